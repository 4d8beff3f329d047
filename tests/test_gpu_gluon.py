"""On the GPU: the warp-specialized Gluon kernel (kernels/gluon_update.py) gives the Triton kernel's
bits and the emulator's: weight and state bit for bit against kernels.fused_linear_update on the TMA
64x128x64 tile (the same wgmma chain) and against the emulator's epilogue on the unfused mainloop's
dW; the non-finite count equal; Σ g² within proofs/telemetry.md's bound. Cases cover edge tiles,
a partial last K block, several tiles per program (the rings' phases wrapping), non-finite
gradients and every rule with each number of states, in the fp32 regime and the bf16-sr regime
(bf16 weight and state, stochastic rounding with the Philox stream, shards' counter maps).

Its PTX (IEEE ops only, no spills) is checked on the CPU by tests/test_ptx.py.
"""

from __future__ import annotations

import math
import os
from unittest import mock

import numpy as np
import pytest
import torch

from forge_num import kernels, rules
from forge_num.emulator import emulate_elementwise
from forge_num.emulator.bounds import sum_of_squares_order_bound
from tests.kernel_cases import bf16_bits, same_bits

pytestmark = [pytest.mark.exactness, pytest.mark.gpu]
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
CUDA = torch.device("cuda")
TRITON_TWIN = kernels.DEFAULT_TMA_CONFIGS["small_k"]  # TMA 64x128x64: the same mainloop instructions

HYPERS = {
    "adamw": {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "adam": {"lr": 1e-3, "betas": (0.9, 0.99999), "eps": 1e-16, "weight_decay": 0.1},
    "sgd": {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 1e-4, "nesterov": True},
    "sgd-plain": {"lr": 0.1, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False},
    "lion": {"lr": 1e-2, "betas": (0.9, 0.99), "weight_decay": 0.1},
}


def _case(rule_name, M, N, K, seed, bad_rows=0, step=3):
    rule = rules.get_rule(rule_name.split("-")[0])
    hyper = HYPERS[rule_name]
    g = torch.Generator().manual_seed(seed)

    def spread(*shape):  # magnitudes over several binades, so that roundings are exercised
        return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape, generator=g).float())

    w = spread(M, N).to(CUDA)
    states = [spread(M, N).to(CUDA) for _ in range(rule.state_slots(hyper))]
    if rule.name in ("adam", "adamw"):
        states[1] = states[1].abs() * 1e-3
    x = spread(K, N).bfloat16().to(CUDA)
    dy = spread(K, M).bfloat16().to(CUDA)
    for r in range(bad_rows):  # a non-finite dY entry makes row r of dW non-finite
        dy[r % K, (r * 7) % M] = (math.inf, -math.inf, math.nan)[r % 3]
    return rule, rule.scalars(hyper, step), w, states, x, dy


def _check(rule_name, M, N, K, seed, bad_rows=0, grad_scale=1.0, config=None):
    """The fp32 regime: a tile of gluon_update.py (WSConfig) or gluon_f32.py (F32WSConfig) against the Triton
    kernel and the emulator."""
    from forge_num.kernels.gluon_f32 import F32WSConfig, fused_linear_update_f32_ws
    from forge_num.kernels.gluon_update import DEFAULT_WS_CONFIG, fused_linear_update_ws

    fused = fused_linear_update_f32_ws if isinstance(config, F32WSConfig) else fused_linear_update_ws
    rule, h, w0, s0, x, dy = _case(rule_name, M, N, K, seed, bad_rows)
    ww, sw = w0.clone(), [s.clone() for s in s0]
    stats_ws = fused(ww, x, dy, sw, rule, h, grad_scale=grad_scale, config=config or DEFAULT_WS_CONFIG)
    wt, st = w0.clone(), [s.clone() for s in s0]
    stats_t = kernels.fused_linear_update(wt, x, dy, st, rule, h, grad_scale=grad_scale, config=TRITON_TWIN)
    assert same_bits(ww, wt), "Gluon weight != Triton weight"
    for a, b in zip(sw, st):
        assert same_bits(a, b), "Gluon state != Triton state"
    assert int(stats_ws.nonfinite) == int(stats_t.nonfinite)
    # the emulator's epilogue on the unfused mainloop's dW (the same wgmma chain)
    grad = kernels.linear_mainloop(x, dy, config=TRITON_TWIN).cpu().numpy()
    p_e, s_e, bad_e = emulate_elementwise(w0.cpu().numpy(), grad, [s.cpu().numpy() for s in s0], rule=rule, h=h,
                                          grad_scale=np.float32(grad_scale))
    assert same_bits(p_e, ww), "emulated epilogue != Gluon weight"
    for a, b in zip(s_e, sw):
        assert same_bits(a, b), "emulated epilogue != Gluon state"
    assert bad_e == int(stats_ws.nonfinite) and (bad_rows == 0) == (bad_e == 0)
    g64 = grad.astype(np.float64)
    ref = float((g64 * g64).sum())
    got = float(stats_ws.norm_sq)
    if math.isfinite(ref):
        assert abs(got - ref) <= sum_of_squares_order_bound(M * N, ref), (got, ref)
    else:
        assert not math.isfinite(got)


