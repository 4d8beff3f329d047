"""Where kernels.fused_linear_update sends an fp32-regime update to the warp-specialized Gluon kernel
(kernels/gluon_update.py: config_for, route_config), checked on the CPU: the measured ranges, and
never off an sm_90 GPU (here, the CPU and the interpreter take the Triton kernel)."""

from __future__ import annotations

import pytest
import torch

from forge_num import kernels, rules

gluon_update = pytest.importorskip("forge_num.kernels.gluon_update")


@pytest.mark.parametrize("M,N,K,expect", [
    (4096, 8192, 256, "small"), (8192, 8192, 256, "small"),   # 4096 x 8192 x 256 = 2^33: the least routed work
    (4096, 4096, 512, "mid"), (8192, 8192, 257, "mid"), (14336, 4096, 1024, "mid"), (4096, 4096, 2048, "mid"),
    (4096, 4096, 4095, "mid"),
    (4096, 4096, 4096, None), (8192, 8192, 16384, None),      # the Triton persistent 128x128 from 4096 tokens
    (2048, 2048, 1024, None), (4096, 4096, 256, None),        # less work than ROUTE_MIN_WORK: host-bound
    (4100, 8192, 1024, None), (8192, 4100, 1024, None),       # rows TMA cannot take in bf16 (not multiples of 8)
    (8192, 8192, 0, None),
])
def test_config_for_the_measured_ranges(M, N, K, expect):
    got = gluon_update.config_for(M, N, K)
    want = {"small": gluon_update.ROUTE_SMALL_K_CONFIG, "mid": gluon_update.ROUTE_MID_K_CONFIG, None: None}[expect]
    assert got == want


def test_route_configs_fit_an_sm():
    """Each routed tile's programs fit the H200's shared memory (227 KB a block, 228 KB an SM)."""
    for c in gluon_update.ROUTE_CONFIGS:
        per_program = c.shared_bytes(2) + 1024  # + barriers and the block's reserved kilobyte
        assert c.programs * per_program <= 228 * 1024, c


def test_no_route_off_the_gpu():
    w = torch.zeros(4096, 4096)
    x = torch.zeros(512, 4096, dtype=torch.bfloat16)
    dy = torch.zeros(512, 4096, dtype=torch.bfloat16)
    assert gluon_update.route_config(w, x, dy, [torch.zeros_like(w)] * 2) is None
    assert kernels._ws_route(w, x, dy, [torch.zeros_like(w)] * 2) is None


def test_an_interpreted_launch_takes_the_triton_kernel(monkeypatch):
    """Under TRITON_INTERPRET the launcher never asks for the route (the Gluon kernel does not run
    on the interpreter); a route that would be taken raises here."""
    monkeypatch.setattr(kernels, "_ws_route", lambda *a: (_ for _ in ()).throw(AssertionError("routed")))
    monkeypatch.setattr(kernels, "_interpreting", lambda: True)
    w = torch.zeros(16, 16)
    kernels.fused_linear_update(w, torch.zeros(4, 16), torch.zeros(4, 16), [torch.zeros_like(w)] * 2, rules.ADAMW,
                                rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                                                     "weight_decay": 0.0}, 1))


def test_the_pingpong_design_takes_one_64_row_program_with_a_register_cap():
    """WSConfig(pingpong=...) names what it cannot run: another tile height, two programs an SM, the
    split design beside it, or no register cap at launch (the two consumers' setmaxnreg needs one)."""
    WSConfig = gluon_update.WSConfig
    for bad in (dict(BM=128, max_registers=168), dict(programs=2, max_registers=168),
                dict(split_mma=True, max_registers=128), dict()):
        with pytest.raises(ValueError, match="ping-pong"):
            WSConfig(pingpong=240, **bad)
    c = gluon_update.PINGPONG_CONFIG
    assert c.label.endswith("pp240") and c.num_warps == 4
    # two staging slots' worth: each consumer its own
    assert c.shared_bytes(2) - WSConfig(STAGES=4, SLOTS=2, OUT_SLOTS=1).shared_bytes(2) == 3 * 64 * 32 * 4


