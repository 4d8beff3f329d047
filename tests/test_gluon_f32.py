"""The fp32 regime's split Gluon kernel (kernels/gluon_f32.py), what can be checked on the CPU: its tiles fit an
SM, it names what it refuses before any launch, it is never routed off an sm_90 GPU or unless switched on, and
its launch key determines Triton's specialization. Its bits are checked on the GPU (tests/test_gpu_gluon.py),
its PTX on the CPU (tests/test_ptx.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from forge_num import kernels, rules

gluon_f32 = pytest.importorskip("forge_num.kernels.gluon_f32")
gluon_update = pytest.importorskip("forge_num.kernels.gluon_update")

H = rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}, 1)
LION = rules.LION.scalars({"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0}, 1)
TILES = (gluon_f32.DEFAULT_F32_WS_CONFIG, *gluon_f32.F32_WS_CANDIDATE_CONFIGS)


def _problem(M=64, N=128, K=64, n_state=2):
    w = torch.zeros(M, N)
    x = torch.zeros(K, N, dtype=torch.bfloat16)
    dy = torch.zeros(K, M, dtype=torch.bfloat16)
    return w, x, dy, [torch.zeros(M, N) for _ in range(n_state)]


def test_its_tiles_fit_an_sm():
    """Each tile's one program fits the H200's shared memory (227 KB a block) and its warps the SM's 65536
    registers at the launch's cap; the labels tell the tiles apart."""
    for c in TILES:
        assert c.shared_bytes() + 1024 <= 227 * 1024, c
        assert c.max_registers * 32 * (c.num_warps + c.BM // 16 + (0 if c.self_load else 4)) <= 65536, c
    assert len({c.label for c in TILES}) == len(TILES)


@pytest.mark.parametrize("bad, match", [
    (dict(BM=256), "BM must be 64 or 128"), (dict(BN=96), "multiple of 128"), (dict(STAGES=1), "at least 2 operand stages"),
    (dict(BK=40), "multiple of 16"), (dict(ROWS=8), "got 16 warps, 8 rows"), (dict(ROWS=24, num_warps=8), "24 rows"),
    (dict(num_warps=12, ROWS=24), "got 12 warps"), (dict(max_registers=128), "exceed the SM's 65536"),
    (dict(self_load=False, num_warps=8), "self_load=True"), (dict(STAGES=8), "exceed the 227 KB"),
    (dict(g_buffers=3), "1 or 2 g buffers"), (dict(BM=128, num_warps=8, max_registers=128, g_buffers=1, STAGES=6),
                                               "exceed the 227 KB"),
])
def test_a_config_names_what_it_cannot_run(bad, match):
    with pytest.raises(ValueError, match=match):
        gluon_f32.F32WSConfig(**bad)


def test_the_kernel_names_what_it_refuses():
    """Checked before any launch, so on the CPU: the regime, the operands' dtype, layout and shapes, the
    states' number, dtypes and shapes."""
    w, x, dy, s = _problem()
    f = gluon_f32.fused_linear_update_f32_ws
    with pytest.raises(TypeError, match="fp32 regime"):
        f(w.bfloat16(), x, dy, [t.bfloat16() for t in s], rules.ADAMW, H)
    with pytest.raises(TypeError, match="fp32 regime"):
        f(w, x, dy, [s[0], s[1].double()], rules.ADAMW, H)
    with pytest.raises(TypeError, match="bf16 operands"):
        f(w, x.float(), dy.float(), s, rules.ADAMW, H)
    with pytest.raises(ValueError, match="at most 1 states"):
        f(w, x, dy, s, rules.LION, LION)
    with pytest.raises(ValueError, match="do not make dW"):
        f(w, x[:, :64], dy, s, rules.ADAMW, H)
    with pytest.raises(ValueError, match="K = 0"):
        f(w, x[:0], dy[:0], s, rules.ADAMW, H)
    with pytest.raises(ValueError, match="contiguous"):
        f(w, x.t().contiguous().t(), dy, s, rules.ADAMW, H)
    with pytest.raises(ValueError, match=r"state 1 of shape \(64, 64\)"):
        f(w, x, dy, [s[0], s[1][:, :64].contiguous()], rules.ADAMW, H)
    w2, x2, dy2, s2 = _problem(M=60)
    with pytest.raises(ValueError, match="multiples of 8"):
        f(w2, x2, dy2, s2, rules.ADAMW, H)


def test_no_route_off_the_gpu_or_unless_switched_on(monkeypatch):
    """Never routed off an sm_90 GPU, whatever the switch; an unknown label is an error naming the known ones
    (checked before the device is looked at)."""
    w, x, dy, s = _problem(M=4096, N=4096, K=4096)
    for flag in ("1", "0", TILES[-1].label.replace(" ", "_")):
        monkeypatch.setenv("FORGE_NUM_GLUON_F32", flag)
        assert gluon_f32.route_config(w, x, dy, s) is None  # CPU tensors
        assert kernels._ws_f32_route(w, x, dy, s) is None
    monkeypatch.setenv("FORGE_NUM_GLUON_F32", TILES[1].label.replace(" ", "_"))
    assert gluon_update.switched_tile("FORGE_NUM_GLUON_F32", gluon_f32.ROUTED, TILES) == TILES[1]
    monkeypatch.setenv("FORGE_NUM_GLUON_F32", "wsf_nonesuch")
    with pytest.raises(ValueError, match="neither 0, 1 nor a tile's label; known: wsf_1?[0-9]+x128x"):
        gluon_f32.route_config(w, x, dy, s)


def test_the_launch_key_determines_its_specialization(monkeypatch):
    """_launch_arguments' key (CPU tensors, the SM count mocked) against Triton's binder: launches under one key
    are launches the binder specializes alike, over shapes of every class the key tells apart (M, N, K a
    multiple of 16 or not, K = 1), two, one and no states, with and without a step slot (16-byte aligned or
    not); and launches do share keys."""
    from tests.test_launch_cache import _binder_specialization

    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)
    sgd = rules.SGD.scalars({"lr": 0.1, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
                             "nesterov": False}, 1)
    by_key, shared = {}, 0
    for (M, N, K), (rule, h, n_state), slot, config in itertools.product(
            ((64, 128, 64), (72, 136, 17), (128, 2048, 1), (200, 264, 150), (8, 8, 16)),
            ((rules.ADAMW, H, 2), (rules.LION, LION, 1), (rules.SGD, sgd, 0)), (None, 0, 1), TILES[:2]):
        w, x, dy, s = _problem(M, N, K, n_state)
        norm_sq, nonfinite = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)
        if slot is not None:  # a slot at word `slot` of a 16-byte aligned buffer
            slot = torch.zeros(kernels.step_slot_size(rule) + 4, dtype=torch.int32)[slot:][:kernels.step_slot_size(rule)]
        key, pins, grid, args, constants = gluon_f32._launch_arguments(w, x, dy, s, rule, h, 1.0, config, norm_sq,
                                                                       nonfinite, slot)
        constexprs, options = constants()
        assert args[-1] is slot and grid[0] <= 132
        spec = _binder_specialization(gluon_f32.fused_linear_update_f32_ws_kernel, args, constexprs,
                                      {k: v for k, v in options.items() if v is not None})
        if key in by_key:
            shared += 1
            assert by_key[key] == spec, (M, N, K, rule.name)
        by_key[key] = spec
    assert shared > 0


