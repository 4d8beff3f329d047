"""Update rules: each one written once, as an ordered sequence of correctly rounded fp32 operations.

This module is the single definition of every optimizer rule in forge_num. It imports nothing but
the standard library. A rule is a plain Python function over an *op vocabulary*:

    add(a, b)      a + b, rounded once (round to nearest even)
    sub(a, b)      a - b, rounded once
    mul(a, b)      a * b, rounded once
    fma(a, b, c)   a * b + c, rounded once
    div(a, b)      a / b, rounded once (IEEE division, never the approximate one)
    sqrt(a)        square root, rounded once (IEEE, never the approximate one)
    neg(a)         -a (exact)
    sign(a)        +1, -1 or 0 (the sign of a zero is kept), NaN for NaN
    where(c, a, b) element-wise select (exact)
    isfinite(a)    a is neither infinite nor NaN

and nothing else: no operator on floats appears in a rule body, so no compiler can contract or
reorder it. The same function object is *bound* to three vocabularies:

    kernels/rules.py      Triton jit functions (GPU, and the Triton interpreter)
    emulator/rules.py     NumPy, exact (forge_num.emulator)
    forge_num/torch_ops   torch tensors (the CPU/any-device backend)

by rebinding its global names (``Rule.bind``), so the kernel epilogue, the element-wise kernel,
the emulator and the torch backend all execute this text, op for op.

Every rule has the same signature ``update(p, g, s0, s1, h) -> (p, s0, s1)``: the parameter, the
(fp32) gradient, two state slots (a rule with one state leaves ``s1`` untouched) and ``h``, the
tuple of per-step fp32 scalars that ``Rule.scalars(hyper, step)`` computes on the host. Host
scalars are computed in binary64, in the order torch.optim computes them, and rounded to fp32 once
(``f32``): the kernels receive exactly representable fp32 values.

The op orders reproduce torch.optim's single-tensor (``foreach=False``) CPU implementation, read
from torch 2.13's optimizer code and its ATen kernels, and checked by tests/test_torch_parity.py:

* ``t.lerp_(end, w)`` is ``fma(w, end - t, t)`` for |w| < 0.5 and ``fma(w - 1, end - t, end)``
  otherwise (ATen's ``lerp_vec``);
* ``t.add_(o, alpha=a)`` is ``fma(o, a, t)`` (ATen's vectorised ``add`` is ``fmadd(o, alpha, t)``);
* ``t.addcmul_(a, b, value=c)`` is ``fma(c * a, b, t)``;
* ``t.addcdiv_(a, b, value=c)`` is ``t + (c * a) / b``;
* ``t.mul_(s)`` with a Python float ``s`` is ``t * fp32(s)``.

torch's own CPU ``sqrt`` on float32 is *not* correctly rounded (about 0.7% of inputs are one ulp
off in torch 2.13); forge_num's rules use the IEEE square root, so parity with torch is exact only
when torch's sqrt is made correctly rounded (tests do so; proofs/rules.md bounds the difference
otherwise).
"""

from __future__ import annotations

import math
import struct
import types
from dataclasses import dataclass, field
from typing import Callable, Mapping

__all__ = [
    "Rule",
    "RULES",
    "ADAMW",
    "ADAM",
    "SGD",
    "LION",
    "VOCABULARY",
    "guarded_update",
    "f32",
    "get_rule",
]

# The names a rule body may use; each binding must provide all of them.
VOCABULARY = ("add", "sub", "mul", "fma", "div", "sqrt", "neg", "sign", "where", "isfinite")


def f32(x: float) -> float:
    """Round a binary64 value to the nearest binary32 value (ties to even); overflow is an error."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"host scalar {x!r} is not finite")
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError as e:  # |x| beyond the binary32 range
        raise ValueError(f"host scalar {x!r} overflows fp32") from e


def _finite(name: str, value) -> float:
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"hyper-parameter {name}={value!r} is not finite")
    return v


@dataclass(frozen=True)
class Rule:
    """One optimizer rule: its op program, its state names and its per-step host scalars."""

    name: str
    update: Callable  # update(p, g, s0, s1, h) -> (p, s0, s1), over the op vocabulary
    state: tuple[str, ...]  # names of the state tensors (torch.optim state_dict keys), at most 2
    scalar_names: tuple[str, ...]  # names of the entries of h, in order
    _scalars: Callable = field(repr=False)  # (hyper: Mapping, step: int) -> tuple of binary64

    def scalars(self, hyper: Mapping, step: int) -> tuple[float, ...]:
        """The fp32 per-step scalars ``h`` for 1-based ``step``."""
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step}")
        values = self._scalars(hyper, step)
        assert len(values) == len(self.scalar_names)
        return tuple(f32(v) for v in values)

    def state_slots(self, hyper: Mapping) -> int:
        """How many state tensors this rule keeps under ``hyper`` (SGD without momentum keeps none)."""
        if self.name == "sgd" and float(hyper.get("momentum", 0.0)) == 0.0:
            return 0
        return len(self.state)

    def bind(self, namespace: Mapping, function=None) -> types.FunctionType:
        """A copy of ``function`` (default: this rule's update) whose op names resolve in ``namespace``."""
        fn = self.update if function is None else function
        missing = [n for n in VOCABULARY if n not in namespace]
        if missing:
            raise KeyError(f"op vocabulary lacks {missing}")
        glb = {"__builtins__": __builtins__, "__name__": fn.__module__, **namespace}
        return types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)

    def bind_guarded(self, namespace: Mapping, wrap: Callable = lambda fn: fn):
        """``guarded_update`` around this rule, both bound to ``namespace``; ``wrap`` (``triton.jit``
        for the kernels) is applied to each bound function. The one composition every backend uses."""
        inner = wrap(self.bind(namespace))
        return wrap(self.bind({**namespace, "rule_update": inner}, guarded_update))


