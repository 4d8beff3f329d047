#!/usr/bin/env bash
# Session 15, call 1: (a) v22, the 8bit tiles with row quarters and register caps (kernels.
# CANDIDATE_Q8_CONFIGS): their bits (hypothesis, 40 cases each) and their times beside the 8bit
# defaults; (b) v21 (the widened row chunks freed one at a time) in the 8bit training step at the tied
# 1B and 3B, beside FlashOptim on the same chunked loss; (c) the 8bit GPU training tests.
# Carries the baselines' wheels in .whl. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s15c1; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== 8bit candidate exactness $(date -u +%T)"
HYPOTHESIS_PROFILE=gpu timeout -s INT -k 10 100 python3 -m pytest -q -rfE -p no:cacheprovider -n 12 tests/test_gpu_exactness.py \
  -k "candidate_configs and 8bit" >"$R/candidates.log" 2>&1
echo "== kernels 8bit $(date -u +%T)"
timeout 170 python3 bench/kernels.py --precision 8bit --shapes 4096x4096,14336x4096 --tokens 256,1024,4096,8192 \
  --out "$R/kernels_8bit.json" >"$R/kernels_8bit.log" 2>&1
echo "== train 8bit $(date -u +%T)"
for m in llama-1b llama-3b; do
  timeout 100 python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl --models "$m" --tokens 1x1024 \
    --checkpointing on --warmup 2 --steps 3 --memory-phases --out "$R/train_${m}.json" >"$R/train_${m}.log" 2>&1
done
echo "== GPU training tests (8bit) $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 80 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 -m gpu tests/test_gpu_training.py \
  tests/test_optim_lowbit.py tests/test_tied_rows.py -k "8bit or q8 or lowbit or tied" >"$R/training.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/candidates.log"; grep -E "^(FAILED|ERROR)" "$R/candidates.log" | cut -c1-200 | head
python3 - "$R/kernels_8bit.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["M"], r["N"], r["K"], "unfused %.3f" % r["unfused_ms"], "default", r["default_label"],
          {k: round(v, 3) for k, v in r["per_label_ms"].items()})
PY
for f in "$R"/train_*.log; do grep -E "peak|tok" "$f" | grep -v "^#" | cut -c1-220 | tail -6; done
tail -1 "$R/training.log"; grep -E "^(FAILED|ERROR)" "$R/training.log" | cut -c1-200 | head
