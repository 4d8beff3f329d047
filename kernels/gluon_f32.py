"""The fp32 regime in gluon_q8's split design: one tile's update in warps of its own beside the next tile's mainloop.

Why (bench/NOTES.md, v45): in the fp32 regime from 4096 tokens on the mainloop is the longer part (at 4096 x 14336,
4096 tokens: ~0.75 ms of wgmma against ~0.45 ms of the update's 24 bytes an element at the HBM's rate), and
the routed kernels run the update after their tile's mainloop in the same warps (kernels/gluon_update.py's
consumer, the Triton tile): the tile's time is the sum of the two, and both trailed the unfused step there
(0.94-0.99x at 4096 tokens, H200, session 11). kernels/gluon_q8.py's design puts them in different warps of one
program, g between them in a double-buffered shared-memory tile; in the 8bit regime it took the update's time
off the step wherever the update was the shorter part (sessions 23-34). Here the same partitions with an
epilogue of the fp32 regime:

    partition        warps  work
    operand loader   1      (self_load=False) TMA loads of dY's and X's K blocks (gluon_update.operand_loader)
    MMA          BM / 16    per tile: the mainloop, then g whole into g buffer t % 2 (gluon_q8.mma_whole_tiles;
                            self_load: gluon_q8.mma_self_loaded_tiles, issuing its own loads, no loader)
    epilogue       E = num_warps (default partition)
                            per tile: row sub-tiles [ROWS, BN] of g from the buffer (a warp a row, 4
                            consecutive columns a thread: 16-byte loads and stores of W and each state), the
                            buffer handed back after the last; on each, load W and the states by pointer,
                            the guarded rule, store them (linear_update's load_f32, store_f32 and
                            telemetry_terms); the tile's telemetry into its slot

The bits are the Triton fp32 tile's: the mainloop is gluon_q8's, the same chain of k16 wgmma block FMAs in K
order as the Triton TMA tile's `tl.dot` (BK = 64), and each element's epilogue is the same guarded rule on the
same fp32 values (rules.py's IEEE text, fp fusion off). The telemetry's sums are bounded, not bit-exact
(proofs/telemetry.md), as between the Triton tiles.

Scope: the fp32 regime (fp32 weight and state) with bf16 operands TMA can address (contiguous, 16-byte aligned,
M and N multiples of 8), K > 0, no accumulation buffer. tests/test_gpu_gluon.py holds it to the Triton kernel
bit for bit.
"""

from __future__ import annotations


import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from forge_num.rules import Rule

from . import gluon_q8 as _q8
from . import gluon_update as _ws
from .launch_cache import CachedLaunch


@gluon.jit
def load_rows(offs, in_tile, w_ptr, s0_ptr, s1_ptr, N_STATE: gl.constexpr, EVICT: gl.constexpr):
    """(p, s0, s1): W and its N_STATE fp32 states at a row sub-tile's offsets (absent states: p, never stored), with
    eviction policy EVICT (linear_update.load_f32's)."""
    p = _ws._LINEAR.load_f32(w_ptr, offs, in_tile, False, EVICT)
    s0 = p
    s1 = p
    if N_STATE >= 1:
        s0 = _ws._LINEAR.load_f32(s0_ptr, offs, in_tile, False, EVICT)
    if N_STATE >= 2:
        s1 = _ws._LINEAR.load_f32(s1_ptr, offs, in_tile, False, EVICT)
    return p, s0, s1


@gluon.jit
def read_staged_rows(st_w, st_s0, st_s1, slot, layout: gl.constexpr, N_STATE: gl.constexpr):
    """load_rows' values from staging slot ``slot`` (gluon_q8.stage_row_blocks' copies of W and the N_STATE
    states, fp32, rows and columns past M and N as zeros: values the masked stores never write), in
    ``layout``."""
    p = st_w.index(slot).load(layout)
    s0 = p
    s1 = p
    if N_STATE >= 1:
        s0 = st_s0.index(slot).load(layout)
    if N_STATE >= 2:
        s1 = st_s1.index(slot).load(layout)
    return p, s0, s1


@gluon.jit
def update_loaded_rows(g, loaded, offs, in_tile, w_ptr, s0_ptr, s1_ptr, h, grad_scale, GUARDED_UPDATE: gl.constexpr,
                       N_STATE: gl.constexpr, EVICT: gl.constexpr):
    """The fp32 epilogue on a row sub-tile g whose W and states load_rows loaded: the guarded rule, the results
    stored back with eviction policy EVICT (linear_update.apply_and_store's fp32 branch); returns its telemetry
    terms."""
    p, s0, s1 = loaded
    p, s0, s1, finite = GUARDED_UPDATE(p, g, s0, s1, h, grad_scale)
    _ws._LINEAR.store_f32(w_ptr, offs, in_tile, p, offs, False, EVICT)
    if N_STATE >= 1:
        _ws._LINEAR.store_f32(s0_ptr, offs, in_tile, s0, offs, False, EVICT)
    if N_STATE >= 2:
        _ws._LINEAR.store_f32(s1_ptr, offs, in_tile, s1, offs, False, EVICT)
    return _ws._LINEAR.telemetry_terms(g, in_tile, finite)


