"""Machine check of proofs/quant8.md: Lemmas Q1, Q1' (the kernels' dequantization), Q2 and Q3, the
counting of Theorem Q, and that the exported ``quant8_error_bound`` / ``quant8_bias_bound`` of
emulator/quant8.py are the proved functions.

Exact arithmetic: the grid of formula (1) and every element value are ``fractions.Fraction``s; the
lemma's integer formulas are re-implemented here from the text of the proof, not imported.
``main()`` returns 0 when every check passes and 1 otherwise. Run: ``python proofs/check_quant8.py``.
"""

from __future__ import annotations

import bisect
import random
import sys
from fractions import Fraction as F

import numpy as np

from forge_num.emulator import quant8

M = 3
FORMATS = {True: 4, False: 5}  # signed (m): E4M3, unsigned (v): E5M3
LIMIT = (254 << 23) | (((1 << M) - 1) << (23 - M))
Q_MAX = 2 - F(1, 2**M)


def q(c: int, E: int) -> F:
    """Formula (1)."""
    T = 2**E - 1
    ec, f = c >> M, c & (2**M - 1)
    return (f + (2**M if ec else 0)) * F(2) ** (max(ec, 1) - T - M)


def val32(w: int) -> F:
    e, f = (w >> 23) & 0xFF, w & 0x7FFFFF
    return (f + (1 << 23 if e else 0)) * F(2) ** (max(e, 1) - 150)


def floor_log2(v: F) -> int:
    k = v.numerator.bit_length() - v.denominator.bit_length()
    return k if F(2) ** k <= v else k - 1


def check_q1(fail):
    for signed, E in FORMATS.items():
        T = 2**E - 1
        for c in range(2 ** (E + M) - 1):
            if q(c + 1, E) - q(c, E) != F(2) ** (max(c >> M, 1) - T - M):
                fail(f"Q1 ({E=}) spacing at code {c}")
        if q(2 ** (E + M) - 1, E) != Q_MAX:
            fail(f"Q1 ({E=}) q_max")
        # the emulator's code_unit_value is formula (1), with the sign bit for m
        codes = np.arange(256, dtype=np.uint8)
        got = quant8.code_unit_value(codes, signed)
        for c in range(256):
            mag = c & 0x7F if signed else c
            want = q(mag, E) * (-1 if signed and c >> 7 else 1)
            if F(float(got[c])) != want:
                fail(f"Q1 code_unit_value({c}, {signed=})")


def check_q1_product(fail):
    """Lemma Q1': the word c << (23 - M) (and the sign bit) read as binary32, times 2^(127 - T), is
    +-q(c), and the product is a normal binary32 or zero (exact: no rounding); with the kernel's own
    shift and factor (kernels/quant8.py's DROP_NORMAL and UNIT_SIGNED / UNIT_UNSIGNED), and -0 for the
    signed code 0x80 (IEEE 754's sign of a product, in binary32)."""
    from forge_num.kernels import quant8 as kernel_quant8

    if kernel_quant8.DROP_NORMAL.value != 23 - M:
        fail("Q1': the kernel's shift is not 23 - M")
    for signed, E in FORMATS.items():
        T = 2**E - 1
        unit = (kernel_quant8.UNIT_SIGNED if signed else kernel_quant8.UNIT_UNSIGNED).value
        if F(unit) != F(2) ** (127 - T):
            fail(f"Q1' ({E=}): the kernel's factor {unit} is not 2^(127 - T)")
        for c in range(256):
            mag, neg = (c & 0x7F, c >> 7) if signed else (c, 0)
            w = (mag << (23 - M)) | (neg << 31)
            value = val32(w & 0x7FFFFFFF) * (-1 if neg else 1)
            product = value * F(unit)
            if product != q(mag, E) * (-1 if neg else 1):
                fail(f"Q1' ({E=}) code {c}")
            if product and not F(2) ** -126 <= abs(product) < F(2) ** 128:
                fail(f"Q1' ({E=}) code {c}: the product is not a normal binary32")
        if signed:  # the sign of zero, which rationals do not carry: 0x80 is -0.0
            zero = np.array([0x80 << 24], dtype=np.uint32).view(np.float32) * np.float32(unit)
            if zero.view(np.uint32)[0] != 0x80000000:
                fail("Q1': code 0x80 does not give -0.0")