def _check_bf16_sr(rule_name, M, N, K, seed, config, bad_rows=0, counter=None):
    """The bf16-sr regime: bf16 weight and state, rounded stochastically with the Philox words of
    each element's counter under the key; Gluon against the Triton kernel and the emulator."""
    from forge_num.emulator.philox import derive_seed
    from forge_num.kernels.gluon_update import fused_linear_update_ws

    rule, h, w32, s32, x, dy = _case(rule_name, M, N, K, seed, bad_rows)
    w0, s0 = w32.bfloat16(), [s.bfloat16() for s in s32]
    key = derive_seed(seed, 3, 2**40 + M)  # a key above 2^63 for some seeds: the u64 argument
    ww, sw = w0.clone(), [s.clone() for s in s0]
    stats_ws = fused_linear_update_ws(ww, x, dy, sw, rule, h, config=config, seed=key, counter=counter)
    wt, st = w0.clone(), [s.clone() for s in s0]
    stats_t = kernels.fused_linear_update(wt, x, dy, st, rule, h, config=TRITON_TWIN, seed=key, counter=counter)
    assert same_bits(ww, wt), "Gluon weight != Triton weight (bf16-sr)"
    for a, b in zip(sw, st):
        assert same_bits(a, b), "Gluon state != Triton state (bf16-sr)"
    assert int(stats_ws.nonfinite) == int(stats_t.nonfinite)
    grad = kernels.linear_mainloop(x, dy, config=TRITON_TWIN).cpu().numpy()
    p_e, s_e, bad_e = emulate_elementwise(bf16_bits(w0.cpu()), grad, [bf16_bits(s.cpu()) for s in s0], rule=rule, h=h,
                                          seed=key, counter=counter)
    assert np.array_equal(p_e, bf16_bits(ww.cpu())), "emulated epilogue != Gluon weight (bf16-sr)"
    for a, b in zip(s_e, sw):
        assert np.array_equal(a, bf16_bits(b.cpu())), "emulated epilogue != Gluon state (bf16-sr)"
    assert bad_e == int(stats_ws.nonfinite) and (bad_rows == 0) == (bad_e == 0)
    # the stochastic rounding happened: some weight's bits differ from round-to-nearest of the fp32 update
    p32, _, _ = emulate_elementwise(w0.float().cpu().numpy(), grad, [s.float().cpu().numpy() for s in s0], rule=rule,
                                    h=h)
    assert not np.array_equal(p_e, bf16_bits(torch.from_numpy(p32).bfloat16()))


def _bf16_sr_configs():
    from forge_num.kernels.gluon_update import BF16_SR_CANDIDATE_CONFIGS, BF16_SR_ROUTE_CONFIGS

    return [*BF16_SR_ROUTE_CONFIGS, *BF16_SR_CANDIDATE_CONFIGS]


@pytest.mark.parametrize("config", _bf16_sr_configs(), ids=lambda c: c.label)
@pytest.mark.parametrize("rule_name", sorted(HYPERS))
@pytest.mark.parametrize("M,N,K", [(64, 128, 64), (200, 264, 150), (8 * 37, 8 * 41, 1024)])
def test_ws_kernel_bf16_sr_gives_the_triton_kernels_bits(rule_name, M, N, K, config):
    _check_bf16_sr(rule_name, M, N, K, seed=M * 7 + N + K, config=config)


def test_ws_kernel_bf16_sr_shards_and_walks():
    """A column shard's counter map (its elements' indices in a parameter 3x as wide, from column
    N), a counter base past 2^32, non-finite gradients, and one program walking every tile."""
    for config in _bf16_sr_configs():
        _check_bf16_sr("adamw", 200, 264, 150, seed=21, config=config, counter=(264, 3 * 264, 264 + 2**33))
        _check_bf16_sr("adamw", 200, 264, 150, seed=22, config=config, bad_rows=3)
        with mock.patch.object(kernels, "_sm_count", lambda device: 1):
            _check_bf16_sr("lion", 320, 384, 200, seed=23, config=config)


def _configs():
    from forge_num.kernels.gluon_update import WSConfig

    from forge_num.kernels.gluon_update import CANDIDATE_CONFIGS, ROUTE_CONFIGS

    return [WSConfig(), WSConfig(BM=128, STAGES=2, SLOTS=2, OUT_SLOTS=1), *ROUTE_CONFIGS, *CANDIDATE_CONFIGS]


@pytest.mark.parametrize("config", _configs(), ids=lambda c: c.label)
@pytest.mark.parametrize("rule_name", sorted(HYPERS))
@pytest.mark.parametrize("M,N,K", [(64, 128, 64), (200, 264, 150), (8 * 37, 8 * 41, 1024), (512, 384, 8)])
def test_ws_kernel_gives_the_triton_kernels_bits(rule_name, M, N, K, config):
    _check(rule_name, M, N, K, seed=M * 7 + N + K, config=config)


def test_one_program_walks_every_tile():
    """With the multiprocessor count taken as 1, the one program walks all 5 x 3 tiles: the operand and
    state rings wrap many times, with their barriers' phases."""
    from forge_num.kernels.gluon_update import WSConfig

    with mock.patch.object(kernels, "_sm_count", lambda device: 1):
        for config in (*_configs(), WSConfig(GROUP_M=1)):
            _check("adamw", 320, 384, 200, seed=11, config=config)
            _check("lion", 8 * 37, 8 * 41, 70, seed=12, config=config)


def test_nonfinite_gradients_leave_their_elements_and_are_counted():
    _check("adamw", 200, 264, 150, seed=5, bad_rows=3)
    _check("sgd", 128, 256, 64, seed=6, bad_rows=2, grad_scale=0.5)


def test_refuses_what_it_does_not_cover():
    from forge_num.kernels.gluon_update import fused_linear_update_ws

    rule, h, w, s, x, dy = _case("adamw", 64, 128, 64, seed=1)
    with pytest.raises(TypeError, match="fp32 regime"):
        fused_linear_update_ws(w.bfloat16(), x, dy, s, rule, h)
    with pytest.raises(ValueError, match="needs seed="):
        fused_linear_update_ws(w.bfloat16(), x, dy, [t.bfloat16() for t in s], rule, h)
    with pytest.raises(TypeError, match="bf16 operands"):
        fused_linear_update_ws(w, x.float(), dy.float(), s, rule, h)
    with pytest.raises(ValueError, match="contiguous"):
        fused_linear_update_ws(w, x.t().contiguous().t(), dy, s, rule, h)
    with pytest.raises(ValueError, match="multiples of 8"):
        fused_linear_update_ws(w[:, :100].contiguous(), x[:, :100].contiguous(), dy, [t[:, :100].contiguous() for t in s],
                               rule, h)


