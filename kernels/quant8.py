"""8-bit block-wise states in registers: E4M3 (m) / E5M3 (v) codes under a power-of-two fp32 scale.

Twin of emulator/quant8.py, which holds the format, the scale rule, the stochastic rounding, the
reasons and the comparison with the bitsandbytes/torchao dynamic map; proofs/quant8.md proves the
error bound and unbiasedness. Summary:

    block      QBLOCK = 128 consecutive elements of one row; a tile [BM, BN] with BN % 128 == 0
    scale      2^(eb - 127),  eb = max(exponent field of RU_3(absmax), 2^E - 1); NaN if the block
               holds NaN/Inf, |x| > 1.875 * 2^127 or (v) a negative value (codes 0 then)
    code       m: | s | e4 | f3 |   v: | e5 | f3 |   q = (1 + f/8) 2^(e - (2^E-1)), e >= 1;
               q = f * 2^(2 - 2^E - 3), e = 0;  value = q * scale (exact)
    rounding   drop D bits of the fp32 significand (D = 20 in the normal code range), round away
               from zero iff rand24 < (dropped field aligned to 24 bits)

Tile functions only (no pointers, no program ids); integer operations, and exact float products
only (a code's value, q * scale: proofs/quant8.md, Lemma Q1' and Theorem Q item 4); every shift amount
is clamped to 0..31 (a shift by 32 or more is undefined in LLVM).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "QBLOCK",
    "MAN_BITS",
    "EXP_BITS_SIGNED",
    "EXP_BITS_UNSIGNED",
    "RAND_BITS",
    "magnitude_key",
    "block_exponent",
    "sr_threshold",
    "sr_code",
    "quantize_blocks_sr",
    "quantize_block_sr",
    "code_unit_value",
    "dequantize_blocks",
    "dequantize",
]

QBLOCK = tl.constexpr(128)
MAN_BITS = tl.constexpr(3)
EXP_BITS_SIGNED = tl.constexpr(4)
EXP_BITS_UNSIGNED = tl.constexpr(5)
RAND_BITS = tl.constexpr(24)
# Derived constants (M = 3; E = 4 for m, 5 for v), spelled out because the interpreter cannot
# shift a Python int by a constexpr.
_M = 3
LIMIT_BITS = tl.constexpr((254 << 23) | (((1 << _M) - 1) << (23 - _M)))  # (2 - 2^-M) * 2^127
ROUND_UP_ADD = tl.constexpr((1 << (23 - _M)) - 1)  # adds to |x| bits: exponent of RU_M(|x|)
DROP_NORMAL = tl.constexpr(23 - _M)  # dropped significand bits in a normal code binade
TOP_SIGNED = tl.constexpr((1 << 4) - 1)  # 2^E - 1: exponent field of the top code binade
TOP_UNSIGNED = tl.constexpr((1 << 5) - 1)
# 2^(127 - (2^E - 1)): code_unit_value's product from a code's fp32 bit fields to its value q
UNIT_SIGNED = tl.constexpr(2.0 ** (127 - ((1 << 4) - 1)))  # 2^112
UNIT_UNSIGNED = tl.constexpr(2.0 ** (127 - ((1 << 5) - 1)))  # 2^96


@triton.jit
def magnitude_key(bits, signed: tl.constexpr):
    """uint32 key whose block maximum decides the scale: |x| bits (m); raw bits, -0 as +0 (v)."""
    if signed:
        key = bits & 0x7FFFFFFF
    else:
        key = tl.where(bits == 0x80000000, 0, bits).to(tl.uint32)
    return key


@triton.jit
def block_exponent(amax_key, signed: tl.constexpr):
    """(eb as int32, poisoned as int1) from the block maximum of ``magnitude_key``."""
    if signed:
        TOP: tl.constexpr = TOP_SIGNED
    else:
        TOP: tl.constexpr = TOP_UNSIGNED
    poisoned = amax_key > LIMIT_BITS
    key = tl.where(poisoned, 0, amax_key).to(tl.uint32)
    eb = ((key + ROUND_UP_ADD) >> 23).to(tl.int32)
    eb = tl.maximum(eb, TOP)
    return eb, poisoned


@triton.jit
def sr_threshold(low, D):
    """The dropped field ``low`` (uint32 < 2^24) of D >= 20 dropped bits aligned to RAND_BITS = 24:
    floor(low 2^24 / 2^D), i.e. low << (24 - D) for D <= 24 and low >> (D - 24) above, as one
    shift pair: low << 7 < 2^31, and >> (D - 17) shifts out only its 7 zero bits or fewer where
    D <= 24; clamped at 31 it gives 0, as every D >= 48 must (bit 31 of low << 7 is 0)."""
    return (low << 7) >> tl.minimum(D - 17, 31).to(tl.uint32)


@triton.jit
def sr_code(bits, eb, rand24, signed: tl.constexpr):
    """One code per element (uint32 < 256) from its encoding, its block's eb and 24 random bits."""
    if signed:
        TOP: tl.constexpr = TOP_SIGNED
    else:
        TOP: tl.constexpr = TOP_UNSIGNED
    ex = ((bits >> 23) & 0xFF).to(tl.int32)
    exn = tl.maximum(ex, 1)
    sig = (bits & 0x7FFFFF) | ((ex > 0).to(tl.uint32) << 23)
    d = tl.maximum(eb - exn, 0)
    extra = tl.maximum(d - (TOP - 1), 0)
    D = DROP_NORMAL + extra
    Dc = tl.minimum(D, 31).to(tl.uint32)
    kept = sig >> Dc
    low = sig - (kept << Dc)
    up = (rand24 < sr_threshold(low, D)).to(tl.uint32)
    offset = tl.maximum((TOP - 1) - d, 0).to(tl.uint32) << MAN_BITS
    mag = offset + kept + up
    if signed:
        mag = ((bits >> 31) << 7) | mag
    return mag


