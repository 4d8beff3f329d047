#!/usr/bin/env bash
# Session 44's second device call (carry .tri/1 and .whl). The first (session 43's call1.sh, parts pair, tiles36,
# route39) hung in the pair's timing: its plain twin, first run with several tiles a cluster. Fixed since (no
# shared release without the multicast); this call, under Triton 3.9:
#   warm   bench/pair_tile.py --warm: each timed tile (st4, its plain twin, TALL_PAIR) and the route compiled and
#          run once on the timed problems, one process each, a tile still running after WARM_S killed (hung)
#   check  beside it, --check for AdamW only (every twin; two cases now of several tiles a cluster)
#   time   the tiles warm found to run, against the route, the unfused step and the floor
source bench/device_call.sh
bash bench/triton_carry.sh receive 1 | tail -1
bash bench/triton_carry.sh install >/dev/null || exit 1
call_begin
source bench/triton_carry.sh use
python3 -c "import triton; print('pair under', triton.__version__)"
ARGS="--shapes ${SHAPES:-4096x14336,28672x8192,8192x8192} --tokens ${TOKENS:-1024,2048,4096,16384} --stages 4 --plain --tall"
timeout "$(budget 200)" python3 bench/pair_tile.py --warm --warm-s "${WARM_S:-150}" $ARGS >"$R/pair_warm.log" 2>&1 &
warming=$!
timeout "$(budget 170)" python3 bench/pair_tile.py --check --rules adamw >"$R/pair_check.log" 2>&1
echo "pair check rc=$?"; grep -E "FAILED|Error|error" "$R/pair_check.log" | head -8 | cut -c1-200
echo "ok cases: $(grep -c ' ok$' "$R/pair_check.log")"; grep "clusters" "$R/pair_check.log" | cut -c1-150
wait $warming; echo "pair warm rc=$?"; grep "^warm" "$R/pair_warm.log"
ran=$(grep -oE "^warm [0-9]+: rc=0" "$R/pair_warm.log" | sed -E "s/warm ([0-9]+).*/\1/" | paste -sd,)
echo "timing tiles: ${ran:-none}"
if [ -n "$ran" ]; then
  timeout "$(budget 300)" python3 bench/pair_tile.py $ARGS --only "${ran}" >"$R/pair_time.log" 2>&1
  echo "pair time rc=$?"; grep -vE "Warning|warn_once" "$R/pair_time.log" | tail -14 | cut -c1-170
fi
call_end
exit 0
