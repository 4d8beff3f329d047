"""A prepared model and its optimizer are freed once the program drops them.

torch does not show the garbage collector a tensor's post-accumulate-grad hooks (checked below for the
installed version), so prepare()'s hook on each parameter holds its optimizer weakly (fused._grad_ready_hook),
and a tied embedding's _TiedRows entry, keyed weakly by the weight, holds it weakly too: otherwise the weights
and optimizer state of every model trained in a process stayed on the device until the process ended (in
session 39 a script that trained a model twice a run ran an 80 GB GPU out of memory after 24 runs).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import forge_num as fn
import forge_num.fused as fused
from forge_num.fused import prepare, unprepare
from tests.test_training_semantics import ADAMW, tiny_llama


def test_torch_keeps_a_parameter_whose_post_accumulate_grad_hook_holds_it():
    """The fact the weak references stand on: a parameter whose post-accumulate-grad hook refers back to
    it is never collected, while the same cycle through a gradient hook (register_hook) is. If this fails,
    torch now traverses those hooks and fused._grad_ready_hook's weak reference is no longer needed."""

    class Holder:
        def __init__(self, p):
            self.p = p

        def hook(self, _):
            pass

    def make(register):
        p = torch.nn.Parameter(torch.randn(4))
        holder = Holder(p)
        register(p, holder)
        return weakref.ref(p)

    kept = make(lambda p, h: p.register_post_accumulate_grad_hook(h.hook))
    freed = make(lambda p, h: p.register_hook(lambda g, h=h: g))
    gc.collect()
    assert kept() is not None and freed() is None


def _trained(model_fn, optimizer_cls, steps, **kwargs):
    """weakrefs to a prepared model's parameters, its optimizer and the model, after ``steps`` steps."""
    model = model_fn()
    opt = optimizer_cls(model.parameters(), **kwargs)
    prepare(model, opt)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        opt.backward(loss)
        opt.step()
    assert opt.state, "the steps created optimizer state"
    return [weakref.ref(p) for p in model.parameters()] + [weakref.ref(opt), weakref.ref(model)]


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])  # tied: a _TiedRows entry
@pytest.mark.parametrize("optimizer_cls,kwargs", [(fn.AdamW, ADAMW), (fn.SGD, dict(lr=1e-2, momentum=0.9))],
                         ids=["adamw", "sgd"])
def test_a_trained_prepared_model_and_its_optimizer_are_collected(tie, optimizer_cls, kwargs):
    refs = _trained(lambda: tiny_llama(tie=tie), optimizer_cls, 2, **kwargs)
    if tie:
        assert any(r() in fused._TIED_ROWS for r in refs[:-2]), "the tied weight has its _TiedRows entry"
    gc.collect()
    alive = [r() for r in refs if r() is not None]
    assert not alive, f"{len(alive)} of {len(refs)} objects outlive the program's references: " \
                      f"{[type(a).__name__ for a in alive][:5]}"


def test_an_unprepared_model_outlives_its_optimizer_and_trains_without_it():
    """unprepare() removes the hooks; a model kept while its optimizer is dropped is left with plain
    gradients in .grad, and its parameters are freed with it."""
    model = tiny_llama()
    opt = fn.AdamW(model.parameters(), **ADAMW)
    prepare(model, opt)
    unprepare(model)
    opt_ref = weakref.ref(opt)
    del opt
    gc.collect()
    assert opt_ref() is None
    ids = torch.arange(16).view(1, 16)
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_the_hook_does_nothing_once_its_optimizer_is_gone():
    """A parameter kept by the program after its model and optimizer are dropped: its hook finds no
    optimizer and leaves the gradient in .grad, as with no hook."""
    model = torch.nn.Linear(4, 3, bias=False)
    opt = fn.AdamW(model.parameters(), **ADAMW)
    prepare(model, opt)
    weight = model.weight
    before = weight.detach().clone()
    del model, opt
    gc.collect()
    (weight * torch.ones(3, 4)).sum().backward()
    assert torch.equal(weight.grad, torch.ones(3, 4)) and torch.equal(weight.detach(), before)
