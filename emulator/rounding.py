"""fp32 -> bf16 by integer bit operations: round to nearest even, and stochastic rounding.

The Triton twin is kernels/rounding.py (same functions, same names, same argument order); both
work on the binary32 encoding as a uint32 and never use a float conversion, because the Triton
interpreter truncates ``.to(tl.bfloat16)`` while the GPU rounds it to nearest even.

Bit layout (bf16 is the upper half of the binary32 word):

      31 30      23 22     16 15              0
     +--+----------+---------+-----------------+
     |s | exponent | mant hi |     mant lo     |     x (binary32)
     +--+----------+---------+-----------------+
     |<------- hi = bits >> 16 --->|<- lo = bits & 0xFFFF ->|
     |s | exponent | 7 bits  |                            bf16 = hi

For finite x with exponent field e and E = max(e, 1) (subnormals share E = 1 with the first normal
binade), ``value(bits) = value(hi << 16) + lo * 2^(E - 150)`` and the bf16 spacing at hi is
``ulp(hi) = 2^(E - 134) = 2^16 * 2^(E - 150)``, so

    |x| = |RZ(x)| + (lo / 2^16) * ulp(hi),         RZ(x) = value(hi << 16) (truncation)

and for non-negative encodings the integer order of hi is the value order, with
``value(hi + 1) = value(hi) + ulp(hi)`` across binades, from subnormals into normals and from the
largest finite bf16 0x7F7F into +Inf 0x7F80 (proofs/stochastic_rounding.md, Lemma 1, machine-checked
for every hi by proofs/check_stochastic_rounding.py). So "add one to hi" moves the magnitude
exactly one bf16 step away from zero, sign untouched.

Round to nearest even (``bf16_rne_bits``; IEEE-754 roundTiesToEven, as ``cvt.rn.bf16.f32``):

    hi' = (bits + 0x7FFF + (hi & 1)) >> 16           (finite and infinite x)

  lo > 0x8000 carries, lo < 0x8000 does not, lo == 0x8000 carries iff hi is odd. Finite values at
  or above 0x7F7F8000 (bf16max + ulp/2) round to Inf, as IEEE overflow does. ±Inf, ±0 and exact
  values are unchanged; subnormals round by the same rule.

Stochastic rounding (``bf16_sr_bits(x, rand16)``; the *compare form*):

    hi' = hi + (rand16 < lo)          rand16 uniform in [0, 2^16)

  so P(away from zero) = lo / 2^16 exactly and E[value(hi')] = x exactly (Theorem 1 of
  proofs/stochastic_rounding.md). We use the compare form rather than ``(bits + rand16) >> 16``:
  the two have the same distribution but map a given random word to different decisions
  (compare: up iff r < lo; add: up iff r >= 2^16 - lo); this one is torchao's choice and makes
  "r = 0 rounds every inexact value up" obvious in tests.

Special values (both functions):

  * NaN -> quiet NaN: ``hi | 0x0040`` (sign and the upper payload bits kept, quiet bit set), so a
    NaN whose payload lies only in lo (e.g. 0x7F800001) stays NaN instead of becoming Inf.
  * ±Inf: lo = 0, kept. ±0: lo = 0, kept with its sign. bf16-representable x: kept exactly.
  * Subnormals: fp32 subnormals round to bf16 subnormals (or zero, or the smallest normal) by the
    same bit rule; there is no flush to zero anywhere.
  * Near the maximum (SR only): SR *saturates*: when |hi| == 0x7F7F (the largest finite bf16,
    bf16max = (2 - 2^-7) * 2^127 ~ 3.3895e38) it never adds the carry, so an fp32 value in
    (bf16max, fp32max] becomes ±bf16max with probability one. Reason: finite in, finite out. A
    rounding that turns a finite weight or state into Inf with probability lo/2^16 would corrupt
    the model with no non-finite gradient for the step's guard to see. Cost: in that range
    (|x| > bf16max) SR is biased toward zero by |x| - bf16max < 1 ulp = 2^120 instead of being
    unbiased; for every finite |x| <= bf16max it is exactly unbiased. RNE keeps IEEE overflow
    (it is the reference conversion and must equal the hardware ``cvt.rn``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["bf16_rne_bits", "bf16_sr_bits", "bf16_to_f32", "f32_bits", "BF16_MAX_BITS"]

BF16_MAX_BITS = 0x7F7F  # largest finite bf16 magnitude, (2 - 2^-7) * 2^127
_QUIET = 0x0040  # bf16 quiet-NaN bit (top mantissa bit)
_ABS_INF_F32 = 0x7F800000


def f32_bits(x) -> np.ndarray:
    """The binary32 encodings of float32 ``x`` as uint32 (refuses other dtypes: no hidden rounding)."""
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"expected float32, got {a.dtype}")
    return a.view(np.uint32)


def _uniform_bits(r, width: int, name: str) -> np.ndarray:
    """Random integers of ``width`` bits as uint32; refuses signed or out-of-range input."""
    a = np.asarray(r)
    if a.dtype.kind != "u":
        raise TypeError(f"{name} must be unsigned integers, got {a.dtype}")
    if a.size and int(a.max()) >> width:
        raise ValueError(f"{name} must lie in [0, 2^{width})")
    return a.astype(np.uint32)


def _is_nan(bits):
    return (bits & np.uint32(0x7FFFFFFF)) > np.uint32(_ABS_INF_F32)


def bf16_rne_bits(x) -> np.ndarray:
    """fp32 -> bf16 encoding (uint16), round to nearest, ties to even; NaN -> quiet NaN."""
    bits = np.atleast_1d(f32_bits(x))
    hi = bits >> np.uint32(16)
    # NaN words may wrap here (0xFFFFFFFF + 0x8000); they are replaced below.
    rounded = (bits + np.uint32(0x7FFF) + (hi & np.uint32(1))) >> np.uint32(16)
    out = np.where(_is_nan(bits), hi | np.uint32(_QUIET), rounded)
    return out.astype(np.uint16).reshape(np.shape(x))


def bf16_sr_bits(x, rand16) -> np.ndarray:
    """fp32 -> bf16 encoding (uint16), stochastically: away from zero iff ``rand16 < lo``.

    ``rand16``: unsigned integers in [0, 2^16), one per element (broadcast), e.g. ``r_p`` of
    ``philox.rounding_bits``. Saturates at ±bf16max; NaN -> quiet NaN (module docstring).
    """
    bits = f32_bits(x)
    r = _uniform_bits(rand16, 16, "rand16")
    bits, r = np.broadcast_arrays(bits, r)
    shape = bits.shape
    bits, r = np.atleast_1d(bits), np.atleast_1d(r)
    hi = bits >> np.uint32(16)
    lo = bits & np.uint32(0xFFFF)
    up = (r < lo) & ((hi & np.uint32(0x7FFF)) != np.uint32(BF16_MAX_BITS))
    # hi + up < 2^16 for every non-NaN word (up = 0 when |hi| = 0x7F7F); NaN words are replaced.
    out = np.where(_is_nan(bits), hi | np.uint32(_QUIET), hi + up.astype(np.uint32))
    return out.astype(np.uint16).reshape(shape)


def bf16_to_f32(bits) -> np.ndarray:
    """bf16 encodings (uint16) -> float32 values (exact: the low half is zero)."""
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError(f"expected uint16 bf16 encodings, got {b.dtype}")
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)
