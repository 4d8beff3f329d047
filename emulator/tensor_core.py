"""Bit-exact model of a Hopper (sm_90) bf16 tensor-core instruction, and the bf16 GEMM mainloop.

Source
------
Khattak & Mikaitis, *Accurate Models of NVIDIA Tensor Cores*, arXiv 2512.07004 (ACM TACO), read through
their MATLAB models (``Generic_BFMA_TC.m`` with the ``H100TC``/``H200TC`` parameters) and their
published H200 measurements; the project note research/tensor-core-model.md §5 restates it and §6.3
lists targeted vectors. tests/test_emulator_tensor_core.py replays the 5,000 published H200 rows (0
mismatches) and proofs/tensor_core_model.md states the model as an assumption with its evidence.

The model of one k16 instruction, d = c + sum_{k<16} a_k * b_k (bf16 a, b; fp32 c and d)
--------------------------------------------------------------------------------------
1. Decode.  A finite bf16 x (1 sign, 8 exponent, 7 fraction bits) is ``sig * 2**(e - 7)`` with
   ``sig = 128 + frac, e = E - 127`` when its exponent field E > 0 and ``sig = frac, e = -126`` for a
   subnormal; fp32 c is the same with 23 fraction bits.  ``e`` is the exponent the hardware aligns on.
2. Products, exact and *not renormalised*: ``p_k = (sig_a*sig_b) * 2**(e_a + e_b - 14)`` with the
   alignment exponent ``e_a + e_b`` (the 16-bit significand product lies in [2^14, 2^16) for normal
   operands, so ``p_k`` may be up to 4x larger than ``2**(e_a+e_b)``).  Products with a zero operand
   are dropped; so is c when it is +-0.
3. Alignment: ``eta = max(-133, e of every remaining term)``, the accumulator c competing with the
   products.  Every term is cut to a multiple of ``2**(eta - 25)`` by truncating its magnitude (sign
   and magnitude, toward zero): 25 fraction bits below the largest exponent are kept, nothing else.
4. The cut terms are added exactly (an integer ``A`` with |A| < 2^32), normalised once, and rounded
   toward zero to fp32; an exponent above 127 gives +-Inf, a result below 2^-126 is an fp32
   subnormal. Every zero result is +0: ``A == 0``, and also a nonzero ``A`` whose magnitude
   truncates to zero (|A| * 2^(eta - 25) < 2^-149), whatever its sign. This last rule is a
   correction: Khattak's model and the research note (T13) predicted a zero of the sum's sign, -0
   for a negative sum; the project's H200 run (2026-12-02, NVIDIA H200, driver 580.159.04, torch
   2.11.0+cu130, triton 3.6.0; bench/results/2026-12-02-h200/tensor_core_vectors.json) gives +0:
   T13 (-2^-150 on c = +0) is 0x00000000 in all 8 tile configurations, and in the region "underflow
   to +-0, tiny subnormal results" exactly the 7,512 outputs per configuration (60,096 of 524,288)
   whose one instruction (K = 16) has a negative nonzero sum truncating to zero were +0 where the
   old rule said -0; nothing else in the run differed, and the corrected model reproduces the GPU
   word of every recorded example (MEASURED_CASES["underflow_is_+0"]). A second session the same day
   (H200_RUN_2) found no mismatch against the corrected model, and X12, X13 give +0 also where the
   accumulator's cut value takes part (MEASURED_CASES["zero_result_with_accumulator_term"]).
5. Specials, per instruction: a NaN operand or accumulator, a 0 x Inf product, or Inf products/c of
   both signs give NaN (0x7FFFFFFF); otherwise any Inf gives that Inf.

The mainloop ``acc = tl.dot(a, b, acc)`` over K is ``ceil(K/16)`` such instructions chained in
increasing k: each instruction's fp32 output is the next one's c. The K tail is zero-padded; an
instruction on zeros only has no product terms, so it returns its accumulator unchanged, except that
-0 becomes +0 and a NaN becomes 0x7FFFFFFF. No instruction outputs -0 or a non-canonical NaN, so
such all-zero instructions are the identity on every value of a chain after its first instruction:
``dot_sm90(..., pad_k_to=BK)`` (a kernel that runs its zero-filled last BK tile as whole
instructions) gives the same words as the default for every K (for K = 0 neither runs any).

Bit layouts used here: a bf16 word is the upper half of the fp32 word with the same value (sign bit
15, exponent bits 14..7, fraction bits 6..0); everything is done on int64 integers so that no float
rounding happens on the way, and the result's fp32 word is assembled from integer fields.

``MEASURED_CASES`` lists the behaviours beyond the published rows' range that the project's two H200
runs settled, each with its vectors, regions and counts (the second, ``H200_RUN_2``, repeated the
first against the corrected model with no mismatch and settled X12, X13: a zero result in which the
accumulator takes part is +0 as well); ``UNMEASURED_CASES`` lists what no measurement has exercised
yet: now only the scope (other parts, drivers and instruction paths). tests/test_gpu_tensor_core.py
is the run that settles them.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable

import numpy as np

__all__ = [
    "SM90_BLOCK_K",
    "SM90_ALIGN_FRAC_BITS",
    "SM90_ETA_FLOOR",
    "FP32_CANONICAL_NAN",
    "MEASURED_CASES",
    "UNMEASURED_CASES",
    "H200_RUN",
    "H200_RUN_2",
    "ARCH_MODELS",
    "NoVerifiedModelError",
    "block_fma_sm90",
    "dot_sm90",
    "mainloop_model",
    "bf16_mainloop_error_bound",
    "bf16_bits_from_f32_rne",
    "f32_from_bf16_bits",
]

# ---- the sm_90 bf16 -> fp32 instruction's parameters (research note §5; H100TC.m) ------------------
SM90_BLOCK_K = 16  # products fused into one instruction (k16; Hopper does not split it 2x8)
SM90_ALIGN_FRAC_BITS = 25  # F: fraction bits kept below the largest exponent (23 + 2 extra bits)
SM90_ETA_FLOOR = -133  # the alignment exponent never goes below this (bf16's smallest subnormal)
FP32_CANONICAL_NAN = 0x7FFFFFFF  # NVIDIA's canonical fp32 NaN

# ---- IEEE formats -----------------------------------------------------------------------------
_BF16_FRAC_BITS = 7
_FP32_FRAC_BITS = 23
_EMIN = -126  # both bf16 and fp32
_FP32_INF = 0x7F800000
_FP32_SIGN = 0x80000000
_FP32_MIN_SUBNORMAL_EXP = -149  # the lsb of the fp32 subnormals
_NO_TERM = -(1 << 20)  # an exponent below every real one: "this lane holds no term"

# The project's own H200 run of tests/test_gpu_tensor_core.py: the 30 vectors T1-T16, X1-X11 of
# tests/data/tensor_core_h200/t_vectors.json (a 30 x 30 problem whose diagonal holds the vectors; its
# 870 off-diagonal outputs matched too) and 10 random regions of 256 x 256 outputs, each through 8
# Triton tl.dot tile configurations (BM x BN x BK warps: 64x64x64 w4, 128x128x64 w8, 128x64x32 w4,
# 64x64x16 w4; A loaded directly and through tl.trans): 655,360 random outputs per configuration,
# 5,242,880 in all. The tests use a copy: tests/data/tensor_core_h200/h200_run_2026-12-02.json.
H200_RUN = (
    "bench/results/2026-12-02-h200/tensor_core_vectors.json (2026-12-02, NVIDIA H200 sm_90, driver "
    "580.159.04, torch 2.11.0+cu130, triton 3.6.0)"
)
# The second H200 session of the same day (same device, driver and versions; code at commit bc223f0):
# the same test against the corrected model, K padded to each BK, on all 32 vectors (X12, X13 added)
# and the same 10 regions (same seed, same inputs): every vector's word = model in all 8
# configurations, 0 mismatches in all 5,242,880 random outputs; and the 32 vectors as one problem
# through forge_num's own kernel (kernels.linear_mainloop, the fused kernel's mainloop from the
# accumulation buffer) with each of the 5 BF16_CONFIGS tile shapes, every output = model. The tests
# use a copy: tests/data/tensor_core_h200/h200_run_2026-12-02-s2.json.
H200_RUN_2 = (
    "bench/results/2026-12-02-h200-s2/tensor_core_vectors.json (2026-12-02, second session, NVIDIA H200 "
    "sm_90, driver 580.159.04, torch 2.11.0+cu130, triton 3.6.0)"
)

# Behaviours outside what the 5,000 published H200 rows exercise (they hold no zeros, subnormals or
# specials, exponents 2^-16..2^2 only) that the H200 runs settled. Each entry: the assumption as the
# model implements it, the vectors (GPU word = model word in all 8 configurations) and regions
# (0 mismatches in all 8 configurations, the zero signs corrected) that exercise it, and the
# counts. The counts are the first run's; the second run (H200_RUN_2) repeated every vector and
# region (the same inputs) against the corrected model and matched all of them, and it alone measured
# X12 and X13 ("zero_result_with_accumulator_term"). Instruction counts in the regions come from
# regenerating the regions' inputs on CPU from the test's seed (the 40 recorded examples are
# reproduced exactly), see proofs/tensor_core_model.md.
_FLOOR_REGION = "bf16 subnormals, the floor, fp32 subnormal results"
_UNDERFLOW_REGION = "underflow to +-0, tiny subnormal results"
MEASURED_CASES: dict[str, dict] = {
    "eta_floor_-133": {
        "assumption": "the alignment exponent is max(-133, ...)",
        "vectors": ("T9a", "T15"),
        "regions": (_FLOOR_REGION, _UNDERFLOW_REGION),
        "evidence": (
            "GPU = model on T9a (no floor: 000001ff) and T15 (every alternative: 0000000a); the floor "
            "acts in 3,195 and 52,279 instructions of the two regions, where a floor of -132, -134 or "
            "none would change 9, 3, 4 outputs of the first region"
        ),
    },
    "zero_acc_excluded": {
        "assumption": "c = +-0 takes no part in the alignment (MMA-Sim gives it exponent -126)",
        "vectors": ("T9b",),
        "regions": (_FLOOR_REGION, _UNDERFLOW_REGION),
        "evidence": (
            "GPU = model on T9b (MMA-Sim zeros: 00000200); giving c = +-0 the exponent -126 would "
            "change 4,651 and 8,605 outputs of the two regions"
        ),
    },
    "zero_products_excluded": {
        "assumption": "a product with a zero operand takes no part in the alignment (MMA-Sim: exponent -126)",
        "vectors": ("T10",),
        "regions": (),
        "evidence": (
            "GPU = model on T10 (MMA-Sim zeros: 30800000), in 8 configurations; no random region has a "
            "zero operand whose partner is large enough for the convention to matter (giving zero "
            "products an exponent changes none of their outputs), so T10 alone pins it"
        ),
    },
    "exact_cancellation_is_+0": {
        "assumption": "a sum that is exactly 0 gives +0",
        "vectors": ("T11",),
        "regions": ("cancellation",),
        "evidence": (
            "GPU = model on T11 (products +-2^200 cancel, c = 1 cut to 0 on their grid); 23,876 "
            "instructions of the region sum terms of both signs to exactly 0 (c = +-0 in all of them)"
        ),
    },
    "underflow_is_+0": {
        "assumption": (
            "a nonzero sum whose magnitude truncates to zero in fp32 gives +0 whatever its sign (the "
            "model's earlier rule, a zero of the sum's sign, i.e. -0 for a negative sum, is refuted)"
        ),
        "vectors": ("T13",),
        "regions": (_UNDERFLOW_REGION,),
        "evidence": (
            "T13 is 00000000 in all 8 configurations (the old rule: 80000000), also with BK = 16 where "
            "the kernel runs that one instruction only; the region's mismatches against the old rule "
            "were 7,512 per configuration (60,096 of 524,288), exactly the outputs whose single "
            "instruction (K = 16) has a negative nonzero sum truncating to zero (c = +0 in 3,748, "
            "c = -0 in 3,764), each -0 in the old model and +0 on the GPU in all 40 recorded examples "
            "and all 16 narrowed instructions; 7,402 positive sums truncating to zero gave +0 as well"
        ),
    },
    "all_zero_terms_give_+0": {
        "assumption": (
            "no nonzero term (all products zero and c = +-0) gives +0, also for c = -0 and all products "
            "-0 (IEEE would keep -0); an all-zero instruction is the identity on every other accumulator"
        ),
        "vectors": ("T14",),
        "regions": ("zeros, +-0 accumulators, zero rows",),
        "evidence": (
            "GPU = model on T14 (IEEE: 80000000); 1,634 all-zero instructions on c = -0 in the region, "
            "1,431 outputs whose whole K = 64 chain has no term and c = -0 are +0; with BK = 32 and 64 "
            "the kernel follows each vector's instruction by 1 and 3 all-zero instructions and the "
            "model without them matched all 30 vectors (Inf, NaN, subnormal and +0 results included)"
        ),
    },
    "overflow_to_inf": {
        "assumption": (
            "a result exponent above 127 gives +-Inf although the rounding is toward zero (IEEE RZ: "
            "+-FLT_MAX)"
        ),
        "vectors": ("T16", "X8", "X11"),
        "regions": ("overflow",),
        "evidence": (
            "GPU = model on T16, X8 (Inf) and X11 (FLT_MAX + 16 stays FLT_MAX); 58,149 outputs of the "
            "region overflow from finite inputs"
        ),
    },
    "nan_is_canonical_0x7fffffff": {
        "assumption": (
            "every NaN result is 0x7FFFFFFF, whatever the NaN inputs' payloads and signs; any "
            "instruction canonicalises a NaN accumulator"
        ),
        "vectors": ("X1", "X4"),
        "regions": ("Inf and NaN sprinkled",),
        "evidence": (
            "GPU = model on X1-X5; the only NaN word the GPU produced in the whole run was 7fffffff "
            "(1,954 NaN outputs in the region); payloads tried: operands 7f81 (signalling), 7fc0, 7fff, "
            "ffc1, accumulators 7f800001 (signalling), 7fc00000, ffc00001"
        ),
    },
    "inf_rules": {
        "assumption": (
            "0 x Inf is NaN, Inf terms of both signs are NaN, otherwise Inf wins over finite terms, "
            "checked per instruction with the running accumulator as c"
        ),
        "vectors": ("X2", "X3", "X5", "X6", "X7"),
        "regions": ("Inf and NaN sprinkled",),
        "evidence": (
            "GPU = model on X2-X7; in the region 1,532 instructions with a NaN operand, 5,343 with a NaN "
            "accumulator, 79 with 0 x Inf, 1 with Inf of both signs, 672 where an Inf product wins, "
            "2,053 with an Inf accumulator and finite products"
        ),
    },
    "subnormal_operands": {
        "assumption": "a bf16 subnormal operand has exponent -126 and no hidden bit (no renormalisation)",
        "vectors": ("T15", "X10"),
        "regions": (
            _FLOOR_REGION,
            _UNDERFLOW_REGION,
            "one instruction, mixed",
            "K tail (K = 50), mixed",
        ),
        "evidence": (
            "GPU = model on T15 and X10 (normalised operand: 3f820002); 261,539, 65,536, 47,777 and "
            "92,489 instructions of the regions have a nonzero product with a subnormal operand"
        ),
    },
    "subnormal_accumulator_aligns_at_-126": {
        "assumption": "an fp32 subnormal c takes part in the alignment with exponent -126",
        "vectors": ("X9",),
        "regions": (_FLOOR_REGION, _UNDERFLOW_REGION),
        "evidence": (
            "GPU = model on X9 (c aligned at its leading bit: 00000200); 134,326 and 9,948 "
            "instructions of the regions have a subnormal c"
        ),
    },
    "triton_tl_dot_path": {
        "assumption": (
            "Triton's bf16 tl.dot on sm_90 (which lowers to wgmma for such tiles) computes the "
            "instruction the published WMMA rows measured, chained in increasing k across BK tiles"
        ),
        "vectors": ("T1", "T4", "T8", "T12"),
        "regions": (
            "normal, randn * 2^U[-10,10] (the note's run)",
            "exponent spread of 120 binades",
            "cancellation",
            "K tail (K = 50), mixed",
        ),
        "evidence": (
            "no mismatch in 9 of the 10 regions and none but the corrected zero signs in the 10th "
            "(K = 16 to 64: chains of 1 to 4 instructions over BK = 16, 32, 64 tiles), in all 8 "
            "configurations, A direct and through tl.trans (the dW kernel's shape); the second run: 0 "
            "mismatches in all 10 regions against the corrected model, and all 32 vectors through "
            "forge_num's own mainloop (kernels.linear_mainloop: the fused kernel's, from the accumulation "
            "buffer, tl.trans of the dY tile, zero-filled K tail) equal to the model in each of the 5 "
            "BF16_CONFIGS tile shapes; the PTX/SASS the runs executed was not recorded"
        ),
    },
    "zero_result_with_accumulator_term": {
        "assumption": (
            "an exact zero or an underflow to zero in which the accumulator's cut value q(c) is nonzero "
            "gives +0, as it does for products alone"
        ),
        "vectors": ("X12", "X13"),
        "regions": (),
        "evidence": (
            "second run only: GPU = model = 00000000 on X12 (q(c) = 2^-126 with products -2^-126 and "
            "-2^-150: a sum of -2^-150 truncating to zero; the signed-zero alternative: 80000000) and "
            "X13 (c = -1 cancelled exactly by a product +1) in all 8 configurations, and through "
            "kernels.linear_mainloop in each of the 5 BF16_CONFIGS tile shapes; no random region has "
            "such an instruction (by the analysis of the regions' inputs, the same in both runs, every "
            "underflow and exact zero there, 7,512 + 7,402 and 23,876 + 22 per configuration, has "
            "c = +-0), so X12 and X13 alone pin it"
        ),
    },
}

# What no measurement has exercised. The model's prediction stands there untested.
UNMEASURED_CASES: dict[str, dict] = {
    "other_parts_and_paths": {
        "assumption": "sm_90 means this model: on other sm_90 parts, drivers and instruction paths too",
        "vectors": (),
        "why": (
            "measured on one H200 (driver 580.159.04, torch 2.11.0+cu130, triton 3.6.0), in two sessions "
            "of 2026-12-02, through Triton tl.dot only: the test kernel in 8 tile configurations (BM x BN "
            "x BK warps 64x64x64 w4, 128x128x64 w8, 128x64x32 w4, 64x64x16 w4, A direct and through "
            "tl.trans) and, in the second run, forge_num's own mainloop (kernels.linear_mainloop) in the "
            "5 BF16_CONFIGS tile shapes (128x64x64 w8 and w4, 64x128x64 w4, 64x64x64 w4, 64x128x32 w8) "
            "on the 32 targeted vectors (the random regions went through the test kernel only; random "
            "data through the fused kernel is tests/test_gpu_exactness.py's); not on an H100 or another "
            "H200, driver or Triton version, not for BM < 64 or tile shapes outside these, not with the "
            "persistent grid (TileConfig.persistent > 0, added after the runs), not through cuBLAS or "
            "hand-written wgmma/mma.sync; the PTX/SASS of the runs was not captured, so which "
            "instructions ran is inferred; NaN payloads other than those tried"
        ),
    },
}


# =================================================================================================
# bf16 helpers
# =================================================================================================
def bf16_bits_from_f32_rne(x_f32) -> np.ndarray:
    """fp32 values -> bf16 words, rounded to nearest with ties to even; a NaN stays a (quiet) NaN."""
    u = np.asarray(x_f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    # add 0x7FFF + the lsb that survives, then cut 16 bits: ties go to the even neighbour, and a
    # carry out of the fraction moves into the exponent (up to Inf), as RNE requires
    rounded = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    is_nan = (u & np.uint64(0x7FFFFFFF)) > np.uint64(_FP32_INF)
    quiet_nan = (u >> np.uint64(16)) | np.uint64(0x0040)  # keep sign and top payload, set quiet bit
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def f32_from_bf16_bits(u16) -> np.ndarray:
    """bf16 words -> their fp32 values (exact: a bf16 word is the upper half of the fp32 word)."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# =================================================================================================
