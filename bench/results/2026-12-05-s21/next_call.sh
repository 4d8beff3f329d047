#!/usr/bin/env bash
# Written at the end of session 21 for the next session's first call (not run; carry .whl):
#   1. Bits: the cached Triton launch's GPU test as widened by session 21's review (fp32 operands, an
#      accumulated gradient, gathered rows' counters) and the Gluon cached-launch tests; then the
#      fp32 regime tests (the Gluon route's reordering, a23be7b) and the 8bit regime test cut in call 2.
#   2. v30's A/B inside one process on this machine's host (session 21 had two H100 hosts only):
#      forge_8bit+cl and forge+cl, each also with FORGE_NUM_FAST_LAUNCH=0, against flashoptim+cl.
#   3. The 8bit step beside flashoptim+cl at 1B and 3B, 4x1024 and 1x1024, checkpointing.
# Every step under what is left of CALL_BUDGET_S (570 s by default); $OUT/results.tgz; a short table last.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/next_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== bits $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 120)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py tests/test_gpu_gluon.py -k cached --junitxml="$R/junit_cached.xml" >"$R/cached.log" 2>&1
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 120)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py tests/test_gpu_gluon.py -k "(fused_unfused_emulator and bf16) or 8bit_regime or route" \
  --junitxml="$R/junit.xml" >"$R/exactness.log" 2>&1
echo "== host split $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 170)" python3 bench/host_time.py --part split --split-model llama-1b \
  --split-tokens 4x1024 --split-methods forge_8bit+cl,forge+cl,flashoptim+cl --split-steps 4 \
  --out "$R/host_split.json" >"$R/host_split.log" 2>&1
echo "== train $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 170)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b,llama-3b --tokens 4x1024,1x1024 --checkpointing on --warmup 2 --steps 3 \
  --out "$R/train.json" >"$R/train.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
echo "cached: $(tail -1 "$R/cached.log")"; echo "bits: $(tail -1 "$R/exactness.log")"
grep -hE "^(FAILED|ERROR)" "$R/cached.log" "$R/exactness.log" | cut -c1-200 | head -8
grep -E "^split|JITFunction|CachedLaunch|fused_linear_update$" "$R/host_split.log" | cut -c1-170
grep -E "^(forge|flash)" "$R/train.log" | cut -c1-170
