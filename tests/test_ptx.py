"""The compiled kernels hold exactly the IEEE operations the rules name, and nothing approximate.

Triton compiles for sm_90 without a GPU (ptxas ships with it), so this runs in CI, in a subprocess
without TRITON_INTERPRET (the test session interprets kernels when there is no GPU). For the
element-wise kernel, one element per thread, the count of each PTX instruction equals the number of
calls of that op in the rule's text plus guarded_update's: no FMA contraction, no approximate
division or square root. The fused kernels: no forbidden instruction; the fp32 mainloop is an FMA
chain (fma.rn.f32 only); the bf16 mainloop uses wgmma.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.interpreter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The spill tables below (and the Philox count with wide products off) are what Triton 3.6's code gives
# (constraints.txt's pin, the device's Triton): another Triton's code spills otherwise (3.9: more in some 8bit
# and Triton-language tiles, none in the routed fp32 ones; README, Tests). Under it every op count is still
# checked; the spill bytes are bounded only under the tables' Triton.
TABLES_TRITON = "3.6.0"


def tables_apply() -> bool:
    import triton

    return triton.__version__ == TABLES_TRITON


def spills_within(spill_stores: int, allowed: int) -> bool:
    """A compile's spill stores within its table's bytes, under the tables' Triton (any, under another)."""
    return spill_stores <= allowed or not tables_apply()


