"""The warp-specialized Gluon kernel (kernels/gluon_update.py) beside the Triton kernel's default tile
and the unfused step, AdamW, fp32 or bf16-sr regime, with the floor: the measurement that decides
whether it replaces the Triton kernel where it applies. Same baselines and floor as bench/kernels.py,
in one run (bf16-sr: bf16 weight and state against cuBLAS dW + torch AdamW(fused) on a bf16 parameter).

    python bench/ws_kernel.py [--shapes 4096x4096,14336x4096] [--tokens 256,1024,4096,16384] [--out x.json]
                              [--exclude pp240,split] [--precision fp32|bf16-sr]

Columns: "triton" is the Triton kernel's default tile (kernels.default_config, given explicitly),
"routed" what kernels.fused_linear_update does with no tile given (the Gluon kernel where
gluon_update.config_for routes, else that same Triton tile), "ws best" the fastest of WS_CONFIGS; the
line under each row gives every WS config's time. (Until session 11's first call the "triton" column
called the launcher without a tile, so after the route landed it timed the routed kernel.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for `bench`

import torch  # noqa: E402
import triton  # noqa: E402

from bench.kernels import (HYPER, LLAMA_SHAPES, STATE_BYTES, graph_ms, host_us, measure_ceilings,  # noqa: E402
                           regime_problem)
from forge_num import kernels, rules  # noqa: E402
from forge_num.kernels import gluon_update  # noqa: E402
from forge_num.kernels.gluon_update import fused_linear_update_ws  # noqa: E402

WS_CONFIGS = {
    "fp32": (*gluon_update.ROUTE_CONFIGS,        # what the launcher routes to (config_for)
             *gluon_update.CANDIDATE_CONFIGS),   # measured beside them, not routed
    "bf16-sr": (*gluon_update.BF16_SR_ROUTE_CONFIGS, *gluon_update.BF16_SR_CANDIDATE_CONFIGS),
}


def bench_point(M: int, N: int, K: int, ceilings: dict, configs=WS_CONFIGS["fp32"], precision: str = "fp32") -> dict:
    x, dy, w, states, h, seed = regime_problem(M, N, K, precision)
    bf16 = precision == "bf16-sr"
    p = torch.nn.Parameter(w.clone())  # the unfused baseline's parameter in the regime's weight dtype
    opt = torch.optim.AdamW([p], fused=True, **HYPER)

    def grad():
        g = dy.t() @ x
        return g if bf16 else g.float()

    def unfused():
        p.grad = grad()
        opt.step()
        p.grad = None

    bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=150, return_mode="median")  # noqa: E731
    row = {"M": M, "N": N, "K": K, "precision": precision}
    default = kernels.default_config(M, N, K, torch.bfloat16, bf16)
    row["unfused_ms"] = bench(unfused)
    # the Triton kernel's default tile named explicitly: with no tile given the launcher routes these
    # shapes to the Gluon kernel itself (kernels.fused_linear_update -> gluon_update.route_config)
    triton_default = lambda: kernels.fused_linear_update(w, x, dy, states, rules.ADAMW, h, config=default,  # noqa: E731
                                                         seed=seed)
    routed = lambda: kernels.fused_linear_update(w, x, dy, states, rules.ADAMW, h, seed=seed)  # noqa: E731
    row["triton_default_ms"] = bench(triton_default)
    row["triton_default"] = default.label
    row["ws_ms"], row["ws_graph_ms"], row["ws_failed"] = {}, {}, {}
    for c in configs:
        try:
            fn = lambda: fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, config=c, seed=seed)  # noqa: E731
            row["ws_ms"][c.label] = bench(fn)
            row["ws_graph_ms"][c.label] = graph_ms(fn)
        except Exception as e:  # reported, not fatal
            row["ws_failed"][c.label] = f"{type(e).__name__}: {str(e)[:200]}"
    # device times without the host (CUDA-graph replay), and the host's time per call
    p_cap = torch.nn.Parameter(w.clone())
    opt_cap = torch.optim.AdamW([p_cap], fused=True, capturable=True, **HYPER)

    def unfused_capturable():
        p_cap.grad = grad()
        opt_cap.step()
        p_cap.grad = None

    row["unfused_graph_ms"] = graph_ms(unfused_capturable)
    row["triton_default_graph_ms"] = graph_ms(triton_default)
    row["triton_host_us"] = host_us(triton_default)
    route = kernels._ws_route(w, x, dy, states)
    row["routed"] = route.label if route is not None else default.label
    row["routed_graph_ms"] = graph_ms(routed)
    row["ws_host_us"] = host_us(lambda: fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, config=configs[0],
                                                               seed=seed))
    flops = 2.0 * K * M * N
    min_bytes = 2 * (K * N + K * M) + STATE_BYTES[precision] * M * N
    row["floor_ms"] = 1e3 * max(flops / ceilings["bf16_flops"], min_bytes / ceilings["copy_bytes_per_s"])
    if row["ws_graph_ms"]:
        best = min(row["ws_graph_ms"], key=row["ws_graph_ms"].get)
        row["ws_best"], row["ws_best_graph_ms"] = best, row["ws_graph_ms"][best]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=LLAMA_SHAPES)
    ap.add_argument("--tokens", default="256,1024,4096,16384")
    ap.add_argument("--out", default=None)
    ap.add_argument("--exclude", default="", help="comma-separated parts of config labels to leave out (e.g. pp240: "
                    "a config that faults takes the process's CUDA context with it, and every later point)")
    ap.add_argument("--precision", default="fp32", choices=sorted(WS_CONFIGS))
    args = ap.parse_args(argv)
    drop = [part for part in args.exclude.split(",") if part]
    configs = tuple(c for c in WS_CONFIGS[args.precision] if not any(part in c.label for part in drop))
    ceilings = measure_ceilings()
    rows = []
    print("device times from CUDA-graph replay (ms); ratios of them")
    head = (f"{'shape':>12} {'K':>6} {'unfused':>8} {'triton':>8} {'routed':>8} {'ws best':>8} {'floor':>7}  ws/unf"
            f"  tri/unf  rt/unf  ws/tri  ws/floor  host us tri/ws  best ws")
    print(head)
    for shape in args.shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        for K in (int(v) for v in args.tokens.split(",")):
            r = bench_point(M, N, K, ceilings, configs, args.precision)
            rows.append(r)
            if args.out:
                Path(args.out).write_text(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                                                      "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                      "triton": triton.__version__, "ceilings": ceilings,
                                                      "precision": args.precision,
                                                      "configs": [c.label for c in configs], "rows": rows},
                                                     indent=1))
            if "ws_best_graph_ms" in r:
                u, t, b, f = r["unfused_graph_ms"], r["triton_default_graph_ms"], r["ws_best_graph_ms"], r["floor_ms"]
                rt = r["routed_graph_ms"]
                print(f"{shape:>12} {K:>6} {u:8.3f} {t:8.3f} {rt:8.3f} {b:8.3f} {f:7.3f}  {u / b:6.2f}  {u / t:7.2f}"
                      f"  {u / rt:6.2f}  {t / b:6.2f}  {b / f:8.2f}  {r['triton_host_us']:5.0f}/{r['ws_host_us']:<5.0f}"
                      f" {r['ws_best']}", flush=True)
                print("      " + "  ".join(f"{lab.removeprefix('ws ')} {ms:.3f}" for lab, ms in r["ws_graph_ms"].items()),
                      flush=True)
            else:
                print(f"{shape:>12} {K:>6} ws failed: {r['ws_failed']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
