"""kernels/launch_cache.py on the CPU: when CachedLaunch goes through Triton's JITFunction.run (a
miss, pins that differ, another device, FORGE_NUM_FAST_LAUNCH=0) and what it refuses; and the keys
of the Triton fused kernel (kernels._linear_launch_arguments) and of the element-wise kernel
(kernels._elementwise_launch_arguments) against Triton's own binder: equal keys, equal
specializations. Its fast path launches a compiled kernel, so it is checked on the GPU
(tests/test_gpu_gluon.py and tests/test_gpu_exactness.py: the kernel Triton's own lookup picks, and
the same bits)."""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import types
from unittest import mock

import pytest
import torch

from forge_num import kernels, rules
from forge_num.kernels import launch_cache
from forge_num.kernels.launch_cache import CachedLaunch
from forge_num.kernels.linear_update import elementwise_update_kernel, fused_linear_update_kernel


class _Device:
    """The driver's current device, settable (the CPU has no CUDA driver to ask)."""

    def __init__(self):
        self.index = 0
        self.active = types.SimpleNamespace(get_current_device=lambda: self.index)


@pytest.fixture(autouse=True)
def device():
    d = _Device()
    with mock.patch.object(launch_cache, "driver", d):
        yield d


class _FakeJIT:
    """A JITFunction's surface: params, and kernel[grid](...) recording its calls."""

    def __init__(self, names):
        self.params = [types.SimpleNamespace(name=n) for n in names]
        self.calls = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return object()  # a CompiledKernel stand-in

        return run


def _launcher():
    jit = _FakeJIT(["x", "n", "BLOCK", "num_warps"])
    return jit, CachedLaunch(jit)


def test_a_miss_goes_through_the_jit_and_keeps_the_kernel():
    jit, cl = _launcher()
    made = []

    def constants():
        made.append(1)
        return {"BLOCK": 64, "num_warps": 4}, {"maxnreg": None}

    k = cl.launch(("k",), ("rule",), (8,), ("X", 3), constants)
    assert jit.calls == [((8,), ("X", 3), {"BLOCK": 64, "num_warps": 4, "maxnreg": None})]
    assert cl.lookup(("k",)) is k and made == [1]


def test_other_pins_under_one_key_are_a_miss():
    """A key names its pins by id(); another object under a reused id must recompile, not reuse."""
    jit, cl = _launcher()
    consts = lambda: ({"BLOCK": 64, "num_warps": 4}, {})  # noqa: E731
    first = cl.launch(("k",), ("a",), (1,), ("X", 3), consts)
    second = cl.launch(("k",), ("b",), (1,), ("X", 3), consts)
    assert len(jit.calls) == 2 and first is not second and cl.lookup(("k",)) is second


def test_the_switch_sends_every_launch_through_the_jit():
    jit, cl = _launcher()
    consts = lambda: ({"BLOCK": 64, "num_warps": 4}, {})  # noqa: E731
    with mock.patch.dict("os.environ", {"FORGE_NUM_FAST_LAUNCH": "0"}):
        for _ in range(3):
            cl.launch(("k",), ("a",), (1,), ("X", 3), consts)
    assert len(jit.calls) == 3


def test_constexprs_out_of_parameter_order_are_refused():
    """The kept values are passed positionally after the runtime arguments: any other order would
    hand a kernel wrong constants, so it is refused on the miss that would keep it."""
    jit, cl = _launcher()
    with pytest.raises(ValueError, match="parameters after the 2 positional ones"):
        cl.launch(("k",), (), (1,), ("X", 3), lambda: ({"num_warps": 4, "BLOCK": 64}, {}))
    assert cl.lookup(("k",)) is None


def test_kernels_are_kept_per_device(device):
    """JITFunction.run compiles for, and launches on, the current device: a kernel kept while another
    device was current is not the one to launch."""
    jit, cl = _launcher()
    consts = lambda: ({"BLOCK": 64, "num_warps": 4}, {})  # noqa: E731
    first = cl.launch(("k",), ("a",), (1,), ("X", 3), consts)
    device.index = 1
    assert cl.lookup(("k",)) is None
    second = cl.launch(("k",), ("a",), (1,), ("X", 3), consts)
    assert len(jit.calls) == 2 and cl.lookup(("k",)) is second
    device.index = 0
    assert cl.lookup(("k",)) is first


