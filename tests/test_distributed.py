"""forge_num inside torch.distributed (CPU, gloo, processes started with torch.multiprocessing).

What each test shows (fp32, bitwise, every parameter compared after a few steps):

* ``test_tensor_parallel[...]``: a tiny Llama-like model (RMSNorm, causal attention, SwiGLU MLP with
  a Colwise and a Rowwise bias, untied head) under ColwiseParallel/RowwiseParallel (``tp``) and with
  SequenceParallel as well (``tp_sp``: replicated norm weights, embedding and head sharded,
  activations sharded on the sequence), 2 ranks, trained with ``forge_num.prepare``, equals the
  *same* parallelized model trained with ``torch.optim`` (AdamW / SGD with Nesterov momentum,
  ``foreach=False``, float32 sqrt correctly rounded as in test_training_semantics.py): losses and
  weights bit for bit. Every sharded Linear takes the fused path on its local shard, and after each
  backward no parameter holds a gradient. Under SP the norm weights' Partial gradients are reduced in
  their hooks (without that reduction they would differ). The reference is the parallel run, not a
  single process: a Rowwise forward sums over the input features in two halves plus an all-reduce,
  which torch itself rounds differently from one matmul (proofs/distributed.md §1: forge_num changes
  the update, and the update is exact given the gradient).
* ``test_tensor_parallel_4_ranks``: the same with 4 ranks and SP (2 tokens per rank).
* ``test_data_parallel_equals_ddp_and_single_process``: ``prepare_data_parallel`` on 2 ranks equals
  torch's DistributedDataParallel + torch.optim on the same 2 ranks, and a single-process run that
  averages the two ranks' gradients as DDP does (``g0*0.5 + g1*0.5``), bit for bit: with two ranks
  the all-reduce is one commutative IEEE addition (proofs/distributed.md §3). Also: one all-reduce
  per parameter per step, and when a gradient is reduced no other parameter holds one.
* ``test_checkpoint_resume_tensor_parallel``: 2 steps, ``torch.distributed.checkpoint`` save
  (sharded DTensor weights and optimizer states, forge_num's step counter), 2 more steps; a fresh
  model and optimizer (other seed) load the checkpoint and run the same 2 steps: bitwise equal.
* ``test_*_refuses_*``: what is not supported yet (clipping, accumulation under DP) raises.
* ``test_sharded_fused_update_equals_unsharded`` (one process, no collectives): for AdamW, Adam, SGD
  and Lion, Colwise and Rowwise shards over P = 2, 3 (uneven), 4 ranks, each shard's fused update
  from its local (X, dY) is the restriction of the unsharded fused update bit for bit, weights and
  states, a non-finite gradient row included (proofs/distributed.md Theorem 1 and Lemma 2).
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import forge_num as fn
from forge_num import torch_backend as _tb
from tests.torch_reference import ExactSqrt  # noqa: E402

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
    pytest.mark.skipif(not _tb.addcmul_is_fma(), reason="torch.optim parity needs ATen's FMA kernels"),
]

WORLD = 2
TIMEOUT_S = 120
VOCAB, DIM, HEADS, HIDDEN, LAYERS, SEQ, BATCH = 64, 32, 4, 64, 2, 8, 2


# --------------------------------------------------------------------------------------------
# A tiny Llama-like model (pure torch): RMSNorm, causal attention, SwiGLU MLP, untied head
# --------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = RMSNorm(DIM)
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.ffn_norm = RMSNorm(DIM)
        self.w1 = nn.Linear(DIM, HIDDEN, bias=True)  # a Colwise bias (Shard(0))
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=True)  # a Rowwise bias (replicated)

    def forward(self, x):
        h = self.attn_norm(x)
        b, s = h.shape[0], h.shape[1]
        hd = DIM // HEADS
        q, k, v = (lin(h).view(b, s, -1, hd).transpose(1, 2) for lin in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # local heads under TP
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Tiny(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        with torch.no_grad():  # norms away from 1 so their updates are not all alike
            for m in self.modules():
                if isinstance(m, RMSNorm):
                    m.weight.uniform_(0.5, 1.5)

    def forward(self, ids):
        x = self.tok(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.norm(x)
        logits = self.head(logits)
        if hasattr(logits, "full_tensor"):
            logits = logits.full_tensor()
        return F.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1))


def parallelize(model, mesh, sp):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    for blk in model.layers:
        # Under SP the Colwise inputs are declared Shard(1), so the parallel style all-gathers them
        # (an autograd node whose backward reduce-scatters); see sharded_linear_forward's docstring.
        col = ColwiseParallel(input_layouts=Shard(1)) if sp else ColwiseParallel()
        plan = {
            "wq": col,
            "wk": col,
            "wv": col,
            "wo": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
            "w1": col,
            "w3": col,
            "w2": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
        }
        if sp:
            plan["attn_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
            plan[""] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True
            )
        parallelize_module(blk, mesh, plan)
    top = {"head": ColwiseParallel(output_layouts=Replicate())}
    if sp:
        top["tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        top["norm"] = SequenceParallel()
        top["head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    parallelize_module(model, mesh, top)
    return model



HYPER = {
    "adamw": dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1),
    "sgd": dict(lr=5e-2, momentum=0.9, weight_decay=0.01, nesterov=True),
}


def make_opt(kind, impl, params):
    if impl == "torch":
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.SGD
        return cls(params, foreach=False, **HYPER[kind])
    cls = fn.AdamW if kind == "adamw" else fn.SGD
    return cls(params, **HYPER[kind])


def batches(n, seed=1, batch=BATCH):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, SEQ), generator=g) for _ in range(n)]


def full_params(model):
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        out[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()
    return out


def train(model, opt, data, impl):
    losses = []
    for ids in data:
        loss = model(ids)
        loss.backward()
        losses.append(loss.item())
        if impl == "torch":
            with ExactSqrt():
                opt.step()
        else:
            for name, p in model.named_parameters():  # every gradient was consumed and freed
                assert p.grad is None, name
            opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


# --------------------------------------------------------------------------------------------
# Process launcher: free port, timeout, results through a file
# --------------------------------------------------------------------------------------------


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn_name, args, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    ok = False
    try:
        result = globals()[fn_name](rank, world, *args, outdir=outdir)
        if rank == 0:
            with open(os.path.join(outdir, "result.pkl"), "wb") as f:
                pickle.dump(result, f)
        dist.barrier()  # no collective in flight when the group goes away
        ok = True
    finally:
        dist.destroy_process_group()
    if ok:
        # Skip the interpreter's teardown: with DTensor's async collectives torch 2.13 sometimes
        # aborts there ("terminate called without an active exception") after all work is done.
        os._exit(0)


def run_distributed(fn_name, *args, world=WORLD):
    with tempfile.TemporaryDirectory() as outdir:
        ctx = mp.start_processes(
            _entry, args=(world, _free_port(), fn_name, args, outdir), nprocs=world, join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + TIMEOUT_S
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                pytest.fail(f"{fn_name} did not finish within {TIMEOUT_S} s")
        with open(os.path.join(outdir, "result.pkl"), "rb") as f:
            return pickle.load(f)


# --------------------------------------------------------------------------------------------
# Workers (run in each process)
# --------------------------------------------------------------------------------------------


def _tp_worker(rank, world, kind, sp, steps, outdir):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    data = batches(steps)
    res = {}
    for impl in ("torch", "forge"):
        model = parallelize(Tiny(seed=0), mesh, sp)
        opt = make_opt(kind, impl, model.parameters())
        fused = []
        if impl == "forge":
            fn.prepare(model, opt)
            fused = sorted(model._forge_num_handle.fused)
        losses = train(model, opt, data, impl)
        res[impl] = dict(params=full_params(model), losses=losses, fused=fused)
    return res


def _ddp_worker(rank, world, kind, steps, outdir):
    from forge_num.distributed import prepare_data_parallel

    data = batches(steps, batch=BATCH * world)
    local = [ids[rank * BATCH : (rank + 1) * BATCH] for ids in data]
    res = {}
    model = nn.parallel.DistributedDataParallel(Tiny(seed=0))
    opt = make_opt(kind, "torch", model.parameters())
    train(model, opt, local, "torch")
    res["ddp"] = full_params(model.module)
    model = Tiny(seed=rank)  # different on each rank: prepare_data_parallel broadcasts rank 0's
    opt = make_opt(kind, "forge", model.parameters())
    prepare_data_parallel(model, opt)
    reduce, alive = opt._grad_reducer, []

    def counting(p, grad):  # how many gradients exist when one is reduced
        alive.append(sum(q.grad is not None for q in model.parameters()))
        return reduce(p, grad)

    opt._grad_reducer = counting
    train(model, opt, local, "forge")
    res["forge"] = full_params(model)
    res["alive"] = alive
    res["nparams"] = len(list(model.parameters()))
    return res


def _ckpt_worker(rank, world, kind, outdir):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from forge_num.distributed import checkpoint_state, load_checkpoint_state

    mesh = init_device_mesh("cpu", (world,))
    data = batches(4)
    path = os.path.join(outdir, "ckpt")

    model = parallelize(Tiny(seed=0), mesh, sp=False)
    opt = make_opt(kind, "forge", model.parameters())
    fn.prepare(model, opt)
    train(model, opt, data[:2], "forge")
    dcp.save(checkpoint_state(model, opt), checkpoint_id=path)
    train(model, opt, data[2:], "forge")
    first, first_step = full_params(model), opt._global_step

    model = parallelize(Tiny(seed=7), mesh, sp=False)
    opt = make_opt(kind, "forge", model.parameters())
    fn.prepare(model, opt)
    state = checkpoint_state(model, opt)  # the structure to load into (fresh state created, no step)
    dcp.load(state, checkpoint_id=path)
    load_checkpoint_state(model, opt, state)
    assert opt._global_step == 2
    train(model, opt, data[2:], "forge")
    return dict(first=first, resumed=full_params(model), steps=(first_step, opt._global_step))


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def _assert_bitwise(a, b, what):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), (
            f"{what}: {name} differs, max |diff| {(a[name] - b[name]).abs().max().item():.3e}"
        )


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_tensor_parallel(kind, sp):
    res = run_distributed("_tp_worker", kind, sp, 3)
    linear = [f"layers.{i}.{n}" for i in range(LAYERS) for n in ("w1", "w2", "w3", "wk", "wo", "wq", "wv")]
    assert res["forge"]["fused"] == sorted([*linear, "head"])  # every sharded Linear took the fused path
    assert res["forge"]["losses"] == res["torch"]["losses"]
    _assert_bitwise(res["forge"]["params"], res["torch"]["params"], f"TP{'+SP' if sp else ''} {kind}")
    before = Tiny(seed=0).state_dict()
    assert all(not torch.equal(before[k], v) for k, v in res["forge"]["params"].items())  # it trained


def _single_process_dp(kind, steps, world=WORLD):
    """One process: each rank's gradient computed alone, averaged as DDP does, then torch.optim."""
    model = Tiny(seed=0)
    opt = make_opt(kind, "torch", model.parameters())
    for ids in batches(steps, batch=BATCH * world):
        grads = []
        for r in range(world):
            model.zero_grad(set_to_none=True)
            model(ids[r * BATCH : (r + 1) * BATCH]).backward()
            grads.append({n: p.grad.mul(1.0 / world) for n, p in model.named_parameters()})
        for n, p in model.named_parameters():
            p.grad = grads[0][n] + grads[1][n]  # two ranks: the all-reduce is one addition
        with ExactSqrt():
            opt.step()
        opt.zero_grad(set_to_none=True)
    return full_params(model)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_data_parallel_equals_ddp_and_single_process(kind):
    res = run_distributed("_ddp_worker", kind, 3)
    # one all-reduce per parameter per step, and no other gradient alive at that moment
    assert len(res["alive"]) == 3 * res["nparams"] and max(res["alive"]) == 0
    _assert_bitwise(res["forge"], res["ddp"], f"data parallel {kind} vs DDP")
    _assert_bitwise(res["forge"], _single_process_dp(kind, 3), f"data parallel {kind} vs single process")