# --------------------------------------------------------------------------------------------
# AdamW (decoupled weight decay) and Adam (L2 weight decay), as torch.optim.adam._single_tensor_adam
#
#   p <- p * (1 - lr*wd)                                    [AdamW only]
#   g <- g + wd * p                                         [Adam only, if wd != 0]
#   m <- lerp(m, g, 1 - beta1)
#   v <- v * beta2 + (1 - beta2) * g * g
#   p <- p + (-lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
# --------------------------------------------------------------------------------------------


def adamw_update(p, g, m, v, h):
    decay, l2, lerp_weight, lerp_from_m, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps = h
    p = mul(p, decay)  # noqa: F821  torch: param.mul_(1 - lr * wd)  (decay == 1 when wd == 0)
    g = where(l2 != 0, fma(p, l2, g), g)  # noqa: F821  torch: grad.add(param, alpha=wd)  (Adam)
    d = sub(g, m)  # noqa: F821  torch: exp_avg.lerp_(grad, 1 - beta1)
    m = fma(lerp_weight, d, where(lerp_from_m != 0, m, g))  # noqa: F821
    v = fma(mul(one_minus_beta2, g), g, mul(v, beta2))  # noqa: F821  v.mul_(b2).addcmul_(g, g, 1-b2)
    denom = add(div(sqrt(v), bias_correction2_sqrt), eps)  # noqa: F821  (v.sqrt() / bc2_sqrt).add_(eps)
    p = add(p, div(mul(neg_step_size, m), denom))  # noqa: F821  p.addcdiv_(m, denom, value=-step_size)
    return p, m, v


