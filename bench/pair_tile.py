"""The fp32 split tile on a cluster of two SMs sharing x's K blocks by TMA multicast (session 42, a prototype: not
routed, not a forge_num kernel until it is measured; needs Triton 3.9's Gluon, bench/triton_carry.sh brings it to
the device).

Why (bench/NOTES.md, sessions 39-41): from 1024 tokens the routed 64x128 tiles are bound by their operands' L2
traffic, (64 + 128) rows of K a tile, where cuBLAS's tiles in clusters of two read about half as much a
product. The 128x128 tile reads (128 + 128) rows for twice the products (0.67x), but on one SM it holds the update
with eight epilogue warps at a 128-register cap (v47), which loses to the 64-row tile's sixteen below ~2300
tokens. Here two SMs of a cluster take the two 64-row halves of a 128x128 block: each loads its own dY half and
x's block reaches both from one multicast copy, so the pair reads the 128x128 tile's operands while each SM keeps
the 64-row tile's partitions (one MMA warp group, sixteen epilogue warps, 96 registers).

The program is the cluster (Gluon's num_ctas = 2), every layout split by a cga_layout:

    tensor                   logical shape       split between the CTAs
    dY's K block             [BK, 128]           [[0, 1]]: CTA r its columns 64 r .. (dW's rows)
    x's K block              [BK, 128]           [[0, 0]]: whole in both (the lead's multicast copy)
    accumulator, g buffer    [128, BN]           [[1, 0]]: CTA r rows 64 r .. 64 r + 63
    epilogue sub-tile j      [2, ROWS, BN]       [[1, 0, 0]]: CTA r rows 64 r + ROWS j .. (the g buffer seen as
                                                 [2, 64, BN]); a row-split [2 ROWS, BN] would give CTA 1 rows
                                                 its accumulator does not hold
    telemetry                [2]                 a slot per CTA: (cluster tile) * 2 + r

    partition     warps a CTA   work
    MMA           4             gluon_q8.mma_self_loaded_tiles' loop (its own loads by a cursor, STAGES - 1 K
                                blocks ahead across tiles) with multicast_mainloop.py's protocol: ready[s] a
                                CTA's own (its dY half and x's block, 24 KB), released[s] the lead's
                                (two_ctas: both CTAs' wgmma on slot s retired; init's count is per CTA, 1, two
                                arrivals in the PTX; the lead waits there before its multicast refills the
                                slot; tests/test_cluster_ring_protocol.py models it); each tile's first block
                                before its loop (ptxas serializes the chain when zeros stand before a loop that
                                may run no iteration, C7515); the accumulator into g buffer t % G
                                (gluon_q8.hand_over)
    epilogue      16            gluon_f32.f32_epilogue's path without staging or prefetch (the grouped
                                default's, routed at 896-2303 tokens) on [2, ROWS, BN] sub-tiles: W and the
                                states by pointer, the guarded rule, stores; or (stage_slots, v46's, routed at
                                256-895) W and the states streamed through slots by TMA, over [M / 64, 64, N]
                                views so that each CTA's rows of a sub-tile are one box

The bits are the 64-row tile's: each CTA runs the same chain of m64n128k16 wgmma in K order from zeros, and each
element the same rule on the same fp32 values (`--check` compares with gluon_f32's grouped default bit for bit).

    python bench/pair_tile.py --ptx                  # compile for sm_90 (no GPU): registers, spills, the chain
    python bench/pair_tile.py --check                # bits against gluon_f32's grouped default, every rule
    python bench/pair_tile.py --tokens 1024,4096 --plain --staged   # times against the route, the unfused
                                                                     # step and the floor
    ncu -k regex:"pair_update|fused_linear_update_f32_ws" python bench/pair_tile.py --ncu --plain --tokens 1024

Status (session 44): on the H100, bits equal to the grouped default's in all 55 cases of `--check` (every rule,
the twins; K to 4096, slots reused), each a tile a cluster. Timing hung in the plain twin, the first time a
program had several tiles: its CTA 1, fed by no multicast, ran ahead into the lead's release phases (fixed: no
shared release without the multicast; `--check` now has cases of several tiles a cluster). No time measured yet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

try:
    from triton.experimental.gluon.language.nvidia.hopper import cluster
except ImportError:  # before Triton 3.7
    raise SystemExit(f"bench/pair_tile.py needs Triton 3.9's Gluon (two-CTA barriers that route arrivals, "
                     f"multicast TMA copies); this is Triton {triton.__version__}") from None

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from forge_num.kernels import gluon_f32 as _f32  # noqa: E402
from forge_num.kernels import gluon_q8 as _q8  # noqa: E402
from forge_num.kernels import gluon_update as _ws  # noqa: E402
from forge_num.kernels.gluon_update import tma_load  # noqa: E402



@gluon.jit
def load_pair_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, slot, k0, pid_m, pid_n, pred, MULTICAST: gl.constexpr):
    """K block k0 of cluster tile (pid_m, pid_n) into operand slot ``slot``: this CTA's dY half by its own copy,
    x's block by the lead's multicast copy into both CTAs (MULTICAST; else by each CTA's own copy, the same bytes:
    the twin that isolates what the multicast gives), both counted against this CTA's ready[slot]."""
    ROWS: gl.constexpr = dy_desc.block_type.shape[1]  # the cluster's (both CTAs')
    COLS: gl.constexpr = x_desc.block_type.shape[1]
    mbarrier.expect(ready.index(slot), dy_desc.nbytes_per_cta + x_desc.nbytes_per_cta, pred=pred)
    tma_load(dy_desc, [k0, pid_m * ROWS], ready.index(slot), dy_bufs.index(slot), pred=pred)
    tma_load(x_desc, [k0, pid_n * COLS], ready.index(slot), x_bufs.index(slot), pred=pred, multicast=MULTICAST)


