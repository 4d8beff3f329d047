#!/usr/bin/env bash
# Session 44's next device call (carry .tri/1 and .whl). Session 44's calls (session 43's call1.sh, parts pair,
# tiles36, route39) hung in the pair's timing: its plain twin, first run with several tiles a cluster. Fixed
# since (no shared release without the multicast). Parts (PART picks them, in this order by default):
#   pair      under Triton 3.9: bench/pair_tile.py --warm (each timed tile, st4, its plain twin, TALL_PAIR, and the
#             route compiled and run once on the timed problems, one process each, one still running after
#             WARM_S killed as hung) beside --check for AdamW (every twin; two cases of several tiles a
#             cluster), then the times of the tiles that ran against the route, the unfused step and the floor
#   route     the fp32 route under 3.6 and under 3.9, alternated twice, 3 rounds each, at 1024-16384 tokens: is
#             3.9's lead of session 44 (up to ~8% at 4096, two rounds, not alternated) real
#   train39   the 8B step at 1x2048 tokens, forge's 8bit regime and FlashOptim, under 3.9 (3.6's in session 38:
#             forge 0.913x FlashOptim's tokens/s)
source bench/device_call.sh
PART=${PART:-pair,route,train39}
bash bench/triton_carry.sh receive 1 | tail -1
bash bench/triton_carry.sh install >/dev/null || exit 1
call_begin
SHAPES=${SHAPES:-4096x14336,28672x8192}
under36() { PYTHONPATH=$(echo "${PYTHONPATH:-}" | tr : "\n" | grep -v tri_site | paste -sd:) "$@"; }
part_pair() {
  ( source bench/triton_carry.sh use
    python3 -c "import triton; print('pair under', triton.__version__)"
    local args="--shapes $SHAPES --tokens ${TOKENS:-1024,2048,4096,16384} --stages 4 --plain --tall" ran
    timeout "$(budget 200)" python3 bench/pair_tile.py --warm --warm-s "${WARM_S:-150}" $args >"$R/pair_warm.log" 2>&1 &
    local warming=$!
    timeout "$(budget 170)" python3 bench/pair_tile.py --check --rules adamw >"$R/pair_check.log" 2>&1
    echo "pair check rc=$?"; grep -E "FAILED|Error|error" "$R/pair_check.log" | head -8 | cut -c1-200
    echo "ok cases: $(grep -c ' ok$' "$R/pair_check.log")"; grep "clusters" "$R/pair_check.log" | cut -c1-150
    wait $warming; echo "pair warm rc=$?"; grep "^warm" "$R/pair_warm.log"
    ran=$(grep -oE "^warm [0-9]+: rc=0" "$R/pair_warm.log" | sed -E "s/warm ([0-9]+).*/\1/" | paste -sd,)
    echo "timing tiles: ${ran:-none}"
    if [ -n "$ran" ]; then
      timeout "$(budget 300)" python3 bench/pair_tile.py $args --only "$ran" >"$R/pair_time.log" 2>&1
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
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
