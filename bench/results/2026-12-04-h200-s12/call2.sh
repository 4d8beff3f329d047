#!/usr/bin/env bash
# Session 12, call 2: the ping-pong consumers with turns (call 1 lost its kernel table to a launch
# failure there): each Gluon config in its own process against the Triton kernel's bits
# (bench/ws_probe.py), then the GPU tests of the ping-pong configs and of the launch path, the
# Gluon tiles' times without any config the probe failed (bench/ws_kernel.py --exclude); v16 (a bf16
# gradient widened in row chunks): forge_8bit+cl at 8B 4x1024 with the peak of each phase; the
# host split after this session's host cuts; the 3B 1x1024 step beside AMP and FlashOptim.
# Everything packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s12c2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  date -u; } | tee "$R/env.txt"
echo "== ws_probe $(date -u +%T)"
timeout 150 python3 bench/ws_probe.py --timeout 140 --out "$R/ws_probe.json" >"$R/ws_probe.log" 2>&1
EXCL=$(grep '^failed:' "$R/ws_probe.log" | sed 's/^failed: //')
echo "== gluon tests $(date -u +%T)"
timeout 100 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/test_gpu_gluon.py \
  -k "pp240 or one_program or cached_launch or nonfinite or routes or training_a_routed or refuses" >"$R/gluon_test.log" 2>&1
echo "== ws_kernel (exclude: '$EXCL') $(date -u +%T)"
timeout 130 python3 bench/ws_kernel.py --tokens 256,1024,2048 --exclude "$EXCL" --out "$R/ws_kernel.json" >"$R/ws_kernel.log" 2>&1
echo "== train 8b 4x1024 8bit memory phases $(date -u +%T)"
timeout 75 python3 bench/train_step.py --methods forge_8bit+cl --models llama-8b --tokens 4x1024 \
  --checkpointing on --warmup 2 --steps 3 --memory-phases --out "$R/train_8b_8bit.json" >"$R/train_8b_8bit.log" 2>&1
echo "== host split $(date -u +%T)"
timeout 50 python3 bench/host_time.py --part split --split-model llama-3b --split-tokens 1x1024 --split-steps 6 \
  --out "$R/host_split.json" >"$R/host_split.log" 2>&1
echo "== train 3b 1x1024 $(date -u +%T)"
timeout 85 python3 bench/train_step.py --methods forge,torch_adamw,flashoptim --models llama-3b --tokens 1x1024 \
  --checkpointing on --warmup 3 --steps 6 --out "$R/train_3b.json" >"$R/train_3b.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
grep -vE "^\{" "$R/ws_probe.log" | cut -c1-160
tail -2 "$R/gluon_test.log"; grep -E "^(FAILED|ERROR)" "$R/gluon_test.log" | cut -c1-200 | head
grep -vE "^      " "$R/ws_kernel.log" | cut -c1-230
grep -vE "^#|^$" "$R/train_8b_8bit.log" | cut -c1-220 | tail -5
grep -E "^split|JITFunction|CachedLaunch|gluon_update|_telemetry|fused_linear_update|_apply_linear" "$R/host_split.log" | cut -c1-150
grep -vE "^#|^$" "$R/train_3b.log" | cut -c1-200 | tail -8
