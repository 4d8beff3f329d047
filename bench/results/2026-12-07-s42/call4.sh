#!/usr/bin/env bash
# Session 42's fourth call (carry .whl), on call 3's warm machine (Triton 3.9 in .tri_site): ncu on the multicast
# probe and its twin without multicast, 28672x8192 and 4096x14336 at 1024 and 4096 tokens: time, L2 read sectors
# and requests from the SMs, the fabric's share, DRAM reads. Prediction (NOTES, session 41): the multicast
# variant's L2 read sectors 0.67-0.70x the other's. PTXAS=<path> as call 3 found (empty: 3.9's own).
source bench/device_call.sh
call_begin
source bench/triton_carry.sh use
[ -n "${PTXAS:-}" ] && export TRITON_PTXAS_BLACKWELL_PATH=$PTXAS
python3 -c "import triton; print('under', triton.__version__)" | tee -a "$R/env.txt"
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum
ncu --query-metrics 2>/dev/null | grep -qE "^lts__t_requests_srcunit_tex_op_read " && M=$M,lts__t_requests_srcunit_tex_op_read.sum
for shape in 28672x8192 4096x14336; do
  echo "== ncu $shape"
  timeout "$(budget 150)" ncu --clock-control none -k regex:two_cta --metrics $M \
    python3 bench/multicast_mainloop.py --ncu --shapes $shape --tokens 1024,4096 >"$R/ncu_probe_$shape.txt" 2>&1
  echo "rc=$?"; grep -E "launched|gpu__time_duration|dram__|lts__|ERR" "$R/ncu_probe_$shape.txt" | sed 's/  */ /g' | head -32
done
call_end
exit 0
