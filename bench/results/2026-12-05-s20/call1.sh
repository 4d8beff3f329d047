#!/usr/bin/env bash
# Session 20, call 1: the 8bit and bf16-sr kernel candidates that sessions 16-19 built but never
# timed, in one call. Carry .whl (it holds .whl/ab-c4c1edf/, a wheel of c4c1edf: session 16's code,
# after v27 and before v29).
#   v24  the TMA 8bit tiles beside the two 8bit defaults (tree, FORGE_NUM_PHILOX_WIDE=0),
#        4096x14336 and 8192x8192, K = 256, 1024, 4096, 16384.
#   v29  the 8bit epilogue's telemetry reduced once a tile: A (c4c1edf) against the tree, off.
#   v25  the Philox rounds' products as mul.wide.u32: the tree with FORGE_NUM_PHILOX_WIDE=1 against 0.
#        Runs off1, A, on, off2 (one process each; off twice to see the drift), the 8bit and bf16-sr
#        defaults at 4096x14336, K = 256, 1024, 4096, 16384.
# Then the bits: the v24 tiles (test_candidate_configs 8bit), v29's telemetry bound, the Philox twins
# in both modes, the 8bit and bf16-sr regime tests with FORGE_NUM_PHILOX_WIDE=1.
# Every step under what is left of CALL_BUDGET_S (570 s by default) from the start; packed into
# $OUT/results.tgz; a short table printed last.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s20c1; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
A=/tmp/forge_ab; rm -rf "$A"; mkdir -p "$A/site" "$A/bench"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$A/site" .whl/ab-c4c1edf/*.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
cp bench/kernels.py "$A/bench/"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
Q8_DEFAULTS="32x128x64_w8_s3_e4,64x128x64_w8_s3_e4_r128"
V24="64x128x64_w8_s3_e4_tma_r128,64x128x64_w8_s4_e4_tma_r128,32x128x64_w8_s3_e4_tma"
SR_DEFAULTS="64x64x64_w4_s4_e2,64x64x64_w4_s3_e4_r128,128x128x64_w8_s3_e8_tma_r128"
echo "== v24: 8bit TMA tiles $(date -u +%T)"
FORGE_NUM_PHILOX_WIDE=0 timeout "$(budget 150)" python3 bench/kernels.py --precision 8bit --shapes 4096x14336,8192x8192 \
  --tokens 256,1024,4096,16384 --configs "$Q8_DEFAULTS,$V24" --out "$R/kernels_v24.json" >"$R/kernels_v24.log" 2>&1
ARGS=(--precision 8bit,bf16-sr --shapes 4096x14336 --tokens 256,1024,4096,16384 --configs "$Q8_DEFAULTS,$SR_DEFAULTS")
for run in off1 A on off2; do
  echo "== defaults $run $(date -u +%T)"
  case $run in
    A) PYTHONPATH="$A/site" timeout "$(budget 75)" python3 "$A/bench/kernels.py" "${ARGS[@]}" --out "$R/kernels_$run.json" \
         >"$R/kernels_$run.log" 2>&1 ;;
    on) FORGE_NUM_PHILOX_WIDE=1 timeout "$(budget 75)" python3 bench/kernels.py "${ARGS[@]}" --out "$R/kernels_$run.json" \
         >"$R/kernels_$run.log" 2>&1 ;;
    *) FORGE_NUM_PHILOX_WIDE=0 timeout "$(budget 60)" python3 bench/kernels.py "${ARGS[@]}" --out "$R/kernels_$run.json" \
         >"$R/kernels_$run.log" 2>&1 ;;
  esac
done
echo "== bits: v24 tiles, v29 telemetry, Philox twins $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 90)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py tests/test_interpreter_rounding.py -k "(candidate_configs and 8bit) or telemetry or cuda" \
  --junitxml="$R/junit_bits.xml" >"$R/bits.log" 2>&1
echo "== regime tests with FORGE_NUM_PHILOX_WIDE=1 $(date -u +%T)"
FORGE_NUM_PHILOX_WIDE=1 HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 170)" python3 -m pytest -q -rfE -p no:cacheprovider \
  -n 12 tests/test_gpu_exactness.py -k "8bit_regime or bf16_sr_regime or default_configs" --junitxml="$R/junit_wide.xml" \
  >"$R/exactness_wide.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for f in bits exactness_wide; do echo "$f: $(tail -1 "$R/$f.log")"; grep -E "^(FAILED|ERROR)" "$R/$f.log" | cut -c1-200 | head -5; done
python3 - "$R" <<'PY'
import json, os, sys
R = sys.argv[1]
load = lambda k: json.load(open(f"{R}/kernels_{k}.json")) if os.path.exists(f"{R}/kernels_{k}.json") else None
v24 = load("v24")
if v24:
    print("v24 (ms; unfused, then each tile)")
    for r in v24["rows"]:
        print(r["M"], r["N"], r["K"], "unfused %.3f" % r["unfused_ms"], "default", r["default_label"],
              " ".join(f"{k}={v:.3f}" for k, v in r["per_label_ms"].items()))
runs = {k: load(k) for k in ("off1", "A", "on", "off2")}
runs = {k: v for k, v in runs.items() if v}
print("runs:", sorted(runs), {k: v["meta"].get("forge_num_path") for k, v in runs.items()})
if "off1" in runs:
    for i, r in enumerate(runs["off1"]["rows"]):
        for label in r["per_label_ms"]:
            t = {k: v["rows"][i]["per_label_ms"].get(label) for k, v in runs.items()}
            off = min(x for k, x in t.items() if k.startswith("off") and x)
            extra = []
            if t.get("A") and r["precision"] == "8bit":
                extra.append("v29 %.3f" % (t["A"] / off))
            if t.get("on"):
                extra.append("v25 %.3f" % (off / t["on"]))
            print(r["precision"], r["M"], r["N"], r["K"], label,
                  " ".join(f"{k} {v:.3f}" for k, v in t.items() if v), *extra)
PY
