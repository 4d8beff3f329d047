"""forge_num.torch_backend: its op vocabulary and rules against the NumPy emulator, bit for bit.

NaN results are compared as "both NaN": IEEE 754 leaves the payload of an operation on two NaNs to
the implementation (x86 keeps the first operand's, and NumPy and torch may order operands
differently in vector code), and the guarded update never writes a NaN result anyway.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from forge_num.emulator import fp32 as E
from forge_num.emulator.rules import NAMESPACE as ENS
from forge_num.emulator.rules import bind_guarded
from hypothesis import given
from hypothesis import strategies as st

from forge_num import rules as R
from forge_num import torch_backend as tb

SPECIAL_BITS = [
    0x00000000,
    0x80000000,  # ±0
    0x00000001,
    0x80000001,  # ±min subnormal
    0x007FFFFF,
    0x807FFFFF,  # ±max subnormal
    0x00800000,
    0x80800000,  # ±min normal
    0x3F800000,
    0xBF800000,  # ±1
    0x3F800001,
    0x3FFFFFFF,  # 1 + ulp, just below 2
    0x4B000001,
    0x4B7FFFFF,  # 2^23 + 1 (ties when halved), 2^24 - 1
    0x33800000,
    0x34000000,  # 2^-24, 2^-23
    0x7F7FFFFF,
    0xFF7FFFFF,  # ±max
    0x7F800000,
    0xFF800000,  # ±inf
    0x7FC00000,  # NaN
]
SPECIAL = np.array(SPECIAL_BITS, dtype=np.uint32).view(np.float32)


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def assert_same_bits(want, got, what=""):
    want = np.asarray(want, dtype=np.float32)
    got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert want.shape == got.shape, what
    nan = np.isnan(want) & np.isnan(got)
    bad = (want.view(np.uint32) != got.view(np.uint32)) & ~nan
    if bad.any():
        i = int(np.nonzero(bad.ravel())[0][0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} differ; first at {i}: "
            f"want {want.ravel()[i]!r} ({want.view(np.uint32).ravel()[i]:#010x}), "
            f"got {got.ravel()[i]!r} ({got.view(np.uint32).ravel()[i]:#010x})"
        )


def _random_bits(rng, n):
    """Random encodings: a quarter subnormal or zero, a quarter in [0.5, 2), the rest anything."""
    u = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    k = n // 4
    u[:k] &= np.uint32(0x807FFFFF)
    u[k : 2 * k] = (u[k : 2 * k] & np.uint32(0x807FFFFF)) | np.uint32(0x3F000000)
    rng.shuffle(u)
    return u.view(np.float32)


BINARY = {"add": E.add, "sub": E.sub, "mul": E.mul, "div": E.div}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_on_special_value_grid(name):
    a, b = np.meshgrid(SPECIAL, SPECIAL)
    assert_same_bits(BINARY[name](a, b), tb.NAMESPACE[name](_t(a), _t(b)), name)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_on_random_bits(name):
    rng = np.random.default_rng(1)
    a, b = _random_bits(rng, 1 << 18), _random_bits(rng, 1 << 18)
    assert_same_bits(BINARY[name](a, b), tb.NAMESPACE[name](_t(a), _t(b)), name)


def test_binary_ops_with_0d_scalar_operands():
    """Host scalars reach the ops as 0-d fp32 tensors (the path h takes)."""
    rng = np.random.default_rng(2)
    a = _random_bits(rng, 4099)
    for s in SPECIAL:
        for name, op in BINARY.items():
            assert_same_bits(op(a, s), tb.NAMESPACE[name](_t(a), torch.tensor(s)), f"{name} by {s}")
            assert_same_bits(op(s, a), tb.NAMESPACE[name](torch.tensor(s), _t(a)), f"{s} {name}")


def test_sqrt_is_correctly_rounded():
    rng = np.random.default_rng(3)
    a = np.abs(np.concatenate([_random_bits(rng, 1 << 18), SPECIAL]))
    assert_same_bits(E.sqrt(a), tb.NAMESPACE["sqrt"](_t(a)), "sqrt")
    neg = -np.abs(SPECIAL)
    assert_same_bits(E.sqrt(neg), tb.NAMESPACE["sqrt"](_t(neg)), "sqrt of negatives")


def test_torch_float32_sqrt_is_not_correctly_rounded():
    """The fact behind the double-precision sqrt (and the tests' TorchFunctionMode for torch.optim).

    If torch fixes its CPU sqrt this fails, and the docs saying otherwise need updating.
    """
    rng = np.random.default_rng(4)
    a = np.abs(_random_bits(rng, 1 << 18))
    a = a[np.isfinite(a)]
    off = E.sqrt(a).view(np.uint32) != torch.sqrt(_t(a)).numpy().view(np.uint32)
    assert off.sum() > 0


@pytest.mark.parametrize("impl", ["odd", "addcmul"])
def test_fma_random_and_special(impl, monkeypatch):
    if impl == "addcmul" and not tb.addcmul_is_fma():
        pytest.skip("this CPU's ATen addcmul rounds twice (no FMA kernels); the round-to-odd path is used")
    monkeypatch.setattr(tb, "FMA_IMPL", impl)
    rng = np.random.default_rng(5)
    n = 1 << 18
    a, b, c = _random_bits(rng, n), _random_bits(rng, n), _random_bits(rng, n)
    assert_same_bits(E.fma(a, b, c), tb.NAMESPACE["fma"](_t(a), _t(b), _t(c)), f"fma[{impl}]")
    # near-total cancellation: c = -round(a*b)
    with np.errstate(all="ignore"):
        c = -(a.astype(np.float64) * b).astype(np.float32)
    assert_same_bits(E.fma(a, b, c), tb.NAMESPACE["fma"](_t(a), _t(b), _t(c)), f"fma[{impl}] cancel")
    x, y, z = np.meshgrid(SPECIAL, SPECIAL, SPECIAL)
    assert_same_bits(E.fma(x, y, z), tb.NAMESPACE["fma"](_t(x), _t(y), _t(z)), f"fma[{impl}] special")


@pytest.mark.parametrize("impl", ["odd", "addcmul"])
def test_fma_rounds_once(impl, monkeypatch):
    """a = b = 1 + 2^-12, c = 2^-70: rounding a*b + c twice gives 1 + 2^-11, once 1 + 2^-11 + 2^-23."""
    if impl == "addcmul" and not tb.addcmul_is_fma():
        pytest.skip("this CPU's ATen addcmul rounds twice")
    monkeypatch.setattr(tb, "FMA_IMPL", impl)
    a = torch.tensor([1 + 2.0**-12] * 19)  # 19: the vector body and the scalar tail
    c = torch.full((19,), 2.0**-70)
    want = 1 + 2.0**-11 + 2.0**-23
    assert tb.NAMESPACE["fma"](a, a, c).tolist() == [want] * 19
    assert tb.NAMESPACE["fma"](a[0].reshape(()), a, c).tolist() == [want] * 19


def test_addcmul_self_check_detects_double_rounding(monkeypatch):
    monkeypatch.setattr(tb, "_ADDCMUL_IS_FMA", None)
    monkeypatch.setattr(tb, "fma_addcmul", lambda a, b, c: (a * b) + c)
    assert tb.addcmul_is_fma() is False


@given(st.lists(st.integers(0, 2**32 - 1), min_size=3, max_size=3 * 64))
def test_fma_hypothesis(words):
    n = len(words) // 3
    u = np.array(words[: 3 * n], dtype=np.uint32).view(np.float32).reshape(3, n)
    for impl in ("odd", "auto"):
        old = tb.FMA_IMPL
        tb.FMA_IMPL = impl
        try:
            assert_same_bits(E.fma(*u), tb.NAMESPACE["fma"](*map(_t, u)), f"fma[{impl}]")
        finally:
            tb.FMA_IMPL = old


def test_neg_sign_where_isfinite():
    x = _t(SPECIAL)
    assert_same_bits(E.neg(SPECIAL), tb.NAMESPACE["neg"](x), "neg")
    # neg flips the sign of zeros and NaNs too (bitwise, the NaN included)
    assert (tb.NAMESPACE["neg"](x).numpy().view(np.uint32) == (SPECIAL.view(np.uint32) ^ 0x80000000)).all()
    assert_same_bits(ENS["sign"](SPECIAL), tb.NAMESPACE["sign"](x), "sign")
    sg = tb.NAMESPACE["sign"](x).numpy()
    assert sg.view(np.uint32)[0] == 0 and sg.view(np.uint32)[1] == 0x80000000  # sign(±0) = ±0
    assert np.isnan(sg[-1])
    assert (tb.NAMESPACE["isfinite"](x).numpy() == ENS["isfinite"](SPECIAL)).all()
    cond = np.arange(SPECIAL.size) % 2 == 0
    assert_same_bits(
        ENS["where"](cond, SPECIAL, SPECIAL[::-1]),
        tb.NAMESPACE["where"](torch.from_numpy(cond), x, _t(SPECIAL[::-1])),
        "where",
    )


HYPERS = {
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
    "adam": dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
    "sgd": dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "lion": dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1),
}
HYPERS_EXTRA = [
    ("adamw", dict(lr=1e-3, betas=(0.3, 0.999), eps=1e-8, weight_decay=0.0)),  # lerp weight >= 0.5
    ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("sgd", dict(lr=0.05)),  # no momentum: no state
]


def _rule_cases():
    for name, hyper in list(HYPERS.items()) + HYPERS_EXTRA:
        for step in (1, 2, 10):
            yield pytest.param(name, hyper, step, id=f"{name}-{hyper.get('momentum', '')}-{step}")


@pytest.mark.parametrize("name,hyper,step", list(_rule_cases()))
@pytest.mark.parametrize("grad_scale", [1.0, 0.37])
def test_guarded_rules_match_emulator(name, hyper, step, grad_scale):
    rule = R.RULES[name]
    h = rule.scalars(hyper, step)
    rng = np.random.default_rng(step)
    n = 5000
    p = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 4)).astype(np.float32)
    g[: SPECIAL.size] = SPECIAL
    p[SPECIAL.size : 2 * SPECIAL.size] = SPECIAL  # non-finite weights propagate as the rule says
    s0 = rng.standard_normal(n).astype(np.float32)
    s1 = np.abs(rng.standard_normal(n)).astype(np.float32)
    s0[100:120] = 0
    s1[100:120] = 0
    want = bind_guarded(rule)(p, g, s0, s1, h, np.float32(grad_scale))
    slots = rule.state_slots(hyper)
    P, S = _t(p), [_t(s0), _t(s1)][:slots]
    stats = tb.elementwise_update(P, _t(g), S, rule, h, grad_scale=grad_scale)
    assert_same_bits(want[0], P, "param")
    for i in range(slots):
        assert_same_bits(want[1 + i], S[i], f"state {i}")
    assert int(stats.nonfinite) == int((~want[3]).sum())
    g64 = g.astype(np.float64)
    assert float(stats.norm_sq) == pytest.approx(float((g64 * g64).sum()), rel=1e-12) or not np.isfinite(
        (g64 * g64).sum()
    )


def _linear_case(rng, K, M, N, dtype=torch.float32):
    x = torch.from_numpy(rng.standard_normal((K, N)).astype(np.float32)).to(dtype)
    dy = torch.from_numpy(rng.standard_normal((K, M)).astype(np.float32)).to(dtype)
    w = torch.from_numpy(rng.standard_normal((M, N)).astype(np.float32))
    return x, dy, w


@pytest.mark.parametrize("block", [None, 37 * 24])  # one block; many row blocks (37 rows of N=24)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_equals_elementwise_on_the_same_blocks(block, dtype, monkeypatch):
    """fused_linear_update == elementwise_update applied to the dW its blocks compute (bitwise)."""
    if block:
        monkeypatch.setattr(tb, "BLOCK_ELEMS", block)
    rng = np.random.default_rng(7)
    K, M, N = 50, 100, 24
    x, dy, w = _linear_case(rng, K, M, N, dtype)
    rule, hyper = R.ADAMW, HYPERS["adamw"]
    h = rule.scalars(hyper, 3)
    m = torch.randn(M, N)
    v = torch.rand(M, N)
    accum = torch.randn(M, N)
    dw = torch.cat([g for _, g in tb.weight_grad_blocks(x, dy, M, N, accum)])
    w1, m1, v1 = w.clone(), m.clone(), v.clone()
    s1 = tb.fused_linear_update(w1, x, dy, [m1, v1], rule, h, grad_scale=0.5, accum=accum)
    w2, m2, v2 = w.clone(), m.clone(), v.clone()
    s2 = tb.elementwise_update(w2, dw, [m2, v2], rule, h, grad_scale=0.5)
    for a, b in ((w1, w2), (m1, m2), (v1, v2)):
        assert torch.equal(a, b)
    assert float(s1.norm_sq) == pytest.approx(float(s2.norm_sq), rel=1e-15)
    # the blocks are fp32 dot products of the exactly upcast inputs: within the bound of any
    # summation order, |fl(Σ) - Σ| <= γ_K Σ|terms|, γ_K = K u / (1 - K u), u = 2^-24
    x64, dy64 = x.double(), dy.double()
    exact = dy64.t() @ x64 + accum.double()
    gamma = (K + 1) * 2.0**-24 / (1 - (K + 1) * 2.0**-24)
    bound = gamma * (dy64.abs().t() @ x64.abs() + accum.double().abs())
    assert ((dw.double() - exact).abs() <= bound).all()


def test_single_block_dw_equals_autograd():
    """One block: the backend's dW is torch's mm of the same operands, equal to autograd's weight grad."""
    rng = np.random.default_rng(8)
    for K, M, N in [(64, 32, 48), (256, 96, 64), (128, 256, 64)]:
        x, dy, w = _linear_case(rng, K, M, N)
        w.requires_grad_(True)
        torch.nn.functional.linear(x, w).backward(dy)
        ((_, dw),) = list(tb.weight_grad_blocks(x, dy, M, N))
        assert torch.equal(dw, w.grad), (K, M, N)


def test_blocks_never_hold_the_whole_dw(monkeypatch):
    monkeypatch.setattr(tb, "BLOCK_ELEMS", 1000)
    rng = np.random.default_rng(9)
    x, dy, _ = _linear_case(rng, 30, 200, 40)
    shapes = [tuple(g.shape) for _, g in tb.weight_grad_blocks(x, dy, 200, 40)]
    assert all(r * c <= 1000 for r, c in shapes) and sum(r for r, _ in shapes) == 200


def test_norm_sq_and_accumulate():
    rng = np.random.default_rng(10)
    x, dy, _ = _linear_case(rng, 40, 30, 20)
    dw = dy.t() @ x
    n2 = tb.weight_grad_norm_sq(x, dy)
    assert n2.dtype == torch.float64 and n2.dim() == 0
    assert float(n2) == pytest.approx(float((dw.double() ** 2).sum()), rel=1e-13)
    # -0.0 is the identity of addition (+0 and -0 included), so a buffer filled with -0.0 and then
    # accumulated into equals dW bitwise: torch assigns the first micro-batch's .grad, it does not add it
    zeros = torch.tensor([0.0, -0.0])
    assert torch.equal((torch.full((2,), -0.0) + zeros).view(torch.int32), zeros.view(torch.int32))
    acc = torch.full((30, 20), -0.0)
    tb.accumulate_weight_grad(x, dy, acc)
    assert torch.equal(acc.view(torch.int32), dw.view(torch.int32))
    tb.accumulate_weight_grad(x, dy, acc)
    assert torch.equal(acc, dw + dw)
    assert float(tb.weight_grad_norm_sq(x, dy, accum=acc)) == pytest.approx(
        float(((acc + dw).double() ** 2).sum()), rel=1e-13
    )


def test_nonfinite_elements_keep_weight_and_state():
    rng = np.random.default_rng(11)
    x, dy, w = _linear_case(rng, 8, 6, 5)
    x[3, 2] = float("nan")  # dW[:, 2] is NaN
    m, v = torch.zeros(6, 5), torch.zeros(6, 5)
    w0 = w.clone()
    stats = tb.fused_linear_update(w, x, dy, [m, v], R.ADAMW, R.ADAMW.scalars(HYPERS["adamw"], 1))
    assert int(stats.nonfinite) == 6
    assert torch.equal(w[:, 2], w0[:, 2]) and (m[:, 2] == 0).all() and (v[:, 2] == 0).all()
    assert not torch.equal(w[:, 1], w0[:, 1])
    assert torch.isfinite(w).all()


def test_errors_name_what_is_wrong():
    rule, h = R.ADAMW, R.ADAMW.scalars(HYPERS["adamw"], 1)
    w, x, dy = torch.zeros(4, 3), torch.zeros(5, 3), torch.zeros(5, 4)
    st = [torch.zeros(4, 3), torch.zeros(4, 3)]
    with pytest.raises(TypeError, match="float32"):
        tb.fused_linear_update(w.double(), x, dy, st, rule, h)
    with pytest.raises(ValueError, match="features"):
        tb.fused_linear_update(w, torch.zeros(5, 2), dy, st, rule, h)
    with pytest.raises(ValueError, match="tokens"):
        tb.fused_linear_update(w, x, torch.zeros(6, 4), st, rule, h)
    with pytest.raises(ValueError, match="shape"):
        tb.fused_linear_update(w, x, dy, [torch.zeros(3, 4), st[1]], rule, h)
    with pytest.raises(TypeError, match="float32, bfloat16"):
        tb.fused_linear_update(w, x.to(torch.int32), dy, st, rule, h)
    with pytest.raises(ValueError, match="contiguous"):
        tb.elementwise_update(
            torch.zeros(3, 4).t(), torch.zeros(4, 3), [], R.SGD, R.SGD.scalars({"lr": 1}, 1)
        )
    with pytest.raises(ValueError, match="takes 9 scalars"):
        tb.elementwise_update(w, w, st, rule, h[:3])
    with pytest.raises(ValueError, match="accum"):
        tb.accumulate_weight_grad(x, dy, torch.zeros(3, 4))


def test_sqrt_midpoint_check_corrects_a_root_one_ulp_off():
    """sqrt_fix makes the result independent of the accuracy of torch's float64 sqrt kernel."""
    rng = np.random.default_rng(12)
    a = np.abs(_random_bits(rng, 1 << 16))
    a = a[np.isfinite(a) & (a > 0)]
    want = E.sqrt(a)
    x = _t(a).double()
    r = _t(want)
    for off in (torch.full_like(r, float("inf")), torch.zeros_like(r)):
        wrong = torch.nextafter(r, off)
        assert_same_bits(want, tb.sqrt_fix(wrong, x), "one ulp off")
    assert_same_bits(want, tb.sqrt_fix(r, x), "already right")


@pytest.mark.parametrize("rule_name", sorted(R.RULES))
def test_bf16_sr_regime_equals_the_emulator(rule_name):
    """bf16 weight and state on the torch backend: the same guarded rule in fp32, then the same
    stochastic rounding with the same random slices as the kernels and the emulator, bit for bit."""
    from forge_num.emulator import emulate_elementwise
    from forge_num.emulator.philox import derive_seed

    rule = R.RULES[rule_name]
    hyper = {"adamw": {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
             "adam": {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
             "sgd": {"lr": 0.1, "momentum": 0.9}, "lion": {"lr": 1e-3, "betas": (0.9, 0.99)}}[rule_name]
    h = rule.scalars(hyper, 3)
    g = torch.Generator().manual_seed(5)
    p = torch.randn(37, 29, generator=g).bfloat16()
    states = [torch.randn(37, 29, generator=g).abs().bfloat16() * 1e-2 for _ in range(rule.state_slots(hyper))]
    grad = torch.randn(37, 29, generator=g)
    grad[3, 4] = float("nan")
    key = derive_seed(11, 3, 2)
    bits = lambda t: t.contiguous().view(torch.int16).numpy().view(np.uint16)  # noqa: E731
    want_p, want_s, bad = emulate_elementwise(bits(p), grad.numpy(), [bits(s) for s in states], rule=rule, h=h,
                                              seed=key)
    stats = tb.elementwise_update(p, grad, states, rule, h, seed=key)
    assert np.array_equal(bits(p), want_p) and int(stats.nonfinite) == bad == 1
    for a, b in zip(states, want_s):
        assert np.array_equal(bits(a), b)


@pytest.mark.parametrize("rule_name", sorted(R.RULES))
def test_8bit_regime_equals_the_kernels(rule_name):
    """The 8bit regime on the torch backend and in the Triton kernel (interpreter or GPU), given the
    same gradient: the same bf16 weight, codes and scales, bit for bit."""
    from forge_num import kernels
    from forge_num.emulator.philox import derive_seed

    rule = R.RULES[rule_name]
    hyper = {"adamw": {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
             "adam": {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
             "sgd": {"lr": 0.1, "momentum": 0.9}, "lion": {"lr": 1e-3, "betas": (0.9, 0.99)}}[rule_name]
    h = rule.scalars(hyper, 2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(8)
    M, N = 9, 150
    w = (torch.randn(M, N, generator=g) * 0.1).bfloat16()
    grad = torch.randn(M, N, generator=g) * 0.01
    grad[1, 2] = float("inf")
    key = derive_seed(3, 2, 0)
    results = []
    for backend in (kernels, tb):
        wk = w.clone().to(dev)
        sts = [kernels.Q8State.zeros(M, N, dev) for _ in range(rule.state_slots(hyper))]
        x0, dy0 = torch.zeros(0, N, device=dev), torch.zeros(0, M, device=dev)
        for _ in range(2):  # the second step starts from nonzero codes and scales
            stats = backend.fused_linear_update(wk, x0, dy0, sts, rule, h, accum=grad.to(dev), seed=key)
        results.append((wk.cpu().view(torch.int16), [(s.codes.cpu(), s.scales.cpu().view(torch.int32)) for s in sts],
                        int(stats.nonfinite)))
    (wa, sa, na), (wb, sb, nb) = results
    assert torch.equal(wa, wb) and na == nb == 1
    for (ca, sca), (cb, scb) in zip(sa, sb):
        assert torch.equal(ca, cb) and torch.equal(sca, scb)
    assert not torch.equal(wa, w.view(torch.int16))
