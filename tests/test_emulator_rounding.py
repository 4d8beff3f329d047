"""emulator/rounding.py and emulator/quant8.py against exact references (fractions), exhaustively
over the random input where the claim is about the random input.

* RNE: every one of the 2^16 upper halves with a sample of lower halves (ties included) against a
  reference that rounds |x| / step with float64 ``rint`` (exact here: step is a power of two, the
  quotient has at most 24 significant bits), and a sample against an exact Fraction reference.
* SR (bf16): for each sampled fp32 value all 2^16 random inputs are enumerated; the mean of the
  results is computed exactly (Fraction) and must equal x, each result must lie less than one
  bf16 ulp from x. Pinned values cover every bf16 binade (exponent fields 0..254, both signs,
  subnormals), hypothesis adds more.
* 8-bit codes: for each sampled (value, block maximum) all 2^24 random inputs are enumerated; the
  number of upward roundings must equal floor(p * 2^24) for the exact fraction p of the way
  from the lower to the upper grid neighbour (computed from the format's definition with
  Fractions), so the expectation is exact wherever quant8_bias_bound says 0 and within it
  elsewhere; whole tiles are held against a from-the-definition reference quantizer.
* The proofs' check scripts run (proofs/check_*.py).
"""

from __future__ import annotations

import bisect
import importlib.util
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]


from forge_num.emulator import quant8, rounding

pytestmark = pytest.mark.emulator

F = Fraction
BF16_MAX = F(2**8 - 1, 2**7) * 2**127  # (2 - 2^-7) * 2^127
N16 = 2**16
N24 = 2**24
LIMIT = 1.875 * 2.0**127  # the largest block maximum with a finite scale (an fp32 value)


# ---------------------------------------------------------------------------------------------
# exact decoders, written from the IEEE field definitions (no bit tricks shared with the code)


def f32_value(bits: int) -> Fraction:
    s, e, f = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    assert e != 0xFF
    v = F(f, 2**149) if e == 0 else F(2**23 + f) * F(2) ** (e - 150)
    return -v if s else v


def bf16_value(hi: int) -> Fraction:
    s, e, f = hi >> 15, (hi >> 7) & 0xFF, hi & 0x7F
    assert e != 0xFF
    v = F(f, 2**133) if e == 0 else F(2**7 + f) * F(2) ** (e - 134)
    return -v if s else v


def bf16_ulp(bits: int) -> Fraction:
    """Spacing of the bf16 grid in the binade of the fp32 value with these bits."""
    e = (bits >> 23) & 0xFF
    return F(2) ** (max(e, 1) - 134)


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bits_of(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))


# ---------------------------------------------------------------------------------------------
# bf16 round to nearest even


def rne_reference(x32: np.ndarray) -> np.ndarray:
    """bf16 encodings of RNE(x) for non-NaN float32 x: rint(|x| / step) * step in float64."""
    x = x32.astype(np.float64)
    ax = np.abs(x)
    _, e = np.frexp(ax)
    step = np.ldexp(1.0, np.maximum(e - 1, -126) - 7)
    y = np.rint(ax / step) * step  # rint: ties to even
    y = np.where((y > float(BF16_MAX)) | np.isinf(ax), np.inf, y)
    y = np.copysign(y, x)
    return (y.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def rne_fraction(bits: int) -> int:
    """Exact RNE of one finite fp32 encoding, by Fractions."""
    sign, mag = bits & 0x80000000, bits & 0x7FFFFFFF
    ax = f32_value(mag)
    lo_hi = mag >> 16
    a = bf16_value(lo_hi)
    b = a + bf16_ulp(mag)
    if ax - a < b - ax:
        h = lo_hi
    elif ax - a > b - ax:
        h = lo_hi + 1
    else:
        h = lo_hi if lo_hi % 2 == 0 else lo_hi + 1
    return (sign >> 16) | h  # lo_hi + 1 == 0x7F80 is Inf: overflow at or beyond max + ulp/2


def test_rne_all_upper_halves():
    his = np.arange(N16, dtype=np.uint32)
    rng = np.random.default_rng(1)
    los = np.concatenate([[0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], rng.integers(1, N16, 10)]).astype(np.uint32)
    bits = ((his[:, None] << 16) | los[None, :]).ravel()
    x = f32(bits)
    got = rounding.bf16_rne_bits(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], rne_reference(x[~nan]))
    assert np.array_equal(got[nan], ((bits[nan] >> 16) | 0x40).astype(np.uint16))


