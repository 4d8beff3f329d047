"""The op vocabulary of forge_num.rules as Triton jit functions: correctly rounded fp32 only.

Every kernel that executes a rule is launched with ``enable_fp_fusion=False``. Then the PTX holds
``add.rn.f32`` / ``sub.rn.f32`` / ``mul.rn.f32`` for ``+ - *`` (an explicit rounding modifier, which
ptxas never contracts into an FMA), ``fma.rn.f32`` only where a rule says ``fma`` (``tl.fma``),
``div.rn.f32`` for ``tl.div_rn`` and ``sqrt.rn.f32`` for ``tl.sqrt_rn`` -- never the approximate
``div.full.f32`` of ``/`` or the ``sqrt.approx.f32`` of ``tl.sqrt``. tests/test_ptx.py compiles the
kernels for sm_90 on the CPU and counts these instructions.

Under ``TRITON_INTERPRET=1`` the same functions run on NumPy: + - * / sqrt are correctly rounded
there, and forge_num.interpreter makes ``tl.fma`` round once (Triton 3.6's interpreter computes
``x*y + z`` with two roundings).
"""

import triton
import triton.language as tl


@triton.jit
def add(a, b):
    return a + b


@triton.jit
def sub(a, b):
    return a - b


@triton.jit
def mul(a, b):
    return a * b


@triton.jit
def fma(a, b, c):
    return tl.fma(a, b, c)


@triton.jit
def div(a, b):
    return tl.div_rn(a, b)


@triton.jit
def sqrt(a):
    return tl.sqrt_rn(a)


@triton.jit
def neg(a):
    return -a


@triton.jit
def sign(a):
    # +1 / -1 for nonzero a; a itself for +-0 (sign of zero kept) and NaN (propagated)
    return tl.where(a > 0, 1.0, tl.where(a < 0, -1.0, a))


@triton.jit
def where(c, a, b):
    return tl.where(c, a, b)


@triton.jit
def isfinite(a):
    # NaN fails a == a; +-inf fails |a| < inf
    return (a == a) & (tl.abs(a) < float("inf"))


NAMESPACE = {
    "add": add,
    "sub": sub,
    "mul": mul,
    "fma": fma,
    "div": div,
    "sqrt": sqrt,
    "neg": neg,
    "sign": sign,
    "where": where,
    "isfinite": isfinite,
    "tl": tl,
}
