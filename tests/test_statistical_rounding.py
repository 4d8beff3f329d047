"""Unbiasedness of stochastic rounding on the project's random stream, by a stated test.

Setup. A grid of 24 values: for bf16, one fp32 value in each of 24 bf16 binades spread over the
whole range (exponent fields 0 (subnormal), 11, 22, ..., 254), alternating signs, random lower
halves; for the 8-bit codes, an m value (E4M3, signed) and a v value (E5M3) from 0 to 18 (m) or
34 (v) binades below their block maximum (so subnormal codes are included), under block scales
from 2^-60 to 2^60. Value i draws its random bits from the project's stream exactly as an
optimizer step would: seed_i = derive_seed(USER_SEED, step=i, param_id=PARAM_ID), counters
0 .. N-1 (N = 1,008,000) and the slices of the random-slice tables: bf16, one ``randint4x(seed_i, n)``
an element (r_p, r_m16, r_v16); the codes, one ``randint4x(seed_i, n >> 1)`` a pair of elements
(r_m24, r_v24 of ``q8_rounding_bits``), so that the codes' draws are both halves of every call. So every value gets
>= 10^6 draws per slice (the 8-bit tiles hold 127 copies of the value and the block maximum per
128-element block: 1,000,125 draws).

Test. Each draw rounds to one of the value's two neighbours, so E[y] = x is equivalent to
P(up) = p0 with p0 = lo/2^16 (bf16) or p0 = (|x| - lower)/(upper - lower) (8-bit, values chosen
where the proof says the rounding is exactly unbiased: D <= 24). For each (value, slice) an exact
two-sided binomial test (``scipy.stats.binomtest``) of H0: P(up) = p0. Family: 24 x 3 bf16 tests
+ 24 m + 24 v = 120 tests at family-wise significance ALPHA = 1e-3, Bonferroni: reject if any
p-value < ALPHA / 120. Seeds are fixed, so the outcome is reproducible. In addition every draw is
checked against its proved bound (bf16: one of the two neighbours, within one ulp; 8-bit:
|y - x| < quant8_error_bound). ``test_family_test_has_power`` shows the same procedure rejects
a rounding that is biased.

The ``gpu`` variant runs the Triton twins on CUDA over the same stream, requires the counts to
equal the emulator's exactly, and applies the same family test.
"""

from __future__ import annotations

import bisect
from fractions import Fraction as F
from functools import lru_cache

import numpy as np
import pytest
from scipy.stats import binomtest

from forge_num.emulator import philox, quant8, rounding

pytestmark = pytest.mark.statistical

USER_SEED = 20240917
PARAM_ID = 3
N_VALUES = 24
ROWS = 7875  # 8-bit tiles [ROWS, 128]: column 0 holds the block maximum, 127 columns the value
N = ROWS * quant8.QBLOCK  # 1,008,000 offsets per value
ALPHA = 1e-3
N_TESTS = N_VALUES * 5


@lru_cache(maxsize=None)
def grid():
    rng = np.random.default_rng(7)
    vals = []
    for i in range(N_VALUES):
        e = round(i * 254 / (N_VALUES - 1))
        hm = int(rng.integers(0, 0x7F))  # < 0x7F: exponent 254 stays below bf16max
        lo = int(rng.integers(1, 2**16))
        bf = ((i % 2) << 31) | (e << 23) | (hm << 16) | lo
        scale_exp = round(-60 + 120 * i / (N_VALUES - 1))
        anchor = np.float32(1.5 * 2.0**scale_exp)
        dm, dv = round(i * 18 / (N_VALUES - 1)), round(i * 34 / (N_VALUES - 1))
        xm = np.float32((1 + rng.random()) * 2.0 ** (scale_exp - dm) * (-1 if i % 3 == 1 else 1))
        xv = np.float32((1 + rng.random()) * 2.0 ** (scale_exp - dv))
        vals.append({"bf16": bf, "m": (xm, anchor), "v": (xv, anchor)})
    return vals


def unit_grid(signed: bool):
    E, M = (4, 3) if signed else (5, 3)
    out = []
    for c in range(2 ** (E + M)):
        ec, f = c >> M, c & 7
        out.append((1 + F(f, 8)) * F(2) ** (ec - (2**E - 1)) if ec else F(f, 8) * F(2) ** (2 - 2**E))
    return out


def neighbours(x: np.float32, scale: np.float32, signed: bool):
    """Lower and upper grid neighbours of |x| (Fractions), from the format's definition."""
    s = F(float(scale))
    g = unit_grid(signed)
    ax = abs(F(float(x))) / s
    i = bisect.bisect_right(g, ax) - 1
    assert g[i] < ax, "grid value: nothing to test"
    return g[i] * s, g[i + 1] * s