def test_rne_against_fractions_and_ties():
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 2**32, 400, dtype=np.uint64).astype(np.uint32)
    bits[:200] = (bits[:200] & 0xFFFF0000) | 0x8000  # exact ties
    pinned = [0x3F808000, 0x3F818000, 0x7F7F7FFF, 0x7F7F8000, 0xFF7F8000, 0x007F8000, 0x00008000, 0x80018000]
    bits = np.concatenate([bits, np.array(pinned, dtype=np.uint32)])
    bits = bits[(bits & 0x7F800000) != 0x7F800000]
    got = rounding.bf16_rne_bits(f32(bits))
    for b, g in zip(bits.tolist(), got.tolist()):
        assert g == rne_fraction(b), hex(b)
    # ties to even, by hand: 1 + 2^-8 -> 1 (even); 1 + 3*2^-8 -> 1 + 2^-6; max + ulp/2 -> Inf
    assert rounding.bf16_rne_bits(f32([0x3F808000, 0x3F818000, 0x7F7F8000])).tolist() == [0x3F80, 0x3F82, 0x7F80]


# ---------------------------------------------------------------------------------------------
# bf16 stochastic rounding: exact expectation over all 2^16 random inputs


def sr_all_random(bits: np.ndarray) -> np.ndarray:
    """[n, 2^16] results of bf16_sr_bits for each value and every random input."""
    r = np.arange(N16, dtype=np.uint32)
    return rounding.bf16_sr_bits(f32(bits)[:, None], r[None, :])


def check_sr_exact(bits_list):
    """Every value: results are RZ(x) or the next bf16 away from zero, mean exactly x, error < ulp."""
    bits_arr = np.asarray(bits_list, dtype=np.uint32)
    for start in range(0, len(bits_arr), 16):
        chunk = bits_arr[start : start + 16]
        out = sr_all_random(chunk).astype(np.int64)
        down = (chunk >> 16).astype(np.int64)
        is_down = out == down[:, None]
        assert np.all(is_down | (out == down[:, None] + 1)), "a result is not one of the two neighbours"
        n_up = (~is_down).sum(axis=1)
        for b, d, k in zip(chunk.tolist(), down.tolist(), n_up.tolist()):
            x = f32_value(b)
            lo = b & 0xFFFF
            assert k == lo, (hex(b), k)  # P(up) = lo / 2^16 exactly
            mean = (bf16_value(d) * (N16 - k) + bf16_value(d + 1) * k) / N16 if k else bf16_value(d)
            assert mean == x, hex(b)
            ulp = bf16_ulp(b)
            assert abs(bf16_value(d) - x) < ulp
            if k:
                assert abs(bf16_value(d + 1) - x) < ulp


def pinned_sr_values():
    """Every bf16 binade (exponent 0..254), both signs, binade edges and random mantissas."""
    rng = np.random.default_rng(3)
    vals = []
    for e in range(255):
        for sign in (0, 1):
            for hm, lo in ((0x00, 0x0001), (0x7F, 0xFFFF), (int(rng.integers(0, 128)), int(rng.integers(1, N16))), (0x2A, 0x8000)):
                if e == 254 and hm == 0x7F:
                    continue  # above bf16max: the saturation range, tested below
                vals.append((sign << 31) | (e << 23) | (hm << 16) | lo)
    return vals


def test_sr_exact_expectation_every_binade():
    check_sr_exact(pinned_sr_values())


