#!/usr/bin/env bash
# Session 41's sixth call (carry .whl), on call 4's tree. The question: call 5 timed v46's three-slot twin (three
# operand stages, two g buffers) at 0.92-1.04x v46's time at 512 tokens (0.92x on 28672x8192, behind on the
# 4096-wide shapes) and 1.13-1.20x at 768; its one-buffer twin (four operand stages, one g buffer, three slots)
# was timed only on an H200 (session 36: 0.99x v46 at 256 and 1024 tokens). Which leads at 256-640 tokens, where
# the route stands at 1.49-1.59x the unfused step at 512? Issue 5's five shapes, 3 interleaved rounds.
source bench/device_call.sh
call_begin
S2=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2
S2G=wsf_64x128x64_st4_w16_rows16_g16_mma96_r96_sl_cur_ss2
S3=wsf_64x128x64_st3_w16_rows16_mma96_r96_sl_cur_ss3
S31=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_gb1_ss3
timeout "$(budget 250)" python3 bench/kernels.py --precision fp32 --rounds 3 --configs "$S2,$S2G,$S3,$S31" \
  --shapes 4096x4096,14336x4096,4096x14336,8192x8192,28672x8192 --tokens 256,384,512,640 \
  --out "$R/slots.json" >"$R/slots.log" 2>&1
echo "slots rc=$?"; kern_table "$R/slots.json"
call_end
exit 0
