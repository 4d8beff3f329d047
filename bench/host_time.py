"""Host (CPU) time of forge_num's launches and of a training step, and where it goes.

Session 6 found forge's 8B training step host-bound on the H200 machine: the profiled step's
kernels summed to 361 ms of a 702 ms wall (AMP: 414 of 369), and one ``fused_linear_update`` call
took 200-360 us of host time there. This script measures that host time and splits it by Python
function (cProfile), so that a change to the launcher or the optimizer can be judged by it:

    python bench/host_time.py [--part launch,step] [--layers 2] [--out bench/results/x.json]
    python bench/host_time.py --part cpu-step [--cpu-precision 8bit] [--cpu-layers 16]

launch  per-call host time of kernels.fused_linear_update (default tile and a given one),
        kernels.elementwise_update, and of torch ops for scale (one empty/zeros/add), on a
        1024x1024 weight with 128 tokens (GPU time far below host time, so the loop of calls
        measures the host alone); then cProfile's split of the fused call.
step    a Llama-8B-width model with --layers layers, 1x2048 tokens, checkpointing: each method's
        step wall time, the profiler's summed kernel time, and cProfile's top functions of one step.
split   forge's host time inside a real training step, without a profiler: --split-model (llama-3b),
        --split-tokens (1x1024), checkpointing; after warm-up steps, each of forge's host functions
        timed by perf_counter wrappers (a fraction of a microsecond each), so that what a fused
        linear costs the host in the step itself (session 11: ~0.5 ms, against ~0.1 ms in a tight
        loop) is split by function; each method's forward, backward and after-backward issue
        times beside its wall time (AMP too). Both models are built first and their steps
        interleaved round by round (forge, forge with FORGE_NUM_FAST_LAUNCH=0, AMP), so the
        ratio to AMP (the median of each round's) is measured against the host's own drift.
        --split-methods picks other methods (bench/train_step.py's names, the last the reference),
        e.g. forge_8bit+cl,flashoptim+cl; each forge method also runs with FORGE_NUM_FAST_LAUNCH=0,
        and once with each --split-env NAME=VALUE set (an A/B of a library switch read at each call,
        e.g. FORGE_NUM_Q8_TILE=<label> for another 8bit tile), in the same rounds.
python  forge's own per-linear Python, on any device (the CPU included): a narrow Llama
        (hidden 32, --python-layers layers, 16 tokens, --python-checkpointing on/off) trained with forge_num.AdamW
        on a backend whose functions return at once, against nn.Linear + torch AdamW(foreach);
        each step's time (the minimum over interleaved rounds, the host being noisy), the
        difference per linear, and cProfile's top functions of forge's step.
cpu-step  the host-bound 1x1024 step's gap to FlashOptim, measured on any CPU: forge's whole host path
        (fused.py, the optimizer, kernels.fused_linear_update and its launch arguments: everything but
        the device check and the launch itself, CachedLaunch.launch, which return at once; the
        telemetry buffers zero-filled, which a launch would write) against FlashOptim's (FlashAdamW with
        gradient release, its fused path's Python down to its Triton call, which returns at once) and
        against free gradient release (hooks that only drop .grad: the floor of any hook-based method),
        in one training step of a narrow Llama (hidden 128, --cpu-layers layers, tied head, 1x16
        tokens, checkpointing, the chunked loss), with the garbage collector frozen after the build as
        bench/train_step.py does; interleaved rounds, the minimum of each; then forge's functions timed
        inside the step (perf_counter wrappers). --cpu-precision 8bit (bf16 model) or fp32 (fp32 model,
        FlashOptim without its 24-bit master). FlashOptim is optional (its wheel); without it only the
        free release is measured. What differs from a GPU's host: (1) FlashOptim's and the free
        release's dW is computed here (autograd's CPU matmul, ~20-25 us a linear on this project's
        CPU), where on a GPU it is one cuBLAS launch, and forge's is inside its stubbed launch: that
        counts against them; (2) Triton's argument binder, which FlashOptim's kernel[grid] call pays on
        a GPU (~12 us a launch on this CPU) and forge's cached launch does not, is left out: that counts
        for FlashOptim; (3) FlashOptim quantizes CUDA tensors only, so its states stay unquantized here
        (the same fused-step Python, its accessors returning plain tensors); (4) forge's launcher takes
        its Triton path with pointer tiles (the narrow model: no TMA descriptors), and the Gluon routes
        (route_config, their arguments) decline off CUDA. Last, the host's time a step of the same
        model captured by forge_num.capture_step would take besides the graph's launch: the bookkeeping
        before a replay and step()'s end (replay_bookkeeping_ms).
launch, step and split need CUDA (split also runs on the CPU with --split-model tiny, for tests).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from unittest import mock

import torch

# Run as `python bench/host_time.py`, sys.path[0] is bench/, whose kernels.py would shadow the PyPI package
# `kernels` (bitsandbytes and transformers >= 5.25 import it); the repository root, whose kernels/
# would shadow it too, goes behind site-packages (tests/conftest.py says more).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (_HERE, _ROOT)] + [_ROOT]

from bench import train_step as ts  # noqa: E402
from bench.kernels import host_us  # noqa: E402


def top_functions(fn, n: int = 25, sort: str = "tottime") -> list[dict]:
    """cProfile of fn(): the n functions with the largest ``sort`` time, in ms."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append({"function": f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line}({name})",
                     "calls": nc, "tottime_ms": tt * 1e3, "cumtime_ms": ct * 1e3})
    return sorted(rows, key=lambda r: -r[f"{sort}_ms"])[:n]


