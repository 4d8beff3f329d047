#!/usr/bin/env bash
# Session 12, call 5: the fp32 peak at the anchor size with forge's chunked loss (8B 1x2048:
# forge+cl with the phases of its peak, beside AMP with Hugging Face's loss and with the chunked
# one, FlashOptim, and forge's bf16-sr regime on the chunked loss); the 3B 1x1024 step a third time
# (calls 2 and 4: 0.86x and 0.55x AMP, same code). Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s12c5; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  nproc; date -u; } | tee "$R/env.txt"
echo "== train 8b 1x2048 $(date -u +%T)"
timeout 200 python3 bench/train_step.py --methods forge+cl,torch_adamw,torch_adamw+cl,flashoptim,forge_bf16sr+cl \
  --models llama-8b --tokens 1x2048 --checkpointing on --warmup 3 --steps 5 --memory-phases \
  --out "$R/train_8b.json" >"$R/train_8b.log" 2>&1
echo "== train 3b 1x1024 $(date -u +%T)"
timeout 75 python3 bench/train_step.py --methods forge,torch_adamw --models llama-3b --tokens 1x1024 \
  --checkpointing on --warmup 3 --steps 8 --out "$R/train_3b.json" >"$R/train_3b.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for f in train_8b train_3b; do grep -vE "^#|^$|ran;" "$R/$f.log" | cut -c1-230 | tail -16; done
