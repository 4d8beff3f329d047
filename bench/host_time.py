"""Host (CPU) time of forge_num's launches and of a training step, and where it goes.

Session 6 found forge's 8B training step host-bound on the H200 machine: the profiled step's
kernels summed to 361 ms of a 702 ms wall (AMP: 414 of 369), and one ``fused_linear_update`` call
took 200-360 us of host time there. This script measures that host time and splits it by Python
function (cProfile), so that a change to the launcher or the optimizer can be judged by it:

    python bench/host_time.py [--part launch,step] [--layers 2] [--out bench/results/x.json]

launch  per-call host time of kernels.fused_linear_update (default tile and a given one),
        kernels.elementwise_update, and of torch ops for scale (one empty/zeros/add), on a
        1024x1024 weight with 128 tokens (GPU time far below host time, so the loop of calls
        measures the host alone); then cProfile's split of the fused call.
step    a Llama-8B-width model with --layers layers, 1x2048 tokens, checkpointing: each method's
        step wall time, the profiler's summed kernel time, and cProfile's top functions of one step.
python  forge's own per-linear Python, on any device (the CPU included): a narrow Llama
        (hidden 32, --python-layers layers, 16 tokens, --python-checkpointing on/off) trained with forge_num.AdamW
        on a backend whose functions return at once, against nn.Linear + torch AdamW(foreach);
        each step's time (the minimum over interleaved rounds, the host being noisy), the
        difference per linear, and cProfile's top functions of forge's step.
launch and step need CUDA.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch

# Run as `python bench/host_time.py`, sys.path[0] is bench/, whose kernels.py would shadow the PyPI package
# `kernels` (bitsandbytes and transformers >= 5.25 import it); the repository root, whose kernels/
# would shadow it too, goes behind site-packages (tests/conftest.py says more).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (_HERE, _ROOT)] + [_ROOT]

from bench import train_step as ts  # noqa: E402
from bench.kernels import host_us  # noqa: E402


def top_functions(fn, n: int = 25, sort: str = "tottime") -> list[dict]:
    """cProfile of fn(): the n functions with the largest ``sort`` time, in ms."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append({"function": f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line}({name})",
                     "calls": nc, "tottime_ms": tt * 1e3, "cumtime_ms": ct * 1e3})
    return sorted(rows, key=lambda r: -r[f"{sort}_ms"])[:n]