@pytest.mark.parametrize("shape,block,dtype_name", [((256, 512), (64, 128), "float32"), ((1024, 64), (64, 64), "bfloat16")])
def test_a_descriptor_set_directly_equals_tritons_constructor(shape, block, dtype_name):
    """_nvmma_desc skips TensorDescriptor's __post_init__ (its checks are the callers'): every field of the
    installed Triton's (3.6's, or 3.9's with round_f32_to_tf32) equals what the constructor makes, and the
    builder knows this Triton's fields (else every launch would pay the constructor)."""
    import dataclasses

    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    assert gluon_update._build_desc is not None, [f.name for f in dataclasses.fields(TensorDescriptor)]
    t = torch.empty(shape, dtype=getattr(torch, dtype_name))
    gl_dtype = getattr(gl, dtype_name)
    fast = gluon_update._nvmma_desc(t, block, gl_dtype)
    made = TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), gluon_update._nvmma_layout(block, gl_dtype))
    assert type(fast) is TensorDescriptor and fast.base is t
    for f in dataclasses.fields(TensorDescriptor):
        assert getattr(fast, f.name) is t if f.name == "base" else getattr(fast, f.name) == getattr(made, f.name), f
    assert fast == made


@pytest.mark.parametrize("M,N,K,expect", [
    (4096, 8192, 256, "small"), (4096, 4096, 1024, "small"), (4096, 4096, 2048, "large"),
    (14336, 4096, 16384, "large"), (4096, 4096, 16385, None), (4096, 4096, 256, None), (4100, 8192, 1024, None),
    (8192, 8192, 0, None),
])
def test_bf16_sr_config_for(M, N, K, expect):
    got = gluon_update.bf16_sr_config_for(M, N, K)
    want = {"small": gluon_update.BF16_SR_SMALL_K_CONFIG, "large": gluon_update.BF16_SR_LARGE_K_CONFIG, None: None}
    assert got == want[expect]


def test_bf16_sr_configs_fit_an_sm_and_split_in_eighths():
    """bf16 state slots are half the fp32 ones; every bf16-sr tile takes eight column sub-tiles."""
    for c in (*gluon_update.BF16_SR_ROUTE_CONFIGS, *gluon_update.BF16_SR_CANDIDATE_CONFIGS):
        assert c.split == 8 and c.SW == c.BN // 8 and c.label.endswith("e8")
        assert c.programs * (c.shared_bytes(2, state_bytes=2) + 1024) <= 228 * 1024, c
    with pytest.raises(ValueError, match="4 or 8 column sub-tiles"):
        gluon_update.WSConfig(split=2)
    with pytest.raises(ValueError, match="4 or 8 column sub-tiles"):
        gluon_update.WSConfig(split=8, split_mma=True, max_registers=128)


def test_the_bf16_sr_kernel_names_what_it_refuses():
    """bf16-sr needs a key, one storage dtype throughout, and not the split design (checked before any
    launch, so on the CPU)."""
    w = torch.zeros(64, 128, dtype=torch.bfloat16)
    x = torch.zeros(64, 128, dtype=torch.bfloat16)
    dy = torch.zeros(64, 64, dtype=torch.bfloat16)
    states = [torch.zeros_like(w), torch.zeros_like(w)]
    h = rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}, 1)
    with pytest.raises(ValueError, match="needs seed="):
        gluon_update.fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h)
    with pytest.raises(ValueError, match="needs seed="):
        gluon_update.fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, seed=2**64)
    with pytest.raises(TypeError, match="bf16-sr regime"):
        gluon_update.fused_linear_update_ws(w, x, dy, [states[0].float(), states[1]], rules.ADAMW, h, seed=1)
    with pytest.raises(ValueError, match="split design"):
        gluon_update.fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, seed=1, config=gluon_update.SPLIT_CONFIG)
    with pytest.raises(ValueError, match="gathered rows"):
        gluon_update.fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, seed=1,
                                            counter=(128, 128, 0, torch.arange(64)))


def test_the_bf16_sr_kernel_takes_the_counter_map(monkeypatch):
    """fused_linear_update_ws hands the launch (seed, row_stride, base) of its counter map, the flat
    indices without one (the launch itself stubbed: checked before it, so on the CPU)."""
    w = torch.zeros(64, 128, dtype=torch.bfloat16)
    x = torch.zeros(64, 128, dtype=torch.bfloat16)
    dy = torch.zeros(64, 64, dtype=torch.bfloat16)
    states = [torch.zeros_like(w), torch.zeros_like(w)]
    h = rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}, 1)
    seen = []
    monkeypatch.setattr(gluon_update, "launch", lambda *args: seen.append(args[-1]))
    gluon_update.fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, seed=7)
    gluon_update.fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, seed=7, counter=(128, 256, 640))
    gluon_update.fused_linear_update_ws(w.float(), x, dy, [s.float() for s in states], rules.ADAMW, h)
    assert seen == [(7, 128, 0), (7, 256, 640), None]


