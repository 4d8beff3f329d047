"""The Triton kernel behind ``forge-num report bias --device gpu``: many stochastic roundings of a
few values, with the kernels' own random slices and bit rule (kernels/random.py, rounding.py)."""

import triton
import triton.language as tl

from forge_num.kernels.random import rounding_bits
from forge_num.kernels.rounding import bf16_sr_bits


@triton.jit
def sr_draws_kernel(x_ptr, out_ptr, key, d0, n, total, BLOCK: tl.constexpr):
    """out[i] = bf16_sr_bits(x[i % n], r_p(key, d0 * n + i)) for i < total (as int16 bits)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < total
    x = tl.load(x_ptr + i % n, mask=inside, other=0.0)
    r_p, _, _ = rounding_bits(key, d0 * n + i)
    tl.store(out_ptr + i, bf16_sr_bits(x, r_p).to(tl.int16, bitcast=True), mask=inside)
