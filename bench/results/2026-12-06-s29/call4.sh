#!/usr/bin/env bash
# Session 29's fourth call (carry .whl): attn_step.py, transformers 5.18 first on the path.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { cat /tmp/install.log; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/transformers-5.18.0-py3-none-any.whl \
  .whl/huggingface_hub-1.33.0-py3-none-any.whl >>/tmp/install.log 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
cd bench/results/2026-12-06-s29 && timeout "${DIAG_S:-200}" python3 attn_step.py 2>&1 | grep -viE "warn|deprecat" \
  | tee "$OUT/attn_step.log" | cut -c1-330
