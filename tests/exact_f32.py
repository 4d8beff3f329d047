"""An independent exact reference for binary32 arithmetic: rationals (fractions.Fraction) and one
rounding to nearest-even binary32, with IEEE-754's special cases written out.

Used by the emulator tests to check emulator.fp32 and, through ``EXACT_NAMESPACE``, every rule's
NumPy emulation against the rule's text evaluated exactly, element by element.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np

EMIN = -126  # binary32: smallest normal exponent
P = 24  # significand bits
MAX_F32 = (2 - Fraction(2) ** (1 - P)) * Fraction(2) ** 127


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def round_to_f32(q: Fraction) -> float:
    """The binary32 value nearest to q (ties to even), +-inf on overflow; q != 0."""
    sign = -1 if q < 0 else 1
    a = abs(q)
    e = math.floor(math.log2(a.numerator) - math.log2(a.denominator))
    # fix e so that 2^e <= a < 2^(e+1)
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum = Fraction(2) ** (max(e, EMIN) - (P - 1))  # ulp at a (subnormals: 2^-149)
    n, r = divmod(a, quantum)
    n = int(n)
    if r > quantum / 2 or (r == quantum / 2 and n % 2 == 1):
        n += 1
    v = n * quantum
    if v > MAX_F32:
        return sign * math.inf
    return sign * float(v)


def _zero_sum_sign(x_neg: bool, y_neg: bool) -> float:
    """An exact zero sum of two zero-or-cancelling operands: -0 only if both are -0 (RN)."""
    return -0.0 if (x_neg and y_neg) else 0.0


def exact_add(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        with np.errstate(all="ignore"):
            return float(np.float32(np.float64(a) + np.float64(b)))
    q = Fraction(a) + Fraction(b)
    if q == 0:
        if a == 0 and b == 0:
            return _zero_sum_sign(math.copysign(1, a) < 0, math.copysign(1, b) < 0)
        return 0.0
    return round_to_f32(q)


def exact_sub(a: float, b: float) -> float:
    return exact_add(a, -b)


def exact_mul(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        with np.errstate(all="ignore"):
            return float(np.float32(np.float64(a) * np.float64(b)))
    q = Fraction(a) * Fraction(b)
    if q == 0:
        return math.copysign(0.0, math.copysign(1, a) * math.copysign(1, b))
    return round_to_f32(q)


def exact_fma(a: float, b: float, c: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        with np.errstate(all="ignore"):
            return float(np.float32(np.float64(a) * np.float64(b) + np.float64(c)))
    prod = Fraction(a) * Fraction(b)
    q = prod + Fraction(c)
    if q == 0:
        prod_neg = math.copysign(1, a) * math.copysign(1, b) < 0
        if prod == 0 and c == 0:
            return _zero_sum_sign(prod_neg, math.copysign(1, c) < 0)
        return 0.0
    return round_to_f32(q)


def exact_div(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        with np.errstate(all="ignore"):
            return float(np.float32(np.float64(a) / np.float64(b)))
    q = Fraction(a) / Fraction(b)
    if q == 0:
        return math.copysign(0.0, math.copysign(1, a) * math.copysign(1, b))
    return round_to_f32(q)


def exact_sqrt(a: float) -> float:
    """Correctly rounded sqrt: the nearest binary32 to sqrt(a), decided with exact squares."""
    if math.isnan(a) or a < 0:
        return math.nan
    if a == 0 or math.isinf(a):
        return a
    q = Fraction(a)
    y = float(np.float32(math.sqrt(a)))  # a candidate; fix it up exactly
    cands = [float(np.nextafter(np.float32(y), np.float32(-np.inf))), y, float(np.nextafter(np.float32(y), np.float32(np.inf)))]
    # nearest by comparing (c - sqrt q) via squares of midpoints: c is nearest iff the midpoints
    # around it bracket sqrt(q)
    def dist_key(c):
        d = abs(Fraction(c) ** 2 - q)  # monotone proxy is not enough near ties; use midpoints below
        return d
    best = None
    for c in cands:
        lo = (Fraction(float(np.nextafter(np.float32(c), np.float32(-np.inf)))) + Fraction(c)) / 2
        hi = (Fraction(c) + Fraction(float(np.nextafter(np.float32(c), np.float32(np.inf))))) / 2
        if lo**2 <= q <= hi**2:
            if lo**2 == q or hi**2 == q:  # a tie: even significand wins (cannot happen for sqrt)
                if f32_bits(c) % 2:
                    continue
            best = c
            break
    assert best is not None
    return best


def exact_sign(a: float) -> float:
    if math.isnan(a) or a == 0:
        return a
    return 1.0 if a > 0 else -1.0


def exact_where(c, a, b):
    return a if c else b


def exact_isfinite(a: float) -> bool:
    return math.isfinite(a)


EXACT_NAMESPACE = {
    "add": exact_add,
    "sub": exact_sub,
    "mul": exact_mul,
    "fma": exact_fma,
    "div": exact_div,
    "sqrt": exact_sqrt,
    "neg": lambda a: -a,
    "sign": exact_sign,
    "where": exact_where,
    "isfinite": exact_isfinite,
}


def same_f32(x: float, y: float) -> bool:
    """Equal as binary32 encodings, any NaN equal to any NaN (payloads are not specified)."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return f32_bits(x) == f32_bits(y)
