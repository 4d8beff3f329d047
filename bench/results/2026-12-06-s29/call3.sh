#!/usr/bin/env bash
# Session 29's third call (carry .whl): SDPA's attention eager against replayed (attn_capture.py), then the
# captured steps with every method's attention held to the backend whose replay was fastest with enable_gqa
# (train_step.py --sdpa): 3B 4x1024 (profiled), 8B 1x2048, 1B 4x1024; checkpointing on, transformers 5.18.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s29; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl \
  .whl/transformers-5.18.0-py3-none-any.whl .whl/huggingface_hub-1.33.0-py3-none-any.whl >>"$R/install.log" 2>&1
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
echo "== attn $(date -u +%T)"
timeout "$(budget 120)" python3 bench/results/2026-12-06-s29/attn_capture.py >"$R/attn.log" 2>&1
echo "attn rc=$?"; grep -vE "^\s*$|[Ww]arn" "$R/attn.log" | cut -c1-200
BEST=$(awk '/enable_gqa eager/ {for (i = 1; i <= NF; i++) if ($i == "replay") print $(i + 1), $1}' "$R/attn.log" \
  | sort -n | head -1 | awk '{print $2}')
case "$BEST" in CUDNN_ATTENTION) SDPA=cudnn;; FLASH_ATTENTION) SDPA=flash;; EFFICIENT_ATTENTION) SDPA=efficient;;
  *) SDPA=default;; esac
echo "fastest replayed with enable_gqa: ${BEST:-none} -> --sdpa $SDPA"
train() {  # $1 tag, $2 seconds, the rest: train_step.py's arguments
  local tag=$1 secs=$2; shift 2
  echo "== $tag $(date -u +%T)"
  timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 --sdpa "$SDPA" \
    --steps 4 --budget-s "$(( $(budget "$secs") - 40 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;|profiled step" "$R/$tag.log" | cut -c1-260
}
M=forge_8bit+graph,flashoptim+cl,forge+graph,torch_adamw
train train3b 200 --methods "$M" --models llama-3b --tokens 4x1024 --profile
train train8b 110 --methods forge_8bit+graph,flashoptim+cl --models llama-8b --tokens 1x2048
train train1b 110 --methods "$M" --models llama-1b --tokens 4x1024
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
