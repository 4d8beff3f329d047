"""forge_num inside torch.distributed (CPU, gloo, processes started with torch.multiprocessing).

What each test shows (fp32, bitwise, every parameter compared after the steps named; TP and DDP 10):

* ``test_tensor_parallel[...]``: a tiny Llama-like model (RMSNorm, causal attention, SwiGLU MLP with
  a Colwise and a Rowwise bias, untied head) under ColwiseParallel/RowwiseParallel (``tp``) and with
  SequenceParallel as well (``tp_sp``: replicated norm weights, embedding and head sharded,
  activations sharded on the sequence), 2 ranks, trained with ``forge_num.prepare``, equals the
  *same* parallelized model trained with ``torch.optim`` (AdamW / SGD with Nesterov momentum,
  ``foreach=False``, float32 sqrt correctly rounded as in test_training_semantics.py): losses and
  weights bit for bit. Every sharded Linear takes the fused path on its local shard, and after each
  backward no parameter holds a gradient. Under SP the norm weights' Partial gradients are reduced in
  their hooks (without that reduction they would differ); the torch reference reduces them before
  its step too (``reduce_partial_grads``: torch's SGD would otherwise keep a Partial momentum
  buffer and reduce late, one ulp away by step 5). The reference is the parallel run, not a
  single process: a Rowwise forward sums over the input features in two halves plus an all-reduce,
  which torch itself rounds differently from one matmul (proofs/distributed.md §1: forge_num changes
  the update, and the update is exact given the gradient).
* ``test_tensor_parallel_4_ranks``: the same with 4 ranks and SP (2 tokens per rank).
* ``test_data_parallel_equals_ddp_and_single_process``: ``prepare_data_parallel`` on 2 ranks equals
  torch's DistributedDataParallel + torch.optim on the same 2 ranks, and a single-process run that
  averages the two ranks' gradients as DDP does (``g0*0.5 + g1*0.5``), bit for bit: with two ranks
  the all-reduce is one commutative IEEE addition (proofs/distributed.md §3). Also: one all-reduce
  per parameter per step, and when a gradient is reduced no other parameter holds one.
* ``test_tensor_parallel_under_checkpointing[...]``: TP + SP with every block under non-reentrant
  activation checkpointing (each sharded fused layer two autograd nodes there, so that the recomputation
  stops before its product) trains as without checkpointing, bit for bit, in fp32 and under autocast.
* ``test_checkpoint_resume_tensor_parallel``: 2 steps, ``torch.distributed.checkpoint`` save
  (sharded DTensor weights and optimizer states, forge_num's step counter), 2 more steps; a fresh
  model and optimizer (other seed) load the checkpoint and run the same 2 steps: bitwise equal.
* ``test_fully_sharded_equals_fsdp_torch_and_single_process``: FSDP2 (``fully_shard`` per block and
  the root), 2 ranks, 10 steps, AdamW and SGD: forge_num equals FSDP2 + torch.optim and a single
  process averaging as FSDP2's reduce-scatter does on gloo (``fl(fl(g_0 + g_1) / 2)``), bit for bit;
  every Linear unfused; when a hook runs no other parameter holds a gradient (proofs/distributed.md §4).
* ``test_fully_sharded_4_ranks`` / ``test_data_parallel_4_ranks``: 4 ranks, bitwise against torch.optim
  after the same reduction; against a single process, step 1's gradients within Proposition 4's
  ``2 γ_3 Σ_r |x_r|`` (the collective's association order).
* ``test_data_parallel_clipping_and_accumulation`` / ``test_fully_sharded_clipping_and_accumulation``:
  2 micro-batches per step, exact and previous-norm clipping. DP exact equals DDP (``no_sync``) +
  ``clip_grad_norm_`` + torch.optim bit for bit; FSDP2's coefficient is the sharded norm formula bit for
  bit and within Proposition 6's bound of the exact norm's; telemetry norms within 2γ_{N+4} (binary64).
* ``test_tensor_parallel_clipping``: TP + SP, exact and previous: bitwise given the coefficients, the
  coefficient within Proposition 6's bound.
* ``test_checkpoint_resume_fully_sharded``: as the TP checkpoint test, under FSDP2 (sharded optimizer
  states); 8bit and parameters outside every ``fully_shard`` unit are refused.
* ``test_sharded_fused_update_equals_unsharded`` (one process, no collectives): for AdamW, Adam, SGD
  and Lion, Colwise and Rowwise shards over P = 2, 3 (uneven), 4 ranks, each shard's fused update
  from its local (X, dY) is the restriction of the unsharded fused update bit for bit, weights and
  states, a non-finite gradient row included (proofs/distributed.md Theorem 1 and Lemma 2).
"""

from __future__ import annotations

import copy
import datetime
import functools
import math
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


def make_opt(kind, impl, params, **options):
    if impl == "torch":
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.SGD
        return cls(params, foreach=False, **HYPER[kind])
    cls = fn.AdamW if kind == "adamw" else fn.SGD
    return cls(params, **HYPER[kind], **options)


