"""forge-num: the train demo (tiny settings) and the verify pass-through."""

from __future__ import annotations

import sys
import types

import pytest

from forge_num import cli
from tests.torch_reference import needs_fused_aten  # noqa: E402


pytest.importorskip("transformers")


def test_stdlib_corpus_needs_no_download():
    data = cli.load_stdlib_corpus(max_bytes=200_000)
    assert 0 < len(data) <= 200_000 and b"def " in data and b"import " in data


@needs_fused_aten
def test_train_compare_tiny(tmp_path, capsys):
    png = tmp_path / "curve.png"
    rc = cli.main(
        [
            "train",
            "--compare",
            "--steps",
            "4",
            "--batch",
            "2",
            "--seq",
            "32",
            "--hidden",
            "32",
            "--layers",
            "1",
            "--heads",
            "2",
            "--plot",
            str(png),
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "reference: torch.optim.AdamW(foreach=False) with a correctly rounded sqrt" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    assert all(r[1] == r[2] and float(r[3]) == 0.0 for r in rows)  # same losses, no parameter difference
    assert "losses identical at every step: yes" in out
    assert "tokens/s" in out and "peak step memory" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_without_compare_and_bad_arguments(tmp_path, capsys):
    assert (
        cli.main(
            [
                "train",
                "--steps",
                "2",
                "--batch",
                "1",
                "--seq",
                "16",
                "--hidden",
                "16",
                "--layers",
                "1",
                "--heads",
                "2",
                "--plot",
                "",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "losses identical" not in capsys.readouterr().out
    assert cli.main(["train", "--hidden", "30", "--heads", "4", "--no-progress"]) == 2
    assert cli.main(["train", "--steps", "0"]) == 2
    with pytest.raises(SystemExit):
        cli.main(["nonsense"])


def test_verify_passes_its_arguments(monkeypatch):
    seen = {}
    fake = types.ModuleType("forge_num.verify")
    fake.main = lambda args: seen.setdefault("args", args) and 0
    monkeypatch.setitem(sys.modules, "forge_num.verify", fake)
    assert cli.main(["verify", "--quick", "x"]) == 0
    assert seen["args"] == ["--quick", "x"]
