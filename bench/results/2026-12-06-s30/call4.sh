#!/usr/bin/env bash
# Session 30, call 4 (carry .whl), v35 (the cursor tile routed at 2048-4095 tokens): the 8B 1x2048 step on
# another host (flashoptim+cl issues its step from the host: its time follows the host's CPU), then issue 5's
# largest micro-batch, 8x2048, captured, never measured so.
#   train8b  8B 1x2048: forge_8bit+graph beside flashoptim+cl
#   big1b    1B 8x2048, the four methods
#   big3b    3B 8x2048, forge_8bit+graph beside flashoptim+cl
set -uo pipefail
PART=${PART:-train8b,big1b,big3b}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s30; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; git rev-parse HEAD 2>/dev/null; date -u; } 2>&1 | tee "$R/env.txt"
train() {  # $1 tag, $2 seconds, the rest: train_step.py's arguments
  local tag=$1 secs=$2; shift 2
  echo "== $tag $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
    --steps 4 --budget-s "$(( $(budget "$secs") - 15 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/$tag.log" | cut -c1-200
}
part_train8b() { train train8b 110 --methods forge_8bit+graph,flashoptim+cl --models llama-8b --tokens 1x2048; }
part_big1b() { train big1b 170 --methods forge_8bit+graph,flashoptim+cl,forge+graph,torch_adamw --models llama-1b \
  --tokens 8x2048; }
part_big3b() { train big3b 170 --methods forge_8bit+graph,flashoptim+cl --models llama-3b --tokens 8x2048; }
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
