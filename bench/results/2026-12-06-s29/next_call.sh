#!/usr/bin/env bash
# The next session's first device call (written in session 29; carry .whl): the captured steps with
# forge_num.hf.one_sequence_per_row (train_step.py's default for +graph methods) beside the eager baselines,
# and the GPU test of a captured bf16 step with the model's own attention, checkpointed and not.
#   check    pytest -m gpu tests/test_gpu_graphs.py (16 cases), the device's own transformers (5.17)
#   train3b  3B 4x1024, profiled: the captured attention should read ~9.4 ms (22.5 in session 29)
#   train8b  8B 1x2048: forge_8bit+graph beside flashoptim+cl
#   train1b  1B 4x1024
set -uo pipefail
PART=${PART:-check,train3b,train8b,train1b}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s30; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
part_check() {
  echo "== check $(date -u +%T)"
  timeout "$(budget 200)" python3 -m pytest -m gpu -v -rA -p no:cacheprovider -n 8 tests/test_gpu_graphs.py \
    >"$R/check.log" 2>&1
  echo "check rc=$?"
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$R/check.log" | cut -c1-300 | tail -20
  grep -E "^E  .*(Error|assert)" "$R/check.log" | sort | uniq -c | sort -rn | head -6 | cut -c1-300
}
train() {  # $1 tag, $2 seconds, the rest: train_step.py's arguments
  local tag=$1 secs=$2; shift 2
  echo "== $tag $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
    --steps 4 --budget-s "$(( $(budget "$secs") - 40 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;|profiled step" "$R/$tag.log" | cut -c1-260
}
M=forge_8bit+graph,flashoptim+cl,forge+graph,torch_adamw
part_train3b() { train train3b 200 --methods "$M" --models llama-3b --tokens 4x1024 --profile; }
part_train8b() { train train8b 110 --methods forge_8bit+graph,flashoptim+cl --models llama-8b --tokens 1x2048; }
part_train1b() { train train1b 120 --methods "$M" --models llama-1b --tokens 4x1024; }
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
