#!/usr/bin/env bash
# The next device session's calls (carry .whl), written in session 40 after its calls: v49, the tile order
# (GROUP_M = 16, 32, 64 tile rows a group instead of 8; kernels/gluon_f32.py and gluon_q8.py say why, and
# bench/tile_order_model.py gives the bytes it predicts). PART picks parts, in this order by default; each prints
# a short table, the logs go to $OUT. About 520 s in all: split over two calls with PART if the budget is short.
#   exact    v49's tiles bit for bit: tests/test_gpu_gluon.py's fp32 and 8bit tile tests for the g16/g32/g64 labels
#   flake47  v47 (routed from 2304 tokens since session 40) forced in the flake case (the wide model trained eager
#            and captured, compared bit for bit; a captured launch reads its scalars from a step slot), 2 x 3 runs
#   order    the default 64x128 tile against its GROUP_M = 16, 32, 64 twins, 512-2560 tokens, issue 5's five
#            shapes, 3 interleaved rounds; v47 (routed from 2304) beside them
#   ncuorder ncu's DRAM bytes at 4096x14336 and 28672x8192, 1024 tokens: the default and its g16 and g32 twins
#            (the default read 949 MB at 4096x14336 in session 39-40; the model: 243 MB of it operands, 126
#            with g16, 67 with g32)
#   order46  v46 (routed at 256-895 tokens) against its g16 and g32 twins at 256, 512, 768 tokens, 3 rounds
#   q8order  the routed 8bit staged cursor against its g16 and g32 twins at 1024 and 2048 tokens on Llama-8B's
#            shapes, 3 rounds
#   train8b  Llama-8B 1x2048 8bit step (+cl+graph), routed and with the g32 staged cursor forced, FlashOptim beside
PART=${PART:-exact,flake47,order,ncuorder,order46,q8order,train8b}
source bench/device_call.sh
call_begin
D=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
DG() { echo "wsf_64x128x64_st4_w16_rows16_g$1_mma96_r96_sl_cur${2:-}"; }
T8=wsf_128x128x64_st4_w8_rows8_mma96_r128_sl_cur_gb1
MS=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ms
MSG() { echo "ws8_64x128x64_st4_w16_rows16_g$1_mma96_r96_sl_cur_ms"; }
SHAPES=4096x4096,14336x4096,4096x14336,8192x8192,28672x8192
part_exact() {
  timeout "$(budget 90)" python3 -m pytest -q -m gpu -n 4 tests/test_gpu_gluon.py \
    -k "(test_f32_split_kernel_gives or test_ws_kernel_8bit_gives) and (g16 or g32 or g64)" >"$R/exact.log" 2>&1
  echo "exact rc=$?"; grep -E "^FAILED|passed|failed" "$R/exact.log" | cut -c1-200 | tail -6
}
part_flake47() {
  FORGE_NUM_GLUON_F32=$T8 flake f32v47 2 3 --precision fp32
}
part_order() {
  timeout "$(budget 170)" python3 bench/kernels.py --precision fp32 --rounds 3 \
    --configs "$D,$(DG 16),$(DG 32),$(DG 64),$T8" --shapes $SHAPES --tokens 512,1024,1536,2048,2560 \
    --out "$R/order.json" >"$R/order.log" 2>&1
  echo "order rc=$?"; kern_table "$R/order.json"
}
part_ncuorder() {
  for S in 4096x14336 28672x8192; do
    for L in $D $(DG 16) $(DG 32); do
      echo "== ncu $S 1024 $L $(date -u +%T)"
      FORGE_NUM_GLUON_F32=$L timeout "$(budget 40)" ncu --clock-control none --profile-from-start off \
        --section SpeedOfLight --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
        python3 bench/results/2026-12-07-s38/ncu_mainloop.py $S 1024 >"$R/ncu_${S}_$L.txt" 2>&1
      grep -E "launcher.s kernel|Duration|DRAM Throughput|dram__bytes|lts__t_bytes" "$R/ncu_${S}_$L.txt" | head -6
    done
  done
}
part_order46() {
  timeout "$(budget 90)" python3 bench/kernels.py --precision fp32 --rounds 3 \
    --configs "${D}_ss2,$(DG 16 _ss2),$(DG 32 _ss2)" --shapes $SHAPES --tokens 256,512,768 \
    --out "$R/order46.json" >"$R/order46.log" 2>&1
  echo "order46 rc=$?"; kern_table "$R/order46.json"
}
part_q8order() {
  timeout "$(budget 90)" python3 bench/kernels.py --precision 8bit --rounds 3 --configs "$MS,$(MSG 16),$(MSG 32)" \
    --shapes 4096x4096,1024x4096,14336x4096,4096x14336 --tokens 1024,2048 --out "$R/q8order.json" >"$R/q8order.log" 2>&1
  echo "q8order rc=$?"; kern_table "$R/q8order.json"
}
part_train8b() {
  train train8b 110 - --methods forge_8bit+cl+graph,flashoptim+cl --models llama-8b --tokens 1x2048
  train train8b_g32 70 "$(MSG 32)" --methods forge_8bit+cl+graph --models llama-8b --tokens 1x2048
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
