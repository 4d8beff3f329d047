"""bench/timing.py's paired timer on a simulated GPU clock (the GPU runs are manual): its samples are the
functions' own times, a drift of the clocks falls on every function alike, and every timed call follows a flush."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from bench.timing import paired_medians, paired_ms, pass_orders


class SimulatedGPU:
    """A device interface whose clock advances only when a simulated kernel runs: each call of a function made by
    kernel(ms) takes ms times the current slowdown, which grows by `drift` a call (clocks falling as the GPU
    heats); events read the clock when recorded."""

    def __init__(self, drift: float = 0.0):
        self.now, self.slowdown, self.drift, self.log = 0.0, 1.0, drift, []

    def kernel(self, name: str, ms: float):
        def run():
            self.now += ms * self.slowdown
            self.slowdown += self.drift
            self.log.append(name)
        return run

    def flush(self):
        self.log.append("flush")

    def synchronize(self):
        pass

    def Event(self, enable_timing: bool = False):  # noqa: N802 (torch.cuda.Event's name)
        gpu = self

        class _Event:
            def record(self):
                self.t = gpu.now

            def elapsed_time(self, end):
                return end.t - self.t
        return _Event()


def test_samples_are_the_functions_own_times_and_each_follows_a_flush():
    gpu = SimulatedGPU()
    fns = {"a": gpu.kernel("a", 2.0), "b": gpu.kernel("b", 3.0), "c": gpu.kernel("c", 0.5)}
    ms = paired_ms(fns, rep_ms=60, warmup_ms=10, device_interface=gpu, flush=gpu.flush)
    assert {n: set(v) for n, v in ms.items()} == {"a": {2.0}, "b": {3.0}, "c": {0.5}}
    assert all(len(v) == 24 for v in ms.values())  # 60 ms / the slowest's 3 ms, rounded up to whole squares of 6
    timed = gpu.log[gpu.log.index("flush"):]  # from the estimate on, every call follows a flush
    calls = [i for i, e in enumerate(timed) if e != "flush"]
    assert all(timed[i - 1] == "flush" for i in calls)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_orders_balance_positions_and_predecessors(n):
    """Every row an order of range(n); over the rows each function at each position equally often, and each
    ordered pair (i directly before j) equally often: what a cyclic rotation of one order lacks from n = 3 on."""
    rows = pass_orders(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n)
    assert all(sorted(row) == list(range(n)) for row in rows)
    positions = Counter((row[p], p) for row in rows for p in range(n))
    assert len(set(positions.values())) == 1 and len(positions) == n * n
    pairs = Counter((row[p], row[p + 1]) for row in rows for p in range(n - 1))
    assert len(pairs) == n * (n - 1) and len(set(pairs.values())) <= 1
    rotation = [[(r + v) % n for v in range(n)] for r in range(n)]
    assert n < 3 or len(Counter((row[p], row[p + 1]) for row in rotation for p in range(n - 1))) < n * (n - 1)


def test_sampled_passes_follow_the_square():
    """The sampled calls, pass by pass, are pass_orders' rows in turn, whole squares of them (3 functions: 6 rows;
    min_samples 10 rounds up to 12 passes)."""
    gpu = SimulatedGPU()
    names = ["a", "b", "c"]
    ms = paired_ms({n: gpu.kernel(n, 1.0) for n in names}, rep_ms=1, warmup_ms=0, min_samples=10,
                   device_interface=gpu, flush=gpu.flush)
    assert all(len(v) == 12 for v in ms.values())
    calls = [e for e in gpu.log if e != "flush"][-12 * 3:]
    rows = pass_orders(3)
    assert [calls[3 * i:3 * i + 3] for i in range(12)] == [[names[j] for j in rows[i % 6]] for i in range(12)]


@pytest.mark.parametrize("drift", [1e-3, 4e-3])
def test_a_clock_drift_does_not_bias_the_ratio(drift):
    """Two functions whose true times differ by 10%, timed while every call slows the next by `drift`: the ratio
    of the paired medians stays within the drift between two calls of one pass (at most n - 1 calls apart,
    n = 2 functions: a relative error of at most (n - 1) * drift / slowdown <= drift), where timing one function's
    samples and then the other's (do_bench's way) puts the whole run's drift into the ratio."""
    gpu = SimulatedGPU(drift)
    med = paired_medians({"a": gpu.kernel("a", 1.0), "b": gpu.kernel("b", 1.1)}, rep_ms=100, warmup_ms=0,
                         device_interface=gpu, flush=gpu.flush)
    assert gpu.slowdown > 1.1  # the run drifted by more than the difference it measures
    assert med["b"] / med["a"] == pytest.approx(1.1, rel=drift)

    sequential = SimulatedGPU(drift)  # the same calls, one function's samples after the other's
    a = statistics.median(paired_ms({"a": sequential.kernel("a", 1.0)}, rep_ms=100, warmup_ms=0,
                                    device_interface=sequential, flush=sequential.flush)["a"])
    b = statistics.median(paired_ms({"b": sequential.kernel("b", 1.1)}, rep_ms=100, warmup_ms=0,
                                    device_interface=sequential, flush=sequential.flush)["b"])
    assert abs(b / a / 1.1 - 1) > 10 * drift


def test_refuses_nothing_to_time_and_no_samples():
    with pytest.raises(ValueError, match="no functions"):
        paired_ms({})
    with pytest.raises(ValueError, match="min_samples"):
        paired_ms({"a": lambda: None}, min_samples=0)
