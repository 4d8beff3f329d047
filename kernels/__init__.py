"""forge_num.kernels: the Triton kernels and their launchers (check -> allocate -> launch).

Public functions (CUDA tensors; CPU tensors only under ``TRITON_INTERPRET=1`` after
``forge_num.interpreter.install()``):

    fused_linear_update(weight, x, dy, states, rule, h, *, grad_scale=1.0, accum=None,
                        config=None, acc_out=None) -> UpdateStats
        dW = dyᵀ x tile by tile, rule applied to weight and states in place; dW never stored
        (``acc_out``: the debug variant, which also stores the accumulator tile).
    linear_mainloop(x, dy, *, accum=None, config=None) -> dW (fp32)
        the same mainloop storing its accumulator: the first half of the unfused comparator.
    elementwise_update(param, grad, states, rule, h, *, grad_scale=1.0) -> UpdateStats
        the same guarded rule on (param, grad, state): non-linear parameters, and the second half
        of the unfused comparator.
    unfused_linear_update(...) -> UpdateStats       linear_mainloop followed by elementwise_update
    weight_grad_norm_sq(x, dy, accum=None) -> 0-d fp64   Σ dW² without storing dW
    accumulate_weight_grad(x, dy, accum) -> None         accum <- the chain dyᵀ x started at accum

Regimes, chosen by the storage of the weight and its states: float32 weight and states (fp32);
bfloat16 weight and states (bf16-sr); bfloat16 weight and ``Q8State`` states (8bit: uint8 codes and
fp32 block scales, fused kernel only — the element-wise update of an 8bit parameter is the fused
kernel with K = 0 from its gradient). bf16-sr and 8bit round stochastically and take ``seed=``,
the Philox key of the parameter and step (forge_num.emulator.philox.derive_seed).

UpdateStats.norm_sq is Σ g² of the unscaled gradient in fp64: per-tile partials (fp64, exact
squares, one slot per tile) summed in a fixed order on the device when first read, so a run is
deterministic; nonfinite counts the gradient elements that were not finite (those elements of W
and state were left unchanged).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import struct
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import triton

# ceil(a / b) for host ints: the emulator's twin of tl.cdiv. (``triton.cdiv`` is a ConstexprFunction
# in Triton 3.6: about 5 us a call on the host, several calls per launch; the launcher's host time
# is on the critical path of a training step, bench/NOTES.md "v7".)
from forge_num.emulator.linear_update import cdiv as _cdiv
from forge_num.emulator.philox import CounterMap, check_counter_rows
from forge_num.rules import Rule

from .launch_cache import CachedLaunch, alignment_bits, descriptor_builder
from .linear_update import elementwise_update_kernel, fused_linear_update_kernel
from .quant8 import QBLOCK as _QBLOCK
from .rules import guarded_update_jit

__all__ = [
    "UpdateStats",
    "Q8State",
    "TileConfig",
    "fused_linear_update",
    "linear_mainloop",
    "elementwise_update",
    "unfused_linear_update",
    "weight_grad_norm_sq",
    "accumulate_weight_grad",
    "configs_for",
    "launcher_tile",
    "step_slot_size",
    "step_slot_words",
]

QBLOCK = int(_QBLOCK)  # 8bit regime: elements of a row per quantization block
ELEMENTWISE_BLOCK = 1024


class Q8State(NamedTuple):
    """One optimizer state in the 8bit regime (kernels/quant8.py): codes and per-block scales."""

    codes: torch.Tensor  # uint8 [M, N]: E4M3 for state 0 (signed m), E5M3 for state 1 (v >= 0)
    scales: torch.Tensor  # float32 [M, cdiv(N, QBLOCK)]: a power of two per QBLOCK elements of a row

    @staticmethod
    def zeros(M: int, N: int, device=None) -> "Q8State":
        """A zero state (all codes 0; scales 1: any finite scale dequantizes code 0 to 0)."""
        return Q8State(torch.zeros(M, N, dtype=torch.uint8, device=device),
                       torch.ones(M, _cdiv(N, QBLOCK), dtype=torch.float32, device=device))


class UpdateStats:
    """What an update reports: ``norm_sq`` (0-d float64, Σ g² of the unscaled gradient) and
    ``nonfinite`` (0-d int64, the number of non-finite gradient elements).

    The kernels leave one partial per tile (per program of the element-wise kernel), ``partials`` =
    (float64 [T], int32 [T]); the totals are summed on the device when first read. A launch so pays
    no reduction of its own, and ForgeOptimizer sums a whole step's partials at once (the launcher's
    host time is on the critical path of a training step: bench/NOTES.md, "v7"). Unpacks like the
    NamedTuple it replaced: ``norm_sq, nonfinite = stats``."""

    __slots__ = ("partials", "_totals")

    def __init__(self, norm_sq_partials: torch.Tensor, nonfinite_partials: torch.Tensor):
        self.partials = (norm_sq_partials, nonfinite_partials)
        self._totals = None

    def _sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._totals is None:
            norm_sq, nonfinite = self.partials
            self._totals = (norm_sq.sum(), nonfinite.sum(dtype=torch.int64))
        return self._totals

    @property
    def norm_sq(self) -> torch.Tensor:
        return self._sums()[0]

    @property
    def nonfinite(self) -> torch.Tensor:
        return self._sums()[1]

    def __iter__(self):
        return iter(self._sums())

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        return self._sums()[i]

    def __repr__(self) -> str:
        return f"UpdateStats(norm_sq={self.norm_sq!r}, nonfinite={self.nonfinite!r})"


@dataclass(frozen=True)
class TileConfig:
    BM: int
    BN: int
    BK: int
    num_warps: int = 4
    num_stages: int = 3
    epilogue_split: int = 1  # the epilogue runs on this many column sub-tiles (8bit regime: row sub-tiles)
    persistent: int = 0  # 0: one program per tile; n > 0: n programs per SM, each looping over tiles
    tma: bool = False  # load the operand tiles through TMA descriptors where the operands allow it
    # ptxas register cap per thread (0: ptxas chooses). A cap lets more programs share a
    # multiprocessor's 65,536 registers, so one program's epilogue overlaps another's mainloop:
    # 128 registers x 256 threads = two 8-warp programs per SM (ptxas then spills what does not fit).
    max_registers: int = 0
    # 8bit regime, persistent programs: the epilogue reads the accumulator back from a scratch slot of
    # BM x BN fp32 a program (in L2) instead of holding it in registers (kernels/linear_update.py, STAGED)
    staged: bool = False

    @property
    def label(self) -> str:
        """Short name for tables: 64x128x64 w4 s4 e4 [p2] [tma] [r128] [st]."""
        return (f"{self.BM}x{self.BN}x{self.BK} w{self.num_warps} s{self.num_stages} e{self.epilogue_split}"
                + (f" p{self.persistent}" if self.persistent else "") + (" tma" if self.tma else "")
                + (f" r{self.max_registers}" if self.max_registers else "") + (" st" if self.staged else ""))

    def __post_init__(self):
        for name in ("BM", "BN", "BK"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two >= 16, got {v}")
        if self.epilogue_split not in (1, 2, 4, 8) or self.BN // self.epilogue_split < 8:
            raise ValueError(f"TileConfig.epilogue_split must be 1, 2, 4 or 8 with BN/split >= 8, got {self}")
        if not (isinstance(self.persistent, int) and 0 <= self.persistent <= 8):
            raise ValueError(f"TileConfig.persistent must be an int in [0, 8] (programs per SM), got {self}")
        if not (isinstance(self.max_registers, int) and (self.max_registers == 0 or 32 <= self.max_registers <= 255)):
            raise ValueError(f"TileConfig.max_registers must be 0 (no cap) or an int in [32, 255], got {self}")
        if self.staged and not self.persistent:
            raise ValueError(f"TileConfig.staged needs persistent programs (one scratch slot a program), got {self}")


# Tile shapes the launcher may use, per mainloop mode. Every one of them is a test case
# (tests/test_interpreter_kernels.py, tests/test_gpu_exactness.py), so autotuning can never pick
# an unverified configuration. The fp32 "ieee" mode runs on the FMA pipes (no tensor cores): small
# K blocks keep the operand tiles in shared memory small. bf16: the usual Hopper wgmma shapes, with
# the epilogue split into column sub-tiles until ptxas reports no spills for AdamW (sm_90,
# contiguous operands; `python -m bench.registers` prints registers and spills per configuration;
# an unsplit 128x128 epilogue spilled ~4.8 KB per thread and ran 3.5x slower than the unfused step).
IEEE_CONFIGS = (
    TileConfig(64, 64, 16, num_warps=4, num_stages=2, epilogue_split=2),
    TileConfig(64, 64, 32, num_warps=4, num_stages=2, epilogue_split=2),
    TileConfig(128, 64, 16, num_warps=8, num_stages=2, epilogue_split=2),
)
BF16_CONFIGS = (
    TileConfig(128, 64, 64, num_warps=8, num_stages=3, epilogue_split=2),
    TileConfig(128, 64, 64, num_warps=4, num_stages=4, epilogue_split=4),
    TileConfig(64, 128, 64, num_warps=4, num_stages=4, epilogue_split=4),
    TileConfig(64, 64, 64, num_warps=4, num_stages=4, epilogue_split=2),
    TileConfig(64, 128, 32, num_warps=8, num_stages=4, epilogue_split=4),
    # TMA mainloops, promoted from the candidates after the H200 runs of 2026-12-03 (default_config).
    TileConfig(64, 128, 64, num_warps=4, num_stages=4, epilogue_split=4, tma=True),
    TileConfig(128, 128, 64, num_warps=8, num_stages=4, epilogue_split=4, tma=True),
    # promoted after H200 session 5 (2026-12-03, bench/results/2026-12-03-h200-s5/): the persistent
    # TMA 128x128 (fp32 storage, K >= LARGE_K) and the register-capped TMA 128x128, two programs
    # per SM (bf16 storage, K >= BF16_SR_LARGE_K); default_config says why.
    TileConfig(128, 128, 64, num_warps=8, num_stages=4, epilogue_split=4, persistent=1, tma=True),
    TileConfig(128, 128, 64, num_warps=8, num_stages=3, epilogue_split=8, tma=True, max_registers=128),
    TileConfig(64, 128, 64, num_warps=4, num_stages=4, epilogue_split=4, persistent=2, tma=True),
    # promoted after H200 session 6 (bench/results/2026-12-03-h200-s6/): the 64x64 capped at 128
    # registers, four programs per SM (bf16 storage, BF16_SR_MID_K <= K < BF16_SR_LARGE_K).
    TileConfig(64, 64, 64, num_warps=4, num_stages=3, epilogue_split=4, max_registers=128),
)
INTERPRETER_CONFIG = TileConfig(32, 32, 16, num_warps=4, num_stages=1, epilogue_split=2)
# 8bit regime: the epilogue needs whole quantization blocks, so BN is a multiple of QBLOCK, and an
# epilogue split is by rows (two halves / four quarters of whole blocks). Since session 15 the
# defaults are the tiles whose registers let two programs share an SM (default_q8_config says where
# each is the default and what they were measured at). The one-program tiles that were the defaults
# until then (an unsplit 32x128 and a 64x128 in two row halves) stay in the list, slower at every
# point timed, so that the regime's GPU tests keep drawing the epilogue's other two splits.
Q8_SMALL_K_CONFIG = TileConfig(32, 128, 64, num_warps=8, num_stages=3, epilogue_split=4)
Q8_LARGE_K_CONFIG = TileConfig(64, 128, 64, num_warps=8, num_stages=3, epilogue_split=4, max_registers=128)
# v24 (session 20): the TMA 64x128 with four stages, whose wgmma ptxas does not serialize (the pointer
# 64x128's C7515), the default wherever its operands are TMA-addressable and it has tiles enough
# (default_q8_config).
Q8_TMA_CONFIG = TileConfig(64, 128, 64, num_warps=8, num_stages=4, epilogue_split=4, tma=True, max_registers=128)
# v31 (session 22): its staged twin on tall weights (default_q8_config): persistent, two programs an SM,
# the accumulator through each program's scratch slot in L2 and the update in eight row sub-tiles.
Q8_TALL_CONFIG = TileConfig(64, 128, 64, num_warps=8, num_stages=4, epilogue_split=8, persistent=2, tma=True,
                            max_registers=128, staged=True)
Q8_CONFIGS = {
    torch.bfloat16: (Q8_SMALL_K_CONFIG, Q8_LARGE_K_CONFIG, Q8_TMA_CONFIG, Q8_TALL_CONFIG,
                     TileConfig(32, 128, 64, num_warps=8, num_stages=3),
                     TileConfig(64, 128, 64, num_warps=8, num_stages=4, epilogue_split=2)),
    torch.float32: (TileConfig(16, 128, 16, num_warps=4, num_stages=2),),
}
INTERPRETER_Q8_CONFIG = TileConfig(16, 128, 16, num_warps=4, num_stages=1)


# Candidates: configurations the launcher never picks. bench/kernels.py times them beside the ones
# above and tests/test_gpu_exactness.py::test_candidate_configs checks their bits on the GPU; one is
# promoted into the lists above once it is measured faster and verified.
#   bf16, fp32 or bf16-sr storage (ptxas, sm_90a, AdamW, `python bench/registers.py --candidates`,
#   spills in bytes per thread as fp32 / bf16-sr regime):
#   * the persistent capped 128x128, two 8-warp programs per SM at 128 registers (468 B / 536 B):
#     the fastest bf16-sr tile at K = 16384 in session 5 (0.75-0.78x), beside the plain capped one
#     promoted there (0.73-0.74x); slower in fp32 (0.69-0.90x).
#   Dropped after session 5, each slower than a verified tile at every one of its timed points (the
#   numbers in bench/results/2026-12-03-h200-s5/): the pointer 128x128 (a TMA twin was faster), the
#   8-way persistent TMA 128x128 (0.78-0.89x at K = 4096 against the promoted 4-way's 0.85-0.97x),
#   the 3-per-SM 64x128 (0.77-1.00x at K <= 1024 against 1.02-1.16x) and the 128x256 (nowhere the
#   fastest in fp32; 0.63-0.64x in bf16-sr at K = 16384 against the capped 128x128's 0.73-0.78x).
#   In the fp32 regime the register caps lost everywhere: a second program per SM did not pay for
#   the spills and the shorter pipeline. A persistent 128x256 TMA tile with 3 stages needs 278,552 B
#   of shared memory, over the H200's 232,448 (OutOfResources, 2026-12-03).
#   Session 6 (bench/results/2026-12-03-h200-s6/): the persistent capped 128x128 was the fastest
#   bf16-sr tile at 14336x4096, K = 4096 and 8192 (1.01x / 1.09x the next), even at 4096x4096;
#   not promoted on two shapes. A prefetching epilogue (each sub-tile's W and state loads issued
#   one sub-tile ahead, the first before the mainloop; commit 53468fc) was removed: its 64x128 TMA
#   8-way, 64x64 4-way and persistent TMA 128x128 8-way tiles were slower than the default at every
#   fp32 point timed (K = 256, 1024, 4096; e.g. 5.57 against 5.15 ms at 28672x8192, K = 4096): the
#   epilogue's loads were not what held the short kernels back.
#   Session 8 (bench/results/2026-12-03-h200-s8/): warp-specialized persistent TMA tiles (Triton
#   3.6's `tl.range(warp_specialize=True)` on the tile loop; on sm_90 it partitions 4-warp programs
#   into a TMA producer and two ping-pong consumer warp groups) were dropped: in every regime and
#   test they updated W wrongly on the GPU while their stored accumulator was right, and
#   nondeterministically (hypothesis could not replay its failure), i.e. a race in the compiler's
#   partitioning; and they were slower than the default at every point timed (1.8-2.3x its time on
#   weights of 3072x3072 and up).
#   Session 9 (bench/results/2026-12-03-h200-s9/), two epilogue changes, each bit-exact on the GPU
#   and dropped:
#   * tiles that prefetched their epilogue's W, m and v into L2 before the mainloop
#     (`prefetch.global.L2` per 128-byte line, no register held; commit a729915): slower than their
#     twins at 26 of 28 fp32 points with K <= 4096 (the TMA 64x128 by 5-19% at K <= 1024); ncu saw
#     DRAM throughput and L2 hit rate unchanged (46.6% / 57% against 45.1% / 58% at 4096x4096, K = 256);
#   * the column epilogue's telemetry reduced across warps once per tile instead of once per
#     sub-tile (51 -> 33 bar.sync in the 64x128 TMA tile; commit 0e5b400): within -3..+4% of the
#     twins on the defaults' own ranges (geometric means 0.97-1.02 over five shapes a K), so the
#     barriers are not what holds the epilogue back. Only the persistent 128x128 gained at
#     K <= 2048 (1.02-1.09x), where it is not the default.
#   8bit: see CANDIDATE_Q8_CONFIGS.
CANDIDATE_CONFIGS = (
    TileConfig(128, 128, 64, num_warps=8, num_stages=3, epilogue_split=8, persistent=2, tma=True, max_registers=128),
    # bf16-sr below BF16_SR_LARGE_K: the 64x64 with three programs per SM (168 registers, no spill);
    # session 6: 1.05-1.18x faster than the 64x64 default at K = 2048 and 4096, behind the promoted
    # four-per-SM tile (128 registers) at every point.
    TileConfig(64, 64, 64, num_warps=4, num_stages=4, epilogue_split=4, max_registers=168),
    # (session 14, dropped: bf16-sr with fewer elements a thread, after ncu put 17% of the default's
    # warp cycles on the instruction cache. Against the default at 4096x4096 and 14336x4096: 64x32 w4
    # r128 1.00x and 1.01x at K = 256, 0.90x and 0.85x at 1024; 64x64 w8 r128 0.73-0.77x; 64x16 w4
    # r128 0.57-0.83x. bench/results/2026-12-04-h200-s14/call3.)
)
# 8bit (session 15, bench/results/2026-12-05-h200-s15/): the two tiles that won were promoted
# (Q8_SMALL_K_CONFIG, Q8_LARGE_K_CONFIG); the others were slower than one of them at every point
# timed (4096x4096 and 14336x4096, K = 256, 1024, 4096, 8192): 32x128 w8 e4 r96 (within 2% of the
# uncapped twin), 16x128 w8 e4 r80 (three programs per SM: 1.19-1.63x the promoted tiles' time),
# 32x128 w4 e4 r168 (1.06-1.36x), 64x128 w8 s4 e4 (1.4-1.9x: one program per SM), and the session-5
# 16x128 w4 (1.15-1.65x) and 128x128 w8 e4 (1.04-1.50x, K = 256-16384: the default from 8192 tokens
# until then).
# Session 16 (call 1, bench/results/2026-12-05-s16/, an H100 that time): the v23 candidates
# were slower than the defaults or within 3% of them at 4096x14336 and 8192x8192, K = 256, 1024,
# 4096, 16384, and were dropped: the 32x128 r128 whose epilogue issued each row quarter's loads one
# quarter ahead (0.99-1.03x the small-K default: the 16.5% of long-scoreboard samples ncu put on
# those loads were not time the loads cost), its 64x128 twin (0.92-0.95x the large-K default at
# 4096-16384), the 64x128 e2 r128 (0.94-1.03x) and the 64x128 w4 e4 (0.73-0.91x).
# v24: ptxas serializes the wgmma instructions of the large-K default (C7515: "non wgmma
# instructions defining accumulator registers ... between start and end of the pipeline stage"),
# as of every pointer-mainloop 8-warp 64x128 8bit tile with row quarters; with TMA loads none of
# them has it (e4 uncapped, r128 with 3 or 4 stages, e2 r128, p2 r128; `python bench/registers.py
# --precision 8bit --candidates` on the CPU).
# Session 20 (bench/results/2026-12-05-s20/, H200): the four-stage TMA 64x128 was promoted
# (Q8_TMA_CONFIG; default_q8_config has its numbers). With the wide Philox products its three-stage
# twin took 0.89-1.10x its time (slower at 17 of 25 points, up to 1.10x from 4096 tokens; 0.89x at
# 4096x14336, K = 16384), and the TMA 32x128 was the fastest only at 512x2048, K = 2048 (0.89x the
# small-K default's time, where the promoted tile took 1.05x): both stay candidates.
# Session 22 (v31, bench/results/2026-12-05-s22/): staged epilogues (TileConfig.staged: the accumulator
# through a per-program scratch slot in L2, its registers free for the epilogue), two programs an SM.
# On the CPU (ptxas of Triton 3.6, sm_90a, AdamW): the persistent 64x128 e4 spills 560 B (the plain
# default 280 B), staged in e8 72 B; the staged 128x128 e16 244 B (unstaged, capped: ~2 KB). Time over
# the TMA default's at 4096x14336, 8192x8192, 8192x2048, 2048x8192, 2048x2048, K = 1024 and 4096: the
# persistent 64x128 0.99-1.25 (H200; its spills), the staged 128x128 e16 1.15-1.69 (H200), both
# dropped; the staged 64x128 e8 promoted on tall weights (Q8_TALL_CONFIG, default_q8_config has its
# numbers). v32, dropped: the staged 64x128's programs started up to 30 or 70 us late, spread over the
# programs, so that two sharing an SM would run out of step (one's epilogue beside the other's
# mainloop): 30 us within -0.02..+0.05 of the unstaggered tile's ratio at eight of ten points (H100),
# 1.13x and 1.06x its time at 2048x2048; 70 us slower at all ten (the sleep's cost: no phase held).
CANDIDATE_Q8_CONFIGS: tuple[TileConfig, ...] = (
    TileConfig(64, 128, 64, num_warps=8, num_stages=3, epilogue_split=4, tma=True, max_registers=128),
    TileConfig(32, 128, 64, num_warps=8, num_stages=3, epilogue_split=4, tma=True),  # 126 registers, no spill
)


def configs_for(input_dtype: torch.dtype) -> tuple[TileConfig, ...]:
    return IEEE_CONFIGS if input_dtype == torch.float32 else BF16_CONFIGS


# Whether the kernels are the interpreter's: Triton decides it when it decorates them (TRITON_INTERPRET
# set at import), so a module constant, not an environment read on every launch (several a launch,
# ~1.5 us each on this project's CPU: the launcher's host time bounds a training step, bench/NOTES.md).
_INTERPRETED = not hasattr(fused_linear_update_kernel, "params")


def _interpreting() -> bool:
    return _INTERPRETED


# ------------------------------------------------------------------------------------------
# checks
# ------------------------------------------------------------------------------------------


def _check_device(*tensors: torch.Tensor) -> None:
    if _interpreting():
        from forge_num import interpreter

        if not interpreter.installed():
            raise RuntimeError(
                "TRITON_INTERPRET=1 is set but forge_num.interpreter.install() was not called: the "
                "interpreter's fma and dot would not match the GPU"
            )
        return
    for t in tensors:
        if t.device.type != "cuda":
            raise ValueError(
                f"forge_num.kernels needs CUDA tensors, got a tensor on {t.device}; on other devices "
                f"use forge_num.torch_backend"
            )
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"tensors are on different devices: {sorted(map(str, devices))}")


def _check_one_device(*tensors: torch.Tensor) -> None:
    """_check_device, its common case first: every tensor on the first one's CUDA device. Anything
    else (the interpreter, another device) goes through _check_device, which raises its errors."""
    if not _interpreting():
        device = tensors[0].device
        if device.type == "cuda":
            for t in tensors:
                if t.device != device:
                    break
            else:
                return
    _check_device(*tensors)


_OPERAND_DTYPES = (torch.float32, torch.bfloat16)


def _plain_operands_ok(weight: torch.Tensor, x, dy) -> bool:
    """Whether x and dy pass _check_linear_inputs against a contiguous 2-D weight, read in few
    attribute reads: tensors, 2-D, of one dtype, float32 or bfloat16, [K, N] and [K, M], no negative
    stride. False only sends the call through the full checks (they raise what is wrong)."""
    if not (isinstance(x, torch.Tensor) and isinstance(dy, torch.Tensor)):
        return False
    shape = weight.shape
    x_shape, dy_shape, x_dtype = x.shape, dy.shape, x.dtype
    return not (len(shape) != 2 or len(x_shape) != 2 or len(dy_shape) != 2 or dy.dtype != x_dtype
                or x_dtype not in _OPERAND_DTYPES or x_shape[0] != dy_shape[0] or x_shape[1] != shape[1]
                or dy_shape[1] != shape[0] or min(x.stride()) < 0 or min(dy.stride()) < 0
                or not weight.is_contiguous())


def _plain_linear_ok(weight: torch.Tensor, x, dy, states, rule: Rule) -> bool:
    """Whether fused_linear_update's tensor checks all pass in their common case, read in few
    attribute reads: weight 2-D and contiguous (its dtype checked by _check_regime before); x and dy
    as _plain_operands_ok (_check_linear_inputs); a list or tuple of at most min(2, len(rule.state))
    plain states, none 8bit, each of the weight's dtype and shape, contiguous (_check_states). True
    implies that each of those checks passes; False only sends the call through them (they raise what
    is wrong)."""
    if type(states) not in (list, tuple) or len(states) > 2 or len(states) > len(rule.state):
        return False
    shape, dtype = weight.shape, weight.dtype
    for st in states:  # first: an 8bit call leaves here, before the operands are read
        if (not isinstance(st, torch.Tensor) or st.dtype != dtype or st.shape != shape or _is_q8(st)
                or not st.is_contiguous()):
            return False
    return _plain_operands_ok(weight, x, dy)


def _plain_q8_linear_ok(weight: torch.Tensor, x, dy, states, rule: Rule) -> bool:
    """_plain_linear_ok for the 8bit regime: a bfloat16 weight; x and dy as _plain_operands_ok; a list
    or tuple of at most len(rule.state) 8bit states, each codes uint8 [M, N] and scales float32
    [M, cdiv(N, QBLOCK)], both contiguous (_check_q8_states). True implies that _check_fp32_like,
    _check_linear_inputs and _check_q8_states pass; False only sends the call through them."""
    if (weight.dtype != torch.bfloat16 or type(states) not in (list, tuple) or len(states) > len(rule.state)
            or not _plain_operands_ok(weight, x, dy)):
        return False
    M, N = weight.shape
    scales_shape = (M, _cdiv(N, QBLOCK))
    for st in states:
        if not (isinstance(st, tuple) and _is_q8(st)):  # a Q8State or the like (unpacked by the checks)
            return False
        codes, scales = st.codes, st.scales
        if (codes.dtype != torch.uint8 or codes.shape != (M, N) or not codes.is_contiguous()
                or scales.dtype != torch.float32 or scales.shape != scales_shape or not scales.is_contiguous()):
            return False
    return True


def _check_fp32_like(name: str, t: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {str(dtype).removeprefix('torch.')} like the weight "
                        f"({_REGIME_OF[dtype]} regime), got {t.dtype}")
    if t.shape != ref.shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")


# Storage dtype of weight and state -> regime. "bf16-sr": both bf16, widened exactly on load, the
# update computed in fp32 registers, stochastically rounded on store (kernels/rounding.py).
_REGIME_OF = {torch.float32: "fp32", torch.bfloat16: "bf16-sr"}


def _check_regime(name: str, t: torch.Tensor, seed) -> bool:
    """True for bf16 storage. Checks the dtype and, for bf16, the Philox key."""
    if t.dtype not in _REGIME_OF:
        raise TypeError(f"{name} must be float32 (fp32 regime) or bfloat16 (bf16-sr regime), got {t.dtype}")
    bf16 = t.dtype == torch.bfloat16
    if bf16 and (seed is None or not 0 <= int(seed) < 2**64):
        raise ValueError(
            f"the bf16-sr regime rounds stochastically and needs seed= (a 64-bit key, e.g. "
            f"forge_num.emulator.philox.derive_seed(user_seed, step, param_id)), got {seed!r}")
    return bf16


def _check_states(states: Sequence[torch.Tensor], ref: torch.Tensor, rule: Rule) -> list:
    states = list(states)
    if len(states) > 2 or len(states) > len(rule.state):
        raise ValueError(f"rule {rule.name} keeps at most {len(rule.state)} state tensors, got {len(states)}")
    for name, s in zip(rule.state, states):
        _check_fp32_like(f"state {name!r}", s, ref, ref.dtype)
    return states


def _is_q8(state) -> bool:
    """An 8bit state: anything with ``codes`` and ``scales`` (Q8State, or the optimizers' own)."""
    return hasattr(state, "codes") and hasattr(state, "scales")


def _check_q8_states(states, weight: torch.Tensor, rule: Rule) -> list:
    states = list(states)
    if weight.dtype != torch.bfloat16:
        raise TypeError(f"the 8bit regime keeps the weight in bfloat16, got {weight.dtype}")
    if len(states) > len(rule.state) or not all(_is_q8(st) for st in states):
        raise ValueError(f"8bit states must be {len(rule.state)} or fewer Q8State(codes, scales), got {states!r:.200}")
    M, N = weight.shape
    for name, st in zip(rule.state, states):
        if st.codes.dtype != torch.uint8 or tuple(st.codes.shape) != (M, N) or not st.codes.is_contiguous():
            raise ValueError(f"state {name!r}: codes must be contiguous uint8 [{M}, {N}], got "
                             f"{st.codes.dtype} {tuple(st.codes.shape)}")
        nb = _cdiv(N, QBLOCK)
        if st.scales.dtype != torch.float32 or tuple(st.scales.shape) != (M, nb) or not st.scales.is_contiguous():
            raise ValueError(f"state {name!r}: scales must be contiguous float32 [{M}, {nb}], got "
                             f"{st.scales.dtype} {tuple(st.scales.shape)}")
    return states


# (rule, h): the last h that passed _check_scalars as a tuple of exact floats. Such a tuple cannot
# change, and this reference keeps it alive, so `is` identifies it: the optimizer hands every layer
# of a group the same h within a step (ForgeOptimizer._prepare_state's memo), checked once.
_SCALARS_CHECKED: tuple = (None, None)


def _check_scalars(rule: Rule, h: Sequence[float], grad_scale: float) -> tuple:
    global _SCALARS_CHECKED
    checked = _SCALARS_CHECKED
    if not (h is checked[1] and rule is checked[0]):
        given = h
        h = tuple(float(v) for v in h)
        if len(h) != len(rule.scalar_names):
            raise ValueError(f"rule {rule.name} takes {len(rule.scalar_names)} scalars {rule.scalar_names}, got {len(h)}")
        for name, v in zip(rule.scalar_names, h):
            if not math.isfinite(v):
                raise ValueError(f"hyper-parameter scalar {name}={v} is not finite")
        if type(given) is tuple and all(type(v) is float for v in given):
            _SCALARS_CHECKED = (rule, given)
            h = given
    grad_scale = float(grad_scale)
    if not (math.isfinite(grad_scale) and grad_scale >= 0.0):
        raise ValueError(f"grad_scale must be finite and >= 0, got {grad_scale}")
    return h, grad_scale


def step_slot_size(rule: Rule) -> int:
    """Words (int32) of a step slot of ``rule``: its scalars h, grad_scale, the key's two halves."""
    return len(rule.scalar_names) + 3


def step_slot_words(h: Sequence[float], grad_scale: float, seed: int | None) -> list[int]:
    """The int32 words of a step slot (linear_update.step_scalars reads them): each of h and
    grad_scale as its fp32 bit pattern (the values are fp32 already: Rule.scalars, _scale; a value
    that is not is rounded to nearest here, as passing it as a kernel argument would), then the Philox
    key's low and high 32 bits (seed None: 0, the fp32 regime's unused key). Signed, as int32 holds them."""
    floats = struct.pack(f"<{len(h) + 1}f", *h, grad_scale)
    key = int(seed or 0)
    if not 0 <= key < 2**64:
        raise ValueError(f"seed must be a 64-bit key in [0, 2^64), got {seed!r}")
    return list(struct.unpack(f"<{len(h) + 3}i", floats + struct.pack("<Q", key)))


def _check_step_slot(slot: torch.Tensor | None, rule: Rule, ref: torch.Tensor) -> None:
    if slot is None:
        return
    if not isinstance(slot, torch.Tensor) or slot.dtype != torch.int32:
        raise TypeError(f"step_slot must be an int32 tensor, got {getattr(slot, 'dtype', type(slot).__name__)}")
    if slot.dim() != 1 or slot.numel() != step_slot_size(rule) or slot.stride(0) != 1:
        raise ValueError(f"step_slot of rule {rule.name} must be a contiguous 1-D tensor of {step_slot_size(rule)} "
                         f"words (h, grad_scale, the key's two halves), got shape {tuple(slot.shape)} and strides "
                         f"{slot.stride()}")
    if slot.device != ref.device:
        raise ValueError(f"step_slot is on {slot.device}, the parameter on {ref.device}")


def _check_linear_inputs(x: torch.Tensor, dy: torch.Tensor, M: int, N: int) -> str:
    if x.dim() != 2 or dy.dim() != 2:
        raise ValueError(f"x and dy must be 2-D [tokens, features], got shapes {tuple(x.shape)} and {tuple(dy.shape)}")
    if x.dtype != dy.dtype:
        raise TypeError(f"x and dy must have the same dtype, got {x.dtype} and {dy.dtype}")
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"x and dy must be float32 (ieee mainloop) or bfloat16 (tensor cores), got {x.dtype}")
    if x.shape[0] != dy.shape[0]:
        raise ValueError(f"x has {x.shape[0]} tokens but dy has {dy.shape[0]}")
    if x.shape[1] != N:
        raise ValueError(f"x has {x.shape[1]} features, the weight has {N} input features")
    if dy.shape[1] != M:
        raise ValueError(f"dy has {dy.shape[1]} features, the weight has {M} output features")
    for name, t in (("x", x), ("dy", dy)):
        if any(s < 0 for s in t.stride()):
            raise ValueError(f"{name} has negative strides {t.stride()}")
    return "ieee" if x.dtype == torch.float32 else "tf32"  # input_precision; ignored for bf16


