"""Correctly rounded IEEE-754 binary32 operations in NumPy: the emulator's arithmetic.

Every function takes and returns ``np.float32`` arrays (or scalars) and rounds exactly once, to
nearest with ties to even, as the GPU's ``add.rn.f32``, ``mul.rn.f32``, ``fma.rn.f32``,
``div.rn.f32`` and ``sqrt.rn.f32`` do.

* add, mul, div, sqrt: NumPy's float32 ufuncs are the host's IEEE instructions (SSE/AVX on x86,
  no flush-to-zero), so they are correctly rounded already.
* fma: there is no float32 FMA ufunc, and ``float32(float64(a)*b + c)`` rounds twice (at 53 bits,
  then at 24), which is wrong: a = b = 1+2^-12, c = 2^-70 gives 1+2^-11 instead of 1+2^-11+2^-23.
  We use *round to odd* (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved
  algorithms using rounding to odd", IEEE TC 2008): the product a*b is exact in binary64
  (24+24 = 48 significant bits, exponents within [-298, 256]); the sum a*b + c is rounded to odd at
  53 bits (round toward zero, then set the last bit if anything was discarded), and rounding that
  to 24 bits is the correctly rounded fma because 53 >= 24 + 2. proofs/fp32_fma.md states it and
  tests/test_emulator_fp32.py checks it against exact rational arithmetic.
"""

from __future__ import annotations

import numpy as np

__all__ = ["add", "sub", "mul", "fma", "div", "sqrt", "neg", "as_f32", "bits", "from_bits"]

f32 = np.float32
f64 = np.float64


def as_f32(x) -> np.ndarray:
    """Value(s) as float32 without rounding: refuses inputs that are not already binary32."""
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"expected float32, got {a.dtype}")
    return a


def bits(x) -> np.ndarray:
    """The binary32 encodings of ``x`` as uint32."""
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def from_bits(u) -> np.ndarray:
    """The binary32 values whose encodings are ``u``."""
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def add(a, b):
    with np.errstate(all="ignore"):
        return np.add(as_f32(a), as_f32(b), dtype=f32)


def sub(a, b):
    with np.errstate(all="ignore"):
        return np.subtract(as_f32(a), as_f32(b), dtype=f32)


def mul(a, b):
    with np.errstate(all="ignore"):
        return np.multiply(as_f32(a), as_f32(b), dtype=f32)


def div(a, b):
    with np.errstate(all="ignore"):
        return np.divide(as_f32(a), as_f32(b), dtype=f32)


def sqrt(a):
    with np.errstate(all="ignore"):
        return np.sqrt(as_f32(a), dtype=f32)


def neg(a):
    """Sign flip (exact; flips the sign of zeros and NaNs too, as ``neg.f32`` does)."""
    return np.negative(as_f32(a))


def fma(a, b, c):
    """a*b + c with a single rounding (round to nearest even), as ``fma.rn.f32``."""
    a, b, c = np.broadcast_arrays(as_f32(a), as_f32(b), as_f32(c))
    with np.errstate(all="ignore"):
        p = a.astype(f64) * b.astype(f64)  # exact: 48 significant bits, no overflow/underflow
        c64 = c.astype(f64)
        s = p + c64  # rounded to nearest at 53 bits
        # Knuth's TwoSum: e = (p + c) - s exactly (valid for finite s; binary64 cannot overflow here).
        c_part = s - p
        p_part = s - c_part
        e = (p - p_part) + (c64 - c_part)
        # Round to odd: where the rounding was inexact and s's last significand bit is 0, replace s by
        # its neighbour toward the exact sum; that neighbour has last bit 1 and is the round-to-odd
        # result (the exact sum lies strictly between s and it).
        u = np.array(s, dtype=f64, order="C", copy=True).view(np.uint64)
        inexact = np.isfinite(s) & (e != 0) & ((u & np.uint64(1)) == 0)
        away_from_zero = np.signbit(e) == np.signbit(s)  # s != 0 whenever e != 0
        u = np.where(inexact & away_from_zero, u + np.uint64(1), u)
        u = np.where(inexact & ~away_from_zero, u - np.uint64(1), u)
        r = u.view(f64).astype(f32)
    return r if r.ndim else r[()]