def batches(n, seed=1, batch=BATCH):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, SEQ), generator=g) for _ in range(n)]


def full_params(model):
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        out[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()
    return out


def reduce_partial_grads(model) -> None:
    """Reduce every ``Partial`` DTensor gradient to its parameter's placements before torch.optim steps.

    Without it torch's SGD clones a Partial gradient into its momentum buffer at step 1, so the
    buffer stays Partial and torch reduces Σ momentum-weighted partials when it updates the
    replicated parameter: the same sum associated differently, one ulp apart after a few steps (seen
    on the final norm weight under sequence parallelism at step 5). forge_num reduces each gradient
    first, as a single process computes it (proofs/distributed.md §1); so does this reference."""
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p.grad, DTensor) and isinstance(p, DTensor) and p.grad.placements != p.placements:
            p.grad = p.grad.redistribute(p.device_mesh, p.placements)


def finish_step(model, opt, impl, clip=None):
    """The end of a training step: torch.optim on reduced gradients (``clip``: clip_grad_norm_), or
    forge_num's bookkeeping step after a backward that consumed and freed every gradient."""
    if impl == "torch":
        reduce_partial_grads(model)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        with ExactSqrt():
            opt.step()
    else:
        for name, p in model.named_parameters():  # every gradient was consumed and freed
            assert p.grad is None, name
        opt.step()


def train(model, opt, data, impl):
    losses = []
    for ids in data:
        loss = model(ids)
        loss.backward()
        losses.append(loss.item())
        finish_step(model, opt, impl)
        opt.zero_grad(set_to_none=True)
    return losses


# --------------------------------------------------------------------------------------------
# Process launcher: free port, timeout, results through a file
# --------------------------------------------------------------------------------------------


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn_name, args, outdir, kwargs=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    ok = False
    try:
        result = globals()[fn_name](rank, world, *args, outdir=outdir, **(kwargs or {}))
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


