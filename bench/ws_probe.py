"""Each Gluon tile configuration in its own process, against the Triton kernel's bits, at shapes where
a program walks one tile, several, or ~16: which configuration faults, hangs or differs is named,
and none takes the others down (a launch failure poisons its process's CUDA context, and every
later launch there fails with it: session 12, call 1, where bench/ws_kernel.py lost its whole table
to one faulting candidate).

    python bench/ws_probe.py [--configs all] [--out x.json]

Prints one line a (config, shape): OK (bits equal the Triton kernel's: weight and both AdamW
states), DIFFERS (how many elements), FAULT (the CUDA error), HANG (no answer within --timeout),
or "not run" after a fault in that process. The last line lists the configs that did not pass
all shapes, comma-separated, for bench/ws_kernel.py --exclude.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the repository root, for `bench` (run as a script, sys.path[0] is bench/)

# (M, N, K, SM count seen by the launcher or 0 for the device's): 64x128 tiles a program walks
# 4 (one program), 15 (one program), ~16 (132 programs) and ~16 with K = 1024
SHAPES = ((128, 256, 256, 1), (320, 384, 200, 1), (4096, 4096, 256, 0), (4096, 4096, 1024, 0))


def _child(index: int, shapes) -> None:
    """Runs in the child: config ``index`` of bench/ws_kernel.py's WS_CONFIGS at each shape, one JSON
    line a shape on stdout, flushed before the next launch."""
    from unittest import mock

    import torch

    from bench.kernels import adamw_problem
    from bench.ws_kernel import WS_CONFIGS as WS_CONFIGS_BY_PRECISION
    from forge_num import kernels, rules
    from forge_num.kernels.gluon_update import fused_linear_update_ws

    config = WS_CONFIGS_BY_PRECISION["fp32"][index]  # the fp32 regime's tiles
    for M, N, K, sms in shapes:
        x, dy, w, states, h = adamw_problem(M, N, K)
        # states that are not zeros, so that a slot read before its load lands shows in the bits
        states = [torch.randn_like(w) * 1e-3, torch.rand_like(w) * 1e-6]
        ref_w, ref_s = w.clone(), [s.clone() for s in states]
        kernels.fused_linear_update(ref_w, x, dy, ref_s, rules.ADAMW, h,
                                    config=kernels.default_config(M, N, K, torch.bfloat16))
        sm_count = (lambda device: sms) if sms else kernels._sm_count
        with mock.patch.object(kernels, "_sm_count", sm_count):
            fused_linear_update_ws(w, x, dy, states, rules.ADAMW, h, config=config)
        torch.cuda.synchronize()
        differ = sum(int((a.view(torch.int32) != b.view(torch.int32)).sum()) for a, b in
                     zip((w, *states), (ref_w, *ref_s)))
        print(json.dumps({"shape": [M, N, K, sms], "result": "OK" if differ == 0 else f"DIFFERS ({differ} elements)"}),
              flush=True)


def probe(index: int, label: str, timeout: float) -> list[dict]:
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", str(index)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
        out, err, hung = proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, hung = "", True
    done = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    rows = [{"config": label, **d} for d in done]
    if len(done) < len(SHAPES):
        cause = "HANG" if hung else "FAULT: " + next(
            (line for line in reversed(err.splitlines()) if "Error" in line), err.strip().splitlines()[-1:] or "?")
        rows.append({"config": label, "shape": list(SHAPES[len(done)]), "result": str(cause)[:300]})
        rows += [{"config": label, "shape": list(s), "result": "not run"} for s in SHAPES[len(done) + 1:]]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="all", help="'all' or comma-separated parts of WS config labels")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds a config's process may take")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        _child(args.child, SHAPES)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench/ws_probe.py launches the Gluon kernel: it needs an sm_90 CUDA device", file=sys.stderr)
        return 2
    from bench.ws_kernel import WS_CONFIGS as WS_CONFIGS_BY_PRECISION

    WS_CONFIGS = WS_CONFIGS_BY_PRECISION["fp32"]  # the fp32 regime's tiles

    chosen = [(i, c.label) for i, c in enumerate(WS_CONFIGS)
              if args.configs == "all" or any(part in c.label for part in args.configs.split(","))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        results = list(pool.map(lambda ic: probe(ic[0], ic[1], args.timeout), chosen))
    rows = [r for rs in results for r in rs]
    for r in rows:
        print(f"{r['config']:<40} {'x'.join(map(str, r['shape'][:3]))} sms={r['shape'][3] or 'all'}  {r['result']}")
    failed = sorted({r["config"] for r in rows if r["result"] != "OK"})
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows, "failed": failed},
                                             indent=1))
    # the labels' distinctive parts for ws_kernel --exclude (a label has spaces; its last word is unique)
    print("failed: " + ",".join(" ".join(label.split()[1:]) for label in failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
