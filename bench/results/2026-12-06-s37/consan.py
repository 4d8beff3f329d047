"""One update of a Gluon split tile under Triton's concurrency sanitizer (ConSan, Triton 3.6:
TRITON_INSTRUMENTATION_MODE=consan): every shared-memory access, barrier, TMA copy and wgmma of the kernel
checked at run time for an unordered pair (a device assertion names the first it meets).

`python bench/results/2026-12-06-s37/consan.py TILE`, TILE one of the names below; prints "TILE ...: clean", or
the assertion (and the process fails). ConSan's kernels are compiled afresh (a
private TRITON_CACHE_DIR: the compile cache's key does not name the instrumentation mode) and launched through
JITFunction.run (FORGE_NUM_FAST_LAUNCH=0), with an allocator for its global scratch."""

import os
import sys
import tempfile

os.environ["TRITON_INSTRUMENTATION_MODE"] = "consan"
os.environ["FORGE_NUM_FAST_LAUNCH"] = "0"
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="consan_cache_")
sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import triton  # noqa: E402

from forge_num.emulator.philox import derive_seed  # noqa: E402
from forge_num.kernels import gluon_f32, gluon_q8  # noqa: E402
from tests.test_gpu_gluon import _case, _q8_states  # noqa: E402

TILES = {
    "q8_staged": ("8bit", gluon_q8.MMA_STAGED_CONFIG),
    "q8_deep": ("8bit", gluon_q8.DEEP_CURSOR_CONFIG),
    "q8_stage_state": ("8bit", gluon_q8.Q8WSConfig(num_warps=16, STAGES=4, self_load=True, load_cursor=True,
                                                   max_registers=96, mma_registers=96, stage_state=True)),
    "q8_default": ("8bit", gluon_q8.DEFAULT_Q8_WS_CONFIG),
    "f32_default": ("fp32", gluon_f32.DEFAULT_F32_WS_CONFIG),
    "f32_ss2": ("fp32", gluon_f32.F32WSConfig(stage_slots=2)),
    "f32_tall_gb1": ("fp32", gluon_f32.TALL_ONE_BUFFER_F32_WS_CONFIG),
}


def main():
    name = sys.argv[1]
    M, N, K = (int(v) for v in (sys.argv[2:5] if len(sys.argv) >= 5 else (2048, 2048, 256)))
    precision, config = TILES[name]
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    rule, h, w32, s32, x, dy = _case("adamw", M, N, K, seed=11)
    if precision == "8bit":
        w, s = w32.bfloat16(), _q8_states(s32, 11)
        gluon_q8.fused_linear_update_q8_ws(w, x, dy, s, rule, h, config=config, seed=derive_seed(11, 3, 2**40 + M))
        got = [w.view(torch.int16)] + [t for q in s for t in (q.codes, q.scales.view(torch.int32))]
    else:
        w, s = w32.clone(), [t.clone() for t in s32]
        gluon_f32.fused_linear_update_f32_ws(w, x, dy, s, rule, h, config=config)
        got = [w.view(torch.int32)] + [t.view(torch.int32) for t in s]
    torch.cuda.synchronize()
    print(f"{name} {M}x{N} K={K}: clean (no ConSan assertion); {sum(int(t.numel()) for t in got)} words written",
          flush=True)


if __name__ == "__main__":
    main()
