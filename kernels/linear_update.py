"""The FORGE kernel: dW = dYᵀX computed one output tile at a time, the update rule applied in the
epilogue, in registers. dW never exists in memory.

Shapes (nn.Linear layout):  W [M, N] (out_features x in_features), X [K, N] (the layer's input,
K = tokens), dY [K, M] (the gradient of the layer's output), dW = dYᵀ X [M, N].

One program owns the tile rows [pid_m*BM, +BM) x columns [pid_n*BN, +BN) of W:

    acc = accum[rows, cols] or 0              fp32 [BM, BN]; accum: gradient accumulation buffer
    for k0 in 0, BK, 2BK, ... < K:            the K-block loop, in order
        acc = dot(dY[k0:k0+BK, rows]ᵀ, X[k0:k0+BK, cols], acc)    out-of-range k, rows, cols read as 0
    g = acc
    W, S0, S1 = guarded_update(W, g, S0, S1, h, grad_scale)      forge_num.rules, op for op
    partial[tile] = Σ g² (fp64), nonfinite[tile] = #non-finite g

The mainloop has two modes, fixed by the operand dtype:
  * fp32 operands, ``input_precision="ieee"``: Triton's FMA dot. Per output element it is the chain
    acc = fma(dY[k, m], X[k, n], acc) for k = 0, 1, ..., K-1 (in order; the zero padding of the last
    K block adds fma(0, 0, acc), which is acc except that it turns -0 into +0). The result does not
    depend on BM or BN; on BK only in the sign of a zero accumulator (proofs/fusion.md, Lemma 4).
  * bf16 operands: tensor cores (wgmma on sm_90), fp32 accumulation; each k16 instruction is a block
    FMA modelled bit for bit by forge_num.emulator.tensor_core on Hopper.

Flags (constexpr):
  UPDATE     apply the rule to W and its state (False: only the mainloop, for the unfused comparator,
             the norm-only pass of exact clipping and gradient accumulation)
  STORE_ACC  also store g (the accumulator, plus accum if HAS_ACCUM) to acc_out: the debug variant
             of the fused kernel, and the mainloop half of the unfused comparator
  HAS_ACCUM  start the accumulator from the fp32 buffer accum[M, N] (gradient accumulation over
             micro-batches: the chain continues from the previous micro-batches' sum). Written as
             the dot's initial value on purpose: Triton rewrites add(dot(a, b, 0), c) into
             dot(a, b, c) (its dot-add combine), so "accum + dot" would not be what runs.
  N_STATE    how many state tensors the rule keeps (0, 1 or 2)
  STAGED     (8bit regime, persistent programs) the epilogue reads the tile's accumulator back from
             the program's own slot of a scratch buffer in global memory, stage[program, BM, BN]
             (BM * BN * 4 bytes a program, resident in L2), one row sub-tile at a time, instead of
             holding it in registers beside the epilogue's values: the registers the accumulator held
             are free for the epilogue (the 8bit TMA 64x128 at a 128-register cap, two programs an SM:
             72 B of spills in eight row sub-tiles, against 280 B holding it in four), and the
             epilogue runs in the layout its loads choose, not the MMA layout. The values are the
             accumulator's: the same bits.

Launch with ``enable_fp_fusion=False`` (see kernels/ieee.py); the launchers in kernels/__init__.py do.
"""

import triton
import triton.language as tl

from .quant8 import QBLOCK, dequantize, quantize_block_sr
from .random import q8_rounding_bits, rounding_bits
from .rounding import bf16_sr_bits, bf16_to_f32


