#!/usr/bin/env bash
# Session 32, call 1 (carry .whl): v41, the 8bit regime's Philox calls shared by pairs of elements (a stream
# revision: emulator/philox.py's 8bit table; kernels/gluon_q8.py's RAND_PAIRS).
#   bits    the new stream on the GPU: the Gluon 8bit tiles (paired, single calls at odd counter maps, pairs
#           off) against the Triton 8bit tile and the emulator; the Triton twins of the tables (both Philox
#           forms); the stochastic rounding's family test on the GPU; the 8bit exactness, gathered and tied
#           rows, training and captured-step cases
#   kern    the routed 8bit tiles at 2048 and 4096 tokens on Llama-8B's shapes, with the pairs
#           (FORGE_NUM_Q8_PAIRS=1) and without (=0, each element its own call), one process after the other
#   train8b 8B 1x2048: forge_8bit+graph beside flashoptim+cl (s31: 0.371 s against 0.350)
#   train3b 3B 4x1024: the same two (s31: 0.301 s against 0.292), with what time is left
set -uo pipefail
PART=${PART:-bits,kern,train8b,train3b}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/fn_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; git log --oneline -1; } 2>&1 | tee "$R/env.txt"
part_bits() {
  echo "== bits $(date -u +%T)"
  timeout "$(budget 80)" python3 -m pytest -q -rfE -p no:cacheprovider -n 6 -m "gpu or exactness or statistical" \
    tests/test_interpreter_rounding.py tests/test_statistical_rounding.py tests/test_gathered_rows.py \
    tests/test_tied_rows.py >"$R/bits_tables.log" 2>&1
  echo "bits (tables, rows) rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/bits_tables.log" | cut -c1-300 | tail -8
  FORGE_NUM_TEST_Q8_ROUTED=1 timeout "$(budget 150)" python3 -m pytest -q -rfE -p no:cacheprovider -n 6 \
    -m "gpu or exactness" \
    tests/test_gpu_gluon.py tests/test_gpu_exactness.py tests/test_gpu_training.py tests/test_gpu_graphs.py \
    -k "8bit or q8" >"$R/bits_8bit.log" 2>&1
  echo "bits (8bit kernels, training, graphs) rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/bits_8bit.log" | cut -c1-300 | tail -8
  cat "$R"/bits_*.log | grep -E "^E  .*(Error|assert)" | sort | uniq -c | sort -rn | head -4 | cut -c1-300
}
kern() {  # $1 tag, $2 FORGE_NUM_Q8_PAIRS
  FORGE_NUM_Q8_PAIRS=$2 timeout "$(budget 60)" python3 bench/kernels.py --precision 8bit \
    --shapes 4096x14336,14336x4096 --tokens 2048,4096 --out "$R/kern_$1.json" >"$R/kern_$1.log" 2>&1
  echo "kern $1 (FORGE_NUM_Q8_PAIRS=$2) rc=$?"
}
part_kern() {
  echo "== kern $(date -u +%T)"
  kern pairs_a 1; kern single 0
  python3 - "$R" <<'PY'
import json, os, sys
runs = {}
for tag in ("pairs_a", "single", "pairs_b"):
    p = os.path.join(sys.argv[1], f"kern_{tag}.json")
    if os.path.exists(p):
        runs[tag] = {(r["M"], r["N"], r["K"]): r for r in json.load(open(p))["rows"]}
print(f"{'shape':>11s} {'K':>5s} {'pairs':>8s} {'single':>8s} {'ratio':>8s} {'unfused':>8s} {'floor':>7s}")
for key, r0 in runs.get("single", {}).items():
    a = runs.get("pairs_a", {}).get(key)
    fa = a["forge_ms"] if a else float("nan")
    print(f"{key[0]:>5d}x{key[1]:<5d} {key[2]:5d} {fa:8.3f} {r0['forge_ms']:8.3f} {fa / r0['forge_ms']:8.3f} "
          f"{r0['unfused_ms']:8.3f} {r0['floor_ms']:7.3f}")
PY
}
part_train8b() {
  echo "== train8b $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget 110)" python3 bench/train_step.py --checkpointing on --warmup 3 --steps 4 \
    --budget-s "$(( $(budget 110) - 20 ))" --out "$R/train8b.json" --methods forge_8bit+graph,flashoptim+cl \
    --models llama-8b --tokens 1x2048 >"$R/train8b.log" 2>&1
  echo "train8b rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/train8b.log" | cut -c1-200
}
part_train3b() {
  echo "== train3b $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget 130)" python3 bench/train_step.py --checkpointing on --warmup 3 --steps 4 \
    --budget-s "$(( $(budget 130) - 20 ))" --out "$R/train3b.json" --methods forge_8bit+graph,flashoptim+cl \
    --models llama-3b --tokens 4x1024 >"$R/train3b.log" 2>&1
  echo "train3b rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/train3b.log" | cut -c1-200
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