# integer decoding and rounding (tile maths; no addressing here)
# =================================================================================================
def _decode(word: np.ndarray, frac_bits: int):
    """Split IEEE words (int64, exponent field 8 bits) into sign, significand, exponent and classes.

    Finite x = (-1)^neg * sig * 2^(exp - frac_bits); exp is the alignment exponent (emin for
    subnormals and zeros). Returns (neg, sig, exp, is_zero, is_inf, is_nan).
    """
    neg = ((word >> (frac_bits + 8)) & 1).astype(bool)
    exp_field = (word >> frac_bits) & 0xFF
    frac = word & ((1 << frac_bits) - 1)
    is_special = exp_field == 0xFF
    hidden = np.where(exp_field > 0, 1 << frac_bits, 0)
    sig = np.where(is_special, 0, hidden + frac)
    exp = np.maximum(exp_field, 1) - 127  # subnormals (field 0) share emin = -126 with field 1
    is_zero = (exp_field == 0) & (frac == 0)
    return neg, sig, exp, is_zero, is_special & (frac == 0), is_special & (frac != 0)


def _require(x, dtype, what: str) -> np.ndarray:
    """x as an array of exactly this dtype: bit patterns are never converted silently."""
    x = np.asarray(x)
    if x.dtype != dtype:
        raise TypeError(f"{what} must be {np.dtype(dtype).name}, got {x.dtype}")
    return x