@gluon.jit
def load_and_advance(dy_desc, x_desc, dy_bufs, x_bufs, ready, released, cursor, nk, tiles_m, tiles_n,
                     GROUP_M: gl.constexpr, MULTICAST: gl.constexpr):
    """gluon_q8.load_and_advance for the pair: the load the cursor (j, tile, k block, pid_m, pid_n) names, once
    the lead has seen both CTAs release the slot's last use (use j - STAGES: released[j % STAGES]'s phase
    (j // STAGES - 1); the first STAGES uses of the ring have none; without MULTICAST no wait, multiply_block's
    SHARED), then the cursor moved on. Predicates, not branches, around the wgmma chain (multicast_mainloop.py)."""
    BK: gl.constexpr = dy_desc.block_type.shape[0]
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    j, tile, kb, pid_m, pid_n = cursor
    exists = tile < tiles_m * tiles_n
    slot = j % STAGES
    if MULTICAST:
        mbarrier.wait(released.index(slot), ((j // STAGES) - 1) & 1, pred=exists & (j >= STAGES))
    load_pair_block(dy_desc, x_desc, dy_bufs, x_bufs, ready, slot, kb * BK, pid_m, pid_n, exists, MULTICAST)
    j += 1
    kb += 1
    if kb == nk:
        kb = 0
        tile += gl.num_programs(0)
        if tile < tiles_m * tiles_n:
            pid_m, pid_n = _ws.tile_coords(tile, tiles_m, tiles_n, GROUP_M)
    return j, tile, kb, pid_m, pid_n


@gluon.jit
def multiply_block(dy_bufs, x_bufs, ready, released, i, acc, x_released=None, SHARED: gl.constexpr = True):
    """The program's i-th K block's wgmma on acc (left in flight), once its operands landed; the wgmma before it
    retired and its slot released: to the lead (both CTAs of a pair arrive at released[(i - 1) % STAGES], a
    two_ctas barrier), or, given x_released (bench/quad_mainloop.py's 2x2 cluster), to dY's issuer at
    released (from_cta=1: the rank's bit 1 cleared) and to x's issuer at x_released (from_cta=2: bit 0 cleared).
    SHARED=False (the plain twins: each CTA copies all its operands itself): no release, each CTA's refill of a
    slot ordered after this retirement by its own program order, as in one CTA. A release kept there hangs:
    nothing holds CTA 1 back, so its arrivals run ahead into the lead's later phases (session 44;
    tests/test_cluster_ring_protocol.py, the plain twin)."""
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    a = dy_bufs.index(s).permute((1, 0))
    b = x_bufs.index(s)
    acc = warpgroup_mma(a, b, acc, is_async=True)
    acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a, b))
    prev = (i + STAGES - 1) % STAGES
    if SHARED:
        if x_released is None:
            mbarrier.arrive(released.index(prev), count=1, pred=i > 0)
        else:
            mbarrier.arrive(released.index(prev), count=1, pred=i > 0, from_cta=1)
            mbarrier.arrive(x_released.index(prev), count=1, pred=i > 0, from_cta=2)
    return acc


@gluon.jit
def pair_mma(dy_desc, x_desc, dy_bufs, x_bufs, ready, released, g_bufs, g_ready, g_empty, M, N, K,
             GROUP_M: gl.constexpr, MULTICAST: gl.constexpr):
    """Worker (a warp group a CTA for 64 rows a CTA, two for 128): per cluster tile, the chain of K blocks from
    zeros (the first before the loop), the next loads issued as each slot is released, then the accumulator into
    g buffer t % G."""
    BK: gl.constexpr = dy_desc.block_type.shape[0]
    ROWS: gl.constexpr = g_bufs.type.shape[1]
    BN: gl.constexpr = g_bufs.type.shape[2]
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[ROWS // 32, 1],
                                                         instr_shape=[16, BN, 16], cga_layout=[[1, 0]])
    tiles_m = gl.cdiv(M, ROWS)
    tiles_n = gl.cdiv(N, BN)
    nk = gl.cdiv(K, BK)
    first_m, first_n = _ws.tile_coords(gl.program_id(0), tiles_m, tiles_n, GROUP_M)  # every cluster has a tile
    cursor = (0, gl.program_id(0), 0, first_m, first_n)
    for _ in gl.static_range(STAGES - 1):
        cursor = load_and_advance(dy_desc, x_desc, dy_bufs, x_bufs, ready, released, cursor, nk, tiles_m, tiles_n,
                                  GROUP_M, MULTICAST)
    i = 0
    t = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        acc = multiply_block(dy_bufs, x_bufs, ready, released, i,
                             gl.zeros((ROWS, BN), dtype=gl.float32, layout=acc_layout), SHARED=MULTICAST)
        cursor = load_and_advance(dy_desc, x_desc, dy_bufs, x_bufs, ready, released, cursor, nk, tiles_m, tiles_n,
                                  GROUP_M, MULTICAST)
        i += 1
        for _kb in range(1, nk):
            acc = multiply_block(dy_bufs, x_bufs, ready, released, i, acc, SHARED=MULTICAST)
            cursor = load_and_advance(dy_desc, x_desc, dy_bufs, x_bufs, ready, released, cursor, nk, tiles_m,
                                      tiles_n, GROUP_M, MULTICAST)
            i += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _q8.hand_over(acc, t, g_bufs, g_ready, g_empty)
        t += 1


@gluon.jit
def stage_pair_rows(staging, u, pid_m, pid_n, j, N_STATE: gl.constexpr):
    """gluon_q8.stage_row_blocks for the pair: row sub-tile j of cluster tile (pid_m, pid_n), each CTA's ROWS
    rows of W and of the N_STATE states (CTA r: rows 128 pid_m + 64 r + ROWS j ..), by TMA into staging slot
    u % S, counted against this CTA's st_ready[u % S]. The descriptors see W [M, N] as [M / 64, 64, N]
    (blocks [2, ROWS, BN] split by CTA), so that each CTA's rows are one box; the slot's last reads (sub-tile u -
    S's) are ordered before the copy's writes by each thread's fence and the partition's barrier before the
    copy (gluon_q8.stage_row_blocks says how)."""
    w_desc, s0_desc, s1_desc, st_w, st_s0, st_s1, st_ready = staging
    S: gl.constexpr = st_ready.type.shape[0]
    ROWS: gl.constexpr = w_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[2]
    slot = u % S
    fence_async_shared()
    mbarrier.expect(st_ready.index(slot), w_desc.nbytes_per_cta * (1 + N_STATE))
    coord = [pid_m * 2, j * ROWS, pid_n * BN]
    tma_load(w_desc, coord, st_ready.index(slot), st_w.index(slot))
    if N_STATE >= 1:
        tma_load(s0_desc, coord, st_ready.index(slot), st_s0.index(slot))
    if N_STATE >= 2:
        tma_load(s1_desc, coord, st_ready.index(slot), st_s1.index(slot))


@gluon.jit
def pair_epilogue(g_bufs, g_ready, g_empty, M, N, w_ptr, s0_ptr, s1_ptr, h, grad_scale, norm_sq_ptr, nonfinite_ptr,
                  staging, GUARDED_UPDATE: gl.constexpr, N_STATE: gl.constexpr, ROWS: gl.constexpr,
                  GROUP_M: gl.constexpr, STAGE_STATE: gl.constexpr, num_warps: gl.constexpr):
    """Default partition (num_warps a CTA): per cluster tile, its (a CTA's rows) / ROWS sub-tiles [2, ROWS, BN] of g
    (CTA r: rows 64 r + ROWS j ..), each's W and states loaded by pointer and updated (gluon_f32.load_rows,
    update_loaded_rows), the g buffer handed back once the last is in registers; the telemetry a slot per CTA.
    STAGE_STATE: W and the states instead streamed through S staging slots by TMA (v46's design, gluon_f32's
    STAGE_STATE: the program's first S sub-tiles before its loop, sub-tile u + S into the slot sub-tile u was
    read from, this tile's or the next one's; the S copies past the last tile waited for at the end)."""
    G: gl.constexpr = g_bufs.type.shape[0]
    PAIR: gl.constexpr = g_bufs.type.shape[1]
    BN: gl.constexpr = g_bufs.type.shape[2]
    HALF: gl.constexpr = PAIR // 2
    SUBTILES: gl.constexpr = HALF // ROWS
    gl.static_assert(SUBTILES * ROWS == HALF, "ROWS must divide a CTA's rows")
    gl.static_assert(ROWS % num_warps == 0, "each epilogue warp takes whole rows of a sub-tile")
    # gluon_q8.row_subtile_layout's (a warp a row, BN / 32 consecutive columns a thread) with the CTA in front
    epi: gl.constexpr = gl.BlockedLayout([1, ROWS // num_warps, BN // 32], [1, 1, 32], [1, num_warps, 1], [2, 1, 0],
                                         cga_layout=[[1, 0, 0]])
    ctas: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, epi))
    rows: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, epi))
    cols: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, epi))
    cta = gl.arange(0, 2, layout=ctas)
    tiles_m = gl.cdiv(M, PAIR)
    tiles_n = gl.cdiv(N, BN)
    _, _, _, st_w, st_s0, st_s1, st_ready = staging
    if STAGE_STATE:
        S: gl.constexpr = st_ready.type.shape[0]
        gl.static_assert(SUBTILES >= S, "a tile's sub-tiles cover the staging distance")
        first_m, first_n = _ws.tile_coords(gl.program_id(0), tiles_m, tiles_n, GROUP_M)  # every cluster has one
        for a in gl.static_range(S):
            stage_pair_rows(staging, a, first_m, first_n, a, N_STATE)
    u = 0  # the program's sub-tiles so far (STAGE_STATE: the staging slots' uses)
    t = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = _ws.tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        if STAGE_STATE:
            # the tile after this one, whose first sub-tiles this one's last ones stage; after the program's
            # last tile this one again (never read; waited for after the loop)
            following = tile + gl.num_programs(0)
            next_m, next_n = _ws.tile_coords(gl.where(following < tiles_m * tiles_n, following, tile), tiles_m,
                                             tiles_n, GROUP_M)
        b = t % G
        offs_n = pid_n * BN + gl.arange(0, BN, layout=cols)
        offs_m = pid_m * PAIR + cta[:, None] * HALF + gl.arange(0, ROWS, layout=rows)[None, :]  # [2, ROWS]
        offs = offs_m[:, :, None].to(gl.int64) * N + offs_n[None, None, :]
        in_tile = (offs_m[:, :, None] < M) & (offs_n[None, None, :] < N)
        mbarrier.wait(g_ready.index(b), (t // G) & 1)
        halves = g_bufs.index(b).reshape([2, HALF, BN])
        sq = gl.zeros((2, ROWS, BN), dtype=gl.float64, layout=epi)
        bad = gl.zeros((2, ROWS, BN), dtype=gl.int32, layout=epi)
        for j in gl.static_range(SUBTILES):
            g = halves.slice(j * ROWS, ROWS, dim=1).load(epi)
            if j == SUBTILES - 1:
                mbarrier.arrive(g_empty.index(b), count=1)  # g is in registers: the MMA warps may refill it
            if STAGE_STATE:
                loaded = _f32.read_staged_rows(st_w, st_s0, st_s1, _q8.staged_slot(st_ready, u), epi, N_STATE)
                if j + S < SUBTILES:  # sub-tile u + S into the slot just read: this tile's, or the next one's
                    stage_pair_rows(staging, u + S, pid_m, pid_n, j + S, N_STATE)
                else:
                    stage_pair_rows(staging, u + S, next_m, next_n, j + S - SUBTILES, N_STATE)
            else:
                loaded = _f32.load_rows(offs, in_tile, w_ptr, s0_ptr, s1_ptr, N_STATE, "")
            sq_j, bad_j = _f32.update_loaded_rows(g, loaded, offs, in_tile, w_ptr, s0_ptr, s1_ptr, h, grad_scale,
                                                  GUARDED_UPDATE, N_STATE, "")
            sq, bad = _q8.add_subtile_telemetry(sq, bad, sq_j, bad_j)
            u += 1
            if j + 1 < SUBTILES:
                offs_m += ROWS
                offs += ROWS * N
                in_tile = (offs_m[:, :, None] < M) & (offs_n[None, None, :] < N)
        slot = (pid_m * tiles_n + pid_n) * 2 + cta
        gl.store(norm_sq_ptr + slot, gl.sum(gl.sum(sq, axis=2), axis=1))
        gl.store(nonfinite_ptr + slot, gl.sum(gl.sum(bad, axis=2), axis=1))
        t += 1
    if STAGE_STATE:
        _q8.drain_staging(st_ready, u)


@gluon.jit
def pair_update_kernel(dy_desc, x_desc, w_desc, s0_desc, s1_desc, w_ptr, s0_ptr, s1_ptr, norm_sq_ptr, nonfinite_ptr,
                       M, N, K, h, grad_scale, GUARDED_UPDATE: gl.constexpr, N_STATE: gl.constexpr,
                       STAGES: gl.constexpr, ROWS: gl.constexpr, GROUP_M: gl.constexpr, MMA_REGS: gl.constexpr,
                       G_BUFS: gl.constexpr, MULTICAST: gl.constexpr, STAGE_SLOTS: gl.constexpr,
                       num_warps: gl.constexpr):
    """The rings and barriers of the cluster, then the partitions (module docstring). dy_desc [K, M] block
    [BK, 128] split by columns, x_desc [K, N] block [BK, BN] whole in both CTAs; STAGE_SLOTS: 0, or the staging
    slots of W and the states, w_desc, s0_desc, s1_desc their descriptors over [M / 64, 64, N] in blocks
    [2, ROWS, BN] split by CTA (an absent state's the weight's; all None without staging)."""
    gl.static_assert(gl.num_ctas() == 2)
    BK: gl.constexpr = dy_desc.block_type.shape[0]
    PAIR: gl.constexpr = dy_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    dy_bufs = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, BK, PAIR], dy_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BK, BN], x_desc.layout)
    g_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([PAIR, BN], gl.float32, cga_layout=[[1, 0]])
    g_bufs = gl.allocate_shared_memory(gl.float32, [G_BUFS, PAIR, BN], g_layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    released = ready  # without the multicast none (multiply_block's SHARED); never used then
    if MULTICAST:
        released = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)
    g_ready = mbarrier.allocate_mbarrier(batch=G_BUFS)
    g_empty = mbarrier.allocate_mbarrier(batch=G_BUFS)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        if MULTICAST:
            mbarrier.init(released.index(s), count=1)
    for b in gl.static_range(G_BUFS):
        mbarrier.init(g_ready.index(b), count=1)
        mbarrier.init(g_empty.index(b), count=1)
    staging = (w_desc, s0_desc, s1_desc, None, None, None, None)
    if STAGE_SLOTS:
        st_w = gl.allocate_shared_memory(w_desc.dtype, [STAGE_SLOTS] + w_desc.block_type.shape, w_desc.layout)
        st_s0 = st_w
        st_s1 = st_w
        if N_STATE >= 1:
            st_s0 = gl.allocate_shared_memory(s0_desc.dtype, [STAGE_SLOTS] + s0_desc.block_type.shape,
                                              s0_desc.layout)
            st_s1 = st_s0
        if N_STATE >= 2:
            st_s1 = gl.allocate_shared_memory(s1_desc.dtype, [STAGE_SLOTS] + s1_desc.block_type.shape,
                                              s1_desc.layout)
        st_ready = mbarrier.allocate_mbarrier(batch=STAGE_SLOTS)
        for a in gl.static_range(STAGE_SLOTS):
            mbarrier.init(st_ready.index(a), count=1)
        staging = (w_desc, s0_desc, s1_desc, st_w, st_s0, st_s1, st_ready)
    cluster.barrier()  # both CTAs' barriers initialized before any copy or arrival reaches them
    gl.warp_specialize([
        (pair_epilogue, (g_bufs, g_ready, g_empty, M, N, w_ptr, s0_ptr, s1_ptr, h, grad_scale, norm_sq_ptr,
                         nonfinite_ptr, staging, GUARDED_UPDATE, N_STATE, ROWS, GROUP_M, STAGE_SLOTS > 0,
                         num_warps)),
        (pair_mma, (dy_desc, x_desc, dy_bufs, x_bufs, ready, released, g_bufs, g_ready, g_empty, M, N, K, GROUP_M,
                    MULTICAST)),
    ], [PAIR // 32], [MMA_REGS])  # a warp a 16-row slice of a CTA's rows
    # neither CTA leaves while the other may still arrive at its barriers or copy into its shared memory
    cluster.barrier()


class PairConfig:
    """The pair tile's knobs: STAGES operand slots, epilogue sub-tiles of ROWS rows (a CTA's), GROUP_M cluster
    tile rows a group (8 = the 64-row tiles' 16), the MMA warp group's registers and the launch's cap, G g
    buffers. The defaults: the grouped default's (gluon_f32.GROUPED_F32_WS_CONFIG) per SM."""

    def __init__(self, STAGES=4, ROWS=16, GROUP_M=8, num_warps=16, mma_registers=96, max_registers=96, g_buffers=2,
                 multicast=True, stage_slots=0, cta_rows=64):
        if cta_rows not in (64, 128) or cta_rows % ROWS or ROWS % num_warps:
            raise ValueError(f"PairConfig: 64 or 128 rows a CTA (one or two MMA warp groups), sub-tiles of whole "
                             f"rows a warp dividing them, got {cta_rows} rows, ROWS={ROWS}, {num_warps} warps")
        self.cta_rows = cta_rows
        self.STAGES, self.ROWS, self.GROUP_M, self.num_warps = STAGES, ROWS, GROUP_M, num_warps
        self.multicast, self.stage_slots = multicast, stage_slots
        self.mma_registers, self.max_registers, self.g_buffers = mma_registers, max_registers, g_buffers
        self.BK, self.BN = 64, 128

    @property
    def label(self) -> str:
        return (f"pair {2 * self.cta_rows}x{self.BN}x{self.BK} st{self.STAGES} w{self.num_warps} rows{self.ROWS} "
                f"g{self.GROUP_M} mma{self.mma_registers} r{self.max_registers} gb{self.g_buffers}"
                + ("" if self.multicast else " plain") + (f" ss{self.stage_slots}" if self.stage_slots else ""))


# v47's SM on the pair (for 2304-16384 tokens, where v47 is routed): 128 rows a CTA on two MMA warp groups, eight
# epilogue warps on 8-row sub-tiles at the 128-register cap, one g buffer, four operand stages (192 KB a CTA).
# A cluster tile of 256 x 128 reads (256 + 128) rows of operands for two 128x128 tiles: 0.75x v47's
TALL_PAIR = PairConfig(cta_rows=128, STAGES=4, ROWS=8, num_warps=8, mma_registers=96, max_registers=128,
                       g_buffers=1)


def _descriptors(dy, x, c: PairConfig):
    dy_layout = gl.NVMMASharedLayout.get_default_for([c.BK, 2 * c.cta_rows], gl.bfloat16, cga_layout=[[0, 1]])
    x_layout = gl.NVMMASharedLayout.get_default_for([c.BK, c.BN], gl.bfloat16, cga_layout=[[0, 0]])
    return (_ws.TensorDescriptor.from_tensor(dy, [c.BK, 2 * c.cta_rows], dy_layout),
            _ws.TensorDescriptor.from_tensor(x, [c.BK, c.BN], x_layout))


def _staging_descs(weight, states, c: PairConfig) -> tuple:
    """(w_desc, s0_desc, s1_desc) of the staged pair tile: W and each fp32 state seen as [M / R, R, N] (R the
    CTA's rows; each CTA's ROWS rows of a sub-tile one box: blocks [2, ROWS, BN] split by CTA, rows as they lie in
    memory), an absent state's the weight's; or three Nones. Needs M a multiple of R."""
    if not c.stage_slots:
        return None, None, None
    M, N = weight.shape
    R = c.cta_rows
    if M % R:
        raise ValueError(f"pair tile: staging its state needs M a multiple of {R}, got {M}")
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3, cga_layout=[[1, 0, 0]])
    descs = [_ws.TensorDescriptor.from_tensor(t.view(M // R, R, N), [2, c.ROWS, c.BN], layout)
             for t in (weight, *states)]
    descs += [descs[0]] * (3 - len(descs))
    return descs[0], descs[1], descs[2]


def _constants(rule, c: PairConfig, n_state: int):
    return (dict(GUARDED_UPDATE=_ws.guarded_update_gluon(rule), N_STATE=n_state, STAGES=c.STAGES, ROWS=c.ROWS,
                 GROUP_M=c.GROUP_M, MMA_REGS=c.mma_registers, G_BUFS=c.g_buffers, MULTICAST=c.multicast,
                 STAGE_SLOTS=c.stage_slots, num_warps=c.num_warps),
            dict(maxnreg=c.max_registers, enable_fp_fusion=False, num_ctas=2))


def pair_update(weight, x, dy, states, rule, h, grad_scale=1.0, config: PairConfig | None = None,
                programs: int | None = None):
    """The fp32 update of weight [M, N] and its states by dW = dyᵀ x (x [K, N], dy [K, M] bf16) on the pair tile;
    (norm_sq, nonfinite) summed over the slots. For operands gluon_f32's route accepts (contiguous, 16-byte
    aligned, M and N multiples of 8). programs: the clusters launched (default one an SM pair, at most one a
    tile); fewer give small problems several tiles a program, as large ones have."""
    c = config or PairConfig()
    M, N = weight.shape
    tiles = triton.cdiv(M, 2 * c.cta_rows) * triton.cdiv(N, c.BN)
    sms = torch.cuda.get_device_properties(weight.device).multi_processor_count
    norm_sq = torch.zeros(2 * tiles, dtype=torch.float64, device=weight.device)
    nonfinite = torch.zeros(2 * tiles, dtype=torch.int32, device=weight.device)
    given = list(states) + [weight, weight]
    constexprs, options = _constants(rule, c, len(states))
    grid = (min(tiles, programs or sms // 2),)
    pair_update_kernel[grid](*_descriptors(dy, x, c), *_staging_descs(weight, states, c), weight, given[0], given[1],
                             norm_sq, nonfinite, M, N, x.shape[0], tuple(h), grad_scale, **constexprs, **options)
    return norm_sq.sum(), nonfinite.sum()


def compile_for_sm90(rule, config: PairConfig | None = None, M=256, N=256, K=128):
    """The kernel compiled for sm_90 without a GPU (gluon_update.compile_gluon_for_sm90)."""
    c = config or PairConfig()
    constexprs, options = _constants(rule, c, len(rule.state))
    dy = torch.empty(K, M, dtype=torch.bfloat16)
    x = torch.empty(K, N, dtype=torch.bfloat16)
    dy_desc, x_desc = _descriptors(dy, x, c)
    w, states = torch.empty(M, N), [torch.empty(M, N) for _ in rule.state]
    w_desc, s0_desc, s1_desc = _staging_descs(w, states, c)
    args = dict(dy_desc=dy_desc, x_desc=x_desc, w_desc=w_desc, s0_desc=s0_desc, s1_desc=s1_desc, w_ptr=w,
                s0_ptr=torch.empty(M, N),
                s1_ptr=torch.empty(M, N), norm_sq_ptr=torch.empty(4, dtype=torch.float64),
                nonfinite_ptr=torch.empty(4, dtype=torch.int32), M=M, N=N, K=K,
                h=tuple(1.0 for _ in rule.scalar_names), grad_scale=1.0, **constexprs)
    num_warps = options.pop("num_warps", c.num_warps)
    return _ws.compile_gluon_for_sm90(pair_update_kernel, args, num_warps, options)


def main(argv=None) -> None:
    from forge_num.rules import RULES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ptx", action="store_true", help="compile for sm_90 (no GPU): registers, spills, the chain")
    p.add_argument("--check", action="store_true", help="bits against gluon_f32's grouped default, every rule")
    p.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336,8192x8192,28672x8192")
    p.add_argument("--tokens", default="1024,2048,4096,16384")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--paired", action="store_true", help="each round, time the tiles, the route and the unfused "
                   "step call by call in turn (bench/timing.py) rather than one function's samples at a time")
    p.add_argument("--stages", default="4,6", help="pair tiles timed: one a number of operand stages")
    p.add_argument("--plain", action="store_true",
                   help="also the first one's twin without multicast (each CTA loads x's block itself)")
    p.add_argument("--staged", action="store_true",
                   help="also the first one's twin streaming W and the states through 2 slots by TMA (v46's)")
    p.add_argument("--tall", action="store_true", help="also TALL_PAIR (v47's SM on the pair)")
    p.add_argument("--ncu", action="store_true",
                   help="launch each pair tile and the route once a shape and K (to run under ncu), no timing")
    p.add_argument("--warm", action="store_true",
                   help="compile and run once what the same arguments would time, one process a tile and one for "
                        "the route, all at once (Triton's cache then serves the timing); prints each one's rc, "
                        "'hung' for one still running after --warm-s seconds (killed); no timing")
    p.add_argument("--warm-s", type=float, default=150.0)
    p.add_argument("--only", default=None,
                   help="the tiles to time, by index in the order built (--stages' tiles, --plain's, --staged's, "
                        "--tall's), comma-separated: those --warm found to run; the route is always timed")
    p.add_argument("--rules", default=None, help="--check: only these rules (comma-separated)")
    args = p.parse_args(argv)
    if args.ptx:
        from bench.registers import resource_usage

        for c in (PairConfig(), PairConfig(stage_slots=2), TALL_PAIR):
            for name in sorted(RULES):
                print(f"{c.label}  {name:8s}", resource_usage(compile_for_sm90(RULES[name], c).asm["ptx"]))
        return
    if args.check:
        sys.exit(check(args.rules.split(",") if args.rules else None))
    configs = [PairConfig(STAGES=int(v)) for v in args.stages.split(",")]
    configs += [PairConfig(STAGES=configs[0].STAGES, multicast=False)] if args.plain else []
    configs += [PairConfig(STAGES=configs[0].STAGES, stage_slots=2)] if args.staged else []
    configs += [TALL_PAIR] if args.tall else []
    if args.warm:
        sys.exit(warm(argv if argv is not None else sys.argv[1:], len(configs), args.warm_s))
    if args.ncu:
        only = args.only
        launch_once(args.shapes, args.tokens, configs if only is None else [] if only == "route" else
                    [configs[int(only)]], route=only in (None, "route"))
        return
    if args.only is not None:
        configs = [configs[int(i)] for i in args.only.split(",") if i]
    time_against_route(args.shapes, args.tokens, args.rounds, configs, args.paired)


def warm(argv, n_configs: int, seconds: float) -> int:
    """--warm: this script with --ncu once a tile (--only i) and once for the route (--only route), the processes
    at once; each launch compiles its kernel into Triton's cache, where the timing run finds it (on a fresh device
    machine the compiles, one after another, took a call's part: bench/results/2026-12-07-s43). A process still
    running after ``seconds`` is killed and reported hung (session 44: the plain twin hung at its first problem
    of several tiles a cluster, and with it the timing that launched it). Returns the number of processes that
    failed or hung."""
    import subprocess
    import time

    base = [sys.executable, __file__, *(a for a in argv if a != "--warm"), "--ncu"]
    procs = {only: subprocess.Popen([*base, "--only", only], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for only in [*map(str, range(n_configs)), "route"]}
    deadline = time.monotonic() + seconds
    failed = 0
    for only, proc in procs.items():
        try:
            err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failed += 1
            print(f"warm {only}: hung (killed after {seconds:.0f} s)")
            continue
        err = err.decode(errors="replace").strip().splitlines()
        failed += proc.returncode != 0
        print(f"warm {only}: rc={proc.returncode}" + (f" {err[-1][:160]}" if proc.returncode and err else ""))
    return failed


def launch_once(shapes: str, tokens: str, configs, route: bool = True) -> None:
    """Each pair tile and (route) the route once a shape and K, in that order, on time_against_route's problem
    (for ncu -k regex:"pair_update|fused_linear_update": the first launch of a tile compiles it, the GPU runs it
    once)."""
    from bench.kernels import adamw_problem
    from forge_num import kernels, rules

    for shape in shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        for K in (int(v) for v in tokens.split(",")):
            x, dy, w, states, h = adamw_problem(M, N, K)
            for c in configs:
                pair_update(w, x, dy, states, rules.ADAMW, h, config=c)
                torch.cuda.synchronize()
                print(f"{shape} K={K} {c.label}: launched")
            if not route:
                continue
            kernels.fused_linear_update(w, x, dy, states, rules.ADAMW, h)
            torch.cuda.synchronize()
            print(f"{shape} K={K} route {getattr(kernels.launcher_tile(w, x, dy, states)[1], 'label', '?')}: "
                  "launched")


def check(rule_names=None) -> int:
    """The pair tile against gluon_f32's grouped default, bit for bit (weights, states, nonfinite counts; the
    squared norm within the order bound of its sums), every rule of tests/test_gpu_gluon.py: cluster tiles past
    M (a CTA with no row, and one with some) and past N, a partial last K block, K below one block, nonfinite
    gradient rows; and two cases on two or three clusters, several tiles each (the g buffers' reuse, the
    staging of the next tile's rows, the ring's uses across tiles: the launch's cluster count covers every tile
    of the others). Returns the number of failed cases."""
    from forge_num.emulator.bounds import sum_of_squares_order_bound
    from tests.kernel_cases import same_bits
    from tests.test_gpu_gluon import HYPERS, _case

    failed = 0
    for rule_name in sorted(rule_names or HYPERS):
        for M, N, K, bad_rows, programs in ((64, 128, 64, 0, None), (200, 264, 150, 0, None),
                                            (8 * 37, 8 * 41, 1024, 3, None), (512, 384, 8, 0, None),
                                            (1024, 1024, 4096, 0, None), (512, 640, 200, 0, 3),
                                            (8 * 37, 8 * 41, 520, 3, 2)):
            rule, h, w0, s0, x, dy = _case(rule_name, M, N, K, seed=M * 5 + N + K, bad_rows=bad_rows)
            wr, sr = w0.clone(), [s.clone() for s in s0]
            stats = _f32.fused_linear_update_f32_ws(wr, x, dy, sr, rule, h, config=_f32.GROUPED_F32_WS_CONFIG)
            ref = float(stats.norm_sq)
            # the plain twin (no multicast) on AdamW's cases, the staged twin where M allows: the same bits
            twins = [PairConfig()] + ([PairConfig(multicast=False)] if rule_name == "adamw" else [])
            twins += [PairConfig(stage_slots=2)] if M % 64 == 0 else []
            twins += [TALL_PAIR] if rule_name in ("adamw", "lion") else []
            for c in twins:
                wp, sp = w0.clone(), [s.clone() for s in s0]
                norm_sq, nonfinite = pair_update(wp, x, dy, sp, rule, h, config=c, programs=programs)
                same = same_bits(wp, wr) and all(same_bits(a, b) for a, b in zip(sp, sr))
                counted = int(nonfinite) == int(stats.nonfinite)
                finite = ref == ref and abs(ref) != float("inf")
                # the same fp64 terms g² (g's bits equal) summed in two orders: proofs/telemetry.md's bound
                summed = (abs(float(norm_sq) - ref) <= sum_of_squares_order_bound(M * N, ref) if finite
                          else bad_rows > 0)
                ok = same and counted and summed
                failed += not ok
                twin = ("" if c.multicast else " plain") + (" staged" if c.stage_slots else "") + (
                    " tall" if c.cta_rows == 128 else "")
                on = f" on {programs} clusters" if programs else ""
                print(f"{rule_name:9s} {M}x{N} K={K} bad rows {bad_rows}{on}{twin}: bits "
                      f"{same}, nonfinite {int(nonfinite)} ({int(stats.nonfinite)}), norm_sq {float(norm_sq):.6g} "
                      f"({ref:.6g}) -> {'ok' if ok else 'FAILED'}")
    return failed


def time_against_route(shapes: str, tokens: str, rounds: int, configs, paired: bool = False) -> None:
    """The pair tiles' AdamW update against the launcher's route (the same problem, bench/kernels.py's), the
    unfused step (cuBLAS's dW, torch's fused AdamW) and the floor, interleaved rounds, medians in ms; the ratios
    of the first pair tile. paired: each round times every function call by call in turn (bench/timing.py)."""
    import statistics

    from bench.kernels import HYPER, adamw_problem, measure_ceilings
    from bench.timing import paired_medians
    from forge_num import kernels, rules

    ceilings = measure_ceilings()
    names = [("tall" if c.cta_rows == 128 else "") + f"st{c.STAGES}" + ("" if c.multicast else "pl")
             + (f"ss{c.stage_slots}" if c.stage_slots else "") for c in configs]
    print(f"{'shape':>12s} {'K':>6s} " + " ".join(f"{n:>8s}" for n in names)
          + f" {'route':>8s} {'unfused':>8s} {'floor':>8s}  pair/route  unfused/pair  pair/floor  route tile")
    for shape in shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        for K in (int(v) for v in tokens.split(",")):
            x, dy, w, states, h = adamw_problem(M, N, K)
            p = torch.nn.Parameter(w.clone())
            opt = torch.optim.AdamW([p], fused=True, **HYPER)

            def unfused():
                p.grad = (dy.t() @ x).float()
                opt.step()
                p.grad = None

            fns = {n: (lambda c=c: pair_update(w, x, dy, states, rules.ADAMW, h, config=c))
                   for n, c in zip(names, configs)}
            fns.update(route=lambda: kernels.fused_linear_update(w, x, dy, states, rules.ADAMW, h), unfused=unfused)
            ms = {k: [] for k in fns}
            for _ in range(rounds):
                if paired:
                    for k, t in paired_medians(fns, rep_ms=200, warmup_ms=25).items():
                        ms[k].append(t)
                    continue
                for k, fn in fns.items():
                    ms[k].append(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
            med = {k: statistics.median(v) for k, v in ms.items()}
            floor = 1e3 * max(2.0 * K * M * N / ceilings["bf16_flops"],
                              (2 * (K * N + K * M) + 24 * M * N) / ceilings["copy_bytes_per_s"])
            _, tile = kernels.launcher_tile(w, x, dy, states)
            pair = med[names[0]]
            print(f"{shape:>12s} {K:6d} " + " ".join(f"{med[n]:8.3f}" for n in names)
                  + f" {med['route']:8.3f} {med['unfused']:8.3f} {floor:8.3f}  {pair / med['route']:10.3f}  "
                  f"{med['unfused'] / pair:12.3f}  {pair / floor:10.3f}  {getattr(tile, 'label', tile)}")


if __name__ == "__main__":
    main()
