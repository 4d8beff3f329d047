# Sourced by a device call's script (bench/results/<date>-s<N>/call*.sh), from the repository root on the
# device machine: what every call does first and last, written once.
#   budget S     seconds for the next part: S, or what is left of CALL_BUDGET_S (default 570) if less
#   call_begin   installs forge_num (editable, no dependencies), flashoptim from .whl into /tmp/site (its
#                baselines run with PYTHONPATH=/tmp/site), pytest-xdist; records the GPU and versions
#   train TAG S FLAG ARGS...   bench/train_step.py (checkpointing on, 3 warm-up steps) with ARGS under S
#                seconds of the budget, FORGE_NUM_GLUON_Q8=FLAG (- leaves it unset; a FLAG VAR=VALUE sets
#                that variable instead), into $R/TAG.{json,log};
#                prints its rows
#   kern_table F prints bench/kernels.py's JSON F as a table: a row a shape and K, a column a tile label
#                (its common prefix dropped), the medians of its rounds in ms; then the launcher's route, the
#                unfused step and the floor, in ms
#   flake TAG N RUNS ARGS...   bench/results/2026-12-06-s36/flake_where.py (a Llama-1B-wide model trained
#                eager and captured, compared bit for bit) in N processes at once, RUNS runs each, with ARGS
#                and the environment as exported, under 120 s of the budget, into $R/TAG<p>.log; prints each
#                process's count of parted runs
#   call_end     the results folder $R packed into $OUT/results.tgz, env.txt beside it
#   run_parts DEFAULT   a call that carries a Triton (.tri/1: bench/triton_carry.sh): receives and installs
#                it, call_begin, the parts PART names (comma-separated; DEFAULT if unset), each the
#                function part_<name> the script defined, then call_end
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
OUT=${OUT:-out}
R=/tmp/fn_call
export PYTHONUNBUFFERED=1

budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }

call_begin() {
  rm -rf "$R"; mkdir -p "$R" "$OUT"
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl \
    >>"$R/install.log" 2>&1
  python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
}

train() {
  local tag=$1 secs=$2 flag=$3; shift 3
  echo "== $tag $(date -u +%T) $([[ "$flag" == *=* ]] && echo "$flag" || echo "FORGE_NUM_GLUON_Q8=$flag")"
  ( if [[ "$flag" == *=* ]]; then export "${flag?}"; elif [ "$flag" != - ]; then export FORGE_NUM_GLUON_Q8=$flag; fi
    # /tmp/site before what the caller had (bench/triton_carry.sh use's carried Triton)
    PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget "$secs")" python3 bench/train_step.py \
      --checkpointing on --warmup 3 \
      --budget-s "$(( $(budget "$secs") - 20 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1 )
  echo "$tag rc=$?"; grep -vE "^#|^$|^ratios" "$R/$tag.log" | cut -c1-220 | tail -24
}

kern_table() {
  python3 - "$1" <<'PY'
import json, os, sys
rows = json.load(open(sys.argv[1]))["rows"]
labels = list(rows[0]["per_label_ms"])
common = os.path.commonprefix(labels)
common = common[:common.rfind(" ") + 1]  # whole words
print("ms (median of the rounds)" + "".join(f"{l[len(common):].replace(' rows16 mma96 r96', '')[:22]:>24s}" for l in labels)
      + "".join(f"{c:>9s}" for c in ("route", "unfused", "floor")))
for r in rows:
    print(f"{r['M']}x{r['N']} K={r['K']:<5d}".ljust(25) + "".join(f"{r['per_label_ms'][l]:24.3f}" for l in labels)
          + "".join(f"{r[c]:9.3f}" for c in ("forge_ms", "unfused_ms", "floor_ms")))
PY
}

flake() {
  local tag=$1 n=$2 runs=$3; shift 3
  echo "== $tag $(date -u +%T)"
  for p in $(seq "$n"); do
    timeout "$(budget 120)" python3 bench/results/2026-12-06-s36/flake_where.py "$runs" "$tag$p" "$@" >"$R/$tag$p.log" 2>&1 &
  done
  wait
  grep -h "parted\|Error" "$R/$tag"*.log | grep -v Warning | cut -c1-200 | head -8
}

call_end() {
  echo "== done $(date -u +%T)"
  date -u >>"$R/env.txt"
  tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
}

run_parts() {
  bash bench/triton_carry.sh receive 1 | tail -1
  bash bench/triton_carry.sh install >/dev/null || exit 1
  call_begin
  local part
  for part in $(echo "${PART:-$1}" | tr , " "); do "part_$part"; done
  call_end
}
