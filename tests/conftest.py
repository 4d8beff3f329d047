"""Test infrastructure: hypothesis profiles, markers and device selection.

Profiles: ``ci`` (the default on CPU: few examples, no deadline, derandomized so CI is
reproducible) and ``gpu`` (the `exactness` runs on the H200: many examples). Choose with
``HYPOTHESIS_PROFILE=gpu``.
"""

from __future__ import annotations

import os
import sys

# The repository root holds kernels/ and emulator/, which install as forge_num.kernels and
# forge_num.emulator (pyproject.toml). Ahead of site-packages on sys.path they would shadow installed
# packages of the same top-level name: transformers >= 5.25 depends on Hugging Face's `kernels` and
# imports it when it is installed, and found ours. So pytest imports test modules with
# --import-mode=append (pyproject.toml: the rootdir goes behind site-packages, not in front), and
# the working directory that `python -m pytest` puts first moves there too: `tests` and `bench`
# still import from the root, `kernels` from the installed package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != ROOT] + [ROOT]


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()
# Without a GPU the Triton kernels run in Triton's interpreter. The variable must be set before
# triton.jit decorates any kernel, so before forge_num.kernels is imported by any test module.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    from forge_num import interpreter

    interpreter.install()

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "gpu",
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    # no shrinking: a device call is time-limited, and a failing case is reported as drawn (with
    # the blob that replays it) rather than lost when shrinking outlasts the call
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` or `exactness` are skipped, with the reason, where there is no CUDA GPU."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m exactness` on the H200)")
    for item in items:
        if "gpu" in item.keywords or "exactness" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    import numpy
    import torch
    import triton

    mode = "CUDA " + torch.cuda.get_device_name(0) if HAS_CUDA else "CPU (Triton interpreter)"
    return f"forge_num: {mode}; torch {torch.__version__}, triton {triton.__version__}, numpy {numpy.__version__}"
