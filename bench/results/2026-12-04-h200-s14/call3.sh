#!/usr/bin/env bash
# Session 14, call 3: the v20 bf16-sr candidates (with the two older candidate tiles) (fewer elements a thread: 64x64 w8, 64x32, 64x16,
# 128 registers) for exactness (hypothesis, 40 cases each) and speed beside the default; then the
# rest of the GPU suite under the `ci` hypothesis profile (call 2's `gpu` profile ran out of time).
# Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s14c3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
echo "== candidate exactness $(date -u +%T)"
HYPOTHESIS_PROFILE=gpu timeout -s INT -k 10 110 python3 -m pytest -q -rfE -p no:cacheprovider -n 12 tests/test_gpu_exactness.py \
  -k "candidate_configs" \
  >"$R/candidates.log" 2>&1
echo "== kernels bf16-sr $(date -u +%T)"
timeout 130 python3 bench/kernels.py --precision bf16-sr --shapes 4096x4096,14336x4096 --tokens 256,1024 \
  --configs "64x64x64_w4_s3_e4_r128,64x64x64_w8_s3_e4_r128,64x32x64_w4_s3_e2_r128,64x16x64_w4_s3_e1_r128" \
  --out "$R/kernels_bf16sr.json" >"$R/kernels_bf16sr.log" 2>&1
echo "== GPU suite (ci profile) $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 15 230 python3 -m pytest -m "exactness or gpu or statistical" -q -rfE -p no:cacheprovider \
  -n 12 --junitxml="$R/junit.xml" tests/test_gpu_exactness.py tests/test_gpu_tensor_core.py tests/test_statistical_rounding.py \
  tests/test_ptx.py tests/test_bench_scripts.py tests/test_emulator_tensor_core.py tests/test_report.py >"$R/suite.log" 2>&1
echo "pytest exit: $?" >>"$R/suite.log"
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/candidates.log"; grep -E "^(FAILED|ERROR)" "$R/candidates.log" | cut -c1-200 | head
python3 - "$R/kernels_bf16sr.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["M"], r["N"], r["K"], "unfused %.3f" % r["unfused_ms"], {k: round(v, 3) for k, v in r["per_label_ms"].items()})
PY
tail -2 "$R/suite.log"; grep -E "^(FAILED|ERROR)" "$R/suite.log" | cut -c1-200 | head -20
