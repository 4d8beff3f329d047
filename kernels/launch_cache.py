"""A JIT kernel's launch without Triton's per-call argument binding, for launches whose
specialization the caller can name more cheaply than Triton can compute it.

Why: ``kernel[grid](*args, **kwargs)`` (triton.runtime.jit.JITFunction.run, Triton 3.6) binds every
argument through a generated function, specializes each one in C++ (dtype, 16-byte alignment,
integer value 1 or a multiple of 16, a descriptor's block and layout), hashes the result into the
compiled-kernel cache's key and looks the kernel up, before the launch itself: about 40% of a
routed launch's host time (bench/host_time.py, session 11 on the H200), paid 225 times in an 8B
training step whose host time bounds its speed. Used by the Gluon kernel's launches
(kernels/gluon_update.py) and, since session 21, the Triton fused kernel's (kernels/__init__.py,
_linear_launch_arguments), whose binder took ~12 of the ~15 us Triton spends before the launcher
on this project's CPU (an 8bit TMA launch's 28 runtime arguments); since session 22 the element-wise
kernel's too (_elementwise_launch_arguments: the norms' and the embedding's updates, 34 launches
a fp32 Llama-1B step).

The caller of ``CachedLaunch`` passes instead a key of its own that determines Triton's
specialization (every value the binder reads to specialize, or a coarser function of the arguments
that fixes them): the first launch with a key goes through ``JITFunction.run`` (compiling if
needed) and keeps the CompiledKernel it returns; later launches with the key call that kernel's
launcher directly, with the argument values in the kernel's parameter order, as
``JITFunction.run`` does after its lookup.

What is skipped besides the binder: ``run``'s check that the kernel's global values have not
changed since compilation (the kernels launched here read module constants only), its pre-run
hooks (none are registered on them), and its reading of ``knobs.runtime.debug`` and
``knobs.compilation.instrumentation_mode`` into the compile options: a kernel kept under a key stays
the one compiled with the knobs of that key's first launch (set FORGE_NUM_FAST_LAUNCH=0 while
debugging or instrumenting kernels). Launch hooks (``knobs.runtime.launch_enter_hook``,
used by Triton's profiler) are still called. ``FORGE_NUM_FAST_LAUNCH=0`` in the environment
sends every launch through ``JITFunction.run`` (an A/B switch, read at each call).

The keys' correctness (equal keys, equal compiled kernels) is checked on the CPU against Triton's
binder over every kind of launch the Triton kernels' launchers make (tests/test_launch_cache.py),
and on the GPU against Triton's own lookup (``JITFunction.run(..., warmup=True)``) over shapes of
each divisibility class, with the bits of both launch paths against each other
(tests/test_gpu_gluon.py, tests/test_gpu_exactness.py::test_cached_triton_launch and
test_cached_elementwise_launch).
"""

from __future__ import annotations

import os

from triton import knobs
from triton.runtime.driver import driver

# Entries kept before the table is cleared: a key may name a launch's shape (the Triton fused
# kernel's names M, N, K and the strides), and a run whose token counts keep changing would grow it
# without end; a cleared entry costs one launch through JITFunction.run (the compiled kernel stays in
# Triton's own cache).
MAX_KEYS = 4096


# Trailing fields of Triton's host-side TensorDescriptor dataclasses that the constructor leaves at their
# defaults for the descriptors built here (bf16 and fp32 blocks, zero padding, no TF32 rounding): Triton 3.6's
# padding, and 3.9's round_f32_to_tf32 after it. A field not named here may be one __post_init__ computes.
KNOWN_DEFAULTED_FIELDS = ("padding", "round_f32_to_tf32")


def descriptor_builder(cls, leading: tuple):
    """A function making an instance of the dataclass ``cls`` from the values of its ``leading`` fields, in
    order, every later field at its declared default, without the constructor: its __post_init__ re-checks in
    Python what the launchers checked already, ~4 us a descriptor on this project's CPU. None where cls's fields
    are not ``leading`` followed by fields of KNOWN_DEFAULTED_FIELDS (a Triton whose descriptor this does not
    know: the caller uses the constructor). tests/test_launch_cache.py and tests/test_gluon_route.py check its
    descriptors equal the constructor's, field by field, under the installed Triton."""
    import dataclasses

    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields)
    trailing = fields[len(leading):]
    if names[:len(leading)] != tuple(leading) or any(
            f.name not in KNOWN_DEFAULTED_FIELDS or f.default is dataclasses.MISSING for f in trailing):
        return None
    defaults = {f.name: f.default for f in trailing}

    def build(*values):
        d = object.__new__(cls)
        d.__dict__.update(zip(leading, values))
        d.__dict__.update(defaults)
        return d

    return build


def alignment_bits(tensors) -> int:
    """One bit a tensor argument, in order: whether its data pointer is 16-byte aligned (Triton
    specializes every pointer on it); 0 for None. A key's part for the launches below."""
    bits = 0
    for t in tensors:
        bits = (bits << 1) | (t is not None and t.data_ptr() % 16 == 0)
    return bits


class CachedLaunch:
    """``launch(key, pins, grid, args, constants)`` = ``jit_fn[grid](*args, **constexprs, **options)``
    with ``(constexprs, options) = constants()``, where ``args`` are the values of the kernel's
    leading runtime parameters (in order; None where a parameter is absent: Triton makes it a
    constexpr), ``constexprs`` a dict of the remaining parameters in their order, ``options`` the
    compile options (num_warps, maxnreg, ...).

    ``key`` must determine Triton's specialization of ``args`` given ``pins``: the objects that
    ``constants()`` is a function of (a rule, a tile configuration), which the key may name by
    ``id()`` for speed. They are kept beside the compiled kernel and compared on every hit (``==``,
    which is ``is`` for the same objects), so an id reused by another object is a miss, never a
    wrong kernel; ``constants()`` is called on a miss only. Kernels are kept per current device
    (the one JITFunction.run compiles for and launches on)."""

    def __init__(self, jit_fn):
        self.jit_fn = jit_fn
        self.param_names = tuple(p.name for p in jit_fn.params)
        self.kernels: dict = {}

    def launch(self, key, pins: tuple, grid: tuple, args: tuple, constants):
        device = driver.active.get_current_device()
        entry = self.kernels.get((device, key))
        if entry is None or entry[2] != pins or os.environ.get("FORGE_NUM_FAST_LAUNCH", "1") == "0":
            constexprs, options = constants()
            kernel = self.jit_fn[grid](*args, **constexprs, **options)
            names = self.param_names[len(args):]
            if tuple(constexprs) != names:  # the values kept must be in the kernel's parameter order
                raise ValueError(f"CachedLaunch: constexprs {tuple(constexprs)} are not the kernel's "
                                 f"parameters after the {len(args)} positional ones, {names}")
            if len(self.kernels) >= MAX_KEYS:  # keys name shapes: bound the table where they keep changing
                self.kernels.clear()
            self.kernels[(device, key)] = (kernel, tuple(constexprs.values()), pins)
            return kernel
        kernel, constexpr_values, _ = entry
        values = (*args, *constexpr_values)
        stream = driver.active.get_current_stream(device)
        grid_0 = grid[0]
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        metadata = kernel.launch_metadata(grid, stream, *values)
        kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, metadata,
                   knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)
        return kernel

    def lookup(self, key):
        """The CompiledKernel kept under key for the current device, or None."""
        entry = self.kernels.get((driver.active.get_current_device(), key))
        return None if entry is None else entry[0]
