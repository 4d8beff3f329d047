#!/usr/bin/env bash
# Session 12, call 3: training steps after this session's host cuts and v16, side by side: the
# issue's anchor size (8B 1x2048: forge, AMP, FlashOptim), 8bit like for like with the phases of
# each peak (8B 4x1024: forge_8bit+cl, flashoptim+cl), 1B 1x1024 (forge, AMP, FlashOptim), the fp32
# peak at 3B with the chunked loss (forge+cl, torch_adamw+cl, with phases); and bench/ws_probe.py
# (each Gluon config's bits in its own process; call 2's run died on an import). Packed into
# $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s12c3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
echo "== train 8b 1x2048 $(date -u +%T)"
timeout 150 python3 bench/train_step.py --methods forge,torch_adamw,flashoptim --models llama-8b --tokens 1x2048 \
  --checkpointing on --warmup 3 --steps 6 --out "$R/train_8b.json" >"$R/train_8b.log" 2>&1
echo "== train 8b 4x1024 8bit $(date -u +%T)"
timeout 110 python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl --models llama-8b --tokens 4x1024 \
  --checkpointing on --warmup 2 --steps 3 --memory-phases --out "$R/train_8b_8bit.json" >"$R/train_8b_8bit.log" 2>&1
echo "== ws_probe $(date -u +%T)"
timeout 130 python3 bench/ws_probe.py --timeout 120 --out "$R/ws_probe.json" >"$R/ws_probe.log" 2>&1
echo "== train 1b 1x1024 $(date -u +%T)"
timeout 70 python3 bench/train_step.py --methods forge,torch_adamw,flashoptim --models llama-1b --tokens 1x1024 \
  --checkpointing on --warmup 3 --steps 6 --out "$R/train_1b.json" >"$R/train_1b.log" 2>&1
echo "== train 3b 1x1024 +cl $(date -u +%T)"
timeout 80 python3 bench/train_step.py --methods forge+cl,torch_adamw+cl --models llama-3b --tokens 1x1024 \
  --checkpointing on --warmup 3 --steps 6 --memory-phases --out "$R/train_3b_cl.json" >"$R/train_3b_cl.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for f in train_8b train_8b_8bit train_1b train_3b_cl; do grep -vE "^#|^$|^ratios|ran;" "$R/$f.log" | cut -c1-220 | tail -12; done
grep -vE "^\{" "$R/ws_probe.log" | cut -c1-160 | tail -30
