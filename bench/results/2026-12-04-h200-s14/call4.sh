#!/usr/bin/env bash
# Session 14, call 4: the nine GPU tests call 3's suite left unfinished at its time limit (default
# tiles' exactness, a persistent tile walking several tiles, the T vectors through forge's own
# mainloop), listed in call4_ids.txt, one process each. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s14c4; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
mapfile -t IDS < bench/results/2026-12-04-h200-s14/call4_ids.txt
timeout -s INT -k 10 270 python3 -m pytest -q -rfE -p no:cacheprovider -n 9 --junitxml="$R/junit.xml" "${IDS[@]}" >"$R/suite.log" 2>&1
echo "pytest exit: $?" >>"$R/suite.log"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -2 "$R/suite.log"; grep -E "^(FAILED|ERROR)" "$R/suite.log" | cut -c1-200 | head -20
