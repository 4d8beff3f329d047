"""The project's random stream on the GPU: Triton's Philox4x32-10 and the random-slice table.

Twin of emulator/philox.py (which holds the algorithm, its known-answer vectors and
``derive_seed``, the host-side key derivation both twins use). The random-slice tables are the ones
in that module's docstring, repeated here because both twins implement them:

    bf16-sr  one call tl.randint4x(seed, n) an element; n = the element's Philox counter (its flat
             row-major index in the whole, unsharded parameter, int64; counter = (lo32, hi32, 0, 0));
             seed = derive_seed(user seed, step, parameter id), a Python int < 2^64

                 c0: |31      r_m16       16|15       r_p        0|
                 c1: |31     (reserved)   16|15       r_v16      0|

    8bit     one call tl.randint4x(seed, n >> 1) a pair of elements (counters 2k, 2k + 1); the
             element's words (a, b) = (c0, c1) for an even n, (c2, c3) for an odd one

                 a: |31   r_v24 23..8   16|15       r_p        0|
                 b: |31             r_m24             8|7 r_v24 0|

Tile functions only (no pointers, no program ids): the kernels compute the offsets of their tile
and call these. Triton 3.6's ``tl.randint4x`` returns uint32 words; all slices stay uint32.

The Gluon kernel (kernels/gluon_update.py) cannot call ``tl.randint4x`` (a Triton-language
function); it runs ``philox4x32_10`` below, the same rounds written out in ops both languages have
(its text bound to Gluon's language, as kernels/ieee.py's ops are), and the same ``random_slices`` and
``q8_slices``.
tests/test_interpreter_rounding.py holds ``philox4x32_10`` against ``tl.randint4x`` and the
emulator bit for bit (interpreter and GPU); tests/test_gpu_gluon.py the Gluon kernel's bits.

WIDE_PRODUCTS (the default on the GPU; FORGE_NUM_PHILOX_WIDE=0 turns it off): the Triton kernels
take their words from ``philox4x32_10`` too, each round's two products one ``mul.wide.u32`` apiece
(the same words, fewer instructions); tests/test_interpreter_rounding.py runs its GPU mode with it
off and on, and holds ``wide_products_a``/``wide_products_b`` against the two multiplies.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from forge_num.emulator import philox as _philox
from forge_num.interpreter import is_interpreter

__all__ = ["randint4x", "randint", "rounding_bits", "random_slices", "q8_rounding_bits", "q8_slices",
           "q8_half_slices", "philox4x32_10", "products_a", "products_b", "wide_products_a", "wide_products_b"]


@triton.jit
def randint4x(seed, offset):
    """Four uint32 words per offset: ``tl.randint4x(seed, offset)`` (Philox4x32, 10 rounds)."""
    return tl.randint4x(seed, offset)


@triton.jit
def randint(seed, offset):
    """Word c0 of ``randint4x``, as ``tl.randint``."""
    c0, _, _, _ = tl.randint4x(seed, offset)
    return c0


@triton.jit
def random_slices(c0, c1):
    """The bf16-sr table on one element's words c0, c1: ``(r_p, r_m16, r_v16)``."""
    return c0 & 0xFFFF, c0 >> 16, c1 & 0xFFFF


@triton.jit
def rounding_bits(seed, offset):
    """The bf16-sr table: ``(r_p, r_m16, r_v16)`` as uint32 tiles, of ``tl.randint4x``'s words (with
    WIDE_PRODUCTS: philox4x32_10's, the same words), one call an element."""
    if WIDE_PRODUCTS:
        c0, c1, _, _ = philox4x32_10(seed, offset)
    else:
        c0, c1, _, _ = tl.randint4x(seed, offset)
    return random_slices(c0, c1)


@triton.jit
def q8_slices(a, b):
    """The 8bit table on one element's words (a, b): ``(r_p, r_m24, r_v24)``."""
    return a & 0xFFFF, b >> 8, ((a >> 16) << 8) | (b & 0xFF)


@triton.jit
def q8_rounding_bits(seed, offset):
    """The 8bit table for elements of any counters ``offset`` (int64 >= 0): the call of each element's
    pair, offset >> 1, computed for the element itself, and its half by the counter's parity."""
    pair = offset >> 1
    if WIDE_PRODUCTS:
        c0, c1, c2, c3 = philox4x32_10(seed, pair)
    else:
        c0, c1, c2, c3 = tl.randint4x(seed, pair)
    return q8_half_slices(offset, c0, c1, c2, c3)


@triton.jit
def q8_half_slices(offset, c0, c1, c2, c3):
    """The 8bit table's slices of the elements with counters ``offset`` from the words of their pairs'
    calls (offset >> 1): the half that the counter's parity picks, (c0, c1) or (c2, c3)."""
    odd = (offset & 1) != 0
    return q8_slices(tl.where(odd, c2, c0), tl.where(odd, c3, c1))


# Philox4x32's constants, the emulator's (emulator/philox.py states where they come from)
PHILOX_ROUND_A: tl.constexpr = tl.constexpr(_philox.PHILOX_ROUND_A)
PHILOX_ROUND_B: tl.constexpr = tl.constexpr(_philox.PHILOX_ROUND_B)
PHILOX_KEY_A: tl.constexpr = tl.constexpr(_philox.PHILOX_KEY_A)
PHILOX_KEY_B: tl.constexpr = tl.constexpr(_philox.PHILOX_KEY_B)

