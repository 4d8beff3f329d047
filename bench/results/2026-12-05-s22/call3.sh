#!/usr/bin/env bash
# Session 22, call 3 (carry .whl): v31's staged tile promoted on tall weights (Q8_TALL_CONFIG).
#   1. Bits: the promoted tile's cached launch, its programs walking several tiles at once, the 8bit
#      defaults' telemetry; the defaults' hypothesis cases last, with what time is left.
#   2. Kernels: the promoted tile against the TMA tile it replaces at 8B's 14336x4096 and 8192x8192, K = 256
#      (not measured before), 1024, 4096 and 16384.
#   3. The 1B 4x1024 step interleaved, 6 rounds: forge_8bit+cl (the new defaults), the same with the TMA tile
#      everywhere TMA loads (FORGE_NUM_Q8_TILE: the defaults before), flashoptim+cl.
#   4. train_step: forge_8bit+cl beside flashoptim+cl at 1B and 3B, 4x1024, checkpointing.
# Every step under what is left of CALL_BUDGET_S (570 s by default); $OUT/results.tgz; a short table last.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/call3; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
OLD="64x128x64_w8_s4_e4_tma_r128"; TALL="64x128x64_w8_s4_e8_p2_tma_r128_st"
echo "== bits $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 80)" python3 -m pytest -q -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py -k "(cached_triton and 8bit) or persistent_8bit or 8bit_telemetry" \
  --junitxml="$R/junit_bits.xml" >"$R/bits.log" 2>&1
echo "== kernels $(date -u +%T)"
timeout "$(budget 90)" python3 bench/kernels.py --precision 8bit --shapes 14336x4096,8192x8192 --tokens 256,1024,4096,16384 \
  --configs "$OLD,$TALL" --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== split $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 120)" python3 bench/host_time.py --part split --split-model llama-1b \
  --split-tokens 4x1024 --split-methods forge_8bit+cl,flashoptim+cl --split-steps 6 \
  --split-env "FORGE_NUM_Q8_TILE=$OLD" --out "$R/host_split.json" >"$R/host_split.log" 2>&1
echo "== train $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 150)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b,llama-3b --tokens 4x1024 --checkpointing on --warmup 2 --steps 3 \
  --out "$R/train.json" >"$R/train.log" 2>&1
echo "== default tiles' hypothesis cases $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 150)" python3 -m pytest -v -rfE -p no:cacheprovider -n 12 \
  tests/test_gpu_exactness.py -k "default_configs and 8bit" --junitxml="$R/junit_defaults.xml" >"$R/defaults.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
echo "bits: $(tail -1 "$R/bits.log")"; echo "defaults: $(grep -E "passed|failed" "$R/defaults.log" | tail -1)"
grep -hE "^(FAILED|ERROR)" "$R/bits.log" "$R/defaults.log" | cut -c1-220 | head -8
grep -E "PASSED|FAILED" "$R/defaults.log" | sed 's/.*::test_default_configs//' | cut -c1-120 | head -8
python3 - "$R/kernels.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:
    sys.exit(f"kernels: {e}")
for r in rows:
    t = r["per_label_ms"]; old = t.get("64x128x64 w8 s4 e4 tma r128"); tall = t.get("64x128x64 w8 s4 e8 p2 tma r128 st")
    print(f"{r['M']:>5}x{r['N']:<5} K={r['K']:<5} TMA tile {old or float('nan'):.3f} ms  staged {tall or float('nan'):.3f} ms"
          f"  ratio {(tall / old) if old and tall else float('nan'):.2f}  default {r['default_label']} {r['forge_ms']:.3f}"
          f"  unfused {r['unfused_ms']:.3f}  floor {r['floor_ms']:.3f}" + (f"  FAILED {list(r['failed'])}" if r["failed"] else ""))
PY
grep -E "^split" "$R/host_split.log" | cut -c1-200
grep -E "^(forge|flash)" "$R/train.log" | cut -c1-170