def eb_formula(A: int, E: int) -> int:
    """Lemma Q2's integer formula."""
    return max((A + 2 ** (23 - M) - 1) >> 23, 2**E - 1)


def sigma_reference(absmax: F, E: int) -> F:
    """(2): the smallest power of two >= 2^(T-127) with absmax <= (2 - 2^-M) sigma."""
    s = F(2) ** ((2**E - 1) - 127)
    while absmax > Q_MAX * s:
        s *= 2
    return s


def check_q2(fail):
    rng = random.Random(0)
    fracs = (0, 1, 7 << 20, (7 << 20) + 1, (1 << 23) - 1)
    for signed, E in FORMATS.items():
        for e in range(255):
            for f in fracs + (rng.randrange(1 << 23),):
                A = (e << 23) | f
                ref = sigma_reference(val32(A), E)
                if A <= LIMIT:
                    eb = eb_formula(A, E)
                    if eb > 254 or F(2) ** (eb - 127) != ref:
                        fail(f"Q2 ({E=}) scale at {A:#010x}")
                elif ref < F(2) ** 128:
                    fail(f"Q2 ({E=}) poisoned {A:#010x} has a finite scale")
        if eb_formula(LIMIT, E) != 254 or sigma_reference(val32(LIMIT + 1), E) != F(2) ** 128:
            fail(f"Q2 ({E=}) LIMIT is not the boundary")
        # the emulator's block_exponent is the formula, and poisons exactly above LIMIT
        keys = np.array([0, 1, 0x00800000, 0x3F7FFFFF, 0x3FF00000, 0x3FF00001, LIMIT, LIMIT + 1, 0x7F800000, 0x7FC00000], dtype=np.uint32)
        eb, poisoned = quant8.block_exponent(keys, signed)
        for k, e_, p in zip(keys.tolist(), eb.tolist(), poisoned.tolist()):
            if p != (k > LIMIT) or (not p and e_ != eb_formula(k, E)):
                fail(f"Q2 ({E=}) block_exponent({k:#010x})")


def lemma_q3(S: int, ex: int, eb: int, E: int):
    """The lemma's quantities, from its text."""
    T = 2**E - 1
    exn = max(ex, 1)
    d = eb - exn
    D = (23 - M) + max(0, d - (T - 1))
    step = F(2) ** (exn - 150 + D)
    kept, L = S >> D, S % (1 << D)
    c0 = (max(0, T - 1 - d) << M) + kept
    Tr = (L << (24 - D)) if D <= 24 else (L >> (D - 24))
    return D, step, kept, L, c0, Tr


