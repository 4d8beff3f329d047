#!/usr/bin/env bash
# Session 12, call 6: forge against AMP at the host-bound sizes with the two models' steps
# interleaved round by round in one process (bench/host_time.py --part split), so the ratio is
# measured against the host's own drift (calls 2, 4, 5: 0.86x, 0.55x, 0.68x at 3B 1x1024, run one
# method after the other). Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s12c6; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
for m in llama-3b llama-1b; do
  echo "== split $m $(date -u +%T)"
  timeout 90 python3 bench/host_time.py --part split --split-model $m --split-tokens 1x1024 --split-steps 8 \
    --out "$R/split_$m.json" >"$R/split_$m.log" 2>&1
done
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
grep -h "^split" "$R"/split_*.log | cut -c1-200
