#!/usr/bin/env bash
# Session 42's device calls with Triton 3.9 (carry .tri/1 and .whl: bench/triton_carry.sh, one part, installed
# each call), then
# under 3.9 with the host Triton 3.6's ptxas (PART picks parts, in this order by default):
#   probe    bench/multicast_mainloop.py --check (bits: the multicast cluster against its twin without, both
#            against the sm_90 tensor-core model), then its times against cuBLAS
#   pair     bench/pair_tile.py --check (the pair tile, the fp32 split tile on a cluster of two sharing x's blocks
#            by multicast, bit for bit against gluon_f32's grouped default, every rule), then its AdamW times
#            against the route, the unfused step and the floor, issue 5's five shapes at 1024-16384 tokens
#            (4 and 6 stages, and the 4-stage twin without multicast); the staged twin (v46's epilogue) at
#            512-1024 tokens
#   ncu      ncu on the pair tile, its plain twin and the route at 1024 tokens (28672x8192, 4096x14336), then on
#            the probe's two variants at 1024 and 4096: time, L2 bytes, read sectors (and requests) from the SMs,
#            the fabric's share, DRAM reads. Prediction (NOTES, session 41): the multicast variant's L2 read
#            sectors 0.67-0.70x the other's, its time 0.85-0.95x
#   bits     the routed fp32 and 8bit tiles bit for bit against the Triton tile and the emulator
#            (tests/test_gpu_gluon.py, FORGE_NUM_TEST_F32_ROUTED=1, FORGE_NUM_TEST_Q8_ROUTED=1)
#   route    the fp32 route's times under 3.6 and under 3.9, one after the other (3.9 spills where 3.6 did not)
PART=${PART:-probe,pair,ncu,route,bits}
bash bench/triton_carry.sh receive 1 | tail -1
bash bench/triton_carry.sh install || exit 1
source bench/device_call.sh
call_begin
source bench/triton_carry.sh use
python3 -c "import triton; print('under', triton.__version__, triton.__file__)" | tee -a "$R/env.txt"
SHAPES=4096x14336,28672x8192,8192x8192
part_probe() {
  timeout "$(budget 150)" python3 bench/multicast_mainloop.py --check >"$R/probe_check.log" 2>&1
  echo "probe check rc=$?"; grep -vE "Warning|warn_once" "$R/probe_check.log" | tail -8 | cut -c1-200
  [ "${PROBE_TIME:-1}" = 1 ] || return 0
  timeout "$(budget 120)" python3 bench/multicast_mainloop.py --shapes $SHAPES --tokens 1024,4096,16384 \
    >"$R/probe_time.log" 2>&1
  echo "probe time rc=$?"; grep -E "K=|Error" "$R/probe_time.log" | cut -c1-200
}
part_pair() {
  timeout "$(budget 100)" python3 bench/pair_tile.py --check >"$R/pair_check.log" 2>&1
  echo "pair check rc=$?"; grep -E "FAILED|Error|error" "$R/pair_check.log" | head -8 | cut -c1-200
  grep -c " ok$" "$R/pair_check.log"
  timeout "$(budget 150)" python3 bench/pair_tile.py ${PAIR_TIME_ARGS:---tokens 1024,2048,4096,16384 --plain} \
    >"$R/pair_time.log" 2>&1
  echo "pair time rc=$?"; grep -vE "Warning|warn_once" "$R/pair_time.log" | tail -22 | cut -c1-150
  timeout "$(budget 90)" python3 bench/pair_tile.py --tokens 512,768,1024 --stages 4 --staged \
    >"$R/pair_time_staged.log" 2>&1
  echo "pair time (staged) rc=$?"; grep -vE "Warning|warn_once" "$R/pair_time_staged.log" | tail -17 | cut -c1-150
}
part_ncu() {
  local m=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum
  m=$m,lts__t_sectors_srcunit_ltcfabric.sum
  ncu --query-metrics 2>/dev/null | grep -qE "^lts__t_requests_srcunit_tex_op_read " \
    && m=$m,lts__t_requests_srcunit_tex_op_read.sum
  # the pair tile (4 stages), its plain twin and the route at 1024 tokens: L2's bytes, the mechanism
  timeout "$(budget 120)" ncu --clock-control none -k regex:"pair_update|fused_linear_update_f32_ws" --metrics $m \
    python3 bench/pair_tile.py --ncu --stages 4 --plain --shapes 28672x8192,4096x14336 --tokens 1024 \
    >"$R/ncu_pair.txt" 2>&1
  echo "ncu pair rc=$?"; grep -E "launched|gpu__time_duration|dram__|lts__|ERR" "$R/ncu_pair.txt" | sed 's/  */ /g' \
    | head -40
  for shape in 28672x8192 4096x14336; do
    echo "== ncu probe $shape"
    timeout "$(budget 90)" ncu --clock-control none -k regex:two_cta --metrics $m \
      python3 bench/multicast_mainloop.py --ncu --shapes $shape --tokens 1024,4096 >"$R/ncu_probe_$shape.txt" 2>&1
    echo "rc=$?"; grep -E "launched|gpu__time_duration|dram__|lts__|ERR" "$R/ncu_probe_$shape.txt" | sed 's/  */ /g' \
      | head -28
  done
}
part_bits() {
  FORGE_NUM_TEST_F32_ROUTED=1 FORGE_NUM_TEST_Q8_ROUTED=1 timeout "$(budget 150)" python3 -m pytest -q -m gpu -n 4 \
    tests/test_gpu_gluon.py -k "f32_split_kernel_gives or 8bit_gives" >"$R/bits39.log" 2>&1
  echo "bits under 3.9 rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$R/bits39.log" | cut -c1-200 | tail -6
}
part_route() {
  for tv in 3.9 3.6; do
    ( if [ $tv = 3.6 ]; then PYTHONPATH=$(echo "$PYTHONPATH" | tr : "\n" | grep -v tri_site | paste -sd:)
        export PYTHONPATH; fi
      python3 -c "import triton; print('route under', triton.__version__)"
      timeout "$(budget 80)" python3 bench/kernels.py --precision fp32 --rounds 2 --configs none --shapes $SHAPES \
        --tokens 512,1024,4096 --out "$R/route$tv.json" >"$R/route$tv.log" 2>&1
      echo "route $tv rc=$?"; grep -E "^fp32" "$R/route$tv.log" | cut -c1-130 )
  done
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
