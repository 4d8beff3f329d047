#!/usr/bin/env bash
# Session 14, call 1: v19 (a tied embedding's touched rows, the head's dW deferred or widened in
# place): its GPU tests and the GPU tests of the reviewed code (Gluon both regimes, the twins,
# training, torch parity); the fp32 peaks at 1B and 3B, 1x1024 and 4x1024, forge+cl against
# torch_adamw+cl and torch_adamw (HF's loss), with phases; the bf16-sr default at K = 512 and 1024.
# Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s14c1; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
echo "== GPU tests $(date -u +%T)"
timeout -s INT -k 15 180 python3 -m pytest -q -rfE -p no:cacheprovider -n 12 --junitxml="$R/junit.xml" \
  tests/test_tied_rows.py tests/test_gpu_training.py tests/test_gpu_gluon.py tests/test_interpreter_rounding.py \
  tests/test_gpu_torch_parity.py >"$R/suite.log" 2>&1
for mt in llama-3b:1x1024 llama-1b:1x1024 llama-3b:4x1024 llama-1b:4x1024; do
  m=${mt%%:*}; t=${mt##*:}
  echo "== train $m $t $(date -u +%T)"
  timeout 75 python3 bench/train_step.py --methods forge+cl,torch_adamw+cl,torch_adamw --models "$m" --tokens "$t" \
    --checkpointing on --warmup 2 --steps 3 --memory-phases --out "$R/train_${m}_$t.json" >"$R/train_${m}_$t.log" 2>&1
done
echo "== kernels bf16-sr $(date -u +%T)"
timeout 60 python3 bench/kernels.py --precision bf16-sr --shapes 4096x4096,14336x4096 --tokens 512,1024 \
  --configs "64x64x64_w4_s4_e2,64x64x64_w4_s3_e4_r128" --out "$R/kernels_bf16sr.json" >"$R/kernels_bf16sr.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/suite.log"; grep -E "^(FAILED|ERROR)" "$R/suite.log" | cut -c1-200 | head -20
for f in "$R"/train_*.log; do grep -E "peak|memory" "$f" | grep -v "^#" | cut -c1-200; done
cut -c1-250 "$R/kernels_bf16sr.log" | tail -8
