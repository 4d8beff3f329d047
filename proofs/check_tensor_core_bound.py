"""Machine checks of the lemmas in proofs/tensor_core_model.md (the bf16 mainloop error bound).

Run ``python proofs/check_tensor_core_bound.py``: exit status 0 when every check passes, 1 otherwise.
Everything is exact rational arithmetic (fractions.Fraction) on the model's *definition*, written
here a third time, independently of emulator/tensor_core.py and of the tests; only the exported
bound function is imported, to check that it computes the theorem's formula.

Checks (the lemma numbers of the .md):
  L1  alignment exponents: exhaustive over every finite nonzero bf16 word, and every fp32 exponent
  L2  products: 2^14 <= sig_a*sig_b < 2^16 for normal operands (exhaustive over significand pairs)
  L3  the term(s) at the alignment exponent lie on the grid; |A| < 2^32 (int64 suffices)
  L4  truncation toward the grid: error < u, magnitude never grows
  L5  one instruction: |T - x| <= 16u (+2^-158 with the floor), |T| <= sum |terms|,
      2^eta <= max(2^-126, |c|, sigma*max|p|)   (random and adversarial blocks)
  L6  round toward zero: |RZ(x) - x| < max(2^-23 |x|, 2^-149), |RZ(x)| <= |x|
  T1  the chained bound on random chains (incl. subnormals, cancellation), exact and binary64 forms
  T2  tightness: a constructed chain reaches >= 0.9 of the bound
"""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from fractions import Fraction
from pathlib import Path

F = 25  # fraction bits kept below the alignment exponent
FLOOR = -133  # alignment exponent floor
EMIN = -126
BLOCK = 16
TWO = Fraction(2)