def _selected_tiles(regime, tiles, routed):
    """tiles (a kernel's default and candidates); with FORGE_NUM_TEST_<regime>_ROUTED=1 in the environment its
    routed tiles only, with FORGE_NUM_TEST_<regime>_TILES=<label>,... those tiles only ('_' for ' '): for a
    device call short of time, or checking new candidates."""
    if os.environ.get(f"FORGE_NUM_TEST_{regime}_ROUTED") == "1":
        return list(dict.fromkeys(routed))
    named = os.environ.get(f"FORGE_NUM_TEST_{regime}_TILES")
    if named:
        labels = {label.replace("_", " ") for label in named.split(",")}
        unknown = labels - {c.label for c in tiles}
        assert not unknown, f"FORGE_NUM_TEST_{regime}_TILES names no tile: {sorted(unknown)}"
        return [c for c in tiles if c.label in labels]
    return list(tiles)


def _f32_configs():
    """The fp32 split tile's default and candidates, as _selected_tiles picks them (FORGE_NUM_TEST_F32_...)."""
    from forge_num.kernels.gluon_f32 import DEFAULT_F32_WS_CONFIG, F32_WS_CANDIDATE_CONFIGS, ROUTE_CONFIGS

    return _selected_tiles("F32", (DEFAULT_F32_WS_CONFIG, *F32_WS_CANDIDATE_CONFIGS), ROUTE_CONFIGS)


@pytest.mark.parametrize("config", _f32_configs(), ids=lambda c: c.label)
@pytest.mark.parametrize("rule_name", sorted(HYPERS))
@pytest.mark.parametrize("M,N,K", [(64, 128, 64), (200, 264, 150), (8 * 37, 8 * 41, 1024), (512, 384, 8)])
def test_f32_split_kernel_gives_the_triton_kernels_bits(rule_name, M, N, K, config):
    """kernels/gluon_f32.py's tiles: edge tiles past M and N, a partial last K block, K below one block, every
    rule with two, one and no states."""
    _check(rule_name, M, N, K, seed=M * 5 + N + K, config=config)


def test_f32_split_kernel_walks_every_tile_and_counts_nonfinite():
    """One program walking all 5 x 3 tiles (the operand ring and both g buffers wrapping, with their barriers'
    phases), and non-finite gradients left out of their elements and counted."""
    for config in _f32_configs():
        with mock.patch.object(kernels, "_sm_count", lambda device: 1):
            _check("adamw", 320, 384, 200, seed=13, config=config)
            _check("lion", 8 * 37, 8 * 41, 70, seed=14, config=config)
        _check("adamw", 200, 264, 150, seed=15, bad_rows=3, config=config)
        _check("sgd", 128, 256, 64, seed=16, bad_rows=2, grad_scale=0.5, config=config)


def test_f32_split_kernel_refuses_what_it_does_not_cover():
    from forge_num.kernels.gluon_f32 import fused_linear_update_f32_ws

    rule, h, w, s, x, dy = _case("adamw", 64, 128, 64, seed=1)
    with pytest.raises(TypeError, match="fp32 regime"):
        fused_linear_update_f32_ws(w.bfloat16(), x, dy, [t.bfloat16() for t in s], rule, h)
    with pytest.raises(TypeError, match="bf16 operands"):
        fused_linear_update_f32_ws(w, x.float(), dy.float(), s, rule, h)
    with pytest.raises(ValueError, match="contiguous"):
        fused_linear_update_f32_ws(w, x.t().contiguous().t(), dy, s, rule, h)
    with pytest.raises(ValueError, match="multiples of 8"):
        fused_linear_update_f32_ws(w[:, :100].contiguous(), x[:, :100].contiguous(), dy,
                                   [t[:, :100].contiguous() for t in s], rule, h)


@pytest.mark.parametrize("K", [256, 1024, 3072, 4096, 16385])  # each routed tile's range, and past them
def test_the_launcher_routes_fp32_to_the_split_tiles(K):
    """kernels.fused_linear_update with no tile given, fp32: gluon_f32.config_for's tile with FORGE_NUM_GLUON_F32
    unset (twice: the second launch cached) and =1; with =<label> the named split tile wherever it applies; with
    =0 none (gluon_update's route or the Triton kernel); the same bits every way."""
    from forge_num.kernels import gluon_f32

    M, N = 4096, 2048  # 64 x 16 = 1024 tiles, 512 of 128 rows
    rule, h, w0, s0, x, dy = _case("adamw", M, N, K, seed=33)
    expect = gluon_f32.config_for(M, N, K)
    assert (expect is None) == (K > gluon_f32.ROUTE_MAX_K)
    named = gluon_f32.F32_WS_CANDIDATE_CONFIGS[2]
    outs = []
    for flag, tile in ((None, expect), (None, expect), ("1", expect), ("0", None),
                       (named.label.replace(" ", "_"), named)):
        w, s = w0.clone(), [t.clone() for t in s0]
        with mock.patch.dict("os.environ", {"FORGE_NUM_GLUON": "1"}), \
                mock.patch.object(gluon_f32, "launch", wraps=gluon_f32.launch) as spy:
            os.environ.pop("FORGE_NUM_GLUON_F32", None)
            if flag is not None:
                os.environ["FORGE_NUM_GLUON_F32"] = flag
            kernels.fused_linear_update(w, x, dy, s, rule, h)
        assert [c.args[7] for c in spy.call_args_list] == ([tile] if tile is not None else [])
        outs.append((w, s))
    for w, s in outs[1:]:
        assert same_bits(w, outs[0][0]) and all(same_bits(a, b) for a, b in zip(s, outs[0][1]))
    with mock.patch.dict("os.environ", {"FORGE_NUM_GLUON_F32": "wsf_nonesuch"}), \
            pytest.raises(ValueError, match="FORGE_NUM_GLUON_F32"):
        kernels.fused_linear_update(w0.clone(), x, dy, [t.clone() for t in s0], rule, h)


def _spied_launch():
    """gluon_update.launch, wrapped: the launches run, and the mock records them."""
    from forge_num.kernels import gluon_update

    return mock.patch.object(gluon_update, "launch", wraps=gluon_update.launch)


def _tiles(launch):
    """The WSConfig of each recorded launch (launch's eighth argument)."""
    return [c.args[7] for c in launch.call_args_list]


