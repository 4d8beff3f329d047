#!/usr/bin/env bash
# Session 13, call 8: the bf16-sr default between the two measured points (K = 512 and 1024): the
# 128-register 64x64 (now the default from 256 tokens) against the uncapped 64x64. Packed into
# $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s13c8; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
timeout 80 python3 bench/kernels.py --precision bf16-sr --shapes 4096x4096,14336x4096 --tokens 512,1024 \
  --configs "64x64x64_w4_s4_e2,64x64x64_w4_s3_e4_r128" --out "$R/kernels_bf16sr.json" >"$R/kernels_bf16sr.log" 2>&1
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
cut -c1-330 "$R/kernels_bf16sr.log"
python3 - "$R/kernels_bf16sr.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["M"], r["N"], r["K"], "unfused %.3f" % r["unfused_ms"], {k: round(v, 3) for k, v in r["per_label_ms"].items()})
PY
