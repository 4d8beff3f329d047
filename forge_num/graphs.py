"""A training step captured in a CUDA graph and replayed: the host's per-layer Python out of the step.

At small batches forge's step is host-bound (bench/NOTES.md, sessions 11-25: the 1B model at 1x1024
tokens issues its forward and backward in ~140 ms of host time on an H100 machine, ~350 us a fused
linear, while its kernels take less). Captured, a step is one graph launch plus the optimizer's
bookkeeping::

    step = forge_num.capture_step(opt, lambda ids: model(input_ids=ids, labels=ids).loss)
    for ids in batches:
        loss = step(ids)          # forward, backward with the fused updates, the step's telemetry

The first ``warmup`` calls run eagerly (real steps, on a side stream, as torch.cuda.graphs asks: they
compile every kernel and settle lazy state); the next captures the step and replays it, and every
later call copies its inputs into the captured ones and replays. The returned loss is the graph's own
tensor: read or clone it before the next call.

Why the bits are the eager step's: the graph holds the same kernels with the same operands. What an
eager launch takes from the host each step (the rule's scalars ``h``, the gradient scale, the Philox
key) is read instead from the parameter's *step slot* in device memory when the kernel runs
(kernels.step_slot_words, linear_update.step_scalars); before each replay the optimizer does for every
update, in the capture's order, what the backward's launch would have done on the host (the rule's step
counter advanced, the scalars computed) and writes them into its slot (ForgeOptimizer.
_prepare_replayed_updates), and after it finishes the step as step() would (the telemetry's totals,
summed inside the graph, copied to the host behind an event; the step count). The warm-up steps read
slots too, so the capture compiles nothing new.

What a captured step cannot hold, refused with an error naming it: a host read of the device inside
the step (the tied embedding's row split in the stochastic regimes sorts its tokens with
torch.unique), exact clipping's two passes (clipping='exact'), gradient accumulation
(accumulation_steps > 1), nonfinite='raise' (its counts are read at once), data parallelism and
sharded parameters, the torch backend (its updates take no slot), a parameter the optimizer holds
that the captured backward does not update in place.
"""

from __future__ import annotations

from typing import Callable

import torch

from forge_num.optim import ForgeOptimizer, _is_sharded, _StepSlots

__all__ = ["CapturedStep", "capture_step"]


def capture_step(opt: ForgeOptimizer, loss_fn: Callable[..., torch.Tensor], *, warmup: int = 2) -> "CapturedStep":
    """A CapturedStep of ``loss_fn`` (inputs -> scalar loss of a model prepared with ``opt``)."""
    return CapturedStep(opt, loss_fn, warmup=warmup)


def _refusal(opt: ForgeOptimizer) -> str | None:
    """Why ``opt``'s step cannot be captured, or None."""
    if not isinstance(opt, ForgeOptimizer):
        return f"the optimizer must be a forge_num optimizer, got {type(opt).__name__}"
    if not opt._recs:
        return "the optimizer updates no parameter in backward: prepare(model, opt) first"
    if opt.accumulation_steps != 1:
        return f"gradient accumulation (accumulation_steps={opt.accumulation_steps}) is not captured"
    if opt.clipping == "exact":
        return "exact clipping takes a norm pass whose total the host reads; use clipping='previous'"
    if opt.nonfinite != "skip":
        return f"nonfinite={opt.nonfinite!r} reads each step's counts at once; use nonfinite='skip' (opt.stats)"
    if opt._grad_reducer is not None or any(_is_sharded(p) for p in opt._recs):
        return "data parallelism and sharded parameters are not captured"
    if opt.backend not in ("auto", "kernels"):
        return f"backend={opt.backend!r}: only the kernels read their scalars from step slots"
    devices = {p.device for p in opt._recs}
    if any(d.type != "cuda" for d in devices) or not torch.cuda.is_available():
        return f"a CUDA graph needs the parameters on a CUDA device, they are on {sorted(map(str, devices))}"
    if len(devices) > 1:
        return f"the parameters lie on several devices ({sorted(map(str, devices))})"
    return None


def _counters(opt: ForgeOptimizer) -> dict:
    """The optimizer state's host scalars (Adam's step counters): what a capture's bookkeeping
    advances, restored if it fails."""
    return {(p, k): v.clone() for p, st in opt.state.items() for k, v in st.items()
            if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0}


