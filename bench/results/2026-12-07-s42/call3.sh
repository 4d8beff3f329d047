#!/usr/bin/env bash
# Session 42's third call (carry .tri/3 and .whl), on the warm machine of calls 1-2: Triton 3.9's last part, its
# install, then under 3.9 (PART picks parts, in this order by default):
#   probe    bench/multicast_mainloop.py --check (bits: the multicast cluster against its twin without, both
#            against the sm_90 tensor-core model), then its times against cuBLAS. First thing it shows: whether
#            the driver (580, CUDA 13.0) runs cubins of Triton 3.9's ptxas 13.4; if the check fails to launch, the
#            rest of the call runs with TRITON_PTXAS_BLACKWELL_PATH at the device's Triton 3.6's ptxas (12.8)
#   bits     the routed fp32 and 8bit tiles bit for bit against the Triton tile and the emulator
#            (tests/test_gpu_gluon.py, FORGE_NUM_TEST_F32_ROUTED=1, FORGE_NUM_TEST_Q8_ROUTED=1)
#   route    the fp32 route's times under 3.6 and under 3.9, one after the other (3.9 spills where 3.6 did not)
PART=${PART:-probe,bits,route}
bash bench/triton_carry.sh receive 3 | tail -1
bash bench/triton_carry.sh install || exit 1
source bench/device_call.sh
call_begin
PTXAS36=$(python3 -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/ptxas'))")
source bench/triton_carry.sh use
python3 -c "import triton; print('under', triton.__version__, triton.__file__)" | tee -a "$R/env.txt"
SHAPES=4096x14336,28672x8192,8192x8192
part_probe() {
  timeout "$(budget 150)" python3 bench/multicast_mainloop.py --check >"$R/probe_check.log" 2>&1
  local rc=$?
  echo "probe check rc=$rc"; grep -vE "Warning|warn_once" "$R/probe_check.log" | tail -8 | cut -c1-200
  if [ $rc -ne 0 ] && ! grep -q "bit for bit" "$R/probe_check.log"; then
    export TRITON_PTXAS_BLACKWELL_PATH=$PTXAS36
    echo "retrying with ptxas $PTXAS36" | tee -a "$R/env.txt"
    timeout "$(budget 150)" python3 bench/multicast_mainloop.py --check >"$R/probe_check2.log" 2>&1
    echo "probe check (ptxas 12.8) rc=$?"; grep -vE "Warning|warn_once" "$R/probe_check2.log" | tail -8 | cut -c1-200
  fi
  timeout "$(budget 150)" python3 bench/multicast_mainloop.py --shapes $SHAPES --tokens 1024,4096,16384 \
    >"$R/probe_time.log" 2>&1
  echo "probe time rc=$?"; grep -E "K=|Error" "$R/probe_time.log" | cut -c1-200
}
part_bits() {
  FORGE_NUM_TEST_F32_ROUTED=1 FORGE_NUM_TEST_Q8_ROUTED=1 timeout "$(budget 150)" python3 -m pytest -q -m gpu -n 4 \
    tests/test_gpu_gluon.py -k "f32_split_kernel_gives or 8bit_gives" >"$R/bits39.log" 2>&1
  echo "bits under 3.9 rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$R/bits39.log" | cut -c1-200 | tail -6
}
part_route() {
  for tv in 3.9 3.6; do
    ( if [ $tv = 3.6 ]; then PYTHONPATH=$(echo "$PYTHONPATH" | tr : "\n" | grep -v tri_site | paste -sd:); export PYTHONPATH; unset TRITON_PTXAS_BLACKWELL_PATH; fi
      python3 -c "import triton; print('route under', triton.__version__)"
      timeout "$(budget 80)" python3 bench/kernels.py --precision fp32 --rounds 2 --configs none --shapes $SHAPES \
        --tokens 512,1024,4096 --out "$R/route$tv.json" >"$R/route$tv.log" 2>&1
      echo "route $tv rc=$?"; grep -E "^fp32" "$R/route$tv.log" | cut -c1-130 )
  done
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
