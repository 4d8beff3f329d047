"""The ``forge-num`` command.

    forge-num train [--compare] [options]   train a small Llama on the Python standard library's source
    forge-num verify [args...]              the verification report (forge_num.verify)

``forge-num train --compare`` trains one randomly initialised LlamaForCausalLM (transformers) twice
from one seed on the same batches: with forge_num (every update folded into the backward pass) and
with ``torch.optim.AdamW(foreach=False)``. It prints both losses and the largest parameter difference
per step, then each side's peak step memory and tokens/s, and writes a loss-curve PNG.

The corpus needs no download: the ``.py`` files of the running interpreter's standard library
(``sysconfig.get_paths()['stdlib']``), as bytes (vocabulary 256).

On the CPU the torch reference uses a correctly rounded square root (torch's CPU float32 ``sqrt`` is
not correctly rounded; forge_num's rules use the IEEE one), so the two runs agree bit for bit and the
parameter difference printed is 0; ``--torch-sqrt`` keeps torch's own sqrt to show the difference it
makes. On CUDA forge_num runs the Triton kernels, whose dW summation order is not cuBLAS's, so the
two runs agree to rounding, not bitwise.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import sysconfig
import time

__all__ = ["main", "load_stdlib_corpus"]


def load_stdlib_corpus(max_bytes: int = 8 << 20) -> bytes:
    """The standard library's .py files (sorted by path), concatenated, at most ``max_bytes``."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("site-packages", "__pycache__", "test", "tests")
        )
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            chunks.append(data)
            total += len(data)
            if total >= max_bytes:
                return b"".join(chunks)[:max_bytes]
    if total == 0:
        raise RuntimeError(f"no .py files found under the standard library at {root}")
    return b"".join(chunks)


# --------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------


def _defaults(device: str) -> dict:
    if device == "cuda":
        return dict(steps=300, batch=16, seq=512, hidden=512, layers=4, heads=8, lr=1e-3)
    return dict(steps=200, batch=8, seq=256, hidden=128, layers=2, heads=4, lr=3e-3)


class _ExactSqrt:
    """A TorchFunctionMode redirecting float32 torch.sqrt / Tensor.sqrt to a correctly rounded sqrt."""

    def __new__(cls):
        import torch
        from torch.overrides import TorchFunctionMode

        class ExactSqrt(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func in (torch.sqrt, torch.Tensor.sqrt) and args[0].dtype == torch.float32 and not kwargs:
                    return args[0].double().sqrt().float()
                return func(*args, **kwargs)

        return ExactSqrt()


def _build_model(args, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3 // 8 * 8,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.seq,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(cfg).to(device)


class _StepMemory:
    """Peak memory allocated during one training step, above what was allocated when it began.

    CUDA: the caching allocator's peak. CPU: every tensor an ATen operation creates (forward,
    backward on the same thread, optimizer) is counted from its creation until it is freed, through a
    TorchDispatchMode; views are not counted twice.
    """

    def __init__(self, device):
        self.device = device

    def measure(self, fn):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base
        with _live_bytes() as live:
            fn()
        return live.peak


def _live_bytes():
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self.sizes = {}

        def _free(self, ptr):
            self.live -= self.sizes.pop(ptr, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    storage = t.untyped_storage()
                    ptr = storage.data_ptr()
                    if ptr and ptr not in self.sizes:
                        self.sizes[ptr] = storage.nbytes()
                        self.live += storage.nbytes()
                        self.peak = max(self.peak, self.live)
                        weakref.finalize(t, self._free, ptr)
            return out

    return LiveBytes()


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def _train(args) -> int:
    import torch
    from tqdm import tqdm

    import forge_num
    from forge_num.fused import prepare

    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        print("forge-num train needs transformers: pip install 'forge_num[hf]'", file=sys.stderr)
        return 2

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    for key, value in _defaults(device).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.hidden % args.heads:
        print(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}", file=sys.stderr)
        return 2

    corpus = load_stdlib_corpus()
    data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8).to(torch.long)
    if data.numel() <= args.seq + 1:
        print("the standard-library corpus is too small for --seq", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(args.seed)

    def batch():
        starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=gen)
        rows = torch.stack([data[s : s + args.seq] for s in starts.tolist()])
        return rows.to(device)

    def schedule(opt):
        warm = max(1, args.steps // 10)

        def f(step):
            if step < warm:
                return (step + 1) / warm
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))

        return torch.optim.lr_scheduler.LambdaLR(opt, f)

    sides = {}
    model = _build_model(args, device)
    nparams = sum(p.numel() for p in model.parameters())
    opt = forge_num.AdamW(
        model.parameters(),
        lr=args.lr,
        weight_decay=0.1,
        max_grad_norm=args.max_grad_norm,
        clipping="exact" if args.max_grad_norm else None,
    )
    prepare(model, opt)
    sides["forge_num"] = dict(model=model, opt=opt, sched=schedule(opt), losses=[], time=0.0, mem=None)
    if args.compare:
        ref = _build_model(args, device)
        ropt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.1, foreach=False)
        sides["torch"] = dict(model=ref, opt=ropt, sched=schedule(ropt), losses=[], time=0.0, mem=None)
    exact_sqrt = args.compare and device == "cpu" and not args.torch_sqrt

    print(
        f"forge-num train: LlamaForCausalLM, {args.layers} layers, hidden {args.hidden}, "
        f"{nparams / 1e6:.2f}M "
        f"parameters; {len(corpus) / 1e6:.1f} MB of standard-library source as bytes; batch {args.batch} x "
        f"{args.seq} tokens, {args.steps} steps on {device}"
        + (f"; forge_num uses {'the Triton kernels' if device == 'cuda' else 'the torch backend'}")
    )
    if args.compare:
        print(
            "reference: torch.optim.AdamW(foreach=False)"
            + (" with a correctly rounded sqrt (torch's CPU float32 sqrt is not)" if exact_sqrt else "")
        )
        print(f"{'step':>5} {'loss forge_num':>15} {'loss torch':>12} {'max |param diff|':>17}")

    mem = _StepMemory(device)
    tokens = args.batch * args.seq

    def one_step(side, ids):
        m, o = side["model"], side["opt"]
        loss = m(input_ids=ids, labels=ids).loss
        if side is sides["forge_num"]:
            o.backward(loss)
            o.step()
        else:
            loss.backward()
            if args.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(m.parameters(), args.max_grad_norm)
            if exact_sqrt:
                with _ExactSqrt():
                    o.step()
            else:
                o.step()
            o.zero_grad(set_to_none=True)
        side["sched"].step()
        return loss.detach()

    bar = tqdm(range(args.steps), desc="training", unit="step", disable=args.no_progress, file=sys.stderr)
    measure_at = min(2, args.steps - 1)
    for step in bar:
        ids = batch()
        for side in sides.values():
            if step == measure_at:
                side["mem"] = mem.measure(lambda s=side, ids=ids: s["losses"].append(float(one_step(s, ids))))
                continue
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = one_step(side, ids)
            if device == "cuda":
                torch.cuda.synchronize()
            if step > 0:
                side["time"] += time.perf_counter() - t0
            side["losses"].append(float(loss))
        lf = sides["forge_num"]["losses"][-1]
        bar.set_postfix(loss=f"{lf:.4f}")
        if args.compare:
            diff = max(
                (a - b).abs().max().item()
                for a, b in zip(
                    sides["forge_num"]["model"].parameters(), sides["torch"]["model"].parameters()
                )
            )
            bar.write(f"{step + 1:>5} {lf:>15.6f} {sides['torch']['losses'][-1]:>12.6f} {diff:>17.3e}")
    bar.close()

    timed = max(1, args.steps - 2)  # the first step (warm-up) and the memory-profiled one are not timed
    print()
    for name, side in sides.items():
        tps = tokens * timed / side["time"] if side["time"] > 0 else float("nan")
        state = sum(p.numel() * p.element_size() for p in side["model"].parameters())
        state += sum(
            t.numel() * t.element_size()
            for s in side["opt"].state.values()
            for t in s.values()
            if torch.is_tensor(t)
        )
        print(
            f"{name:>10}: final loss {side['losses'][-1]:.4f}, {tps:,.0f} tokens/s, peak step memory "
            f"{_fmt_bytes(side['mem'] or 0)} above the weights and optimizer state ({_fmt_bytes(state)})"
        )
    if args.compare:
        same = sides["forge_num"]["losses"] == sides["torch"]["losses"]
        print(f"losses identical at every step: {'yes' if same else 'no'}")
    if device != "cuda":
        print(
            "(on the CPU forge_num runs its torch backend, a reference for the Triton kernels: the same "
            "correctly rounded fp32 operations, blocked dW; speed and memory at scale are the GPU's to show)"
        )
    if args.plot:
        _plot(sides, args.plot)
        print(f"loss curve: {args.plot}")
    return 0


