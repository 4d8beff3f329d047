"""bench/fidelity.py in its --tiny CPU mode: the JSON's structure and the claims that can be derived.

The script runs as a user runs it (a subprocess, JSON in a temporary folder). bitsandbytes and
torchao are hidden (BENCH_HIDE_MODULES), so their rows must say 'unavailable' with a reason, and the
run stays fast (torchao's torch.compile alone takes ~20 s on the CPU).

What is asserted, and why (the derivations are in bench/fidelity.py's docstring; u32 = 2^-24 and
u_bf16 = 2^-8 are the unit roundoffs of fp32 and bf16):

* forge_fp32, step 1: update_err < u_bf16: the update is more exact than a single bf16 rounding of
  it could be (fp32_bound, a first-order estimate of the fp32 error, is reported, not asserted). At
  step 1 no weight is left unchanged (lost_1 == 0): |ΔW| = lr·|g|/(|g| + eps) is ≈ lr = 1e-5,
  ~4·10^3 times the fp32 spacing ≈ 2^-23·|W| ≈ 2.4e-9 of weights of magnitude ≈ 0.02 (and still
  above it for |W| up to 40 std), unless |g| < ~2e-12 (eps·spacing/lr), while |g| ≈ 8e-3 here
  (K = 64 products of N(0, 1) and N(0, 1e-3²) values): probability ~3e-10 per element. From step 2 on |ΔW| ∝ |m| may be arbitrarily small
  (m changes sign), so lost_T is not asserted.
* torch_bf16, step 1: every element with lr·(1 + 2^-6) < ulp_below(W0)/2 is rounded back to W0
  (round to nearest), so lost ≥ rne_lost_bound > 0; its rounding is deterministic, so averaging
  repeats changes nothing (update_err_mean == update_err).
* forge_bf16sr, step 1: single updates are lost too (lost > 0: SR keeps W with probability
  1 − |ΔW|/ulp), but the R repeats are independent and unbiased (proofs/stochastic_rounding.md), so
  averaging them shrinks the error (update_err_mean < update_err; about update_err/sqrt(R)), while a
  deterministic rounding's average does not move (torch_bf16 above: equal); and the average is
  closer to the exact update than round-to-nearest's.
* torch_amp (fp32 W, bf16 gradient) vs forge_fp32 at step T = 3: from step 2 the update depends on
  g through m and v, so the bf16 gradient's error (≤ u_bf16 relative per element) reaches the update,
  while forge_fp32's stays at the fp32 storage level: forge_fp32's update_err_T < torch_amp's.
* Training: every available method runs with finite losses; forge_fp32 differs from the reference
  (torch AMP) only in that its dW is not rounded to bf16 (both store fp32 weights), whereas every
  bf16-weight method stores weights on a grid whose spacing (~ulp_bf16(0.02) ≈ 1e-4) is 10x the
  per-step update: forge_fp32 is the closest to the reference.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # on sys.path behind site-packages (conftest.py)

from bench import fidelity  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("fidelity") / "fidelity.json"
    env = dict(os.environ, BENCH_HIDE_MODULES="bitsandbytes,torchao")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fidelity.py"), "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "| method |" in proc.stdout  # the Markdown tables
    return json.loads(out.read_text())


def _update_rows(result):
    return {r["method"]: r for r in result["update"]["rows"]}


def test_structure(result):
    meta = result["meta"]
    for key in ("date", "device", "torch", "transformers", "bitsandbytes", "torchao", "command", "lr",
                "u32", "u_bf16", "wall_s"):
        assert key in meta, key
    assert meta["device"] == "cpu"
    up = _update_rows(result)
    assert list(up) == fidelity.METHODS
    for m in ("bnb_adamw8bit", "ao_adamw8bit"):
        assert up[m]["status"] == "unavailable" and "not installed" in up[m]["reason"]
    R = result["update"]["repeats"]
    for m in ("forge_fp32", "forge_bf16sr", "forge_8bit", "torch_amp", "torch_bf16"):
        r = up[m]
        assert r["status"] == "ok", r
        for s in r["shapes"]:
            for key in ("update_err_1", "update_err_mean_1", "w_err_1", "lost_1", "update_err_T",
                        "update_err_mean_T", "w_err_T", "lost_T", "fp32_bound", "rne_lost_bound"):
                assert math.isfinite(s[key]), (m, key)
            assert s["repeats"] == (R if m in fidelity.STOCHASTIC else 1)
            assert all(len(v) == s["steps"] for v in s["per_step"].values())
    tr = {r["method"]: r for r in result["train"]["rows"]}
    assert list(tr) == fidelity.METHODS[3:4] + [m for m in fidelity.METHODS if m != "torch_amp"]
    for m in ("bnb_adamw8bit", "ao_adamw8bit"):
        assert tr[m]["status"] == "unavailable" and tr[m]["reason"]
    for m in ("forge_fp32", "forge_bf16sr", "forge_8bit", "torch_amp", "torch_bf16"):
        r = tr[m]
        assert r["status"] == "ok", r
        assert len(r["losses"]) == result["train"]["steps"] and all(math.isfinite(x) for x in r["losses"])
        for key in ("final_gap", "loss_drop_vs_ref", "eval_loss_init", "eval_loss_final", "eval_drop_vs_ref",
                    "displacement_vs_ref", "distance_to_ref"):
            assert key in r, (m, key)


def test_forge_fp32_update_at_fp32_level(result):
    for s in _update_rows(result)["forge_fp32"]["shapes"]:
        assert s["update_err_1"] < fidelity.U_BF16, s
        assert s["lost_1"] == 0.0  # (not lost_T: from step 2, |ΔW| ∝ |m| can be near 0)


def test_round_to_nearest_bf16_loses_updates(result):
    for s in _update_rows(result)["torch_bf16"]["shapes"]:
        assert s["lost_1"] >= s["rne_lost_bound"] > 0.0, s
        assert s["update_err_mean_1"] == s["update_err_1"]


def test_stochastic_rounding_keeps_updates_in_expectation(result):
    up = _update_rows(result)
    for s, s_rne in zip(up["forge_bf16sr"]["shapes"], up["torch_bf16"]["shapes"]):
        R = s["repeats"]
        assert R >= 4 and s["lost_1"] > 0.0
        assert s["update_err_mean_1"] < s["update_err_1"], s
        assert s["update_err_mean_1"] < s_rne["update_err_mean_1"]


def test_bf16_gradient_shows_after_step_one(result):
    up = _update_rows(result)
    for s, s_amp in zip(up["forge_fp32"]["shapes"], up["torch_amp"]["shapes"]):
        assert s["update_err_T"] < s_amp["update_err_T"], (s, s_amp)


def test_training_forge_fp32_closest_to_reference(result):
    tr = {r["method"]: r for r in result["train"]["rows"] if r["status"] == "ok"}
    d = tr["forge_fp32"]["distance_to_ref"]
    for m in ("forge_bf16sr", "forge_8bit", "torch_bf16"):
        assert d < tr[m]["distance_to_ref"], (m, d, tr[m]["distance_to_ref"])
