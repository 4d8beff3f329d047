"""Hardware counters of one fused launch beside its unfused parts, for Nsight Compute (ncu).

Issue 5's kernel gap at K <= 1024 is the update epilogue: at 4096x4096, K = 256, the fused launch
(0.171 ms, session 8) runs at 1.8x the copy-bandwidth floor, while forge's element-wise update alone
moves more bytes (28 per weight against 24) at 0.93x the copy rate. Counters say why: DRAM
throughput, L2 hit rate of the epilogue's loads, occupancy, and the warps' stall reasons.

This script only launches; ncu measures. It warms every launch up (compilation, autotuning of
cuBLAS) outside the profiled range and then runs each once between cudaProfilerStart/Stop:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        python bench/ncu_probe.py --shape 4096x4096 --tokens 256 [--configs default,<label>...]

Launches, in order: forge's fused update with each named tile (default: the launcher's Triton pick; in
the 8bit regime the Gluon tiles' "ws8 ..." labels too), then
the unfused baseline's two kernels (cuBLAS dW, torch's fused AdamW on its fp32 copy) and forge's
element-wise update on a stored dW (kernels.elementwise_update). Only CUDA.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

_HERE, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [p for p in sys.path if p not in (_HERE, _ROOT)] + [_ROOT]  # tests/conftest.py says why

from bench.kernels import HYPER, regime_problem  # noqa: E402
from forge_num import kernels, rules  # noqa: E402


def tile_by_label(label: str, M: int, N: int, K: int, precision: str = "fp32"):
    """'default' (the launcher's pick) or a TileConfig label among the library's and candidate tiles
    of the precision's kernel (the 8bit regime's own lists for "8bit")."""
    if precision == "8bit":
        if label == "default":
            return kernels.default_q8_config(M, N, K, torch.bfloat16)
        from forge_num.kernels import gluon_q8

        tiles = {c.label: c for c in (*kernels.Q8_CONFIGS[torch.bfloat16], *kernels.CANDIDATE_Q8_CONFIGS,
                                      gluon_q8.DEFAULT_Q8_WS_CONFIG, *gluon_q8.Q8_WS_CANDIDATE_CONFIGS)}
    elif label == "default":
        return kernels.default_config(M, N, K, torch.bfloat16, precision == "bf16-sr")
    else:
        tiles = {c.label: c for c in (*kernels.configs_for(torch.bfloat16), *kernels.CANDIDATE_CONFIGS)}
    if label not in tiles:
        raise SystemExit(f"unknown tile label {label!r}; known: {sorted(tiles)}")
    return tiles[label]


def profile_once(launches, warmups: int = 3) -> None:
    """launches() run warmups times outside the profiled range (compilation, cuBLAS's heuristics), then once
    between cudaProfilerStart and Stop: what ncu --profile-from-start off measures."""
    for _ in range(warmups):
        launches()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    launches()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4096x4096", help="MxN of the weight")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--configs", default="default", help="comma-separated tile labels ('_' for space), or 'default'")
    ap.add_argument("--ws-configs", default="", help="comma-separated labels of bench/ws_kernel.py's Gluon tiles "
                    "('_' for space), launched after the Triton tiles")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16-sr", "8bit"],
                    help="bf16-sr: bf16 weight and state (the Philox key 12345), unfused on a bf16 parameter; "
                    "8bit: bf16 weight and 8-bit states (the same key), unfused on a bf16 parameter")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("ncu_probe needs CUDA")
    M, N = (int(s) for s in args.shape.split("x"))
    K = args.tokens
    x, dy, w, states, h, seed = regime_problem(M, N, K, args.precision)
    bf16 = args.precision != "fp32"  # the weight's dtype (and the unfused baseline's gradient's)
    # labels hold spaces; "_" stands for one where a shell word cannot hold them (gpu_session.sh)
    tiles = [tile_by_label(c.replace("_", " "), M, N, K, args.precision) for c in args.configs.split(",") if c]
    if args.precision == "8bit" and args.ws_configs:
        raise SystemExit("the Gluon kernel has no 8bit regime: --ws-configs takes fp32 or bf16-sr")
    ws_tiles = []
    if args.ws_configs:
        from bench.ws_kernel import WS_CONFIGS
        from forge_num.kernels.gluon_update import fused_linear_update_ws

        known = {c.label: c for c in WS_CONFIGS[args.precision]}
        for label in args.ws_configs.split(","):
            if label.replace("_", " ") not in known:
                raise SystemExit(f"unknown WS label {label!r}; known: {sorted(known)}")
            ws_tiles.append(known[label.replace("_", " ")])
    from forge_num.kernels import gluon_q8
    from forge_num.kernels.gluon_q8 import Q8WSConfig

    if any(isinstance(t, Q8WSConfig) for t in tiles):
        gluon_q8.fused_linear_update_q8_ws(w, x, dy, states, rules.ADAMW, h, seed=seed)  # the operands' checks, once
    p = torch.nn.Parameter(w.clone())
    opt = torch.optim.AdamW([p], fused=True, **HYPER)
    g = torch.empty(M, N, device="cuda")

    def launches():
        for t in tiles:
            if isinstance(t, Q8WSConfig):  # a Gluon 8bit tile ("ws8 ..."), launched as bench/kernels.py does
                gluon_q8.launch(w, x, dy, states, rules.ADAMW, tuple(float(v) for v in h), 1.0, t, (seed, N, 0))
            else:
                kernels.fused_linear_update(w, x, dy, states, rules.ADAMW, h, config=t, seed=seed)
        for c in ws_tiles:
            fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, config=c, seed=seed)
        dw = dy.t() @ x
        p.grad = dw if bf16 else dw.float()
        opt.step()
        if args.precision != "8bit":  # (an 8bit parameter's element-wise update is the fused kernel at K = 0)
            kernels.elementwise_update(w, g, states, rules.ADAMW, h, seed=seed)

    profile_once(launches)
    print("profiled:", ", ".join(t.label for t in tiles), "+ cuBLAS dW, cast, torch AdamW(fused)",
          "" if args.precision == "8bit" else "+ forge update only",
          f"at {M}x{N}, K={K}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
