#!/usr/bin/env bash
# Session 22, call 2 (carry .whl): v32's staggered starts on the staged 64x128 8bit tile.
#   1. Bits: the staged candidates' programs walking several tiles at once (the multiprocessor count
#      taken as 1) and their telemetry; their hypothesis cases last (cut in call 1 by its limit).
#   2. Kernels: the 8bit default against the staged 64x128 e8 without and with staggered starts (30 and
#      70 us), at 8B's and 1B's shapes, K = 1024 and 4096.
#   3. The 1B 4x1024 step, interleaved in one process, 6 rounds: forge_8bit+cl (default tile;
#      FORGE_NUM_FAST_LAUNCH=0; the staggered staged tiles through FORGE_NUM_Q8_TILE) against flashoptim+cl.
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
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; git log -1 --format=%h; } | tee "$R/env.txt"
DEFAULT="64x128x64_w8_s4_e4_tma_r128"; ST64="64x128x64_w8_s4_e8_p2_tma_r128_st"
Z30="${ST64}_z30"; Z70="${ST64}_z70"
echo "== bits $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 90)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py -k "persistent_8bit or 8bit_telemetry" --junitxml="$R/junit_cached.xml" >"$R/cached.log" 2>&1
echo "== kernels $(date -u +%T)"
timeout "$(budget 130)" python3 bench/kernels.py --precision 8bit --shapes 4096x14336,8192x8192,8192x2048,2048x8192,2048x2048 \
  --tokens 1024,4096 --configs "$DEFAULT,$ST64,$Z30,$Z70" --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== split $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 170)" python3 bench/host_time.py --part split --split-model llama-1b \
  --split-tokens 4x1024 --split-methods forge_8bit+cl,flashoptim+cl --split-steps 6 \
  --split-env "FORGE_NUM_Q8_TILE=$Z30" --split-env "FORGE_NUM_Q8_TILE=$Z70" \
  --out "$R/host_split.json" >"$R/host_split.log" 2>&1
echo "== candidate hypothesis cases $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 150)" python3 -m pytest -v -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py -k "candidate_configs and 8bit" --junitxml="$R/junit_staged.xml" >"$R/staged.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
echo "loops/telemetry: $(tail -1 "$R/cached.log")"; echo "staged hypothesis: $(grep -E "passed|failed" "$R/staged.log" | tail -1)"
grep -E "PASSED|FAILED" "$R/staged.log" | sed 's/.*::test_candidate_configs//' | cut -c1-140 | head -8
grep -hE "^(FAILED|ERROR)" "$R/cached.log" "$R/staged.log" | cut -c1-220 | head -8
python3 - "$R/kernels.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:
    sys.exit(f"kernels: {e}")
for r in rows:
    t = r["per_label_ms"]; d = t.get(r["default_label"])
    print(f"{r['M']:>5}x{r['N']:<5} K={r['K']:<5} default {d or float('nan'):.3f} ms  unfused {r['unfused_ms']:.3f}  "
          + "  ".join(f"{k.replace(' w8', '').replace('x64', '')}: {v / d:.2f}" for k, v in t.items() if d and k != r['default_label'])
          + (f"  FAILED {list(r['failed'])}" if r["failed"] else ""))
PY
grep -E "^split|CachedLaunch|JITFunction" "$R/host_split.log" | cut -c1-190
