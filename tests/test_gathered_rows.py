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


@pytest.mark.parametrize("rows,match", [
    (np.array([1, 2, 3]), "one per row"), (np.array([[1, 2]]), "one per row"),
    (np.array([1.0, 2.0]), "integers"), (np.array([-1, 2]), ">= 0"),
])
def test_counter_map_rows_checked(rows, match):
    with pytest.raises(ValueError, match=match):
        CounterMap.of((8, 8, 0, rows), 16)


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
    """The kernels check the rows' tensor without reading it (a device wait): dtype, shape, device."""
    from forge_num import kernels, rules

    if not (INTERPRETING or torch.cuda.is_available()):
        pytest.skip("the Triton kernels need a GPU or the interpreter")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w, g = torch.zeros(2, 4, dtype=torch.bfloat16, device=dev), torch.zeros(2, 4, device=dev)
    h = rules.SGD.scalars({"lr": 0.1}, 1)
    for rows, err, match in [(torch.tensor([0, 1], dtype=torch.int32), TypeError, "int64"),
                             (torch.tensor([0, 1, 2]), ValueError, "3 entries"),
                             (torch.tensor([[0, 1]]), TypeError, "1-D")]:
        with pytest.raises(err, match=match):
            kernels.elementwise_update(w, g, [], rules.SGD, h, seed=1, counter=(4, 4, 0, rows.to(dev)))
