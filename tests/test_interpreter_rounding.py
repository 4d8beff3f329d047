"""The Triton twins (kernels/random.py, kernels/rounding.py, kernels/quant8.py) against the emulator,
bit for bit, on small tiles with special values.

The kernels run in a child process (this file run as a script): under ``TRITON_INTERPRET=1`` on the
CPU (marker ``interpreter``), and compiled on CUDA (markers ``gpu``, ``exactness``; skipped without a
GPU). A child process is needed because the interpreter is chosen when ``@triton.jit`` runs, and
other test modules may import the kernels compiled. The parent writes the inputs, the child writes
every kernel output to an .npz, and the tests compare with the emulator here.

Wrapper kernels only load, call one tile function, and store; the last one runs the whole
rounding path of one optimizer tile (offsets -> rounding_bits / q8_rounding_bits -> bf16 SR of p, m,
v and 8-bit codes of m, v), so the random-slice tables are checked end to end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]



SEEDS = [0, 1, 42, 0xFFFFFFFF, 0x0000000FCAFEB0BA, 2**63 + 12345, 2**64 - 1]
BM, BN = 4, 256
PIPE_ROWS, PIPE_COLS = 8, 512  # the parameter the pipeline tile is cut from
PIPE_ROW0, PIPE_COL0 = 4, 256  # its tile origin

CONSTANTS = ("QBLOCK", "MAN_BITS", "EXP_BITS_SIGNED", "EXP_BITS_UNSIGNED", "RAND_BITS")
BF16_SPECIALS = [
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # ±0, ±Inf
    0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0xFF800001, 0x7FA00000, 0x7F80FFFF,  # NaNs
    0x7F7F0000, 0x7F7F0001, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7E8000,  # near bf16max
    0x00000001, 0x00008000, 0x0000FFFF, 0x007FFFFF, 0x807FFFFF, 0x00018000,  # subnormals
    0x3F808000, 0x3F818000, 0x3F7FFFFF, 0xBF7FFFFF, 0x3F800001,  # ties and carries
]


def make_inputs(path: Path):
    rng = np.random.default_rng(20240917)
    d = {}
    d["seeds"] = np.array(SEEDS, dtype=np.uint64)
    off64 = np.array([0, 1, 2, 3, 5, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 7, 2**63 - 1, -1, -(2**40)], dtype=np.int64)
    d["off64"] = np.concatenate([off64, rng.integers(0, 2**62, 64 - off64.size, dtype=np.int64)])
    d["off32"] = np.concatenate([np.array([0, 1, 2**31 - 1, -1, -(2**31)], dtype=np.int32), rng.integers(-(2**31), 2**31 - 1, 59, dtype=np.int32)])
    # the 8bit table's counters (>= 0): both halves of pairs, across 2^32 and at the top
    q8 = np.array([0, 1, 2, 3, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**33 + 3, 2**63 - 2, 2**63 - 1], dtype=np.int64)
    d["q8_off"] = np.concatenate([q8, rng.integers(0, 2**62, 64 - q8.size, dtype=np.int64)])
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    bits[: len(BF16_SPECIALS)] = BF16_SPECIALS
    bits[len(BF16_SPECIALS) : 2 * len(BF16_SPECIALS)] = BF16_SPECIALS
    d["bf16_x"] = bits.view(np.float32)
    r16 = rng.integers(0, 2**16, 4096, dtype=np.uint32)
    r16[: len(BF16_SPECIALS)] = 0  # r = 0: every inexact value rounds up
    r16[len(BF16_SPECIALS) : 2 * len(BF16_SPECIALS)] = 0xFFFF
    d["bf16_r"] = r16
    for signed in (True, False):
        tiles = []
        for t in range(4):
            x = (rng.standard_normal((BM, BN)) * np.exp(rng.uniform(-45, 12, (BM, BN)))).astype(np.float32)
            if t == 0:
                x[0, :8] = [0.0, -0.0, 1e-45, -1e-40, 1.9, 3e-39, -3.3e-6, 7e-30]
                x[1, :128] = np.float32(1e-41)  # fp32-subnormal block (scale at its clamp)
                x[1, 128:] = 0.0  # all-zero block
                x[2, 5] = np.nan
                x[2, 200] = np.float32(3.2e38)  # beyond the largest finite scale: poisoned
                x[3, 9] = -np.inf
                x[3, 130] = np.float32(1.875 * 2.0**127)  # exactly the largest finite scale
            if t == 1:
                x *= np.float32(2.0**-100)
            if not signed:
                x = np.abs(x)
                if t == 0:
                    x[0, 1] = -0.0  # accepted for v
                    x[3, 20] = -1.0  # a negative v: poisoned block
            tiles.append(x)
        key = "m" if signed else "v"
        d[f"q_{key}_x"] = np.stack(tiles)
        d[f"q_{key}_r"] = rng.integers(0, 2**24, (4, BM, BN), dtype=np.uint32)
        codes = np.tile(np.arange(256, dtype=np.uint8), (2, 1))
        d[f"dq_{key}_codes"] = codes
        d[f"dq_{key}_scales"] = np.array([[2.0**-112 if signed else 2.0**-96, 1.0], [2.0**127, np.nan]], dtype=np.float32)
    mul_x = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    mul_x[:8] = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF, 0xD2511F53]
    d["mul_x"] = mul_x
    p = rng.standard_normal((PIPE_ROWS, PIPE_COLS)).astype(np.float32)
    m = (rng.standard_normal((PIPE_ROWS, PIPE_COLS)) * 1e-3).astype(np.float32)
    v = (m.astype(np.float64) ** 2 * rng.uniform(0.5, 2, m.shape)).astype(np.float32)
    d["pipe_p"], d["pipe_m"], d["pipe_v"] = p, m, v
    np.savez(path, **d)


# ---------------------------------------------------------------------------------------------
# the child: kernels, run under the interpreter or on CUDA

if __name__ == "__main__":
    import torch
    import triton
    import triton.language as tl

    from forge_num.kernels import quant8 as KQ
    from forge_num.kernels import random as KRand
    from forge_num.kernels import rounding as KR

    @triton.jit
    def k_randint4x(seed, off_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        off = tl.load(off_ptr + i)
        c0, c1, c2, c3 = KRand.randint4x(seed, off)
        tl.store(out_ptr + i, c0)
        tl.store(out_ptr + N + i, c1)
        tl.store(out_ptr + 2 * N + i, c2)
        tl.store(out_ptr + 3 * N + i, c3)
        tl.store(out_ptr + 4 * N + i, KRand.randint(seed, off))

    @triton.jit(do_not_specialize=["seed"])  # as the kernels pass it: typed u64, never a constexpr
    def k_philox_written_out(seed: tl.uint64, off_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        off = tl.load(off_ptr + i)
        c0, c1, c2, c3 = KRand.philox4x32_10(seed, off)
        tl.store(out_ptr + i, c0)
        tl.store(out_ptr + N + i, c1)
        tl.store(out_ptr + 2 * N + i, c2)
        tl.store(out_ptr + 3 * N + i, c3)

    @triton.jit
    def k_wide_products(x_ptr, out_ptr, N: tl.constexpr):
        x = tl.load(x_ptr + tl.arange(0, N))
        hi_a, lo_a = KRand.wide_products_a(x)
        hi_b, lo_b = KRand.wide_products_b(x)
        tl.store(out_ptr + tl.arange(0, N), hi_a)
        tl.store(out_ptr + N + tl.arange(0, N), lo_a)
        tl.store(out_ptr + 2 * N + tl.arange(0, N), hi_b)
        tl.store(out_ptr + 3 * N + tl.arange(0, N), lo_b)

    @triton.jit(do_not_specialize=["seed"])  # the kernels' seed: u64; wide, philox4x32_10 takes no constexpr
    def k_rounding_bits(seed: tl.uint64, off_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        off = tl.load(off_ptr + i)
        a, b, c = KRand.rounding_bits(seed, off)
        tl.store(out_ptr + i, a)
        tl.store(out_ptr + N + i, b)
        tl.store(out_ptr + 2 * N + i, c)

    @triton.jit(do_not_specialize=["seed"])
    def k_q8_rounding_bits(seed: tl.uint64, off_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        a, b, c = KRand.q8_rounding_bits(seed, tl.load(off_ptr + i))
        tl.store(out_ptr + i, a)
        tl.store(out_ptr + N + i, b)
        tl.store(out_ptr + 2 * N + i, c)

    @triton.jit
    def k_bf16(x_ptr, r_ptr, rne_ptr, sr_ptr, back_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        r = tl.load(r_ptr + i)
        tl.store(rne_ptr + i, KR.bf16_rne_bits(x))
        b = KR.bf16_sr_bits(x, r)
        tl.store(sr_ptr + i, b)
        tl.store(back_ptr + i, KR.bf16_to_f32(b))

    @triton.jit
    def k_quant(x_ptr, r_ptr, c_ptr, s_ptr, y_ptr, BM: tl.constexpr, BN: tl.constexpr, SIGNED: tl.constexpr):
        J: tl.constexpr = BN // KQ.QBLOCK
        i = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        j = tl.arange(0, BM)[:, None] * J + tl.arange(0, J)[None, :]
        codes, scales = KQ.quantize_block_sr(tl.load(x_ptr + i), tl.load(r_ptr + i), SIGNED)
        tl.store(c_ptr + i, codes)
        tl.store(s_ptr + j, scales)
        tl.store(y_ptr + i, KQ.dequantize(codes, scales, SIGNED))

    @triton.jit
    def k_dequant(c_ptr, s_ptr, y_ptr, BM: tl.constexpr, BN: tl.constexpr, SIGNED: tl.constexpr):
        J: tl.constexpr = BN // KQ.QBLOCK
        i = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        j = tl.arange(0, BM)[:, None] * J + tl.arange(0, J)[None, :]
        tl.store(y_ptr + i, KQ.dequantize(tl.load(c_ptr + i), tl.load(s_ptr + j), SIGNED))

    @triton.jit(do_not_specialize=["seed"])
    def k_pipeline(seed: tl.uint64, p_ptr, m_ptr, v_ptr, pb_ptr, mb_ptr, vb_ptr, mc_ptr, ms_ptr, vc_ptr, vs_ptr,
                   row0, col0, NCOLS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        rows = row0 + tl.arange(0, BM)
        cols = col0 + tl.arange(0, BN)
        off = rows.to(tl.int64)[:, None] * NCOLS + cols[None, :]  # flat element index, int64
        r_p, r_m16, r_v16 = KRand.rounding_bits(seed, off)
        _, r_m24, r_v24 = KRand.q8_rounding_bits(seed, off)
        p = tl.load(p_ptr + off)
        m = tl.load(m_ptr + off)
        v = tl.load(v_ptr + off)
        J: tl.constexpr = BN // KQ.QBLOCK
        t = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        tj = tl.arange(0, BM)[:, None] * J + tl.arange(0, J)[None, :]
        tl.store(pb_ptr + t, KR.bf16_sr_bits(p, r_p))
        tl.store(mb_ptr + t, KR.bf16_sr_bits(m, r_m16))
        tl.store(vb_ptr + t, KR.bf16_sr_bits(v, r_v16))
        mc, ms = KQ.quantize_block_sr(m, r_m24, True)
        vc, vs = KQ.quantize_block_sr(v, r_v24, False)
        tl.store(mc_ptr + t, mc)
        tl.store(ms_ptr + tj, ms)
        tl.store(vc_ptr + t, vc)
        tl.store(vs_ptr + tj, vs)

    def main(device: str, inp: str, out: str):
        d = dict(np.load(inp))
        dev = torch.device(device)
        T = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
        res = {}
        for name, off in (("off64", d["off64"]), ("off32", d["off32"])):
            for k, seed in enumerate(d["seeds"].tolist()):
                o = torch.zeros(5 * off.size, dtype=torch.uint32, device=dev)
                k_randint4x[(1,)](int(seed), T(off), o, off.size)
                res[f"r4_{name}_{k}"] = o.cpu().numpy().reshape(5, off.size)
                o = torch.zeros(3 * off.size, dtype=torch.uint32, device=dev)
                k_rounding_bits[(1,)](int(seed), T(off), o, off.size)
                res[f"rb_{name}_{k}"] = o.cpu().numpy().reshape(3, off.size)
                # philox4x32_10 on int64 counters (the kernels' kind) and int32 ones (tl.randint4x's
                # second word 0), as rounding_bits takes them with WIDE_PRODUCTS
                o = torch.zeros(4 * off.size, dtype=torch.uint32, device=dev)
                k_philox_written_out[(1,)](int(seed), T(off), o, off.size)
                res[f"px_{name}_{k}"] = o.cpu().numpy().reshape(4, off.size)
        for k, seed in enumerate(d["seeds"].tolist()):
            off = d["q8_off"]
            o = torch.zeros(3 * off.size, dtype=torch.uint32, device=dev)
            k_q8_rounding_bits[(1,)](int(seed), T(off), o, off.size)
            res[f"q8rb_{k}"] = o.cpu().numpy().reshape(3, off.size)
        if device == "cuda":  # mul.wide.u32 is PTX: the interpreter cannot run it
            x = d["mul_x"]
            o = torch.zeros(4 * x.size, dtype=torch.uint32, device=dev)
            k_wide_products[(1,)](T(x), o, x.size)
            res["wide_products"] = o.cpu().numpy().reshape(4, x.size)
        res["wide_rounds"] = np.array(bool(KRand.WIDE_PRODUCTS))
        n = d["bf16_x"].size
        rne = torch.zeros(n, dtype=torch.uint16, device=dev)
        sr = torch.zeros(n, dtype=torch.uint16, device=dev)
        back = torch.zeros(n, dtype=torch.float32, device=dev)
        k_bf16[(1,)](T(d["bf16_x"]), T(d["bf16_r"]), rne, sr, back, n)
        res["bf16_rne"], res["bf16_sr"], res["bf16_back"] = rne.cpu().numpy(), sr.cpu().numpy(), back.cpu().numpy()
        for key, signed in (("m", True), ("v", False)):
            xs, rs = d[f"q_{key}_x"], d[f"q_{key}_r"]
            for t in range(xs.shape[0]):
                bm, bn = xs.shape[1:]
                c = torch.zeros((bm, bn), dtype=torch.uint8, device=dev)
                s = torch.zeros((bm, bn // 128), dtype=torch.float32, device=dev)
                y = torch.zeros((bm, bn), dtype=torch.float32, device=dev)
                k_quant[(1,)](T(xs[t]), T(rs[t]), c, s, y, bm, bn, signed)
                res[f"q_{key}_{t}_codes"], res[f"q_{key}_{t}_scales"], res[f"q_{key}_{t}_y"] = c.cpu().numpy(), s.cpu().numpy(), y.cpu().numpy()
            codes, scales = d[f"dq_{key}_codes"], d[f"dq_{key}_scales"]
            y = torch.zeros(codes.shape, dtype=torch.float32, device=dev)
            k_dequant[(1,)](T(codes), T(scales), y, codes.shape[0], codes.shape[1], signed)
            res[f"dq_{key}_y"] = y.cpu().numpy()
        bm, bn = 4, 256
        outs = {
            "pb": torch.zeros((bm, bn), dtype=torch.uint16, device=dev),
            "mb": torch.zeros((bm, bn), dtype=torch.uint16, device=dev),
            "vb": torch.zeros((bm, bn), dtype=torch.uint16, device=dev),
            "mc": torch.zeros((bm, bn), dtype=torch.uint8, device=dev),
            "ms": torch.zeros((bm, bn // 128), dtype=torch.float32, device=dev),
            "vc": torch.zeros((bm, bn), dtype=torch.uint8, device=dev),
            "vs": torch.zeros((bm, bn // 128), dtype=torch.float32, device=dev),
        }
        seed = int(d["seeds"][-2])
        k_pipeline[(1,)](seed, T(d["pipe_p"]), T(d["pipe_m"]), T(d["pipe_v"]), *outs.values(),
                         PIPE_ROW0, PIPE_COL0, d["pipe_p"].shape[1], bm, bn)
        for k, v in outs.items():
            res[f"pipe_{k}"] = v.cpu().numpy()
        res["consts"] = np.array([int(getattr(KQ, n)) for n in CONSTANTS])
        np.savez(out, **res)

    main(sys.argv[1], sys.argv[2], sys.argv[3])
    sys.exit(0)


# ---------------------------------------------------------------------------------------------
# the parent: run the child, compare with the emulator

from forge_num.emulator import philox, quant8, rounding

MODES = [
    pytest.param("interpreter", marks=pytest.mark.interpreter),
    # "cuda": the Philox rounds as tl.randint4x writes them (FORGE_NUM_PHILOX_WIDE=0); "cuda-wide":
    # with one mul.wide.u32 a product (kernels/random.py, WIDE_PRODUCTS, the GPU's default): every
    # kernel here, the optimizer tile's path included
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.exactness]),
    pytest.param("cuda-wide", marks=[pytest.mark.gpu, pytest.mark.exactness]),
]


@pytest.fixture(scope="module", params=MODES)
def run(request, tmp_path_factory):
    mode = request.param
    tmp = tmp_path_factory.mktemp(f"twins_{mode}")
    inp, out = tmp / "in.npz", tmp / "out.npz"
    make_inputs(inp)
    env = dict(os.environ)
    if mode == "interpreter":
        env["TRITON_INTERPRET"] = "1"
        device = "cpu"
    else:
        env.pop("TRITON_INTERPRET", None)
        env["FORGE_NUM_PHILOX_WIDE"] = "1" if mode == "cuda-wide" else "0"
        device = "cuda"
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), device, str(inp), str(out)],
        env=env, capture_output=True, text=True, timeout=600, cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = dict(np.load(out))
    assert bool(res["wide_rounds"]) == (mode == "cuda-wide"), (mode, res["wide_rounds"])
    return dict(np.load(inp)), res


def bits32(a):
    return np.ascontiguousarray(a).view(np.uint32)


def test_randint4x_and_slices(run):
    d, res = run
    for name in ("off64", "off32"):
        for k, seed in enumerate(d["seeds"].tolist()):
            seed = int(seed)
            words = np.stack(philox.randint4x(seed, d[name]))
            assert np.array_equal(res[f"r4_{name}_{k}"][:4], words), (name, hex(seed))
            assert np.array_equal(res[f"r4_{name}_{k}"][4], philox.randint(seed, d[name]))
            assert np.array_equal(res[f"rb_{name}_{k}"], np.stack(philox.rounding_bits(seed, d[name]))), (name, hex(seed))


def test_q8_slices_per_element(run):
    """kernels/random.py's q8_rounding_bits (each element's own call of its pair, the Triton 8bit tiles'
    path) is the emulator's table, both halves of pairs, across the counter's high word."""
    d, res = run
    for k, seed in enumerate(d["seeds"].tolist()):
        assert np.array_equal(res[f"q8rb_{k}"], np.stack(philox.q8_rounding_bits(int(seed), d["q8_off"]))), hex(seed)


def test_philox_written_out_is_randint4x(run):
    """kernels/random.py's philox4x32_10 (the Gluon kernel's Philox) gives tl.randint4x's words and
    the emulator's, for every seed and int64 offset of the inputs (negative and >= 2^32 included), and
    every int32 offset (negative included: their high word is 0, not the sign's copies)."""
    d, res = run
    for name in ("off64", "off32"):
        for k, seed in enumerate(d["seeds"].tolist()):
            assert np.array_equal(res[f"px_{name}_{k}"], res[f"r4_{name}_{k}"][:4]), (name, hex(int(seed)))
            assert np.array_equal(res[f"px_{name}_{k}"], np.stack(philox.randint4x(int(seed), d[name]))), \
                (name, hex(int(seed)))


def test_wide_products_are_the_two_multiplies(run):
    """wide_products_a/b (one PTX mul.wide.u32) give umulhi(x, A) and x A mod 2^32 exactly, for the
    two round constants, edge values and random words; GPU only (the interpreter runs no PTX)."""
    d, res = run
    if "wide_products" not in res:
        pytest.skip("mul.wide.u32 is PTX: CUDA only")
    x = d["mul_x"].astype(np.uint64)
    got = res["wide_products"].astype(np.uint64)
    for row, const in ((0, philox.PHILOX_ROUND_A), (2, philox.PHILOX_ROUND_B)):
        product = x * np.uint64(const)  # < 2^64: exact in uint64
        assert np.array_equal(got[row], product >> np.uint64(32)), hex(const)
        assert np.array_equal(got[row + 1], product & np.uint64(0xFFFFFFFF)), hex(const)


def test_triton_known_answer_vectors(run):
    """The research note's Triton vectors, on the kernels themselves (seed 42: index 2 of SEEDS)."""
    d, res = run
    i = list(d["off64"]).index(2**32 + 5)
    assert [int(w) for w in res["r4_off64_2"][:4, i]] == [0x131A8A04, 0x494EFEE7, 0xE24F0E03, 0x5128A584]
    i = list(d["off64"]).index(5)
    assert [int(w) for w in res["r4_off64_2"][:4, i]] == [0x5099D809, 0x4B20B5D2, 0x0D41B5E2, 0x0A653407]


def test_bf16_roundings(run):
    d, res = run
    x, r = d["bf16_x"], d["bf16_r"]
    assert np.array_equal(res["bf16_rne"], rounding.bf16_rne_bits(x))
    sr = rounding.bf16_sr_bits(x, r)
    assert np.array_equal(res["bf16_sr"], sr)
    assert np.array_equal(bits32(res["bf16_back"]), bits32(rounding.bf16_to_f32(sr)))


@pytest.mark.parametrize("key,signed", [("m", True), ("v", False)])
def test_quantize_and_dequantize(run, key, signed):
    d, res = run
    for t in range(d[f"q_{key}_x"].shape[0]):
        codes, scales = quantize = quant8.quantize_block_sr(d[f"q_{key}_x"][t], d[f"q_{key}_r"][t], signed)
        assert np.array_equal(res[f"q_{key}_{t}_codes"], codes), t
        assert np.array_equal(bits32(res[f"q_{key}_{t}_scales"]), bits32(scales)), t
        assert np.array_equal(bits32(res[f"q_{key}_{t}_y"]), bits32(quant8.dequantize(*quantize, signed))), t
    y = quant8.dequantize(d[f"dq_{key}_codes"], d[f"dq_{key}_scales"], signed)
    assert np.array_equal(bits32(res[f"dq_{key}_y"]), bits32(y))
    # the special tile really exercised the poisoned and clamped blocks
    assert np.isnan(res[f"q_{key}_0_scales"]).sum() == 3 and res[f"q_{key}_0_scales"][3, 1] == 2.0**127


def test_optimizer_tile_rounding_path(run):
    """offsets -> rounding_bits -> bf16 SR (p, m, v), offsets -> q8_rounding_bits -> 8-bit codes (m, v), as
    the tables say."""
    d, res = run
    seed = int(d["seeds"][-2])
    rows = np.arange(PIPE_ROW0, PIPE_ROW0 + 4)
    cols = np.arange(PIPE_COL0, PIPE_COL0 + 256)
    off = (rows[:, None] * PIPE_COLS + cols[None, :]).astype(np.int64)
    r_p, r_m16, r_v16 = philox.rounding_bits(seed, off)
    _, r_m24, r_v24 = philox.q8_rounding_bits(seed, off)
    tile = np.ix_(rows, cols)
    p, m, v = d["pipe_p"][tile], d["pipe_m"][tile], d["pipe_v"][tile]
    assert np.array_equal(res["pipe_pb"], rounding.bf16_sr_bits(p, r_p))
    assert np.array_equal(res["pipe_mb"], rounding.bf16_sr_bits(m, r_m16))
    assert np.array_equal(res["pipe_vb"], rounding.bf16_sr_bits(v, r_v16))
    mc, ms = quant8.quantize_block_sr(m, r_m24, True)
    vc, vs = quant8.quantize_block_sr(v, r_v24, False)
    assert np.array_equal(res["pipe_mc"], mc) and np.array_equal(bits32(res["pipe_ms"]), bits32(ms))
    assert np.array_equal(res["pipe_vc"], vc) and np.array_equal(bits32(res["pipe_vs"]), bits32(vs))


def test_twins_share_the_format_constants(run):
    _, res = run
    assert res["consts"].tolist() == [getattr(quant8, n) for n in CONSTANTS]