def test_checkpoint_resume_tensor_parallel():
    res = run_distributed("_ckpt_worker", "adamw")
    assert res["steps"] == (4, 4)
    _assert_bitwise(res["resumed"], res["first"], "TP checkpoint resume")


def test_data_parallel_refuses_what_it_does_not_support():
    from forge_num.distributed import prepare_data_parallel

    model = Tiny(seed=0)
    with pytest.raises(NotImplementedError, match="clipping"):
        prepare_data_parallel(model, fn.AdamW(model.parameters(), max_grad_norm=1.0))
    with pytest.raises(NotImplementedError, match="accumulation"):
        prepare_data_parallel(model, fn.AdamW(model.parameters(), accumulation_steps=2))
    assert getattr(model, "_forge_num_handle", None) is None  # nothing was changed


def _tp_clip_worker(rank, world, outdir):
    from torch.distributed.device_mesh import init_device_mesh

    model = parallelize(Tiny(seed=0), init_device_mesh("cpu", (world,)), sp=False)
    opt = fn.AdamW(model.parameters(), max_grad_norm=1.0, clipping="previous")
    fn.prepare(model, opt)
    try:
        model(batches(1)[0])
    except NotImplementedError as e:
        return str(e)
    return None


def test_tensor_parallel_refuses_clipping():
    assert "clipping" in (run_distributed("_tp_clip_worker") or "")