def part_launch() -> dict:
    from forge_num import kernels, rules

    M = N = 1024
    K = 128
    x = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(K, M, device="cuda", dtype=torch.bfloat16) * 1e-3
    w = torch.randn(M, N, device="cuda") * 0.02
    m, v, g = torch.zeros_like(w), torch.zeros_like(w), torch.randn_like(w) * 1e-3
    h = rules.ADAMW.scalars({"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, 1)
    cfg = kernels.default_config(M, N, K, torch.bfloat16)
    small = torch.empty(1, device="cuda")
    fns = {
        "fused_linear_update (default tile)": lambda: kernels.fused_linear_update(w, x, dy, [m, v], rules.ADAMW, h),
        "fused_linear_update (config given)": lambda: kernels.fused_linear_update(w, x, dy, [m, v], rules.ADAMW, h,
                                                                                  config=cfg),
        "elementwise_update": lambda: kernels.elementwise_update(w, g, [m, v], rules.ADAMW, h),
        "torch.empty(1)": lambda: torch.empty(1, device="cuda"),
        "torch.zeros(1)": lambda: torch.zeros(1, device="cuda"),
        "torch.add(t, t)": lambda: torch.add(small, small),
        "dy.t() @ x": lambda: dy.t() @ x,
    }
    for f in fns.values():  # compile and warm
        f()
    out = {"host_us": {name: host_us(f, calls=200, loops=5) for name, f in fns.items()}}
    def calls():  # each result dropped at once, as in host_us's loop
        for _ in range(200):
            fns["fused_linear_update (default tile)"]()

    out["fused_profile"] = top_functions(calls)
    return out


def part_step(layers: int) -> dict:
    cfg = dict(ts.MODELS["llama-8b"], num_hidden_layers=layers)
    out = {}
    for method in ("forge", "torch_adamw"):
        model = ts._build_model(cfg, torch.float32, torch.device("cuda"), True)
        amp_dtype, after = ts._setup(method, model, True)
        ids = torch.randint(0, cfg["vocab_size"], (1, 2048), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            after()

        walls = []
        for k in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if k >= 2:
                walls.append((time.perf_counter() - t0) * 1e3)
        prof = ts.profile_step(step, True)
        out[method] = {"wall_ms": walls, "profile_wall_ms": prof["profile_wall_ms"],
                       "profile_device_ms": prof["profile_device_ms"], "profile_ms": prof["profile_ms"],
                       "cprofile_tottime": top_functions(step, 30), "cprofile_cumtime": top_functions(step, 40, "cumtime")}
        model = after = step = None  # free the model before the next method builds its own
        torch.cuda.empty_cache()
    return out


class _NoKernels:
    """A forge_num backend (optim.BACKEND_FUNCTIONS) that launches nothing: what remains of a
    step is the host's Python around the kernels."""

    class _Stats:
        partials = (torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.int32))

    def fused_linear_update(self, *args, **kwargs):
        return self._Stats()

    def elementwise_update(self, *args, **kwargs):
        return self._Stats()

    def weight_grad_norm_sq(self, *args, **kwargs):
        return torch.zeros((), dtype=torch.float64)

    def accumulate_weight_grad(self, *args, **kwargs):
        return None


def part_python(layers: int, rounds: int = 5, steps: int = 10, checkpointing: bool = True) -> dict:
    import forge_num
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, use_cache=False, attn_implementation="sdpa")
    ids = torch.randint(0, 128, (1, 16), device=device)

    def model():
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg).to(device)
        m.train()
        if checkpointing:
            m.gradient_checkpointing_enable({"use_reentrant": False})
        return m

    plain = model()
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-3, foreach=True)
    fused = model()
    fused_opt = forge_num.AdamW(fused.parameters(), lr=1e-3, backend=_NoKernels())
    forge_num.prepare(fused, fused_opt)

    def plain_step():
        plain(input_ids=ids, labels=ids).loss.backward()
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)

    def forge_step():
        fused(input_ids=ids, labels=ids).loss.backward()
        fused_opt.step()

    def seconds(step):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    for step in (plain_step, forge_step):
        for _ in range(3):
            step()
    best = {"plain": float("inf"), "forge": float("inf")}
    for _ in range(rounds):  # interleaved, so that a slow spell of the host hits both
        best["plain"] = min(best["plain"], seconds(plain_step))
        best["forge"] = min(best["forge"], seconds(forge_step))
    linears = 7 * layers
    return {"device": str(device), "layers": layers, "linears": linears, "checkpointing": checkpointing,
            "plain_step_ms": best["plain"] * 1e3, "forge_step_ms": best["forge"] * 1e3,
            "forge_extra_us_per_linear": (best["forge"] - best["plain"]) / linears * 1e6,
            "cprofile_tottime": top_functions(forge_step, 30)}


