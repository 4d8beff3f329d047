"""Gathered rows (a counter map with rows: emulator.philox.CounterMap) update as they would in place:
the torch backend on the CPU, the Triton kernels under the interpreter (CPU) or compiled (GPU)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from forge_num.emulator.philox import CounterMap
from tests.kernel_cases import run_gathered_rows_case

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def test_counter_map_rows_are_the_rows_counters():
    whole = CounterMap.identity(8)
    rows = np.array([5, 0, 2])
    gathered = CounterMap.of((8, 8, 0, rows), 3 * 8)
    assert np.array_equal(gathered.of_tile([0, 1, 2], np.arange(8)), whole.of_tile(rows, np.arange(8)))
    assert np.array_equal(gathered.of_flat(np.arange(24)), whole.of_tile(rows, np.arange(8)).reshape(-1))
    # rows past the tensor (a tile's padding) draw row 0's counters, as the kernels' masked load gives
    assert np.array_equal(gathered.of_tile([3, 4], [1]), [[1], [1]])
    assert CounterMap.of((8, 8, 0, torch.tensor([1, 2])), 16).rows.tolist() == [1, 2]


# every backend checks what check_counter_rows checks; where the values are read (the emulator, the
# torch backend), they must be >= 0 too
ROWS_ERRORS = [
    (np.array([1, 2, 3]), ValueError, "3 entries"), (np.array([[1, 2]]), TypeError, "1-D int64"),
    (np.array([1.0, 2.0]), TypeError, "1-D int64"), (np.array([1, 2], dtype=np.int32), TypeError, "1-D int64"),
    (torch.tensor([1, 2], dtype=torch.int32), TypeError, "1-D int64"), (np.array([-1, 2]), ValueError, ">= 0"),
]


@pytest.mark.parametrize("rows,err,match", ROWS_ERRORS)
def test_counter_map_rows_checked(rows, err, match):
    with pytest.raises(err, match=match):
        CounterMap.of((8, 8, 0, rows), 16)
    from forge_num import rules, torch_backend

    w, g = torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(2, 8)
    with pytest.raises(err, match=match):
        torch_backend.elementwise_update(w, g, [], rules.SGD, rules.SGD.scalars({"lr": 0.1}, 1), seed=1,
                                         counter=(8, 8, 0, rows))


@pytest.mark.parametrize("regime", ["bf16-sr", "8bit"])
def test_gathered_rows_torch_backend(regime):
    run_gathered_rows_case("torch", regime, torch.device("cpu"))


@pytest.mark.interpreter
@pytest.mark.skipif(not INTERPRETING, reason="the interpreter runs where there is no GPU")
@pytest.mark.parametrize("regime", ["bf16-sr", "8bit"])
def test_gathered_rows_interpreter(regime):
    run_gathered_rows_case("kernels", regime, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.exactness
@pytest.mark.parametrize("regime", ["bf16-sr", "8bit"])
def test_gathered_rows_gpu(regime):
    run_gathered_rows_case("kernels", regime, torch.device("cuda"))


def test_kernels_check_counter_rows():
    """The kernels check the rows' tensor without reading it (a device wait): what every backend checks,
    and that it is a contiguous torch tensor on the weight's device; both kernels' entry points."""
    from forge_num import kernels, rules

    if not (INTERPRETING or torch.cuda.is_available()):
        pytest.skip("the Triton kernels need a GPU or the interpreter")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w, g = torch.zeros(2, 128, dtype=torch.bfloat16, device=dev), torch.zeros(2, 128, device=dev)
    h = rules.SGD.scalars({"lr": 0.1}, 1)
    q8 = [kernels.Q8State(torch.zeros(2, 128, dtype=torch.uint8, device=dev), torch.ones(2, 1, device=dev))]
    h_m = rules.SGD.scalars({"lr": 0.1, "momentum": 0.9}, 1)
    cases = [(torch.tensor([0, 1], dtype=torch.int32, device=dev), TypeError, "int64"),
             (torch.tensor([0, 1, 2], device=dev), ValueError, "3 entries"),
             (torch.tensor([[0, 1]], device=dev), TypeError, "1-D"),
             (np.array([0, 1]), TypeError, "torch tensor"),
             (torch.tensor([0, 5, 1, 7], device=dev)[::2], ValueError, "contiguous")]
    if dev.type == "cuda":
        cases.append((torch.tensor([0, 1]), ValueError, "is on cpu"))
    for rows, err, match in cases:
        with pytest.raises(err, match=match):
            kernels.elementwise_update(w, g, [], rules.SGD, h, seed=1, counter=(128, 128, 0, rows))
        with pytest.raises(err, match=match):
            kernels.fused_linear_update(w, g[:0], g[:0, :2], q8, rules.SGD, h_m, accum=g, seed=1,
                                        counter=(128, 128, 0, rows))
    with pytest.raises(TypeError, match="counter must be"):
        kernels.elementwise_update(w, g, [], rules.SGD, h, seed=1, counter=(128, 128, 0, None, 5))
