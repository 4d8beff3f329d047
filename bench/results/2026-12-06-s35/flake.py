"""Repeat tests/test_gpu_graphs.py's 8bit-hf-wide case (session 35, call 5: its captured losses differed from the
eager ones once in six runs) N times in one process: `python bench/results/2026-12-06-s35/flake.py N TAG`.
Prints one line a run (equal, or where the runs parted: tests/test_gpu_graphs.py's messages) and a count;
FORGE_NUM_GLUON_Q8 in the environment picks the 8bit tile as for any step."""

import os
import sys
import time

sys.path.insert(0, os.getcwd())

from tests.test_gpu_graphs import _batches, _eager_then_captured, _model  # noqa: E402


def main() -> int:
    n, tag = int(sys.argv[1]), sys.argv[2]
    failed = 0
    for i in range(n):
        t0 = time.time()
        try:
            _eager_then_captured(lambda: _model("wide", "8bit", False), "hf", _batches(1024))
            verdict = "equal"
        except AssertionError as e:
            failed += 1
            verdict = f"DIFFER: {str(e).splitlines()[0][:300]}"
        print(f"{tag} run {i}: {verdict} ({time.time() - t0:.1f} s)", flush=True)
    print(f"{tag}: {failed} of {n} differed (FORGE_NUM_GLUON_Q8={os.environ.get('FORGE_NUM_GLUON_Q8', 'unset')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
