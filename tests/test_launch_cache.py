"""kernels/launch_cache.py on the CPU: when CachedLaunch goes through Triton's JITFunction.run (a
miss, pins that differ, another device, FORGE_NUM_FAST_LAUNCH=0) and what it refuses; and the
Triton fused kernel's key (kernels._linear_launch_arguments) against Triton's own binder: equal keys,
equal specializations. Its fast path launches a compiled kernel, so it is checked on the GPU
(tests/test_gpu_gluon.py and tests/test_gpu_exactness.py: the kernel Triton's own lookup picks, and
the same bits)."""

from __future__ import annotations

import json
import types
from unittest import mock

import pytest
import torch

from forge_num import kernels, rules
from forge_num.kernels import launch_cache
from forge_num.kernels.launch_cache import CachedLaunch


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


def _binder_specialization(args, constexprs, options) -> str:
    """What Triton's binder makes of a launch (its specialization and options: the compiled kernel's
    cache key, less the source), as text."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    k = kernels.fused_linear_update_kernel
    if not hasattr(k, "params"):  # the interpreter's kernel (TRITON_INTERPRET=1): the same function, jitted
        k = JITFunction(k.fn, **k.kwargs)
    binder = create_function_from_signature(k.signature, k.params, BaseBackend)
    _, spec, opts = binder(*args, **constexprs, **options)
    return json.dumps([[str(v) for v in s] for s in spec] + [sorted(map(str, opts.items()))])


def _offset(t: torch.Tensor, elements: int) -> torch.Tensor:
    """t's values in a tensor whose storage starts ``elements`` elements before it (a view at that
    offset: its address no longer 16-byte aligned for elements * itemsize % 16 != 0)."""
    flat = torch.zeros(t.numel() + elements, dtype=t.dtype)
    return flat[elements:].view(t.shape)


def _launch_cases():
    """Launches of every kind the launchers make, on CPU tensors (for their types and addresses):
    the three regimes, the mainloop alone and with accum, TMA and pointer tiles, shapes and strides of
    each of Triton's integer classes, misaligned operands, gathered rows, and values Triton does not
    specialize (the Philox key and base, the rule's scalars, the gradient scale)."""
    rule = rules.get_rule("adamw")
    n_h = len(rule.scalar_names)
    ptr, tma = kernels.Q8_SMALL_K_CONFIG, kernels.Q8_TMA_CONFIG
    fp32_ptr = kernels.DEFAULT_BF16_CONFIG[False]
    for regime in ("fp32", "bf16-sr", "8bit", "mainloop", "accum"):
        for M, N, K in ((256, 256, 64), (256, 256, 80), (128, 384, 16), (1, 128, 1), (33, 272, 17)):
            for misaligned in (False, True):
                for seed, base, h0 in ((7, 0, 0.5), (2**63 + 1, 2**40, 0.25)):
                    wdt = torch.float32 if regime in ("fp32", "accum") else torch.bfloat16
                    x = torch.zeros(K, N, dtype=torch.bfloat16)
                    dy = torch.zeros(K, M, dtype=torch.bfloat16)
                    if misaligned:
                        x = _offset(x, 1)
                    w = torch.zeros(M, N, dtype=wdt)
                    q8 = regime == "8bit"
                    if q8:
                        s = [torch.zeros(M, N, dtype=torch.uint8) for _ in range(2)]
                        scales = [torch.ones(M, -(-N // 128)) for _ in range(2)]
                    else:
                        s = [torch.zeros(M, N, dtype=wdt) for _ in range(2)]
                        scales = [None, None]
                    norm_sq = torch.empty(4, dtype=torch.float64)
                    nonfinite = torch.empty(4, dtype=torch.int32)
                    scales = [t if t is not None else norm_sq for t in scales]
                    update = regime != "mainloop"
                    accum = torch.zeros(M, N) if regime == "accum" else None
                    acc_out = torch.zeros(M, N) if regime == "mainloop" else None
                    rows = torch.arange(M) if (regime == "bf16-sr" and seed == 7) else None
                    rand = (N + (16 if rows is not None else 0), base, rows)
                    h = tuple(h0 + i for i in range(n_h)) if update else ()
                    tma_ok = kernels._tma_addressable(x, dy)
                    for config in ((ptr, tma) if q8 else (fp32_ptr, tma)):
                        yield kernels._linear_launch_arguments(
                            w if update else None, s + [None, None] if update else [None, None], scales, x, dy,
                            accum, acc_out, norm_sq, nonfinite, rule, h, 1.0 / h0, update, config,
                            2 if update else 0, seed, regime == "bf16-sr", q8, rand if update else None, tma_ok)


def test_the_fused_kernels_key_determines_its_specialization():
    """Launches under one key are launches Triton's binder specializes alike (so the kernel kept
    under the key is the one Triton would pick): over every kind of launch the launchers make; and
    the cases are not vacuous (several launches share keys, and specializations differ between keys)."""
    by_key: dict = {}
    specs = set()
    for key, pins, grid, args, constants in _launch_cases():
        constexprs, options = constants()
        spec = _binder_specialization(args, constexprs, options)
        specs.add(spec)
        seen = by_key.setdefault((key, pins), spec)
        assert seen == spec, key
    assert len(by_key) < sum(1 for _ in _launch_cases()) and len(specs) > 10


@pytest.mark.parametrize("config", [kernels.Q8_TMA_CONFIG, kernels.DEFAULT_TMA_CONFIGS["large_k"]], ids=str)
def test_the_launchers_descriptors_equal_tritons_constructor(config):
    """_tma_descriptors sets TensorDescriptor's fields without its __post_init__ (whose checks are
    _tma_addressable's): every field equals what the constructor makes, on the installed Triton's
    fields; a row pitch TMA cannot take gets no descriptor."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    assert kernels._descriptor_type() == (TensorDescriptor, True)
    x = torch.empty(96, 136, dtype=torch.bfloat16)[8:]  # a view: rows of 272 B, 16-byte aligned
    dy = torch.empty(88, 264, dtype=torch.bfloat16)
    fast = kernels._tma_descriptors(x, dy, config, kernels._tma_addressable(x, dy))
    made = (TensorDescriptor.from_tensor(x, [config.BK, config.BN]),
            TensorDescriptor.from_tensor(dy, [config.BK, config.BM]))
    for f, m in zip(fast, made):
        assert type(f) is TensorDescriptor and f.base is m.base
        assert (f.shape, f.strides, f.block_shape, f.padding) == (list(m.shape), list(m.strides), m.block_shape,
                                                                  m.padding)
    odd = torch.empty(88, 132, dtype=torch.bfloat16)  # rows of 264 B
    assert kernels._tma_descriptors(odd, dy, config, kernels._tma_addressable(odd, dy)) == (None, None)
