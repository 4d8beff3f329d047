"""The dW mainloop on a 2x2 cluster, both operands shared by TMA multicast (session 43, CPU: compiled for sm_90 under
Triton 3.9, not yet run on a GPU). A probe, not a forge_num kernel, beside bench/multicast_mainloop.py's pair. What
it answers: does a cluster of four 64x128 tiles that share dY's and x's blocks run the fp32 split tile's mainloop
faster than the pair, as the L2 traffic says it could (operands of 128 + 256 rows from L2 for four tiles, 96 rows a
tile: 0.5x the 64-row tile's 192, the pair's 128)?

The program is the cluster (num_ctas = 4): a [128, 256] block of dW = dYᵀ X. Rank bit 0 picks the CTA's 64 rows,
bit 1 its 128 columns (the accumulator's cga_layout [[1, 0], [0, 1]]). dY's [BK, 128] buffers are split by bit 0
and shared along bit 1 ([[0, 1], [0, 0]]), x's [BK, 256] shared along bit 0 and split by bit 1 ([[0, 0], [0, 1]]).
A STAGES-deep ring:

    ready[s]        each CTA's own: its dY half (8 KB) and its x half (16 KB) landed, each from a multicast copy
    dy_released[s]  used in dY's issuer (the CTA of its pair with bit 1 clear: the lowering issues a multicast from
                    the lowest rank of its group), two arrivals: both sharers' wgmma on slot s retired; each CTA
                    arrives there with from_cta=1 (the rank's bit 0 kept, bit 1 cleared)
    x_released[s]   likewise in x's issuer (bit 0 clear), from_cta=2

Ordinary barriers, so init's count is literal (2). Only an issuer waits at its barrier before refilling the slot:
the others' copies of the barriers get no arrivals, and a wait there would never pass. The role comes from the
rank, read by inline asm from %cluster_ctarank (Gluon has no builtin). tests/test_cluster_ring_protocol.py's
run_quad models the ring, proofs/ring_protocol.md (Lemma 4) argues it.

    python bench/quad_mainloop.py --ptx       # no GPU: the cluster instructions, registers, the chain
    python bench/quad_mainloop.py --check     # bits against the sm_90 tensor-core model and the pair
    python bench/quad_mainloop.py --shapes 4096x14336,28672x8192 --tokens 1024,4096,16384

Needs Triton 3.9's Gluon (bench/triton_carry.sh brings one to the device).
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
    raise SystemExit(f"bench/quad_mainloop.py needs Triton 3.9's Gluon (multicast TMA copies, arrivals routed "
                     f"across a cluster); this is Triton {triton.__version__}") from None

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from emulator.tensor_core import dot_sm90  # noqa: E402
from bench.multicast_mainloop import two_cta_dw  # noqa: E402
from bench.pair_tile import multiply_block  # noqa: E402
from forge_num.kernels.gluon_update import tma_load  # noqa: E402

ROWS, COLS, BK = 128, 256, 64  # the cluster's block: four 64x128 tiles


@gluon.jit
def load_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, kb, pid_m, pid_n, pred=True):
    """K block kb's dY half and x half of this CTA into slot kb % STAGES, both by multicast (issued from each
    group's lowest rank), counted against this CTA's ready[slot]."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    BKc: gl.constexpr = dy_desc.block_type.shape[0]
    s = kb % STAGES
    mbarrier.expect(ready.index(s), dy_desc.nbytes_per_cta + x_desc.nbytes_per_cta, pred=pred)
    tma_load(dy_desc, [kb * BKc, pid_m * dy_desc.block_type.shape[1]], ready.index(s), dy_bufs.index(s), pred=pred,
             multicast=True)
    tma_load(x_desc, [kb * BKc, pid_n * x_desc.block_type.shape[1]], ready.index(s), x_bufs.index(s), pred=pred,
             multicast=True)


