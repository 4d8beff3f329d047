#!/usr/bin/env bash
# Session 19's call (session 17's call 1, with session 19's host split): carry .whl (the baselines'
# wheels, and .whl/ab-c4c1edf/: a wheel of c4c1edf, session 16's code, before v26, v28, v29, the
# loss's aten chunk gradient, the 8bit launcher's fast checks and v30). In order of need, each step
# under what is left of CALL_BUDGET_S (default 570 s from the script's start):
#  1. the GPU bits of v26 and v30 (gathered rows in both kernels, the tied rows on CUDA's embedding
#     kernels, gpt2's tied head in 8bit and bf16-sr against the materialized reference, its backward
#     under CUDA's sync debug mode);
#  2. the tree's 8bit step at Llama-1B 4x1024 beside flashoptim+cl: peaks by phase, tokens/s, the
#     step profiled (kernel time by category against the wall);
#  3. forge_8bit+cl's host time split by function beside flashoptim+cl's at 1B 4x1024
#     (bench/host_time.py --part split --split-methods);
#  4. the tree's 3B 4x1024 beside flashoptim+cl; 5. the 1B step on c4c1edf's wheel (the A of the A/B).
# Packed into $OUT/results.tgz.
set -uo pipefail
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))  # CALL_BUDGET_S: less where less device time is left
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s19c; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
A=/tmp/forge_ab; rm -rf "$A"; mkdir -p "$A"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$A" .whl/ab-c4c1edf/*.whl >>"$R/install.log" 2>&1 \
  || { cat "$R/install.log"; exit 1; }
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
echo "== v26 bits $(date -u +%T)"
HYPOTHESIS_PROFILE=ci timeout -s INT -k 10 "$(budget 150)" python3 -m pytest -q -rfE -p no:cacheprovider -n 8 \
  tests/test_gathered_rows.py tests/test_tied_rows.py tests/test_gpu_training.py -k "gathered or tied or chunked" \
  --junitxml="$R/junit.xml" >"$R/tests.log" 2>&1
TRAIN=(--checkpointing on --warmup 2 --steps 3 --memory-phases)
echo "== 1B 4x1024 tree $(date -u +%T)"
timeout "$(budget 150)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl --models llama-1b \
  --tokens 4x1024 "${TRAIN[@]}" --profile --out "$R/train_1b.json" >"$R/train_1b.log" 2>&1
echo "== host split 1B 4x1024 $(date -u +%T)"
timeout "$(budget 120)" python3 bench/host_time.py --part split --split-model llama-1b --split-tokens 4x1024 \
  --split-methods forge_8bit+cl,flashoptim+cl --split-steps 5 --out "$R/host_split_1b.json" >"$R/host_split_1b.log" 2>&1
echo "== 3B 4x1024 tree $(date -u +%T)"
timeout "$(budget 170)" python3 bench/train_step.py --methods forge_8bit+cl,flashoptim+cl --models llama-3b \
  --tokens 4x1024 "${TRAIN[@]}" --out "$R/train_3b.json" >"$R/train_3b.log" 2>&1
echo "== 1B 4x1024 A (c4c1edf) $(date -u +%T)"
# from a copy of bench/ outside the repository: run from it, bench/ puts the repository root on sys.path, and
# transformers' probe for a `kernels` package imported the tree's kernels/ against the wheel's forge_num (the
# ImportError of the 13:29 run; its README says so)
mkdir -p "$A/run" && cp -r bench "$A/run/"
PYTHONPATH="$A:/tmp/site" timeout "$(budget 120)" python3 "$A/run/bench/train_step.py" --methods forge_8bit+cl --models llama-1b \
  --tokens 4x1024 "${TRAIN[@]}" --out "$R/train_1b_A.json" >"$R/train_1b_A.log" 2>&1
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
tail -1 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | cut -c1-200 | head
grep -E "^split|ms/step" "$R/host_split_1b.log" | head -40
python3 - "$R" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "train_*.json"))):
    data = json.load(open(f))
    print(os.path.basename(f), "forge_num from", data["meta"].get("forge_num_path"))
    for r in data.get("rows", []):
        print(os.path.basename(f), r.get("model"), "%sx%s" % (r.get("batch"), r.get("seq")), r.get("method"), r.get("status"),
              "peak %.2f GiB" % r["peak_gib"] if r.get("peak_gib") else "", "tok/s %.0f" % r["tokens_per_s"] if r.get("tokens_per_s") else "")
        if r.get("profile_ms"):
            print("   profile wall %.1f ms, kernels %.1f ms:" % (r["profile_wall_ms"], r["profile_device_ms"]),
                  ", ".join("%s %.1f" % kv for kv in r["profile_ms"].items()))
PY