def _shift(value: np.ndarray, left: np.ndarray) -> np.ndarray:
    """value * 2^left truncated toward zero (value >= 0): a left shift, or a right shift for left < 0.

    int64: right shifts are clamped at 63, which gives 0 for every value < 2^63. Object arrays of
    Python ints are shifted exactly.
    """
    up = np.maximum(left, 0)
    down = np.maximum(-left, 0)
    if value.dtype != object:
        down = np.minimum(down, 63)
    return (value << up) >> down


def _bit_length(mag: np.ndarray) -> np.ndarray:
    """Number of bits of each magnitude (0 for 0)."""
    if mag.dtype == object:
        return np.frompyfunc(int.bit_length, 1, 1)(mag).astype(np.int64)
    if mag.size and int(mag.max()) >= 1 << 53:
        raise OverflowError("magnitude beyond 2^53: pass an object array")
    # frexp is exact here: every magnitude below 2^53 is a binary64 value
    return np.frexp(mag.astype(np.float64))[1].astype(np.int64)


def _fp32_bits_from_scaled_int(
    neg, mag, scale_exp, rounding: str = "rz", signed_underflow: bool = False
) -> np.ndarray:
    """fp32 words of (-1)^neg * mag * 2^scale_exp, rounded once ("rz": toward zero; "rne": nearest even).

    mag >= 0 (int64 below 2^53, or Python ints in an object array). The result's lsb weight is
    lsb = max(E - 23, -149) for the leading-bit exponent E; M = mag * 2^(scale_exp - lsb) cut to an
    integer is then the 24-bit significand (normal) or the subnormal fraction, and the word is
    (lsb + 149) << 23 plus M: for a normal M the hidden bit 2^23 lifts the exponent field from
    lsb + 149 to lsb + 150 = E + 127, and a rounding carry moves up the same way (to Inf at the top).
    A zero result is +0: a magnitude 0, and also a nonzero magnitude that rounds to 0 whatever
    ``neg`` says (the H200 gives +0 there, not a zero of the sum's sign); E > 127 gives +-Inf.
    signed_underflow=True restores the refuted rule (a nonzero magnitude that rounds to 0 keeps its
    sign), for the tests that show what the H200 run rejected.
    """
    bitlen = _bit_length(mag)
    lead_exp = bitlen - 1 + scale_exp
    lsb = np.maximum(lead_exp - _FP32_FRAC_BITS, _FP32_MIN_SUBNORMAL_EXP)
    cut = lsb - scale_exp  # bits of mag below the result's lsb (negative: none, shift left)
    m = _shift(mag, -cut)
    if rounding == "rne":
        kept_low = _shift(m, np.where(cut > 0, cut, 0))  # m * 2^cut for cut > 0
        dropped = np.where(cut > 0, mag - kept_low, 0)
        half = np.where(cut > 0, _shift(np.ones_like(mag), cut - 1), 1)
        round_up = (dropped > half) | ((dropped == half) & (cut > 0) & (m % 2 == 1))
        m = m + round_up.astype(m.dtype)
    elif rounding != "rz":
        raise ValueError(f"unknown rounding {rounding!r}")
    word = ((lsb + 149) << _FP32_FRAC_BITS).astype(np.int64) + m.astype(np.int64)
    overflow = (lead_exp > 127) | (word >= _FP32_INF)
    word = np.where(overflow, _FP32_INF, word)
    word = np.where(bitlen == 0, 0, word)  # an exact zero sum (lead_exp is meaningless there)
    # a zero result is +0 whatever the sign of the sum: an exact zero (bitlen == 0), and a nonzero
    # sum whose magnitude rounds to zero (measured: T13 and 60,096 outputs of the H200 run, module
    # docstring); the sign is attached to nonzero magnitudes only
    keeps_sign = (bitlen > 0) if signed_underflow else (word != 0)
    word = np.where(neg & keeps_sign, word | _FP32_SIGN, word)
    return word.astype(np.uint32)


