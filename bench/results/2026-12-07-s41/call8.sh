#!/usr/bin/env bash
# Session 41's eighth call (carry .whl): where v46's extra L2 bytes at 512 tokens come from (NOTES, session 41,
# "Three staging slots at 512 tokens"). ncu's L2 sectors by source unit (the SMs' L1/TEX and TMA, or the other L2
# partition through the fabric) and by operation, for v46 and its st3 ss3 twin on 28672x8192 at 512 and 640 tokens.
# If the difference is fabric traffic, it is where tiles run against where their operands' lines are homed, not
# bytes the kernel asks for.
source bench/device_call.sh
call_begin
ncu --query-metrics 2>/dev/null | grep -E "^lts__t_" | cut -c1-120 >"$R/lts_metrics.txt"
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct
# the L2 breakdowns this ncu knows (a name it does not know would fail every run)
for m in lts__t_sectors_srcunit_tex lts__t_sectors_srcunit_ltcfabric lts__t_sectors_srcunit_tex_op_read \
         lts__t_sectors_srcunit_tex_op_write lts__t_sectors_op_read lts__t_sectors_op_write; do
  grep -qE "^$m( |$)" "$R/lts_metrics.txt" && M=$M,$m.sum
done
echo "metrics: $M"
for K in 512 640; do
  for L in wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 wsf_64x128x64_st3_w16_rows16_mma96_r96_sl_cur_ss3; do
    echo "== ncu 28672x8192 $K $L"
    FORGE_NUM_GLUON_F32=$L timeout "$(budget 40)" ncu --clock-control none --profile-from-start off --metrics $M \
      python3 bench/results/2026-12-07-s38/ncu_mainloop.py 28672x8192 $K >"$R/ncu_${K}_$L.txt" 2>&1
    echo "rc=$?"; grep -E "gpu__time_duration|dram__|lts__|ERR" "$R/ncu_${K}_$L.txt" | head -12
  done
done
grep -E "srcunit" "$R/lts_metrics.txt" | cut -c1-60 | head -20
call_end
exit 0