def test_the_table_is_bounded():
    """Keys that name shapes (the Triton fused kernel's) would grow the table without end in a run
    whose token counts keep changing: at MAX_KEYS entries it starts over."""
    jit, cl = _launcher()
    consts = lambda: ({"BLOCK": 64, "num_warps": 4}, {})  # noqa: E731
    with mock.patch.object(launch_cache, "MAX_KEYS", 3):
        for k in range(5):
            cl.launch((k,), ("a",), (1,), ("X", 3), consts)
    assert len(cl.kernels) == 2 and cl.lookup((4,)) is not None and cl.lookup((0,)) is None


# -- the Triton fused kernel's key --------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _binder(kernel):
    """Triton's argument binder of a kernel (of the same function jitted, where the session's kernel is
    the interpreter's: TRITON_INTERPRET=1)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    k = kernel
    if not hasattr(k, "params"):
        k = JITFunction(k.fn, **k.kwargs)
    return create_function_from_signature(k.signature, k.params, BaseBackend)


def _binder_specialization(kernel, args, constexprs, options) -> str:
    """What Triton's binder makes of a launch (its specialization and options: the compiled kernel's
    cache key, less the source), as text."""
    _, spec, opts = _binder(kernel)(*args, **constexprs, **options)
    return json.dumps([[str(v) for v in s] for s in spec] + [sorted(map(str, opts.items()))])


def _offset(t: torch.Tensor, elements: int) -> torch.Tensor:
    """t's values in a tensor whose storage starts ``elements`` elements before it (a view at that
    offset: its address no longer 16-byte aligned for elements * itemsize % 16 != 0)."""
    if elements == 0:
        return t
    flat = torch.zeros(t.numel() + elements, dtype=t.dtype)
    view = flat[elements:].view(t.shape)
    view.copy_(t)
    return view


# The parts of kernels._linear_launch_arguments' key, in its order (a changed key must change this).
_KEY_PARTS = ("guarded", "config", "n_state", "bf16", "q8", "update", "has_accum", "has_acc_out", "use_tma",
              "x_dtype", "weight_dtype", "no_rows", "no_slot", "aligned", "M", "N", "K", "stride_xk", "stride_xn",
              "stride_dyk", "stride_dym", "rand_stride")


def _record_launches(monkeypatch, arguments: str, launch: str, kernel) -> list:
    """Every launch made through ``kernels.<arguments>`` (a launch-arguments function), on CPU tensors,
    as (key, pins, Triton's specialization): the kernel stubbed (nothing runs), the device checks
    passed (the tensors' types and addresses are what matter), through the launch path the
    interpreter takes (kernel[grid]: ``kernels.<launch>``, the CachedLaunch, set to None). Each
    launch's constexprs are checked to be every parameter after its runtime arguments, in the
    kernel's order, as a cached launch passes them (CachedLaunch refuses others on its first miss,
    which only runs on the GPU)."""
    seen = []
    real = getattr(kernels, arguments)
    names = tuple(inspect.signature(kernel.fn).parameters)

    def spy(*args):
        launch_arguments = real(*args)
        key, pins, _, runtime_args, constants = launch_arguments
        constexprs, options = constants()
        assert tuple(constexprs) == names[len(runtime_args):], (tuple(constexprs), names)
        seen.append((key, pins, _binder_specialization(kernel, runtime_args, constexprs, options)))
        return launch_arguments

    class _Stub:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(kernels, arguments, spy)
    monkeypatch.setattr(kernels, launch, None)
    monkeypatch.setattr(kernels, kernel.fn.__name__, _Stub())
    monkeypatch.setattr(kernels, "_check_one_device", lambda *t: None)
    monkeypatch.setattr(kernels, "_check_device", lambda *t: None)
    return seen


@pytest.fixture
def recorded_launches(monkeypatch):
    """Every launch of the Triton fused kernel the public launchers make (_record_launches)."""
    return _record_launches(monkeypatch, "_linear_launch_arguments", "_LAUNCH", fused_linear_update_kernel)


@pytest.fixture
def recorded_elementwise_launches(monkeypatch):
    """Every launch of the element-wise kernel kernels.elementwise_update makes (_record_launches)."""
    return _record_launches(monkeypatch, "_elementwise_launch_arguments", "_ELEMENTWISE_LAUNCH",
                            elementwise_update_kernel)


def _check_keys(records, key_parts, blank_parts):
    """Launches under one key (and pins) are launches Triton's binder specializes alike; launches share
    keys; and for each tuple of ``blank_parts``, the same check with those parts of the key blanked
    out fails (the test is not vacuous: the key's parts tell apart launches Triton specializes
    differently)."""
    by_key: dict = {}
    for key, pins, spec in records:
        assert len(key) == len(key_parts)
        assert by_key.setdefault((key, pins), spec) == spec, dict(zip(key_parts, key))
    assert len(by_key) < len(records)

    def blanked_check_fails(parts):
        blank = [i for i, name in enumerate(key_parts) if name in parts]
        seen: dict = {}
        for key, pins, spec in records:
            k = tuple(None if i in blank else v for i, v in enumerate(key))
            if seen.setdefault((k, pins), spec) != spec:
                return True
        return False

    for parts in blank_parts:
        assert all(p in key_parts for p in parts), parts
        assert blanked_check_fails(parts), parts


def _every_kind_of_launch():
    """Calls of each public launcher over what changes Triton's specialization: x and dy bf16 or fp32;
    M, N and K in each of its integer classes (1, a multiple of 16 or not; each varied alone); each
    tensor misaligned in turn; 0-2 states; accum, acc_out, gathered rows, counter maps, a step slot; every regime;
    pointer, TMA, persistent and IEEE tiles; and values Triton does not specialize (the Philox key and
    base, the rule's scalars as floats or ints, the gradient scale)."""
    rule = rules.get_rule("adamw")
    h = rule.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, 3)
    linear = (kernels.DEFAULT_BF16_CONFIG[False], kernels.DEFAULT_TMA_CONFIGS["small_k"],
              kernels.DEFAULT_TMA_CONFIGS["large_k"], kernels.IEEE_CONFIGS[0])
    q8 = (kernels.Q8_SMALL_K_CONFIG, kernels.Q8_TMA_CONFIG, kernels.Q8_TALL_CONFIG)  # the last staged
    zeros = torch.zeros
    shapes = ((256, 256, 64), (256, 256, 17), (256, 256, 1), (33, 256, 64), (256, 136, 64))
    update = kernels.fused_linear_update
    misaligned = ("none", "x", "dy", "w", "s1", "accum", "scales", "rows", "slot")
    for (M, N, K), x_dtype, odd in itertools.product(shapes, (torch.bfloat16, torch.float32), misaligned):
        x = _offset(zeros(K, N, dtype=x_dtype), odd == "x")
        dy = _offset(zeros(K, M, dtype=x_dtype), odd == "dy")
        accum = _offset(zeros(M, N), odd == "accum")
        rows = _offset(torch.arange(M), odd == "rows")
        slot = _offset(zeros(kernels.step_slot_size(rule), dtype=torch.int32), odd == "slot")
        for config in linear:
            yield kernels.linear_mainloop, (x, dy), dict(config=config)
            yield kernels.linear_mainloop, (x, dy), dict(accum=accum, config=config)
            yield kernels.weight_grad_norm_sq, (x, dy, accum), dict(config=config)
            yield kernels.accumulate_weight_grad, (x, dy, accum.clone()), dict(config=config)
            for dtype, seed in ((torch.float32, None), (torch.bfloat16, 5), (torch.bfloat16, 2**63 + 3)):
                w = _offset(zeros(M, N, dtype=dtype), odd == "w")
                for n_state in (0, 1, 2):
                    st = [_offset(zeros(M, N, dtype=dtype), odd == "s1" and i == 1) for i in range(n_state)]
                    common = dict(seed=seed, config=config)
                    yield update, (w, x, dy, st, rule, h), dict(grad_scale=1, **common)
                    yield update, (w, x, dy, st, rule, list(h)), dict(accum=accum, **common)
                    yield update, (w, x, dy, st, rule, h), dict(acc_out=accum.clone(), **common)
                    yield update, (w, x, dy, st, rule, h), dict(step_slot=slot, **common)
                    if seed is not None:
                        yield update, (w, x, dy, st, rule, h), dict(counter=(N, N + 16, 32, rows), **common)
                        yield update, (w, x, dy, st, rule, h), dict(counter=(N, N, 2**40), **common)
        # the staged tile's mainloop-only launches (the comparator's): unstaged, no scratch
        yield kernels.linear_mainloop, (x, dy), dict(config=kernels.Q8_TALL_CONFIG)
        yield kernels.weight_grad_norm_sq, (x, dy, accum), dict(config=kernels.Q8_TALL_CONFIG)
        for config in q8:
            w = _offset(zeros(M, N, dtype=torch.bfloat16), odd == "w")
            for n_state in (1, 2):
                st = [kernels.Q8State(_offset(zeros(M, N, dtype=torch.uint8), odd == "s1" and i == 1),
                                      _offset(torch.ones(M, -(-N // 128)), odd == "scales" and i == n_state - 1))
                      for i in range(n_state)]
                for seed in (1, 2**64 - 1):
                    common = dict(seed=seed, config=config)
                    yield update, (w, x, dy, st, rule, h), common
                    yield update, (w, x, dy, st, rule, h), dict(accum=accum, **common)
                    yield update, (w, x, dy, st, rule, h), dict(counter=(N, N, 0, rows), **common)
                    yield update, (w, x, dy, st, rule, h), dict(step_slot=slot, **common)


def test_the_fused_kernels_key_determines_its_specialization(recorded_launches):
    """Launches under one key are launches Triton's binder specializes alike (so the kernel kept
    under the key is the one Triton would pick), over every kind of launch the public launchers make;
    and not vacuously: launches share keys, and for each part of the key that tells launches apart on
    its own (the alignment, the flags, the dtypes, the integers), the same check with that part blanked
    out fails."""
    for launcher, args, kwargs in _every_kind_of_launch():
        launcher(*args, **kwargs)
    _check_keys(recorded_launches, _KEY_PARTS,
                (("aligned",), ("has_accum",), ("has_acc_out",), ("n_state",), ("x_dtype",), ("K",), ("no_slot",),
                 ("M", "stride_dyk"), ("N", "stride_xk", "rand_stride")))


# -- the element-wise kernel's key ------------------------------------------------------------------

# The parts of kernels._elementwise_launch_arguments' key, in its order (a changed key must change this).
_ELEMENTWISE_KEY_PARTS = ("guarded", "n_state", "bf16", "grad_dtype", "no_rows", "no_slot", "remap", "block",
                          "aligned", "numel", "rand_cols", "rand_stride")

# numel -> counter maps (cols, row_stride) of its own that remap (row_stride != cols): cols = numel
# (one row), cols neither 1 nor a multiple of 16, two cols under one row stride, a row stride past 2^31
# (Triton's i64 class); each also drawn with gathered rows and, unremapped, as (cols, cols).
_ELEMENTWISE_COUNTERS = {1: ((1, 16),), 16: ((16, 32), (8, 32)), 17: ((17, 33),),
                         4096 + 16: ((257, 272), (16, 272)), 4096 + 17: ((1371, 2**32 + 16),)}


def _every_kind_of_elementwise_launch():
    """Calls of kernels.elementwise_update over what changes Triton's specialization: fp32 and bf16
    params (the bf16-sr regime, with a seed), fp32 and bf16 gradients; 0, 1 and 2 states (SGD without
    and with momentum: one rule, two state counts; Lion; AdamW); numel 1, 16, 17 and past a block of
    the kernel (a multiple of 16 and not); counter maps: none, remapped (cols != row_stride; among them
    (1, 17) on every numel), unremapped with a base, and gathered rows; each tensor misaligned in turn
    (param: also the absent states' stand-ins); and values Triton does not specialize (the Philox key
    and base, the rule's scalars as a tuple or a list, the gradient scale as an int or a float); with and
    without a step slot."""
    rule_cases = (
        (rules.SGD, rules.SGD.scalars({"lr": 0.1}, 1), 0),
        (rules.SGD, rules.SGD.scalars({"lr": 0.1, "momentum": 0.9}, 2), 1),
        (rules.LION, rules.LION.scalars({"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.1}, 2), 1),
        (rules.ADAMW, rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                                           "weight_decay": 0.01}, 3), 2),
    )
    zeros = torch.zeros
    for numel, remapped in _ELEMENTWISE_COUNTERS.items():
        c, s = remapped[0]
        counters = [None, (1, 17, 7), *((c2, s2, 2**40) for c2, s2 in remapped), (c, c, 5),
                    (c, s, 32, "rows")]
        for (dtype, seed), grad_dtype, odd in itertools.product(
                ((torch.float32, None), (torch.bfloat16, 5), (torch.bfloat16, 2**64 - 1)),
                (torch.float32, torch.bfloat16), ("none", "param", "grad", "s0", "s1", "rows", "slot")):
            param = _offset(zeros(numel, dtype=dtype), odd == "param")
            grad = _offset(zeros(numel, dtype=grad_dtype), odd == "grad")
            rows = _offset(torch.arange(numel // c), odd == "rows")
            for (rule, h, n_state), counter in itertools.product(rule_cases, counters):
                if (odd == "s0" and n_state < 1) or (odd == "s1" and n_state < 2) or (
                        odd == "rows" and (counter is None or len(counter) < 4)):
                    continue  # the same launch as with nothing misaligned
                states = [_offset(zeros(numel, dtype=dtype), odd == f"s{i}") for i in range(n_state)]
                if counter is not None and len(counter) == 4:
                    counter = (*counter[:3], rows)
                kwargs = dict(seed=seed, counter=counter)
                if odd != "slot":
                    yield (param, grad, states, rule, h), dict(grad_scale=1, **kwargs)
                yield (param, grad, states, rule, list(h)), dict(
                    grad_scale=0.5, step_slot=_offset(zeros(kernels.step_slot_size(rule), dtype=torch.int32),
                                                      odd == "slot"), **kwargs)


def test_the_elementwise_kernels_key_determines_its_specialization(recorded_elementwise_launches):
    """As test_the_fused_kernels_key_determines_its_specialization, for kernels.elementwise_update's
    launches of the element-wise kernel: launches under one key are launches Triton's binder
    specializes alike, launches share keys, and blanking each part of the key that tells launches apart
    on its own (the alignment, the flags, the dtypes, the integers) makes the check fail."""
    for args, kwargs in _every_kind_of_elementwise_launch():
        kernels.elementwise_update(*args, **kwargs)
    _check_keys(recorded_elementwise_launches, _ELEMENTWISE_KEY_PARTS,
                (("aligned",), ("n_state",), ("bf16",), ("grad_dtype",), ("no_rows",), ("no_slot",),
                 ("remap", "rand_stride"), ("numel",), ("rand_cols",), ("rand_stride",)))


def test_the_descriptor_builder_takes_only_fields_it_knows_at_their_defaults():
    """launch_cache.descriptor_builder skips a dataclass's constructor only where every field after the ones it
    sets is a known one left at its declared default (Triton 3.6's padding, 3.9's round_f32_to_tf32): a field
    it does not know, one without a default, or other leading fields send the caller to the constructor."""
    import dataclasses

    def desc(*extra):
        return dataclasses.make_dataclass("D", [("base", object), ("shape", list), *extra])

    lead = ("base", "shape")
    d36 = desc(("padding", str, dataclasses.field(default="zero")))
    d39 = desc(("padding", str, dataclasses.field(default="zero")),
               ("round_f32_to_tf32", bool, dataclasses.field(default=False)))
    for cls in (d36, d39):
        made = launch_cache.descriptor_builder(cls, lead)("t", [2, 3])
        assert type(made) is cls and made == cls("t", [2, 3])
    unknown = desc(("padding", str, dataclasses.field(default="zero")), ("swizzle", int, dataclasses.field(default=0)))
    assert launch_cache.descriptor_builder(unknown, lead) is None  # a field it does not know: maybe derived
    assert launch_cache.descriptor_builder(desc(("padding", str)), lead) is None  # no default to give it
    assert launch_cache.descriptor_builder(d36, ("base", "strides")) is None


@pytest.mark.parametrize("config", [kernels.Q8_TMA_CONFIG, kernels.DEFAULT_TMA_CONFIGS["large_k"]], ids=str)
def test_the_launchers_descriptors_equal_tritons_constructor(config):
    """_tma_descriptors sets TensorDescriptor's fields without its __post_init__ (whose checks are
    _tma_addressable's): every field equals what the constructor makes, on the installed Triton's
    fields; a row pitch TMA cannot take gets no descriptor."""
    import dataclasses

    from triton.tools.tensor_descriptor import TensorDescriptor

    cls, build = kernels._descriptor_type()
    assert cls is TensorDescriptor and build is not None, [f.name for f in dataclasses.fields(TensorDescriptor)]
    x = torch.empty(96, 136, dtype=torch.bfloat16)[8:]  # a view: rows of 272 B, 16-byte aligned
    dy = torch.empty(88, 264, dtype=torch.bfloat16)
    fast = kernels._tma_descriptors(x, dy, config, kernels._tma_addressable(x, dy))
    made = (TensorDescriptor.from_tensor(x, [config.BK, config.BN]),
            TensorDescriptor.from_tensor(dy, [config.BK, config.BM]))
    for f, m in zip(fast, made):
        assert type(f) is TensorDescriptor and f.base is m.base
        for field in dataclasses.fields(TensorDescriptor):  # every field of the installed Triton's
            got, want = getattr(f, field.name), getattr(m, field.name)
            assert got is want if field.name == "base" else list(got) == list(want) if field.name in (
                "shape", "strides", "block_shape") else got == want, field.name
    odd = torch.empty(88, 132, dtype=torch.bfloat16)  # rows of 264 B
    assert kernels._tma_descriptors(odd, dy, config, kernels._tma_addressable(odd, dy)) == (None, None)