@pytest.fixture(scope="module")
def report():
    # the GPU's defaults: compiled for sm_90 (no interpreter), the Philox products wide (the spill
    # table below is theirs; FORGE_NUM_PHILOX_WIDE=0 in the caller's environment would change them)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FORGE_NUM_PHILOX_WIDE"] = "1"
    proc = subprocess.run([sys.executable, "-m", "tests.ptx_check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        # a negative return code is the signal that ended it (stderr then empty)
        pytest.fail(f"PTX compilation failed (return code {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def test_philox_rounds_take_one_multiply_a_product_when_wide():
    """kernels/random.py's WIDE_PRODUCTS (on unless FORGE_NUM_PHILOX_WIDE=0): each round's two mul.hi.u32 of
    the 8bit tile's Philox become mul.wide.u32 (the low halves with them), and nothing approximate
    comes in; off, the tile keeps tl.randint4x's mul.hi.u32 (ten rounds, two a round, less the
    first round's umulhi of the zero word c2: 19 an element)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = {wide: subprocess.Popen([sys.executable, "-m", "tests.ptx_check", "--philox"], cwd=ROOT,
                                    env={**env, "FORGE_NUM_PHILOX_WIDE": wide}, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for wide in ("0", "1")}
    got = {}
    for wide, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        got[wide] = json.loads(out)
    off, on = got["0"], got["1"]
    n = off["per_thread"]
    assert not off["wide"] and on["wide"]
    assert off["forbidden"] == [] and on["forbidden"] == []
    # (a mul.hi or mul.wide or two of the tile's own addressing, the same on and off); off, the count of mul.hi
    # is Triton's code (3.9's: 16 an element, both here and in the Gluon kernel's calls)
    off_products = 19 if tables_apply() else 16
    assert off["mul_hi"] >= off_products * n, off
    assert off["mul_hi"] - on["mul_hi"] >= off_products * n and on["mul_wide"] - off["mul_wide"] >= 19 * n, (off, on)
    # the 8bit Gluon kernel compiles either way (Gluon has no tl.randint4x: it runs philox4x32_10), with
    # the rule's IEEE ops, its products as mul.hi.u32 off and mul.wide.u32 on (one call a pair of elements)
    for g, kind, products in ((off["gluon_q8"], "mul_hi", off_products), (on["gluon_q8"], "mul_wide", 19)):
        assert g["forbidden"] == [] and g["ptx"] == g["expected"] and g[kind] >= products * g["per_thread"] // 2, g


def test_elementwise_kernels_hold_exactly_the_rule_ops(report):
    for r in report["elementwise"]:
        assert r["forbidden"] == [], r
        assert r["ptx"] == r["expected"], r


def test_fused_kernels_have_no_approximate_ops(report):
    for r in report["fused"]:
        assert r["forbidden"] == [], r
        if r["dtype"] == "bf16":
            assert r["wgmma"] > 0, f"bf16 mainloop is not on wgmma: {r}"
        else:
            assert r["wgmma"] == 0 and r["fma_total"] >= 64 * 64 * 16 // 128, r


# Spills of the Gluon tiles of kernels/gluon_update.py, by (label, rule[, regime]), bytes of spill stores a
# thread (ptxas of Triton 3.6, sm_90a, compiled with the launch's specialization: tests/ptx_check.py); every other
# (tile, rule) compiles without a spill. In the fp32 regime none spills (before session 39 the compiles lacked the
# launch's 16-byte divisibility, so their loads and stores took 4 bytes an element, and AdamW spilled 8-32 B in
# the two-program, 128-row and ping-pong tiles: not the kernels the GPU runs).
GLUON_SPILL_EXCEPTIONS = {
    # bf16-sr (session 13; routed only with FORGE_NUM_GLUON_BF16_SR=1, 1.0-1.85x slower than the Triton tile):
    # SGD's one state, with the Philox products as one mul.wide.u32 (kernels/random.py's WIDE_PRODUCTS, the
    # default since session 20); AdamW's and Lion's none. With four column sub-tiles instead of eight every
    # bf16-sr tile spilled 250-520 B for AdamW (session 13), which is why they take eight.
    ("ws 64x128x64 st2 sl2 o1 p2 r128 e8", "sgd", "bf16-sr"): 16,
    ("ws 64x128x64 st3 sl4 o2 e8", "sgd", "bf16-sr"): 4,
    ("ws 128x128x64 st3 sl2 o1 e8", "sgd", "bf16-sr"): 56,
    ("ws 64x128x64 st2 sl2 o1 p2 r168 e8", "sgd", "bf16-sr"): 28,
    ("ws 128x128x64 st4 sl4 o2 e8", "sgd", "bf16-sr"): 56,
}


def test_the_warp_specialized_gluon_kernel_compiles_to_ieee_ops_for_sm_90(report):
    """kernels/gluon_update.py, its default tile, the routed ones, the split and the ping-pong design,
    and the bf16-sr regime's tiles (with their Philox rounds, none in the fp32 regime):
    each op of the rule once per element a consumer (or epilogue) thread updates (the ping-pong's two
    consumers each), in its correctly rounded form and nothing approximate; the mainloop on wgmma (4
    m64n128k16 a K block of 64, per consumer's code);
    TMA loads and stores; the loaders' register caps (setmaxnreg); spills only as GLUON_SPILL_EXCEPTIONS states; shared
    memory as WSConfig.shared_bytes counts it (plus barriers), within the H200's 227 KB a block."""
    seen = set()
    for r in report["gluon_ws"]:
        key = (r["config"], r["rule"])
        seen.add(key)
        assert r["forbidden"] == [] and r["ptx"] == r["expected"], r
        assert r["wgmma"] == 4 * r["consumers"] and r["tma"] >= 4 and r["setmaxnreg"] >= 2, r
        if r["precision"] == "bf16-sr":
            # the Philox rounds: two high products a round, ten rounds a (consumer thread's) element,
            # less those that fold or feed only the unused words c2, c3 (round 1's umulhi(B, 0),
            # round 10's c2; 17 an element in Triton 3.6's PTX), plus a few for addressing; each a
            # mul.hi.u32, or with WIDE_PRODUCTS (the GPU's default) a mul.wide.u32 with its low half
            products = r["mul_hi"] + r["mul_wide"]
            assert 16 * r["per_thread"] <= products <= 20 * r["per_thread"] + 8, r
            key = (*key, "bf16-sr")
            seen.add(key)
        else:
            assert r["mul_hi"] == 0 and r["mul_wide"] == 0, r
        assert spills_within(r["spill_stores"], GLUON_SPILL_EXCEPTIONS.get(key, 0)), r
        assert 0 <= r["shared"] - r["shared_model"] <= 1024 and r["shared"] <= 227 * 1024, r
    assert set(GLUON_SPILL_EXCEPTIONS) <= seen, "an exception names a tile the report no longer compiles"


def test_the_8bit_gluon_kernel_compiles_to_ieee_ops_for_sm_90_without_spills(report):
    """kernels/gluon_q8.py, its default tile and candidates, for rules of two and one 8bit states:
    each op of the rule once per element an epilogue thread updates, plus dequantization's two
    products a state, correctly rounded and nothing approximate; the Philox rounds' products (one
    call a pair of elements, RAND_PAIRS: 19-20 a thread's pair, kernels/random.py); the mainloop on wgmma (BK / 16
    m64n128k16 a K block) from TMA loads; the partitions' register caps; no spill but
    GLUON_Q8_SPILL_EXCEPTIONS' (ptxas of Triton 3.6: the tiles were chosen so, kernels/gluon_q8.py
    says which spilled); shared memory as Q8WSConfig.shared_bytes counts it (plus barriers)."""
    assert report["gluon_q8"], "no 8bit Gluon tile compiled"
    for r in report["gluon_q8"]:
        assert r["forbidden"] == [] and r["ptx"] == r["expected"], r
        products = r["mul_hi"] + r["mul_wide"]
        assert 19 * r["per_thread"] // 2 <= products <= 10 * r["per_thread"] + 8, r
        assert r["wgmma"] == r["BK"] // 16 and r["tma"] >= 2 and r["setmaxnreg"] >= 2, r
        assert spills_within(r["spill_stores"], GLUON_Q8_SPILL_EXCEPTIONS.get((r["config"], r["rule"]), 0)), r
        assert 0 <= r["shared"] - r["shared_model"] <= 1024 and r["shared"] <= 227 * 1024, r
    seen = {(r["config"], r["rule"]) for r in report["gluon_q8"]}
    assert set(GLUON_Q8_SPILL_EXCEPTIONS) <= seen, "an exception names a tile the report no longer compiles"


def test_the_fp32_split_gluon_kernel_compiles_to_ieee_ops_for_sm_90(report):
    """kernels/gluon_f32.py, its default tile and candidates, for rules of two, one and no states: each op of
    the rule once per element an epilogue thread updates, correctly rounded and nothing approximate; no Philox
    rounds; the mainloop on wgmma (BK / 16 m64n128k16 a K block) from TMA loads; the partitions' register caps;
    no spill but GLUON_F32_SPILL_EXCEPTIONS' (ptxas of Triton 3.6); shared memory as F32WSConfig.shared_bytes
    counts it (plus barriers)."""
    assert report["gluon_f32"], "no fp32 split Gluon tile compiled"
    for r in report["gluon_f32"]:
        assert r["forbidden"] == [] and r["ptx"] == r["expected"], r
        assert r["mul_hi"] == 0 and r["mul_wide"] == 0, r
        assert r["wgmma"] == r["BK"] // 16 and r["tma"] >= 2 and r["setmaxnreg"] >= 2, r
        assert spills_within(r["spill_stores"], GLUON_F32_SPILL_EXCEPTIONS.get((r["config"], r["rule"]), 0)), r
        # compiled as a launch specializes it: W and the states stored 16 bytes at a time, as on the GPU
        # (compile_gluon_for_sm90; without the specialization one 4-byte store an element)
        assert r["st_v4"] > 0, r
        assert 0 <= r["shared"] - r["shared_model"] <= 1024 and r["shared"] <= 227 * 1024, r
    seen = {(r["config"], r["rule"]) for r in report["gluon_f32"]}
    assert set(GLUON_F32_SPILL_EXCEPTIONS) <= seen, "an exception names a tile the report no longer compiles"


# The fp32 split tiles' spills, by (label, rule), bytes of spill stores a thread (ptxas of Triton 3.6, compiled with
# the launch's specialization: 16-byte loads and stores of W and the states). The 64-row tiles with sixteen
# epilogue warps at 96 registers spill nothing but with a second sub-tile's values beside the update (prefetch,
# or 32-row sub-tiles). The 128-row tiles' eight epilogue warps hold eight elements a thread (16-row sub-tiles)
# at the 128-register launch cap, which ptxas holds every partition to. Since session 43 each sub-tile's
# telemetry terms are added in place (gluon_q8.add_subtile_telemetry): before it, AdamW spilled 200-252 B in the
# 128-row tiles with 16-row sub-tiles, Lion 20-96 and SGD 28-120, v47 (8-row sub-tiles) Lion 24 and SGD 76; now
# those tiles' AdamW none, and v47's Lion 60, SGD 8 (and none of them under Triton 3.9, whose v47 spilled 228 B for
# AdamW without the pin). Until session 39 these numbers came from compiles without the launch's divisibility
# (4-byte accesses): AdamW none in the 128-row tiles, 64 B in the default; the GPU ran the kernels counted here.
GLUON_F32_SPILL_EXCEPTIONS = {
    ("wsf 64x128x64 st4 w16 rows16 mma96 r96 sl cur pf", "adamw"): 8,
    ("wsf 64x128x64 st4 w16 rows32 mma96 r96 sl cur", "adamw"): 268,
    # the 128-row tile, routed at 3072-4095 tokens in sessions 35-39
    ("wsf 128x128x64 st3 w8 rows16 mma96 r128 sl cur", "lion"): 16,
    ("wsf 128x128x64 st3 w8 rows16 mma96 r128 sl cur", "sgd"): 92,
    # its one-buffer twins with four (routed from 4096 tokens in sessions 36-39) and five operand stages
    ("wsf 128x128x64 st4 w8 rows16 mma96 r128 sl cur gb1", "lion"): 28,
    ("wsf 128x128x64 st4 w8 rows16 mma96 r128 sl cur gb1", "sgd"): 12,
    ("wsf 128x128x64 st5 w8 rows16 mma96 r128 sl cur gb1", "lion"): 16,
    ("wsf 128x128x64 st5 w8 rows16 mma96 r128 sl cur gb1", "sgd"): 20,
    # v47 (session 39; routed from 2304 tokens since session 40): the one-buffer tile with 8-row sub-tiles
    ("wsf 128x128x64 st4 w8 rows8 mma96 r128 sl cur gb1", "lion"): 60,
    ("wsf 128x128x64 st4 w8 rows8 mma96 r128 sl cur gb1", "sgd"): 8,
    # v49b (session 41): v47 with groups of 16 and 32 tile rows (the tile order is addressing only: v47's spills)
    ("wsf 128x128x64 st4 w8 rows8 g16 mma96 r128 sl cur gb1", "lion"): 60,
    ("wsf 128x128x64 st4 w8 rows8 g16 mma96 r128 sl cur gb1", "sgd"): 8,
    ("wsf 128x128x64 st4 w8 rows8 g32 mma96 r128 sl cur gb1", "lion"): 60,
    ("wsf 128x128x64 st4 w8 rows8 g32 mma96 r128 sl cur gb1", "sgd"): 8,
    # v48b (session 40): v47 with W's and the states' accesses by pointer hinted evict_first (the hint's policy
    # register beside the values)
    ("wsf 128x128x64 st4 w8 rows8 mma96 r128 sl cur gb1 ef", "lion"): 60,
    ("wsf 128x128x64 st4 w8 rows8 mma96 r128 sl cur gb1 ef", "sgd"): 8,
    # v46's staged tiles (W and the states read from shared memory: no load addresses in registers)
    ("wsf 128x128x64 st3 w8 rows16 mma96 r128 sl cur gb1 ss2", "lion"): 12,
    ("wsf 128x128x64 st3 w8 rows16 mma96 r128 sl cur gb1 ss2", "sgd"): 8,
}


def test_the_8bit_gluon_kernel_compiles_single_philox_calls(report):
    """RAND_PAIRS off (a counter map whose rows start on odd counters): the same rule ops, and each element
    its own Philox call (19-20 products a thread's element, twice the paired tiles'), no more spills than
    GLUON_Q8_SPILL_EXCEPTIONS allows the paired tile plus 16 B (the select of the call's half)."""
    assert report["gluon_q8_single"], "no single-call 8bit Gluon tile compiled"
    for r in report["gluon_q8_single"]:
        assert not r["pairs"] and r["forbidden"] == [] and r["ptx"] == r["expected"], r
        assert 19 * r["per_thread"] <= r["mul_hi"] + r["mul_wide"] <= 20 * r["per_thread"] + 8, r
        # 16 B for AdamW with the launch's 16-byte accesses (session 39; 8 before, with 4-byte ones)
        assert spills_within(r["spill_stores"], GLUON_Q8_SPILL_EXCEPTIONS.get((r["config"], r["rule"]), 0) + 16), r


def test_launches_reading_a_step_slot_compile_to_the_same_ops(report):
    """A launch given a step slot (kernels.fused_linear_update's step_slot: a captured step's) reads h,
    grad_scale and the key from memory when it runs; the rule's ops are the same, in the Triton kernels
    (tests.ptx_check's elementwise and fused rows with slot) and the routed Gluon tiles. Passed as
    arguments the scalars stay in the constant bank; loaded, they take registers, so the routed tiles
    at a 128-register cap spill more: STEP_SLOT_SPILLS."""
    for kind, keys in (("elementwise", ("rule",)), ("fused", ("rule", "dtype"))):
        plain = {tuple(r[k] for k in keys): r["ptx"] for r in report[kind] if not r["slot"]}
        slotted = [r for r in report[kind] if r["slot"]]
        assert slotted and all(r["ptx"] == plain[tuple(r[k] for k in keys)] and r["forbidden"] == [] for r in slotted)
    for r in report["gluon_slot"]:
        assert r["forbidden"] == [] and r["ptx"] == r["expected"], r
        assert spills_within(r["spill_stores"], STEP_SLOT_SPILLS[r["config"]]), r
    assert {r["config"] for r in report["gluon_slot"]} == set(STEP_SLOT_SPILLS)


# Spill stores a thread (bytes, ptxas of Triton 3.6, the launch's specialization) of the routed Gluon tiles reading a
# step slot, AdamW: the nine scalars, the scale and the key's two words held in registers through the epilogue
# (the 8bit sixteen-warp tiles 20-60 B, against 16-52 B without a slot; the fp32 tiles as without one). Only a
# captured step's launches read a slot.
STEP_SLOT_SPILLS = {
    "ws8 64x128x64 st4 w8 rows16 mma104 r128": 0,
    "ws8 64x128x64 st4 w16 rows16 mma96 r96 sl cur ms": 60,  # routed since session 34; 52 B without a slot
    "ws8 64x128x64 st4 w16 rows16 mma96 r96 sl cur": 20,  # 16 B without a slot (GLUON_Q8_SPILL_EXCEPTIONS)
    "ws8 64x128x128 st3 w16 rows16 mma96 r96 sl cur": 20,  # routed since session 33
    "ws 64x128x64 st2 sl1 o1 p2 r128": 0,
    "ws 128x128x64 st3 sl1 o1": 0,
    "wsf 64x128x64 st4 w16 rows16 mma96 r96 sl cur ss2": 0,  # routed since session 39 (v46)
    "wsf 64x128x64 st4 w16 rows16 g16 mma96 r96 sl cur ss2": 0,  # routed since session 41 (v49: v46 grouped)
    "wsf 64x128x64 st4 w16 rows16 g16 mma96 r96 sl cur": 0,  # routed since session 41 (v49: the default grouped)
    "wsf 128x128x64 st4 w8 rows8 mma96 r128 sl cur gb1": 0,  # routed since session 40 (v47); as without a slot
}


# The 8bit Gluon tiles' spills, by (label, rule), bytes of spill stores a thread (ptxas of Triton 3.6, the launch's
# specialization): the tiles with sixteen epilogue warps at 96 registers (20 warps an SM: the most the SM's
# registers allow at a launch cap the wgmma accumulator needs) spill 16 B for AdamW (52 B with the MMA warps
# staging the state; 44 and 76 B before session 43's gluon_q8.add_subtile_telemetry); they are routed (from 1024 tokens: the state staged by the MMA warps to 3071, the deep
# cursor and the K-block-128 cursor above) because eight epilogue warps an SM bound the spill-free tiles below
# 4096 tokens (session 23, call 2; session 30, calls 2-3; session 34). (Before session 39 the compiles lacked
# the launch's divisibility, and counted 104 and 124 B.)
GLUON_Q8_SPILL_EXCEPTIONS = {
    ("ws8 64x128x64 st3 w16 rows16 mma96 r96 sl", "adamw"): 16,
    ("ws8 64x128x64 st3 w16 rows16 mma96 r96 sl cur", "adamw"): 16,  # the same epilogue
    ("ws8 64x128x64 st4 w16 rows16 mma96 r96 sl cur", "adamw"): 16,  # a candidate: its ring one stage deeper
    ("ws8 64x128x128 st3 w16 rows16 mma96 r96 sl cur", "adamw"): 16,  # a candidate: K blocks of 128
    # the default with its state loads one sub-tile ahead (PREFETCH), a candidate (session 30: 0.88-0.91x the
    # Triton tile at 2048 tokens): the prefetched sub-tile's registers beside AdamW's update
    ("ws8 64x128x64 st4 w8 rows16 mma104 r128 pf", "adamw"): 4,
    # v38's candidates, the next sub-tile's state staged by TMA (STAGE_STATE, session 31): the staging copies
    # in the sub-tile loop; not yet timed
    ("ws8 64x128x64 st4 w16 rows16 mma96 r96 sl cur stg", "adamw"): 56,
    ("ws8 64x128x64 st4 w16 rows16 mma96 r96 sl cur stg", "lion"): 8,
    ("ws8 64x128x64 st4 w8 rows16 mma104 r128 stg", "adamw"): 12,
    # v44's tiles, each tile's state staged by the MMA warps (MMA_STAGE, session 34): the next sub-tile's scales
    # and the next tile's coordinates held through the update
    ("ws8 64x128x64 st3 w16 rows16 mma96 r96 sl cur ms", "adamw"): 52,
    ("ws8 64x128x64 st4 w16 rows16 mma96 r96 sl cur ms", "adamw"): 52,
    ("ws8 64x128x64 st4 w16 rows16 mma96 r96 sl cur msh", "adamw"): 52,  # the copies at the hand-over
    # v49 (session 40): the staged cursor in groups of 16 and 32 tile rows, the same epilogue
    ("ws8 64x128x64 st4 w16 rows16 g16 mma96 r96 sl cur ms", "adamw"): 52,
    ("ws8 64x128x64 st4 w16 rows16 g32 mma96 r96 sl cur ms", "adamw"): 52,
}


# Spills a configuration may have, by (label, storage regime), each with the measurement that
# makes it worth them. Every entry must name a configuration the report compiles, so the table
# cannot outlive its reason. Bytes of spill stores per thread, ptxas of Triton 3.6 for sm_90a.
SPILL_EXCEPTIONS = {
    # the fp32 default from LARGE_K tokens: 0.85-0.97x the unfused step at K = 4096 against its
    # spill-free 8-way-split twin's 0.78-0.89x (bench/results/2026-12-03-h200-s5/kernels_callA.json)
    ("128x128x64 w8 s4 e4 p1 tma", "fp32"): 36,
    # the fp32 default for 2048-4095 tokens on tall weights: 1.02-1.06x the unfused step at
    # K = 2048 on the three shapes with M >= 8192, against 0.88-1.00x for the spill-free plain tile
    ("64x128x64 w4 s4 e4 p2 tma", "fp32"): 40,
    # the bf16-sr default from BF16_SR_LARGE_K tokens: a 128-register cap so that two 8-warp
    # programs share an SM; 0.73-0.74x at K = 16384 against 0.59x uncapped and spill-free
    # (kernels_lowbit_callB.json there). The fp32 row is the same tile compiled for fp32 storage.
    ("128x128x64 w8 s3 e8 tma r128", "fp32"): 356,
    # 560 B with the Philox products as mul.hi.u32 and mul.lo.u32, 300 as one mul.wide.u32 (session 20)
    ("128x128x64 w8 s3 e8 tma r128", "bf16-sr"): 300,
    # the bf16-sr default for BF16_SR_MID_K <= K < BF16_SR_LARGE_K: four programs per SM at 128
    # registers; 1.18-1.26x faster than the spill-free 64x64 at K = 2048 (bench/results/
    # 2026-12-03-h200-s6/kernels_lowbit_callB.json); 36 B then, 8 with the wide Philox products
    ("64x64x64 w4 s3 e4 r128", "bf16-sr"): 8,
    # the 8bit default from Q8_LARGE_K tokens: a 128-register cap so that two 8-warp programs share an
    # SM; 1.04-1.25x faster than the one-program tiles at K = 4096-16384 (bench/results/
    # 2026-12-05-h200-s15/call1, call2); 220 B then, 248 B since the stochastic rounding's threshold
    # became one shift pair (session 16: 7 instructions an element fewer, 13 more local loads/stores),
    # 272 B since the telemetry is reduced once a tile (session 17, v29: 20 instructions an element fewer),
    # 308 B with the Philox products as one mul.wide.u32 (session 20: 1.26-1.29x faster so, at K <= 4096),
    # 324 B since each element draws its pair's Philox call and keeps its half (session 32, v41: the 8bit
    # stream's revision 2; 7-8 instructions an element more in the Triton tiles)
    ("64x128x64 w8 s3 e4 r128", "8bit"): 324,
    # the 8bit default where TMA loads the operands (session 20, v24): the same cap, 0.80-0.93x the
    # pointer default's time from 4096 tokens, 0.64-0.92x below 4096 on weights of 256 tiles or more
    # (bench/results/2026-12-05-s20/followup); 280 B
    ("64x128x64 w8 s4 e4 tma r128", "8bit"): 280,
    # its staged twin, the 8bit default on tall weights (session 22, v31): 0.83-0.95x its time at
    # 8192x8192 and 8192x2048 (bench/results/2026-12-05-s22); 72 B
    ("64x128x64 w8 s4 e8 p2 tma r128 st", "8bit"): 72,
}


def test_no_configuration_spills_registers(report):
    """Local-memory spills made the first kernel 3.5x slower than the unfused step (bench/NOTES.md):
    none, except the measured exceptions above, each within its stated bytes."""
    seen = set()
    for r in report["resources"]:
        key = (report["labels"][r["config"]], r["precision"])
        allowed = SPILL_EXCEPTIONS.get(key, 0)
        seen.add(key)
        assert not tables_apply() or (r["spill_stores"] <= allowed and (allowed or r["spill_loads"] == 0)), (key, r)
    assert set(SPILL_EXCEPTIONS) <= seen, f"exceptions for configurations no longer compiled: {set(SPILL_EXCEPTIONS) - seen}"


def test_stochastic_keys_reach_one_compiled_kernel(report):
    """Triton's binder (which computes a launch's specialization, part of the compiled kernel's cache
    key) maps every Philox key and counter base to one specialization, ("u64", None) and ("i64", None):
    the types tests.ptx_check compiles with. Without that, the 64-bit keys of a training run select
    among five compiled variants of each configuration (u64/i64 by the top bit, divisible by 16 or
    not, i32 below 2^31; 1 a constant), each compiled when first drawn (kernels/linear_update.py)."""
    for name, specs in report["specializations"].items():
        assert specs == [[["u64", None], ["i64", None]]], (name, specs)
    # the Gluon kernel's launches skip the binder on a cache hit with a key that names none of seed,
    # rand_stride, rand_base (kernels/launch_cache.py): one specialization, or a kept kernel typed
    # for a small counter base meets a large one (session 20: five, an OverflowError on the GPU)
    assert report["gluon_specializations"] == [[["u64", None], ["i64", None], ["i64", None]]], \
        report["gluon_specializations"]


def test_gluon_kernels_invalidate_their_barriers_and_reuse_none_of_their_bytes(report):
    """Every Gluon kernel (each family's tiles, the slot-reading launches, the single-call 8bit tile)
    invalidates each mbarrier it initializes, at its end, and no byte of an mbarrier is also data. Why: PTX
    requires an mbarrier invalidated before its memory has another use, and Triton's allocator gives a barrier
    array's bytes to later buffers once past the array's last use. Until session 37 no kernel invalidated: an
    operand ring's empty barriers, unused by the self-loading tiles, ended at their initialization, and their
    bytes became the telemetry's reduction scratch or, in the staged tiles, staging slot 0, a TMA destination
    (tests.ptx_check.barrier_reuse found them at offset 163840 of the fp32 default, the 8bit deep cursor,
    v46 and the 8bit staged tile). Invalidating at the end keeps every barrier allocated to the end."""
    reports = [r for part in ("gluon_ws", "gluon_q8", "gluon_f32", "gluon_q8_single", "gluon_slot") for r in report[part]]
    assert reports
    for r in reports:
        assert r["mbarrier_init"] > 0 and r["mbarrier_inval"] == r["mbarrier_init"], r["config"]
        assert r["barrier_bytes_as_data"] == [], (r["config"], r["barrier_bytes_as_data"])


def test_barrier_reuse_finds_a_barriers_bytes_used_as_data():
    """tests.ptx_check.barrier_reuse on lines of the forms Triton 3.6's LLVM IR gave before session 37's fix
    (shortened): a barrier's bytes as a TMA copy's destination, as a float pointer's base, by a plain store;
    not its own array's i64 indexing or the mbarrier instructions."""
    from tests.ptx_check import barrier_reuse

    def smem(offset):
        return f"getelementptr (i8, ptr addrspace(3) @global_smem, i32 {offset})"

    init = f'call void asm sideeffect "@$0 mbarrier.init.shared::cta.b64 [$1], 1;", "b,r"(i1 %p, ptr addrspace(3) {smem(512)})'
    own = f"%a = getelementptr i64, ptr addrspace(3) {smem(512)}, i32 %i"
    wait = f'call void asm sideeffect "mbarrier.try_wait.parity.shared.b64 complete, [$0], $1;", "r,r"(ptr addrspace(3) {smem(512)})'
    tma = (f'call void asm sideeffect "@$0 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes '
           f'[$1], [$2, {{$3, $4}}], [$5];", "b,r,l,r,r,r"(i1 %p, ptr addrspace(3) {smem(512)}, ptr %d, i32 0, i32 0, '
           f'ptr addrspace(3) {smem(4096)})')
    as_float = f"%b = getelementptr float, ptr addrspace(3) {smem(516)}, i32 %i"
    store = f"store double 0.0, ptr addrspace(3) {smem(512)}, align 16"
    inval = f'call void asm sideeffect "mbarrier.inval.shared::cta.b64 [$0];", "r"(ptr addrspace(3) {smem(512)})'
    clean = "\n".join([init, own, wait, inval])
    assert barrier_reuse(clean) == {"mbarrier_init": 1, "mbarrier_inval": 1, "barrier_bytes_as_data": []}
    for line, offset in ((tma, 512), (as_float, 516), (store, 512)):
        assert barrier_reuse(clean + "\n" + line)["barrier_bytes_as_data"] == [offset], line
    # a copy whose barrier, not its destination, sits there is no reuse
    assert barrier_reuse(clean + "\n" + tma.replace(smem(512), smem(8192)).replace(smem(4096), smem(512)))[
        "barrier_bytes_as_data"] == []