@gluon.jit
def mma_partition(dy_desc, x_desc, dy_bufs, x_bufs, ready, dy_released, x_released, out_smem, done, K, pid_m,
                  pid_n):
    """Worker (one warp group a CTA): the ring's loads and the wgmma chain, as multicast_mainloop's, each slot
    released to both issuers and each issuer waiting for its operand's releases."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    BKc: gl.constexpr = dy_desc.block_type.shape[0]
    R: gl.constexpr = dy_desc.block_type.shape[1]
    C: gl.constexpr = x_desc.block_type.shape[1]
    nk = gl.cdiv(K, BKc)
    # this CTA's rank: bit 0 its rows, bit 1 its columns; dY's issuer has bit 1 clear, x's bit 0
    rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [nk], dtype=gl.int32, is_pure=True,
                                     pack=1)
    issues_dy = (rank & 2) == 0
    issues_x = (rank & 1) == 0
    for j in gl.static_range(STAGES - 1):
        if j < nk:
            load_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, j, pid_m, pid_n)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, C // 2, 16], cga_layout=[[1, 0], [0, 1]])
    # block 0 from zeros before the loop (multicast_mainloop.mma_partition says why)
    acc = multiply_block(dy_bufs, x_bufs, ready, dy_released, 0, gl.zeros((R, C), dtype=gl.float32,
                                                                           layout=acc_layout), x_released)
    load_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, STAGES - 1, pid_m, pid_n, pred=STAGES - 1 < nk)
    for kb in range(1, nk):
        acc = multiply_block(dy_bufs, x_bufs, ready, dy_released, kb, acc, x_released)
        ahead = kb + STAGES - 1
        s = ahead % STAGES
        phase = ((ahead // STAGES) - 1) & 1
        mbarrier.wait(dy_released.index(s), phase, pred=(ahead < nk) & issues_dy)
        mbarrier.wait(x_released.index(s), phase, pred=(ahead < nk) & issues_x)
        load_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, ahead, pid_m, pid_n, pred=ahead < nk)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    out_smem.store(acc)
    mbarrier.arrive(done, count=1)


@gluon.jit
def write_partition(out_smem, done, out_ptr, N, pid_m, pid_n):
    """Default partition (four warps): the block from out_smem to dW by pointer, each CTA its own quarter
    (multicast_mainloop.write_partition says why not the MMA warps)."""
    R: gl.constexpr = out_smem.type.shape[0]
    C: gl.constexpr = out_smem.type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0], cga_layout=[[1, 0], [0, 1]])
    mbarrier.wait(done, 0)
    block = out_smem.load(layout)
    rows = pid_m * R + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
    cols = pid_n * C + gl.arange(0, C, layout=gl.SliceLayout(0, layout))
    gl.store(out_ptr + rows[:, None].to(gl.int64) * N + cols[None, :], block)


@gluon.jit
def quad_mainloop_kernel(dy_desc, x_desc, out_ptr, N, K, STAGES: gl.constexpr):
    """out[pid_m * 128 :, pid_n * 256 :] = dY[:, rows]ᵀ X[:, cols] in fp32 for the cluster's block (module
    docstring)."""
    gl.static_assert(gl.num_ctas() == 4)
    BKc: gl.constexpr = dy_desc.block_type.shape[0]
    R: gl.constexpr = dy_desc.block_type.shape[1]
    C: gl.constexpr = x_desc.block_type.shape[1]
    tiles_n = gl.cdiv(N, C)
    pid_m = gl.program_id(0) // tiles_n
    pid_n = gl.program_id(0) % tiles_n
    dy_bufs = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, BKc, R], dy_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BKc, C], x_desc.layout)
    out_smem = gl.allocate_shared_memory(gl.float32, [R, C], gl.NVMMASharedLayout.get_default_for(
        [R, C], gl.float32, cga_layout=[[1, 0], [0, 1]]))
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    dy_released = mbarrier.allocate_mbarrier(batch=STAGES)
    x_released = mbarrier.allocate_mbarrier(batch=STAGES)
    done = mbarrier.allocate_mbarrier()
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(dy_released.index(i), count=2)
        mbarrier.init(x_released.index(i), count=2)
    mbarrier.init(done, count=1)
    cluster.barrier()  # every CTA's barriers initialized before any copy or arrival reaches them
    gl.warp_specialize([
        (write_partition, (out_smem, done, out_ptr, N, pid_m, pid_n)),
        (mma_partition, (dy_desc, x_desc, dy_bufs, x_bufs, ready, dy_released, x_released, out_smem, done, K,
                         pid_m, pid_n)),
    ], [4], [232])
    cluster.barrier()  # no CTA leaves while another may still arrive at its barriers or copy into it


def descriptors(dy: torch.Tensor, x: torch.Tensor):
    """TMA descriptors of the cluster's blocks: dY [BK, 128] split by rank bit 0 and shared along bit 1, x [BK, 256]
    shared along bit 0 and split by bit 1."""
    dy_layout = gl.NVMMASharedLayout.get_default_for([BK, ROWS], gl.bfloat16, cga_layout=[[0, 1], [0, 0]])
    x_layout = gl.NVMMASharedLayout.get_default_for([BK, COLS], gl.bfloat16, cga_layout=[[0, 0], [0, 1]])
    return (TensorDescriptor.from_tensor(dy, [BK, ROWS], dy_layout),
            TensorDescriptor.from_tensor(x, [BK, COLS], x_layout))


def quad_dw(dy: torch.Tensor, x: torch.Tensor, stages: int = 4) -> torch.Tensor:
    """dW = dyᵀ x (fp32) by the 2x2 cluster's mainloop; dy [K, M], x [K, N] bf16, M a multiple of 128, N of 256."""
    K, M = dy.shape
    N = x.shape[1]
    if M % ROWS or N % COLS:
        raise ValueError(f"quad_dw: M a multiple of {ROWS} and N of {COLS}, got {M}x{N}")
    out = torch.empty(M, N, dtype=torch.float32, device=dy.device)
    dy_desc, x_desc = descriptors(dy, x)
    quad_mainloop_kernel[(M // ROWS * (N // COLS),)](dy_desc, x_desc, out, N, K, STAGES=stages, num_warps=4,
                                                      num_ctas=4)
    return out


def compile_for_sm90(stages: int = 4, M: int = 256, N: int = 512, K: int = 512):
    """The kernel compiled for sm_90 without a GPU (gluon_update.compile_gluon_for_sm90)."""
    from forge_num.kernels.gluon_update import compile_gluon_for_sm90

    dy = torch.empty(K, M, dtype=torch.bfloat16)
    x = torch.empty(K, N, dtype=torch.bfloat16)
    dy_desc, x_desc = descriptors(dy, x)
    args = dict(dy_desc=dy_desc, x_desc=x_desc, out_ptr=torch.empty(M, N), N=N, K=K, STAGES=stages)
    return compile_gluon_for_sm90(quad_mainloop_kernel, args, 4, {"num_ctas": 4})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="bits against the sm_90 tensor-core model and the pair")
    p.add_argument("--ptx", action="store_true", help="compile for sm_90 (no GPU): cluster instructions, registers")
    p.add_argument("--shapes", default="4096x14336,28672x8192")
    p.add_argument("--tokens", default="1024,4096,16384")
    args = p.parse_args(argv)
    if args.ptx:
        from bench.registers import resource_usage

        ptx = compile_for_sm90().asm["ptx"]
        counts = {name: len(re.findall(pattern, ptx)) for name, pattern in (
            ("multicast copies", r"cp\.async\.bulk\.tensor\S*multicast::cluster"),
            ("routed arrivals", r"mbarrier\.arrive\.shared::cluster"), ("rank reads", r"%cluster_ctarank"),
            ("wgmma", r"wgmma\.mma_async"), ("cluster directives", r"\.reqnctapercluster"))}
        print(counts, resource_usage(ptx))
        return
    torch.manual_seed(0)
    if args.check:
        # one block (no loop iteration), a ragged last block, slots reused (K = 512: 8 blocks, 4 stages; 1000)
        failed = 0
        for K, M, N in ((64, 256, 512), (100, 128, 256), (512, 256, 512), (1000, 384, 256)):
            dy = torch.randn(K, M, dtype=torch.bfloat16, device="cuda")
            x = torch.randn(K, N, dtype=torch.bfloat16, device="cuda")
            quad = quad_dw(dy, x)
            model = dot_sm90(dy.t().contiguous().cpu().view(torch.int16).numpy().view(np.uint16),
                             x.cpu().view(torch.int16).numpy().view(np.uint16), np.zeros((M, N), np.float32))
            modelled = np.array_equal(quad.cpu().numpy().view(np.uint32), model.view(np.uint32))
            as_pair = torch.equal(quad.view(torch.int32), two_cta_dw(dy, x, True).view(torch.int32))
            failed += not (modelled and as_pair)
            print(f"K={K} {M}x{N}: == the sm_90 model: {modelled}; == the pair: {as_pair}")
        sys.exit(1 if failed else 0)
    for shape in args.shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        for K in (int(v) for v in args.tokens.split(",")):
            dy = torch.randn(K, M, dtype=torch.bfloat16, device="cuda")
            x = torch.randn(K, N, dtype=torch.bfloat16, device="cuda")
            ms = {name: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") for name, fn in (
                ("quad", lambda: quad_dw(dy, x)), ("pair", lambda: two_cta_dw(dy, x, True)),
                ("cublas", lambda: dy.t() @ x))}
            tflops = {k: 2 * M * N * K / v * 1e-9 for k, v in ms.items()}
            print(f"{M}x{N} K={K}: " + "  ".join(f"{k} {ms[k]:.3f} ms ({tflops[k]:.0f} TFLOP/s)" for k in ms))


if __name__ == "__main__":
    main()
