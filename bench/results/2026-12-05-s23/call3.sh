#!/usr/bin/env bash
# Session 23, call 3 (carry .whl): v33 (kernels/gluon_q8.py) in the training step, and the rest of its bits.
#   1. tests/test_gpu_gluon.py: the 8bit cases call 2's 170 s cut off (shards, walks, non-finite, refusals,
#      the route, the two-stage candidate's parametrized cases).
#   2. train_step, llama-1b 4x1024 with checkpointing, forge_8bit+cl with --profile (device time by kernel
#      kind), without and with FORGE_NUM_GLUON_Q8=1: does the fused kernels' device time fall, and is the
#      step's wall set by the device or the host (call 2's interleaved A/B: 201 against 173 ms, rounds
#      168-220 with the Gluon kernel).
#   3. bench/kernels.py --precision 8bit at K = 4096 on 1B's other routed shapes (2048x2048, 2048x8192).
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-540}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/call3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== train $(date -u +%T)"
for flag in 0 1; do
  FORGE_NUM_GLUON_Q8=$flag PYTHONPATH=/tmp/site timeout "$(budget 110)" python3 bench/train_step.py --methods forge_8bit+cl \
    --models llama-1b --tokens 4x1024 --checkpointing on --warmup 2 --steps 4 --profile \
    --out "$R/train_q8ws$flag.json" >"$R/train_q8ws$flag.log" 2>&1
done
echo "== kernels $(date -u +%T)"
timeout "$(budget 80)" python3 bench/kernels.py --precision 8bit --shapes 2048x2048,2048x8192 --tokens 4096 \
  --configs "64x128x64_w8_s4_e4_tma_r128,ws8_64x128x64_st3_w8_rows16_mma104_r128,ws8_64x128x64_st4_w8_rows16_mma104_r128" \
  --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== tests $(date -u +%T)"
timeout "$(budget 240)" python3 -m pytest -q -x -rA tests/test_gpu_gluon.py -p no:cacheprovider \
  -k "8bit and (shards or refuses or routes or st2)" >"$R/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$R/tests.log" | tail -30
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for flag in 0 1; do echo "FORGE_NUM_GLUON_Q8=$flag"; grep -E "^forge|profiled step|^ +[a-z_]+ .*ms" "$R/train_q8ws$flag.log" | cut -c1-220 | head -12; done
grep -E "^ *[0-9]+x[0-9]+|ws8|tma" "$R/kernels.log" | cut -c1-200 | head -12
