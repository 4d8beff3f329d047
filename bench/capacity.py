"""Capacity: the largest model and the largest micro-batch whose full training step fits on one GPU.

For each method of bench/train_step.py:

    max depth   the Llama-8B width (hidden 4096, MLP 14336, 32/8 heads, vocab 128256) with more or
                fewer layers: the most layers whose training step (batch 1 x 2048 tokens) fits,
                found by galloping from the memory model's prediction, then bisection
    max batch   the largest micro-batch (x 2048 tokens) of the 8B model whose step fits

Each probe is one fresh process running two training steps (warm-up + one) of bench/train_step.py's
worker; a probe fits when it finishes, and does not when it runs out of memory. Any other failure
stops that method's search and is reported with its reason. Ratios are to torch_adamw (AMP).

    python bench/capacity.py [--methods forge,torch_adamw] [--checkpointing on] [--out x.json]
    python bench/capacity.py --tiny --memory-limit-gib 0.005   # CPU: the tiny width, a fake limit

--memory-limit-gib on a GPU caps the allocator (torch.cuda.set_per_process_memory_fraction); on
the CPU (no allocator peak) a probe runs the real step and is judged by the memory model
(train_step.predict_peak_bytes) against the limit, which tests the search logic.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Run as `python bench/capacity.py`, sys.path[0] is bench/, whose kernels.py would shadow the PyPI package
# `kernels` (bitsandbytes and transformers >= 5.25 import it); the repository root, whose kernels/
# would shadow it too, goes behind site-packages (tests/conftest.py says more).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (_HERE, _ROOT)] + [_ROOT]

from bench import train_step as ts  # noqa: E402

GIB = ts.GIB


def search_max(fits, start: int, upper: int, resolution: int = 1) -> tuple[int, list]:
    """Largest n in [1, upper] with fits(n) (fits monotone: True up to the answer), 0 if none; with
    ``resolution`` r > 1, an n that fits where n + r does not (the answer lies in [n, n + r - 1]).

    Gallops from ``start`` (steps doubling) to bracket the answer, then bisects. ``fits`` returns
    True, False, or raises to abort. Returns (answer, [(n, fits)] in probe order).
    """
    probes = []

    def probe(n):
        ok = fits(n)
        probes.append((n, ok))
        return ok

    start = max(1, min(upper, start))
    step = max(1, resolution, start // 32)  # the memory model has been within 2.3% of every measured peak
    if probe(start):
        lo, hi = start, None
        while hi is None:
            if lo == upper:
                return lo, probes
            n = min(upper, lo + step)
            if probe(n):
                lo = n
                step *= 2
            else:
                hi = n
    else:
        lo, hi = 0, start
        while lo == 0:
            if hi == 1:
                return 0, probes
            n = max(1, hi - step)
            if probe(n):
                lo = n
            else:
                hi = n
                step *= 2
    while hi - lo > max(1, resolution):
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


def predicted_max(method, base_cfg, limit, seq, ckpt, vary: str, upper: int) -> int:
    """The memory model's answer (linear scan), the search's starting point."""
    best = 0
    for n in range(1, upper + 1):
        cfg = dict(base_cfg)
        batch = 1
        if vary == "layers":
            cfg["num_hidden_layers"] = n
        else:
            batch = n
        if ts.predict_peak_bytes(cfg, method, batch, seq, ckpt) <= limit:
            best = n
        else:
            break
    return best


def human(n) -> str:
    n = n or 0
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e3:.1f}k"


class Abort(Exception):
    pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(ts.METHODS))
    ap.add_argument("--seq", type=int, default=2048, help="tokens per micro-batch sequence")
    ap.add_argument("--checkpointing", choices=["on", "off"], default="on")
    ap.add_argument("--search", default="layers,batch", help="layers, batch or both")
    ap.add_argument("--max-layers", type=int, default=256)
    ap.add_argument("--max-batch", type=int, default=512)
    ap.add_argument("--memory-limit-gib", type=float, default=None)
    ap.add_argument("--start-layers", type=int, default=None, help="first probe (default: predicted)")
    ap.add_argument("--start-batch", type=int, default=None, help="first probe (default: predicted)")
    ap.add_argument("--tiny", action="store_true", help="the tiny width on the CPU (smoke test)")
    ap.add_argument("--isolation", choices=["subprocess", "fork"], default=None)
    ap.add_argument("--probe-timeout", type=float, default=240.0)
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting probes after this")
    ap.add_argument("--resolution", type=int, default=1,
                    help="stop bisecting when the answer is bracketed this closely (fewer probes)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if args.tiny:
        base = dict(ts.MODELS["tiny"])
        seq = 32 if args.seq == ap.get_default("seq") else args.seq
        max_layers = min(args.max_layers, 64)
        max_batch = min(args.max_batch, 64)
        if args.memory_limit_gib is None:
            args.memory_limit_gib = 0.005
    else:
        base, seq = dict(ts.MODELS["llama-8b"]), args.seq
        max_layers, max_batch = args.max_layers, args.max_batch
    if args.memory_limit_gib is not None:
        limit = args.memory_limit_gib * GIB
    elif cuda:
        limit = ts.gpu_info()[1]
    else:
        raise SystemExit("no GPU: give --tiny (and/or --memory-limit-gib)")
    isolation = args.isolation or ("subprocess" if cuda else "fork")
    ckpt = args.checkpointing == "on"
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    searches = [s.strip() for s in args.search.split(",")]
    meta = ts.environment(cuda)
    meta.update({"device": "cuda" if cuda else "cpu", "limit_gib": limit / GIB, "seq": seq,
                 "checkpointing": ckpt, "base_config": base, "isolation": isolation,
                 "fake_limit": args.memory_limit_gib is not None})
    print(f"# {meta['gpu'] or 'CPU'}  limit {limit / GIB:.4f} GiB  seq {seq}  checkpointing {ckpt}",
          flush=True)
    t_begin = time.perf_counter()
    results = {}

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "results": results}, f, indent=1)

    for method in methods:
        res = {"method": method, "status": "ok", "reason": None}
        results[method] = res
        reason = ts.unavailable_reason(method, cuda)
        if reason is not None:
            res.update(status="unavailable", reason=reason)
            print(f"{method:<14} UNAVAILABLE: {reason}", flush=True)
            save()
            continue

        def make_fits(vary, method=method, res=res):
            def fits(n):
                if args.budget_s is not None and time.perf_counter() - t_begin > args.budget_s:
                    raise Abort(f"time budget of {args.budget_s:.0f} s spent")
                cfg, batch = dict(base), 1
                if vary == "layers":
                    cfg["num_hidden_layers"] = n
                else:
                    batch = n
                spec = {"method": method, "config": cfg, "batch": batch, "seq": seq, "checkpointing": ckpt,
                        "warmup": 0 if args.tiny else 1, "steps": 1, "cpu": not cuda,
                        "threads": 1 if args.tiny else None,
                        "memory_limit_bytes": limit if args.memory_limit_gib is not None else None}
                row = ts.run_isolated(spec, isolation, args.probe_timeout)
                res.setdefault("probes", []).append(
                    {"vary": vary, "n": n, "status": row["status"], "peak_gib": row.get("peak_gib"),
                     "wall_s": row.get("wall_s"), "reason": row.get("reason")})
                peak = "" if row.get("peak_gib") is None else f" peak {row['peak_gib']:.2f} GiB"
                why = "" if row["status"] in ("ok", "oom") else ": " + str(row.get("reason"))
                print(f"  {method:<14} {vary}={n:<4} {row['status']}{peak}{why}", flush=True)
                save()
                if row["status"] == "ok":
                    return True
                if row["status"] == "oom":
                    return False
                raise Abort(f"{vary}={n}: {row['status']}: {row.get('reason')}")
            return fits

        try:
            if "layers" in searches:
                guess = predicted_max(method, base, limit, seq, ckpt, "layers", max_layers)
                res["predicted_max_layers"] = guess
                best, _ = search_max(make_fits("layers"), args.start_layers or guess or 1, max_layers, args.resolution)
                cfg = dict(base, num_hidden_layers=best)
                res.update(max_layers=best, max_params=ts.count_params(cfg)["total"] if best else 0)
            if "batch" in searches:
                guess = predicted_max(method, base, limit, seq, ckpt, "batch", max_batch)
                res["predicted_max_batch"] = guess
                best, _ = search_max(make_fits("batch"), args.start_batch or guess or 1, max_batch, args.resolution)
                res.update(max_batch=best, max_tokens=best * seq)
        except Abort as e:
            res.update(status="error", reason=str(e))
        for vary in ("layers", "batch"):  # the bracket the probes found, also when a search stopped early
            seen = [(p["n"], p["status"]) for p in res.get("probes", []) if p["vary"] == vary]
            if seen:
                res[f"{vary}_fit_at_least"] = max([n for n, st in seen if st == "ok"], default=0)
                res[f"{vary}_not_fitting_from"] = min([n for n, st in seen if st == "oom"], default=None)
        print(f"{method:<14} {res['status']}: layers {res.get('max_layers')} "
              f"({human(res.get('max_params'))} params; predicted {res.get('predicted_max_layers')}), "
              f"batch {res.get('max_batch')} (predicted {res.get('predicted_max_batch')})"
              + (f"  [{res['reason']}]" if res["reason"] else ""), flush=True)
        save()

    ref = results.get("torch_adamw", {})
    for res in results.values():
        for key in ("max_layers", "max_params", "max_batch"):
            if res.get(key) is not None and ref.get(key):
                res[f"{key}_vs_torch_adamw"] = res[key] / ref[key]
    save()
    print(f"\n{'method':<14} {'layers':>6} {'params':>9} {'x AMP':>6} {'batch':>6} {'x AMP':>6}")
    for m, r in results.items():
        if r["status"] != "ok":
            print(f"{m:<14} {r['status']}: {r['reason']}")
            continue
        print(f"{m:<14} {r.get('max_layers', '-')!s:>6} {human(r.get('max_params')):>9} "
              f"{r.get('max_params_vs_torch_adamw', float('nan')):>6.2f} {r.get('max_batch', '-')!s:>6} "
              f"{r.get('max_batch_vs_torch_adamw', float('nan')):>6.2f}")
    print(f"{time.perf_counter() - t_begin:.0f} s" + (f"; wrote {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
