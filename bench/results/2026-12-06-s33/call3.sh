#!/usr/bin/env bash
# Session 33's third device call (carry .whl; bench/device_call.sh does the rest). NOTES "Session 33".
#   graphs   tests/test_gpu_graphs.py with the capture's memory fix (one warm-up stream, cuBLAS workspaces
#            cleared before the capture) and its new test
#   residue  Llama-1B 4x1024: forge_8bit+cl eager beside forge_8bit+cl+graph, the capturing call's residue
#   train3b  Llama-3B 4x1024 (every update at K = 4096): forge_8bit+graph routed (since 8de977b the K-block-128
#            cursor), with the deep cursor forced (the route before), and flashoptim+cl, side by side
#   train1b  Llama-1B 4x1024: forge_8bit+cl+graph with the deep cursor forced beside flashoptim+cl (the routed
#            step: residue's)
PART=${PART:-graphs,residue,train3b,train1b}
source bench/device_call.sh
call_begin
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
part_graphs() {
  echo "== graphs $(date -u +%T)"
  timeout "$(budget 110)" python3 -m pytest -v -p no:cacheprovider -n 4 -m "gpu or exactness" tests/test_gpu_graphs.py \
    >"$R/graphs.log" 2>&1
  echo "graphs rc=$?"
  grep -E " (FAILED|ERROR) |passed|failed|assert" "$R/graphs.log" | cut -c1-300 | tail -8
}
part_residue() {
  train residue 100 - --methods forge_8bit+cl,forge_8bit+cl+graph --models llama-1b --tokens 4x1024 --steps 4 \
    --capture-history sizes
}
part_train3b() {
  train train3b_routed 140 - --methods forge_8bit+graph,flashoptim+cl --models llama-3b --tokens 4x1024 --steps 5
  train train3b_deep 70 "$DEEP" --methods forge_8bit+graph --models llama-3b --tokens 4x1024 --steps 5
}
part_train1b() {
  train train1b_deep 80 "$DEEP" --methods forge_8bit+cl+graph,flashoptim+cl --models llama-1b --tokens 4x1024 \
    --steps 5
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
