#!/usr/bin/env bash
# One device session: install, kernel benchmark, exactness suite. Writes everything under $OUT
# (or ./out), prints short tables.
#   BENCH_ARGS="--shapes 4096x4096 --tokens 256"  arguments for bench/kernels.py
#   EXACT_TIMEOUT=420  seconds for pytest; at the limit it gets SIGINT and still prints its summary
#   HYPOTHESIS_PROFILE=gpu (250 cases per test) or ci (40)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FORGE_RESULTS_DIR="$OUT" HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.version.cuda)"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
timeout ${BENCH_TIMEOUT:-240} python3 bench/kernels.py ${BENCH_ARGS:-} --out "$OUT/kernels.json" 2>&1 | tee "$OUT/bench.log" | tail -20
timeout -s INT -k 30 ${EXACT_TIMEOUT:-420} python3 -m pytest -m "exactness or gpu" -q -rfE -p no:cacheprovider \
  -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning -n ${XDIST:-8} "$@" 2>&1 | tee "$OUT/exactness.log" \
  | grep -v "^\s*$" | tail -25
echo "exactness exit: ${PIPESTATUS[0]}" | tee -a "$OUT/exactness.log"
