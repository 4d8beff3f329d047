"""The 8bit regime's warp-specialized Gluon kernel (kernels/gluon_q8.py), what can be checked on the
CPU: its tiles fit an SM, it names what it refuses before any launch, it hands the launch its
counter map, it is never routed off an sm_90 GPU or unless switched on, and its launch key
determines Triton's specialization. Its bits are checked on the GPU (tests/test_gpu_gluon.py), its
PTX on the CPU (tests/test_ptx.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from forge_num import kernels, rules

gluon_q8 = pytest.importorskip("forge_num.kernels.gluon_q8")
gluon_update = pytest.importorskip("forge_num.kernels.gluon_update")

H = rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}, 1)


def _problem(M=64, N=128, K=64, n_state=2):
    w = torch.zeros(M, N, dtype=torch.bfloat16)
    x = torch.zeros(K, N, dtype=torch.bfloat16)
    dy = torch.zeros(K, M, dtype=torch.bfloat16)
    return w, x, dy, [kernels.Q8State.zeros(M, N) for _ in range(n_state)]


def test_its_tiles_fit_an_sm():
    """Each tile's one program fits the H200's shared memory (227 KB a block) and its warps the SM's
    65536 registers at the launch's cap."""
    for c in (gluon_q8.DEFAULT_Q8_WS_CONFIG, *gluon_q8.Q8_WS_CANDIDATE_CONFIGS):
        assert c.shared_bytes() + 1024 <= 227 * 1024, c
        assert c.max_registers * 32 * (c.num_warps + 4 + (0 if c.self_load else 4)) <= 65536, c


@pytest.mark.parametrize("bad, match", [
    (dict(BM=128), "BM must be 64"), (dict(BN=256), "BN 128"), (dict(ROWS=4, num_warps=4), "got 4$"),
    (dict(ROWS=24), "got 24$"), (dict(num_warps=12, ROWS=24), "epilogue warps.*got 12$"),
    (dict(num_warps=16, ROWS=8), "dividing the sub-tile's 8 rows"), (dict(num_warps=16, ROWS=16), "exceed the SM's 65536"),
    (dict(STAGES=1), "at least 2 operand stages"), (dict(BK=40), "multiple of 16"),
    (dict(STAGES=7), "exceed the 227 KB"), (dict(load_cursor=True), "self_load=True"),
    (dict(prefetch=True, stage_state=True), "choose one"),
    (dict(self_load=True, stage_state=True, mma_stage=True), "choose one"), (dict(mma_stage=True), "self_load=True"),
    (dict(self_load=True, mma_stage=3), "0 \\(none\\), 1 .* or 2"),
])
def test_a_config_names_what_it_cannot_run(bad, match):
    with pytest.raises(ValueError, match=match):
        gluon_q8.Q8WSConfig(**bad)


