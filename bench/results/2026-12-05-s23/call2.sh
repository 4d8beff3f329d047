#!/usr/bin/env bash
# Session 23, call 2 (carry .whl): the 8bit Gluon kernel (kernels/gluon_q8.py, v33) on the GPU for the first time.
#   1. Its bits: tests/test_gpu_gluon.py -k 8bit (against the Triton 8bit TMA tile and the emulator).
#   2. Its time beside the Triton 8bit tiles and the unfused step (bench/kernels.py --precision 8bit: the
#      default tile, the staged tall tile and the ws8 tiles), on the 8B shapes and the 1B/3B tall ones.
#   3. The 1B 4x1024 step, forge_8bit+cl with FORGE_NUM_GLUON_Q8=1 against without, beside flashoptim+cl.
# Every step under what is left of CALL_BUDGET_S (570 s by default); $OUT/results.tgz; a short table last.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/call2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; git log -1 --format=%h; date -u; } | tee "$R/env.txt"
echo "== tests $(date -u +%T)"
timeout "$(budget 170)" python3 -m pytest -q -x -v tests/test_gpu_gluon.py -k "8bit" -p no:cacheprovider >"$R/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|PASSED|FAILED|Error" "$R/tests.log" | tail -4
echo "== kernels $(date -u +%T)"
timeout "$(budget 220)" python3 bench/kernels.py --precision 8bit --shapes 4096x14336,14336x4096,4096x4096,8192x2048 \
  --tokens 256,1024,4096 --configs "64x128x64_w8_s4_e4_tma_r128,64x128x64_w8_s4_e8_p2_tma_r128_st,ws8_64x128x64_st3_w8_rows16_mma104_r128,ws8_64x128x64_st4_w8_rows16_mma104_r128,ws8_64x128x64_st2_w8_rows16_mma104_r128" \
  --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== split $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 150)" python3 bench/host_time.py --part split --split-model llama-1b \
  --split-tokens 4x1024 --split-methods forge_8bit+cl,flashoptim+cl --split-env FORGE_NUM_GLUON_Q8=1 --split-steps 5 \
  --out "$R/host_split.json" >"$R/host_split.log" 2>&1
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
    cells = "  ".join(f"{k.replace(' w8 ', ' ')[:26]} {v:.3f}" for k, v in t.items())
    print(f"{r['M']:>6}x{r['N']:<5} K={r['K']:<5} unfused {r['unfused_ms']:.3f} floor {r['floor_ms']:.3f} | {cells}"
          + (f"  FAILED {list(r['failed'])}" if r["failed"] else ""))
PY
grep -E "^split" "$R/host_split.log" | cut -c1-190
