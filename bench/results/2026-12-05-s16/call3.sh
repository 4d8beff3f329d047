#!/usr/bin/env bash
# Session 16's plan, call 3 (not run in session 16: no device was lent after call 1): v25, the
# Philox rounds' products as one mul.wide.u32 (FORGE_NUM_PHILOX_WIDE=1), against the two-multiply
# form, the 8bit and bf16-sr default tiles timed with it off, on, off (one process each: the flag
# is read at import); its bits (the twin tests' cuda-wide mode; the 8bit and bf16-sr regime tests
# with it on). Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s16c3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
DEFAULTS="32x128x64_w8_s3_e4,64x128x64_w8_s3_e4_r128,64x64x64_w4_s4_e2,64x64x64_w4_s3_e4_r128,128x128x64_w8_s3_e8_tma_r128"
for run in off1:0 on:1 off2:0; do
  echo "== kernels, FORGE_NUM_PHILOX_WIDE=${run#*:} (${run%%:*}) $(date -u +%T)"
  FORGE_NUM_PHILOX_WIDE=${run#*:} timeout 80 python3 bench/kernels.py --precision 8bit,bf16-sr --shapes 4096x14336 \
    --tokens 256,1024,4096,8192 --configs "$DEFAULTS" --out "$R/kernels_${run%%:*}.json" >"$R/kernels_${run%%:*}.log" 2>&1
done
echo "== twin tests (cuda, cuda-wide) $(date -u +%T)"
timeout -s INT -k 10 100 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_interpreter_rounding.py \
  >"$R/twins.log" 2>&1
echo "== regime tests with FORGE_NUM_PHILOX_WIDE=1 $(date -u +%T)"
FORGE_NUM_PHILOX_WIDE=1 HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 200 python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py -k "8bit_regime or bf16_sr or default_configs" --junitxml="$R/junit_wide.xml" >"$R/exactness_wide.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/twins.log"; grep -E "^(FAILED|ERROR)" "$R/twins.log" | cut -c1-200 | head
tail -1 "$R/exactness_wide.log"; grep -E "^(FAILED|ERROR)" "$R/exactness_wide.log" | cut -c1-200 | head
python3 - "$R" <<'PY'
import json, sys
runs = {k: json.load(open(f"{sys.argv[1]}/kernels_{k}.json")) for k in ("off1", "on", "off2")}
for i, r in enumerate(runs["on"]["rows"]):
    for label, on in r["per_label_ms"].items():
        offs = [runs[k]["rows"][i]["per_label_ms"].get(label) for k in ("off1", "off2")]
        print(r["precision"] if "precision" in r else "", r["M"], r["N"], r["K"], label,
              "off %.3f/%.3f on %.3f" % (offs[0], offs[1], on), "gain %.3f" % (min(offs) / on))
PY
