#!/usr/bin/env bash
# Session 12, call 4: why the ping-pong design is slow (ncu at 4096x4096, K = 256, beside the
# routed two-program tile); where forge's host time goes at 1B (call 3: 0.74x AMP, host-bound);
# the 3B 1x1024 step again (call 2's 0.86x AMP, one call); 8B 4x1024 with the chunked loss in the
# fp32 regime beside AMP and FlashOptim on the same loss. Packed into $OUT/results.tgz.
set -uo pipefail
OUT=${OUT:-out}; R=/tmp/s12c4; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } | tee "$R/env.txt"
echo "== ncu pingpong $(date -u +%T)"
timeout 100 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section LaunchStats \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  python3 bench/ncu_probe.py --shape 4096x4096 --tokens 256 \
  --ws-configs ws_64x128x64_st2_sl1_o1_p2_r128,ws_64x128x64_st4_sl2_o1_r168_pp240 >"$R/ncu_pp.txt" 2>&1
echo "== host split 1b $(date -u +%T)"
timeout 45 python3 bench/host_time.py --part split --split-model llama-1b --split-tokens 1x1024 --split-steps 6 \
  --out "$R/host_split_1b.json" >"$R/host_split_1b.log" 2>&1
echo "== train 3b 1x1024 $(date -u +%T)"
timeout 90 python3 bench/train_step.py --methods forge,torch_adamw,flashoptim --models llama-3b --tokens 1x1024 \
  --checkpointing on --warmup 3 --steps 8 --out "$R/train_3b.json" >"$R/train_3b.log" 2>&1
echo "== train 8b 4x1024 +cl $(date -u +%T)"
timeout 150 python3 bench/train_step.py --methods forge+cl,torch_adamw+cl,flashoptim+cl --models llama-8b \
  --tokens 4x1024 --checkpointing on --warmup 2 --steps 4 --out "$R/train_8b_cl.json" >"$R/train_8b_cl.log" 2>&1
echo "== done $(date -u +%T)"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
grep -E "fused_linear_update|Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible|Registers Per|Achieved Occ|stalled_(long|barrier|wait|math|mio|short|lg|membar|sleep|branch)" "$R/ncu_pp.txt" | cut -c1-120 | head -60
grep -E "^split|JITFunction|CachedLaunch|gluon_update.launch|_launch_linear|fused_linear_update|_apply_linear|fused linear|_prepare" "$R/host_split_1b.log" | cut -c1-150
for f in train_3b train_8b_cl; do grep -vE "^#|^$|ran;" "$R/$f.log" | cut -c1-220 | tail -10; done
