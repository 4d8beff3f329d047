#!/usr/bin/env bash
# Session 42's second call (carry .whl), under the device's Triton 3.6: ncu at 512 and 640 tokens on 28672x8192 for v46 and its st3 ss3 twin with L2's
# read requests beside its read sectors and the lookups' hits and misses (NOTES, session 41, call 8's hypothesis:
# L2 counts once the reads of one line that arrive together).
source bench/device_call.sh
call_begin
ncu --query-metrics 2>/dev/null | grep -E "^lts__t_(requests|sectors)_srcunit_tex" | cut -d' ' -f1 >"$R/lts_tex_metrics.txt"
M=gpu__time_duration.sum,dram__bytes_read.sum
for m in lts__t_requests_srcunit_tex_op_read lts__t_sectors_srcunit_tex_op_read \
         lts__t_sectors_srcunit_tex_op_read_lookup_hit lts__t_sectors_srcunit_tex_op_read_lookup_miss \
         lts__t_requests_srcunit_tex lts__t_sectors_srcunit_tex; do
  grep -qx "$m" "$R/lts_tex_metrics.txt" && M=$M,$m.sum
done
echo "metrics: $M"
for K in 512 640; do
  for L in wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 wsf_64x128x64_st3_w16_rows16_mma96_r96_sl_cur_ss3; do
    echo "== ncu 28672x8192 $K ${L#wsf_64x128x64_}"
    FORGE_NUM_GLUON_F32=$L timeout "$(budget 45)" ncu --clock-control none --profile-from-start off --metrics $M \
      python3 bench/results/2026-12-07-s38/ncu_mainloop.py 28672x8192 $K >"$R/ncu_${K}_$L.txt" 2>&1
    echo "rc=$?"; grep -E "gpu__time_duration|dram__|lts__|ERR" "$R/ncu_${K}_$L.txt" | sed 's/  */ /g' | head -8
  done
done
# the 8bit flake case (the 8bit Gluon route on, a Llama-1B-wide model trained eager and captured, compared bit
# for bit) if this is an H200: every H100 run clean since session 37's fix; NOTES asks for an H200's
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$gib" -gt 100000 ]; then FORGE_NUM_GLUON_Q8=1 flake q8route 4 6; else echo "an H100: no flake case"; fi
call_end
exit 0
