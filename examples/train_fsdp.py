"""FSDP2 (``fully_shard``) training of a tiny Llama-like model with forge_num.

FSDP2 reduce-scatters each block's gradients as its backward ends and calls the sharded parameters'
post-accumulate-grad hooks; forge_num's hook updates the local shard (weights and optimizer states are
sharded DTensors) and frees the sharded gradient at once, so no rank ever holds the model's
gradients. Run on CPU (gloo) or GPUs (NCCL):

    torchrun --standalone --nproc_per_node=2 examples/train_fsdp.py
    torchrun --standalone --nproc_per_node=2 examples/train_fsdp.py --clip exact --accum 2
    torchrun --standalone --nproc_per_node=2 examples/train_fsdp.py --check   # also trains the same
        # FSDP2 model with torch.optim.AdamW and checks the weights agree bit for bit (fp32, no clipping)
    torchrun --standalone --nproc_per_node=2 examples/train_fsdp.py --save /tmp/ckpt   # then --load

Single process (world size 1) works too: ``python examples/train_fsdp.py``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tp import BATCH, SEQ, VOCAB, ExactSqrt, TinyLlama, full  # noqa: E402

import forge_num as fn  # noqa: E402
from forge_num.distributed import checkpoint_state, load_checkpoint_state  # noqa: E402


def build(seed):
    torch.manual_seed(seed)  # the same full weights on every rank; fully_shard keeps each rank's shard
    model = TinyLlama()
    for block in model.layers:
        fully_shard(block)
    return fully_shard(model)  # the root: embedding, final norm and head


def train(model, opt, steps, accum, rank, world, log, forge, opt_backward):
    g = torch.Generator().manual_seed(1)  # one global batch per micro-batch; each rank takes its rows
    for step in range(steps):
        for _ in range(accum):
            ids = torch.randint(0, VOCAB, (BATCH * world, SEQ), generator=g)
            ids = ids[rank * BATCH : (rank + 1) * BATCH]
            loss = model(ids) / accum
            if opt_backward:
                opt.backward(loss)  # exact clipping: the norm-only pass, then the updating one
            else:
                loss.backward()  # forge_num: every parameter is updated here (at the last micro-batch)
        if forge:
            opt.step()  # bookkeeping only
        else:
            with ExactSqrt():
                opt.step()
        opt.zero_grad(set_to_none=True)
        if log and (step % 5 == 0 or step == steps - 1):
            extra = ""
            if forge:
                coef = opt.stats["clip_coef"]
                extra = f"  grad-norm {opt.stats['grad_norm']:.4f}" + (f"  clip {coef:.4f}" if coef else "")
            print(f"step {step:3d}  loss {loss.item() * accum:.4f}{extra}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step")
    ap.add_argument("--clip", choices=["exact", "previous"], help="clip the global gradient norm to 0.5")
    ap.add_argument("--check", action="store_true", help="compare with torch.optim.AdamW, bitwise")
    ap.add_argument("--save", help="save a torch.distributed.checkpoint here after training")
    ap.add_argument("--load", help="resume from a torch.distributed.checkpoint before training")
    args = ap.parse_args()

    if "RANK" not in os.environ:  # plain `python examples/train_fsdp.py`: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    with torch.device(device):
        model = build(seed=0)
    clip = dict(max_grad_norm=0.5, clipping=args.clip) if args.clip else {}
    opt = fn.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, accumulation_steps=args.accum, **clip)
    fn.prepare(model, opt)
    if args.load:
        state = checkpoint_state(model, opt)  # the sharded structure to load into
        dcp.load(state, checkpoint_id=args.load)
        load_checkpoint_state(model, opt, state)
    if rank == 0:
        print(f"{world} rank(s), FSDP2: {len(model._forge_num_handle.sharded)} Linear layers updated on "
              f"their shards after FSDP2's reduce-scatter; starting at step {opt._global_step}")
    train(model, opt, args.steps, args.accum, rank, world, rank == 0, True, args.clip == "exact")
    if args.save:
        dcp.save(checkpoint_state(model, opt), checkpoint_id=args.save)

    if args.check:
        if args.clip or args.load:
            raise SystemExit("--check compares unclipped runs from scratch")
        with torch.device(device):
            ref = build(seed=0)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.01, foreach=False)
        train(ref, ref_opt, args.steps, args.accum, rank, world, False, False, False)
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
