"""Each rule's NumPy emulation against the rule's own text evaluated exactly (rationals, one
rounding per op), element by element; and the host scalars."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge_num import rules
from forge_num.emulator.rules import bind_guarded
from forge_num.rules import guarded_update
from tests.exact_f32 import EXACT_NAMESPACE, same_f32
from tests.strategies import any_f32, finite_f32

pytestmark = pytest.mark.emulator

F = np.float32

HYPER = {
    "adamw": st.fixed_dictionaries({
        "lr": st.sampled_from([0.0, 1e-5, 1e-3, 0.1, 3.0]),
        "betas": st.tuples(st.sampled_from([0.0, 0.5, 0.9, 0.99]), st.sampled_from([0.0, 0.9, 0.999, 0.99999])),
        "eps": st.sampled_from([1e-16, 1e-8, 1e-3]),
        "weight_decay": st.sampled_from([0.0, 0.01, 0.1]),
    }),
    "sgd": st.fixed_dictionaries({
        "lr": st.sampled_from([0.0, 1e-3, 0.1]),
        "momentum": st.sampled_from([0.0, 0.9]),
        "dampening": st.sampled_from([0.0, 0.1]),
        "weight_decay": st.sampled_from([0.0, 1e-4]),
    }),
    "lion": st.fixed_dictionaries({
        "lr": st.sampled_from([0.0, 1e-4, 1e-2]),
        "betas": st.tuples(st.sampled_from([0.9, 0.95]), st.sampled_from([0.98, 0.99])),
        "weight_decay": st.sampled_from([0.0, 0.1]),
    }),
}
HYPER["adam"] = HYPER["adamw"]


def exact_guarded(rule):
    exact_rule = rule.bind(EXACT_NAMESPACE)
    return rule.bind({**EXACT_NAMESPACE, "rule_update": exact_rule}, guarded_update)


nonneg_f32 = finite_f32.map(abs)


@pytest.mark.parametrize("name", sorted(rules.RULES))
@given(data=st.data())
def test_rule_emulation_equals_exact_evaluation(name, data):
    rule = rules.RULES[name]
    hyper = data.draw(HYPER[name])
    step = data.draw(st.integers(1, 1000))
    h = rule.scalars(hyper, step)
    n = data.draw(st.integers(1, 24))
    p = data.draw(st.lists(finite_f32, min_size=n, max_size=n))
    g = data.draw(st.lists(any_f32, min_size=n, max_size=n))
    s0 = data.draw(st.lists(finite_f32, min_size=n, max_size=n))
    s1 = data.draw(st.lists(nonneg_f32, min_size=n, max_size=n))  # exp_avg_sq >= 0
    scale = data.draw(st.sampled_from([1.0, 0.5, 0.123456789]))
    scale = float(F(scale))
    emu = bind_guarded(rule)(np.array(p, F), np.array(g, F), np.array(s0, F), np.array(s1, F), h, F(scale))
    ex = exact_guarded(rule)
    for i in range(n):
        want = ex(p[i], g[i], s0[i], s1[i], h, scale)
        for k, (got_arr, w) in enumerate(zip(emu, want)):
            got = bool(got_arr[i]) if k == 3 else float(got_arr[i])
            assert (got == w) if k == 3 else same_f32(got, w), (name, i, k, p[i], g[i], s0[i], s1[i], h)


def test_nonfinite_gradient_leaves_parameter_and_state():
    rule = rules.ADAMW
    h = rule.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}, 3)
    p = np.array([1.0, 2.0, 3.0, 4.0], F)
    g = np.array([np.nan, np.inf, -np.inf, 1.0], F)
    m = np.array([0.1, 0.2, 0.3, 0.4], F)
    v = np.array([0.01, 0.02, 0.03, 0.04], F)
    p2, m2, v2, finite = bind_guarded(rule)(p, g, m, v, h, F(1.0))
    assert finite.tolist() == [False, False, False, True]
    assert np.array_equal(p2[:3], p[:3]) and np.array_equal(m2[:3], m[:3]) and np.array_equal(v2[:3], v[:3])
    assert p2[3] != p[3]


def test_host_scalars_are_fp32_and_stated():
    h = rules.ADAMW.scalars({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}, 10)
    for v in h:
        assert float(F(v)) == v
    named = dict(zip(rules.ADAMW.scalar_names, h))
    assert named["neg_step_size"] == float(F(-(1e-3 / (1 - 0.9**10))))
    assert named["bias_correction2_sqrt"] == float(F((1 - 0.999**10) ** 0.5))
    assert named["decay"] == float(F(1 - 1e-3 * 0.01))
    # beta1 <= 0.5: torch's lerp switches to fma(w - 1, end - t, end)
    h2 = dict(zip(rules.ADAMW.scalar_names, rules.ADAMW.scalars({"lr": 1.0, "betas": (0.25, 0.9), "eps": 1e-8}, 1)))
    assert h2["lerp_from_m"] == 0.0 and h2["lerp_weight"] == 0.75 - 1.0


@pytest.mark.parametrize(
    "hyper,msg",
    [
        ({"lr": math.nan, "betas": (0.9, 0.999), "eps": 1e-8}, "lr"),
        ({"lr": 1e-3, "betas": (0.9, math.inf), "eps": 1e-8}, "betas"),
        ({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": -1.0}, "weight_decay"),
        ({"lr": 1e-3, "betas": (1.5, 0.999), "eps": 1e-8}, "betas"),
        ({"lr": 1e39, "betas": (0.9, 0.999), "eps": 1e-8}, "fp32"),
    ],
)
def test_bad_hyper_parameters_are_named(hyper, msg):
    with pytest.raises(ValueError, match=msg):
        rules.ADAMW.scalars(hyper, 1)


def test_every_rule_uses_only_the_vocabulary():
    import ast
    import inspect

    allowed = set(rules.VOCABULARY)
    for rule in rules.RULES.values():
        tree = ast.parse(inspect.getsource(rule.update))
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) or isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
                pytest.fail(f"{rule.name}: arithmetic operator {ast.dump(node.op)} outside the vocabulary")
            if isinstance(node, ast.Call):
                assert isinstance(node.func, ast.Name) and node.func.id in allowed, ast.dump(node.func)
