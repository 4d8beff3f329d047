#!/usr/bin/env bash
# Session 34, call 3 (carry .whl): v44, each tile's state staged by the MMA warps (mma_stage, label "... ms").
#   bits   the two mma_stage candidates against the Triton 8bit tile and the emulator (every 8bit case of
#          tests/test_gpu_gluon.py, the edges test included), FORGE_NUM_TEST_Q8_TILES naming them
#   kern   the cursor and the deep cursor beside their mma_stage twins at 1024-4096 tokens on Llama-8B's shapes,
#          three interleaved rounds
#   train8b  8B 1x2048 captured: routed, the cursor ms forced, flashoptim+cl
#   train1b  1B 8x2048 captured: routed (the K-block-128 cursor at 16384 tokens since 7f0d774), the Gluon default
#          forced (the route before), flashoptim+cl
PART=${PART:-bits,kern,train8b,train1b}
source bench/device_call.sh
call_begin
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
DEFAULT=ws8_64x128x64_st4_w8_rows16_mma104_r128
part_bits() {
  echo "== bits $(date -u +%T)"
  FORGE_NUM_TEST_Q8_TILES="${CUR}_ms,${DEEP}_ms" timeout "$(budget 170)" python3 -m pytest -q -m gpu -n 8 \
    tests/test_gpu_gluon.py -k 8bit >"$R/bits.log" 2>&1
  echo "bits rc=$?"; tail -4 "$R/bits.log" | cut -c1-200
}
part_kern() {
  echo "== kern $(date -u +%T)"
  timeout "$(budget 120)" python3 bench/kernels.py --precision 8bit --configs "$CUR,${CUR}_ms,$DEEP,${DEEP}_ms" \
    --rounds 3 --shapes 4096x14336,14336x4096,4096x4096 --tokens 1024,2048,3072,4096 --out "$R/kern.json" \
    >"$R/kern.log" 2>&1
  echo "kern rc=$?"
  python3 - "$R/kern.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
labels = list(rows[0]["per_label_ms"])
print("ms (median of 3 rounds)  " + "".join(f"{l.replace('ws8 64x128x64 ', '').replace(' rows16 mma96 r96', '')[:16]:>18s}" for l in labels))
for r in rows:
    print(f"{r['M']}x{r['N']} K={r['K']:<5d}       " + "".join(f"{r['per_label_ms'][l]:18.3f}" for l in labels))
PY
}
part_train8b() {
  train train8b 130 - --methods forge_8bit+cl+graph,flashoptim+cl --models llama-8b --tokens 1x2048 --steps 4
  train train8b_ms 70 "${CUR}_ms" --methods forge_8bit+cl+graph --models llama-8b --tokens 1x2048 --steps 4
}
part_train1b() {
  train train1b 110 - --methods forge_8bit+cl+graph,flashoptim+cl --models llama-1b --tokens 8x2048 --steps 4
  train train1b_default 60 "$DEFAULT" --methods forge_8bit+cl+graph --models llama-1b --tokens 8x2048 --steps 4
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