def test_the_kernel_names_what_it_refuses():
    """Checked before any launch, so on the CPU: the regime, the key, gathered rows, the operands'
    dtype, layout and shapes, the states' dtypes and shapes."""
    w, x, dy, q = _problem()
    f = gluon_q8.fused_linear_update_q8_ws
    with pytest.raises(TypeError, match="8bit regime"):
        f(w.float(), x, dy, q, rules.ADAMW, H, seed=1)
    with pytest.raises(TypeError, match="8bit regime"):
        f(w, x, dy, [torch.zeros_like(w)] * 2, rules.ADAMW, H, seed=1)
    with pytest.raises(TypeError, match="8bit regime"):
        f(w, x, dy, [], rules.ADAMW, H, seed=1)
    with pytest.raises(ValueError, match="needs a seed"):
        f(w, x, dy, q, rules.ADAMW, H)
    with pytest.raises(ValueError, match="gathered rows"):
        f(w, x, dy, q, rules.ADAMW, H, seed=1, counter=(128, 128, 0, torch.arange(64)))
    with pytest.raises(TypeError, match="bf16 operands"):
        f(w, x.float(), dy.float(), q, rules.ADAMW, H, seed=1)
    with pytest.raises(ValueError, match="at most 1 states"):
        f(w, x, dy, q, rules.LION, rules.LION.scalars({"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0}, 1),
          seed=1)
    with pytest.raises(ValueError, match="do not make dW"):
        f(w, x[:, :64], dy, q, rules.ADAMW, H, seed=1)
    with pytest.raises(ValueError, match="K = 0"):
        f(w, x[:0], dy[:0], q, rules.ADAMW, H, seed=1)
    with pytest.raises(ValueError, match="contiguous"):
        f(w, x.t().contiguous().t(), dy, q, rules.ADAMW, H, seed=1)
    with pytest.raises(TypeError, match="uint8 codes and float32 scales"):
        f(w, x, dy, [kernels.Q8State(q[0].codes.to(torch.int8), q[0].scales), q[1]], rules.ADAMW, H, seed=1)
    with pytest.raises(ValueError, match=r"state 1 scales of shape \(64, 2\)"):
        f(w, x, dy, [q[0], kernels.Q8State(q[1].codes, torch.ones(64, 2))], rules.ADAMW, H, seed=1)
    w2, x2, dy2, q2 = _problem(M=60)
    with pytest.raises(ValueError, match="multiples of 8"):
        f(w2, x2, dy2, q2, rules.ADAMW, H, seed=1)


def test_the_kernel_takes_the_counter_map(monkeypatch):
    """fused_linear_update_q8_ws hands the launch (seed, row_stride, base) of its counter map, the
    flat indices without one (the launch itself stubbed)."""
    w, x, dy, q = _problem()
    seen = []
    monkeypatch.setattr(gluon_q8, "launch", lambda *args: seen.append(args[-1]))
    gluon_q8.fused_linear_update_q8_ws(w, x, dy, q, rules.ADAMW, H, seed=7)
    gluon_q8.fused_linear_update_q8_ws(w, x, dy, q, rules.ADAMW, H, seed=2**64 - 1, counter=(128, 384, 2**33))
    assert seen == [(7, 128, 0), (2**64 - 1, 384, 2**33)]


def test_no_route_off_the_gpu_or_unless_switched_on(monkeypatch):
    w, x, dy, q = _problem(M=4096, N=4096, K=4096)
    for flag in ("1", "0", gluon_q8.Q8_WS_CANDIDATE_CONFIGS[-1].label.replace(" ", "_")):
        monkeypatch.setenv("FORGE_NUM_GLUON_Q8", flag)
        assert gluon_q8.route_config(w, x, dy, q) is None  # CPU tensors
        assert kernels._ws_q8_route(w, x, dy, q) is None


def _binder_specialization(args, constexprs, options) -> str:
    from tests.test_launch_cache import _binder_specialization as spec

    return spec(gluon_q8.fused_linear_update_q8_ws_kernel, args, constexprs, options)


def test_the_launch_key_determines_its_specialization(monkeypatch):
    """_launch_arguments' key (CPU tensors, the SM count mocked) against Triton's binder: launches
    under one key are launches the binder specializes alike, over shapes of every class the key tells
    apart (M, N, K, n_blocks a multiple of 16 or not, K = 1, one block a row), one and two states,
    counter maps and Philox keys of every size, with and without a step slot (16-byte aligned or not);
    and launches do share keys."""
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)
    lion = rules.LION.scalars({"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0}, 1)
    by_key, shared = {}, 0
    staged = next(c for c in gluon_q8.Q8_WS_CANDIDATE_CONFIGS if c.stage_state)
    for (M, N, K), (rule, h, n_state), rand, slot, config in itertools.product(
            ((64, 128, 64), (72, 136, 17), (128, 2048, 1), (200, 264, 150), (64, 16 * 128, 32), (8, 8, 16)),
            ((rules.ADAMW, H, 2), (rules.LION, lion, 1)),
            ((1, 128, 0), (2**63 + 5, 2**31 + 16, 2**40), (2**64 - 1, 3, 17)), (None, 0, 1),
            (gluon_q8.DEFAULT_Q8_WS_CONFIG, staged)):
        if config.stage_state and N % 16:
            continue  # launch takes the unstaged twin there (test_a_staged_tile_loads_by_pointer_where_...)
        w, x, dy, q = _problem(M, N, K, n_state)
        norm_sq, nonfinite = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)
        if slot is not None:  # a slot at word `slot` of a 16-byte aligned buffer
            slot = torch.zeros(kernels.step_slot_size(rule) + 4, dtype=torch.int32)[slot:][:kernels.step_slot_size(rule)]
        key, pins, grid, args, constants = gluon_q8._launch_arguments(
            w, x, dy, q, rule, h, 1.0, config, norm_sq, nonfinite, rand, slot)
        constexprs, options = constants()
        assert args[-4:-1] == rand and args[-1] is slot and grid[0] <= 132
        spec = _binder_specialization(args, constexprs, {k: v for k, v in options.items() if v is not None})
        if key in by_key:
            shared += 1
            assert by_key[key] == spec, (M, N, K, rule.name, rand)
        by_key[key] = spec
    assert shared > 0


def _twin_and_launches(monkeypatch, tile, twin, field):
    """Check that ``twin`` is one object for ``tile`` and equals it in every field but ``field``; then mock
    the launch (132 SMs) and return the list each launch appends its (config, arguments) to."""
    assert {k: getattr(twin, k) for k in twin.__slots__ if k != field} == \
        {k: getattr(tile, k) for k in tile.__slots__ if k != field}
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)
    launched = []
    monkeypatch.setattr(gluon_q8._LAUNCH, "launch", lambda key, pins, grid, args, constants: launched.append(
        (pins[1], args)))
    return launched


@pytest.mark.parametrize("field", ["stage_state", "mma_stage"])
def test_a_staged_tile_loads_by_pointer_where_tma_cannot_address_the_codes(monkeypatch, field):
    """A stage_state or mma_stage tile's TMA loads need the codes' rows 16-byte apart (N bytes: N a multiple
    of 16); elsewhere launch takes its unstaged twin (the same fields but that one, one object, so one launch
    key), whose state is loaded by pointer; where it can, the staged tile with its three descriptors, in
    blocks of a sub-tile's rows (stage_state) or a tile's (mma_stage)."""
    staged = next(c for c in gluon_q8.Q8_WS_CANDIDATE_CONFIGS if getattr(c, field))
    twin = gluon_q8.unstaged(staged)
    assert twin is gluon_q8.unstaged(staged) and not twin.stage_state and not twin.mma_stage
    launched = _twin_and_launches(monkeypatch, staged, twin, field)
    rows = staged.ROWS if field == "stage_state" else staged.BM
    for N, n_state in ((264, 2), (256, 2), (256, 1)):
        w, x, dy, q = _problem(M=72, N=N, K=16, n_state=n_state)
        gluon_q8.launch(w, x, dy, q, rules.ADAMW, H, 1.0, staged, (1, N, 0))
        config, args = launched[-1]
        assert config is (twin if N % 16 else staged)
        descs = args[2:5]
        if N % 16:
            assert descs == (None, None, None)
        else:
            assert [d.block_shape for d in descs[:1 + n_state]] == [[rows, staged.BN]] * (1 + n_state)
            assert [d.base for d in descs[:1 + n_state]] == [w, *(s.codes for s in q)]
            assert descs[1 + n_state:] == (None,) * (2 - n_state)


def test_a_wide_k_block_tile_launches_only_on_whole_k_blocks(monkeypatch):
    """A tile of K blocks wider than its Triton twin's 64 gives the twin's bits where K is a multiple of its
    block (the same k16 chain); elsewhere launch takes the tile with the twin's K block (twin_k_blocks: the
    same fields but BK, one object, so one launch key)."""
    wide = next(c for c in gluon_q8.Q8_WS_CANDIDATE_CONFIGS if c.BK > gluon_q8.TWIN_BK)
    twin = gluon_q8.twin_k_blocks(wide)
    assert twin is gluon_q8.twin_k_blocks(wide) and twin.BK == gluon_q8.TWIN_BK
    launched = _twin_and_launches(monkeypatch, wide, twin, "BK")
    for K in (wide.BK, 2 * wide.BK, 64, wide.BK + 64, 150, 8):
        w, x, dy, q = _problem(M=72, N=256, K=K, n_state=2)
        gluon_q8.launch(w, x, dy, q, rules.ADAMW, H, 1.0, wide, (1, 256, 0))
        config, args = launched[-1]
        assert config is (twin if K % wide.BK else wide), K
        assert args[0].block_shape == [config.BK, config.BM] and args[1].block_shape == [config.BK, config.BN]


def test_a_range_of_wider_k_blocks_routes_only_whole_ones(monkeypatch):
    """config_for gives a range's tile of K blocks wider than TWIN_BK only where K is a multiple of its
    block; elsewhere the range's before it (the measured tile, not the wider one's twin)."""
    wide = gluon_q8.K128_CURSOR_CONFIG
    monkeypatch.setattr(gluon_q8, "ROUTE_BY_K", ((2048, gluon_q8.CURSOR_CONFIG), (4096, wide)))
    assert gluon_q8.config_for(4096, 14336, 4096) is wide
    assert gluon_q8.config_for(4096, 14336, 4096 + 128) is wide
    assert gluon_q8.config_for(4096, 14336, 4096 + 64) is gluon_q8.CURSOR_CONFIG
    assert gluon_q8.config_for(4096, 14336, 4095) is gluon_q8.CURSOR_CONFIG


def test_a_tile_is_switched_on_by_its_label(monkeypatch):
    """FORGE_NUM_GLUON_Q8=<label> names the tile the route takes ('_' for ' '); an unknown one is an
    error naming the known labels (checked before the device is looked at)."""
    w, x, dy, q = _problem(M=4096, N=4096, K=4096)
    tiles = (gluon_q8.DEFAULT_Q8_WS_CONFIG, *gluon_q8.Q8_WS_CANDIDATE_CONFIGS)
    monkeypatch.setenv("FORGE_NUM_GLUON_Q8", gluon_q8.Q8_WS_CANDIDATE_CONFIGS[0].label.replace(" ", "_"))
    assert gluon_update.switched_tile("FORGE_NUM_GLUON_Q8", True, tiles) == gluon_q8.Q8_WS_CANDIDATE_CONFIGS[0]
    monkeypatch.setenv("FORGE_NUM_GLUON_Q8", "ws8_nonesuch")
    with pytest.raises(ValueError, match="neither 0, 1 nor a tile's label; known: ws8_64x128x"):
        gluon_q8.route_config(w, x, dy, q)


@pytest.mark.parametrize("M,N,K,expect", [
    (4096, 14336, 4096, "k128"), (2048, 8192, 4096, "k128"), (4096, 14336, 4992, "k128"),
    (1024, 2048, 4096, "k128"),                                     # 16 x 16 = 256 tiles
    (4096, 14336, 5119, "deep"), (4096, 14336, 4160, "deep"),      # K blocks of 128 on whole ones only
    (4096, 14336, 3584, "deep"), (4096, 14336, 4095, "deep"),      # the four-stage cursor from 3584
    (4096, 14336, 5120, "k128"), (4096, 14336, 8192, "k128"), (4096, 14336, 16384, "k128"),
    (4096, 14336, 5184, "default"), (4096, 14336, 16320, "default"),  # from 5120, K not a multiple of 128
    (4096, 14336, 16385, None), (4096, 14336, 32768, None),         # the Triton tiles past the measured
    (4096, 14336, 1024, "staged"), (2048, 8192, 2047, "staged"),    # the MMA warps stage the state, 1024-3583
    (4096, 14336, 2048, "staged"), (2048, 8192, 3072, "staged"), (4096, 14336, 3583, "staged"),
    (4096, 14336, 1023, None), (4096, 14336, 512, None), (4096, 14336, 256, None),
    (512, 2048, 4096, None),                                        # 8 x 16 = 128 tiles, below MIN_TILES
    (4100, 8192, 4096, None), (8192, 4100, 4096, None), (8192, 8192, 0, None),
])
def test_config_for_the_measured_ranges(M, N, K, expect):
    want = {"staged": gluon_q8.MMA_STAGED_CONFIG,
            "deep": gluon_q8.DEEP_CURSOR_CONFIG, "k128": gluon_q8.K128_CURSOR_CONFIG,
            "default": gluon_q8.DEFAULT_Q8_WS_CONFIG, None: None}[expect]
    assert gluon_q8.config_for(M, N, K) == want
    assert want is None or want in gluon_q8.ROUTE_CONFIGS
