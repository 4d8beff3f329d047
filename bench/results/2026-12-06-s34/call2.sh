#!/usr/bin/env bash
# Session 34, call 2 (carry .whl), on call 1's warm machine.
#   ncusrc  the routed cursor at 14336x4096, 2048 tokens under ncu with the source page kept (item 2's diet)
#   train1b 1B 4x1024: forge_8bit+graph and forge_8bit+cl+graph beside flashoptim+cl (call 1: +cl+graph 0.139 s)
#   kern16k the K-block-128 cursor beside the Gluon default at 16384 tokens
PART=${PART:-ncusrc,train1b,kern16k}
source bench/device_call.sh
call_begin
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
K128=ws8_64x128x128_st3_w16_rows16_mma96_r96_sl_cur
DEFAULT=ws8_64x128x64_st4_w8_rows16_mma104_r128
part_ncusrc() {
  echo "== ncusrc $(date -u +%T)"
  timeout "$(budget 120)" ncu --clock-control none --profile-from-start off -k regex:fused_linear_update_q8_ws \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats \
    --import-source yes -o "$R/cur_k2048" \
    python3 bench/ncu_probe.py --shape 14336x4096 --tokens 2048 --precision 8bit --configs "$CUR" >"$R/ncu.log" 2>&1
  echo "ncu rc=$?"
  ncu -i "$R/cur_k2048.ncu-rep" --page source --csv --print-source cuda,sass 2>/dev/null | gzip >"$R/cur_k2048_source.csv.gz"
  ncu -i "$R/cur_k2048.ncu-rep" --page details >"$R/cur_k2048_details.txt" 2>&1
  rm -f "$R/cur_k2048.ncu-rep"; ls -la "$R"/cur_k2048*
  grep -E "Duration|Warp Cycles Per Issued|Issued Instructions  " "$R/cur_k2048_details.txt" | cut -c1-120 | head -4
}
part_train1b() {
  train train1b 150 - --methods forge_8bit+graph,forge_8bit+cl+graph,flashoptim+cl --models llama-1b --tokens 4x1024 --steps 5
}
part_kern16k() {
  echo "== kern16k $(date -u +%T)"
  timeout "$(budget 120)" python3 bench/kernels.py --precision 8bit --configs "$DEFAULT,$K128" --rounds 3 \
    --shapes 4096x14336,4096x4096 --tokens 16384 --out "$R/kern16k.json" >"$R/kern16k.log" 2>&1
  echo "kern16k rc=$?"; tail -8 "$R/kern16k.log" | cut -c1-200
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