@triton.jit
def weight_grad_tile(
    acc, x_ptr, dy_ptr, x_desc, dy_desc, K, M, N,
    stride_xk, stride_xn, stride_dyk, stride_dym,
    offs_m, offs_n, m0, n0,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """acc[BM, BN] += dY[:, offs_m]ᵀ X[:, offs_n] over the whole K, in K blocks of BK, in order.

    Two ways to bring the operand tiles in, with the same values in the same order (so the same
    bits): USE_TMA, the Hopper tensor-memory accelerator through the descriptors x_desc [K, N] and
    dy_desc [K, M] (block [BK, BN] and [BK, BM] at rows k0, columns n0 or m0), which fills the rows
    and columns past the tensor's edge with zeros in hardware; otherwise masked pointer loads with
    other=0 (cp.async on sm_90)."""
    if USE_TMA:
        for k0 in range(0, K, BK):
            dy = dy_desc.load([k0, m0])
            x = x_desc.load([k0, n0])
            acc = tl.dot(tl.trans(dy), x, acc, input_precision=INPUT_PRECISION)
        return acc
    offs_k = tl.arange(0, BK)
    in_m = offs_m < M
    in_n = offs_n < N
    # Pointers to the dY tile [BK, BM] and the X tile [BK, BN] of the first K block, in 64-bit
    # offsets (K * stride can pass 2^31), then advanced by BK rows per block: one 64-bit add per
    # pointer and block instead of recomputing every offset (the address arithmetic was about half
    # of the loop's PTX instructions beside 4 wgmma per block at 64x128x64).
    dy_ptrs = dy_ptr + offs_k[:, None].to(tl.int64) * stride_dyk + offs_m[None, :].to(tl.int64) * stride_dym
    x_ptrs = x_ptr + offs_k[:, None].to(tl.int64) * stride_xk + offs_n[None, :].to(tl.int64) * stride_xn
    # tl.cast, not .to: a stride equal to 1 arrives as a Python int (Triton specializes it), e.g. dY of
    # a layer with one output feature
    dy_step = tl.cast(stride_dyk, tl.int64) * BK
    x_step = tl.cast(stride_xk, tl.int64) * BK
    for k0 in range(0, K, BK):
        in_k = offs_k < K - k0
        dy = tl.load(dy_ptrs, mask=in_k[:, None] & in_m[None, :], other=0.0)
        x = tl.load(x_ptrs, mask=in_k[:, None] & in_n[None, :], other=0.0)
        acc = tl.dot(tl.trans(dy), x, acc, input_precision=INPUT_PRECISION)
        dy_ptrs += dy_step
        x_ptrs += x_step
    return acc


@triton.jit
def tile_telemetry(g, in_tile, finite):
    """(Σ g² over the tile in fp64, number of non-finite g) -- g² is exact in fp64 (48 bits).
    telemetry_terms and reduce_telemetry are the same in two steps, but written as those two calls
    this function compiled to other SASS for the column epilogue (the ops in another order: more
    spills), so its text is kept as measured."""
    g64 = g.to(tl.float64)
    sq = tl.where(in_tile, g64 * g64, 0.0)
    norm_sq = tl.sum(tl.sum(sq, axis=1), axis=0)
    nonfinite = tl.sum(tl.sum(tl.where(in_tile & (finite == 0), 1, 0), axis=1), axis=0)
    return norm_sq, nonfinite


@triton.jit
def telemetry_terms(g, in_tile, finite):
    """tile_telemetry's terms before their reduction, for sub-tiles whose terms are added first (the 8bit
    row epilogue): (g² in fp64, 0 outside the tile; 1 where g is not finite, else 0)."""
    g64 = g.to(tl.float64)
    return tl.where(in_tile, g64 * g64, 0.0), tl.where(in_tile & (finite == 0), 1, 0)


@triton.jit
def reduce_telemetry(sq, bad):
    """(Σ sq, Σ bad) over a tile of telemetry_terms: tile_telemetry in two steps."""
    return tl.sum(tl.sum(sq, axis=1), axis=0), tl.sum(tl.sum(bad, axis=1), axis=0)


@triton.jit
def step_scalars(step_slot, h, grad_scale, seed):
    """(h, grad_scale, seed) of this launch: as passed, or, where ``step_slot`` is a pointer, read from
    that slot when the kernel runs, so that a launch captured in a CUDA graph and replayed applies each
    step's scalars (its arguments are fixed at capture). The slot is int32 words (kernels.step_slot_words
    writes them): h_0 .. h_{n-1} and grad_scale as their fp32 bit patterns, then the Philox key's low and
    high 32 bits. Loads and bit casts only: the values are the words' bits, as passing them would give.
    ``h`` passed with a slot gives only the count n (its values are not used)."""
    if step_slot is not None:
        n: tl.constexpr = len(h)
        loaded = ()
        for i in tl.static_range(n):
            loaded = loaded + (tl.load(step_slot + i).to(tl.float32, bitcast=True),)
        h = loaded
        grad_scale = tl.load(step_slot + n).to(tl.float32, bitcast=True)
        key_lo = tl.load(step_slot + n + 1).to(tl.uint32, bitcast=True).to(tl.uint64)
        key_hi = tl.load(step_slot + n + 2).to(tl.uint32, bitcast=True).to(tl.uint64)
        seed = key_lo | (key_hi << 32)
    return h, grad_scale, seed


# Triton specializes every int argument on its value (== 1, % 16 == 0) and its range (i32, i64,
# u64). The Philox key is a uniform 64-bit value, so, specialized, it would select among five compiled
# variants of every configuration (u64/i64 x divisible by 16 or not, i32 when < 2^31), each compiled
# when a training run first draws one. The key is typed u64 and the counter base i64 (the values the
# Philox counters are computed in: tl.randint4x converts its key to uint64 first, so no bit changes),
# and neither is specialized: one compiled kernel per configuration, whatever the step's keys.
_UNSPECIALIZED = ["seed", "rand_base"]


@triton.jit(do_not_specialize=_UNSPECIALIZED)
def fused_linear_update_kernel(
    # tensors
    w_ptr, s0_ptr, s1_ptr, x_ptr, dy_ptr, accum_ptr, acc_out_ptr, norm_sq_ptr, nonfinite_ptr,
    # STAGED: fp32 scratch [programs, BM, BN] (one slot a program of the persistent grid); else unused
    stage_ptr,
    # USE_TMA: TMA descriptors of x [K, N] (block [BK, BN]) and dy [K, M] (block [BK, BM]); else None
    x_desc, dy_desc,
    # 8bit regime: fp32 block scales of the states, [M, n_blocks] with n_blocks = cdiv(N, QBLOCK)
    scale0_ptr, scale1_ptr, n_blocks,
    # sizes and strides (W, S0, S1, accum, acc_out are contiguous [M, N])
    M, N, K, stride_xk, stride_xn, stride_dyk, stride_dym,
    # the rule's per-step scalars (a tuple of fp32), the gradient scale (clipping coefficient) and
    # the Philox key of this parameter and step (bf16 storage: stochastic rounding); element (r, c)
    # draws counter r * rand_stride + c + rand_base (its flat index in the whole parameter; for a
    # shard, in the unsharded parameter: emulator.philox.CounterMap); rand_rows None, or an int64
    # [M] tensor for gathered rows: row r is row rand_rows[r] of the parameter (counter R(r) * ...)
    h, grad_scale, seed: tl.uint64, rand_stride, rand_base: tl.int64, rand_rows,
    # None, or an int32 pointer: the slot h, grad_scale and seed are read from when the kernel runs
    # (step_scalars; a launch captured in a CUDA graph)
    step_slot,
    # telemetry: tile (pid_m, pid_n) writes slot pid_m * slots_n + pid_n, slots_n = cdiv(N, BN)
    slots_n,
    # compile-time
    GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr,
    STATE_Q8: tl.constexpr,
    UPDATE: tl.constexpr, STORE_ACC: tl.constexpr, HAS_ACCUM: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EPILOGUE_SPLIT: tl.constexpr,
    PERSISTENT: tl.constexpr = False, GROUP_M: tl.constexpr = 8, USE_TMA: tl.constexpr = False,
    STAGED: tl.constexpr = False,
):
    """One program per tile (grid [cdiv(M, BM), cdiv(N, BN)]), or PERSISTENT: a 1-D grid of fewer
    programs, each walking tiles pid, pid + P, pid + 2P, ... in grouped order (GROUP_M tile rows
    share the X tiles in L2), so that the next tile's loads can start during this tile's epilogue.
    Scheduling only: every tile computes the same bits and writes the same telemetry slot."""
    tl.static_assert(not STAGED or (PERSISTENT and STATE_Q8), "STAGED needs PERSISTENT programs and STATE_Q8")
    h, grad_scale, seed = step_scalars(step_slot, h, grad_scale, seed)
    if PERSISTENT:
        stage = stage_ptr + tl.program_id(0).to(tl.int64) * (BM * BN)  # this program's scratch slot
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
            # grouped order: GROUP_M consecutive tile rows, column by column
            group = tile // (GROUP_M * tiles_n)
            first_m = group * GROUP_M
            rows = tl.minimum(tiles_m - first_m, GROUP_M)
            pid_m = first_m + (tile % (GROUP_M * tiles_n)) % rows
            pid_n = (tile % (GROUP_M * tiles_n)) // rows
            linear_update_tile(
                pid_m, pid_n, w_ptr, s0_ptr, s1_ptr, x_ptr, dy_ptr, x_desc, dy_desc, accum_ptr, acc_out_ptr,
                norm_sq_ptr, nonfinite_ptr, stage, scale0_ptr, scale1_ptr, n_blocks, M, N, K, stride_xk, stride_xn, stride_dyk,
                stride_dym, h, grad_scale, seed, rand_stride, rand_base, rand_rows, slots_n, GUARDED_UPDATE, N_STATE,
                BF16_STORAGE, STATE_Q8, UPDATE, STORE_ACC, HAS_ACCUM, INPUT_PRECISION, BM, BN, BK, EPILOGUE_SPLIT, USE_TMA,
                STAGED)
    else:
        linear_update_tile(
            tl.program_id(0), tl.program_id(1), w_ptr, s0_ptr, s1_ptr, x_ptr, dy_ptr, x_desc, dy_desc, accum_ptr,
            acc_out_ptr,
            norm_sq_ptr, nonfinite_ptr, stage_ptr, scale0_ptr, scale1_ptr, n_blocks, M, N, K, stride_xk, stride_xn,
            stride_dyk, stride_dym, h, grad_scale, seed, rand_stride, rand_base, rand_rows, slots_n, GUARDED_UPDATE,
            N_STATE, BF16_STORAGE, STATE_Q8, UPDATE, STORE_ACC, HAS_ACCUM, INPUT_PRECISION, BM, BN, BK, EPILOGUE_SPLIT, USE_TMA,
            STAGED)


@triton.jit
def linear_update_tile(
    pid_m, pid_n,
    w_ptr, s0_ptr, s1_ptr, x_ptr, dy_ptr, x_desc, dy_desc, accum_ptr, acc_out_ptr, norm_sq_ptr, nonfinite_ptr,
    stage_ptr, scale0_ptr, scale1_ptr, n_blocks,
    M, N, K, stride_xk, stride_xn, stride_dyk, stride_dym,
    h, grad_scale, seed, rand_stride, rand_base, rand_rows, slots_n,
    GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr,
    STATE_Q8: tl.constexpr,
    UPDATE: tl.constexpr, STORE_ACC: tl.constexpr, HAS_ACCUM: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EPILOGUE_SPLIT: tl.constexpr, USE_TMA: tl.constexpr,
    STAGED: tl.constexpr,
):
    """The tile (pid_m, pid_n): mainloop, epilogue, telemetry slot (the module docstring's pseudocode).
    ``stage_ptr``: this program's scratch slot [BM, BN] where STAGED."""
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)

    in_tile = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    if HAS_ACCUM:
        acc = tl.load(accum_ptr + offs, mask=in_tile, other=0.0)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    g = weight_grad_tile(
        acc, x_ptr, dy_ptr, x_desc, dy_desc, K, M, N, stride_xk, stride_xn, stride_dyk, stride_dym,
        offs_m, offs_n, pid_m * BM, pid_n * BN, BM, BN, BK, INPUT_PRECISION, USE_TMA,
    )

    if STATE_Q8:
        # 8bit regime: the epilogue needs whole quantization blocks (QBLOCK elements of a row), so
        # the tile's width is a multiple of QBLOCK and the epilogue is split by *rows*: EPILOGUE_SPLIT
        # row sub-tiles of [BM / EPILOGUE_SPLIT, BN], each holding whole blocks. Rows are independent
        # (a block's scale comes from its own row), so the split changes no bit of W, codes or scales.
        if STORE_ACC:
            tl.store(acc_out_ptr + offs, g, mask=in_tile)
        # the row sub-tiles' telemetry terms are added element by element and reduced once a tile: a
        # reduction crosses the tile's warps (shuffles, shared memory, barriers), and one a sub-tile was
        # 2-7% of the 8bit epilogue's instructions (bench/NOTES.md, session 17: v29). Not in the column
        # epilogue: its sub-tiles' terms are 4-8x larger, and keeping them live spilled 130-500 B more
        if STAGED:
            sq, bad = update_rows_q8_staged(
                g, stage_ptr, pid_m * BM, offs_n, M, N, w_ptr, s0_ptr, scale0_ptr, s1_ptr, scale1_ptr, n_blocks, h,
                grad_scale, seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE, EPILOGUE_SPLIT)
        else:
            sq, bad = update_rows_q8_split(
                g, pid_m * BM, offs_n, M, N, w_ptr, s0_ptr, scale0_ptr, s1_ptr, scale1_ptr, n_blocks, h, grad_scale,
                seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE, EPILOGUE_SPLIT)
        norm_sq, nonfinite = reduce_telemetry(sq, bad)
    else:
        norm_sq, nonfinite = update_columns(
            g, offs_m, pid_n * BN, M, N, w_ptr, s0_ptr, s1_ptr, acc_out_ptr, h, grad_scale, seed,
            rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE, BF16_STORAGE, UPDATE, STORE_ACC, EPILOGUE_SPLIT)

    slot = pid_m * slots_n + pid_n  # one slot per tile: every slot is written, no fill needed
    tl.store(norm_sq_ptr + slot, norm_sq)
    tl.store(nonfinite_ptr + slot, nonfinite)


