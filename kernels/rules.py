"""The rules of forge_num.rules bound to Triton ops (kernels/ieee.py), as jit functions.

``guarded_update_jit(rule)`` is the jit function ``(p, g, s0, s1, h, grad_scale) -> (p, s0, s1,
finite)`` that the fused epilogue and the element-wise kernel call: the text of
forge_num.rules.guarded_update around the rule's own text, both executed by Triton.
"""

from __future__ import annotations

import functools

import triton

from forge_num.rules import Rule

from .ieee import NAMESPACE


@functools.lru_cache(maxsize=None)
def guarded_update_jit(rule: Rule):
    return rule.bind_guarded(NAMESPACE, triton.jit)
