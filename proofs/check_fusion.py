"""Machine-check Lemma 4 of proofs/fusion.md: fma(+-0, +-0, a) == a for every a != -0 (the zero
padding of the last K block does not change a nonzero or +0 accumulator), fma(+0, +0, -0) == +0
(padding turns a -0 accumulator into +0), and a -0 accumulator does arise from +0 when a negative
product underflows to zero. Exact arithmetic (fractions) on special values and a spread of
bf16-representable fp32 values. Exits non-zero on failure."""

from __future__ import annotations

import math
import os
import struct
import sys
from fractions import Fraction

# the repository root (for tests.exact_f32) behind site-packages: its kernels/ would shadow the PyPI
# package `kernels` (tests/conftest.py says more)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT] + [_ROOT]

from tests.exact_f32 import exact_fma, f32_bits, same_f32  # noqa: E402


def f32(u: int) -> float:
    return struct.unpack("<f", struct.pack("<I", u))[0]


def main() -> int:
    values = [f32(u << 16) for u in range(0, 1 << 16, 61)]  # a spread of bf16 values, both signs
    values += [0.0, math.inf, -math.inf, math.nan, f32(1), f32(0x80000001), f32(0x7F7FFFFF)]
    bad = []
    for a in values:
        if a == 0 and math.copysign(1, a) < 0:
            continue
        for z1 in (0.0, -0.0):
            for z2 in (0.0, -0.0):
                if not same_f32(exact_fma(z1, z2, a), a):
                    bad.append((z1, z2, a))
    if not same_f32(exact_fma(0.0, 0.0, -0.0), 0.0):  # masked loads fill with +0
        bad.append(("padding of -0",))
    # -0 from +0: a negative product below half the smallest subnormal rounds to -0
    tiny = f32(1)  # 2^-149
    if not same_f32(exact_fma(-tiny, tiny, 0.0), -0.0):
        bad.append(("expected -0 from an underflowing product",))
    print(f"check_fusion: {len(values)} values, {len(bad)} counterexamples")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
