"""fp32 -> bf16 by integer bit operations in registers: round to nearest even, and stochastic.

Twin of emulator/rounding.py, which holds the bit layout, the rules for NaN, ±Inf, ±0,
subnormals and the saturation of SR at ±bf16max, and the reasons; proofs/stochastic_rounding.md
proves them. In short, with bits = x as uint32, hi = bits >> 16, lo = bits & 0xFFFF:

    RNE:  hi' = (bits + 0x7FFF + (hi & 1)) >> 16
    SR:   hi' = hi + (rand16 < lo),  except |hi| == 0x7F7F (saturate at ±bf16max)
    NaN:  hi' = hi | 0x0040 (quiet), for both

Never ``x.to(tl.bfloat16)`` for rounding: the interpreter truncates that cast while the GPU
rounds it to nearest even; these integer forms give the same bits on both and in NumPy.
Results are bf16 *encodings* as uint16; store them through a uint16 view of the bf16 buffer (or
bitcast with ``.to(tl.bfloat16, bitcast=True)``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["bf16_rne_bits", "bf16_sr_bits", "bf16_to_f32"]


@triton.jit
def _is_nan(bits):
    return (bits & 0x7FFFFFFF) > 0x7F800000


@triton.jit
def bf16_rne_bits(x):
    """fp32 tile -> bf16 encodings (uint16), round to nearest even; NaN -> quiet NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    hi = bits >> 16
    rounded = (bits + 0x7FFF + (hi & 1)) >> 16
    out = tl.where(_is_nan(bits), hi | 0x0040, rounded)
    return out.to(tl.uint16)


@triton.jit
def bf16_sr_bits(x, rand16):
    """fp32 tile -> bf16 encodings (uint16), away from zero iff ``rand16 < lo`` (uint32 in [0, 2^16))."""
    bits = x.to(tl.uint32, bitcast=True)
    hi = bits >> 16
    lo = bits & 0xFFFF
    up = (rand16 < lo) & ((hi & 0x7FFF) != 0x7F7F)
    out = tl.where(_is_nan(bits), hi | 0x0040, hi + up.to(tl.uint32))
    return out.to(tl.uint16)


@triton.jit
def bf16_to_f32(bits):
    """bf16 encodings (uint16) -> fp32 values (exact)."""
    return (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
