"""Tensor-parallel (optionally sequence-parallel) training of a tiny Llama-like model with forge_num.

Every sharded Linear weight is updated inside its layer's backward, on its local shard, from the
local activations and output gradients (no weight gradient is materialized, no communication for
the update); replicated norm weights under sequence parallelism have their Partial gradient reduced
and are updated in a hook. Run on CPU (gloo) or GPUs (NCCL):

    torchrun --standalone --nproc_per_node=2 examples/train_tp.py
    torchrun --standalone --nproc_per_node=2 examples/train_tp.py --sp --steps 20
    torchrun --standalone --nproc_per_node=2 examples/train_tp.py --check   # also trains the same
        # parallel model with torch.optim.AdamW and checks the weights agree bit for bit (fp32)

Single process (world size 1) works too: ``python examples/train_tp.py``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import forge_num as fn

VOCAB, DIM, HEADS, HIDDEN, LAYERS, SEQ, BATCH = 256, 64, 4, 128, 2, 16, 4


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
        self.attn_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        h = self.attn_norm(x)
        b, s = h.shape[0], h.shape[1]
        q, k, v = (m(h).view(b, s, -1, DIM // HEADS).transpose(1, 2) for m in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # this rank's heads
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):
        x = self.tok(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1))


def parallelize(model, mesh, sp):
    for blk in model.layers:
        # Under SP declare the Colwise inputs Shard(1): the parallel style all-gathers them.
        col = ColwiseParallel(input_layouts=Shard(1)) if sp else ColwiseParallel()
        row = RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()
        plan = {"wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "w3": col, "w2": row}
        if sp:
            plan.update(attn_norm=SequenceParallel(), ffn_norm=SequenceParallel())
            plan[""] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True
            )
        parallelize_module(blk, mesh, plan)
    if sp:
        top = {
            "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        }
    else:
        top = {"head": ColwiseParallel(output_layouts=Replicate())}
    return parallelize_module(model, mesh, top)


def build(mesh, sp, seed):
    torch.manual_seed(seed)  # the same full weights on every rank; each keeps its shard
    return parallelize(TinyLlama(), mesh, sp)


def train(model, opt, steps, seed, log, forge):
    g = torch.Generator().manual_seed(seed)  # the same batches on every rank (TP ranks share data)
    for step in range(steps):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        loss = model(ids)
        loss.backward()  # forge_num: every parameter is updated here
        opt.step()  # forge_num: bookkeeping only
        opt.zero_grad(set_to_none=True)
        if log and (step % 5 == 0 or step == steps - 1):
            extra = f"  grad-norm {opt.stats['grad_norm']:.4f}" if forge else ""
            print(f"step {step:3d}  loss {loss.item():.4f}{extra}", flush=True)


class ExactSqrt(TorchFunctionMode):
    """torch.optim's float32 sqrt correctly rounded, as forge_num's rules compute it (torch's CPU
    float32 sqrt is one ulp off on some inputs): the reference then follows the same IEEE ops."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.sqrt, torch.Tensor.sqrt) and args[0].dtype == torch.float32:
            return args[0].double().sqrt().float()
        return func(*args, **(kwargs or {}))


def full(p):
    p = p.detach()
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sp", action="store_true", help="sequence parallelism as well")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--check", action="store_true", help="compare with torch.optim.AdamW, bitwise")
    args = ap.parse_args()

    if "RANK" not in os.environ:  # plain `python examples/train_tp.py`: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if DIM % world or HEADS % world or HIDDEN % world or VOCAB % world or (args.sp and SEQ % world):
        raise SystemExit(f"world size {world} must divide the model's dimensions")
    mesh = init_device_mesh(device, (world,))
    with torch.device(device):
        model = build(mesh, args.sp, seed=0)
    opt = fn.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    fn.prepare(model, opt)
    if rank == 0:
        fused = model._forge_num_handle.fused
        print(f"{world} rank(s), {'TP+SP' if args.sp else 'TP'}: {len(fused)} sharded Linear layers fused")
    train(model, opt, args.steps, seed=1, log=rank == 0, forge=True)

    if args.check:
        with torch.device(device):
            ref = build(mesh, args.sp, seed=0)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.01, foreach=False)
        with ExactSqrt():
            train(ref, ref_opt, args.steps, seed=1, log=False, forge=False)
        diffs = {
            n: (full(p) - full(q)).abs().max().item()
            for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters())
        }
        if rank == 0:
            worst = max(diffs.items(), key=lambda kv: kv[1])
            same = sum(d == 0 for d in diffs.values())
            print(f"vs torch.optim.AdamW: {same}/{len(diffs)} parameters bitwise equal; max |diff| "
                  f"{worst[1]:.3e} ({worst[0]})")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
