"""The rules of forge_num.rules bound to exact NumPy fp32 arithmetic (emulator.fp32).

``bind_rule(rule)`` returns ``update(p, g, s0, s1, h) -> (p, s0, s1)`` and ``bind_guarded(rule)``
returns ``guarded_update(p, g, s0, s1, h, grad_scale) -> (p, s0, s1, finite)``: the very function
text of forge_num/rules.py, executed with NumPy float32 arrays. The Triton kernels execute the same
text with Triton ops (kernels/rules.py).
"""

from __future__ import annotations

import functools

import numpy as np

from forge_num.rules import Rule

from . import fp32

__all__ = ["NAMESPACE", "bind_rule", "bind_guarded"]

_F32 = np.float32


def _sign(x):
    """+1, -1 for nonzero x; x itself for ±0 and NaN (keeps the sign of zero, propagates NaN)."""
    x = fp32.as_f32(x)
    return np.where(x > 0, _F32(1.0), np.where(x < 0, _F32(-1.0), x)).astype(_F32)


def _where(cond, a, b):
    """Element-wise select; scalars are taken as fp32 (they are fp32 values already)."""
    return np.where(cond, np.asarray(a, dtype=_F32), np.asarray(b, dtype=_F32))


def _isfinite(x):
    return np.isfinite(fp32.as_f32(x))


def _scalar_safe(op):
    """Host scalars arrive as Python floats holding fp32 values: wrap them as np.float32 (exact)."""

    @functools.wraps(op)
    def wrapped(*args):
        return op(*(np.float32(a) if isinstance(a, float) else a for a in args))

    return wrapped


NAMESPACE = {
    "add": _scalar_safe(fp32.add),
    "sub": _scalar_safe(fp32.sub),
    "mul": _scalar_safe(fp32.mul),
    "fma": _scalar_safe(fp32.fma),
    "div": _scalar_safe(fp32.div),
    "sqrt": _scalar_safe(fp32.sqrt),
    "neg": _scalar_safe(fp32.neg),
    "sign": _scalar_safe(_sign),
    "where": _where,
    "isfinite": _scalar_safe(_isfinite),
}


@functools.lru_cache(maxsize=None)
def bind_rule(rule: Rule):
    return rule.bind(NAMESPACE)


@functools.lru_cache(maxsize=None)
def bind_guarded(rule: Rule):
    return rule.bind_guarded(NAMESPACE)
