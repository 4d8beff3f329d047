#!/usr/bin/env bash
# Session 16's plan, call 3 (not run in session 16: no device was lent after call 1). Carry .whl
# (it holds .whl/ab-a6ecb01/, a wheel of commit a6ecb01: session 15's kernels, the defaults' SASS
# of before v27). The 8bit and bf16-sr default tiles at 4096x14336, K = 256, 1024, 4096, timed four
# times, one process each: A = the a6ecb01 wheel, then the working tree with FORGE_NUM_PHILOX_WIDE
# off, on, off. v27 (the stochastic rounding's threshold as one shift pair, 8bit) is A against the
# tree off; v25 (the Philox products as mul.wide.u32) the tree on against off. Then v25's bits: the
# twin tests' cuda and cuda-wide modes, the regime tests with it on. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s16c3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
A=/tmp/forge_ab; rm -rf "$A"; mkdir -p "$A/site" "$A/bench"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$A/site" .whl/ab-a6ecb01/*.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
cp bench/kernels.py "$A/bench/"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
DEFAULTS="32x128x64_w8_s3_e4,64x128x64_w8_s3_e4_r128,64x64x64_w4_s4_e2,64x64x64_w4_s3_e4_r128,128x128x64_w8_s3_e8_tma_r128"
ARGS=(--precision 8bit,bf16-sr --shapes 4096x14336 --tokens 256,1024,4096 --configs "$DEFAULTS")
echo "== kernels A (a6ecb01) $(date -u +%T)"
PYTHONPATH="$A/site" timeout 90 python3 "$A/bench/kernels.py" "${ARGS[@]}" --out "$R/kernels_A.json" >"$R/kernels_A.log" 2>&1
for run in off1:0 on:1 off2:0; do
  echo "== kernels tree, FORGE_NUM_PHILOX_WIDE=${run#*:} (${run%%:*}) $(date -u +%T)"
  FORGE_NUM_PHILOX_WIDE=${run#*:} timeout 90 python3 bench/kernels.py "${ARGS[@]}" --out "$R/kernels_${run%%:*}.json" \
    >"$R/kernels_${run%%:*}.log" 2>&1
done
echo "== twin tests (cuda, cuda-wide) $(date -u +%T)"
timeout -s INT -k 10 100 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_interpreter_rounding.py \
  >"$R/twins.log" 2>&1
echo "== regime tests with FORGE_NUM_PHILOX_WIDE=1 $(date -u +%T)"
FORGE_NUM_PHILOX_WIDE=1 HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 170 python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py -k "8bit_regime or bf16_sr or default_configs" --junitxml="$R/junit_wide.xml" >"$R/exactness_wide.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/twins.log"; grep -E "^(FAILED|ERROR)" "$R/twins.log" | cut -c1-200 | head
tail -1 "$R/exactness_wide.log"; grep -E "^(FAILED|ERROR)" "$R/exactness_wide.log" | cut -c1-200 | head
python3 - "$R" <<'PY'
import json, sys
runs = {k: json.load(open(f"{sys.argv[1]}/kernels_{k}.json")) for k in ("A", "off1", "on", "off2")}
print("forge_num:", {k: v["meta"].get("forge_num_path") for k, v in runs.items()})
for i, r in enumerate(runs["off1"]["rows"]):
    for label in r["per_label_ms"]:
        t = {k: runs[k]["rows"][i]["per_label_ms"].get(label) for k in runs}
        off = min(t["off1"], t["off2"])
        print(r["precision"], r["M"], r["N"], r["K"], label, " ".join(f"{k} {v:.3f}" for k, v in t.items()),
              "v27 %.3f" % (t["A"] / off) if r["precision"] == "8bit" else "", "v25 %.3f" % (off / t["on"]))
PY
