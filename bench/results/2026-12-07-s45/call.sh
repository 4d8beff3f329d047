#!/usr/bin/env bash
# Session 45's device calls (carry .tri/1 and .whl): session 44's call1.sh (its parts pair, route, train39; that
# file says what each measures), the pair's times now paired (bench/timing.py: every tile, the route and the
# unfused step call by call in turn), and two parts more:
#   labels    under 3.6, v47 (the route's tile at 4096-16384 tokens) timed as a label beside the route at 4096
#             tokens, once a function at a time (do_bench, as session 44) and once paired: session 44's labels
#             read up to 15% above the route for the same kernel; if paired timing closes the gap, it was the
#             method (the clocks between one function's samples and the next's), not the kernel
#   (PAIR_TWINS, default "--plain --tall", names the pair's twins timed beside it; "" for none)
#   exact39   the GPU exactness tests of the Gluon route and the Triton kernels under 3.9 (3.9 as the device's
#             Triton needs them first), as many as the budget allows; the cases passed in passed39.txt
# Sourced (session 46's call.sh), it defines the parts and runs nothing.
source bench/device_call.sh
SHAPES=${SHAPES:-4096x14336,28672x8192}
under36() { PYTHONPATH=$(echo "${PYTHONPATH:-}" | tr : "\n" | grep -v tri_site | paste -sd:) "$@"; }
part_pair() {
  ( source bench/triton_carry.sh use
    python3 -c "import triton; print('pair under', triton.__version__)"
    local args="--shapes $SHAPES --tokens ${TOKENS:-1024,2048,4096,16384} --stages 4 ${PAIR_TWINS---plain --tall}" ran
    timeout "$(budget 200)" python3 bench/pair_tile.py --warm --warm-s "${WARM_S:-150}" $args >"$R/pair_warm.log" 2>&1 &
    local warming=$!
    timeout "$(budget 170)" python3 bench/pair_tile.py --check --rules adamw >"$R/pair_check.log" 2>&1
    echo "pair check rc=$?"; grep -E "FAILED|Error|error" "$R/pair_check.log" | head -8 | cut -c1-200
    echo "ok cases: $(grep -c ' ok$' "$R/pair_check.log")"; grep "clusters" "$R/pair_check.log" | cut -c1-150
    wait $warming; echo "pair warm rc=$?"; grep "^warm" "$R/pair_warm.log"
    ran=$(grep -oE "^warm [0-9]+: rc=0" "$R/pair_warm.log" | sed -E "s/warm ([0-9]+).*/\1/" | paste -sd,)
    echo "timing tiles: ${ran:-none}"
    if [ -n "$ran" ]; then
      timeout "$(budget 300)" python3 bench/pair_tile.py $args --paired --only "$ran" >"$R/pair_time.log" 2>&1
      echo "pair time rc=$?"; grep -vE "Warning|warn_once" "$R/pair_time.log" | tail -14 | cut -c1-170
    fi )
}
part_route() {
  for round in 1 2; do
    for v in 36 39; do
      ( if [ $v = 39 ]; then source bench/triton_carry.sh use; fi
        run=(timeout "$(budget 90)" python3 bench/kernels.py --precision fp32 --rounds 3 --configs none
             --shapes $SHAPES --tokens 1024,4096,16384 --out "$R/route${v}_$round.json")
        if [ $v = 36 ]; then under36 "${run[@]}"; else "${run[@]}"; fi >"$R/route${v}_$round.log" 2>&1
        echo "route $v round $round rc=$?"; grep -E "^fp32" "$R/route${v}_$round.log" | cut -c1-130 )
    done
  done
}
part_train39() {
  ( source bench/triton_carry.sh use
    A8="--models llama-8b --tokens 1x2048 --steps 5"
    train r8t39 90 - --methods forge_8bit+cl+graph $A8
    train fo8t39 70 - --methods flashoptim+cl $A8 )
}
part_labels() {
  local v47=wsf_128x128x64_st4_w8_rows8_mma96_r128_sl_cur_gb1
  for mode in sequential paired; do
    under36 timeout "$(budget 60)" python3 bench/kernels.py --precision fp32 --rounds 2 --shapes 28672x8192,4096x14336 \
      --tokens 4096 --configs $v47 $([ $mode = paired ] && echo --paired) --out "$R/labels_$mode.json" \
      >"$R/labels_$mode.log" 2>&1
    echo "labels $mode rc=$?"; kern_table "$R/labels_$mode.json"
  done
}
part_exact39() {
  ( source bench/triton_carry.sh use
    timeout -s INT -k 20 "$(budget 400)" python3 -m pytest -m "exactness or gpu" -q -rfEp -p no:cacheprovider \
      -W ignore::DeprecationWarning -n 12 tests/test_gpu_gluon.py tests/test_gpu_exactness.py >"$R/exact39.log" 2>&1
    echo "exact39 rc=$?"; sed -n 's/^PASSED //p' "$R/exact39.log" | LC_ALL=C sort -u >"$R/passed39.txt"
    grep -E "^FAILED|^ERROR| passed| failed" "$R/exact39.log" | cut -c1-200 | tail -8 )
}
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0
run_parts pair,route,train39
exit 0