def run_distributed(fn_name, *args, world=WORLD, **kwargs):
    with tempfile.TemporaryDirectory() as outdir:
        ctx = mp.start_processes(
            _entry, args=(world, _free_port(), fn_name, args, outdir, kwargs), nprocs=world, join=False,
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
    res = run_distributed("_tp_worker", kind, sp, 10)
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
    res = run_distributed("_ddp_worker", kind, 10)
    # one all-reduce per parameter per step, and no other gradient alive at that moment
    assert len(res["alive"]) == 10 * res["nparams"] and max(res["alive"]) == 0
    _assert_bitwise(res["forge"], res["ddp"], f"data parallel {kind} vs DDP")
    _assert_bitwise(res["forge"], _single_process_dp(kind, 10), f"data parallel {kind} vs single process")


def test_checkpoint_resume_tensor_parallel():
    res = run_distributed("_ckpt_worker", "adamw")
    assert res["steps"] == (4, 4)
    _assert_bitwise(res["resumed"], res["first"], "TP checkpoint resume")


@pytest.mark.parametrize("kind", ["adamw"])
def test_tensor_parallel_4_ranks(kind):
    """The same bitwise claim with 4 ranks (sequence parallel: 2 tokens per rank)."""
    res = run_distributed("_tp_worker", kind, True, 10, world=4)
    assert res["forge"]["losses"] == res["torch"]["losses"]
    _assert_bitwise(res["forge"]["params"], res["torch"]["params"], f"TP+SP 4 ranks {kind}")



# --------------------------------------------------------------------------------------------
# Data parallel and FSDP2: workers and single-process references
# --------------------------------------------------------------------------------------------

U32 = 2.0**-24


def gamma(k, u=U32):
    return k * u / (1 - k * u)


def clip_bound(n, P):
    """proofs/distributed.md Proposition 6: two clipping coefficients computed from the same gradient
    by clip_grad_norm_'s formula and by the sharded one differ by at most E + E² (relative)."""
    e = gamma(n + 1) + gamma(P + 1) + 10 * U32
    return e + e * e


def fsdp_shard(model):
    from torch.distributed.fsdp import fully_shard

    for blk in model.layers:
        fully_shard(blk)
    return fully_shard(model)


def local_batches(steps, rank, world, micro=1):
    data = batches(steps * micro, batch=BATCH * world)
    return [ids[rank * BATCH : (rank + 1) * BATCH] for ids in data]


def train_dist(model, opt, local, impl, micro=1, clip=None, opt_backward=False):
    """``micro`` micro-batches per step (loss / micro each); ``clip``: clip_grad_norm_ (torch only)."""
    coefs, norms = [], []
    for i in range(0, len(local), micro):
        for ids in local[i : i + micro]:
            loss = model(ids) / micro
            opt.backward(loss) if opt_backward else loss.backward()
        finish_step(model, opt, impl, clip)
        if impl != "torch":
            coefs.append(opt.stats["clip_coef"])
            norms.append(opt.stats["grad_norm"])
        opt.zero_grad(set_to_none=True)
    return coefs, norms


def _fsdp_worker(rank, world, kinds, steps, outdir, micro=1, clip=None, ref=True):
    """FSDP2 + forge_num against FSDP2 + torch.optim on the same ranks; step 1's reduced gradients."""
    res = {}
    local = local_batches(steps, rank, world, micro)
    for kind in kinds:
        out = {}
        if ref and clip is None:
            model = fsdp_shard(Tiny(seed=0))
            train_dist(model, make_opt(kind, "torch", model.parameters()), local, "torch", micro)
            out["torch"] = full_params(model)
        model = fsdp_shard(Tiny(seed=0))
        kw = {} if clip is None else dict(max_grad_norm=clip[1], clipping=clip[0])
        opt = make_opt(kind, "forge", model.parameters(), **kw, accumulation_steps=micro)
        params = list(model.parameters())
        alive, grads1 = [], {}

        def counting(p):  # registered before prepare's hook: runs first, with p.grad set by FSDP2
            alive.append(sum(q.grad is not None for q in params))
            if opt._global_step == 0 and opt._mode == "update":
                grads1[p] = p.grad.to_local().clone()

        for p in params:
            p.register_post_accumulate_grad_hook(counting)
        fn.prepare(model, opt)
        handle = model._forge_num_handle
        out["fused"], out["unfused"] = sorted(handle.fused), sorted(handle.sharded)
        exact = clip is not None and clip[0] == "exact"
        out["coefs"], out["norms"] = train_dist(model, opt, local, "forge", micro, opt_backward=exact)
        out["forge"] = full_params(model)
        out["alive"], out["nparams"] = alive, len(params)
        names = {p: n for n, p in model.named_parameters()}
        shards = [None] * world
        dist.all_gather_object(shards, {names[p]: g for p, g in grads1.items()})
        out["grads1"] = {n: torch.cat([sh[n] for sh in shards]) for n in shards[0]}
        res[kind] = out
    return res


def _reduce_grads(model, ids_per_rank, micro, how):
    """Each rank's gradient computed alone (loss / micro per micro-batch), reduced as the collective
    does with 2 ranks. ``dp``: DDP's ``fl(l_r · (1/P))`` of each rank's locally accumulated gradient,
    then their sum (one addition for P = 2). ``fsdp``: per micro-batch FSDP2's reduce-scatter AVG on
    gloo, ``fl(fl(g_0 + g_1) / P)`` (sum, then divide: tests check it on overflow and subnormals), the
    micro-batches' results accumulated as FSDP2 does (``grad += new``)."""
    world = len(ids_per_rank)
    local = []  # per rank: per micro-batch gradients
    for r in range(world):
        per = []
        for ids in ids_per_rank[r]:
            model.zero_grad(set_to_none=True)
            (model(ids) / micro).backward()
            per.append({n: p.grad.clone() for n, p in model.named_parameters()})
        local.append(per)
    model.zero_grad(set_to_none=True)
    out = {}
    for n, _ in model.named_parameters():
        if how == "dp":
            acc = []
            for r in range(world):
                a = local[r][0][n]
                for g in local[r][1:]:
                    a = a + g[n]
                acc.append(a.mul(1.0 / world))
            total = acc[0]
            for a in acc[1:]:
                total = total + a
        else:
            total = None
            for m in range(micro):
                s = local[0][m][n]
                for r in range(1, world):
                    s = s + local[r][m][n]
                s = s / world
                total = s if total is None else total + s
        out[n] = total
    return out


def fsdp_norm_coef(grads, world, max_norm):
    """forge_num's global norm under FSDP2, from whole gradients: per parameter the fp32 norms of its
    world dim-0 chunks (FSDP2's shards), combined as fl32(sqrt(Σ_r fl64(n_r)²)) in rank order, then
    vector_norm over the parameters in order (forge_num.distributed.global_total_norm)."""
    per = []
    for g in grads:
        sq = None
        for c in torch.chunk(g, world, dim=0):
            n = torch.linalg.vector_norm(c.clone(), 2.0).double() ** 2
            sq = n if sq is None else sq + n
        per.append(sq.sqrt().float())
    total = torch.linalg.vector_norm(torch.stack(per), 2.0)
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)


def single_process(kind, steps, how, world=WORLD, micro=1, clip=None, coefs=None):
    """The single-process reference: averaged gradients (``_reduce_grads``), optionally clipped, then
    torch.optim. ``clip=("exact", m)``: dp: clip_grad_norm_ itself; fsdp: ``fsdp_norm_coef``.
    ``coefs``: the coefficients a distributed run reported (clipping by the previous step's norm).
    Returns the parameters and the norms of the averaged gradients (fp64)."""
    model = Tiny(seed=0)
    opt = make_opt(kind, "torch", model.parameters())
    data = batches(steps * micro, batch=BATCH * world)
    norms = []
    for t in range(steps):
        step = data[t * micro : (t + 1) * micro]
        per_rank = [[ids[r * BATCH : (r + 1) * BATCH] for ids in step] for r in range(world)]
        grads = _reduce_grads(model, per_rank, micro, how)
        norms.append(math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values())))
        for n, p in model.named_parameters():
            p.grad = grads[n]
        gs = [p.grad for p in model.parameters()]
        if coefs is not None:
            if coefs[t] is not None:
                torch._foreach_mul_(gs, torch.tensor(coefs[t], dtype=torch.float32))
        elif clip is not None and how == "dp":
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip[1])
        elif clip is not None:
            torch._foreach_mul_(gs, fsdp_norm_coef(gs, world, clip[1]))
        with ExactSqrt():
            opt.step()
        opt.zero_grad(set_to_none=True)
    return full_params(model), norms


