"""The FORGE kernel written by hand in Gluon for sm_90: a warp-specialized, persistent dW = dYᵀX with
the update in the epilogue, whose W and state arrive in shared memory while the mainloop runs.

Why (bench/NOTES.md, sessions 4-9): the Triton kernel's time is its mainloop's plus its epilogue's.
Its epilogue loads W, m and v (12 bytes an element) only when the mainloop ends, and Nsight Compute
measured it latency-bound (45% of DRAM bandwidth at 4096x4096, K = 256, where torch's fused AdamW
reaches 79%). Prefetch hints, fewer barriers and a third program per SM did not change that; Triton
3.6's automatic warp specialization miscompiled the tile (session 8). Here the overlap is explicit:

    partition        warps  work
    state loader     1      TMA loads of the tile's W, S0, S1 column sub-tiles [BM, BN/4] into a ring
                            of SLOTS shared-memory slots, each slot refilled as soon as the consumer
                            has read it
    operand loader   1      TMA loads of the K blocks dY[k0:k0+BK, rows] and X[k0:k0+BK, cols] into
                            a ring of STAGES slots
    consumer       4 or 8   (split_mma: an MMA warp group and eight epilogue warps, g between them in
                            shared memory; pingpong: two 4-warp consumers on alternate tiles, one's
                            update beside the other's mainloop; candidates, not routed)
                            per tile: the mainloop (one m64nBNk16 wgmma chain per warp group, in K
    (default)               order), its accumulator split into four column sub-tiles in registers;
                            per sub-tile: W and state read from their slot (which goes back to the
                            loader at once), the guarded rule, the results through OUT_SLOTS staging
                            slots to memory by TMA stores that nothing waits for until the staging
                            slot comes round again

Measured on the H200 (bench/NOTES.md, "v11", session 10): 1.21-1.28x the Triton kernel's default
tile at K = 256 and 1.05-1.20x at 1024 on the Llama-8B/70B shapes, 0.92-1.03x from 4096 tokens on;
kernels.fused_linear_update routes to it where it is faster (config_for below). Its versions: the
first stored g through shared memory and ran one program an SM (0.67-1.04x); the fourth hands a
state slot back when it is read instead of after the next sub-tile's stores (the loads had never
run ahead with two slots: ncu put it at 50% of DRAM bandwidth).

Each program walks tiles pid, pid + P, ... in the grouped order of the Triton kernel's persistent
mode. Every ring slot has a `ready` barrier (the TMA transaction count) and an `empty` barrier (the
consumer's arrival); slot i of a ring is used for the n-th time with phase n & 1, and a producer
waits for `empty` with the opposite phase, so its first pass does not block.

The bits (why they are the Triton kernel's and the emulator's):
  * mainloop: per element, the chain of k16 wgmma block FMAs over k = 0, 16, ..., in order, from a
    zero accumulator, the same instructions on the same operands as `tl.dot` in the Triton kernel's
    TMA mode (BK = 64 there too); TMA fills rows and columns past the tensors' edges with zeros;
  * epilogue: forge_num.rules.guarded_update around the rule, bound to the op vocabulary below
    (correctly rounded fp32 ops only; launched with enable_fp_fusion=False), element-wise, so the
    sub-tile split and the layouts change no bit;
  * telemetry: Σ g² in fp64 and the non-finite count per tile, in the slot the Triton kernel uses
    (the sum's order differs: it is bounded, not bit-exact, as there: proofs/telemetry.md);
  * bf16-sr: W and state widened from bf16 by a bit shift, rounded back stochastically with the
    random-slice table's bits of the element's Philox4x32-10 words (kernels/random.py's
    philox4x32_10, held against tl.randint4x), counter r rand_stride + c + rand_base: the Triton
    kernel's texts, bound to Gluon.

Scope (fused_linear_update_ws refuses the rest): the fp32 regime (fp32 weight and state) and the
bf16-sr regime (bf16 weight and state, a Philox key), bf16 operands TMA can address (contiguous,
16-byte aligned, M and N multiples of 8), K > 0, no gradient accumulation buffer, no debug store of
the accumulator. The launcher routes fp32-regime updates here (config_for); bf16-sr ones only with
FORGE_NUM_GLUON_BF16_SR=1: measured 1.0-1.85x slower than the Triton bf16-sr tile (session 13; its
epilogue's integer and IEEE work wants more warps an SM than these tiles have).
"""

from __future__ import annotations

import functools
import os
import types

import torch
import triton
import triton.language as tl  # the Philox arguments' annotations (fused_linear_update_ws_kernel says why)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from forge_num.rules import Rule

from . import ieee as _ieee
from . import linear_update as _linear_update
from . import quant8 as _quant8
from . import random as _random
from . import rounding as _rounding
from .ieee import NAMESPACE as IEEE_NAMESPACE
from .launch_cache import CachedLaunch, descriptor_builder

# Gluon's TMA copies under the installed Triton's names: async_load and async_store from Triton 3.8 (3.9 turned
# the older async_copy_global_to_shared and async_copy_shared_to_global into errors), the older names before
# (3.6, the device's and CI's, has only those). The same copies either way.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

# ---------------------------------------------------------------------------------------------
# The op vocabulary of forge_num.rules in Gluon: kernels/ieee.py's functions, their `tl` bound to
# Gluon's language (which has the same fma, div_rn, sqrt_rn, where and abs), so that the one text
# of each op runs in both kernels: + - * round once (add.rn/sub.rn/mul.rn without fp fusion), fma
# where the rule says fma, IEEE div and sqrt.
# ---------------------------------------------------------------------------------------------


def _modules_in_gluon(spec):
    """The jit functions of kernels/ modules as Gluon functions: spec is ((module, names), ...); each
    function is rebuilt in a namespace of its module's own where ``tl`` is Gluon's language and every
    name in spec is its Gluon twin, so that the twins call one another's twins, never a
    Triton-language function, across modules too (linear_update's 8bit epilogue calls quant8's,
    random's and rounding's functions, imported there by name). Returns one module object of twins
    for each module in spec, in order."""
    twins, built = {}, []
    for module, names in spec:
        namespace = {**vars(module), "tl": gl}
        own = {}
        for name in names:
            if name in twins:
                raise ValueError(f"_modules_in_gluon: two functions named {name!r}")
            fn = getattr(module, name).fn
            own[name] = twins[name] = gluon.jit(types.FunctionType(fn.__code__, namespace, fn.__name__,
                                                                   fn.__defaults__, fn.__closure__))
        built.append((module, namespace, own))
    twin_modules = []
    for module, namespace, own in built:
        namespace.update(twins)
        # a module object: Triton's dependency hashing skips modules and hashes the functions read from
        # them (a namespace object would be deep-copied as a global value)
        twin_module = types.ModuleType(f"{__name__}.{module.__name__.rsplit('.', 1)[-1]}_in_gluon")
        for name, fn in own.items():
            setattr(twin_module, name, fn)
        twin_modules.append(twin_module)
    return twin_modules


_IEEE_OPS = {name: op.fn.__name__ for name, op in IEEE_NAMESPACE.items() if name != "tl"}
(_IEEE,) = _modules_in_gluon([(_ieee, _IEEE_OPS.values())])
NAMESPACE = {**{name: getattr(_IEEE, fn_name) for name, fn_name in _IEEE_OPS.items()}, "tl": gl}

# The stochastic regimes' register operations, one text with the Triton kernels': the Philox rounds
# (philox4x32_10 = tl.randint4x's), the random-slice table, the bf16 widening and stochastic rounding
# (the bf16-sr regime), and the 8bit regime's block quantization on blocks along a tile's last axis,
# with the epilogue's loads, stores, counters and telemetry terms (kernels/gluon_q8.py)
_RANDOM, _ROUNDING, _QUANT8, _LINEAR = _modules_in_gluon([
    (_random, ("wide_products_a", "wide_products_b", "products_a", "products_b", "philox4x32_10", "random_slices",
               "q8_slices", "q8_half_slices")),
    (_rounding, ("_is_nan", "bf16_sr_bits", "bf16_to_f32")),
    (_quant8, ("magnitude_key", "block_exponent", "sr_threshold", "sr_code", "quantize_blocks_sr", "code_unit_value",
               "dequantize_blocks")),
    (_linear_update, ("load_f32", "store_f32", "telemetry_terms", "element_counters", "step_scalars")),
])


@functools.lru_cache(maxsize=None)
def guarded_update_gluon(rule: Rule):
    """forge_num.rules.guarded_update around ``rule``, both bound to the Gluon vocabulary."""
    return rule.bind_guarded(NAMESPACE, gluon.jit)


