#!/usr/bin/env bash
# Session 15, call 4: Nsight Compute's per-instruction stall samples of the two 8bit defaults after
# v22 (32x128 w8 e4 at 4096x14336, K = 256; 64x128 w8 e4 r128 at K = 4096), so that the next change
# to the 8bit epilogue starts from where its time goes. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s15c4; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  ncu --version | tail -1; date -u; } | tee "$R/env.txt"
for K in 256 4096; do
  echo "== ncu 8bit K=$K $(date -u +%T)"
  timeout 105 ncu --clock-control none --profile-from-start off -k regex:fused_linear_update \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters --section InstructionStats \
    --import-source no -o "$R/q8_k$K" \
    python3 bench/ncu_probe.py --shape 4096x14336 --tokens $K --precision 8bit --configs default >"$R/ncu_k$K.log" 2>&1
  echo "exit $?" >>"$R/ncu_k$K.log"
  ncu -i "$R/q8_k$K.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip >"$R/q8_k${K}_sass.csv.gz"
  ncu -i "$R/q8_k$K.ncu-rep" --page details >"$R/q8_k${K}_details.txt" 2>&1
done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
rm -f "$R"/*.ncu-rep
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
for K in 256 4096; do tail -2 "$R/ncu_k$K.log"
  grep -E "Duration|Issued Ipc|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Theoretical Occupancy|Executed Ipc" "$R/q8_k${K}_details.txt" | cut -c1-120 | head -12; done