def check_q3_and_theorem(fail):
    rng = random.Random(1)
    xs, scales, flags, steps, biases = [], [], [], [], []
    for signed, E in FORMATS.items():
        T = 2**E - 1
        n_codes = 2 ** (E + M)
        for eb in sorted({T, T + 1, T + 5, 60, 100, 127, 200, 254}):
            sigma = F(2) ** (eb - 127)
            grid = [q(c, E) * sigma for c in range(n_codes)]
            kmin = (eb - 127) - (T - 1)
            s_min = F(2) ** (kmin - M)
            cases = []
            for d in range(0, 46):
                ex = eb - d
                if ex < 1:
                    break
                for S in ((1 << 23), (1 << 23) + 1, (1 << 24) - 1, (1 << 23) | rng.randrange(1 << 23)):
                    cases.append((S, ex))
            cases += [(rng.randrange(1, 1 << 23), 0), (1, 0), ((1 << 23) - 1, 0)]  # fp32 subnormals
            for S, ex in cases:
                x = S * F(2) ** (max(ex, 1) - 150)
                if x > Q_MAX * sigma:
                    continue  # not an element of a block with this scale (Lemma Q2)
                D, step, kept, L, c0, Tr = lemma_q3(S, ex, eb, E)
                tag = f"({E=}, {eb=}, {ex=}, S={S:#x})"
                if x != (kept + F(L, 2**D)) * step:
                    fail(f"Q3 (i) {tag}")
                i = bisect.bisect_right(grid, x) - 1
                if grid[i] != kept * step or q(c0, E) * sigma != kept * step or (L == 0) != (grid[i] == x):
                    fail(f"Q3 (ii) lower {tag}")
                if L:
                    if c0 + 1 >= n_codes:
                        fail(f"Q3 (iii) {tag}")
                    elif q(c0 + 1, E) * sigma != (kept + 1) * step or grid[i + 1] != (kept + 1) * step:
                        fail(f"Q3 (ii) upper {tag}")
                if step != F(2) ** (max(floor_log2(x), kmin) - M):
                    fail(f"Q3 (iv) {tag}")
                # Theorem Q: threshold and exactness
                if Tr != (L * 2**24) // 2**D:
                    fail(f"Theorem Q: Tr {tag}")
                exact = F(Tr, 2**24) == F(L, 2**D)
                if D <= 24 and not exact:
                    fail(f"Theorem Q item 2 {tag}")
                if x >= s_min / 2 and D > 24:
                    fail(f"Theorem Q: |x| >= s_min/2 but D > 24 {tag}")
                mean = (kept + F(Tr, 2**24)) * step
                if not (0 <= x - mean < F(1, 2**24) * s_min) or (D <= 24 and mean != x):
                    fail(f"Theorem Q items 2-3 {tag}")
                if D > 24 and step != s_min:
                    fail(f"Theorem Q item 3 step {tag}")
                xs.append(float(x))
                scales.append(float(sigma))
                flags.append(signed)
                steps.append(step)
                biases.append(F(0) if D <= 24 else s_min / 2**24)
        # item 4: every code times every scale is an exact fp32 product
        qv = quant8.code_unit_value(np.arange(256, dtype=np.uint8), signed)
        for eb in (T, T + 1, 90, 127, 254):
            prod = qv * np.float32(2.0 ** (eb - 127))
            for c in range(256):
                mag = c & 0x7F if signed else c
                if abs(F(float(prod[c]))) != q(mag, E) * F(2) ** (eb - 127):
                    fail(f"Theorem Q item 4 ({E=}, {eb=}, code {c})")
    # the exported bound functions are the proved ones
    xs32 = np.array(xs, dtype=np.float32)
    sc32 = np.array(scales, dtype=np.float32)
    if not np.array_equal(xs32.astype(np.float64), np.array(xs)):
        fail("sample values are not fp32")
    for signed in (True, False):
        sel = np.array(flags) == signed
        eb_ = quant8.quant8_error_bound(xs32[sel], sc32[sel], signed)
        bb_ = quant8.quant8_bias_bound(xs32[sel], sc32[sel], signed)
        for got_e, got_b, st, bi in zip(eb_.tolist(), bb_.tolist(), np.array(steps, dtype=object)[sel], np.array(biases, dtype=object)[sel]):
            if F(got_e) != st or F(got_b) != bi:
                fail(f"quant8_error_bound/quant8_bias_bound ({signed=}) differ from the lemma")
                break
    return len(xs)


def main() -> int:
    failures = []

    def fail(msg):
        failures.append(msg)

    check_q1(fail)
    check_q1_product(fail)
    check_q2(fail)
    n = check_q3_and_theorem(fail)
    for msg in failures[:20]:
        print("FAIL", msg)
    print(f"check_quant8: {n} element cases; " + (f"FAILED ({len(failures)})" if failures else "all lemmas hold"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