@settings(max_examples=60)
@given(st.integers(0, 2**32 - 1))
def test_sr_exact_expectation_hypothesis_bits(b):
    if (b & 0x7F800000) == 0x7F800000 or (b & 0x7FFF0000) == 0x7F7F0000:
        return  # specials and the saturation range have their own tests
    check_sr_exact([b])


@settings(max_examples=40)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_sr_exact_expectation_hypothesis_floats(x):
    b = bits_of(x)
    if (b & 0x7FFF0000) == 0x7F7F0000:
        return  # the saturation range has its own test
    check_sr_exact([b])


def test_sr_saturates_above_bf16_max():
    """|x| in (bf16max, fp32max]: always ±bf16max; E[y] = ±bf16max, biased toward zero by
    |x| - bf16max = lo * 2^104 < ulp = 2^120 (the documented claim for this range)."""
    for b in (0x7F7F0001, 0x7F7F8000, 0x7F7FFFFF, 0xFF7F0001, 0xFF7FFFFF, 0x7F7F1234):
        out = sr_all_random(np.array([b], dtype=np.uint32))[0]
        assert np.all(out == (b >> 16))
        x = f32_value(b)
        bias = abs(x) - BF16_MAX
        assert bias == (b & 0xFFFF) * F(2) ** 104 and 0 < bias < F(2) ** 120
    # the largest finite bf16 itself and just below it stay exactly unbiased
    check_sr_exact([0x7F7F0000, 0x7F7EFFFF, 0xFF7EFFFF, 0x7F7E0001])


def test_sr_special_values_for_every_random_input():
    nans = [0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0xFF800001, 0x7FA00000, 0xFFC00001, 0x7F80FFFF]
    out = sr_all_random(np.array(nans, dtype=np.uint32))
    for b, row in zip(nans, out):
        want = (b >> 16) | 0x40
        assert np.all(row == want)
        assert (want & 0x7F80) == 0x7F80 and (want & 0x7F) != 0 and (want >> 15) == (b >> 31)  # NaN, sign kept
    keep = [0x7F800000, 0xFF800000, 0x00000000, 0x80000000]  # ±Inf, ±0
    out = sr_all_random(np.array(keep, dtype=np.uint32))
    for b, row in zip(keep, out):
        assert np.all(row == (b >> 16))
    rne = rounding.bf16_rne_bits(f32(nans + keep))
    assert rne.tolist() == [((b >> 16) | 0x40) for b in nans] + [b >> 16 for b in keep]


def test_bf16_representable_values_are_fixed_points():
    hi = np.arange(N16, dtype=np.uint32)
    x = f32(hi << 16)
    nan = np.isnan(x)
    assert np.array_equal(rounding.bf16_rne_bits(x)[~nan], hi[~nan].astype(np.uint16))
    for r in (0, 1, 0x7FFF, 0xFFFF):
        got = rounding.bf16_sr_bits(x, np.full(N16, r, dtype=np.uint32))
        assert np.array_equal(got[~nan], hi[~nan].astype(np.uint16))
    back = rounding.bf16_to_f32(hi.astype(np.uint16))
    assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), hi << 16)


def test_sr_argument_checks():
    x = np.zeros(3, dtype=np.float32)
    with pytest.raises(TypeError):
        rounding.bf16_sr_bits(x, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError):
        rounding.bf16_sr_bits(x, np.full(3, N16, dtype=np.uint32))
    with pytest.raises(TypeError):
        rounding.bf16_rne_bits(np.zeros(3))  # float64 would round twice


# ---------------------------------------------------------------------------------------------
# 8-bit codes: reference from the format's definition


@lru_cache(maxsize=None)
def unit_grid(signed: bool) -> tuple:
    """Magnitudes q(c), c = 0 .. 2^(E+M)-1, from the definition in emulator/quant8.py."""
    E, M = (4, 3) if signed else (5, 3)
    out = []
    for c in range(2 ** (E + M)):
        ec, f = c >> M, c & (2**M - 1)
        out.append((1 + F(f, 2**M)) * F(2) ** (ec - (2**E - 1)) if ec else F(f, 2**M) * F(2) ** (2 - 2**E))
    assert all(a < b for a, b in zip(out, out[1:]))
    return tuple(out)


