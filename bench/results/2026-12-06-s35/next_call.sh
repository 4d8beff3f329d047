#!/usr/bin/env bash
# The next session's first device call (written in session 35; carry .whl): NOTES "Next device session (plan,
# written after session 35)", item 1.
#   flake  tests/test_gpu_graphs.py's 8bit-hf-wide case repeated (flake.py): four processes at once (call 5 failed
#          under -n 8), eight runs each, with the route (the staged deep cursor at 1024 tokens), then with the deep
#          cursor forced (unstaged), then two processes with the Triton 8bit tile (FORGE_NUM_GLUON_Q8=0)
#   graphs tests/test_gpu_graphs.py whole under -n 8, twice
PART=${PART:-flake,graphs}
source bench/device_call.sh
call_begin
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
FLAKE=bench/results/2026-12-06-s35/flake.py
batch() {  # batch TAG PROCS RUNS FLAG: PROCS processes of RUNS runs each, FORGE_NUM_GLUON_Q8=FLAG (- unset)
  local tag=$1 procs=$2 runs=$3 flag=$4
  echo "== $tag $(date -u +%T)"
  for p in $(seq "$procs"); do
    ( [ "$flag" != - ] && export FORGE_NUM_GLUON_Q8=$flag
      timeout "$(budget 150)" python3 "$FLAKE" "$runs" "$tag$p" >"$R/$tag$p.log" 2>&1 ) &
  done
  wait
  grep -h "differed\|DIFFER" "$R/$tag"*.log | cut -c1-240
}
part_flake() {
  batch routed 4 8 -
  batch deep 4 8 "$DEEP"
  batch triton 2 8 0
}
part_graphs() {
  for i in 1 2; do
    timeout "$(budget 90)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_graphs.py >"$R/graphs$i.log" 2>&1
    echo "graphs $i rc=$?"; grep -E "^FAILED|passed|failed" "$R/graphs$i.log" | cut -c1-240 | tail -4
  done
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
