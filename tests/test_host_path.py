"""The launcher's host-side shortcut (kernels/__init__.py): the input checks' fast path must give
what the long way gives (every bad input its error), and the telemetry stays each launch's own."""

from __future__ import annotations

import copy
import math
import types
import os
import sys

import pytest
import torch

import forge_num as fn
from forge_num import kernels, rules
from forge_num.fused import prepare

pytestmark = pytest.mark.interpreter

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("interpreter tests run where there is no GPU (TRITON_INTERPRET=1)", allow_module_level=True)

KM = sys.modules["forge_num.kernels"]
ADAMW = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
H = rules.ADAMW.scalars(ADAMW, 1)


def _problem(seed, M=33, N=17, K=9):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(M, N, generator=g)
    return w, torch.randn(K, N, generator=g), torch.randn(K, M, generator=g), [torch.zeros(M, N), torch.zeros(M, N)]


def _norm_sq(x, dy):
    return float((dy.double().t() @ x.double()).square().sum())


def _ptrs(stats):
    return tuple(t.data_ptr() for t in stats.partials)


def test_elementwise_update_telemetry():
    g = torch.Generator().manual_seed(3)
    p = torch.randn(3000, generator=g)
    grads = [torch.randn(3000, generator=g) for _ in range(2)]
    grads[1][7] = math.inf
    kept = [kernels.elementwise_update(p.clone(), gr, [torch.zeros(3000), torch.zeros(3000)], rules.ADAMW, H)
            for gr in grads]
    assert len({_ptrs(st) for st in kept}) == 2
    assert float(kept[0].norm_sq) == pytest.approx(float(grads[0].double().square().sum()), rel=1e-12)
    assert int(kept[0].nonfinite) == 0 and int(kept[1].nonfinite) == 1
    empty = kernels.elementwise_update(torch.zeros(0), torch.zeros(0), [torch.zeros(0)] * 2, rules.ADAMW, H)
    assert float(empty.norm_sq) == 0 and int(empty.nonfinite) == 0


def test_training_steps_report_every_layers_telemetry():
    """Four Linear layers of one shape, each gradient a different size: the step's norm and
    non-finite count are every layer's own, step after step."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(16, 16, bias=False) for _ in range(4)])
    plain = copy.deepcopy(net)  # the reference gradients; lr = 0 keeps the weights equal
    opt = fn.SGD(net.parameters(), lr=0.0, backend="kernels", nonfinite="skip")
    prepare(net, opt)
    scale = [1.0, 10.0, 100.0, 1000.0]  # each layer's gradient a different size

    def loss(model, x, poison):
        for k, lin in enumerate(model):
            x = lin(x) * scale[k]
        if poison:  # one non-finite dY element in the last layer, spreading to the earlier ones
            x.register_hook(lambda g: g.index_put((torch.tensor([2]), torch.tensor([3])), torch.tensor(math.inf)))
        return x.sum()

    for step in range(3):
        x = torch.randn(5, 16)
        loss(net, x, step == 1).backward()
        opt.step()
        loss(plain, x, step == 1).backward()
        grads = [lin.weight.grad.double() for lin in plain]
        plain.zero_grad(set_to_none=True)
        bad = sum(int((~g.isfinite()).sum()) for g in grads)
        assert opt.stats["nonfinite"] == bad and (bad > 16) == (step == 1)
        if not bad:
            expect = math.sqrt(sum(float(g.square().sum()) for g in grads))
            assert opt.stats["grad_norm"] == pytest.approx(expect, rel=1e-5)


# ------------------------------------------------------------------------------------------
# the checks' fast path
# ------------------------------------------------------------------------------------------


def _detailed_checks(w, x, dy, states, rule, h, grad_scale, seed=None, accum=None):
    """fused_linear_update's checks as they were before the fast path (commit 452d5f5)."""
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got shape {tuple(w.shape)}")
    KM._check_regime("weight", w, seed)
    KM._check_fp32_like("weight", w, w, w.dtype)
    M, N = w.shape
    KM._check_linear_inputs(x, dy, M, N)
    q8 = any(KM._is_q8(st) for st in states)
    if q8:
        states = KM._check_q8_states(states, w, rule)
        KM._check_device(w, x, dy, *(t for st in states for t in st))
    else:
        states = KM._check_states(states, w, rule)
    KM._check_scalars(rule, tuple(h) if not isinstance(h, tuple) else h + (), grad_scale)
    if accum is not None:
        KM._check_fp32_like("accum", accum, w)
    KM._check_device(w, x, dy, *(t for t in (accum,) if t is not None), *(states if not q8 else ()))