@triton.jit
def quantize_blocks_sr(bits, rand, signed: tl.constexpr):
    """Blocks along the last axis: fp32 encodings ``bits`` (uint32 [..., QBLOCK]) -> (codes uint32
    [..., QBLOCK], scales fp32 [...]). The rank is free: quantize_block_sr's tile [BM, J, QBLOCK], or
    a [R, QBLOCK] row sub-tile of one block a row (the Gluon 8bit epilogue, kernels/gluon_q8.py), whose
    layouts Gluon keeps as given: the reduction and its expansion are on the one axis."""
    amax = tl.max(magnitude_key(bits, signed), axis=-1)
    eb, poisoned = block_exponent(amax, signed)
    codes = sr_code(bits, tl.expand_dims(eb, -1), rand, signed)
    codes = tl.where(tl.expand_dims(poisoned, -1), 0, codes).to(tl.uint32)
    scale_bits = tl.where(poisoned, 0x7FC00000, eb.to(tl.uint32) << 23).to(tl.uint32)
    return codes, scale_bits.to(tl.float32, bitcast=True)


@triton.jit
def quantize_block_sr(x, rand, signed: tl.constexpr):
    """fp32 tile [BM, BN] -> (codes uint8 [BM, BN], scales fp32 [BM, BN // QBLOCK]).

    ``rand``: uint32 tile in [0, 2^24) (r_m24 for m with signed=True, r_v24 for v with signed=False).
    """
    BM: tl.constexpr = x.shape[0]
    BN: tl.constexpr = x.shape[1]
    J: tl.constexpr = BN // QBLOCK
    tl.static_assert(BN % QBLOCK == 0, "tile width must be a multiple of QBLOCK")
    bits = tl.reshape(x.to(tl.uint32, bitcast=True), (BM, J, QBLOCK))
    codes, scales = quantize_blocks_sr(bits, tl.reshape(rand, (BM, J, QBLOCK)), signed)
    return tl.reshape(codes, (BM, BN)).to(tl.uint8), scales


@triton.jit
def code_unit_value(codes, signed: tl.constexpr):
    """q(code) as fp32 (exact): the value of a code under scale 1."""
    if signed:
        UNIT: tl.constexpr = UNIT_SIGNED
    else:
        UNIT: tl.constexpr = UNIT_UNSIGNED
    c = codes.to(tl.uint32)
    if signed:
        mag = c & 0x7F
    else:
        mag = c
    # mag = e 2^M + f shifted to the fp32 exponent and mantissa fields, mag << DROP_NORMAL, is the
    # binary32 encoding of (1 + f/2^M) 2^(e - 127) for e >= 1 and of the subnormal f 2^(DROP_NORMAL - 149)
    # for e = 0: q(code) 2^(TOP - 127) either way, so one product by the power of two UNIT = 2^(127 - TOP)
    # gives q exactly (no rounding: the product is q itself, +-0 or a normal fp32; proofs/quant8.md,
    # Lemma Q1', checked for every code). mul.rn.f32 keeps subnormal operands (no .ftz:
    # tests/ptx_check.py forbids it). Three SASS instructions an element and state fewer than the
    # emulator's integer form and its select (bench/NOTES.md, session 24); the same bits as it on all
    # 256 codes (tests/test_interpreter_rounding.py).
    bits = mag << DROP_NORMAL
    if signed:
        bits = bits | ((c >> 7) << 31)  # the sign as a bit: Triton's -q is 0 - q, which loses -0
    return bits.to(tl.float32, bitcast=True) * UNIT


@triton.jit
def dequantize_blocks(codes, scales, signed: tl.constexpr):
    """Blocks along the last axis: (codes uint8 [..., QBLOCK], scales fp32 [...]) -> fp32 [..., QBLOCK],
    exactly q * scale; NaN (0x7FC00000) throughout a block whose scale is not finite. Any rank, as
    quantize_blocks_sr."""
    q = code_unit_value(codes, signed)
    s = tl.expand_dims(scales, -1)
    y = (q * s).to(tl.uint32, bitcast=True)
    # a non-finite scale (a poisoned block) gives the quiet NaN 0x7FC00000, written as bits: a NaN
    # produced by arithmetic is 0x7FFFFFFF on the GPU but keeps the operand's payload on a CPU
    poisoned = (s.to(tl.uint32, bitcast=True) & 0x7F800000) == 0x7F800000
    y = tl.where(poisoned, 0x7FC00000, y).to(tl.uint32)
    return y.to(tl.float32, bitcast=True)


@triton.jit
def dequantize(codes, scales, signed: tl.constexpr):
    """(codes uint8 [BM, BN], scales fp32 [BM, BN // QBLOCK]) -> fp32 [BM, BN], exactly q * scale;
    NaN (0x7FC00000) throughout a block whose scale is not finite."""
    BM: tl.constexpr = codes.shape[0]
    BN: tl.constexpr = codes.shape[1]
    J: tl.constexpr = BN // QBLOCK
    return tl.reshape(dequantize_blocks(tl.reshape(codes, (BM, J, QBLOCK)), scales, signed), (BM, BN))
