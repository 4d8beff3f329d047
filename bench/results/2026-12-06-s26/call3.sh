#!/usr/bin/env bash
# Session 26's third call: the captured step (forge_num.capture_step) on a GPU. Carry .whl. Call 3 ran
# PART=graphs with the tests as they were then; for the next session: PART=diag,graphs,train.
#   diag     bench/results/2026-12-06-s26/diag_graphs.py: eager against eager, slotted against eager and
#            captured against eager, with SDPA and with eager attention (call 3's seven differing cases)
#   graphs   tests/test_gpu_graphs.py (captured training equals eager training bit for bit: fp32 and
#            8bit, the HF and chunked losses, narrow and wide models; the refused capture) and the step
#            slot of the default launch paths (tests/test_gpu_gluon.py -k step_slot), eight processes
#   train    1B at 1x1024: forge_8bit+graph and forge_8bit+cl+graph (the tied head's capturable path:
#            the embedding's dense gradient added to the head's, no token sort; added after call 3)
#            beside forge_8bit+cl and flashoptim+cl, with activation checkpointing and without (its
#            RNG-state stash inside a capture)
set -uo pipefail
PART=${PART:-graphs,train}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/call3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
part_diag() {
  echo "== diag $(date -u +%T)"
  timeout "$(budget 200)" python3 bench/results/2026-12-06-s26/diag_graphs.py >"$R/diag.log" 2>&1
  echo "diag rc=$?"; grep -E "first loss" "$R/diag.log" | cut -c1-240
}
part_graphs() {
  echo "== graphs $(date -u +%T)"
  timeout "$(budget 220)" python3 -m pytest -v -rA -p no:cacheprovider -n 8 tests/test_gpu_graphs.py \
    tests/test_gpu_gluon.py -k "graph or step_slot or host_read" >"$R/graphs.log" 2>&1
  echo "graphs rc=$?"; grep -cE " PASSED " "$R/graphs.log"
  grep -E "^(FAILED|ERROR)| FAILED | ERROR |passed|failed" "$R/graphs.log" | cut -c1-300 | tail -14
}
part_train() {
  echo "== train $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget 250)" python3 bench/train_step.py \
    --methods forge_8bit+graph,forge_8bit+cl+graph,forge_8bit+cl,flashoptim+cl --models llama-1b --tokens 1x1024 --checkpointing on,off \
    --warmup 3 --steps 4 --out "$R/train.json" >"$R/train.log" 2>&1
  echo "train rc=$?"
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
[ -f "$R/graphs.log" ] && grep -E "^E  .*(Error|assert)" "$R/graphs.log" | sort | uniq -c | sort -rn | head -8 | cut -c1-300
[ -f "$R/train.log" ] && grep -E "^(forge|flash)|error|Error" "$R/train.log" | cut -c1-220
exit 0
