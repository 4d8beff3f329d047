"""Tile-level mirror of kernels/linear_update.py in NumPy: same grid, tile order, K-block loop,
masking and epilogue, op for op. Function names, argument order and flags follow the kernels.

What is mirrored exactly:
  * the program grid (pid_m, pid_n) and, inside a program, the K-block loop in order, with the
    same zero fill of out-of-range rows, columns and k;
  * the mainloop dot: fp32 operands as the FMA chain acc = fma(a_k, b_k, acc) over k in order
    (Triton's "ieee" FMA dot); bf16 operands through the Hopper tensor-core model
    (emulator/tensor_core.py) when the architecture has a verified model;
  * the epilogue: forge_num.rules.guarded_update bound to exact fp32 NumPy ops (emulator/rules.py).

What is not mirrored bit for bit: the order in which ``tl.sum`` adds a tile's fp64 squares for the
norm telemetry (a compiler-chosen tree). The emulator sums them in row-major order; both sums are
within the bound of proofs/telemetry.md of the exact Σ g², which tests check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forge_num.rules import Rule

from . import fp32
from .philox import CounterMap, q8_rounding_bits, rounding_bits
from .quant8 import QBLOCK, dequantize, quantize_block_sr
from .rounding import bf16_sr_bits, bf16_to_f32
from .rules import bind_guarded

def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _load_tile(mat: np.ndarray, rows: np.ndarray, cols: np.ndarray, fill) -> np.ndarray:
    """mat[rows][:, cols] with out-of-range entries replaced by ``fill`` (a masked tl.load)."""
    r_ok = rows < mat.shape[0]
    c_ok = cols < mat.shape[1]
    out = np.full((rows.size, cols.size), fill, dtype=mat.dtype)
    out[np.ix_(r_ok, c_ok)] = mat[np.ix_(rows[r_ok], cols[c_ok])]
    return out


def _store_tile(mat: np.ndarray, rows: np.ndarray, cols: np.ndarray, tile: np.ndarray) -> None:
    r_ok = rows < mat.shape[0]
    c_ok = cols < mat.shape[1]
    mat[np.ix_(rows[r_ok], cols[c_ok])] = tile[np.ix_(r_ok, c_ok)]


def dot_ieee(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Triton's fp32 FMA dot: acc[m, n] <- fma(a[m, k], b[k, n], acc[m, n]) for k in order."""
    for k in range(a.shape[1]):
        acc = fp32.fma(a[:, k : k + 1], b[k : k + 1, :], acc)
    return acc


def dot_bf16(a_bits: np.ndarray, b_bits: np.ndarray, acc: np.ndarray, arch: str) -> np.ndarray:
    """bf16 x bf16 -> fp32 tensor-core dot of ``arch`` (its verified bit-exact model)."""
    from .tensor_core import mainloop_model

    return mainloop_model(arch)(a_bits, b_bits, acc)


def weight_grad_tile(acc, x, dy, offs_m, offs_n, BK: int, mainloop: str, arch: str) -> np.ndarray:
    """acc[BM, BN] += dY[:, offs_m]ᵀ X[:, offs_n] over K in blocks of BK, in order (zero fill)."""
    K = x.shape[0]
    offs_k = np.arange(BK)
    for k0 in range(0, K, BK):
        rk = k0 + offs_k
        dy_tile = _load_tile(dy, rk, offs_m, 0)  # [BK, BM]
        x_tile = _load_tile(x, rk, offs_n, 0)  # [BK, BN]
        if mainloop == "ieee":
            acc = dot_ieee(dy_tile.T, x_tile, acc)
        else:
            acc = dot_bf16(dy_tile.T, x_tile, acc, arch)
    return acc


def tile_telemetry(g: np.ndarray, in_tile: np.ndarray, finite: np.ndarray) -> tuple[float, int]:
    """(Σ g² in fp64 -- squares exact, summed row-major --, number of non-finite g in the tile)."""
    g64 = g.astype(np.float64)
    with np.errstate(all="ignore"):
        sq = np.where(in_tile, g64 * g64, 0.0)
    return float(np.sum(sq.ravel())), int(np.sum(in_tile & ~finite))


def load_f32(stored: np.ndarray, bf16: bool) -> np.ndarray:
    """fp32 values of a loaded tile: fp32 storage as is, bf16 encodings (uint16) widened exactly."""
    return bf16_to_f32(stored) if bf16 else stored


def store_f32(x: np.ndarray, rand16, bf16: bool) -> np.ndarray:
    """What is stored for fp32 values x: x itself, or bf16 encodings rounded stochastically."""
    return bf16_sr_bits(x, rand16) if bf16 else x


def update_in_place(p_stored, states_stored, offs, g, guarded, h, grad_scale, seed, bf16: bool):
    """kernels.linear_update.update_in_place on loaded tiles: widen, apply the guarded rule in fp32,
    round for storage with the random bits of the elements' flat indices ``offs``. Returns
    (stored p, stored states, finite)."""
    p = load_f32(p_stored, bf16)
    s = [load_f32(t, bf16) for t in states_stored] + [p, p]
    p, s0, s1, finite = guarded(p, g, s[0], s[1], h, np.float32(grad_scale))
    if bf16:
        r_p, r_s0, r_s1 = rounding_bits(seed, offs)
    else:
        r_p = r_s0 = r_s1 = None
    new_states = [store_f32(x, r, bf16) for x, r, _ in zip((s0, s1), (r_s0, r_s1), states_stored)]
    return store_f32(p, r_p, bf16), new_states, finite


