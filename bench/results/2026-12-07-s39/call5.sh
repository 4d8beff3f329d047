#!/usr/bin/env bash
# Session 39's fifth call (carry .whl), after the lifetime fix (commit 01674e8): does a dropped captured model give
# its device memory back (tests/test_gpu_graphs.py's new case), and does the fp32 flake case now run in four
# processes on an H100 (v46 forced, the route it clears; each run trains two models)?
source bench/device_call.sh
call_begin
timeout "$(budget 80)" python3 -m pytest -q -m gpu tests/test_gpu_graphs.py -k dropped tests/test_lifetime.py \
  >"$R/lifetime.log" 2>&1
echo "lifetime rc=$?"; grep -E "^FAILED|passed|failed|^E " "$R/lifetime.log" | cut -c1-200 | tail -6
FORGE_NUM_GLUON_F32=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 flake f32ss2 4 5 --precision fp32
call_end
exit 0
