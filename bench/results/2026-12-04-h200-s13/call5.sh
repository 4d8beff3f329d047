#!/usr/bin/env bash
# Session 13, call 5: how much of the bf16-sr epilogue is the Philox rounds. The same kernels timed
# with Philox4x32 at 10 rounds (the contract), 5 and 0: a PROBE that edits this machine's copies
# only (kernels/random.py's philox4x32_10 for the Gluon tiles, Triton's N_ROUNDS_DEFAULT for the
# Triton tiles' tl.randint4x), each in a fresh Triton cache, so its bits are not the contract's and
# nothing of it is committed. Then forge+cl's peak at 1B 1x1024 by allocation (the snapshot).
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s13c5; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
TRAND=$(python3 -c "import triton.language.random as r; print(r.__file__)")
cp "$TRAND" "$R/triton_random.py.orig"; cp kernels/random.py "$R/forge_random.py.orig"
echo "== snapshot 1b $(date -u +%T)"
timeout 60 python3 bench/train_step.py --methods forge+cl --models llama-1b --tokens 1x1024 --checkpointing on \
  --warmup 2 --steps 2 --memory-snapshot --out "$R/snap_1b.json" >"$R/snap_1b.log" 2>&1
for rounds in 10 5 0; do
  echo "== rounds $rounds $(date -u +%T)"
  sed -i "s/^N_ROUNDS_DEFAULT = tl.constexpr([0-9]*)/N_ROUNDS_DEFAULT = tl.constexpr($rounds)/" "$TRAND"
  sed -i "s/for _ in tl.static_range([0-9]*):/for _ in tl.static_range($rounds):/" kernels/random.py
  grep -n "N_ROUNDS_DEFAULT = " "$TRAND" >"$R/rounds_$rounds.check"; grep -n "static_range" kernels/random.py >>"$R/rounds_$rounds.check"
  TRITON_CACHE_DIR="$R/cache_$rounds" timeout 100 python3 bench/ws_kernel.py --precision bf16-sr --shapes 4096x4096,14336x4096 \
    --tokens 256,2048 --exclude "128x128,64x128,p4 " --out "$R/ws_rounds_$rounds.json" >"$R/ws_rounds_$rounds.log" 2>&1
  rm -rf "$R/cache_$rounds"
done
cp "$R/triton_random.py.orig" "$TRAND"; cp "$R/forge_random.py.orig" kernels/random.py
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" --exclude='*.orig' . ; cp "$R/env.txt" "$OUT/"
grep -vE "^#|^$|gc_gen|ratios|ran;" "$R/snap_1b.log" | cut -c1-200 | head -22
for rounds in 10 5 0; do echo "-- rounds $rounds"; cat "$R/rounds_$rounds.check"; cut -c1-230 "$R/ws_rounds_$rounds.log"; done
