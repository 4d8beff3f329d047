"""Make Triton's CPU interpreter (``TRITON_INTERPRET=1``) compute what the GPU computes.

The interpreter runs kernels on NumPy. Two of its ops differ from the H200 in ways that matter to
bit-exact tests (Triton 3.6, runtime/interpreter.py):

* ``create_fma`` is ``x*y + z`` with two roundings; ``fma.rn.f32`` on the GPU rounds once.
  Patched to emulator.fp32.fma (round to odd in binary64, proved exact).
* ``create_dot`` is ``np.matmul(a, b) + d``: BLAS order, and bf16 operands multiplied as raw uint16
  bit patterns (triton issue #11584). Patched to the GPU's mainloop semantics:
  - fp32 operands: the FMA dot, acc = fma(a[:, k], b[k, :], acc) for k in order, which is what
    Triton emits for ``input_precision="ieee"`` (fma.rn.f32 chains, checked in tests/test_ptx.py and
    on the H200);
  - bf16 operands: the Hopper tensor-core model of forge_num.emulator.tensor_core when it is
    available; otherwise the operands are widened exactly to fp32 and the FMA chain is used, which
    is *not* the tensor cores' arithmetic (the interpreter then checks logic, not bits, in bf16 mode).

Other interpreter facts (not patched; forge_num never relies on them): ``/`` and ``tl.sqrt`` are
correctly rounded (approximate on the GPU: kernels use div_rn and sqrt_rn), fp32->bf16 ``.to()``
truncates (kernels round with integer bit operations instead).

``install()`` is idempotent; tests/conftest.py and ``forge-num verify`` call it when interpreting.
"""

from __future__ import annotations

import os

import numpy as np

from forge_num.emulator import fp32

_installed = False


def is_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def fma_chain_dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """acc[m, n] <- fma(a[m, k], b[k, n], acc[m, n]) for k = 0 .. K-1 in order (fp32)."""
    acc = acc.astype(np.float32, copy=True)
    for k in range(a.shape[1]):
        acc = fp32.fma(a[:, k : k + 1], b[k : k + 1, :], acc)
    return acc


def _bf16_bits_to_f32(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _bf16_dot(a_bits: np.ndarray, b_bits: np.ndarray, acc: np.ndarray) -> np.ndarray:
    try:
        from forge_num.emulator.tensor_core import dot_sm90
    except ImportError:  # no tensor-core model: exact widening + FMA chain (logic, not bits)
        return fma_chain_dot(_bf16_bits_to_f32(a_bits), _bf16_bits_to_f32(b_bits), acc)
    return dot_sm90(a_bits, b_bits, acc.astype(np.float32))


def install() -> None:
    """Patch the interpreter's fma and dot (see the module docstring). No effect on GPU runs."""
    global _installed
    if _installed:
        return
    from triton.runtime import interpreter as tri

    builder_cls = type(tri.interpreter_builder)

    def create_fma(self, x, y, z):
        return tri.TensorHandle(fp32.fma(x.data, y.data, z.data), z.dtype.scalar)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a_data, b_data = a.data, b.data
        if a_data.dtype == np.float32 and b_data.dtype == np.float32:
            out = fma_chain_dot(a_data, b_data, d.data)
        elif a_data.dtype == np.uint16 and b_data.dtype == np.uint16:  # bf16 bit patterns
            out = _bf16_dot(a_data, b_data, d.data)
        else:
            raise NotImplementedError(
                f"forge_num's interpreter dot supports fp32 x fp32 and bf16 x bf16, got "
                f"{a.dtype} x {b.dtype}"
            )
        return tri.TensorHandle(out.astype(np.float32), d.dtype.scalar)

    builder_cls.create_fma = create_fma
    builder_cls.create_dot = create_dot
    _installed = True


def installed() -> bool:
    return _installed
