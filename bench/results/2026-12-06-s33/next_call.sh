#!/usr/bin/env bash
# The next session's first device call (written in session 33; carry .whl; bench/device_call.sh does the rest).
# NOTES "Next device session (plan, written after session 33)", item 1.
#   kern   the K-block-128 cursor beside the deep cursor and the Gluon default at 3072-8192 tokens on Llama-8B's
#          shapes, three interleaved rounds each (--rounds 3): where the K-block-128 route should end
#   train  Llama-1B and -3B 4x1024 and 8B 1x2048, the 8bit step captured, beside flashoptim+cl
PART=${PART:-kern,train}
source bench/device_call.sh
call_begin
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
K128=ws8_64x128x128_st3_w16_rows16_mma96_r96_sl_cur
DEFAULT=ws8_64x128x64_st4_w8_rows16_mma104_r128
part_kern() {
  echo "== kern $(date -u +%T)"
  timeout "$(budget 200)" python3 bench/kernels.py --precision 8bit --configs "$DEEP,$K128,$DEFAULT" --rounds 3 \
    --shapes 4096x14336,14336x4096,4096x4096 --tokens 3072,4096,6144,8192 --out "$R/kern.json" >"$R/kern.log" 2>&1
  echo "kern rc=$?"
  python3 - "$R/kern.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
labels = list(rows[0]["per_label_ms"])
print("ms (median of 3 rounds)  " + "".join(f"{l.replace('ws8 64x128x', '')[:24]:>26s}" for l in labels))
for r in rows:
    print(f"{r['M']}x{r['N']} K={r['K']:<5d}       " + "".join(f"{r['per_label_ms'][l]:26.3f}" for l in labels))
PY
}
part_train() {
  train train1b3b 200 - --methods forge_8bit+cl+graph,flashoptim+cl --models llama-1b,llama-3b --tokens 4x1024 --steps 5
  train train8b 120 - --methods forge_8bit+cl+graph,flashoptim+cl --models llama-8b --tokens 1x2048 --steps 4
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
