"""Two-CTA dW mainloop with x's K blocks shared by TMA multicast (session 41, CPU: compiled for sm_90 under
Triton 3.9, not yet run on a GPU). A probe, not a forge_num kernel. What it answers: does a cluster of two
64x128 tiles that share x's block (each CTA loading its own dY rows) run the fp32 split tile's mainloop faster
than two independent 64x128 tiles, as the L2 traffic says it should (bench/NOTES.md, session 41: 128 rows of
operands a tile from L2 instead of 192, the 128x128 tile's 0.67x, while each SM could keep the 64-row tile's
sixteen epilogue warps)?

The program is the cluster (Gluon's num_ctas = 2): a [128, 128] block of dW = dYᵀ X, rows split between the
two CTAs (cga_layout [[1, 0]]: CTA r computes rows 64 r .. 64 r + 63), x's [BK, 128] buffers broadcast
([[0, 0]]: both CTAs hold the whole block). A STAGES-deep ring:

    ready[s]   each CTA's own: its dY half (8 KB) and x's block (16 KB) landed
    released[s] the lead CTA's (allocate_mbarrier(two_ctas=True): Triton 3.9 routes both CTAs' arrivals there,
               only the lead waits), two arrivals: both CTAs' wgmma on slot s retired (init's count is per CTA
               on such a barrier: count=1 is 2 in the PTX; session 42's count=2, 4, hung). The lead issues x's
               multicast (Gluon's lowering picks the lowest rank of the broadcast group), so it alone must know
               that the other CTA is done with the slot before refilling it; a CTA's own dY half is refilled in
               program order after its own wgmma retired (warpgroup_mma_wait(1)), as gluon_q8's
               mma_self_loaded_tiles does.

MULTICAST=False: the same program with x loaded by each CTA for itself (the same bytes into the same slots),
the baseline with the same chain of wgmma: both give the same bits. The fp32 result goes out through shared
memory, written to dW by pointer by a partition of its own (the MMA warp group hands it over, as in the split
tile).

    python bench/multicast_mainloop.py --check            # bits: multicast against not, and the sm_90 tensor-core model
    python bench/multicast_mainloop.py --shapes 4096x14336,28672x8192 --tokens 1024,4096,16384

Needs a Triton whose Gluon has multicast TMA copies and two-CTA barriers that route arrivals (3.9;
bench/triton_carry.sh brings one to the device).

Status (session 41): compiled for sm_90 under Triton 3.9 (`--ptx`), not run. In the PTX each CTA expects
24,576 bytes a slot, loads its dY half itself and takes x from the lead's `multicast::cluster` copy, arrives at
the lead's barrier (`mbarrier.arrive.shared::cluster`), and only the lead waits there; no spills; the wgmma
chain not serialized. ptxas serialized it (C7515) while the MMA warps also wrote the result (by pointer or by
TMA), and while the zero accumulator stood before a loop that might run no iteration (its zeros moved on the
loop's exit edge, inside the pipeline): hence the writing partition and the first block before the loop.

Session 42 (H100, Triton 3.9 with the device Triton's ptxas 12.8; bench/results/2026-12-07-s42/call1): `--check`
gave the sm_90 model's bits with and without multicast at K = 64, 100 and 256 (at most four blocks, no slot
reused), then hung at K = 512: the released barriers were initialized with count=2, which Gluon writes as 4 on
a two-CTA barrier (count per CTA). count=1 since; not yet run again.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

try:
    from triton.experimental.gluon.language.nvidia.hopper import cluster
except ImportError:  # before Triton 3.7
    raise SystemExit(f"bench/multicast_mainloop.py needs Triton 3.9's Gluon (two-CTA barriers that route "
                     f"arrivals, multicast TMA copies); this is Triton {triton.__version__}") from None

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from emulator.tensor_core import dot_sm90  # noqa: E402
from bench.pair_tile import multiply_block  # noqa: E402
from forge_num.kernels.gluon_update import tma_load  # noqa: E402

CTA_ROWS = 64  # rows of dW a CTA computes: one warp group's m64 wgmma
BN, BK = 128, 64


@gluon.jit
def load_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, kb, pid_m, pid_n, MULTICAST: gl.constexpr, pred=True):
    """K block kb's dY half (this CTA's rows) and x's block (multicast by the lead, or each CTA's own) into slot
    kb % STAGES, counted against this CTA's ready[slot]."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    BKc: gl.constexpr = dy_desc.block_type.shape[0]
    ROWS: gl.constexpr = dy_desc.block_type.shape[1]  # the cluster's rows (both CTAs')
    COLS: gl.constexpr = x_desc.block_type.shape[1]
    s = kb % STAGES
    mbarrier.expect(ready.index(s), dy_desc.nbytes_per_cta + x_desc.nbytes_per_cta, pred=pred)
    tma_load(dy_desc, [kb * BKc, pid_m * ROWS], ready.index(s), dy_bufs.index(s), pred=pred)
    tma_load(x_desc, [kb * BKc, pid_n * COLS], ready.index(s), x_bufs.index(s), pred=pred, multicast=MULTICAST)


