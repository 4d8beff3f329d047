#!/usr/bin/env bash
# Session 13, call 1: v18, the bf16-sr regime on the Gluon kernel. Its GPU tests (bits against the
# Triton kernel and the emulator; the written-out Philox against tl.randint4x on the GPU), then its
# tiles' times against the Triton bf16-sr default and the unfused step (bench/ws_kernel.py
# --precision bf16-sr), the 8B step with bf16-sr routed to it and not (FORGE_NUM_GLUON_BF16_SR=1/0),
# and the fp32 two-program tile with eight sub-tiles beside the routed one. Packed into
# $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s13c1; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
echo "== gluon tests $(date -u +%T)"
timeout 170 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/test_gpu_gluon.py tests/test_interpreter_rounding.py \
  -k "bf16_sr or e8 or cached_launch or routes or refuses or one_program or cuda" >"$R/gluon_test.log" 2>&1
echo "== ws_kernel bf16-sr $(date -u +%T)"
timeout 200 python3 bench/ws_kernel.py --precision bf16-sr --shapes 4096x4096,14336x4096 --tokens 256,1024,2048,4096,8192 \
  --out "$R/ws_kernel_bf16sr.json" >"$R/ws_kernel_bf16sr.log" 2>&1
for flag in 0 1; do
  echo "== train 8b 1x2048 bf16sr FORGE_NUM_GLUON_BF16_SR=$flag $(date -u +%T)"
  FORGE_NUM_GLUON_BF16_SR=$flag timeout 85 python3 bench/train_step.py --methods forge_bf16sr+cl --models llama-8b \
    --tokens 1x2048 --checkpointing on --warmup 2 --steps 4 --out "$R/train_8b_bf16sr_$flag.json" >"$R/train_8b_bf16sr_$flag.log" 2>&1
done
echo "== ws_kernel fp32 e8 $(date -u +%T)"
timeout 60 python3 bench/ws_kernel.py --shapes 4096x8192,14336x4096 --tokens 256,1024 --exclude "pp240,split,x32 " \
  --out "$R/ws_kernel_fp32.json" >"$R/ws_kernel_fp32.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -2 "$R/gluon_test.log"; grep -E "^(FAILED|ERROR)" "$R/gluon_test.log" | cut -c1-220 | head
cat "$R/ws_kernel_bf16sr.log" | cut -c1-230
for flag in 0 1; do grep -vE "^#|^$" "$R/train_8b_bf16sr_$flag.log" | cut -c1-200 | tail -3; done
cat "$R/ws_kernel_fp32.log" | cut -c1-230
