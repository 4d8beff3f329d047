#!/usr/bin/env bash
# Session 13, call 6: why the Gluon bf16-sr tile is slower than the fp32 one of the same shape by
# more than its Philox rounds (call 5: without Philox the Triton bf16-sr tile gains 12-23%). Nsight
# Compute on the two-program 64x128 tile with eight sub-tiles at 4096x8192, K = 256, in the fp32 and
# the bf16-sr regime, and the Triton bf16-sr default beside it: shared-memory bank conflicts, warp
# stalls, pipe utilization. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s13c6; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
WS="ws_64x128x64_st2_sl2_o1_p2_r128_e8"
for prec in fp32 bf16-sr; do
  tiles=""; [ "$prec" = bf16-sr ] && tiles=default
  echo "== ncu $prec $(date -u +%T)"
  timeout 150 ncu --clock-control none --profile-from-start off -k regex:fused_linear_update \
    --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section ComputeWorkloadAnalysis --section InstructionStats \
    python3 bench/ncu_probe.py --shape 4096x8192 --tokens 256 --precision "$prec" --configs "$tiles" --ws-configs "$WS" \
    >"$R/ncu_$prec.txt" 2>&1
  echo "exit $?" >>"$R/ncu_$prec.txt"
done
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for prec in fp32 bf16-sr; do echo "-- $prec"; grep -E "fused_linear|Duration|Bank Conflicts|Shared Load|Shared Store|Stall|Issued Ipc|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Achieved Occupancy|Executed Instructions  |Memory Throughput|DRAM Throughput|exit" "$R/ncu_$prec.txt" | cut -c1-150 | head -60; done
