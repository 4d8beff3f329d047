"""Training-step benchmark: forward + backward + update of Llama-architecture models, per method.

For each method, model (random init, built directly on the GPU), token shape (batch x sequence) and
activation checkpointing on/off, one fresh process (so peak memory and OOMs are isolated) builds
the model and optimizer, runs warm-up steps and timed steps, and reports

    peak        torch.cuda.max_memory_allocated() over all steps, reset after the build (n/a on CPU)
    tokens/s    batch*seq / median step time of the timed steps (synchronized)
    pipelined   tokens/s of as many steps again run back to back, synchronized only before the first and
                after the last (CUDA): what a training loop that does not wait for the device between
                steps gets, where a host that keeps ahead issues the next step while the device finishes
                this one. A method that waits for the device inside its step (forge's tied embedding's
                forward reads the batch's distinct tokens in the stochastic regimes; its step() waits
                for the previous step's telemetry only) keeps less of that overlap than one that does not
    predicted   the memory model of this file (predict_peak_bytes), stated before the run
    TFLOP/s     model FLOPs (model_flops: 6 x matmul params x tokens + causal attention) / step time
    ratios      peak and tokens/s over torch_adamw's of the same configuration, same run

Methods (no gradient clipping anywhere: gradient release cannot clip):

    forge         forge_num fp32 regime: fp32 params, forge_num.AdamW + prepare() (update in backward,
                  fused layers), autocast bf16
    torch_adamw   torch.optim.AdamW(fused=True), fp32 params + autocast bf16 (AMP)
    torch_hooks   fp32 params + autocast bf16, one torch.optim.AdamW(fused=True) per parameter stepped
                  in a post-accumulate-grad hook (torch's "optimizer in backward")
    bnb_adamw8bit bitsandbytes.optim.AdamW8bit, bf16 params
    ao_adamw8bit  torchao.optim.AdamW8bit(bf16_stochastic_round=True), bf16 params
    flashoptim    flashoptim.FlashAdamW (8-bit states, 24-bit master: bf16 params + int8 correction),
                  enable_gradient_release(); on the CPU (--tiny) quantize=False, master_weight_bits=None,
                  fused=False, since the rest is CUDA only

A method name with the suffix "+cl" (forge+cl, torch_adamw+cl, ...) runs the same method with the
loss computed by forge_num.hf.causal_lm_loss (forge_num.linear_cross_entropy: the LM head's logits
in row chunks, 2 bytes a logit kept for the backward instead of 12: forge_num/loss.py) instead of
the model's own; the head's update is the method's as before. Every method can take it, so its memory and speed are
compared method by method. A forge method with the suffix "+graph" after it (forge_8bit+graph,
forge_8bit+cl+graph) runs its steps through forge_num.capture_step: two eager warm-up steps, then the
step captured in a CUDA graph and replayed (forge_num/graphs.py); a step that cannot be captured is
reported as an error with the reason. Its forward runs inside forge_num.hf.one_sequence_per_row() (each
row here is one sequence), so that transformers attends as in the eager steps, without the explicit causal
mask it builds under capture; --capture-attention transformers leaves that out (sessions 27-29's numbers).

A method that cannot run is reported with its status (unavailable / oom / error / timeout /
skipped) and the reason; it is never dropped.

    python bench/train_step.py [--methods forge,torch_adamw] [--models llama-1b,llama-8b]
        [--tokens 1x1024,4x1024,8x2048] [--checkpointing on,off] [--out bench/results/x.json]
    python bench/train_step.py --tiny          # tiny config on CPU (CI smoke test)

--profile adds one more step under torch.profiler and reports where its time went: device time
per category of kernel (profile_ms; KERNEL_CATEGORIES) and the longest kernels (profile_top), so a
gap in tokens/s between two methods can be located (the GEMMs, forge's kernels, the weight casts,
the optimizer, attention, ...). On the CPU the same categories hold the aten ops' self CPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

# Run as `python bench/train_step.py`, sys.path[0] is bench/, whose kernels.py would shadow the PyPI package
# `kernels` (bitsandbytes and transformers >= 5.25 import it); the repository root, whose kernels/
# would shadow it too, goes behind site-packages (tests/conftest.py says more).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (_HERE, _ROOT)] + [_ROOT]

METHODS = ["forge", "forge_bf16sr", "forge_8bit", "torch_adamw", "torch_hooks", "bnb_adamw8bit", "ao_adamw8bit",
           "flashoptim"]
FORGE_PRECISION = {"forge": "fp32", "forge_bf16sr": "bf16-sr", "forge_8bit": "8bit"}
HYPER = {"lr": 1e-4, "weight_decay": 0.01}
GIB = 1024**3

_LLAMA3 = {"vocab_size": 128256, "rope_theta": 500000.0, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-5}
MODELS = {
    # Llama-3.2-1B / 3.2-3B / 3.1-8B shapes (tied embeddings for 1B and 3B, as released).
    "llama-1b": dict(_LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
    "llama-3b": dict(_LLAMA3, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                     num_attention_heads=24, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "llama-8b": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    # CPU smoke tests: 106,816 parameters at 2 layers (36,992 per layer + 32,832).
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                 max_position_embeddings=512),
}

def memory_at_peak(forward, after, top: int = 16) -> dict:
    """One more step under the allocator's history (torch.cuda.memory._record_memory_history, no
    stack capture: with Python stacks torch 2.11 failed inside forge's autograd Function, session 13
    call 3): the step's peak of allocated bytes, replayed from the trace, in which phase it falls,
    and the allocations made during the step and alive at that moment, largest first, each with its
    size and the phase (forward, backward, after) that made it; what was allocated
    before the step (weights, state) is one number."""
    import torch

    def trace_length():
        return sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"])

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
    try:
        loss = forward()
        torch.cuda.synchronize()
        n_forward = trace_length()
        loss.backward()
        torch.cuda.synchronize()
        n_backward = trace_length()
        after()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)

    def phase(i):
        return "forward" if i < n_forward else "backward" if i < n_backward else "after"

    live, total, peak, at_peak, peak_index, i = {}, 0, 0, {}, 0, -1
    for trace in snap["device_traces"]:
        for e in trace:
            i += 1
            if e["action"] == "alloc":
                live[e["addr"]] = (i, e["size"])
                total += e["size"]
            elif e["action"] == "free_completed" and e["addr"] in live:
                total -= live.pop(e["addr"])[1]
            else:
                continue
            if total > peak:
                peak, at_peak, peak_index = total, dict(live), i
    blocks = sorted(at_peak.values(), key=lambda b: -b[1])
    by_phase = {}
    for j, size in blocks:
        by_phase[phase(j)] = by_phase.get(phase(j), 0) + size / GIB
    return {"before_step_gib": base / GIB, "peak_gib": (base + peak) / GIB, "step_at_peak_gib": peak / GIB,
            "peak_phase": phase(peak_index), "alive_by_phase_gib": by_phase, "n_alive": len(blocks),
            "allocations": [{"mib": size / 2**20, "phase": phase(j), "order": j} for j, size in blocks[:top]],
            "other_mib": sum(size for _, size in blocks[top:]) / 2**20}


def alive_after(device_traces) -> list:
    """The alloc events of an allocator history (torch.cuda.memory._snapshot()["device_traces"]) whose
    block no later event freed, largest first; a block counts as freed at its free_requested event
    (where torch.cuda.memory_allocated drops; free_completed follows once its streams are done)."""
    live = {}
    for trace in device_traces:
        for e in trace:
            if e["action"] == "alloc":
                live[e["addr"]] = e
            elif e["action"] in ("free_requested", "free_completed"):
                live.pop(e["addr"], None)
    return sorted(live.values(), key=lambda e: -e["size"])


def allocations_left_by(call, stacks: bool, top: int = 12) -> tuple:
    """call() under the allocator's history: (its result, what it allocated and left alive when it
    returned). Measured for a captured step's capturing call: what it leaves alive is held between
    replays (the graph's outputs and whatever Python keeps of the capture), the captured step's excess
    over the eager one at the same point (session 32: 0.12 GiB at Llama-1B 4x1024). Each allocation:
    its MiB, and with stacks its innermost frames of this project's and transformers' code (Python
    stacks failed inside forge's autograd Function under torch 2.11 in session 13: stacks=False records
    the sizes alone). An allocation freed while the call ran counts as freed when the free is
    requested, where torch.cuda.memory_allocated drops."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context="alloc" if stacks else None,
                                             stacks="python")
    try:
        result = call()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    left = alive_after(snap["device_traces"])

    def ours(frames):  # "file.py:line function", innermost first
        keep = [f for f in frames if any(k in f["filename"] for k in ("forge_num", "transformers", "bench"))]
        return [f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in keep[:4]]

    return result, {"before_gib": before / GIB, "after_gib": torch.cuda.memory_allocated() / GIB,
                    "reserved_gib": torch.cuda.memory_reserved() / GIB, "n_left": len(left),
                    "left_gib": sum(e["size"] for e in left) / GIB,
                    "allocations": [{"mib": e["size"] / 2**20, "frames": ours(e.get("frames") or [])}
                                    for e in left[:top]],
                    "other_mib": sum(e["size"] for e in left[top:]) / 2**20}


