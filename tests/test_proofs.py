"""The proofs' check scripts, run as part of the emulator suite."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.emulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script", ["check_fusion.py", "check_fp32_fma.py"])
def test_proof_check_script(script):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "proofs", script)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
