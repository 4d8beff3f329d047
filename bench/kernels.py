"""Kernel benchmark: FORGE dW + AdamW update against the unfused baseline, with the roofline floor.

For each Llama shape W [M, N] and token count K (bf16 activations X [K, N], dY [K, M]; fp32
weight and AdamW state, the fp32 regime):

    forge       kernels.fused_linear_update: dW tile by tile, AdamW in the epilogue
    unfused     cuBLAS dW = (dYᵀ X) in bf16, cast to fp32 (what autograd hands an fp32 parameter
                under autocast), then torch.optim.AdamW(fused=True).step()
    floor       max(2KMN / measured bf16 matmul rate, minimum bytes / measured copy bandwidth),
                minimum bytes = X and dY read once + W, m, v read and written once (fp32)

All measured side by side in one run (triton.testing.do_bench, median). Prints a table; writes JSON.

    python bench/kernels.py [--shapes 4096x4096,14336x4096] [--tokens 256,1024] [--precision fp32,bf16-sr,8bit]
                            [--out bench/results/x.json]
    python bench/kernels.py --mainloop [--shapes ...] [--tokens ...]   the dW mainloop alone, per tile

bf16-sr and 8bit are compared with torch.optim.AdamW(fused=True) on a bf16 parameter (the
memory-matched torch setup), fp32 with the AMP setup (fp32 parameter, bf16 activations).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import statistics
import sys
import time

import torch
import triton

from forge_num import kernels, rules
try:
    from forge_num.kernels import gluon_f32, gluon_q8
except ImportError:  # a Triton without Gluon: the Triton tiles only
    gluon_f32 = gluon_q8 = None
from forge_num.kernels import random as krandom

# run as `python bench/kernels.py`, sys.path[0] is bench/: the repository's root behind the rest, for bench.timing
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.timing import paired_medians  # noqa: E402

# issue 5: the Llama-8B projections (4096x4096, 14336x4096, 4096x14336) and two of Llama-70B's
LLAMA_SHAPES = "4096x4096,14336x4096,4096x14336,8192x8192,28672x8192"
HYPER = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def measure_ceilings() -> dict:
    """The two ceilings of this GPU, measured now: bf16 matmul FLOP/s and device copy bytes/s."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_mm = triton.testing.do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median") * 1e-3
    src = torch.empty(2 * 1024**3 // 4, device="cuda", dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    t_cp = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median") * 1e-3
    return {"bf16_flops": 2 * 8192**3 / t_mm, "copy_bytes_per_s": 2 * src.numel() * 4 / t_cp}


# Timed beside the library's configurations: kernels.CANDIDATE_CONFIGS / CANDIDATE_Q8_CONFIGS
# (not picked by the launcher until measured faster and verified; their comment says why each).
CANDIDATES = kernels.CANDIDATE_CONFIGS
Q8_CANDIDATES = kernels.CANDIDATE_Q8_CONFIGS


def _gluon_tiles(kernel, M: int, N: int) -> tuple:
    """A Gluon kernel module's tiles (kernels/gluon_q8.py: labelled "ws8 ...", kernels/gluon_f32.py: "wsf ..."),
    its default and candidates, where it runs: an sm_90 GPU, M and N multiples of 8; timed beside the Triton
    tiles of its regime."""
    if kernel is None or M % 8 or N % 8 or torch.cuda.get_device_capability() != (9, 0):
        return ()
    if kernel is gluon_q8:
        return (gluon_q8.DEFAULT_Q8_WS_CONFIG, *gluon_q8.Q8_WS_CANDIDATE_CONFIGS)
    return (gluon_f32.DEFAULT_F32_WS_CONFIG, *gluon_f32.F32_WS_CANDIDATE_CONFIGS)


def _is_gluon_q8(config) -> bool:
    return gluon_q8 is not None and isinstance(config, gluon_q8.Q8WSConfig)


def _is_gluon_f32(config) -> bool:
    return gluon_f32 is not None and isinstance(config, gluon_f32.F32WSConfig)


# Bytes per weight element that the update must read and write at least, by regime: W, m, v read
# and written once (8bit: codes, plus one fp32 scale per QBLOCK elements for each state).
STATE_BYTES = {"fp32": 2 * (4 + 4 + 4), "bf16-sr": 2 * (2 + 2 + 2), "8bit": 2 * (2 + 1 + 1 + 8 / kernels.QBLOCK)}


def host_us(fn, calls: int = 20, loops: int = 3) -> float:
    """Host time of one call, in us: the launches queue asynchronously, so a loop of calls that the
    GPU has not caught up with measures the host alone (median of ``loops`` loops)."""
    times = []
    for _ in range(loops):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def graph_ms(fn) -> float:
    """Device time of fn's kernels replayed from a CUDA graph (no host in the interval), median ms."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        return triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
    finally:
        del graph


class LaunchRecorder:
    """Stands in for kernels.fused_linear_update_kernel and keeps the compiled kernel of the last
    launch (Triton's launch returns it), so each row can say how many registers, spills and bytes of
    shared memory a tile compiled to on this GPU: what decides how many programs share an SM."""

    def __init__(self, fn):
        self.fn, self.last = fn, None

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def run(*args, **kwargs):
            self.last = launch(*args, **kwargs)
            return self.last
        return run

    def resources(self) -> dict:
        k = self.last
        try:
            return {"n_regs": int(k.n_regs), "n_spills": int(k.n_spills), "shared": int(k.metadata.shared),
                    "num_warps": int(k.metadata.num_warps)}
        except Exception as e:  # diagnostics only: never fail a timing row for them
            return {"error": f"{type(e).__name__}: {str(e)[:80]}"}


RECORDER = LaunchRecorder(kernels.fused_linear_update_kernel)  # installed by main(), not on import


def adamw_problem(M: int, N: int, K: int):
    """(x [K, N] bf16, dy [K, M] bf16, w [M, N] fp32, [m, v] zeros, AdamW's step-1 scalars): the update
    every kernel benchmark times (bench/ws_kernel.py and bench/ncu_probe.py too), seeded."""
    torch.manual_seed(0)
    x = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(K, M, device="cuda", dtype=torch.bfloat16) * 1e-3
    w = torch.randn(M, N, device="cuda") * 0.02
    return x, dy, w, [torch.zeros_like(w), torch.zeros_like(w)], rules.ADAMW.scalars(HYPER, 1)


SEED = 12345  # the low-precision regimes' Philox key in every kernel benchmark


def regime_problem(M: int, N: int, K: int, precision: str = "fp32"):
    """adamw_problem in a storage regime: (x, dy, w, states, h, seed) with w and states fp32 (seed
    None), bf16 (bf16-sr) or a bf16 w with Q8State states (8bit)."""
    x, dy, w32, fp32_states, h = adamw_problem(M, N, K)
    if precision == "fp32":
        return x, dy, w32, fp32_states, h, None
    w = w32.bfloat16()
    if precision == "bf16-sr":
        states = [torch.zeros_like(w), torch.zeros_like(w)]
    else:
        states = [kernels.Q8State.zeros(M, N, "cuda"), kernels.Q8State.zeros(M, N, "cuda")]
    return x, dy, w, states, h, SEED


def bench_one(M: int, N: int, K: int, ceilings: dict, precision: str = "fp32", only=None, rounds: int = 1,
              paired: bool = False) -> dict:
    x, dy, w, states, h, seed = regime_problem(M, N, K, precision)

    def forge(config=None):
        if _is_gluon_q8(config):
            # the Gluon 8bit kernel's tiles (kernels/gluon_q8.py), timed as the launcher runs them once
            # routed: its launch, the operands checked once (below) as the launcher's fast path checks them
            gluon_q8.launch(w, x, dy, states, rules.ADAMW, h_checked, 1.0, config, (seed, N, 0))
        elif _is_gluon_f32(config):
            gluon_f32.launch(w, x, dy, states, rules.ADAMW, h_checked, 1.0, config)
        else:
            kernels.fused_linear_update(w, x, dy, states, rules.ADAMW, h, config=config, seed=seed)

    h_checked = tuple(float(v) for v in h)
    if precision == "8bit" and _gluon_tiles(gluon_q8, M, N):
        gluon_q8.fused_linear_update_q8_ws(w, x, dy, states, rules.ADAMW, h, seed=seed)  # the operands' checks, once
    if precision == "fp32" and _gluon_tiles(gluon_f32, M, N):
        gluon_f32.fused_linear_update_f32_ws(w, x, dy, states, rules.ADAMW, h)  # the operands' checks, once

    # the unfused baseline keeps its parameter in the regime's weight dtype: fp32 under AMP, or bf16
    p = torch.nn.Parameter(w.clone())
    opt = torch.optim.AdamW([p], fused=True, **HYPER)

    def unfused():
        g = dy.t() @ x
        p.grad = g.float() if precision == "fp32" else g
        opt.step()
        p.grad = None

    per_config, compiled, failed = {}, {}, {}
    configs = kernels.Q8_CONFIGS[torch.bfloat16] if precision == "8bit" else kernels.configs_for(torch.bfloat16)
    candidates = (Q8_CANDIDATES + _gluon_tiles(gluon_q8, M, N) if precision == "8bit"
                  else CANDIDATES + _gluon_tiles(gluon_f32, M, N) if precision == "fp32" else CANDIDATES)
    default = (kernels.default_q8_config(M, N, K, torch.bfloat16) if precision == "8bit"
               else kernels.default_config(M, N, K, torch.bfloat16, precision == "bf16-sr"))
    # Each tile timed once a round, then the launcher's route and the unfused step, the rounds one after
    # another (interleaved), each time the median of its rounds: a drift of the GPU's clocks falls on every tile
    # and on both baselines alike (session 33: two timings of one tile minutes apart in one run differed by
    # 2-7%; session 37: the route, timed once after the rounds, read 4-7% above the same tile's median on the
    # largest shape at 768-1024 tokens). With paired (--paired), each round times the route, the unfused step and
    # the tiles call by call in turn (bench/timing.py): session 44's labels read up to 15% above the route for the
    # same kernel, and up to 20% apart round to round, timed a function at a time.
    rounds_ms, route_rounds_ms, unfused_rounds_ms = {}, [], []
    selected = [cfg for cfg in (*configs, *candidates) if only is None or cfg.label in only]

    def compiles(cfg) -> bool:
        """cfg's first launch (its compilation), its resources recorded; a tile that does not compile here (shared
        memory) is reported in failed, not fatal."""
        try:
            forge(cfg)
        except Exception as e:
            failed[str(cfg)] = f"{type(e).__name__}: {str(e)[:160]}"
            return False
        compiled[str(cfg)] = {} if _is_gluon_q8(cfg) or _is_gluon_f32(cfg) else RECORDER.resources()
        return True

    selected = [cfg for cfg in selected if compiles(cfg)]
    for _ in range(rounds):
        if paired:  # the route, the unfused step and the tiles call by call (bench/timing.py)
            med = paired_medians({"route": forge, "unfused": unfused,
                                  **{str(cfg): (lambda c=cfg: forge(c)) for cfg in selected}}, rep_ms=200, warmup_ms=25)
            route_rounds_ms.append(med.pop("route"))
            unfused_rounds_ms.append(med.pop("unfused"))
            for k, t in med.items():
                rounds_ms.setdefault(k, []).append(t)
        else:
            route_rounds_ms.append(triton.testing.do_bench(forge, warmup=25, rep=200, return_mode="median"))
            unfused_rounds_ms.append(triton.testing.do_bench(unfused, warmup=25, rep=200, return_mode="median"))
            for cfg in selected:
                t = triton.testing.do_bench(lambda: forge(cfg), warmup=10, rep=100, return_mode="median")
                rounds_ms.setdefault(str(cfg), []).append(t)
    per_config = {k: statistics.median(v) * 1e-3 for k, v in rounds_ms.items()}
    t_forge = statistics.median(route_rounds_ms) * 1e-3
    t_unfused = statistics.median(unfused_rounds_ms) * 1e-3
    # The same two steps without the host: their launches replayed from a CUDA graph. do_bench's
    # interval runs from an event recorded behind its L2 flush to one behind the step, so a host that
    # fell behind would leave the GPU idle inside it; forge_ms - forge_graph_ms is that gap. (Session
    # 6: within 2% at every fp32 point; the host runs ahead of do_bench's loop.)
    p_cap = torch.nn.Parameter(p.detach().clone())
    opt_cap = torch.optim.AdamW([p_cap], fused=True, capturable=True, **HYPER)

    def unfused_capturable():
        g = dy.t() @ x
        p_cap.grad = g.float() if precision == "fp32" else g
        opt_cap.step()
        p_cap.grad = None

    parts = {"forge_host_us": host_us(forge), "unfused_host_us": host_us(unfused)}
    for name, fn in (("forge_graph_ms", forge), ("unfused_graph_ms", unfused_capturable)):
        try:
            parts[name] = graph_ms(fn)
        except Exception as e:  # reported, not fatal
            parts[name] = f"{type(e).__name__}: {str(e)[:160]}"
    if precision == "fp32":
        # where the time goes: the two mainloops alone (dW stored: fp32 by Triton, bf16 by cuBLAS) and
        # the update alone (forge's element-wise kernel and torch's fused AdamW on a stored fp32 dW)
        g = torch.empty(M, N, device="cuda")
        bench = lambda f: triton.testing.do_bench(f, warmup=10, rep=100, return_mode="median")  # noqa: E731
        parts["triton_dw_ms"] = bench(lambda: kernels.linear_mainloop(x, dy, out=g))
        parts["cublas_dw_ms"] = bench(lambda: dy.t() @ x)
        parts["forge_update_only_ms"] = bench(lambda: kernels.elementwise_update(w, g, states, rules.ADAMW, h))
        p.grad = g

        def torch_step():
            opt.step()
        parts["torch_update_only_ms"] = bench(torch_step)
        p.grad = None
    labels = {str(c): c.label for c in (*configs, *candidates)}
    # what the launcher runs with no tile given (kernels.launcher_tile): a Gluon kernel's tile where routed
    kernel, routed = kernels.launcher_tile(w, x, dy, states)
    if kernel != "triton":
        default = routed
    best = min(per_config, key=per_config.get) if per_config else None
    flops = 2.0 * K * M * N
    min_bytes = 2 * (K * N + K * M) + STATE_BYTES[precision] * M * N
    floor = max(flops / ceilings["bf16_flops"], min_bytes / ceilings["copy_bytes_per_s"])
    return {"precision": precision, "M": M, "N": N, "K": K, "forge_ms": t_forge * 1e3, "unfused_ms": t_unfused * 1e3,
            "floor_ms": floor * 1e3, "speedup_vs_unfused": t_unfused / t_forge, "forge_over_floor": t_forge / floor,
            "config": str(default), "default_label": default.label,
            "per_config_ms": {k: t * 1e3 for k, t in per_config.items()},
            # the same timings by label (64x128x64 w4 s4 e4 tma ...): stable when TileConfig gains a field
            "per_label_ms": {labels[k]: t * 1e3 for k, t in per_config.items()},
            "rounds_ms_by_label": {labels[k]: v for k, v in rounds_ms.items()},
            "rounds_route_ms": route_rounds_ms, "rounds_unfused_ms": unfused_rounds_ms,
            "compiled": compiled, "failed": failed,
            # with --configs none (the route, the unfused step and the floor only) no tile is timed alone
            "best_config": best, "best_label": labels[best] if best else None,
            "candidates": [str(c) for c in candidates],
            "best_config_speedup_vs_unfused": t_unfused / per_config[best] if best else None, **parts}


# Mainloop-only tiles (--mainloop): the dW GEMM with a plain store epilogue, so that register
# pressure from the update does not limit the tile. How fast Triton's mainloop can get on these
# shapes, beside cuBLAS, says which part of the gap to cuBLAS the epilogue costs.
MAINLOOP_TILES = (
    kernels.TileConfig(64, 128, 64, num_warps=4, num_stages=4),
    kernels.TileConfig(128, 128, 64, num_warps=8, num_stages=4),
    kernels.TileConfig(128, 256, 64, num_warps=8, num_stages=3),
    kernels.TileConfig(256, 128, 64, num_warps=8, num_stages=3),
    kernels.TileConfig(128, 128, 128, num_warps=8, num_stages=3),
    kernels.TileConfig(64, 128, 64, num_warps=4, num_stages=4, tma=True),
    kernels.TileConfig(128, 128, 64, num_warps=8, num_stages=4, tma=True),
    kernels.TileConfig(128, 256, 64, num_warps=8, num_stages=3, tma=True),
    kernels.TileConfig(128, 256, 64, num_warps=8, num_stages=4, tma=True),
    # the 8bit defaults' mainloops (their epilogues aside): how much of the fused 8bit time is the dW
    kernels.TileConfig(32, 128, 64, num_warps=8, num_stages=3),
    kernels.TileConfig(64, 128, 64, num_warps=8, num_stages=4, tma=True, max_registers=128),
)


def bench_mainloop(M: int, N: int, K: int) -> dict:
    """Time kernels.linear_mainloop (dW stored in fp32) per tile against cuBLAS dW (bf16 and fp32 out)."""
    torch.manual_seed(0)
    x = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(K, M, device="cuda", dtype=torch.bfloat16)
    g = torch.empty(M, N, device="cuda")
    bench = lambda f: triton.testing.do_bench(f, warmup=10, rep=100, return_mode="median")  # noqa: E731
    flops = 2.0 * K * M * N
    row = {"M": M, "N": N, "K": K, "cublas_bf16_out_ms": bench(lambda: dy.t() @ x), "triton_ms": {}}
    try:  # fp32 output, as the mainloop stores it (torch.mm's out_dtype, where this torch has it)
        row["cublas_fp32_out_ms"] = bench(lambda: torch.mm(dy.t(), x, out_dtype=torch.float32))
    except (TypeError, RuntimeError) as e:
        row["cublas_fp32_out_ms"] = f"{type(e).__name__}: {str(e)[:120]}"
    for cfg in MAINLOOP_TILES:
        try:
            row["triton_ms"][str(cfg)] = bench(lambda: kernels.linear_mainloop(x, dy, out=g, config=cfg))
        except Exception as e:  # a tile that does not compile (shared memory): reported, not fatal
            row["triton_ms"][str(cfg)] = f"{type(e).__name__}: {str(e)[:120]}"
    row["tflops"] = {k: flops / v * 1e-9 for k, v in row["triton_ms"].items() if isinstance(v, float)}
    row["labels"] = {str(c): c.label for c in MAINLOOP_TILES}
    row["cublas_tflops"] = flops / row["cublas_bf16_out_ms"] * 1e-9
    return row


def _ms(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else "failed"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=LLAMA_SHAPES)
    ap.add_argument("--tokens", default="256,512,1024,2048,4096,8192,16384")  # issue 5: every K
    ap.add_argument("--precision", default="fp32", help="comma-separated: fp32, bf16-sr, 8bit")
    ap.add_argument("--out", default=None)
    ap.add_argument("--configs", default=None, help="time only these tile labels ('_' for space, comma-separated) "
                    "beside the default (the launcher's pick)")
    ap.add_argument("--rounds", type=int, default=1, help="time the tiles this many times, interleaved (each tile "
                    "once a round); each tile's time is the median of its rounds")
    ap.add_argument("--paired", action="store_true", help="each round, time the route, the unfused step and the "
                    "tiles call by call in turn (bench/timing.py) rather than one function's samples at a time")
    ap.add_argument("--mainloop", action="store_true", help="time the dW mainloop alone per tile (MAINLOOP_TILES)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.mainloop:
        rows = []
        for shape in args.shapes.split(","):
            M, N = (int(v) for v in shape.split("x"))
            for K in (int(t) for t in args.tokens.split(",")):
                r = bench_mainloop(M, N, K)
                rows.append(r)
                best = max(r["tflops"], key=r["tflops"].get) if r["tflops"] else None
                print(f"mainloop {M:>6}x{N:<6} K={K:<6} cuBLAS {r['cublas_tflops']:6.0f} TFLOP/s  "
                      + "  ".join(f"{r['labels'][k]}: {v:4.0f}" for k, v in r["tflops"].items())
                      + (f"  best {r['labels'][best]}" if best else ""), flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump({"meta": {"command": "python bench/kernels.py " + " ".join(sys.argv[1:] if argv is None else argv),
                                            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                            "triton": triton.__version__}, "rows": rows}, f, indent=1)
        return 0
    kernels.fused_linear_update_kernel = RECORDER  # the launcher looks the kernel up in its module
    ceilings = measure_ceilings()
    rows = []
    shapes = [tuple(int(s) for s in shape.split("x")) for shape in args.shapes.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "ceilings": ceilings,
            # the Philox rounds' multiply form (kernels/random.py: mul.wide.u32 unless FORGE_NUM_PHILOX_WIDE=0)
            "philox_wide_products": bool(getattr(krandom, "WIDE_PRODUCTS", False)),  # (an older build has none)
            "timing": "paired (bench/timing.py)" if args.paired else "do_bench, a function at a time",
            "command": "python bench/kernels.py " + " ".join(sys.argv[1:] if argv is None else argv),
            # which forge_num ran (an A/B puts an older build first on PYTHONPATH)
            "forge_num_path": os.path.dirname(kernels.__file__)}
    for precision, (M, N), K in itertools.product(args.precision.split(","), shapes, tokens):
        if precision not in STATE_BYTES:
            raise SystemExit(f"unknown precision {precision!r}; choose from {sorted(STATE_BYTES)}")
        only = None if args.configs is None else {c.replace("_", " ") for c in args.configs.split(",")}
        rows.append(bench_one(M, N, K, ceilings, precision, only, args.rounds, args.paired))
        r = rows[-1]
        print(f"{precision:<7} {M:>6}x{N:<6} K={K:<6} forge {r['forge_ms']:8.3f} ms  unfused {r['unfused_ms']:8.3f} ms  "
              f"floor {r['floor_ms']:7.3f} ms  speedup {r['speedup_vs_unfused']:5.2f}x  "
              f"forge/floor {r['forge_over_floor']:5.2f}  ({r['default_label']})"
              + (f"  best {r['best_config_speedup_vs_unfused']:5.2f}x ({r['best_label']})" if r["best_label"] else "")
              + (f"  [dW triton {r['triton_dw_ms']:.3f} cublas {r['cublas_dw_ms']:.3f}; update forge "
                 f"{r['forge_update_only_ms']:.3f} torch {r['torch_update_only_ms']:.3f}]" if "triton_dw_ms" in r else "")
              + f"  [host us forge {r['forge_host_us']:.0f} unfused {r['unfused_host_us']:.0f}; graph ms forge "
                f"{_ms(r['forge_graph_ms'])} unfused {_ms(r['unfused_graph_ms'])}]",
              flush=True)
        if args.out:  # rewritten after every row: a run stopped at its time limit keeps what it measured
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\nceilings: bf16 matmul {ceilings['bf16_flops'] / 1e12:.0f} TFLOP/s, copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
