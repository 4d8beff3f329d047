#!/usr/bin/env bash
# Session 15, call 2: the promoted 8bit tiles (v22): their bits (test_default_configs and the 8bit
# regime tests, `ci` hypothesis profile), their times at K = 2048 and 16384 beside the older tiles,
# and the 8bit training step at 3B 1x1024 and 8B 4x1024 beside FlashOptim on the same chunked loss.
# Carries the baselines' wheels in .whl. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s15c2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== 8bit exactness $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 150 python3 -m pytest -q -rfE -p no:cacheprovider -n 12 tests/test_gpu_exactness.py \
  -k "8bit or q8" --junitxml="$R/junit.xml" >"$R/exactness.log" 2>&1
echo "== kernels 8bit $(date -u +%T)"
timeout 90 python3 bench/kernels.py --precision 8bit --shapes 4096x4096,14336x4096 --tokens 2048,16384 \
  --out "$R/kernels_8bit.json" >"$R/kernels_8bit.log" 2>&1
echo "== train 8bit $(date -u +%T)"
timeout 100 python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl --models llama-3b --tokens 1x1024 \
  --checkpointing on --warmup 2 --steps 3 --out "$R/train_3b.json" >"$R/train_3b.log" 2>&1
timeout 190 python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl --models llama-8b --tokens 4x1024 \
  --checkpointing on --warmup 2 --steps 3 --memory-phases --out "$R/train_8b.json" >"$R/train_8b.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/exactness.log"; grep -E "^(FAILED|ERROR)" "$R/exactness.log" | cut -c1-200 | head
python3 - "$R/kernels_8bit.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["M"], r["N"], r["K"], "unfused %.3f" % r["unfused_ms"], "default", r["default_label"],
          {k: round(v, 3) for k, v in r["per_label_ms"].items()})
PY
for f in "$R"/train_*.log; do grep -E "peak|tok" "$f" | grep -v "^#" | cut -c1-220 | tail -6; done
