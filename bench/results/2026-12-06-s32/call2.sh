#!/usr/bin/env bash
# Session 32, call 2 (carry .whl), after call 1's bits: v41's steps and session 31's planned peaks.
#   train3b  3B 4x1024: forge_8bit+graph beside flashoptim+cl (s31: 0.301 s against 0.292 on a fast host)
#   peaks    1B 4x1024: forge_8bit+cl eager beside forge_8bit+cl+graph and flashoptim+cl (is the captured tied
#            step's 0.16 GiB above session 19's eager 6.16 GiB the capture's?), with the allocator's phases
#   ncusrc   the paired cursor at 14336x4096, 2048 tokens, under ncu with the Python lines: executed
#            instructions and stalls by source line
set -uo pipefail
PART=${PART:-train3b,peaks,ncusrc}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/fn_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
part_peaks() {
  echo "== peaks $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget 150)" python3 bench/train_step.py --checkpointing on --warmup 3 --steps 4 \
    --budget-s "$(( $(budget 150) - 15 ))" --memory-phases --out "$R/peaks.json" \
    --methods forge_8bit+cl,forge_8bit+cl+graph,flashoptim+cl --models llama-1b --tokens 4x1024 >"$R/peaks.log" 2>&1
  echo "peaks rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/peaks.log" | cut -c1-200
}
ncu_one() {  # $1 tag, $2 label, $3 tokens
  timeout "$(budget 100)" ncu --clock-control none --profile-from-start off -k regex:fused_linear_update_q8_ws \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats \
    --import-source yes -o "$R/$1" \
    python3 bench/ncu_probe.py --shape 14336x4096 --tokens "$3" --precision 8bit --configs "$2" >"$R/$1.log" 2>&1
  echo "$1 rc=$?"
  { ncu -i "$R/$1.ncu-rep" --page source --csv --print-source cuda,sass 2>/dev/null \
      || ncu -i "$R/$1.ncu-rep" --page source --csv --print-source sass; } | gzip >"$R/$1_source.csv.gz"
  ncu -i "$R/$1.ncu-rep" --page details >"$R/$1_details.txt" 2>&1
  rm -f "$R/$1.ncu-rep"
  grep -E "Duration|Warp Cycles Per Issued|Issued Instructions  " "$R/$1_details.txt" | cut -c1-120 | head -4
}
part_ncusrc() {
  echo "== ncusrc $(date -u +%T)"
  ncu_one cur_k2048 "$CUR" 2048
}
part_train3b() {
  echo "== train3b $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget 140)" python3 bench/train_step.py --checkpointing on --warmup 3 --steps 4 \
    --budget-s "$(( $(budget 140) - 20 ))" --out "$R/train3b.json" --methods forge_8bit+graph,flashoptim+cl \
    --models llama-3b --tokens 4x1024 >"$R/train3b.log" 2>&1
  echo "train3b rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/train3b.log" | cut -c1-200
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
