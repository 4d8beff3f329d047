#!/usr/bin/env bash
# Session 36's fourth device call (carry .whl), the command as run: the 8bit-hf-wide flake case with the Triton
# 8bit tile, four processes at once, eight runs each (call 1 ran twelve on the H200).
source bench/device_call.sh; call_begin; for p in 1 2 3 4; do ( export FORGE_NUM_GLUON_Q8=0; timeout 150 python3 bench/results/2026-12-06-s35/flake.py 8 triton$p > $R/triton$p.log 2>&1 ) & done; wait; grep -h "differ" $R/triton*.log | cut -c1-300; call_end
