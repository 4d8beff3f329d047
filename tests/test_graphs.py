"""The captured step's host side, on the CPU (forge_num.graphs; the capture itself and its bits against
eager training are tests/test_gpu_graphs.py's, on a GPU): updates whose launches read their scalars
from step slots train as the eager step does, bit for bit, in every regime (the kernels under the
interpreter); the bookkeeping done before a replay writes the slots and advances the counters exactly
as the next eager step's launches do; what a capture cannot hold is refused with its reason."""

from __future__ import annotations

import contextlib
import os
from unittest import mock

import pytest
import torch

import forge_num as fn
from forge_num.optim import _StepSlots
from tests.test_training_semantics import tiny_llama, training_bits

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("the kernels run under the interpreter here (TRITON_INTERPRET=1)", allow_module_level=True)

HYPER = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
CPU = torch.device("cpu")


def _prepared(precision: str, slots: bool):
    """tiny_llama prepared with AdamW on the kernels backend, clipping by the previous step's norm (so
    that the gradient scale changes from step to step); ``slots``: every launch reads a step slot."""
    model = tiny_llama(seed=1)
    if precision != "fp32":
        model = model.to(torch.bfloat16)
    opt = fn.AdamW(model.parameters(), precision=precision, seed=9, backend="kernels", max_grad_norm=0.05,
                   clipping="previous", **HYPER)
    fn.prepare(model, opt)
    if slots:
        opt._slots = _StepSlots.for_optimizer(opt, CPU)
    return model, opt


def _step(model, opt, k: int) -> float:
    if opt._slots is not None:
        opt._slots.begin_step()
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(100 + k))
    loss = model(input_ids=ids, labels=ids).loss
    opt.backward(loss)
    opt.step()
    return float(loss.detach())


@pytest.mark.parametrize("precision", ["fp32", "8bit"])  # bf16-sr's slot: tests/test_step_slot.py
def test_updates_reading_step_slots_train_as_the_eager_step(precision):
    """Two steps with every launch reading its scalars from its slot (the path a captured step's
    launches take) equal two plain steps bit for bit: losses, weights, states; the clipping
    coefficient below 1 in the second step (the gradient scale is in the slot too). Each launch given a
    slot is passed another step's scalars beside it (other h, scale and key), so only the slot's can
    make the bits; every launch of the slotted run has a slot."""
    runs = []
    for slots in (False, True):
        model, opt = _prepared(precision, slots)
        with _decoy_arguments() as launches:
            losses = [_step(model, opt, k) for k in range(2)]
        assert launches and all(launches) == slots, launches
        runs.append((losses, training_bits(model, opt), [s["clip_coef"] for s in opt.stats_history]))
    (l0, b0, c0), (l1, b1, c1) = runs
    assert l0 == l1 and c0 == c1 and all(torch.equal(a, b) for a, b in zip(b0, b1))
    assert any(c is not None and c < 1.0 for c in c0[1:]), c0


@contextlib.contextmanager
def _decoy_arguments():
    """kernels.fused_linear_update and elementwise_update, where a launch has a step slot, passed other
    scalars than the optimizer's beside it: every entry of h 0.5, grad_scale 0.25, the key's low bit
    flipped. Yields the list of launches, True for each that had a slot."""
    from forge_num import kernels

    launches = []

    def decoyed(real, h_index):
        def launch(*args, step_slot=None, **kw):
            launches.append(step_slot is not None)
            if step_slot is not None:
                args = list(args)
                args[h_index] = tuple(0.5 for _ in args[h_index])
                kw["grad_scale"] = 0.25
                if kw.get("seed") is not None:
                    kw["seed"] ^= 1
            return real(*args, step_slot=step_slot, **kw)
        return launch

    with mock.patch.object(kernels, "fused_linear_update", decoyed(kernels.fused_linear_update, 5)), \
            mock.patch.object(kernels, "elementwise_update", decoyed(kernels.elementwise_update, 4)):
        yield launches


