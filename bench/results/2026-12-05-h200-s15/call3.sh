#!/usr/bin/env bash
# Session 15, call 3: the 8bit regime after v22 across issue 5's grid: the kernel table (the two
# defaults, five Llama shapes, seven K) and the training step at 1B and 3B 4x1024 (with AMP) and the
# 8B 1x2048 anchor, beside FlashOptim on the same chunked loss. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s15c3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== kernels 8bit $(date -u +%T)"
timeout 180 python3 bench/kernels.py --precision 8bit --configs "32x128x64_w8_s3_e4,64x128x64_w8_s3_e4_r128" \
  --out "$R/kernels_8bit.json" >"$R/kernels_8bit.log" 2>&1
echo "== train 1B, 3B 4x1024 $(date -u +%T)"
timeout 160 python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl,torch_adamw --models llama-1b,llama-3b \
  --tokens 4x1024 --checkpointing on --warmup 2 --steps 3 --out "$R/train_4x1024.json" >"$R/train_4x1024.log" 2>&1
echo "== train 8B 1x2048 $(date -u +%T)"
timeout 150 python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl --models llama-8b --tokens 1x2048 \
  --checkpointing on --warmup 2 --steps 3 --out "$R/train_8b.json" >"$R/train_8b.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
grep -E "^8bit" "$R/kernels_8bit.log" | cut -c1-150
for f in "$R"/train_*.log; do grep -E "peak|tok" "$f" | grep -v "^#" | cut -c1-200 | tail -8; done