@pytest.mark.parametrize("M,N,K", [(4096, 8192, 256), (4096, 4096, 1024), (4096, 4096, 4096)])
def test_the_launcher_routes_where_measured_faster(M, N, K, monkeypatch):
    """kernels.fused_linear_update with no tile given and the fp32 split tiles switched off
    (FORGE_NUM_GLUON_F32=0: where gluon_f32.config_for declines, as below MIN_TILES) takes the Gluon kernel on the
    ranges of gluon_update.config_for (here: K = 256 and 1024, not 4096), and its weight and state are the
    Triton kernel's bit for bit."""
    from forge_num.kernels import gluon_update

    monkeypatch.setenv("FORGE_NUM_GLUON_F32", "0")
    rule, h, w0, s0, x, dy = _case("adamw", M, N, K, seed=K)
    expect = gluon_update.config_for(M, N, K)
    assert (expect is not None) == (K < gluon_update.ROUTE_MAX_K)
    wr, sr = w0.clone(), [s.clone() for s in s0]
    with _spied_launch() as launch:
        kernels.fused_linear_update(wr, x, dy, sr, rule, h)
    assert _tiles(launch) == ([expect] if expect is not None else [])
    wt, st = w0.clone(), [s.clone() for s in s0]
    kernels.fused_linear_update(wt, x, dy, st, rule, h, config=TRITON_TWIN)
    assert same_bits(wr, wt) and all(same_bits(a, b) for a, b in zip(sr, st))
    # FORGE_NUM_GLUON=0: no route
    with mock.patch.dict("os.environ", {"FORGE_NUM_GLUON": "0"}), _spied_launch() as launch:
        kernels.fused_linear_update(w0.clone(), x, dy, [s.clone() for s in s0], rule, h)
    assert _tiles(launch) == []


@pytest.mark.parametrize("K", [256, 2048])
def test_the_launcher_routes_bf16_sr_where_enabled(K):
    """bf16-sr through kernels.fused_linear_update with no tile given: with FORGE_NUM_GLUON_BF16_SR=1
    the Gluon kernel (gluon_update.bf16_sr_config_for), with =0 the Triton kernel, the same bits."""
    from forge_num.emulator.philox import derive_seed
    from forge_num.kernels import gluon_update

    M, N = 4096, 8192 // (K // 256 if K > 256 else 1)
    rule, h, w32, s32, x, dy = _case("adamw", M, N, K, seed=K + 1)
    w0, s0 = w32.bfloat16(), [s.bfloat16() for s in s32]
    key = derive_seed(5, K, 9)
    outs = []
    for flag in ("1", "0"):
        w, s = w0.clone(), [t.clone() for t in s0]
        with mock.patch.dict("os.environ", {"FORGE_NUM_GLUON_BF16_SR": flag}), _spied_launch() as launch:
            kernels.fused_linear_update(w, x, dy, s, rule, h, seed=key)
        expect = gluon_update.bf16_sr_config_for(M, N, K)
        assert expect is not None
        assert _tiles(launch) == ([expect] if flag == "1" else [])
        outs.append((w, s))
    (wg, sg), (wt, st) = outs
    assert same_bits(wg, wt) and all(same_bits(a, b) for a, b in zip(sg, st))


def test_training_a_routed_layer_equals_the_materialized_reference():
    """A layer large enough to be routed (4096 -> 8192 features, 256 tokens a step: the fp32 split tile that
    gluon_f32.ROUTE_BY_K names for 256 tokens),
    trained for three steps under autocast: forge_num's fused path (through the Gluon kernel) gives
    the weights and state of its materialized backend bit for bit."""
    import copy

    import forge_num as fn
    from forge_num.fused import prepare
    from forge_num.kernels import gluon_f32
    from tests.test_gpu_training import Materialized, _assert_same
    from tests.test_training_semantics import ADAMW

    torch.manual_seed(0)
    m1 = torch.nn.Sequential(torch.nn.Linear(4096, 8192, bias=False)).to(CUDA)
    m2 = copy.deepcopy(m1)
    o1, o2 = fn.AdamW(m1.parameters(), **ADAMW), fn.AdamW(m2.parameters(), backend=Materialized, **ADAMW)
    prepare(m1, o1)
    prepare(m2, o2)
    with mock.patch.object(gluon_f32, "launch", wraps=gluon_f32.launch) as launch:
        for _ in range(3):
            x = torch.randn(256, 4096, device=CUDA)
            for m, o in ((m1, o1), (m2, o2)):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = m(x).float().square().mean()
                loss.backward()
                o.step()
                o.zero_grad()
    assert _tiles(launch) == [gluon_f32.config_for(8192, 4096, 256)] * 3
    _assert_same(m1, o1, m2, o2)


@pytest.mark.parametrize("rule_name", ["adamw", "sgd", "sgd-plain"])  # two, one and no states
def test_cached_launch_is_tritons_kernel_and_bits(rule_name):
    """kernels/launch_cache.py: the launch that skips Triton's argument binding picks, for shapes of
    every class its key tells apart (M, N, K each 1 or not, a multiple of 16 or not) and shapes it
    does not (equal flags, other values), the CompiledKernel that Triton's own lookup picks
    (JITFunction.run(..., warmup=True)), and gives the bits of the launch through JITFunction.run."""
    from forge_num.kernels import gluon_update as gu

    shapes = [(256, 256, 128), (512, 384, 64), (264, 136, 100), (520, 264, 36), (128, 256, 1), (136, 520, 17)]
    for config in gu.ROUTE_CONFIGS:
        for M, N, K in shapes:
            rule, h, w0, s0, x, dy = _case(rule_name, M, N, K, seed=M + N + K)
            outs = []
            for fast in ("0", "1"):
                w, s = w0.clone(), [t.clone() for t in s0]
                with mock.patch.dict("os.environ", {"FORGE_NUM_FAST_LAUNCH": fast}):
                    gu.fused_linear_update_ws(w, x, dy, s, rule, h, config=config)
                outs.append((w, s))
            (wj, sj), (wf, sf) = outs
            assert same_bits(wj, wf) and all(same_bits(a, b) for a, b in zip(sj, sf)), (config, M, N, K)
            norm_sq, nonfinite = kernels._telemetry_buffers(4, CUDA, launched=True)
            key, pins, grid, args, constants = gu._launch_arguments(w0, x, dy, s0, rule, h, 1.0, config,
                                                                      norm_sq, nonfinite)
            constexprs, options = constants()
            tritons = gu.fused_linear_update_ws_kernel.run(*args, grid=grid, warmup=True, **constexprs, **options)
            assert gu._LAUNCH.lookup(key) is tritons, (config, M, N, K)


