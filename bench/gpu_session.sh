#!/usr/bin/env bash
# One device call: install, then the named parts in order, each under its own time limit, so the
# call ends inside the device's 10-minute limit with everything it measured. All results go to
# $OUT (the device tool returns at most 8 files): logs and JSON are collected into
# $OUT/results.tgz, and the short tables are printed last.
#
#   bash bench/gpu_session.sh kernels exactness+bias     (kernel benchmark, then the whole GPU test
#                                                         suite with the bias report beside it)
#   bash bench/gpu_session.sh train capacity             (training step, then capacity)
#
# Parts: kernels, mainloop, exactness, bias, train, capacity, fidelity, host, ncu; "a+b" runs a and b side by side.
# Environment:
#   KERNEL_ARGS / KERNEL_ARGS_LOWBIT   arguments of the two bench/kernels.py runs
#   T_KERNELS T_EXACT T_TRAIN T_CAPACITY T_FIDELITY T_BIAS T_HOST   seconds for each part
#                 (T_KERNELS=0 / T_KERNELS_LOWBIT=0: skip that kernels run)
#   PYTEST_FILES, PYTEST_K   test files and a -k expression for the exactness part
#   EXACT_PASSED  a passed.txt of an earlier call (carried): the exactness part runs the rest
#   XDIST         pytest-xdist workers (12)
#   NCU_POINTS    shape:tokens[:tile,tile] points for bench/ncu_probe.py under Nsight Compute (tile
#                 labels with "_" for spaces, e.g. 64x128x64_w4_s4_e4_tma)
#                 ("4096x4096:256 4096x4096:16384"); T_NCU seconds for all of them
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
R=/tmp/forge_results; rm -rf "$R"; mkdir -p "$R"
export PYTHONUNBUFFERED=1 FORGE_RESULTS_DIR="$R" HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
if ls .whl/*.whl >/dev/null 2>&1; then  # the baselines (bitsandbytes, torchao, flashoptim), carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >>"$R/install.log" 2>&1 && export PYTHONPATH=/tmp/site
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.version.cuda)"
  # the device's copy of the working tree may carry a stale .git (seen in session 9: HEAD was the
  # session's first commit): the digest of the Python sources says which tree ran; compare it with
  # the same command run here on a commit
  git log -1 --format='commit %H %s' 2>/dev/null
  echo "sources $(find forge_num kernels emulator bench tests proofs examples -name '*.py' | sort | xargs sha1sum | sha1sum | cut -c1-12)" \
    "(find forge_num kernels emulator bench tests proofs examples -name '*.py' | sort | xargs sha1sum | sha1sum)"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$R/env.txt"

# The whole GPU suite takes more than one call (session 28: 501 exactness cases, 560 s reached 495 with 14
# workers): each run writes the cases it passed to $R/passed.txt (results.tgz), with those of EXACT_PASSED's
# file if given; a later call with EXACT_PASSED=<that file, carried> runs only the collected cases not in it.
EXACT_MARK=${EXACT_MARK:-"exactness or gpu or statistical"}
run_exactness() {
  local select=(${PYTEST_FILES:-tests} ${PYTEST_K:+-k "$PYTEST_K"})
  if [ -n "${EXACT_PASSED:-}" ]; then
    python3 -m pytest --collect-only -q -p no:cacheprovider -m "$EXACT_MARK" "${select[@]}" 2>/dev/null \
      | grep "::" | LC_ALL=C sort -u >"$R/collected.txt"
    LC_ALL=C comm -23 "$R/collected.txt" <(LC_ALL=C sort -u "$EXACT_PASSED") >"$R/rest.txt"
    echo "collected $(wc -l <"$R/collected.txt"), not passed before: $(wc -l <"$R/rest.txt")" >"$R/exactness.log"
    if [ ! -s "$R/rest.txt" ]; then
      echo "every collected case passed before (EXACT_PASSED=$EXACT_PASSED)" >>"$R/exactness.log"
      LC_ALL=C sort -u "$EXACT_PASSED" >"$R/passed.txt"; return
    fi
    mapfile -t select <"$R/rest.txt"
  fi
  timeout -s INT -k 30 "${T_EXACT:-300}" python3 -m pytest -m "$EXACT_MARK" -q -rfEp \
    -p no:cacheprovider -W ignore::DeprecationWarning -n "${XDIST:-12}" --junitxml="$R/junit.xml" \
    "${select[@]}" >>"$R/exactness.log" 2>&1
  echo "pytest exit: $?" >>"$R/exactness.log"
  { sed -n 's/^PASSED //p' "$R/exactness.log"; [ -n "${EXACT_PASSED:-}" ] && cat "$EXACT_PASSED"; } \
    | LC_ALL=C sort -u >"$R/passed.txt"
}
run_bias() {
  timeout "${T_BIAS:-280}" forge-num report bias --device gpu --draws "${BIAS_DRAWS:-1000000}" --out "$R/bias" \
    >"$R/bias.log" 2>&1; echo "bias exit: $?" >>"$R/bias.log"
}
run_kernels() {
  [ "${T_KERNELS:-200}" -gt 0 ] && timeout "${T_KERNELS:-200}" python3 bench/kernels.py ${KERNEL_ARGS:---precision fp32} \
    --out "$R/kernels.json" 2>&1 | tee "$R/kernels.log" | tail -3
  [ "${T_KERNELS_LOWBIT:-90}" -gt 0 ] && timeout "${T_KERNELS_LOWBIT:-90}" python3 bench/kernels.py ${KERNEL_ARGS_LOWBIT:---precision bf16-sr,8bit --shapes 4096x4096,14336x4096} \
    --out "$R/kernels_lowbit.json" 2>&1 | tee "$R/kernels_lowbit.log" | tail -3
}
run_mainloop() {
  timeout "${T_MAINLOOP:-150}" python3 bench/kernels.py --mainloop ${MAINLOOP_ARGS:---shapes 4096x4096,14336x4096 --tokens 1024,4096,16384} \
    --out "$R/mainloop.json" 2>&1 | tee "$R/mainloop.log" | tail -8
}
run_train() {
  timeout "${T_TRAIN:-300}" python3 bench/train_step.py ${TRAIN_ARGS:---models llama-1b,llama-8b --tokens 1x2048 --checkpointing on --warmup 2 --steps 4} \
    --budget-s $(( ${T_TRAIN:-300} - 40 )) --out "$R/train_step.json" >"$R/train_step.log" 2>&1; tail -20 "$R/train_step.log"
}
run_capacity() {
  timeout "${T_CAPACITY:-200}" python3 bench/capacity.py ${CAPACITY_ARGS:---methods torch_adamw,forge --search layers} \
    --budget-s $(( ${T_CAPACITY:-200} - 30 )) --out "$R/capacity.json" >"$R/capacity.log" 2>&1; tail -12 "$R/capacity.log"
}
run_host() {
  timeout "${T_HOST:-200}" python3 bench/host_time.py ${HOST_ARGS:-} --out "$R/host_time.json" >"$R/host_time.log" 2>&1
  echo "host_time exit: $?" >>"$R/host_time.log"
}
run_ncu() {
  local end=$(( SECONDS + ${T_NCU:-150} )) pt shape tokens tiles
  for pt in ${NCU_POINTS:-4096x4096:256 4096x4096:16384}; do
    IFS=: read -r shape tokens tiles <<<"$pt"
    timeout $(( end - SECONDS > 5 ? end - SECONDS : 5 )) ncu --clock-control none --profile-from-start off \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats \
      python3 bench/ncu_probe.py --shape "$shape" --tokens "$tokens" --configs "${tiles:-default}" \
      >"$R/ncu_${shape}_${tokens}.txt" 2>&1
    echo "ncu $pt exit: $?" >>"$R/ncu.log"
  done
}
run_fidelity() {
  timeout "${T_FIDELITY:-200}" python3 bench/fidelity.py ${FIDELITY_ARGS:---parts update --run-timeout 120} \
    --out "$R/fidelity.json" >"$R/fidelity.log" 2>&1; tail -20 "$R/fidelity.log"
}

# A part "a+b" runs a and b side by side (for parts whose timings do not matter).
for part in "$@"; do
  echo "== $part $(date -u +%H:%M:%S)"
  for p in ${part//+/ }; do
    case "$p" in
      kernels|mainloop|exactness|bias|train|capacity|fidelity|host|ncu) "run_$p" & ;;
      *) echo "unknown part $p" ;;
    esac
  done
  wait
done

echo "== summary $(date -u +%H:%M:%S)"
{ [ -f "$R/kernels.log" ] || [ -f "$R/kernels_lowbit.log" ]; } && grep -E "^(fp32|bf16|8bit)|ceilings" "$R/kernels.log" "$R/kernels_lowbit.log" 2>/dev/null | cut -c1-230
if [ -f "$R/exactness.log" ]; then
  grep -E "^(FAILED|ERROR)" "$R/exactness.log" | cut -c1-200 | head -30
  tail -3 "$R/exactness.log"
  [ -f "$R/exactness_cases.jsonl" ] && python3 -c "
import collections, json
c = collections.Counter(json.loads(l)['case'] for l in open('$R/exactness_cases.jsonl'))
print('passing hypothesis cases:', ' '.join(f'{k}={v}' for k, v in sorted(c.items())))"
fi
[ -f "$R/bias.log" ] && tail -6 "$R/bias.log"
[ -f "$R/ncu.log" ] && { echo "-- ncu"; cat "$R/ncu.log"; for f in "$R"/ncu_*.txt; do echo "# $f"
  grep -E "^  [a-zA-Z_0-9]+.*\(|Duration|DRAM Throughput|L2 Hit Rate|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit Reg|Stall Long|Warp Cycles Per Issued|Compute \(SM\) Throughput" "$f" | cut -c1-150 | head -90; done; }
[ -f "$R/host_time.log" ] && { echo "-- host_time"; head -120 "$R/host_time.log"; }
for f in train_step capacity fidelity; do [ -f "$R/$f.log" ] && { echo "-- $f"; tail -25 "$R/$f.log"; }; done
tar czf "$OUT/results.tgz" -C "$R" . && cp "$R/env.txt" "$OUT/" && ls -la "$OUT"