@pytest.mark.parametrize("kind", ["adamw"])
def test_tensor_parallel_4_ranks(kind):
    """The same bitwise claim with 4 ranks (sequence parallel: 2 tokens per rank)."""
    res = run_distributed("_tp_worker", kind, True, 2, world=4)
    assert res["forge"]["losses"] == res["torch"]["losses"]
    _assert_bitwise(res["forge"]["params"], res["torch"]["params"], f"TP+SP 4 ranks {kind}")


# --------------------------------------------------------------------------------------------
# proofs/distributed.md Theorem 1 + Lemma 2, in one process, for every rule
# --------------------------------------------------------------------------------------------

RULES = {
    "adamw": dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1),
    "adam": dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1),
    "sgd": dict(lr=5e-2, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False),
    "lion": dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1),
}


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("style", ["colwise", "rowwise"])
@pytest.mark.parametrize("name", sorted(RULES))
def test_sharded_fused_update_equals_unsharded(name, style, P):
    """Each rank's fused update of its shard, from its local (X, dY), is the restriction of the
    unsharded fused update, bit for bit (uneven shards for P=3; non-finite gradients included).
    On this backend dW comes from MKL's mm: the row/column slice of the product is the product of
    the slice here (single-block shapes); the Triton mainloop guarantees it by construction."""
    from forge_num import rules

    rule = getattr(rules, name.upper())
    h = rule.scalars(RULES[name], 3)
    g = torch.Generator().manual_seed(P)
    K, M, N = 24, 48, 40
    x, dy = torch.randn(K, N, generator=g), torch.randn(K, M, generator=g)
    dy[3, 5] = float("nan")  # the guard keeps row 5 unchanged wherever it lives
    w = torch.randn(M, N, generator=g)
    states = [torch.randn(M, N, generator=g).abs() for _ in range(rule.state_slots(RULES[name]))]
    full_w, full_s = w.clone(), [s.clone() for s in states]
    _tb.fused_linear_update(full_w, x, dy, full_s, rule, h)
    changed = full_w != w
    assert changed.sum() > M * N // 2 and not changed[5].any()  # updated, except the guarded row
    dim = 0 if style == "colwise" else 1
    size = (M, N)[dim]
    bounds = [size * r // P for r in range(P + 1)]
    for r in range(P):
        idx = slice(bounds[r], bounds[r + 1])
        cut = (lambda t: t[idx].contiguous()) if dim == 0 else (lambda t: t[:, idx].contiguous())
        w_r, s_r = cut(w), [cut(s) for s in states]
        if dim == 0:  # Colwise: X whole, dY's local output features
            _tb.fused_linear_update(w_r, x, cut(dy.t()).t().contiguous(), s_r, rule, h)
        else:  # Rowwise: X's local input features, dY whole
            _tb.fused_linear_update(w_r, cut(x), dy, s_r, rule, h)
        assert torch.equal(w_r, cut(full_w)), (name, style, P, r)
        for a, b in zip(s_r, full_s):
            assert torch.equal(a, cut(b)), (name, style, P, r)
