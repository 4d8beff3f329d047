"""bench/timing.py's paired timer on a simulated GPU clock (the GPU runs are manual): its samples are the
functions' own times, a drift of the clocks falls on every function alike, and every timed call follows a flush."""

from __future__ import annotations

import statistics

import pytest

from bench.timing import paired_medians, paired_ms


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
    assert all(len(v) == 20 for v in ms.values())  # 60 ms / the slowest's 3 ms
    timed = gpu.log[gpu.log.index("flush"):]  # from the estimate on, every call follows a flush
    calls = [i for i, e in enumerate(timed) if e != "flush"]
    assert all(timed[i - 1] == "flush" for i in calls)


def test_rotation_puts_each_function_first_equally_often():
    gpu = SimulatedGPU()
    names = ["a", "b", "c"]
    paired_ms({n: gpu.kernel(n, 1.0) for n in names}, rep_ms=30, warmup_ms=0, min_samples=30,
              device_interface=gpu, flush=gpu.flush)
    calls = [e for e in gpu.log if e != "flush"][-30 * 3:]  # the sampled passes, the last 30
    firsts = [calls[3 * i] for i in range(30)]
    assert {n: firsts.count(n) for n in names} == {n: 10 for n in names}


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
