"""The Triton kernels under TRITON_INTERPRET=1 against the emulator, bit for bit (fp32 ieee mode),
and fused against unfused; tiling, masking, indexing, strides, K edge cases, bad input."""

from __future__ import annotations

import math
import os

import pytest
import torch

from forge_num import kernels, rules
from tests.kernel_cases import Case, run_case

pytestmark = pytest.mark.interpreter

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("interpreter tests run where there is no GPU (TRITON_INTERPRET=1)", allow_module_level=True)

ADAMW = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
HYPERS = {
    "adamw": ADAMW,
    "adam": {"lr": 1e-3, "betas": (0.8, 0.99999), "eps": 1e-16, "weight_decay": 0.1},
    "sgd": {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 1e-4, "nesterov": True},
    "lion": {"lr": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.1},
}
CPU = torch.device("cpu")


@pytest.mark.parametrize("rule", sorted(rules.RULES))
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (17, 33, 17), (33, 17, 40), (130, 33, 5)])
def test_fused_equals_unfused_and_emulator(rule, M, N, K):
    run_case(Case(rule, M, N, K, torch.float32, HYPERS[rule], step=3, seed=M * 1000 + N + K), CPU)


@pytest.mark.parametrize("K", [0, 1, 15, 16, 33])
def test_k_edge_cases(K):
    """K = 0 is a zero gradient (as torch.optim treats a zero grad); K not a multiple of BK."""
    run_case(Case("adamw", 17, 20, K, torch.float32, ADAMW, step=1, seed=K), CPU)


@pytest.mark.parametrize("config", kernels.IEEE_CONFIGS, ids=str)
def test_every_ieee_config(config):
    run_case(Case("adamw", 70, 65, 18, torch.float32, ADAMW, step=2, seed=7, config=config), CPU)


@pytest.mark.parametrize("config", kernels.BF16_CONFIGS, ids=str)
def test_every_bf16_config(config):
    """Tiling, masking and the split epilogue of every bf16 configuration; the interpreter's dot is
    the tensor-core model (forge_num.interpreter), so this checks logic, not the hardware. A TMA
    configuration gets rows the copy engine can address (multiples of 8 bf16), not multiples of its
    tile, so that its descriptor loads and their zero fill run."""
    M, N = (136, 264) if config.tma else (70, 130)
    run_case(Case("adamw", M, N, 40, torch.bfloat16, ADAMW, step=2, seed=8, config=config, with_accum=True), CPU)


def test_tile_config_rejects_what_cannot_compile():
    """A TileConfig names what is wrong with it before any compilation: sizes, split, persistence,
    register cap (ptxas accepts a cap from 32 to 255 registers per thread)."""
    T = kernels.TileConfig
    assert T(128, 128, 64, num_warps=8, max_registers=128).label == "128x128x64 w8 s3 e1 r128"
    for bad, field in (({"BM": 48}, "BM"), ({"epilogue_split": 3}, "epilogue_split"),
                       ({"persistent": 9}, "persistent"), ({"max_registers": 16}, "max_registers"),
                       ({"max_registers": 256}, "max_registers"), ({"max_registers": 128.0}, "max_registers")):
        with pytest.raises(ValueError, match=f"TileConfig.{field}"):
            T(**{"BM": 64, "BN": 64, "BK": 64, **bad})


