#!/usr/bin/env bash
# Session 11, call 1: the 8B 1x2048 A/B of the Gluon route (the unexplained 0.70x of session 10's
# call H), the split candidates' first GPU test and timing, and the host time of a routed launch.
# Each part under its own limit; everything under $OUT.
set -uo pipefail
R=${OUT:-out}; mkdir -p "$R"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "sources $(find forge_num kernels emulator bench tests proofs examples -name '*.py' | sort | xargs sha1sum | sha1sum | cut -c1-12)"
  date -u; } | tee "$R/env.txt"
T="python3 bench/train_step.py --models llama-8b --tokens 1x2048 --checkpointing on --warmup 4 --steps 4 --profile"
echo "== train routed $(date -u +%T)"
timeout 140 $T --methods forge,torch_adamw --out "$R/train_routed.json" >"$R/train_routed.log" 2>&1
echo "== train FORGE_NUM_GLUON=0 $(date -u +%T)"
FORGE_NUM_GLUON=0 timeout 90 $T --methods forge --out "$R/train_triton.json" >"$R/train_triton.log" 2>&1
echo "== host_time $(date -u +%T)"
timeout 60 python3 bench/host_time.py --part launch,step --out "$R/host_routed.json" >"$R/host_routed.log" 2>&1
FORGE_NUM_GLUON=0 timeout 50 python3 bench/host_time.py --part step --out "$R/host_triton.json" >"$R/host_triton.log" 2>&1
echo "== gluon tests $(date -u +%T)"
timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/test_gpu_gluon.py >"$R/gluon_test.log" 2>&1
echo "== ws_kernel $(date -u +%T)"
timeout 130 python3 bench/ws_kernel.py --tokens 256,1024,2048 --out "$R/ws_kernel.json" >"$R/ws_kernel.log" 2>&1
echo "== done $(date -u +%T)"
grep -E "issued|profiled|x0\.|x1\." "$R"/train_*.log | cut -c1-220
grep -A12 "runtime calls" "$R/train_routed.log" | head -30
tail -4 "$R/gluon_test.log"; grep -E "^(FAILED|ERROR)" "$R/gluon_test.log" | cut -c1-200 | head
tail -30 "$R/ws_kernel.log"
head -40 "$R/host_routed.log"; grep -iE "step|forge" "$R/host_triton.log" | head -20