def test_cached_launch_bf16_sr_whatever_the_key():
    """The bf16-sr launch's key does not name the Philox key or the counter map (typed u64 / i64 and
    not specialized): for keys and bases of every size class Triton's own lookup picks the kernel kept
    under that key, and both launch paths give the same bits. The cached launch goes first, so that
    each class meets the kernel kept for the one before (with the three typed by value, as in session
    20, a base past 2^31 met a kernel kept for an i32 base: an OverflowError)."""
    from forge_num.kernels import gluon_update as gu

    config = gu.BF16_SR_SMALL_K_CONFIG
    rule, h, w32, s32, x, dy = _case("adamw", 264, 136, 100, seed=3)
    w0, s0 = w32.bfloat16(), [s.bfloat16() for s in s32]
    for seed, base in ((1, 0), (16, 2**31), (2**31 + 5, 2**40 + 16), (2**63 + 7, 3), (2**64 - 1, 0)):
        rand = (seed, 136, base)
        outs = []
        for fast in ("1", "0"):
            w, s = w0.clone(), [t.clone() for t in s0]
            with mock.patch.dict("os.environ", {"FORGE_NUM_FAST_LAUNCH": fast}):
                gu.launch(w, x, dy, s, rule, h, 1.0, config, rand)
            outs.append((w, s))
        (wf, sf), (wj, sj) = outs
        assert same_bits(wj, wf) and all(same_bits(a, b) for a, b in zip(sj, sf)), (seed, base)
        norm_sq, nonfinite = kernels._telemetry_buffers(4, CUDA, launched=True)
        key, pins, grid, args, constants = gu._launch_arguments(w0, x, dy, s0, rule, h, 1.0, config, norm_sq,
                                                                  nonfinite, rand)
        constexprs, options = constants()
        tritons = gu.fused_linear_update_ws_kernel.run(*args, grid=grid, warmup=True, **constexprs, **options)
        assert gu._LAUNCH.lookup(key) is tritons, (seed, base)


# ---------------------------------------------------------------------------------------------
# The 8bit regime (kernels/gluon_q8.py): bf16 weight and Q8State states, the epilogue in warps of
# its own. Its twin is the Triton 8bit TMA tile (64x128x64: the same wgmma chain, K blocks of 64).
# ---------------------------------------------------------------------------------------------

Q8_TRITON_TWIN = kernels.DEFAULT_Q8_CONFIGS["tma"]


def _q8_configs():
    """The 8bit tile's default and candidates, as _selected_tiles picks them (FORGE_NUM_TEST_Q8_...)."""
    from forge_num.kernels.gluon_q8 import DEFAULT_Q8_WS_CONFIG, Q8_WS_CANDIDATE_CONFIGS, ROUTE_CONFIGS

    return _selected_tiles("Q8", (DEFAULT_Q8_WS_CONFIG, *Q8_WS_CANDIDATE_CONFIGS), ROUTE_CONFIGS)


def _q8_states(states, seed):
    """fp32 states (as _case draws them, scaled by 1e-2) quantized into 8bit states on the GPU: state 0
    signed (m), state 1 unsigned (v)."""
    from tests.kernel_cases import _q8_state

    return [kernels.Q8State(*(t.to(CUDA) for t in _q8_state(s.cpu() * 1e-2, signed=(i == 0), seed=seed + i)))
            for i, s in enumerate(states)]


def _q8_clone(states):
    return [kernels.Q8State(s.codes.clone(), s.scales.clone()) for s in states]


def _same_q8(a, b) -> bool:
    return torch.equal(a.codes, b.codes) and torch.equal(a.scales.view(torch.int32), b.scales.view(torch.int32))


def _check_q8(rule_name, M, N, K, seed, config, bad_rows=0, counter=None):
    """The 8bit regime: Gluon against the Triton 8bit kernel (weight, codes, scales bit for bit, the
    non-finite count equal, Σ g² within the telemetry bound) and against the emulator's kernel."""
    from forge_num.emulator import emulate
    from forge_num.emulator.philox import derive_seed
    from forge_num.kernels.gluon_q8 import fused_linear_update_q8_ws

    rule, h, w32, s32, x, dy = _case(rule_name, M, N, K, seed, bad_rows)
    w0 = w32.bfloat16()
    s0 = _q8_states(s32, seed)
    key = derive_seed(seed, 3, 2**40 + M)  # a key above 2^63 for some seeds: the u64 argument
    ww, sw = w0.clone(), _q8_clone(s0)
    stats_ws = fused_linear_update_q8_ws(ww, x, dy, sw, rule, h, config=config, seed=key, counter=counter)
    wt, st = w0.clone(), _q8_clone(s0)
    stats_t = kernels.fused_linear_update(wt, x, dy, st, rule, h, config=Q8_TRITON_TWIN, seed=key, counter=counter)
    assert same_bits(ww, wt), "Gluon weight != Triton weight (8bit)"
    for a, b in zip(sw, st):
        assert _same_q8(a, b), "Gluon state != Triton state (8bit)"
    assert int(stats_ws.nonfinite) == int(stats_t.nonfinite)
    assert (bad_rows == 0) == (int(stats_ws.nonfinite) == 0)
    res = emulate(bf16_bits(w0.cpu()), bf16_bits(x.cpu()), bf16_bits(dy.cpu()),
                  [(s.codes.cpu().numpy(), s.scales.cpu().numpy()) for s in s0], rule=rule, h=h,
                  tile=(config.BM, config.BN, config.BK), precision="8bit", seed=key, counter=counter)
    assert np.array_equal(res.weight, bf16_bits(ww.cpu())), "emulated kernel != Gluon weight (8bit)"
    for (c, sc), s in zip(res.states, sw):
        assert np.array_equal(c, s.codes.cpu().numpy()), "emulated codes != Gluon codes"
        assert np.array_equal(sc.view(np.uint32), s.scales.cpu().numpy().view(np.uint32)), "emulated scales differ"
    grad = kernels.linear_mainloop(x, dy, config=TRITON_TWIN).cpu().numpy().astype(np.float64)
    ref, got = float((grad * grad).sum()), float(stats_ws.norm_sq)
    if math.isfinite(ref):
        assert abs(got - ref) <= sum_of_squares_order_bound(M * N, ref), (got, ref)
    else:
        assert not math.isfinite(got)
    # not vacuous: the states moved
    assert any(not torch.equal(a.codes, b.codes) for a, b in zip(sw, s0))


