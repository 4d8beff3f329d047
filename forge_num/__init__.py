"""forge_num: the optimizer step fused into the weight-gradient GEMM, with a bit-exact emulator.

Submodules load lazily, so that ``import forge_num.emulator`` (NumPy only) and
``import forge_num.rules`` (standard library only) never import torch or triton.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    # name -> (module, attribute)
    "emulate": ("forge_num.emulator", "emulate"),
    "RULES": ("forge_num.rules", "RULES"),
    "AdamW": ("forge_num.optim", "AdamW"),
    "Adam": ("forge_num.optim", "Adam"),
    "SGD": ("forge_num.optim", "SGD"),
    "Lion": ("forge_num.optim", "Lion"),
    "prepare": ("forge_num.fused", "prepare"),
    "unprepare": ("forge_num.fused", "unprepare"),
    "linear_cross_entropy": ("forge_num.loss", "linear_cross_entropy"),
    "capture_step": ("forge_num.graphs", "capture_step"),
    "CapturedStep": ("forge_num.graphs", "CapturedStep"),
}


_SUBMODULES = ("hf", "distributed")  # forge_num.hf.one_sequence_per_row() without importing forge_num.hf first


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    if name in _SUBMODULES:
        return importlib.import_module(f"forge_num.{name}")
    raise AttributeError(f"module 'forge_num' has no attribute {name!r}")
