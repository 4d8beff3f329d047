#!/usr/bin/env bash
# The next session's first device call (written in session 30; carry .whl): v36, the chunked loss's GEMM over
# groups of chunks (forge_num/loss.py), its bits and its time; v37, a captured step's tied split (forge_num/
# fused.py, _StaticSplitHeadUpdate), its bits and peak; the cursor tile at 3072 tokens (its route's middle).
#   check    the chunked loss on the GPU: the backward's logits in dY's rows equal the forward's
#            (tests/test_loss.py on cuda), training with it equal to the materialized reference
#            (tests/test_gpu_training.py -k chunked), captured equal to eager (tests/test_gpu_graphs.py -k chunked:
#            the tied 8bit cases take v37's split), the tied rows' GPU cases (tests/test_tied_rows.py)
#   cl1b     1B 4x1024 and 8x2048: forge_8bit+cl+graph beside forge_8bit+graph and flashoptim+cl (v36's time,
#            v37's peak: Llama-1B's head is tied)
#   cl8b     8B 1x2048: forge_8bit+cl+graph beside flashoptim+cl
#   ncu      the cursor tile at 14336x4096, 2048 tokens, under Nsight Compute: issue rate, stalls, and the
#            executed instructions by SASS line (the epilogue's dynamic count, where registers.py counts static)
#   k3072    the cursor tile beside the default at 3072 and 4096 tokens, and the cursor with four operand
#            stages (a candidate since session 30, not yet run)
#   cand4    that candidate's bits (tests/test_gpu_gluon.py, its 16 cases), in what time is left
set -uo pipefail
PART=${PART:-check,cl1b,cl8b,ncu,k3072,cand4}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/fn_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
DEF=ws8_64x128x64_st4_w8_rows16_mma104_r128
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
CUR4=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
part_check() {
  echo "== check $(date -u +%T)"
  timeout "$(budget 120)" python3 -m pytest -v -rA -p no:cacheprovider -n 6 tests/test_loss.py tests/test_gpu_training.py \
    tests/test_gpu_graphs.py tests/test_tied_rows.py -k "cuda or chunked or block_products" >"$R/check.log" 2>&1
  echo "check rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/check.log" | cut -c1-300 | tail -12
  grep -E "^E  .*(Error|assert)" "$R/check.log" | sort | uniq -c | sort -rn | head -4 | cut -c1-300
}
train() {  # $1 tag, $2 seconds, the rest: train_step.py's arguments
  local tag=$1 secs=$2; shift 2
  echo "== $tag $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
    --steps 4 --budget-s "$(( $(budget "$secs") - 15 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/$tag.log" | cut -c1-200
}
part_cl1b() {
  train cl1b 160 --methods forge_8bit+cl+graph,forge_8bit+graph,flashoptim+cl --models llama-1b --tokens 4x1024,8x2048
}
part_cl8b() { train cl8b 110 --methods forge_8bit+cl+graph,flashoptim+cl --models llama-8b --tokens 1x2048; }
part_ncu() {
  echo "== ncu $(date -u +%T)"
  ncu --version | tail -1
  timeout "$(budget 100)" ncu --clock-control none --profile-from-start off -k regex:fused_linear_update_q8_ws \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters \
    --section InstructionStats --import-source no -o "$R/cur_k2048" \
    python3 bench/ncu_probe.py --shape 14336x4096 --tokens 2048 --precision 8bit --configs "$CUR" >"$R/ncu.log" 2>&1
  echo "ncu rc=$?"; tail -2 "$R/ncu.log"
  ncu -i "$R/cur_k2048.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip >"$R/cur_k2048_sass.csv.gz"
  ncu -i "$R/cur_k2048.ncu-rep" --page details >"$R/cur_k2048_details.txt" 2>&1
  rm -f "$R"/*.ncu-rep
  grep -E "Duration|Issued Ipc|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Executed Ipc|Stall" \
    "$R/cur_k2048_details.txt" | cut -c1-120 | head -14
}
part_k3072() {
  echo "== k3072 $(date -u +%T)"
  timeout "$(budget 90)" python3 bench/kernels.py --precision 8bit --configs "$DEF,$CUR,$CUR4" \
    --shapes 4096x14336,2048x8192,4096x4096 --tokens 3072,4096 --out "$R/k3072.json" >"$R/k3072.log" 2>&1
  echo "k3072 rc=$?"; grep -E "^8bit" "$R/k3072.log" | cut -c1-150
}
part_cand4() {
  echo "== cand4 $(date -u +%T)"
  timeout "$(budget 90)" python3 -m pytest -v -rA -p no:cacheprovider -n 6 tests/test_gpu_gluon.py \
    -k "8bit and st4 and w16 and cur" >"$R/cand4.log" 2>&1
  echo "cand4 rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$R/cand4.log" | cut -c1-300 | tail -6
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