# --------------------------------------------------------------------------------------------
# Memory model (bytes), written down before measuring
# --------------------------------------------------------------------------------------------

# Per parameter, persistent: weights (+ master/correction bits) W, optimizer state S; gradients
# alive together at the end of backward G ("transient" = one parameter's at a time, released);
# autocast's cache of bf16 weight copies C (alive from the forward to the end of autocast/backward).
FLOOR = {
    #                W      S      G      C    params dtype
    "forge":        (4.0, 8.0, 0.0, 0.0, "fp32"),  # dW never materialized (linear weights)
    "forge_bf16sr": (2.0, 4.0, 0.0, 0.0, "bf16"),  # bf16 W, m, v (stochastic rounding)
    "forge_8bit":   (2.0, 2.0625, 0.0, 0.0, "bf16"),  # bf16 W; 8-bit m, v + an fp32 scale per 128
    "torch_adamw":  (4.0, 8.0, 4.0, 2.0, "fp32"),
    "torch_hooks":  (4.0, 8.0, 0.0, 2.0, "fp32"),
    "bnb_adamw8bit": (2.0, 2.0, 2.0, 0.0, "bf16"),  # two 8-bit states (+ fp32 block absmax, ~0.03)
    "ao_adamw8bit": (2.0, 2.0, 2.0, 0.0, "bf16"),   # block 256 scales: ~0.03 B/param
    "flashoptim":   (3.0, 2.125, 0.0, 0.0, "bf16"),  # bf16 + int8 ECC; int8 m, v + scales (8.5 bit)
}


CHUNKED_LOSS = "+cl"
GRAPHED = "+graph"


def base_method(method: str) -> str:
    """The optimizer setup of a method name: "forge+cl" -> "forge", "forge_8bit+cl+graph" ->
    "forge_8bit" (the suffixes pick the loss and the captured step)."""
    method = method.removesuffix(GRAPHED)
    return method[: -len(CHUNKED_LOSS)] if method.endswith(CHUNKED_LOSS) else method


def chunked_loss(method: str) -> bool:
    """Whether a method name asks for the chunked loss ("+cl", before any "+graph")."""
    return method.removesuffix(GRAPHED).endswith(CHUNKED_LOSS)


