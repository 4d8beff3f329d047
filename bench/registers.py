"""Registers and spills of the fused kernel per tile configuration, from ptxas, without a GPU.

Compiles kernels.fused_linear_update_kernel for sm_90 with the specializations a real launch gets
for contiguous operands (unit inner strides, sizes and pointers divisible by 16), then runs the
ptxas that ships with Triton with ``-v``. Spills (local-memory traffic) in the epilogue were the
first cause of the v0 kernel's slowness (bench/NOTES.md).

    python bench/registers.py [--rule adamw] [--dtype bf16] [--precision fp32|bf16-sr|8bit] [--candidates] [--sass]
                              [--by-source] [--gluon-q8]

``--sass`` adds each tile's main path: the SASS instructions up to the first EXIT, i.e. without the
out-of-line slow paths of the IEEE division and square root (which their FCHK-guarded branches
rarely take), per element a thread updates, and its most frequent opcodes. A loop's body counts
once, so where the mainloop is short the count is close to the dynamic one: the 8bit small-K tile's
307.6 an element against ncu's 311 on the H200 at K = 256 (session 16).

``--by-source`` splits those instructions by the source file and line they come from (ptxas
``-lineinfo``; Triton's PTX carries every inlined function's own file and line), per element: which
part of the update costs what (the 8bit TMA tile at the start of session 24: quant8 81, the rule's IEEE
ops 69, Philox 46, the tile's loads, stores and telemetry 42 of 264 an element; a tile that leaves
early through a predicated EXIT, as the persistent staged one, counts only that far). ``--gluon-q8``
reports the Gluon 8bit kernel's tiles (kernels/gluon_q8.py) instead: its partitions have no single main path,
so every instruction of the kernel counts, per element an epilogue thread updates in a tile.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from forge_num import kernels, rules
from forge_num.kernels.linear_update import fused_linear_update_kernel
from forge_num.kernels.rules import guarded_update_jit


def _sm90_ptxas() -> str:
    """The ptxas Triton itself runs for sm_90: from Triton 3.9 its CUDA 13 one ("ptxas-blackwell") for every
    target from sm_90, whose PTX (.version 9.x) the older ptxas beside it refuses; the one named ptxas before."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(90).path
    except (ImportError, AttributeError):  # a Triton before get_ptxas
        return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


PTXAS = _sm90_ptxas()
DIV16 = ["w_ptr", "s0_ptr", "s1_ptr", "x_ptr", "dy_ptr", "accum_ptr", "acc_out_ptr", "norm_sq_ptr",
         "nonfinite_ptr", "stage_ptr", "M", "N", "K", "stride_xk", "stride_dyk", "slots_n"]


STORAGE = {"fp32": ("*fp32", "*fp32"), "bf16-sr": ("*bf16", "*bf16"), "8bit": ("*bf16", "*u8")}


