#!/usr/bin/env bash
# Session 31, call 2 (carry .whl): v38, the 8bit Gluon tiles that stage the next sub-tiles' state by TMA
# (gluon_q8.Q8WSConfig(stage_state=True): "stg" labels), and the cursor with four operand stages (call 1: 0.89-0.93x
# the routed tiles at 3072 and 4096 tokens).
#   bits     the staged tiles' bits (tests/test_gpu_gluon.py: their 16 cases each against the Triton 8bit tile and
#            the emulator, and the edges test: tiles past M and N, walks, one state)
#   kern     the routed tiles (default, sixteen-warp, cursor), the four-stage cursor and both staged tiles at 1024,
#            2048 and 4096 tokens on Llama-8B's three large shapes
#   train8b  8B 1x2048: forge_8bit+graph routed beside flashoptim+cl, then with the best tile at 2048 forced
#            (FORGE_NUM_GLUON_Q8=<label>; a staged tile only if its bits passed)
#   train1b  1B 4x1024: forge_8bit+graph routed, then with the best tile at 4096 forced
#   ncu      the best staged tile at 14336x4096, 2048 tokens: issue rate, stalls, by SASS line
set -uo pipefail
PART=${PART:-bits,kern,train8b,train1b,ncu}
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
DEF=ws8_64x128x64_st4_w8_rows16_mma104_r128
WIDE=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
CUR4=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
CUR4S=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_stg
DEFS=ws8_64x128x64_st4_w8_rows16_mma104_r128_stg
BITS_OK=0
part_bits() {
  echo "== bits $(date -u +%T)"
  timeout "$(budget 130)" python3 -m pytest -v -rA -p no:cacheprovider -n 6 tests/test_gpu_gluon.py \
    -k "(8bit and stg) or staged" >"$R/bits.log" 2>&1
  local rc=$?; echo "bits rc=$rc"; [ $rc = 0 ] && BITS_OK=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/bits.log" | cut -c1-300 | tail -8
  grep -E "^E  .*(Error|assert)" "$R/bits.log" | sort | uniq -c | sort -rn | head -4 | cut -c1-300
}
part_kern() {
  echo "== kern $(date -u +%T)"
  timeout "$(budget 170)" python3 bench/kernels.py --precision 8bit --configs "$DEF,$WIDE,$CUR,$CUR4,$CUR4S,$DEFS" \
    --shapes 4096x14336,14336x4096,4096x4096 --tokens 1024,2048,4096 --out "$R/kern.json" >"$R/kern.log" 2>&1
  echo "kern rc=$?"
  python3 - "$R/kern.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
labels = list(rows[0]["per_label_ms"])
short = {l: l.replace("ws8 64x128x64 ", "").replace(" rows16", "") for l in labels}
print("ms          " + "".join(f"{short[l][:22]:>24s}" for l in labels))
for r in rows:
    print(f"{r['M']}x{r['N']} K={r['K']:<5d}" + "".join(f"{r['per_label_ms'][l]:24.3f}" for l in labels))
PY
}
best_at() {  # $1 tokens: the label with the least summed time over the shapes at those tokens ('_' for ' ')
  python3 - "$R/kern.json" "$1" "$BITS_OK" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["K"] == int(sys.argv[2])]
tot = {}
for r in rows:
    for l, ms in r["per_label_ms"].items():
        if sys.argv[3] == "1" or "stg" not in l:
            tot[l] = tot.get(l, 0) + ms
print(min(tot, key=tot.get).replace(" ", "_"))
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
  train train8b_routed 110 - --methods forge_8bit+graph,flashoptim+cl --models llama-8b --tokens 1x2048
  local best; best=$(best_at 2048); echo "best at 2048: $best"
  train train8b_best 70 "$best" --methods forge_8bit+graph --models llama-8b --tokens 1x2048
}
part_train1b() {
  train train1b_routed 50 - --methods forge_8bit+graph --models llama-1b --tokens 4x1024
  local best; best=$(best_at 4096); echo "best at 4096: $best"
  train train1b_best 50 "$best" --methods forge_8bit+graph --models llama-1b --tokens 4x1024
}
part_ncu() {
  echo "== ncu $(date -u +%T)"
  local cfg=$CUR4S; [ $BITS_OK = 1 ] || { echo "ncu skipped: the staged bits did not pass"; return; }
  timeout "$(budget 90)" ncu --clock-control none --profile-from-start off -k regex:fused_linear_update_q8_ws \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters \
    --section InstructionStats --import-source no -o "$R/stg_k2048" \
    python3 bench/ncu_probe.py --shape 14336x4096 --tokens 2048 --precision 8bit --configs "$cfg" >"$R/ncu.log" 2>&1
  echo "ncu rc=$?"; tail -2 "$R/ncu.log"
  ncu -i "$R/stg_k2048.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip >"$R/stg_k2048_sass.csv.gz"
  ncu -i "$R/stg_k2048.ncu-rep" --page details >"$R/stg_k2048_details.txt" 2>&1
  rm -f "$R"/*.ncu-rep
  grep -E "Duration|Warp Cycles Per Issued|Issued Instructions  " "$R/stg_k2048_details.txt" | cut -c1-120 | head -6
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