def _variants():
    """Arguments of fused_linear_update, each one changed in a way a check must catch (or not)."""
    M, N, K = 6, 5, 4
    good = dict(w=torch.zeros(M, N), x=torch.zeros(K, N), dy=torch.zeros(K, M),
                s=[torch.zeros(M, N), torch.zeros(M, N)], h=H, scale=1.0, seed=None, accum=None)
    yield "good", {}
    yield "states as a tuple", dict(s=(torch.zeros(M, N), torch.zeros(M, N)))
    yield "one state", dict(s=[torch.zeros(M, N)])
    yield "no state", dict(s=[])
    yield "bf16 operands", dict(x=torch.zeros(K, N, dtype=torch.bfloat16), dy=torch.zeros(K, M, dtype=torch.bfloat16))
    yield "strided x", dict(x=torch.zeros(N, K).t())
    yield "no tokens", dict(x=torch.zeros(0, N), dy=torch.zeros(0, M))
    yield "weight float64", dict(w=torch.zeros(M, N, dtype=torch.float64))
    yield "weight 3-D", dict(w=torch.zeros(1, M, N))
    yield "weight transposed", dict(w=torch.zeros(N, M).t())
    yield "bf16 weight, no seed", dict(w=torch.zeros(M, N, dtype=torch.bfloat16))
    yield "bf16 weight and states", dict(w=torch.zeros(M, N, dtype=torch.bfloat16), seed=5,
                                         s=[torch.zeros(M, N, dtype=torch.bfloat16)] * 2)
    yield "bf16 weight, fp32 states", dict(w=torch.zeros(M, N, dtype=torch.bfloat16), seed=5)
    yield "x 3-D", dict(x=torch.zeros(1, K, N))
    yield "dy 1-D", dict(dy=torch.zeros(K * M))
    yield "x float16", dict(x=torch.zeros(K, N, dtype=torch.float16), dy=torch.zeros(K, M, dtype=torch.float16))
    yield "x bf16 dy fp32", dict(x=torch.zeros(K, N, dtype=torch.bfloat16))
    yield "tokens differ", dict(dy=torch.zeros(K + 1, M))
    yield "x features", dict(x=torch.zeros(K, N + 1))
    yield "dy features", dict(dy=torch.zeros(K, M + 1))
    yield "x and dy swapped", dict(x=torch.zeros(K, M), dy=torch.zeros(K, N))
    yield "state shape", dict(s=[torch.zeros(M, N), torch.zeros(N, M)])
    yield "state dtype", dict(s=[torch.zeros(M, N), torch.zeros(M, N, dtype=torch.float64)])
    yield "state not contiguous", dict(s=[torch.zeros(M, N), torch.zeros(N, M).t()])
    yield "three states", dict(s=[torch.zeros(M, N)] * 3)
    yield "state not a tensor", dict(s=[torch.zeros(M, N), 0.0])
    yield "states as a generator", dict(s=(torch.zeros(M, N) for _ in range(2)))
    yield "8bit states, fp32 weight", dict(s=[kernels.Q8State.zeros(M, N)] * 2)
    yield "8bit states", dict(w=torch.zeros(M, N, dtype=torch.bfloat16), seed=5, s=[kernels.Q8State.zeros(M, N)] * 2)
    w16 = torch.zeros(M, N, dtype=torch.bfloat16)
    q = kernels.Q8State.zeros(M, N)
    yield "8bit, one state as a tuple", dict(w=w16, seed=5, s=(q,))
    yield "8bit, no state", dict(w=w16, seed=5, s=[])
    yield "8bit, three states", dict(w=w16, seed=5, s=[q] * 3)
    yield "8bit, no seed", dict(w=w16, s=[q] * 2)
    yield "8bit, codes int8", dict(w=w16, seed=5, s=[q, q._replace(codes=q.codes.to(torch.int8))])
    yield "8bit, codes shape", dict(w=w16, seed=5, s=[q, q._replace(codes=torch.zeros(N, M, dtype=torch.uint8))])
    yield "8bit, codes strided", dict(w=w16, seed=5, s=[q, q._replace(codes=torch.zeros(N, M, dtype=torch.uint8).t())])
    yield "8bit, scales shape", dict(w=w16, seed=5, s=[q, q._replace(scales=torch.ones(M, 2))])
    yield "8bit, scales float64", dict(w=w16, seed=5, s=[q, q._replace(scales=q.scales.double())])
    yield "8bit, scales strided", dict(w=w16, seed=5, s=[q, q._replace(scales=torch.ones(M, 2)[:, :1])])
    yield "8bit, a state not a tuple", dict(w=w16, seed=5,
                                            s=[q, types.SimpleNamespace(codes=q.codes, scales=q.scales)])
    yield "8bit and a plain state", dict(w=w16, seed=5, s=[q, torch.zeros(M, N, dtype=torch.bfloat16)])
    yield "8bit states as a generator", dict(w=w16, seed=5, s=(kernels.Q8State.zeros(M, N) for _ in range(2)))
    yield "8bit, weight transposed", dict(w=torch.zeros(N, M, dtype=torch.bfloat16).t(), seed=5, s=[q] * 2)
    yield "8bit, bad x", dict(w=w16, seed=5, s=[q] * 2, x=torch.zeros(K, N + 1))
    yield "8bit, bad scalar", dict(w=w16, seed=5, s=[q] * 2, h=(math.inf,) + H[1:])
    yield "8bit, bad grad_scale", dict(w=w16, seed=5, s=[q] * 2, scale=math.nan)
    yield "8bit, accum", dict(w=w16, seed=5, s=[q] * 2, accum=torch.zeros(M, N))
    yield "scalar inf", dict(h=(math.inf,) + H[1:])
    yield "scalar nan, a list", dict(h=[math.nan] + list(H[1:]))
    yield "too few scalars", dict(h=H[:-1])
    yield "grad_scale nan", dict(scale=math.nan)
    yield "grad_scale < 0", dict(scale=-1.0)
    yield "accum", dict(accum=torch.zeros(M, N))
    yield "accum shape", dict(accum=torch.zeros(N, M))
    yield "accum bf16", dict(accum=torch.zeros(M, N, dtype=torch.bfloat16))
    yield "bad scalar and bad state", dict(h=(math.inf,) + H[1:], s=[torch.zeros(M, N), torch.zeros(N, M)])
    yield "bad x and bad scalar", dict(x=torch.zeros(K, N + 1), scale=math.nan)
    _ = good