@contextlib.contextmanager
def _launches_stubbed():
    """forge_num.kernels on CPU tensors, every launch returning at once: the device checks pass, the
    cached launches (the fused and element-wise kernels') return, and the telemetry buffers are zeros
    (what no launch writes reads as no update's partials). Everything else runs as on a GPU."""
    from forge_num import kernels
    from forge_num.kernels import launch_cache

    telemetry = kernels._telemetry_buffers
    with mock.patch.object(kernels, "_check_one_device", lambda *t: None), \
            mock.patch.object(kernels, "_check_device", lambda *t: None), \
            mock.patch.object(launch_cache.CachedLaunch, "launch", lambda self, *a, **k: None), \
            mock.patch.object(kernels, "_telemetry_buffers",
                              lambda tiles, device, launched: telemetry(tiles, device, False)):
        yield


def part_cpu_step(layers: int, precision: str = "8bit", rounds: int = 7, steps: int = 10) -> dict:
    """The cpu-step part (module docstring): per-step host time of forge, FlashOptim (where importable)
    and free gradient release, launches stubbed, and forge's functions inside its step."""
    import gc

    import forge_num
    from forge_num import kernels
    from forge_num.hf import causal_lm_loss

    if torch.cuda.is_available():
        raise SystemExit("--part cpu-step stubs the launches of CPU tensors: run it where torch sees no GPU "
                         "(CUDA_VISIBLE_DEVICES= python bench/host_time.py --part cpu-step)")
    if kernels._interpreting():
        raise SystemExit("--part cpu-step times the compiled kernels' launcher: unset TRITON_INTERPRET "
                         "(under it every launch runs the kernel in Triton's interpreter)")
    dtype = torch.bfloat16 if precision == "8bit" else torch.float32
    cfg = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    ids = torch.randint(0, 256, (1, 16))

    def model():
        torch.manual_seed(0)
        return ts._build_model(cfg, dtype, torch.device("cpu"), True)

    steps_by_method = {}
    released = model()
    for p in released.parameters():
        p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    steps_by_method["free release"] = lambda: causal_lm_loss(released, ids).backward()
    # the same without the layers' dW (their weights frozen): the difference is what autograd's CPU
    # matmuls for dW cost a linear here, which a GPU's host pays as one launch (docstring, item 1)
    frozen = model()
    for name, p in frozen.named_parameters():
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            p.requires_grad_(False)
        else:
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    steps_by_method["free release, no layer dW"] = lambda: causal_lm_loss(frozen, ids).backward()
    try:
        import flashoptim
        from flashoptim import optimizers as fo_optimizers
    except ImportError:
        flashoptim = None
    fo_patch = contextlib.nullcontext()
    if flashoptim is not None:
        fo_model = model()
        # its constructor refuses without CUDA for the 8-bit states and the 24-bit master, which it
        # allocates on the parameters' device; its launch (the whole Triton call) returns at once
        with mock.patch("torch.cuda.is_available", lambda: True):
            fo_opt = flashoptim.FlashAdamW(fo_model.parameters(), lr=1e-4,
                                           master_weight_bits=24 if precision == "8bit" else None)
        handle = flashoptim.enable_gradient_release(fo_model, fo_opt)
        fo_patch = mock.patch.object(fo_optimizers, "_fused_adam_step", lambda *a, **k: None)
        steps_by_method["flashoptim"] = lambda: causal_lm_loss(fo_model, ids).backward()
    forge_model = model()
    opt = forge_num.AdamW(forge_model.parameters(), lr=1e-4, precision=precision, backend=kernels)
    forge_num.prepare(forge_model, opt)

    def forge_step():
        causal_lm_loss(forge_model, ids).backward()
        opt.step()

    steps_by_method["forge"] = forge_step

    def seconds(step):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - t0) / steps

    best = {name: float("inf") for name in steps_by_method}
    ratios = []
    with _launches_stubbed(), fo_patch:
        for step in steps_by_method.values():
            for _ in range(3):
                step()
        gc.collect()
        gc.freeze()
        try:
            for _ in range(rounds):  # interleaved, so that a slow spell of the host hits every method
                times = {name: seconds(step) for name, step in steps_by_method.items()}
                for name, t in times.items():
                    best[name] = min(best[name], t)
                if flashoptim is not None:
                    ratios.append(times["flashoptim"] / times["forge"])
            timers = _forge_timers(opt)
            with timers.on():
                for _ in range(steps):
                    forge_step()
            replay_ms = _replay_bookkeeping_ms(opt, forge_step, rounds, steps)
        finally:
            gc.unfreeze()
            if flashoptim is not None:
                handle.remove()
    linears = 7 * layers
    reference = "flashoptim" if flashoptim is not None else "free release"
    return {"layers": layers, "linears": linears, "precision": precision, "steps": steps, "rounds": rounds,
            "step_ms": {name: t * 1e3 for name, t in best.items()}, "reference": reference,
            "forge_extra_us_per_linear": (best["forge"] - best[reference]) / linears * 1e6,
            "cpu_dw_us_per_linear":
                (best["free release"] - best["free release, no layer dW"]) / linears * 1e6,
            "speed_vs_flashoptim": statistics.median(ratios) if ratios else None,
            "replay_bookkeeping_ms": replay_ms,
            "functions": {label: {"us_per_call": timers.total[label] * 1e6 / timers.calls[label],
                                  "calls_per_step": timers.calls[label] / steps}
                          for label in sorted(timers.total, key=lambda k: -timers.total[k])}}


