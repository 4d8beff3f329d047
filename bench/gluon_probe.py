"""A warp-specialized Gluon GEMM for sm_90, compiled on the CPU: the starting point of the overlap kernel.

Session 9's measurements (bench/NOTES.md) leave one route to the fused kernel's targets: a kernel
whose loads for the update are in flight while the mainloop runs, written by hand in Gluon
(triton.experimental.gluon), since Triton 3.6's automatic warp specialization miscompiled the
fused tile (session 8). This is the skeleton such a kernel starts from, not yet part of forge_num
and never run on a GPU: one TMA producer warp (24 registers, `setmaxnreg`) fills a ring of
STAGES shared-memory slots of A [BM, BK] and B [BK, BN] tiles, guarded by `ready` / `empty`
mbarriers; the default partition (4 warps, one warp group) waits for each slot, runs `wgmma`
on it, frees the slot, and stores C through TMA.

Found on the way (Triton 3.6.0): a default partition that *returns* its accumulator fails to
compile (`warp_specialize` calls `flatten_values_to_ir` outside JIT, "Did you forget to add
@triton.jit?"), so the default partition runs its epilogue itself.

    python bench/gluon_probe.py      prints the PTX counts (wgmma, TMA copies, mbarrier ops, setmaxnreg)

tests/ptx_check.py compiles it in CI and checks that the counts are there.
"""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma

@gluon.jit
def producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, K, BLOCK_K: gl.constexpr,
             STAGES: gl.constexpr):
    """The producer warp: TMA loads of the K blocks into the ring, each slot once the consumer freed it."""
    i = 0
    for k in range(0, K, BLOCK_K):
        s = i % STAGES
        mbarrier.wait(empty.index(s), phase=((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [off_m, k], ready.index(s), a_bufs.index(s))
        tma.async_copy_global_to_shared(b_desc, [k, off_n], ready.index(s), b_bufs.index(s))
        i += 1


@gluon.jit
def consumer(a_bufs, b_bufs, ready, empty, c_desc, off_m, off_n, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    """The default partition (one warp group): wgmma on each slot as it becomes ready, then C [BM, BN]
    through shared memory and TMA. One wgmma instruction spans the tile's 128 columns (instr_shape n)."""
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    i = 0
    for k in range(0, K, BLOCK_K):
        s = i % STAGES
        mbarrier.wait(ready.index(s), phase=(i // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc)
        mbarrier.arrive(empty.index(s), count=1)
        i += 1
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc)
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def ws_kernel(a_desc, b_desc, c_desc, num_warps: gl.constexpr):
    """C = A·B, one [BM, BN] tile a program: the shared ring and its barriers, then the two partitions."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    STAGES: gl.constexpr = 2
    K = a_desc.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    off_m = gl.program_id(0) * BLOCK_M
    off_n = gl.program_id(1) * BLOCK_N
    gl.warp_specialize([
        (consumer, (a_bufs, b_bufs, ready, empty, c_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)),
        (producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, off_m, off_n, K, BLOCK_K, STAGES)),
    ], [1], [24])


def compile_ptx(BM: int = 64, BN: int = 128, BK: int = 64) -> str:
    """PTX of ws_kernel for sm_90 with bf16 A [256, 512], B [512, 256] and fp32 C (no GPU needed: the
    descriptors are built on CPU tensors only for their types)."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import create_function_from_signature

    a = torch.empty(256, 512, dtype=torch.bfloat16)
    b = torch.empty(512, 256, dtype=torch.bfloat16)
    c = torch.empty(256, 256)
    descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), blk, gl.NVMMASharedLayout.get_default_for(blk, ty))
             for t, blk, ty in ((a, [BM, BK], gl.bfloat16), (b, [BK, BN], gl.bfloat16), (c, [BM, BN], gl.float32))]
    binder = create_function_from_signature(ws_kernel.signature, ws_kernel.params, BaseBackend)
    _, spec, _ = binder(*descs, 4)
    signature = {p.name: s[0] for p, s in zip(ws_kernel.params, spec)}
    src = GluonASTSource(fn=ws_kernel, signature=signature, constexprs={"num_warps": 4})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]


def ptx_counts(ptx: str) -> dict:
    return {name: len(re.findall(pattern, ptx)) for name, pattern in (
        ("wgmma", r"wgmma\.mma_async"), ("tma", r"cp\.async\.bulk\.tensor"), ("mbarrier", r"mbarrier\."),
        ("setmaxnreg", r"setmaxnreg"))}


if __name__ == "__main__":
    print(ptx_counts(compile_ptx()))
