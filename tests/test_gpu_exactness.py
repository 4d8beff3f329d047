"""On the GPU: for each rule and both mainloop modes, over hypothesis-generated cases (shapes,
strides, tile configurations, hyper-parameters including lr = 0, weight_decay = 0,
beta2 = 0.99999, eps = 1e-16): fused == unfused bit for bit; fused == emulator bit for bit (the
whole kernel in ieee mode; in bf16 mode the epilogue given the stored accumulator, and the whole
kernel where the tensor-core model exists). Run: HYPOTHESIS_PROFILE=gpu pytest -m exactness.
"""

from __future__ import annotations

import itertools
import json
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_num import kernels, rules
from tests.kernel_cases import Case, run_case

pytestmark = [pytest.mark.exactness, pytest.mark.gpu]

HYPER = {
    "adamw": st.fixed_dictionaries({
        "lr": st.sampled_from([0.0, 1e-5, 1e-3, 0.1]),
        "betas": st.tuples(st.sampled_from([0.0, 0.9, 0.95]), st.sampled_from([0.0, 0.95, 0.999, 0.99999])),
        "eps": st.sampled_from([1e-16, 1e-8, 1e-6]),
        "weight_decay": st.sampled_from([0.0, 0.01, 0.1]),
    }),
    "sgd": st.fixed_dictionaries({
        "lr": st.sampled_from([0.0, 1e-3, 0.1]),
        "momentum": st.sampled_from([0.0, 0.9]),
        "dampening": st.sampled_from([0.0]),
        "weight_decay": st.sampled_from([0.0, 1e-4]),
        "nesterov": st.booleans(),
    }).filter(lambda h: not (h["nesterov"] and h["momentum"] == 0.0)),
    "lion": st.fixed_dictionaries({
        "lr": st.sampled_from([0.0, 1e-4, 1e-2]),
        "betas": st.tuples(st.sampled_from([0.9, 0.95]), st.sampled_from([0.98, 0.99])),
        "weight_decay": st.sampled_from([0.0, 0.1]),
    }),
}
HYPER["adam"] = HYPER["adamw"]
CUDA = torch.device("cuda")


def _record(key, whole):
    """One line per passing case, appended (atomic small writes: xdist workers share the file)."""
    out = os.environ.get("FORGE_RESULTS_DIR")
    if out:
        with open(os.path.join(out, "exactness_cases.jsonl"), "a") as f:
            f.write(json.dumps({"case": key, "whole_kernel_emulated": bool(whole)}) + "\n")


def _draw_dims(data, config, hi: int) -> tuple[int, int, bool]:
    """(M, N, transpose_inputs). A TMA configuration gets, 3 times in 4, contiguous operands with
    rows of a multiple of 8 bf16 over up to 2-3 of its tiles a side, so that its descriptor loads
    (and their zero fill past the edges) run; otherwise sizes that take the pointer fallback."""
    if config.tma and data.draw(st.integers(0, 3)):
        return 8 * data.draw(st.integers(1, 40)), 8 * data.draw(st.integers(1, 66)), False
    return data.draw(st.integers(1, hi)), data.draw(st.integers(1, hi)), data.draw(st.booleans())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
@pytest.mark.parametrize("rule", sorted(rules.RULES))
@given(data=st.data())
def test_fused_unfused_emulator(rule, dtype, data):
    hyper = data.draw(HYPER[rule])
    config = data.draw(st.sampled_from(kernels.configs_for(dtype)))
    M, N, transpose = _draw_dims(data, config, 96)
    case = Case(
        rule=rule,
        M=M,
        N=N,
        K=data.draw(st.one_of(st.integers(0, 3), st.integers(4, 100))),
        dtype=dtype,
        hyper=hyper,
        step=data.draw(st.integers(1, 50)),
        seed=data.draw(st.integers(0, 2**31)),
        config=config,
        grad_scale=data.draw(st.sampled_from([1.0, 0.5, 0.0078125, 0.7])),
        with_accum=data.draw(st.booleans()),
        transpose_inputs=transpose,
        bad_rows=data.draw(st.sampled_from([0, 0, 0, 2])),
    )
    res = run_case(case, CUDA)
    _record(f"{rule}/{'ieee' if dtype == torch.float32 else 'bf16'}", res["whole_kernel_emulated"])