def _replay_bookkeeping_ms(opt, forge_step, rounds: int, steps: int) -> float:
    """The host's time a step of the same model captured by forge_num.capture_step, but for the graph's
    launch: the bookkeeping before a replay (every update's counters and scalars into its step slot,
    their upload) and step()'s end after it. The slots' order from one eager step that reads slots
    (launches stubbed); the minimum over rounds of the mean of ``steps`` steps, in ms."""
    from forge_num.optim import _StepSlots

    opt._slots = _StepSlots.for_optimizer(opt, torch.device("cpu"))
    try:
        forge_step()
        updates = list(dict.fromkeys(opt._slots.written))
        summed = torch.zeros(2, dtype=torch.float64)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(steps):
                opt._prepare_replayed_updates(updates)
                opt._slots.upload()
                opt._finish_step(summed=summed)
            best = min(best, (time.perf_counter() - t0) / steps)
    finally:
        opt._slots = None
    return best * 1e3


class _Timers:
    """perf_counter accumulators around named functions (inclusive times: a function's callees are
    inside its total), counting only inside ``with timers.on():``; the functions are wrapped there
    and put back on leaving it."""

    def __init__(self):
        self.total = {}
        self.calls = {}
        self._targets = []

    def wrap(self, owner, attr: str, label: str, static: bool = False):
        self._targets.append((owner, attr, label, static))

    @contextlib.contextmanager
    def on(self):
        total, calls, clock = self.total, self.calls, time.perf_counter
        undo = []

        def timed_version(fn, label):
            def timed(*args, **kwargs):
                t0 = clock()
                try:
                    return fn(*args, **kwargs)
                finally:
                    total[label] = total.get(label, 0.0) + (clock() - t0)
                    calls[label] = calls.get(label, 0) + 1

            return timed

        try:
            for owner, attr, label, static in self._targets:
                own = attr in vars(owner)  # an instance's method lives on its class: deleted again after
                orig = vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)
                fn = orig.__func__ if isinstance(orig, staticmethod) else orig
                timed = timed_version(fn, label)
                setattr(owner, attr, staticmethod(timed) if static else timed)
                undo.append((owner, attr, orig, own))
            yield self
        finally:
            for owner, attr, orig, own in reversed(undo):
                if own:
                    setattr(owner, attr, orig)
                else:
                    delattr(owner, attr)


