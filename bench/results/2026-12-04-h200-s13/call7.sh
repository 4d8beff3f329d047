#!/usr/bin/env bash
# Session 13, call 7: the Triton bf16-sr tile with more warps an SM or without spills (two
# candidates: 64x64 s3 e8 r128, four programs, no spill; 64x64 s2 e8 r96, five programs) against the
# default at K = 256, 2048, 4096, and their bits (test_candidate_configs). Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s13c7; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
echo "== kernels $(date -u +%T)"
timeout 110 python3 bench/kernels.py --precision bf16-sr --shapes 4096x4096,14336x4096 --tokens 256,2048,4096 \
  --configs "64x64x64_w4_s4_e2,64x64x64_w4_s3_e4_r128,64x64x64_w4_s3_e8_r128,64x64x64_w4_s2_e8_r96" \
  --out "$R/kernels_bf16sr.json" >"$R/kernels_bf16sr.log" 2>&1
echo "== tests $(date -u +%T)"
timeout 70 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/test_gpu_exactness.py -k "candidate_configs and e8" \
  >"$R/test.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
cut -c1-330 "$R/kernels_bf16sr.log"
tail -1 "$R/test.log"; grep -E "^(FAILED|ERROR)" "$R/test.log" | cut -c1-200 | head
python3 - "$R/kernels_bf16sr.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["M"], r["N"], r["K"], "unfused %.3f" % r["unfused_ms"], {k: round(v, 3) for k, v in r["per_label_ms"].items()})
PY