def test_bf16_mainloop_within_proved_bound():
    tc = pytest.importorskip("forge_num.emulator.tensor_core")
    bound_fn = getattr(tc, "bf16_mainloop_error_bound", None)
    if bound_fn is None:
        pytest.skip("no bf16 mainloop bound exported yet")
    g = torch.Generator(device="cpu").manual_seed(0)
    for M, N, K in [(64, 64, 1000), (96, 80, 4097)]:
        x = torch.randn(K, N, generator=g).bfloat16().cuda()
        dy = torch.randn(K, M, generator=g).bfloat16().cuda()
        got = kernels.linear_mainloop(x, dy).double().cpu()
        exact = dy.double().cpu().t() @ x.double().cpu()  # exact: bf16 products are exact in fp64, K small
        abs_sum = dy.double().cpu().abs().t() @ x.double().cpu().abs()
        # max_k |dy[k,m] x[k,n]| <= max_k |dy[k,m]| * max_k |x[k,n]| (the bound grows with it)
        max_prod = dy.double().cpu().abs().amax(0)[:, None] * x.double().cpu().abs().amax(0)[None, :]
        subnormal = any(bool(((t != 0) & (t.abs() < 2.0**-126)).any()) for t in (x, dy))
        bound = torch.as_tensor(bound_fn(abs_sum.numpy(), max_prod.numpy(), K, subnormal_operands=subnormal))
        # the fp64 reference has its own error: at most gamma_K * sum|products| (Higham eq. 3.4)
        fp64_err = K * 2.0**-53 / (1 - K * 2.0**-53) * abs_sum
        assert torch.all((got - exact).abs() <= bound + fp64_err), float(((got - exact).abs() / bound).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
@pytest.mark.parametrize("rule", sorted(rules.RULES))
@given(data=st.data())
def test_bf16_sr_regime(rule, dtype, data):
    """bf16 weight and state, stochastic rounding from the Philox stream: fused == unfused ==
    emulator bit for bit (issue 4: at least 200 cases per rule and mode with HYPOTHESIS_PROFILE=gpu)."""
    config = data.draw(st.sampled_from(kernels.configs_for(dtype)))
    M, N, _ = _draw_dims(data, config, 96)
    case = Case(
        rule=rule, M=M, N=N,
        K=data.draw(st.integers(0, 80)), dtype=dtype, hyper=data.draw(HYPER[rule]),
        step=data.draw(st.integers(1, 50)), seed=data.draw(st.integers(0, 2**31)),
        config=config,
        with_accum=data.draw(st.booleans()), bad_rows=data.draw(st.sampled_from([0, 0, 2])),
        precision="bf16-sr",
    )
    res = run_case(case, CUDA)
    _record(f"bf16-sr/{rule}/{'ieee' if dtype == torch.float32 else 'bf16'}", res["whole_kernel_emulated"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["ieee", "bf16"])
@pytest.mark.parametrize("rule", sorted(rules.RULES))
@given(data=st.data())
def test_8bit_regime(rule, dtype, data):
    """8-bit block-wise states and a bf16 weight: fused == unfused == emulator, codes and scales."""
    from tests.kernel_cases import run_q8_case

    run_q8_case(rule, data.draw(HYPER[rule]), dtype, M=data.draw(st.integers(1, 80)),
                N=data.draw(st.integers(1, 300)), K=data.draw(st.integers(0, 80)),
                seed=data.draw(st.integers(0, 2**20)), device=CUDA,
                config=data.draw(st.sampled_from(kernels.Q8_CONFIGS[dtype])), step=data.draw(st.integers(1, 50)))
    _record(f"8bit/{rule}/{'ieee' if dtype == torch.float32 else 'bf16'}", True)


CANDIDATES = [("linear", c) for c in kernels.CANDIDATE_CONFIGS] + [("8bit", c) for c in kernels.CANDIDATE_Q8_CONFIGS]
# every tile the launcher's defaults can pick for bf16 operands, drawn for sure (the regime tests
# draw from whole lists): a newly promoted default is verified in the run that follows its promotion
DEFAULTS = ([("linear", c) for c in kernels.DEFAULT_CONFIGS]
            + [("8bit", c) for c in dict.fromkeys(kernels.DEFAULT_Q8_CONFIGS.values())])


@pytest.mark.parametrize("regime,config", CANDIDATES, ids=[f"{r}-{c}" for r, c in CANDIDATES])
@settings(max_examples=40)
@given(data=st.data())
def test_candidate_configs(regime, config, data):
    """The benchmark's candidate tiles (bigger tiles, persistent grids, the 8bit row-split epilogue)
    compute the same bits as the unfused path and the emulator, in every regime they can run, so that
    a measured winner can be promoted into the launcher's lists."""
    _random_case_with_config(regime, config, data)


@pytest.mark.parametrize("regime,config", DEFAULTS, ids=[f"{r}-{c}" for r, c in DEFAULTS])
@settings(max_examples=20)
@given(data=st.data())
def test_default_configs(regime, config, data):
    """Each default tile, forced: fused == unfused == emulator bit for bit, in both linear regimes."""
    _random_case_with_config(regime, config, data)


def _random_case_with_config(regime, config, data):
    from tests.kernel_cases import run_q8_case

    rule = data.draw(st.sampled_from(sorted(rules.RULES)))
    hyper = data.draw(HYPER[rule])
    # up to 2-3 tiles a side, so that persistent programs walk several tiles and groups
    M, N, transpose = _draw_dims(data, config, 260)
    K = data.draw(st.integers(0, 140))
    step, seed = data.draw(st.integers(1, 50)), data.draw(st.integers(0, 2**20))
    if regime == "8bit":
        run_q8_case(rule, hyper, torch.bfloat16, M=M, N=N, K=K, seed=seed, device=CUDA, config=config, step=step)
        return
    precision = data.draw(st.sampled_from(["fp32", "bf16-sr"]))
    run_case(Case(rule=rule, M=M, N=N, K=K, dtype=torch.bfloat16, hyper=hyper, step=step, seed=seed, config=config,
                  with_accum=data.draw(st.booleans()), transpose_inputs=transpose,
                  bad_rows=data.draw(st.sampled_from([0, 0, 2])), precision=precision), CUDA)



@pytest.mark.parametrize("config", dict.fromkeys(kernels.DEFAULT_Q8_CONFIGS.values()), ids=str)
def test_8bit_telemetry_within_its_bound(config):
    """The 8bit defaults' telemetry, reduced once a tile (v29), against the exact Σ g² and the
    non-finite count, over several tiles with rows and columns past the edges (the staged default's
    too: its terms read back from the scratch slot)."""
    from tests.kernel_cases import run_q8_telemetry_case

    run_q8_telemetry_case(CUDA, config, M=2 * config.BM + 5, N=3 * config.BN - 56)


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("style", ["colwise", "rowwise"])
def test_bf16_sr_shard_counter_maps(style, P):
    """The Philox counter maps of sharded parameters in the Triton kernels on the GPU: a shard's
    bf16-sr update is the restriction of the unsharded one, bit for bit (as on the CPU)."""
    from tests.kernel_cases import run_sharded_bf16_sr_case

    run_sharded_bf16_sr_case("kernels", style, P, CUDA)


PERSISTENT = [c for c in (*kernels.BF16_CONFIGS, *kernels.CANDIDATE_CONFIGS) if c.persistent]


@pytest.mark.parametrize("precision", ["fp32", "bf16-sr"])
@pytest.mark.parametrize("config", PERSISTENT, ids=str)
def test_persistent_programs_loop_over_tiles(config, precision):
    """On the H200 a persistent grid has config.persistent x 132 programs, more than the tiles of
    the hypothesis cases, so there each program runs one tile. With the multiprocessor count taken
    as 1, each program walks several tiles in grouped order (edge tiles too; the TMA descriptors
    reused from tile to tile), and fused == unfused == emulator bit for bit."""
    from unittest import mock

    adamw = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    with mock.patch.object(kernels, "_sm_count", lambda device: 1):
        for M, N, transpose in ((8 * 37, 8 * 41, False), (300, 330, True)):  # TMA, then the pointer fallback
            run_case(Case("adamw", M, N, 150, torch.bfloat16, adamw, step=3, seed=M + N, config=config,
                          with_accum=True, bad_rows=2, transpose_inputs=transpose, precision=precision), CUDA)


PERSISTENT_Q8 = [c for c in (*kernels.Q8_CONFIGS[torch.bfloat16], *kernels.CANDIDATE_Q8_CONFIGS) if c.persistent]


@pytest.mark.parametrize("config", PERSISTENT_Q8, ids=str)
def test_persistent_8bit_programs_loop_over_tiles(config):
    """The 8bit persistent tiles with the multiprocessor count taken as 1: config.persistent programs
    run at once, each walking several tiles (edge tiles too), so that a staged tile's scratch slot is
    rewritten by its program's next tile while the other program uses its own (a missing barrier or a
    shared slot shows as other bits); fused == unfused == emulator, codes and scales."""
    from unittest import mock

    from tests.kernel_cases import run_q8_case

    hyper = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    with mock.patch.object(kernels, "_sm_count", lambda device: 1):
        for M, N in ((8 * 37, 8 * 41), (3 * config.BM + 7, 2 * config.BN + 24)):
            run_q8_case("adamw", hyper, torch.bfloat16, M=M, N=N, K=150, seed=M + N, device=CUDA, config=config,
                        step=3)


def _cached_launch_case(regime: str, M: int, N: int, K: int, seed: int):
    """(weight, states, x, dy, rule, h, philox seed) on the GPU: AdamW, values over several binades."""
    rule = rules.get_rule("adamw")
    g = torch.Generator().manual_seed(seed)

    def spread(*shape):  # magnitudes over several binades, so that roundings are exercised
        return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape, generator=g).float())

    x_dtype = torch.float32 if regime == "fp32-ieee" else torch.bfloat16
    x, dy = spread(K, N).to(CUDA, x_dtype), spread(K, M).to(CUDA, x_dtype)
    if regime == "8bit":
        w = spread(M, N).bfloat16().to(CUDA)
        states = [kernels.Q8State(torch.randint(0, 256, (M, N), generator=g, dtype=torch.uint8).to(CUDA),
                                  torch.exp2(torch.randint(-20, 0, (M, -(-N // 128)), generator=g).float()).to(CUDA))
                  for _ in range(2)]
    else:
        dtype = torch.bfloat16 if regime == "bf16-sr" else torch.float32
        w, m, v = spread(M, N), spread(M, N), spread(M, N).abs() * 1e-3
        w, states = w.to(CUDA, dtype), [m.to(CUDA, dtype), v.to(CUDA, dtype)]
    h = rule.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, 3)
    return w, states, x, dy, rule, h, (None if regime.startswith("fp32") else 2**63 + seed)


def _clone_states(states):
    return [kernels.Q8State(s.codes.clone(), s.scales.clone()) if isinstance(s, kernels.Q8State) else s.clone()
            for s in states]


def _state_bits(states):
    return [t for s in states for t in ((s.codes, s.scales) if isinstance(s, kernels.Q8State) else (s,))]


# a pointer, a TMA and a persistent TMA tile of the linear regimes, the 8bit pointer, TMA and staged
# TMA tiles (the last with a scratch tensor of its own each launch), and the fp32 regime with fp32
# operands (the IEEE mainloop)
_LINEAR_TILES = (kernels.DEFAULT_BF16_CONFIG[False], kernels.DEFAULT_TMA_CONFIGS["small_k"],
                 kernels.DEFAULT_TMA_CONFIGS["large_k"])
CACHED_LAUNCH_CASES = ([(r, c) for r in ("fp32", "bf16-sr") for c in _LINEAR_TILES]
                       + [("8bit", kernels.DEFAULT_Q8_CONFIGS["small_k"]), ("8bit", kernels.DEFAULT_Q8_CONFIGS["tma"]),
                          ("8bit", kernels.DEFAULT_Q8_CONFIGS["tma_tall"]), ("fp32-ieee", kernels.IEEE_CONFIGS[0])])


@pytest.fixture
def cached_launches(monkeypatch):
    """The (key, grid, args, constants) of every CachedLaunch.launch call, in order (the launches run)."""
    from forge_num.kernels import launch_cache

    seen = []
    real_launch = launch_cache.CachedLaunch.launch

    def spy(self, key, pins, grid, args, constants):
        seen.append((key, grid, args, constants))
        return real_launch(self, key, pins, grid, args, constants)

    monkeypatch.setattr(launch_cache.CachedLaunch, "launch", spy)
    return seen


@pytest.mark.parametrize("regime,config", CACHED_LAUNCH_CASES, ids=[f"{r}-{c}" for r, c in CACHED_LAUNCH_CASES])
def test_cached_triton_launch(regime, config, monkeypatch, cached_launches):
    """kernels/launch_cache.py on the Triton fused kernel (kernels._linear_launch_arguments' key): on
    shapes of each of Triton's integer classes (M, N, K multiples of 16 or not, K = 1; TMA where
    their rows allow it, else the pointer fallback), plain and with an accumulated gradient (or, in
    bf16-sr, gathered rows' counters), the launch that skips Triton's binder (a key's second launch)
    gives the bits of the launch through JITFunction.run, and the kernel kept under its key is the
    one Triton's own lookup picks (JITFunction.run(..., warmup=True))."""
    seen = cached_launches
    for (M, N, K), extra in itertools.product(((256, 256, 128), (264, 136, 100), (128, 520, 1)), (False, True)):
        w0, s0, x, dy, rule, h, seed = _cached_launch_case(regime, M, N, K, seed=M + N + K)
        kwargs = dict(seed=seed, config=config)
        if extra and regime == "bf16-sr":
            kwargs["counter"] = (N, N + 16, 32, torch.arange(M, device=CUDA).flip(0))
        elif extra:
            kwargs["accum"] = torch.randn(M, N, generator=torch.Generator().manual_seed(K)).to(CUDA)
        outs = []
        for fast in ("0", "1", "1"):  # the binder's launch (its kernel kept), then two fast-path hits
            w, s = w0.clone(), _clone_states(s0)
            monkeypatch.setenv("FORGE_NUM_FAST_LAUNCH", fast)
            kernels.fused_linear_update(w, x, dy, s, rule, h, **kwargs)
            outs.append([w, *_state_bits(s)])
        assert len({key for key, *_ in seen[-3:]}) == 1  # the clones share the key: the hits were hits
        for out in outs[1:]:
            for a, b in zip(out, outs[0]):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (M, N, K, extra)
        key, grid, args, constants = seen[-1]
        constexprs, options = constants()
        tritons = kernels.fused_linear_update_kernel.run(*args, grid=grid, warmup=True, **constexprs, **options)
        assert kernels._LAUNCH.lookup(key) is tritons, (M, N, K, extra)


# the element-wise kernel's cached launch: rules with 0, 1 and 2 states -> (hyper-parameters, step, states)
_ELEMENTWISE_RULES = {
    "sgd": ({"lr": 0.1, "weight_decay": 1e-4}, 1, 0),  # no momentum: no state
    "lion": ({"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.1}, 2, 1),
    "adamw": ({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, 3, 2),
}
# parameters [rows, cols]: numel 1; numel and cols 17; numel and cols multiples of 16, over several of
# the kernel's blocks; and numel and cols not, over several blocks, with the gradient misaligned (an
# offset view: not 16-byte aligned)
_ELEMENTWISE_SHAPES = ((1, 1), (1, 17), (4, 1024 + 16), (3, 689))


def _cached_elementwise_case(regime: str, rule_name: str, shape: tuple, seed: int):
    """(param, grad, states, rule, h, philox seed) on the GPU for kernels.elementwise_update: values
    over several binades, a bf16 gradient on every other shape, an infinite and a NaN gradient element
    where there are enough elements (the telemetry's non-finite count, the guard)."""
    rule = rules.get_rule(rule_name)
    hyper, step, n_state = _ELEMENTWISE_RULES[rule_name]
    g = torch.Generator().manual_seed(seed)

    def spread(*shape):
        return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape, generator=g).float())

    dtype = torch.bfloat16 if regime == "bf16-sr" else torch.float32
    grad_dtype = torch.bfloat16 if _ELEMENTWISE_SHAPES.index(shape) % 2 else torch.float32
    grad = spread(*shape)
    if grad.numel() > 8:
        grad.view(-1)[3], grad.view(-1)[7] = float("inf"), float("nan")
    if shape == _ELEMENTWISE_SHAPES[-1]:  # misaligned by one element
        flat = torch.zeros(grad.numel() + 1, dtype=grad_dtype, device=CUDA)
        grad = flat[1:].view(shape).copy_(grad.to(CUDA, grad_dtype))
        assert grad.data_ptr() % 16
    else:
        grad = grad.to(CUDA, grad_dtype)
    param = spread(*shape).to(CUDA, dtype)
    states = [spread(*shape).to(CUDA, dtype), (spread(*shape).abs() * 1e-3).to(CUDA, dtype)][:n_state]
    h = rule.scalars(hyper, step)
    return param, grad, states, rule, h, (2**63 + seed if regime == "bf16-sr" else None)


@pytest.mark.parametrize("rule_name", sorted(_ELEMENTWISE_RULES))
@pytest.mark.parametrize("regime", ["fp32", "bf16-sr"])
def test_cached_elementwise_launch(regime, rule_name, monkeypatch, cached_launches):
    """kernels/launch_cache.py on the element-wise kernel (kernels._elementwise_launch_arguments' key):
    for a rule with 0, 1 and 2 states, on parameters of each of Triton's integer classes (numel and
    cols 1, multiples of 16 or not; one misaligned gradient), with the flat counters, a remapped
    counter map (a column shard: row_stride != cols) and gathered rows' counters, the launches that skip
    Triton's binder (a key's second and third launches) give the bits of the launch through
    JITFunction.run (FORGE_NUM_FAST_LAUNCH=0): param, states and the telemetry's partials; and the
    kernel kept under its key is the one Triton's own lookup picks (JITFunction.run(..., warmup=True))."""
    from unittest import mock

    seen = cached_launches
    kernel = kernels.elementwise_update_kernel
    binder_runs = []
    real_run = kernel.run

    def counted_run(*args, **kwargs):  # the launches that go through Triton's binder
        binder_runs.append(kwargs.get("warmup"))
        return real_run(*args, **kwargs)

    cases = itertools.product(_ELEMENTWISE_SHAPES, ("flat", "remap", "rows"))
    for i, (shape, counter_kind) in enumerate(cases):
        R, C = shape
        p0, grad, s0, rule, h, seed = _cached_elementwise_case(regime, rule_name, shape, seed=i)
        counter = {"flat": None, "remap": (C, C + 16, 3 * C),
                   "rows": (C, C + 8, 32, torch.arange(R, device=CUDA).flip(0) + 5)}[counter_kind]
        outs = []
        del binder_runs[:]
        for fast in ("0", "1", "1"):  # the binder's launch (its kernel kept), then two fast-path hits
            p, s = p0.clone(), _clone_states(s0)
            monkeypatch.setenv("FORGE_NUM_FAST_LAUNCH", fast)
            with mock.patch.object(kernel, "run", counted_run):  # (removed after: the class's run again)
                stats = kernels.elementwise_update(p, grad, s, rule, h, seed=seed, counter=counter)
            outs.append([p, *s, *stats.partials])
        case = (shape, counter_kind)
        assert len({key for key, *_ in seen[-3:]}) == 1, case  # the clones share the key: the hits were hits
        assert binder_runs == [False], case  # only the first launch went through JITFunction.run
        for out in outs[1:]:
            assert len(out) == len(outs[0]) == 3 + len(s0)
            for a, b in zip(out, outs[0]):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), case
        assert int(outs[0][-1].sum()) == (2 if R * C > 8 else 0), case  # the non-finite elements, counted
        key, grid, args, constants = seen[-1]
        constexprs, options = constants()
        tritons = real_run(*args, grid=grid, warmup=True, **constexprs, **options)
        assert kernels._ELEMENTWISE_LAUNCH.lookup(key) is tritons, case