def floor_bytes_per_param(method: str) -> float:
    """Weights + optimizer state + gradients kept at once, bytes per parameter (no activations)."""
    w, s, g, _c, _ = FLOOR[base_method(method)]
    return w + s + g


def count_params(cfg: dict) -> dict:
    h, i, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h
    layer = attn + 3 * h * i + 2 * h
    embed = V * h
    head = 0 if cfg.get("tie_word_embeddings") else V * h
    total = embed + head + L * layer + h
    return {"total": total, "per_layer": layer, "embed": embed, "head": head,
            "linear": L * (attn + 3 * h * i) + head}


def model_flops(cfg: dict, batch: int, seq: int) -> float:
    """Model FLOPs of one training step (no recomputation counted): 6 x matmul parameters x tokens
    (embedding lookup excluded, LM head included) + causal attention, 6 x layers x seq x (heads x
    head_dim) per token (QK^T and AV, forward and backward, half the square)."""
    n = count_params(cfg)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    T = batch * seq
    head = n["head"] or n["embed"]  # a tied head is still a matmul
    matmul = n["linear"] - n["head"] + head
    return 6.0 * matmul * T + 6.0 * cfg["num_hidden_layers"] * seq * cfg["num_attention_heads"] * hd * T


def predict_peak_bytes(cfg: dict, method: str, batch: int, seq: int, checkpointing: bool) -> float:
    """max(end of forward, end of backward) of the memory model; activations roughly estimated.

    end of forward: W + S + C*linear + saved activations + logits (bf16 logits, fp32 upcast in the
                    loss, fp32 and bf16 logit gradients: 12 B per logit)
    end of backward: W + S + G + the largest single gradient where gradients are released one by
                    one (the embedding's, fp32 or bf16)
    With the chunked loss ("+cl") the logits term is the bf16 dY kept for the head (2 B per logit)
    plus one chunk's temporaries (forge_num.loss.DEFAULT_CHUNK_BYTES).
    Saved activations per token and layer: residual stream only with checkpointing (4h fp32
    regime, 2h bf16) plus one recomputed layer; without, 34h + 8i (fp32 regime) or 24h + 8i (bf16).
    """
    from forge_num.loss import DEFAULT_CHUNK_BYTES

    chunked = chunked_loss(method)
    method = base_method(method)
    n = count_params(cfg)
    w, s, g, c, dt = FLOOR[method]
    h, i, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    T = batch * seq
    full_layer = (34 * h + 8 * i) if dt == "fp32" else (24 * h + 8 * i)
    resid = 4 * h if dt == "fp32" else 2 * h
    act = T * (L * resid + full_layer) if checkpointing else T * L * full_layer
    cache = c * n["linear"]
    if method in FORGE_PRECISION:
        # fused linears hold no bf16 copy; a tied LM head is an ordinary autocast linear (fp32 regime)
        cache = 2.0 * n["embed"] if cfg.get("tie_word_embeddings") and dt == "fp32" else 0.0
    logits = 2.0 * T * V + DEFAULT_CHUNK_BYTES if chunked else 12.0 * T * V
    fwd = (w + s) * n["total"] + cache + act + logits
    released = {"forge": 4.0, "forge_bf16sr": 2.0, "forge_8bit": 2.0, "torch_hooks": 4.0,
                "flashoptim": 2.0}.get(method, 0.0) * n["embed"]
    bwd = (w + s + g) * n["total"] + released
    return max(fwd, bwd)


# --------------------------------------------------------------------------------------------
# Availability (checked in the parent: an unavailable method is reported, not spawned)
# --------------------------------------------------------------------------------------------

_NEEDS = {"bnb_adamw8bit": "bitsandbytes", "ao_adamw8bit": "torchao", "flashoptim": "flashoptim"}


def unavailable_reason(method: str, cuda: bool) -> str | None:
    base = base_method(method)
    if base not in METHODS:
        return f"unknown method (known: {', '.join(METHODS)})"
    if method.endswith(GRAPHED) and base not in FORGE_PRECISION:
        return f"{GRAPHED} captures forge's step only (forge, forge_bf16sr, forge_8bit)"
    method = base
    mod = _NEEDS.get(method)
    hidden = os.environ.get("BENCH_HIDE_MODULES", "").split(",")  # tests: pretend not installed
    if mod and (mod in hidden or importlib.util.find_spec(mod) is None):
        return f"not installed: python module {mod!r} not importable (see bench/README.md for the wheel)"
    return None


# --------------------------------------------------------------------------------------------
# --profile: device time by kind of kernel
# --------------------------------------------------------------------------------------------

# (category, regular expression on the kernel name, or the aten op name on the CPU), first match
# wins: the copy kernels are element-wise kernels too, so casts come before the element-wise rest.
KERNEL_CATEGORIES = (
    ("forge fused dW + update", r"fused_linear_update_(q8_)?(ws_)?kernel"),  # the Triton and the Gluon kernels
    ("forge element-wise update", r"elementwise_update_kernel"),
    ("optimizer step", r"multi_tensor_apply|fused_adam|adamw?_?8bit|optimizer|flashoptim|_step_kernel"),
    ("GEMM", r"gemm|xmma|nvjet|cutlass|cublas|^aten::(mm|addmm|bmm|matmul|linear)$"),
    ("attention", r"flash|fmha|attention|sdpa|_efficient_attention"),
    ("casts and copies", r"copy|_to_copy|convert|cast"),
    ("reductions and norms", r"reduce|softmax|norm|cross_entropy|nll_loss|mean|sum"),
    ("other element-wise", r"elementwise|vectorized|unrolled|^aten::"),
)


def kernel_category(name: str) -> str:
    """The KERNEL_CATEGORIES entry a kernel (or aten op) name falls in; "other" if none."""
    import re

    for category, pattern in KERNEL_CATEGORIES:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return category
    return "other"


