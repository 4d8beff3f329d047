"""The update rules on torch tensors: the CPU (and any-device) backend of forge_num.

Same four functions, same signatures, as ``forge_num.kernels`` (the Triton kernels, CUDA):

    fused_linear_update(weight, x, dy, states, rule, h, *, grad_scale=1.0, accum=None, seed=None,
                        counter=None) -> UpdateStats
    elementwise_update(param, grad, states, rule, h, *, grad_scale=1.0, seed=None, counter=None) -> UpdateStats
    weight_grad_norm_sq(x, dy, accum=None) -> 0-d float64 tensor
    accumulate_weight_grad(x, dy, accum) -> None

The rules of ``forge_num.rules`` are bound (``Rule.bind``) to ``NAMESPACE``, a vocabulary of
*exact* fp32 operations on torch tensors:

* ``add``, ``sub``, ``mul``, ``div``: torch's float32 ops. On the CPU they are the host's IEEE
  instructions (SSE/AVX/AVX-512, no flush-to-zero unless ``torch.set_flush_denormal(True)``), so
  correctly rounded; tests/test_torch_backend.py checks them bit for bit against
  ``forge_num.emulator.fp32`` on random data, subnormals, ±0, ±inf, NaN and ties. Host scalars ``h``
  are passed as 0-d fp32 tensors *on the tensor's device*: CUDA's ``a / cpu_scalar`` is computed as
  ``a * (1 / b)`` (two roundings) and a device tensor avoids that path.
* ``sqrt``: ``x.double().sqrt().float()``, then checked against the neighbouring binary32
  midpoints m (m² is exact in binary64) and moved by one ulp if it lies beyond one. torch's own
  float32 ``sqrt`` on the CPU is not correctly rounded (about 0.7% of inputs are one ulp off in torch
  2.13). The double rounding alone is innocuous for a faithful binary64 root:
  scale x to [1, 4); a binary32 midpoint m of [1, 2) is an odd multiple of 2^-24, so m² is an odd
  multiple of 2^-48 while x is a multiple of 2^-23 (fewer bits still for a subnormal x), hence
  |x - m²| >= 2^-48 and |sqrt(x) - m| >= 2^-48 / 4 = 2^-50, more than the error of any faithful
  binary64 square root (< 2^-52). So the binary64 root lies strictly on the same side of every
  binary32 midpoint as the exact root, and rounding it to binary32 gives the correctly rounded result;
  the midpoint check makes that independent of how accurate torch's binary64 sqrt kernel is (MKL's
  vector math, Sleef or libm, by build and CPU).
* ``fma``: correctly rounded by *round to odd* in binary64 (Boldo & Melquiond 2008), as
  ``emulator/fp32.py`` does in NumPy: the product of two binary32 values is exact in binary64, the
  sum is rounded to nearest, Knuth's TwoSum gives the exact error, and where the sum was inexact and
  its last bit is even it is moved one ulp toward the exact value; rounding that round-to-odd value
  to binary32 (53 >= 24 + 2) is the correctly rounded fma (``fma_round_to_odd``, any device). On a
  CPU whose ATen kernels use AVX2/AVX-512, ``torch.addcmul(c, a, b)`` is the hardware fma (ATen
  computes ``fmadd(1 * a, b, c)``), about 20 times fewer operations; it is used only where a
  self-test on double-rounding cases passes at first use (``addcmul_is_fma``): with
  ``ATEN_CPU_CAPABILITY=default`` it rounds twice and the round-to-odd path is taken.
* ``neg`` (flips the sign bit, zeros and NaNs included), ``sign`` (+1/-1; ±0 and NaN returned as
  they are), ``where``, ``isfinite``.

Agreement with the emulator (and the kernels): the *epilogue* — the guarded rule applied to a given
fp32 gradient — is bitwise identical to ``forge_num.emulator.rules.bind_guarded(rule)`` (tested).
The weight gradient ``dW = dyᵀ x`` is computed here by torch's CPU matmul in row blocks
(``dW[rows] = dy[:, rows]ᵀ @ x``, at most ``BLOCK_ELEMS`` fp32 elements of dW alive at once; bf16
inputs are upcast to fp32 first, exactly), whose summation order is MKL's, not the Triton
kernel's: end to end the agreement is "the same rule applied to the same gradient", not bitwise dW.
Against torch's autograd on the CPU: when dW fits in one block the block is torch's own ``mm`` of the
same operands, and MKL gave ``dyᵀ @ x`` bitwise equal to autograd's weight gradient on every shape
tried; when dW is split into several blocks MKL's summation order depends on the block's shape (e.g.
K=1000, M=300, N=200 with 64-row blocks differs in the last bits), so each element is then only
within the fp32 dot-product bound γ_K · Σ|dy_ki x_kj| of either (tests check that bound).

Memory: one dW block (BLOCK_ELEMS fp32 elements) and the rule's temporaries for it (about ten
tensors of the block's size; fp64 ones in the round-to-odd fma) exist at a time, whatever the layer's
size; bf16 x and dy are upcast to fp32 copies (activation-sized) for the duration of the call.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

from forge_num.emulator.philox import CounterMap
from forge_num.rules import Rule

__all__ = [
    "NAMESPACE",
    "UpdateStats",
    "BLOCK_ELEMS",
    "bind_rule",
    "bind_guarded",
    "fused_linear_update",
    "elementwise_update",
    "weight_grad_norm_sq",
    "accumulate_weight_grad",
    "weight_grad_blocks",
]

# The most elements of a weight gradient block, and of each temporary of the update, that exist at once.
BLOCK_ELEMS = 1 << 16

_F32 = torch.float32
_F64 = torch.float64


class UpdateStats(NamedTuple):
    """What an update reports (the same fields as ``forge_num.kernels.UpdateStats``)."""

    norm_sq: torch.Tensor  # 0-d float64: Σ g² of the unscaled gradient
    nonfinite: torch.Tensor  # 0-d int64: number of non-finite gradient elements


# --------------------------------------------------------------------------------------------
# The op vocabulary
# --------------------------------------------------------------------------------------------


def _add(a, b):
    return torch.add(a, b)


def _sub(a, b):
    return torch.sub(a, b)


def _mul(a, b):
    return torch.mul(a, b)


def _div(a, b):
    return torch.div(a, b)


def _sqrt(a):
    x = a.to(_F64)
    return sqrt_fix(x.sqrt().to(_F32), x)


def sqrt_fix(r, x):
    """The correctly rounded binary32 sqrt of ``x`` from ``r`` one ulp off at most."""
    # Check against the neighbouring binary32 midpoints, exactly: a midpoint has 25 significant bits,
    # its square 50, so both are exact in binary64. This makes the result correctly rounded whatever
    # the accuracy of the binary64 square root (MKL/Sleef/libm), as long as it is within one ulp.
    pos = (x > 0) & torch.isfinite(x)
    up = torch.nextafter(r, torch.full_like(r, float("inf")))
    down = torch.nextafter(r, torch.zeros_like(r))
    r64 = r.to(_F64)
    mid_up = (r64 + up.to(_F64)) * 0.5
    mid_down = (r64 + down.to(_F64)) * 0.5
    r = torch.where(pos & (mid_up * mid_up < x), up, r)
    return torch.where(pos & (mid_down * mid_down > x), down, r)


def fma_round_to_odd(a, b, c):
    """Correctly rounded fp32 a*b + c on any device: round to odd in binary64 (see the module docstring)."""
    p = a.to(_F64) * b.to(_F64)  # exact: 48 significant bits, exponent within binary64's range
    c64 = c.to(_F64)
    s = p + c64  # rounded to nearest at 53 bits
    # TwoSum: e = (p + c) - s exactly (NaN where s is not finite: then nothing is adjusted).
    c_part = s - p
    e = (p - (s - c_part)) + (c64 - c_part)
    even = (s.view(torch.int64) & 1) == 0
    fix = (e.abs() > 0) & even  # inexact with an even last bit: step one ulp toward the exact sum
    s = torch.where(fix, torch.nextafter(s, torch.copysign(torch.full_like(s, float("inf")), e)), s)
    return s.to(_F32)


def fma_addcmul(a, b, c):
    """``torch.addcmul(c, a, b)``: on a CPU whose ATen kernels are AVX2/AVX-512 it is the hardware fma."""
    return torch.addcmul(c, a, b)


_ADDCMUL_IS_FMA: bool | None = None
FMA_IMPL = (
    "auto"  # "auto": addcmul on a CPU where the self-test passes, else round to odd; or "odd", "addcmul"
)


def addcmul_is_fma() -> bool:
    """Whether this process's CPU ``torch.addcmul`` rounds once (checked once, on double-rounding cases).

    ATen's vectorised addcmul computes ``fmadd(value * a, b, c)``; with AVX2/AVX-512 kernels that is
    one fused multiply-add, but the DEFAULT (no-FMA) kernels round twice. The check runs the vector
    body and the scalar tail (sizes 1..67), with 0-d operands, on cases where a double rounding is
    wrong, and on random bit patterns, against ``fma_round_to_odd``.
    """
    global _ADDCMUL_IS_FMA
    if _ADDCMUL_IS_FMA is None:
        gen = torch.Generator().manual_seed(20261202)
        ok = True
        one = 1.0 + 2.0**-12
        for n in (1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 67):
            bits = torch.randint(-(2**31), 2**31, (3, n), generator=gen, dtype=torch.int64).to(torch.int32)
            a, b, c = bits.view(_F32).unbind(0)
            a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
            a[0], b[0], c[0] = (
                one,
                one,
                2.0**-70,
            )  # round-to-nearest twice gives 1 + 2^-11, once 1 + 2^-11 + 2^-23
            cases = [(a, b, c), (a[:1].reshape(()), b, c), (a, b, c[:1].reshape(()))]
            for x, y, z in cases:
                want = fma_round_to_odd(x, y, z)
                got = fma_addcmul(x, y, z)
                same = (want.view(torch.int32) == got.view(torch.int32)) | (
                    torch.isnan(want) & torch.isnan(got)
                )
                ok = ok and bool(same.all())
        _ADDCMUL_IS_FMA = ok
    return _ADDCMUL_IS_FMA


def _fma(a, b, c):
    impl = FMA_IMPL
    if impl == "auto":
        impl = "addcmul" if a.device.type == "cpu" and addcmul_is_fma() else "odd"
    return fma_addcmul(a, b, c) if impl == "addcmul" else fma_round_to_odd(a, b, c)


def _neg(a):
    return torch.neg(a)


def _sign(a):
    return torch.where((a == 0) | torch.isnan(a), a, torch.where(a > 0, 1.0, -1.0).to(a.dtype))


def _where(c, a, b):
    return torch.where(c, a, b)


def _isfinite(a):
    return torch.isfinite(a)


NAMESPACE = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "fma": _fma,
    "div": _div,
    "sqrt": _sqrt,
    "neg": _neg,
    "sign": _sign,
    "where": _where,
    "isfinite": _isfinite,
}


@functools.lru_cache(maxsize=None)
def bind_rule(rule: Rule):
    """``rule.update`` over torch tensors: ``(p, g, s0, s1, h) -> (p, s0, s1)``."""
    return rule.bind(NAMESPACE)


@functools.lru_cache(maxsize=None)
def bind_guarded(rule: Rule):
    """The guarded update over torch tensors: ``(p, g, s0, s1, h, grad_scale) -> (p, s0, s1, finite)``."""
    return rule.bind_guarded(NAMESPACE)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def _check_rule(rule, h):
    if not isinstance(rule, Rule):
        raise TypeError(f"rule must be a forge_num.rules.Rule, got {type(rule).__name__}")
    if len(h) != len(rule.scalar_names):
        raise ValueError(
            f"rule {rule.name!r} takes {len(rule.scalar_names)} scalars {rule.scalar_names}, got {len(h)}"
        )


def _check_param_like(name, t, like_name, like, dtype=_F32):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {str(dtype).removeprefix('torch.')}, got {t.dtype}")
    if t.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, {like_name} has {tuple(like.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, {like_name} on {like.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _check_states(states, param, name):
    states = list(states)
    if len(states) > 2:
        raise ValueError(f"at most two state tensors, got {len(states)}")
    for i, s in enumerate(states):
        _check_param_like(f"states[{i}]", s, name, param, param.dtype)  # state stored like the param
    return states


def _check_storage(name, t, seed):
    """True for bf16 storage (the bf16-sr regime, which needs the Philox key ``seed``)."""
    if t.dtype not in (_F32, torch.bfloat16):
        raise TypeError(f"{name} must be float32 (fp32 regime) or bfloat16 (bf16-sr regime), got {t.dtype}")
    if t.dtype == torch.bfloat16 and (seed is None or not 0 <= int(seed) < 2**64):
        raise ValueError(f"the bf16-sr regime rounds stochastically and needs seed= (a 64-bit Philox key), got {seed!r}")
    return t.dtype == torch.bfloat16


def _check_activations(x, dy, M=None, N=None):
    for name, t in (("x", x), ("dy", dy)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D [tokens, features], got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if x.shape[0] != dy.shape[0]:
        raise ValueError(f"x has {x.shape[0]} tokens (rows), dy has {dy.shape[0]}")
    if x.device != dy.device:
        raise ValueError(f"x is on {x.device}, dy on {dy.device}")
    if N is not None and x.shape[1] != N:
        raise ValueError(f"x has {x.shape[1]} features, the weight [M, N] has N={N}")
    if M is not None and dy.shape[1] != M:
        raise ValueError(f"dy has {dy.shape[1]} features, the weight [M, N] has M={M}")


def _scalars(h, device):
    """The host scalars as 0-d fp32 tensors on ``device`` (exact: they are fp32 values already)."""
    return tuple(torch.tensor(float(v), dtype=_F32, device=device) for v in h)


def _grad_scale(grad_scale, device):
    if isinstance(grad_scale, torch.Tensor):
        if grad_scale.numel() != 1:
            raise ValueError(f"grad_scale must be a scalar, got shape {tuple(grad_scale.shape)}")
        return grad_scale.reshape(()).to(device=device, dtype=_F32)
    return torch.tensor(float(grad_scale), dtype=_F32, device=device)


# --------------------------------------------------------------------------------------------
# The guarded update of one block
# --------------------------------------------------------------------------------------------


def _bf16_sr(x: torch.Tensor, rand16) -> torch.Tensor:
    """x (fp32) stochastically rounded to bf16 with the given 16-bit random integers: the bit rule
    of emulator/rounding.py (the kernels' twin), computed there in NumPy on the CPU."""
    from forge_num.emulator.rounding import bf16_sr_bits

    bits = bf16_sr_bits(x.detach().cpu().numpy(), rand16)
    return torch.from_numpy(bits.view("int16")).view(torch.bfloat16).to(x.device).reshape(x.shape)


def _apply(fn, p, g, states, hs, scale, seed=None, offsets=None):
    """Run the guarded rule on views ``p``, ``g``, ``states`` and write p and states back in place.

    bf16 ``p``/``states`` (the bf16-sr regime): widened exactly, updated in fp32, stored rounded
    stochastically with the random bits of ``offsets`` (the elements' flat indices in the whole
    parameter) under the key ``seed``: slices r_p, r_m16, r_v16, as the kernels.
    Returns (Σ g² of the unscaled g in fp64, number of non-finite elements of the scaled g).
    """
    bf16 = p.dtype == torch.bfloat16
    dummy = torch.zeros((), dtype=_F32, device=p.device)  # an unused state slot
    widen = (lambda t: t.to(_F32)) if bf16 else (lambda t: t)  # noqa: E731  bf16 -> fp32 is exact
    s0 = widen(states[0]) if len(states) > 0 else dummy
    s1 = widen(states[1]) if len(states) > 1 else dummy
    p_new, s0_new, s1_new, finite = fn(widen(p), g, s0, s1, hs, scale)
    if bf16:
        from forge_num.emulator.philox import rounding_bits

        r_p, r_s0, r_s1 = rounding_bits(int(seed), offsets.detach().cpu().numpy().reshape(p.shape))
        p_new = _bf16_sr(p_new, r_p)
        s0_new = _bf16_sr(s0_new, r_s0) if len(states) > 0 else s0_new
        s1_new = _bf16_sr(s1_new, r_s1) if len(states) > 1 else s1_new
    with torch.no_grad():
        p.copy_(p_new)
        if len(states) > 0:
            states[0].copy_(s0_new)
        if len(states) > 1:
            states[1].copy_(s1_new)
    g64 = g.to(_F64)
    return (g64 * g64).sum(), (~finite).sum()


def weight_grad_blocks(x, dy, M, N, accum=None):
    """Yield (row slice, fp32 dW block) with dW = dyᵀ x (+ accum) and at most BLOCK_ELEMS elements per block.

    bf16/fp16 inputs are upcast to fp32 (exactly) once; the block is torch's ``mm``.
    """
    xf = x.to(_F32)
    dyf = dy.to(_F32)
    rows = max(1, BLOCK_ELEMS // max(N, 1))
    for r0 in range(0, M, rows):
        r1 = min(M, r0 + rows)
        if accum is not None and x.shape[0] == 0:
            blk = accum[r0:r1].clone()  # no tokens: the gradient is the buffer, -0 kept (as the kernels)
        else:
            blk = torch.mm(dyf[:, r0:r1].t(), xf)
            if accum is not None:
                blk = torch.add(accum[r0:r1], blk)  # as torch accumulates .grad: old + new
        yield slice(r0, r1), blk


@torch.no_grad()
def fused_linear_update(weight, x, dy, states, rule, h, *, grad_scale=1.0, accum=None, seed=None,
                        counter=None) -> UpdateStats:
    """Apply ``rule`` (guarded) to ``weight`` [M, N] and ``states`` with dW = dyᵀ x, in row blocks, in place.

    ``x`` [K, N], ``dy`` [K, M] (fp32, bf16 or fp16; any strides); ``accum`` an optional fp32 [M, N]
    accumulation buffer added to each gradient block (``accum + dW``) before the update.
    """
    _check_rule(rule, h)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D tensor [M, N], got {getattr(weight, 'shape', weight)!r}")
    _check_storage("weight", weight, seed)
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    M, N = weight.shape
    _check_activations(x, dy, M, N)
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device}, weight on {weight.device}")
    cmap = CounterMap.of(counter, M * N, cols=N)
    if any(_is_q8(st) for st in states):
        return _fused_linear_update_q8(weight, x, dy, list(states), rule, h, grad_scale, accum, seed, cmap)
    states = _check_states(states, weight, "weight")
    if accum is not None:
        _check_param_like("accum", accum, "weight", weight)
    fn = bind_guarded(rule)
    hs = _scalars(h, weight.device)
    scale = _grad_scale(grad_scale, weight.device)
    norm_sq = torch.zeros((), dtype=_F64, device=weight.device)
    nonfinite = torch.zeros((), dtype=torch.int64, device=weight.device)
    for rows, g in weight_grad_blocks(x, dy, M, N, accum):
        offsets = (torch.from_numpy(cmap.of_flat(np.arange(rows.start * N, rows.stop * N, dtype=np.int64)))
                   if seed is not None else None)
        n2, bad = _apply(fn, weight[rows], g, [s[rows] for s in states], hs, scale, seed, offsets)
        norm_sq += n2
        nonfinite += bad
    return UpdateStats(norm_sq, nonfinite)


def _is_q8(state) -> bool:
    """An 8bit state: an object with uint8 ``codes`` and fp32 ``scales`` (forge_num.kernels.Q8State)."""
    return hasattr(state, "codes") and hasattr(state, "scales")


def _fused_linear_update_q8(weight, x, dy, states, rule, h, grad_scale, accum, seed, cmap) -> UpdateStats:
    """The 8bit regime (bf16 weight; m, v as 8-bit codes with a scale per 128 elements of a row):
    whole rows at a time, through the emulator's twin of the kernel's epilogue
    (emulator.linear_update.update_in_place_q8, NumPy on the CPU), so the bits are the kernel's
    for the same gradient."""
    from forge_num.emulator.linear_update import update_in_place_q8
    from forge_num.emulator.quant8 import QBLOCK
    from forge_num.emulator.rules import bind_guarded as np_guarded

    if weight.dtype != torch.bfloat16:
        raise TypeError(f"the 8bit regime keeps the weight in bfloat16, got {weight.dtype}")
    if seed is None or not 0 <= int(seed) < 2**64:
        raise ValueError(f"the 8bit regime rounds stochastically and needs seed=, got {seed!r}")
    M, N = weight.shape
    nb = -(-N // QBLOCK)
    if len(states) > len(rule.state) or not all(_is_q8(st) for st in states):
        raise ValueError(f"8bit states must be at most {len(rule.state)} Q8State(codes, scales)")
    for st in states:
        if st.codes.dtype != torch.uint8 or tuple(st.codes.shape) != (M, N):
            raise ValueError(f"8bit codes must be uint8 [{M}, {N}], got {st.codes.dtype} {tuple(st.codes.shape)}")
        if st.scales.dtype != _F32 or tuple(st.scales.shape) != (M, nb):
            raise ValueError(f"8bit scales must be float32 [{M}, {nb}], got {st.scales.dtype} {tuple(st.scales.shape)}")
    guarded = np_guarded(rule)
    hs = tuple(float(v) for v in h)
    scale = float(grad_scale)
    Np = nb * QBLOCK

    def pad(a, fill=0):
        out = np.full((a.shape[0], Np), fill, dtype=a.dtype)
        out[:, :N] = a
        return out

    norm_sq = torch.zeros((), dtype=_F64, device=weight.device)
    nonfinite = torch.zeros((), dtype=torch.int64, device=weight.device)
    for rows, g in weight_grad_blocks(x, dy, M, N, accum):
        r0, r1 = rows.start, rows.stop
        offs = cmap.of_tile(np.arange(r0, r1), np.arange(Np))  # Philox counters, padding included
        p_bits = pad(weight[rows].detach().cpu().view(torch.int16).numpy().view(np.uint16))
        q = [(pad(st.codes[rows].cpu().numpy()), st.scales[rows].cpu().numpy()) for st in states]
        g_np = pad(g.detach().cpu().numpy().astype(np.float32))
        p_new, q_new, finite = update_in_place_q8(p_bits, q, offs, g_np, guarded, hs, np.float32(scale), int(seed))
        weight[rows].copy_(torch.from_numpy(np.ascontiguousarray(p_new[:, :N]).view(np.int16)).view(torch.bfloat16))
        for st, (codes, scales) in zip(states, q_new):
            st.codes[rows].copy_(torch.from_numpy(np.ascontiguousarray(codes[:, :N])))
            st.scales[rows].copy_(torch.from_numpy(scales))
        g64 = g.to(_F64)
        norm_sq += (g64 * g64).sum()
        nonfinite += int(np.sum(~finite[:, :N]))
    return UpdateStats(norm_sq, nonfinite)


@torch.no_grad()
def elementwise_update(param, grad, states, rule, h, *, grad_scale=1.0, seed=None, counter=None) -> UpdateStats:
    """Apply ``rule`` (guarded) to ``param`` and ``states`` with gradient ``grad``, in place.

    Contiguous, any shape; param and states fp32, or bf16 with ``seed`` (bf16-sr); grad fp32.
    """
    _check_rule(rule, h)
    if not isinstance(param, torch.Tensor):
        raise TypeError(f"param must be a torch.Tensor, got {type(param).__name__}")
    _check_storage("param", param, seed)
    if not param.is_contiguous():
        raise ValueError("param must be contiguous")
    _check_param_like("grad", grad, "param", param)
    states = _check_states(states, param, "param")
    fn = bind_guarded(rule)
    hs = _scalars(h, param.device)
    scale = _grad_scale(grad_scale, param.device)
    p1, g1, s1 = param.view(-1), grad.view(-1), [s.view(-1) for s in states]
    cmap = CounterMap.of(counter, p1.numel())
    norm_sq = torch.zeros((), dtype=_F64, device=param.device)
    nonfinite = torch.zeros((), dtype=torch.int64, device=param.device)
    for i in range(0, max(p1.numel(), 1), BLOCK_ELEMS):
        sl = slice(i, i + BLOCK_ELEMS)
        offsets = (torch.from_numpy(cmap.of_flat(np.arange(i, min(i + BLOCK_ELEMS, p1.numel()), dtype=np.int64)))
                   if seed is not None else None)
        n2, bad = _apply(fn, p1[sl], g1[sl], [s[sl] for s in s1], hs, scale, seed, offsets)
        norm_sq += n2
        nonfinite += bad
    return UpdateStats(norm_sq, nonfinite)


@torch.no_grad()
def weight_grad_norm_sq(x, dy, accum=None) -> torch.Tensor:
    """Σ dW² in fp64 for dW = dyᵀ x (+ accum), without ever holding all of dW."""
    _check_activations(x, dy)
    M, N = dy.shape[1], x.shape[1]
    if accum is not None and (accum.dtype != _F32 or tuple(accum.shape) != (M, N)):
        raise ValueError(f"accum must be float32 [{M}, {N}], got {accum.dtype} {tuple(accum.shape)}")
    total = torch.zeros((), dtype=_F64, device=x.device)
    for _, g in weight_grad_blocks(x, dy, M, N, accum):
        g64 = g.to(_F64)
        total += (g64 * g64).sum()
    return total


@torch.no_grad()
def accumulate_weight_grad(x, dy, accum) -> None:
    """accum += dyᵀ x (fp32, in place, in row blocks).

    Fill a new buffer with -0.0: -0.0 + d == d for every d, so the first accumulation is dW itself.
    """
    _check_activations(x, dy)
    M, N = dy.shape[1], x.shape[1]
    if not isinstance(accum, torch.Tensor) or accum.dtype != _F32 or tuple(accum.shape) != (M, N):
        raise ValueError(
            f"accum must be a float32 tensor [{M}, {N}], got {getattr(accum, 'dtype', None)} "
            f"{tuple(getattr(accum, 'shape', ()))}"
        )
    if not accum.is_contiguous():
        raise ValueError("accum must be contiguous")
    for rows, g in weight_grad_blocks(x, dy, M, N, accum):
        accum[rows].copy_(g)
