"""The 8bit regime in the warp-specialized Gluon kernel: one tile's update beside the next tile's mainloop.

Why (bench/NOTES.md, sessions 16-22): in the 8bit regime the update is the work. Per element the
Triton tile's epilogue runs ~268 SASS instructions (block quantization 81, the rule's IEEE
divisions and square root 69, Philox 46), against 8 bytes of memory traffic, and the Triton kernel
runs it after its mainloop, in the same warps: the tile's time is the sum of the two. Here they are
different warps of one program, and the accumulator goes between them through shared memory:

    partition        warps  work
    operand loader   1      TMA loads of the K blocks dY[k0:k0+BK, rows] and X[k0:k0+BK, cols] into a
                            ring of STAGES slots (kernels/gluon_update.py's operand_loader)
    MMA              4      per tile: the mainloop (gluon_update.mainloop, one m64nBNk16 wgmma chain),
                            then the accumulator [BM, BN] whole into g buffer t % 2 of shared memory
                            (double buffered: the next tile's mainloop runs while the epilogue
                            warps update this one), handed over by g_ready, taken back by g_empty
    epilogue       E = num_warps (default partition)
                            per tile: row sub-tiles [ROWS, BN] of g read from the buffer in a layout
                            of their own (a warp a row of a block, 4 consecutive columns a thread:
                            a block's absmax is a reduction within a warp), the buffer handed back
                            after the last one; on each, the Triton 8bit epilogue's steps
                            (linear_update.update_rows_q8's: load W and the codes and scales by
                            pointer, the guarded rule, Philox, stochastic rounding, store), Philox
                            first and once a pair of elements (row_block_rounding_bits); the
                            tile's telemetry into its slot

The bits are the Triton 8bit kernel's: the mainloop is the same chain of k16 wgmma block FMAs in K
order as `tl.dot` in that kernel's TMA mode (BK = 64, zeros past the edges: gluon_update's module
docstring), and the epilogue runs the same functions (the guarded rule, linear_update's loads, stores,
counters and telemetry terms, quant8's block functions, random's Philox rounds, compiled in Gluon's
language by gluon_update._modules_in_gluon), only its addressing its own (row_block_addresses: one
scale a row) and its Philox calls shared by the two elements of a pair in one thread (the 8bit
table's calls, which the Triton tile computes for each element), element-wise given an element's
128-column block, and every sub-tile row holds whole
blocks (BN = QBLOCK = 128, tiles at multiples of 128). The
telemetry's sums are bounded, not bit-exact (proofs/telemetry.md), as between the Triton tiles.

The loader-free design (mma_self_loaded_tiles, Q8WSConfig(self_load=True)) drops the loader
partition: the MMA warp group issues its own TMA loads, and the registers the loader's warp group held
let sixteen epilogue warps run instead of eight (faster below 4096 tokens, slower from there: the
route at the end of this module says where each runs).

Scope: the 8bit regime (bf16 weight, Q8State states) with bf16 operands TMA can address (contiguous,
16-byte aligned, M and N multiples of 8), K > 0, the plain counter map or a shard's (no gathered
rows), no accumulation buffer. tests/test_gpu_gluon.py holds it to the Triton kernel bit for bit.
"""

from __future__ import annotations

import functools
import os
import types

import torch
import triton
import triton.language as tl  # the Philox arguments' annotations (gluon_update says why)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait,
)

from forge_num.rules import Rule

from . import gluon_update as _ws
from .launch_cache import CachedLaunch
from .quant8 import QBLOCK as _QBLOCK

QBLOCK = int(_QBLOCK.value)  # elements a block of an 8-bit state's row (kernels/quant8.py), as a host int
# stage_state tiles: shared-memory slots of a sub-tile's state, and how many sub-tiles ahead it is loaded
# (a sub-tile's slot refilled, by TMA, once its update has read it: the copy lands under the next update)
STAGING_SLOTS = gl.constexpr(2)
# mma_stage tiles: when the MMA warp group stages a tile's state (stage_tile_state). At the tile's start it waits
# there for the epilogue to hand back the tile's g buffer and slot (from tile t - 2), before the mainloop: time
# the mainloop loses where it is the longer part (3072-4096 tokens, session 34). At the hand-over it waits where
# hand_over waits anyway, and the copy still lands before the epilogue needs it wherever the epilogue is the
# longer part (it is then still updating tile t - 1); where the mainloop is, the epilogue waits for the copy
# once a tile (a candidate, not yet run on a GPU).
MMA_STAGE_AT_START = gl.constexpr(1)
MMA_STAGE_AT_HANDOVER = gl.constexpr(2)


