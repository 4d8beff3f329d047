"""Tensor-parallel training step of a Llama model (transformers, random init) with forge_num or
torch.optim.AdamW: peak memory per rank and tokens/s, and the largest micro-batch that fits.

Issue 7's run (several GPUs, NCCL). Each rank holds 1/P of every attention and MLP projection
(q, k, v, gate, up Colwise; o, down Rowwise, as torchtitan's Llama plan); the embedding, the LM
head and the norms stay replicated. forge_num's fused layers update their local shards inside the
backward (forge_num.distributed); torch_adamw keeps fp32 parameters, gradients and AdamW state
under autocast (AMP).

    torchrun --standalone --nproc_per_node=2 bench/tp_train.py --model llama-8b --method forge \\
        --batch 4 --seq 2048 --checkpointing --out tp.json            # one measurement
    python bench/tp_train.py --find-batch --nproc 2 --model llama-8b --methods forge,torch_adamw \\
        --out tp_capacity.json                                       # the largest micro-batch, each method
    python bench/tp_train.py --spawn 2 --model tiny --method forge   # CPU smoke test (gloo)

Methods: forge (fp32 weights and state, autocast bf16), forge_bf16sr (bf16 weights and state,
stochastic rounding), torch_adamw (fp32, autocast, AdamW(fused=True) on CUDA). The 8bit regime is
not available under tensor parallelism yet (its states' layout; forge_num.distributed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

# Run as `python bench/tp_train.py`, sys.path[0] is bench/, whose kernels.py would shadow the PyPI package
# `kernels` (bitsandbytes and transformers >= 5.25 import it); the repository root, whose kernels/
# would shadow it too, goes behind site-packages (tests/conftest.py says more).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (_HERE, _ROOT)] + [_ROOT]

from bench.train_step import GIB, MODELS  # noqa: E402

METHODS = ("forge", "forge_bf16sr", "torch_adamw")
HYPER = {"lr": 1e-4, "weight_decay": 0.01}
PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
        "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
        "mlp.down_proj": "rowwise"}


def parallelize_llama(model, mesh) -> None:
    """The attention and MLP projections of every decoder layer: Colwise / Rowwise over ``mesh``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    P = mesh.size()
    cfg = model.config
    if cfg.num_attention_heads % P or cfg.num_key_value_heads % P or cfg.intermediate_size % P:
        raise ValueError(f"heads {cfg.num_attention_heads}/{cfg.num_key_value_heads} and MLP width "
                         f"{cfg.intermediate_size} must divide by the {P} ranks")
    style = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for layer in model.model.layers:
        parallelize_module(layer, mesh, {name: style[kind]() for name, kind in PLAN.items()})