def _forge_timers(opt) -> _Timers:
    """Timers on forge's host path of a fused linear, outermost first."""
    from forge_num import fused, kernels
    from forge_num.kernels import launch_cache

    t = _Timers()
    t.wrap(fused._FusedLinearFn, "forward", "fused linear forward", static=True)
    t.wrap(fused._FusedLinearFn, "backward", "fused linear backward (all of it)", static=True)
    # inside a non-reentrant checkpointed segment a fused layer is two nodes (forge_num/fused.py says why)
    t.wrap(fused._FusedLinearOperands, "forward", "fused linear forward, checkpointed: operands", static=True)
    t.wrap(fused._FusedLinearProduct, "forward", "fused linear forward, checkpointed: product", static=True)
    t.wrap(fused._FusedLinearProduct, "backward", "fused linear backward, checkpointed (all of it)", static=True)
    t.wrap(fused, "fused_linear_backward", "  fused_linear_backward")
    cls = type(opt)
    # _apply_elementwise: the hook path's update (norm weights; the embedding where not tied)
    for attr in ("_on_linear_grad", "_apply_linear", "_apply_elementwise", "_prepare_state", "_record"):
        if attr in cls.__dict__ or any(attr in c.__dict__ for c in cls.__mro__):
            owner = next(c for c in cls.__mro__ if attr in c.__dict__)
            t.wrap(owner, attr, f"    opt.{attr}")
    t.wrap(kernels, "fused_linear_update", "      kernels.fused_linear_update")
    t.wrap(kernels, "_telemetry_buffers", "        kernels._telemetry_buffers")
    t.wrap(kernels, "_launch_linear", "        kernels._launch_linear (Triton)")
    t.wrap(kernels, "_linear_launch_arguments", "          kernels._linear_launch_arguments")
    t.wrap(kernels, "_tma_descriptors", "            kernels._tma_descriptors")
    # every launch of the Triton fused kernel and of the Gluon one; JITFunction.run beneath it only
    # on a key's first launch, or every launch with FORGE_NUM_FAST_LAUNCH=0
    t.wrap(launch_cache.CachedLaunch, "launch", "          CachedLaunch.launch (Triton, Gluon)")
    t.wrap(kernels.fused_linear_update_kernel, "run", "            JITFunction.run (Triton)")
    try:
        from forge_num.kernels import gluon_update
    except ImportError:
        gluon_update = None
    if gluon_update is not None:
        t.wrap(kernels, "_ws_route", "        kernels._ws_route")
        t.wrap(gluon_update, "launch", "        gluon_update.launch")
        t.wrap(gluon_update, "_nvmma_desc", "          gluon_update._nvmma_desc")
        t.wrap(gluon_update.fused_linear_update_ws_kernel, "run", "          JITFunction.run (Gluon)")
    try:
        from forge_num.kernels import gluon_q8
    except ImportError:
        gluon_q8 = None
    if gluon_q8 is not None:  # the 8bit regime's routed launches (session 23)
        t.wrap(kernels, "_ws_q8_route", "        kernels._ws_q8_route")
        t.wrap(gluon_q8, "launch", "        gluon_q8.launch")
    # Triton's per-launch Python (Triton 3.6), where a launch's host time goes (session 23: 75 us a cached
    # launch on an H100 host): the launch metadata for hooks, the launcher's Python around its C function,
    # and in it each TMA descriptor's encoding (cuTensorMapEncodeTiled). Every Triton launch of the step
    # counts (the fused and element-wise kernels' through CachedLaunch, and any other): not nested
    # under the labels above.
    try:
        from triton.backends.nvidia import driver as nvidia_driver
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        nvidia_driver = None
    if nvidia_driver is not None:
        t.wrap(CompiledKernel, "launch_metadata", "[every Triton launch] CompiledKernel.launch_metadata")
        t.wrap(nvidia_driver.CudaLauncher, "__call__", "[every Triton launch] CudaLauncher.__call__")
        t.wrap(nvidia_driver, "make_tensordesc_arg",
               "[every Triton launch] make_tensordesc_arg (a TMA descriptor)")
    return t


