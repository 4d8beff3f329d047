"""End to end on the GPU: training with the fused Triton kernels equals training on a materialized
weight gradient, bit for bit, in every regime, with the training semantics of the CPU tests.

The reference optimizer (``Materialized`` below) is forge_num with another backend: each Linear's
dW is *stored* by the kernel's own mainloop (``kernels.linear_mainloop``, the accumulator the fused
kernel holds in registers), and the rule is then applied to that stored gradient by the torch
backend's exact fp32 ops (``forge_num.torch_backend``: IEEE add/mul/div of CUDA, sqrt and fma
correctly rounded through binary64) — an implementation of the epilogue that shares no code with
the Triton one but the rule's definition. So each test checks, on real models, that folding the
update into the GEMM changes nothing: the same losses, weights and states at every step
(proofs/fusion.md). Why not torch.optim.AdamW on CUDA as the reference: torch's CUDA op order for
AdamW differs from its CPU order (up to 1926 ulp on the weight, bench/results/2026-12-02-h200), and
cuBLAS's dW sums in another order than any Triton mainloop; the CPU tests
(test_training_semantics.py) hold forge_num to torch.optim bit for bit where both are exact.

Run on the H200: ``pytest -m gpu tests/test_gpu_training.py``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import forge_num as fn
from forge_num import torch_backend
from forge_num.fused import prepare
from tests.test_training_semantics import ADAMW, TwiceNet, batches, lm_loss, tiny_gpt2, tiny_llama

pytestmark = [pytest.mark.gpu]
CUDA = torch.device("cuda")


class Materialized:
    """A forge_num backend that stores dW (the kernels' own mainloop) and applies the rule to it by
    torch ops. Norm-only passes and accumulation use the kernels, as the fused path does."""

    @staticmethod
    def fused_linear_update(weight, x, dy, states, rule, h, *, grad_scale=1.0, accum=None, seed=None, counter=None):
        from forge_num import kernels

        grad = kernels.linear_mainloop(x, dy, accum=accum)
        if any(hasattr(s, "codes") for s in states):  # 8bit: whole quantization blocks (rows)
            return torch_backend.fused_linear_update(weight, x[:0], dy[:0], states, rule, h,
                                                     grad_scale=grad_scale, accum=grad, seed=seed, counter=counter)
        return torch_backend.elementwise_update(weight, grad, states, rule, h, grad_scale=grad_scale, seed=seed,
                                                counter=counter)

    @staticmethod
    def elementwise_update(param, grad, states, rule, h, *, grad_scale=1.0, seed=None, counter=None):
        return torch_backend.elementwise_update(param, grad, states, rule, h, grad_scale=grad_scale, seed=seed,
                                                counter=counter)

    @staticmethod
    def weight_grad_norm_sq(x, dy, accum=None):
        from forge_num import kernels

        return kernels.weight_grad_norm_sq(x, dy, accum=accum)

    @staticmethod
    def accumulate_weight_grad(x, dy, accum):
        from forge_num import kernels

        kernels.accumulate_weight_grad(x, dy, accum)


def _cuda_batches(n, micro=1, **kw):
    return [[ids.to(CUDA) for ids in m] for m in batches(n, micro=micro, **kw)]


def _train(model, opt, data, autocast=False, loss_fn=lm_loss):
    losses = []
    for micro in data:
        for ids in micro:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(model, ids) / len(micro)
            loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses


def _state_tensors(opt):
    out = []
    for p in opt.state:
        for k, v in sorted(opt.state[p].items()):
            if isinstance(v, dict):
                out += [(k, v[f]) for f in sorted(v)]
            elif isinstance(v, torch.Tensor) and v.dim() > 0:
                out.append((k, v))
    return out


def _bits(t):
    """The stored bits (so -0 != +0 and NaN payloads count)."""
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}.get(t.dtype, t.dtype))


def _assert_same(m1, o1, m2, o2):
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert a.dtype == b.dtype and torch.equal(_bits(a), _bits(b)), (
            f"{n}: max |diff| {(a.float() - b.float()).abs().max().item():.3e}")
    s1, s2 = _state_tensors(o1), _state_tensors(o2)
    assert len(s1) == len(s2) > 0
    for (k, a), (_, b) in zip(s1, s2):
        assert torch.equal(_bits(a), _bits(b)), f"state {k} differs"


OPTS = {
    "adamw": lambda ps, **kw: fn.AdamW(ps, **ADAMW, **kw),
    "sgd": lambda ps, **kw: fn.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, **kw),
    "lion": lambda ps, **kw: fn.Lion(ps, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, **kw),
}

CASES = [  # (model, optimizer, precision, autocast)
    ("llama", "adamw", "fp32", False),
    ("llama", "adamw", "fp32", True),
    ("gpt2", "adamw", "fp32", False),
    ("gpt2", "adamw", "fp32", True),
    ("llama", "sgd", "fp32", False),
    ("llama", "lion", "fp32", True),
    ("llama", "adamw", "bf16-sr", False),
    ("llama", "adamw", "8bit", False),
    ("gpt2", "lion", "bf16-sr", False),
]


@pytest.mark.parametrize("model,kind,precision,autocast", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_fused_kernels_equal_materialized_gradient_end_to_end(model, kind, precision, autocast):
    build = {"llama": tiny_llama, "gpt2": tiny_gpt2}[model]
    m1 = build().to(CUDA)
    if precision != "fp32":
        m1 = m1.to(torch.bfloat16)
    m2 = copy.deepcopy(m1)
    init = {n: p.detach().clone() for n, p in m1.named_parameters()}
    extra = {} if precision == "fp32" else {"precision": precision, "seed": 7}
    o1 = OPTS[kind](m1.parameters(), **extra)
    o2 = OPTS[kind](m2.parameters(), backend=Materialized, **extra)
    prepare(m1, o1)
    prepare(m2, o2)
    # every Linear (Conv1D) of the 2 blocks takes the fused path: q, k, v, o, gate, up, down (llama),
    # c_attn, attn c_proj, c_fc, mlp c_proj (gpt2; its head is tied to the embedding)
    assert len(m1._forge_num_handle.fused) >= {"llama": 14, "gpt2": 8}[model]
    data = _cuda_batches(12 if precision == "fp32" else 6)
    l1 = _train(m1, o1, data, autocast)
    l2 = _train(m2, o2, data, autocast)
    assert l1 == l2
    _assert_same(m1, o1, m2, o2)
    params = dict(m1.named_parameters())  # it trained: every fused layer's weight moved
    moved = [n for n in m1._forge_num_handle.fused if not torch.equal(params[n + ".weight"], init[n + ".weight"])]
    assert moved == list(m1._forge_num_handle.fused)


def test_resume_at_step_10_equals_uninterrupted_and_runs_repeat():
    data = _cuda_batches(20)

    def fresh():
        m = tiny_llama().to(CUDA)
        o = fn.AdamW(m.parameters(), max_grad_norm=1.0, clipping="previous", **ADAMW)
        s = torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20)
        prepare(m, o)
        return m, o, s

    def run(m, o, s, part):
        out = []
        for micro in part:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = lm_loss(m, micro[0])
            loss.backward()
            o.step()
            s.step()
            out.append(loss.item())
        return out

    m1, o1, s1 = fresh()
    full = run(m1, o1, s1, data)
    m2, o2, s2 = fresh()
    first = run(m2, o2, s2, data[:10])
    ckpt = copy.deepcopy((m2.state_dict(), o2.state_dict(), s2.state_dict()))
    m3, o3, s3 = fresh()
    m3.load_state_dict(ckpt[0])
    o3.load_state_dict(ckpt[1])
    s3.load_state_dict(ckpt[2])
    assert first + run(m3, o3, s3, data[10:]) == full
    _assert_same(m1, o1, m3, o3)
    m4, o4, s4 = fresh()
    assert run(m4, o4, s4, data) == full  # two runs with one seed
    _assert_same(m1, o1, m4, o4)


@pytest.mark.parametrize("clip,micro", [(None, 4), ("exact", 1), ("exact", 3), ("previous", 2)],
                         ids=["accum4", "clip", "clip-accum3", "previous-accum2"])
def test_clipping_and_accumulation_equal_materialized(clip, micro):
    m1 = tiny_llama().to(CUDA)
    m2 = copy.deepcopy(m1)
    kw = dict(max_grad_norm=0.5 if clip else None, accumulation_steps=micro, **ADAMW)
    if clip == "previous":
        kw["clipping"] = "previous"
    o1, o2 = fn.AdamW(m1.parameters(), **kw), fn.AdamW(m2.parameters(), backend=Materialized, **kw)
    prepare(m1, o1)
    prepare(m2, o2)
    data = _cuda_batches(4, micro=micro)
    backward = (lambda o: o.backward) if clip == "exact" else (lambda o: lambda loss: loss.backward())
    for opt, model in ((o1, m1), (o2, m2)):
        for step in data:
            for ids in step:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = lm_loss(model, ids) / micro
                backward(opt)(loss)
            opt.step()
    _assert_same(m1, o1, m2, o2)
    assert o1.stats["step"] == 4
    if clip:
        assert min(h["clip_coef"] or 1.0 for h in o1.stats_history) < 1  # None: no coefficient yet
        assert [h["clip_coef"] for h in o1.stats_history] == [h["clip_coef"] for h in o2.stats_history]


def test_module_called_twice_and_tied_weights():
    torch.manual_seed(0)
    m1 = TwiceNet().to(CUDA)
    m2 = copy.deepcopy(m1)
    o1, o2 = fn.AdamW(m1.parameters(), **ADAMW), fn.AdamW(m2.parameters(), backend=Materialized, **ADAMW)
    prepare(m1, o1)
    prepare(m2, o2)
    assert m1._forge_num_handle.tied == ["out"] and "mid" in m1._forge_num_handle.fused
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        ids = torch.randint(0, 50, (4, 7), generator=g).to(CUDA)
        l1, l2 = m1(ids), m2(ids)
        l1.backward()
        l2.backward()
        o1.step()
        o2.step()
        assert l1.item() == l2.item()
    _assert_same(m1, o1, m2, o2)


def test_injected_nonfinite_gradients_leave_weights_finite_and_unchanged_there():
    m1 = tiny_llama().to(CUDA)
    m2 = copy.deepcopy(m1)
    o1, o2 = fn.AdamW(m1.parameters(), **ADAMW), fn.AdamW(m2.parameters(), backend=Materialized, **ADAMW)
    prepare(m1, o1)
    prepare(m2, o2)
    ids = _cuda_batches(1)[0][0]
    before = {n: p.detach().clone() for n, p in m1.named_parameters()}

    def poisoned_step(model, opt):
        layer = model.model.layers[1].mlp.down_proj  # dY[0, 3, 5] = inf: dW row 5 and every upstream grad
        handle = layer.register_full_backward_pre_hook(
            lambda mod, gout: (gout[0].index_put(tuple(torch.tensor([i], device=CUDA) for i in (0, 3, 5)),
                                                 torch.tensor(float("inf"), device=CUDA)),))
        lm_loss(model, ids).backward()
        handle.remove()
        opt.step()

    poisoned_step(m1, o1)
    poisoned_step(m2, o2)
    assert o1.stats["nonfinite"] == o2.stats["nonfinite"] > 0
    changed = 0
    for n, p in m1.named_parameters():
        assert torch.isfinite(p).all(), n
        changed += int((p != before[n]).sum())
    assert m1.model.layers[1].mlp.down_proj.weight[5].equal(before["model.layers.1.mlp.down_proj.weight"][5])
    _assert_same(m1, o1, m2, o2)  # elsewhere the update of the finite gradient, as materialized
    assert changed > 0


# gpt2's tied head in the stochastic regimes: its update split between the head's backward and the
# embedding's (forge_num.fused._SplitHeadUpdate; gathered rows with their own counters in the kernels)
CHUNKED_CASES = [("llama", "fp32", True), ("llama", "8bit", False), ("gpt2", "fp32", True), ("gpt2", "8bit", False),
                 ("gpt2", "bf16-sr", False)]


@pytest.mark.parametrize("model,precision,autocast", CHUNKED_CASES, ids=["-".join(map(str, c)) for c in CHUNKED_CASES])
def test_chunked_loss_fused_head_equals_materialized(model, precision, autocast):
    """forge_num.hf.causal_lm_loss (the logits in chunks of 5 rows): the LM head's dY goes to the fused
    kernel (llama) or to autograd (gpt2's tied head), and training equals the materialized reference
    on the same loss, bit for bit."""
    from forge_num.hf import causal_lm_loss

    build = {"llama": tiny_llama, "gpt2": tiny_gpt2}[model]
    m1 = build().to(CUDA)
    if precision != "fp32":
        m1 = m1.to(torch.bfloat16)
    m2 = copy.deepcopy(m1)
    extra = {} if precision == "fp32" else {"precision": precision, "seed": 7}
    o1 = OPTS["adamw"](m1.parameters(), **extra)
    o2 = OPTS["adamw"](m2.parameters(), backend=Materialized, **extra)
    prepare(m1, o1)
    prepare(m2, o2)
    assert ("lm_head" in m1._forge_num_handle.fused) == (model == "llama")
    data = _cuda_batches(6)
    loss = lambda m, ids: causal_lm_loss(m, ids, chunk_rows=5)  # noqa: E731
    assert _train(m1, o1, data, autocast, loss) == _train(m2, o2, data, autocast, loss)
    _assert_same(m1, o1, m2, o2)


@pytest.mark.parametrize("precision", ["8bit", "bf16-sr"])
def test_tied_split_backward_does_not_wait_for_the_device(precision, monkeypatch):
    """gpt2's tied head in a stochastic regime (the update split by rows, v26): with the tokens sorted in
    the embedding's forward (v30), nothing in the backward waits for the device (CUDA's sync debug mode
    raises at any synchronizing call), so the host keeps issuing the layers' backward while the loss's
    chunks run. The step's end (opt.step(): the telemetry's one transfer) may wait."""
    from forge_num import fused
    from forge_num.hf import causal_lm_loss

    splits = []
    apply_head = fused._SplitHeadUpdate.apply_head
    monkeypatch.setattr(fused._SplitHeadUpdate, "apply_head",
                        lambda self, *a: (splits.append(1), apply_head(self, *a)))
    m = tiny_gpt2().to(CUDA).to(torch.bfloat16)
    opt = OPTS["adamw"](m.parameters(), precision=precision, seed=7)
    prepare(m, opt)
    data = _cuda_batches(2)
    causal_lm_loss(m, data[0][0], chunk_rows=5).backward()  # the first step creates the state
    opt.step()
    loss = causal_lm_loss(m, data[1][0], chunk_rows=5)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    opt.step()
    assert opt.stats["nonfinite"] == 0 and len(splits) == 2  # both steps split the head's update


@pytest.mark.parametrize("precision", ["fp32", "8bit"])
def test_training_step_does_not_wait_for_the_device(precision):
    """A Llama step whose backward and opt.step() never synchronize with the device (CUDA's sync debug
    mode raises at any synchronizing call; it does not count an event's wait, which step() makes for
    the previous step's totals only): step() leaves its telemetry totals in flight (one copy to a
    pinned buffer and an event), read at the next step() or when opt.stats is asked for. The history
    equals that of an optimizer with nonfinite="raise", which reads its totals in step() (it must, to
    raise), and the two trainings stay bitwise equal. The untied model: a tied embedding in a
    stochastic regime sorts the batch's tokens in its forward (v30), a wait of its own."""
    data = _cuda_batches(3)
    models, opts = [], []
    for nonfinite in ("skip", "raise"):
        m = tiny_llama(tie=False).to(CUDA)
        if precision != "fp32":
            m = m.to(torch.bfloat16)
        opt = OPTS["adamw"](m.parameters(), precision=precision, seed=11, nonfinite=nonfinite)
        prepare(m, opt)
        models.append(m), opts.append(opt)
    for step, micro in enumerate(data):
        for m, opt in zip(models, opts):
            loss = lm_loss(m, micro[0])  # transformers' forward is not forge_num's to vouch for
            torch.cuda.synchronize()
            if opt.nonfinite == "skip" and step > 0:  # the first step creates the state (allocations)
                torch.cuda.set_sync_debug_mode("error")
            try:
                loss.backward()
                opt.step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
    # read only now: each step's totals waited in the next step() (the pinned buffer's reuse), the last
    # step's here
    history = opts[0].stats_history
    assert history == opts[1].stats_history and [s["step"] for s in history] == [1, 2, 3]
    assert all(math.isfinite(s["grad_norm"]) and s["nonfinite"] == 0 for s in history)
    _assert_same(models[0], opts[0], models[1], opts[1])