def run_rank(args) -> dict | None:
    """One measurement on this rank (the process group is initialized); rank 0 returns the row."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from bench.train_step import _build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (world,))
    cfg = dict(MODELS[args.model])
    row = {"method": args.method, "model": args.model, "ranks": world, "batch": args.batch, "seq": args.seq,
           "checkpointing": args.checkpointing, "status": "error", "reason": None}
    t_start = time.perf_counter()
    try:
        torch.manual_seed(0)
        dtype = torch.bfloat16 if args.method == "forge_bf16sr" else torch.float32
        model = _build_model(cfg, dtype, device, args.checkpointing)
        parallelize_llama(model, mesh)
        if args.method == "torch_adamw":
            import forge_num  # noqa: F401  (the same imports on every path)

            opt = torch.optim.AdamW(model.parameters(), fused=cuda, foreach=False if not cuda else None, **HYPER)
            amp = torch.bfloat16

            def after():
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:
            import forge_num

            precision = "fp32" if args.method == "forge" else "bf16-sr"
            opt = forge_num.AdamW(model.parameters(), precision=precision, seed=0, **HYPER)
            forge_num.prepare(model, opt)
            amp = torch.bfloat16 if precision == "fp32" else None
            after = opt.step
        ids = torch.randint(0, cfg["vocab_size"], (args.batch, args.seq), device=device,
                            generator=torch.Generator(device=device).manual_seed(1))
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for k in range(args.warmup + args.steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            after()
            if cuda:
                torch.cuda.synchronize()
            if k >= args.warmup:
                times.append(time.perf_counter() - t0)
            losses.append(float(loss))
        peak = torch.tensor([torch.cuda.max_memory_allocated() / GIB if cuda else float("nan")], device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        row.update(status="ok", losses=losses, step_s=times,
                   tokens_per_s=args.batch * args.seq / statistics.median(times) if times else None,
                   peak_gib_max_rank=None if not cuda else float(peak))
    except torch.OutOfMemoryError as e:
        row.update(status="oom", reason=str(e).splitlines()[0][:300])
    except Exception as e:  # noqa: BLE001 - reported, never dropped
        row.update(status="oom" if "out of memory" in str(e).lower() else "error",
                   reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400])
    row["wall_s"] = time.perf_counter() - t_start
    return row if rank == 0 else None


def _write(path, rows, extra=None) -> None:
    import torch

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "command": " ".join(sys.argv),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, **(extra or {})}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


def _spawned(rank, world, port, args):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ok = False
    try:
        row = run_rank(args)
        if row is not None and args.out:
            _write(args.out, [row])
        if row is not None:
            print("TP_TRAIN_RESULT " + json.dumps(row), flush=True)
        ok = True
    finally:
        dist.barrier()
        dist.destroy_process_group()
    if ok:
        # Skip the interpreter's teardown, as tests/test_distributed.py's ranks do: with DTensor's
        # async collectives torch 2.13 sometimes aborts there ("terminate called without an active
        # exception", seen in CI under load) after all work is done and the result printed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _probe(args, method: str, batch: int) -> dict:
    """One torchrun measurement in fresh processes (an OOM cannot poison the next probe)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           os.path.abspath(__file__), "--model", args.model, "--method", method, "--batch", str(batch),
           "--seq", str(args.seq), "--warmup", "1", "--steps", "1"] + (["--checkpointing"] if args.checkpointing else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout).stdout
    except subprocess.TimeoutExpired:
        return {"method": method, "batch": batch, "status": "timeout"}
    for line in out.splitlines():
        if line.startswith("TP_TRAIN_RESULT "):
            return json.loads(line[len("TP_TRAIN_RESULT "):])
    return {"method": method, "batch": batch, "status": "error", "reason": out[-400:]}


def find_batch(args, probe=_probe) -> list:
    """The largest micro-batch (x seq tokens) whose step fits, per method: doubling, then bisection."""
    rows = []
    for method in args.methods.split(","):
        lo, hi, b, probes = 0, None, 1, []
        while hi is None or hi - lo > 1:
            r = probe(args, method, b)
            probes.append(r)
            if r["status"] == "ok":
                lo = b
                b = b * 2 if hi is None else (lo + hi) // 2
            elif r["status"] == "oom":
                hi = b
                b = (lo + hi) // 2
            else:
                break
            if b == lo or (hi is not None and b >= hi):
                break
        rows.append({"method": method, "largest_batch": lo, "seq": args.seq, "probes": probes})
        if args.out:
            _write(args.out, rows, {"ranks": args.nproc, "model": args.model})
        print(f"{method:<13} largest micro-batch {lo} x {args.seq} tokens on {args.nproc} ranks", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-8b", choices=sorted(MODELS))
    ap.add_argument("--method", default="forge", choices=METHODS)
    ap.add_argument("--methods", default=",".join(METHODS), help="--find-batch: methods to search")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU even where CUDA exists")
    ap.add_argument("--spawn", type=int, default=0, help="run N ranks with gloo here (CPU smoke test)")
    ap.add_argument("--find-batch", action="store_true")
    ap.add_argument("--nproc", type=int, default=2, help="--find-batch: ranks per probe (torchrun)")
    ap.add_argument("--run-timeout", type=float, default=600.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.find_batch:
        find_batch(args)
        return 0
    if args.spawn:
        import socket

        import torch.multiprocessing as mp

        args.cpu = True
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(_spawned, args=(args.spawn, port, args), nprocs=args.spawn, start_method="spawn")
        return 0
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() and not args.cpu else "gloo"
    dist.init_process_group(backend)
    try:
        row = run_rank(args)
        if row is not None:
            print("TP_TRAIN_RESULT " + json.dumps(row), flush=True)
            if args.out:
                _write(args.out, [row])
    finally:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
