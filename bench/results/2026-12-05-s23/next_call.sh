#!/usr/bin/env bash
# Written at the end of session 23 for the next session's first call (not run; carry .whl):
#   1. The 8bit Gluon kernel's cases no GPU has run: the route's two ranges (1024 and 4096 tokens), the
#      one-K-block walk, v33c (the loader-free tile with load_and_advance's cursor), v33d (the default
#      with its state loads one sub-tile ahead).
#   2. v33c's and v33d's time beside the routed tiles and the Triton 8bit tiles at 1024-16384 tokens.
#   3. train_step: forge_8bit+cl (the route on, as shipped) beside flashoptim+cl at 1B and 3B, 4x1024.
# Every step under what is left of CALL_BUDGET_S (570 s by default); $OUT/results.tgz; a short table last.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/next_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== tests $(date -u +%T)"
timeout "$(budget 200)" python3 -m pytest -q -x -rA tests/test_gpu_gluon.py -p no:cacheprovider \
  -k "8bit and (routes or shards or cur or pf)" >"$R/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$R/tests.log" | tail -6
echo "== kernels $(date -u +%T)"
timeout "$(budget 160)" python3 bench/kernels.py --precision 8bit --shapes 4096x14336,2048x8192 --tokens 1024,4096,16384 \
  --configs "64x128x64_w8_s4_e4_tma_r128,64x128x64_w8_s4_e8_p2_tma_r128_st,ws8_64x128x64_st4_w8_rows16_mma104_r128,ws8_64x128x64_st3_w16_rows16_mma96_r96_sl,ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur,ws8_64x128x64_st4_w8_rows16_mma104_r128_pf" \
  --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== train $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 170)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b,llama-3b --tokens 4x1024 --checkpointing on --warmup 2 --steps 4 \
  --out "$R/train.json" >"$R/train.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
python3 - "$R/kernels.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:
    sys.exit(f"kernels: {e}")
for r in rows:
    t = r["per_label_ms"]
    print(f"{r['M']:>5}x{r['N']:<5} K={r['K']:<5} unfused {r['unfused_ms']:.3f} | " + "  ".join(f"{v:.3f}" for v in t.values())
          + (f"  FAILED {list(r['failed'])}" if r["failed"] else ""))
print("columns:", " | ".join(rows[0]["per_label_ms"]) if rows else "")
PY
grep -E "^(forge|flash)" "$R/train.log" | cut -c1-170
