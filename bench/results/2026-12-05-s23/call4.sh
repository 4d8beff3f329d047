#!/usr/bin/env bash
# Session 23, call 4 (carry .whl): v33's loader-free candidates (kernels/gluon_q8.py, mma_self_loaded_tiles):
#   1. Their time beside ws8's default and the Triton 8bit tiles at 256, 1024 and 4096 tokens.
#   2. Their bits (tests/test_gpu_gluon.py -k 8bit: the self-loading tiles' cases, the walks, the route).
#   3. The 1B 4x1024 step (checkpointing, --profile): FORGE_NUM_GLUON_Q8=0, =1 (ws8's default from 4096
#      tokens), =<the sixteen-warp candidate>; flashoptim+cl beside the first.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-440}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/call4; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== kernels $(date -u +%T)"
timeout "$(budget 110)" python3 bench/kernels.py --precision 8bit --shapes 4096x14336,2048x8192 --tokens 256,1024,4096 \
  --configs "64x128x64_w8_s4_e4_tma_r128,64x128x64_w8_s4_e8_p2_tma_r128_st,ws8_64x128x64_st3_w8_rows16_mma104_r128,ws8_64x128x64_st3_w8_rows16_mma104_r168_sl,ws8_64x128x64_st3_w16_rows16_mma96_r96_sl" \
  --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== train $(date -u +%T)"
for flag in 0 1 ws8_64x128x64_st3_w16_rows16_mma96_r96_sl; do
  methods=forge_8bit+cl; [ "$flag" = 0 ] && methods=forge_8bit+cl,flashoptim+cl
  FORGE_NUM_GLUON_Q8=$flag PYTHONPATH=/tmp/site timeout "$(budget 80)" python3 bench/train_step.py --methods $methods \
    --models llama-1b --tokens 4x1024 --checkpointing on --warmup 2 --steps 4 --profile \
    --out "$R/train_${flag:0:3}.json" >"$R/train_${flag:0:3}.log" 2>&1
done
echo "== tests $(date -u +%T)"
timeout "$(budget 170)" python3 -m pytest -q -x -rA tests/test_gpu_gluon.py -p no:cacheprovider \
  -k "8bit and (sl or shards or routes)" >"$R/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$R/tests.log" | tail -8; grep -c "^PASSED" "$R/tests.log"
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
    print(f"{r['M']:>5}x{r['N']:<5} K={r['K']:<5} unfused {r['unfused_ms']:.3f} | " + "  ".join(f"{v:.3f}" for v in t.values()))
print("columns:", " | ".join(rows[0]["per_label_ms"]) if rows else "")
PY
for f in 0 1 ws8; do echo "FORGE_NUM_GLUON_Q8=$f"; grep -E "^(forge|flash)|profiled step" "$R/train_$f.log" | cut -c1-200; done