def test_default_tile_by_k_and_operands():
    """default_config's table (kernels/__init__.py, measured on the H200): fp32 storage, the TMA
    64x128 below LARGE_K tokens (persistent, two per SM, from MID_K on weights of TALL_M rows or
    more) and the persistent TMA 128x128 from LARGE_K on where it has LARGE_K_MIN_TILES tiles, the
    pointer 64x128 for problems below SMALL_WORK = M N K; bf16 storage, the 64x64 below
    BF16_SR_MID_K, the 128-register 64x64 up to BF16_SR_LARGE_K and the register-capped TMA 128x128
    from there (the capped 64x64 where TMA cannot address the operands); the pointer tiles
    for operands TMA cannot address; the FMA tile for the fp32 (ieee) mainloop."""
    assert "FORGE_NUM_Q8_TILE" not in os.environ  # the benchmarks' switch would change every 8bit pick below
    bf16, tma = torch.bfloat16, kernels.DEFAULT_TMA_CONFIGS
    assert kernels.default_config(4096, 4096, kernels.LARGE_K - 1, bf16) == tma["small_k"]
    tall, mid = kernels.TALL_M, kernels.MID_K
    assert kernels.default_config(tall, 4096, mid - 1, bf16) == tma["small_k"]
    assert kernels.default_config(tall, 4096, mid, bf16) == tma["mid_k_tall"]
    assert kernels.default_config(tall - 1, 4096, mid, bf16) == tma["small_k"]
    assert kernels.default_config(tall, 4096, kernels.LARGE_K, bf16) == tma["large_k"]
    assert tma["mid_k_tall"].persistent == 2 and tma["mid_k_tall"].tma
    assert kernels.default_config(4096, 4096, kernels.LARGE_K, bf16) == tma["large_k"]
    assert kernels.default_config(28672, 8192, 16384, bf16) == tma["large_k"]
    assert tma["large_k"].tma and tma["large_k"].persistent == 1
    # small weights (session 7): below SMALL_WORK = M N K the pointer 64x128 (no host-side TMA
    # descriptors); from LARGE_K tokens the 128x128 only with LARGE_K_MIN_TILES tiles or more
    pointer = kernels.DEFAULT_BF16_CONFIG[False]
    assert not pointer.tma and (pointer.BM, pointer.BN) == (64, 128)
    assert kernels.default_config(512, 2048, 4096, bf16) == pointer  # 2^32
    assert kernels.default_config(2048, 2048, 1024, bf16) == pointer
    assert kernels.default_config(1024, 4096, 2048, bf16) == tma["small_k"]  # exactly SMALL_WORK
    assert kernels.default_config(2048, 2048, 4096, bf16) == tma["small_k"]  # 256 tiles of 128x128
    assert kernels.default_config(2048, 4096, 4096, bf16) == tma["large_k"]  # 512
    assert kernels.default_config(2048, 3968, 4096, bf16) == tma["small_k"]  # 496
    assert kernels.default_config(8192, 2048, 4096, bf16) == tma["large_k"]  # 1024
    assert kernels.default_config(8192, 8192, 16384, bf16, tma_ok=False) == kernels.DEFAULT_BF16_CONFIG[False]
    assert kernels.default_config(8192, 8192, 128, bf16, bf16_storage=True) == kernels.DEFAULT_BF16_CONFIG[True]
    sr_mid, sr_large, sr_mid_cfg = kernels.BF16_SR_MID_K, kernels.BF16_SR_LARGE_K, kernels.DEFAULT_BF16_SR_MID_K_CONFIG
    assert kernels.default_config(8192, 8192, sr_mid - 1, bf16, bf16_storage=True) == kernels.DEFAULT_BF16_CONFIG[True]
    assert kernels.default_config(8192, 8192, sr_mid, bf16, bf16_storage=True) == sr_mid_cfg
    assert kernels.default_config(8192, 8192, sr_large - 1, bf16, bf16_storage=True) == sr_mid_cfg
    assert sr_mid_cfg.max_registers == 128 and not sr_mid_cfg.tma
    assert kernels.default_config(8192, 8192, sr_large, bf16, bf16_storage=True) == tma["bf16_sr_large_k"]
    assert tma["bf16_sr_large_k"].max_registers == 128
    assert (kernels.default_config(8192, 8192, sr_large, bf16, bf16_storage=True, tma_ok=False)
            == sr_mid_cfg)
    assert kernels.default_config(8192, 8192, 16384, torch.float32) == kernels.IEEE_CONFIGS[0]
    q8 = kernels.DEFAULT_Q8_CONFIGS
    q8_large_k = kernels.Q8_LARGE_K
    # the element-wise update of an 8bit parameter: no tokens, nothing for TMA to load
    assert kernels.default_q8_config(4096, 4096, 0, bf16, tma_ok=False) == q8["small_k"]
    # the TMA 64x128 wherever TMA can load the operands, from Q8_LARGE_K tokens or with tiles enough
    # (1024, 2048): 256 tiles exactly; (1000, 2048): 256 counting the partial row of tiles, 240 without;
    # (512, 2048): 128, measured slower below 4096 tokens
    # and on weights of Q8_TALL_M rows or more, its staged twin in the TMA tile's place (at K <= 256 only
    # from Q8_TALL_M_SMALL_K rows)
    for M, N in ((4096, 4096), (2048, 2048), (1024, 2048), (1000, 2048), (960, 2048), (512, 2048), (8, 128),
                 (8192, 2048), (8191, 2048), (128256, 2048), (8192, 128)):
        many = -(-M // 64) * -(-N // 128) >= kernels.Q8_TMA_MIN_TILES
        assert many == ((M, N) in ((4096, 4096), (2048, 2048), (1024, 2048), (1000, 2048), (8192, 2048),
                                   (8191, 2048), (128256, 2048)))
        tma_tile = q8["tma_tall"] if M >= kernels.Q8_TALL_M else q8["tma"]
        assert kernels.default_q8_config(M, N, q8_large_k, bf16) == tma_tile
        assert kernels.default_q8_config(M, N, 512, bf16) == (tma_tile if many else q8["small_k"])
        # at 256 tokens the staged tile only from Q8_TALL_M_SMALL_K rows (128256 here, not 8192)
        small_k_tile = q8["tma_tall"] if M >= kernels.Q8_TALL_M_SMALL_K else q8["tma"]
        assert kernels.default_q8_config(M, N, 256, bf16) == (small_k_tile if many else q8["small_k"])
        assert kernels.default_q8_config(M, N, q8_large_k - 1, bf16, tma_ok=False) == q8["small_k"]
        assert kernels.default_q8_config(M, N, q8_large_k, bf16, tma_ok=False) == q8["large_k"]
    assert q8["tma"].tma and q8["tma"].max_registers == 128 and q8["tma"] in kernels.Q8_CONFIGS[bf16]
    assert q8["tma_tall"].staged and q8["tma_tall"].tma and q8["tma_tall"] in kernels.Q8_CONFIGS[bf16]
    assert kernels.default_q8_config(8192, 8192, 16384, torch.float32) == kernels.Q8_CONFIGS[torch.float32][0]
    ok = lambda *shapes: kernels._tma_addressable(*(torch.zeros(s, dtype=bf16) for s in shapes))  # noqa: E731
    assert ok((40, 136), (40, 72))
    assert not ok((40, 130), (40, 72))  # a row of 260 bytes
    assert not ok((0, 136), (0, 72))  # no tokens
    assert not kernels._tma_addressable(torch.zeros(136, 40, dtype=bf16).t(), torch.zeros(40, 72, dtype=bf16))


def test_accumulation_scaling_and_strided_inputs():
    run_case(Case("adamw", 33, 40, 20, torch.float32, ADAMW, step=5, seed=3, with_accum=True,
                  grad_scale=0.37109375, transpose_inputs=True), CPU)


@pytest.mark.parametrize("rule", ["adamw", "sgd"])
def test_nonfinite_gradients_leave_elements_unchanged(rule):
    case = Case(rule, 9, 16, 4, torch.float32, HYPERS[rule], step=2, seed=11, bad_rows=3)
    run_case(case, CPU)
    from tests.kernel_cases import make_inputs

    w, states, x, dy, accum = make_inputs(case, CPU)
    w0 = w.clone()
    stats = kernels.fused_linear_update(w, x, dy, states, rules.get_rule(rule), rules.get_rule(rule).scalars(case.hyper, 2), accum=accum)
    assert int(stats.nonfinite) == 3
    bad = ~torch.isfinite(accum)
    assert torch.equal(w[bad], w0[bad]) and torch.all(torch.isfinite(w))
    assert not torch.equal(w[~bad], w0[~bad])


@pytest.mark.parametrize("rule", sorted(rules.RULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
def test_bf16_sr_regime(rule, dtype):
    """bf16 weight and state, stochastically rounded from the fp32 update with the Philox stream:
    fused == unfused == emulator, bit for bit (accumulation, non-finite rows and a scale too)."""
    run_case(Case(rule, 33, 40, 19, dtype, HYPERS[rule], step=4, seed=21, precision="bf16-sr", with_accum=True,
                  bad_rows=2, grad_scale=0.75), CPU)


def test_bf16_sr_is_reproducible_and_seeded():
    """Same key: the same bits; another step's key: other roundings of the same update."""
    from tests.kernel_cases import make_inputs
    from forge_num.emulator.philox import derive_seed

    case = Case("adamw", 16, 32, 8, torch.float32, ADAMW, step=1, seed=3, precision="bf16-sr")
    h = rules.ADAMW.scalars(ADAMW, 1)
    outs = []
    for key in (derive_seed(3, 1, 7), derive_seed(3, 1, 7), derive_seed(3, 2, 7)):
        w, states, x, dy, _ = make_inputs(case, CPU)
        kernels.fused_linear_update(w, x, dy, states, rules.ADAMW, h, seed=key)
        outs.append(w.view(torch.int16).clone())
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])


def test_bf16_sr_needs_a_seed():
    w = torch.zeros(4, 3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="seed"):
        kernels.fused_linear_update(w, torch.zeros(2, 3), torch.zeros(2, 4), [], rules.SGD, rules.SGD.scalars({"lr": 0.1}, 1))
    with pytest.raises(TypeError, match="bfloat16 like the weight"):
        kernels.fused_linear_update(w, torch.zeros(2, 3), torch.zeros(2, 4), [torch.zeros(4, 3)], rules.LION,
                                    rules.LION.scalars(HYPERS["lion"], 1), seed=1)


def test_sgd_without_momentum_keeps_no_state():
    hyper = {"lr": 0.1, "momentum": 0.0}
    assert rules.SGD.state_slots(hyper) == 0
    run_case(Case("sgd", 17, 17, 3, torch.float32, hyper, step=4, seed=5), CPU)


def test_bf16_mode_epilogue_matches_emulator():
    """bf16 operands: fused == unfused bitwise, and the emulated epilogue given the accumulator."""
    run_case(Case("adamw", 33, 17, 20, torch.bfloat16, ADAMW, step=2, seed=9), CPU)


def test_norm_only_pass_and_accumulate():
    torch.manual_seed(0)
    x, dy = torch.randn(10, 7), torch.randn(10, 5)
    acc = kernels.linear_mainloop(x, dy)
    ref = float((acc.double() ** 2).sum())
    assert abs(float(kernels.weight_grad_norm_sq(x, dy)) - ref) <= 1e-12 * ref
    # accumulation continues the FMA chain: two micro-batches == one batch of both, bit for bit
    # (K of the first a multiple of BK, so no zero-padded steps in between)
    x1, dy1 = torch.randn(16, 7), torch.randn(16, 5)
    buf = torch.zeros(5, 7)
    kernels.accumulate_weight_grad(x1, dy1, buf)
    kernels.accumulate_weight_grad(x, dy, buf)
    assert torch.equal(buf, kernels.linear_mainloop(torch.cat([x1, x]), torch.cat([dy1, dy])))


def _good():
    w = torch.zeros(4, 3)
    return w, torch.zeros(5, 3), torch.zeros(5, 4), [torch.zeros(4, 3), torch.zeros(4, 3)]


@pytest.mark.parametrize(
    "mutate,exc,msg",
    [
        (lambda a: a.update(w=a["w"].double()), TypeError, "weight must be float32"),
        (lambda a: a.update(x=torch.zeros(5, 2)), ValueError, "features"),
        (lambda a: a.update(dy=torch.zeros(6, 4)), ValueError, "tokens"),
        (lambda a: a.update(x=a["x"].half(), dy=a["dy"].half()), TypeError, "float32"),
        (lambda a: a.update(x=a["x"].bfloat16()), TypeError, "same dtype"),
        (lambda a: a.update(w=torch.zeros(3, 4).t()), ValueError, "contiguous"),
        (lambda a: a.update(s=[torch.zeros(4, 3), torch.zeros(3, 4)]), ValueError, "shape"),
        (lambda a: a.update(scale=math.nan), ValueError, "grad_scale"),
        (lambda a: a.update(h=(math.inf,) + a["h"][1:]), ValueError, "not finite"),
    ],
)
def test_bad_input_is_named(mutate, exc, msg):
    w, x, dy, s = _good()
    args = {"w": w, "x": x, "dy": dy, "s": s, "scale": 1.0, "h": rules.ADAMW.scalars(ADAMW, 1)}
    mutate(args)
    with pytest.raises(exc, match=msg):
        kernels.fused_linear_update(args["w"], args["x"], args["dy"], args["s"], rules.ADAMW, args["h"],
                                    grad_scale=args["scale"])


@pytest.mark.parametrize("rule", sorted(rules.RULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
def test_8bit_regime(rule, dtype):
    """bf16 weight (stochastic rounding) and 8-bit block-wise states (m signed E4M3, v unsigned E5M3,
    a power-of-two scale per 128 elements of a row, stochastic rounding): fused == unfused ==
    emulator bit for bit, codes and scales included; N not a multiple of the block, rows past the
    tile, non-finite gradient rows."""
    from tests.kernel_cases import run_q8_case

    run_q8_case(rule, HYPERS[rule], dtype, 20, 200, 9, seed=4, device=CPU)


@pytest.mark.parametrize("precision", ["fp32", "bf16-sr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
def test_persistent_schedule_computes_the_same_bits(precision, dtype):
    """A persistent grid (TileConfig.persistent: 4 programs under the interpreter for 3 x 5 tiles,
    grouped order) only changes which program computes which tile: fused == unfused == emulator."""
    cfg = kernels.TileConfig(32, 32, 16, num_warps=4, num_stages=1, epilogue_split=2, persistent=1)
    run_case(Case("adamw", 70, 130, 40, dtype, ADAMW, step=2, seed=9, config=cfg, with_accum=True,
                  precision=precision), CPU)


def test_q8_tile_override(monkeypatch):
    """FORGE_NUM_Q8_TILE=<label> (a benchmark's switch) picks that 8bit tile, a candidate too, wherever TMA
    can load the operands, and nowhere else; a label naming no tile is an error that lists the known ones."""
    bf16 = torch.bfloat16
    monkeypatch.delenv("FORGE_NUM_Q8_TILE", raising=False)
    assert kernels.default_q8_config(8192, 2048, 4096, bf16) == kernels.Q8_TALL_CONFIG  # unset: the defaults
    candidate = kernels.CANDIDATE_Q8_CONFIGS[-1]
    monkeypatch.setenv("FORGE_NUM_Q8_TILE", candidate.label.replace(" ", "_"))
    for K in (256, 4096, 16384):
        assert kernels.default_q8_config(512, 2048, K, bf16) == candidate
        assert kernels.default_q8_config(8192, 2048, K, bf16) == candidate
        assert kernels.default_q8_config(512, 2048, K, bf16, tma_ok=False) in kernels.DEFAULT_Q8_CONFIGS.values()
    assert kernels.default_q8_config(512, 2048, 4096, torch.float32) == kernels.Q8_CONFIGS[torch.float32][0]
    monkeypatch.setenv("FORGE_NUM_Q8_TILE", "64x128x64_w8_s9")
    with pytest.raises(ValueError, match="names no 8bit tile; known: .*64x128x64_w8_s4_e4_tma_r128"):
        kernels.default_q8_config(512, 2048, 4096, bf16)


@pytest.mark.parametrize("staged_split", [0, 1, 4, 8], ids=lambda s: f"staged-e{s}" if s else "held")
def test_persistent_schedule_8bit(staged_split):
    """4 programs for 3 x 2 tiles (two programs walk two): the 8bit update computes the emulator's bits
    with the accumulator held in registers, or staged through each program's scratch slot (its second
    tile overwrites the slot its first was read from), its rows in 1, 4 or 8 sub-tiles (rows past M:
    40 = 2 x 16 + 8). The interpreter runs the programs one after another and its barriers are no-ops,
    so this catches the staging's addressing (a sub-tile read from the wrong rows, a slot past this
    program's), not a missing barrier or a slot two programs share: on the GPU,
    tests/test_gpu_exactness.py::test_persistent_8bit_programs_loop_over_tiles runs two at once."""
    from tests.kernel_cases import run_q8_case

    cfg = kernels.TileConfig(16, 128, 16, num_warps=4, num_stages=1, persistent=1, staged=bool(staged_split),
                             epilogue_split=staged_split or 1)
    run_q8_case("adamw", HYPERS["adamw"], torch.bfloat16, 40, 200, 9, seed=5, device=CPU, config=cfg)


@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
def test_8bit_row_split_epilogue(split, dtype):
    """The 8bit epilogue split into row sub-tiles of whole quantization blocks (rows past M, N not a
    multiple of the block, a non-finite gradient element): the same bits as the emulator."""
    from tests.kernel_cases import run_q8_case

    cfg = kernels.TileConfig(32, 128, 16, num_warps=4, num_stages=1, epilogue_split=split)
    run_q8_case("adamw", HYPERS["adamw"], dtype, 45, 200, 9, seed=6, device=CPU, config=cfg)


@pytest.mark.parametrize("split,staged", [(1, False), (2, False), (4, False), (8, True)])
def test_8bit_telemetry_within_its_bound(split, staged):
    """The 8bit epilogue's telemetry terms, added over its row sub-tiles and reduced once a tile (staged:
    the sub-tiles read back from the program's scratch slot, persistent programs)."""
    from tests.kernel_cases import run_q8_telemetry_case

    run_q8_telemetry_case(CPU, kernels.TileConfig(32, 128, 16, num_warps=4, num_stages=1, epilogue_split=split,
                                                  persistent=int(staged), staged=staged))


@pytest.mark.parametrize("precision", ["fp32", "bf16-sr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
def test_tma_mainloop_computes_the_same_bits(precision, dtype, monkeypatch):
    """TileConfig.tma: the operand tiles come through TMA descriptors (zero fill past the edges in
    place of masked loads; K = 40 is not a multiple of BK, M and N not of the tile): fused == unfused
    == emulator. Checks that the descriptor path is the one that ran (rows of 72 and 136 elements:
    a TMA row pitch must be a multiple of 16 bytes)."""
    used = []
    make = kernels._tma_descriptors
    monkeypatch.setattr(kernels, "_tma_descriptors", lambda x, dy, c, ok: used.append(make(x, dy, c, ok)) or used[-1])
    cfg = kernels.TileConfig(32, 32, 16, num_warps=4, num_stages=1, epilogue_split=2, tma=True)
    run_case(Case("adamw", 72, 136, 40, dtype, ADAMW, step=2, seed=9, config=cfg, with_accum=True,
                  precision=precision, bad_rows=2), CPU)
    assert used and all(d[0] is not None for d in used)


def test_tma_falls_back_for_operands_it_cannot_address():
    """Transposed operands (inner stride not 1) take the pointer mainloop, with the same bits."""
    cfg = kernels.TileConfig(32, 32, 16, num_warps=4, num_stages=1, epilogue_split=2, tma=True)
    x = torch.zeros(40, 130, dtype=torch.bfloat16).t().contiguous().t()
    dy = torch.zeros(40, 70, dtype=torch.bfloat16)
    assert not kernels._tma_addressable(x, dy)
    assert kernels._tma_descriptors(x, dy, cfg, kernels._tma_addressable(x, dy)) == (None, None)
    run_case(Case("adamw", 70, 130, 40, torch.bfloat16, ADAMW, step=2, seed=9, config=cfg,
                  transpose_inputs=True), CPU)


def test_eight_way_split_epilogue():
    """EPILOGUE_SPLIT = 8 (column sub-tiles of 16 in a 32x128 tile): the same bits as the emulator."""
    cfg = kernels.TileConfig(32, 128, 16, num_warps=4, num_stages=1, epilogue_split=8)
    run_case(Case("adamw", 45, 200, 20, torch.bfloat16, ADAMW, step=2, seed=4, config=cfg, with_accum=True,
                  bad_rows=2, precision="bf16-sr"), CPU)


@pytest.mark.parametrize("config", kernels.CANDIDATE_CONFIGS, ids=str)
def test_candidate_configs(config):
    """The benchmark's candidate tiles (kernels.CANDIDATE_CONFIGS) compute the emulator's bits (TMA
    ones on rows the copy engine can address, over several tiles, so that the descriptors run)."""
    M, N = (136, 264) if config.tma else (150, 140)
    run_case(Case("adamw", M, N, 20, torch.bfloat16, ADAMW, step=2, seed=5, config=config, with_accum=True,
                  bad_rows=2), CPU)


@pytest.mark.parametrize("config", (*kernels.Q8_CONFIGS[torch.bfloat16], *kernels.CANDIDATE_Q8_CONFIGS), ids=str)
def test_q8_tiles(config):
    """Every 8bit tile the launcher may pick, row-split epilogues included, computes the emulator's bits."""
    from tests.kernel_cases import run_q8_case

    # TMA tiles: operand rows of a multiple of 16 bytes, so that the descriptors are made (else the
    # launcher falls back to the pointer mainloop); a partial last block either way
    M, N = (136, 264) if config.tma else (150, 260)
    run_q8_case("adamw", HYPERS["adamw"], torch.bfloat16, M, N, 20, seed=3, device=CPU, config=config)
