#!/usr/bin/env bash
# Session 21, call 3 (carry .whl): v30 (the cached Triton launch) A/B inside one process on the
# machine lent, the fp32 regime beside the 8bit one: bench/host_time.py --part split at 1B 4x1024
# with forge_8bit+cl and forge+cl (each also with FORGE_NUM_FAST_LAUNCH=0) interleaved with
# flashoptim+cl; then the 8bit step beside flashoptim+cl at 1B and 3B, 4x1024 (one process a model).
# Every step under what is left of CALL_BUDGET_S (300 s by default); $OUT/results.tgz; a short table last.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-300}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/call3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== host split $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 170)" python3 bench/host_time.py --part split --split-model llama-1b \
  --split-tokens 4x1024 --split-methods forge_8bit+cl,forge+cl,flashoptim+cl --split-steps 4 \
  --out "$R/host_split.json" >"$R/host_split.log" 2>&1
echo "== train $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 170)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b,llama-3b --tokens 4x1024 --checkpointing on --warmup 2 --steps 3 \
  --out "$R/train.json" >"$R/train.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
grep -E "^split|JITFunction|CachedLaunch|fused_linear_update$" "$R/host_split.log" | cut -c1-170
grep -E "^(forge|flash)" "$R/train.log" | cut -c1-170