@pytest.mark.parametrize("precision", ["fp32", "8bit"])
def test_the_bookkeeping_before_a_replay_is_the_eager_steps(precision):
    """After a step, _prepare_replayed_updates (what runs before a replay) writes every slot as the
    second eager step's launches write it (the clipping coefficient from the first step's norm among
    them), in the order of the updates, and leaves the step counters where that step leaves them: a
    replay's kernels then read the second step's scalars."""
    model_a, opt_a = _prepared(precision, True)
    for k in range(2):
        _step(model_a, opt_a, k)
    model_b, opt_b = _prepared(precision, True)
    _step(model_b, opt_b, 0)
    updates = list(opt_b._slots.written)  # the first step's updates, in order: what a capture records
    assert _names(model_b, updates) == _names(model_a, opt_a._slots.written)  # the same in every step
    opt_b._prepare_replayed_updates(updates)
    assert torch.equal(opt_b._slots.host_words, opt_a._slots.host_words)
    steps_a = [st["step"].item() for st in opt_a.state.values()]
    steps_b = [st["step"].item() for st in opt_b.state.values()]
    assert steps_a == steps_b == [2.0] * len(steps_a)
    assert opt_b._slots.host_words.any()


def _names(model, params) -> list[str]:
    by_param = {p: n for n, p in model.named_parameters()}
    return [by_param[p] for p in params]


@pytest.mark.parametrize("precision", ["fp32", "8bit"])
def test_a_tied_heads_capturable_path_trains_as_its_eager_path(precision):
    """In a captured step's optimizer (opt._capturable) the tied head's chunked loss reads nothing on the host:
    no token sort for a row split (8bit), and the embedding's backward adds its dense gradient to the
    head's (autograd's sum itself) instead of only its tokens' rows (add_touched_rows, which sorts them
    with torch.unique). Two steps taking those paths, torch.unique refused throughout, equal two
    eager steps bit for bit."""
    from forge_num.hf import causal_lm_loss

    runs = []
    for capturing in (False, True):
        model = tiny_llama(seed=1, tie=True)
        if precision != "fp32":
            model = model.to(torch.bfloat16)
        opt = fn.AdamW(model.parameters(), precision=precision, seed=9, backend="kernels", **HYPER)
        fn.prepare(model, opt)
        opt._capturable = capturing
        refused = mock.patch.object(torch, "unique", side_effect=AssertionError("a host read while capturing"))
        with refused if capturing else contextlib.nullcontext():
            for k in range(2):
                ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(100 + k))
                opt.backward(causal_lm_loss(model, ids))
                opt.step()
        runs.append(training_bits(model, opt))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("options,reason", [
    ({"accumulation_steps": 2}, "gradient accumulation"),
    ({"max_grad_norm": 1.0, "clipping": "exact"}, "exact clipping"),
    ({"nonfinite": "raise"}, "nonfinite='raise'"),
    ({"backend": "torch"}, "backend='torch'"),
    ({}, "CUDA device"),
])
def test_a_step_that_cannot_be_captured_is_refused(options, reason):
    model = tiny_llama(seed=1)
    opt = fn.AdamW(model.parameters(), **{**HYPER, **options})
    fn.prepare(model, opt)
    with pytest.raises(RuntimeError, match=reason):
        fn.capture_step(opt, lambda ids: model(input_ids=ids, labels=ids).loss)
    assert opt._slots is None
    unprepared = fn.AdamW(tiny_llama().parameters(), **HYPER)
    with pytest.raises(RuntimeError, match="prepare"):
        fn.capture_step(unprepared, lambda ids: ids.sum())


@pytest.mark.parametrize("version,entered,affected", [
    ("5.0.0", False, True), ("5.17.0", False, True), ("5.18.0", False, True), ("5.25.0", False, True),
    ("5.25.0", True, False), ("5.17.1.dev0", True, False), ("4.57.6", False, False), ("6.0.0", False, False),
    ("main", False, False), (None, False, False)])
def test_the_attention_capture_caveat_names_what_attends_otherwise(version, entered, affected):
    """transformers 5.x build explicit causal masks while a CUDA stream captures (one_sequence_per_row's
    docstring; 4.57.6's masking_utils does not look at stream capture): capture_step's warning names them,
    unless the capture entered forge_num.hf.one_sequence_per_row(), and says when (5.0-5.17 always, 5.18
    on without a KV cache)."""
    from forge_num.graphs import _attention_capture_caveat

    caveat = _attention_capture_caveat(version, entered)
    assert (caveat is not None) == affected
    if affected:
        assert version in caveat and "one_sequence_per_row" in caveat
        assert ("always" in caveat) == (version in ("5.0.0", "5.17.0"))
