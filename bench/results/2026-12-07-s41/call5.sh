#!/usr/bin/env bash
# Session 41's fifth call (carry .whl), on call 4's tree. PART picks parts, in this order by default.
#   mid     v46 (the streamed tile), its GROUP_M = 16 and 32 twins, its three-slot twin and the grouped default
#           at 512-1280 tokens, issue 5's five shapes, 3 interleaved rounds. The question: call 4's route ran
#           faster at 768 tokens (v46 grouped) than at 512 (v46) on three shapes, and v46 trailed the default at
#           1024 before either was grouped (1.02-1.07x, session 37): does the grouped v46 lead from 1024?
#   ncu     ncu's DRAM bytes and throughput for v46 on 28672x8192 at 512 and 768 tokens (why 512 is slower)
#   big     the route, the unfused step and the floor at 16384 tokens, 5 rounds (call 4's 3 rounds put the route
#           at 0.93-1.03x the unfused step there, session 40's 2 rounds at 1.01-1.03x on four shapes)
PART=${PART:-mid,ncu,big}
source bench/device_call.sh
call_begin
S2=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2
S2G() { echo "wsf_64x128x64_st4_w16_rows16_g$1_mma96_r96_sl_cur_ss2"; }
S3=wsf_64x128x64_st3_w16_rows16_mma96_r96_sl_cur_ss3
G16=wsf_64x128x64_st4_w16_rows16_g16_mma96_r96_sl_cur
SHAPES=4096x4096,14336x4096,4096x14336,8192x8192,28672x8192
part_mid() {
  timeout "$(budget 170)" python3 bench/kernels.py --precision fp32 --rounds 3 \
    --configs "$S2,$(S2G 16),$(S2G 32),$S3,$G16" --shapes $SHAPES --tokens 512,768,1024,1280 \
    --out "$R/mid.json" >"$R/mid.log" 2>&1
  echo "mid rc=$?"; kern_table "$R/mid.json"
}
part_ncu() {
  for K in 512 768; do
    echo "== ncu 28672x8192 $K $S2 $(date -u +%T)"
    FORGE_NUM_GLUON_F32=$S2 timeout "$(budget 40)" ncu --clock-control none --profile-from-start off \
      --section SpeedOfLight --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
      python3 bench/results/2026-12-07-s38/ncu_mainloop.py 28672x8192 $K >"$R/ncu_28672x8192_${K}.txt" 2>&1
    grep -E "launcher.s kernel|Duration|DRAM Throughput|dram__bytes|lts__t_bytes" "$R/ncu_28672x8192_${K}.txt" | head -6
  done
}
part_big() {
  timeout "$(budget 150)" python3 bench/kernels.py --precision fp32 --rounds 5 --configs none --shapes $SHAPES \
    --tokens 16384 --out "$R/big.json" >"$R/big.log" 2>&1
  echo "big rc=$?"; grep -E "^fp32" "$R/big.log" | cut -c1-130
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
