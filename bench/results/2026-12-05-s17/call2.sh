#!/usr/bin/env bash
# Session 17's plan, call 2 (not run in session 17: no device was lent). Carry .whl (it holds
# .whl/ab-c4c1edf/, a wheel of c4c1edf: session 16's kernels, before v29). v29 (the 8bit epilogue's
# telemetry reduced once a tile) timed A/B: the two 8bit defaults at 4096x14336 and 8192x8192,
# K = 256, 1024, 4096, 16384, in one process each, A (c4c1edf), tree, A again; then the 8bit
# telemetry tests and the 8bit defaults' bits. Session 18 added the 8bit and fp32 kernels at Llama-1B's four
# linear shapes, K = 4096 (is the 1B step's 8bit time what the 8B shapes' table predicts?). Packed into
# $OUT/results.tgz.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))  # CALL_BUDGET_S: less where less device time is left
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s17c2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
A=/tmp/forge_ab; rm -rf "$A"; mkdir -p "$A/site" "$A/bench"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$A/site" .whl/ab-c4c1edf/*.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
cp bench/kernels.py "$A/bench/"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
# Session 18: each step under what is left of 570 s from the start (CALL_BUDGET_S; results packed before the limit).
ARGS=(--precision 8bit --shapes 4096x14336,8192x8192 --tokens 256,1024,4096,16384)
for run in A1 tree A2; do
  echo "== kernels $run $(date -u +%T)"
  if [ "$run" = tree ]; then
    timeout "$(budget 100)" python3 bench/kernels.py "${ARGS[@]}" --out "$R/kernels_$run.json" >"$R/kernels_$run.log" 2>&1
  else
    PYTHONPATH="$A/site" timeout "$(budget 100)" python3 "$A/bench/kernels.py" "${ARGS[@]}" --out "$R/kernels_$run.json" \
      >"$R/kernels_$run.log" 2>&1
  fi
done
echo "== kernels at Llama-1B's shapes, K = 4096 (session 18) $(date -u +%T)"
timeout "$(budget 80)" python3 bench/kernels.py --precision 8bit,fp32 --shapes 2048x2048,512x2048,8192x2048,2048x8192 --tokens 4096 \
  --out "$R/kernels_1b.json" >"$R/kernels_1b.log" 2>&1
echo "== 8bit bits $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 200)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 tests/test_gpu_exactness.py \
  -k "telemetry or (default_configs and 8bit) or 8bit_regime" --junitxml="$R/junit.xml" >"$R/exactness.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/exactness.log"; grep -E "^(FAILED|ERROR)" "$R/exactness.log" | cut -c1-200 | head
python3 - "$R" <<'PY'
import json, os, sys
runs = {k: json.load(open(f"{sys.argv[1]}/kernels_{k}.json")) for k in ("A1", "tree", "A2")
        if os.path.exists(f"{sys.argv[1]}/kernels_{k}.json")}
if len(runs) < 3:
    sys.exit(f"v29 A/B incomplete: {sorted(runs)}")
print("forge_num:", {k: v["meta"].get("forge_num_path") for k, v in runs.items()})
for i, r in enumerate(runs["tree"]["rows"]):
    t = {k: runs[k]["rows"][i]["per_label_ms"][r["default_label"]] for k in runs}
    print(r["M"], r["N"], r["K"], r["default_label"], "unfused %.3f" % r["unfused_ms"],
          " ".join(f"{k} {v:.3f}" for k, v in t.items()), "v29 %.3f" % (min(t["A1"], t["A2"]) / t["tree"]))
PY
grep -E "^(8bit|fp32) " "$R/kernels_1b.log" | cut -c1-160
