#!/usr/bin/env bash
# Session 11, call 2: every Gluon tile against the Triton kernel's default tile (named explicitly) and
# the routed launch at K = 256-2048; Nsight Compute on the three candidate designs at 8192x8192,
# K = 2048, where none overlaps its update with the mainloop (call 1: 2.5x the floor); the issue's
# kernel table with the routed forge column. Everything packed into $OUT/results.tgz (a device call
# returns at most 8 files).
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s11; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "sources $(find forge_num kernels emulator bench tests proofs examples -name '*.py' | sort | xargs sha1sum | sha1sum | cut -c1-12)"
  date -u; } | tee "$R/env.txt"
echo "== ws_kernel $(date -u +%T)"
timeout 170 python3 bench/ws_kernel.py --tokens 256,512,1024,2048 --out "$R/ws_kernel.json" >"$R/ws_kernel.log" 2>&1
echo "== ncu $(date -u +%T)"
timeout 110 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  python3 bench/ncu_probe.py --shape 8192x8192 --tokens 2048 \
  --ws-configs ws_128x128x64_st3_sl1_o1,ws_64x128x64_st3_sl2_o1_r128_split,ws_64x128x64_st2_sl1_o1_p2_r128 \
  >"$R/ncu_8192_2048.txt" 2>&1
echo "== kernels $(date -u +%T)"
timeout 200 python3 bench/kernels.py --precision fp32 --out "$R/kernels.json" >"$R/kernels.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
cat "$R/ws_kernel.log" | cut -c1-200
grep -E "fused_linear_update|Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible|Registers Per|Achieved Occ|stalled_(long|barrier|wait|math|mio|short|lg|dispatch|not_sel|membar|sleep|branch)" "$R/ncu_8192_2048.txt" | cut -c1-120 | head -120
grep -E "^(fp32|ceilings)" "$R/kernels.log" | cut -c1-200 | tail -45
