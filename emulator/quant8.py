"""8-bit block-wise optimizer states: float codes under a power-of-two fp32 scale, rounded stochastically.

The Triton twin is kernels/quant8.py (same functions, names, argument order, flag names). Both
work on binary32 encodings with integer operations, and float products only where they are exact
(a code's value, q * scale): no table, no division, no float rounding anywhere, so the GPU, the
interpreter and this emulator agree bit for bit.

Blocks
------
A block is ``QBLOCK = 128`` consecutive elements of one row of the parameter, so a tile
``[BM, BN]`` with ``BN % 128 == 0`` holds ``BM * BN/128`` whole blocks and the scale of every
block it touches is computed inside the tile, from the *updated* fp32 state, in registers.
Why 128: tile widths of the H200 GEMM epilogue are 128 or 256 (128 divides both); the fp32 scale
costs 4/128 B per element ("8bit" regime: bf16 weight 2 + codes 1 + 1 + scales 2*(4/128) = 4.0625
B/param; block 256 would give the design table's 4.03 but would forbid BN = 128 tiles); and with
a *float* code the block size only decides which elements fall below the code's range (14
binades under the block maximum for m, 30 for v), not the precision of the others, so larger
blocks cost little and smaller ones would cost scale bytes (32: 4.25 B/param).

Codes
-----
m (signed) is E4M3: sign, 4 exponent bits, 3 mantissa bits. v (unsigned, v >= 0) is E5M3: the
sign bit becomes a fifth exponent bit. No Inf or NaN codes: all 256 codes are finite.

       m:  | s | e e e e | f f f |          v:  | e e e e e | f f f |
             7   6    3   2   0                   7       3   2   0

With E exponent bits and M = 3 mantissa bits, a code magnitude c = (ec << M) | f has the unit
value

    q(c) = (1 + f/2^M) * 2^(ec - (2^E - 1))     ec >= 1   (top binade ec = 2^E-1 is [1, 2))
    q(c) = f * 2^(2 - 2^E - M)                  ec == 0   (subnormal codes, step s = 2^(2-2^E-M))

so q lies in [0, 2 - 2^-M] = [0, 1.875]; m: smallest normal 2^-14, smallest step 2^-17;
v: smallest normal 2^-30, smallest step 2^-33. The integer order of c is the order of q and
q(c + 1) - q(c) is the grid step at q(c), across binades (Lemma Q1 of proofs/quant8.md).

Scale
-----
scale = 2^(eb - 127), an fp32 power of two stored per block, with

    A  = max over the block of |x| as binary32 bits (signed); for v the raw bits, with -0 as +0
    eb = max( (A + 2^(23-M) - 1) >> 23 ,  2^E - 1 )

that is, scale is the smallest power of two >= 2^(2^E - 128) with absmax <= (2 - 2^-M) * scale
(Lemma Q2). The first term is the exponent field of RU_M(absmax), absmax rounded up to M mantissa
bits (the carry of the addition runs into the exponent exactly when absmax is above the largest
M-bit mantissa of its binade). So RU_M(absmax) <= (2 - 2^-M) * scale is itself a grid point and every
element of the block lies at or below it: stochastic rounding never leaves the code range (no
saturation, no clipping). absmax / scale lies in (0.9375, 1.875] except for blocks with
absmax < 2^(2^E - 128) (m: 2^-112, v: 2^-96; all-zero blocks too), where the clamp
eb >= 2^E - 1 puts the smallest code step at 2^-129 >= the fp32 subnormal spacing; the clamp is
what lets fp32 subnormals use the same bit rule (Lemma Q2).

A power-of-two scale makes both x/scale and q*scale exact: the code grid is a set of fp32 values,
quantization is a truncation of the binary32 significand with stochastic carry, exactly like
bf16 SR, and the expectation of the *dequantized* value is the fp32 state itself. (With
scale = absmax/max_code the division and the multiplication each round, which adds a
deterministic per-block bias.) For a float code the scale only positions the exponent range; it
does not change the relative precision (that is 2^-M in every normal binade), so a power of two
loses at most one binade of range against absmax/max_code.

Poisoned blocks: if A > LIMIT = (254 << 23) | ((2^M - 1) << (23 - M)) = 0x7F700000 (a NaN or Inf
in the block, |x| > 1.875 * 2^127, or, for v, any negative value other than -0) the block has no
valid scale: its scale is NaN and its codes are 0, so every dequantized element is NaN (written as
the bits 0x7FC00000 by both twins, since an arithmetic NaN is 0x7FFFFFFF on the GPU and keeps its
payload on a CPU) and the next step's non-finite guard sees it. Nothing is clipped silently.

Stochastic rounding of one element
----------------------------------
For x with exponent field ex, ex' = max(ex, 1), significand S = mantissa | (ex > 0) << 23 (so
|x| = S * 2^(ex' - 150)), relative exponent d = eb - ex' >= 0:

    D     = (23 - M) + max(0, d - (2^E - 2))        dropped bits (>= 20)
    kept  = S >> D                                  grid points below |x|, in units of the step
    L     = S - (kept << D)                          dropped field: |x| = (kept + L/2^D) * step
    T     = L << (24 - D)   if D <= 24              threshold, P(up) = T / 2^24
            L >> (D - 24)   if D >  24              (both: (L << 7) >> min(D - 17, 31), sr_threshold)
    up    = rand24 < T                              rand24 uniform in [0, 2^24)  (r_m24 / r_v24)
    c     = (max(0, 2^E - 2 - d) << M) + kept + up  (all shifts clamped to 0..31)
    code  = (sign << 7) | c   for m,    c   for v

The same compare form as bf16 SR ("up iff r < dropped field"), with a 24-bit random integer
because an fp32 significand loses 20 bits (23 - M) in a normal code binade and up to 23 in the
subnormal codes. In the normal binades the carry of ``kept + up`` into bit M+1 moves to the next
exponent exactly as the bf16 carry does.

Claims (proofs/quant8.md, machine-checked by proofs/check_quant8.py; ``quant8_error_bound`` and
``quant8_bias_bound`` below are the proved functions):

  * Q(x) in {lower, upper} grid neighbour of x, so |dequant(Q(x)) - x| < step(x), where
    step(x) = 2^(max(k, kmin) - M), k = floor(log2 |x|), kmin = log2(scale) - (2^E - 2):
    relative error below 2^-M = 12.5% in the normal code range, absolute error below the
    smallest step s_min = scale * 2^(2 - 2^E - M) under it (m: scale*2^-17, v: scale*2^-33).
  * E[dequant(Q(x))] = x exactly when D <= 24, which holds for every |x| >= s_min / 2 (and for
    every fp32 subnormal when the scale is at its clamp). Below that, T truncates the dropped
    field: 0 <= |x| - |E[dequant]| < 2^-24 * s_min (a bias toward zero).
  * Codes are exact functions of (x, rand): ±0 -> code 0 (m keeps the sign of zero: 0x80 -> -0.0).

Comparison with the bitsandbytes/torchao dynamic map (research note §1.4-1.5):

  * cost: the dynamic map needs x / absmax (one fp32 division, rounded), an 8-step binary search
    over a 256-entry table (8 dependent gathers: shared memory on the GPU, no register indexing
    in Triton) and a midpoint compare; ours is ~25 integer ALU operations per element, no
    memory and no division, plus one integer max per block.
  * near the top: the dynamic map has 64 codes per sign in [0.1, 1]*absmax (steps ~0.014*absmax),
    finer than E4M3's 8 codes per binade (step 0.125*scale in the top binade); both round
    deterministically there in bnb/torchao (error <= half a step, biased), ours stochastically
    (error < one step, unbiased).
  * near zero: the dynamic map's smallest nonzero magnitudes are 5.5e-7*absmax (signed) and
    3.25e-7*absmax (unsigned) with few codes per decade below 1e-3; E4M3 reaches
    2^-17*scale ~ 4.1e-6..8.1e-6*absmax with 8 codes per binade down to 2^-14*scale, E5M3 reaches
    2^-33*scale ~ 6.2e-11..1.2e-10*absmax with 8 codes per binade down to 2^-30*scale. Deterministic
    rounding sends everything under half the smallest code to 0 (the "zero point problem" that
    divides by sqrt(v) = 0); SR sends it to 0 or the smallest code with the right probability.
"""

