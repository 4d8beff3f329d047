"""The torch.optim reference of the parity tests, in one place.

forge_num's rules reproduce torch.optim's single-tensor (``foreach=False``) CPU code op for op,
with two stated differences handled here:

* torch's float32 ``sqrt`` on the CPU is not correctly rounded (about 0.7% of inputs one ulp off in
  torch 2.13); ``ExactSqrt`` makes it so (through float64: innocuous double rounding for sqrt), and
  ``ExactAdamW`` runs torch.optim.AdamW's step under it.
* ATen's AVX2/AVX-512 kernels compute lerp/addcmul/add(alpha=) as one fused multiply-add
  (Vectorized::fmadd); its DEFAULT kernels (no FMA, e.g. ``ATEN_CPU_CAPABILITY=default``) round
  twice, so torch.optim itself computes something else there: ``needs_fused_aten`` skips parity
  tests on such a CPU (forge_num's own ops stay exact).
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from forge_num import torch_backend as _tb

needs_fused_aten = pytest.mark.skipif(
    not _tb.addcmul_is_fma(),
    reason="this CPU's ATen kernels round lerp/addcmul twice (no FMA): not the rules' op order",
)


class ExactSqrt(TorchFunctionMode):
    """torch.sqrt / Tensor.sqrt / Tensor.sqrt_ on float32, correctly rounded (through float64)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.sqrt, torch.Tensor.sqrt) and args[0].dtype == torch.float32:
            return args[0].double().sqrt().float()
        if func is torch.Tensor.sqrt_ and args[0].dtype == torch.float32:
            return args[0].copy_(args[0].double().sqrt().float())
        return func(*args, **kwargs)


class ExactAdamW(torch.optim.AdamW):
    """torch.optim.AdamW whose step runs under ExactSqrt."""

    def step(self, closure=None):
        with ExactSqrt():
            return super().step(closure)
