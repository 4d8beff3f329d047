#!/usr/bin/env bash
# Session 11, call 3: the split tile routed at 512 < K <= 1024 (its GPU tests: bits and the route),
# then training steps with Python's collector frozen after the build for every method (train_step
# --gc freeze, the default now): 8B 1x2048 (forge, AMP) and 1B/3B 1x1024 (forge, AMP, FlashOptim,
# whose wheels are carried), where K = 1024 takes the split tile; last, the Gluon kernel on smaller
# shapes (the ROUTE_MIN_WORK threshold). Everything packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s11; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "sources $(find forge_num kernels emulator bench tests proofs examples -name '*.py' | sort | xargs sha1sum | sha1sum | cut -c1-12)"
  date -u; } | tee "$R/env.txt"
echo "== gluon tests $(date -u +%T)"
timeout 130 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/test_gpu_gluon.py >"$R/gluon_test.log" 2>&1
echo "== train 8b $(date -u +%T)"
timeout 130 python3 bench/train_step.py --methods forge,torch_adamw --models llama-8b --tokens 1x2048 \
  --checkpointing on --warmup 3 --steps 6 --out "$R/train_8b.json" >"$R/train_8b.log" 2>&1
echo "== train 1b 3b $(date -u +%T)"
timeout 200 python3 bench/train_step.py --methods forge,torch_adamw,flashoptim --models llama-1b,llama-3b \
  --tokens 1x1024 --checkpointing on --warmup 3 --steps 6 --budget-s 170 --out "$R/train_1b3b.json" >"$R/train_1b3b.log" 2>&1
echo "== ws_kernel small shapes $(date -u +%T)"
timeout 80 python3 bench/ws_kernel.py --shapes 1024x4096,2048x2048,2048x8192,3072x3072 --tokens 256,1024 \
  --out "$R/ws_small.json" >"$R/ws_small.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -3 "$R/gluon_test.log"; grep -E "^(FAILED|ERROR)" "$R/gluon_test.log" | cut -c1-200 | head
grep -vE "^#|^$" "$R/train_8b.log" | cut -c1-200; grep -vE "^#|^$" "$R/train_1b3b.log" | cut -c1-200
grep -vE "^      " "$R/ws_small.log" | cut -c1-200
