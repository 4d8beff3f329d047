"""forge_num.emulator: the NumPy tile-level emulator of forge_num's kernels.

It needs only NumPy and the standard library (no torch, no triton), and returns, bit for bit, what
the kernels write. Modules mirror kernels/ function for function:

    fp32            correctly rounded fp32 add, mul, fma, div, sqrt (fma exact by round to odd)
    rules           forge_num.rules bound to those ops
    linear_update   the fused dW + update kernel and the element-wise kernel, tile by tile
    tensor_core     the Hopper bf16 tensor-core block FMA (bf16 mainloop)

``emulate(...)`` is the entry point.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from forge_num.rules import Rule, get_rule

from .linear_update import LinearUpdateResult, elementwise_update_kernel, fused_linear_update_kernel

__all__ = ["emulate", "emulate_elementwise", "LinearUpdateResult"]


def _rule(rule) -> Rule:
    return rule if isinstance(rule, Rule) else get_rule(rule)


def _mainloop_of(x: np.ndarray, dy: np.ndarray) -> str:
    if x.dtype != dy.dtype:
        raise TypeError(f"x and dy must have one dtype, got {x.dtype} and {dy.dtype}")
    if x.dtype == np.float32:
        return "ieee"
    if x.dtype == np.uint16:
        return "bf16"
    raise TypeError(
        f"x and dy must be float32 (ieee mainloop) or uint16 bf16 bit patterns (tensor cores), got {x.dtype}"
    )


def emulate(
    weight: np.ndarray | None,
    x: np.ndarray,
    dy: np.ndarray,
    state: Sequence[np.ndarray] = (),
    *,
    rule="adamw",
    hyper: dict | None = None,
    step: int = 1,
    h: Sequence[float] | None = None,
    grad_scale: float = 1.0,
    accum: np.ndarray | None = None,
    precision: str = "fp32",
    tile: tuple[int, int, int] = (64, 64, 16),
    store_acc: bool = False,
    arch: str = "sm_90",
    seed: int | None = None,
    counter=None,
) -> LinearUpdateResult:
    """What the fused kernel writes for W [M, N], X [K, N], dY [K, M] and the rule's state.

    ``precision``: "fp32" (weight and state float32), "bf16-sr" (weight and state as uint16 bf16
    encodings, stochastically rounded with the Philox key ``seed``) or "8bit" (weight as bf16
    encodings, each state a (codes, scales) pair of emulator/quant8.py). ``x``/``dy`` as float32 select the fp32 "ieee" mainloop; as uint16 arrays of bf16 bit patterns,
    the bf16 tensor-core mainloop of ``arch``. The per-step scalars are ``h`` if given, else
    ``rule.scalars(hyper, step)``. ``weight=None`` runs the mainloop only (store_acc gives dW).
    ``tile`` is (BM, BN, BK) of the kernel configuration being mirrored. ``counter``: the Philox
    counters of the weight's elements (philox.CounterMap; default their flat indices; a shard of a
    parameter passes its elements' indices in the whole parameter).
    """
    if precision not in ("fp32", "bf16-sr", "8bit"):
        raise ValueError(f"precision must be 'fp32', 'bf16-sr' or '8bit', got {precision!r}")
    rule_obj = _rule(rule) if weight is not None else None
    mainloop = _mainloop_of(x, dy)
    if weight is not None:
        want = np.float32 if precision == "fp32" else np.uint16
        stored = [("weight", weight)] + ([] if precision == "8bit" else [(f"state {i}", s) for i, s in enumerate(state)])
        for name, t in stored:
            if t.dtype != want:
                raise TypeError(f"{name} must be {np.dtype(want).name} in the {precision} regime "
                                f"(bf16 as uint16 encodings), got {t.dtype}")
        if precision == "8bit" and not all(isinstance(s, tuple) and len(s) == 2 for s in state):
            raise TypeError("8bit states are (codes uint8 [M, N], scales float32 [M, cdiv(N, 128)]) pairs")
        if precision != "fp32" and seed is None:
            raise ValueError(f"the {precision} regime needs seed= (the Philox key: philox.derive_seed(...))")
        if h is None:
            if hyper is None:
                raise ValueError("give the rule's hyper-parameters (hyper=) or its per-step scalars (h=)")
            h = rule_obj.scalars(hyper, step)
        M, N = weight.shape
    else:
        M, N = dy.shape[1], x.shape[1]
    if x.shape != (x.shape[0], N) or dy.shape != (x.shape[0], M):
        raise ValueError(f"shapes do not match: W {(M, N)}, x {x.shape}, dy {dy.shape}")
    BM, BN, BK = tile
    return fused_linear_update_kernel(
        weight, list(state), x, dy, accum, rule=rule_obj, h=tuple(h) if h is not None else (),
        grad_scale=grad_scale, update=weight is not None, store_acc=store_acc,
        BM=BM, BN=BN, BK=BK, mainloop=mainloop, arch=arch, seed=0 if seed is None else int(seed),
        counter=counter,
    )


def emulate_elementwise(param, grad, state=(), *, rule="adamw", hyper=None, step=1, h=None, grad_scale=1.0,
                        seed=None, counter=None):
    """What the element-wise kernel writes: (param, states, nonfinite count). param and state as
    float32 (fp32 regime) or uint16 bf16 encodings (bf16-sr, which needs seed)."""
    rule_obj = _rule(rule)
    if h is None:
        h = rule_obj.scalars(hyper, step)
    if param.dtype == np.uint16 and seed is None:
        raise ValueError("the bf16-sr regime needs seed= (the Philox key: philox.derive_seed(...))")
    return elementwise_update_kernel(param, grad, list(state), rule=rule_obj, h=tuple(h), grad_scale=grad_scale,
                                     seed=0 if seed is None else int(seed), counter=counter)
