#!/usr/bin/env bash
# Session 13, call 3: what is alive at the fp32 regime's peak (bench/train_step.py --memory-snapshot:
# the allocator's history over one step) at 8B 4x1024 and 3B 1x1024, where forge+cl misses 0.78x
# torch_adamw+cl by 0.6-0.8%, and 1B; then the GPU tests of the files this session's kernels touch
# (the Gluon kernel in both regimes, the twins, training, torch parity). Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s13c3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
for mt in llama-8b:4x1024 llama-3b:1x1024 llama-1b:1x1024; do
  m=${mt%%:*}; t=${mt##*:}
  echo "== snapshot $m $t $(date -u +%T)"
  timeout 75 python3 bench/train_step.py --methods forge+cl,torch_adamw+cl --models "$m" --tokens "$t" --checkpointing on \
    --warmup 2 --steps 2 --memory-snapshot --out "$R/snap_${m}_$t.json" >"$R/snap_${m}_$t.log" 2>&1
done
echo "== GPU tests $(date -u +%T)"
timeout -s INT -k 20 270 python3 -m pytest -m "exactness or gpu or statistical" -q -rfE -p no:cacheprovider -n 12 \
  --junitxml="$R/junit.xml" tests/test_gpu_gluon.py tests/test_interpreter_rounding.py tests/test_gpu_training.py \
  tests/test_gpu_torch_parity.py >"$R/suite.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for f in "$R"/snap_*.log; do grep -vE "^#|^$|gc_gen|ratios|ran;" "$f" | cut -c1-230 | head -40; done
tail -3 "$R/suite.log"; grep -E "^(FAILED|ERROR)" "$R/suite.log" | cut -c1-200 | head -20