from __future__ import annotations

import numpy as np

from .rounding import _uniform_bits, f32_bits

__all__ = [
    "QBLOCK",
    "MAN_BITS",
    "EXP_BITS_SIGNED",
    "EXP_BITS_UNSIGNED",
    "RAND_BITS",
    "code_format",
    "quantize_block_sr",
    "dequantize",
    "code_unit_value",
    "magnitude_key",
    "block_exponent",
    "sr_threshold",
    "sr_code",
    "quant8_error_bound",
    "quant8_bias_bound",
]

QBLOCK = 128  # elements per block, along a row
MAN_BITS = 3  # mantissa bits of both codes
EXP_BITS_SIGNED = 4  # m: E4M3 with a sign bit
EXP_BITS_UNSIGNED = 5  # v: E5M3, no sign bit
RAND_BITS = 24  # width of the random integer per code (r_m24, r_v24)

_U = np.uint32


def code_format(signed: bool) -> tuple[int, int]:
    """(exponent bits E, mantissa bits M) of the code: E4M3 for m (signed), E5M3 for v."""
    return (EXP_BITS_SIGNED if signed else EXP_BITS_UNSIGNED), MAN_BITS


def _limit_bits(M: int) -> int:
    """Largest |absmax| encoding with a finite scale: (2 - 2^-M) * 2^127."""
    return (254 << 23) | (((1 << M) - 1) << (23 - M))


