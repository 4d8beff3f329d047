"""Session 44 (CPU): the routed fp32 Gluon tiles compiled for sm_90 under whichever Triton runs this, their SASS's
size and its barrier instructions by kind (`BAR.SYNC.DEFER_BLOCKING <id>, <threads>`). Why: call1 measured 3.9's
route 2-8% faster than 3.6's at 4096 tokens with neither spilling; v47's SASS is the same size under both but has
fewer barriers over its epilogue warps under 3.9. Run under each Triton, with 3.6's ptxas for both (session 43's
method):

    python bench/results/2026-12-07-s44/sass_barriers.py                    # under Triton 3.6
    TRITON_PTXAS_PATH=$P TRITON_PTXAS_BLACKWELL_PATH=$P \
        <Triton 3.9's python> bench/results/2026-12-07-s44/sass_barriers.py   # $P: 3.6's ptxas
"""
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import triton  # noqa: E402

from bench.registers import _SASS_LINE, sass_of  # noqa: E402
from forge_num import rules  # noqa: E402
from forge_num.kernels import gluon_f32  # noqa: E402

print("triton", triton.__version__)
for config in gluon_f32.ROUTE_CONFIGS:
    sass = sass_of(gluon_f32.compile_for_sm90(rules.get_rule("adamw"), config).asm["ptx"])
    instructions = [m.group(1) for m in map(_SASS_LINE.match, sass.splitlines()) if m]
    barriers = collections.Counter(re.sub(r"\s+", " ", i.split("BAR.", 1)[1]) for i in instructions
                                   if "BAR.SYNC" in i)
    print(f"{config.label:<52} {len(instructions):5d} instructions; barriers {dict(barriers)}")
