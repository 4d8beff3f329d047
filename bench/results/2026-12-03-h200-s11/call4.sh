#!/usr/bin/env bash
# Session 11, call 4: the v13 candidates (K blocks of 32) - their bits (tests/test_gpu_gluon.py, with
# every routed tile and the route) and their times beside the routed tiles (bench/ws_kernel.py);
# the routed launch's host time with the descriptors' layouts computed once; the host split of an
# 8-layer 8B-width step. Everything packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s11; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "sources $(find forge_num kernels emulator bench tests proofs examples -name '*.py' | sort | xargs sha1sum | sha1sum | cut -c1-12)"
  date -u; } | tee "$R/env.txt"
echo "== gluon tests $(date -u +%T)"
timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/test_gpu_gluon.py >"$R/gluon_test.log" 2>&1
echo "== ws_kernel $(date -u +%T)"
timeout 150 python3 bench/ws_kernel.py --tokens 256,512,1024,2048 --out "$R/ws_kernel.json" >"$R/ws_kernel.log" 2>&1
echo "== host_time $(date -u +%T)"
timeout 35 python3 bench/host_time.py --part launch --out "$R/host_launch.json" >"$R/host_launch.log" 2>&1
timeout 60 python3 bench/host_time.py --part step --layers 8 --out "$R/host_step8.json" >"$R/host_step8.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -2 "$R/gluon_test.log"; grep -E "^(FAILED|ERROR)" "$R/gluon_test.log" | cut -c1-200 | head
cut -c1-330 "$R/ws_kernel.log"
grep "host " "$R/host_launch.log" | head -8; grep -E "^step|fused.py|fused_linear_update|launch|_apply_linear|_prepare_state" "$R/host_step8.log" | head -30