VARIANTS = list(_variants())


def _args(change):
    M, N, K = 6, 5, 4
    a = dict(w=torch.zeros(M, N), x=torch.zeros(K, N), dy=torch.zeros(K, M),
             s=[torch.zeros(M, N), torch.zeros(M, N)], h=H, scale=1.0, seed=None, accum=None)
    a.update(change)
    return a


def _error(fn_, *args, **kwargs):
    try:
        fn_(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None


@pytest.mark.parametrize("name,change", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_input_gets_the_detailed_checks_answer(name, change):
    """The same error (type and message) as the detailed checks, or none where they pass; and the
    fast path says yes only where every detailed check passes."""
    a = _args(change)
    if name.endswith("states as a generator"):  # consumed once per call: each call gets its own
        states = list(a["s"])
        a["s"] = iter(states)
        want = _error(_detailed_checks, a["w"], a["x"], a["dy"], states, rules.ADAMW, a["h"],
                      a["scale"], a["seed"], a["accum"])
    else:
        want = _error(_detailed_checks, a["w"], a["x"], a["dy"], a["s"], rules.ADAMW, a["h"], a["scale"],
                      a["seed"], a["accum"])
        if KM._plain_linear_ok(a["w"], a["x"], a["dy"], a["s"], rules.ADAMW):
            assert a["w"].dim() == 2
            assert _error(KM._check_fp32_like, "weight", a["w"], a["w"], a["w"].dtype) is None
            assert _error(KM._check_linear_inputs, a["x"], a["dy"], *a["w"].shape) is None
            assert _error(KM._check_states, a["s"], a["w"], rules.ADAMW) is None
        if KM._plain_q8_linear_ok(a["w"], a["x"], a["dy"], a["s"], rules.ADAMW):
            assert a["w"].dim() == 2
            assert _error(KM._check_fp32_like, "weight", a["w"], a["w"], a["w"].dtype) is None
            assert _error(KM._check_linear_inputs, a["x"], a["dy"], *a["w"].shape) is None
            assert _error(KM._check_q8_states, a["s"], a["w"], rules.ADAMW) is None
    got = _error(kernels.fused_linear_update, a["w"], a["x"], a["dy"], a["s"], rules.ADAMW, a["h"],
                 grad_scale=a["scale"], seed=a["seed"], accum=a["accum"])
    assert got == want


def test_checks_are_not_remembered_across_calls():
    """A call that passed does not vouch for the next: the same list of scalars or states, changed
    in place, is checked again."""
    w, x, dy, s = _problem(0)
    h = list(H)
    kernels.fused_linear_update(w, x, dy, s, rules.ADAMW, h)
    h[2] = math.inf
    with pytest.raises(ValueError, match="is not finite"):
        kernels.fused_linear_update(w, x, dy, s, rules.ADAMW, h)
    kernels.fused_linear_update(w, x, dy, s, rules.ADAMW, H)  # H is now the remembered tuple
    with pytest.raises(ValueError, match="is not finite"):
        kernels.fused_linear_update(w, x, dy, s, rules.ADAMW, (math.nan,) + H[1:])
    with pytest.raises(ValueError, match="scalars"):
        kernels.fused_linear_update(w, x, dy, s[:1], rules.SGD, H)  # the same h, another rule
    s[1] = s[1].t().contiguous().t()  # the same list, a state now strided
    with pytest.raises(ValueError, match="contiguous"):
        kernels.fused_linear_update(w, x, dy, s, rules.ADAMW, H)
    s[1] = torch.zeros_like(w)
    w.resize_(w.shape[0] + 1, w.shape[1])  # the same weight object, a new shape
    with pytest.raises(ValueError, match="features"):
        kernels.fused_linear_update(w, x, dy, s, rules.ADAMW, H)


def test_the_device_check_falls_back_to_the_detailed_one(monkeypatch):
    """Off the interpreter, anything but one CUDA device gets _check_device's error."""
    monkeypatch.setattr(KM, "_interpreting", lambda: False)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        KM._check_one_device(torch.zeros(2), torch.zeros(2))
    meta = torch.zeros(2, device="meta")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        KM._check_one_device(meta, torch.zeros(2))
