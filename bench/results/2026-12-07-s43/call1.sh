#!/usr/bin/env bash
# Session 43's device call (carry .tri/1 and .whl: bench/triton_carry.sh's Triton 3.9 bundle, installed each call).
# Parts (PART picks them, in this order by default):
#   bits36  under the device's Triton 3.6: the routed fp32 and 8bit Gluon tiles bit for bit against the Triton
#           tile and the emulator (tests/test_gpu_gluon.py with FORGE_NUM_TEST_F32_ROUTED=1 and
#           FORGE_NUM_TEST_Q8_ROUTED=1): session 43's pin of each sub-tile's telemetry
#           (gluon_q8.add_subtile_telemetry) changes every Gluon epilogue's code
#   pair    under 3.9: bench/pair_tile.py --check (the pair tile bit for bit against gluon_f32's grouped default,
#           every rule, its twins, TALL_PAIR) while --warm compiles the timed tiles in parallel, then AdamW times
#           against the route, the unfused step and the floor (4 and 6 stages, the plain twin, TALL_PAIR) at
#           1024-16384 tokens
#   ab36    under 3.6: the route's AdamW times with the pin and without (unpin.py: the pin's two calls replaced in this
#           copy by the sums they replaced, as at 4a5cf67, then put back), fp32 and 8bit, alternated twice
#   quad    under 3.9: bench/quad_mainloop.py, the 2x2 cluster's dW mainloop (both operands multicast): --check
#           (bits against the sm_90 model and the pair's mainloop, slots reused), then its times beside the pair's
#           mainloop (multicast_mainloop.two_cta_dw) and cuBLAS
#   tiles36 under 3.6: v47 against the 16-row one-buffer tile (v45b) and its two-buffer, three-stage twin at 4096
#           and 16384 tokens: with the pin their AdamW spills nothing (200 and 212 B before), the spills that made
#           v47 win by up to 9% in session 39
#   route39 under 3.9: the fp32 route's times (no fp32 tile spills under 3.9 with the pin)
#   staged  under 3.9: the pair's staged twin (v46's epilogue) at 512-1024 tokens
PART=${PART:-bits36,pair,ab36,quad,tiles36,route39,staged}
bash bench/triton_carry.sh receive 1 | tail -1
bash bench/triton_carry.sh install || exit 1
source bench/device_call.sh
call_begin
SHAPES=4096x14336,28672x8192,8192x8192
HERE=bench/results/2026-12-07-s43
under36() { PYTHONPATH=$(echo "${PYTHONPATH:-}" | tr : "\n" | grep -v tri_site | paste -sd:) "$@"; }
part_bits36() {
  ( under36 python3 -c "import triton; print('bits under', triton.__version__)"
    FORGE_NUM_TEST_F32_ROUTED=1 FORGE_NUM_TEST_Q8_ROUTED=1 under36 timeout "$(budget 240)" python3 -m pytest -q -m gpu \
      -n 8 tests/test_gpu_gluon.py -k "f32_split_kernel_gives or 8bit_gives" >"$R/bits36.log" 2>&1
    echo "bits under 3.6 rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$R/bits36.log" | cut -c1-200 | tail -6 )
}
part_pair() {
  ( source bench/triton_carry.sh use
    python3 -c "import triton; print('pair under', triton.__version__)"
    local time_args=${PAIR_TIME_ARGS:---tokens 1024,2048,4096,16384 --plain --tall}
    # the timed tiles' compiles, one process each, beside the check (call 1: one after another they took the part)
    timeout "$(budget 240)" python3 bench/pair_tile.py --warm $time_args >"$R/pair_warm.log" 2>&1 &
    local warming=$!
    timeout "$(budget 200)" python3 bench/pair_tile.py --check >"$R/pair_check.log" 2>&1
    echo "pair check rc=$?"; grep -E "FAILED|Error|error" "$R/pair_check.log" | head -8 | cut -c1-200
    grep -c " ok$" "$R/pair_check.log"
    wait $warming; echo "pair warm rc=$?"; grep "^warm" "$R/pair_warm.log"
    timeout "$(budget 200)" python3 bench/pair_tile.py $time_args >"$R/pair_time.log" 2>&1
    echo "pair time rc=$?"; grep -vE "Warning|warn_once" "$R/pair_time.log" | tail -22 | cut -c1-170 )
}
part_ab36() {
  # alternated, pin then before, twice: the second round finds both versions' compiles in the cache, and each run's
  # unfused step beside the route normalizes the host's drift between runs
  for round in 1 2; do
    for v in pin before; do
      if [ $v = before ]; then python3 $HERE/unpin.py || return; fi
      under36 timeout "$(budget $((round == 1 ? 120 : 60)))" python3 bench/kernels.py --precision fp32,8bit \
        --rounds 1 --configs none --shapes $SHAPES --tokens 1024,4096 --out "$R/ab36_${v}_$round.json" \
        >"$R/ab36_${v}_$round.log" 2>&1
      echo "route 3.6 $v round $round rc=$?"; grep -E "^(fp32|8bit)" "$R/ab36_${v}_$round.log" | cut -c1-130
      if [ $v = before ]; then python3 $HERE/unpin.py restore; fi
    done
  done
}
part_quad() {
  ( source bench/triton_carry.sh use
    timeout "$(budget 120)" python3 bench/quad_mainloop.py --check >"$R/quad_check.log" 2>&1
    echo "quad check rc=$?"; grep -E "K=|Error" "$R/quad_check.log" | cut -c1-160
    timeout "$(budget 120)" python3 bench/quad_mainloop.py --shapes 4096x14336,28672x8192 --tokens 1024,4096,16384 \
      >"$R/quad_time.log" 2>&1
    echo "quad time rc=$?"; grep -E "K=|Error" "$R/quad_time.log" | cut -c1-200 )
}
part_tiles36() {
  timeout "$(budget 70)" python3 bench/kernels.py --precision fp32 --rounds 2 --shapes $SHAPES --tokens 4096,16384 \
    --configs wsf_128x128x64_st4_w8_rows8_mma96_r128_sl_cur_gb1,wsf_128x128x64_st4_w8_rows16_mma96_r128_sl_cur_gb1,$(
             )wsf_128x128x64_st3_w8_rows16_mma96_r128_sl_cur \
    --out "$R/tiles36.json" >"$R/tiles36.log" 2>&1
  echo "tiles 3.6 rc=$?"; grep -E "^fp32|wsf" "$R/tiles36.log" | cut -c1-150 | tail -20
}
part_route39() {
  ( source bench/triton_carry.sh use
    timeout "$(budget 70)" python3 bench/kernels.py --precision fp32 --rounds 2 --configs none --shapes $SHAPES \
      --tokens 1024,4096 --out "$R/route39.json" >"$R/route39.log" 2>&1
    echo "route 3.9 rc=$?"; grep -E "^fp32" "$R/route39.log" | cut -c1-130 )
}
part_staged() {
  ( source bench/triton_carry.sh use
    timeout "$(budget 90)" python3 bench/pair_tile.py --tokens 512,768,1024 --stages 4 --staged \
      >"$R/pair_time_staged.log" 2>&1
    echo "pair time (staged) rc=$?"; grep -vE "Warning|warn_once" "$R/pair_time_staged.log" | tail -17 | cut -c1-150 )
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