def reference_scale(absmax: Fraction, signed: bool) -> Fraction:
    """Smallest power of two s >= 2^(2^E - 128) with absmax <= (2 - 2^-M) s."""
    E = 4 if signed else 5
    s = F(2) ** ((2**E - 1) - 127)
    while absmax > F(15, 8) * s:
        s *= 2
    return s


def reference_round(x: Fraction, s: Fraction, signed: bool):
    """(lower neighbour, upper neighbour, floor(p * 2^24)) of |x| on the grid q * s."""
    grid = unit_grid(signed)
    ax = abs(x) / s
    i = bisect.bisect_right(grid, ax) - 1
    lo = grid[i]
    if lo == ax:
        return lo * s, lo * s, 0
    hi = grid[i + 1]
    return lo * s, hi * s, ((ax - lo) * N24) // (hi - lo)


def enumerate_codes(x: float, anchor: float, signed: bool):
    """Counts of each code over all 2^24 random inputs for element x in a block whose max is anchor."""
    xb = np.array(x, dtype=np.float32).view(np.uint32)
    # the block holds x and anchor: its maximum key is the larger of the two
    key = np.maximum(
        quant8.magnitude_key(np.array(anchor, dtype=np.float32).view(np.uint32), signed),
        quant8.magnitude_key(xb, signed),
    )
    eb, poisoned = quant8.block_exponent(key, signed)
    assert not poisoned
    counts = np.zeros(256, dtype=np.int64)
    for start in range(0, N24, N16):
        r = np.arange(start, start + N16, dtype=np.uint32)
        counts += np.bincount(quant8.sr_code(xb, eb, r, signed).astype(np.intp), minlength=256)
    scale = np.array(eb.astype(np.uint32) << np.uint32(23), dtype=np.uint32).view(np.float32)
    return counts, float(scale)


def check_code_enumeration(x: float, anchor: float, signed: bool):
    x = float(np.float32(x))
    counts, scale = enumerate_codes(x, anchor, signed)
    s = F(scale)
    assert s == reference_scale(max(abs(F(float(np.float32(anchor)))), abs(F(x))), signed)
    lo, hi, t = reference_round(F(x), s, signed)
    codes = np.nonzero(counts)[0].astype(np.uint8)
    vals = [abs(F(float(v))) for v in quant8.code_unit_value(codes, signed)]
    by_val = {v * s: int(counts[c]) for v, c in zip(vals, codes)}
    assert set(by_val) <= {lo, hi}, (x, anchor, by_val, lo, hi)
    n_up = by_val.get(hi, 0) if hi != lo else 0
    assert n_up == t, (x, anchor, n_up, t)  # P(up) = floor(p 2^24) / 2^24, exactly
    if signed:  # the sign bit of every code is the sign bit of x
        assert all(((int(c) >> 7) == (bits_of(x) >> 31)) for c in codes)
    mean = (lo * (N24 - n_up) + hi * n_up) / N24
    bias = float(abs(F(x)) - mean)
    bias_bound = float(quant8.quant8_bias_bound(np.float32(x), np.float32(scale), signed))
    if bias_bound == 0:
        assert mean == abs(F(x)), (x, anchor)  # exactly unbiased
    else:
        assert 0 <= bias < bias_bound
    err_bound = F(float(quant8.quant8_error_bound(np.float32(x), np.float32(scale), signed)))
    assert abs(F(x)) - lo < err_bound and hi - abs(F(x)) < err_bound
    return bias_bound == 0