@pytest.mark.parametrize("config", _q8_configs(), ids=lambda c: c.label)
@pytest.mark.parametrize("rule_name", ["adamw", "adam", "sgd", "lion"])  # two and one 8bit states
@pytest.mark.parametrize("M,N,K", [(64, 128, 64), (200, 264, 150), (8 * 37, 8 * 41, 1024), (512, 384, 8)])
def test_ws_kernel_8bit_gives_the_triton_kernels_bits(rule_name, M, N, K, config):
    _check_q8(rule_name, M, N, K, seed=M * 7 + N + K, config=config)


def test_ws_kernel_8bit_shards_walks_and_nonfinite():
    """A column shard's counter map (a counter base past 2^32), non-finite gradients, and one program
    walking every tile (the operand ring and both g buffers wrapping, with their phases)."""
    for config in _q8_configs():
        _check_q8("adamw", 200, 264, 150, seed=21, config=config, counter=(264, 3 * 264, 264 + 2**33))
        _check_q8("adamw", 200, 264, 150, seed=22, config=config, bad_rows=3)
        with mock.patch.object(kernels, "_sm_count", lambda device: 1):
            _check_q8("lion", 320, 384, 200, seed=23, config=config)
            _check_q8("adamw", 8 * 37, 8 * 41, 70, seed=24, config=config)
            _check_q8("sgd", 320, 384, 40, seed=25, config=config)  # one K block a tile (fewer than the stages)


@pytest.mark.parametrize("config", _q8_configs(), ids=lambda c: c.label)
def test_ws_kernel_8bit_pairs_and_single_calls_give_the_same_bits(config):
    """The 8bit table draws one Philox call a pair of counters (2k, 2k + 1). Where every row's counters
    start even the tiles compute each call once for both elements (RAND_PAIRS); where a counter map's
    row stride or base is odd (a row then starts mid-pair) each element computes its own pair's call:
    both against the Triton tile and the emulator, and with the pairs turned off on even counters."""
    from forge_num.kernels import gluon_q8

    assert gluon_q8.rand_pairs(264, 2**33) and not gluon_q8.rand_pairs(265, 0) and not gluon_q8.rand_pairs(264, 1)
    _check_q8("adamw", 200, 264, 150, seed=31, config=config, counter=(264, 3 * 264 + 1, 2**33))
    _check_q8("lion", 200, 264, 150, seed=32, config=config, counter=(264, 264, 2**33 + 1))
    with mock.patch.object(gluon_q8, "RAND_PAIRS_ENABLED", False):
        _check_q8("adamw", 200, 264, 150, seed=33, config=config)


def test_ws_kernel_8bit_staged_state_at_the_edges():
    """The stage_state tiles (v38: the next sub-tiles' W and codes by TMA, two slots) and the mma_stage tiles
    (v44: each tile's, by the MMA warps, a slot a g buffer) where the shapes above take their unstaged twins
    (N not a multiple of 16): tiles past M and N (200 = 3 x 64 + 8 rows, 400 = 3 x 128 + 16 columns: the TMA
    boxes' zeros), one program walking every tile (the slots' phases across tiles; stage_state's copies past
    the last tile waited for), one state (Lion) and two, a shard's counter map."""
    from forge_num.kernels import gluon_q8

    for config in (c for c in _q8_configs() if c.stage_state or c.mma_stage):
        assert gluon_q8.unstaged(config) != config
        _check_q8("adamw", 200, 400, 150, seed=41, config=config)
        _check_q8("lion", 200, 400, 150, seed=42, config=config, counter=(400, 3 * 400, 400 + 2**33))
        _check_q8("adamw", 200, 400, 150, seed=43, config=config, bad_rows=3)
        with mock.patch.object(kernels, "_sm_count", lambda device: 1):
            _check_q8("adamw", 200, 400, 150, seed=44, config=config)
            _check_q8("sgd", 8 * 37, 16 * 23, 70, seed=45, config=config)
        with mock.patch.object(kernels, "_sm_count", lambda device: 3):  # programs ending on different tiles
            _check_q8("lion", 320, 384, 64, seed=46, config=config)