def _dp_worker(rank, world, kind, steps, outdir, micro=1, clip=None, ddp=False, allreduce=False):
    """prepare_data_parallel (clipping, accumulation); optionally DDP + torch.optim on the same ranks,
    and torch.optim after forge_num's reduction (``fl(g · (1/P))``, then one all-reduce per parameter)."""
    from forge_num.distributed import prepare_data_parallel

    local = local_batches(steps, rank, world, micro)
    res = {}
    if allreduce:
        model = Tiny(seed=0)
        opt = make_opt(kind, "torch", model.parameters())
        for ids in local:
            model(ids).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad.mul_(1.0 / world))
            with ExactSqrt():
                opt.step()
            opt.zero_grad(set_to_none=True)
        res["allreduce"] = full_params(model)
    if ddp:
        model = nn.parallel.DistributedDataParallel(Tiny(seed=0))
        opt = make_opt(kind, "torch", model.parameters())
        for i in range(0, len(local), micro):
            for j, ids in enumerate(local[i : i + micro]):
                if j < micro - 1:
                    with model.no_sync():
                        (model(ids) / micro).backward()
                else:
                    (model(ids) / micro).backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip[1])
            with ExactSqrt():
                opt.step()
            opt.zero_grad(set_to_none=True)
        res["ddp"] = full_params(model.module)
    model = Tiny(seed=rank)
    kw = {} if clip is None else dict(max_grad_norm=clip[1], clipping=clip[0])
    opt = make_opt(kind, "forge", model.parameters(), **kw, accumulation_steps=micro)
    prepare_data_parallel(model, opt)
    reduce, grads1 = opt._grad_reducer, {}
    names = {p: n for n, p in model.named_parameters()}

    def keep(p, grad):
        out = reduce(p, grad)
        if opt._global_step == 0 and opt._mode == "update":
            grads1[names[p]] = out.clone()
        return out

    opt._grad_reducer = keep
    res["coefs"], res["norms"] = train_dist(
        model, opt, local, "forge", micro, opt_backward=clip is not None and clip[0] == "exact"
    )
    res["forge"], res["grads1"] = full_params(model), grads1
    return res


def assert_norms(dist_norms, ref_norms, n_elems):
    """Telemetry: the global norm (binary64 sums of exact squares, any order) within 2γ_{N+4}
    (u = 2^-53) of a single process's, N the number of gradient elements (proofs/distributed.md §5)."""
    bound = 2 * gamma(n_elems + 4, 2.0**-53)
    for a, b in zip(dist_norms, ref_norms):
        assert abs(a * a / (b * b) - 1) <= bound, (a, b)


def assert_within_sum_bound(grads, ref_grads, world, what):
    """proofs/distributed.md Proposition 4: two summation orders of the P ranks' contributions differ
    by at most 2 γ_{P-1} Σ_r |x_r| per element; Σ_r |x_r| from the single-process gradients."""
    for n, g in grads.items():
        bound = 2 * gamma(world - 1) * ref_grads[n][1]
        assert ((g - ref_grads[n][0]).abs() <= bound).all(), f"{what}: {n}"


def single_process_abs(world, how):
    """Step 1's averaged gradients of a single process and Σ_r |x_r| per element (x_r = g_r / P)."""
    model = Tiny(seed=0)
    ids = batches(1, batch=BATCH * world)[0]
    gs = []
    for r in range(world):
        model.zero_grad(set_to_none=True)
        model(ids[r * BATCH : (r + 1) * BATCH]).backward()
        gs.append({n: p.grad.clone() for n, p in model.named_parameters()})
    out = {}
    for n in gs[0]:
        avg = sum((g[n] for g in gs[1:]), gs[0][n]) / world
        out[n] = (avg, sum((g[n].abs() for g in gs[1:]), gs[0][n].abs()) / world)
    return out


N_ELEMS = sum(p.numel() for p in Tiny(seed=0).parameters())
N_MAX, N_PARAMS = max(p.numel() for p in Tiny(seed=0).parameters()), len(list(Tiny(seed=0).parameters()))
LINEARS = sorted(
    [*(f"layers.{i}.{n}" for i in range(LAYERS) for n in ("w1", "w2", "w3", "wk", "wo", "wq", "wv")), "head"]
)


