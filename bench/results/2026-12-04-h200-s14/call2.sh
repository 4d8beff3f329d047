#!/usr/bin/env bash
# Session 14, call 2: the rest of the GPU suite on the reviewed code (the Triton kernels' exactness
# in every regime and configuration, the tensor-core model, stochastic rounding's statistics, PTX
# checks, the bench scripts), and Nsight Compute's per-instruction stall samples of the Triton
# bf16-sr tile (4096x8192, K = 256), whose IPC was 1.67 of 4 in session 13. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s14c2; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  ncu --version | tail -1; date -u; } | tee "$R/env.txt"
echo "== ncu bf16-sr $(date -u +%T)"
timeout 150 ncu --clock-control none --profile-from-start off -k regex:fused_linear_update \
  --section WarpStateStats --section SourceCounters --section InstructionStats --import-source no -o "$R/bf16sr" \
  python3 bench/ncu_probe.py --shape 4096x8192 --tokens 256 --precision bf16-sr --configs default >"$R/ncu.log" 2>&1
echo "exit $?" >>"$R/ncu.log"
ncu -i "$R/bf16sr.ncu-rep" --page source --csv --print-source sass >"$R/bf16sr_sass.csv" 2>"$R/sass.err"
ncu -i "$R/bf16sr.ncu-rep" --page details >"$R/bf16sr_details.txt" 2>&1
echo "== GPU suite $(date -u +%T)"
timeout -s INT -k 20 330 python3 -m pytest -m "exactness or gpu or statistical" -q -rfE -p no:cacheprovider -n 12 \
  --junitxml="$R/junit.xml" tests/test_gpu_exactness.py tests/test_gpu_tensor_core.py tests/test_statistical_rounding.py \
  tests/test_ptx.py tests/test_bench_scripts.py tests/test_emulator_tensor_core.py tests/test_report.py >"$R/suite.log" 2>&1
echo "pytest exit: $?" >>"$R/suite.log"
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -2 "$R/suite.log"; grep -E "^(FAILED|ERROR)" "$R/suite.log" | cut -c1-200 | head -20
tail -3 "$R/ncu.log"; wc -l "$R/bf16sr_sass.csv"; head -c 600 "$R/sass.err"
grep -E "Warp Cycles Per Issued|Issued Ipc|Stall" "$R/bf16sr_details.txt" | cut -c1-150 | head -20