class CapturedStep:
    """``step(*inputs) -> loss``: one training step of ``loss_fn`` with ``opt``'s updates in its
    backward, eagerly for the first ``warmup`` calls, then captured in a CUDA graph and replayed (the
    module docstring). Inputs keep their shapes, dtypes and devices from the capture on."""

    def __init__(self, opt: ForgeOptimizer, loss_fn: Callable[..., torch.Tensor], *, warmup: int = 2):
        reason = _refusal(opt)
        if reason is not None:
            raise RuntimeError(f"forge_num.capture_step: {reason}")
        if int(warmup) != warmup or warmup < 1:
            raise ValueError(f"warmup must be an integer >= 1 (the eager steps that compile), got {warmup!r}")
        if opt._slots is not None:
            raise RuntimeError("forge_num.capture_step: this optimizer's steps are captured already")
        self.opt, self.loss_fn, self.warmup = opt, loss_fn, int(warmup)
        device = next(iter(opt._recs)).device
        n_params = sum(len(g["params"]) for g in opt.param_groups)
        width = max(len(opt._rule(g).scalar_names) for g in opt.param_groups) + 3
        opt._slots = _StepSlots(device, n_params, width)
        self._calls = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static: tuple[torch.Tensor, ...] = ()
        self._loss: torch.Tensor | None = None
        self._summed: torch.Tensor | None = None

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self._graph is not None:
            return self._replay(inputs)
        if self._calls < self.warmup:
            self._calls += 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = self._eager(inputs)
            torch.cuda.current_stream().wait_stream(side)
            return loss
        return self._capture(inputs)

    def _eager(self, inputs) -> torch.Tensor:
        loss = self.loss_fn(*inputs)
        self.opt.backward(loss)
        self.opt.step()
        return loss.detach()

    def _capture(self, inputs) -> torch.Tensor:
        opt, slots = self.opt, self.opt._slots
        opt._resolve_stats()  # nothing of an earlier step read inside the capture
        self._static = tuple(t.detach().clone() for t in inputs)
        saved = _counters(opt)
        graph = torch.cuda.CUDAGraph()
        slots.defer = True
        try:
            with torch.cuda.graph(graph):
                loss = self.loss_fn(*self._static)
                opt.backward(loss)
                summed = opt._summed_partials() if opt._parts else None
            left = [rec.name for rec in opt._recs.values() if rec.events and not rec.updated]
            left += [f"a parameter of param_groups[{i}]" for i, g in enumerate(opt.param_groups)
                     for p in g["params"] if p not in opt._recs and p.grad is not None]
            if left or summed is None:
                raise RuntimeError(
                    "forge_num.capture_step: the captured backward left updates to step() "
                    f"({', '.join(left[:5]) or 'none made'}): only updates made in backward are captured")
        except Exception as e:
            for (p, k), v in saved.items():
                opt.state[p][k].copy_(v)
            opt._reset_step_fields()
            for group in opt.param_groups:  # gradients the aborted capture left hold nothing computed
                for p in group["params"]:
                    p.grad = None
            slots.defer = False
            if isinstance(e, RuntimeError) and str(e).startswith("forge_num"):
                raise
            raise RuntimeError(
                "forge_num.capture_step: the step could not be captured in a CUDA graph: an operation in it "
                "is not allowed while a stream is captured (a host read of the device, such as the tied "
                "embedding's row split in the stochastic regimes, which sorts its tokens with torch.unique, "
                f"or an allocation of pinned memory). The optimizer's state is as before the call. Cause: {e}"
            ) from e
        slots.defer = False
        self._graph, self._loss, self._summed = graph, loss.detach(), summed
        slots.upload()
        graph.replay()
        opt._finish_step(summed=summed)
        return self._loss

    def _replay(self, inputs) -> torch.Tensor:
        if len(inputs) != len(self._static):
            raise ValueError(f"the captured step takes {len(self._static)} inputs, got {len(inputs)}")
        for i, (static, t) in enumerate(zip(self._static, inputs)):
            if t.shape != static.shape or t.dtype != static.dtype or t.device != static.device:
                raise ValueError(
                    f"input {i} is {tuple(t.shape)} {t.dtype} on {t.device}; the captured step's is "
                    f"{tuple(static.shape)} {static.dtype} on {static.device} (capture another step for another shape)")
        for static, t in zip(self._static, inputs):
            static.copy_(t, non_blocking=True)
        opt = self.opt
        opt._prepare_replayed_updates()
        opt._slots.upload()
        self._graph.replay()
        opt._finish_step(summed=self._summed)
        return self._loss