def test_fully_sharded_equals_fsdp_torch_and_single_process():
    """FSDP2 (fully_shard per block and the root), 2 ranks, 10 steps, AdamW and SGD: forge_num equals
    the same FSDP2 model with torch.optim and a single process averaging as FSDP2 on gloo does
    (``fl(fl(g_0 + g_1) / 2)``), bit for bit. Every Linear is left unfused (FSDP2 reduce-scatters
    its dW); when a hook runs, its parameter is the only one holding a gradient."""
    res = run_distributed("_fsdp_worker", ("adamw", "sgd"), 10)
    for kind in ("adamw", "sgd"):
        r = res[kind]
        assert r["fused"] == [] and r["unfused"] == LINEARS
        assert len(r["alive"]) == 10 * r["nparams"] and set(r["alive"]) == {1}
        _assert_bitwise(r["forge"], r["torch"], f"FSDP2 {kind} vs FSDP2 + torch.optim")
        ref, _ = single_process(kind, 10, "fsdp")
        _assert_bitwise(r["forge"], ref, f"FSDP2 {kind} vs single process")


def test_fully_sharded_4_ranks():
    """4 ranks: bitwise against FSDP2 + torch.optim (the same reduce-scatter); against a single
    process, step 1's reduced gradients within Proposition 4's bound 2 γ_3 Σ_r |x_r| (the order of
    gloo's 4-term sum is the collective's)."""
    res = run_distributed("_fsdp_worker", ("adamw",), 10, world=4)["adamw"]
    _assert_bitwise(res["forge"], res["torch"], "FSDP2 4 ranks vs FSDP2 + torch.optim")
    assert_within_sum_bound(res["grads1"], single_process_abs(4, "fsdp"), 4, "FSDP2 4 ranks")


def test_data_parallel_4_ranks():
    """4 ranks: bitwise against torch.optim after the same per-parameter reduction (Theorem 1 given
    the gradient). Not bitwise against DDP: its bucketed all-reduce sums the 4 contributions in another
    order (seen in the last bit of tok.weight after a few steps). Step 1's gradients are within
    Proposition 4's 2 γ_3 Σ_r |x_r| of a single process's (sequential sum)."""
    res = run_distributed("_dp_worker", "adamw", 10, allreduce=True, world=4)
    _assert_bitwise(res["forge"], res["allreduce"], "DP 4 ranks vs the same reduction + torch.optim")
    assert_within_sum_bound(res["grads1"], single_process_abs(4, "dp"), 4, "DP 4 ranks")


@pytest.mark.parametrize("clip", [("exact", 0.05), ("previous", 0.05)], ids=["exact", "previous"])
def test_data_parallel_clipping_and_accumulation(clip):
    """prepare_data_parallel, 2 ranks, 2 micro-batches per step, clipping: equals DDP (no_sync on
    the first micro-batch) + clip_grad_norm_ + torch.optim and the single-process reference, bit for
    bit. Exact: every rank holds the averaged gradient, so forge_num's norm is clip_grad_norm_'s
    (per-parameter fp32 norms stacked in parameter order). Previous: the coefficient of step t is
    min(1, max / (norm_{t-1} + 1e-6)), the reference given those coefficients."""
    res = run_distributed("_dp_worker", "adamw", 3, micro=2, clip=clip, ddp=clip[0] == "exact")
    ref, norms = single_process("adamw", 3, "dp", micro=2, clip=clip,
                                coefs=res["coefs"] if clip[0] == "previous" else None)
    assert_norms(res["norms"], norms, N_ELEMS)
    if clip[0] == "exact":
        assert all(c < 1 for c in res["coefs"])
        _assert_bitwise(res["forge"], res["ddp"], "DP exact clipping + accumulation vs DDP")
    else:
        assert res["coefs"][0] is None and all(c < 1 for c in res["coefs"][1:])
    _assert_bitwise(res["forge"], ref, f"DP {clip[0]} clipping + accumulation vs single process")


@pytest.mark.parametrize("clip", [("exact", 0.05), ("previous", 0.05)], ids=["exact", "previous"])
def test_fully_sharded_clipping_and_accumulation(clip):
    """FSDP2, 2 ranks, 2 micro-batches per step (each reduce-scattered, the shards accumulated as
    FSDP2 accumulates them), clipping. Exact: the coefficient is ``fsdp_norm_coef`` of the averaged
    gradient bit for bit (the single process computing it is bitwise), and within Proposition 6's
    E + E² of the coefficient of the gradient's fp64-accurate norm. Previous: the global telemetry norm (all ranks) within 2γ_N of a single
    process's, and the reference given the coefficients is bitwise."""
    res = run_distributed("_fsdp_worker", ("adamw",), 3, micro=2, clip=clip)["adamw"]
    ref, norms = single_process("adamw", 3, "fsdp", micro=2, clip=clip,
                                coefs=res["coefs"] if clip[0] == "previous" else None)
    assert_norms(res["norms"], norms, N_ELEMS)
    _assert_bitwise(res["forge"], ref, f"FSDP2 {clip[0]} clipping + accumulation vs single process")
    if clip[0] == "exact":
        c_torch = [float(torch.clamp(clip[1] / (torch.tensor(n, dtype=torch.float32) + 1e-6), max=1.0))
                   for n in norms]
        for a, b in zip(res["coefs"], c_torch):
            assert a < 1 and abs(a / b - 1) <= clip_bound(N_MAX, N_PARAMS)