def pinned_code_cases():
    rng = np.random.default_rng(4)
    cases = []
    for signed, dmax in ((True, 22), (False, 38)):
        for d in range(0, dmax + 1, 2 if signed else 3):  # binades below the block maximum
            m = 1 + rng.random()
            cases.append((float(np.float32((-m if signed and d % 4 else m) * 2.0**-d)), 1.0, signed))
        cases += [
            (0.0, 1.0, signed),
            (1.0, 1.0, signed),  # the block maximum itself
            (1.9, 1.9, signed),  # absmax above 1.875 * 2^0: the scale carries to 2^1
            (1.875, 1.875, signed),  # exactly the largest code: scale 2^0
            (1.7e38, 3.1e38, signed),  # near the largest finite scale
            (float(f32(0x00000001)), 1e-37, signed),  # fp32 subnormals, block at the scale clamp
            (float(f32(0x007FFFFF)), float(f32(0x00800001)), signed),
            (3e-39, 2e-30, signed),
        ]
    cases += [(-0.0, 1.0, True), (-3.3e-6, 2.0, True), (-1e-9, 1.0, True)]
    return cases


@pytest.mark.parametrize("x,anchor,signed", pinned_code_cases())
def test_codes_exact_over_all_random_inputs(x, anchor, signed):
    check_code_enumeration(x, anchor, signed)


def test_code_enumeration_covers_both_regimes():
    """The pinned cases include values where the bias bound is 0 and values where it is not."""
    flags = {check_code_enumeration(x, a, s) for x, a, s in [(0.3, 1.0, True), (1e-6, 1.0, True)]}
    assert flags == {True, False}


@settings(max_examples=12)
@given(
    st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-LIMIT, max_value=LIMIT),
    st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=0, max_value=LIMIT),
    st.booleans(),
)
def test_codes_exact_hypothesis(x, anchor, signed):
    if not signed:
        x = abs(x)
    check_code_enumeration(x, max(abs(x), anchor), signed)


def test_code_values_match_definition():
    for signed in (True, False):
        codes = np.arange(256, dtype=np.uint8)
        q = quant8.code_unit_value(codes, signed)
        grid = unit_grid(signed)
        for c, v in zip(codes.tolist(), q.tolist()):
            mag = c & 0x7F if signed else c
            want = -grid[mag] if signed and c >> 7 else grid[mag]
            assert F(v) == want
            if signed and c >> 7:
                assert np.signbit(q[c])  # 0x80 is -0.0


