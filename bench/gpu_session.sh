#!/usr/bin/env bash
# One device session: install, exactness suite, kernel benchmark. Writes everything under $OUT
# (or ./out), prints a short table last.   Usage: bash bench/gpu_session.sh [pytest args...]
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FORGE_RESULTS_DIR="$OUT" HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.version.cuda)"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
timeout ${EXACT_TIMEOUT:-420} python3 -m pytest -m "exactness or gpu" -q -rs -p no:cacheprovider -n ${XDIST:-8} "$@" \
  2>&1 | tee "$OUT/exactness.log" | tail -40
echo "exactness exit: ${PIPESTATUS[0]}" | tee -a "$OUT/exactness.log"
timeout ${BENCH_TIMEOUT:-240} python3 bench/kernels.py --out "$OUT/kernels.json" 2>&1 | tee "$OUT/bench.log" | tail -20