# ---------------------------------------------------------------------------------------------
# Scheduling: the tile a persistent program takes next (the Triton kernel's grouped order)
# ---------------------------------------------------------------------------------------------


@gluon.jit
def tile_coords(tile, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of the tile-th tile in grouped order: GROUP_M consecutive tile rows, column by column."""
    group = tile // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows = gl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % (GROUP_M * tiles_n)) % rows
    pid_n = (tile % (GROUP_M * tiles_n)) // rows
    return pid_m, pid_n


# ---------------------------------------------------------------------------------------------
# The partitions
# ---------------------------------------------------------------------------------------------


@gluon.jit
def operand_loader(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, op_empty, M, N, K, GROUP_M: gl.constexpr):
    """Worker: the K blocks of every tile this program owns, in order, into the operand ring."""
    BK: gl.constexpr = dy_desc.block_type.shape[0]
    BM: gl.constexpr = dy_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    i = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        for k0 in range(0, K, BK):
            s = i % STAGES
            mbarrier.wait(op_empty.index(s), ((i // STAGES) & 1) ^ 1)
            load_operands(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, s, k0, pid_m, pid_n)
            i += 1


@gluon.jit
def load_operands(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, s, k0, pid_m, pid_n):
    """The TMA loads of the K block at k0 of tile (pid_m, pid_n), dY[k0:k0+BK, rows] and X[k0:k0+BK,
    cols], into operand slot s, counted against op_ready[s] (operand_loader's, and gluon_q8's MMA
    warps' where they load their own)."""
    BM: gl.constexpr = dy_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    mbarrier.expect(op_ready.index(s), dy_desc.block_type.nbytes + x_desc.block_type.nbytes)
    tma_load(dy_desc, [k0, pid_m * BM], op_ready.index(s), dy_bufs.index(s))
    tma_load(x_desc, [k0, pid_n * BN], op_ready.index(s), x_bufs.index(s))


@gluon.jit
def state_loader(descs, bufs, bars, M, N, K, GROUP_M: gl.constexpr):
    """Worker: W, S0, S1 of every column sub-tile [BM, SW] of every tile this program owns, in order,
    into the state ring (N_STATE, the number of state tensors, is the number of state descriptors)."""
    dy_desc, x_desc, w_desc, s0_desc, s1_desc = descs
    dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, g_bufs = bufs
    op_ready, op_empty, st_ready, st_empty, g_ready, g_empty = bars
    BM: gl.constexpr = w_desc.block_type.shape[0]
    SW: gl.constexpr = w_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    SPLIT: gl.constexpr = BN // SW
    SLOTS: gl.constexpr = w_bufs.type.shape[0]
    N_STATE: gl.constexpr = (s0_desc is not None) + (s1_desc is not None)
    nbytes: gl.constexpr = w_desc.block_type.nbytes * (1 + N_STATE)
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    j = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        for c in gl.static_range(SPLIT):
            s = j % SLOTS
            mbarrier.wait(st_empty.index(s), ((j // SLOTS) & 1) ^ 1)
            mbarrier.expect(st_ready.index(s), nbytes)
            coord = [pid_m * BM, pid_n * BN + c * SW]
            tma_load(w_desc, coord, st_ready.index(s), w_bufs.index(s))
            if N_STATE >= 1:
                tma_load(s0_desc, coord, st_ready.index(s), s0_bufs.index(s))
            if N_STATE >= 2:
                tma_load(s1_desc, coord, st_ready.index(s), s1_bufs.index(s))
            j += 1


@gluon.jit
def mainloop(dy_bufs, x_bufs, op_ready, op_empty, i, K, mma_layout: gl.constexpr):
    """acc [BM, BN] = Σ_k dY[k, rows]ᵀ X[k, cols] from a zero accumulator, one ring slot per K block, in
    order; i counts the ring's uses. Each block's wgmma is waited for (the next block's left in
    flight) before its slot is handed back to the loader."""
    BM: gl.constexpr = dy_bufs.type.shape[2]
    BK: gl.constexpr = dy_bufs.type.shape[1]
    BN: gl.constexpr = x_bufs.type.shape[2]
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_layout)
    first = i
    for k0 in range(0, K, BK):
        s = i % STAGES
        mbarrier.wait(op_ready.index(s), (i // STAGES) & 1)
        # A = dY blockᵀ [BM, BK]: a transposed view of the [BK, BM] slot, handed to wgmma as MN-major
        a = dy_bufs.index(s).permute((1, 0))
        b = x_bufs.index(s)
        acc = warpgroup_mma(a, b, acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a, b))
        mbarrier.arrive(op_empty.index((i + STAGES - 1) % STAGES), count=1, pred=i > first)
        i += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(op_empty.index((i + STAGES - 1) % STAGES), count=1, pred=i > first)
    return acc, i


@gluon.jit
def column_halves(x):
    """x[:, :W/2], x[:, W/2:] of x [R, W], in registers (reshape to [R, 2, W/2], move the 2 last, split:
    the halves are register subsets of the wgmma layout, so no data moves)."""
    R: gl.constexpr = x.shape[0]
    W: gl.constexpr = x.shape[1]
    return gl.split(gl.permute(gl.reshape(x, (R, 2, W // 2)), (0, 2, 1)))


@gluon.jit
def column_quarters(x):
    """The four column sub-tiles of x [R, W], in order, in registers (column_halves twice)."""
    left, right = column_halves(x)
    g0, g1 = column_halves(left)
    g2, g3 = column_halves(right)
    return g0, g1, g2, g3


@gluon.jit
def column_subtiles(x, SPLIT: gl.constexpr):
    """The SPLIT (4 or 8) column sub-tiles of x [R, W], in order, in registers. (A constexpr `if`
    does not end the function at its `return`: the second case is an `else`.)"""
    if SPLIT == 4:
        return column_quarters(x)
    else:
        gl.static_assert(SPLIT == 8, "the epilogue splits a tile into 4 or 8 column sub-tiles")
        g0, g1, g2, g3 = column_quarters(x)
        g00, g01 = column_halves(g0)
        g10, g11 = column_halves(g1)
        g20, g21 = column_halves(g2)
        g30, g31 = column_halves(g3)
        return g00, g01, g10, g11, g20, g21, g30, g31


@gluon.jit
def update_subtile(g, j, coord, M, N, descs, bufs, bars, h, grad_scale, rand, GUARDED_UPDATE: gl.constexpr,
                   BF16_STORAGE: gl.constexpr):
    """The epilogue on one column sub-tile g [BM, SW] (in the accumulator's registers) whose W and
    state are in state slot j % SLOTS: read into registers and the slot handed back to the state
    loader at once (its next load is then in flight while this sub-tile computes); the guarded rule;
    the results through staging slot j % OUT_SLOTS to memory by TMA, once the stores that last used
    that staging slot have read it. Returns (Σ g² in fp64, number of non-finite g) over the
    sub-tile's elements inside W.

    BF16_STORAGE (the bf16-sr regime): W and state are bf16, widened exactly on reading (a bit
    shift) and rounded stochastically for the store with their slices of the element's Philox
    words, rand = (seed, rand_stride, rand_base): element (r, c) draws counter r rand_stride + c +
    rand_base (emulator.philox.CounterMap), as in the Triton kernel's epilogue."""
    dy_desc, x_desc, w_desc, s0_desc, s1_desc = descs
    dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, g_bufs = bufs
    op_ready, op_empty, st_ready, st_empty, g_ready, g_empty = bars
    SLOTS: gl.constexpr = w_bufs.type.shape[0]
    N_STATE: gl.constexpr = (s0_desc is not None) + (s1_desc is not None)
    OUT_SLOTS: gl.constexpr = out_bufs.type.shape[0] // (1 + N_STATE)
    if BF16_STORAGE:
        rows = coord[0] + gl.arange(0, g.shape[0], layout=gl.SliceLayout(1, g.type.layout))
        cols = coord[1] + gl.arange(0, g.shape[1], layout=gl.SliceLayout(0, g.type.layout))
        # the Philox words first, while the state's TMA load may still be in flight (and before the
        # state's registers are live: the rounds' temporaries and the state together spilled)
        seed, rand_stride, rand_base = rand
        counters = rows[:, None].to(gl.int64) * rand_stride + cols[None, :] + rand_base
        c0, c1, c2, c3 = _RANDOM.philox4x32_10(seed, counters)
    s = j % SLOTS
    mbarrier.wait(st_ready.index(s), (j // SLOTS) & 1)
    p = widen(w_bufs.index(s).load(g.type.layout), BF16_STORAGE)
    s0 = p
    s1 = p
    if N_STATE >= 1:
        s0 = widen(s0_bufs.index(s).load(g.type.layout), BF16_STORAGE)
    if N_STATE >= 2:
        s1 = widen(s1_bufs.index(s).load(g.type.layout), BF16_STORAGE)
    # the shared-memory reads are ordered before the loader's next TMA write into the slot
    fence_async_shared()
    mbarrier.arrive(st_empty.index(s), count=1)
    p, s0, s1, finite = GUARDED_UPDATE(p, g, s0, s1, h, grad_scale)
    if BF16_STORAGE:
        r_p, r_s0, r_s1 = _RANDOM.random_slices(c0, c1)
        p = _ROUNDING.bf16_sr_bits(p, r_p).to(gl.bfloat16, bitcast=True)
        s0 = _ROUNDING.bf16_sr_bits(s0, r_s0).to(gl.bfloat16, bitcast=True)
        s1 = _ROUNDING.bf16_sr_bits(s1, r_s1).to(gl.bfloat16, bitcast=True)
    # staging slot o holds the sub-tile's (1 + N_STATE) results at out_bufs[o * (1 + N_STATE) + t];
    # the stores issued from it OUT_SLOTS sub-tiles ago (1 + N_STATE bulk groups each) must have read it
    o = (j % OUT_SLOTS) * (1 + N_STATE)
    tma.store_wait(pendings=(OUT_SLOTS - 1) * (1 + N_STATE))
    out_bufs.index(o).store(p)
    if N_STATE >= 1:
        out_bufs.index(o + 1).store(s0)
    if N_STATE >= 2:
        out_bufs.index(o + 2).store(s1)
    fence_async_shared()
    # TMA clips the rows and columns past W's edge
    tma_store(w_desc, coord, out_bufs.index(o))
    if N_STATE >= 1:
        tma_store(s0_desc, coord, out_bufs.index(o + 1))
    if N_STATE >= 2:
        tma_store(s1_desc, coord, out_bufs.index(o + 2))
    rows = coord[0] + gl.arange(0, g.shape[0], layout=gl.SliceLayout(1, g.type.layout))
    cols = coord[1] + gl.arange(0, g.shape[1], layout=gl.SliceLayout(0, g.type.layout))
    in_w = (rows[:, None] < M) & (cols[None, :] < N)
    g64 = g.to(gl.float64)
    sq = gl.sum(gl.sum(gl.where(in_w, g64 * g64, 0.0), axis=1), axis=0)
    bad = gl.sum(gl.sum(gl.where(in_w & (finite == 0), 1, 0), axis=1), axis=0)
    return sq, bad


@gluon.jit
def widen(x, BF16_STORAGE: gl.constexpr):
    """fp32 values of a state slot's tile: fp32 as read, or bf16 widened exactly (bit shift)."""
    if BF16_STORAGE:
        return _ROUNDING.bf16_to_f32(x.to(gl.uint16, bitcast=True))
    else:
        return x


@gluon.jit
def update_tile(gs, j, pid_m, pid_n, tiles_n, M, N, descs, bufs, bars, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr,
                GUARDED_UPDATE: gl.constexpr, BF16_STORAGE: gl.constexpr):
    """The epilogue of tile (pid_m, pid_n) on its SPLIT column sub-tiles gs (in order: the state
    loader filled the slots j, j + 1, ... in this order), then its telemetry slot
    pid_m * tiles_n + pid_n (the sub-tiles' partial sums in a balanced tree)."""
    x_desc = descs[1]
    w_desc = descs[2]
    BM: gl.constexpr = w_desc.block_type.shape[0]
    SW: gl.constexpr = w_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    SPLIT: gl.constexpr = BN // SW
    # the partial sums in a balanced tree, sub-tiles in column order
    sq0, bad0 = update_subtile(gs[0], j, [pid_m * BM, pid_n * BN], M, N, descs, bufs, bars, h, grad_scale, rand,
                               GUARDED_UPDATE, BF16_STORAGE)
    sq1, bad1 = update_subtile(gs[1], j + 1, [pid_m * BM, pid_n * BN + SW], M, N, descs, bufs, bars, h,
                               grad_scale, rand, GUARDED_UPDATE, BF16_STORAGE)
    sq2, bad2 = update_subtile(gs[2], j + 2, [pid_m * BM, pid_n * BN + 2 * SW], M, N, descs, bufs, bars, h,
                               grad_scale, rand, GUARDED_UPDATE, BF16_STORAGE)
    sq3, bad3 = update_subtile(gs[3], j + 3, [pid_m * BM, pid_n * BN + 3 * SW], M, N, descs, bufs, bars, h,
                               grad_scale, rand, GUARDED_UPDATE, BF16_STORAGE)
    sq = (sq0 + sq1) + (sq2 + sq3)
    bad = (bad0 + bad1) + (bad2 + bad3)
    if SPLIT == 8:
        sq4, bad4 = update_subtile(gs[4], j + 4, [pid_m * BM, pid_n * BN + 4 * SW], M, N, descs, bufs, bars, h,
                                   grad_scale, rand, GUARDED_UPDATE, BF16_STORAGE)
        sq5, bad5 = update_subtile(gs[5], j + 5, [pid_m * BM, pid_n * BN + 5 * SW], M, N, descs, bufs, bars, h,
                                   grad_scale, rand, GUARDED_UPDATE, BF16_STORAGE)
        sq6, bad6 = update_subtile(gs[6], j + 6, [pid_m * BM, pid_n * BN + 6 * SW], M, N, descs, bufs, bars, h,
                                   grad_scale, rand, GUARDED_UPDATE, BF16_STORAGE)
        sq7, bad7 = update_subtile(gs[7], j + 7, [pid_m * BM, pid_n * BN + 7 * SW], M, N, descs, bufs, bars, h,
                                   grad_scale, rand, GUARDED_UPDATE, BF16_STORAGE)
        sq = sq + ((sq4 + sq5) + (sq6 + sq7))
        bad = bad + ((bad4 + bad5) + (bad6 + bad7))
    slot = pid_m * tiles_n + pid_n
    gl.store(norm_sq_ptr + slot, sq)
    gl.store(nonfinite_ptr + slot, bad)


@gluon.jit
def consumer(descs, bufs, bars, M, N, K, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr,
             GUARDED_UPDATE: gl.constexpr, BF16_STORAGE: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    """Default partition: per tile, the mainloop, then the epilogue on the SPLIT column sub-tiles
    from the state ring, and the tile's telemetry slot (pid_m * tiles_n + pid_n)."""
    dy_desc, x_desc, w_desc, s0_desc, s1_desc = descs
    dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, g_bufs = bufs
    op_ready, op_empty, st_ready, st_empty, g_ready, g_empty = bars
    BM: gl.constexpr = w_desc.block_type.shape[0]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    SPLIT: gl.constexpr = BN // w_desc.block_type.shape[1]
    # the warps stacked on the tile's rows, 16 each (BM = 16 num_warps): each warp group runs the
    # wgmma of its 64 rows; one instruction spans the tile's columns (m64nBNk16)
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BN, 16])
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    i = 0
    j = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        acc, i = mainloop(dy_bufs, x_bufs, op_ready, op_empty, i, K, mma_layout)
        update_tile(column_subtiles(acc, SPLIT), j, pid_m, pid_n, tiles_n, M, N, descs, bufs, bars, h, grad_scale,
                    rand, norm_sq_ptr, nonfinite_ptr, GUARDED_UPDATE, BF16_STORAGE)
        j += SPLIT
    tma.store_wait(pendings=0)


@gluon.jit
def mma_worker(descs, bufs, bars, M, N, K, GROUP_M: gl.constexpr):
    """Worker (one warp group) of the split design: per tile, the mainloop, then the accumulator's
    four column sub-tiles into g buffer t % 2 (double buffered: the next tile's mainloop runs while
    the epilogue warps work on this one), handed over by g_ready and taken back by g_empty."""
    dy_desc, x_desc, w_desc, s0_desc, s1_desc = descs
    dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, g_bufs = bufs
    op_ready, op_empty, st_ready, st_empty, g_ready, g_empty = bars
    BM: gl.constexpr = w_desc.block_type.shape[0]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    i = 0
    t = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        acc, i = mainloop(dy_bufs, x_bufs, op_ready, op_empty, i, K, mma_layout)
        g0, g1, g2, g3 = column_quarters(acc)
        b = t % 2
        mbarrier.wait(g_empty.index(b), ((t // 2) & 1) ^ 1)
        g_bufs.index(4 * b).store(g0)
        g_bufs.index(4 * b + 1).store(g1)
        g_bufs.index(4 * b + 2).store(g2)
        g_bufs.index(4 * b + 3).store(g3)
        mbarrier.arrive(g_ready.index(b), count=1)
        t += 1


@gluon.jit
def epilogue_consumer(descs, bufs, bars, M, N, K, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr,
                      GUARDED_UPDATE: gl.constexpr, BF16_STORAGE: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    """Default partition of the split design (num_warps epilogue warps, no mainloop): per tile, the
    four column sub-tiles of g read from g buffer t % 2, the buffer handed back, then update_tile."""
    dy_desc, x_desc, w_desc, s0_desc, s1_desc = descs
    dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, g_bufs = bufs
    op_ready, op_empty, st_ready, st_empty, g_ready, g_empty = bars
    BM: gl.constexpr = w_desc.block_type.shape[0]
    SW: gl.constexpr = w_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    # each thread 4 consecutive fp32 of a row (16-byte shared-memory reads), warps stacked on rows
    epi: gl.constexpr = gl.BlockedLayout([1, 4], [32 * 4 // SW, SW // 4], [num_warps, 1], [1, 0])
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    j = 0
    t = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        b = t % 2
        mbarrier.wait(g_ready.index(b), (t // 2) & 1)
        gs = (g_bufs.index(4 * b).load(epi), g_bufs.index(4 * b + 1).load(epi), g_bufs.index(4 * b + 2).load(epi),
              g_bufs.index(4 * b + 3).load(epi))
        mbarrier.arrive(g_empty.index(b), count=1)  # g is in registers: the MMA warp group may refill it
        update_tile(gs, j, pid_m, pid_n, tiles_n, M, N, descs, bufs, bars, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr,
                    GUARDED_UPDATE, BF16_STORAGE)
        j += 4
        t += 1
    tma.store_wait(pendings=0)


@gluon.jit
def pingpong_consumer(descs, bufs, bars, M, N, K, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr,
                      GUARDED_UPDATE: gl.constexpr, BF16_STORAGE: gl.constexpr, GROUP_M: gl.constexpr, PARITY: gl.constexpr):
    """One of the ping-pong design's two consumer warp groups (PARITY 0: the default partition, 1: a
    worker): consumer's per-tile work on the tiles of this program whose local index lt (tile =
    pid + lt P) has lt % 2 == PARITY. The loaders fill both rings in tile order, so this group's K
    blocks are the operand ring's uses lt nk ... (nk = cdiv(K, BK)) and its sub-tiles the state
    ring's uses 4 lt ...; one group's mainloop takes the next tile's blocks while the other's update
    streams its state. Its store staging slots (bufs' out_bufs) are its own: a TMA store group is
    waited for by the thread that issued it.

    Turns: the two groups' mainloops take turns, and so do their updates (mma_turn, epi_turn: one
    barrier a group, arrived on by the other group when its own turn ends). A ring wait by phase
    parity, (use // RING) & 1, is only sound while the slot's barrier is at most one phase behind;
    in one consumer's ring that holds because the consumer itself received the slot's previous use,
    but here the previous use of a tile's first slots is the other group's. Without the turns, the
    second group's first waits found the barriers a phase behind, passed at once and read slots not
    yet loaded (session 12, call 1: "unspecified launch failure" at 4096x4096, K = 256, ~16 tiles a
    program; every earlier GPU test gave a program at most one tile). With them, a group's mainloop
    starts after the other's previous one has received all its blocks, and its update after the
    other's previous update: still one group's update beside the other's mainloop.
    proofs/ring_protocol.md proves the waits sound with the turns; tests/test_ring_protocol.py
    models the rings on the CPU: without the turns it finds the early pass from two tiles a
    program, with them none at 1-16."""
    dy_desc, x_desc, w_desc, s0_desc, s1_desc = descs
    dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, g_bufs = bufs
    op_ready, op_empty, st_ready, st_empty, mma_turn, epi_turn = bars
    BM: gl.constexpr = w_desc.block_type.shape[0]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    BK: gl.constexpr = dy_desc.block_type.shape[0]
    SPLIT: gl.constexpr = BN // w_desc.block_type.shape[1]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    nk = gl.cdiv(K, BK)
    lt = PARITY
    t = 0
    for tile in range(gl.program_id(0) + PARITY * gl.num_programs(0), tiles_m * tiles_n, 2 * gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        # this group's t-th turn is the barrier's phase t - 1 + PARITY completing (group 0's first
        # wait, parity 1 on a fresh barrier, passes at once; group 1's waits for group 0's first turn)
        mbarrier.wait(mma_turn.index(PARITY), (t + PARITY + 1) & 1)
        acc, _ = mainloop(dy_bufs, x_bufs, op_ready, op_empty, lt * nk, K, mma_layout)
        mbarrier.arrive(mma_turn.index(1 - PARITY), count=1)
        mbarrier.wait(epi_turn.index(PARITY), (t + PARITY + 1) & 1)
        update_tile(column_subtiles(acc, SPLIT), lt * SPLIT, pid_m, pid_n, tiles_n, M, N, descs, bufs, bars, h, grad_scale, rand,
                    norm_sq_ptr, nonfinite_ptr, GUARDED_UPDATE, BF16_STORAGE)
        mbarrier.arrive(epi_turn.index(1 - PARITY), count=1)
        lt += 2
        t += 1
    tma.store_wait(pendings=0)


# The Philox key and counter map are typed (u64, i64) and not specialized: one compiled kernel per
# configuration whatever a step's key (kernels/linear_update.py, _UNSPECIALIZED), and a launch
# key (kernels/launch_cache.py) that need not name them. The fp32 regime passes zeros.
# Spelled tl.uint64 and tl.int64 (the same dtype objects as gl.uint64, gl.int64): this module's
# annotations are strings (``from __future__ import annotations``) and Triton 3.6's binder reads a
# string annotation as a type only with the "tl." prefix; "gl.uint64" it ignores, and typed these
# three by value (i32, i64 or u64: five specializations), so a cached launch could meet a kernel
# compiled for an i32 counter base with a base past 2^31 (an OverflowError in session 20's call 2).
# tests/test_ptx.py holds the binder to one specialization.
@gluon.jit
def barrier_pairs(n: gl.constexpr):
    """(ready, empty): n mbarriers each, of one arrival, initialized: the barriers of a ring of n slots."""
    ready = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(n):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    return ready, empty


@gluon.jit
def invalidate_barriers(bars):
    """Every mbarrier of the array ``bars`` invalidated (mbarrier.inval), once the partitions have joined and every
    copy counted on one has been waited for. Why: PTX requires an mbarrier object invalidated before its
    shared memory is put to any other use. Inside the kernel: Triton's allocator ends a buffer's life at its
    last use, and without this an array never waited on (the self-loading tiles' operand empty barriers) ended
    at its initialization and its bytes went to later buffers, the staged tiles' first staging slot, a TMA
    destination, among them (session 37: the cause of the 8bit route's and v46's wrong weights); a use at the
    kernel's end keeps every barrier allocated to the end (tests/test_ptx.py checks both). After it: a CTA's
    shared memory is the next CTA's on that SM. Triton's own pipelines invalidate theirs (triton-lang/triton#3858)."""
    n: gl.constexpr = bars.type.shape[0]
    for i in gl.static_range(n):
        mbarrier.invalidate(bars.index(i))


@gluon.jit(do_not_specialize=["seed", "rand_stride", "rand_base"])
def fused_linear_update_ws_kernel(dy_desc, x_desc, w_desc, s0_desc, s1_desc, norm_sq_ptr, nonfinite_ptr,
                                  M, N, K, h, grad_scale, seed: tl.uint64, rand_stride: tl.int64, rand_base: tl.int64,
                                  step_slot, GUARDED_UPDATE: gl.constexpr, BF16_STORAGE: gl.constexpr, STAGES: gl.constexpr, SLOTS: gl.constexpr,
                                  OUT_SLOTS: gl.constexpr, GROUP_M: gl.constexpr, SPLIT_MMA: gl.constexpr,
                                  PINGPONG: gl.constexpr, PINGPONG_REGS: gl.constexpr, num_warps: gl.constexpr):
    """The shared rings and their barriers, then the three partitions (module docstring).
    dy_desc [K, M] block [BK, BM], x_desc [K, N] block [BK, BN], w/s0/s1_desc [M, N] block
    [BM, BN/SPLIT] (SPLIT column sub-tiles, 4 or 8), fp32 or (BF16_STORAGE) bf16 (s0/s1 None for a rule with fewer states); seed,
    rand_stride, rand_base: the bf16-sr regime's Philox key and counter map (update_subtile); step_slot
    None, or where h, grad_scale and seed are read when the kernel runs (linear_update.step_scalars)."""
    h, grad_scale, seed = _LINEAR.step_scalars(step_slot, h, grad_scale, seed)
    rand = (seed, rand_stride, rand_base)
    dy_bufs = gl.allocate_shared_memory(dy_desc.dtype, [STAGES] + dy_desc.block_type.shape, dy_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [SLOTS] + w_desc.block_type.shape, w_desc.layout)
    s0_bufs = w_bufs
    s1_bufs = w_bufs
    if s0_desc is not None:
        s0_bufs = gl.allocate_shared_memory(w_desc.dtype, [SLOTS] + w_desc.block_type.shape, w_desc.layout)
    if s1_desc is not None:
        s1_bufs = gl.allocate_shared_memory(w_desc.dtype, [SLOTS] + w_desc.block_type.shape, w_desc.layout)
    N_STATE: gl.constexpr = (s0_desc is not None) + (s1_desc is not None)
    out_bufs = gl.allocate_shared_memory(w_desc.dtype, [OUT_SLOTS * (1 + N_STATE)] + w_desc.block_type.shape,
                                         w_desc.layout)
    op_ready, op_empty = barrier_pairs(STAGES)
    st_ready, st_empty = barrier_pairs(SLOTS)
    descs = (dy_desc, x_desc, w_desc, s0_desc, s1_desc)
    if SPLIT_MMA:
        # g between the MMA warp group and the epilogue warps: two tiles' four column sub-tiles
        g_bufs = gl.allocate_shared_memory(gl.float32, [8] + w_desc.block_type.shape, w_desc.layout)
        g_ready, g_empty = barrier_pairs(2)
        bufs = (dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, g_bufs)
        bars = (op_ready, op_empty, st_ready, st_empty, g_ready, g_empty)
        gl.warp_specialize([
            (epilogue_consumer, (descs, bufs, bars, M, N, K, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr,
                                 GUARDED_UPDATE, BF16_STORAGE, GROUP_M, num_warps)),
            (operand_loader, (dy_desc, x_desc, dy_bufs, x_bufs, op_ready, op_empty, M, N, K, GROUP_M)),
            (state_loader, (descs, bufs, bars, M, N, K, GROUP_M)),
            (mma_worker, (descs, bufs, bars, M, N, K, GROUP_M)),
        ], [1, 1, 4], [24, 24, 152])
        invalidate_barriers(g_ready)
        invalidate_barriers(g_empty)
    elif PINGPONG:
        # the second consumer's own store staging slots (the g slots of the split design: placeholders)
        out_b = gl.allocate_shared_memory(w_desc.dtype, [OUT_SLOTS * (1 + N_STATE)] + w_desc.block_type.shape,
                                          w_desc.layout)
        bufs = (dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, out_bufs)
        bufs_b = (dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_b, out_b)
        # the consumers' turn barriers (pingpong_consumer), where the split design's g barriers sit
        mma_turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        epi_turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(2):
            mbarrier.init(mma_turn.index(b), count=1)
            mbarrier.init(epi_turn.index(b), count=1)
        bars = (op_ready, op_empty, st_ready, st_empty, mma_turn, epi_turn)
        gl.warp_specialize([
            (pingpong_consumer, (descs, bufs, bars, M, N, K, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr,
                                 GUARDED_UPDATE, BF16_STORAGE, GROUP_M, 0)),
            (operand_loader, (dy_desc, x_desc, dy_bufs, x_bufs, op_ready, op_empty, M, N, K, GROUP_M)),
            (state_loader, (descs, bufs, bars, M, N, K, GROUP_M)),
            (pingpong_consumer, (descs, bufs_b, bars, M, N, K, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr,
                                 GUARDED_UPDATE, BF16_STORAGE, GROUP_M, 1)),
        ], [1, 1, 4], [24, 24, PINGPONG_REGS])
        invalidate_barriers(mma_turn)
        invalidate_barriers(epi_turn)
    else:
        # (the g slots and barriers of the split design are not used: placeholders keep one tuple shape)
        bufs = (dy_bufs, x_bufs, w_bufs, s0_bufs, s1_bufs, out_bufs, out_bufs)
        bars = (op_ready, op_empty, st_ready, st_empty, op_ready, op_empty)
        gl.warp_specialize([
            (consumer, (descs, bufs, bars, M, N, K, h, grad_scale, rand, norm_sq_ptr, nonfinite_ptr, GUARDED_UPDATE, BF16_STORAGE, GROUP_M,
                        num_warps)),
            (operand_loader, (dy_desc, x_desc, dy_bufs, x_bufs, op_ready, op_empty, M, N, K, GROUP_M)),
            (state_loader, (descs, bufs, bars, M, N, K, GROUP_M)),
        ], [1, 1], [24, 24])
    # (the barriers of every design; the split and pingpong designs' own invalidated in their branches)
    invalidate_barriers(op_ready)
    invalidate_barriers(op_empty)
    invalidate_barriers(st_ready)
    invalidate_barriers(st_empty)


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


class ValueConfig:
    """A tile configuration as a value: equal (and hashed alike) when every field in ``__slots__`` is,
    shown by its ``label`` (WSConfig here, gluon_q8.Q8WSConfig)."""

    __slots__ = ()

    def _key(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __eq__(self, other):
        return type(other) is type(self) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"{type(self).__name__}({self.label})"

    def replace(self, **changes):
        """This configuration with ``changes`` (constructor arguments, as named in ``__slots__``), checked as
        a new one is: a variant that says what it changes."""
        return type(self)(**{**{k: getattr(self, k) for k in self.__slots__}, **changes})

    def check_shared_memory(self):
        """Raise unless one program's shared_bytes() and its barriers (1 KB) fit the 227 KB of a block on sm_90."""
        if self.shared_bytes() + 1024 > 227 * 1024:
            raise ValueError(f"{type(self).__name__}: {self.shared_bytes()} B of shared memory a program exceed the "
                             "227 KB of a block on sm_90")


def switched_tile(variable: str, routed: bool, tiles):
    """What the A/B switch ``variable`` in the environment (read at each call) asks of a Gluon kernel's route:
    False (0, or unset where the kernel is not routed: no route), None (1, or unset where it is: its measured
    ranges), or the tile of ``tiles`` whose label it names ('_' for ' ': that tile wherever the kernel applies).
    A label no tile has is an error naming the known ones, wherever the update runs."""
    switch = os.environ.get(variable, "1" if routed else "0")
    if switch == "0":
        return False
    if switch == "1":
        return None
    by_label = {c.label: c for c in tiles}
    tile = by_label.get(switch.replace("_", " "))
    if tile is None:
        raise ValueError(f"{variable}={switch!r} is neither 0, 1 nor a tile's label; known: "
                         + ", ".join(sorted(k.replace(" ", "_") for k in by_label)))
    return tile


class WSConfig(ValueConfig):
    """The warp-specialized kernel's tile: BM x BN output tiles (BM = 64 or 128: one or two consumer
    warp groups, 16 rows a warp), K blocks of BK, the epilogue on four column sub-tiles of SW = BN / 4;
    STAGES operand slots, SLOTS state slots (4: a whole tile's state in flight), `programs`
    persistent programs per SM (2 with a register cap of `max_registers` a thread so that two fit),
    GROUP_M tile rows per group."""

    __slots__ = ("BM", "BN", "BK", "STAGES", "SLOTS", "OUT_SLOTS", "GROUP_M", "programs", "max_registers",
                 "split_mma", "pingpong", "split")

    def __init__(self, BM=64, BN=128, BK=64, STAGES=3, SLOTS=4, OUT_SLOTS=2, GROUP_M=8, programs=1,
                 max_registers=None, split_mma=False, pingpong=None, split=4):
        if BM not in (64, 128) or BN % 32:
            raise ValueError(f"WSConfig: BM must be 64 or 128 and BN a multiple of 32, got {BM}x{BN}")
        if split not in (4, 8) or (split_mma and split != 4):
            raise ValueError(f"WSConfig: the epilogue takes 4 or 8 column sub-tiles (the split design 4), got {split}")
        # split: the column sub-tiles of the epilogue (8: half the elements a thread at a time, for the
        # bf16-sr regime's Philox rounds, whose temporaries spilled with 4)
        self.split = split
        if split_mma and (BM != 64 or programs != 1 or max_registers != 128):
            raise ValueError("WSConfig: the split design runs one 64-row program an SM, its 16 warps capped at "
                             f"128 registers at launch, got {BM=}, {programs=}, {max_registers=}")
        if pingpong is not None and (BM != 64 or programs != 1 or split_mma or max_registers is None):
            raise ValueError("WSConfig: the ping-pong design runs one 64-row program an SM with a register cap at "
                             f"launch, not the split design, got {BM=}, {programs=}, {split_mma=}, {max_registers=}")
        # split_mma: one warp group runs the mainloop (a worker) and eight epilogue warps (the default
        # partition) the update, through a double-buffered g in shared memory
        self.split_mma = split_mma
        # pingpong (the second consumer warp group's registers, or None): two consumer warp groups,
        # each a 64-row tile's mainloop and update, on alternate tiles
        self.pingpong = pingpong
        self.BM, self.BN, self.BK = BM, BN, BK
        self.STAGES, self.SLOTS, self.GROUP_M, self.programs = STAGES, SLOTS, GROUP_M, programs
        self.OUT_SLOTS = OUT_SLOTS
        self.max_registers = max_registers

    @property
    def SW(self) -> int:
        return self.BN // self.split

    @property
    def num_warps(self) -> int:
        """Warps of the default partition: the consumer's (16 a row block), or the split design's
        eight epilogue warps."""
        return 8 if self.split_mma else self.BM // 16

    @property
    def label(self) -> str:
        return (f"ws {self.BM}x{self.BN}x{self.BK} st{self.STAGES} sl{self.SLOTS} o{self.OUT_SLOTS}"
                + (f" p{self.programs}" if self.programs != 1 else "")
                + (f" g{self.GROUP_M}" if self.GROUP_M != 8 else "")
                + (f" r{self.max_registers}" if self.max_registers else "") + (" split" if self.split_mma else "")
                + (f" pp{self.pingpong}" if self.pingpong else "") + (f" e{self.split}" if self.split != 4 else ""))

    def shared_bytes(self, n_state: int, state_bytes: int = 4) -> int:
        """Shared memory of one program: operand ring, state ring, store staging (barriers aside);
        state_bytes: 4 in the fp32 regime, 2 in the bf16-sr regime."""
        out_slots = self.OUT_SLOTS * (2 if self.pingpong else 1)  # each ping-pong consumer its own
        return (self.STAGES * self.BK * (self.BM + self.BN) * 2
                + (self.SLOTS + out_slots) * (1 + n_state) * self.BM * self.SW * state_bytes
                + (8 * self.BM * self.SW * 4 if self.split_mma else 0))


DEFAULT_WS_CONFIG = WSConfig()


@functools.lru_cache(maxsize=None)
def _nvmma_layout(block: tuple, dtype):
    """The shared-memory layout (swizzle) of a TMA block: a function of its shape and dtype only, so
    computed once (6 of the 9 us a descriptor took on the host, five descriptors a launch)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


# TensorDescriptor's leading fields (a dataclass, Triton 3.6 to 3.9), set by _nvmma_desc; the later ones at
# their defaults (launch_cache.descriptor_builder), or None: a Triton whose descriptor it does not know
_DESC_FIELDS = ("base", "shape", "strides", "block_shape", "layout")
_build_desc = descriptor_builder(TensorDescriptor, _DESC_FIELDS)


def _nvmma_desc(t: torch.Tensor, block, dtype, layout=None):
    """Triton's host-side TMA descriptor of t in blocks of ``block`` (the NVMMA shared layout: the widest
    swizzle the block allows, or ``layout``).

    Its fields are set directly, without the constructor's __post_init__: that re-checks in Python
    what every caller here has checked already (route_config, _check_ws_operands: contiguous,
    16-byte aligned base and row pitch, a known dtype, every dimension > 0; the blocks are the
    configs' powers of two), at about 4 of the 5 us a descriptor took on this machine's CPU, five
    descriptors a launch. tests/test_gluon_route.py checks the result equals the constructor's."""
    layout = _nvmma_layout(tuple(block), dtype) if layout is None else layout
    make = TensorDescriptor if _build_desc is None else _build_desc
    return make(t, list(t.shape), list(t.stride()), list(block), layout)


def check_operands(fn: str, weight, x, dy, tensors, n_given: int, n_state: int):
    """What both Gluon kernels need of a launch, each violation named with ``fn``: bf16 operands x
    [K, N] and dy [K, M] making dW of weight's [M, N] shape, at most ``n_state`` states given, K > 0,
    M and N multiples of 8 (TMA's 16-byte rows), and each (name, tensor, shape or None) of ``tensors``
    of that shape, contiguous, 16-byte aligned (TMA; the launch keys' alignment) and on weight's device."""
    if x.dtype != torch.bfloat16 or dy.dtype != torch.bfloat16:
        raise TypeError(f"{fn}: bf16 operands only, got x {x.dtype}, dy {dy.dtype}")
    if n_given > n_state:
        raise ValueError(f"{fn}: the rule keeps at most {n_state} states, got {n_given}")
    if x.dim() != 2 or dy.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"{fn}: x [K, N], dy [K, M] and weight [M, N] must be 2-D")
    M, N = weight.shape
    if x.shape[1] != N or dy.shape[1] != M or x.shape[0] != dy.shape[0]:
        raise ValueError(f"{fn}: shapes weight {tuple(weight.shape)}, x {tuple(x.shape)}, dy {tuple(dy.shape)} "
                         "do not make dW = dyᵀ x of weight's shape")
    for name, t, shape in tensors:
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"{fn}: {name} of shape {tuple(t.shape)} beside weight {(M, N)}, expected {shape}")
        if not t.is_contiguous():
            raise ValueError(f"{fn}: {name} must be contiguous (TMA), got strides {t.stride()}")
        if t.data_ptr() % 16:
            raise ValueError(f"{fn}: {name} must start 16-byte aligned (TMA)")
        if t.device != weight.device:
            raise ValueError(f"{fn}: {name} on {t.device}, weight on {weight.device}")
    if x.shape[0] == 0:
        raise ValueError(f"{fn}: K = 0 tokens (an empty operand) is not covered; kernels.fused_linear_update "
                         "handles it")
    if M % 8 or N % 8:
        raise ValueError(f"{fn}: M and N must be multiples of 8 (16-byte TMA rows), got {M}x{N}")


def _check_ws_operands(weight, x, dy, states, n_state, seed):
    """The scope of this kernel (module docstring), each violation named; True for the bf16-sr regime."""
    from forge_num import kernels

    if any(s.dtype != weight.dtype for s in states):
        raise TypeError("fused_linear_update_ws: the fp32 regime (fp32 weight and state) or the bf16-sr regime "
                        f"(bf16 weight and state), got weight {weight.dtype}, states {[s.dtype for s in states]}")
    bf16 = kernels._check_regime("fused_linear_update_ws: weight", weight, seed)  # the dtype, and bf16-sr's key
    shape = tuple(weight.shape) if weight.dim() == 2 else None
    check_operands("fused_linear_update_ws", weight, x, dy,
                   [("weight", weight, None), ("x", x, None), ("dy", dy, None),
                    *((f"state {i}", s, shape) for i, s in enumerate(states))], len(states), n_state)
    return bf16


def fused_linear_update_ws(weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, states, rule: Rule, h,
                           grad_scale: float = 1.0, config: WSConfig = DEFAULT_WS_CONFIG, seed: int | None = None,
                           counter: tuple | None = None):
    """weight, states <- the guarded rule applied with g = dyᵀ x, in place, in the fp32 regime (fp32
    weight and state) or the bf16-sr regime (bf16 weight and state, ``seed`` and ``counter`` as
    kernels.fused_linear_update takes them); returns kernels.UpdateStats, like
    kernels.fused_linear_update, whose bits it must give."""
    from forge_num import kernels

    states = list(states)
    bf16 = _check_ws_operands(weight, x, dy, states, len(rule.state), seed)
    if bf16 and config.split_mma:
        raise ValueError(f"fused_linear_update_ws: the split design ({config.label}) hands g over in an fp32 "
                         "layout of the state's tiles: the fp32 regime only")
    h, grad_scale = kernels._check_scalars(rule, h, grad_scale)
    rand = None
    if bf16:
        _, rand_stride, rand_base, rows = kernels._kernel_counter(counter, weight.numel(), weight.device,
                                                                  cols=weight.shape[1])
        if rows is not None:
            raise ValueError("fused_linear_update_ws: a counter map of gathered rows is the Triton kernel's only")
        rand = (int(seed), rand_stride, rand_base)
    return launch(weight, x, dy, states, rule, h, grad_scale, config, rand)


def launch(weight, x, dy, states, rule: Rule, h: tuple, grad_scale: float, config: WSConfig, rand=None,
           step_slot=None):
    """The launch itself, for operands already checked (fused_linear_update_ws, or the Triton
    launcher's checks and route_config); rand = (seed, rand_stride, rand_base) in the bf16-sr
    regime, None in the fp32 regime; step_slot None or a checked slot (kernels.fused_linear_update)."""
    from forge_num import kernels

    M, N = weight.shape
    tiles = triton.cdiv(M, config.BM) * triton.cdiv(N, config.BN)
    norm_sq, nonfinite = kernels._telemetry_buffers(max(tiles, 1), weight.device, launched=bool(M and N))
    if M and N:
        _LAUNCH.launch(*_launch_arguments(weight, x, dy, states, rule, h, grad_scale, config, norm_sq, nonfinite,
                                          rand, step_slot))
    return kernels.UpdateStats(norm_sq, nonfinite)


_STORAGE = {torch.float32: gl.float32, torch.bfloat16: gl.bfloat16}


def _launch_arguments(weight, x, dy, states, rule, h, grad_scale, c: WSConfig, norm_sq, nonfinite, rand=None,
                      step_slot=None):
    """(key, pins, grid, runtime arguments, constants) of a launch through _LAUNCH (CachedLaunch)."""
    from forge_num import kernels

    M, N = weight.shape
    K = x.shape[0]
    bf16 = rand is not None
    storage = _STORAGE[weight.dtype]
    state_descs = [_nvmma_desc(s, (c.BM, c.SW), storage) for s in states] + [None, None]
    programs = min(triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN), c.programs * kernels._sm_count(weight.device))
    # What Triton specializes this launch on, as a key of its own (kernels/launch_cache.py): the
    # constexprs and options (a function of the rule, the config and the regime, pinned), which state
    # descriptors are None, the storage dtype (the descriptors' types) and the integers M, N, K (each:
    # 1 or not, a multiple of 16 or not; all below 2^31, so i32); seed, rand_stride and rand_base are
    # typed and not specialized. The descriptors' blocks and layouts follow from the config and the
    # dtype; every tensor is 16-byte aligned (checked by the callers, route_config and
    # _check_ws_operands; the telemetry buffers by construction), and the descriptors' shapes and
    # strides are M, N, K's (contiguous operands). The step slot: None or an int32 tensor (and its alignment).
    key = (id(rule), id(c), len(states), bf16, weight.device.index, M == 1, N == 1, K == 1,
           M % 16 == 0, N % 16 == 0, K % 16 == 0, None if step_slot is None else step_slot.data_ptr() % 16 == 0)
    seed, rand_stride, rand_base = rand if bf16 else (0, 0, 0)
    args = (_nvmma_desc(dy, (c.BK, c.BM), gl.bfloat16), _nvmma_desc(x, (c.BK, c.BN), gl.bfloat16),
            _nvmma_desc(weight, (c.BM, c.SW), storage), state_descs[0], state_descs[1],
            norm_sq, nonfinite, M, N, K, h, grad_scale, seed, rand_stride, rand_base, step_slot)
    return key, (rule, c, bf16), (programs,), args, lambda: _launch_constants(rule, c, bf16)


def _launch_constants(rule: Rule, c: WSConfig, bf16: bool = False) -> tuple[dict, dict]:
    """(constexprs in the kernel's parameter order, compile options) of a rule, a config and a
    regime (bf16: the bf16-sr regime)."""
    constexprs = dict(GUARDED_UPDATE=guarded_update_gluon(rule), BF16_STORAGE=bf16, STAGES=c.STAGES, SLOTS=c.SLOTS,
                      OUT_SLOTS=c.OUT_SLOTS, GROUP_M=c.GROUP_M, SPLIT_MMA=c.split_mma, PINGPONG=bool(c.pingpong),
                      PINGPONG_REGS=c.pingpong or 0, num_warps=c.num_warps)
    return constexprs, dict(maxnreg=c.max_registers, enable_fp_fusion=False)


_LAUNCH = CachedLaunch(fused_linear_update_ws_kernel)


# ---------------------------------------------------------------------------------------------
# Where the launcher uses this kernel (kernels.fused_linear_update with no tile given)
# ---------------------------------------------------------------------------------------------
# Measured on the H200 (bench/results/2026-12-03-h200-s10/callG/ws_kernel.json, session 11's
# call2/ and call4/ws_kernel.json; CUDA-graph times, the five Llama shapes of issue 5, against the
# Triton kernel's default tile in the same run):
#   K <= ROUTE_SMALL_K: two 64x128 programs an SM (96 KB of rings each, 128 registers): 1.21-1.28x
#     the Triton default at K = 256 on four shapes (1.40-1.48x the unfused step); on 28672x8192 the
#     128-row tile was 2% faster;
#   ROUTE_SMALL_K < K < ROUTE_MAX_K: one 128x128 program an SM (two consumer warp groups): 1.05-1.20x
#     at K = 1024, equal at 2048 (1.03-1.11x unfused there); at K = 4096 0.96-1.03x, so from ROUTE_MAX_K
#     on the Triton persistent 128x128 stays (0.92-0.99x of it at 16384).
# Since session 35 the fp32 split kernel (kernels/gluon_f32.py) goes first where it applies (256-16384 tokens since
# session 36, at least 132 of its tiles); these ranges take the fp32 updates it leaves (fewer tiles, K below 256).
# Below ROUTE_MIN_WORK = M N K the step is host-bound (the Triton launcher's SMALL_WORK, session 7),
# and this launch costs the host more (five TMA descriptors built per call: 1.46x the Triton
# launch's host time in session 11's call 1, 1.17x with the layouts computed once, call 4).
ROUTE_SMALL_K_CONFIG = WSConfig(STAGES=2, SLOTS=1, OUT_SLOTS=1, programs=2, max_registers=128)
ROUTE_MID_K_CONFIG = WSConfig(BM=128, STAGES=3, SLOTS=1, OUT_SLOTS=1)
ROUTE_CONFIGS = (ROUTE_SMALL_K_CONFIG, ROUTE_MID_K_CONFIG)
# Not routed: measured beside the routed tiles (bench/ws_kernel.py) and checked bit for bit on the
# GPU (tests/test_gpu_gluon.py), each exact on the H200 (session 11, calls 1-4):
#   the split design (one MMA warp group handing g through shared memory to eight epilogue warps):
#     at K = 1024 1.03-1.08x the 128x128 on four shapes in call 2 but 0.94-1.05x in call 4 (slower
#     on three), 0.90-0.96x the two-program tile at K = 256, 0.88-0.93x the 128x128 at 2048: not
#     reproducibly faster anywhere;
#   the two-program tile on K blocks of 32 with a second state slot: 1.00-1.05x the routed one at
#     K = 256 in its one run (call 4), slower from 512 on.
# (Refuted in call 4 and dropped, K blocks of 32: with two operand stages on the two-program tile,
# 6-11% slower at K = 256; with three state slots on the split design, 1-11% slower at K = 1024 on
# four shapes and 2% faster on 28672x8192; with two on the 128x128, 2-10% slower at K = 512-2048.)
# (Refuted in session 13, call 1, and dropped: the two-program tile with eight column sub-tiles and
# a second state slot, spill-free at 128 registers where the routed one spilled 32 B (none as the launch
# specializes it, session 39), 5-7% slower at
# K = 256 and 29% at 1024 on 4096x8192 and 14336x4096.)
# The ping-pong design (bench/NOTES.md "v15"), two consumer warp groups on alternate tiles of one
# program (12 warps with the loaders' padded group: 168 registers a thread at launch, 240 for each
# consumer by setmaxnreg, 24 for the loaders), one shared 4-stage operand ring and 2-slot state
# ring, a staging slot each: exact once its consumers took turns (session 12, call 2), but 2.4-4.5x
# the routed tile's time at every measured shape and K (about 40 us a tile a program whatever K: a
# latency chain, not yet analyzed), so kept only as a candidate the GPU tests check; its twin with
# a third state slot, as slow, was dropped.
SPLIT_CONFIG = WSConfig(STAGES=3, SLOTS=2, OUT_SLOTS=1, max_registers=128, split_mma=True)
PINGPONG_CONFIG = WSConfig(STAGES=4, SLOTS=2, OUT_SLOTS=1, max_registers=168, pingpong=240)
CANDIDATE_CONFIGS = (
    SPLIT_CONFIG,
    WSConfig(BK=32, STAGES=3, SLOTS=2, OUT_SLOTS=1, programs=2, max_registers=128),
    PINGPONG_CONFIG,
)
ROUTE_SMALL_K = 256
ROUTE_MAX_K = 4096
ROUTE_MIN_WORK = 2**33

# The bf16-sr regime (bf16 weight and state, the Philox rounds in the epilogue): eight column
# sub-tiles, since with four the rounds' temporaries spilled 250-520 B a thread in every tile
# (ptxas, sm_90) and with eight none spills, at 128 registers too. Measured on the H200 (session 13,
# bench/results/2026-12-04-h200-s13/, `bench/ws_kernel.py --precision bf16-sr`) against the Triton
# kernel's bf16-sr default: the best of these tiles took 1.00x its time at 4096x4096, K = 256, and
# 1.17-1.85x elsewhere (K = 256-8192, 4096x4096 and 14336x4096); an 8B step with bf16-sr routed
# here ran 3692 tok/s against 5172. So BF16_SR_ROUTED is False: the launcher routes bf16-sr
# updates here only with FORGE_NUM_GLUON_BF16_SR=1 in the environment (an A/B switch; =0 never).
BF16_SR_SMALL_K_CONFIG = WSConfig(STAGES=2, SLOTS=2, OUT_SLOTS=1, programs=2, max_registers=128, split=8)
BF16_SR_LARGE_K_CONFIG = WSConfig(BM=128, STAGES=3, SLOTS=2, OUT_SLOTS=1, split=8)
BF16_SR_ROUTE_CONFIGS = (BF16_SR_SMALL_K_CONFIG, BF16_SR_LARGE_K_CONFIG)
BF16_SR_CANDIDATE_CONFIGS = (
    WSConfig(STAGES=3, SLOTS=4, OUT_SLOTS=2, split=8),
    WSConfig(STAGES=2, SLOTS=2, OUT_SLOTS=1, programs=2, max_registers=168, split=8),
    WSConfig(BM=128, STAGES=4, SLOTS=4, OUT_SLOTS=2, split=8),
    # more consumer warps an SM for the Philox rounds' dependent integer chains (session 13, call 1:
    # the tiles above, 4-8 consumer warps an SM, were 0.46-0.68x the Triton bf16-sr tile, which runs
    # 16): 64x64 tiles, four programs at 80 registers or three at 104, no spill in ptxas
    WSConfig(BN=64, STAGES=2, SLOTS=2, OUT_SLOTS=1, programs=4, max_registers=80, split=8),
    WSConfig(BN=64, STAGES=3, SLOTS=2, OUT_SLOTS=1, programs=3, max_registers=104, split=8),
)
BF16_SR_ROUTED = False
BF16_SR_SMALL_K = 1024
BF16_SR_MAX_K = 16384


def bf16_sr_config_for(M: int, N: int, K: int) -> WSConfig | None:
    """The tile the launcher would route a (M, N, K) bf16-sr update to, or None (the Triton kernel)."""
    if K == 0 or K > BF16_SR_MAX_K or M * N * K < ROUTE_MIN_WORK or M % 8 or N % 8:
        return None
    return BF16_SR_SMALL_K_CONFIG if K <= BF16_SR_SMALL_K else BF16_SR_LARGE_K_CONFIG


def config_for(M: int, N: int, K: int) -> WSConfig | None:
    """The tile the launcher routes a (M, N, K) fp32-regime update to, or None (the Triton kernel):
    the measured ranges above; M and N multiples of 8 (TMA's 16-byte rows of bf16 operands)."""
    if K == 0 or K >= ROUTE_MAX_K or M * N * K < ROUTE_MIN_WORK or M % 8 or N % 8:
        return None
    return ROUTE_SMALL_K_CONFIG if K <= ROUTE_SMALL_K else ROUTE_MID_K_CONFIG


@functools.lru_cache(maxsize=None)
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def route_config(weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, states) -> WSConfig | None:
    """config_for (or, for a bf16 weight, bf16_sr_config_for where bf16-sr is routed), for operands
    that passed the Triton launcher's checks in the fp32 or bf16-sr regime (plain states, no
    accumulation buffer): None unless on an sm_90 GPU, with bf16 operands, every tensor contiguous
    and 16-byte aligned (what the TMA descriptors need)."""
    if weight.device.type != "cuda" or x.dtype != torch.bfloat16:
        return None
    if weight.dtype == torch.bfloat16:
        if os.environ.get("FORGE_NUM_GLUON_BF16_SR", "1" if BF16_SR_ROUTED else "0") != "1":
            return None
        select = bf16_sr_config_for
    elif weight.dtype == torch.float32:
        select = config_for
    else:
        return None
    config = select(weight.shape[0], weight.shape[1], x.shape[0])  # first: most launches leave here
    if config is None:
        return None
    if not _is_sm90(weight.device.index if weight.device.index is not None else torch.cuda.current_device()):
        return None
    for t in (weight, x, dy, *states):  # dtypes: the launcher's checks (states as weight, dy as x)
        if not t.is_contiguous() or t.data_ptr() % 16:
            return None
    return config


def compile_for_sm90(rule: Rule, config: WSConfig = DEFAULT_WS_CONFIG, M: int = 256, N: int = 256, K: int = 128,
                     bf16: bool = False, slot: bool = False):
    """The kernel compiled for sm_90 without a GPU (descriptors built on CPU tensors, for their types
    only): the CompiledKernel, whose .asm holds "ttgir", "ptx" and (with ptxas) "cubin". bf16: the
    bf16-sr regime's kernel; slot: the launch that reads its scalars from a step slot."""
    c = config
    n_state = len(rule.state)
    constexprs, launch_options = _launch_constants(rule, c, bf16)
    dtype, storage = (torch.bfloat16, gl.bfloat16) if bf16 else (torch.float32, gl.float32)
    dy = torch.empty(K, M, dtype=torch.bfloat16)
    x = torch.empty(K, N, dtype=torch.bfloat16)
    w = torch.empty(M, N, dtype=dtype)
    states = [_nvmma_desc(torch.empty(M, N, dtype=dtype), (c.BM, c.SW), storage) for _ in range(n_state)] + [None, None]
    args = dict(dy_desc=_nvmma_desc(dy, (c.BK, c.BM), gl.bfloat16), x_desc=_nvmma_desc(x, (c.BK, c.BN), gl.bfloat16),
                w_desc=_nvmma_desc(w, (c.BM, c.SW), storage), s0_desc=states[0], s1_desc=states[1],
                norm_sq_ptr=torch.empty(4, dtype=torch.float64), nonfinite_ptr=torch.empty(4, dtype=torch.int32),
                M=M, N=N, K=K, h=tuple(1.0 for _ in rule.scalar_names), grad_scale=1.0, seed=2**63 + 1,
                rand_stride=N, rand_base=0, step_slot=_cpu_slot(rule) if slot else None, **constexprs)
    return compile_gluon_for_sm90(fused_linear_update_ws_kernel, args, c.num_warps, launch_options)


def _cpu_slot(rule: Rule) -> torch.Tensor:
    """A step slot on the CPU, for its type only (compile_for_sm90)."""
    from forge_num import kernels

    return torch.zeros(kernels.step_slot_size(rule), dtype=torch.int32)


def compile_gluon_for_sm90(kernel, args: dict, num_warps: int, launch_options: dict):
    """A Gluon kernel compiled for sm_90 without a GPU from its arguments by name (constexprs among
    them; tensors and descriptors on the CPU, for their types only; an argument None is a constexpr),
    as Triton's binder would specialize a launch with them: the CompiledKernel. The specialization's
    attributes too (JITFunction._pack_args: tt.divisibility 16 for a pointer 16-byte aligned and an
    integer a multiple of 16), without which the epilogue's loads and stores by pointer compile to one
    4-byte access an element where a launch on the GPU makes 16-byte ones (until session 39 the PTX
    checks read such kernels: more registers and spills than the GPU's)."""
    from triton._utils import find_paths_if, get_iterable_path
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    _, spec, _ = binder(**args)
    signature = {p.name: s[0] for p, s in zip(kernel.params, spec)}
    constexprs = {p.name: args[p.name] for p in kernel.params if p.is_constexpr}
    for p in kernel.params:
        if args[p.name] is None:
            constexprs[p.name] = None
            signature[p.name] = "constexpr"
    keys = [s[1] for s in spec]
    attrs = {path: CUDABackend.parse_attr(get_iterable_path(keys, path))
             for path in find_paths_if(keys, lambda _, key: isinstance(key, str))}
    src = GluonASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, **{k: v for k, v in launch_options.items() if v is not None}}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