def make_tile(x, anchor):
    t = np.full((ROWS, quant8.QBLOCK), x, dtype=np.float32)
    t[:, 0] = anchor
    return t


def expected(vals):
    """p0 for each test, keyed (i, slice): lo/2^16 (bf16) and the exact 8-bit fraction."""
    p0 = {}
    for i, v in enumerate(vals):
        for sl in ("p", "m16", "v16"):
            p0[(i, sl)] = F(v["bf16"] & 0xFFFF, 2**16)
        for key, signed in (("m", True), ("v", False)):
            x, anchor = v[key]
            _, scales = quant8.quantize_block_sr(make_tile(x, anchor)[:1], np.zeros((1, 128), np.uint32), signed)
            assert float(quant8.quant8_bias_bound(x, scales[0, 0], signed)) == 0, "pick values in the exact region"
            lo, hi = neighbours(x, scales[0, 0], signed)
            p0[(i, key)] = (abs(F(float(x))) - lo) / (hi - lo)
    return p0


def emulator_counts(i, v):
    """Number of upward roundings per slice for value i, on the emulator, with the bound checks."""
    seed = philox.derive_seed(USER_SEED, i, PARAM_ID)
    r_p, r_m16, r_v16 = philox.rounding_bits(seed, np.arange(N, dtype=np.int64))
    _, r_m24, r_v24 = philox.q8_rounding_bits(seed, np.arange(N, dtype=np.int64))
    counts = {}
    b = v["bf16"]
    x = np.array([b], dtype=np.uint32).view(np.float32)
    for sl, r in (("p", r_p), ("m16", r_m16), ("v16", r_v16)):
        out = rounding.bf16_sr_bits(x, r)
        up = out != np.uint16(b >> 16)
        assert np.all(out[up] == np.uint16((b >> 16) + 1))  # a neighbour, so within one ulp
        counts[(i, sl)] = int(up.sum())
    for key, signed, r in (("m", True, r_m24), ("v", False, r_v24)):
        xv, anchor = v[key]
        tile = make_tile(xv, anchor)
        codes, scales = quant8.quantize_block_sr(tile, r.reshape(tile.shape), signed)
        y = quant8.dequantize(codes, scales, signed)[:, 1:]
        lo, hi = neighbours(xv, scales[0, 0], signed)
        mag = np.abs(y.astype(np.float64))
        up = mag == float(hi)
        assert np.all(up | (mag == float(lo)))
        if signed:
            assert np.all(np.signbit(y) == np.signbit(xv))
        bound = quant8.quant8_error_bound(np.full(y.shape, xv), scales[0, 0], signed)
        assert np.all(np.abs(y.astype(np.float64) - float(xv)) < bound)
        counts[(i, key)] = int(up.sum())
    return counts


def n_draws(key):
    return N if key[1] in ("p", "m16", "v16") else ROWS * (quant8.QBLOCK - 1)


def family_test(counts, p0):
    """Bonferroni over all tests: the keys that reject at ALPHA / N_TESTS, and the smallest p-value."""
    pvals = {k: binomtest(counts[k], n_draws(k), float(p0[k])).pvalue for k in counts}
    rejected = [k for k, pv in pvals.items() if pv < ALPHA / N_TESTS]
    return rejected, min(pvals.values())


@lru_cache(maxsize=None)
def all_emulator_counts():
    counts = {}
    for i, v in enumerate(grid()):
        counts.update(emulator_counts(i, v))
    return counts


def test_grid_spans_every_regime():
    vals = grid()
    exps = sorted({(v["bf16"] >> 23) & 0xFF for v in vals})
    assert exps[0] == 0 and exps[-1] == 254 and len(exps) == N_VALUES  # subnormal .. top binade
    assert {v["bf16"] >> 31 for v in vals} == {0, 1}
    assert any(v["m"][0] < 0 for v in vals)
    # subnormal codes are exercised: some m values lie below 2^-14 of their scale
    assert any(abs(float(v["m"][0])) < 2.0**-14 * float(v["m"][1]) for v in vals)
    assert any(float(v["v"][0]) < 2.0**-30 * float(v["v"][1]) for v in vals)
    assert len(expected(vals)) == N_TESTS


def test_unbiased_on_project_stream():
    counts = all_emulator_counts()
    rejected, pmin = family_test(counts, expected(grid()))
    assert not rejected, f"rejected at family-wise {ALPHA} (Bonferroni, {N_TESTS} tests): {rejected}, min p = {pmin}"