@pytest.mark.parametrize("M,N,K,expect", [
    (4096, 14336, 256, "streamed"), (4096, 14336, 639, "streamed"), (4096, 14336, 640, "streamed grouped"),
    (4096, 14336, 895, "streamed grouped"), (4096, 14336, 896, "grouped"),
    (4096, 14336, 1024, "grouped"), (4096, 14336, 2303, "grouped"), (4096, 14336, 2304, "tall"),
    (4096, 14336, 3072, "tall"), (4096, 14336, 4096, "tall"), (4096, 14336, 8192, "tall"),
    (4096, 14336, 16384, "tall"),
    (4096, 14336, 16385, None), (4096, 14336, 32768, None),         # the Triton tile past the measured
    (4096, 14336, 255, None), (4096, 14336, 64, None),              # below: gluon_update's route, the Triton tiles
    (1024, 2048, 1024, "grouped"), (1024, 2048, 4096, None),         # 16 x 16 = 256 tiles, 8 x 16 = 128 tall ones
    (512, 2048, 1024, None),                                        # 8 x 16 = 128 tiles, below MIN_TILES
    (4100, 8192, 1024, None), (8192, 4100, 4096, None), (8192, 8192, 0, None),
])
def test_config_for_the_measured_ranges(M, N, K, expect):
    want = {"streamed": gluon_f32.STREAMED_F32_WS_CONFIG, "streamed grouped": gluon_f32.STREAMED_GROUPED_F32_WS_CONFIG,
            "grouped": gluon_f32.GROUPED_F32_WS_CONFIG,
            "tall": gluon_f32.TALL_SUBTILED_F32_WS_CONFIG, None: None}[expect]
    assert gluon_f32.config_for(M, N, K) == want
    assert want is None or want in gluon_f32.ROUTE_CONFIGS


def test_a_replaced_config_changes_what_it_names_and_is_checked_as_a_new_one():
    """ValueConfig.replace: the variant equals the config built with every field spelled out, and an invalid
    change is refused as the constructor refuses it."""
    one_buffer = gluon_f32.TALL_ONE_BUFFER_F32_WS_CONFIG
    assert one_buffer.replace(ROWS=8) == gluon_f32.F32WSConfig(BM=128, STAGES=4, ROWS=8, num_warps=8, mma_registers=96,
                                                              max_registers=128, g_buffers=1)
    assert one_buffer.replace() == one_buffer and one_buffer.replace(ROWS=8) != one_buffer
    with pytest.raises(ValueError, match="BM must be 64 or 128"):
        one_buffer.replace(BM=256)
