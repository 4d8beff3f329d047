#!/usr/bin/env bash
# Session 20, call 2: the promotions from call 1, checked and measured. v25 (the Philox products as
# mul.wide.u32) is the GPU's default now, and v24's TMA 64x128 (four stages, r128) the 8bit default
# where TMA can load the operands (from 4096 tokens, or with 256 tiles and more). Carry .whl
# (flashoptim's wheel).
#   1. Bits: the 8bit defaults forced and the 8bit regime (which draws the new tile from Q8_CONFIGS),
#      the 8bit telemetry bound, the Philox twins in both modes (their test kernels now pass the seed
#      as the kernels do), the Gluon kernel's bf16-sr bits (its rounds are wide now).
#   2. The 8bit and bf16-sr defaults against the unfused step (the table of record).
#   3. The 8bit step beside flashoptim+cl: 1B and 3B at 4x1024 and 1x1024, checkpointing.
#   3b. Before it, the dW mainloops alone of the 8bit defaults' tile shapes (how much of the fused time is dW).
#   4. Both methods' 1B 4x1024 step under the profiler (the kernel table by name).
# Every step under what is left of CALL_BUDGET_S (570 s by default); $OUT/results.tgz; a short table last.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s20c2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "from forge_num.kernels import random as r; print('philox wide products', bool(r.WIDE_PRODUCTS))"; date -u; } \
  | tee "$R/env.txt"
echo "== bits $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 200)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py tests/test_interpreter_rounding.py tests/test_gpu_gluon.py \
  -k "(default_configs and 8bit) or 8bit_regime or telemetry or cuda or bf16_sr" --junitxml="$R/junit.xml" \
  >"$R/exactness.log" 2>&1
echo "== kernels $(date -u +%T)"
DEFAULTS="32x128x64_w8_s3_e4,64x128x64_w8_s4_e4_tma_r128,64x64x64_w4_s4_e2,64x64x64_w4_s3_e4_r128,128x128x64_w8_s3_e8_tma_r128"
timeout "$(budget 70)" python3 bench/kernels.py --precision 8bit,bf16-sr --shapes 4096x14336,8192x8192,2048x8192 \
  --tokens 256,1024,4096,16384 --configs "$DEFAULTS" --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== mainloops $(date -u +%T)"
timeout "$(budget 40)" python3 bench/kernels.py --mainloop --shapes 4096x14336,8192x2048 --tokens 1024,4096 \
  --out "$R/mainloop.json" >"$R/mainloop.log" 2>&1
echo "== train $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 150)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b,llama-3b --tokens 4x1024,1x1024 --checkpointing on --warmup 2 --steps 3 \
  --out "$R/train.json" >"$R/train.log" 2>&1
echo "== profile $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 60)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b --tokens 4x1024 --checkpointing on --warmup 2 --steps 2 --profile \
  --out "$R/profile.json" >"$R/profile.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
echo "bits: $(tail -1 "$R/exactness.log")"; grep -E "^(FAILED|ERROR)" "$R/exactness.log" | cut -c1-200 | head -8
grep -E "^(8bit|bf16-sr) " "$R/kernels.log" | cut -c1-150
grep -E "^(forge|flash)" "$R/train.log" "$R/profile.log" | cut -c1-170
grep -E "profiled step" "$R/profile.log" | cut -c1-300
tail -12 "$R/mainloop.log" | cut -c1-200
