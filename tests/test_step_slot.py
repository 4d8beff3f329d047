"""The kernels' step slot (kernels.step_slot_words, linear_update.step_scalars): a launch given an
int32 slot reads h, grad_scale and the Philox key from it when it runs, not from its arguments, so a
launch captured in a CUDA graph can be replayed with each step's scalars. Under the interpreter: a
launch whose arguments hold other values computes, from the slot, the bits of a launch passed the
slot's values, in every regime of both kernels; the slot's words; a bad slot named."""

from __future__ import annotations

import os
import struct

import pytest
import torch

from forge_num import kernels, rules
from forge_num.emulator.philox import derive_seed

pytestmark = pytest.mark.interpreter

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("interpreter tests run where there is no GPU (TRITON_INTERPRET=1)", allow_module_level=True)

ADAMW = rules.ADAMW
HYPER = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
M, N, K = 20, 200, 9  # N: two 8bit blocks and a partial one; rows past the interpreter's tile
KEY = derive_seed(11, 3, 2) | 2**63  # the high half's top bit set: the slot's words are signed
# the scalars an eager launch is passed and a slot holds, and others that the arguments hold beside
# the slot (step 3 against step 1, another scale, another key): a kernel reading its arguments would
# compute other bits
TRUE = (ADAMW.scalars(HYPER, 3), 0.75, KEY)
DECOY = (ADAMW.scalars(HYPER, 1), 1.0, derive_seed(12, 1, 0))


def slot_of(h, grad_scale, seed) -> torch.Tensor:
    return torch.tensor(kernels.step_slot_words(h, grad_scale, seed), dtype=torch.int32)


def test_slot_words_are_the_scalars_bits():
    h = (1.5, -0.0, 2.0**-149, -3.4028234663852886e38)
    words = kernels.step_slot_words(h, 0.25, 2**64 - 2)
    assert len(words) == len(h) + 3 == kernels.step_slot_size(rules.Rule("x", None, (), ("a",) * 4, None))
    raw = struct.pack(f"<{len(words)}i", *words)
    assert struct.unpack(f"<{len(h) + 1}f", raw[: 4 * (len(h) + 1)]) == (*h, 0.25)
    assert struct.unpack("<Q", raw[4 * (len(h) + 1):])[0] == 2**64 - 2
    assert kernels.step_slot_words(h, 1.0, None)[-2:] == [0, 0]  # the fp32 regime: no key
    with pytest.raises(ValueError, match="64-bit key"):
        kernels.step_slot_words(h, 1.0, 2**64)


def _operands(precision: str, gen: torch.Generator):
    w = torch.randn(M, N, generator=gen)
    x = torch.randn(K, N, generator=gen).to(torch.bfloat16)
    dy = torch.randn(K, M, generator=gen).to(torch.bfloat16)
    dy[0, 3] = float("inf")  # a non-finite gradient row: the guard, from the slot's scale too
    if precision == "fp32":
        return w, [torch.zeros(M, N), torch.rand(M, N, generator=gen)], x, dy
    w = w.to(torch.bfloat16)
    if precision == "bf16-sr":
        return w, [torch.zeros(M, N, dtype=torch.bfloat16), torch.rand(M, N, generator=gen).to(torch.bfloat16)], x, dy
    return w, [kernels.Q8State.zeros(M, N), kernels.Q8State.zeros(M, N)], x, dy


def _clone(states):
    return [kernels.Q8State(s.codes.clone(), s.scales.clone()) if isinstance(s, kernels.Q8State) else s.clone()
            for s in states]


def _flat(w, states):
    return [w] + [t for s in states for t in (s if isinstance(s, kernels.Q8State) else (s,))]


def _fused(w, states, x, dy, scalars, slot=None):
    h, grad_scale, seed = scalars
    stats = kernels.fused_linear_update(w, x, dy, states, ADAMW, h, grad_scale=grad_scale,
                                        seed=None if w.dtype == torch.float32 else seed, step_slot=slot)
    return _telemetry(stats)


