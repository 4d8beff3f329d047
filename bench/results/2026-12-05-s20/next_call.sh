#!/usr/bin/env bash
# Written at the end of session 20 for the next session's first call (not run): what session 20 left
# unmeasured or unchecked on the H200. Carry .whl (flashoptim's wheel).
#   1. Bits: the Gluon bf16-sr shard test (cut by call 3's limit), the 8bit candidates' own test (it
#      did not run in call 1), the training tests (tiny Llama and GPT-2 trained with the fused kernels
#      against a materialized gradient) with the new 8bit default and the wide Philox products.
#   2. The 8bit step beside flashoptim+cl on the H200 with v24 and v25 both (call 2 had an H100): 1B
#      and 3B at 4x1024 and 1x1024, checkpointing; then the host split at 1B 4x1024.
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
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 220)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_gluon.py tests/test_gpu_exactness.py tests/test_gpu_training.py \
  -k "shards_and_walks or (candidate_configs and 8bit) or 8bit or bf16_sr or bf16-sr" --junitxml="$R/junit.xml" \
  >"$R/exactness.log" 2>&1
echo "== train $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 200)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b,llama-3b --tokens 4x1024,1x1024 --checkpointing on --warmup 2 --steps 3 \
  --out "$R/train.json" >"$R/train.log" 2>&1
echo "== host split $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 60)" python3 bench/host_time.py --part split --split-model llama-1b \
  --split-tokens 4x1024 --split-methods forge_8bit+cl,flashoptim+cl --split-steps 3 --out "$R/host_split.json" \
  >"$R/host_split.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
echo "bits: $(tail -1 "$R/exactness.log")"; grep -E "^(FAILED|ERROR)" "$R/exactness.log" | cut -c1-200 | head -8
grep -E "^(forge|flash)" "$R/train.log" | cut -c1-170
grep -E "^split" "$R/host_split.log" | cut -c1-170