@gluon.jit
def f32_epilogue(g_bufs, g_ready, g_empty, M, N, w_ptr, s0_ptr, s1_ptr, h, grad_scale, norm_sq_ptr, nonfinite_ptr,
                 staging, GUARDED_UPDATE: gl.constexpr, N_STATE: gl.constexpr, ROWS: gl.constexpr,
                 GROUP_M: gl.constexpr, PREFETCH: gl.constexpr, STAGE_STATE: gl.constexpr, STATE_EVICT: gl.constexpr,
                 num_warps: gl.constexpr):
    """Default partition: per tile, its BM / ROWS row sub-tiles of g from g buffer t % G (G buffers), each's W and states
    loaded and updated (the buffer handed back once the last sub-tile of g is in registers); the sub-tiles'
    telemetry terms added element by element, in order, then reduced into the tile's slot pid_m * tiles_n +
    pid_n. PREFETCH: each sub-tile's W and states loaded one sub-tile ahead (the tile's first before the wait
    for g), so that their latency passes under the previous sub-tile's update. STAGE_STATE: instead, W and the
    states stream through S shared-memory slots by TMA (staging = (w_desc, s0_desc, s1_desc, st_w, st_s0, st_s1,
    st_ready), gluon_q8.stage_row_blocks): the program's first S sub-tiles before its loop, then, as soon as
    sub-tile u's values are in registers, sub-tile u + S (this tile's, or its next tile's) into the slot u
    has read; no register holds a load in flight, and S sub-tiles' bytes (24 KB each at 16 x 128 with two
    states) are in flight where the loads by pointer keep at most one. Stores by pointer either way. STATE_EVICT:
    the eviction policy of the loads and stores by pointer ("" or "evict_first", linear_update.load_f32's). The
    same values every way."""
    G: gl.constexpr = g_bufs.type.shape[0]
    BM: gl.constexpr = g_bufs.type.shape[1]
    BN: gl.constexpr = g_bufs.type.shape[2]
    SUBTILES: gl.constexpr = BM // ROWS
    gl.static_assert(SUBTILES * ROWS == BM, "ROWS must divide BM")
    gl.static_assert(ROWS % num_warps == 0, "each epilogue warp takes whole rows of a sub-tile")
    # a warp a row, 4 consecutive columns a thread: 16-byte loads and stores of W and each state
    epi: gl.constexpr = _q8.row_subtile_layout(ROWS, BN, num_warps)
    rows: gl.constexpr = gl.SliceLayout(1, epi)
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    tiles = tiles_m * tiles_n
    _, _, _, st_w, st_s0, st_s1, st_ready = staging
    if STAGE_STATE:
        S: gl.constexpr = st_ready.type.shape[0]
        gl.static_assert(SUBTILES >= S, "a tile's sub-tiles cover the staging distance")
        first_m, first_n = _ws.tile_coords(gl.program_id(0), tiles_m, tiles_n, GROUP_M)  # every program has one
        _q8.stage_first_row_blocks(staging, first_m, first_n, BM, ROWS, N_STATE)
    u = 0  # the program's sub-tiles so far (STAGE_STATE: the staging slots' uses)
    t = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        pid_m, pid_n = _ws.tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        b = t % G
        offs_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, epi))
        offs_m = pid_m * BM + gl.arange(0, ROWS, layout=rows)
        offs = offs_m[:, None].to(gl.int64) * N + offs_n[None, :]
        in_tile = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        if STAGE_STATE:
            # the tile after this one, whose first sub-tiles this one's last ones stage; after the program's
            # last tile this one again (never read; waited for after the loop), as gluon_q8's q8_epilogue
            following = tile + gl.num_programs(0)
            next_m, next_n = _ws.tile_coords(gl.where(following < tiles, following, tile), tiles_m, tiles_n, GROUP_M)
        if PREFETCH:
            loaded = load_rows(offs, in_tile, w_ptr, s0_ptr, s1_ptr, N_STATE, STATE_EVICT)
        mbarrier.wait(g_ready.index(b), (t // G) & 1)
        sq = gl.zeros((ROWS, BN), dtype=gl.float64, layout=epi)
        bad = gl.zeros((ROWS, BN), dtype=gl.int32, layout=epi)
        for j in gl.static_range(SUBTILES):
            g = g_bufs.index(b).slice(j * ROWS, ROWS, dim=0).load(epi)
            if j == SUBTILES - 1:
                mbarrier.arrive(g_empty.index(b), count=1)  # g is in registers: the MMA warps may refill it
            if STAGE_STATE:
                loaded = read_staged_rows(st_w, st_s0, st_s1, _q8.staged_slot(st_ready, u), epi, N_STATE)
                # sub-tile u + S into the slot just read: this tile's, or the next one's
                _q8.stage_row_blocks_ahead(staging, u, j, pid_m, pid_n, next_m, next_n, BM, ROWS, SUBTILES, N_STATE)
            elif PREFETCH:
                if j + 1 < SUBTILES:
                    ahead_m = offs_m + ROWS
                    ahead_offs = offs + ROWS * N
                    ahead_in = (ahead_m[:, None] < M) & (offs_n[None, :] < N)
                    ahead = load_rows(ahead_offs, ahead_in, w_ptr, s0_ptr, s1_ptr, N_STATE, STATE_EVICT)
            else:
                loaded = load_rows(offs, in_tile, w_ptr, s0_ptr, s1_ptr, N_STATE, STATE_EVICT)
            sq_j, bad_j = update_loaded_rows(g, loaded, offs, in_tile, w_ptr, s0_ptr, s1_ptr, h, grad_scale,
                                             GUARDED_UPDATE, N_STATE, STATE_EVICT)
            sq, bad = _q8.add_subtile_telemetry(sq, bad, sq_j, bad_j)
            u += 1
            if j + 1 < SUBTILES:
                offs_m += ROWS
                offs += ROWS * N
                in_tile = (offs_m[:, None] < M) & (offs_n[None, :] < N)
                if PREFETCH:
                    loaded = ahead
        _q8.store_tile_telemetry(sq, bad, pid_m, pid_n, tiles_n, norm_sq_ptr, nonfinite_ptr)
        t += 1
    if STAGE_STATE:
        _q8.drain_staging(st_ready, u)


@gluon.jit
def fused_linear_update_f32_ws_kernel(dy_desc, x_desc, w_desc, s0_desc, s1_desc, w_ptr, s0_ptr, s1_ptr, norm_sq_ptr,
                                      nonfinite_ptr, M, N, K, h, grad_scale, step_slot, GUARDED_UPDATE: gl.constexpr,
                                      N_STATE: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr,
                                      GROUP_M: gl.constexpr, MMA_REGS: gl.constexpr, SELF_LOAD: gl.constexpr,
                                      LOAD_CURSOR: gl.constexpr, PREFETCH: gl.constexpr, G_BUFS: gl.constexpr,
                                      STAGE_SLOTS: gl.constexpr, STATE_EVICT: gl.constexpr, num_warps: gl.constexpr):
    """The operand ring, the double-buffered g and their barriers, then the partitions (module docstring).
    dy_desc [K, M] block [BK, BM], x_desc [K, N] block [BK, BN]; w_ptr the fp32 weight [M, N], s0/s1_ptr its
    N_STATE fp32 states (the others any pointer, never read); step_slot None, or where h and grad_scale are read
    when the kernel runs (linear_update.step_scalars). G_BUFS: g buffers, 2 (the MMA warps start the next tile's
    hand-over while the epilogue updates this one) or 1 (they wait at the hand-over for the epilogue to have
    read this tile's g: nothing where the mainloop is the longer part; 64 KB freed at 128 rows). STAGE_SLOTS:
    0, or the staging slots through which the epilogue streams W and the states (f32_epilogue's STAGE_STATE),
    w_desc, s0_desc, s1_desc their descriptors in blocks [ROWS, BN] (an absent state's the weight's; all three
    None without staging)."""
    h, grad_scale, _ = _ws._LINEAR.step_scalars(step_slot, h, grad_scale, 0)
    BM: gl.constexpr = dy_desc.block_type.shape[1]  # the MMA partition: a warp a 16-row slice of the tile
    dy_bufs, x_bufs, g_bufs, op_ready, op_empty, g_ready, g_empty = _q8.allocate_rings(dy_desc, x_desc, STAGES, G_BUFS)
    staging = (w_desc, s0_desc, s1_desc, None, None, None, None)
    if STAGE_SLOTS:
        st_w, st_s0, st_s1, st_ready = _q8.allocate_staging(w_desc, s0_desc, s1_desc, STAGE_SLOTS, N_STATE)
        staging = (w_desc, s0_desc, s1_desc, st_w, st_s0, st_s1, st_ready)
    if SELF_LOAD:
        # no staged state: gluon_q8's tile_staging placeholders, never read (MMA_STAGE 0)
        gl.warp_specialize([
            (f32_epilogue, (g_bufs, g_ready, g_empty, M, N, w_ptr, s0_ptr, s1_ptr, h, grad_scale, norm_sq_ptr,
                            nonfinite_ptr, staging, GUARDED_UPDATE, N_STATE, ROWS, GROUP_M, PREFETCH,
                            STAGE_SLOTS > 0, STATE_EVICT, num_warps)),
            (_q8.mma_self_loaded_tiles, (dy_desc, x_desc, dy_bufs, x_bufs, op_ready, g_bufs, g_ready, g_empty, M, N,
                                         K, (None, None, None, None, None, None, None), GROUP_M, LOAD_CURSOR, 0,
                                         N_STATE)),
        ], [BM // 16], [MMA_REGS])
    else:
        gl.warp_specialize([
            (f32_epilogue, (g_bufs, g_ready, g_empty, M, N, w_ptr, s0_ptr, s1_ptr, h, grad_scale, norm_sq_ptr,
                            nonfinite_ptr, staging, GUARDED_UPDATE, N_STATE, ROWS, GROUP_M, PREFETCH,
                            STAGE_SLOTS > 0, STATE_EVICT, num_warps)),
            (_ws.operand_loader, (dy_desc, x_desc, dy_bufs, x_bufs, op_ready, op_empty, M, N, K, GROUP_M)),
            (_q8.mma_whole_tiles, (dy_bufs, x_bufs, op_ready, op_empty, g_bufs, g_ready, g_empty, M, N, K, GROUP_M)),
        ], [1, BM // 16], [24, MMA_REGS])
    _q8.invalidate_rings(op_ready, op_empty, g_ready, g_empty)
    if STAGE_SLOTS:
        _ws.invalidate_barriers(staging[6])  # st_ready


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------

class F32WSConfig(_ws.ValueConfig):
    """The fp32 split tile: BM x BN output tiles (BM = 64 or 128: one or two MMA warp groups), K blocks of BK in STAGES operand
    slots, num_warps epilogue warps on row sub-tiles of ROWS rows, the MMA warp group's registers (setmaxnreg)
    and the launch's register cap, GROUP_M tile rows per group; one program an SM. self_load, load_cursor: the
    MMA warps issue their own loads (gluon_q8.mma_self_loaded_tiles), by a cursor; prefetch: f32_epilogue's
    PREFETCH; evict_first: its STATE_EVICT, the loads and stores of W and the states by pointer hinted to leave L2
    first."""

    __slots__ = ("BM", "BN", "BK", "STAGES", "ROWS", "GROUP_M", "num_warps", "mma_registers", "max_registers",
                 "self_load", "load_cursor", "prefetch", "g_buffers", "stage_slots", "evict_first")

    def __init__(self, BM=64, BN=128, BK=64, STAGES=4, ROWS=16, GROUP_M=8, num_warps=16, mma_registers=96,
                 max_registers=96, self_load=True, load_cursor=True, prefetch=False, g_buffers=2, stage_slots=0,
                 evict_first=False):
        if BM not in (64, 128) or BN % 128:
            raise ValueError(f"F32WSConfig: BM must be 64 or 128 (one or two MMA warp groups) and BN a multiple of "
                             f"128 (a warp a row, 4 columns a thread), got {BM}x{BN}")
        if STAGES < 2 or BK % 16:
            raise ValueError(f"F32WSConfig: at least 2 operand stages (a K block is loaded while the one before "
                             f"it is multiplied) and K blocks of a multiple of 16, got STAGES={STAGES}, BK={BK}")
        if num_warps not in (4, 8, 16) or ROWS % num_warps or ROWS % 8 or BM % ROWS:
            raise ValueError(f"F32WSConfig: 4, 8 or 16 epilogue warps on sub-tiles of whole rows a warp, a multiple "
                             f"of 8 rows (a slice of the swizzled g buffer) dividing BM = {BM}, got {num_warps} "
                             f"warps, {ROWS} rows")
        warps = num_warps + BM // 16 + (0 if self_load else 4)  # the epilogue, the MMA warps, the loader's group
        if max_registers * 32 * warps > 65536:
            raise ValueError(f"F32WSConfig: {max_registers} registers a thread at launch for {warps} warps exceed "
                             "the SM's 65536")
        if load_cursor and not self_load:
            raise ValueError("F32WSConfig: load_cursor keeps the self-loading MMA warps' load coordinates "
                             "(self_load=True)")
        self.BM, self.BN, self.BK, self.STAGES, self.ROWS, self.GROUP_M = BM, BN, BK, STAGES, ROWS, GROUP_M
        self.num_warps, self.mma_registers, self.max_registers = num_warps, mma_registers, max_registers
        if g_buffers not in (1, 2):
            raise ValueError(f"F32WSConfig: 1 or 2 g buffers, got {g_buffers}")
        if stage_slots and (prefetch or not 2 <= stage_slots <= BM // ROWS):
            raise ValueError(f"F32WSConfig: stage_slots streams W and the states through 2 to BM / ROWS = "
                             f"{BM // ROWS} slots of a sub-tile each (instead of prefetch's loads by pointer), got "
                             f"stage_slots={stage_slots}, prefetch={prefetch}")
        self.self_load, self.load_cursor, self.prefetch, self.g_buffers = self_load, load_cursor, prefetch, g_buffers
        self.stage_slots = stage_slots
        self.evict_first = evict_first
        self.check_shared_memory()

    @property
    def label(self) -> str:
        return (f"wsf {self.BM}x{self.BN}x{self.BK} st{self.STAGES} w{self.num_warps} rows{self.ROWS}"
                + (f" g{self.GROUP_M}" if self.GROUP_M != 8 else "")
                + f" mma{self.mma_registers} r{self.max_registers}" + (" sl" if self.self_load else "")
                + (" cur" if self.load_cursor else "") + (" pf" if self.prefetch else "")
                + (" gb1" if self.g_buffers == 1 else "") + (f" ss{self.stage_slots}" if self.stage_slots else "")
                + (" ef" if self.evict_first else ""))

    def shared_bytes(self, n_state: int = 2) -> int:
        """Shared memory of one program: the operand ring, the g buffers and the staging slots of W and n_state
        states, barriers aside."""
        staging = self.stage_slots * self.ROWS * self.BN * 4 * (1 + n_state)
        return self.STAGES * self.BK * (self.BM + self.BN) * 2 + self.g_buffers * self.BM * self.BN * 4 + staging


# The tiles written first (session 35, CPU): gluon_q8's deep cursor (sixteen epilogue warps, four operand stages,
# the MMA warps loading by a cursor), with and without the one-ahead loads, and its loader-partition twin with
# eight epilogue warps (gluon_q8's default, which led the 8bit regime from 5120 tokens). The 128-row tile (two MMA
# warp groups: a one-warp-group 64x128 mainloop ran at 315-442 TFLOP/s where cuBLAS ran at 634-762, session 20)
# for long K: three operand stages and two 64 KB g buffers, 224 KB; eight epilogue warps. ptxas (Triton 3.6) with
# the launch's 16-byte accesses: the default none, the 128-row tile 212 B for AdamW (tests/test_ptx.py's tables;
# until session 39 they were read from compiles with 4-byte accesses, where it spilled none).
DEFAULT_F32_WS_CONFIG = F32WSConfig()
TALL_F32_WS_CONFIG = F32WSConfig(BM=128, STAGES=3, num_warps=8, mma_registers=96, max_registers=128)
# the 128-row tile with one g buffer and four operand stages (v45b): where the mainloop is the longer part (from
# ~4096 tokens) the epilogue has read a tile's g long before the next hand-over, so a second buffer buys nothing
# there, and its 64 KB take a fourth operand stage (192 KB); the two-buffer tile's mainloop ran at ~450 TFLOP/s
# with three. ptxas (Triton 3.6): AdamW spills none, Lion 28 B, SGD 12 (AdamW 200 B before session 43's
# gluon_q8.add_subtile_telemetry)
TALL_ONE_BUFFER_F32_WS_CONFIG = F32WSConfig(BM=128, STAGES=4, num_warps=8, mma_registers=96, max_registers=128,
                                            g_buffers=1)
# v46 (session 36): the default tile with W and the states streamed through two shared-memory slots by TMA
# (f32_epilogue's STAGE_STATE); why, below among the candidates it was timed with
STREAMED_F32_WS_CONFIG = F32WSConfig(STAGES=4, stage_slots=2)
# v47 (session 39; routed in session 40): the one-buffer 128-row tile with 8-row sub-tiles (four elements a
# thread, a row a warp), so that AdamW's epilogue holds its sub-tile in registers at the 128-register cap (ptxas,
# Triton 3.6: AdamW spilled none, Lion 24 B, SGD 76; the 16-row tile 200, 20, 36; since session 43's pin of the
# telemetry, v47 0, 60, 8 and the 16-row tile 0, 28, 12). Why, below among the candidates it was timed with
TALL_SUBTILED_F32_WS_CONFIG = TALL_ONE_BUFFER_F32_WS_CONFIG.replace(ROWS=8)
# v49 (session 40; routed in session 41): the default tile and v46 with groups of 16 tile rows instead of 8
# (GROUP_M), so that an x panel serves twice the tiles before the state's stream evicts it from L2; why and
# what it gave, below among the candidates and at ROUTE_BY_K
GROUPED_F32_WS_CONFIG = DEFAULT_F32_WS_CONFIG.replace(GROUP_M=16)
STREAMED_GROUPED_F32_WS_CONFIG = STREAMED_F32_WS_CONFIG.replace(GROUP_M=16)
F32_WS_CANDIDATE_CONFIGS = (
    F32WSConfig(prefetch=True),
    F32WSConfig(ROWS=32),
    F32WSConfig(num_warps=8, self_load=False, load_cursor=False, mma_registers=104, max_registers=128),
    F32WSConfig(num_warps=8, self_load=False, load_cursor=False, mma_registers=104, max_registers=128,
                prefetch=True),
    TALL_F32_WS_CONFIG,
    TALL_ONE_BUFFER_F32_WS_CONFIG,
    # its five-stage twin (224 KB; AdamW spilled 200 B, Lion and SGD 76-120, before session 43's pin; now 0, 16,
    # 20): 1.00-1.06x its time at 4096-16384 tokens
    F32WSConfig(BM=128, STAGES=5, num_warps=8, mma_registers=96, max_registers=128, g_buffers=1),
    # the default tile with deeper operand rings (session 36; H200: within 2-3% of its time at 256-2048 tokens,
    # either way, so the mainloop does not wait for operands): its MMA warps load
    # STAGES - 1 K blocks ahead and reuse a slot once the wgmma before it retired, so STAGES - 2 blocks cover a
    # load's latency; a 64x128x64 wgmma is ~0.14 us at the SM's peak, so four stages cover ~0.3 us where a TMA
    # load from L2 takes ~0.5-1 us. Five and six stages (184 and 208 KB) change no register: the same epilogue
    F32WSConfig(STAGES=5),
    F32WSConfig(STAGES=6),
    # v46 (session 36): the default tile with W and the states streamed through shared-memory slots by TMA
    # (f32_epilogue's STAGE_STATE). Why: its update streams at ~2.4-2.6 TB/s (0.586 ms at 4096x14336, 256 tokens,
    # against a 0.467 ms floor), with at most one 16-row sub-tile's loads (24 KB an SM) in flight; at ~3 TB/s and
    # ~1 us of loaded latency an SM needs ~23 KB in flight all the time. Two or three slots keep one or two
    # sub-tiles ahead without a register; 208 KB, or 200 with one g buffer. Two slots (session 37, H100, issue
    # 5's five shapes): 0.91-0.93x the default's time at 256 tokens, 0.92-1.01x at 512, 0.92-0.96x at 768,
    # 1.03-1.07x at 1024. Not routed until session 37's barrier fix holds on an H200: before it, its flake case
    # parted in 1 of 16 runs there; with it, in 0 of 24 on an H100
    F32WSConfig(STAGES=3, stage_slots=3),
    STREAMED_F32_WS_CONFIG,
    F32WSConfig(STAGES=4, g_buffers=1, stage_slots=3),
    # v46b (session 36, after the calls; timed in session 40): the one-buffer 128-row tile with the state
    # streamed, for 1024-3071 tokens. Why: at 1024 tokens the default tile takes ~0.58 ms (H200) where its update
    # alone would take ~0.42: the mainloop and the update overlap only in part. One suspect is L2: a 64x128 tile
    # reads (64 + 128) x 2 B of operands a token from L2, 48 B an element at 1024 tokens beside the update's 24 B
    # from HBM; a 128x128 tile reads 32 B. The 128-row tiles had only eight epilogue warps to keep loads in flight
    # by pointer (1.25x the default's time at 1024, session 35); streamed, the warps no longer matter for that.
    # 208 KB; ptxas (Triton 3.6): AdamW spills 252 B, Lion 84, SGD 8. Outcome (session 40, H100, bench/results/
    # 2026-12-07-s40/call5, 3 rounds): 1.23-1.26x the default's time at 1024 tokens, 1.12-1.17x at 1536,
    # 1.04-1.07x at 2048, 1.01-1.04x at 2560; not routed
    F32WSConfig(BM=128, STAGES=3, num_warps=8, mma_registers=96, max_registers=128, g_buffers=1, stage_slots=2),
    # v47 (session 39, CPU; timed and routed in session 40, below at ROUTE_BY_K): the one-buffer 128-row tile with
    # 8-row sub-tiles, for 4096-16384 tokens. Why: compiled as a launch specializes it (16-byte loads and stores),
    # the one-buffer tile's eight epilogue warps hold eight elements a thread at the 128-register cap, and AdamW
    # spills 200 B a thread, each sub-tile's spills and reloads in the epilogue's path; with four elements a thread
    # (an 8-row sub-tile, a row a warp) AdamW spills none (Lion 24 B, SGD 76). The same bytes and mainloop; twice
    # the sub-tiles.
    TALL_SUBTILED_F32_WS_CONFIG,
    # v48 (session 39, CPU; timed in session 40): the default and v46 with W's and the states' accesses by pointer
    # hinted evict_first (an L2 cache policy: createpolicy.fractional.L2::evict_first; v46's TMA copies take no
    # hint in Gluon 3.6, its stores do). Why: at 1024 tokens on 4096x14336 (ncu, session 39, H100) the default
    # moved 1.63 GB through DRAM where 1.45 GB is the least, its operands' K blocks read again after the state's
    # 1.4 GB stream (24 B an element, read and written once) turned the 50 MB L2 over; its L2 hit rate was 62%.
    # Prediction: DRAM bytes within 5% of 1.45 GB and 0.93-0.97x the routed tile's time at 512-2048 tokens.
    # Outcome (session 40, H100, bench/results/2026-12-07-s40/call1-2): the bytes as before (ncu, 4096x14336 at
    # 1024 tokens: 948 MB read and 682 MB written against 949 and 683), and 0.97-1.02x its twin's time at
    # 256-2048 tokens (the streamed twin 0.96-1.01x). Not routed: the operands' extra reads are not the
    # state's stream evicting them
    DEFAULT_F32_WS_CONFIG.replace(evict_first=True),
    STREAMED_F32_WS_CONFIG.replace(evict_first=True),
    # v48b (session 40): v47 with v48's hint, for 4096-16384 tokens, where ncu (session
    # 39, H100, 4096x14336 at 16384 tokens) counted the operands read from DRAM ~6.3 times against cuBLAS's ~4.2,
    # the state's 0.7 GB stream between their reuses. ptxas (Triton 3.6): AdamW spills none, as v47. Outcome
    # (session 40, H100, call1, 3 rounds): 0.95-1.15x v47's time at 4096-16384 tokens; not routed
    TALL_SUBTILED_F32_WS_CONFIG.replace(evict_first=True),
    # v49 (session 40, CPU; timed in session 41, outcome below the list): the 64-row tiles (the default, v46) with
    # groups of 16, 32 and 64 tile rows (GROUP_M; 8 in every tile before). Why: in grouped order an x panel (128
    # columns, K tokens) is used by the GROUP_M tiles of its column in one group and then not until the next group,
    # tiles_n x GROUP_M tiles later; by then the state's stream (24 B an element, never reused) has pushed it out of L2,
    # so every group reads x again: tiles_m / GROUP_M times. bench/tile_order_model.py replays the stream through an LRU
    # L2; it gives 243 MB of operand reads for the default at 4096x14336, 1024 tokens, where ncu counted ~244 (session
    # 39: 949 MB read, 705 of them the state), the operands once being 38 MB. Modelled (C = 35-50 MB;
    # bench/results/2026-12-07-s40/tile_order_model.json), DRAM bytes against the least (state + operands once): at 512
    # tokens 1.06-1.10x with GROUP_M = 8, 1.03-1.04x with 16, 1.01-1.02x with 32; at 1024 1.12-1.16x, 1.06-1.08x,
    # 1.02-1.04x; at 2048 1.24-1.40x, 1.12-1.18x, 1.04-1.38x (32 and 64 lose at 2048 if the L2 keeps less than ~40 MB:
    # their groups' dy panels no longer fit beside the state's stream; 16 holds at every capacity modelled). For the
    # 128-row tiles the model gives GROUP_M = 16 within 2% of 8 from 2048 tokens: their waves' panels fill L2 whatever
    # the order, so no 128-row twin then (v49b, below, tries one). Prediction: where the default is bound by DRAM (1024
    # tokens: 76% of the peak, ncu), time falls with the bytes: 0.91-0.96x its time with GROUP_M = 16 or 32 at 1024
    # tokens, 0.95-0.98x at 512, 0.88-0.95x at 2048 (with 16); v46 likewise at 256-768 tokens, less at 256 (1.03-1.04x
    # the least bytes there)
    GROUPED_F32_WS_CONFIG,
    DEFAULT_F32_WS_CONFIG.replace(GROUP_M=32),
    DEFAULT_F32_WS_CONFIG.replace(GROUP_M=64),
    STREAMED_GROUPED_F32_WS_CONFIG,
    STREAMED_F32_WS_CONFIG.replace(GROUP_M=32),
    # v49b (session 41, timed in its call 4): v47 with groups of 16 and 32 tile rows, for 2560-16384 tokens. Why: at
    # 2560 tokens on 28672x8192 the default with GROUP_M = 16 took 0.95x v47's time (3.72 against 3.93 ms, call 2)
    # though v47 led it on the four smaller shapes, and 28672x8192 at 16384 tokens is the one shape still slower than
    # the unfused step (0.89-0.985x); its 224 x 64 tiles make 28 groups of 8 tile rows, each group reading all of x
    # again. The model (fitted at 1024 tokens) undercounts at 16384, so no byte prediction; ptxas (Triton
    # 3.6): the tile order is addressing only, so v47's spills (AdamW none, Lion 24 B, SGD 76). Prediction: 0.95-1.0x
    # v47's time on 28672x8192 at 2560-16384 tokens, within 2% either way on the others. Outcome (H100,
    # bench/results/2026-12-07-s41/call4/tall.json, 3 interleaved rounds, issue 5's five shapes): GROUP_M = 16
    # 0.93-1.00x v47's time at 2560 tokens, 0.98-1.05x at 4096, 0.99-1.12x at 8192, 1.00-1.10x at 16384 (28672x8192:
    # 0.93x, then 1.03x, 1.12x, 1.02x); GROUP_M = 32 0.95-1.22x. It held at 2560 only; not routed
    TALL_SUBTILED_F32_WS_CONFIG.replace(GROUP_M=16),
    TALL_SUBTILED_F32_WS_CONFIG.replace(GROUP_M=32),
)


def _check_f32_ws_operands(weight, x, dy, states, n_state):
    """The scope of this kernel (module docstring), each violation named."""
    if weight.dtype != torch.float32 or any(s.dtype != torch.float32 for s in states):
        raise TypeError("fused_linear_update_f32_ws: the fp32 regime (fp32 weight and states), got weight "
                        f"{weight.dtype}, states {[s.dtype for s in states]}")
    shape = tuple(weight.shape) if weight.dim() == 2 else None
    _ws.check_operands("fused_linear_update_f32_ws", weight, x, dy,
                       [("weight", weight, None), ("x", x, None), ("dy", dy, None),
                        *((f"state {i}", s, shape) for i, s in enumerate(states))], len(states), n_state)


def fused_linear_update_f32_ws(weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, states, rule: Rule, h,
                               grad_scale: float = 1.0, config: F32WSConfig = DEFAULT_F32_WS_CONFIG):
    """weight, states <- the guarded rule applied with g = dyᵀ x, in place, in the fp32 regime; returns
    kernels.UpdateStats, like kernels.fused_linear_update, whose bits it must give."""
    from forge_num import kernels

    states = list(states)
    _check_f32_ws_operands(weight, x, dy, states, len(rule.state))
    h, grad_scale = kernels._check_scalars(rule, h, grad_scale)
    return launch(weight, x, dy, states, rule, h, grad_scale, config)


def launch(weight, x, dy, states, rule: Rule, h: tuple, grad_scale: float, config: F32WSConfig, step_slot=None):
    """The launch itself, for operands already checked; step_slot None or a checked slot
    (kernels.fused_linear_update)."""
    from forge_num import kernels

    M, N = weight.shape
    if x.shape[0] == 0:  # the mainloop divides by its K blocks (and a zero-token update is the launcher's)
        raise ValueError("gluon_f32.launch: K = 0 tokens; kernels.fused_linear_update handles them")
    tiles = triton.cdiv(M, config.BM) * triton.cdiv(N, config.BN)
    norm_sq, nonfinite = kernels._telemetry_buffers(max(tiles, 1), weight.device, launched=bool(M and N))
    if M and N:
        _LAUNCH.launch(*_launch_arguments(weight, x, dy, states, rule, h, grad_scale, config, norm_sq, nonfinite,
                                          step_slot))
    return kernels.UpdateStats(norm_sq, nonfinite)


def _launch_arguments(weight, x, dy, states, rule, h, grad_scale, c: F32WSConfig, norm_sq, nonfinite, step_slot=None):
    """(key, pins, grid, runtime arguments, constants) of a launch through _LAUNCH (CachedLaunch)."""
    from forge_num import kernels

    M, N = weight.shape
    K = x.shape[0]
    given = list(states) + [weight, weight]  # absent states: any pointer, never read
    programs = min(triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN), kernels._sm_count(weight.device))
    # What Triton specializes this launch on (kernels/launch_cache.py): the constexprs and options (a function
    # of the rule and the config, pinned), the number of states, and the integers M, N, K (1 or not, a multiple
    # of 16 or not; all below 2^31); every pointer is 16-byte aligned (checked by the callers); the step slot
    # None or an int32 tensor (and its alignment).
    key = (id(rule), id(c), len(states), weight.device.index, M == 1, N == 1, K == 1, M % 16 == 0, N % 16 == 0,
           K % 16 == 0, None if step_slot is None else step_slot.data_ptr() % 16 == 0)
    args = (_ws._nvmma_desc(dy, (c.BK, c.BM), gl.bfloat16), _ws._nvmma_desc(x, (c.BK, c.BN), gl.bfloat16),
            *_staging_descs(weight, states, c), weight, given[0], given[1], norm_sq, nonfinite, M, N, K, h, grad_scale,
            step_slot)
    return key, (rule, c), (programs,), args, lambda: _launch_constants(rule, c, len(states))


def _staging_descs(weight, states, c: F32WSConfig) -> tuple:
    """(w_desc, s0_desc, s1_desc) of a staged tile, fp32 blocks [ROWS, BN] as the rows lie in memory (an absent
    state's: the weight's, never copied: gluon_q8.copy_state counts the states' bytes N_STATE times), or three
    Nones. Rows are 4 N bytes apart, a multiple of 16 where the route sends a weight (N a multiple of 8)."""
    if not c.stage_slots:
        return None, None, None
    descs = [_ws._nvmma_desc(t, (c.ROWS, c.BN), gl.float32, _PLAIN_32) for t in (weight, *states)]
    descs += [descs[0]] * (3 - len(descs))
    return descs[0], descs[1], descs[2]


# The staging slots' layout: rows as they lie in memory, no swizzle (the epilogue reads a row a warp, 16
# contiguous bytes a thread: no bank conflict to avoid)
_PLAIN_32 = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _launch_constants(rule: Rule, c: F32WSConfig, n_state: int) -> tuple[dict, dict]:
    """(constexprs in the kernel's parameter order, compile options) of a rule, a config and its number of
    states."""
    constexprs = dict(GUARDED_UPDATE=_ws.guarded_update_gluon(rule), N_STATE=n_state, STAGES=c.STAGES, ROWS=c.ROWS,
                      GROUP_M=c.GROUP_M, MMA_REGS=c.mma_registers, SELF_LOAD=c.self_load, LOAD_CURSOR=c.load_cursor,
                      PREFETCH=c.prefetch, G_BUFS=c.g_buffers, STAGE_SLOTS=c.stage_slots,
                      STATE_EVICT="evict_first" if c.evict_first else "", num_warps=c.num_warps)
    return constexprs, dict(maxnreg=c.max_registers, enable_fp_fusion=False)


_LAUNCH = CachedLaunch(fused_linear_update_f32_ws_kernel)


def compile_for_sm90(rule: Rule, config: F32WSConfig = DEFAULT_F32_WS_CONFIG, M: int = 256, N: int = 256,
                     K: int = 128, slot: bool = False):
    """The kernel compiled for sm_90 without a GPU (descriptors built on CPU tensors, for their types only): the
    CompiledKernel, whose .asm holds "ttgir", "ptx" and (with ptxas) "cubin"; slot: the launch that reads its
    scalars from a step slot."""
    c = config
    constexprs, launch_options = _launch_constants(rule, c, len(rule.state))
    dy = torch.empty(K, M, dtype=torch.bfloat16)
    x = torch.empty(K, N, dtype=torch.bfloat16)
    w, states = torch.empty(M, N), [torch.empty(M, N) for _ in rule.state]
    w_desc, s0_desc, s1_desc = _staging_descs(w, states, c)
    args = dict(dy_desc=_ws._nvmma_desc(dy, (c.BK, c.BM), gl.bfloat16),
                x_desc=_ws._nvmma_desc(x, (c.BK, c.BN), gl.bfloat16), w_desc=w_desc, s0_desc=s0_desc,
                s1_desc=s1_desc, w_ptr=w, s0_ptr=torch.empty(M, N), s1_ptr=torch.empty(M, N),
                norm_sq_ptr=torch.empty(4, dtype=torch.float64), nonfinite_ptr=torch.empty(4, dtype=torch.int32),
                M=M, N=N, K=K, h=tuple(1.0 for _ in rule.scalar_names), grad_scale=1.0,
                step_slot=_ws._cpu_slot(rule) if slot else None, **constexprs)
    return _ws.compile_gluon_for_sm90(fused_linear_update_f32_ws_kernel, args, c.num_warps, launch_options)


# ---------------------------------------------------------------------------------------------
# Where the launcher uses this kernel (kernels.fused_linear_update with no tile given)
# ---------------------------------------------------------------------------------------------
# Measured in session 35 (H100, bench/results/2026-12-06-s35/call1 and call3; AdamW, do_bench medians, on
# 4096x14336, 14336x4096 and 4096x4096, against the fp32 route before it in the same run: gluon_update's
# two-program 64x128 tile at 256 tokens, its 128x128 to 4095, the Triton 128x128 persistent tile from 4096):
#   DEFAULT_F32_WS_CONFIG: 0.87-0.99x the route's time at 256 tokens, 0.93-0.97x at 512, 0.86-0.89x at 1024,
#     0.91-0.95x at 2048 (1.46-1.52x the unfused step at 256-1024, 1.28-1.29x at 2048); its loader-partition
#     twin (eight epilogue warps) within 1.5% of it at 2048-16384 and 4-11% behind it at 256-1024, the
#     prefetching and 32-row twins behind both;
#   TALL_F32_WS_CONFIG: at 3072 tokens 0.94-0.95x the route (0.96x the default split tile), at 4096 0.89-0.95x
#     (1.07x the unfused step on the two large shapes), at 6144 0.99-1.02x, at 8192 0.95-1.00x, at 16384
#     0.99-1.12x (the Triton tile stays there). Llama-3B's 4x1024 step (captured, checkpointing) with it forced:
#     0.323 s against 0.327 routed before (0.988x, call 2).
# Measured in session 36 (H200, bench/results/2026-12-06-s36/call2, the same shapes, against the route then):
#   TALL_ONE_BUFFER_F32_WS_CONFIG: 1.03-1.08x the two-buffer tile's time at 3072 tokens, 0.91-0.93x at 4096,
#     0.82-0.90x at 8192, 0.87-0.90x at 16384; against the Triton tile the route kept at 16384, 0.86-0.99x
#     (1.00-1.09x the unfused step at 4096-8192, 0.93-0.96x at 16384); its five-stage twin 1.00-1.06x its time.
# Measured in sessions 37 and 39 (H100, 3 interleaved rounds each: bench/results/2026-12-06-s37/call2 and
# bench/results/2026-12-07-s39/f32small.json, the latter's ranges here; the two agree within 0.01x):
#   STREAMED_F32_WS_CONFIG (v46): 0.91-0.93x the default's time at 256 tokens, 0.92-1.02x at 512, 0.92-0.95x at
#     768, 1.02-1.07x at 1024 (1.58-1.66x the unfused step at 256, 1.48-1.61x at 512, 1.55-1.66x at 768).
#   Its flake case (the wide model trained eagerly and captured, compared bit for bit) parted in 0 of 60 runs on
#   an H100 after session 37's barrier fix (1 of 16 before it, on an H200; none has come since).
# So until session 40: STREAMED_F32_WS_CONFIG from 256 tokens (below, not measured: gluon_update's route and the
# Triton tiles), DEFAULT_F32_WS_CONFIG from 896 (halfway between 768, where v46 leads it, and 1024, where it
# trails), the 128-row tile from 3072, its one-buffer twin from 4096 to ROUTE_MAX_K.
# Measured in session 40 (H100, bench/results/2026-12-07-s40/: call3/f32tall5.json 5 interleaved rounds, call5/
# f32mid.json 3, the same shapes):
#   TALL_SUBTILED_F32_WS_CONFIG (v47): 0.85-0.98x the two-buffer 128-row tile's time at 3072 tokens; 0.93-0.97x,
#     0.91-0.98x, 0.92-0.99x, 0.94-0.99x its one-buffer twin's at 3072, 4096, 8192, 16384 (call 1's 3 rounds:
#     0.90-0.96x, 0.94-1.03x, 0.92-1.02x at 4096-16384); against the default tile 1.18-1.24x at 1024 tokens,
#     1.07-1.11x at 1536, 0.95-1.03x at 2048, 0.87-0.99x at 2560.
# So from session 40: STREAMED_F32_WS_CONFIG from 256 tokens, DEFAULT_F32_WS_CONFIG from 896, and v47 from 2304
# (halfway between 2048, where it and the default tie within 5%, and 2560, where it leads) to ROUTE_MAX_K, each
# with at least gluon_q8.MIN_TILES tiles of its own.
# Measured in session 41 (H100, bench/results/2026-12-07-s41/call2: order.json and order46.json, 3 interleaved
# rounds, the same shapes), v49's twins against the tile they vary:
#   GROUPED_F32_WS_CONFIG (the default, GROUP_M = 16): 0.99-1.02x at 512 tokens, 0.98-1.01x at 1024, 0.95-0.96x
#     at 1536, 0.95x at 2048, 0.94-0.97x at 2560 (where v47 took 0.87-1.00x, leading on four shapes of five);
#     GROUP_M = 32 0.94-1.07x at 1536-2048, 64 1.01-1.14x.
#   STREAMED_GROUPED_F32_WS_CONFIG (v46, GROUP_M = 16): 0.99-1.02x at 256 and 512 tokens, 0.96-0.98x at 768;
#     GROUP_M = 32 0.98-1.12x.
#   ncu (call 2, 4096x14336 at 1024 tokens): DRAM reads 949 MB, 839 with GROUP_M = 16 and 798 with 32 (modelled
#   830-850 and 770-790), the kernel 630, 623 and 617 us: the bytes fell as modelled, the time by 1-2% where
#   4-9% was predicted, so at 1024 tokens these reads are not what bounds it; from 1536 tokens they count.
# So from session 41: STREAMED_F32_WS_CONFIG from 256 tokens, its grouped twin from 640 (halfway between 512,
# where they tie, and 768, where the twin leads), GROUPED_F32_WS_CONFIG from 896, and v47 from 2304 as before
# (the grouped tile took 0.93-1.00x v47's time at 2048 tokens, 0.95-1.12x at 2560).
# FORGE_NUM_GLUON_F32 in the environment (read at each call):
# 0 never, 1 or unset these ranges, a tile's label ('_' for ' ') that tile wherever the kernel applies (an A/B
# switch for benchmarks).
ROUTED = True
# (first K, tile), in order of K: the last one whose first K is at most K is taken
ROUTE_BY_K = ((256, STREAMED_F32_WS_CONFIG), (640, STREAMED_GROUPED_F32_WS_CONFIG), (896, GROUPED_F32_WS_CONFIG),
              (2304, TALL_SUBTILED_F32_WS_CONFIG))
ROUTE_MAX_K = 16384
ROUTE_CONFIGS = tuple(dict.fromkeys(c for _, c in ROUTE_BY_K))


def config_for(M: int, N: int, K: int) -> F32WSConfig | None:
    """The tile the launcher routes a (M, N, K) fp32 update to, or None: the last entry of ROUTE_BY_K whose first
    K is at most K, up to ROUTE_MAX_K; M and N multiples of 8 (TMA's 16-byte rows of bf16 operands), at least
    gluon_q8.MIN_TILES tiles of that tile's shape (an SM each)."""
    if M % 8 or N % 8 or K > ROUTE_MAX_K:
        return None
    tile = None
    for first_k, c in ROUTE_BY_K:
        if K >= first_k:
            tile = c
    if tile is None or triton.cdiv(M, tile.BM) * triton.cdiv(N, tile.BN) < _q8.MIN_TILES:
        return None
    return tile


def route_config(weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, states) -> F32WSConfig | None:
    """config_for's tile (or the tile FORGE_NUM_GLUON_F32=<label> names) for an fp32-regime update that passed
    the Triton launcher's checks (plain states, no accumulation buffer), else None: switched off, not an sm_90
    GPU, not bf16 operands, no tokens, M or N not a multiple of 8, fewer than MIN_TILES tiles, a tensor not
    contiguous or not 16-byte aligned."""
    forced = _ws.switched_tile("FORGE_NUM_GLUON_F32", ROUTED, (DEFAULT_F32_WS_CONFIG, *F32_WS_CANDIDATE_CONFIGS))
    if forced is False:
        return None
    if weight.device.type != "cuda" or weight.dtype != torch.float32 or x.dtype != torch.bfloat16:
        return None
    M, N = weight.shape
    K = x.shape[0]
    c = config_for(M, N, K) if forced is None else forced
    if forced is not None and (K == 0 or M % 8 or N % 8 or triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN) < _q8.MIN_TILES):
        return None
    if c is None:
        return None
    if not _ws._is_sm90(weight.device.index if weight.device.index is not None else torch.cuda.current_device()):
        return None
    for t in (weight, x, dy, *states):
        if not t.is_contiguous() or t.data_ptr() % 16:
            return None
    return c
