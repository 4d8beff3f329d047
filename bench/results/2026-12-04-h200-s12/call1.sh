#!/usr/bin/env bash
# Session 12, call 1: the ping-pong candidates (v15) and the launch that skips Triton's binder
# (kernels/launch_cache.py) on the GPU: their bits (tests/test_gpu_gluon.py); the Gluon tiles'
# times (bench/ws_kernel.py); forge's host time inside the real 3B 1x1024 step, split by function,
# fast launch against FORGE_NUM_FAST_LAUNCH=0 on alternate steps (bench/host_time.py --part split);
# the v14 prediction (smaller loss chunks): forge_8bit+cl and flashoptim+cl at 8B 4x1024.
# Everything packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s12; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
echo "== gluon tests $(date -u +%T)"
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/test_gpu_gluon.py >"$R/gluon_test.log" 2>&1
echo "== ws_kernel $(date -u +%T)"
timeout 150 python3 bench/ws_kernel.py --tokens 256,512,1024,2048 --out "$R/ws_kernel.json" >"$R/ws_kernel.log" 2>&1
echo "== host split $(date -u +%T)"
timeout 100 python3 bench/host_time.py --part split --split-model llama-3b --split-tokens 1x1024 --split-steps 6 \
  --out "$R/host_split.json" >"$R/host_split.log" 2>&1
echo "== train 8b 4x1024 $(date -u +%T)"
timeout 140 python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl --models llama-8b --tokens 4x1024 \
  --checkpointing on --warmup 2 --steps 3 --out "$R/train_8b_cl.json" >"$R/train_8b_cl.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -2 "$R/gluon_test.log"; grep -E "^(FAILED|ERROR)" "$R/gluon_test.log" | cut -c1-200 | head
grep -vE "^      " "$R/ws_kernel.log" | cut -c1-230
grep -E "^split|JITFunction|CachedLaunch|launch|fused linear|_apply|fused_linear" "$R/host_split.log" | cut -c1-150
grep -vE "^#|^$" "$R/train_8b_cl.log" | cut -c1-200 | tail -8
