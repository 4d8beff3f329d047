#!/usr/bin/env bash
# Session 40's device calls (carry .whl): the call session 39 planned (bench/NOTES.md, "Next device session
# (plan, written after session 39)"), with v48b (v47 hinted evict_first) added to f32tall. PART picks parts, in
# this order by default; each prints a short table, the logs go to $OUT:
#   lifetime  the lifetime fix (commit 01674e8): tests/test_gpu_graphs.py's dropped captured model (weak references
#             to its tensors, optimizer, step and graph dead after gc) and tests/test_lifetime.py on the GPU
#   flake     the fp32 flake case, v46 forced, in four processes (ran out of an H100's 80 GB before the fix)
#   f32ef     v48 (evict_first on the state's stream) beside the default and v46, at 256-2048 tokens, issue 5's
#             five shapes, 3 interleaved rounds (bench/NOTES.md, "Next device session (plan, written after
#             session 39)", item 4)
#   f32tall   v47 (8-row sub-tiles, no AdamW spill) and v48b (v47 with v48's hint) beside the routed one-buffer
#             128-row tile at 4096-16384 tokens
#   ncuef     ncu's DRAM bytes at 4096x14336, 1024 tokens, the default and v48 forced (1.63 GB before; 1.45 least)
#   exact     the new candidates and routes bit for bit: tests/test_gpu_gluon.py (every candidate tile against the
#             Triton tile and the emulator)
PART=${PART:-lifetime,flake,f32ef,f32tall,ncuef,exact}
source bench/device_call.sh
call_begin
D=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
T=wsf_128x128x64_st4_w8_rows16_mma96_r128_sl_cur_gb1
T8=wsf_128x128x64_st4_w8_rows8_mma96_r128_sl_cur_gb1
T8E=${T8}_ef
SHAPES=4096x4096,14336x4096,4096x14336,8192x8192,28672x8192
part_lifetime() {
  timeout "$(budget 80)" python3 -m pytest -q -m gpu tests/test_gpu_graphs.py -k dropped tests/test_lifetime.py \
    >"$R/lifetime.log" 2>&1
  echo "lifetime rc=$?"; grep -E "^FAILED|passed|failed|^E " "$R/lifetime.log" | cut -c1-200 | tail -6
}
part_flake() {
  FORGE_NUM_GLUON_F32=${D}_ss2 flake f32ss2 4 5 --precision fp32
}
part_f32ef() {
  timeout "$(budget 200)" python3 bench/kernels.py --precision fp32 --rounds 3 --configs "$D,${D}_ef,${D}_ss2,${D}_ss2_ef" \
    --shapes $SHAPES --tokens 256,512,1024,2048 --out "$R/f32ef.json" >"$R/f32ef.log" 2>&1
  echo "f32ef rc=$?"; kern_table "$R/f32ef.json"
}
part_f32tall() {
  timeout "$(budget 200)" python3 bench/kernels.py --precision fp32 --rounds 3 --configs "$T,$T8,$T8E" \
    --shapes $SHAPES --tokens 4096,8192,16384 --out "$R/f32tall.json" >"$R/f32tall.log" 2>&1
  echo "f32tall rc=$?"; kern_table "$R/f32tall.json"
}
part_ncuef() {
  for L in $D ${D}_ef; do
    echo "== ncu 1024 $L $(date -u +%T)"
    FORGE_NUM_GLUON_F32=$L timeout "$(budget 60)" ncu --clock-control none --profile-from-start off \
      --section SpeedOfLight --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
      python3 bench/results/2026-12-07-s38/ncu_mainloop.py 4096x14336 1024 >"$R/ncu1024_$L.txt" 2>&1
    echo "ncu rc=$?"
    grep -E "launcher.s kernel|Duration|DRAM Throughput|dram__bytes|lts__t_bytes" "$R/ncu1024_$L.txt" | head -12
  done
}
part_exact() {
  timeout "$(budget 200)" python3 -m pytest -q -m gpu -n 4 tests/test_gpu_gluon.py >"$R/exact.log" 2>&1
  echo "exact rc=$?"; grep -E "^FAILED|passed|failed" "$R/exact.log" | cut -c1-200 | tail -6
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
