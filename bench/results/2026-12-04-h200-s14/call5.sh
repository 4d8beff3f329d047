#!/usr/bin/env bash
# Session 14, call 5: the 8bit regime at the tied 1B and 3B models (1x1024, checkpointing) with the
# chunked loss and v19's tied rows, beside FlashOptim on the same loss and AMP on Hugging Face's.
# Carries the baselines' wheels in .whl. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s14c5; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
for m in llama-1b llama-3b; do
  timeout 75 python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl,torch_adamw --models "$m" --tokens 1x1024 \
    --checkpointing on --warmup 2 --steps 3 --memory-phases --out "$R/train_${m}.json" >"$R/train_${m}.log" 2>&1
done
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for f in "$R"/train_*.log; do grep -E "peak|memory" "$f" | grep -v "^#" | cut -c1-200; done
