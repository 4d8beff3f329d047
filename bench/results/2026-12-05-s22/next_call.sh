#!/usr/bin/env bash
# Written at the end of session 22 for the next session's first call (not run; carry .whl):
#   1. Kernels: the staged tall-weight 8bit tile (Q8_TALL_CONFIG) against the TMA tile it replaced on the
#      tall shapes the rule now covers, unmeasured so far (3B's gate/up 8192x3072, the tied heads 128256x2048
#      and 128256x3072) and 8192x8192, at 256 and 512 tokens (where 8192x8192 lost: 1.04x at 256) and 4096.
#   2. The fp32 step's host A/B on this machine (forge+cl with FORGE_NUM_FAST_LAUNCH=0, which now also
#      covers the element-wise kernel's launches), interleaved with the 8bit step and flashoptim+cl.
#   3. train_step: forge_8bit+cl beside flashoptim+cl at 1B and 3B, 1x1024 (4x1024 ran in session 22).
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
OLD="64x128x64_w8_s4_e4_tma_r128"; TALL="64x128x64_w8_s4_e8_p2_tma_r128_st"
echo "== kernels $(date -u +%T)"
timeout "$(budget 150)" python3 bench/kernels.py --precision 8bit --shapes 8192x3072,128256x2048,128256x3072,8192x8192 \
  --tokens 256,512,4096 --configs "$OLD,$TALL" --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== split $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 200)" python3 bench/host_time.py --part split --split-model llama-1b \
  --split-tokens 4x1024 --split-methods forge_8bit+cl,forge+cl,flashoptim+cl --split-steps 6 \
  --out "$R/host_split.json" >"$R/host_split.log" 2>&1
echo "== train $(date -u +%T)"
PYTHONPATH=/tmp/site timeout "$(budget 170)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl \
  --models llama-1b,llama-3b --tokens 1x1024 --checkpointing on --warmup 2 --steps 3 \
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
    t = r["per_label_ms"]; old = t.get("64x128x64 w8 s4 e4 tma r128"); tall = t.get("64x128x64 w8 s4 e8 p2 tma r128 st")
    print(f"{r['M']:>6}x{r['N']:<5} K={r['K']:<5} TMA tile {old or float('nan'):.3f} ms  staged {tall or float('nan'):.3f} ms"
          f"  ratio {(tall / old) if old and tall else float('nan'):.2f}  unfused {r['unfused_ms']:.3f}  floor {r['floor_ms']:.3f}"
          + (f"  FAILED {list(r['failed'])}" if r["failed"] else ""))
PY
grep -E "^split|CachedLaunch|JITFunction" "$R/host_split.log" | cut -c1-190
grep -E "^(forge|flash)" "$R/train.log" | cut -c1-170
