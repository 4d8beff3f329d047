"""A 2x2 cluster (session 43, CPU, Triton 3.9, compile only; session 42's probe with the issuers' roles): a
[128, 256] block on four CTAs, dY halves multicast along rank bit 1, x halves along bit 0, each CTA releasing a
slot to both issuers by from_cta routing; each release barrier waited for only where it lives, in the CTA that
issues that operand's multicast (rank bit 1 clear for dY's, bit 0 clear for x's), the rank read from
%cluster_ctarank by inline asm (Gluon has no builtin). Run under Triton 3.9 from the repository root."""
import re, sys, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait, cluster
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from forge_num.kernels.gluon_update import tma_load, compile_gluon_for_sm90
from bench.registers import resource_usage

BK = gl.constexpr(64)

@gluon.jit
def quad_kernel(dy_desc, x_desc, out_ptr, N, K, STAGES: gl.constexpr):
    ROWS: gl.constexpr = dy_desc.block_type.shape[1]   # 128: two CTAs' rows
    COLS: gl.constexpr = x_desc.block_type.shape[1]    # 256: two CTAs' columns
    dy_bufs = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, BK, ROWS], dy_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BK, COLS], x_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    dy_released = mbarrier.allocate_mbarrier(batch=STAGES)
    x_released = mbarrier.allocate_mbarrier(batch=STAGES)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(dy_released.index(i), count=2)
        mbarrier.init(x_released.index(i), count=2)
    cluster.barrier()
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 128, 16], cga_layout=[[1, 0], [0, 1]])
    nk = gl.cdiv(K, BK)
    # this CTA's rank in the cluster: bit 0 the column half (x's), bit 1 the row half (dY's). The multicast
    # lowering issues a copy from the lowest rank of its broadcast group, where from_cta routes the releases
    rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [nk], dtype=gl.int32, is_pure=True,
                                     pack=1)
    issues_dy = (rank & 2) == 0
    issues_x = (rank & 1) == 0
    for j in gl.static_range(STAGES - 1):
        mbarrier.expect(ready.index(j), dy_desc.nbytes_per_cta + x_desc.nbytes_per_cta)
        tma_load(dy_desc, [j * BK, 0], ready.index(j), dy_bufs.index(j), multicast=True)
        tma_load(x_desc, [j * BK, 0], ready.index(j), x_bufs.index(j), multicast=True)
    acc = gl.zeros((ROWS, COLS), dtype=gl.float32, layout=acc_layout)
    for kb in range(0, nk):
        s = kb % STAGES
        mbarrier.wait(ready.index(s), (kb // STAGES) & 1)
        a = dy_bufs.index(s).permute((1, 0))
        b = x_bufs.index(s)
        acc = warpgroup_mma(a, b, acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a, b))
        prev = (kb + STAGES - 1) % STAGES
        mbarrier.arrive(dy_released.index(prev), pred=kb > 0, from_cta=1)  # to (0, r0): dY's issuer
        mbarrier.arrive(x_released.index(prev), pred=kb > 0, from_cta=2)   # to (r1, 0): x's issuer
        ahead = kb + STAGES - 1
        mbarrier.wait(dy_released.index(prev), ((ahead // STAGES) - 1) & 1, pred=(ahead < nk) & issues_dy)
        mbarrier.wait(x_released.index(prev), ((ahead // STAGES) - 1) & 1, pred=(ahead < nk) & issues_x)
        mbarrier.expect(ready.index(prev), dy_desc.nbytes_per_cta + x_desc.nbytes_per_cta, pred=ahead < nk)
        tma_load(dy_desc, [ahead * BK, 0], ready.index(prev), dy_bufs.index(prev), pred=ahead < nk, multicast=True)
        tma_load(x_desc, [ahead * BK, 0], ready.index(prev), x_bufs.index(prev), pred=ahead < nk, multicast=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0], cga_layout=[[1, 0], [0, 1]])
    block = gl.convert_layout(acc, layout)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    gl.store(out_ptr + rows[:, None] * N + cols[None, :], block)
    cluster.barrier()

dy = torch.empty(512, 128, dtype=torch.bfloat16); x = torch.empty(512, 256, dtype=torch.bfloat16)
dy_l = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16, cga_layout=[[0, 1], [0, 0]])
x_l = gl.NVMMASharedLayout.get_default_for([64, 256], gl.bfloat16, cga_layout=[[0, 0], [0, 1]])
args = dict(dy_desc=TensorDescriptor.from_tensor(dy, [64, 128], dy_l),
            x_desc=TensorDescriptor.from_tensor(x, [64, 256], x_l),
            out_ptr=torch.empty(128, 256), N=256, K=512, STAGES=4)
k = compile_gluon_for_sm90(quad_kernel, args, 4, {"num_ctas": 4})
ptx = k.asm["ptx"]
for name, pat in (("multicast", r"cp\.async\.bulk\.tensor[^\n]*multicast::cluster[^\n]*"),
                  ("arrive cluster", r"mbarrier\.arrive\.shared::cluster[^\n]*"), ("init", r"mbarrier\.init[^\n]*"),
                  ("wgmma", r"wgmma\.mma_async[^\n]*"), ("expect", r"expect_tx[^\n]*")):
    f = re.findall(pat, ptx); print(name, len(f), f[:3])
print(resource_usage(ptx))
print("rank reads", re.findall(r"[^\n]*cluster_ctarank[^\n]*", ptx))
print("predicated waits", len(re.findall(r"mbarrier\.try_wait", ptx)))
i = ptx.index("mbarrier.try_wait"); print(ptx[i-600:i+120])