# =================================================================================================
# one k16 instruction
# =================================================================================================
def _block_fma(
    acc,
    a_bits,
    b_bits,
    *,
    frac_bits: int = SM90_ALIGN_FRAC_BITS,
    eta_floor: int | None = SM90_ETA_FLOOR,
    acc_in_alignment: bool = True,
    rounding: str = "rz",
    zeros_have_exponent: bool = False,
    signed_underflow: bool = False,
) -> np.ndarray:
    """The block FMA with its features as parameters (the defaults are the sm_90 model).

    The alternatives exist so that tests can show which feature each measurement pins:
    frac_bits (24, 26, ...); eta_floor=None (no floor); acc_in_alignment=False (products aligned
    among themselves, c added exactly afterwards); rounding="rne" at the end; zeros_have_exponent
    (MMA-Sim's convention: zero products and c = 0 take part in the alignment with exponent -126);
    signed_underflow (the model's rule before the H200 run: a nonzero sum that truncates to zero
    gives a zero of its sign, -0 for a negative sum; refuted, see MEASURED_CASES["underflow_is_+0"]).
    """
    acc = _require(acc, np.float32, "acc")
    a_bits = _require(a_bits, np.uint16, "a_bits (bf16 words)")
    b_bits = _require(b_bits, np.uint16, "b_bits (bf16 words)")
    if a_bits.shape[-1:] != (SM90_BLOCK_K,) or b_bits.shape[-1:] != (SM90_BLOCK_K,):
        raise ValueError(f"operands need a last axis of {SM90_BLOCK_K}: {a_bits.shape}, {b_bits.shape}")
    out_shape = np.broadcast_shapes(acc.shape, a_bits.shape[:-1], b_bits.shape[:-1])
    if out_shape != acc.shape:
        raise ValueError(f"operands {a_bits.shape}, {b_bits.shape} do not fit the accumulator {acc.shape}")

    # decode each operand at its own shape; broadcasting happens in the products
    a_neg, a_sig, a_exp, a_zero, a_inf, a_nan = _decode(a_bits.astype(np.int64), _BF16_FRAC_BITS)
    b_neg, b_sig, b_exp, b_zero, b_inf, b_nan = _decode(b_bits.astype(np.int64), _BF16_FRAC_BITS)
    c_word = acc.view(np.uint32).astype(np.int64)
    c_neg, c_sig, c_exp, c_zero, c_inf, c_nan = _decode(c_word, _FP32_FRAC_BITS)

    # ---- specials (checked per instruction; the finite path below ignores these lanes) ----------
    p_neg = a_neg ^ b_neg
    p_nan = a_nan | b_nan | (a_inf & b_zero) | (a_zero & b_inf)
    p_inf = (a_inf | b_inf) & ~p_nan
    has_pos_inf = (p_inf & ~p_neg).any(axis=-1) | (c_inf & ~c_neg)
    has_neg_inf = (p_inf & p_neg).any(axis=-1) | (c_inf & c_neg)
    is_nan = p_nan.any(axis=-1) | c_nan | (has_pos_inf & has_neg_inf)
    is_inf = (has_pos_inf | has_neg_inf) & ~is_nan

    # ---- exact products: sig in [0, 2^16), value sig * 2^(p_exp - 14) ----------------------------
    p_sig = a_sig * b_sig  # 0 for zero and special lanes
    p_exp = a_exp + b_exp
    p_frac_bits = 2 * _BF16_FRAC_BITS
    p_finite = ~(a_inf | a_nan | b_inf | b_nan)
    p_in_eta = p_finite if zeros_have_exponent else p_sig != 0
    c_in_eta = ~(c_inf | c_nan) if zeros_have_exponent else c_sig != 0

    # ---- alignment exponent eta and the grid 2^(eta - F) -----------------------------------------
    eta = np.max(np.where(p_in_eta, p_exp, _NO_TERM), axis=-1)
    if acc_in_alignment:
        eta = np.maximum(eta, np.where(c_in_eta, c_exp, _NO_TERM))
    if eta_floor is not None:
        eta = np.maximum(eta, eta_floor)
    grid_exp = eta - frac_bits

    # ---- cut every term to the grid (magnitude truncation) and add exactly -----------------------
    p_on_grid = _shift(p_sig, (p_exp - p_frac_bits) - grid_exp[..., None])  # left shift <= F - 14
    total = np.sum(np.where(p_neg, -p_on_grid, p_on_grid), axis=-1)  # |total| < 2^32
    if acc_in_alignment:
        c_on_grid = _shift(c_sig, (c_exp - _FP32_FRAC_BITS) - grid_exp)  # left shift <= F - 23
        total = total + np.where(c_neg, -c_on_grid, c_on_grid)
        scale_exp = grid_exp
    else:  # alternative: c added exactly to the aligned products, on the finer of the two grids
        scale_exp = np.minimum(grid_exp, c_exp - _FP32_FRAC_BITS)
        c_signed = np.where(c_neg, -c_sig, c_sig)
        # left shifts of Python ints are exact for either sign, whatever the exponent gap
        total = total.astype(object) << (grid_exp - scale_exp).astype(object)
        total = total + (c_signed.astype(object) << (c_exp - _FP32_FRAC_BITS - scale_exp).astype(object))
    neg = total < 0
    word = _fp32_bits_from_scaled_int(neg, np.abs(total), scale_exp, rounding, signed_underflow)

    word = np.where(is_inf, np.where(has_neg_inf, _FP32_INF | _FP32_SIGN, _FP32_INF), word)
    word = np.where(is_nan, FP32_CANONICAL_NAN, word).astype(np.uint32)
    return word.view(np.float32).reshape(out_shape)