def test_no_bf16_sr_route_off_the_gpu_or_unless_enabled(monkeypatch):
    w = torch.zeros(4096, 8192, dtype=torch.bfloat16)
    x = torch.zeros(1024, 8192, dtype=torch.bfloat16)
    dy = torch.zeros(1024, 4096, dtype=torch.bfloat16)
    monkeypatch.setenv("FORGE_NUM_GLUON_BF16_SR", "1")
    assert gluon_update.route_config(w, x, dy, [torch.zeros_like(w)] * 2) is None  # a CPU tensor


def test_launch_arguments_carry_the_regime_and_the_philox_key(monkeypatch):
    """_launch_arguments (CPU tensors, the SM count mocked): the bf16-sr launch passes its key and
    counter map as the kernel's last three runtime arguments, bf16 state descriptors, and a cache key
    and constexprs of its own; the fp32 launch passes zeros there and its own key."""
    from triton.experimental.gluon import language as gl

    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)
    c = gluon_update.BF16_SR_SMALL_K_CONFIG
    h = rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}, 1)
    x = torch.zeros(64, 256, dtype=torch.bfloat16)
    dy = torch.zeros(64, 128, dtype=torch.bfloat16)
    norm_sq, nonfinite = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)
    keys = {}
    for dtype, rand in ((torch.bfloat16, (2**63 + 9, 256, 2**33)), (torch.float32, None)):
        w = torch.zeros(128, 256, dtype=dtype)
        states = [torch.zeros_like(w), torch.zeros_like(w)]
        key, pins, grid, args, constants = gluon_update._launch_arguments(w, x, dy, states, rules.ADAMW, h, 1.0, c,
                                                                          norm_sq, nonfinite, rand)
        constexprs, options = constants()
        names = [p.name for p in gluon_update.fused_linear_update_ws_kernel.params]
        assert names[len(args) - 4:len(args)] == ["seed", "rand_stride", "rand_base", "step_slot"]
        assert args[-4:] == (*(rand if rand is not None else (0, 0, 0)), None)
        storage = gl.bfloat16 if dtype == torch.bfloat16 else gl.float32
        assert all(d.layout.element_bitwidth == storage.primitive_bitwidth for d in args[2:5])
        assert constexprs["BF16_STORAGE"] == (rand is not None) and options["enable_fp_fusion"] is False
        assert grid == (min(c.programs * 132, 2 * 2),)  # two programs an SM, no more than the 2 x 2 tiles
        keys[dtype] = (key, pins)
    assert keys[torch.bfloat16][0] != keys[torch.float32][0] and keys[torch.bfloat16][1] != keys[torch.float32][1]


def test_a_step_slot_is_in_the_launch_key(monkeypatch):
    """gluon_update._launch_arguments' key tells apart launches without a step slot, with an aligned
    one and with a misaligned one, which Triton's binder specializes differently; launches alike in
    those share a key and a specialization."""
    from tests.test_launch_cache import _binder_specialization

    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)
    c = gluon_update.ROUTE_SMALL_K_CONFIG
    h = rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}, 1)
    x, dy = torch.zeros(64, 256, dtype=torch.bfloat16), torch.zeros(64, 128, dtype=torch.bfloat16)
    w = torch.zeros(128, 256)
    states = [torch.zeros_like(w), torch.zeros_like(w)]
    size = kernels.step_slot_size(rules.ADAMW)
    by_key, specs = {}, set()
    for offset in (None, 0, 1, None, 0, 1):
        slot = None if offset is None else torch.zeros(size + 4, dtype=torch.int32)[offset:][:size]
        key, _, _, args, constants = gluon_update._launch_arguments(
            w, x, dy, states, rules.ADAMW, h, 1.0, c, torch.zeros(4, dtype=torch.float64),
            torch.zeros(4, dtype=torch.int32), None, slot)
        constexprs, options = constants()
        spec = _binder_specialization(gluon_update.fused_linear_update_ws_kernel, args, constexprs,
                                      {k: v for k, v in options.items() if v is not None})
        assert by_key.setdefault(key, spec) == spec, offset
        specs.add(spec)
    assert len(by_key) == len(specs) == 3
