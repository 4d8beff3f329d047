#!/usr/bin/env bash
# The next session's first device call (written in session 32; carry .whl). NOTES "Next device session (plan,
# written after session 32)".
#   bits     every 8bit Gluon tile with v41's stream, the candidates included (session 32 ran the routed ones
#            only), and the K-block-128 cursor (twin_k_blocks where K is not a multiple of 128)
#   kern     the routed tiles beside the K-block-128 cursor at 2048, 3072 and 4096 tokens on Llama-8B's shapes
#   train8b  8B 1x2048: forge_8bit+graph routed, then with the K-block-128 cursor forced, beside flashoptim+cl
set -uo pipefail
PART=${PART:-bits,kern,train8b}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/fn_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
BK128=ws8_64x128x128_st3_w16_rows16_mma96_r96_sl_cur
part_bits() {
  echo "== bits $(date -u +%T)"
  timeout "$(budget 240)" python3 -m pytest -v -p no:cacheprovider -n 10 -m "gpu or exactness" tests/test_gpu_gluon.py \
    -k "8bit" >"$R/bits.log" 2>&1
  echo "bits rc=$?"
  grep -cE " PASSED " "$R/bits.log"; grep -E " (FAILED|ERROR) |passed|failed" "$R/bits.log" | cut -c1-300 | tail -8
}
part_kern() {
  echo "== kern $(date -u +%T)"
  timeout "$(budget 150)" python3 bench/kernels.py --precision 8bit --configs "$CUR,$DEEP,$BK128" \
    --shapes 4096x14336,14336x4096,4096x4096 --tokens 2048,3072,4096 --out "$R/kern.json" >"$R/kern.log" 2>&1
  echo "kern rc=$?"
  python3 - "$R/kern.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
labels = list(rows[0]["per_label_ms"])
print("ms          " + "".join(f"{l.replace('ws8 64x128x', '')[:22]:>24s}" for l in labels))
for r in rows:
    print(f"{r['M']}x{r['N']} K={r['K']:<5d}" + "".join(f"{r['per_label_ms'][l]:24.3f}" for l in labels))
PY
}
train() {  # $1 tag, $2 seconds, $3 FORGE_NUM_GLUON_Q8 (- for unset), the rest: train_step.py's arguments
  local tag=$1 secs=$2 flag=$3; shift 3
  echo "== $tag $(date -u +%T) FORGE_NUM_GLUON_Q8=$flag"
  ( [ "$flag" != - ] && export FORGE_NUM_GLUON_Q8=$flag
    PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
      --steps 4 --budget-s "$(( $(budget "$secs") - 20 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1 )
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/$tag.log" | cut -c1-200
}
part_train8b() {
  train train8b_routed 100 - --methods forge_8bit+graph,flashoptim+cl --models llama-8b --tokens 1x2048
  train train8b_bk128 70 "$BK128" --methods forge_8bit+graph --models llama-8b --tokens 1x2048
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
