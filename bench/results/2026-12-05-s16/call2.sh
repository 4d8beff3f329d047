#!/usr/bin/env bash
# Session 16, call 2: the v24 8bit candidates (TMA mainloops, which ptxas does not serialize) timed
# beside the two 8bit defaults on three Llama-8B shapes, K = 256-16384; their bits
# (test_candidate_configs, `ci` hypothesis profile) and the defaults' since v27 (test_default_configs).
# Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s16c2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== kernels 8bit candidates $(date -u +%T)"
timeout 250 python3 bench/kernels.py --precision 8bit --shapes 4096x14336,8192x8192,14336x4096 --tokens 256,1024,2048,4096,16384 \
  --configs "32x128x64_w8_s3_e4,64x128x64_w8_s3_e4_r128,64x128x64_w8_s3_e4_tma_r128,64x128x64_w8_s4_e4_tma_r128,32x128x64_w8_s3_e4_tma" \
  --out "$R/kernels_8bit.json" >"$R/kernels_8bit.log" 2>&1
echo "== 8bit candidate exactness $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 250 python3 -m pytest -q -rfE -p no:cacheprovider -n 12 tests/test_gpu_exactness.py \
  -k "(candidate_configs or default_configs) and 8bit" --junitxml="$R/junit.xml" >"$R/exactness.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/exactness.log"; grep -E "^(FAILED|ERROR)" "$R/exactness.log" | cut -c1-200 | head
python3 - "$R/kernels_8bit.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["M"], r["N"], r["K"], "unfused %.3f" % r["unfused_ms"], "default", r["default_label"],
          {k: round(v, 3) for k, v in r["per_label_ms"].items()})
PY
tail -3 "$R/kernels_8bit.log"
