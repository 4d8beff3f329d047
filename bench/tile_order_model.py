"""How many bytes of the GEMM operands a persistent split tile reads from DRAM, by tile order: an LRU model of L2.

The fused kernels walk their tiles in grouped order (kernels/gluon_update.py's tile_coords: GROUP_M tile rows,
column by column), one program an SM, each program taking every programs-th tile. Between two uses of an operand
panel (dy's BM rows or x's BN columns, K tokens deep) the L2 also sees every tile's state stream (W and the states
read and written once: 24 bytes an element in the fp32 regime), which is never reused. This script replays that
access stream through an LRU cache of a given capacity and counts the operand bytes that miss, the DRAM reads
beyond the state's.

The model: the programs run in lockstep waves (wave r holds tiles r*programs .. r*programs + programs - 1); a
wave's tiles read their K blocks together, block by block (a BM x BK chunk of dy and a BN x BK chunk of x each);
the previous wave's tiles stream their state meanwhile (the epilogue overlaps the next tile's mainloop), in
`state_slices` slices spread over the wave's K blocks; L2 is one LRU cache of capacity C. The H100's L2 is 50 MB
in two partitions, hashed and not exactly LRU, so C is a parameter: the answers below are read over C = 25-50 MB.

Checked against ncu (session 39, H100, 4096x14336 at 1024 tokens, the default 64x128 tile, GROUP_M = 8): 949 MB
read, of which 705 MB are W and the two states, so ~244 MB of operands; the model gives 243 MB at C = 35-50 MB
(306 at 25 MB), the operands once being 38 MB. Where it falls short: at 16384 tokens (the same shape, the 128-row
tile, ncu in session 39: ~3.78 GB of operand reads) it gives 2.98 GB at any C: over 256 K blocks the programs
drift out of the lockstep it assumes, and a wave's shared panels are fetched more than once.

    python bench/tile_order_model.py --shapes 4096x14336,28672x8192 --tokens 1024,2048 --groups 8,16,32,64
"""
from __future__ import annotations

import argparse
import collections
import json


def tile_coords(tile: int, tiles_m: int, tiles_n: int, group_m: int) -> tuple[int, int]:
    """(pid_m, pid_n) of the tile-th tile in grouped order, as kernels/gluon_update.py's tile_coords."""
    group = tile // (group_m * tiles_n)
    first_m = group * group_m
    rows = min(tiles_m - first_m, group_m)
    r = tile % (group_m * tiles_n)
    return first_m + r % rows, r // rows


def operand_dram_bytes(M: int, N: int, K: int, *, BM: int = 64, BN: int = 128, BK: int = 64, group_m: int = 8,
                       programs: int = 132, capacity_mb: float = 50.0, state_bytes: int = 24,
                       state_slices: int = 4) -> int:
    """Bytes of dy (K x M) and x (K x N), bf16, that miss the modelled L2 (the module docstring's model)."""
    tiles_m, tiles_n = -(-M // BM), -(-N // BN)
    tiles, n_k = tiles_m * tiles_n, -(-K // BK)
    capacity = capacity_mb * 2**20
    dy_chunk, x_chunk = BM * BK * 2, BN * BK * 2
    state_slice = BM * BN * state_bytes // state_slices
    cache: collections.OrderedDict = collections.OrderedDict()
    held = missed = 0

    def touch(key, nbytes: int, reused: bool) -> int:
        nonlocal held
        if reused and key in cache:
            cache.move_to_end(key)
            return 0
        cache[key] = nbytes
        held += nbytes
        while held > capacity:
            held -= cache.popitem(last=False)[1]
        return nbytes

    streaming: list[int] = []
    state_key = 0
    slice_every = max(1, n_k // state_slices)
    for first in range(0, tiles, programs):
        wave = [tile_coords(t, tiles_m, tiles_n, group_m) for t in range(first, min(first + programs, tiles))]
        for kb in range(n_k):
            for pid_m, pid_n in wave:
                missed += touch((0, pid_m, kb), dy_chunk, True)
                missed += touch((1, pid_n, kb), x_chunk, True)
            if kb % slice_every == 0 and kb // slice_every < state_slices:
                for _ in streaming:
                    state_key += 1
                    touch((2, state_key), state_slice, False)
        streaming = wave
    return missed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x14336,14336x4096,4096x4096,8192x8192,28672x8192",
                    help="weights MxN (out x in features)")
    ap.add_argument("--tokens", default="512,1024,2048")
    ap.add_argument("--groups", default="1,8,16,32,64", help="GROUP_M values (tile rows a group)")
    ap.add_argument("--capacity-mb", default="25,35,50")
    ap.add_argument("--bm", type=int, default=64)
    ap.add_argument("--state-bytes", type=int, default=24, help="a weight element's state traffic: fp32 24, 8bit ~8")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        M, N = map(int, shape.split("x"))
        for K in map(int, args.tokens.split(",")):
            once = (M + N) * K * 2
            state = M * N * args.state_bytes
            for cap in map(float, args.capacity_mb.split(",")):
                row = {"M": M, "N": N, "K": K, "BM": args.bm, "capacity_mb": cap, "operands_once": once,
                       "state_bytes": state, "operand_reads": {}}
                for g in map(int, args.groups.split(",")):
                    if g > -(-M // args.bm):
                        continue
                    row["operand_reads"][g] = operand_dram_bytes(M, N, K, BM=args.bm, group_m=g, capacity_mb=cap,
                                                                 state_bytes=args.state_bytes)
                rows.append(row)
                cells = "  ".join(f"G{g} {b / 1e6:6.0f} ({(state + b) / (state + once):.2f}x)"
                                  for g, b in row["operand_reads"].items())
                print(f"{M}x{N} K={K:<5d} C={cap:4.0f} MB  once {once / 1e6:5.0f} MB  {cells}", flush=True)
    print("operand MB read from DRAM by GROUP_M, and (state + those) / (state + operands once)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
