#!/usr/bin/env bash
# Session 13, call 4: call 3's snapshot again without stack capture (with Python stacks torch 2.11
# failed inside forge's autograd Function): what forge+cl holds at its peak at 8B 4x1024 and 3B 1x1024,
# by size and by the phase that made it. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s13c4; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
for mt in llama-8b:4x1024 llama-3b:1x1024; do
  m=${mt%%:*}; t=${mt##*:}
  echo "== snapshot $m $t $(date -u +%T)"
  timeout 80 python3 bench/train_step.py --methods forge+cl --models "$m" --tokens "$t" --checkpointing on \
    --warmup 2 --steps 2 --memory-phases --memory-snapshot --out "$R/snap_${m}_$t.json" >"$R/snap_${m}_$t.log" 2>&1
done
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for f in "$R"/snap_*.log; do grep -vE "^#|^$|gc_gen|ratios|ran;" "$f" | cut -c1-250 | head -24; done