def _load_bound():
    """bf16_mainloop_error_bound from emulator/tensor_core.py (by path: the package may not be installed)."""
    path = Path(__file__).resolve().parent.parent / "emulator" / "tensor_core.py"
    spec = importlib.util.spec_from_file_location("_forge_num_tensor_core_for_proof", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.bf16_mainloop_error_bound


# ---- formats ------------------------------------------------------------------------------------
def decode(word: int, frac_bits: int):
    """(value, alignment exponent, is_subnormal) of a finite IEEE word with an 8-bit exponent field."""
    sign = -1 if word >> (frac_bits + 8) & 1 else 1
    field = (word >> frac_bits) & 0xFF
    frac = word & ((1 << frac_bits) - 1)
    assert field != 0xFF
    if field == 0:
        return sign * Fraction(frac, 1 << frac_bits) * TWO**EMIN, EMIN, True
    return sign * (1 + Fraction(frac, 1 << frac_bits)) * TWO ** (field - 127), field - 127, False


def floor_log2(x: Fraction) -> int:
    x = abs(x)
    n = x.numerator.bit_length() - x.denominator.bit_length()
    while TWO**n > x:
        n -= 1
    while TWO ** (n + 1) <= x:
        n += 1
    return n


def rz_fp32(x: Fraction) -> Fraction:
    """x rounded toward zero to fp32 (the value; finite range assumed)."""
    if x == 0:
        return Fraction(0)
    e = floor_log2(x)
    assert e <= 127, "overflow"
    lsb = max(e - 23, -149)
    m = math.floor(abs(x) / TWO**lsb)
    return (1 if x > 0 else -1) * m * TWO**lsb


def trunc_to(x: Fraction, unit: Fraction) -> Fraction:
    return int(x / unit) * unit  # int() of a Fraction truncates toward zero


def block(c: Fraction, ce: int, prods):
    """One instruction by the definition. prods: list of (value, alignment exponent); c with its exponent.

    Returns (d, T, eta, terms)."""
    terms = [(v, e) for v, e in prods if v != 0] + ([(c, ce)] if c != 0 else [])
    if not terms:
        return Fraction(0), Fraction(0), FLOOR, []
    eta = max(FLOOR, max(e for _, e in terms))
    unit = TWO ** (eta - F)
    t_sum = sum(trunc_to(v, unit) for v, _ in terms)
    return rz_fp32(t_sum), t_sum, eta, terms


def fp32_exponent(x: Fraction) -> int:
    return EMIN if x == 0 else max(floor_log2(x), EMIN)


def chain(c0: Fraction, a_words, b_words):
    """The mainloop by the definition: returns (d, exact, G, Pmax, has_subnormal_operand)."""
    k = len(a_words)
    ops = [(decode(a, 7), decode(b, 7)) for a, b in zip(a_words, b_words)]
    d = c0
    for j in range(0, k, BLOCK):
        prods = [(av * bv, ae + be) for (av, ae, _), (bv, be, _) in ops[j : j + BLOCK]]
        d, _, _, _ = block(d, fp32_exponent(d), prods)
    products = [av * bv for (av, _, _), (bv, _, _) in ops]
    sub = any((asub and av != 0) or (bsub and bv != 0) for (av, _, asub), (bv, _, bsub) in ops)
    return d, c0 + sum(products), abs(c0) + sum(abs(p) for p in products), max(map(abs, products)), sub


# ---- checks ---------------------------------------------------------------------------------------
class Checker:
    def __init__(self):
        self.failures = []

    def check(self, name: str, ok: bool, detail=""):
        if not ok:
            self.failures.append(f"{name}: {detail}")
            if len(self.failures) < 20:
                print(f"FAIL {name}: {detail}")


def check_l1(ck: Checker):
    n = 0
    for w in range(1 << 16):
        field = (w >> 7) & 0xFF
        if field == 0xFF or w & 0x7FFF == 0:
            continue
        x, e, sub = decode(w, 7)
        n += 1
        if sub:
            ok = TWO ** (e - 7) <= abs(x) < TWO**e and TWO**e <= 2**7 * abs(x)
            ck.check("L1 bf16 subnormal", ok, hex(w))
        else:
            ck.check("L1 bf16 normal", TWO**e <= abs(x) < TWO ** (e + 1), hex(w))
    ck.check("L1 count", n == 2 * (254 * 128 + 127), n)
    for field in range(0, 255):
        for frac in (0, 1, 1 << 22, (1 << 23) - 1):
            if field == 0 and frac == 0:
                continue
            x, e, sub = decode(field << 23 | frac, 23)
            if sub:
                ck.check("L1 fp32 subnormal", abs(x) < TWO**e == TWO**EMIN, (field, frac))
            else:
                ck.check("L1 fp32 normal", TWO**e <= abs(x) < TWO ** (e + 1), (field, frac))
    print(f"L1 alignment exponents: {n} bf16 words, 1019 fp32 words")


def check_l2(ck: Checker):
    lo, hi = min(range(128, 256)) ** 2, max(range(128, 256)) ** 2
    ck.check("L2 product significand", 2**14 <= lo and hi < 2**16, (lo, hi))
    ck.check("L2 subnormal product significand", 127 * 255 < 2**16)
    print(f"L2 product significands in [{lo}, {hi}] within [2^14, 2^16)")


def check_l3(ck: Checker):
    # a product at eta: sig * 2^(eta - 14) = (sig << 11) * 2^(eta - 25); c at eta: (sig << 2) units
    ck.check("L3 product shift", F - 14 == 11)
    ck.check("L3 acc shift", F - 23 == 2)
    max_a = BLOCK * (255 * 255) * 2 ** (F - 14) + ((1 << 24) - 1) * 2 ** (F - 23)
    ck.check("L3 |A| < 2^32", max_a < 2**32, max_a)
    print(f"L3 top terms exact; max |A| = {max_a} < 2^32")


def check_l4(ck: Checker, rng: random.Random):
    for _ in range(20000):
        unit = TWO ** rng.randint(-170, 130)
        x = Fraction(rng.randint(-(2**40), 2**40), 2 ** rng.randint(0, 45)) * unit
        q = trunc_to(x, unit)
        ck.check("L4 error < u", abs(x - q) < unit, (x, unit))
        ck.check("L4 magnitude", abs(q) <= abs(x) and (q == 0 or (q > 0) == (x > 0)), (x, unit))
        ck.check("L4 exact on grid", trunc_to(q, unit) == q, (x, unit))
    print("L4 truncation: 20000 random values")


def _random_bf16(rng: random.Random, lo: int, hi: int) -> int:
    r = rng.random()
    sign = rng.getrandbits(1) << 15
    if r < 0.08:
        return sign  # zero
    if r < 0.16:
        return sign | rng.randint(1, 127)  # subnormal
    return sign | rng.randint(lo, hi) << 7 | rng.getrandbits(7)


def _random_c(rng: random.Random, lo: int, hi: int) -> int:
    """An fp32 word: +-0, a subnormal, or a normal number with exponent field in [lo, hi] (clamped)."""
    r = rng.random()
    sign = rng.getrandbits(1) << 31
    lo, hi = min(max(lo, 1), 254), min(max(hi, 1), 254)
    if r < 0.1:
        return sign
    if r < 0.2:
        return sign | rng.randint(1, (1 << 23) - 1)
    return sign | rng.randint(lo, hi) << 23 | rng.getrandbits(23)


def check_l5(ck: Checker, rng: random.Random):
    n = 0
    for i in range(6000):
        span = rng.randint(0, 70)
        lo = rng.randint(1, 127 - span // 2) if i % 3 == 0 else rng.randint(1, 254 - span)
        hi = lo + span
        a = [_random_bf16(rng, lo, hi) for _ in range(BLOCK)]
        b = [_random_bf16(rng, lo, hi) for _ in range(BLOCK)]
        if i % 4 == 1:  # cancellation: repeat a product with the other sign
            for k in range(1, BLOCK, 2):
                a[k], b[k] = a[k - 1] ^ 0x8000, b[k - 1]
        clo = rng.randint(1, 254) if i % 2 else lo + hi - 127  # near the products half of the time
        c, ce, _ = decode(_random_c(rng, clo - 20, clo + 20), 23)
        ops = [(decode(x, 7), decode(y, 7)) for x, y in zip(a, b)]
        prods = [(av * bv, ae + be) for (av, ae, _), (bv, be, _) in ops]
        if max(e for _, e in prods) > 125:
            continue  # products beyond fp32's range: the instruction overflows, the lemma is about T
        d_unused, t_sum, eta, terms = block(c, ce, prods)
        x = c + sum(v for v, _ in prods)
        unit = TWO ** (eta - F)
        floor_active = all(e < eta for _, e in terms)
        allowed = BLOCK * unit + (unit if floor_active else 0)
        ck.check("L5 truncation", abs(t_sum - x) <= allowed, (a, b, c))
        ck.check("L5 truncation vs formula", allowed <= TWO**-21 * TWO**eta + TWO**-158, (a, b, c))
        ck.check("L5 magnitude", abs(t_sum) <= sum(abs(v) for v, _ in terms), (a, b, c))
        has_sub = any((sa and av != 0) or (sb and bv != 0) for (av, _, sa), (bv, _, sb) in ops)
        sigma = 2**7 if has_sub else 1
        pmax = max(abs(v) for v, _ in prods)
        ck.check("L5 eta", TWO**eta <= max(TWO**-126, abs(c), sigma * pmax), (a, b, c))
        n += 1
    ck.check("L5 adversarial count", n > 4000, n)
    print(f"L5 one instruction: {n} random blocks (zeros, subnormals, spreads to 70 binades, cancellation)")


def check_l6(ck: Checker, rng: random.Random):
    samples = []
    for _ in range(20000):
        e = rng.randint(-160, 127)
        sign = 1 if rng.random() < 0.5 else -1
        samples.append(sign * (1 + Fraction(rng.getrandbits(60), 2**60)) * TWO**e)
    for e in (-150, -149, -127, -126, -125, 0, 127):  # just below and at powers of two
        samples += [TWO**e, TWO**e - TWO ** (e - 70), -(TWO**e) + TWO ** (e - 70)]
    for x in samples:
        if floor_log2(x) > 127:
            continue
        r = rz_fp32(x)
        ck.check("L6 error", x == r or abs(r - x) < max(TWO**-23 * abs(x), TWO**-149), x)
        ck.check("L6 magnitude", abs(r) <= abs(x) and (r == 0 or (r > 0) == (x > 0)), x)
    print(f"L6 round toward zero: {len(samples)} values")


def theorem_bound(g: Fraction, pmax: Fraction, k: int, sigma: int) -> Fraction:
    """The theorem's right-hand side, written from the .md (not from the emulator)."""
    j = -(-k // BLOCK)
    w = max(g, sigma * pmax, TWO**-126)
    return j * (TWO**-21 * w + TWO**-23 * g + TWO**-149 + TWO**-158)


def check_t1(ck: Checker, rng: random.Random, bound_fn):
    worst = Fraction(0)
    n = 0
    for i in range(400):
        k = rng.choice([1, 7, 16, 17, 40, 64, 100])
        span = rng.randint(0, 40)
        lo = rng.randint(60, 127 - span // 2) if i % 2 else rng.randint(1, 100)
        a = [_random_bf16(rng, lo, lo + span) for _ in range(k)]
        b = [_random_bf16(rng, lo, lo + span) for _ in range(k)]
        if i % 3 == 0:
            a = [x & 0x7FFF for x in a]
            b = [x & 0x7FFF for x in b]  # all products >= 0: truncation errors add up
        product_field = 2 * lo + span - 127  # fp32 exponent field of a middle product
        c0, _, _ = decode(_random_c(rng, product_field - 10, product_field + 10), 23)
        d, exact, g, pmax, sub = chain(c0, a, b)
        if g == 0:
            continue
        sigma = 2**7 if sub else 1
        rhs = theorem_bound(g, pmax, k, sigma)
        exported = bound_fn(g - abs(c0), pmax, k, abs_acc=abs(c0), subnormal_operands=sub)
        ck.check("T1 exported formula", exported == rhs, (k, exported, rhs))
        as_float = bound_fn(
            float(g - abs(c0)), float(pmax), k, abs_acc=float(abs(c0)), subnormal_operands=sub
        )
        ck.check("T1 binary64 form rounds up", Fraction(float(as_float)) >= rhs, (k, as_float, rhs))
        ck.check("T1 bound", abs(d - exact) <= rhs, (a, b, c0))
        worst = max(worst, abs(d - exact) / rhs)
        n += 1
    print(f"T1 chained bound: {n} random chains, worst error/bound = {float(worst):.3f}")


def adversarial_chain(blocks: int):
    """c0 = 1 + blocks*2^-18; per block 15 products of 0.992u and one of 3.97u (u = 2^-25)."""
    just_below_unit = (0x3F7F, 0x32FF)  # (255/128 * 2^-1)(255/128 * 2^-26) = 0.9922 * 2^-25
    three_point_97 = (0x3FFF, 0x337F)  # (255/128)(255/128 * 2^-25) = 3.969 * 2^-25
    a, b = [], []
    for _ in range(blocks):
        a += [just_below_unit[0]] * 15 + [three_point_97[0]]
        b += [just_below_unit[1]] * 15 + [three_point_97[1]]
    c0 = 1 + blocks * TWO**-18
    return c0, a, b


def check_t2(ck: Checker, bound_fn):
    for blocks in (1, 8, 64):
        c0, a, b = adversarial_chain(blocks)
        d, exact, g, pmax, sub = chain(c0, a, b)
        ck.check("T2 c0 is fp32", rz_fp32(c0) == c0)
        bound = bound_fn(g - abs(c0), pmax, len(a), abs_acc=abs(c0), subnormal_operands=sub)
        ratio = abs(d - exact) / bound
        ck.check("T2 bound holds", ratio <= 1, float(ratio))
        ck.check("T2 tight", ratio >= Fraction(9, 10), float(ratio))
        print(f"T2 adversarial chain of {blocks} blocks: error/bound = {float(ratio):.4f}")


def main(argv=None, bound_fn=None) -> int:
    """Run every check; 0 when all pass. bound_fn replaces the exported bound (tests pass a wrong one)."""
    rng = random.Random(20261202)
    ck = Checker()
    bound_fn = bound_fn or _load_bound()
    check_l1(ck)
    check_l2(ck)
    check_l3(ck)
    check_l4(ck, rng)
    check_l5(ck, rng)
    check_l6(ck, rng)
    check_t1(ck, rng, bound_fn)
    check_t2(ck, bound_fn)
    if ck.failures:
        print(f"{len(ck.failures)} check(s) FAILED")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