@gluon.jit
def mma_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, released, out_smem, done, K, pid_m, pid_n,
                  MULTICAST: gl.constexpr):
    """Worker (one warp group): the ring's loads and the wgmma chain, K blocks of BK in the order the fp32 split
    tile takes them; the accumulator into out_smem, then done."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    BKc: gl.constexpr = dy_desc.block_type.shape[0]
    ROWS: gl.constexpr = dy_desc.block_type.shape[1]
    COLS: gl.constexpr = x_desc.block_type.shape[1]
    nk = gl.cdiv(K, BKc)
    for j in gl.static_range(STAGES - 1):
        if j < nk:
            load_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, j, pid_m, pid_n, MULTICAST)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, COLS, 16], cga_layout=[[1, 0]])
    # block 0 from a zero accumulator before the loop (K > 0): with the zeros before a loop that may run no
    # iteration, they are moved into the accumulator on the loop's exit edge, inside the wgmma pipeline, and
    # ptxas serializes the chain (C7515). The same chain: zeros, then each block in K order, each block's wgmma
    # and its predecessor's release as the pair tile's (pair_tile.multiply_block)
    acc = multiply_block(dy_bufs, x_bufs, ready, released, 0,
                         gl.zeros((ROWS, COLS), dtype=gl.float32, layout=acc_layout), SHARED=MULTICAST)
    load_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, STAGES - 1, pid_m, pid_n, MULTICAST, pred=STAGES - 1 < nk)
    for kb in range(1, nk):
        acc = multiply_block(dy_bufs, x_bufs, ready, released, kb, acc, SHARED=MULTICAST)
        ahead = kb + STAGES - 1
        # that slot's next block: the lead waits for both CTAs' release before refilling it (predicates, not
        # branches, around the chain); without the multicast each CTA refills after its own wgmma retired
        if MULTICAST:
            mbarrier.wait(released.index(ahead % STAGES), ((ahead // STAGES) - 1) & 1, pred=ahead < nk)
        load_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, ahead, pid_m, pid_n, MULTICAST, pred=ahead < nk)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    out_smem.store(acc)
    mbarrier.arrive(done, count=1)


@gluon.jit
def write_partition(out_smem, done, out_ptr, N, pid_m, pid_n):
    """Default partition (four warps): the block from out_smem to dW by pointer, each CTA its own rows. Why not
    the MMA warps: with the global stores (by pointer or by TMA) after their loop, ptxas serializes the wgmma
    chain (C7515; session 41, a one-CTA copy of the loop), as the fp32 split tile avoids by its epilogue
    partition."""
    ROWS: gl.constexpr = out_smem.type.shape[0]
    COLS: gl.constexpr = out_smem.type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0], cga_layout=[[1, 0]])
    mbarrier.wait(done, 0)
    block = out_smem.load(layout)
    rows = pid_m * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = pid_n * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    gl.store(out_ptr + rows[:, None].to(gl.int64) * N + cols[None, :], block)


@gluon.jit
def two_cta_mainloop_kernel(dy_desc, x_desc, out_ptr, N, K, STAGES: gl.constexpr, MULTICAST: gl.constexpr):
    """out[pid_m * 128 :, pid_n * 128 :] = dY[:, rows]ᵀ X[:, cols] in fp32 for the cluster's block (module
    docstring)."""
    gl.static_assert(gl.num_ctas() == 2)
    BKc: gl.constexpr = dy_desc.block_type.shape[0]
    ROWS: gl.constexpr = dy_desc.block_type.shape[1]
    COLS: gl.constexpr = x_desc.block_type.shape[1]
    tiles_n = gl.cdiv(N, COLS)
    pid_m = gl.program_id(0) // tiles_n
    pid_n = gl.program_id(0) % tiles_n
    dy_bufs = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, BKc, ROWS], dy_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BKc, COLS], x_desc.layout)
    out_smem = gl.allocate_shared_memory(gl.float32, [ROWS, COLS], gl.NVMMASharedLayout.get_default_for(
        [ROWS, COLS], gl.float32, cga_layout=[[1, 0]]))
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    released = ready  # without the multicast none (pair_tile.multiply_block's SHARED); never used then
    if MULTICAST:
        released = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)
    done = mbarrier.allocate_mbarrier()
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        if MULTICAST:
            mbarrier.init(released.index(i), count=1)
    mbarrier.init(done, count=1)
    cluster.barrier()  # both CTAs' barriers initialized before any copy or arrival reaches them
    gl.warp_specialize([
        (write_partition, (out_smem, done, out_ptr, N, pid_m, pid_n)),
        (mma_partition, (dy_desc, x_desc, dy_bufs, x_bufs, ready, released, out_smem, done, K, pid_m, pid_n,
                         MULTICAST)),
    ], [4], [232])
    # neither CTA leaves while the other may still arrive at its barriers (the last releases, which nothing waits
    # for) or copy into its shared memory
    cluster.barrier()


def descriptors(dy: torch.Tensor, x: torch.Tensor):
    """TMA descriptors of the cluster's blocks: dY [BK, 128] split by rows between the CTAs, x [BK, 128] whole in
    both."""
    dy_layout = gl.NVMMASharedLayout.get_default_for([BK, 2 * CTA_ROWS], gl.bfloat16, cga_layout=[[0, 1]])
    x_layout = gl.NVMMASharedLayout.get_default_for([BK, BN], gl.bfloat16, cga_layout=[[0, 0]])
    return (TensorDescriptor.from_tensor(dy, [BK, 2 * CTA_ROWS], dy_layout),
            TensorDescriptor.from_tensor(x, [BK, BN], x_layout))


def two_cta_dw(dy: torch.Tensor, x: torch.Tensor, multicast: bool = True, stages: int = 4) -> torch.Tensor:
    """dW = dyᵀ x (fp32) by the two-CTA mainloop; dy [K, M], x [K, N] bf16, M a multiple of 128, N of 128."""
    K, M = dy.shape
    N = x.shape[1]
    if M % (2 * CTA_ROWS) or N % BN:
        raise ValueError(f"two_cta_dw: M a multiple of {2 * CTA_ROWS} and N of {BN}, got {M}x{N}")
    out = torch.empty(M, N, dtype=torch.float32, device=dy.device)
    dy_desc, x_desc = descriptors(dy, x)
    grid = (M // (2 * CTA_ROWS) * (N // BN),)
    two_cta_mainloop_kernel[grid](dy_desc, x_desc, out, N, K, STAGES=stages, MULTICAST=multicast, num_warps=4,
                                  num_ctas=2)
    return out


def compile_for_sm90(multicast: bool = True, stages: int = 4, M: int = 256, N: int = 256, K: int = 256):
    """The kernel compiled for sm_90 without a GPU (gluon_update.compile_gluon_for_sm90)."""
    from forge_num.kernels.gluon_update import compile_gluon_for_sm90

    dy = torch.empty(K, M, dtype=torch.bfloat16)
    x = torch.empty(K, N, dtype=torch.bfloat16)
    dy_desc, x_desc = descriptors(dy, x)
    args = dict(dy_desc=dy_desc, x_desc=x_desc, out_ptr=torch.empty(M, N), N=N, K=K, STAGES=stages,
                MULTICAST=multicast)
    return compile_gluon_for_sm90(two_cta_mainloop_kernel, args, 4, {"num_ctas": 2})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="bits: multicast against not, and against the sm_90 tensor-core model")
    p.add_argument("--ptx", action="store_true",
                   help="compile for sm_90 (no GPU) and count the PTX's cluster instructions")
    p.add_argument("--ncu", action="store_true",
                   help="launch each variant once per shape and K (to run under ncu), no timing")
    p.add_argument("--shapes", default="4096x14336,28672x8192")
    p.add_argument("--tokens", default="1024,4096,16384")
    args = p.parse_args(argv)
    if args.ptx:
        from bench.registers import resource_usage

        for mc in (True, False):
            ptx = compile_for_sm90(mc).asm["ptx"]
            counts = {name: len(re.findall(pattern, ptx)) for name, pattern in (
                ("multicast copies", r"cp\.async\.bulk\.tensor\S*multicast::cluster"),
                ("arrivals at the lead", r"mbarrier\.arrive\.shared::cluster"),
                ("wgmma", r"wgmma\.mma_async"), ("cluster directives", r"\.reqnctapercluster"))}
            print(f"multicast={mc}:", counts, resource_usage(ptx))
        return
    torch.manual_seed(0)
    if args.check:
        # K from one block (the loop runs no iteration) through a ragged last block (TMA fills it with zeros)
        # to more blocks than stages; M and N several clusters
        failed = 0
        for K, M, N in ((64, 256, 384), (100, 128, 128), (256, 256, 256), (512, 256, 384), (1000, 384, 256)):
            dy = torch.randn(K, M, dtype=torch.bfloat16, device="cuda")
            x = torch.randn(K, N, dtype=torch.bfloat16, device="cuda")
            shared, alone = two_cta_dw(dy, x, True), two_cta_dw(dy, x, False)
            # the bits of the sm_90 tensor-core model (proofs/tensor_core_model.md, Assumptions M and K): the
            # chain of k16 instructions in increasing k, each from the last one's accumulator, zeros first
            model = dot_sm90(dy.t().contiguous().cpu().view(torch.int16).numpy().view(np.uint16),
                             x.cpu().view(torch.int16).numpy().view(np.uint16), np.zeros((M, N), np.float32))
            same = torch.equal(shared.view(torch.int32), alone.view(torch.int32))
            modelled = np.array_equal(shared.cpu().numpy().view(np.uint32), model.view(np.uint32))
            failed += not (same and modelled)
            print(f"K={K} {M}x{N}: multicast == not, bit for bit: {same}; == the sm_90 model: {modelled}")
        sys.exit(1 if failed else 0)
    if args.ncu:  # each variant once a shape and K, for ncu -k regex:two_cta (the first launch compiles)
        for shape in args.shapes.split(","):
            M, N = (int(v) for v in shape.split("x"))
            for K in (int(v) for v in args.tokens.split(",")):
                dy = torch.randn(K, M, dtype=torch.bfloat16, device="cuda")
                x = torch.randn(K, N, dtype=torch.bfloat16, device="cuda")
                for mc in (True, False):
                    two_cta_dw(dy, x, mc)
                    torch.cuda.synchronize()
                    print(f"{M}x{N} K={K} multicast={mc}: launched")
        return
    for shape in args.shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        for K in (int(v) for v in args.tokens.split(",")):
            dy = torch.randn(K, M, dtype=torch.bfloat16, device="cuda")
            x = torch.randn(K, N, dtype=torch.bfloat16, device="cuda")
            ms = {name: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") for name, fn in (
                ("multicast", lambda: two_cta_dw(dy, x, True)), ("alone", lambda: two_cta_dw(dy, x, False)),
                ("cublas", lambda: dy.t() @ x))}
            tflops = {k: 2 * M * N * K / v * 1e-9 for k, v in ms.items()}
            print(f"{M}x{N} K={K}: " + "  ".join(f"{k} {ms[k]:.3f} ms ({tflops[k]:.0f} TFLOP/s)" for k in ms))


if __name__ == "__main__":
    main()