def reference_tile(x: np.ndarray, r: np.ndarray, signed: bool):
    """Dequantized tile and scales from the definitions: exact SR on the grid with 24-bit thresholds."""
    rows, cols = x.shape
    out = np.zeros_like(x)
    scales = np.zeros((rows, cols // quant8.QBLOCK), dtype=np.float32)
    for i in range(rows):
        for j in range(cols // quant8.QBLOCK):
            sl = slice(j * quant8.QBLOCK, (j + 1) * quant8.QBLOCK)
            blk = x[i, sl]
            if not np.all(np.isfinite(blk)) or (not signed and np.any((blk < 0))):
                scales[i, j] = np.nan
                out[i, sl] = np.nan
                continue
            amax = max(abs(F(float(v))) for v in blk)
            if amax > F(15, 8) * F(2) ** 127:
                scales[i, j] = np.nan
                out[i, sl] = np.nan
                continue
            s = reference_scale(amax, signed)
            scales[i, j] = float(s)
            for k, (v, rr) in enumerate(zip(blk.tolist(), r[i, sl].tolist())):
                lo, hi, t = reference_round(F(v), s, signed)
                y = float(hi if rr < t else lo)
                out[i, j * quant8.QBLOCK + k] = np.copysign(y, v) if signed else y
    return out, scales


def special_tile(rng, signed: bool):
    x = (rng.standard_normal((3, 256)) * np.exp(rng.uniform(-40, 10, (3, 256)))).astype(np.float32)
    if not signed:
        x = np.abs(x)
    x[0, :6] = [0.0, -0.0, 1e-45, -1e-40, 1.9, 3e-39]
    if not signed:
        x[0, :6] = np.abs(x[0, :6])
        x[0, 1] = -0.0  # -0 is accepted for v
    x[1, :128] = np.float32(1e-41)  # a block of fp32 subnormals
    x[1, 128:] = 0.0  # an all-zero block
    x[2, 7] = np.inf if signed else -1.0  # poisoned block (Inf for m, a negative v)
    x[2, 200] = np.float32(3.2e38)  # |x| > 1.875 * 2^127: poisoned
    return x


@pytest.mark.parametrize("signed", [True, False])
def test_quantize_tile_against_reference(signed):
    rng = np.random.default_rng(5 + signed)
    for trial in range(3):
        x = special_tile(rng, signed) if trial == 0 else (rng.standard_normal((2, 256)) * 10.0 ** rng.uniform(-8, 3)).astype(np.float32)
        if not signed:
            x = np.where(np.signbit(x) & (x != 0), -x, x).astype(np.float32)
        r = rng.integers(0, N24, x.shape, dtype=np.uint32)
        codes, scales = quant8.quantize_block_sr(x, r, signed)
        y = quant8.dequantize(codes, scales, signed)
        want, want_scales = reference_tile(x, r, signed)
        assert np.array_equal(scales.view(np.uint32)[~np.isnan(scales)], want_scales.view(np.uint32)[~np.isnan(want_scales)])
        assert np.array_equal(np.isnan(scales), np.isnan(want_scales))
        assert np.all(scales.view(np.uint32)[np.isnan(scales)] == 0x7FC00000)
        finite = ~np.isnan(want)
        assert np.array_equal(y.view(np.uint32)[finite], want.view(np.uint32)[finite])  # bits: -0.0 too
        assert np.all(np.isnan(y[~finite])) and np.all(codes[~finite] == 0)
        bound = quant8.quant8_error_bound(x, np.repeat(scales, quant8.QBLOCK, axis=1), signed)
        assert np.all(np.abs(y[finite].astype(np.float64) - x[finite]) < bound[finite])


def test_sr_threshold_is_the_dropped_field_aligned_to_24_bits():
    """quant8.sr_threshold (one shift pair, the kernel's twin) equals the module docstring's T =
    floor(L 2^24 / 2^D) -- L << (24 - D) up to D = 24, L >> (D - 24) above -- for every D a code can
    drop (20 in the normal binades, up to 23 + 254 below them) and, for each, every L < 2^min(D, 24)
    of a grid of edge and random values (all 2^20 at D = 20)."""
    rng = np.random.default_rng(7)
    for D in range(20, 23 + 255):
        width = min(D, 24)
        if D == 20:
            L = np.arange(1 << 20, dtype=np.uint64)
        else:
            edges = [0, 1, 2, (1 << width) - 2, (1 << width) - 1, 1 << (width - 1), (1 << (width - 1)) - 1]
            L = np.concatenate([np.array(edges, dtype=np.uint64), rng.integers(0, 1 << width, 4096, dtype=np.uint64)])
        want = (L << np.uint64(24)) >> np.uint64(D) if D < 64 else np.zeros_like(L)
        got = quant8.sr_threshold(L.astype(np.uint32), np.full(L.shape, D, dtype=np.int32))
        assert got.dtype == np.uint32 and np.array_equal(got.astype(np.uint64), want), D


def test_quantize_argument_checks():
    x = np.zeros((2, 256), dtype=np.float32)
    r = np.zeros((2, 256), dtype=np.uint32)
    with pytest.raises(ValueError):
        quant8.quantize_block_sr(np.zeros((2, 200), dtype=np.float32), np.zeros((2, 200), dtype=np.uint32), True)
    with pytest.raises(ValueError):
        quant8.quantize_block_sr(x, r + N24, True)
    with pytest.raises(TypeError):
        quant8.quantize_block_sr(x.astype(np.float64), r, True)
    codes, scales = quant8.quantize_block_sr(x, r, True)
    assert codes.dtype == np.uint8 and scales.dtype == np.float32 and scales.shape == (2, 2)


# ---------------------------------------------------------------------------------------------
# the proofs' machine checks


def _run_check(name: str) -> int:
    path = ROOT / "proofs" / name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main()


@pytest.mark.parametrize("name", ["check_stochastic_rounding.py", "check_quant8.py"])
def test_proof_check_scripts(name):
    assert _run_check(name) == 0