def _tp_clip_worker(rank, world, mode, outdir):
    """TP + clipping; the reference is torch.optim on the same parallel model given the coefficients,
    and clip_grad_norm_'s coefficient from its full gradients (for the bound)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    data = batches(3)
    model = parallelize(Tiny(seed=0), mesh, sp=True)
    opt = fn.AdamW(model.parameters(), max_grad_norm=0.05, clipping=mode, **HYPER["adamw"])
    fn.prepare(model, opt)
    coefs, norms = train_dist(model, opt, data, "forge", opt_backward=mode == "exact")
    fused = sorted(model._forge_num_handle.fused)
    res = dict(forge=full_params(model), coefs=coefs, norms=norms, fused=fused)
    model = parallelize(Tiny(seed=0), mesh, sp=True)
    opt = make_opt("adamw", "torch", model.parameters())
    ref_norms = []
    for ids, c in zip(data, coefs):
        model(ids).backward()
        full = [p.grad.full_tensor() for p in model.parameters()]
        ref_norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in full])))
        if c is not None:  # the gradient reduced to the parameter's placements first, as forge_num's hook
            for p in model.parameters():
                if tuple(p.grad.placements) != tuple(p.placements):
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
                p.grad.mul_(c)
        with ExactSqrt():
            opt.step()
        opt.zero_grad(set_to_none=True)
    res["torch"], res["ref_norms"] = full_params(model), [float(n) for n in ref_norms]
    return res


@pytest.mark.parametrize("mode", ["exact", "previous"])
def test_tensor_parallel_clipping(mode):
    """TP + SP, 2 ranks: the fused sharded layers' norm pass and the hooks' norms (Partial gradients
    reduced first) combined across ranks, replicated parameters counted once. Bitwise against the same
    parallel model with torch.optim given forge_num's coefficients; the coefficient within Proposition
    6's E + E² of the one clip_grad_norm_'s formula gives on the full gradients."""
    res = run_distributed("_tp_clip_worker", mode)
    assert res["fused"] == LINEARS
    _assert_bitwise(res["forge"], res["torch"], f"TP+SP {mode} clipping")
    coefs = res["coefs"] if mode == "exact" else res["coefs"][1:]
    ref = res["ref_norms"] if mode == "exact" else res["ref_norms"][:-1]
    assert len(coefs) == len(ref) and all(c < 1 for c in coefs)
    for c, n in zip(coefs, ref):
        c_full = float(torch.clamp(0.05 / (torch.tensor(n, dtype=torch.float32) + 1e-6), max=1.0))
        assert abs(c / c_full - 1) <= clip_bound(N_MAX, N_PARAMS)


def _fsdp_ckpt_worker(rank, world, outdir):
    import torch.distributed.checkpoint as dcp

    from forge_num.distributed import checkpoint_state, load_checkpoint_state

    local = local_batches(4, rank, world)
    path = os.path.join(outdir, "ckpt")
    model = fsdp_shard(Tiny(seed=0))
    opt = make_opt("adamw", "forge", model.parameters())
    fn.prepare(model, opt)
    train_dist(model, opt, local[:2], "forge")
    state = checkpoint_state(model, opt)
    sharded = all(type(v).__name__ == "DTensor" for s in state["optim"]["state"].values()
                  for k, v in s.items() if k != "step")
    dcp.save(state, checkpoint_id=path)
    train_dist(model, opt, local[2:], "forge")
    first, first_step = full_params(model), opt._global_step

    model = fsdp_shard(Tiny(seed=7))
    opt = make_opt("adamw", "forge", model.parameters())
    fn.prepare(model, opt)
    state = checkpoint_state(model, opt)
    dcp.load(state, checkpoint_id=path)
    load_checkpoint_state(model, opt, state)
    assert opt._global_step == 2
    train_dist(model, opt, local[2:], "forge")
    refused = []
    for what, make in [
        ("8bit", lambda m: fn.AdamW(m.parameters(), precision="8bit", seed=0)),
        ("root", lambda m: fn.AdamW(m.parameters())),
    ]:
        m = Tiny(seed=0)
        if what == "8bit":
            fsdp_shard(m.to(torch.bfloat16))
        else:
            from torch.distributed.fsdp import fully_shard

            fully_shard(m.layers[0])  # the root and other blocks left unsharded
        try:
            fn.prepare(m, make(m))
        except NotImplementedError as e:
            refused.append(str(e))
    return dict(first=first, resumed=full_params(model), steps=(first_step, opt._global_step),
                sharded=sharded, refused=refused)


def test_checkpoint_resume_fully_sharded():
    """FSDP2, 2 ranks: torch.distributed.checkpoint of sharded weights and sharded optimizer states,
    resumed bitwise; what FSDP2 does not support (the 8bit regime, unsharded parameters) raises."""
    res = run_distributed("_fsdp_ckpt_worker")
    assert res["steps"] == (4, 4) and res["sharded"]
    _assert_bitwise(res["resumed"], res["first"], "FSDP2 checkpoint resume")
    assert len(res["refused"]) == 2
    assert "8bit" in res["refused"][0] and "fully_shard" in res["refused"][1]

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
    On this backend dW comes from the BLAS's mm, whose summation order may change with the shape of
    the slice (MKL on an AMD EPYC: it did for 10-column slices), so X and dY hold small multiples of
    1/8: every product and partial sum is exact in fp32 and dW is the same in any order. What is
    tested is the sharded update itself; the Triton mainloop's slice invariance holds by
    construction (a tile's K order does not depend on the grid) and is tested on the GPU."""
    from forge_num import rules

    rule = getattr(rules, name.upper())
    h = rule.scalars(RULES[name], 3)
    g = torch.Generator().manual_seed(P)
    K, M, N = 24, 48, 40
    # |x|, |dy| <= 4 in steps of 1/8: |products| <= 16 in steps of 2^-6, |sums| <= 384 (< 2^24 steps)
    x, dy = (torch.randint(-32, 33, (K, n), generator=g).float() / 8 for n in (N, M))
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


