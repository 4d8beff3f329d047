#!/usr/bin/env bash
# Session 42's second call (carry .tri/2 and .whl), on the first's warm machine: Triton 3.9's second part; then the
# 8bit flake case (the 8bit Gluon route on, a Llama-1B-wide model trained eager and captured, compared bit for bit)
# if this is an H200 (every H100 run clean since session 37's fix; NOTES asks for an H200's).
bash bench/triton_carry.sh receive 2 | tail -2
source bench/device_call.sh
call_begin
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$gib" -gt 100000 ]; then FORGE_NUM_GLUON_Q8=1 flake q8route 4 6; else echo "an H100: no flake case"; fi
call_end
exit 0
