"""Hypothesis strategies for binary32 values: every class IEEE-754 distinguishes."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


def f32_from_bits(u: int) -> float:
    return float(np.uint32(u).view(np.float32))


# raw bit patterns hit every class (NaN, inf, subnormal, zero) with their natural frequency;
# the explicit lists make sure each appears often.
SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), f32_from_bits(1), f32_from_bits(0x807FFFFF),
            f32_from_bits(0x00800000), f32_from_bits(0x7F7FFFFF), f32_from_bits(0xFF7FFFFF), 1.0, -1.0]

any_f32 = st.one_of(
    st.integers(0, 2**32 - 1).map(f32_from_bits),
    st.sampled_from(SPECIALS),
    st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
)
finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


def near_one(scale_exp: int = 0):
    """Values 2^e * (1 + k 2^-23) with small k: products and sums land on rounding ties."""
    return st.tuples(st.integers(0, 64), st.integers(-3, 3), st.booleans()).map(
        lambda t: float(np.float32((-1 if t[2] else 1) * 2.0 ** (scale_exp + t[1]) * (1 + t[0] * 2.0**-23)))
    )