def part_launch() -> dict:
    from forge_num import kernels, rules

    M = N = 1024
    K = 128
    x = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(K, M, device="cuda", dtype=torch.bfloat16) * 1e-3
    w = torch.randn(M, N, device="cuda") * 0.02
    m, v, g = torch.zeros_like(w), torch.zeros_like(w), torch.randn_like(w) * 1e-3
    h = rules.ADAMW.scalars({"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, 1)
    cfg = kernels.default_config(M, N, K, torch.bfloat16)
    small = torch.empty(1, device="cuda")
    fns = {
        "fused_linear_update (default tile)": lambda: kernels.fused_linear_update(w, x, dy, [m, v], rules.ADAMW, h),
        "fused_linear_update (config given)": lambda: kernels.fused_linear_update(w, x, dy, [m, v], rules.ADAMW, h,
                                                                                  config=cfg),
        "elementwise_update": lambda: kernels.elementwise_update(w, g, [m, v], rules.ADAMW, h),
        "torch.empty(1)": lambda: torch.empty(1, device="cuda"),
        "torch.zeros(1)": lambda: torch.zeros(1, device="cuda"),
        "torch.add(t, t)": lambda: torch.add(small, small),
        "dy.t() @ x": lambda: dy.t() @ x,
    }
    for f in fns.values():  # compile and warm
        f()
    out = {"host_us": {name: host_us(f, calls=200, loops=5) for name, f in fns.items()}}
    def calls():  # each result dropped at once, as in host_us's loop
        for _ in range(200):
            fns["fused_linear_update (default tile)"]()

    out["fused_profile"] = top_functions(calls)
    return out


def part_step(layers: int) -> dict:
    cfg = dict(ts.MODELS["llama-8b"], num_hidden_layers=layers)
    out = {}
    for method in ("forge", "torch_adamw"):
        model = ts._build_model(cfg, torch.float32, torch.device("cuda"), True)
        amp_dtype, after = ts._setup(method, model, True)
        ids = torch.randint(0, cfg["vocab_size"], (1, 2048), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            after()

        walls = []
        for k in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if k >= 2:
                walls.append((time.perf_counter() - t0) * 1e3)
        prof = ts.profile_step(step, True)
        out[method] = {"wall_ms": walls, "profile_wall_ms": prof["profile_wall_ms"],
                       "profile_device_ms": prof["profile_device_ms"], "profile_ms": prof["profile_ms"],
                       "cprofile_tottime": top_functions(step, 30), "cprofile_cumtime": top_functions(step, 40, "cumtime")}
        model = after = step = None  # free the model before the next method builds its own
        torch.cuda.empty_cache()
    return out


class _NoKernels:
    """A forge_num backend (optim.BACKEND_FUNCTIONS) that launches nothing: what remains of a
    step is the host's Python around the kernels."""

    class _Stats:
        partials = (torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.int32))

    def fused_linear_update(self, *args, **kwargs):
        return self._Stats()

    def elementwise_update(self, *args, **kwargs):
        return self._Stats()

    def weight_grad_norm_sq(self, *args, **kwargs):
        return torch.zeros((), dtype=torch.float64)

    def accumulate_weight_grad(self, *args, **kwargs):
        return None


def part_python(layers: int, rounds: int = 5, steps: int = 10, checkpointing: bool = True) -> dict:
    import forge_num
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, use_cache=False, attn_implementation="sdpa")
    ids = torch.randint(0, 128, (1, 16), device=device)

    def model():
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg).to(device)
        m.train()
        if checkpointing:
            m.gradient_checkpointing_enable({"use_reentrant": False})
        return m

    plain = model()
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-3, foreach=True)
    fused = model()
    fused_opt = forge_num.AdamW(fused.parameters(), lr=1e-3, backend=_NoKernels())
    forge_num.prepare(fused, fused_opt)

    def plain_step():
        plain(input_ids=ids, labels=ids).loss.backward()
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)

    def forge_step():
        fused(input_ids=ids, labels=ids).loss.backward()
        fused_opt.step()

    def seconds(step):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    for step in (plain_step, forge_step):
        for _ in range(3):
            step()
    best = {"plain": float("inf"), "forge": float("inf")}
    for _ in range(rounds):  # interleaved, so that a slow spell of the host hits both
        best["plain"] = min(best["plain"], seconds(plain_step))
        best["forge"] = min(best["forge"], seconds(forge_step))
    linears = 7 * layers
    return {"device": str(device), "layers": layers, "linears": linears, "checkpointing": checkpointing,
            "plain_step_ms": best["plain"] * 1e3, "forge_step_ms": best["forge"] * 1e3,
            "forge_extra_us_per_linear": (best["forge"] - best["plain"]) / linears * 1e6,
            "cprofile_tottime": top_functions(forge_step, 30)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="launch,step")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--python-layers", type=int, default=16)
    ap.add_argument("--python-checkpointing", choices=["on", "off"], default="on")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    parts = args.part.split(",")
    cuda = torch.cuda.is_available()
    if not cuda and set(parts) - {"python"}:
        raise SystemExit("bench/host_time.py --part launch/step measures CUDA launches: no CUDA device here "
                         "(--part python runs anywhere)")
    res = {"meta": {"gpu": torch.cuda.get_device_name(0) if cuda else None, "torch": torch.__version__,
                    "command": "python bench/host_time.py " + " ".join(sys.argv[1:] if argv is None else argv)}}
    if "python" in parts:
        r = res["python"] = part_python(args.python_layers, checkpointing=args.python_checkpointing == "on")
        print(f"python ({r['device']}, {r['layers']} layers, checkpointing {args.python_checkpointing}, kernels stubbed): "
              f"nn.Linear + torch AdamW "
              f"{r['plain_step_ms']:.2f} ms a step, forge {r['forge_step_ms']:.2f} ms: "
              f"{r['forge_extra_us_per_linear']:.1f} us more per linear", flush=True)
        for row in r["cprofile_tottime"][:15]:
            print(f"  {row['tottime_ms']:7.1f} ms self {row['cumtime_ms']:7.1f} cum {row['calls']:>6}x  {row['function']}")
    if "launch" in parts:
        res["launch"] = part_launch()
        for name, us in res["launch"]["host_us"].items():
            print(f"host {name:<40} {us:8.1f} us/call", flush=True)
        if "telemetry_pairs_kept" in res["launch"]:
            print(f"telemetry pairs kept (device, stream, tiles): {res['launch']['telemetry_pairs_kept']}", flush=True)
        for r in res["launch"]["fused_profile"][:15]:
            print(f"  {r['tottime_ms'] / 200 * 1e3:7.1f} us/call self  {r['cumtime_ms'] / 200 * 1e3:7.1f} cum  "
                  f"{r['calls'] // 200:>3}x  {r['function']}", flush=True)
    if "step" in parts:
        res["step"] = part_step(args.layers)
        for method, r in res["step"].items():
            print(f"step {method:<12} wall {statistics.median(r['wall_ms']):7.1f} ms  profiled wall "
                  f"{r['profile_wall_ms']:7.1f} kernels {r['profile_device_ms']:7.1f} ms", flush=True)
            for row in r["cprofile_tottime"][:12]:
                print(f"  {row['tottime_ms']:7.1f} ms self {row['cumtime_ms']:7.1f} cum {row['calls']:>6}x  {row['function']}")
            print("  cumulative:")
            for row in r["cprofile_cumtime"][:25]:
                print(f"  {row['tottime_ms']:7.1f} ms self {row['cumtime_ms']:7.1f} cum {row['calls']:>6}x  {row['function']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