def test_family_test_has_power():
    """The same procedure rejects SR that reads one random bit too few (P(up) = 2*lo/2^16, capped)
    and round-toward-zero, on the same draws: the test can fail."""
    counts = all_emulator_counts()
    p0 = expected(grid())
    biased = {}
    for i, v in enumerate(grid()[:6]):
        seed = philox.derive_seed(USER_SEED, i, PARAM_ID)
        r_p = philox.rounding_bits(seed, np.arange(N, dtype=np.int64))[0]
        biased[(i, "p")] = int(((r_p >> 1) < (v["bf16"] & 0xFFFF)).sum())
    assert family_test(biased, p0)[0]
    truncated = {k: 0 for k in counts}
    assert family_test(truncated, p0)[0]


# ---------------------------------------------------------------------------------------------
# the same on CUDA, with the Triton twins


def _define_gpu_kernels():
    """The wrapper kernels, defined on first use so that CPU runs never import triton here. The
    names their bodies use are module globals (a jit function resolves names in its globals)."""
    global tl, KQ, KRand, KR, _k_sr, _k_q
    import triton
    import triton.language as tl

    from forge_num.kernels import quant8 as KQ
    from forge_num.kernels import random as KRand
    from forge_num.kernels import rounding as KR

    @triton.jit
    def _k_sr(seed, x_ptr, p_ptr, m_ptr, v_ptr, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        r_p, r_m16, r_v16 = KRand.rounding_bits(seed, offs.to(tl.int64))
        x = tl.load(x_ptr + offs * 0)
        tl.store(p_ptr + offs, KR.bf16_sr_bits(x, r_p), mask=mask)
        tl.store(m_ptr + offs, KR.bf16_sr_bits(x, r_m16), mask=mask)
        tl.store(v_ptr + offs, KR.bf16_sr_bits(x, r_v16), mask=mask)

    @triton.jit
    def _k_q(seed, t_ptr, c_ptr, s_ptr, NROWS, BR: tl.constexpr, SIGNED: tl.constexpr):
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        inside = rows[:, None] < NROWS
        off = rows.to(tl.int64)[:, None] * 128 + tl.arange(0, 128)[None, :]
        _, r_m24, r_v24 = KRand.q8_rounding_bits(seed, off)
        if SIGNED:
            r = r_m24
        else:
            r = r_v24
        codes, scales = KQ.quantize_block_sr(tl.load(t_ptr + off, mask=inside, other=0.0), r, SIGNED)
        tl.store(c_ptr + off, codes, mask=inside)
        tl.store(s_ptr + rows[:, None] + tl.arange(0, 1)[None, :], scales, mask=inside)


def _gpu_counts(device: str = "cuda"):
    import torch
    import triton

    if "_k_sr" not in globals():
        _define_gpu_kernels()
    dev = torch.device(device)
    counts = {}
    for i, v in enumerate(grid()):
        seed = philox.derive_seed(USER_SEED, i, PARAM_ID)
        b = v["bf16"]
        x = torch.tensor([b], dtype=torch.int64).to(torch.uint32).view(torch.float32).to(dev)
        outs = [torch.empty(N, dtype=torch.uint16, device=dev) for _ in range(3)]
        _k_sr[(triton.cdiv(N, 1024),)](seed, x, *outs, N, 1024)
        for sl, o in zip(("p", "m16", "v16"), outs):
            o = o.cpu().numpy()
            up = o != np.uint16(b >> 16)
            assert np.all(o[up] == np.uint16((b >> 16) + 1))
            counts[(i, sl)] = int(up.sum())
        for key, signed in (("m", True), ("v", False)):
            xv, anchor = v[key]
            tile = torch.from_numpy(make_tile(xv, anchor)).to(dev)
            codes = torch.empty((ROWS, 128), dtype=torch.uint8, device=dev)
            scales = torch.empty((ROWS, 1), dtype=torch.float32, device=dev)
            _k_q[(triton.cdiv(ROWS, 32),)](seed, tile, codes, scales, ROWS, 32, signed)
            y = quant8.dequantize(codes.cpu().numpy(), scales.cpu().numpy(), signed)[:, 1:]
            lo, hi = neighbours(xv, scales[0, 0].item(), signed)
            mag = np.abs(y.astype(np.float64))
            assert np.all((mag == float(hi)) | (mag == float(lo)))
            counts[(i, key)] = int((mag == float(hi)).sum())
    return counts


@pytest.mark.gpu
def test_gpu_stream_equals_emulator_and_is_unbiased():
    gpu = _gpu_counts()
    assert gpu == all_emulator_counts()
    rejected, pmin = family_test(gpu, expected(grid()))
    assert not rejected, f"rejected: {rejected}, min p = {pmin}"
