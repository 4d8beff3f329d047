#!/usr/bin/env bash
# Session 34, call 4 (carry .whl), on call 3's warm machine: the 8B 1x2048 step with the mma_stage tiles forced,
# alternated with the routed step (call 3: the cursor ms forced 0.367 s against 0.361 routed, where its kernel
# timings were 0.93-0.96x the cursor's), and 3B 1x1024 (every update at 1024 tokens) routed against the cursor ms.
source bench/device_call.sh
call_begin
CUR_MS=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur_ms
DEEP_MS=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ms
ARGS8="--methods forge_8bit+cl+graph --models llama-8b --tokens 1x2048 --steps 6"
train r8_a 45 - $ARGS8
train deepms8 45 "$DEEP_MS" $ARGS8
train r8_b 45 - $ARGS8
train curms8 45 "$CUR_MS" $ARGS8
ARGS3="--methods forge_8bit+cl+graph --models llama-3b --tokens 1x1024 --steps 6"
train r3 40 - $ARGS3
train curms3 40 "$CUR_MS" $ARGS3
call_end
exit 0
