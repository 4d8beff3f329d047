"""One kernel case, checked the same way under the interpreter (CPU) and on the GPU.

A case draws W, X, dY and the rule's state, runs

    fused       kernels.fused_linear_update (with the debug store of its accumulator)
    unfused     kernels.linear_mainloop + kernels.elementwise_update
    emulator    forge_num.emulate (whole kernel in ieee mode; in bf16 mode the epilogue given the
                stored accumulator, and the whole kernel too when a tensor-core model exists)

and asserts: fused == unfused bit for bit (weight, state, accumulator); fused == emulator bit for
bit; telemetry within the bound of proofs/telemetry.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from forge_num import kernels, rules
from forge_num.emulator import emulate, emulate_elementwise
from forge_num.emulator.bounds import sum_of_squares_order_bound
from forge_num.emulator.philox import derive_seed


@dataclass
class Case:
    rule: str
    M: int
    N: int
    K: int
    dtype: torch.dtype
    hyper: dict
    step: int
    seed: int
    config: kernels.TileConfig | None = None
    grad_scale: float = 1.0
    with_accum: bool = False
    transpose_inputs: bool = False  # X and dY as transposed (non-contiguous) views
    bad_rows: int = 0  # rows of the accumulation buffer set to NaN/inf (non-finite gradients)
    precision: str = "fp32"  # or "bf16-sr": weight and state stored as bf16, stochastically rounded

    @property
    def seed_key(self):
        """The Philox key of this parameter and step (None in the fp32 regime)."""
        return derive_seed(self.seed, self.step, 7) if self.precision == "bf16-sr" else None


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def stored(t) -> np.ndarray:
    """What a tensor holds, as NumPy: float32 as is, bf16 as its uint16 encodings."""
    if isinstance(t, np.ndarray):
        return t
    t = t.detach().cpu()
    return bf16_bits(t) if t.dtype == torch.bfloat16 else t.numpy()


def same_bits(a, b) -> bool:
    """Bitwise equality of float32 arrays (or tensors; bf16 compared as encodings), any NaN equal
    to any NaN."""
    a, b = stored(a), stored(b)
    if a.dtype == np.uint16 or b.dtype == np.uint16:
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    nan = np.isnan(a)
    return a.shape == b.shape and bool(np.all(nan == np.isnan(b))) and np.array_equal(
        a.view(np.uint32)[~nan], b.view(np.uint32)[~nan]
    )


def make_inputs(case: Case, device):
    g = torch.Generator().manual_seed(case.seed)
    rule = rules.get_rule(case.rule)
    n_state = rule.state_slots(case.hyper)
    # spread magnitudes over several binades so roundings are exercised
    def spread(*shape):
        return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape, generator=g).float())

    w = spread(case.M, case.N)
    states = [spread(case.M, case.N) for _ in range(n_state)]
    if rule.name in ("adam", "adamw") and n_state == 2:
        states[1] = states[1].abs() * 1e-3  # exp_avg_sq >= 0
    if case.transpose_inputs:
        x = spread(case.N, case.K).to(case.dtype).t()
        dy = spread(case.M, case.K).to(case.dtype).t()
    else:
        x = spread(case.K, case.N).to(case.dtype)
        dy = spread(case.K, case.M).to(case.dtype)
    accum = None
    if case.with_accum or case.bad_rows:
        accum = spread(case.M, case.N) * 0.1
        for r in range(min(case.bad_rows, case.M)):
            accum[r, (r * 7) % case.N] = (math.nan, math.inf, -math.inf)[r % 3]
    if case.precision == "bf16-sr":
        w = w.bfloat16()
        states = [s_.bfloat16() for s_ in states]
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(w), [to(s) for s in states], to(x), to(dy), to(accum)


def run_case(case: Case, device) -> dict:
    rule = rules.get_rule(case.rule)
    h = rule.scalars(case.hyper, case.step)
    w, states, x, dy, accum = make_inputs(case, device)
    w0 = w.clone()
    s_init = [s.clone() for s in states]
    config = case.config

    # fused, with the debug store of the accumulator
    wf, sf = w0.clone(), [s.clone() for s in s_init]
    acc = torch.full(w0.shape, math.nan, dtype=torch.float32, device=w0.device)
    stats_f = kernels.fused_linear_update(wf, x, dy, sf, rule, h, grad_scale=case.grad_scale, accum=accum,
                                          config=config, acc_out=acc, seed=case.seed_key)
    # unfused: the same mainloop storing dW, then the element-wise kernel
    wu, su = w0.clone(), [s.clone() for s in s_init]
    grad = kernels.linear_mainloop(x, dy, accum=accum, config=config)
    stats_u = kernels.elementwise_update(wu, grad, su, rule, h, grad_scale=case.grad_scale, seed=case.seed_key)

    assert same_bits(acc.cpu().numpy(), grad.cpu().numpy()), "debug accumulator != unfused mainloop"
    assert same_bits(wf, wu), "fused weight != unfused weight"
    for a, b in zip(sf, su):
        assert same_bits(a, b), "fused state != unfused state"
    assert int(stats_f.nonfinite) == int(stats_u.nonfinite)

    # the emulator: epilogue given the stored accumulator (both modes)
    p_e, s_e, bad_e = emulate_elementwise(
        stored(w0), acc.cpu().numpy(), [stored(s) for s in s_init], rule=rule, h=h,
        grad_scale=np.float32(case.grad_scale), seed=case.seed_key,
    )
    assert same_bits(p_e, wf), "emulated epilogue != kernel weight"
    for a, b in zip(s_e, sf):
        assert same_bits(a, b), "emulated epilogue != kernel state"
    assert bad_e == int(stats_f.nonfinite)

    # the emulator: the whole kernel
    whole = case.dtype == torch.float32 or _has_tensor_core_model()
    if whole:
        to_np = (lambda t: t.cpu().numpy()) if case.dtype == torch.float32 else bf16_bits
        tile = (config.BM, config.BN, config.BK) if config else _used_tile(x, dy, case.precision == "bf16-sr")
        res = emulate(
            stored(w0), to_np(x), to_np(dy), [stored(s) for s in s_init], rule=rule, h=h,
            grad_scale=case.grad_scale, accum=None if accum is None else accum.cpu().numpy(),
            tile=tile, store_acc=True, precision=case.precision, seed=case.seed_key,
        )
        assert same_bits(res.acc_out, acc.cpu().numpy()), "emulated mainloop != kernel accumulator"
        assert same_bits(res.weight, wf), "emulated kernel != kernel weight"
        for a, b in zip(res.states, sf):
            assert same_bits(a, b), "emulated kernel != kernel state"
        assert res.nonfinite == int(stats_f.nonfinite)

    # telemetry: Σ g² within the proved order bound of the emulator's sum
    g64 = acc.cpu().double()
    ref = float((g64 * g64).sum())
    got = float(stats_f.norm_sq)
    if math.isfinite(ref):
        assert abs(got - ref) <= sum_of_squares_order_bound(case.M * case.N, ref), (got, ref)
    else:
        assert not math.isfinite(got)
    return {"whole_kernel_emulated": whole}


def _has_tensor_core_model() -> bool:
    try:
        from forge_num.emulator.tensor_core import mainloop_model

        mainloop_model("sm_90")
        return True
    except Exception:
        return False


def _used_tile(x, dy, bf16_storage=False):
    """(BM, BN, BK) of the tile the launcher picks for these operands (config=None)."""
    cfg = (kernels.INTERPRETER_CONFIG if kernels._interpreting()
           else kernels.default_config(dy.shape[1], x.shape[1], x.shape[0], x.dtype, bf16_storage,
                                       tma_ok=kernels._tma_addressable(x, dy)))
    return (cfg.BM, cfg.BN, cfg.BK)


def _q8_state(x: torch.Tensor, signed: bool, seed: int) -> kernels.Q8State:
    """x quantized (emulator/quant8.py) into an 8bit state: N padded with zeros to whole blocks."""
    from forge_num.emulator.quant8 import QBLOCK, quantize_block_sr

    M, N = x.shape
    Np = -(-N // QBLOCK) * QBLOCK
    padded = np.zeros((M, Np), np.float32)
    padded[:, :N] = x.numpy()
    rand = np.random.default_rng(seed).integers(0, 2**24, size=(M, Np), dtype=np.uint32)
    codes, scales = quantize_block_sr(padded, rand, signed)
    return kernels.Q8State(torch.from_numpy(np.ascontiguousarray(codes[:, :N])), torch.from_numpy(scales))


def run_q8_case(rule_name: str, hyper: dict, dtype: torch.dtype, M: int, N: int, K: int, seed: int, device,
                config=None, step: int = 3) -> None:
    """The 8bit regime: fused == unfused (the fused kernel with K = 0 from the stored dW) ==
    emulator, bit for bit: bf16 weight, codes and scales. One accumulation-buffer element is NaN."""
    r = rules.get_rule(rule_name)
    h = r.scalars(hyper, step)
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(M, N, generator=g) * 0.1).bfloat16()
    x = torch.randn(K, N, generator=g).to(dtype)
    dy = (torch.randn(K, M, generator=g) * 0.01).to(dtype)
    accum = torch.randn(M, N, generator=g) * 0.01
    accum[(seed * 7) % M, (seed * 13) % N] = float("nan")
    raw = [torch.randn(M, N, generator=g) * 1e-2, torch.rand(M, N, generator=g) * 1e-4]
    states = [_q8_state(raw[i], signed=(i == 0), seed=seed + i) for i in range(r.state_slots(hyper))]
    key = derive_seed(seed, step, 1)
    dev = lambda t: t.clone().to(device)  # noqa: E731  (a copy: .to() of a CPU tensor to the CPU is the same tensor)
    to_dev = lambda sts: [kernels.Q8State(dev(s.codes), dev(s.scales)) for s in sts]  # noqa: E731
    wf, sf = dev(w), to_dev(states)
    wu, su = dev(w), to_dev(states)
    stats = kernels.fused_linear_update(wf, dev(x), dev(dy), sf, r, h, accum=dev(accum), seed=key, config=config)
    kernels.unfused_linear_update(wu, dev(x), dev(dy), su, r, h, accum=dev(accum), seed=key, config=config)
    assert int(stats.nonfinite) == 1
    assert same_bits(wf, wu), "fused weight != unfused weight"
    for a, b in zip(sf, su):
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scales.view(torch.int32), b.scales.view(torch.int32))
    to_np = (lambda t: t.numpy()) if dtype == torch.float32 else bf16_bits  # noqa: E731
    cfg = config or (kernels.INTERPRETER_Q8_CONFIG if kernels._interpreting() else kernels.default_q8_config(
        M, N, K, dtype, kernels._tma_addressable(x, dy)))
    res = emulate(bf16_bits(w), to_np(x), to_np(dy), [(s.codes.numpy(), s.scales.numpy()) for s in states], rule=r,
                  h=h, accum=accum.numpy(), tile=(cfg.BM, cfg.BN, cfg.BK), precision="8bit", seed=key)
    assert same_bits(res.weight, wf), "emulated kernel != kernel weight"
    for (c, sc), s in zip(res.states, sf):
        assert np.array_equal(c, s.codes.cpu().numpy()), "emulated codes != kernel codes"
        assert np.array_equal(sc.view(np.uint32), s.scales.cpu().numpy().view(np.uint32)), "scales differ"
    # not vacuous: the states moved. The weight may legitimately not (lr = 0, or updates far below its
    # bf16 ulp), nor may a few state codes: an E4M3 step is 12.5%, and a momentum change of ~10%
    # rounds stochastically back to the same code about half the time (seen on the H200 with a single
    # finite element). With 64 elements all staying put has probability ~2^-64.
    if M * N >= 64 and states:
        assert any(not np.array_equal(c, s.codes.numpy()) for (c, _), s in zip(res.states, states))


def run_sharded_bf16_sr_case(backend: str, style: str, P: int, device) -> None:
    """bf16-sr: each shard's update with its counter map (its elements' indices in the whole
    parameter) is the restriction of the unsharded update, bit for bit: fused (from the local X, dY)
    and element-wise (from the gradient's slice); the emulator agrees (proofs/distributed.md §6).
    ``backend``: "torch" (forge_num.torch_backend) or "kernels" (Triton: the GPU or the interpreter)."""
    from forge_num import torch_backend as _tb
    from forge_num import kernels, rules
    from forge_num.emulator import emulate, emulate_elementwise

    be = _tb if backend == "torch" else kernels
    rule = rules.ADAMW
    h = rule.scalars(dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1), 3)
    g = torch.Generator().manual_seed(10 + P)
    K, M, N = 24, 48, 40
    x, dy = torch.randn(K, N, generator=g), torch.randn(K, M, generator=g) * 0.1
    w = torch.randn(M, N, generator=g).bfloat16()
    states = [torch.randn(M, N, generator=g).bfloat16(), torch.rand(M, N, generator=g).bfloat16()]
    x, dy, w, states = x.to(device), dy.to(device), w.to(device), [s.to(device) for s in states]
    key = 0x1234_5678_9ABC
    full_w, full_s = w.clone(), [s.clone() for s in states]
    be.fused_linear_update(full_w, x, dy, full_s, rule, h, seed=key)
    grad = dy.t() @ x
    ew_w, ew_s = w.clone(), [s.clone() for s in states]
    be.elementwise_update(ew_w, grad.contiguous(), ew_s, rule, h, seed=key)
    bits = lambda t: t.view(torch.int16).cpu().numpy().view(np.uint16)  # noqa: E731
    # the whole fused kernel's emulation holds where dW is the kernels' own (the torch backend's dW is
    # MKL's, summed in another order); the element-wise emulation holds for both backends
    whole = backend == "kernels"
    if whole:
        emu = emulate(bits(w), x.cpu().numpy(), dy.cpu().numpy(), [bits(s) for s in states], rule="adamw", h=h,
                      precision="bf16-sr", seed=key, tile=(32, 32, 16))
        assert np.array_equal(emu.weight, bits(full_w))
    dim = 0 if style == "colwise" else 1
    size = (M, N)[dim]
    bounds = [size * r // P for r in range(P + 1)]
    for r in range(P):
        lo, hi = bounds[r], bounds[r + 1]
        # copies: a row slice's .contiguous() would be a view, and the updates are in place
        cut = ((lambda t: t[lo:hi].clone(memory_format=torch.contiguous_format)) if dim == 0
               else (lambda t: t[:, lo:hi].clone(memory_format=torch.contiguous_format)))
        counter = (N, N, lo * N) if dim == 0 else (hi - lo, N, lo)
        w_r, s_r = cut(w), [cut(s) for s in states]
        if dim == 0:  # Colwise: X whole, dY's local output features
            x_r, dy_r = x, cut(dy.t()).t().contiguous()
        else:  # Rowwise: X's local input features, dY whole
            x_r, dy_r = cut(x), dy
        be.fused_linear_update(w_r, x_r, dy_r, s_r, rule, h, seed=key, counter=counter)
        assert np.array_equal(bits(w_r), bits(cut(full_w))), (style, P, r)
        for a, b in zip(s_r, full_s):
            assert np.array_equal(bits(a), bits(cut(b))), (style, P, r)
        e_w, e_s = cut(w), [cut(s) for s in states]
        be.elementwise_update(e_w, cut(grad), e_s, rule, h, seed=key, counter=counter)
        assert np.array_equal(bits(e_w), bits(cut(ew_w))), (style, P, r, "elementwise")
        if whole:
            emu_r = emulate(bits(cut(w)), x_r.cpu().numpy(), dy_r.cpu().numpy(), [bits(cut(s)) for s in states],
                            rule="adamw", h=h, precision="bf16-sr", seed=key, tile=(32, 32, 16), counter=counter)
            assert np.array_equal(emu_r.weight, bits(w_r)), (style, P, r, "emulator")
        emu_e = emulate_elementwise(bits(cut(w)), cut(grad).cpu().numpy(), [bits(cut(s)) for s in states],
                                    rule="adamw", h=h, seed=key, counter=counter)
        assert np.array_equal(emu_e[0], bits(e_w)), (style, P, r, "emulator elementwise")


def run_gathered_rows_case(backend: str, regime: str, device) -> None:
    """Rows gathered from a parameter and updated apart, with their indices as the counter map's rows
    (CounterMap(C, C, 0, rows)), are the rows of the whole parameter's update, bit for bit: weight and
    states, and the emulator agrees. What a tied head's touched rows rely on (forge_num.fused).
    ``regime``: "bf16-sr" (element-wise, and fused from X and the rows' dY columns) or "8bit" (the
    fused kernel with K = 0 from the rows' gradient). ``backend``: "torch" or "kernels"."""
    from forge_num import torch_backend as _tb
    from forge_num.emulator import emulate, emulate_elementwise

    be = _tb if backend == "torch" else kernels
    rule = rules.ADAMW
    h = rule.scalars(dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1), 3)
    g = torch.Generator().manual_seed(31)
    K, M, N = 24, 40, 256
    x, dy = torch.randn(K, N, generator=g), torch.randn(K, M, generator=g) * 0.1
    w = torch.randn(M, N, generator=g).bfloat16()
    rows = torch.tensor([0, 3, 4, 17, 38, 39], dtype=torch.int64)  # a row tile's first and last rows among them
    key = 0x0123_4567_89AB_CDEF
    grad = (dy.t() @ x).contiguous()
    bits = lambda t: t.view(torch.int16).cpu().numpy().view(np.uint16)  # noqa: E731
    dev = lambda t: t.clone().to(device)  # noqa: E731
    counter = (N, N, 0, rows.to(device))
    if regime == "8bit":
        raw = [torch.randn(M, N, generator=g) * 1e-2, torch.rand(M, N, generator=g) * 1e-4]
        states = [_q8_state(raw[i], signed=(i == 0), seed=5 + i) for i in range(2)]
        gather_q8 = lambda sts, idx: [kernels.Q8State(dev(s.codes[idx]), dev(s.scales[idx])) for s in sts]  # noqa: E731
        full_w, full_s = dev(w), gather_q8(states, slice(None))
        be.fused_linear_update(full_w, dev(x[:0]), dev(dy[:0]), full_s, rule, h, accum=dev(grad), seed=key)
        part_w, part_s = dev(w[rows]), gather_q8(states, rows)
        be.fused_linear_update(part_w, dev(x[:0]), dev(dy[:0, rows]), part_s, rule, h, accum=dev(grad[rows]),
                               seed=key, counter=counter)
        assert np.array_equal(bits(part_w), bits(full_w[rows.to(device)])), "gathered rows' weight"
        for a, b in zip(part_s, full_s):
            assert torch.equal(a.codes.cpu(), b.codes.cpu()[rows]), "gathered rows' codes"
            assert torch.equal(a.scales.cpu(), b.scales.cpu()[rows]), "gathered rows' scales"
        emu = emulate(bits(w[rows]), x[:0].numpy(), dy[:0, rows].numpy(),
                      [(s.codes[rows].numpy(), s.scales[rows].numpy()) for s in states], rule=rule, h=h,
                      accum=grad[rows].numpy(), tile=(32, 128, 16), precision="8bit", seed=key,
                      counter=(N, N, 0, rows.numpy()))
        assert np.array_equal(emu.weight, bits(part_w)), "emulated gathered rows"
        assert not np.array_equal(bits(part_w), bits(w[rows])), "vacuous: the rows did not move"
        return
    states = [torch.randn(M, N, generator=g).bfloat16(), torch.rand(M, N, generator=g).bfloat16()]
    full_w, full_s = dev(w), [dev(s) for s in states]
    be.elementwise_update(full_w, dev(grad), full_s, rule, h, seed=key)
    part_w, part_s = dev(w[rows]), [dev(s[rows]) for s in states]
    be.elementwise_update(part_w, dev(grad[rows]), part_s, rule, h, seed=key, counter=counter)
    idx = rows.to(device)
    assert np.array_equal(bits(part_w), bits(full_w[idx])), "gathered rows' weight (element-wise)"
    for a, b in zip(part_s, full_s):
        assert np.array_equal(bits(a), bits(b[idx])), "gathered rows' state (element-wise)"
    emu = emulate_elementwise(bits(w[rows]), grad[rows].numpy(), [bits(s[rows]) for s in states], rule="adamw", h=h,
                              seed=key, counter=(N, N, 0, rows.numpy()))
    assert np.array_equal(emu[0], bits(part_w)), "emulated gathered rows (element-wise)"
    assert not np.array_equal(bits(part_w), bits(w[rows])), "vacuous: the rows did not move"
    # fused from X and the rows' dY columns: the restriction of the whole fused update
    full_w, full_s = dev(w), [dev(s) for s in states]
    be.fused_linear_update(full_w, dev(x), dev(dy), full_s, rule, h, seed=key)
    part_w, part_s = dev(w[rows]), [dev(s[rows]) for s in states]
    be.fused_linear_update(part_w, dev(x), dev(dy[:, rows]), part_s, rule, h, seed=key, counter=counter)
    assert np.array_equal(bits(part_w), bits(full_w[idx])), "gathered rows' weight (fused)"
    for a, b in zip(part_s, full_s):
        assert np.array_equal(bits(a), bits(b[idx])), "gathered rows' state (fused)"


def run_q8_telemetry_case(device, config=None, M: int = 45, N: int = 200) -> None:
    """The 8bit kernel's telemetry (its row sub-tiles' terms added element by element, reduced once a
    tile): Σ g² within proofs/telemetry.md's bound of the exact sum (math.fsum of the exact fp64
    squares), over rows past M and columns past N; then one inf and two NaN elements: counted 3, the
    sum not finite. The gradient is the accumulation buffer (K = 0), so it is known exactly."""
    import math

    from forge_num.emulator.bounds import sum_of_squares_order_bound

    rule = rules.ADAMW
    h = rule.scalars(dict(lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0), 2)
    gen = torch.Generator().manual_seed(M * N)
    g = torch.randn(M, N, generator=gen) * torch.exp2(torch.randint(-20, 20, (M, N), generator=gen).float())
    w = (torch.randn(M, N, generator=gen) * 0.1).bfloat16()
    states = [_q8_state(torch.zeros(M, N), signed=True, seed=1), _q8_state(torch.zeros(M, N), signed=False, seed=2)]

    def run(grad):
        st = [kernels.Q8State(s.codes.clone().to(device), s.scales.clone().to(device)) for s in states]
        return kernels.fused_linear_update(w.clone().to(device), torch.zeros(0, N, device=device),
                                           torch.zeros(0, M, device=device), st, rule, h, accum=grad.to(device),
                                           seed=3, config=config)

    stats = run(g)
    ref = math.fsum(float(v) ** 2 for v in g.double().reshape(-1).tolist())
    got = float(stats.norm_sq)
    assert int(stats.nonfinite) == 0
    assert abs(got - ref) <= sum_of_squares_order_bound(M * N, ref), (got, ref)
    bad = g.clone()
    bad[0, 0], bad[M - 1, N - 1], bad[M // 2, 7] = float("inf"), float("nan"), float("nan")
    stats = run(bad)
    assert int(stats.nonfinite) == 3 and not math.isfinite(float(stats.norm_sq))