def part_split(model_name: str, tokens: str, warmup: int = 3, steps: int = 6,
               methods: tuple[str, ...] = ("forge", "torch_adamw"), envs: tuple[str, ...] = ()) -> dict:
    """Each method's real training step (checkpointing), its host time split by phase and, for
    forge, by function. ``methods``: bench/train_step.py's names ("+cl": forge's chunked loss); the
    last is the reference the speeds are given against. Every model is built first and the steps
    interleaved, round by round, so that a slow spell of the device's host hits every method alike
    (session 12: three calls of the same 3B 1x1024 code gave forge 0.55-0.86x AMP, run one method after
    the other); each forge method runs once more with FORGE_NUM_FAST_LAUNCH=0 (Triton's binder for
    every launch of the fused kernels, kernels/launch_cache.py), and once with each of ``envs``
    ("NAME=VALUE", set around each of its steps). ``steps`` rounds after ``warmup``;
    ``speed_vs_reference`` is the median over rounds of the reference's step time over the method's in
    the same round (tokens/s, x the reference). See the module docstring."""
    import gc

    from forge_num.hf import causal_lm_loss

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    batch, seq = (int(v) for v in tokens.split("x"))
    cfg = ts.MODELS[model_name]
    if len(set(methods)) != len(methods) or not methods:
        raise ValueError(f"--split-methods: each method once, at least one, got {','.join(methods)!r}")
    reference = methods[-1]
    out = {"model": model_name, "tokens": tokens, "steps": steps, "interleaved": True, "reference": reference}
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), device=device)
    built = {}
    for method in methods:
        base = ts.base_method(method)
        dtype = torch.float32 if ts.FLOOR[base][4] == "fp32" else torch.bfloat16
        model = ts._build_model(cfg, dtype, device, True)
        built[method] = (model, *ts._setup(base, model, cuda))
    for assignment in envs:
        if "=" not in assignment or not assignment.split("=", 1)[0]:
            raise ValueError(f"--split-env: NAME=VALUE, got {assignment!r}")
    # name -> (method, the environment its steps run under: None for a method that is not forge's)
    variants = {}
    for method in methods:
        forge = ts.base_method(method) in ts.FORGE_PRECISION
        variants[method] = (method, {"FORGE_NUM_FAST_LAUNCH": "1"} if forge else None)
        if forge:
            variants[f"{method} (FORGE_NUM_FAST_LAUNCH=0)"] = (method, {"FORGE_NUM_FAST_LAUNCH": "0"})
            for assignment in envs:
                name, value = assignment.split("=", 1)
                variants[f"{method} ({assignment})"] = (method, {"FORGE_NUM_FAST_LAUNCH": "1", name: value})
    timers = {name: _forge_timers(built[method][2].__self__) if env is not None else _Timers()
              for name, (method, env) in variants.items()}
    phases = {name: {"forward": [], "backward": [], "after": [], "wall": []} for name in variants}
    gc.collect()
    gc.freeze()
    try:
        for k in range(warmup + steps):
            for name, (method, env) in variants.items():
                model, amp_dtype, after = built[method]
                t = timers[name]
                with mock.patch.dict(os.environ, env or {}), (t.on() if k >= warmup else contextlib.nullcontext()):
                    if cuda:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                        if method.endswith(ts.CHUNKED_LOSS):
                            loss = causal_lm_loss(model, ids)
                        else:
                            loss = model(input_ids=ids, labels=ids).loss
                    t1 = time.perf_counter()
                    loss.backward()
                    t2 = time.perf_counter()
                    after()
                    t3 = time.perf_counter()
                    if cuda:
                        torch.cuda.synchronize()
                    t4 = time.perf_counter()
                if k >= warmup:
                    for phase, dt in (("forward", t1 - t0), ("backward", t2 - t1), ("after", t3 - t2),
                                      ("wall", t4 - t0)):
                        phases[name][phase].append(dt * 1e3)
    finally:
        gc.unfreeze()
    for name in variants:
        row = {phase: statistics.median(v) for phase, v in phases[name].items()}
        row["wall_all"] = phases[name]["wall"]
        row["speed_vs_reference"] = statistics.median(
            a / b for a, b in zip(phases[reference]["wall"], phases[name]["wall"]))
        t = timers[name]
        row["functions"] = {label: {"ms_per_step": t.total[label] * 1e3 / steps,
                                    "calls_per_step": t.calls[label] / steps,
                                    "us_per_call": t.total[label] * 1e6 / t.calls[label]}
                            for label in t.total}
        out[name] = row
    out["variants"] = list(variants)
    built.clear()
    if cuda:
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="launch,step")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--python-layers", type=int, default=16)
    ap.add_argument("--python-checkpointing", choices=["on", "off"], default="on")
    ap.add_argument("--split-model", default="llama-3b", choices=sorted(ts.MODELS))
    ap.add_argument("--split-tokens", default="1x1024")
    ap.add_argument("--split-steps", type=int, default=6)
    ap.add_argument("--split-methods", default="forge,torch_adamw",
                    help="bench/train_step.py's method names, the last the reference (e.g. forge_8bit+cl,flashoptim+cl)")
    ap.add_argument("--split-env", action="append", default=[], metavar="NAME=VALUE",
                    help="also run each forge method with this variable set (repeatable)")
    ap.add_argument("--cpu-layers", type=int, default=16)
    ap.add_argument("--cpu-precision", default="8bit", choices=["8bit", "fp32"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    parts = args.part.split(",")
    cuda = torch.cuda.is_available()
    cpu_parts = {"python", "split", "cpu-step"}
    if not cuda and (set(parts) - cpu_parts or ("split" in parts and args.split_model != "tiny")):
        raise SystemExit("bench/host_time.py --part launch/step/split measures CUDA launches: no CUDA device here "
                         "(--part python runs anywhere, --part split --split-model tiny too)")
    res = {"meta": {"gpu": torch.cuda.get_device_name(0) if cuda else None, "torch": torch.__version__,
                    "command": "python bench/host_time.py " + " ".join(sys.argv[1:] if argv is None else argv)}}
    if "python" in parts:
        r = res["python"] = part_python(args.python_layers, checkpointing=args.python_checkpointing == "on")
        print(f"python ({r['device']}, {r['layers']} layers, checkpointing {args.python_checkpointing}, kernels stubbed): "
              f"nn.Linear + torch AdamW "
              f"{r['plain_step_ms']:.2f} ms a step, forge {r['forge_step_ms']:.2f} ms: "
              f"{r['forge_extra_us_per_linear']:.1f} us more per linear", flush=True)
        for row in r["cprofile_tottime"][:15]:
            print(f"  {row['tottime_ms']:7.1f} ms self {row['cumtime_ms']:7.1f} cum {row['calls']:>6}x  {row['function']}")
    if "cpu-step" in parts:
        r = res["cpu_step"] = part_cpu_step(args.cpu_layers, args.cpu_precision)
        times = ", ".join(f"{name} {ms:.2f}" for name, ms in r["step_ms"].items())
        speed = ("" if r["speed_vs_flashoptim"] is None
                 else f"; forge x flashoptim {r['speed_vs_flashoptim']:.3f} (median of rounds)")
        print(f"cpu-step ({r['precision']}, {r['layers']} layers, launches stubbed): {times} ms a step; "
              f"forge {r['forge_extra_us_per_linear']:.1f} us more a linear than {r['reference']}{speed}; "
              f"autograd's CPU dW {r['cpu_dw_us_per_linear']:.1f} us a linear (in the others' times, "
              f"not forge's); a captured step's bookkeeping {r['replay_bookkeeping_ms']:.2f} ms a step", flush=True)
        for label, f in r["functions"].items():
            print(f"  {f['us_per_call']:8.1f} us/call {f['calls_per_step']:6.0f} calls/step  {label}")
    if "split" in parts:
        r = res["split"] = part_split(args.split_model, args.split_tokens, steps=args.split_steps,
                                      methods=tuple(args.split_methods.split(",")), envs=tuple(args.split_env))
        for method in r["variants"]:
            m = r[method]
            print(f"split {r['model']} {r['tokens']} {method:<32} wall {m['wall']:7.1f} ms  issued: forward "
                  f"{m['forward']:6.1f} backward {m['backward']:6.1f} after {m['after']:6.1f} ms  "
                  f"x {r['reference']} {m['speed_vs_reference']:.3f} (median of rounds)", flush=True)
            for label, f in m["functions"].items():
                print(f"  {f['ms_per_step']:7.1f} ms/step {f['calls_per_step']:6.0f} calls {f['us_per_call']:7.1f} us/call  {label}")
    if "launch" in parts:
        res["launch"] = part_launch()
        for name, us in res["launch"]["host_us"].items():
            print(f"host {name:<40} {us:8.1f} us/call", flush=True)
        if "telemetry_pairs_kept" in res["launch"]:
            print(f"telemetry pairs kept (device, stream, tiles): {res['launch']['telemetry_pairs_kept']}", flush=True)
        for r in res["launch"]["fused_profile"][:15]:
            print(f"  {r['tottime_ms'] / 200 * 1e3:7.1f} us/call self  {r['cumtime_ms'] / 200 * 1e3:7.1f} cum  "
                  f"{r['calls'] // 200:>3}x  {r['function']}", flush=True)
    if "step" in parts:
        res["step"] = part_step(args.layers)
        for method, r in res["step"].items():
            print(f"step {method:<12} wall {statistics.median(r['wall_ms']):7.1f} ms  profiled wall "
                  f"{r['profile_wall_ms']:7.1f} kernels {r['profile_device_ms']:7.1f} ms", flush=True)
            for row in r["cprofile_tottime"][:12]:
                print(f"  {row['tottime_ms']:7.1f} ms self {row['cumtime_ms']:7.1f} cum {row['calls']:>6}x  {row['function']}")
            print("  cumulative:")
            for row in r["cprofile_cumtime"][:25]:
                print(f"  {row['tottime_ms']:7.1f} ms self {row['cumtime_ms']:7.1f} cum {row['calls']:>6}x  {row['function']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
