#!/usr/bin/env bash
# Session 27's device calls (carry .whl). Parts, run in the order PART names them:
#   diag    bench/results/2026-12-06-s27/diag2.py: captured against eager training step by step (loss,
#           telemetry norm and clip coefficient, the scalars each update was given, the parameters whose
#           bits differ after each step), narrow and wide, fp32 and 8bit, SDPA's default and math backends
#   graphs  tests/test_gpu_graphs.py (SDPA's math backend since call 1) and the step slot tests, 8 processes
#   train   1B, checkpointing on, 1x1024: the captured 8bit and fp32 steps beside
#           flashoptim+cl and torch AdamW AMP (their eager twins: call 1 and session 26)
set -uo pipefail
PART=${PART:-diag,graphs,train}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s27; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
part_diag() {
  echo "== diag $(date -u +%T)"
  timeout "$(budget 200)" python3 bench/results/2026-12-06-s27/diag2.py >"$R/diag2.log" 2>&1
  echo "diag rc=$?"; grep -E " step |Error" "$R/diag2.log" | cut -c1-600
}
part_graphs() {
  echo "== graphs $(date -u +%T)"
  timeout "$(budget 200)" python3 -m pytest -v -rA -p no:cacheprovider -n 8 tests/test_gpu_graphs.py \
    tests/test_gpu_gluon.py -k "graph or step_slot or host_read" >"$R/graphs.log" 2>&1
  echo "graphs rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/graphs.log" | cut -c1-300 | tail -16
  grep -E "^E  .*(Error|assert)" "$R/graphs.log" | sort | uniq -c | sort -rn | head -6 | cut -c1-300
}
part_train() {
  echo "== train $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget 330)" python3 bench/train_step.py \
    --methods forge_8bit+graph,flashoptim+cl,forge+graph,torch_adamw --models llama-1b \
    --tokens 1x1024 --checkpointing on --warmup 3 --steps 4 --out "$R/train.json" >"$R/train.log" 2>&1
  echo "train rc=$?"; grep -E "^(forge|flash|torch)|rror" "$R/train.log" | cut -c1-220
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