def _lowbit_sharded_worker(rank, world, outdir):
    """Tensor parallelism in the stochastic regimes: 8bit is refused with a clear error; bf16-sr
    trains, each shard drawing the Philox counters of its elements in the whole parameter."""
    from torch.distributed.device_mesh import init_device_mesh

    from forge_num.distributed import shard_counter

    model = parallelize(Tiny(seed=0), init_device_mesh("cpu", (world,)), sp=True).to(torch.bfloat16)
    out = {}
    try:
        fn.AdamW(model.parameters(), precision="8bit", seed=1)
        out["8bit"] = None
    except NotImplementedError as e:
        out["8bit"] = str(e)
    blk = model.layers[0]
    out["counters"] = {"wq": shard_counter(blk.wq.weight), "wo": shard_counter(blk.wo.weight),
                       "norm": shard_counter(blk.attn_norm.weight)}
    out["local_shapes"] = {"wq": tuple(blk.wq.weight.to_local().shape), "wo": tuple(blk.wo.weight.to_local().shape)}
    out["global_shapes"] = {"wq": tuple(blk.wq.weight.shape), "wo": tuple(blk.wo.weight.shape)}
    before = full_params(model)
    opt = fn.AdamW(model.parameters(), precision="bf16-sr", seed=1, **HYPER["adamw"])
    fn.prepare(model, opt)
    for ids in batches(2):
        model(ids).backward()
        opt.step()
    after = full_params(model)
    out["trained"] = all(torch.isfinite(after[k].float()).all() and not torch.equal(after[k], before[k])
                         for k in after if "layers" in k)
    return out


def _fsdp_bf16_sr_worker(rank, world, outdir):
    """FSDP2 in the bf16-sr regime: dim-0 shards draw the counters of their rows in the parameter."""
    from forge_num.distributed import shard_counter

    model = fsdp_shard(Tiny(seed=0).to(torch.bfloat16))
    wq = model.layers[0].wq.weight
    local, full = tuple(wq.to_local().shape), tuple(wq.shape)
    before = full_params(model)
    opt = fn.AdamW(model.parameters(), precision="bf16-sr", seed=3, **HYPER["adamw"])
    fn.prepare(model, opt)
    for ids in local_batches(2, rank, world):
        model(ids).backward()
        opt.step()
    after = full_params(model)
    counters = [None] * world
    dist.all_gather_object(counters, shard_counter(wq))
    return {"counters": counters, "local": local, "full": full,
            "trained": all(torch.isfinite(after[k].float()).all() and not torch.equal(after[k], before[k])
                           for k in after if "layers" in k)}


def test_fully_sharded_bf16_sr():
    res = run_distributed("_fsdp_bf16_sr_worker")
    (rows, cols), (lrows, _) = res["full"], res["local"]
    assert lrows < rows
    # rank r holds rows [r * rows / 2, ...): its elements draw the counters from r * (rows / 2) * cols on
    assert res["counters"] == [(cols, cols, r * lrows * cols) for r in range(len(res["counters"]))]
    assert res["trained"]


def test_sharded_parameters_in_the_stochastic_regimes():
    res = run_distributed("_lowbit_sharded_worker")
    msg = res["8bit"]
    assert msg and "sharded DTensor" in msg and "8bit" in msg, msg
    # rank 0's shards: wq rows [0, out/2) -> (C, C, 0); wo columns [0, in/2) -> (in/2, in, 0); the
    # replicated norm weight is not sharded
    (o, i), (lo, li) = res["global_shapes"]["wo"], res["local_shapes"]["wo"]
    assert res["counters"]["wq"] == (res["global_shapes"]["wq"][1],) * 2 + (0,)
    assert res["counters"]["wo"] == (li, i, 0) and lo == o
    assert res["counters"]["norm"] is None
    assert res["trained"]


