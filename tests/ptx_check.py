"""Compile forge_num's kernels to PTX for sm_90 (no GPU needed) and count IEEE instructions.

Run as a script (``python -m tests.ptx_check``) or through tests/test_ptx_subprocess.py, which runs
it in a subprocess without TRITON_INTERPRET (the test session itself interprets kernels on CPU).
"""

from __future__ import annotations

import ast
import collections
import inspect
import json
import re
import sys

PTX_OP = {"add": "add.rn.f32", "sub": "sub.rn.f32", "mul": "mul.rn.f32", "fma": "fma.rn.f32",
          "div": "div.rn.f32", "sqrt": "sqrt.rn.f32"}
FORBIDDEN = [r"div\.full\.f32", r"div\.approx", r"sqrt\.approx", r"rcp\.approx", r"rsqrt", r"\bmad(\.\w+)?\.f32",
             r"fma\.rn\.ftz", r"\bex2\.", r"\.ftz\b"]


def vocabulary_calls(fn) -> collections.Counter:
    tree = ast.parse(inspect.getsource(fn))
    return collections.Counter(n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name))


def compile_ptx(kernel, signature, constexprs, options=None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # parameters left at their defaults (constexprs such as RAND_REMAP=False): Triton 3.6's ASTSource took them
    # from the function, 3.9's leaves their types unset; named here for both
    signature, constexprs = dict(signature), dict(constexprs)
    for p in kernel.params:
        if p.name not in signature and p.has_default:
            signature[p.name], constexprs[p.name] = "constexpr", p.default
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    opts = {"enable_fp_fusion": False, "num_warps": 4}
    opts.update(options or {})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]


def count(ptx: str) -> dict:
    return {op: len(re.findall(re.escape(instr) + r"\b", ptx)) for op, instr in PTX_OP.items()}


def forbidden(ptx: str) -> list:
    return [pat for pat in FORBIDDEN if re.search(pat, ptx)]


def check_elementwise(rule_name: str, slot: bool = False) -> dict:
    """``slot``: the launch reads its scalars from a step slot (linear_update.step_scalars): the same
    rule ops, from loaded values."""
    from forge_num import rules
    from forge_num.kernels.linear_update import elementwise_update_kernel
    from forge_num.kernels.rules import guarded_update_jit

    rule = rules.get_rule(rule_name)
    n_state = len(rule.state)
    sig = {"p_ptr": "*fp32", "g_ptr": "*fp32", "s0_ptr": "*fp32", "s1_ptr": "*fp32", "norm_sq_ptr": "*fp64",
           "nonfinite_ptr": "*i32", "numel": "i32", "h": tuple("fp32" for _ in rule.scalar_names),
           "grad_scale": "fp32", "seed": "u64", "rand_cols": "i32", "rand_stride": "i32", "rand_base": "i64",
           "rand_rows": "constexpr", "step_slot": "constexpr", "GUARDED_UPDATE": "constexpr", "N_STATE": "constexpr",
           "BF16_STORAGE": "constexpr", "BLOCK": "constexpr"}
    # BLOCK = 128 threads x 1 element: each op appears once per element in the PTX
    const = {"GUARDED_UPDATE": guarded_update_jit(rule), "N_STATE": n_state, "BF16_STORAGE": False, "BLOCK": 128,
             "rand_rows": None, "step_slot": None}
    if slot:
        sig["step_slot"] = "*i32"
        del const["step_slot"]
    ptx = compile_ptx(elementwise_update_kernel, sig, const)
    calls = vocabulary_calls(rule.update) + vocabulary_calls(rules.guarded_update)
    expected = {op: calls.get(op, 0) for op in PTX_OP}
    return {"rule": rule_name, "slot": slot, "expected": expected, "ptx": count(ptx), "forbidden": forbidden(ptx)}