def profile_step(step, cuda: bool) -> dict:
    """Runs step() once under torch.profiler; {"profile_ms": {category: ms}, "profile_top": [...]}:
    CUDA kernels' device time (on the CPU: aten ops' self CPU time), summed by kernel_category."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    per_name = {}
    for evt in prof.key_averages():
        if cuda:
            if evt.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = evt.self_device_time_total
        else:
            if not evt.key.startswith("aten::"):
                continue
            us = evt.self_cpu_time_total
        per_name[evt.key] = per_name.get(evt.key, 0.0) + us / 1e3
    by_category = {}
    for name, ms in per_name.items():
        category = kernel_category(name)
        by_category[category] = by_category.get(category, 0.0) + ms
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:20]
    # Where the host's time went: the CUDA runtime and driver calls (a synchronization or a blocked
    # launch shows here as a long call) and the host's most expensive ops, self time, with counts.
    runtime, host = [], []
    for evt in prof.key_averages():
        if evt.device_type != torch.autograd.DeviceType.CPU:
            continue
        row = {"name": evt.key[:120], "ms": evt.self_cpu_time_total / 1e3, "count": evt.count}
        (runtime if evt.key.startswith(("cuda", "cu")) else host).append(row)
    # wall time well above the kernels' summed device time: the GPU waited for the host (profiler
    # overhead included). The sum can exceed the wall where kernels overlap (AMP's, session 6).
    return {"profile_wall_ms": wall_ms, "profile_device_ms": sum(per_name.values()),
            "profile_ms": dict(sorted(by_category.items(), key=lambda kv: -kv[1])),
            "profile_top": [{"name": n[:200], "ms": ms, "category": kernel_category(n)} for n, ms in top],
            "profile_runtime_top": sorted(runtime, key=lambda r: -r["ms"])[:12],
            "profile_host_top": sorted(host, key=lambda r: -r["ms"])[:15]}


# --------------------------------------------------------------------------------------------
# The worker: one (method, model, shape, checkpointing) in this process
# --------------------------------------------------------------------------------------------


def _hold_sdpa_backend(name: str) -> None:
    """--sdpa: every SDPA call of this process held to one backend (the global switches, not a context:
    checkpointing's recomputation and a captured step's backward run outside the forward's code), or
    left to PyTorch's choice ("default")."""
    import torch

    if name == "default":
        return
    for backend, enable in (("flash", torch.backends.cuda.enable_flash_sdp),
                            ("efficient", torch.backends.cuda.enable_mem_efficient_sdp),
                            ("cudnn", torch.backends.cuda.enable_cudnn_sdp),
                            ("math", torch.backends.cuda.enable_math_sdp)):
        enable(backend == name)


def _build_model(cfg: dict, dtype, device, checkpointing: bool):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**cfg, attn_implementation="sdpa", use_cache=False)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # built in place: never the 8B model on the CPU
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    model.train()
    if checkpointing:  # non-reentrant; transformers >= 5.2x renamed the method
        enable = (getattr(model, "activation_checkpointing_enable", None)
                  or model.gradient_checkpointing_enable)
        enable({"use_reentrant": False})
    return model


def _setup(method: str, model, cuda: bool):
    """(autocast dtype or None, after_backward()) for the method; the optimizer is attached to model."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if method in FORGE_PRECISION:
        import forge_num

        precision = FORGE_PRECISION[method]
        opt = forge_num.AdamW(params, max_grad_norm=None, precision=precision, seed=0, **HYPER)
        forge_num.prepare(model, opt)
        # step(): bookkeeping only, every parameter was updated in backward. fp32 weights train under
        # autocast; the bf16 regimes' model is bf16 already
        return (torch.bfloat16 if precision == "fp32" else None), opt.step
    if method == "torch_adamw":
        opt = torch.optim.AdamW(params, fused=True, **HYPER)

        def after():
            opt.step()
            opt.zero_grad(set_to_none=True)

        return torch.bfloat16, after
    if method == "torch_hooks":
        opts = {p: torch.optim.AdamW([p], fused=True, **HYPER) for p in params}

        def hook(p):
            opts[p].step()
            opts[p].zero_grad(set_to_none=True)

        model._bench_hooks = [p.register_post_accumulate_grad_hook(hook) for p in params]
        return torch.bfloat16, lambda: None
    if method == "bnb_adamw8bit":
        import bitsandbytes as bnb

        opt = bnb.optim.AdamW8bit(params, **HYPER)

        def after():
            opt.step()
            opt.zero_grad(set_to_none=True)

        return None, after
    if method == "ao_adamw8bit":
        from torchao.optim import AdamW8bit

        opt = AdamW8bit(params, bf16_stochastic_round=True, **HYPER)

        def after():
            opt.step()
            opt.zero_grad(set_to_none=True)

        return None, after
    if method == "flashoptim":
        import flashoptim

        if cuda:
            opt = flashoptim.FlashAdamW(params, master_weight_bits=24, **HYPER)
        else:  # its 8-bit states, ECC bits and fused step are CUDA only: the API path, for smoke tests
            opt = flashoptim.FlashAdamW(params, quantize=False, master_weight_bits=None, fused=False, **HYPER)
        model._bench_release = flashoptim.enable_gradient_release(model, opt)
        return None, lambda: None  # step() is a no-op under gradient release
    raise ValueError(f"unknown method {method!r}")


def _host_event_counts(cuda: bool) -> dict:
    """Counters of what can stall the host inside a step: Python's garbage collections by generation
    (a full one walks every object of the process) and the CUDA caching allocator's cudaMalloc /
    cudaFree calls and out-of-memory retries (cudaFree and a retry synchronize the device). Their
    per-step differences go into the row (step_host_events), to tell a slow host step's cause."""
    import gc

    import torch

    counts = {f"gc_gen{g}": s["collections"] for g, s in enumerate(gc.get_stats())}
    if cuda:
        stats = torch.cuda.memory_stats()
        for key in ("num_device_alloc", "num_device_free", "num_alloc_retries"):
            counts[key] = stats.get(key, 0)
    return counts