# ------------------------------------------------------------------------------------------
# launch
# ------------------------------------------------------------------------------------------


def _telemetry_buffers(tiles: int, device, launched: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm_sq float64 [tiles], nonfinite int32 [tiles]): one slot per tile, each a fresh allocation
    (so 16-byte aligned, and the kernel keeps one specialization). Every tile writes its slot, so a
    launch needs no fill; zeros where nothing is launched (an empty weight). Two allocations, not
    one split by views: the views cost the host more than the second allocation (session 12,
    bench/host_time.py --part split: 28.6 us a call in the 3B step)."""
    alloc = torch.empty if launched else torch.zeros
    return alloc(tiles, dtype=torch.float64, device=device), alloc(tiles, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=None)
def _sm_count_cached(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (the interpreter: 4, so that programs loop over several tiles)."""
    if device.type != "cuda":
        return 4
    return _sm_count_cached(device.index if device.index is not None else torch.cuda.current_device())


def _tma_addressable(x: torch.Tensor, dy: torch.Tensor) -> bool:
    """Whether the copy engine can load tiles of x [K, N] and dy [K, M]: some tokens, unit inner
    stride, row pitch and base address multiples of 16 bytes (cuTensorMapEncodeTiled's rules)."""
    if x.shape[0] == 0:
        return False
    for t in (x, dy):
        row_pitch, inner = t.stride()
        if inner != 1 or (row_pitch * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    return True


def _tma_descriptors(x: torch.Tensor, dy: torch.Tensor, config: TileConfig, tma_ok: bool):
    """(x_desc, dy_desc) for a TMA mainloop, or (None, None) where it cannot run: the config does not
    ask for it, or ``tma_ok`` (_tma_addressable(x, dy)) is False: no tokens, or operands the copy
    engine cannot address (inner stride not 1, a row pitch or base address not a multiple of 16
    bytes). Either way the kernel reads the same values: the pointer mainloop is the fallback, with
    the same bits (tests/test_gpu_exactness.py)."""
    if not (config.tma and tma_ok):
        return None, None
    K = x.shape[0]
    return (_tma_descriptor(x, [K, x.shape[1]], [x.stride(0), 1], [config.BK, config.BN]),
            _tma_descriptor(dy, [K, dy.shape[1]], [dy.stride(0), 1], [config.BK, config.BM]))


@functools.lru_cache(maxsize=1)
def _descriptor_type():
    """Triton's host-side TensorDescriptor, and the function that builds one from (base, shape, strides,
    block_shape) without its constructor (launch_cache.descriptor_builder), or None where this Triton's fields
    are not known."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor, descriptor_builder(TensorDescriptor, ("base", "shape", "strides", "block_shape"))


def _tma_descriptor(t: torch.Tensor, shape: list, strides: list, block: list):
    """TensorDescriptor(t, shape, strides, block), built without its __post_init__, which re-checks in Python
    what _tma_addressable checked (unit inner stride, 16-byte base and row pitch, tokens; the launcher launches
    only with M, N > 0) and the configs' blocks (powers of two), two descriptors a launch
    (kernels/gluon_update.py's _nvmma_desc does the same). tests/test_launch_cache.py checks the result equals
    the constructor's."""
    cls, build = _descriptor_type()
    return (cls if build is None else build)(t, shape, strides, block)


def _triton_tile(M: int, N: int, K: int, dtype: torch.dtype, bf16: bool, q8: bool, tma_ok: bool) -> TileConfig:
    """The Triton kernel's tile where none is given: the measured default of the regime (default_q8_config,
    default_config), or the interpreter's small tile."""
    if q8:
        return INTERPRETER_Q8_CONFIG if _interpreting() else default_q8_config(M, N, K, dtype, tma_ok)
    return INTERPRETER_CONFIG if _interpreting() else default_config(M, N, K, dtype, bf16, tma_ok=tma_ok)


def _launch_linear(
    weight, states, x, dy, accum, acc_out, rule, h, grad_scale, *, update: bool, config: TileConfig | None,
    n_state: int, seed: int = 0, bf16: bool = False, q8: bool = False, rand: tuple | None = None,
    step_slot: torch.Tensor | None = None,
) -> UpdateStats:
    M, N = (weight.shape if weight is not None else (dy.shape[1], x.shape[1]))
    K = x.shape[0]
    device = x.device
    tma_ok = _tma_addressable(x, dy)
    if config is None:
        config = _triton_tile(M, N, K, x.dtype, bf16, q8, tma_ok)
    if q8 and (config.BN % QBLOCK or config.epilogue_split > (8 if config.staged else 4)
               or config.BM % config.epilogue_split):
        raise ValueError(f"the 8bit regime needs BN a multiple of {QBLOCK} and its epilogue split into 1, 2 or 4 "
                         f"row sub-tiles (1, 2, 4 or 8 staged), got {config}")
    tiles = _cdiv(M, config.BM) * _cdiv(N, config.BN)
    norm_sq, nonfinite = _telemetry_buffers(max(tiles, 1), device, launched=bool(M and N))
    if M and N:
        _launch(_LAUNCH, fused_linear_update_kernel,
                _linear_launch_arguments(weight, states, x, dy, accum, acc_out, norm_sq, nonfinite, rule, h,
                                         grad_scale, update, config, n_state, seed, bf16, q8, rand, tma_ok,
                                         step_slot))
    return UpdateStats(norm_sq, nonfinite)


def _launch(cached: CachedLaunch | None, kernel, launch: tuple) -> None:
    """Run ``launch`` = (key, pins, grid, args, constants) of ``kernel``: through its CachedLaunch, or
    as kernel[grid](...) where ``cached`` is None (the interpreter's kernel, TRITON_INTERPRET=1 at import)."""
    if cached is None:
        _, _, grid, args, constants = launch
        constexprs, options = constants()
        kernel[grid](*args, **constexprs, **options)
    else:
        cached.launch(*launch)


# The kernel's GROUP_M (a defaulted constexpr): passed explicitly, since a cached launch names every
# constexpr after the runtime arguments (kernels/launch_cache.py).
_GROUP_M = inspect.signature(fused_linear_update_kernel.fn).parameters["GROUP_M"].default
# The launch without Triton's argument binder on a key's second launch; None where the kernel is the
# interpreter's (TRITON_INTERPRET=1 at import), which launches through kernel[grid].
_LAUNCH = None if _INTERPRETED else CachedLaunch(fused_linear_update_kernel)


def _linear_launch_arguments(weight, states, x, dy, accum, acc_out, norm_sq, nonfinite, rule, h, grad_scale,
                             update, config, n_state, seed, bf16, q8, rand, tma_ok, step_slot=None):
    """(key, pins, grid, runtime arguments, constants) of one fused_linear_update_kernel launch, for
    _LAUNCH (kernels/launch_cache.py), for operands the launchers checked: ``states`` plain tensors, or
    8bit states (codes and block scales); ``rand`` (rand_stride, rand_base, rand_rows) or None;
    ``step_slot`` None or a checked slot (_check_step_slot)."""
    M, N = (weight.shape if weight is not None else (dy.shape[1], x.shape[1]))
    K = x.shape[0]
    dummy = norm_sq  # any tensor: pointers of absent operands are never dereferenced
    if q8:
        s = [st.codes for st in states] + [dummy, dummy]
        scales = [st.scales for st in states] + [dummy, dummy]
    else:
        s = list(states) + [dummy, dummy]
        scales = [dummy, dummy]
    guarded = guarded_update_jit(rule) if update else _NO_UPDATE
    tiles_m, tiles_n = _cdiv(M, config.BM), _cdiv(N, config.BN)
    grid = (tiles_m, tiles_n)
    if config.persistent:  # a 1-D grid of at most `persistent` programs per SM, looping over the tiles
        grid = (min(tiles_m * tiles_n, config.persistent * _sm_count(x.device)),)
    x_desc, dy_desc = _tma_descriptors(x, dy, config, tma_ok)
    (stride_xk, stride_xn), (stride_dyk, stride_dym) = x.stride(), dy.stride()
    rand_stride, rand_base, rand_rows = rand or (max(N, 1), 0, None)
    # a staged tile's scratch: one BM x BN fp32 slot for each program of the persistent grid (the 8bit
    # update's only; a mainloop-only launch with the tile, the comparator's, holds its accumulator)
    # (a fresh tensor each launch, from torch's caching allocator, ordered on the launch's stream: ~6-10 us
    # of the device's host, ~35 launches a 1B step; a buffer kept per stream would save that, and would
    # need care under CUDA-graph capture)
    staged = config.staged and q8
    stage = torch.empty(grid[0] * config.BM * config.BN, dtype=torch.float32, device=x.device) if staged else dummy
    tensors = (weight if weight is not None else dummy, s[0], s[1], x, dy, accum if accum is not None else dummy,
               acc_out if acc_out is not None else dummy, norm_sq, nonfinite, stage)
    args = (*tensors, x_desc, dy_desc, scales[0], scales[1], _cdiv(N, QBLOCK), M, N, K, stride_xk, stride_xn,
            stride_dyk, stride_dym, h, grad_scale, int(seed), rand_stride, rand_base, rand_rows, step_slot, tiles_n)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    use_tma = x_desc is not None
    # What Triton specializes this launch on, as a key of its own (kernels/launch_cache.py): the
    # constexprs and options (functions of the guarded rule and the config, pinned, and of the flags
    # named here); each tensor's dtype (the regime's, fixed by the launchers' checks given these flags:
    # x and dy one dtype, the weight's and the states', the scales fp32, accum and acc_out fp32, the
    # dummy fp64) and its 16-byte alignment; the descriptors' types (the config's blocks, x's dtype);
    # the integers themselves (a superset of Triton's classes: 1, a multiple of 16, i32 or i64); h a
    # tuple of floats (_check_scalars; its length the rule's), grad_scale a float, seed and rand_base
    # typed (tl.uint64, tl.int64) and not specialized; the step slot None or an int32 tensor (its
    # alignment with the others').
    aligned = alignment_bits((*tensors, scales[0], scales[1], rand_rows, step_slot))
    key = (id(guarded), id(config), n_state, bf16, q8, update, accum is not None, acc_out is not None, use_tma,
           x.dtype, weight.dtype if weight is not None else None, rand_rows is None, step_slot is None, aligned, M,
           N, K, stride_xk, stride_xn, stride_dyk, stride_dym, rand_stride)

    def constants():
        return (dict(GUARDED_UPDATE=guarded, N_STATE=n_state, BF16_STORAGE=bf16, STATE_Q8=q8, UPDATE=update,
                     STORE_ACC=acc_out is not None, HAS_ACCUM=accum is not None, INPUT_PRECISION=precision,
                     BM=config.BM, BN=config.BN, BK=config.BK, EPILOGUE_SPLIT=config.epilogue_split,
                     PERSISTENT=bool(config.persistent), GROUP_M=_GROUP_M, USE_TMA=use_tma, STAGED=staged),
                dict(num_warps=config.num_warps, num_stages=config.num_stages, maxnreg=config.max_registers or None,
                     enable_fp_fusion=False))

    return key, (guarded, config), grid, args, constants


# The default bf16 tiles, by storage regime, as measured on the H200.
# fp32 weight and state (bench/results/2026-12-03-h200-s4/kernels_fp32.json and
# bench/results/2026-12-03-h200-s5/kernels_call{A,C}.json: every configuration of BF16_CONFIGS and
# CANDIDATE_CONFIGS timed side by side at 5 Llama shapes x the 7 K of issue 5):
#   K < LARGE_K: 64x128x64, 4 warps, TMA loads: the fastest verified tile or within 2% of it at
#     K = 256 and 1024 on the four larger shapes (1.02-1.16x the unfused step); at 4096x4096
#     0.85-0.93x, within 0.05 of the pointer twin (0.90-0.91x). Two 4-warp CTAs per
#     multiprocessor overlap one's epilogue with the other's mainloop.
#   K >= LARGE_K: the mainloop dominates: the persistent TMA 128x128 (one 8-warp program per SM
#     walking tiles in grouped order, so GROUP_M tile rows share X in L2): 0.85-0.97x at K = 4096
#     (the TMA 64x128: 0.73-0.92x) and 0.86-0.92x at K = 16384 (the plain TMA 128x128: 0.71-0.89x).
#     It spills 36 B per thread (tests/test_ptx.py states the exception); its spill-free 8-way
#     twin was slower at K = 4096. Its programs walking several tiles passed on the GPU
#     (test_persistent_programs_loop_over_tiles, session 5).
#   MID_K <= K < LARGE_K on tall weights (M >= TALL_M): the persistent TMA 64x128, two programs
#     per SM walking tiles in grouped order (GROUP_M tile rows share each X tile): at K = 2048 it
#     was 1.02-1.06x on the three shapes with M >= 8192 against 0.88-1.00x for the plain tile, and
#     0.87-1.00x against 0.92-1.03x on the two with M = 4096 (session 5). dY [K, M] of a tall weight
#     at K = 2048 (58 MB at M = 14336) no longer fits the 50 MB L2, so the order of the tiles
#     starts to matter; at K <= 1024 the plain tile won on two of the three tall shapes. It spills
#     40 B per thread (tests/test_ptx.py); its programs walking several tiles passed on the GPU.
#   Operands TMA cannot address (see _tma_addressable) take the pointer 64x128 tile, the fastest
#   of the pointer tiles in session 2.
#   Small weights (session 7, bench/results/2026-12-03-h200-s7/kernels_callC.json: the 1B model's
#   2048x2048, 512x2048, 8192x2048 and 2048x8192 at K = 1024 and 4096, every tile timed):
#   * M N K < SMALL_WORK: the pointer 64x128. The kernel runs 27-55 us on the GPU (CUDA-graph
#     replay), less than the launch's host time, and a TMA launch costs the host ~30 us more (two
#     descriptors built and encoded per call): every TMA tile took 0.085-0.099 ms a call there, the
#     pointer 64x128 0.063-0.064 (1.25-1.29x the unfused step, against 0.77-0.94x for the TMA
#     defaults). At M N K = 1.7e10 the TMA 64x128 is as fast or faster (0.202 against 0.204 ms on
#     8192x2048 at K = 1024; 0.090 against 0.118 on 2048x2048 at 4096): the edge lies between
#     4.3e9 and 1.7e10, and SMALL_WORK = 2^33 is their geometric middle. Training a 1B or 3B model
#     is host-bound (session 7), so the host's time is the one that counts there.
#   * K >= LARGE_K with fewer than LARGE_K_MIN_TILES 128x128 tiles: the TMA 64x128. One persistent
#     128x128 program per SM leaves SMs idle on a small weight: on 2048x2048 (256 tiles, 132 SMs)
#     it took 0.133 ms at K = 4096 against 0.090 for the 64x128 (512 tiles), while at 1024 tiles
#     (4096x4096, sessions 4-5) it was the fastest; LARGE_K_MIN_TILES = 512 is their geometric middle.
# bf16 weight and state (bf16-sr; bench/results/2026-12-03-h200-s5/kernels_lowbit_callB.json): the
# epilogue (Philox4x32-10 per element, three stochastic roundings) is heavier than the mainloop
#   K < BF16_SR_MID_K: 64x64x64, 4 warps: the fastest at K = 256 and 2048 in session 5 (0.31-0.46x);
#     session 13 measured the capped tile below faster at 256 too
#   K >= BF16_SR_LARGE_K: the TMA 128x128 capped at 128 registers, so two 8-warp programs share
#     an SM and one's epilogue runs beside the other's mainloop: 0.73-0.74x at K = 16384 against
#     0.45-0.46x for the 64x64 (the uncapped TMA 128x128: 0.59x). It spills 356 B (fp32) / 560 B
#     (bf16-sr) in the epilogue (tests/test_ptx.py states the exception).
#   BF16_SR_MID_K <= K < BF16_SR_LARGE_K: the 64x64 capped at 128 registers (3 stages), four
#     programs per SM instead of two: 1.18-1.26x faster than the 64x64 at K = 2048 and 1.09-1.23x
#     at 4096, on 4096x4096 and 14336x4096 (bench/results/2026-12-03-h200-s6/kernels_lowbit_callB.json:
#     0.44-0.46x the unfused step). It spills 36 B in bf16-sr (tests/test_ptx.py). Session 13
#     measured it at K = 256 (bench/results/2026-12-04-h200-s13/call7/kernels_bf16sr.json): 0.200
#     against 0.258 ms on 4096x4096 and 0.705 against 0.897 on 14336x4096, 1.27-1.29x the uncapped
#     64x64; so BF16_SR_MID_K moved from 2048 to 256 (512 and 1024 lie between two measured wins,
#     not themselves measured; below 256 tokens the uncapped 64x64 stays, not measured).
#     The two candidates with eight column sub-tiles (four programs without spills; five at 96
#     registers) lost to it at 5 of 6 points (won 5% at 14336x4096, K = 4096) and were dropped.
#   BF16_SR_LARGE_K = 8192, measured in session 6: at K = 4096 the capped TMA 128x128 was slower
#   than the capped 64x64 (0.587 against 0.564 ms on 4096x4096, 2.155 against 2.019 on
#   14336x4096); at 8192 it was 1.31x and 1.39x faster.
# The fp32 regime on sm_90 with bf16 operands TMA can address: from 256 to 16384 tokens with at least 132
#   tiles, not a Triton tile but the split Gluon kernel (kernels/gluon_f32.py, config_for; session 35:
#   0.86-0.99x the route below at 256-2048 tokens, its 128-row tile 0.89-0.95x at 3072-4096; session 36: its
#   one-buffer 128-row tile 0.86-0.99x the Triton tile at 16384); elsewhere below
#   LARGE_K tokens and from 2^33 = M N K the warp-specialized Gluon kernel (kernels/gluon_update.py,
#   config_for; session 10: 1.21-1.28x this default at K = 256 and 1.05-1.20x at 1024 on the Llama-8B/70B
#   shapes); all with the same bits; fused_linear_update routes there when no tile is given.
# All keep BK = 64, so the unfused comparator's mainloop (fp32 regime default) walks K in the same
# blocks as the fused kernel in either regime, and a checkpoint resumes with the same bits whatever
# tile a step's K selects.
LARGE_K = 4096
MID_K = 2048
TALL_M = 8192
SMALL_WORK = 2**33
LARGE_K_MIN_TILES = 512
BF16_SR_MID_K = 256
BF16_SR_LARGE_K = 8192
DEFAULT_BF16_SR_MID_K_CONFIG = TileConfig(64, 64, 64, num_warps=4, num_stages=3, epilogue_split=4, max_registers=128)
DEFAULT_BF16_CONFIG = {False: TileConfig(64, 128, 64, num_warps=4, num_stages=4, epilogue_split=4),
                       True: TileConfig(64, 64, 64, num_warps=4, num_stages=4, epilogue_split=2)}
DEFAULT_TMA_CONFIGS = {
    "small_k": TileConfig(64, 128, 64, num_warps=4, num_stages=4, epilogue_split=4, tma=True),
    "mid_k_tall": TileConfig(64, 128, 64, num_warps=4, num_stages=4, epilogue_split=4, persistent=2, tma=True),
    "large_k": TileConfig(128, 128, 64, num_warps=8, num_stages=4, epilogue_split=4, persistent=1, tma=True),
    "bf16_sr_large_k": TileConfig(128, 128, 64, num_warps=8, num_stages=3, epilogue_split=8, tma=True,
                                  max_registers=128),
}
# every tile default_config can pick for bf16 operands (tests/test_gpu_exactness.py re-verifies each)
DEFAULT_CONFIGS = (*DEFAULT_BF16_CONFIG.values(), *DEFAULT_TMA_CONFIGS.values(), DEFAULT_BF16_SR_MID_K_CONFIG)
assert all(c in BF16_CONFIGS for c in DEFAULT_CONFIGS)
assert len({c.BK for c in DEFAULT_CONFIGS}) == 1


def default_config(M: int, N: int, K: int, dtype: torch.dtype, bf16_storage: bool = False,
                   tma_ok: bool = True) -> TileConfig:
    """The tile shape for a problem: a measured default per mainloop mode, storage regime and
    number of tokens K (the table above). ``tma_ok``: whether the operands can be loaded through
    TMA descriptors (_tma_addressable)."""
    if dtype == torch.float32:
        return IEEE_CONFIGS[0]
    if bf16_storage:
        if tma_ok and K >= BF16_SR_LARGE_K:
            return DEFAULT_TMA_CONFIGS["bf16_sr_large_k"]
        if K >= BF16_SR_MID_K:
            return DEFAULT_BF16_SR_MID_K_CONFIG
        return DEFAULT_BF16_CONFIG[True]
    if not tma_ok or M * N * K < SMALL_WORK:
        return DEFAULT_BF16_CONFIG[False]
    if K >= LARGE_K:
        large = DEFAULT_TMA_CONFIGS["large_k"]
        many_tiles = _cdiv(M, large.BM) * _cdiv(N, large.BN) >= LARGE_K_MIN_TILES
        return DEFAULT_TMA_CONFIGS["large_k" if many_tiles else "small_k"]
    return DEFAULT_TMA_CONFIGS["mid_k_tall" if K >= MID_K and M >= TALL_M else "small_k"]


# 8bit regime, bf16 operands, against torch AdamW(fused) on a bf16 parameter after cuBLAS's dW.
# Session 15 (bench/results/2026-12-05-h200-s15/call1 and call2, 4096x4096 and 14336x4096; the
# unfused step / the previous default / the new one, ms):
#   K < Q8_LARGE_K: 32x128, 8 warps, four row quarters (122 registers then, 115 since v27: two
#     programs per SM; the unsplit 32x128 took 232, one program): K = 256 0.133 / 0.415 / 0.335
#     and 0.349 / 1.512 / 1.160; K = 1024 0.123 / 0.578 / 0.461 and 0.458 / 2.475 / 1.754; K = 2048
#     (against the 64x128 in two row halves) 0.163 / 0.656 / 0.624 and 0.599 / 3.105 / 2.567:
#     1.05-1.41x.
#   K >= Q8_LARGE_K: 64x128, 8 warps, four row quarters at 128 registers (two programs per SM,
#     220 B of spills then, 248 since v27, tests/test_ptx.py): K = 4096 0.252 / 1.097 / 0.881 and
#     0.923 / 4.020 / 3.285; K = 8192 (against the 128x128, the default there until then) 0.438 /
#     1.391 / 1.170 and 1.582 / 5.257 / 4.395; K = 16384 0.831 / 1.825 / 1.727 and 2.937 / 6.916 /
#     6.642: 1.04-1.25x.
#     At 2048 tokens the 32x128 was 1.04-1.13x faster than it, at 4096 1.22-1.24x slower.
# Session 20 (v24, bench/results/2026-12-05-s20/followup, H200, the Philox products wide): the TMA
# 64x128 with four stages (Q8_TMA_CONFIG), against the pointer default the launcher picked, time
# ratios: 4096x14336 0.86, 0.80, 0.76, 0.80, 0.93 at K = 256, 1024, 2048, 4096, 16384; 8192x8192
# 0.79, 0.92, 0.68, 0.84, 0.85; Llama-1B's 2048x2048, 8192x2048, 2048x8192 and 8B's 14336x4096 0.64-0.88
# at K = 1024, 2048, 4096. Where it has few tiles it loses below Q8_LARGE_K: 512x2048 (128 of its
# tiles for 132 SMs) 1.68x at K = 1024 and 1.05x at 2048, while 0.83x at 4096. So: the TMA tile
# from Q8_LARGE_K tokens, and below it where it has at least Q8_TMA_MIN_TILES tiles (two programs
# on each SM of an H100 or H200 is 264; 128 tiles lost, 512 won: 256 lies between); the pointer
# tiles where TMA cannot address the operands.
# Session 22 (v31, bench/results/2026-12-05-s22/call1 on an H200, call2 on an H100; K = 1024 and 4096,
# time over Q8_TMA_CONFIG's, H200 / H100): its staged twin, Q8_TALL_CONFIG, 0.89-0.94 / 0.83-0.90 at
# 8192x8192, 0.94-0.95 / 0.89 at 8192x2048; 1.00-1.04 / 0.96-0.98 at 4096x14336, 1.01-1.04 / 1.02-1.05
# at 2048x8192, 0.98-1.03 / 1.02 at 2048x2048. So the staged tile where the TMA tile would run on
# weights of Q8_TALL_M rows or more: the gate and up projections of Llama-1B (8192x2048), 3B
# (8192x3072, not measured) and 8B (14336x4096), and the tied heads (128256 rows, not measured). Call 3
# (H100) at K = 256 / 1024 / 4096 / 16384: 14336x4096 0.88 / 0.84 / 0.80 / 0.82, 8192x8192 1.04 / 0.83
# / 0.89 / 0.81 (the one loss, at 256 tokens, left in the rule until 256-512 tokens are measured on
# more shapes).
# Session 23 (bench/results/2026-12-05-s23/call1, H100), K = 256 / 512 / 4096: 8192x3072 1.14 / 0.90 /
# 0.89, the heads 128256x2048 0.91 / 0.85 / 0.72 and 128256x3072 0.92 / 0.85 / 0.73, 8192x8192 1.04 /
# 0.89 / 0.90. At K <= Q8_TALL_SMALL_K the staged tile loses on both 8192-row weights and wins on
# 14336x4096 (0.88, session 22) and the heads: there it needs Q8_TALL_M_SMALL_K rows.
Q8_LARGE_K = 4096
Q8_TMA_MIN_TILES = 256
Q8_TALL_M = 8192
Q8_TALL_SMALL_K = 256
Q8_TALL_M_SMALL_K = 14336
DEFAULT_Q8_CONFIGS = {"small_k": Q8_SMALL_K_CONFIG, "large_k": Q8_LARGE_K_CONFIG, "tma": Q8_TMA_CONFIG,
                      "tma_tall": Q8_TALL_CONFIG}


@functools.lru_cache(maxsize=None)
def _q8_tile_by_label(label: str) -> TileConfig:
    """The bf16-operand 8bit tile (a library tile or a candidate) whose label is ``label``, '_' for ' '."""
    tiles = {c.label: c for c in (*Q8_CONFIGS[torch.bfloat16], *CANDIDATE_Q8_CONFIGS)}
    tile = tiles.get(label.replace("_", " "))
    if tile is None:
        raise ValueError(f"FORGE_NUM_Q8_TILE={label!r} names no 8bit tile; known: "
                         + ", ".join(sorted(k.replace(" ", "_") for k in tiles)))
    return tile


def default_q8_config(M: int, N: int, K: int, dtype: torch.dtype, tma_ok: bool = True) -> TileConfig:
    """The 8bit regime's tile for an M x N weight and K tokens of dtype operands (the table above;
    fp32 operands: the FMA tile). ``tma_ok``: whether the operands can be loaded through TMA
    descriptors (_tma_addressable). FORGE_NUM_Q8_TILE=<label> in the environment (read at each call;
    '_' for the label's spaces) picks that tile wherever TMA can load the operands: a benchmark's A/B
    switch (bench/host_time.py --split-env), never needed for the bits (every tile computes the same)."""
    if dtype == torch.float32:
        return Q8_CONFIGS[torch.float32][0]
    override = os.environ.get("FORGE_NUM_Q8_TILE")
    if override and tma_ok:
        return _q8_tile_by_label(override)
    tma = DEFAULT_Q8_CONFIGS["tma"]
    if tma_ok and (K >= Q8_LARGE_K or _cdiv(M, tma.BM) * _cdiv(N, tma.BN) >= Q8_TMA_MIN_TILES):
        tall = M >= (Q8_TALL_M if K > Q8_TALL_SMALL_K else Q8_TALL_M_SMALL_K)
        return DEFAULT_Q8_CONFIGS["tma_tall"] if tall else tma
    return DEFAULT_Q8_CONFIGS["small_k" if K < Q8_LARGE_K else "large_k"]


def fused_linear_update(
    weight: torch.Tensor,
    x: torch.Tensor,
    dy: torch.Tensor,
    states: Sequence[torch.Tensor],
    rule: Rule,
    h: Sequence[float],
    *,
    grad_scale: float = 1.0,
    accum: torch.Tensor | None = None,
    config: TileConfig | None = None,
    acc_out: torch.Tensor | None = None,
    seed: int | None = None,
    counter: tuple | None = None,
    step_slot: torch.Tensor | None = None,
) -> UpdateStats:
    """Apply ``rule`` to ``weight`` (and ``states``) with the gradient dyᵀx, never stored.

    Regimes, by storage: float32 weight and states (fp32); bfloat16 weight and states (bf16-sr);
    bfloat16 weight and ``Q8State`` states (8bit). The last two round stochastically and need
    ``seed`` (the Philox key of this parameter and step); ``counter`` (cols, row_stride, base) maps
    the weight's elements to their Philox counters (emulator.philox.CounterMap; cols must be N;
    default: flat indices, a shard passes its elements' indices in the whole parameter); a fourth
    entry, an int64 tensor [M] on the weight's device, names gathered rows' indices in the parameter.

    ``step_slot``: None, or an int32 tensor of step_slot_size(rule) words on the weight's device, from
    which the kernel reads h, grad_scale and the key when it runs (step_slot_words gives its contents):
    a launch captured in a CUDA graph, replayed with each step's scalars written there first. The h,
    grad_scale and seed given are still checked, but the kernel uses the slot's (the Gluon kernels too).
    A slot is read when the launch runs, so writing it for the next launch must wait for this one."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got shape {tuple(weight.shape)}")
    bf16 = _check_regime("weight", weight, seed)
    if accum is None and acc_out is None and _plain_linear_ok(weight, x, dy, states, rule):
        # the common case (a training step's call), its tensors checked in few attribute reads; the
        # scalars and the device as below, in the same order, so that any error is the same one
        M, N = weight.shape
        q8, states = False, list(states)
        h, grad_scale = _check_scalars(rule, h, grad_scale)
        _check_one_device(weight, x, dy, *states)
    elif accum is None and acc_out is None and _plain_q8_linear_ok(weight, x, dy, states, rule):
        # the 8bit regime's training step: as the q8 branch below, the device before the scalars
        M, N = weight.shape
        q8, states = True, list(states)
        _check_one_device(weight, x, dy, *(t for st in states for t in (st.codes, st.scales)))
        h, grad_scale = _check_scalars(rule, h, grad_scale)
    else:
        _check_fp32_like("weight", weight, weight, weight.dtype)
        M, N = weight.shape
        _check_linear_inputs(x, dy, M, N)
        q8 = any(_is_q8(st) for st in states)
        if q8:
            states = _check_q8_states(states, weight, rule)
            _check_device(weight, x, dy, *(t for st in states for t in st))
        else:
            states = _check_states(states, weight, rule)
        h, grad_scale = _check_scalars(rule, h, grad_scale)
        for name, t in (("accum", accum), ("acc_out", acc_out)):
            if t is not None:
                _check_fp32_like(name, t, weight)
        _check_device(weight, x, dy, *(t for t in (accum, acc_out) if t is not None),
                      *(states if not q8 else ()))
    _check_step_slot(step_slot, rule, weight)
    _, rand_stride, rand_base, rand_rows = _kernel_counter(counter, M * N, weight.device, cols=N)
    gluon = None
    if config is None and accum is None and acc_out is None and rand_rows is None:
        gluon = _gluon_tile(weight, x, dy, states, bf16, q8)
    if gluon is not None:  # a Gluon kernel where routed (measured faster): the same bits
        module, tile = gluon
        if module == "gluon_f32":  # the fp32 split kernel
            from . import gluon_f32

            return gluon_f32.launch(weight, x, dy, states, rule, h, grad_scale, tile, step_slot)
        if module == "gluon_update":  # the warp-specialized fp32 / bf16-sr kernel
            from . import gluon_update

            rand = (int(seed), rand_stride, rand_base) if bf16 else None
            return gluon_update.launch(weight, x, dy, states, rule, h, grad_scale, tile, rand, step_slot)
        from . import gluon_q8

        return gluon_q8.launch(weight, x, dy, states, rule, h, grad_scale, tile, (int(seed), rand_stride, rand_base),
                               step_slot)
    return _launch_linear(
        weight, states, x, dy, accum, acc_out, rule, h, grad_scale, update=True, config=config,
        n_state=len(states), seed=seed or 0, bf16=bf16 and not q8, q8=q8,
        rand=(rand_stride, rand_base, rand_rows), step_slot=step_slot,
    )


def _gluon_tile(weight, x, dy, states, bf16: bool, q8: bool):
    """(module, tile) of the Gluon kernel a plain update (no tile given, no accumulation, no gathered rows) takes,
    or None (the Triton kernel; always under the interpreter): in the 8bit regime gluon_q8's route; in the fp32
    regime gluon_f32's split tiles where routed, else, in the fp32 and bf16-sr regimes, gluon_update's."""
    if _interpreting():
        return None
    if q8:
        tile = _ws_q8_route(weight, x, dy, states)
        return None if tile is None else ("gluon_q8", tile)
    split = None if bf16 else _ws_f32_route(weight, x, dy, states)
    if split is not None:
        return "gluon_f32", split
    tile = _ws_route(weight, x, dy, states)
    return None if tile is None else ("gluon_update", tile)


def launcher_tile(weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, states) -> tuple[str, object]:
    """(kernel, tile) that fused_linear_update, given no tile, launches for this update with no accumulation
    buffer and no gathered rows: a Gluon kernel module's name ("gluon_f32", "gluon_update", "gluon_q8") and its
    tile where routed, else ("triton", the Triton kernel's tile). The regime is read from the tensors as
    fused_linear_update reads it (bf16 weight: bf16-sr, or 8bit with Q8State states). forge-num verify names
    the kernel it checks with it."""
    q8 = any(_is_q8(st) for st in states)
    bf16 = weight.dtype == torch.bfloat16
    gluon = _gluon_tile(weight, x, dy, states, bf16, q8)
    if gluon is not None:
        return gluon
    M, N = weight.shape
    return "triton", _triton_tile(M, N, x.shape[0], x.dtype, bf16 and not q8, q8, _tma_addressable(x, dy))


def _gluon_route(module: str, weight, x, dy, states):
    """The route_config of the Gluon kernel module ``module`` (kernels/<module>.py) for this update: its tile
    where it is routed, else None. Where Gluon cannot be imported (a Triton without it), or with
    FORGE_NUM_GLUON=0 in the environment (read at each call: an A/B switch for benchmarks, and a way out should
    a Gluon kernel misbehave on some Triton), None: the Triton kernel, the same bits."""
    if weight.device.type != "cuda" or os.environ.get("FORGE_NUM_GLUON", "1") == "0":
        return None
    try:
        kernel = importlib.import_module(f"{__name__}.{module}")
    except ImportError:
        return None
    return kernel.route_config(weight, x, dy, states)


def _ws_route(weight, x, dy, states):
    """The tile of kernels/gluon_update.py for this fp32- or bf16-sr-regime update where that kernel
    is the measured default (its route_config: sm_90, bf16 operands, the measured K ranges, enough
    work), else None (_gluon_route)."""
    return _gluon_route("gluon_update", weight, x, dy, states)


def _ws_f32_route(weight, x, dy, states):
    """The tile of kernels/gluon_f32.py for this fp32-regime update where that kernel is routed (its
    route_config: sm_90, its K ranges, enough tiles; FORGE_NUM_GLUON_F32 its own switch), else None
    (_gluon_route)."""
    return _gluon_route("gluon_f32", weight, x, dy, states)


def _ws_q8_route(weight, x, dy, states):
    """The tile of kernels/gluon_q8.py for this 8bit-regime update where that kernel is switched on
    (FORGE_NUM_GLUON_Q8: on unless 0; off in sessions 36-38, gluon_q8.ROUTED says why) and its route_config
    takes it (sm_90, the measured K ranges, enough tiles), else None (_gluon_route)."""
    return _gluon_route("gluon_q8", weight, x, dy, states)


def _kernel_counter(counter, numel: int, device, cols: int | None = None) -> tuple[int, int, int, torch.Tensor | None]:
    """(cols, row_stride, base, rows) of a counter map for a tensor of ``numel`` elements on ``device``
    (``cols``: a linear weight's N), as the kernels take it (emulator.philox.CounterMap.of checks the
    integers, _counter_rows the rows); None: the flat indices, CounterMap.identity without building it
    (every training step's case)."""
    if counter is None:
        c = max(cols if cols is not None else numel, 1)
        return c, c, 0, None
    c = CounterMap.of(tuple(counter)[:3], numel, cols=cols)
    return c.cols, c.row_stride, c.base, _counter_rows(counter, numel // c.cols, device)


def _counter_rows(counter, n_rows: int, device) -> torch.Tensor | None:
    """The gathered rows' indices of a counter map (its fourth entry; None without one), checked as
    every backend checks them (emulator.philox.check_counter_rows), and as the kernels read them: a
    contiguous torch tensor on ``device``. Their values are not read here (that would wait for the
    device); a negative index draws other counters and never touches memory."""
    if len(counter) not in (3, 4):
        raise TypeError(f"counter must be (cols, row_stride, base[, rows]), got {counter!r}")
    if len(counter) == 3 or counter[3] is None:
        return None
    rows = counter[3]
    check_counter_rows(rows, n_rows)
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"counter rows must be a torch tensor on the weight's device for the kernels, got "
                        f"{type(rows).__name__}")
    if rows.device != device:
        raise ValueError(f"counter rows is on {rows.device}, the weight on {device}")
    if not rows.is_contiguous():
        raise ValueError(f"counter rows must be contiguous, got strides {rows.stride()}")
    return rows


def linear_mainloop(
    x: torch.Tensor, dy: torch.Tensor, *, accum: torch.Tensor | None = None, config: TileConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """dW = dyᵀ x (+ accum) in fp32 by the fused kernel's own mainloop, stored."""
    M, N = dy.shape[1], x.shape[1]
    _check_linear_inputs(x, dy, M, N)
    if out is None:
        out = torch.empty((M, N), dtype=torch.float32, device=x.device)
    _check_fp32_like("out", out, out.new_empty((M, N)))
    if accum is not None:
        _check_fp32_like("accum", accum, out)
    _check_device(x, dy, out, *(t for t in (accum,) if t is not None))
    _launch_linear(None, (), x, dy, accum, out, None, (), 1.0, update=False, config=config, n_state=0)
    return out


def weight_grad_norm_sq(
    x: torch.Tensor, dy: torch.Tensor, accum: torch.Tensor | None = None, config: TileConfig | None = None
) -> torch.Tensor:
    """Σ (dyᵀx + accum)² in fp64, without storing the gradient (the norm-only pass of clipping)."""
    M, N = dy.shape[1], x.shape[1]
    _check_linear_inputs(x, dy, M, N)
    if accum is not None:
        _check_fp32_like("accum", accum, accum.new_empty((M, N)))
    _check_device(x, dy, *(t for t in (accum,) if t is not None))
    stats = _launch_linear(None, (), x, dy, accum, None, None, (), 1.0, update=False, config=config, n_state=0)
    return stats.norm_sq


def accumulate_weight_grad(
    x: torch.Tensor, dy: torch.Tensor, accum: torch.Tensor, config: TileConfig | None = None
) -> None:
    """accum <- accum + dyᵀ x (fp32), for every micro-batch but the last."""
    linear_mainloop(x, dy, accum=accum, config=config, out=accum)


# The element-wise kernel's launch without Triton's argument binder on a key's second launch (as _LAUNCH
# for the fused kernel); None where the kernel is the interpreter's, which launches through kernel[grid].
_ELEMENTWISE_LAUNCH = None if _INTERPRETED else CachedLaunch(elementwise_update_kernel)


def _elementwise_launch_arguments(param, grad, states, norm_sq, nonfinite, numel, n_prog, rule, h, grad_scale,
                                  seed, bf16, cols, stride, base, rows, step_slot=None):
    """(key, pins, grid, runtime arguments, constants) of one elementwise_update_kernel launch, for
    _ELEMENTWISE_LAUNCH (kernels/launch_cache.py), for operands elementwise_update checked: ``states``
    0-2 plain tensors of the param's dtype and shape; (cols, stride, base, rows) the counter map as
    _kernel_counter gives it."""
    s = list(states) + [param, param]  # absent states: the param's pointer, never dereferenced (N_STATE)
    guarded = guarded_update_jit(rule)
    n_state, block, remap = len(states), ELEMENTWISE_BLOCK, stride != cols
    tensors = (param, grad, s[0], s[1], norm_sq, nonfinite)
    args = (*tensors, numel, h, grad_scale, int(seed or 0), cols, stride, base, rows, step_slot)
    # What Triton specializes this launch on, as a key of its own (kernels/launch_cache.py): the
    # constexprs (the guarded rule, pinned; N_STATE, BF16_STORAGE, BLOCK, RAND_REMAP, and rand_rows
    # None or not, which Triton makes a constexpr too); each tensor's dtype (fixed by the checks given
    # these flags: the param's by BF16_STORAGE, the states' and their stand-ins' the param's, norm_sq
    # fp64 and nonfinite int32 by construction, rand_rows int64 by check_counter_rows; only grad's is
    # free, fp32 or bf16) and its 16-byte alignment (rand_rows' bit 0 when None, told apart by the
    # flag); the integers themselves (numel, rand_cols, rand_stride: a superset of Triton's classes, 1,
    # a multiple of 16, i32 or i64); h a tuple of floats (_check_scalars; its length the rule's),
    # grad_scale a float, seed and rand_base typed (tl.uint64, tl.int64) and not specialized
    # (linear_update._UNSPECIALIZED); the step slot None or an int32 tensor, as rand_rows.
    aligned = alignment_bits((*tensors, rows, step_slot))
    key = (id(guarded), n_state, bf16, grad.dtype, rows is None, step_slot is None, remap, block, aligned, numel,
           cols, stride)

    def constants():
        constexprs = dict(GUARDED_UPDATE=guarded, N_STATE=n_state, BF16_STORAGE=bf16, BLOCK=block,
                          RAND_REMAP=remap)  # every one named, in the kernel's parameter order
        return constexprs, dict(enable_fp_fusion=False)

    return key, (guarded,), (n_prog,), args, constants


def elementwise_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    states: Sequence[torch.Tensor],
    rule: Rule,
    h: Sequence[float],
    *,
    grad_scale: float = 1.0,
    seed: int | None = None,
    counter: tuple | None = None,
    step_slot: torch.Tensor | None = None,
) -> UpdateStats:
    """Apply ``rule`` to ``param`` (any shape, contiguous; fp32, or bf16 with ``seed``: the bf16-sr
    regime) with the materialized ``grad``. ``counter`` (cols, row_stride, base[, rows]): the
    elements' Philox counters, as in fused_linear_update (param seen as [numel / cols, cols]);
    ``step_slot`` as there."""
    bf16 = _check_regime("param", param, seed)
    _check_fp32_like("param", param, param, param.dtype)
    if grad.shape != param.shape:
        raise ValueError(f"grad has shape {tuple(grad.shape)}, param has {tuple(param.shape)}")
    if grad.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"grad must be float32 or bfloat16, got {grad.dtype}")
    if not grad.is_contiguous():
        raise ValueError(f"grad must be contiguous, got strides {grad.stride()}")
    states = _check_states(states, param, rule)
    h, grad_scale = _check_scalars(rule, h, grad_scale)
    _check_one_device(param, grad, *states)
    _check_step_slot(step_slot, rule, param)
    numel = param.numel()
    cols, stride, base, rows = _kernel_counter(counter, numel, param.device)
    n_prog = max(1, _cdiv(numel, ELEMENTWISE_BLOCK))
    # every program writes its own slot: no fill needed, except when there is no launch at all
    norm_sq, nonfinite = _telemetry_buffers(n_prog, param.device, launched=bool(numel))
    if numel:
        _launch(_ELEMENTWISE_LAUNCH, elementwise_update_kernel,
                _elementwise_launch_arguments(param, grad, states, norm_sq, nonfinite, numel, n_prog, rule, h,
                                              grad_scale, seed, bf16, cols, stride, base, rows, step_slot))
    return UpdateStats(norm_sq, nonfinite)


def unfused_linear_update(
    weight: torch.Tensor,
    x: torch.Tensor,
    dy: torch.Tensor,
    states: Sequence[torch.Tensor],
    rule: Rule,
    h: Sequence[float],
    *,
    grad_scale: float = 1.0,
    accum: torch.Tensor | None = None,
    config: TileConfig | None = None,
    seed: int | None = None,
    counter: tuple | None = None,
) -> UpdateStats:
    """The comparator: the same mainloop storing dW, then the element-wise update of the same rule
    (8bit regime: the fused kernel with K = 0 starting from the stored dW, whose whole-block tiles
    the element-wise kernel does not have)."""
    grad = linear_mainloop(x, dy, accum=accum, config=config)
    if any(_is_q8(st) for st in states):
        return fused_linear_update(weight, x[:0], dy[:0], states, rule, h, grad_scale=grad_scale, accum=grad,
                                   seed=seed, counter=counter)
    return elementwise_update(weight, grad, states, rule, h, grad_scale=grad_scale, seed=seed, counter=counter)


@triton.jit
def _no_update(p, g, s0, s1, h, grad_scale):  # placeholder GUARDED_UPDATE when UPDATE is False
    return p, s0, s1, g == g


_NO_UPDATE = _no_update