@triton.jit
def column_halves(x, BM: tl.constexpr, BN: tl.constexpr):
    """x[:, :BN/2], x[:, BN/2:] of a [BM, BN] tile (reshape to [BM, 2, BN/2], move the 2 last, split)."""
    return tl.split(tl.permute(tl.reshape(x, (BM, 2, BN // 2)), (0, 2, 1)))


@triton.jit
def row_halves(x, BM: tl.constexpr, BN: tl.constexpr):
    """x[:BM/2, :], x[BM/2:, :] of a [BM, BN] tile (reshape to [2, BM/2, BN], move the 2 last, split)."""
    return tl.split(tl.permute(tl.reshape(x, (2, BM // 2, BN)), (1, 2, 0)))


# The column epilogue of the fp32 and bf16-sr regimes: EPILOGUE_SPLIT column sub-tiles of
# [BM, BN / EPILOGUE_SPLIT], one after the other, each loading its W and state, applying the rule and
# storing them (W, S0 and S1 of a whole tile next to the accumulator do not fit in registers: ptxas
# spilled kilobytes per thread at 128x128; a quarter of them does). Element-wise, so the split
# changes no bit of W or state; the telemetry partials add up in a balanced tree (pairwise_sum).
@triton.jit
def column_subtiles(g, SPLIT: tl.constexpr):
    """(g[:, 0:SW], g[:, SW:2SW], ...): the SPLIT (1, 2, 4 or 8) column sub-tiles of g [BM, W], SW = W / SPLIT.
    Triton functions cannot recurse, so the halving levels are written out."""
    BM: tl.constexpr = g.shape[0]
    W: tl.constexpr = g.shape[1]
    # (a constexpr `if` does not end the function at its `return`: each level is an `else`)
    if SPLIT == 1:
        return (g,)
    else:
        gl, gr = column_halves(g, BM, W)
        if SPLIT == 2:
            return gl, gr
        else:
            g0, g1 = column_halves(gl, BM, W // 2)
            g2, g3 = column_halves(gr, BM, W // 2)
            if SPLIT == 4:
                return g0, g1, g2, g3
            else:
                tl.static_assert(SPLIT == 8, "EPILOGUE_SPLIT must be 1, 2, 4 or 8")
                g00, g01 = column_halves(g0, BM, W // 4)
                g10, g11 = column_halves(g1, BM, W // 4)
                g20, g21 = column_halves(g2, BM, W // 4)
                g30, g31 = column_halves(g3, BM, W // 4)
                return g00, g01, g10, g11, g20, g21, g30, g31


@triton.jit
def subtile_addresses(offs_m, n, M, N, SW: tl.constexpr):
    """(flat offsets [BM, SW] in int64, in-bounds mask, column indices) of the columns [n, n + SW)."""
    offs_n = n + tl.arange(0, SW)
    in_tile = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    return offs, in_tile, offs_n


@triton.jit
def load_subtile_state(offs_m, n, M, N, w_ptr, s0_ptr, s1_ptr, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr,
                       SW: tl.constexpr):
    """load_state of the columns [n, n + SW) of the tile's rows: (p, s0, s1)."""
    offs, in_tile, _ = subtile_addresses(offs_m, n, M, N, SW)
    return load_state(w_ptr, s0_ptr, s1_ptr, offs, in_tile, N_STATE, BF16_STORAGE)


@triton.jit
def element_counters(offs_m, offs_n, M, rand_stride, rand_base, rand_rows):
    """The Philox counters of the tile rows offs_m x columns offs_n (emulator.philox.CounterMap.of_tile):
    R(r) * rand_stride + c + rand_base with R(r) = r, or rand_rows[r] (gathered rows; 0 past M) where
    rand_rows is a pointer. None is a constexpr: without gathered rows the code is the plain product."""
    if rand_rows is None:
        rows = offs_m.to(tl.int64)
    else:
        rows = tl.load(rand_rows + offs_m, mask=offs_m < M, other=0)
    return rows[:, None] * rand_stride + offs_n[None, :] + rand_base


@triton.jit
def finish_subtile(
    state, g, offs_m, n, M, N, w_ptr, s0_ptr, s1_ptr, acc_out_ptr, h, grad_scale, seed, rand_stride, rand_base,
    rand_rows,
    GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr,
    UPDATE: tl.constexpr, STORE_ACC: tl.constexpr,
):
    """The epilogue on the columns [n, n + SW) with their W and state loaded (state = (p, s0, s1)):
    store g (debug), apply the guarded rule and store W and state; return (Σ g² in fp64, number of
    non-finite g) over the sub-tile."""
    offs, in_tile, offs_n = subtile_addresses(offs_m, n, M, N, g.shape[1])
    if STORE_ACC:
        tl.store(acc_out_ptr + offs, g, mask=in_tile)
    if UPDATE:
        p, s0, s1 = state
        counters = element_counters(offs_m, offs_n, M, rand_stride, rand_base, rand_rows)
        finite = apply_and_store(p, s0, s1, w_ptr, s0_ptr, s1_ptr, offs, in_tile, g, h, grad_scale, seed, counters,
                                 GUARDED_UPDATE, N_STATE, BF16_STORAGE)
    else:
        finite = (g == g) & (tl.abs(g) < float("inf"))
    return tile_telemetry(g, in_tile, finite)


@triton.jit
def update_columns(
    g, offs_m, n0, M, N, w_ptr, s0_ptr, s1_ptr, acc_out_ptr, h, grad_scale, seed, rand_stride, rand_base, rand_rows,
    GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr,
    UPDATE: tl.constexpr, STORE_ACC: tl.constexpr, SPLIT: tl.constexpr,
):
    """The column epilogue (see above) on the tile g [BM, W] at columns n0."""
    SW: tl.constexpr = g.shape[1] // SPLIT
    subtiles = column_subtiles(g, SPLIT)
    state = None
    sqs = ()
    bads = ()
    for j in tl.static_range(SPLIT):
        if UPDATE:
            state = load_subtile_state(offs_m, n0 + j * SW, M, N, w_ptr, s0_ptr, s1_ptr, N_STATE, BF16_STORAGE, SW)
        sq, bad = finish_subtile(state, subtiles[j], offs_m, n0 + j * SW, M, N, w_ptr, s0_ptr, s1_ptr, acc_out_ptr,
                                 h, grad_scale, seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE,
                                 BF16_STORAGE, UPDATE, STORE_ACC)
        sqs = sqs + (sq,)
        bads = bads + (bad,)
    return pairwise_sum(sqs, SPLIT), pairwise_sum(bads, SPLIT)


@triton.jit
def pairwise_sum(xs, N: tl.constexpr):
    """((x0 + x1) + (x2 + x3)) + ...: the sum of N (1, 2, 4 or 8) partials in a balanced tree."""
    if N == 1:
        return xs[0]
    else:
        if N == 2:
            return xs[0] + xs[1]
        else:
            if N == 4:
                return (xs[0] + xs[1]) + (xs[2] + xs[3])
            else:
                return ((xs[0] + xs[1]) + (xs[2] + xs[3])) + ((xs[4] + xs[5]) + (xs[6] + xs[7]))


@triton.jit
def update_rows_q8_split(
    g, m0, offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h, grad_scale, seed, rand_stride,
    rand_base, rand_rows, GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, SPLIT: tl.constexpr,
):
    """The 8bit epilogue on the rows [m0, m0 + R) of the tile g [R, BN], in SPLIT row sub-tiles; the
    sub-tiles' telemetry terms ([R / SPLIT, BN]) summed element by element."""
    if SPLIT == 1:
        return update_rows_q8(
            g, m0 + tl.arange(0, g.shape[0]), offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks,
            h, grad_scale, seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE)
    else:
        tl.static_assert(SPLIT == 2 or SPLIT == 4, "the 8bit EPILOGUE_SPLIT must be 1, 2 or 4")
        R: tl.constexpr = g.shape[0]
        gt, gb = row_halves(g, R, g.shape[1])
        a_sq, a_bad = update_rows_q8_half(
            gt, m0, offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h, grad_scale, seed,
            rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE, SPLIT // 2)
        b_sq, b_bad = update_rows_q8_half(
            gb, m0 + R // 2, offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h, grad_scale,
            seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE, SPLIT // 2)
        return a_sq + b_sq, a_bad + b_bad


@triton.jit
def update_rows_q8_half(
    g, m0, offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h, grad_scale, seed, rand_stride,
    rand_base, rand_rows, GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, SPLIT: tl.constexpr,
):
    """update_rows_q8_split one level down (SPLIT in 1, 2)."""
    if SPLIT == 1:
        return update_rows_q8(
            g, m0 + tl.arange(0, g.shape[0]), offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks,
            h, grad_scale, seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE)
    else:
        R: tl.constexpr = g.shape[0]
        gt, gb = row_halves(g, R, g.shape[1])
        a_sq, a_bad = update_rows_q8(
            gt, m0 + tl.arange(0, R // 2), offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h,
            grad_scale, seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE)
        b_sq, b_bad = update_rows_q8(
            gb, m0 + R // 2 + tl.arange(0, R // 2), offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr,
            n_blocks, h, grad_scale, seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE)
        return a_sq + b_sq, a_bad + b_bad


@triton.jit
def update_rows_q8_staged(
    g, stage_ptr, m0, offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h, grad_scale, seed,
    rand_stride, rand_base, rand_rows, GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, SPLIT: tl.constexpr,
):
    """The 8bit epilogue on the tile g [BM, BN] at rows m0 through the program's scratch slot (STAGED):
    g stored to stage_ptr[BM, BN] row-major, then SPLIT row sub-tiles [BM / SPLIT, BN] loaded back one
    at a time and updated; their telemetry terms summed element by element, in sub-tile order.
    Barriers: the slot is read by threads other than the ones that wrote it (a bar.sync orders a
    block's global-memory accesses as it does its shared-memory ones), and the program's next tile
    overwrites it."""
    BM: tl.constexpr = g.shape[0]
    BN: tl.constexpr = g.shape[1]
    R: tl.constexpr = BM // SPLIT
    tl.static_assert(R * SPLIT == BM, "the staged epilogue's SPLIT must divide BM")
    cols = tl.arange(0, BN)
    tl.store(stage_ptr + tl.arange(0, BM)[:, None] * BN + cols[None, :], g)
    tl.debug_barrier()
    sq = tl.zeros((R, BN), dtype=tl.float64)
    bad = tl.zeros((R, BN), dtype=tl.int32)
    for j in tl.static_range(SPLIT):
        rows = j * R + tl.arange(0, R)
        g_rows = tl.load(stage_ptr + rows[:, None] * BN + cols[None, :])
        sq_j, bad_j = update_rows_q8(
            g_rows, m0 + rows, offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h, grad_scale,
            seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE)
        sq += sq_j
        bad += bad_j
    tl.debug_barrier()
    return sq, bad


@triton.jit
def update_rows_q8(
    g, offs_m, offs_n, M, N, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, h, grad_scale, seed,
    rand_stride, rand_base, rand_rows,
    GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr,
):
    """The 8bit epilogue on a row sub-tile of whole blocks; its telemetry terms (telemetry_terms)."""
    loaded = load_q8(w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, offs_m, offs_n, M, N, N_STATE)
    in_tile = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    finite = update_in_place_q8(loaded, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, offs_m, offs_n, M, N,
                                g, h, grad_scale, seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE, N_STATE)
    return telemetry_terms(g, in_tile, finite)


@triton.jit
def load_f32(ptr, offs, mask, BF16: tl.constexpr, EVICT: tl.constexpr = tl.constexpr("")):
    """fp32 values at ptr[offs]: fp32 storage, or bf16 storage widened exactly (bit shift). EVICT: the access's
    cache eviction policy, "" (the default) or "evict_first" (on sm_90 an L1 and an L2 hint: for a stream read
    and written once, which should not evict a GEMM's operands from L2); the values are the same either way."""
    if BF16:
        return bf16_to_f32(tl.load(ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.uint16,
                                                                                                 bitcast=True))
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT)


@triton.jit
def store_f32(ptr, offs, mask, x, rand16, BF16: tl.constexpr, EVICT: tl.constexpr = tl.constexpr("")):
    """Store x: as fp32, or stochastically rounded to bf16 with the 16 random bits rand16. EVICT: as load_f32's."""
    if BF16:
        tl.store(ptr + offs, bf16_sr_bits(x, rand16).to(tl.bfloat16, bitcast=True), mask=mask, eviction_policy=EVICT)
    else:
        tl.store(ptr + offs, x, mask=mask, eviction_policy=EVICT)


@triton.jit
def load_state(w_ptr, s0_ptr, s1_ptr, offs, mask, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr):
    """(p, s0, s1): W and its N_STATE state tensors at offs, in fp32 (absent states: p, never stored)."""
    p = load_f32(w_ptr, offs, mask, BF16_STORAGE)
    s0 = p
    s1 = p
    if N_STATE >= 1:
        s0 = load_f32(s0_ptr, offs, mask, BF16_STORAGE)
    if N_STATE >= 2:
        s1 = load_f32(s1_ptr, offs, mask, BF16_STORAGE)
    return p, s0, s1


@triton.jit
def apply_and_store(p, s0, s1, w_ptr, s0_ptr, s1_ptr, offs, mask, g, h, grad_scale, seed, counters,
                    GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr):
    """The guarded rule on loaded (p, s0, s1) with gradient g in fp32 registers, stored back at
    offs; returns where g was finite. BF16_STORAGE rounds each stored value stochastically with its
    slice of the elements' Philox bits (update_in_place)."""
    p, s0, s1, finite = GUARDED_UPDATE(p, g, s0, s1, h, grad_scale)
    if BF16_STORAGE:
        r_p, r_s0, r_s1 = rounding_bits(seed, counters)
    else:
        r_p = offs
        r_s0 = offs
        r_s1 = offs
    store_f32(w_ptr, offs, mask, p, r_p, BF16_STORAGE)
    if N_STATE >= 1:
        store_f32(s0_ptr, offs, mask, s0, r_s0, BF16_STORAGE)
    if N_STATE >= 2:
        store_f32(s1_ptr, offs, mask, s1, r_s1, BF16_STORAGE)
    return finite


@triton.jit
def update_in_place(w_ptr, s0_ptr, s1_ptr, offs, mask, g, h, grad_scale, seed, counters,
                    GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr):
    """Load W (and its N_STATE state tensors) at offs, apply the guarded rule with gradient g in
    fp32 registers, store them back; return where g was finite. Shared by the fused epilogue and
    the element-wise kernel, so the two differ only in where g comes from.

    BF16_STORAGE ("bf16-sr" regime): W and state are stored as bf16, widened exactly on load and
    stochastically rounded on store, with the random bits of the elements' Philox counters
    (``counters``: their flat row-major indices in the whole parameter) under the key seed: slices
    r_p, r_m16, r_v16 of kernels/random.py."""
    p, s0, s1 = load_state(w_ptr, s0_ptr, s1_ptr, offs, mask, N_STATE, BF16_STORAGE)
    return apply_and_store(p, s0, s1, w_ptr, s0_ptr, s1_ptr, offs, mask, g, h, grad_scale, seed, counters,
                           GUARDED_UPDATE, N_STATE, BF16_STORAGE)


@triton.jit
def q8_addresses(offs_m, offs_n, M, N, n_blocks):
    """(offs, in_tile, soffs, smask) of a row sub-tile [R, BN] of whole blocks: its elements' flat
    offsets and mask, and its blocks' offsets into the [M, n_blocks] scales and their mask."""
    BN: tl.constexpr = offs_n.shape[0]
    J: tl.constexpr = BN // QBLOCK
    tl.static_assert(J * QBLOCK == BN, "the 8bit regime needs BN to be a multiple of QBLOCK")
    in_tile = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    block = tl.min(tl.reshape(offs_n, (J, QBLOCK)), axis=1) // QBLOCK  # block column of each block
    soffs = offs_m[:, None].to(tl.int64) * n_blocks + block[None, :]
    smask = (offs_m[:, None] < M) & (block[None, :] < n_blocks)
    return offs, in_tile, soffs, smask


@triton.jit
def load_q8(w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, offs_m, offs_n, M, N, N_STATE: tl.constexpr):
    """(p, s0, s1): W and its dequantized states of a row sub-tile in fp32 (absent states: p, never
    stored)."""
    offs, in_tile, soffs, smask = q8_addresses(offs_m, offs_n, M, N, n_blocks)
    p = load_f32(w_ptr, offs, in_tile, True)
    s0 = p
    s1 = p
    if N_STATE >= 1:
        s0 = dequantize(tl.load(c0_ptr + offs, mask=in_tile, other=0), tl.load(scale0_ptr + soffs, mask=smask, other=1.0),
                        True)
    if N_STATE >= 2:
        s1 = dequantize(tl.load(c1_ptr + offs, mask=in_tile, other=0), tl.load(scale1_ptr + soffs, mask=smask, other=1.0),
                        False)
    return p, s0, s1


@triton.jit
def update_in_place_q8(loaded, w_ptr, c0_ptr, scale0_ptr, c1_ptr, scale1_ptr, n_blocks, offs_m, offs_n, M, N,
                       g, h, grad_scale, seed, rand_stride, rand_base, rand_rows, GUARDED_UPDATE: tl.constexpr,
                       N_STATE: tl.constexpr):
    """update_in_place for the 8bit regime on a tile [R, BN] of whole quantization blocks, from the
    values load_q8 loaded there: W is bf16 (stochastic rounding, slice r_p); state 0 is signed E4M3
    codes (m: slice r_m24), state 1 unsigned E5M3 codes (v >= 0: slice r_v24), each with an fp32
    power-of-two scale per block of QBLOCK elements of a row (kernels/quant8.py); the slices from the 8bit
    table, one Philox call a pair of counters (random.q8_rounding_bits). The rule runs on the
    dequantized fp32 state and the fp32 gradient; the new scale comes from the updated block. An
    element whose gradient was not finite keeps its dequantized value, which is then requantized under
    its block's new scale."""
    offs, in_tile, soffs, smask = q8_addresses(offs_m, offs_n, M, N, n_blocks)
    p, s0, s1 = loaded
    p, s0, s1, finite = GUARDED_UPDATE(p, g, s0, s1, h, grad_scale)
    counters = element_counters(offs_m, offs_n, M, rand_stride, rand_base, rand_rows)  # Philox counters
    r_p, r_m24, r_v24 = q8_rounding_bits(seed, counters)
    store_f32(w_ptr, offs, in_tile, p, r_p, True)
    if N_STATE >= 1:
        codes0, scales0 = quantize_block_sr(s0, r_m24, True)
        tl.store(c0_ptr + offs, codes0, mask=in_tile)
        tl.store(scale0_ptr + soffs, scales0, mask=smask)
    if N_STATE >= 2:
        codes1, scales1 = quantize_block_sr(s1, r_v24, False)
        tl.store(c1_ptr + offs, codes1, mask=in_tile)
        tl.store(scale1_ptr + soffs, scales1, mask=smask)
    return finite


@triton.jit(do_not_specialize=_UNSPECIALIZED)
def elementwise_update_kernel(
    p_ptr, g_ptr, s0_ptr, s1_ptr, norm_sq_ptr, nonfinite_ptr,
    numel, h, grad_scale, seed: tl.uint64, rand_cols, rand_stride, rand_base: tl.int64, rand_rows, step_slot,
    GUARDED_UPDATE: tl.constexpr, N_STATE: tl.constexpr, BF16_STORAGE: tl.constexpr, BLOCK: tl.constexpr,
    RAND_REMAP: tl.constexpr = False,
):
    """The same guarded rule on (param, grad, state) flattened: for every parameter that is not a
    fused linear weight, and as the second half of the unfused comparator. Element i draws Philox
    counter i + rand_base, or with RAND_REMAP (a column shard of a parameter seen as [rows, cols])
    (i // rand_cols) * rand_stride + i % rand_cols + rand_base, and with rand_rows (gathered rows: an
    int64 pointer, else None) rand_rows[i // rand_cols] in place of i // rand_cols
    (emulator.philox.CounterMap). ``step_slot``: None, or where h, grad_scale and seed are read
    (step_scalars)."""
    h, grad_scale, seed = step_scalars(step_slot, h, grad_scale, seed)
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < numel
    g = tl.load(g_ptr + offs, mask=in_range, other=0.0).to(tl.float32)
    if rand_rows is not None:
        rows = tl.load(rand_rows + offs // rand_cols, mask=in_range, other=0)
        counters = rows * rand_stride + offs % rand_cols + rand_base
    elif RAND_REMAP:
        counters = (offs // rand_cols) * rand_stride + offs % rand_cols + rand_base
    else:
        counters = offs + rand_base
    finite = update_in_place(p_ptr, s0_ptr, s1_ptr, offs, in_range, g, h, grad_scale, seed, counters,
                             GUARDED_UPDATE, N_STATE, BF16_STORAGE)
    g64 = g.to(tl.float64)
    tl.store(norm_sq_ptr + pid, tl.sum(tl.where(in_range, g64 * g64, 0.0), axis=0))
    tl.store(nonfinite_ptr + pid, tl.sum(tl.where(in_range & (finite == 0), 1, 0), axis=0))
