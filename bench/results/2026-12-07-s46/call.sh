#!/usr/bin/env bash
# Session 46's device calls (carry .tri/1 and .whl): session 45's parts (bench/results/2026-12-07-s45/call.sh:
# pair, route, train39, labels, exact39; that file says what each measures, none has run yet) and one more:
#   loss   the chunked loss with the head's bf16 cast made a slab at a time (129369f), under the device's
#          Triton: Llama-8B fp32 at 4x1024 tokens, forge+cl beside torch_adamw+cl (AMP), peak and tokens/s
#          (AMP's ~120 GiB needs an H200: skipped on a smaller GPU); then Llama-3B at 4x1024 (session 47: its
#          peak was the loss's loop with the cast in session 14) and Llama-1B at 1x1024 and 4x1024, the
#          same two methods (the slabs' 24 GEMMs and casts a step where there were 3: tokens/s); first the
#          loss's GPU tests (tests/test_loss.py on cuda: the recomputation's bits; the chunked-loss training
#          cases of tests/test_gpu_training.py), into losstests.log. Session 47 (v51, before the call ran):
#          the loss by blocks, dY by slabs from the forward's row normalizers, the tied head's split update
#          fed slab by slab in every regime; its GPU tests too (the slab gradient against autograd, the
#          split's block products from contiguous slabs, the tied split's backward without a sync)
source bench/results/2026-12-07-s45/call.sh
part_loss() {
  local mib
  timeout "$(budget 110)" python3 -m pytest -q -rfE -p no:cacheprovider -W ignore::DeprecationWarning \
    -k "cuda or chunked or block_products or tied_split" \
    tests/test_loss.py tests/test_gpu_training.py tests/test_tied_rows.py >"$R/losstests.log" 2>&1
  echo "loss tests rc=$?"; grep -E "^FAILED|^ERROR| passed| failed" "$R/losstests.log" | cut -c1-200 | tail -6
  # session 47: v51 moves the tied 3B and 1B most, so they run before 8B (whose fused head keeps dY whole)
  train loss3b 90 - --methods forge+cl,torch_adamw+cl --models llama-3b --tokens 4x1024
  train loss1b 150 - --methods forge+cl,torch_adamw+cl --models llama-1b --tokens 1x1024,4x1024
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  if [ "${mib:-0}" -gt 100000 ]; then
    train loss8b 220 - --methods forge+cl,torch_adamw+cl --models llama-8b --tokens 4x1024 --steps 3
  else
    echo "loss8b: skipped (${mib} MiB: torch_adamw+cl at 8B 4x1024 needs ~120 GiB)"
  fi
}
run_parts loss,pair
exit 0