def _telemetry(stats) -> tuple:
    """(Σ g² as its binary64 bits: NaN where a gradient is, compared bit for bit; the non-finite count)"""
    return struct.pack("<d", stats.norm_sq.item()), stats.nonfinite.item()


def _elementwise(w, states, g, scalars, slot=None):
    h, grad_scale, seed = scalars
    stats = kernels.elementwise_update(w, g, states, ADAMW, h, grad_scale=grad_scale,
                                       seed=None if w.dtype == torch.float32 else seed, step_slot=slot)
    return _telemetry(stats)


def _assert_bits_equal(a, b):
    for s, t in zip(a, b):
        assert torch.equal(s.view(torch.uint8), t.view(torch.uint8)) if s.dtype != torch.uint8 else torch.equal(s, t)


def _assert_bits_differ(a, b):
    assert any(not torch.equal(s.view(torch.uint8) if s.dtype != torch.uint8 else s,
                               t.view(torch.uint8) if t.dtype != torch.uint8 else t) for s, t in zip(a, b))


@pytest.mark.parametrize("precision", ["fp32", "bf16-sr", "8bit"])
def test_fused_launch_reads_its_scalars_from_the_slot(precision):
    gen = torch.Generator().manual_seed(5)
    w, states, x, dy = _operands(precision, gen)
    runs = {}
    for name, scalars, slot in (("passed", TRUE, None), ("slot", DECOY, slot_of(*TRUE)), ("decoy", DECOY, None)):
        wi, si = w.clone(), _clone(states)
        telemetry = _fused(wi, si, x, dy, scalars, slot)
        runs[name] = (_flat(wi, si), telemetry)
    _assert_bits_equal(runs["slot"][0], runs["passed"][0])
    assert runs["slot"][1] == runs["passed"][1]  # the telemetry is of the unscaled gradient: alike in all three
    _assert_bits_differ(runs["decoy"][0], runs["passed"][0])  # the slot's values are what made the difference


@pytest.mark.parametrize("precision", ["fp32", "bf16-sr"])
def test_elementwise_launch_reads_its_scalars_from_the_slot(precision):
    gen = torch.Generator().manual_seed(6)
    w, states, _, _ = _operands(precision, gen)
    g = torch.randn(M, N, generator=gen)
    g[4, 7] = float("nan")
    runs = {}
    for name, scalars, slot in (("passed", TRUE, None), ("slot", DECOY, slot_of(*TRUE)), ("decoy", DECOY, None)):
        wi, si = w.clone(), _clone(states)
        telemetry = _elementwise(wi, si, g, scalars, slot)
        runs[name] = (_flat(wi, si), telemetry)
    _assert_bits_equal(runs["slot"][0], runs["passed"][0])
    assert runs["slot"][1] == runs["passed"][1]
    _assert_bits_differ(runs["decoy"][0], runs["passed"][0])


@pytest.mark.parametrize("slot,exc,msg", [
    (torch.zeros(ADAMW_WORDS := kernels.step_slot_size(ADAMW), dtype=torch.int64), TypeError, "int32 tensor"),
    (torch.zeros(ADAMW_WORDS - 1, dtype=torch.int32), ValueError, f"{ADAMW_WORDS} words"),
    (torch.zeros(ADAMW_WORDS, 2, dtype=torch.int32)[:, 0], ValueError, "contiguous"),
    ([0] * ADAMW_WORDS, TypeError, "int32 tensor"),
])
def test_a_bad_slot_is_named(slot, exc, msg):
    w, states, x, dy = _operands("fp32", torch.Generator().manual_seed(7))
    h, grad_scale, _ = TRUE
    with pytest.raises(exc, match=msg):
        kernels.fused_linear_update(w, x, dy, states, ADAMW, h, grad_scale=grad_scale, step_slot=slot)
    with pytest.raises(exc, match=msg):
        kernels.elementwise_update(w, torch.zeros(M, N), states, ADAMW, h, grad_scale=grad_scale, step_slot=slot)
