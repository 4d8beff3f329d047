"""Session 41 (CPU): what Gluon makes of a two-CTA program for sm_90 under the installed Triton (3.7 or newer):
x's [64, 128] block copied by TMA with multicast=True into both CTAs, then one barrier arrived at by both CTAs'
elected threads (allocate_mbarrier(two_ctas=True): on Triton 3.9 the arrival is routed to the lead CTA's barrier,
mbarrier.arrive.shared::cluster with the rank bit of the address cleared; on 3.7 it stays in each CTA). Prints
the PTX lines that show who issues the copy and where the arrivals go.

    python bench/results/2026-12-07-s41/triton_probes/cluster_probe.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from forge_num.kernels.gluon_update import compile_gluon_for_sm90, tma_load, tma_store  # noqa: E402

try:  # Triton 3.9: one cluster-wide barrier; 3.7: the init fence and an arrive/wait pair
    from triton.experimental.gluon.language.nvidia.hopper.cluster import barrier as cluster_barrier
except ImportError:
    cluster_barrier = mbarrier.sync_cluster_init


@gluon.jit
def two_cta_probe(x_desc):
    smem = gl.allocate_shared_memory(x_desc.dtype, x_desc.block_shape, x_desc.layout)
    ready = mbarrier.allocate_mbarrier()
    released = mbarrier.allocate_mbarrier(two_ctas=True)
    mbarrier.init(ready, count=1)
    mbarrier.init(released, count=2)
    cluster_barrier()
    mbarrier.expect(ready, x_desc.nbytes_per_cta)
    tma_load(x_desc, [0, 0], ready, smem, multicast=True)
    mbarrier.wait(ready, phase=0, deps=[smem])
    mbarrier.arrive(released, count=1)
    mbarrier.wait(released, phase=0)
    tma_store(x_desc, [0, 0], smem)
    tma.store_wait(0)


x = torch.empty(64, 128, dtype=torch.bfloat16)
layout = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16, cga_layout=[[0, 0]])  # both CTAs hold all
ptx = compile_gluon_for_sm90(two_cta_probe, dict(x_desc=TensorDescriptor.from_tensor(x, [64, 128], layout)), 4,
                             {"num_ctas": 2}).asm["ptx"]
print("triton", triton.__version__)
for line in ptx.splitlines():
    if any(k in line for k in ("multicast", "mbarrier.arrive", "reqnctapercluster", "cluster_ctarank", "-16777232")):
        print("   ", line.strip()[:150])
