"""The project's random stream on the GPU: Triton's Philox4x32-10 and the random-slice table.

Twin of emulator/philox.py (which holds the algorithm, its known-answer vectors and
``derive_seed``, the host-side key derivation both twins use). The random-slice table is the one
in that module's docstring, repeated here because both twins implement it:

    one call  tl.randint4x(seed, offset)  per element; offset = the element's flat row-major
              index in the whole (unsharded) parameter, int64 (counter = (lo32, hi32, 0, 0));
              seed = derive_seed(user seed, step, parameter id), a Python int < 2^64

     word  bits     name      rounds                                         random input
     ----  -------  --------  ---------------------------------------------  -----------------
     c0    15..0    r_p       the weight p, fp32 -> bf16 (SR)                 16 bits
     c0    31..16   r_m16     m, fp32 -> bf16 (SR)      ("bf16-sr" regime)    16 bits
     c1    15..0    r_v16     v, fp32 -> bf16 (SR)      ("bf16-sr" regime)    16 bits
     c1    31..16   -         reserved (a third bf16 state, e.g. AMSGrad's max v)
     c2    31..8    r_m24     m, fp32 -> 8-bit code (SR) ("8bit" regime)      24 bits
     c3    31..8    r_v24     v, fp32 -> 8-bit code (SR) ("8bit" regime)      24 bits
     c2, c3 7..0    -         unused

Tile functions only (no pointers, no program ids): the kernels compute the offsets of their tile
and call these. Triton 3.6's ``tl.randint4x`` returns uint32 words; all slices stay uint32.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["randint4x", "randint", "rounding_bits"]


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
def rounding_bits(seed, offset):
    """The random-slice table: ``(r_p, r_m16, r_v16, r_m24, r_v24)`` as uint32 tiles."""
    c0, c1, c2, c3 = tl.randint4x(seed, offset)
    r_p = c0 & 0xFFFF
    r_m16 = c0 >> 16
    r_v16 = c1 & 0xFFFF
    r_m24 = c2 >> 8
    r_v24 = c3 >> 8
    return r_p, r_m16, r_v16, r_m24, r_v24