def _blocks(a, width: int = QBLOCK):
    rows, cols = a.shape
    if cols % width:
        raise ValueError(f"tile width {cols} is not a multiple of QBLOCK={width}")
    return a.reshape(rows, cols // width, width)


def magnitude_key(bits, signed: bool):
    """uint32 key whose block maximum decides the scale (module docstring: A)."""
    if signed:
        return bits & _U(0x7FFFFFFF)
    return np.where(bits == _U(0x80000000), _U(0), bits)


def block_exponent(amax_key, signed: bool):
    """(eb as int32, poisoned as bool) from the block maximum of ``magnitude_key``."""
    E, M = code_format(signed)
    poisoned = amax_key > _U(_limit_bits(M))
    key = np.where(poisoned, _U(0), amax_key)  # keeps the addition below 2^32
    eb = ((key + _U((1 << (23 - M)) - 1)) >> _U(23)).astype(np.int32)
    eb = np.maximum(eb, np.int32((1 << E) - 1))
    return eb, poisoned


def sr_threshold(low, D):
    """T of the module docstring, floor(L 2^24 / 2^D), for uint32 L < 2^24 and int32 D >= 20, as
    one shift pair: (L << 7) >> min(D - 17, 31) (L << 7 < 2^31; the right shift drops only zero bits
    where D <= 24, and clamped at 31 gives the 0 every D >= 48 must)."""
    return (low << _U(7)) >> np.minimum(D - np.int32(17), np.int32(31)).astype(np.uint32)


def sr_code(bits, eb, rand24, signed: bool):
    """One element's code (uint32 < 256) from its encoding, its block's eb and 24 random bits."""
    E, M = code_format(signed)
    ex = ((bits >> _U(23)) & _U(0xFF)).astype(np.int32)
    exn = np.maximum(ex, np.int32(1))
    sig = (bits & _U(0x7FFFFF)) | ((ex > 0).astype(np.uint32) << _U(23))
    d = np.maximum(eb - exn, np.int32(0))  # >= 0 except in poisoned blocks (codes zeroed there)
    extra = np.maximum(d - np.int32((1 << E) - 2), np.int32(0))
    D = np.int32(23 - M) + extra
    Dc = np.minimum(D, np.int32(31)).astype(np.uint32)
    kept = sig >> Dc
    low = sig - (kept << Dc)
    up = (rand24 < sr_threshold(low, D)).astype(np.uint32)
    offset = (np.maximum(np.int32((1 << E) - 2) - d, np.int32(0)).astype(np.uint32)) << _U(M)
    mag = offset + kept + up
    if signed:
        return ((bits >> _U(31)) << _U(7)) | mag
    return mag


def quantize_block_sr(x, rand, signed: bool):
    """fp32 tile ``x [rows, QBLOCK*j]`` -> (codes uint8 [rows, QBLOCK*j], scales f32 [rows, j]).

    ``rand``: uint32 random integers in [0, 2^24), one per element (``r_m24`` for m with
    ``signed=True``, ``r_v24`` for v with ``signed=False``). Stochastic rounding to the E4M3 (m) or
    E5M3 (v) grid under a per-block power-of-two scale taken from the block's absmax (module
    docstring).
    """
    bits = f32_bits(x)
    if bits.ndim != 2:
        raise ValueError("x must be a 2-D tile [rows, QBLOCK*j]")
    r = _uniform_bits(rand, RAND_BITS, "rand")
    bits, r = np.broadcast_arrays(bits, r)
    amax = _blocks(magnitude_key(bits, signed)).max(axis=2)  # [rows, j]
    eb, poisoned = block_exponent(amax, signed)
    codes = _blocks(sr_code(bits, eb.repeat(QBLOCK, axis=1), r, signed))
    codes = np.where(poisoned[:, :, None], _U(0), codes).reshape(bits.shape)
    scale_bits = np.where(poisoned, _U(0x7FC00000), eb.astype(np.uint32) << _U(23))
    return codes.astype(np.uint8), scale_bits.view(np.float32)


def code_unit_value(codes, signed: bool):
    """q(code) as float32 (exact), the value of a code under scale 1 (module docstring).

    Normal codes by their bits, subnormal codes by an exact product whose operands and result are
    normal numbers. The kernel twin computes the same value as (mag << (23 - M)) read as binary32, an
    fp32 subnormal for e = 0, times the power of two 2^(127 - (2^E - 1)) (proofs/quant8.md, Lemma Q1'):
    exact, and fewer instructions on the GPU, whose mul.rn.f32 keeps subnormal operands; here that
    product would depend on the host's denormals-are-zero mode (torch.set_flush_denormal), which this
    form does not. (dequantize's q * scale may give a subnormal result, which a host flushing to zero
    would change either way.)"""
    E, M = code_format(signed)
    c = np.asarray(codes)
    if c.dtype != np.uint8:
        raise TypeError(f"codes must be uint8, got {c.dtype}")
    c = c.astype(np.uint32)
    mag = c & _U(0x7F) if signed else c
    # mag = e 2^M + f: ((e + 127 - (2^E - 1)) << 23) | (f << (23 - M)) is mag << (23 - M) plus the
    # exponent bias, one shift and one add (f << (23 - M) stays below bit 23)
    normal = (mag << _U(23 - M)) + _U((127 - ((1 << E) - 1)) << 23)
    sub = mag.astype(np.float32) * np.float32(2.0 ** (2 - (1 << E) - M))  # e = 0: mag = f < 2^M, exact
    q = np.where(mag <= _U((1 << M) - 1), sub.view(np.uint32), normal)
    if signed:
        q = q | ((c >> _U(7)) << _U(31))  # the sign as a bit, as the twin does (code 0x80 is -0.0)
    return q.astype(np.uint32).view(np.float32)


def dequantize(codes, scales, signed: bool):
    """(codes uint8 [rows, QBLOCK*j], scales f32 [rows, j]) -> fp32 [rows, QBLOCK*j], exactly q*scale;
    NaN (0x7FC00000) throughout a block whose scale is not finite (a poisoned block)."""
    q = code_unit_value(codes, signed)
    s = np.asarray(scales)
    if s.dtype != np.float32:
        raise TypeError(f"scales must be float32, got {s.dtype}")
    s3 = s[:, :, None]
    with np.errstate(invalid="ignore"):
        y = (_blocks(q) * s3).astype(np.float32).view(np.uint32)
    # a non-finite scale (a poisoned block) gives the quiet NaN 0x7FC00000, written as bits: a NaN
    # produced by arithmetic is 0x7FFFFFFF on the GPU but keeps the operand's payload on a CPU
    poisoned = (s3.view(np.uint32) & _U(0x7F800000)) == _U(0x7F800000)
    y = np.where(poisoned, _U(0x7FC00000), y).astype(np.uint32)
    return y.reshape(q.shape).view(np.float32)


# ---------------------------------------------------------------------------------------------
# the proved bounds (proofs/quant8.md), in float64 (every quantity is a power of two)


def _exponents(x, scale, signed: bool):
    E, M = code_format(signed)
    ax = np.abs(np.asarray(x, dtype=np.float64))
    _, e = np.frexp(ax)
    k = np.where(ax > 0, e - 1, -(1 << 30))  # floor(log2 |x|)
    _, es = np.frexp(np.asarray(scale, dtype=np.float64))
    log2_scale = es - 1
    kmin = log2_scale - ((1 << E) - 2)  # lowest normal code binade
    return E, M, k, kmin, log2_scale


def quant8_error_bound(x, scale, signed: bool):
    """step(x): |dequant(Q(x)) - x| < step(x) for every element of a block with this ``scale``.

    step(x) = 2^(max(floor(log2|x|), kmin) - M), kmin = log2(scale) - (2^E - 2): at most
    2^-M * |x| in the normal code range, the smallest step s_min = scale * 2^(2 - 2^E - M) below it.
    NaN where the scale is NaN (poisoned block: no claim).
    """
    _, M, k, kmin, _ = _exponents(x, scale, signed)
    out = np.ldexp(1.0, np.maximum(k, kmin) - M)
    return np.where(np.isnan(np.asarray(scale, dtype=np.float64)), np.nan, out)


def quant8_bias_bound(x, scale, signed: bool):
    """|x| - |E[dequant(Q(x))]| lies in [0, bias_bound): 0 (exactly unbiased) when D <= 24, else
    2^-24 * s_min. D = (23 - M) + max(0, d - (2^E - 2)), d = log2(scale) - max(floor(log2|x|), -126)."""
    E, M, k, kmin, log2_scale = _exponents(x, scale, signed)
    d = log2_scale - np.maximum(k, -126)
    D = (23 - M) + np.maximum(0, d - ((1 << E) - 2))
    s_min = np.ldexp(1.0, kmin - M)
    out = np.where(D <= RAND_BITS, 0.0, s_min * 2.0**-RAND_BITS)
    return np.where(np.isnan(np.asarray(scale, dtype=np.float64)), np.nan, out)