@pytest.mark.parametrize("backend", ["torch", "kernels"])
@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("style", ["colwise", "rowwise"])
def test_sharded_bf16_sr_update_equals_unsharded(style, P, backend):
    """tests/kernel_cases.py::run_sharded_bf16_sr_case on the CPU (the kernels in the interpreter)."""
    from tests.kernel_cases import run_sharded_bf16_sr_case

    run_sharded_bf16_sr_case(backend, style, P, torch.device("cpu"))


def _tp_autocast_worker(rank, world, outdir):
    """A Colwise then a Rowwise Linear under autocast(bf16), SGD with lr = 1: the forward equals
    torch's own tensor-parallel forward under autocast, bit for bit, and each local weight shard moves
    by exactly dW = dyᵀ x computed in fp32 from the bf16 operands (never rounded to bf16)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    plan = {"0": ColwiseParallel(), "1": RowwiseParallel()}
    # A Colwise bias is part of the local product; a Rowwise bias is added to the reduced output, and
    # there torch's own autocast forward rounds differently (one bf16 ulp seen): left out here.
    net = nn.Sequential(nn.Linear(32, 16, bias=True), nn.Linear(16, 8, bias=False))
    ref = copy.deepcopy(net)
    parallelize_module(net, mesh, plan)
    parallelize_module(ref, mesh, plan)
    w0 = [net[i].weight.to_local().detach().clone() for i in (0, 1)]
    opt = fn.SGD(net.parameters(), lr=1.0)
    fn.prepare(net, opt)
    x = torch.randn(6, 32)  # the same on every rank (same seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = net[0](x)  # the local shard of the hidden features (ColwiseParallel's local output)
        y = net[1](h)
        h_ref = ref[0](x)
        y_ref = ref[1](h_ref)
    seen = {}
    h.register_hook(lambda g: seen.setdefault("dh", g))
    y.register_hook(lambda g: seen.setdefault("dy", g))
    (y.float() ** 2).sum().backward()
    opt.step()
    dw0 = seen["dh"].to(torch.bfloat16).float().t() @ x.to(torch.bfloat16).float()
    dw1 = seen["dy"].to(torch.bfloat16).float().t() @ h.detach().to(torch.bfloat16).float()
    # a whole tensor- and sequence-parallel model under autocast trains, every weight stays finite fp32
    model = parallelize(Tiny(seed=0), mesh, sp=True)
    before = full_params(model)
    o = fn.AdamW(model.parameters(), **HYPER["adamw"])
    fn.prepare(model, o)
    for ids in batches(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(ids)
        loss.backward()
        o.step()
    after = full_params(model)
    trained = all(torch.isfinite(after[k]).all() and after[k].dtype == torch.float32 and not torch.equal(after[k], before[k])
                  for k in after)
    return {
        "model_trained": trained and o.stats["nonfinite"] == 0,
        "dtypes": (str(h.dtype), str(y.dtype)),
        "forward_equal": (torch.equal(h, h_ref), torch.equal(y, y_ref)),
        "w0_equal": torch.equal(net[0].weight.to_local(), w0[0] - dw0),
        "w1_equal": torch.equal(net[1].weight.to_local(), w0[1] - dw1),
        "fp32_weights": all(p.dtype == torch.float32 for p in net.parameters()),
    }


def _tp_checkpoint_worker(rank, world, amp, outdir):
    """Tensor and sequence parallel, every block under non-reentrant activation checkpointing, where each
    sharded fused layer is two autograd nodes (forge_num/distributed.py): the same training as without
    checkpointing (one node), bit for bit, and the two-node form was taken."""
    from torch.distributed.device_mesh import init_device_mesh

    from forge_num import distributed as fd

    mesh = init_device_mesh("cpu", (world,))
    products = []
    real_apply = fd._ShardedFusedLinearProduct.apply
    fd._ShardedFusedLinearProduct.apply = lambda *a: products.append(1) or real_apply(*a)
    res = {}
    for ckpt in (True, False):
        model = parallelize(Tiny(seed=0), mesh, sp=True)
        if ckpt:
            for block in model.layers:
                block.forward = functools.partial(torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)
        opt = fn.AdamW(model.parameters(), **HYPER["adamw"])
        fn.prepare(model, opt)
        for ids in batches(3):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = model(ids)
            loss.backward()
            opt.step()
        res[ckpt] = full_params(model)
        res[f"products_{ckpt}"] = len(products)
    res["two_node_products"] = (res.pop("products_True"), res.pop("products_False"))
    return res


@pytest.mark.parametrize("amp", [False, True])
def test_tensor_parallel_under_checkpointing(amp):
    res = run_distributed("_tp_checkpoint_worker", amp)
    first, second = res["two_node_products"]
    assert first > 0 and second == first, res["two_node_products"]  # taken under checkpointing only
    _assert_bitwise(res[True], res[False], "TP checkpointed against not")


def test_tensor_parallel_under_autocast():
    res = run_distributed("_tp_autocast_worker")
    assert res["dtypes"] == ("torch.bfloat16", "torch.bfloat16")
    assert res["forward_equal"] == (True, True), res
    assert res["fp32_weights"]
    assert res["w0_equal"] and res["w1_equal"]
    assert res["model_trained"]
