"""Paired GPU timing: several functions timed call by call in turn, for A/B ratios a drift of the clocks cannot bias.

triton.testing.do_bench times one function for `rep` ms; timing A and then B that way puts seconds between their
samples, and a drift of the GPU's clocks in between lands on one side of the ratio (session 44: the same Gluon
tile read 4.94-5.18 ms timed as a label and 4.30-4.34 ms as the launcher's route, 0.2-0.4 s apart; two rounds of
one label differed by up to 20%). paired_ms keeps do_bench's method for each call (the L2 flushed by writing a
256 MB buffer, a CUDA event on each side of the call, the median of the samples) and interleaves the calls: sample
i of every function is taken within one pass over them. The passes take their orders from a balanced Latin square
(pass_orders): within passes every function comes first equally often and follows every other equally often, since
the flush evens out what the previous call left in the L2 but not the clocks (a cuBLAS GEMM's power draw) it left;
a cyclic rotation of one order would put each function behind the same one in all but one place of every pass. A
ratio of two medians from one paired run compares the functions under the same conditions.
"""
from __future__ import annotations

import statistics


def pass_orders(n: int) -> list[list[int]]:
    """A balanced Latin square on range(n) (Williams, 1949): rows of the orders of n functions in which each
    comes at each position equally often and each ordered pair (i directly before j, i != j) equally often; n
    rows for even n, 2n (the rows and their reverses) for odd n. Row r is r + (0, 1, n-1, 2, n-2, ...) mod n."""
    first = [0]
    for k in range(1, n):
        first.append((k + 1) // 2 if k % 2 else n - k // 2)
    rows = [[(r + v) % n for v in first] for r in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def paired_ms(fns: dict, rep_ms: float = 200.0, warmup_ms: float = 25.0, min_samples: int = 10,
              device_interface=None, flush=None) -> dict[str, list[float]]:
    """{name: [ms of each sample]} for fns ({name: callable with no arguments}), each function called in every
    pass, the passes in pass_orders' orders; passes = max(min_samples, rep_ms / the slowest function's estimate)
    rounded up to whole squares, so that every function is sampled at least as often as do_bench(rep=rep_ms) would
    sample the slowest one. The first call of each (compilation) and warmup_ms of passes come before the samples.
    device_interface and flush default to Triton's active driver's (as do_bench uses them); a test passes its
    own."""
    if not fns:
        raise ValueError("paired_ms: no functions to time")
    if min_samples < 1:
        raise ValueError(f"paired_ms: min_samples must be at least 1, got {min_samples}")
    if device_interface is None or flush is None:
        from triton import runtime

        driver = runtime.driver.active
        device_interface = device_interface or driver.get_device_interface()
        if flush is None:
            cache = driver.get_empty_cache_for_benchmark()
            flush = lambda: driver.clear_cache(cache)  # noqa: E731
    names = list(fns)
    orders = pass_orders(len(names))
    for fn in fns.values():
        fn()
    device_interface.synchronize()

    def one_pass(index: int, events=None):
        for j in orders[index % len(orders)]:
            name = names[j]
            flush()
            if events is not None:
                events[name][0].record()
            fns[name]()
            if events is not None:
                events[name][1].record()

    # the estimate: one timed call of each, after one more untimed pass (do_bench: the mean of 5 calls of one)
    one_pass(0)
    estimate = {n: (device_interface.Event(enable_timing=True), device_interface.Event(enable_timing=True))
                for n in names}
    one_pass(0, estimate)
    device_interface.synchronize()
    est_ms = {n: max(s.elapsed_time(e), 1e-3) for n, (s, e) in estimate.items()}
    pass_ms = sum(est_ms.values())
    for r in range(max(1, int(warmup_ms / pass_ms))):
        one_pass(r)
    # whole squares, so that positions and predecessors stay balanced over the samples
    passes = -(-max(min_samples, int(rep_ms / max(est_ms.values()))) // len(orders)) * len(orders)
    samples = []
    for r in range(passes):
        events = {n: (device_interface.Event(enable_timing=True), device_interface.Event(enable_timing=True))
                  for n in names}
        one_pass(r, events)
        samples.append(events)
    device_interface.synchronize()
    return {n: [ev[n][0].elapsed_time(ev[n][1]) for ev in samples] for n in names}


def paired_medians(fns: dict, **kwargs) -> dict[str, float]:
    """{name: median ms} of paired_ms(fns, **kwargs)."""
    return {n: statistics.median(v) for n, v in paired_ms(fns, **kwargs).items()}