def _adam_scalars(hyper: Mapping, step: int, decoupled: bool) -> tuple[float, ...]:
    lr = _finite("lr", hyper["lr"])
    beta1, beta2 = (_finite("betas", b) for b in hyper["betas"])
    eps = _finite("eps", hyper["eps"])
    wd = _finite("weight_decay", hyper.get("weight_decay", 0.0))
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"betas must lie in [0, 1), got {hyper['betas']}")
    if lr < 0.0 or eps < 0.0 or wd < 0.0:
        raise ValueError(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {wd}")
    decay = 1.0 - lr * wd if decoupled else 1.0
    l2 = 0.0 if decoupled else wd
    # ATen's lerp: weight w below 0.5 in magnitude -> fma(w, end - t, t); else fma(w - 1, end - t, end),
    # with w - 1 formed in fp32 (exact for w in [0.5, 1] by Sterbenz's lemma).
    w = f32(1.0 - beta1)
    lerp_from_m = abs(w) < 0.5
    lerp_weight = w if lerp_from_m else w - 1.0
    bias_correction1 = 1.0 - beta1 ** float(step)
    bias_correction2 = 1.0 - beta2 ** float(step)
    step_size = lr / bias_correction1
    return (
        decay,
        l2,
        lerp_weight,
        1.0 if lerp_from_m else 0.0,
        beta2,
        1.0 - beta2,
        -step_size,
        bias_correction2**0.5,
        eps,
    )


ADAMW = Rule(
    name="adamw",
    update=adamw_update,
    state=("exp_avg", "exp_avg_sq"),
    scalar_names=("decay", "l2", "lerp_weight", "lerp_from_m", "beta2", "one_minus_beta2",
                  "neg_step_size", "bias_correction2_sqrt", "eps"),
    _scalars=lambda hyper, step: _adam_scalars(hyper, step, decoupled=True),
)

ADAM = Rule(
    name="adam",
    update=adamw_update,  # the same program: decay == 1 and l2 == wd
    state=("exp_avg", "exp_avg_sq"),
    scalar_names=ADAMW.scalar_names,
    _scalars=lambda hyper, step: _adam_scalars(hyper, step, decoupled=False),
)


# --------------------------------------------------------------------------------------------
# SGD with momentum, dampening, Nesterov and L2 weight decay, as torch.optim.sgd._single_tensor_sgd
#
#   g <- g + wd * p                                   [if wd != 0]
#   b <- g                                            [first step]
#   b <- b * momentum + (1 - dampening) * g           [later steps]
#   g <- g + momentum * b  (Nesterov)   or   g <- b
#   p <- p - lr * g
# Without momentum there is no state and g is used directly (first == 1, nesterov == 0).
# --------------------------------------------------------------------------------------------


def sgd_update(p, g, b, unused, h):
    neg_lr, weight_decay, momentum, one_minus_dampening, first, nesterov = h
    g = where(weight_decay != 0, fma(p, weight_decay, g), g)  # noqa: F821  grad.add(param, alpha=wd)
    b = where(first != 0, g, fma(g, one_minus_dampening, mul(b, momentum)))  # noqa: F821
    g = where(nesterov != 0, fma(b, momentum, g), b)  # noqa: F821  grad.add(buf, alpha=momentum)
    p = fma(g, neg_lr, p)  # noqa: F821  param.add_(grad, alpha=-lr)
    return p, b, unused


def _sgd_scalars(hyper: Mapping, step: int) -> tuple[float, ...]:
    lr = _finite("lr", hyper["lr"])
    momentum = _finite("momentum", hyper.get("momentum", 0.0))
    dampening = _finite("dampening", hyper.get("dampening", 0.0))
    wd = _finite("weight_decay", hyper.get("weight_decay", 0.0))
    nesterov = bool(hyper.get("nesterov", False))
    if lr < 0.0 or momentum < 0.0 or wd < 0.0:
        raise ValueError(f"lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, {wd}")
    if nesterov and (momentum <= 0.0 or dampening != 0.0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    first = step == 1 or momentum == 0.0
    return (-lr, wd, momentum, 1.0 - dampening, 1.0 if first else 0.0, 1.0 if nesterov else 0.0)


SGD = Rule(
    name="sgd",
    update=sgd_update,
    state=("momentum_buffer",),
    scalar_names=("neg_lr", "weight_decay", "momentum", "one_minus_dampening", "first", "nesterov"),
    _scalars=_sgd_scalars,
)


# --------------------------------------------------------------------------------------------
# Lion (Chen et al. 2023), as the reference implementation lion-pytorch:
#
#   p <- p * (1 - lr*wd)
#   c <- m * beta1 + (1 - beta1) * g
#   p <- p - lr * sign(c)
#   m <- m * beta2 + (1 - beta2) * g
# --------------------------------------------------------------------------------------------


def lion_update(p, g, m, unused, h):
    decay, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_lr = h
    p = mul(p, decay)  # noqa: F821  p.mul_(1 - lr * wd)
    c = fma(g, one_minus_beta1, mul(m, beta1))  # noqa: F821  m.clone().mul_(b1).add(g, alpha=1-b1)
    p = fma(sign(c), neg_lr, p)  # noqa: F821  p.add_(c.sign_(), alpha=-lr)
    m = fma(g, one_minus_beta2, mul(m, beta2))  # noqa: F821  m.mul_(b2).add_(g, alpha=1-b2)
    return p, m, unused


def _lion_scalars(hyper: Mapping, step: int) -> tuple[float, ...]:
    lr = _finite("lr", hyper["lr"])
    beta1, beta2 = (_finite("betas", b) for b in hyper["betas"])
    wd = _finite("weight_decay", hyper.get("weight_decay", 0.0))
    if not (0.0 <= beta1 <= 1.0 and 0.0 <= beta2 <= 1.0):
        raise ValueError(f"betas must lie in [0, 1], got {hyper['betas']}")
    if lr < 0.0 or wd < 0.0:
        raise ValueError(f"lr and weight_decay must be >= 0, got {lr}, {wd}")
    return (1.0 - lr * wd, beta1, 1.0 - beta1, beta2, 1.0 - beta2, -lr)


LION = Rule(
    name="lion",
    update=lion_update,
    state=("exp_avg",),
    scalar_names=("decay", "beta1", "one_minus_beta1", "beta2", "one_minus_beta2", "neg_lr"),
    _scalars=_lion_scalars,
)

RULES = {r.name: r for r in (ADAMW, ADAM, SGD, LION)}


def get_rule(name: str) -> Rule:
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"unknown rule {name!r}; known rules: {sorted(RULES)}") from None


# --------------------------------------------------------------------------------------------
# The guarded step: what every update path (fused epilogue, element-wise kernel, emulator, torch
# backend) applies around a rule. ``g`` is the fp32 gradient (the GEMM accumulator in the fused
# kernel); ``grad_scale`` is the clipping coefficient (1.0 when not clipping: g * 1 == g exactly).
#
#   g      <- g * grad_scale                  (torch.nn.utils.clip_grad_norm_ multiplies likewise)
#   finite <- g is finite
#   (p, s0, s1) <- rule(p, g, s0, s1)  where finite; unchanged where not
#
# A non-finite gradient element therefore never reaches the weight or the state.
# ``rule_update`` is bound per rule (Rule.bind(namespace, guarded_update)).
# --------------------------------------------------------------------------------------------


def guarded_update(p, g, s0, s1, h, grad_scale):
    g = mul(g, grad_scale)  # noqa: F821
    finite = isfinite(g)  # noqa: F821
    p_new, s0_new, s1_new = rule_update(p, g, s0, s1, h)  # noqa: F821
    p = where(finite, p_new, p)  # noqa: F821
    s0 = where(finite, s0_new, s0)  # noqa: F821
    s1 = where(finite, s1_new, s1)  # noqa: F821
    return p, s0, s1, finite