@gluon.jit
def hand_over(acc, t, g_bufs, g_ready, g_empty):
    """Tile t's accumulator (the program's t-th) whole into g buffer t % G (G buffers: 2, or 1 for gluon_f32's
    one-buffer tiles), once the epilogue has handed that buffer back from tile t - G (phase t // G - 1 of its
    g_empty: a fresh barrier's first wait passes), then g_ready."""
    G: gl.constexpr = g_bufs.type.shape[0]
    b = t % G
    mbarrier.wait(g_empty.index(b), ((t // G) & 1) ^ 1)
    g_bufs.index(b).store(acc)
    mbarrier.arrive(g_ready.index(b), count=1)


@gluon.jit
def mma_whole_tiles(dy_bufs, x_bufs, op_ready, op_empty, g_bufs, g_ready, g_empty, M, N, K, GROUP_M: gl.constexpr):
    """Worker (BM / 64 warp groups, a warp a 16-row slice of the tile: the 8bit tiles' one, gluon_f32's 128-row
    tiles two): per tile this program owns, the mainloop, then the accumulator whole into g buffer t % 2 once the
    epilogue has handed it back (its (t // 2)-th use), then g_ready."""
    BM: gl.constexpr = g_bufs.type.shape[1]
    BN: gl.constexpr = g_bufs.type.shape[2]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BM // 16, 1],
                                                         instr_shape=[16, BN, 16])
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    i = 0
    t = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        acc, i = _ws.mainloop(dy_bufs, x_bufs, op_ready, op_empty, i, K, mma_layout)
        hand_over(acc, t, g_bufs, g_ready, g_empty)
        t += 1


@gluon.jit
def load_k_block(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, j, nk, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    """The TMA loads of this program's j-th K block (block j % nk of its (j // nk)-th tile) into operand
    slot j % STAGES, where that tile exists."""
    BK: gl.constexpr = dy_desc.block_type.shape[0]
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    tile = gl.program_id(0) + (j // nk) * gl.num_programs(0)
    if tile < tiles_m * tiles_n:
        pid_m, pid_n = _ws.tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        _ws.load_operands(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, j % STAGES, (j % nk) * BK, pid_m, pid_n)


@gluon.jit
def load_and_advance(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, cursor, nk, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    """load_k_block for the use a load cursor names, then the cursor moved to the next use, without
    load_k_block's divisions: cursor = (j, tile, k block, pid_m, pid_n) of the next load, the tile's
    coordinates recomputed only when the cursor enters a tile (per K block load_k_block divides j by
    nk and tile_coords twice more: three div.s32 in that loop's PTX, each an instruction sequence on
    sm_90, between one wgmma's retirement and the next one's issue; here none in the K loop but at a
    tile's end)."""
    BK: gl.constexpr = dy_desc.block_type.shape[0]
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    j, tile, kb, pid_m, pid_n = cursor
    tiles = tiles_m * tiles_n
    if tile < tiles:
        _ws.load_operands(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, j % STAGES, kb * BK, pid_m, pid_n)
    j += 1
    kb += 1
    if kb == nk:
        kb = 0
        tile += gl.num_programs(0)
        if tile < tiles:
            pid_m, pid_n = _ws.tile_coords(tile, tiles_m, tiles_n, GROUP_M)
    return j, tile, kb, pid_m, pid_n


@gluon.jit
def stage_tile_state(tile_staging, g_empty, t, pid_m, pid_n, N_STATE: gl.constexpr):
    """The mma_stage tiles' loads (Q8WSConfig), issued by the MMA warp group as it starts tile t (the program's
    t-th) or hands its accumulator over (MMA_STAGE_AT_START, MMA_STAGE_AT_HANDOVER): W [BM, BN] bf16 and each
    state's uint8 codes of the tile by TMA into slot t % 2, counted against st_ready[t % 2], once the epilogue
    has handed slot and g buffer t % 2 back from tile t - 2 (g_empty, which the epilogue arrives on after the
    fence that orders its last reads of the slot, in the generic proxy, before these writes, in the async
    proxy). Rows and columns past M and N arrive as zeros, what load_row_blocks' masked loads give. Why: the
    whole tile's state lands before the epilogue needs it, with no epilogue register in flight and no barrier
    of the epilogue's warps (v38's staging issued the copies from the epilogue, under a barrier of its sixteen
    warps each time)."""
    w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready = tile_staging
    BM: gl.constexpr = w_desc.block_type.shape[0]
    BN: gl.constexpr = w_desc.block_type.shape[1]
    b = t % 2
    mbarrier.wait(g_empty.index(b), ((t // 2) & 1) ^ 1)
    copy_state(w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready, b, pid_m * BM, pid_n * BN, N_STATE)


@gluon.jit
def tile_staged_rows(tile_staging, t, j, scales0, scales1, layout: gl.constexpr, ROWS: gl.constexpr,
                     N_STATE: gl.constexpr):
    """load_row_blocks' values of row sub-tile j (ROWS rows) of the program's t-th tile from slot t % 2 of
    stage_tile_state's (the caller has waited for its st_ready), in ``layout``; its rows' scales as given."""
    _, _, _, st_w, st_c0, st_c1, _ = tile_staging
    b = t % 2
    return read_state(st_w.index(b).slice(j * ROWS, ROWS, dim=0), st_c0.index(b).slice(j * ROWS, ROWS, dim=0),
                      st_c1.index(b).slice(j * ROWS, ROWS, dim=0), scales0, scales1, layout, N_STATE)


@gluon.jit
def mma_self_loaded_tiles(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, g_bufs, g_ready, g_empty, M, N, K, tile_staging,
                          GROUP_M: gl.constexpr, LOAD_CURSOR: gl.constexpr, MMA_STAGE: gl.constexpr,
                          N_STATE: gl.constexpr):
    """Worker (BM / 64 warp groups, as mma_whole_tiles) of the loader-free design: mma_whole_tiles, issuing its
    own TMA loads
    STAGES - 1 K blocks ahead (across tiles) instead of a loader partition's; no empty barriers: block
    i + STAGES - 1 goes into block i - 1's slot once block i - 1's wgmma has retired (the wait that
    leaves one wgmma in flight). The same wgmma chain as gluon_update.mainloop, so the same bits. Why:
    without the loader's warp group (padded to four warps) sixteen epilogue warps fit the SM's
    registers at a launch cap the wgmma accumulator allows (Q8WSConfig). LOAD_CURSOR: the loads'
    coordinates kept by load_and_advance's cursor instead of load_k_block's divisions (a candidate, not
    yet run on a GPU: the same uses into the same slots, so the same protocol). MMA_STAGE: each tile's state
    staged (stage_tile_state) as the tile starts (MMA_STAGE_AT_START) or as its accumulator is handed over
    (MMA_STAGE_AT_HANDOVER)."""
    BK: gl.constexpr = dy_desc.block_type.shape[0]
    BM: gl.constexpr = g_bufs.type.shape[1]
    BN: gl.constexpr = g_bufs.type.shape[2]
    STAGES: gl.constexpr = dy_bufs.type.shape[0]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BM // 16, 1],
                                                         instr_shape=[16, BN, 16])
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    nk = gl.cdiv(K, BK)
    first_m, first_n = _ws.tile_coords(gl.program_id(0), tiles_m, tiles_n, GROUP_M)  # every program has a tile
    cursor = (0, gl.program_id(0), 0, first_m, first_n)
    for j in gl.static_range(STAGES - 1):
        if LOAD_CURSOR:
            cursor = load_and_advance(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, cursor, nk, tiles_m, tiles_n, GROUP_M)
        else:
            load_k_block(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, j, nk, tiles_m, tiles_n, GROUP_M)
    i = 0
    t = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        if MMA_STAGE == MMA_STAGE_AT_START:
            pid_m, pid_n = _ws.tile_coords(tile, tiles_m, tiles_n, GROUP_M)
            stage_tile_state(tile_staging, g_empty, t, pid_m, pid_n, N_STATE)
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_layout)
        for kb in range(0, nk):
            s = i % STAGES
            mbarrier.wait(op_ready.index(s), (i // STAGES) & 1)
            a = dy_bufs.index(s).permute((1, 0))
            b = x_bufs.index(s)
            acc = warpgroup_mma(a, b, acc, is_async=True)
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a, b))
            if LOAD_CURSOR:
                cursor = load_and_advance(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, cursor, nk, tiles_m, tiles_n,
                                          GROUP_M)
            else:
                load_k_block(dy_desc, x_desc, dy_bufs, x_bufs, op_ready, i + STAGES - 1, nk, tiles_m, tiles_n,
                             GROUP_M)
            i += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if MMA_STAGE == MMA_STAGE_AT_HANDOVER:
            pid_m, pid_n = _ws.tile_coords(tile, tiles_m, tiles_n, GROUP_M)
            stage_tile_state(tile_staging, g_empty, t, pid_m, pid_n, N_STATE)  # hand_over's wait then passes
        hand_over(acc, t, g_bufs, g_ready, g_empty)
        t += 1


@gluon.jit
def row_block_addresses(offs_m, offs_n, block, M, N, n_blocks):
    """(offs, in_tile, soffs, smask) of a row sub-tile of one block a row, rows offs_m x columns offs_n,
    block column ``block``: its elements' flat offsets and mask, its rows' offsets into the [M,
    n_blocks] scales and their mask (linear_update.q8_addresses for [R, J] blocks, one scale a row here)."""
    in_tile = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None].to(gl.int64) * N + offs_n[None, :]
    soffs, smask = row_scale_addresses(offs_m, block, M, n_blocks)
    return offs, in_tile, soffs, smask


@gluon.jit
def row_scale_addresses(offs_m, block, M, n_blocks):
    """(soffs, smask): rows offs_m's offsets into the [M, n_blocks] scales at block column ``block`` (one
    block a row: one scale a row), and their mask."""
    return offs_m.to(gl.int64) * n_blocks + block, offs_m < M


@gluon.jit
def load_row_scales(scale_ptr, soffs, smask):
    """A state's fp32 scales at row_scale_addresses' (soffs, smask); rows past M read as 1.0."""
    return gl.load(scale_ptr + soffs, mask=smask, other=1.0)


@gluon.jit
def load_row_blocks(offs_m, offs_n, block, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks,
                    N_STATE: gl.constexpr):
    """What update_loaded_row_blocks reads of a row sub-tile's rows offs_m x columns offs_n (one block
    a row, block column ``block`` of the [M, n_blocks] scales): W widened exactly from bf16, and each
    state's uint8 codes and its rows' fp32 scales (absent states: placeholders, never read)."""
    offs, in_tile, soffs, smask = row_block_addresses(offs_m, offs_n, block, M, N, n_blocks)
    p = _ws._LINEAR.load_f32(w_ptr, offs, in_tile, True)
    codes0 = in_tile
    scales0 = smask
    codes1 = in_tile
    scales1 = smask
    if N_STATE >= 1:
        codes0 = gl.load(c0_ptr + offs, mask=in_tile, other=0)
        scales0 = load_row_scales(scale0_ptr, soffs, smask)
    if N_STATE >= 2:
        codes1 = gl.load(c1_ptr + offs, mask=in_tile, other=0)
        scales1 = load_row_scales(scale1_ptr, soffs, smask)
    return p, codes0, scales0, codes1, scales1


@gluon.jit
def load_scales(offs_m, block, M, scale0_ptr, scale1_ptr, n_blocks, N_STATE: gl.constexpr):
    """(scales0, scales1): load_row_scales of each state of a row sub-tile (absent states: a placeholder).
    load_row_blocks loads them itself, each beside its state's codes: in that order ptxas spills nothing in
    the default tile, which with this function's order spilled 4 B."""
    soffs, smask = row_scale_addresses(offs_m, block, M, n_blocks)
    scales0 = smask
    scales1 = smask
    if N_STATE >= 1:
        scales0 = load_row_scales(scale0_ptr, soffs, smask)
    if N_STATE >= 2:
        scales1 = load_row_scales(scale1_ptr, soffs, smask)
    return scales0, scales1


@gluon.jit
def stage_row_blocks(w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready, u, row0, col0,
                     N_STATE: gl.constexpr):
    """The stage_state candidate's loads (Q8WSConfig; gluon_f32's staged tiles, with fp32 W and states): W
    [ROWS, BN] bf16 and each state's uint8 codes of the row sub-tile at (row0, col0), by TMA, into staging
    slot u % S (S = the slots st_ready counts; the program's u-th sub-tile), counted against st_ready[u % S].
    Rows and columns past M and N arrive as zeros, what load_row_blocks' masked loads give (other=0). The
    slot's last reads (sub-tile u - S's, by every epilogue warp, in the generic proxy) come before the copy's
    writes (the async proxy): each thread's fence orders its own reads, and the barrier of the partition that
    Gluon puts before the copy (one thread issues it) waits for every warp's fence."""
    S: gl.constexpr = st_ready.type.shape[0]
    fence_async_shared()
    copy_state(w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready, u % S, row0, col0, N_STATE)


@gluon.jit
def copy_state(w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready, slot, row0, col0, N_STATE: gl.constexpr):
    """W (bf16) and each state's uint8 codes of the block at (row0, col0), as large as the descriptors' blocks
    (a sub-tile's rows for stage_state, a tile's for mma_stage), by TMA into shared-memory slot ``slot``,
    counted against st_ready[slot]; rows and columns past M and N arrive as zeros."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + N_STATE * c0_desc.block_type.nbytes
    mbarrier.expect(st_ready.index(slot), nbytes)
    _ws.tma_load(w_desc, [row0, col0], st_ready.index(slot), st_w.index(slot))
    if N_STATE >= 1:
        _ws.tma_load(c0_desc, [row0, col0], st_ready.index(slot), st_c0.index(slot))
    if N_STATE >= 2:
        _ws.tma_load(c1_desc, [row0, col0], st_ready.index(slot), st_c1.index(slot))


@gluon.jit
def read_state(w_rows, c0_rows, c1_rows, scales0, scales1, layout: gl.constexpr, N_STATE: gl.constexpr):
    """load_row_blocks' values from shared memory: W widened exactly from the bf16 of ``w_rows`` and each
    state's codes from ``c0_rows``, ``c1_rows`` (views of one sub-tile's rows), in ``layout``; its rows'
    scales as given (absent states: placeholders, never read)."""
    p = _ws._ROUNDING.bf16_to_f32(w_rows.load(layout).to(gl.uint16, bitcast=True))
    codes0 = p
    codes1 = p
    if N_STATE >= 1:
        codes0 = c0_rows.load(layout)
    if N_STATE >= 2:
        codes1 = c1_rows.load(layout)
    return p, codes0, scales0, codes1, scales1


@gluon.jit
def staged_row_blocks(st_w, st_c0, st_c1, st_ready, u, scales0, scales1, layout: gl.constexpr,
                      N_STATE: gl.constexpr):
    """load_row_blocks' values of the program's u-th sub-tile from its staging slot, once its TMA loads
    have landed (staged_slot), in ``layout``; its rows' scales as given."""
    s = staged_slot(st_ready, u)
    return read_state(st_w.index(s), st_c0.index(s), st_c1.index(s), scales0, scales1, layout, N_STATE)


@gluon.jit
def stage_first_row_blocks(staging, first_m, first_n, BM: gl.constexpr, ROWS: gl.constexpr, N_STATE: gl.constexpr):
    """The program's first S sub-tiles (S = the slots st_ready counts; all of its first tile's, whose
    coordinates are given) staged by stage_row_blocks before its loop."""
    w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready = staging
    S: gl.constexpr = st_ready.type.shape[0]
    BN: gl.constexpr = w_desc.block_type.shape[1]
    for a in gl.static_range(S):
        stage_row_blocks(w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready, a, first_m * BM + a * ROWS,
                         first_n * BN, N_STATE)


@gluon.jit
def stage_row_blocks_ahead(staging, u, J: gl.constexpr, pid_m, pid_n, next_m, next_n, BM: gl.constexpr,
                           ROWS: gl.constexpr, SUBTILES: gl.constexpr, N_STATE: gl.constexpr):
    """Once the program's u-th sub-tile (row sub-tile J of tile (pid_m, pid_n)) has been read from its slot:
    sub-tile u + S into that slot (stage_row_blocks), row sub-tile J + S of this tile or, past its last, of the
    next one (next_m, next_n)."""
    w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready = staging
    S: gl.constexpr = st_ready.type.shape[0]
    BN: gl.constexpr = w_desc.block_type.shape[1]
    if J + S < SUBTILES:
        stage_row_blocks(w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready, u + S, pid_m * BM + (J + S) * ROWS,
                         pid_n * BN, N_STATE)
    else:
        stage_row_blocks(w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready, u + S,
                         next_m * BM + (J + S - SUBTILES) * ROWS, next_n * BN, N_STATE)


@gluon.jit
def drain_staging(st_ready, u):
    """After the program's u sub-tiles: the S copies staged past its last tile (never read) waited for, so that
    no copy into its shared memory outlives it."""
    S: gl.constexpr = st_ready.type.shape[0]
    for a in gl.static_range(S):
        mbarrier.wait(st_ready.index((u + a) % S), ((u + a) // S) & 1)


@gluon.jit
def staged_slot(st_ready, u):
    """The staging slot of the program's u-th sub-tile (u % S, S = the slots st_ready counts), once
    stage_row_blocks' TMA loads into it have landed (phase (u // S) & 1 of st_ready[u % S])."""
    S: gl.constexpr = st_ready.type.shape[0]
    s = u % S
    mbarrier.wait(st_ready.index(s), (u // S) & 1)
    return s


@gluon.jit
def update_loaded_row_blocks(g, loaded, offs_m, offs_n, block, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr,
                             n_blocks, h, grad_scale, rand_bits, GUARDED_UPDATE: gl.constexpr, N_STATE: gl.constexpr):
    """The 8bit epilogue on a row sub-tile g [R, QBLOCK] of one block a row whose state load_row_blocks
    loaded: kernels/linear_update.py's update_rows_q8 (load_q8, update_in_place_q8, telemetry_terms)
    step for step, with this tile's addressing (q8_addresses' there: a scale per row here, not [R, J])
    and the block functions on the last axis (quant8's quantize_blocks_sr and dequantize_blocks, which
    quantize_block_sr and dequantize call on [R, J, QBLOCK]): W bf16, stored with stochastic rounding
    (slice r_p); state 0 signed E4M3 codes (slice r_m24), state 1 unsigned E5M3 codes (slice r_v24),
    each under its block's power-of-two scale; rand_bits = (r_p, r_m24, r_v24), the sub-tile's slices
    (row_block_rounding_bits). Returns its telemetry terms."""
    r_p, r_m24, r_v24 = rand_bits
    offs, in_tile, soffs, smask = row_block_addresses(offs_m, offs_n, block, M, N, n_blocks)
    p, codes0, scales0, codes1, scales1 = loaded
    s0 = p
    s1 = p
    if N_STATE >= 1:
        s0 = _ws._QUANT8.dequantize_blocks(codes0, scales0, True)
    if N_STATE >= 2:
        s1 = _ws._QUANT8.dequantize_blocks(codes1, scales1, False)
    p, s0, s1, finite = GUARDED_UPDATE(p, g, s0, s1, h, grad_scale)
    _ws._LINEAR.store_f32(w_ptr, offs, in_tile, p, r_p, True)
    if N_STATE >= 1:
        new_codes0, new_scales0 = _ws._QUANT8.quantize_blocks_sr(s0.to(gl.uint32, bitcast=True), r_m24, True)
        gl.store(c0_ptr + offs, new_codes0.to(gl.uint8), mask=in_tile)
        gl.store(scale0_ptr + soffs, new_scales0, mask=smask)
    if N_STATE >= 2:
        new_codes1, new_scales1 = _ws._QUANT8.quantize_blocks_sr(s1.to(gl.uint32, bitcast=True), r_v24, False)
        gl.store(c1_ptr + offs, new_codes1.to(gl.uint8), mask=in_tile)
        gl.store(scale1_ptr + soffs, new_scales1, mask=smask)
    return _ws._LINEAR.telemetry_terms(g, in_tile, finite)


@gluon.jit
def row_block_rounding_bits(offs_m, col0, seed, rand_stride, rand_base, layout: gl.constexpr,
                            RAND_PAIRS: gl.constexpr, num_warps: gl.constexpr):
    """The 8bit table's slices (r_p, r_m24, r_v24) of a row sub-tile [R, BN] in ``layout`` (q8_epilogue's:
    4 consecutive columns a thread), rows offs_m, columns col0 + [0, BN): element (r, c) has Philox counter
    n = r rand_stride + c + rand_base and draws call n >> 1, words (c0, c1) if n is even, (c2, c3) if odd
    (kernels/random.py's table). RAND_PAIRS (the launch's when rand_stride and rand_base are even, so that
    each row's counters start even and a thread's columns 2k, 2k + 1 are one pair): each call once, on the
    sub-tile's [R, BN / 2] pairs, its words joined to both elements' registers (a join and a reshape that
    keep every value in its thread: no data moves); else each element's own call (random.py's
    q8_rounding_bits). The same bits either way."""
    R: gl.constexpr = offs_m.shape[0]
    BN: gl.constexpr = _QBLOCK  # a row sub-tile is one block a row
    if RAND_PAIRS:
        # the pairs two to a thread where the elements are four: the join's new axis is a thread's
        # consecutive pair of elements, which the reshape lays back on the columns
        pairs: gl.constexpr = gl.BlockedLayout([R // num_warps, BN // 64], [1, 32], [num_warps, 1], [1, 0])
        rows = gl.convert_layout(offs_m, gl.SliceLayout(1, pairs))
        row_pair0 = (rows.to(gl.int64) * rand_stride + rand_base) >> 1
        pair_cols = col0 // 2 + gl.arange(0, BN // 2, layout=gl.SliceLayout(0, pairs))
        counters = row_pair0[:, None] + pair_cols[None, :]
        c0, c1, c2, c3 = _ws._RANDOM.philox4x32_10(seed, counters)
        a = gl.convert_layout(gl.reshape(gl.join(c0, c2), [R, BN]), layout)
        b = gl.convert_layout(gl.reshape(gl.join(c1, c3), [R, BN]), layout)
        bits = _ws._RANDOM.q8_slices(a, b)
    else:
        offs_n = col0 + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        n = offs_m[:, None].to(gl.int64) * rand_stride + offs_n[None, :] + rand_base
        # random.py's q8_rounding_bits without its tl.randint4x branch (FORGE_NUM_PHILOX_WIDE=0), which
        # Gluon lacks: philox4x32_10 gives tl.randint4x's words either way
        c0, c1, c2, c3 = _ws._RANDOM.philox4x32_10(seed, n >> 1)
        bits = _ws._RANDOM.q8_half_slices(n, c0, c1, c2, c3)
    return bits


@gluon.constexpr_function
def row_subtile_layout(ROWS, BN, num_warps):
    """The epilogue's layout of a row sub-tile [ROWS, BN] of g: a warp a row, BN / 32 consecutive columns a thread
    (4 for BN = 128: 16-byte shared-memory reads of g), warps stacked on the rows (q8_epilogue, gluon_f32)."""
    return gl.BlockedLayout([ROWS // num_warps, BN // 32], [1, 32], [num_warps, 1], [1, 0])


@gluon.jit
def add_subtile_telemetry(sq, bad, sq_j, bad_j):
    """(sq + sq_j, bad + bad_j): a row sub-tile's telemetry terms added to its tile's, element by element, here and
    not later. The sums pass through a non-pure inline asm (two moves, which ptxas removes) because it is ordered
    against the sub-tile's stores: Triton 3.9 otherwise sinks every sub-tile's terms below the tile's last stores
    (one popcount of 64 packed flags, the fp64 squares after the loop), keeping each thread's g values of all
    sub-tiles live, and v47's AdamW spilled 228 B a thread (none with the pin). Triton 3.6 sinks some of them too:
    its 128-row tiles with 16-row sub-tiles spilled 200-252 B for AdamW, none with the pin (bench/NOTES.md,
    session 43)."""
    return gl.inline_asm_elementwise("mov.b64 $0, $2; mov.b32 $1, $3;", "=l,=r,l,r", [sq + sq_j, bad + bad_j],
                                     dtype=(gl.float64, gl.int32), is_pure=False, pack=1)


@gluon.jit
def store_tile_telemetry(sq, bad, pid_m, pid_n, tiles_n, norm_sq_ptr, nonfinite_ptr):
    """A tile's telemetry terms (sq, bad: its sub-tiles' terms summed element by element) reduced into its slot
    pid_m * tiles_n + pid_n."""
    slot = pid_m * tiles_n + pid_n
    gl.store(norm_sq_ptr + slot, gl.sum(gl.sum(sq, axis=1), axis=0))
    gl.store(nonfinite_ptr + slot, gl.sum(gl.sum(bad, axis=1), axis=0))


@gluon.jit
def q8_epilogue(g_bufs, g_ready, g_empty, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h, grad_scale,
                seed, rand_stride, rand_base, norm_sq_ptr, nonfinite_ptr, staging, GUARDED_UPDATE: gl.constexpr,
                N_STATE: gl.constexpr, ROWS: gl.constexpr, GROUP_M: gl.constexpr, PREFETCH: gl.constexpr,
                STAGE_STATE: gl.constexpr, MMA_STAGE: gl.constexpr, RAND_PAIRS: gl.constexpr,
                num_warps: gl.constexpr):
    """Default partition: per tile, its BM / ROWS row sub-tiles of g from g buffer t % 2, each's state
    loaded (load_row_blocks) and updated (update_loaded_row_blocks; the buffer handed back once the
    last sub-tile of g is in registers); the sub-tiles' telemetry terms added element by element, in
    order, then reduced into the tile's slot pid_m * tiles_n + pid_n (the Triton 8bit epilogue's order).
    PREFETCH: each sub-tile's state loaded one sub-tile ahead (the first before the wait for g), so
    that its loads' latency passes under the previous sub-tile's update (a candidate: with eight
    epilogue warps an SM, two a scheduler, little else hides it). STAGE_STATE: instead, W and the codes
    by TMA into STAGING_SLOTS shared-memory slots (staging = (w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1,
    st_ready)): the program's first sub-tiles before its loop, then after each sub-tile u's update the one
    STAGING_SLOTS ahead (this tile's, or its next tile's first) into the slot u has read; the scales by
    pointer one sub-tile ahead. No register holds W or the codes in flight. MMA_STAGE: W and the codes of the
    whole tile staged by the MMA warp group (stage_tile_state; staging its descriptors, slots and st_ready),
    read from shared memory sub-tile by sub-tile (tile_staged_rows); the slot handed back with the g buffer;
    the scales by pointer one sub-tile ahead. The same values every way."""
    BM: gl.constexpr = g_bufs.type.shape[1]
    BN: gl.constexpr = g_bufs.type.shape[2]
    SUBTILES: gl.constexpr = BM // ROWS
    gl.static_assert(SUBTILES * ROWS == BM, "ROWS must divide BM")
    gl.static_assert(ROWS % num_warps == 0, "each epilogue warp takes whole rows of a sub-tile")
    # a warp a row of one 128-column block (8-byte loads of W, 4-byte loads of the codes)
    epi: gl.constexpr = row_subtile_layout(ROWS, BN, num_warps)
    rows: gl.constexpr = gl.SliceLayout(1, epi)
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    tiles = tiles_m * tiles_n
    _, _, _, st_w, st_c0, st_c1, st_ready = staging
    u = 0  # the program's sub-tiles so far (STAGE_STATE: the staging slots' uses)
    if STAGE_STATE or MMA_STAGE:
        first_m, first_n = _ws.tile_coords(gl.program_id(0), tiles_m, tiles_n, GROUP_M)  # every program has one
    if STAGE_STATE:
        gl.static_assert(SUBTILES >= STAGING_SLOTS, "a tile's sub-tiles cover the staging distance")
        stage_first_row_blocks(staging, first_m, first_n, BM, ROWS, N_STATE)
    if STAGE_STATE or MMA_STAGE:
        next_scales = load_scales(first_m * BM + gl.arange(0, ROWS, layout=rows), first_n, M, scale0_ptr, scale1_ptr,
                                  n_blocks, N_STATE)
    t = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        pid_m, pid_n = _ws.tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        b = t % 2
        offs_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, epi))
        if STAGE_STATE or MMA_STAGE:
            # the tile after this one, whose first sub-tiles this one's last stage (MMA_STAGE: whose first
            # scales it loads); after the program's last tile this one again (unconditional copies: a branch
            # around them cost ptxas ~350 B of spills at 96 registers), waited for after the loop
            following = tile + gl.num_programs(0)
            next_m, next_n = _ws.tile_coords(gl.where(following < tiles, following, tile), tiles_m, tiles_n, GROUP_M)
        if PREFETCH:
            loaded = load_row_blocks(pid_m * BM + gl.arange(0, ROWS, layout=rows), offs_n, pid_n, M, N, w_ptr,
                                     c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, N_STATE)
        mbarrier.wait(g_ready.index(b), (t // 2) & 1)
        if MMA_STAGE:
            mbarrier.wait(st_ready.index(b), (t // 2) & 1)
        sq = gl.zeros((ROWS, BN), dtype=gl.float64, layout=epi)
        bad = gl.zeros((ROWS, BN), dtype=gl.int32, layout=epi)
        for j in gl.static_range(SUBTILES):
            # the random bits first, while the registers hold little else (after the rule, the rounds'
            # temporaries beside the state spilled 228 B at 96 registers, against 92 here)
            rand_bits = row_block_rounding_bits(pid_m * BM + j * ROWS + gl.arange(0, ROWS, layout=rows), pid_n * BN,
                                                seed, rand_stride, rand_base, epi, RAND_PAIRS, num_warps)
            g = g_bufs.index(b).slice(j * ROWS, ROWS, dim=0).load(epi)
            if j == SUBTILES - 1 and not MMA_STAGE:
                mbarrier.arrive(g_empty.index(b), count=1)  # g is in registers: the MMA warps may refill it
            offs_m = pid_m * BM + j * ROWS + gl.arange(0, ROWS, layout=rows)
            if MMA_STAGE:
                scales0, scales1 = next_scales
                loaded = tile_staged_rows(staging, t, j, scales0, scales1, epi, ROWS, N_STATE)
                if j == SUBTILES - 1:
                    # g and the slot's state are in registers: the MMA warps may refill both (its TMA writes
                    # after these reads: the fence orders each thread's reads before the async proxy's writes)
                    fence_async_shared()
                    mbarrier.arrive(g_empty.index(b), count=1)
            elif STAGE_STATE:
                scales0, scales1 = next_scales
                loaded = staged_row_blocks(st_w, st_c0, st_c1, st_ready, u, scales0, scales1, epi, N_STATE)
            elif PREFETCH:
                if j + 1 < SUBTILES:
                    ahead = load_row_blocks(offs_m + ROWS, offs_n, pid_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr,
                                            scale1_ptr, n_blocks, N_STATE)
            else:
                loaded = load_row_blocks(offs_m, offs_n, pid_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr,
                                         n_blocks, N_STATE)
            sq_j, bad_j = update_loaded_row_blocks(
                g, loaded, offs_m, offs_n, pid_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h,
                grad_scale, rand_bits, GUARDED_UPDATE, N_STATE)
            if PREFETCH:
                if j + 1 < SUBTILES:
                    loaded = ahead
            if STAGE_STATE:
                # sub-tile u + STAGING_SLOTS into the slot this one's update has read (u's): this tile's, or
                # the next's; it lands while the next sub-tile is updated
                stage_row_blocks_ahead(staging, u, j, pid_m, pid_n, next_m, next_n, BM, ROWS, SUBTILES, N_STATE)
            if STAGE_STATE or MMA_STAGE:
                if j + 1 < SUBTILES:
                    next_scales = load_scales(offs_m + ROWS, pid_n, M, scale0_ptr, scale1_ptr, n_blocks, N_STATE)
                else:
                    next_scales = load_scales(next_m * BM + gl.arange(0, ROWS, layout=rows), next_n, M, scale0_ptr,
                                              scale1_ptr, n_blocks, N_STATE)
            sq, bad = add_subtile_telemetry(sq, bad, sq_j, bad_j)
            u += 1
        store_tile_telemetry(sq, bad, pid_m, pid_n, tiles_n, norm_sq_ptr, nonfinite_ptr)
        t += 1
    if STAGE_STATE:
        drain_staging(st_ready, u)


@gluon.jit
def invalidate_rings(op_ready, op_empty, g_ready, g_empty):
    """allocate_rings' barriers invalidated, after the partitions have joined (gluon_update.invalidate_barriers
    says why)."""
    _ws.invalidate_barriers(op_ready)
    _ws.invalidate_barriers(op_empty)
    _ws.invalidate_barriers(g_ready)
    _ws.invalidate_barriers(g_empty)


@gluon.jit
def allocate_rings(dy_desc, x_desc, STAGES: gl.constexpr, G_BUFS: gl.constexpr):
    """(dy_bufs, x_bufs, g_bufs, op_ready, op_empty, g_ready, g_empty): the split design's shared memory, its
    barriers initialized: STAGES operand slots of dY's and X's K blocks, G_BUFS g buffers [BM, BN] fp32 (BM, BN
    the descriptors' blocks), a ready and an empty barrier for each."""
    BM: gl.constexpr = dy_desc.block_type.shape[1]
    BN: gl.constexpr = x_desc.block_type.shape[1]
    dy_bufs = gl.allocate_shared_memory(dy_desc.dtype, [STAGES] + dy_desc.block_type.shape, dy_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    g_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.float32)
    g_bufs = gl.allocate_shared_memory(gl.float32, [G_BUFS, BM, BN], g_layout)
    op_ready, op_empty = _ws.barrier_pairs(STAGES)
    g_ready, g_empty = _ws.barrier_pairs(G_BUFS)
    return dy_bufs, x_bufs, g_bufs, op_ready, op_empty, g_ready, g_empty


@gluon.jit
def allocate_staging(w_desc, c0_desc, c1_desc, SLOTS: gl.constexpr, N_STATE: gl.constexpr):
    """(st_w, st_c0, st_c1, st_ready): SLOTS shared-memory slots of W's block and of each of the N_STATE states'
    blocks (each descriptor's block shape, dtype and layout; an absent state's slots are the one before it,
    never written), and a barrier a slot, for stage_row_blocks and stage_tile_state."""
    st_w = gl.allocate_shared_memory(w_desc.dtype, [SLOTS] + w_desc.block_type.shape, w_desc.layout)
    st_c0 = st_w
    st_c1 = st_w
    if N_STATE >= 1:
        st_c0 = gl.allocate_shared_memory(c0_desc.dtype, [SLOTS] + c0_desc.block_type.shape, c0_desc.layout)
        st_c1 = st_c0
    if N_STATE >= 2:
        st_c1 = gl.allocate_shared_memory(c1_desc.dtype, [SLOTS] + c1_desc.block_type.shape, c1_desc.layout)
    st_ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(SLOTS):
        mbarrier.init(st_ready.index(b), count=1)
    return st_w, st_c0, st_c1, st_ready


# seed, rand_stride, rand_base typed and not specialized (gluon_update's kernel says why)
@gluon.jit(do_not_specialize=["seed", "rand_stride", "rand_base"])
def fused_linear_update_q8_ws_kernel(dy_desc, x_desc, w_desc, c0_desc, c1_desc, w_ptr, c0_ptr, scale0_ptr, c1_ptr,
                                     scale1_ptr, norm_sq_ptr, nonfinite_ptr, n_blocks, M, N, K, h, grad_scale,
                                     seed: tl.uint64, rand_stride: tl.int64, rand_base: tl.int64, step_slot,
                                     GUARDED_UPDATE: gl.constexpr, N_STATE: gl.constexpr, STAGES: gl.constexpr,
                                     ROWS: gl.constexpr, GROUP_M: gl.constexpr, MMA_REGS: gl.constexpr,
                                     SELF_LOAD: gl.constexpr, LOAD_CURSOR: gl.constexpr, PREFETCH: gl.constexpr,
                                     STAGE_STATE: gl.constexpr, MMA_STAGE: gl.constexpr, RAND_PAIRS: gl.constexpr,
                                     num_warps: gl.constexpr):
    """The operand ring, the double-buffered g and their barriers, then the three partitions (module
    docstring). dy_desc [K, M] block [BK, BM], x_desc [K, N] block [BK, BN]; w_ptr the bf16 weight
    [M, N]; c0/c1_ptr the states' uint8 codes [M, N], scale0/scale1_ptr their fp32 block scales
    [M, n_blocks] (N_STATE of them; the others any pointer, never read); step_slot None, or where h,
    grad_scale and seed are read when the kernel runs (linear_update.step_scalars). STAGE_STATE: w_desc,
    c0_desc, c1_desc the weight's and the states' codes' descriptors in blocks [ROWS, BN] (c1_desc None
    for one state), and two staging slots of each in shared memory (q8_epilogue); MMA_STAGE: the same in
    blocks [BM, BN], two tile slots of each (stage_tile_state); else all three None.
    RAND_PAIRS: rand_stride and rand_base are even (row_block_rounding_bits)."""
    h, grad_scale, seed = _ws._LINEAR.step_scalars(step_slot, h, grad_scale, seed)
    dy_bufs, x_bufs, g_bufs, op_ready, op_empty, g_ready, g_empty = allocate_rings(dy_desc, x_desc, STAGES, 2)
    staging = (w_desc, c0_desc, c1_desc, None, None, None, None)
    if STAGE_STATE or MMA_STAGE:
        slots: gl.constexpr = STAGING_SLOTS if STAGE_STATE else 2  # MMA_STAGE: a slot a g buffer
        st_w, st_c0, st_c1, st_ready = allocate_staging(w_desc, c0_desc, c1_desc, slots, N_STATE)
        staging = (w_desc, c0_desc, c1_desc, st_w, st_c0, st_c1, st_ready)
    # (the epilogue partition's entry is written out in both branches: a tuple holding a jit function
    # cannot be a variable in Gluon)
    if SELF_LOAD:
        gl.warp_specialize([
            (q8_epilogue, (g_bufs, g_ready, g_empty, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks,
                           h, grad_scale, seed, rand_stride, rand_base, norm_sq_ptr, nonfinite_ptr, staging,
                           GUARDED_UPDATE, N_STATE, ROWS, GROUP_M, PREFETCH, STAGE_STATE, MMA_STAGE, RAND_PAIRS,
                           num_warps)),
            (mma_self_loaded_tiles, (dy_desc, x_desc, dy_bufs, x_bufs, op_ready, g_bufs, g_ready, g_empty, M, N, K,
                                     staging, GROUP_M, LOAD_CURSOR, MMA_STAGE, N_STATE)),
        ], [4], [MMA_REGS])
    else:
        gl.warp_specialize([
            (q8_epilogue, (g_bufs, g_ready, g_empty, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks,
                           h, grad_scale, seed, rand_stride, rand_base, norm_sq_ptr, nonfinite_ptr, staging,
                           GUARDED_UPDATE, N_STATE, ROWS, GROUP_M, PREFETCH, STAGE_STATE, MMA_STAGE, RAND_PAIRS,
                           num_warps)),
            (_ws.operand_loader, (dy_desc, x_desc, dy_bufs, x_bufs, op_ready, op_empty, M, N, K, GROUP_M)),
            (mma_whole_tiles, (dy_bufs, x_bufs, op_ready, op_empty, g_bufs, g_ready, g_empty, M, N, K, GROUP_M)),
        ], [1, 4], [24, MMA_REGS])
    invalidate_rings(op_ready, op_empty, g_ready, g_empty)
    if STAGE_STATE or MMA_STAGE:
        _ws.invalidate_barriers(staging[6])  # st_ready


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


class Q8WSConfig(_ws.ValueConfig):
    """The 8bit warp-specialized tile: BM x BN output tiles (BM = 64: one MMA warp group; BN = QBLOCK:
    one block a row), K blocks of BK in STAGES operand slots, num_warps epilogue warps on row sub-tiles
    of ROWS rows, the MMA warp group's registers (setmaxnreg) and the launch's register cap, GROUP_M
    tile rows per group; one program an SM (the operand ring and the two g buffers: 136 KB)."""

    __slots__ = ("BM", "BN", "BK", "STAGES", "ROWS", "GROUP_M", "num_warps", "mma_registers", "max_registers",
                 "self_load", "load_cursor", "prefetch", "stage_state", "mma_stage")

    def __init__(self, BM=64, BN=128, BK=64, STAGES=3, ROWS=16, GROUP_M=8, num_warps=8, mma_registers=104,
                 max_registers=128, self_load=False, load_cursor=False, prefetch=False, stage_state=False,
                 mma_stage=False):
        if BM != 64 or BN != QBLOCK:
            raise ValueError(f"Q8WSConfig: BM must be 64 (one MMA warp group) and BN {QBLOCK} (one block a row), "
                             f"got {BM}x{BN}")
        if STAGES < 2 or BK % 16:
            raise ValueError(f"Q8WSConfig: at least 2 operand stages (a K block is loaded while the one before "
                             f"it is multiplied) and K blocks of a multiple of 16, got STAGES={STAGES}, BK={BK}")
        if num_warps not in (4, 8, 16) or ROWS % num_warps:
            raise ValueError(f"Q8WSConfig: 4, 8 or 16 epilogue warps, dividing the sub-tile's {ROWS} rows (whole rows "
                             f"a warp), got {num_warps}")
        if ROWS % 8 or BM % ROWS:
            raise ValueError(f"Q8WSConfig: sub-tiles of a multiple of 8 rows (a slice of the swizzled g buffer) "
                             f"dividing BM = {BM}, got {ROWS}")
        # warps: the epilogue's, the MMA warp group, and (unless the MMA warps load) the loader's group,
        # one warp padded to four
        warps = num_warps + 4 + (0 if self_load else 4)
        if max_registers * 32 * warps > 65536:
            raise ValueError(f"Q8WSConfig: {max_registers} registers a thread at launch for {warps} warps exceed "
                             "the SM's 65536")
        if load_cursor and not self_load:
            raise ValueError("Q8WSConfig: load_cursor keeps the self-loading MMA warps' load coordinates "
                             "(self_load=True)")
        if mma_stage not in (0, 1, 2):
            raise ValueError(f"Q8WSConfig: mma_stage is 0 (none), 1 (at a tile's start) or 2 (at its hand-over), "
                             f"got {mma_stage!r}")
        if prefetch + stage_state + bool(mma_stage) > 1:
            raise ValueError("Q8WSConfig: prefetch (into registers), stage_state (into shared memory, by the epilogue) "
                             "and mma_stage (into shared memory, by the MMA warps) are ways of loading the state "
                             "ahead; choose one")
        if mma_stage and not self_load:
            raise ValueError("Q8WSConfig: mma_stage has the self-loading MMA warps issue the state's copies "
                             "(self_load=True)")
        self.self_load, self.load_cursor = self_load, load_cursor
        self.prefetch, self.stage_state, self.mma_stage = prefetch, stage_state, mma_stage
        self.BM, self.BN, self.BK, self.STAGES, self.ROWS, self.GROUP_M = BM, BN, BK, STAGES, ROWS, GROUP_M
        self.num_warps, self.mma_registers, self.max_registers = num_warps, mma_registers, max_registers
        self.check_shared_memory()

    @property
    def label(self) -> str:
        return (f"ws8 {self.BM}x{self.BN}x{self.BK} st{self.STAGES} w{self.num_warps} rows{self.ROWS}"
                + (f" g{self.GROUP_M}" if self.GROUP_M != 8 else "")
                + f" mma{self.mma_registers} r{self.max_registers}" + (" sl" if self.self_load else "")
                + (" cur" if self.load_cursor else "") + (" pf" if self.prefetch else "")
                + (" stg" if self.stage_state else "") + ("", " ms", " msh")[self.mma_stage])

    def shared_bytes(self, n_state: int = 2) -> int:
        """Shared memory of one program: the operand ring, the two g buffers and (stage_state) the staging
        slots of a sub-tile's W (bf16) and its n_state states' codes (uint8), or (mma_stage) two slots of a
        tile's, barriers aside."""
        staging = int(STAGING_SLOTS.value) * self.ROWS * self.BN * (2 + n_state) if self.stage_state else 0
        staging += 2 * self.BM * self.BN * (2 + n_state) if self.mma_stage else 0
        return self.STAGES * self.BK * (self.BM + self.BN) * 2 + 2 * self.BM * self.BN * 4 + staging


# ptxas (sm_90, Triton 3.6, AdamW): eight epilogue warps on 16-row sub-tiles (8 elements a thread)
# with the MMA warp group at 104 registers spill nothing; at 152 the epilogue spilled 140 B, on 8-row
# sub-tiles 340 B (their g reads hoisted together), on 32-row 1.2 KB, and 16 epilogue warps (80
# registers at launch) did not compile.
# Four operand stages, not three: 0.96-1.01x the three-stage tile's time on the six shapes timed at 256,
# 1024 and 4096 tokens (session 23, calls 2-3), bit-exact alike; the training steps of calls 3-4 ran
# with three.
DEFAULT_Q8_WS_CONFIG = Q8WSConfig(STAGES=4)
# The loader-free design (mma_self_loaded_tiles) with sixteen epilogue warps: 20 warps at 96 registers
# (the epilogue gets 112 and spills 44 B for AdamW, ptxas of Triton 3.6 as the launch specializes it; 104 B
# counted before session 39 without the specialization), because call 2 found eight
# epilogue warps an SM the bound below 4096 tokens. Call 4 (H200): 0.77x the default's time at 256 and
# 1024 tokens on 4096x14336, 0.73-0.77x on 2048x8192, but 1.38x at 4096, where its mainloop falls
# behind the loader partition's: each K block's load, issued between one wgmma's retirement and the
# next one's issue, runs load_k_block's three integer divisions (the PTX of that loop) and four
# warp-group barriers (one before each mbarrier operation and TMA copy) on that path.
WIDE_EPILOGUE_CONFIG = Q8WSConfig(num_warps=16, self_load=True, max_registers=96, mma_registers=96)
# candidates measured beside them (bench/kernels.py --precision 8bit: "ws8 ..." labels): three and two
# operand stages (session 23, call 2: two starve the mainloop at 4096 tokens, 1.8x; three 1.00-1.04x
# four's time); the loader-free design with the default's eight epilogue warps (12 warps at 168 registers,
# no spill; call 4: 0.98-1.02x the default at 256-1024 tokens, 1.33-1.36x at 4096).
# The sixteen-warp tile with load_and_advance's cursor (session 23): each K block's load without the three
# integer divisions load_k_block runs between one wgmma's retirement and the next one's issue, which by the
# PTX were the sixteen-warp tile's 1.38x at 4096 tokens (call 4). Session 30, call 2 (H100, 2048 tokens,
# AdamW): 0.81-0.84x the Triton 8bit tile's time on 4096x4096, 14336x4096 and 4096x14336, 0.96x on
# 1024x4096; the sixteen-warp tile without it 0.94-0.98x.
CURSOR_CONFIG = Q8WSConfig(num_warps=16, self_load=True, load_cursor=True, max_registers=96, mma_registers=96)
# The cursor with four operand stages (the default's ring), written after session 30's call 3 found the cursor
# at 1.10-1.12x the default's time at 4096 tokens, its self-loading mainloop behind. Session 31 (H100): at 3072
# tokens 0.90-0.92x the cursor's time, at 4096 0.92-0.95x the default's; at 2048 1.01-1.03x the cursor's. The
# same spills as the cursor (ptxas of Triton 3.6).
DEEP_CURSOR_CONFIG = Q8WSConfig(num_warps=16, STAGES=4, self_load=True, load_cursor=True, max_registers=96,
                                mma_registers=96)
# The cursor with K blocks of 128 (v42, session 32). Why: ncu's source page of the paired cursor at 14336x4096,
# 2048 tokens (H100, session 32) put ~45 of its 255 thread instructions an element in the MMA warp group, paid
# once a K block: the descriptors' uniform arithmetic around each K block's four HGMMA (~30 a warp), the two
# TMA copies (each after a warp-group barrier) and the ring's waits; they take issue slots from the epilogue's
# warps on the same schedulers. K blocks of 128 pay them half as often (three stages: 144 KB of operands and
# 64 KB of g, as many K elements in flight as six stages of 64). ptxas (Triton 3.6, AdamW): the cursor's 96 B
# of spills. Launched only where K is a multiple of 128 (twin_k_blocks; config_for routes it only there).
# Session 33 (H100): at 4096 tokens 0.93-0.97x the deep cursor's time on 4096x14336, 14336x4096 and 4096x4096;
# at 3072 0.96-1.02x; at 2048 0.98-1.01x the cursor's (predicted 0.95-0.97x: the MMA side was not the bound).
K128_CURSOR_CONFIG = Q8WSConfig(num_warps=16, BK=128, STAGES=3, self_load=True, load_cursor=True, max_registers=96,
                                mma_registers=96)
# v44: the deep cursor with each tile's W and codes staged by the MMA warp group as the tile starts
# (stage_tile_state), so that they land during its mainloop. Why: ncu's source page of the cursor at
# 14336x4096, 2048 tokens (H100, session 34): 52% of the issue rate, the long scoreboard the first stall
# (24% of the samples), 14% of all on the dequantization's first use of the codes' loads; issuing those loads
# earlier in the epilogue's registers spilled 328-356 B at 96 registers (ptxas), and v38 staged them from the
# epilogue under a barrier of its sixteen warps a sub-tile. ptxas (Triton 3.6, as launched): AdamW spills 76 B
# (the cursor's 44; 124 and 96 counted before session 39 without the launch's specialization), 230 KB of shared
# memory. Session 34 (H100, bench/results/2026-12-06-s34/call3-5): every 8bit
# case exact; at 1024 tokens 0.87-0.89x the cursor's time (the routed sixteen-warp tile's there), at 2048
# 0.91-0.94x the cursor's on 4096x14336, 14336x4096 and 4096x4096 (1.02x on the 128256x4096 head, 0.92x on
# 1024x4096), at 3072 0.96-1.02x the deep cursor's, at 4096 1.01-1.03x. Llama-8B's 1x2048 step (captured)
# 0.986x the routed one with it forced.
MMA_STAGED_CONFIG = Q8WSConfig(num_warps=16, STAGES=4, self_load=True, load_cursor=True, max_registers=96,
                               mma_registers=96, mma_stage=1)
Q8_WS_CANDIDATE_CONFIGS = (
    Q8WSConfig(STAGES=3),
    Q8WSConfig(STAGES=2),
    Q8WSConfig(self_load=True, max_registers=168),
    WIDE_EPILOGUE_CONFIG,
    CURSOR_CONFIG,
    DEEP_CURSOR_CONFIG,
    # the default with each sub-tile's state loaded one sub-tile ahead (q8_epilogue's PREFETCH): AdamW spills
    # 164 B for it (none without), SGD none; session 30, call 2: 0.88-0.91x the Triton tile at 2048 tokens on
    # the large shapes (the default 0.97-1.01x), behind the cursor's 0.81-0.84x. (The cursor with PREFETCH
    # spills 540 B for AdamW at its 96 registers: not kept.)
    Q8WSConfig(STAGES=4, prefetch=True),
    # v38 (session 31): the state of the next sub-tile staged by TMA into shared memory (q8_epilogue's
    # STAGE_STATE). Why: ncu on the cursor tile at 14336x4096, 2048 tokens (H100, session 31): 52% of the
    # issue rate, 5 warps a scheduler, and the epilogue's first stalls the long scoreboard of the byte
    # extraction (PRMT) from the codes' loads and W's (~14% of the samples): their latency exposed
    # sub-tile by sub-tile. Staging holds no register in flight (the register prefetch spilled 540 B). Session
    # 31, call 2 (H100): bit-exact (33 cases), but slower: the staged cursor 1.03-1.10x the unstaged one's time
    # at 1024-4096 tokens, the staged default 1.07-1.14x the default's (four partition barriers a sub-tile
    # keep the sixteen warps in step, and ptxas spills more).
    Q8WSConfig(num_warps=16, STAGES=4, self_load=True, load_cursor=True, max_registers=96, mma_registers=96,
               stage_state=True),
    Q8WSConfig(STAGES=4, stage_state=True),
    K128_CURSOR_CONFIG,
    # v44's cursor with three stages (session 34, H100: at 1024 tokens 0.87-0.88x the cursor, at 2048 0.93-1.00x,
    # as the deep one within 1-2% on five shapes; but Llama-8B's 1x2048 step 1.02x the routed one, twice)
    Q8WSConfig(num_warps=16, self_load=True, load_cursor=True, max_registers=96, mma_registers=96, mma_stage=1),
    MMA_STAGED_CONFIG,
    # the staged deep cursor with the copies issued at the hand-over (MMA_STAGE_AT_HANDOVER), for 3072-4096 tokens,
    # where staging at the tile's start lost what it saved (session 34): written after the session's last call
    Q8WSConfig(num_warps=16, STAGES=4, self_load=True, load_cursor=True, max_registers=96, mma_registers=96,
               mma_stage=2),
    # v49 (session 40, CPU; timed in session 41): the routed staged cursor (1024-3583 tokens) with groups of 16
    # and 32 tile rows (GROUP_M, 8 before), as gluon_f32's v49 (why there). The 8bit state is ~8 B an element
    # (the bf16 weight and two 1-byte codes, read and written), so the operands' re-reads weigh more:
    # bench/tile_order_model.py --state-bytes 8 gives, at 4096x14336 and 2048 tokens (Llama-8B's down
    # projection at 1x2048), 487 MB of operand reads with GROUP_M = 8, 252 with 16, 134 with 32, against 470 MB
    # of state and 75 of operands once. Prediction: where the staged cursor waits on its operands' loads,
    # 0.95-0.98x its time at 2048 tokens; nothing if its epilogue's issue rate binds it (ncu, session 31: 52%).
    # Outcome (H100, bench/results/2026-12-07-s41/call3, 3 rounds, Llama-8B's shapes): 0.98-1.00x at 2048
    # tokens with 16, 0.99-1.00x with 32, 0.99-1.00x at 1024; the 8B 1x2048 step 0.356 s with 32 against 0.358
    # routed. The epilogue binds it; not routed
    MMA_STAGED_CONFIG.replace(GROUP_M=16),
    MMA_STAGED_CONFIG.replace(GROUP_M=32),
)


def _check_q8_ws_operands(weight, x, dy, states, n_state, seed, counter):
    """The scope of this kernel (module docstring), each violation named."""
    from forge_num import kernels

    if weight.dtype != torch.bfloat16 or not states or not all(isinstance(s, kernels.Q8State) for s in states):
        raise TypeError("fused_linear_update_q8_ws: the 8bit regime (a bf16 weight and Q8State states), got weight "
                        f"{weight.dtype}, states {[type(s).__name__ for s in states]}")
    if seed is None:
        raise ValueError("fused_linear_update_q8_ws: the 8bit regime rounds stochastically and needs a seed")
    if counter is not None and len(counter) == 4 and counter[3] is not None:
        raise ValueError("fused_linear_update_q8_ws: a counter map of gathered rows is the Triton kernel's only")
    for i, s in enumerate(states):
        if s.codes.dtype != torch.uint8 or s.scales.dtype != torch.float32:
            raise TypeError(f"fused_linear_update_q8_ws: state {i}: uint8 codes and float32 scales, got "
                            f"{s.codes.dtype}, {s.scales.dtype}")
    M, N = weight.shape if weight.dim() == 2 else (0, 0)
    tensors = [("weight", weight, None), ("x", x, None), ("dy", dy, None)]
    for i, s in enumerate(states):
        tensors += [(f"state {i} codes", s.codes, (M, N)), (f"state {i} scales", s.scales, (M, triton.cdiv(N, QBLOCK)))]
    _ws.check_operands("fused_linear_update_q8_ws", weight, x, dy, tensors, len(states), n_state)


def fused_linear_update_q8_ws(weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, states, rule: Rule, h,
                              grad_scale: float = 1.0, config: Q8WSConfig = DEFAULT_Q8_WS_CONFIG,
                              seed: int | None = None, counter: tuple | None = None):
    """weight, states <- the guarded rule applied with g = dyᵀ x, in place, in the 8bit regime (a bf16
    weight and Q8State states; ``seed`` and ``counter`` as kernels.fused_linear_update takes them);
    returns kernels.UpdateStats, like kernels.fused_linear_update, whose bits it must give."""
    from forge_num import kernels

    states = list(states)
    _check_q8_ws_operands(weight, x, dy, states, len(rule.state), seed, counter)
    h, grad_scale = kernels._check_scalars(rule, h, grad_scale)
    _, rand_stride, rand_base, _ = kernels._kernel_counter(counter, weight.numel(), weight.device, cols=weight.shape[1])
    return launch(weight, x, dy, states, rule, h, grad_scale, config, (int(seed), rand_stride, rand_base))


def launch(weight, x, dy, states, rule: Rule, h: tuple, grad_scale: float, config: Q8WSConfig, rand: tuple,
           step_slot=None):
    """The launch itself, for operands already checked; rand = (seed, rand_stride, rand_base);
    step_slot None or a checked slot (kernels.fused_linear_update)."""
    from forge_num import kernels

    M, N = weight.shape
    if x.shape[0] == 0:  # the mainloop divides by its K blocks (and a zero-token update is the launcher's)
        raise ValueError("gluon_q8.launch: K = 0 tokens; kernels.fused_linear_update handles them")
    if (config.stage_state or config.mma_stage) and N % 16:
        config = unstaged(config)
    if config.BK != TWIN_BK and x.shape[0] % config.BK:
        config = twin_k_blocks(config)
    tiles = triton.cdiv(M, config.BM) * triton.cdiv(N, config.BN)
    norm_sq, nonfinite = kernels._telemetry_buffers(max(tiles, 1), weight.device, launched=bool(M and N))
    if M and N:
        _LAUNCH.launch(*_launch_arguments(weight, x, dy, states, rule, h, grad_scale, config, norm_sq, nonfinite, rand,
                                          step_slot))
    return kernels.UpdateStats(norm_sq, nonfinite)


def _launch_arguments(weight, x, dy, states, rule, h, grad_scale, c: Q8WSConfig, norm_sq, nonfinite, rand,
                      step_slot=None):
    """(key, pins, grid, runtime arguments, constants) of a launch through _LAUNCH (CachedLaunch)."""
    from forge_num import kernels

    M, N = weight.shape
    K = x.shape[0]
    codes = [s.codes for s in states] + [weight, weight]  # absent states: any pointer, never read
    scales = [s.scales for s in states] + [norm_sq, norm_sq]
    programs = min(triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN), kernels._sm_count(weight.device))
    # What Triton specializes this launch on (kernels/launch_cache.py): the constexprs and options (a
    # function of the rule and the config, pinned), the number of states (which pointers are real:
    # absent ones stand in as tensors of other dtypes), and the integers n_blocks, M, N, K (1 or not, a
    # multiple of 16 or not; all below 2^31); every pointer is 16-byte aligned (checked by the callers)
    # and seed, rand_stride, rand_base are typed and not specialized; the step slot None or an int32
    # tensor (and its alignment).
    n_blocks = triton.cdiv(N, QBLOCK)
    seed, rand_stride, rand_base = rand
    pairs = rand_pairs(rand_stride, rand_base)
    key = (id(rule), id(c), len(states), pairs, weight.device.index, M == 1, N == 1, K == 1, n_blocks == 1,
           M % 16 == 0, N % 16 == 0, K % 16 == 0, n_blocks % 16 == 0,
           None if step_slot is None else step_slot.data_ptr() % 16 == 0)
    args = (_ws._nvmma_desc(dy, (c.BK, c.BM), gl.bfloat16), _ws._nvmma_desc(x, (c.BK, c.BN), gl.bfloat16),
            *_staging_descs(weight, states, c), weight, codes[0], scales[0], codes[1], scales[1], norm_sq, nonfinite,
            n_blocks, M, N, K, h, grad_scale, seed, rand_stride, rand_base, step_slot)
    return key, (rule, c), (programs,), args, lambda: _launch_constants(rule, c, len(states), pairs)


# FORGE_NUM_Q8_PAIRS=0 in the environment: every launch computes each element's Philox call itself
# (RAND_PAIRS off; the same bits, ~18-20 more instructions an element), for timing the pairs against it
RAND_PAIRS_ENABLED = os.environ.get("FORGE_NUM_Q8_PAIRS", "1") != "0"


def rand_pairs(rand_stride: int, rand_base: int) -> bool:
    """Whether a launch computes each Philox call once for a pair of elements (RAND_PAIRS): where every
    row's counters start even (rand_stride and rand_base even)."""
    return RAND_PAIRS_ENABLED and rand_stride % 2 == 0 and rand_base % 2 == 0


def _launch_constants(rule: Rule, c: Q8WSConfig, n_state: int, pairs: bool = True) -> tuple[dict, dict]:
    """(constexprs in the kernel's parameter order, compile options) of a rule, a config, its number of
    states and RAND_PAIRS."""
    constexprs = dict(GUARDED_UPDATE=_ws.guarded_update_gluon(rule), N_STATE=n_state, STAGES=c.STAGES, ROWS=c.ROWS,
                      GROUP_M=c.GROUP_M, MMA_REGS=c.mma_registers, SELF_LOAD=c.self_load,
                      LOAD_CURSOR=c.load_cursor, PREFETCH=c.prefetch, STAGE_STATE=c.stage_state,
                      MMA_STAGE=int(c.mma_stage),
                      RAND_PAIRS=pairs, num_warps=c.num_warps)
    return constexprs, dict(maxnreg=c.max_registers, enable_fp_fusion=False)


def _staging_descs(weight, states, c: Q8WSConfig) -> tuple:
    """(w_desc, c0_desc, c1_desc) of a stage_state tile, blocks [ROWS, BN], or of an mma_stage tile, blocks
    [BM, BN] (None for an absent state), or three Nones. The codes' rows are N bytes apart, a multiple of 16
    (TMA's row pitch: launch's fallback)."""
    if not (c.stage_state or c.mma_stage):
        return None, None, None
    rows = c.ROWS if c.stage_state else c.BM
    codes = [_ws._nvmma_desc(s.codes, (rows, c.BN), gl.uint8, _PLAIN_8) for s in states] + [None, None]
    return _ws._nvmma_desc(weight, (rows, c.BN), gl.bfloat16, _PLAIN_16), codes[0], codes[1]


# The staging slots' layout: rows as they lie in memory, no swizzle (the epilogue reads a row a warp,
# contiguous: no bank conflict to avoid)
_PLAIN_8 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
_PLAIN_16 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)


@functools.lru_cache(maxsize=None)
def unstaged(config: Q8WSConfig) -> Q8WSConfig:
    """A stage_state or mma_stage tile without its staging, for weights whose codes' rows TMA cannot address
    (N not a multiple of 16: a row pitch of N bytes): the same update, its state loaded by pointer. One
    object per tile (the launch key names a config by id)."""
    return Q8WSConfig(**{k: getattr(config, k) for k in Q8WSConfig.__slots__ if k not in ("stage_state", "mma_stage")})


# The K block of the Triton 8bit tile these tiles equal bit for bit (tests/test_gpu_gluon.py's twin).
TWIN_BK = 64


@functools.lru_cache(maxsize=None)
def twin_k_blocks(config: Q8WSConfig) -> Q8WSConfig:
    """A tile of K blocks wider than TWIN_BK with the twin's K block, for a K that is not a multiple of its
    own. Why: both run one chain of k16 wgmma block products in K order, zeros past K (TMA's padding), and
    where K is a multiple of the wider block the chains are the same; elsewhere the wider block adds k16
    blocks of zeros past K that the twin's lacks, and an accumulator that is exactly -0.0 becomes +0.0 when a
    zero block is added (an SGD or Adam update of a -0.0 gradient differs from a +0.0 one's). One object per
    tile (the launch key names a config by id)."""
    return Q8WSConfig(**{k: (TWIN_BK if k == "BK" else getattr(config, k)) for k in Q8WSConfig.__slots__})


_LAUNCH = CachedLaunch(fused_linear_update_q8_ws_kernel)


def compile_for_sm90(rule: Rule, config: Q8WSConfig = DEFAULT_Q8_WS_CONFIG, M: int = 256, N: int = 256, K: int = 128,
                     slot: bool = False, pairs: bool = True):
    """The kernel compiled for sm_90 without a GPU (descriptors built on CPU tensors, for their types
    only): the CompiledKernel, whose .asm holds "ttgir", "ptx" and (with ptxas) "cubin"; slot: the
    launch that reads its scalars from a step slot; pairs: RAND_PAIRS (rand_pairs)."""
    c = config
    n_state = len(rule.state)
    constexprs, launch_options = _launch_constants(rule, c, n_state, pairs)
    dy = torch.empty(K, M, dtype=torch.bfloat16)
    x = torch.empty(K, N, dtype=torch.bfloat16)
    n_blocks = triton.cdiv(N, QBLOCK)
    w = torch.empty(M, N, dtype=torch.bfloat16)
    codes = [torch.empty(M, N, dtype=torch.uint8) for _ in range(2)]
    w_desc, c0_desc, c1_desc = _staging_descs(w, [types.SimpleNamespace(codes=t) for t in codes[:n_state]], c)
    args = dict(dy_desc=_ws._nvmma_desc(dy, (c.BK, c.BM), gl.bfloat16), x_desc=_ws._nvmma_desc(x, (c.BK, c.BN), gl.bfloat16),
                w_desc=w_desc, c0_desc=c0_desc, c1_desc=c1_desc,
                w_ptr=w, c0_ptr=codes[0], scale0_ptr=torch.empty(M, n_blocks), c1_ptr=codes[1],
                scale1_ptr=torch.empty(M, n_blocks), norm_sq_ptr=torch.empty(4, dtype=torch.float64),
                nonfinite_ptr=torch.empty(4, dtype=torch.int32), n_blocks=n_blocks, M=M, N=N, K=K,
                h=tuple(1.0 for _ in rule.scalar_names), grad_scale=1.0, seed=2**63 + 1, rand_stride=N, rand_base=0,
                step_slot=_ws._cpu_slot(rule) if slot else None, **constexprs)
    return _ws.compile_gluon_for_sm90(fused_linear_update_q8_ws_kernel, args, c.num_warps, launch_options)


# ---------------------------------------------------------------------------------------------
# Where the launcher uses this kernel (kernels.fused_linear_update with no tile given)
# ---------------------------------------------------------------------------------------------
# Measured in session 23 (bench/results/2026-12-05-s23/, AdamW, time over the better Triton 8bit tile's,
# the TMA 64x128 or the staged tall tile):
#   DEFAULT_Q8_WS_CONFIG (four stages) at 4096 tokens: 0.82-0.87x on 4096x14336, 14336x4096, 4096x4096
#     and 8192x2048 (H100, call 2), 0.87x on 2048x8192 and 0.99x on 2048x2048 (H100, call 3); with three
#     stages 0.83-0.90x and 1.03x there, 0.88x and 0.94x on 4096x14336 and 2048x8192 (H200, call 4); at
#     1024 tokens 0.98-1.06x, at 256 1.15-1.33x. Llama-1B's 4x1024 step (checkpointing) with the
#     three-stage tile routed: its fused kernels 38.0 -> 34.6 ms, 1.013x tokens/s (H100, call 3), 36.7
#     -> 34.1 ms, 1.014x (H200, call 4);
#   WIDE_EPILOGUE_CONFIG at 1024 tokens: 0.86x on 4096x14336 and on 2048x8192 (H200, call 4); at 256
#     1.00x and 0.93x; at 4096 1.20-1.26x.
#   CURSOR_CONFIG (session 30, H100, bench/results/2026-12-06-s30/): at 2048 tokens 0.81-0.84x the Triton
#     tile on 4096x4096, 14336x4096 and 4096x14336 (default 0.97-1.01x, sixteen-warp 0.94-0.98x there);
#     at 1024 tokens 0.98-1.01x the sixteen-warp tile, at 4096 1.10-1.12x the default. Llama-8B's 1x2048
#     step (captured, checkpointing) 0.395 -> 0.364-0.371 s.
#   DEEP_CURSOR_CONFIG (session 31, H100, bench/results/2026-12-06-s31/): at 3072 tokens 0.90-0.92x the
#     cursor on 4096x14336, 2048x8192 and 4096x4096, at 4096 0.92-0.95x the default on 4096x14336, 14336x4096
#     and 4096x4096, but at 6144 1.05-1.09x the default; at 2048 1.01-1.03x the cursor, at 1024 1.00-1.03x.
#     Llama-1B's 4x1024 step (captured, checkpointing) 0.129 -> 0.124 s with it forced.
#   DEFAULT_Q8_WS_CONFIG above 8192 tokens (session 31): 0.78-0.84x the Triton tile's time at 8192 on the same
#     three shapes, 0.77-0.86x at 12288, 0.70-0.87x at 16384; Llama-1B's and -3B's 8x2048 steps 0.98x and
#     0.97x with it forced there.
#   v41 (session 32, H100, bench/results/2026-12-06-s32/): every tile computing each Philox call once for a
#     pair of elements (RAND_PAIRS) against each element's own call: 0.91-0.94x at 2048 tokens (the cursor),
#     0.95-0.97x at 4096 (the deep cursor) on 4096x14336 and 14336x4096; the routes unchanged.
#   K128_CURSOR_CONFIG (session 33, H100, bench/results/2026-12-06-s33/call1): at 4096 tokens 0.93-0.97x the
#     deep cursor's time on 4096x14336, 14336x4096 and 4096x4096; at 3072 0.96-1.02x (two timings of one tile
#     in that run differed by 2-7% there: not settled); at 2048 0.98-1.01x the cursor's.
#     Session 34 (H100, bench/results/2026-12-06-s34/, medians of three interleaved rounds): 0.91-0.95x the
#     default's time at 6144 and 8192 tokens and 0.92-0.94x at 16384 (4096x14336, 14336x4096, 4096x4096);
#     0.96-0.97x the deep cursor's at 4096; at 3072 0.99-1.02x (a tie: the deep cursor stays there).
#   MMA_STAGED_CONFIG (session 34, above): routed from 1024 tokens (to 3071 in session 34). Session 35 (H100,
#     bench/results/2026-12-06-s35/call2, three interleaved rounds): at 3072 tokens 0.96-0.99x the deep cursor's
#     time on 4096x14336, 14336x4096 and 4096x4096 (the K-block-128 cursor 0.98-0.99x), at 4096 1.04-1.10x the
#     deep cursor's; at 1024-2048 its hand-over twin (mma_stage=2) 1.00-1.03x its time.
# So each tile of ROUTE_BY_K from its first K to the next one's (from 1024 the staged deep cursor; 3584 halfway
# between 3072, where it leads the deep cursor, and 4096, where it trails it; from 4096 the K-block-128 cursor, which leads
# the deep cursor there and the default from 6144 to 16384, on whole K blocks of 128 only: elsewhere the deep
# cursor to 5120, halfway between 4096, where it leads the default, and 6144, where it trails it, then the
# default), the last to ROUTE_MAX_K tokens inclusive (the most measured: above it the mainloop's share grows,
# where the Triton tiles' mainloops were the faster before the Gluon default led at 8192-16384), with at least
# MIN_TILES tiles. FORGE_NUM_GLUON_Q8 in the environment (read at each call): 0 never, 1 or unset the ranges
# above, a tile's label ('_' for ' ') that tile wherever the kernel applies (an A/B switch for benchmarks).
#
# Not routed by default since session 36: tests/test_gpu_graphs.py's 8bit-hf-wide case (a Llama-1B-wide model,
# 1024 tokens, five steps eager against five captured; bench/results/2026-12-06-s35/flake.py repeats it) gave
# different weights in 8 of 24 runs with this route (the staged deep cursor at 1024 tokens), several with NaN
# losses, and in 1 of 24 with the deep cursor forced, four processes on one H200 at once; with the Triton 8bit
# tile in 0 of 44 (12 on the H200, 32 on an H100). Where the losses agreed only layer 0's down_proj weight
# differed, its states equal. Each tile alone, from fixed inputs, 60 repeats at down_proj's shapes (and 30 in four
# processes at once), gave the same bits every time (bench/results/2026-12-06-s36/stress.py, H100): the fault
# needs the training step around the kernel. Its cause, found in session 37: no kernel invalidated its
# mbarriers, and Triton's allocator gave an unused barrier array's bytes to the staging slot W is copied into
# (gluon_update.invalidate_barriers; tests/test_ptx.py checks every kernel). With the fix the case parted in 0
# of 24 runs with this route, on an H100 (bench/results/2026-12-06-s37/), and in 0 of 44 in session 39 (H100,
# bench/results/2026-12-07-s39/): 0 of 68. Every failure before the fix was on an H200, and none has come since;
# the kernels are the same sm_90 code on both, and tests/test_ptx.py checks every compiled kernel for reused
# barrier bytes. Routed again from session 39; FORGE_NUM_GLUON_Q8=0 keeps the 8bit updates on the Triton tile.
ROUTED = True
MIN_TILES = 132  # below one tile an SM of an H100/H200 the one-program-an-SM grid idles SMs
# (first K, tile), in order of K; the last one that applies is taken, so the default's range from 5120 is
# what the K-block-128 cursor's second entry leaves to it: K not a multiple of 128
ROUTE_BY_K = ((1024, MMA_STAGED_CONFIG), (3584, DEEP_CURSOR_CONFIG),
              (4096, K128_CURSOR_CONFIG), (5120, DEFAULT_Q8_WS_CONFIG), (5120, K128_CURSOR_CONFIG))
ROUTE_MAX_K = 16384
ROUTE_CONFIGS = tuple(dict.fromkeys(c for _, c in ROUTE_BY_K))  # every tile config_for returns, once


def config_for(M: int, N: int, K: int) -> Q8WSConfig | None:
    """The tile the launcher routes a (M, N, K) 8bit update to, or None (the Triton kernel): the measured
    ranges above (where K is not a multiple of a range's K block wider than TWIN_BK, the range's before
    it: the measured tile, not the wider one's untimed twin); M and N multiples of 8 (TMA's 16-byte rows of
    bf16 operands)."""
    if M % 8 or N % 8 or triton.cdiv(M, 64) * triton.cdiv(N, QBLOCK) < MIN_TILES or K > ROUTE_MAX_K:
        return None
    tile = None
    for first_k, c in ROUTE_BY_K:
        if K >= first_k and (c.BK == TWIN_BK or K % c.BK == 0):
            tile = c  # a tile of wider K blocks only on whole ones (twin_k_blocks), else the range's before it
    return tile


def route_config(weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, states) -> Q8WSConfig | None:
    """config_for's tile (or the tile FORGE_NUM_GLUON_Q8=<label> names) for an 8bit update that passed
    the Triton launcher's checks (plain states, no accumulation buffer, no gathered rows), else None:
    switched off (above), or not an sm_90 GPU, not bf16 operands, no tokens, M or N not a multiple of 8,
    fewer than MIN_TILES tiles, a tensor not contiguous or not 16-byte aligned (TMA's descriptors; the
    launch key's alignment)."""
    forced = _ws.switched_tile("FORGE_NUM_GLUON_Q8", ROUTED, (DEFAULT_Q8_WS_CONFIG, *Q8_WS_CANDIDATE_CONFIGS))
    if forced is False:
        return None
    if weight.device.type != "cuda" or x.dtype != torch.bfloat16 or not states:
        return None
    M, N = weight.shape
    K = x.shape[0]
    c = config_for(M, N, K) if forced is None else forced
    if forced is not None and (K == 0 or M % 8 or N % 8 or triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN) < MIN_TILES):
        return None
    if c is None:
        return None
    if not _ws._is_sm90(weight.device.index if weight.device.index is not None else torch.cuda.current_device()):
        return None
    for t in (weight, x, dy, *(u for s in states for u in (s.codes, s.scales))):
        if not t.is_contiguous() or t.data_ptr() % 16:
            return None
    return c