def check_fused(rule_name: str, dtype: str, slot: bool = False) -> dict:
    from forge_num import rules
    from forge_num.kernels.linear_update import fused_linear_update_kernel
    from forge_num.kernels.rules import guarded_update_jit

    rule = rules.get_rule(rule_name)
    sig = {"w_ptr": "*fp32", "s0_ptr": "*fp32", "s1_ptr": "*fp32", "x_ptr": f"*{dtype}", "dy_ptr": f"*{dtype}",
           "accum_ptr": "*fp32", "acc_out_ptr": "*fp32", "norm_sq_ptr": "*fp64", "nonfinite_ptr": "*i32", "stage_ptr": "*fp32",
           "x_desc": "constexpr", "dy_desc": "constexpr",
           "scale0_ptr": "*fp32", "scale1_ptr": "*fp32", "n_blocks": "i32", "M": "i32", "N": "i32", "K": "i32", "stride_xk": "i32", "stride_xn": "i32", "stride_dyk": "i32",
           "stride_dym": "i32", "h": tuple("fp32" for _ in rule.scalar_names), "grad_scale": "fp32",
           "seed": "u64", "rand_stride": "i32", "rand_base": "i64", "rand_rows": "constexpr", "step_slot": "constexpr",
           "slots_n": "i32"}
    const = {"GUARDED_UPDATE": guarded_update_jit(rule), "N_STATE": len(rule.state), "BF16_STORAGE": False, "STATE_Q8": False, "UPDATE": True,
             "STORE_ACC": False, "HAS_ACCUM": False, "INPUT_PRECISION": "ieee" if dtype == "fp32" else "tf32",
             "BM": 64, "BN": 64, "BK": 32 if dtype == "bf16" else 16, "EPILOGUE_SPLIT": 2,
             "x_desc": None, "dy_desc": None, "USE_TMA": False, "rand_rows": None, "step_slot": None}
    if rule_name == "lion":
        # strides equal to 1 are specialized into Python ints at launch (a layer with one input or
        # output feature): the kernel must compile with them too
        const.update(stride_xk=1, stride_dyk=1)
    for k in const:
        sig[k] = "constexpr"
    if slot:  # the scalars read from a step slot (check_elementwise)
        sig["step_slot"] = "*i32"
        del const["step_slot"]
    ptx = compile_ptx(fused_linear_update_kernel, sig, const, {"num_stages": 2})
    return {"rule": rule_name, "dtype": dtype, "slot": slot, "ptx": count(ptx), "forbidden": forbidden(ptx),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "fma_total": len(re.findall(r"fma\.rn\.f32", ptx))}