def run_spec(spec: dict) -> dict:
    """Runs one measurement in this process; returns the result row (never raises)."""
    import torch

    from forge_num.hf import causal_lm_loss

    cuda = torch.cuda.is_available() and not spec.get("cpu", False)
    device = torch.device("cuda" if cuda else "cpu")
    method, cfg = base_method(spec["method"]), spec["config"]
    chunked, graphed = chunked_loss(spec["method"]), spec["method"].endswith(GRAPHED)
    batch, seq, ckpt = spec["batch"], spec["seq"], spec["checkpointing"]
    row = {"status": "error", "reason": None, "peak_gib": None, "after_build_gib": None,
           "tokens_per_s": None, "pipelined_tokens_per_s": None, "step_s_median": None, "step_s": [],
           "losses": []}
    t_start = time.perf_counter()
    limit = spec.get("memory_limit_bytes")
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])  # tiny CPU runs: 2+ threads were 40x slower (contention)
    try:
        torch.manual_seed(0)
        if cuda and limit:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total))
        dtype = torch.float32 if FLOOR[method][4] == "fp32" else torch.bfloat16
        model = _build_model(cfg, dtype, device, ckpt)
        row["n_params"] = sum(p.numel() for p in model.parameters())
        amp_dtype, after = _setup(method, model, cuda)
        ids = torch.randint(0, cfg["vocab_size"], (batch, seq), device=device)
        if spec.get("gc", "default") == "freeze":
            # A full (generation 2) collection walks every object of the process: with transformers, torch
            # and an 8B model built, one took ~0.3 s inside a timed step (session 11, call 1: forge's first
            # timed step 0.71 s against 0.37 s, the step with the run's one full collection; session 10's
            # 0.70x AMP median at 8B was such steps). Frozen once built, they are never walked again.
            import gc

            gc.collect()
            gc.freeze()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            row["after_build_gib"] = torch.cuda.memory_allocated() / GIB
        row["build_s"] = time.perf_counter() - t_start

        backward_issued = []

        _hold_sdpa_backend(spec.get("sdpa", "default"))

        def loss_of(input_ids):
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                if chunked:  # the model's next-token loss, its logits in row chunks
                    return causal_lm_loss(model, input_ids)
                return model(input_ids=input_ids, labels=input_ids).loss

        def forward():
            return loss_of(ids)

        if graphed:
            import forge_num
            from forge_num.hf import one_sequence_per_row

            one_sequence = spec.get("capture_attention", "one_sequence") == "one_sequence"

            def captured_loss(input_ids):  # one sequence a row: the eager attention path (no mask), or not
                with one_sequence_per_row() if one_sequence else contextlib.nullcontext():
                    return loss_of(input_ids)
            captured = forge_num.capture_step(after.__self__, captured_loss)  # after is the optimizer's step()

            def step():
                history = spec.get("capture_history")
                if cuda and history and captured._graph is None and captured._calls >= captured.warmup:
                    loss, row["capture_left"] = allocations_left_by(lambda: captured(ids), history == "stacks")
                    loss = loss.clone()
                else:
                    loss = captured(ids).clone()  # the graph's loss tensor is rewritten by the next replay
                backward_issued.append(time.perf_counter())
                return loss
        else:
            def step():
                loss = forward()
                loss.backward()
                backward_issued.append(time.perf_counter())  # before after(): the optimizer's step, if any
                after()
                return loss.detach()

        losses = []
        issue_s = []
        row["step_host_events"] = []
        for k in range(spec["warmup"] + spec["steps"]):
            if cuda:
                torch.cuda.synchronize()
            before = _host_event_counts(cuda)
            t0 = time.perf_counter()
            losses.append(step())
            t_issued = backward_issued[-1]
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if k >= spec["warmup"]:
                row["step_s"].append(dt)
                issue_s.append(t_issued - t0)
                after_counts = _host_event_counts(cuda)
                row["step_host_events"].append({key: after_counts[key] - before[key] for key in before})
        # the host's time to issue forward and backward (no synchronization before): close to the
        # step's time, the GPU waited for the host; well below it, the host waited for the GPU
        row["host_issue_s_median"] = statistics.median(issue_s) if issue_s else None
        if cuda and spec["steps"]:  # the same number of steps back to back (module docstring: pipelined)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(spec["steps"]):
                losses.append(step())
            torch.cuda.synchronize()
            row["pipelined_tokens_per_s"] = batch * seq * spec["steps"] / (time.perf_counter() - t0)
        if cuda and spec.get("memory_phases"):
            row["peak_gib"] = torch.cuda.max_memory_allocated() / GIB  # the timed steps' peak, kept
            row["memory_phases_gib"] = memory_phases(forward, after)
        if cuda and spec.get("memory_snapshot"):
            row["peak_gib"] = max(row["peak_gib"] or 0.0, torch.cuda.max_memory_allocated() / GIB)
            row["memory_at_peak"] = memory_at_peak(forward, after)
        if spec.get("profile"):
            row.update(profile_step(step, cuda))
        row["losses"] = [float(x) for x in losses]
        if not all(math.isfinite(x) for x in row["losses"]):
            raise FloatingPointError(f"non-finite loss: {row['losses']}")
        if cuda:
            row["peak_gib"] = max(row["peak_gib"] or 0.0, torch.cuda.max_memory_allocated() / GIB)
            row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        if row["step_s"]:
            row["step_s_median"] = statistics.median(row["step_s"])
            row["tokens_per_s"] = batch * seq / row["step_s_median"]
        if row["step_s_median"]:
            row["model_tflops_per_s"] = model_flops(cfg, batch, seq) / row["step_s_median"] / 1e12
        row["status"] = "ok"
        if limit and not cuda:
            # CPU has no allocator peak: a fake limit is judged on the memory model (capacity tests).
            pred = predict_peak_bytes(cfg, method, batch, seq, ckpt)
            if pred > limit:
                row["status"] = "oom"
                row["reason"] = f"fake limit: predicted peak {pred / GIB:.6f} GiB > {limit / GIB:.6f} GiB"
    except torch.OutOfMemoryError as e:
        row["status"] = "oom"
        row["reason"] = str(e).splitlines()[0][:300]
        if cuda:
            row["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    except Exception as e:  # noqa: BLE001 - reported, never dropped
        # an allocation failure raised by an extension (bitsandbytes, Triton) as a plain RuntimeError
        row["status"] = "oom" if "out of memory" in str(e).lower() else "error"
        row["reason"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
        row["traceback"] = traceback.format_exc()[-2000:]
    row["wall_s"] = time.perf_counter() - t_start
    return row


def memory_phases(forward, after) -> dict:
    """One more step (run_spec's forward, then backward, then after), the allocator's peak of each of
    its phases (GiB): where a method's peak is (forward with the loss; backward, which holds forge's
    updates; after, the optimizer's step or forge's end of step), with what is allocated at each
    boundary."""
    import torch

    out = {}
    torch.cuda.synchronize()
    out["start"] = torch.cuda.memory_allocated() / GIB
    torch.cuda.reset_peak_memory_stats()
    loss = forward()
    torch.cuda.synchronize()
    out["forward_peak"], out["after_forward"] = torch.cuda.max_memory_allocated() / GIB, torch.cuda.memory_allocated() / GIB
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    out["backward_peak"], out["after_backward"] = torch.cuda.max_memory_allocated() / GIB, torch.cuda.memory_allocated() / GIB
    torch.cuda.reset_peak_memory_stats()
    after()
    torch.cuda.synchronize()
    out["after_peak"], out["end"] = torch.cuda.max_memory_allocated() / GIB, torch.cuda.memory_allocated() / GIB
    return out


# --------------------------------------------------------------------------------------------
# Isolation: each spec in a fresh process
# --------------------------------------------------------------------------------------------

_MARK = "TRAIN_STEP_RESULT "


def preimport() -> None:
    """Fork mode: import the heavy modules once in the parent (CPU only, no CUDA touched)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401

    import forge_num.fused  # noqa: F401


def _fork_child(spec, conn):
    try:
        conn.send(run_spec(spec))
    finally:
        conn.close()
        os._exit(0)


def run_isolated(spec: dict, isolation: str, timeout: float) -> dict:
    """run_spec in a fresh process: 'subprocess' (a new interpreter; needed with CUDA) or 'fork'
    (CPU only: the parent's imports are reused, ~0.1 s instead of ~4 s per probe)."""
    t0 = time.perf_counter()
    if isolation == "fork":
        import multiprocessing as mp

        preimport()

        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_fork_child, args=(spec, child))
        p.start()
        child.close()
        row = None
        if parent.poll(timeout):
            try:
                row = parent.recv()
            except EOFError:
                row = None
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
            return {"status": "timeout", "reason": f"no result within {timeout:.0f} s"}
        if row is None:
            return {"status": "error", "reason": f"worker died (exit code {p.exitcode})",
                    "wall_s": time.perf_counter() - t0}
        return row
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "reason": f"no result within {timeout:.0f} s (killed)",
                "wall_s": time.perf_counter() - t0}
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
    oom = "out of memory" in (proc.stderr or "").lower()
    return {"status": "oom" if oom else "error",
            "reason": f"worker exit code {proc.returncode}: " + " | ".join(tail)[-400:],
            "wall_s": time.perf_counter() - t0}


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def parse_tokens(s: str) -> list[tuple[int, int]]:
    out = []
    for part in s.split(","):
        b, q = part.lower().split("x")
        out.append((int(b), int(q)))
    return out


def parse_ckpt(s: str) -> list[bool]:
    vals = {"on": True, "off": False, "1": True, "0": False, "true": True, "false": False}
    return [vals[x.strip().lower()] for x in s.split(",")]


_GPU_INFO = None


def gpu_info() -> tuple[str, int]:
    """(name, total bytes) of GPU 0, asked in a child process: the parent must hold no CUDA context
    (it would take memory from the measured children, and forked children could not use CUDA)."""
    global _GPU_INFO
    if _GPU_INFO is None:
        code = ("import json, torch; p = torch.cuda.get_device_properties(0); "
                "print(json.dumps([p.name, p.total_memory]))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        _GPU_INFO = tuple(json.loads(out.stdout.strip().splitlines()[-1]))
    return _GPU_INFO


def environment(cuda: bool) -> dict:
    import torch

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": gpu_info()[0] if cuda else None,
            "gpu_memory_gib": gpu_info()[1] / GIB if cuda else None,
            "torch": torch.__version__, "python": platform.python_version(),
            "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]), "hyper": HYPER}
    for mod in ("triton", "transformers", "bitsandbytes", "torchao", "flashoptim"):
        try:
            if importlib.util.find_spec(mod) is None:
                meta[mod] = None
                continue
            from importlib.metadata import version

            meta[mod] = version(mod)
        except Exception as e:  # noqa: BLE001
            meta[mod] = f"? ({type(e).__name__})"
    # which forge_num this run measured (an A/B run puts another build first on PYTHONPATH)
    spec = importlib.util.find_spec("forge_num")
    meta["forge_num_path"] = os.path.dirname(spec.origin) if spec and spec.origin else None
    # the Philox rounds' multiply form, as the runs' children read it (kernels/random.py, WIDE_PRODUCTS)
    meta["philox_wide_products"] = cuda and os.environ.get("FORGE_NUM_PHILOX_WIDE", "1") != "0"
    return meta


def _fmt(x, spec="{:.2f}"):
    return "n/a" if x is None else spec.format(x)


def add_ratios(rows: list) -> None:
    """Each ok row: peak and tokens/s as ratios to torch_adamw's row of the same configuration; a
    chunked-loss row ("+cl") also to torch_adamw+cl's (the suffix _cl)."""
    key = lambda r: (r["model"], r["batch"], r["seq"], r["checkpointing"])  # noqa: E731
    for ref_method, suffix in (("torch_adamw", ""), ("torch_adamw" + CHUNKED_LOSS, "_cl")):
        ref = {key(r): r for r in rows if r["method"] == ref_method and r["status"] == "ok"}
        for r in rows:
            b = ref.get(key(r))
            if r["status"] != "ok" or b is None or (suffix and not chunked_loss(r["method"])):
                continue
            if r.get("peak_gib") and b.get("peak_gib"):
                r["peak_vs_torch_adamw" + suffix] = r["peak_gib"] / b["peak_gib"]
            if r.get("tokens_per_s") and b.get("tokens_per_s"):
                r["tokens_per_s_vs_torch_adamw" + suffix] = r["tokens_per_s"] / b["tokens_per_s"]
            if r.get("pipelined_tokens_per_s") and b.get("pipelined_tokens_per_s"):
                r["pipelined_tokens_per_s_vs_torch_adamw" + suffix] = (r["pipelined_tokens_per_s"]
                                                                       / b["pipelined_tokens_per_s"])


def print_row(r: dict) -> None:
    ck = "ckpt" if r["checkpointing"] else "    "
    what = (f"peak {_fmt(r.get('peak_gib')):>7} GiB (pred {_fmt(r.get('predicted_peak_gib')):>7})  "
            f"{_fmt(r.get('tokens_per_s'), '{:.0f}'):>7} tok/s "
            f"(pipelined {_fmt(r.get('pipelined_tokens_per_s'), '{:.0f}')})  "
            f"step {_fmt(r.get('step_s_median'), '{:.3f}')} s, "
            f"forward+backward issued in {_fmt(r.get('host_issue_s_median'), '{:.3f}')} s") if r["status"] == "ok" else \
        f"{r['status'].upper()}: {r.get('reason')}"
    print(f"{r['method']:<14} {r['model']:<9} {r['batch']}x{r['seq']:<5} {ck}  {what}", flush=True)
    events = r.get("step_host_events") or []
    totals = {k: sum(e[k] for e in events) for k in (events[0] if events else {})}
    if any(totals.values()):  # what may have stalled the host in the timed steps
        print(f"    in {len(events)} timed steps: " + ", ".join(f"{k} {v}" for k, v in totals.items() if v), flush=True)
    if r.get("memory_phases_gib"):
        print("    memory (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in r["memory_phases_gib"].items()), flush=True)
    if r.get("memory_at_peak"):
        m = r["memory_at_peak"]
        print(f"    at the step's peak {m['peak_gib']:.2f} GiB (in {m['peak_phase']}): before the step "
              f"{m['before_step_gib']:.2f}, {m['n_alive']} allocations of the step alive, by phase made "
              + ", ".join(f"{k} {v:.2f}" for k, v in m["alive_by_phase_gib"].items()), flush=True)
        for a in m["allocations"]:
            print(f"      {a['mib']:9.1f} MiB  {a['phase']:<8} event {a['order']}", flush=True)
        print(f"      {m['other_mib']:9.1f} MiB  the rest", flush=True)
    if r.get("capture_left"):
        c = r["capture_left"]
        print(f"    the capturing call: allocated {c['before_gib']:.3f} -> {c['after_gib']:.3f} GiB (reserved "
              f"{c['reserved_gib']:.2f}); {c['n_left']} of its allocations alive after it, {c['left_gib']:.3f} GiB",
              flush=True)
        for a in c["allocations"]:
            print(f"      {a['mib']:9.2f} MiB  " + " < ".join(a["frames"]), flush=True)
        print(f"      {c['other_mib']:9.2f} MiB  the rest", flush=True)
    if r.get("profile_ms"):
        print(f"    profiled step: wall {r['profile_wall_ms']:.1f} ms, kernels {r['profile_device_ms']:.1f} ms; by kind: "
              + ", ".join(f"{k} {v:.1f}" for k, v in r["profile_ms"].items()), flush=True)
        for key, label in (("profile_runtime_top", "runtime calls"), ("profile_host_top", "host ops")):
            if r.get(key):
                print(f"    {label} (self ms, count): "
                      + ", ".join(f"{e['name'][:40]} {e['ms']:.1f} x{e['count']}" for e in r[key][:6]), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--models", default="llama-1b,llama-3b,llama-8b")
    ap.add_argument("--tokens", default="1x1024,4x1024,8x2048", help="batch x sequence, comma-separated")
    ap.add_argument("--checkpointing", default="off,on", help="on, off or off,on")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (median)")
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers of every model")
    ap.add_argument("--tiny", action="store_true", help="the tiny config on the CPU (smoke test)")
    ap.add_argument("--sdpa", choices=["default", "cudnn", "flash", "efficient", "math"], default="default",
                    help="the SDPA backend every method's attention is held to (default: PyTorch's choice)")
    ap.add_argument("--capture-attention", choices=["one_sequence", "transformers"], default="one_sequence",
                    help="+graph methods: the model's forward inside forge_num.hf.one_sequence_per_row() (the eager "
                         "attention path), or as transformers builds it under capture (an explicit causal mask; "
                         "sessions 27-29's captured numbers)")
    ap.add_argument("--profile", action="store_true", help="one more step under torch.profiler: time by kernel kind")
    ap.add_argument("--memory-phases", action="store_true",
                    help="one more step: the allocator's peak in forward, backward and after (CUDA)")
    ap.add_argument("--memory-snapshot", action="store_true",
                    help="one more step under the allocator's history: what is alive at its peak, and where from (CUDA)")
    ap.add_argument("--capture-history", choices=["sizes", "stacks"], default=None,
                    help="+graph methods: the capturing call under the allocator's history: what it leaves alive "
                         "(held between replays), by size, with Python stacks or without (CUDA)")
    ap.add_argument("--gc", choices=["freeze", "default"], default="freeze",
                    help="freeze: gc.collect() and gc.freeze() once the model and optimizer are built, for every "
                         "method (as torchtitan manages Python's collector), so that a full collection inside a "
                         "timed step walks only what the steps allocate; default: Python's collector untouched")
    ap.add_argument("--isolation", choices=["subprocess", "fork"], default=None,
                    help="default: subprocess with CUDA, fork on the CPU")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds per measurement")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="launch no new measurement after this many seconds (the rest: status 'skipped')")
    ap.add_argument("--out", default=None, help="JSON file, rewritten after every measurement")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker is not None:
        print(_MARK + json.dumps(run_spec(json.loads(args.worker))), flush=True)
        return 0

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if args.tiny:
        models = ["tiny"] if args.models == ap.get_default("models") else args.models.split(",")
        tokens = [(2, 32)] if args.tokens == ap.get_default("tokens") else parse_tokens(args.tokens)
        if args.warmup == ap.get_default("warmup"):
            args.warmup = 1
        if args.steps == ap.get_default("steps"):
            args.steps = 2
    else:
        models, tokens = args.models.split(","), parse_tokens(args.tokens)
    isolation = args.isolation or ("subprocess" if cuda else "fork")
    if isolation == "fork" and cuda:
        raise SystemExit("--isolation fork is CPU only (CUDA cannot be used in a forked child)")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    meta = environment(cuda)
    meta.update({"device": "cuda" if cuda else "cpu", "isolation": isolation, "gc": args.gc, "sdpa": args.sdpa,
                 "capture_attention": args.capture_attention, "warmup": args.warmup, "steps": args.steps,
                 "floor_bytes_per_param": {m: floor_bytes_per_param(m) for m in METHODS}})
    print(f"# {meta['gpu'] or 'CPU'}  torch {meta['torch']}  transformers {meta['transformers']}  "
          f"bitsandbytes {meta['bitsandbytes']}  torchao {meta['torchao']}  flashoptim {meta['flashoptim']}",
          flush=True)
    rows = []
    t_begin = time.perf_counter()

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)

    for model_name in models:
        cfg = dict(MODELS[model_name])
        if args.layers is not None:
            cfg["num_hidden_layers"] = args.layers
        for batch, seq in tokens:
            for ckpt in parse_ckpt(args.checkpointing):
                for method in methods:
                    row = {"method": method, "model": model_name, "batch": batch, "seq": seq,
                           "tokens": batch * seq, "checkpointing": ckpt,
                           "n_params": count_params(cfg)["total"]}
                    if method in FLOOR:
                        row["predicted_peak_gib"] = predict_peak_bytes(cfg, method, batch, seq, ckpt) / GIB
                    reason = unavailable_reason(method, cuda)
                    if reason is not None:
                        row.update(status="unavailable", reason=reason)
                    elif args.budget_s is not None and time.perf_counter() - t_begin > args.budget_s:
                        row.update(status="skipped", reason=f"time budget of {args.budget_s:.0f} s spent")
                    else:
                        spec = {"method": method, "config": cfg, "batch": batch, "seq": seq,
                                "checkpointing": ckpt, "warmup": args.warmup, "steps": args.steps,
                                "cpu": not cuda, "threads": 1 if args.tiny else None, "profile": args.profile,
                                "memory_phases": args.memory_phases, "memory_snapshot": args.memory_snapshot,
                                "capture_history": args.capture_history, "gc": args.gc, "sdpa": args.sdpa,
                                "capture_attention": args.capture_attention}
                        row.update(run_isolated(spec, isolation, args.run_timeout))
                    rows.append(row)
                    print_row(row)
                    save()
    add_ratios(rows)
    save()
    print("\nratios to torch_adamw (AMP) measured in the same run: peak memory, tokens/s")
    for r in rows:
        if r.get("peak_vs_torch_adamw") is not None or r.get("tokens_per_s_vs_torch_adamw") is not None:
            ck = "ckpt" if r["checkpointing"] else "    "
            print(f"{r['method']:<14} {r['model']:<9} {r['batch']}x{r['seq']:<5} {ck}  "
                  f"peak x{_fmt(r.get('peak_vs_torch_adamw'))}  "
                  f"tok/s x{_fmt(r.get('tokens_per_s_vs_torch_adamw'))}  "
                  + (f"(vs torch_adamw+cl: peak x{_fmt(r.get('peak_vs_torch_adamw_cl'))} "
                     f"tok/s x{_fmt(r.get('tokens_per_s_vs_torch_adamw_cl'))})  "
                     if "peak_vs_torch_adamw_cl" in r or "tokens_per_s_vs_torch_adamw_cl" in r else "")
                  + f"{_fmt(r.get('model_tflops_per_s'), '{:.1f}')} TFLOP/s (model FLOPs)")
    n_ok = sum(r["status"] == "ok" for r in rows)
    print(f"\n{n_ok}/{len(rows)} ran; {time.perf_counter() - t_begin:.0f} s" +
          (f"; wrote {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