def update_in_place_q8(p_bits, states_q8, offs, g, guarded, h, grad_scale, seed):
    """kernels.linear_update.update_in_place_q8 on loaded tiles of whole quantization blocks:
    p_bits bf16 encodings; states_q8 a list of (codes uint8 [R, BN], scales f32 [R, BN/QBLOCK]),
    state 0 signed (m), state 1 unsigned (v). Returns (stored p, stored states, finite)."""
    p = bf16_to_f32(p_bits)
    signed = (True, False)
    s = [dequantize(c, sc, signed[i]) for i, (c, sc) in enumerate(states_q8)] + [p, p]
    p, s0, s1, finite = guarded(p, g, s[0], s[1], h, np.float32(grad_scale))
    r_p, r_m24, r_v24 = q8_rounding_bits(seed, offs)
    new_states = [quantize_block_sr(x, r, sg) for x, r, sg, _ in zip((s0, s1), (r_m24, r_v24), signed, states_q8)]
    return bf16_sr_bits(p, r_p), new_states, finite


@dataclass
class LinearUpdateResult:
    """What the fused kernel writes."""

    weight: np.ndarray
    states: list
    acc_out: np.ndarray | None  # the debug variant's stored accumulator (or the unfused dW)
    norm_sq: float
    nonfinite: int
    norm_sq_partials: np.ndarray


def fused_linear_update_kernel(
    w, states, x, dy, accum, *, rule: Rule | None, h, grad_scale, update: bool, store_acc: bool,
    BM: int, BN: int, BK: int, mainloop: str, arch: str = "sm_90", seed: int = 0, counter=None,
) -> LinearUpdateResult:
    """Run every program of the kernel's grid, in (pid_m, pid_n) order, on copies of the inputs.

    w and states as float32 (fp32 regime) or as uint16 bf16 encodings (bf16-sr regime)."""
    M, N = (w.shape if w is not None else (dy.shape[1], x.shape[1]))
    counter = CounterMap.of(counter, M * N, cols=N)  # the elements' Philox counters
    w = None if w is None else w.copy()
    states = [s if isinstance(s, tuple) else s.copy() for s in states]
    acc_out = np.zeros((M, N), np.float32) if store_acc else None
    tiles_n = cdiv(N, BN)
    partials = np.zeros(max(cdiv(M, BM) * tiles_n, 1), dtype=np.float64)  # one slot per tile
    nonfinite = 0
    guarded = bind_guarded(rule) if update else None
    q8 = bool(states) and isinstance(states[0], tuple)
    if q8:
        states = [(c.copy(), sc.copy()) for c, sc in states]
        if BN % QBLOCK:
            raise ValueError(f"the 8bit regime needs BN a multiple of {QBLOCK}, got {BN}")
    bf16 = w is not None and w.dtype == np.uint16
    zero = np.uint16(0) if bf16 else np.float32(0)
    for pid_m in range(cdiv(M, BM)):
        for pid_n in range(cdiv(N, BN)):
            offs_m = pid_m * BM + np.arange(BM)
            offs_n = pid_n * BN + np.arange(BN)
            in_tile = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            if accum is not None:  # the chain continues from the accumulation buffer
                acc = _load_tile(accum, offs_m, offs_n, np.float32(0))
            else:
                acc = np.zeros((BM, BN), dtype=np.float32)
            g = weight_grad_tile(acc, x, dy, offs_m, offs_n, BK, mainloop, arch)
            if store_acc:
                _store_tile(acc_out, offs_m, offs_n, g)
            if update and q8:
                offs = counter.of_tile(offs_m, offs_n)  # the elements' Philox counters
                blocks = offs_n[::QBLOCK] // QBLOCK  # block column of each QBLOCK of the tile
                p, new_states, finite = update_in_place_q8(
                    _load_tile(w, offs_m, offs_n, zero),
                    [(_load_tile(c, offs_m, offs_n, np.uint8(0)), _load_tile(sc, offs_m, blocks, np.float32(1)))
                     for c, sc in states], offs, g, guarded, h, grad_scale, seed)
                _store_tile(w, offs_m, offs_n, p)
                for (c, sc), (nc, nsc) in zip(states, new_states):
                    _store_tile(c, offs_m, offs_n, nc)
                    _store_tile(sc, offs_m, blocks, nsc)
            elif update:
                offs = counter.of_tile(offs_m, offs_n)  # Philox counters: flat indices in the parameter
                p, new_states, finite = update_in_place(
                    _load_tile(w, offs_m, offs_n, zero), [_load_tile(t, offs_m, offs_n, zero) for t in states],
                    offs, g, guarded, h, grad_scale, seed, bf16)
                _store_tile(w, offs_m, offs_n, p)
                for t, new in zip(states, new_states):
                    _store_tile(t, offs_m, offs_n, new)
            else:
                finite = np.isfinite(g)
            part, bad = tile_telemetry(g, in_tile, finite)
            partials[pid_m * tiles_n + pid_n] = part
            nonfinite += bad
    return LinearUpdateResult(w, states, acc_out, float(np.sum(partials)), nonfinite, partials)


def elementwise_update_kernel(param, grad, states, *, rule: Rule, h, grad_scale, seed: int = 0, counter=None):
    """The element-wise kernel: the same guarded rule on flattened (param, grad, state); param and
    states float32, or uint16 bf16 encodings (bf16-sr). ``grad`` float32. ``counter``: a
    philox.CounterMap (default: the flat index)."""
    bf16 = param.dtype == np.uint16
    flat = np.arange(param.size, dtype=np.int64)
    offs = CounterMap.of(counter, param.size).of_flat(flat)
    p, new_states, finite = update_in_place(
        param.reshape(-1), [t.reshape(-1) for t in states], offs, grad.reshape(-1).astype(np.float32),
        bind_guarded(rule), h, grad_scale, seed, bf16)
    return p.reshape(param.shape), [t.reshape(param.shape) for t in new_states], int(np.sum(~finite))
