"""How fast can a tiled update stream its state? W, m, v (fp32) read and written once, tile by tile,
with AdamW's arithmetic on a gradient that costs no memory (g = 1e-3 w), for tiles of one size (8192
elements) and different shapes, beside the same update on flat contiguous blocks.

Session 10's question (bench/NOTES.md, "v11"): at K = 256 every fused tile, Triton's or Gluon's,
streams the state at ~2.4 TB/s, where the element-wise update reaches 3.9 TB/s. If a 64x128 tile
(64 rows of W, 512 bytes each) streams slower than a flat block or a wide tile, the tile's shape
is the limit, and the fused kernel needs wider tiles.

    python bench/state_stream.py [--shape 8192x8192] [--out x.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

TILES = ((64, 128), (128, 64), (64, 256), (32, 256), (16, 512), (8, 1024), (4, 2048), (1, 8192))


@triton.jit
def stream_tile_kernel(w_ptr, m_ptr, v_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr, FLAT: tl.constexpr):
    pid = tl.program_id(0)
    if FLAT:  # a contiguous block of BM * BN elements
        offs = pid.to(tl.int64) * (BM * BN) + tl.arange(0, BM * BN)
        mask = offs < M.to(tl.int64) * N
    else:  # tile (pid // tiles_n, pid % tiles_n): row-major order
        tiles_n = tl.cdiv(N, BN)
        rows = (pid // tiles_n) * BM + tl.arange(0, BM)
        cols = (pid % tiles_n) * BN + tl.arange(0, BN)
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        mask = (rows[:, None] < M) & (cols[None, :] < N)
    w = tl.load(w_ptr + offs, mask=mask)
    m = tl.load(m_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)
    g = w * 1e-3
    m = m + 0.1 * (g - m)
    v = v * 0.999 + 0.001 * g * g
    w = w * 0.9999 - 1e-4 * m / (tl.sqrt_rn(v) + 1e-8)
    tl.store(w_ptr + offs, w, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192x8192")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    M, N = (int(v) for v in args.shape.split("x"))
    w, m, v = (torch.rand(M, N, device="cuda") for _ in range(3))
    nbytes = 24 * M * N
    rows = []
    for (bm, bn), flat in [(t, False) for t in TILES] + [((64, 128), True)]:
        for warps in (4, 8):
            grid = (triton.cdiv(M * N, bm * bn),) if flat else (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
            fn = lambda: stream_tile_kernel[grid](w, m, v, M, N, BM=bm, BN=bn, FLAT=flat, num_warps=warps)  # noqa: E731
            ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
            rows.append({"tile": "flat" if flat else f"{bm}x{bn}", "warps": warps, "ms": ms, "TB_s": nbytes / ms * 1e-9})
            print(f"{rows[-1]['tile']:>8} w{warps}  {ms:.3f} ms  {rows[-1]['TB_s']:.2f} TB/s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": [M, N], "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