# A Philox round multiplies two counter words by constants and uses both halves of each 64-bit
# product. ``tl.umulhi(x, A)`` and ``x * A`` are two PTX instructions (mul.hi.u32, mul.lo.u32) that
# ptxas leaves as two (IMAD.HI.U32, IMAD); one ``mul.wide.u32`` is one IMAD.WIDE.U32 with both
# halves, the same bits (the exact product either way). Per element, 69 -> 50 SASS instructions
# for the ten rounds (sm_90, ptxas of Triton 3.6), ~5% of the 8bit epilogue's (bench/NOTES.md,
# session 16). Timed on the H200 in session 20 (bench/results/2026-12-05-s20/), on against off in
# one call: the 8bit tiles 1.00-1.29x (the capped 64x128 1.26-1.29x at K = 256-4096 and 1.06x at
# 16384, though its spills grew 272 -> 308 B), the bf16-sr defaults 0.98-1.09x; the regime tests
# passed with it on. On by default for the Triton kernels' rounding_bits and the Gluon kernel's
# rounds; FORGE_NUM_PHILOX_WIDE=0 in the environment when this module is imported turns it off
# (tl.umulhi and a multiply, the same words). The interpreter runs no PTX, so never under
# TRITON_INTERPRET.
WIDE_PRODUCTS: tl.constexpr = tl.constexpr(not is_interpreter()
                                           and os.environ.get("FORGE_NUM_PHILOX_WIDE", "1") != "0")
# {hi, lo} of the product of $2 and a round constant: mov.b64's vector is {low word, high word}
_MUL_WIDE_A: tl.constexpr = tl.constexpr(
    "{ .reg .b64 t; mul.wide.u32 t, $2, %d; mov.b64 {$1, $0}, t; }" % _philox.PHILOX_ROUND_A)
_MUL_WIDE_B: tl.constexpr = tl.constexpr(
    "{ .reg .b64 t; mul.wide.u32 t, $2, %d; mov.b64 {$1, $0}, t; }" % _philox.PHILOX_ROUND_B)


@triton.jit
def wide_products_a(x):
    """(umulhi(x, A), x A mod 2^32) for a uint32 tile x and A = PHILOX_ROUND_A, by one mul.wide.u32
    (GPU only)."""
    return tl.inline_asm_elementwise(_MUL_WIDE_A, "=r,=r,r", [x], dtype=(tl.uint32, tl.uint32), is_pure=True,
                                     pack=1)


@triton.jit
def wide_products_b(x):
    """wide_products_a for B = PHILOX_ROUND_B."""
    return tl.inline_asm_elementwise(_MUL_WIDE_B, "=r,=r,r", [x], dtype=(tl.uint32, tl.uint32), is_pure=True,
                                     pack=1)


@triton.jit
def products_a(x):
    """(umulhi(x, A), x A mod 2^32) for a uint32 tile x and A = PHILOX_ROUND_A."""
    if WIDE_PRODUCTS:
        return wide_products_a(x)
    else:
        return tl.umulhi(x, PHILOX_ROUND_A), x * PHILOX_ROUND_A


@triton.jit
def products_b(x):
    """(umulhi(x, B), x B mod 2^32) for a uint32 tile x and B = PHILOX_ROUND_B."""
    if WIDE_PRODUCTS:
        return wide_products_b(x)
    else:
        return tl.umulhi(x, PHILOX_ROUND_B), x * PHILOX_ROUND_B


@triton.jit
def philox4x32_10(seed, offset):
    """``tl.randint4x(seed, offset)`` for an int64 or int32 offset tile, its rounds written out
    (emulator/philox.py states them): key (k0, k1) = (seed mod 2^32, seed >> 32) of the uint64
    seed, counter (offset mod 2^32, offset >> 32 mod 2^32, 0, 0), the second word 0 for an int32
    tile as tl.randint4x takes it; per round, in uint32 arithmetic,
    c0' = umulhi(B, c2) ^ c1 ^ k0, c2' = umulhi(A, c0) ^ c3 ^ k1, c1' = B c2, c3' = A c0, then the
    key bump k0 += 0x9E3779B9, k1 += 0xBB67AE85; ten rounds. ``seed`` must be a runtime integer, not
    a constexpr (the kernels type it u64 and do not specialize it)."""
    key = seed.to(tl.uint64)
    k0 = (key & 0xFFFFFFFF).to(tl.uint32)
    k1 = (key >> 32).to(tl.uint32)
    c0 = offset.to(tl.uint32)
    if tl.constexpr(offset.dtype.primitive_bitwidth) > 32:
        c1 = (offset >> 32).to(tl.uint32)
    else:  # (not offset >> 32: a 32-bit shift by 32 gives the sign's copies in PTX and is poison in LLVM)
        c1 = c0 * 0
    c2 = c0 * 0
    c3 = c0 * 0
    for _ in tl.static_range(10):
        hi_b, lo_b = products_b(c2)
        hi_a, lo_a = products_a(c0)
        c0 = hi_b ^ c1 ^ k0
        c2 = hi_a ^ c3 ^ k1
        c1 = lo_b
        c3 = lo_a
        k0 = k0 + PHILOX_KEY_A
        k1 = k1 + PHILOX_KEY_B
    return c0, c1, c2, c3
