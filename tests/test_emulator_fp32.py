"""emulator.fp32 against an exact rational reference (tests/exact_f32.py), including +-0,
subnormals, +-inf, NaN and rounding ties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from forge_num.emulator import fp32
from tests.exact_f32 import exact_add, exact_div, exact_fma, exact_mul, exact_sqrt, exact_sub, same_f32
from tests.strategies import any_f32, near_one

pytestmark = pytest.mark.emulator

F = np.float32


def _run(op, *args):
    return float(op(*(F(a) for a in args)))


@given(any_f32, any_f32)
@example(1.0, 2.0**-24)  # a tie: 1 + 2^-24 rounds to even (1.0)
@example(1.0 + 2.0**-23, 2.0**-24)  # a tie rounding up to even
@example(-0.0, -0.0)
@example(-0.0, 0.0)
def test_add_sub(a, b):
    assert same_f32(_run(fp32.add, a, b), exact_add(a, b))
    assert same_f32(_run(fp32.sub, a, b), exact_sub(a, b))


@given(any_f32, any_f32)
@example(1.0 + 2.0**-12, 1.0 + 2.0**-12)
@example(2.0**-75, 2.0**-75)  # underflow to a subnormal / zero
def test_mul(a, b):
    assert same_f32(_run(fp32.mul, a, b), exact_mul(a, b))


@given(any_f32, any_f32, any_f32)
@example(1 + 2.0**-12, 1 + 2.0**-12, 2.0**-70)  # double rounding through binary64 gets this wrong
@example(1 + 2.0**-12, 1 + 2.0**-12, -(2.0**-70))
@example(0.0, -1.0, 0.0)  # -0 + +0 = +0
@example(0.0, -1.0, -0.0)  # -0 + -0 = -0
@example(3.0, float("inf"), float("-inf"))  # inf - inf = NaN
@example(0.0, float("inf"), 1.0)  # 0 * inf = NaN
def test_fma(a, b, c):
    assert same_f32(_run(fp32.fma, a, b, c), exact_fma(a, b, c))


@given(near_one(), near_one(), near_one(1))
def test_fma_near_ties(a, b, c):
    assert same_f32(_run(fp32.fma, a, b, -c), exact_fma(a, b, -c))


def test_fma_counterexample_to_binary64_route():
    a = F(1 + 2.0**-12)
    c = F(2.0**-70)
    naive = F(np.float64(a) * np.float64(a) + np.float64(c))
    assert float(naive) == 1 + 2.0**-11  # the double rounding the emulator must avoid
    assert float(fp32.fma(a, a, c)) == 1 + 2.0**-11 + 2.0**-23


@given(any_f32, any_f32)
@example(1.0, 3.0)
@example(1.0, 0.0)
@example(-1.0, -0.0)
@example(0.0, 0.0)
def test_div(a, b):
    assert same_f32(_run(fp32.div, a, b), exact_div(a, b))


@given(any_f32)
@example(2.0)
@example(-0.0)
@example(-1.0)
@example(float("inf"))
@example(float(np.uint32(1).view(np.float32)))
def test_sqrt(a):
    assert same_f32(_run(fp32.sqrt, a), exact_sqrt(a))


@given(st.lists(st.tuples(any_f32, any_f32, any_f32), min_size=1, max_size=64))
def test_fma_vectorised_equals_scalar(triples):
    a, b, c = (np.array(col, dtype=F) for col in zip(*triples))
    vec = fp32.fma(a, b, c)
    for i, (x, y, z) in enumerate(triples):
        assert same_f32(float(vec[i]), exact_fma(x, y, z))
