"""Machine check of proofs/stochastic_rounding.md: Lemmas 1-2 and the counting facts of Theorems 1-2.

Exact arithmetic only: every value is decoded from its IEEE fields into a ``fractions.Fraction``.
``main()`` returns 0 when every check passes and 1 otherwise (and prints what failed).
Run: ``python proofs/check_stochastic_rounding.py``.
"""

from __future__ import annotations

import random
import sys
from fractions import Fraction as F

N16 = 1 << 16
BF16_MAX = 0x7F7F


def val32(w: int) -> F:
    """(1) of the proof: value of a finite binary32 word."""
    s, e, f = w >> 31, (w >> 23) & 0xFF, w & 0x7FFFFF
    assert e != 0xFF
    v = (f + (1 << 23 if e else 0)) * F(2) ** (max(e, 1) - 150)
    return -v if s else v


def val16(h: int) -> F:
    """(2) of the proof: value of a finite bf16 word."""
    s, e, g = h >> 15, (h >> 7) & 0xFF, h & 0x7F
    assert e != 0xFF
    v = (g + (1 << 7 if e else 0)) * F(2) ** (max(e, 1) - 134)
    return -v if s else v


def ulp(h: int) -> F:
    """(3) of the proof."""
    return F(2) ** (max((h >> 7) & 0xFF, 1) - 134)


def check_lemma1(fail):
    for h in range(BF16_MAX):  # |h| + 1 finite
        if val16(h + 1) - val16(h) != ulp(h):
            fail(f"Lemma 1: spacing at {h:#06x}")
    if (BF16_MAX + 1) != 0x7F80 or ((0x7F80 >> 7) & 0xFF) != 0xFF or (0x7F80 & 0x7F) != 0:
        fail("Lemma 1: successor of 0x7F7F is not +Inf")
    # the successor of bf16max, were the exponent unbounded, is bf16max + ulp = 2^128
    if val16(BF16_MAX) + ulp(BF16_MAX) != F(2) ** 128:
        fail("Lemma 1: bf16max + ulp != 2^128")
    for h in (0x0000, 0x007F, 0x0080, 0x3F7F, 0x7F7E):  # the sign bit does not matter
        if val16(0x8000 | h) != -val16(h) or val16(0x8000 | (h + 1)) - val16(0x8000 | h) != -ulp(h):
            fail(f"Lemma 1: negative side at {h:#06x}")


def check_lemma2(fail):
    rng = random.Random(0)
    fixed = (1, 0x8000, 0xFFFF)
    for h in range(BF16_MAX + 1):
        for l in fixed + (rng.randrange(N16),):
            w = (h << 16) | l
            if val32(w) != val16(h) + F(l, N16) * ulp(h):
                fail(f"Lemma 2 at {w:#010x}")
            if rng.random() < 0.02:  # negative words: same magnitudes
                if val32(w | 0x80000000) != -val32(w):
                    fail(f"Lemma 2 (sign) at {w:#010x}")


def check_theorem1(fail):
    rng = random.Random(1)
    # counting: exactly l of the 2^16 values r satisfy r < l (so P(up) = l / 2^16)
    for l in (0, 1, 2, 0x7FFF, 0x8000, 0xFFFF, rng.randrange(N16)):
        if sum(1 for r in range(N16) if r < l) != l:
            fail(f"Theorem 1: count for l={l}")
    # item 1: E[y] = x with both outcomes within one ulp, on words from every binade
    for e in range(255):
        for _ in range(4):
            h = (rng.randrange(2) << 15) | (e << 7) | rng.randrange(128)
            if (h & 0x7FFF) == BF16_MAX:
                continue
            l = rng.randrange(N16)
            x = val32((h << 16) | l)
            up = val16(h + 1)
            mean = val16(h) + F(l, N16) * (up - val16(h))
            if mean != x or abs(val16(h) - x) >= ulp(h) or (l and abs(up - x) >= ulp(h)):
                fail(f"Theorem 1 item 1 at {(h << 16) | l:#010x}")
    # item 2: the saturation range
    for l in (1, 0x8000, 0xFFFF):
        for s in (0, 0x8000):
            x = val32(((s | BF16_MAX) << 16) | l)
            bias = abs(x) - val16(BF16_MAX)
            if bias != l * F(2) ** 104 or not (0 < bias < ulp(BF16_MAX) == F(2) ** 120):
                fail(f"Theorem 1 item 2 at l={l:#x}")
    # item 3: quieted NaN encodings are NaNs with the input's sign
    for h in list(range(0x7F80, 0x8000)) + list(range(0xFF80, 0x10000)):
        q = h | 0x0040
        if ((q >> 7) & 0xFF) != 0xFF or (q & 0x7F) == 0 or (q >> 15) != (h >> 15):
            fail(f"Theorem 1 item 3: NaN {h:#06x}")


def check_theorem2(fail):
    for b in (0, 1):
        for l in range(N16):
            carry = (l + 0x7FFF + b) >= N16
            if carry != (l > 0x8000 or (l == 0x8000 and b == 1)):
                fail(f"Theorem 2: carry for l={l:#x}, b={b}")
    # nearest: val16(h) is nearer iff l < 0x8000 (Lemma 2), on a sample of words
    rng = random.Random(2)
    for _ in range(2000):
        h = rng.randrange(BF16_MAX)
        l = rng.choice((0x7FFF, 0x8000, 0x8001, rng.randrange(N16)))
        x = val32((h << 16) | l)
        d_lo, d_hi = x - val16(h), val16(h + 1) - x
        if (d_lo < d_hi) != (l < 0x8000) or (d_lo == d_hi) != (l == 0x8000):
            fail(f"Theorem 2: nearest at {(h << 16) | l:#010x}")


def main() -> int:
    failures = []

    def fail(msg):
        failures.append(msg)

    for check in (check_lemma1, check_lemma2, check_theorem1, check_theorem2):
        check(fail)
    for msg in failures[:20]:
        print("FAIL", msg)
    print(f"check_stochastic_rounding: {'FAILED (' + str(len(failures)) + ')' if failures else 'all lemmas hold'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