def block_fma_sm90(acc, a_bits, b_bits) -> np.ndarray:
    """One Hopper bf16 tensor-core instruction per element: d = c + sum_k a_k b_k, bit for bit.

    acc: float32 array of shape S (the accumulator c). a_bits, b_bits: uint16 bf16 words whose shapes
    broadcast to S + (16,). Returns the float32 array d of shape S (model: module docstring).
    """
    return _block_fma(acc, a_bits, b_bits)


# =================================================================================================
# the mainloop (addressing: padding, slicing, row chunks; the maths is block_fma_sm90)
# =================================================================================================
_ROWS_ELEMENTS = 1 << 20  # lanes (rows x N x 16) decoded at once: bounds the int64 temporaries


def _dot_chained(block_fma: Callable, a_bits, b_bits, acc, pad_k_to: int = SM90_BLOCK_K) -> np.ndarray:
    if pad_k_to <= 0 or pad_k_to % SM90_BLOCK_K:
        raise ValueError(f"pad_k_to must be a positive multiple of {SM90_BLOCK_K}, got {pad_k_to}")
    a_bits = _require(a_bits, np.uint16, "a_bits (bf16 words)")
    b_bits = _require(b_bits, np.uint16, "b_bits (bf16 words)")
    acc = _require(acc, np.float32, "acc")
    (m, k), (k_b, n) = a_bits.shape, b_bits.shape
    if k != k_b or acc.shape != (m, n):
        raise ValueError(f"shapes do not chain: a {a_bits.shape}, b {b_bits.shape}, acc {acc.shape}")
    k_padded = -(-k // pad_k_to) * pad_k_to
    blocks = k_padded // SM90_BLOCK_K
    a_pad = np.zeros((m, k_padded), dtype=np.uint16)
    a_pad[:, :k] = a_bits
    b_pad = np.zeros((k_padded, n), dtype=np.uint16)
    b_pad[:k, :] = b_bits
    out = acc.copy()
    rows = max(1, _ROWS_ELEMENTS // max(1, n * SM90_BLOCK_K))
    for r0 in range(0, m, rows):
        d = out[r0 : r0 + rows]
        for j in range(blocks):
            ks = slice(j * SM90_BLOCK_K, (j + 1) * SM90_BLOCK_K)
            a_block = a_pad[r0 : r0 + rows, None, ks]  # [rows, 1, 16]
            b_block = b_pad[ks, :].T[None, :, :]  # [1, N, 16]
            d = block_fma(d, a_block, b_block)
        out[r0 : r0 + rows] = d
    return out


def dot_sm90(a_bits, b_bits, acc, *, pad_k_to: int = SM90_BLOCK_K) -> np.ndarray:
    """``acc = tl.dot(a, b, acc)`` on an H200 with bf16 operands, bit for bit.

    a_bits [M, K] and b_bits [K, N] uint16 bf16 words, acc [M, N] float32. K is zero-padded to a
    multiple of 16 and the k16 instructions run in increasing k, each one's output the next one's
    accumulator; a K loop of several tl.dot calls is one longer chain.

    pad_k_to: pad K to a multiple of this instead (a multiple of 16). A kernel whose K loop loads
    zero-filled [., BK] tiles issues BK/16 instructions per tile, also on the padding, and
    pad_k_to=BK mirrors it instruction for instruction. The result is the same as without it: an
    all-zero instruction changes only an accumulator of -0 (to +0) or a NaN with another payload (to
    0x7FFFFFFF), and no instruction outputs either, so after the first instruction the extra ones are
    the identity (the H200 run's BK = 32 and 64 configurations agree with the unpadded model).
    """
    return _dot_chained(block_fma_sm90, a_bits, b_bits, acc, pad_k_to)


# =================================================================================================
# architectures
# =================================================================================================
ARCH_MODELS: dict[str, Callable] = {"sm_90": dot_sm90}
_ARCH_ALIASES = {"sm_90a": "sm_90"}  # Triton compiles Hopper kernels for sm_90a


class NoVerifiedModelError(LookupError):
    """No bit-exact tensor-core model has been verified for this architecture."""

    fallback = "bf16_mainloop_error_bound"


def mainloop_model(arch: str) -> Callable:
    """The bit-exact bf16 mainloop ``dot(a_bits, b_bits, acc)`` of a verified architecture.

    Raises NoVerifiedModelError for any other: there the emulator cannot mirror the tensor cores bit
    for bit, and the documented fallback is bf16_mainloop_error_bound (proofs/tensor_core_model.md),
    valid where its hypotheses hold for that architecture (block of at most 16 products, truncation
    to at least 25 fraction bits below the largest exponent, exact sum, one rounding within one ulp).
    """
    key = _ARCH_ALIASES.get(arch.lower(), arch.lower())
    if key not in ARCH_MODELS:
        raise NoVerifiedModelError(
            f"no verified model for {arch}: use the proved bound "
            f"(forge_num.emulator.tensor_core.bf16_mainloop_error_bound, proofs/tensor_core_model.md)"
        )
    return ARCH_MODELS[key]


# =================================================================================================
# the proved error bound of the bf16 mainloop (proofs/tensor_core_model.md, Theorem 1)
# =================================================================================================
def bf16_mainloop_error_bound(
    abs_products_sum,
    max_abs_product,
    K: int,
    *,
    abs_acc=0,
    subnormal_operands: bool = True,
    block_k: int = SM90_BLOCK_K,
    frac_bits: int = SM90_ALIGN_FRAC_BITS,
):
    """Upper bound on |dot_sm90(a, b, acc) - (acc + sum_k a_k b_k)| for one output (finite result).

        J = ceil(K / block_k),  G = abs_acc + abs_products_sum,
        W = max(G, sigma * max_abs_product, 2^-126),  sigma = 2^7 if subnormal_operands else 1,
        bound = J * ( block_k * 2^-frac_bits * W  +  2^-23 * G  +  2^-149 + 2^-158 ).

    abs_products_sum: sum_k |a_k b_k| (an upper bound of it); max_abs_product: max_k |a_k b_k| (None:
    use abs_products_sum); abs_acc: |initial acc|. subnormal_operands=False may be passed only when no
    a_k or b_k is a nonzero bf16 subnormal. Holds whenever the computed result is finite.

    Exact (a Fraction) for int/Fraction inputs; for float or array inputs it is computed in binary64
    and rounded up: the arguments are taken as given, except that abs_products_sum may be a binary64
    sum, in any order, of the exact |a_k b_k| (low by a relative (K-1) 2^-53 at most; covered).
    """
    if K < 0:
        raise ValueError("K must be >= 0")
    blocks = -(-K // block_k)
    sigma = 2**7 if subnormal_operands else 1
    if max_abs_product is None:
        max_abs_product = abs_products_sum
    exact = all(isinstance(x, (int, Fraction)) for x in (abs_products_sum, max_abs_product, abs_acc))
    if exact:
        g = Fraction(abs_acc) + Fraction(abs_products_sum)
        w = max(g, sigma * Fraction(max_abs_product), Fraction(1, 2**126))
        per_block = (
            block_k * Fraction(1, 2**frac_bits) * w
            + Fraction(1, 2**23) * g
            + Fraction(1, 2**149)
            + Fraction(1, 2**158)
        )
        return blocks * per_block
    # binary64: inflate the sum for its own summation error, then round every step up by a margin
    sum_slack = 1.0 + (K + 1) * 2.0**-52
    g = np.asarray(abs_acc, dtype=np.float64) + np.asarray(abs_products_sum, dtype=np.float64) * sum_slack
    w = np.maximum(np.maximum(g, sigma * np.asarray(max_abs_product, dtype=np.float64)), 2.0**-126)
    per_block = block_k * 2.0**-frac_bits * w + 2.0**-23 * g + (2.0**-149 + 2.0**-158)
    return blocks * per_block * (1.0 + 2.0**-40)
