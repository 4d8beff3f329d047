#!/usr/bin/env bash
# Session 21, call 2 (carry .whl): the Triton fused kernel's launch through CachedLaunch.
#   1. Bits: the cached launch against JITFunction.run (test_cached_triton_launch), then every GPU
#      exactness test (each fused launch now takes the cached path from a key's second launch) and
#      the training tests.
#   2. Host split at 1B 4x1024: forge_8bit+cl with the cached launch and with FORGE_NUM_FAST_LAUNCH=0,
#      interleaved with flashoptim+cl in one process.
#   3. The 8bit step beside flashoptim+cl at 1B and 3B, 4x1024, checkpointing.
# Every step under what is left of CALL_BUDGET_S (570 s by default); $OUT/results.tgz; a short table last.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/call2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== bits $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 100)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py tests/test_gpu_gluon.py -k cached --junitxml="$R/junit_cached.xml" >"$R/cached.log" 2>&1
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 140)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py tests/test_gpu_training.py -k "not cached" --junitxml="$R/junit.xml" \
  >"$R/exactness.log" 2>&1
echo "== host split $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 100)" python3 bench/host_time.py --part split --split-model llama-1b \
  --split-tokens 4x1024 --split-methods forge_8bit+cl,flashoptim+cl --split-steps 4 --out "$R/host_split.json" \
  >"$R/host_split.log" 2>&1
echo "== train $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 170)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b,llama-3b --tokens 4x1024 --checkpointing on --warmup 2 --steps 3 \
  --out "$R/train.json" >"$R/train.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
echo "cached: $(tail -1 "$R/cached.log")"; echo "bits: $(tail -1 "$R/exactness.log")"
grep -hE "^(FAILED|ERROR)" "$R/cached.log" | cut -c1-200 | head -8; grep -E "^(FAILED|ERROR)" "$R/exactness.log" | cut -c1-200 | head -8
grep -E "^split|JITFunction|CachedLaunch|_launch_linear|fused_linear_update$|fused linear" "$R/host_split.log" | cut -c1-170
grep -E "^(forge|flash)" "$R/train.log" | cut -c1-170
