#!/usr/bin/env bash
# Session 36's third device call (carry .whl):
#   stress   bench/results/2026-12-06-s36/stress.py: each Gluon split tile (8bit and fp32) repeated from fixed
#            inputs at down_proj's shapes, 1024 tokens, against its own first result: nondeterminism on its own?
#   f32bits  the staged fp32 tiles' GPU tests again (call 2: SGD without momentum failed to compile: an absent
#            state's descriptor was None)
#   f32mid   the staged tiles beside the default at 512 and 768 tokens (call 2 measured 256, 1024, 2048)
PART=${PART:-stress,f32bits,f32mid}
source bench/device_call.sh
call_begin
DEF=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
part_stress() {  # one process, then four at once (the flake came with several processes on the GPU)
  timeout "$(budget 150)" python3 bench/results/2026-12-06-s36/stress.py 60 >"$R/stress.log" 2>&1
  echo "stress rc=$?"; grep -v Warning "$R/stress.log" | cut -c1-300 | tail -30
  for p in 1 2 3 4; do
    timeout "$(budget 100)" python3 bench/results/2026-12-06-s36/stress.py 30 8bit >"$R/stress4_$p.log" 2>&1 &
  done
  wait
  echo "== four at once"; grep -h "differ" "$R"/stress4_*.log | cut -c1-300
}
part_f32bits() {
  timeout "$(budget 120)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py -k "f32 and ss" >"$R/f32bits.log" 2>&1
  echo "f32bits rc=$?"; grep -E "^FAILED|passed|failed" "$R/f32bits.log" | cut -c1-200 | tail -6
}
part_f32mid() {
  timeout "$(budget 120)" python3 bench/kernels.py --precision fp32 --rounds 2 \
    --configs "$DEF,${DEF}_ss2,${DEF}_gb1_ss3" --shapes 4096x14336,14336x4096,4096x4096 \
    --tokens 256,512,768,1024 --out "$R/f32mid.json" >"$R/f32mid.log" 2>&1
  echo "f32mid rc=$?"; kern_table "$R/f32mid.json"
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
