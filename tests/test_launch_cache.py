"""kernels/launch_cache.py on the CPU: when CachedLaunch goes through Triton's JITFunction.run (a
miss, pins that differ, FORGE_NUM_FAST_LAUNCH=0) and what it refuses. Its fast path launches a
compiled kernel, so it is checked on the GPU (tests/test_gpu_gluon.py: the kernel Triton's own
lookup picks, and the same bits)."""

from __future__ import annotations

import types
from unittest import mock

import pytest

from forge_num.kernels.launch_cache import CachedLaunch


class _FakeJIT:
    """A JITFunction's surface: params, and kernel[grid](...) recording its calls."""

    def __init__(self, names):
        self.params = [types.SimpleNamespace(name=n) for n in names]
        self.calls = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return object()  # a CompiledKernel stand-in

        return run


def _launcher():
    jit = _FakeJIT(["x", "n", "BLOCK", "num_warps"])
    return jit, CachedLaunch(jit)


def test_a_miss_goes_through_the_jit_and_keeps_the_kernel():
    jit, cl = _launcher()
    made = []

    def constants():
        made.append(1)
        return {"BLOCK": 64, "num_warps": 4}, {"maxnreg": None}

    k = cl.launch(("k",), ("rule",), (8,), ("X", 3), constants)
    assert jit.calls == [((8,), ("X", 3), {"BLOCK": 64, "num_warps": 4, "maxnreg": None})]
    assert cl.lookup(("k",)) is k and made == [1]


def test_other_pins_under_one_key_are_a_miss():
    """A key names its pins by id(); another object under a reused id must recompile, not reuse."""
    jit, cl = _launcher()
    consts = lambda: ({"BLOCK": 64, "num_warps": 4}, {})  # noqa: E731
    first = cl.launch(("k",), ("a",), (1,), ("X", 3), consts)
    second = cl.launch(("k",), ("b",), (1,), ("X", 3), consts)
    assert len(jit.calls) == 2 and first is not second and cl.lookup(("k",)) is second


def test_the_switch_sends_every_launch_through_the_jit():
    jit, cl = _launcher()
    consts = lambda: ({"BLOCK": 64, "num_warps": 4}, {})  # noqa: E731
    with mock.patch.dict("os.environ", {"FORGE_NUM_FAST_LAUNCH": "0"}):
        for _ in range(3):
            cl.launch(("k",), ("a",), (1,), ("X", 3), consts)
    assert len(jit.calls) == 3


def test_constexprs_out_of_parameter_order_are_refused():
    """The kept values are passed positionally after the runtime arguments: any other order would
    hand a kernel wrong constants, so it is refused on the miss that would keep it."""
    jit, cl = _launcher()
    with pytest.raises(ValueError, match="parameters after the 2 positional ones"):
        cl.launch(("k",), (), (1,), ("X", 3), lambda: ({"num_warps": 4, "BLOCK": 64}, {}))
    assert cl.lookup(("k",)) is None
