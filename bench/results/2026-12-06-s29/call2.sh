#!/usr/bin/env bash
# Session 29's second call (carry .whl, which holds transformers-5.18.0 and huggingface_hub-1.33.0 beside
# flashoptim and xdist): the device's transformers 5.17 builds an explicit causal mask and repeats the k/v
# heads while a CUDA stream captures (forge_num/graphs.py's docstring); 5.18 does not. With 5.18 first on
# PYTHONPATH:
#   check    pytest -m gpu tests/test_gpu_graphs.py (its new bf16-attention case runs under 5.18) beside
#            diag5.py (the tiny Llama's captured gradients against eager)
#   train    the captured steps beside flashoptim+cl and torch AdamW AMP at 1B 4x1024, 3B 4x1024 (profiled),
#            8B 1x2048 (8bit against flashoptim only), then 1B 1x2048 and 3B 1x1024; checkpointing on
set -uo pipefail
PART=${PART:-check,train}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s29; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl \
  .whl/transformers-5.18.0-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
export PYTHONPATH=/tmp/site
if ! python3 -c "import transformers; transformers.LlamaConfig" >>"$R/install.log" 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/huggingface_hub-1.33.0-py3-none-any.whl \
    >>"$R/install.log" 2>&1
fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers, huggingface_hub as h; print('torch', torch.__version__, 'triton', \
triton.__version__, 'transformers', transformers.__version__, transformers.__file__, 'hub', h.__version__)"
  date -u; } 2>&1 | tee "$R/env.txt"
part_check() {
  echo "== check $(date -u +%T)"
  ( cd bench/results/2026-12-06-s28 && timeout "$(budget 150)" python3 diag5.py >"$R/diag5.log" 2>&1 ) &
  timeout "$(budget 200)" python3 -m pytest -m gpu -v -rA -p no:cacheprovider -n 8 tests/test_gpu_graphs.py \
    >"$R/check.log" 2>&1
  echo "check rc=$?"
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|bf16_attention" "$R/check.log" | cut -c1-300 | tail -20
  grep -E "^E  .*(Error|assert)" "$R/check.log" | sort | uniq -c | sort -rn | head -6 | cut -c1-300
  wait; echo "-- diag5"; grep -vE "^\s*$|Warning|warn" "$R/diag5.log" | cut -c1-300 | tail -12
}
train() {  # $1 tag, $2 seconds, the rest: train_step.py's arguments
  local tag=$1 secs=$2; shift 2
  echo "== $tag $(date -u +%T)"
  timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
    --steps 4 --budget-s "$(( $(budget "$secs") - 40 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;|profiled step" "$R/$tag.log" | cut -c1-260
}
M=forge_8bit+graph,flashoptim+cl,forge+graph,torch_adamw
part_train() {
  train train3b 200 --methods "$M" --models llama-3b --tokens 4x1024 --profile
  train train8b 110 --methods forge_8bit+graph,flashoptim+cl --models llama-8b --tokens 1x2048
  train train1b 110 --methods "$M" --models llama-1b --tokens 4x1024
  train train1b2k 110 --methods "$M" --models llama-1b --tokens 1x2048
  train train3b1k 120 --methods "$M" --models llama-3b --tokens 1x1024
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
