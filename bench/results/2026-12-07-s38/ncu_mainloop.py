"""For ncu (session 38): the fp32 route's launch (kernels.fused_linear_update with no tile: gluon_f32.config_for's
tile) and cuBLAS's dW (dy.t() @ x, bf16 out) at one shape and K, each warmed up outside the profiled range, then
launched once between cudaProfilerStart/Stop. The question (bench/NOTES.md, session 38): is the 128-row tile's
mainloop at 16384 tokens (~450 TFLOP/s against cuBLAS's ~700) held by L2 throughput? ncu's SpeedOfLight and
MemoryWorkloadAnalysis give each kernel's L2 and DRAM throughput beside its duration.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
        python bench/results/2026-12-07-s38/ncu_mainloop.py 4096x14336 16384
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.kernels import regime_problem  # noqa: E402
from bench.ncu_probe import profile_once  # noqa: E402
from forge_num import kernels, rules  # noqa: E402

M, N = (int(v) for v in sys.argv[1].split("x"))
K = int(sys.argv[2])
x, dy, w, states, h, _ = regime_problem(M, N, K, "fp32")
kernel, tile = kernels.launcher_tile(w, x, dy, states)
print("the launcher's kernel:", kernel, tile.label)


def launches():
    kernels.fused_linear_update(w, x, dy, states, rules.ADAMW, h)
    dy.t() @ x


profile_once(launches)
