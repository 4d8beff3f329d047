"""Session 41 (CPU): the routed Gluon tiles compiled for sm_90 under whichever Triton runs this, with their IEEE op
counts against the rule's (tests/ptx_check.py) and ptxas's spill stores. Run with an interpreter whose Triton is
the one to check, forge_num installed in it (`pip install --no-deps -e .`):

    python bench/results/2026-12-07-s41/triton_probes/routed_tiles_compile.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import triton  # noqa: E402

from forge_num.kernels import gluon_f32, gluon_q8  # noqa: E402
from tests.ptx_check import check_gluon_f32, check_gluon_q8  # noqa: E402

print("triton", triton.__version__)
for check, tiles in ((check_gluon_f32, gluon_f32.ROUTE_CONFIGS), (check_gluon_q8, gluon_q8.ROUTE_CONFIGS)):
    for c in tiles:
        try:
            r = check("adamw", c)
            print(f"{c.label:<50} spill {r['spill_stores']:>4} B  ops {'as the rule' if r['ptx'] == r['expected'] else 'DIFFER'}"
                  f"{'  forbidden ' + str(r['forbidden']) if r['forbidden'] else ''}")
        except Exception as e:  # noqa: BLE001 (a report of what fails under this Triton)
            print(f"{c.label:<50} {type(e).__name__}: {str(e).splitlines()[-1][:100]}")
