#!/usr/bin/env bash
# A newer Triton on the device, carried in a few calls (session 41). Why: Gluon's TMA copy takes `multicast` from
# Triton 3.7 on (triton-lang/triton#9005; the device's Triton is 3.6, which has none), the lever bench/NOTES.md
# names for the fp32 kernel at 1024-16384 tokens. The device has no network and a call carries at most 64 MiB with
# the working tree (~17 MB); Triton 3.9's cp312 wheel is ~250 MB. What forge_num needs of it (the compiler
# libtriton.so without its debug sections, the Python package; not CUPTI, proton, nvdisasm, ptxas: the host
# Triton's serves) is one tar.xz in parts of 48 MB (session 42: one part for 3.9; session 41's bundle, with
# ptxas and the debug sections, took three).
#
#   here:     bash bench/triton_carry.sh prepare [VERSION]    -> .tri/1/ .. .tri/N/ (a part each, the bundle's sha256)
#   device:   call i = 1 .. N on one warm machine (each within the last's 30 s idle release), carry [".tri/i"]:
#                       bash bench/triton_carry.sh receive i
#             the last of them, or one after:  bash bench/triton_carry.sh install && ...
#             later calls on that machine:  source bench/triton_carry.sh use; then python3 imports that Triton
#
# The parts land in .tri_got/ and the package in .tri_site/ (ignored paths: a warm machine keeps them between
# calls; a fresh one starts without them). `use` puts .tri_site first on PYTHONPATH; torch 2.11 there keeps its own
# Triton 3.6 for torch.compile, which forge_num does not call. CI and the README's commands stay on
# constraints.txt's Triton.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "${1:-}" = use ]; then  # sourced: the caller's shell options stay as they were
  # the host Triton's ptxas for the carried one (the bundle has none), found before PYTHONPATH changes (once)
  [ -n "${TRITON_PTXAS_PATH:-}" ] || TRITON_PTXAS_PATH=$(python3 -c "import os, triton; \
print(os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'ptxas'))")
  export TRITON_PTXAS_PATH TRITON_PTXAS_BLACKWELL_PATH=$TRITON_PTXAS_PATH
  export PYTHONPATH="$ROOT/.tri_site${PYTHONPATH:+:$PYTHONPATH}"
  return 0 2>/dev/null || exit 0
fi
set -euo pipefail

prepare() {
  local version=${1:-3.7.0} work
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$work" "triton==$version"
  mkdir "$work/pkg"
  (cd "$work/pkg" && python3 -m zipfile -e "$work"/triton-"$version"-*.whl .)
  # what forge_num's kernels never load: CUPTI and proton (profiling), nvdisasm, a test library, the AMD backend's
  # code generator (its Python stays: the host's Triton 3.6 metadata names it as an entry point, imported at
  # start), and both ptxas: `use` points Triton at the host Triton's own (3.6's, CUDA 12.8), which the
  # driver surely runs, and which assembles 3.9's PTX for sm_90 as 13.4 does (session 42: the same spills, the
  # same code, probed here)
  rm -rf "$work/pkg/triton/backends/nvidia/lib/cupti" "$work/pkg/triton/backends/nvidia/lib/cupti-blackwell" \
    "$work/pkg/triton/backends/amd/lib" "$work/pkg/triton/backends/nvidia/bin/ptxas" \
    "$work/pkg/triton/backends/nvidia/bin/ptxas-blackwell" "$work/pkg/triton/backends/nvidia/bin/nvdisasm" \
    "$work/pkg/triton/_C/libproton.so" "$work/pkg/triton/instrumentation/libGPUInstrumentationTestLib.so"
  # the compiler library's debug sections (500 MB -> 192 MB for 3.9; its dynamic symbols stay)
  strip --strip-unneeded "$work/pkg/triton/_C/libtriton.so"
  chmod +x "$work/pkg/triton/backends/nvidia/bin/"*  # zipfile drops the mode bits
  tar -C "$work/pkg" -cf - . | xz -T0 -6 >"$work/bundle.tar.xz"
  # parts of 48 MB: with the working tree (~17 MB) under a call's 64 MiB (67.1 MB)
  rm -rf "$ROOT/.tri"
  split -b 48000000 -d "$work/bundle.tar.xz" "$work/part"
  local sum n=0
  sum=$(sha256sum <"$work/bundle.tar.xz" | cut -d' ' -f1)
  for part in "$work"/part*; do
    n=$((n + 1))
    mkdir -p "$ROOT/.tri/$n" && mv "$part" "$ROOT/.tri/$n/"
  done
  for i in $(seq "$n"); do echo "$sum $n triton==$version" >"$ROOT/.tri/$i/SHA256"; done
  rm -rf "$work"
  du -sh "$ROOT/.tri/"*
  echo "carry .tri/1 .. .tri/$n in $n calls on one warm machine (receive 1 .. receive $n), then install"
}

receive() {
  mkdir -p "$ROOT/.tri_got"
  cp "$ROOT/.tri/$1/"* "$ROOT/.tri_got/"
  ls -la "$ROOT/.tri_got"
}

install() {
  local want n got
  read -r want n _ <"$ROOT/.tri_got/SHA256"
  for i in $(seq 0 $((n - 1))); do
    [ -f "$ROOT/.tri_got/$(printf 'part%02d' "$i")" ] || { echo "triton_carry: part $((i + 1)) of $n missing from \
.tri_got (a fresh machine: receive every part on one warm machine)" >&2; exit 1; }
  done
  got=$(cat "$ROOT/.tri_got"/part* | sha256sum | cut -d' ' -f1)
  [ "$want" = "$got" ] || { echo "triton_carry: the bundle's sha256 is $got, not $want" >&2; exit 1; }
  rm -rf "$ROOT/.tri_site" && mkdir -p "$ROOT/.tri_site"
  cat "$ROOT/.tri_got"/part* | xz -dc | tar -C "$ROOT/.tri_site" -xf -
  (source "$ROOT/bench/triton_carry.sh" use && python3 -c "import triton; print('triton', triton.__version__, \
triton.__file__)" && "$TRITON_PTXAS_PATH" --version | tail -1)
}

case "${1:-}" in
  prepare) prepare "${2:-}" ;;
  receive) receive "$2" ;;
  install) install ;;
  *) echo "usage: bash bench/triton_carry.sh prepare [VERSION] | receive I | install; source ... use" >&2; exit 2 ;;
esac
