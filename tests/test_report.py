"""`forge-num report bias`: runs, writes its three files, and measures what the proofs state."""

from __future__ import annotations

import json

import pytest

from forge_num import report
from forge_num.cli import main

pytestmark = pytest.mark.statistical


def test_bias_report(tmp_path):
    assert main(["report", "bias", "--draws", "4000", "--steps", "300", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bias.json").read_text())
    assert (tmp_path / "bias.md").exists()
    sr = data["sr_bf16"]
    assert len(sr["binades"]) == 255 and sr["binades"][0]["kind"] == "subnormal"
    # the stated test: exact binomial, Bonferroni over all values, family-wise level 1e-3, fixed seed
    assert sr["min_p_bonferroni"] > 1e-3
    for r in data["quant8"].values():
        assert r["worst_error_over_bound"] < 1.0  # proofs/quant8.md: |dequant(Q(x)) - x| < step(x)
        assert r["min_p_bonferroni"] > 1e-3 and r["elements_two_way"] > 0  # the exact binomial test
    fin = data["tiny_updates"]["final"]
    assert fin["rne"] == 1.0  # every 0.1-ulp update cancelled by round-to-nearest
    assert fin["sr"] > 1.0


def test_report_detects_a_biased_rounding(monkeypatch):
    """The same procedure rejects a rounding that is biased by 1/64 of an ulp (so it can fail)."""
    import numpy as np

    real = report.bf16_sr_bits
    monkeypatch.setattr(report, "bf16_sr_bits", lambda x, r: real(x, np.minimum(np.asarray(r) + 1024, 65535)))
    vals = np.array([1.0 + 2.0**-9, 3.0 + 2.0**-10], np.float32)
    res = report.sr_bias(vals, 20000, seed=1)
    assert float(np.min(res["p_value"])) * vals.size < 1e-3


def test_gpu_path_draws_the_emulators_roundings():
    """`--device gpu` runs the kernels' own rounding code (here under the interpreter when there is
    no GPU): the same draws as the emulator, so the same statistics to the bit."""
    import numpy as np

    vals = np.array([1.0 + 2.0**-9, -3.0 - 2.0**-12, 2.0**-140, 3.3e38], np.float32)
    a = report.sr_bias(vals, 300, 1, "gpu")
    b = report.sr_bias(vals, 300, 1, "emulator")
    assert np.array_equal(a["mean_err_ulp"], b["mean_err_ulp"]) and np.array_equal(a["p_value"], b["p_value"])


def test_report_detects_a_biased_8bit_rounding(monkeypatch):
    """The 8-bit test rejects a stochastic rounding biased by 1/16 of a grid step (so it can fail)."""
    import numpy as np

    from forge_num.emulator import quant8

    real = quant8.quantize_block_sr
    monkeypatch.setattr(quant8, "quantize_block_sr",
                        lambda x, r, signed: real(x, np.minimum(np.asarray(r) + (1 << 20), (1 << 24) - 1), signed))
    res = report.quant8_check(blocks=2, draws=2000, seed=3)
    assert all(r["min_p_bonferroni"] < 1e-3 for r in res.values()), res
