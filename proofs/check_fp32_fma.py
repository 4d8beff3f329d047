"""Exhaustive check of the round-to-odd theorem (proofs/fp32_fma.md) in a small model:
RN_p(RO_q(a*b + c)) == RN_p(a*b + c) for all a, b, c of a p-bit toy format with subnormals,
p = 4, q = p + 2 = 6, and the failure of double rounding RN_p(RN_q(.)) somewhere (so the check
can fail). Exact rationals. Exits non-zero on failure."""

from __future__ import annotations

import sys
from fractions import Fraction

P, EMIN, EMAX = 3, -2, 2


def values(p=P, emin=EMIN, emax=EMAX):
    out = {Fraction(0)}
    for e in range(emin, emax + 1):
        for m in range(0 if e == emin else 2 ** (p - 1), 2**p):
            v = Fraction(m) * Fraction(2) ** (e - p + 1)
            out |= {v, -v}
    return sorted(out)


def quantum(x: Fraction, p: int, emin: int) -> Fraction:
    a = abs(x)
    e = emin
    while a >= Fraction(2) ** (e + 1):
        e += 1
    return Fraction(2) ** (max(e, emin) - p + 1)


def round_nearest_even(x: Fraction, p: int, emin: int) -> Fraction:
    if x == 0:
        return x
    q = quantum(x, p, emin)
    n, r = divmod(abs(x), q)
    n = int(n)
    if r > q / 2 or (r == q / 2 and n % 2):
        n += 1
    return (1 if x > 0 else -1) * n * q


def round_odd(x: Fraction, p: int, emin: int) -> Fraction:
    if x == 0:
        return x
    q = quantum(x, p, emin)
    n, r = divmod(abs(x), q)
    n = int(n)
    if r and n % 2 == 0:
        n += 1
    return (1 if x > 0 else -1) * n * q


def main() -> int:
    vs = values()
    Q = P + 2
    bad = double_rounding_failures = 0
    for a in vs:
        for b in vs:
            prod = a * b
            for c in vs:
                x = prod + c
                want = round_nearest_even(x, P, EMIN)
                if round_nearest_even(round_odd(x, Q, EMIN - 8), P, EMIN) != want:
                    bad += 1
                if round_nearest_even(round_nearest_even(x, Q, EMIN - 8), P, EMIN) != want:
                    double_rounding_failures += 1
    print(f"check_fp32_fma: {len(vs)}^3 triples, round-to-odd failures {bad}, "
          f"double-rounding failures {double_rounding_failures} (must be > 0)")
    return 0 if bad == 0 and double_rounding_failures > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