def compile_ptx(cfg: kernels.TileConfig, rule: rules.Rule, dtype: str, precision: str = "fp32") -> str:
    w_ty, s_ty = STORAGE[precision]
    sig = {"w_ptr": w_ty, "s0_ptr": s_ty, "s1_ptr": s_ty, "x_ptr": f"*{dtype}", "dy_ptr": f"*{dtype}",
           "accum_ptr": "*fp32", "acc_out_ptr": "*fp32", "norm_sq_ptr": "*fp64", "nonfinite_ptr": "*i32", "stage_ptr": "*fp32",
           # TMA configurations get the descriptors a launch with unit inner strides makes
           "x_desc": f"tensordesc<{dtype}[{cfg.BK}, {cfg.BN}]>" if cfg.tma else "constexpr",
           "dy_desc": f"tensordesc<{dtype}[{cfg.BK}, {cfg.BM}]>" if cfg.tma else "constexpr",
           "scale0_ptr": "*fp32", "scale1_ptr": "*fp32", "n_blocks": "i32", "M": "i32", "N": "i32", "K": "i32", "stride_xk": "i32", "stride_xn": "i32", "stride_dyk": "i32",
           "stride_dym": "i32", "h": tuple("fp32" for _ in rule.scalar_names), "grad_scale": "fp32", "seed": "u64",
           "rand_stride": "i32", "rand_base": "i64", "rand_rows": "constexpr", "step_slot": "constexpr",
           "slots_n": "i32"}
    const = {"stride_xn": 1, "stride_dym": 1, "GUARDED_UPDATE": guarded_update_jit(rule), "N_STATE": len(rule.state), "BF16_STORAGE": precision == "bf16-sr", "STATE_Q8": precision == "8bit",
             "UPDATE": True, "STORE_ACC": False, "HAS_ACCUM": False,
             "INPUT_PRECISION": "ieee" if dtype == "fp32" else "tf32",
             "BM": cfg.BM, "BN": cfg.BN, "BK": cfg.BK, "EPILOGUE_SPLIT": cfg.epilogue_split,
             "PERSISTENT": bool(cfg.persistent), "GROUP_M": 8, "USE_TMA": cfg.tma,
             "STAGED": cfg.staged}
    if not cfg.tma:
        const.update(x_desc=None, dy_desc=None)
    const["rand_rows"] = None  # gathered rows' counters: not in a training step's launches
    const["step_slot"] = None  # the eager step's launch: the scalars as arguments
    for k in const:
        sig[k] = "constexpr"
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in DIV16}
    src = ASTSource(fn=fused_linear_update_kernel, signature=sig, constexprs=const, attrs=attrs)
    options = {"enable_fp_fusion": False, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
               "maxnreg": cfg.max_registers or None}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def resource_usage(ptx: str) -> dict:
    """{'registers', 'spill_stores', 'spill_loads', 'stack'} as ptxas -v reports them (bytes)."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        out = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", "--fmad=false", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    text = out.stdout + out.stderr

    def grab(pattern):
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    # C7515: "wgmma.mma_async instructions are serialized due to non wgmma instructions defining
    # accumulator registers of a wgmma between start and end of the pipeline stage" -- the tensor-core
    # pipeline runs one wgmma at a time (seen on the capped 64x128 8bit tile, session 15)
    return {"registers": grab(r"Used (\d+) registers"), "spill_stores": grab(r"(\d+) bytes spill stores"),
            "spill_loads": grab(r"(\d+) bytes spill loads"), "stack": grab(r"(\d+) bytes stack frame"),
            "wgmma_serialized": "C7515" in text}


def sass_of(ptx: str, line_info: bool = False) -> str:
    """nvdisasm's text of the cubin ptxas makes of ptx (sm_90a, no FMA contraction); with
    ``line_info``, each run of instructions preceded by its source's ``//## File "...", line N``."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(ptx)
        subprocess.run([PTXAS, "--gpu-name=sm_90a", "--fmad=false", *(["-lineinfo"] if line_info else []),
                        os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k.cubin")],
                       capture_output=True, text=True, check=True)
        return subprocess.run([os.path.join(os.path.dirname(PTXAS), "nvdisasm"), "-c",
                               *(["-g"] if line_info else []), os.path.join(d, "k.cubin")],
                              capture_output=True, text=True, check=True).stdout


_SASS_LINE = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def main_path(sass: str) -> collections.Counter:
    """Opcodes (first dotted part: IMAD.WIDE.U32 -> IMAD) of the instructions from the kernel's first
    up to and including its first EXIT, predicates dropped: the path every thread runs, without the
    subroutines placed after it."""
    ops = collections.Counter()
    for line in sass.splitlines():
        m = _SASS_LINE.match(line)
        if not m:
            continue
        op = _PREDICATE.sub("", m.group(1)).split()[0].split(".")[0]
        ops[op] += 1
        if op == "EXIT":
            break
    return ops


_SOURCE_LINE = re.compile(r'\s*//## File "(.*?)", line (\d+)')


def by_source(sass: str, whole: bool = False) -> collections.Counter:
    """Instructions of nvdisasm -g's text by (source file name, line): those of the main path
    (main_path's: up to the first EXIT), or with ``whole`` every instruction of the kernel."""
    lines = collections.Counter()
    where = ("?", 0)
    for line in sass.splitlines():
        m = _SOURCE_LINE.match(line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = _SASS_LINE.match(line)
        if not m:
            continue
        lines[where] += 1
        if not whole and _PREDICATE.sub("", m.group(1)).split()[0].split(".")[0] == "EXIT":
            break
    return lines


def print_by_source(lines: collections.Counter, per_thread: int, top: int = 12) -> None:
    files = collections.Counter()
    for (name, _), n in lines.items():
        files[name] += n
    print("    by file, an element: "
          + ", ".join(f"{name} {n / per_thread:.1f}" for name, n in files.most_common()))
    print("    heaviest lines: "
          + ", ".join(f"{name}:{line} {n / per_thread:.1f}" for (name, line), n in lines.most_common(top)))


def gluon_q8_report(rule: rules.Rule, by_lines: bool) -> None:
    """--gluon-q8: the Gluon 8bit kernel's tiles (the default and the candidates), registers, spills and
    (--sass or --by-source) its instructions by source file and line."""
    from forge_num.kernels import gluon_q8

    for c in (gluon_q8.DEFAULT_Q8_WS_CONFIG, *gluon_q8.Q8_WS_CANDIDATE_CONFIGS):
        ptx = gluon_q8.compile_for_sm90(rule, c).asm["ptx"]
        u = resource_usage(ptx)
        print(f"{c.label}: {u['registers']} registers at most, spill stores {u['spill_stores']} B, "
              f"loads {u['spill_loads']} B")
        if by_lines:
            lines = by_source(sass_of(ptx, line_info=True), whole=True)
            # the tile's BM x BN elements over its num_warps epilogue warps (the MMA and loader warps' few
            # instructions counted with theirs)
            per_thread = c.BM * c.BN // (32 * c.num_warps)
            total = sum(lines.values())
            print(f"    kernel {total} instructions, {total / per_thread:.1f} an element")
            print_by_source(lines, per_thread)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rule", default="adamw")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="mainloop operands")
    ap.add_argument("--precision", default="fp32", choices=sorted(STORAGE), help="weight/state storage")
    ap.add_argument("--candidates", action="store_true", help="the benchmark's candidates instead of the launcher's lists")
    ap.add_argument("--sass", action="store_true", help="also the main path's SASS instructions per element")
    ap.add_argument("--by-source", action="store_true",
                    help="with --sass (implied with --gluon-q8): the instructions by source file and line")
    ap.add_argument("--gluon-q8", action="store_true",
                    help="the Gluon 8bit kernel's tiles instead (kernels/gluon_q8.py; --rule only)")
    args = ap.parse_args(argv)
    rule = rules.get_rule(args.rule)
    if args.gluon_q8:
        gluon_q8_report(rule, args.sass or args.by_source)
        return 0
    torch_dtype = kernels.torch.bfloat16 if args.dtype == "bf16" else kernels.torch.float32
    cfgs = kernels.Q8_CONFIGS[torch_dtype] if args.precision == "8bit" else kernels.configs_for(torch_dtype)
    if args.candidates:
        cfgs = kernels.CANDIDATE_Q8_CONFIGS if args.precision == "8bit" else kernels.CANDIDATE_CONFIGS
    for cfg in cfgs:
        ptx = compile_ptx(cfg, rule, args.dtype, args.precision)
        u = resource_usage(ptx)
        print(f"{cfg}: {u['registers']} registers, spill stores {u['spill_stores']} B, loads {u['spill_loads']} B"
              + (", wgmma serialized (ptxas C7515)" if u["wgmma_serialized"] else ""))
        if args.sass:
            sass = sass_of(ptx, line_info=args.by_source)
            ops = main_path(sass)
            per_thread = cfg.BM * cfg.BN // (32 * cfg.num_warps)
            print(f"    main path {sum(ops.values())} instructions, {sum(ops.values()) / per_thread:.1f} an element; "
                  + ", ".join(f"{op} {n}" for op, n in ops.most_common(8)))
            if args.by_source:
                print_by_source(by_source(sass), per_thread)
    return 0


if __name__ == "__main__":
    sys.exit(main())