class _Guarded:
    """Tensors carved from one buffer of random bytes, GUARD bytes of it before, between and after them (each
    tensor 256-byte aligned, as TMA needs 16): ``untouched()`` says whether every byte outside the tensors is
    as it was. Why (session 36): an update that writes past its own tensors changes a neighbour's memory, and
    the bit tests, which read the update's own tensors, cannot see it; in a model the neighbour may be a
    weight."""

    GUARD = 4096

    def __init__(self, specs, seed):
        sizes = [math.prod(shape) * torch.empty(0, dtype=dtype).element_size() for shape, dtype in specs]
        spans, offset = [], self.GUARD
        for size in sizes:
            spans.append((offset, offset + size))
            offset += -(-size // 256) * 256 + self.GUARD
        g = torch.Generator(device=CUDA).manual_seed(seed)
        self.buffer = torch.randint(0, 256, (offset + 256,), dtype=torch.uint8, device=CUDA, generator=g)
        self.outside = torch.ones(offset + 256, dtype=torch.bool, device=CUDA)
        shift = -self.buffer.data_ptr() % 256  # each tensor 256-byte aligned whatever the buffer's alignment
        self.tensors = []
        for (shape, dtype), (a, b) in zip(specs, spans):
            a, b = a + shift, b + shift
            self.outside[a:b] = False
            self.tensors.append(self.buffer[a:b].view(dtype).view(shape))
        self.before = self.buffer.clone()

    def untouched(self) -> bool:
        torch.cuda.synchronize()
        return torch.equal(self.buffer[self.outside], self.before[self.outside])


@pytest.mark.parametrize("M,N,K", [(2048, 8192, 1024), (200, 400, 150)])
def test_the_kernels_write_nothing_outside_their_tensors(M, N, K):
    """Every Gluon tile (8bit: the default, the candidates, the staged ones; fp32: the split tiles) and the Triton
    twins, on weight and state tensors carved from one buffer with guard bytes around each (_Guarded), and
    telemetry slots carved likewise: the guard bytes unchanged after the update, and the update's bits the same
    as on tensors of their own."""
    telemetry = []

    def guarded_telemetry(tiles, device, launched):
        guarded = _Guarded([((tiles,), torch.float64), ((tiles,), torch.int32)], seed=54 + len(telemetry))
        telemetry.append(guarded)
        return guarded.tensors[0], guarded.tensors[1]

    with mock.patch.object(kernels, "_telemetry_buffers", guarded_telemetry):
        _write_nothing_outside(M, N, K)
    assert telemetry and all(g.untouched() for g in telemetry), "a kernel wrote past its telemetry slots"


def _write_nothing_outside(M, N, K):
    """test_the_kernels_write_nothing_outside_their_tensors' updates, tile by tile."""
    from forge_num.emulator.philox import derive_seed
    from forge_num.kernels.gluon_f32 import fused_linear_update_f32_ws
    from forge_num.kernels.gluon_q8 import fused_linear_update_q8_ws

    rule, h, w32, s32, x, dy = _case("adamw", M, N, K, seed=51)
    key = derive_seed(51, 3, 7)
    w0, q0 = w32.bfloat16(), _q8_states(s32, 51)
    n_blocks = q0[0].scales.shape[1]
    for config in [None, *_q8_configs()]:
        specs = [((M, N), torch.bfloat16)] + [((M, N), torch.uint8), ((M, n_blocks), torch.float32)] * 2
        guarded = _Guarded(specs, seed=52)
        w, c0, sc0, c1, sc1 = guarded.tensors
        for t, v in zip((w, c0, sc0, c1, sc1), (w0, q0[0].codes, q0[0].scales, q0[1].codes, q0[1].scales)):
            t.copy_(v)
        states = [kernels.Q8State(c0, sc0), kernels.Q8State(c1, sc1)]
        own_w, own_s = w0.clone(), _q8_clone(q0)
        if config is None:
            for ww, ss in ((w, states), (own_w, own_s)):
                kernels.fused_linear_update(ww, x, dy, ss, rule, h, config=Q8_TRITON_TWIN, seed=key)
        else:
            for ww, ss in ((w, states), (own_w, own_s)):
                fused_linear_update_q8_ws(ww, x, dy, ss, rule, h, config=config, seed=key)
        label = "triton 8bit" if config is None else config.label
        assert guarded.untouched(), f"{label}: bytes outside the tensors changed"
        assert same_bits(w, own_w) and all(_same_q8(a, b) for a, b in zip(states, own_s)), label
    for config in [None, *_f32_configs()]:
        guarded = _Guarded([((M, N), torch.float32)] * 3, seed=53)
        w, m, v = guarded.tensors
        for t, src in zip((w, m, v), (w32, *s32)):
            t.copy_(src)
        own = [w32.clone(), *(t.clone() for t in s32)]
        for ww, *ss in ((w, m, v), own):
            if config is None:
                kernels.fused_linear_update(ww, x, dy, ss, rule, h, config=TRITON_TWIN)
            else:
                fused_linear_update_f32_ws(ww, x, dy, ss, rule, h, config=config)
        label = "triton fp32" if config is None else config.label
        assert guarded.untouched(), f"{label}: bytes outside the tensors changed"
        assert all(same_bits(a, b) for a, b in zip((w, m, v), own)), label


def test_ws_kernel_8bit_refuses_what_it_does_not_cover():
    from forge_num.kernels.gluon_q8 import fused_linear_update_q8_ws

    rule, h, w, s, x, dy = _case("adamw", 64, 128, 64, seed=1)
    q = _q8_states(s, 0)
    with pytest.raises(TypeError, match="8bit regime"):
        fused_linear_update_q8_ws(w, x, dy, q, rule, h, seed=1)
    with pytest.raises(TypeError, match="8bit regime"):
        fused_linear_update_q8_ws(w.bfloat16(), x, dy, [t.bfloat16() for t in s], rule, h, seed=1)
    with pytest.raises(ValueError, match="needs a seed"):
        fused_linear_update_q8_ws(w.bfloat16(), x, dy, q, rule, h)
    with pytest.raises(ValueError, match="gathered rows"):
        fused_linear_update_q8_ws(w.bfloat16(), x, dy, q, rule, h, seed=1,
                                  counter=(128, 128, 0, torch.arange(64, device=CUDA)))
    with pytest.raises(TypeError, match="bf16 operands"):
        fused_linear_update_q8_ws(w.bfloat16(), x.float(), dy.float(), q, rule, h, seed=1)
    with pytest.raises(ValueError, match="contiguous"):
        fused_linear_update_q8_ws(w.bfloat16(), x.t().contiguous().t(), dy, q, rule, h, seed=1)


@pytest.mark.parametrize("K", [1024, 2048, 3072, 4096, 8192])  # each routed tile's range
def test_the_launcher_routes_8bit_where_measured_faster(K):
    """kernels.fused_linear_update with no tile given, 8bit states: gluon_q8.config_for's tile with
    FORGE_NUM_GLUON_Q8=1 (and unset, where gluon_q8.ROUTED), none with =0 (the Triton kernel); the same bits, and
    a cached second launch (kernels/launch_cache.py) the same bits again."""
    from forge_num.emulator.philox import derive_seed
    from forge_num.kernels import gluon_q8

    M, N = 4096, 2048  # 64 x 16 = 1024 tiles
    rule, h, w32, s32, x, dy = _case("adamw", M, N, K, seed=31)
    w0 = w32.bfloat16()
    s0 = _q8_states(s32, 0)
    key = derive_seed(7, 3, 11)
    expect = gluon_q8.config_for(M, N, K)
    assert expect is not None
    outs = []
    for flag, fast in ((None, "0"), ("1", "1"), ("1", "1"), ("0", "1")):
        w, s = w0.clone(), _q8_clone(s0)
        env = {"FORGE_NUM_GLUON": "1", "FORGE_NUM_FAST_LAUNCH": fast}
        with mock.patch.dict("os.environ", env), mock.patch.object(gluon_q8, "launch", wraps=gluon_q8.launch) as spy:
            os.environ.pop("FORGE_NUM_GLUON_Q8", None)
            if flag is not None:
                os.environ["FORGE_NUM_GLUON_Q8"] = flag
            kernels.fused_linear_update(w, x, dy, s, rule, h, seed=key)
        routed = flag == "1" or (flag is None and gluon_q8.ROUTED)
        assert [c.args[7] for c in spy.call_args_list] == ([expect] if routed else [])
        outs.append((w, s))
    for w, s in outs[1:]:
        assert same_bits(w, outs[0][0]) and all(_same_q8(a, b) for a, b in zip(s, outs[0][1]))


@pytest.mark.parametrize("regime,M,N,K", [("fp32", 4096, 8192, 256), ("fp32", 4096, 4096, 1024),
                                          ("fp32", 4096, 4096, 4096), ("fp32-split", 4096, 4096, 1024),
                                          ("fp32-split", 4096, 4096, 4096),
                                          ("8bit", 4096, 2048, 1024),
                                          ("8bit", 4096, 2048, 4096), ("bf16-sr", 2048, 2048, 512)])
def test_a_launch_reads_its_scalars_from_the_step_slot(regime, M, N, K, monkeypatch):
    """kernels.fused_linear_update's default path (the Gluon routes where they take the shape, the Triton
    tiles elsewhere) given a step slot (a captured step's launch): the bits of a launch passed the
    slot's scalars, while its own arguments hold another step's (another step, scale and key, whose
    bits differ); then a second, cached launch on the updated tensors after the slot is rewritten with
    the next step's scalars (what a replay's next step does): the bits of that step passed as arguments.
    Each launch runs as it is issued; the slot is read when it runs."""
    from forge_num.emulator.philox import derive_seed

    rule, _, w32, s32, x, dy = _case("adamw", M, N, K, seed=41)
    hyper = HYPERS["adamw"]
    from forge_num.kernels import gluon_f32, gluon_q8, gluon_update

    # fp32-split: the fp32 regime routed as by default (kernels/gluon_f32.py's tiles where they apply); fp32: with
    # them switched off (FORGE_NUM_GLUON_F32=0), gluon_update's route and the Triton tiles
    split_routed = regime == "fp32-split" and gluon_f32.config_for(M, N, K) is not None
    if regime == "fp32-split":
        monkeypatch.delenv("FORGE_NUM_GLUON_F32", raising=False)
    else:
        monkeypatch.setenv("FORGE_NUM_GLUON_F32", "0")
    monkeypatch.setenv("FORGE_NUM_GLUON_Q8", "1")  # the 8bit Gluon route, off by default (gluon_q8.ROUTED)
    regime = "fp32" if regime == "fp32-split" else regime
    if regime == "fp32":
        w0, s0, clone = w32, s32, (lambda s: [t.clone() for t in s])
    elif regime == "8bit":
        w0, s0, clone = w32.bfloat16(), _q8_states(s32, 0), _q8_clone
    else:
        w0, s0, clone = w32.bfloat16(), [s.bfloat16() for s in s32], (lambda s: [t.clone() for t in s])
    stochastic = regime != "fp32"

    def scalars(step, scale, user_seed):
        return rule.scalars(hyper, step), scale, derive_seed(user_seed, step, 3) if stochastic else None

    def update(w, s, passed, slot=None):
        h, scale, key = passed
        kernels.fused_linear_update(w, x, dy, s, rule, h, grad_scale=scale, seed=key, step_slot=slot)

    def flat(w, s):
        return [w, *(t for st in s for t in ((st.codes, st.scales) if regime == "8bit" else (st,)))]

    steps = (scalars(3, 0.75, 7), scalars(4, 0.5, 7))
    decoy = scalars(1, 1.0, 8)
    passed_w, passed_s = w0.clone(), clone(s0)
    slot_w, slot_s = w0.clone(), clone(s0)
    slot = torch.empty(kernels.step_slot_size(rule), dtype=torch.int32, device=CUDA)
    routed = {"fp32": split_routed or gluon_update.config_for(M, N, K) is not None, "8bit": True,
              "bf16-sr": False}[regime]
    module = gluon_q8 if regime == "8bit" else gluon_f32 if split_routed else gluon_update
    slot_arg = 8 if module is gluon_f32 else 9  # launch's step_slot
    for step in steps:
        update(passed_w, passed_s, step)
        slot.copy_(torch.tensor(kernels.step_slot_words(*step), dtype=torch.int32))
        with mock.patch.object(module, "launch", wraps=module.launch) as spy:
            update(slot_w, slot_s, decoy, slot)
        assert [c.args[slot_arg] is slot for c in spy.call_args_list] == ([True] if routed else [])  # the route ran
        torch.cuda.synchronize()
        assert all(same_bits(a, b) for a, b in zip(flat(slot_w, slot_s), flat(passed_w, passed_s)))
    decoy_w, decoy_s = w0.clone(), clone(s0)
    update(decoy_w, decoy_s, decoy)
    once_w, once_s = w0.clone(), clone(s0)
    update(once_w, once_s, steps[0])
    assert not all(same_bits(a, b) for a, b in zip(flat(decoy_w, decoy_s), flat(once_w, once_s)))