def _plot(sides, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"forge_num": dict(lw=2.0), "torch": dict(lw=1.0, ls="--")}
    for name, side in sides.items():
        label = "forge_num AdamW (update in backward)" if name == "forge_num" else "torch.optim.AdamW"
        ax.plot(range(1, len(side["losses"]) + 1), side["losses"], label=label, **styles[name])
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_title("Llama on the Python standard library, byte level")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="forge-num", description="forge_num: the optimizer step fused into backward"
    )
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a small Llama on the standard library's source")
    t.add_argument("--compare", action="store_true", help="also train with torch.optim.AdamW and compare")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--batch", type=int, default=None)
    t.add_argument("--seq", type=int, default=None, help="tokens (bytes) per sequence")
    t.add_argument("--hidden", type=int, default=None)
    t.add_argument("--layers", type=int, default=None)
    t.add_argument("--heads", type=int, default=None)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--max-grad-norm", type=float, default=None, help="exact global clipping")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    t.add_argument("--plot", default="forge-num-train.png", help="loss-curve PNG ('' for none)")
    t.add_argument("--torch-sqrt", action="store_true", help="reference keeps torch's own float32 sqrt")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    v = sub.add_parser("verify", help="the verification report (forge_num.verify)", add_help=False)
    v.add_argument("args", nargs=argparse.REMAINDER)
    r = sub.add_parser("report", help="reports: `report bias` (forge_num.report)", add_help=False)
    r.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "verify":
        import importlib

        verify = importlib.import_module("forge_num.verify")
        return verify.main(argv[1:])
    if argv and argv[0] == "report":
        if argv[1:2] != ["bias"]:
            print("usage: forge-num report bias [--draws N] [--out DIR] (see --help)", file=sys.stderr)
            return 2
        from forge_num import report

        return report.main(argv[2:])
    args = _parser().parse_args(argv)
    if args.command == "train":
        for name in ("steps", "batch", "seq", "hidden", "layers", "heads"):
            value = getattr(args, name)
            if value is not None and value < 1:
                print(f"--{name} must be >= 1, got {value}", file=sys.stderr)
                return 2
        return _train(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