def launch_specializations(kernel, names=("seed", "rand_base")) -> list:
    """The distinct specializations of the ``names`` arguments (of seed, rand_stride, rand_base)
    that Triton's binder gives launches of ``kernel`` with Philox keys, counter strides and counter
    bases of every class (0, 1, divisible by 16 or not, below 2^31, between 2^31 and 2^63, above
    2^63): the part of the compiled kernel's cache key they decide."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    params = [p.name for p in kernel.params]
    seen = set()
    for values in ((0, 0, 0), (1, 1, 1), (16, 17, 2**31), (2**31 + 5, 2**31 + 16, 2**40 + 16), (2**63, 3, 3),
                   (2**64 - 16, 2**40, 7)):
        args = {p.name: (p.default if p.has_default else 2) for p in kernel.params}
        args.update({n: v for n, v in zip(("seed", "rand_stride", "rand_base"), values) if n in names})
        _, specialization, _ = binder(**args)
        spec = dict(zip(params, specialization))
        seen.add(json.dumps([spec[n] for n in names]))
    return sorted(json.loads(s) for s in seen)


# a constant shared-memory address in Triton's LLVM IR: byte offset OFF of the kernel's shared memory
_SMEM = r"getelementptr \(i8, ptr addrspace\(3\) @global_smem, i32 (\d+)\)"


def barrier_reuse(llir: str) -> dict:
    """The kernel's mbarriers in its LLVM IR: how many it initializes and invalidates, and the byte offsets of
    shared memory that an mbarrier occupies and something else also uses as data (a TMA copy's destination, a
    pointer to a non-i64 element, a plain load or store), which must be none: PTX requires an mbarrier object
    invalidated before its memory has another use, and Triton's allocator reuses the bytes of a barrier array
    once past its last use in the program (an unused array: past its initialization; session 37 found the
    staged tiles' first staging slot over one). Barriers and their uses are found by their constant offsets
    (the kernels initialize theirs in unrolled loops)."""
    inits, invals, data = [], 0, set()
    for line in llir.splitlines():
        if "mbarrier.init" in line:
            inits += [int(o) for o in re.findall(_SMEM, line)]
        elif "mbarrier.inval" in line:
            invals += 1
        elif "cp.async.bulk" in line:  # a copy's destination: its first shared-memory operand
            m = re.search(r"\"\(i1 %\w+, ptr addrspace\(3\) " + _SMEM, line)
            if m:
                data.add(int(m.group(1)))
        elif "mbarrier" not in line:
            data.update(int(m.group(2)) for m in re.finditer(r"getelementptr (?:inbounds )?(\w+), ptr addrspace\(3\) "
                                                             + _SMEM, line) if m.group(1) != "i64")
            data.update(int(m.group(1)) for m in re.finditer(r"(?:load|store) [^,]*, ptr addrspace\(3\) " + _SMEM, line))
    return {"mbarrier_init": len(inits), "mbarrier_inval": invals,
            "barrier_bytes_as_data": sorted(o for o in data if any(b <= o < b + 8 for b in inits))}


def _gluon_resources(compiled) -> dict:
    """What every Gluon kernel's check reports beside its op counts: the Philox products, the wgmma and TMA
    instructions, the setmaxnreg register caps, the shared memory Triton allocates, its mbarriers
    (barrier_reuse) and ptxas's resources."""
    from bench.registers import resource_usage

    ptx = compiled.asm["ptx"]
    return {"mul_hi": len(re.findall(r"mul\.hi\.u32", ptx)), "mul_wide": len(re.findall(r"mul\.wide\.u32", ptx)),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "tma": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
            "setmaxnreg": len(re.findall(r"setmaxnreg", ptx)), "shared": int(compiled.metadata.shared),
            # 16-byte global stores: what the launch's specialization (divisibility 16) gives stores by pointer
            "st_v4": len(re.findall(r"st\.global[.\w:]*\.v4\.b32", ptx)),
            **barrier_reuse(compiled.asm["llir"]), **resource_usage(ptx)}


def check_gluon_ws(rule_name: str, config, precision: str = "fp32", slot: bool = False) -> dict:
    """The warp-specialized Gluon kernel (kernels/gluon_update.py) for sm_90 with one tile, in the
    fp32 or bf16-sr regime: IEEE op counts (each vocabulary op of the rule once per element a
    consumer thread updates), the wgmma chain, TMA copies, the partitions' register caps, ptxas
    resources and shared memory; bf16-sr: the Philox rounds' multiplications (two a round, ten
    rounds, per element: mul.hi.u32, or mul.wide.u32 with kernels/random.py's WIDE_PRODUCTS)."""
    from forge_num import rules
    from forge_num.kernels.gluon_update import compile_for_sm90

    rule = rules.get_rule(rule_name)
    bf16 = precision == "bf16-sr"
    compiled = compile_for_sm90(rule, config, bf16=bf16, slot=slot)
    ptx = compiled.asm["ptx"]
    calls = vocabulary_calls(rule.update) + vocabulary_calls(rules.guarded_update)
    per_thread = config.BM * config.BN // (32 * config.num_warps)  # elements a consumer thread updates
    consumers = 2 if config.pingpong else 1  # the ping-pong design: the consumer's code twice, one per warp group
    return {"rule": rule_name, "config": config.label, "precision": precision, "slot": slot, "ptx": count(ptx),
            "forbidden": forbidden(ptx),
            "expected": {op: calls.get(op, 0) * per_thread * consumers for op in PTX_OP},
            "consumers": consumers, "per_thread": per_thread,
            **_gluon_resources(compiled), "shared_model": config.shared_bytes(len(rule.state), 2 if bf16 else 4)}


def check_gluon_q8(rule_name: str, config, slot: bool = False, pairs: bool = True) -> dict:
    """The 8bit Gluon kernel (kernels/gluon_q8.py) for sm_90 with one tile: IEEE op counts (each op of
    the rule once per element an epilogue thread updates, and dequantization's two products a state:
    a code's bit fields times 2^(127 - TOP) and q * scale), the wgmma chain, TMA loads, the register
    caps, ptxas resources and shared memory; its Philox rounds' products (as in check_gluon_ws)."""
    from forge_num import rules
    from forge_num.kernels.gluon_q8 import compile_for_sm90

    rule = rules.get_rule(rule_name)
    compiled = compile_for_sm90(rule, config, slot=slot, pairs=pairs)
    ptx = compiled.asm["ptx"]
    calls = vocabulary_calls(rule.update) + vocabulary_calls(rules.guarded_update)
    calls["mul"] += 2 * len(rule.state)
    per_thread = config.BM * config.BN // (32 * config.num_warps)
    return {"rule": rule_name, "config": config.label, "slot": slot, "pairs": pairs, "BK": config.BK, "ptx": count(ptx),
            "forbidden": forbidden(ptx),
            "expected": {op: calls.get(op, 0) * per_thread for op in PTX_OP}, "per_thread": per_thread,
            **_gluon_resources(compiled), "shared_model": config.shared_bytes(len(rule.state))}


def check_gluon_f32(rule_name: str, config, slot: bool = False) -> dict:
    """The fp32 split Gluon kernel (kernels/gluon_f32.py) for sm_90 with one tile: IEEE op counts (each op of
    the rule once per element an epilogue thread updates), the wgmma chain, TMA loads, the register caps, ptxas
    resources and shared memory."""
    from forge_num import rules
    from forge_num.kernels.gluon_f32 import compile_for_sm90

    rule = rules.get_rule(rule_name)
    compiled = compile_for_sm90(rule, config, slot=slot)
    ptx = compiled.asm["ptx"]
    calls = vocabulary_calls(rule.update) + vocabulary_calls(rules.guarded_update)
    per_thread = config.BM * config.BN // (32 * config.num_warps)
    return {"rule": rule_name, "config": config.label, "slot": slot, "BK": config.BK, "ptx": count(ptx),
            "forbidden": forbidden(ptx),
            "expected": {op: calls.get(op, 0) * per_thread for op in PTX_OP}, "per_thread": per_thread,
            **_gluon_resources(compiled), "shared_model": config.shared_bytes(len(rule.state))}


def _gluon_f32_configs():
    from forge_num.kernels.gluon_f32 import DEFAULT_F32_WS_CONFIG, F32_WS_CANDIDATE_CONFIGS

    return (DEFAULT_F32_WS_CONFIG, *F32_WS_CANDIDATE_CONFIGS)


def _gluon_f32_route_configs():
    from forge_num.kernels.gluon_f32 import ROUTE_CONFIGS

    return ROUTE_CONFIGS


def _gluon_q8_configs():
    from forge_num.kernels.gluon_q8 import DEFAULT_Q8_WS_CONFIG, Q8_WS_CANDIDATE_CONFIGS

    return (DEFAULT_Q8_WS_CONFIG, *Q8_WS_CANDIDATE_CONFIGS)


def _gluon_q8_route_configs():
    from forge_num.kernels.gluon_q8 import ROUTE_CONFIGS

    return ROUTE_CONFIGS


def _gluon_kernel():
    from forge_num.kernels.gluon_update import fused_linear_update_ws_kernel

    return fused_linear_update_ws_kernel


def _gluon_ws_configs():
    from forge_num.kernels.gluon_update import DEFAULT_WS_CONFIG, PINGPONG_CONFIG, ROUTE_CONFIGS, SPLIT_CONFIG

    return (DEFAULT_WS_CONFIG, *ROUTE_CONFIGS, SPLIT_CONFIG, PINGPONG_CONFIG)


def _gluon_route_configs():
    from forge_num.kernels.gluon_update import ROUTE_CONFIGS

    return ROUTE_CONFIGS


def _gluon_ws_bf16_sr_configs():
    from forge_num.kernels.gluon_update import BF16_SR_CANDIDATE_CONFIGS, BF16_SR_ROUTE_CONFIGS

    return (*BF16_SR_ROUTE_CONFIGS, *BF16_SR_CANDIDATE_CONFIGS)


def philox_products() -> dict:
    """The Philox rounds' multiplications in the 8bit small-K default tile (AdamW; all four words of
    each element's Philox call are used there): PTX mul.hi.u32 and mul.wide.u32 counts, elements a
    thread, and whether kernels/random.py's WIDE_PRODUCTS was on (unless FORGE_NUM_PHILOX_WIDE=0)."""
    from bench.registers import compile_ptx as compile_tuned
    from forge_num import kernels, rules
    from forge_num.kernels import random as krandom

    cfg = kernels.Q8_SMALL_K_CONFIG
    ptx = compile_tuned(cfg, rules.ADAMW, "bf16", "8bit")
    # the 8bit Gluon kernel takes the switch too (its rounds: philox4x32_10's products either way)
    gluon = check_gluon_q8("adamw", _gluon_q8_configs()[0])
    return {"wide": bool(krandom.WIDE_PRODUCTS), "per_thread": cfg.BM * cfg.BN // (32 * cfg.num_warps),
            "mul_hi": len(re.findall(r"mul\.hi\.u32", ptx)), "mul_wide": len(re.findall(r"mul\.wide\.u32", ptx)),
            "forbidden": forbidden(ptx),
            "gluon_q8": {k: gluon[k] for k in ("per_thread", "mul_hi", "mul_wide", "forbidden", "ptx", "expected")}}


def main() -> int:
    if sys.argv[1:] == ["--philox"]:
        json.dump(philox_products(), sys.stdout)
        return 0
    from forge_num import rules

    from bench.registers import compile_ptx as compile_tuned, resource_usage
    from forge_num import kernels

    out = {"elementwise": [check_elementwise(r, slot) for r in sorted(rules.RULES) for slot in (False, True)],
           "specializations": {name: launch_specializations(getattr(kernels, name))
                               for name in ("fused_linear_update_kernel", "elementwise_update_kernel")},
           # the Gluon kernel's launches skip the binder on a cache hit (kernels/launch_cache.py), with a
           # key that does not name these three: they must reach one specialization
           "gluon_specializations": launch_specializations(_gluon_kernel(), ("seed", "rand_stride", "rand_base")),
           "fused": [check_fused(r, d) for r in ("adamw", "lion") for d in ("fp32", "bf16")]
                    + [check_fused("adamw", "bf16", slot=True)],
           # AdamW holds the most state: registers and spills of every configuration the launcher may use
           "resources": [dict(config=str(c), dtype=d, precision=prec, **resource_usage(compile_tuned(c, rules.ADAMW, d, prec)))
                         for prec, d, cfgs in (("fp32", "bf16", kernels.BF16_CONFIGS), ("fp32", "fp32", kernels.IEEE_CONFIGS),
                                               ("bf16-sr", "bf16", (kernels.DEFAULT_BF16_CONFIG[True],
                                                                    kernels.DEFAULT_BF16_SR_MID_K_CONFIG,
                                                                    kernels.DEFAULT_TMA_CONFIGS["bf16_sr_large_k"])),
                                               ("8bit", "bf16", kernels.Q8_CONFIGS[kernels.torch.bfloat16]),
                                               ("8bit", "fp32", kernels.Q8_CONFIGS[kernels.torch.float32]))
                         for c in cfgs],
           "gluon_ws": [check_gluon_ws(r, c) for r in ("adamw", "lion", "sgd") for c in _gluon_ws_configs()]
                       + [check_gluon_ws(r, c, "bf16-sr") for r in ("adamw", "sgd") for c in _gluon_ws_bf16_sr_configs()],
           "gluon_q8": [check_gluon_q8(r, c) for r in ("adamw", "lion", "sgd") for c in _gluon_q8_configs()],
           "gluon_f32": [check_gluon_f32(r, c) for r in ("adamw", "lion", "sgd") for c in _gluon_f32_configs()],
           # the 8bit default with each element's own Philox call (RAND_PAIRS off: odd counter maps)
           "gluon_q8_single": [check_gluon_q8(r, _gluon_q8_configs()[0], pairs=False) for r in ("adamw", "lion")],
           # the routed Gluon tiles reading their scalars from a step slot (a captured step's launches)
           "gluon_slot": [check_gluon_ws("adamw", c, slot=True) for c in _gluon_route_configs()]
                         + [check_gluon_q8("adamw", c, slot=True) for c in _gluon_q8_route_configs()]
                         + [check_gluon_f32("adamw", c, slot=True) for c in _gluon_f32_route_configs()],
           "labels": {str(c): c.label for c in (*kernels.BF16_CONFIGS, *kernels.IEEE_CONFIGS,
                                                *kernels.Q8_CONFIGS[kernels.torch.bfloat16],
                                                *kernels.Q8_CONFIGS[kernels.torch.float32])}}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
