#!/usr/bin/env bash
# Session 13, call 2: the bf16-sr Gluon tiles with 12-16 consumer warps an SM (64x64, three or four
# programs) against the Triton bf16-sr default, their bits; the twin tests on the GPU again (the
# test kernel's seed fixed); v17's peaks (forge+cl at 8B 1x2048 and 4x1024, 3B 1x1024) with the
# 8B step's tokens/s beside FlashOptim and bf16-sr; the interleaved host split at 3B. Packed into
# $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s13c2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
echo "== tests $(date -u +%T)"
timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/test_gpu_gluon.py tests/test_interpreter_rounding.py \
  -k "p4 or p3 or shards or cuda" >"$R/test.log" 2>&1
echo "== ws_kernel bf16-sr $(date -u +%T)"
timeout 110 python3 bench/ws_kernel.py --precision bf16-sr --shapes 4096x4096,14336x4096 --tokens 256,2048,8192 \
  --exclude "64x128x64" --out "$R/ws_kernel_bf16sr.json" >"$R/ws_kernel_bf16sr.log" 2>&1
echo "== train 8b 1x2048 $(date -u +%T)"
timeout 150 python3 bench/train_step.py --methods forge+cl,torch_adamw+cl,flashoptim+cl,forge_bf16sr+cl --models llama-8b \
  --tokens 1x2048 --checkpointing on --warmup 2 --steps 4 --memory-phases --out "$R/train_8b_1x2048.json" >"$R/train_8b_1x2048.log" 2>&1
echo "== train 8b 4x1024 $(date -u +%T)"
timeout 75 python3 bench/train_step.py --methods forge+cl,torch_adamw+cl --models llama-8b \
  --tokens 4x1024 --checkpointing on --warmup 2 --steps 3 --memory-phases --out "$R/train_8b_4x1024.json" >"$R/train_8b_4x1024.log" 2>&1
echo "== train 3b 1x1024 $(date -u +%T)"
timeout 60 python3 bench/train_step.py --methods forge+cl,torch_adamw+cl --models llama-3b \
  --tokens 1x1024 --checkpointing on --warmup 2 --steps 4 --memory-phases --out "$R/train_3b.json" >"$R/train_3b.log" 2>&1
echo "== host split $(date -u +%T)"
timeout 55 python3 bench/host_time.py --part split --split-model llama-3b --split-tokens 1x1024 --split-steps 6 \
  --out "$R/host_split.json" >"$R/host_split.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/test.log"; grep -E "^(FAILED|ERROR)" "$R/test.log" | cut -c1-200 | head
cut -c1-230 "$R/ws_kernel_bf16sr.log"
for f in train_8b_1x2048 train_8b_4x1024 train_3b; do grep -vE "^#|^$|gc_gen" "$R/$f.log" | cut -c1-200 | tail -7; done
grep -E "^split|speed|ratio" "$R/host_split.log" | cut -c1-160 | tail -6
