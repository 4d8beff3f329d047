"""A training step captured in a CUDA graph and replayed: the host's per-layer Python out of the step.

At small batches forge's step is host-bound (bench/NOTES.md, sessions 11-25: the 1B model at 1x1024
tokens issues its forward and backward in ~140 ms of host time on an H100 machine, ~350 us a fused
linear, while its kernels take less). Captured, a step is one graph launch plus the optimizer's
bookkeeping::

    def loss_of(ids):
        with forge_num.hf.one_sequence_per_row():  # a Hugging Face model: attend as eagerly (below)
            return model(input_ids=ids, labels=ids).loss

    step = forge_num.capture_step(opt, loss_of)
    for ids in batches:
        loss = step(ids)          # forward, backward with the fused updates, the step's telemetry

The first ``warmup`` calls run eagerly (real steps, on a side stream, as torch.cuda.graphs asks: they
compile every kernel and settle lazy state); the next captures the step and replays it, and every
later call copies its inputs into the captured ones and replays. The returned loss is the graph's own
tensor: read or clone it before the next call.

Memory: torch keeps a cuBLAS and a cuBLASLt workspace for each stream a matmul ran on (32 MiB each on
Hopper), for the process's life. The capture allocates its stream's pair in the graph's pool, where
every replay uses it; the warm-up stream's pair would stay allocated beside it, unused (session 33 on
an H100, Llama-1B 4x1024: 0.12 GiB more allocated when a replay starts than when an eager step starts,
with one warm-up stream a call). So every warm-up runs on one side stream, and the workspaces are
cleared before the capture (as torch's own CUDA-graph trees do, _inductor/cudagraph_trees.py): a later
matmul outside the graph makes its stream's pair again.

Why the bits are the eager step's: the graph holds the same kernels with the same operands. What an
eager launch takes from the host each step (the rule's scalars ``h``, the gradient scale, the Philox
key) is read instead from the parameter's *step slot* in device memory when the kernel runs
(kernels.step_slot_words, linear_update.step_scalars); before each replay the optimizer does for every
update, in the capture's order, what the backward's launch would have done on the host (the rule's step
counter advanced, the scalars computed) and writes them into its slot (ForgeOptimizer.
_prepare_replayed_updates), and after it finishes the step as step() would (the telemetry's totals,
summed inside the graph, copied to the host behind an event; the step count). The warm-up steps read
slots too, so the capture compiles nothing new.

That is forge_num's part: given the model's gradients, the updates, their scalars and the telemetry are
the eager step's (tests/test_gpu_graphs.py, on an H100). The model's own forward and backward are the
model's, and Hugging Face transformers 5.x attend otherwise while a CUDA stream captures: they build an
explicit causal mask and repeat the key/value heads where the eager forward passes is_causal and enable_gqa
(slower attention, other bf16 gradients; forge_num.hf.one_sequence_per_row() says when and why, and gives a
capture of one-sequence rows the eager path). capture_step warns when a transformers 5.x is imported and
the capture did not enter that context (_attention_capture_caveat).

A tied head with the chunked loss (forge_num.linear_cross_entropy) sorts the batch's tokens with
torch.unique, a host read, to split the tied weight's update by rows (bf16-sr, 8bit) or to add only
the touched rows of the embedding's gradient to the head's (fused.add_touched_rows). In a captured
step's optimizer (``opt._capturable``, set for every step from the warm-up on) the split keeps a fixed
number of rows instead, one a token (fused._StaticTokenRows: the touched rows and the lowest untouched
ones), found on the device; the same bits. In the fp32 regime, which does not split, the embedding's
dense gradient is added to the head's: autograd's sum, the same bits, with a [vocabulary, hidden]
gradient more at the step's end.

What a captured step cannot hold, refused with an error naming it: any other host read of the device
inside the step, exact clipping's two passes (clipping='exact'), gradient accumulation
(accumulation_steps > 1), nonfinite='raise' (its counts are read at once), data parallelism and
sharded parameters, the torch backend (its updates take no slot), a parameter the optimizer holds
that the captured backward does not update in place.
"""

from __future__ import annotations

import sys
import warnings
from typing import Callable

import torch

from forge_num.optim import ForgeOptimizer, _is_sharded, _StepSlots

__all__ = ["CapturedStep", "capture_step"]


def capture_step(opt: ForgeOptimizer, loss_fn: Callable[..., torch.Tensor], *, warmup: int = 2) -> "CapturedStep":
    """A CapturedStep of ``loss_fn`` (inputs -> scalar loss of a model prepared with ``opt``)."""
    return CapturedStep(opt, loss_fn, warmup=warmup)


def _attention_capture_caveat(transformers_version: str | None, entered_one_sequence: bool) -> str | None:
    """Why a captured step of a Hugging Face model may not attend as its eager step does, or None:
    transformers 5.x build explicit causal masks while a CUDA stream captures (the module docstring),
    unless the capture entered forge_num.hf.one_sequence_per_row(); None for 4.x, a version that does
    not parse, and where transformers is not imported."""
    if transformers_version is None or entered_one_sequence:
        return None
    try:
        major, minor = (int(part) for part in transformers_version.split(".")[:2])
    except ValueError:
        return None
    if major != 5:
        return None
    when = "always" if minor < 18 else "when the model has no KV cache (gradient checkpointing, use_cache=False)"
    return (f"transformers {transformers_version} builds an explicit causal mask while a CUDA stream captures "
            f"({when}), where the eager step passes is_causal to SDPA: a captured Hugging Face model's attention "
            "is slower (no causal skipping, key/value heads repeated) and its gradients are not the eager step's "
            "bits. If each row of the batch holds one sequence (no packing), run the model's forward inside "
            "forge_num.hf.one_sequence_per_row().")


def _clear_cublas_workspaces() -> None:
    """torch's cuBLAS and cuBLASLt workspaces of every stream freed (module docstring, "Memory"): the
    blocks go back to the caching allocator, stream-ordered behind the work that used them, and
    torch.cuda.graph's entry empties its cache. A torch without the call keeps them (more memory, the
    same bits)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _one_sequence_entries() -> int:
    """How many forge_num.hf.one_sequence_per_row() contexts were entered so far (0 if never imported)."""
    hf = sys.modules.get("forge_num.hf")
    return hf._ONE_SEQUENCE["entered"] if hf is not None else 0


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


def _addresses(opt: ForgeOptimizer, params) -> tuple[int, ...]:
    """The data pointers of ``params`` and of their optimizer state's tensors (an 8bit state's codes and
    scales): what a graph's kernels address. A replay after any of them was replaced (load_state_dict,
    .to(), a parameter's .data assigned) would train the old tensors."""
    out = []
    for p in params:
        out.append(p.data_ptr())
        for v in opt.state[p].values():
            for t in (v.values() if isinstance(v, dict) else (v,)):
                if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                    out.append(t.data_ptr())
    return tuple(out)


class CapturedStep:
    """``step(*inputs) -> loss``: one training step of ``loss_fn`` with ``opt``'s updates in its
    backward, eagerly for the first ``warmup`` calls, then captured in a CUDA graph and replayed (the
    module docstring). Inputs keep their shapes, dtypes and devices from the capture on. ``close()``
    gives the optimizer back to eager training (a capture that fails does so itself); a replay after
    the parameters or the optimizer's state tensors were replaced is refused."""

    def __init__(self, opt: ForgeOptimizer, loss_fn: Callable[..., torch.Tensor], *, warmup: int = 2):
        reason = _refusal(opt)
        if reason is not None:
            raise RuntimeError(f"forge_num.capture_step: {reason}")
        if int(warmup) != warmup or warmup < 1:
            raise ValueError(f"warmup must be an integer >= 1 (the eager steps that compile), got {warmup!r}")
        if opt._slots is not None:
            raise RuntimeError("forge_num.capture_step: this optimizer's steps are captured already (close() that "
                               "CapturedStep first)")
        self.opt, self.loss_fn, self.warmup = opt, loss_fn, int(warmup)
        opt._slots = _StepSlots.for_optimizer(opt, next(iter(opt._recs)).device)
        opt._capturable = True  # every step from here on, the warm-up ones too, takes the capturable paths
        self._calls = 0
        self._closed = False
        self._warmup_stream: torch.cuda.Stream | None = None  # one for every warm-up call (module docstring)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static: tuple[torch.Tensor, ...] = ()
        self._loss: torch.Tensor | None = None
        self._summed: torch.Tensor | None = None
        self._updates: list[torch.Tensor] = []  # the parameters the graph updates, in its order
        self._addresses: tuple[int, ...] = ()

    def close(self) -> None:
        """The optimizer back to eager steps (its slots and capturable paths dropped); the graph freed."""
        if self.opt._slots is not None:
            self.opt._slots.wait_for_upload()
        self.opt._slots, self.opt._capturable = None, False
        self._graph = self._loss = self._summed = None
        self._static, self._updates = (), []
        self._closed = True

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self._closed:
            raise RuntimeError("forge_num: this CapturedStep is closed; capture_step(opt, loss_fn) makes another")
        if self._graph is not None:
            return self._replay(inputs)
        if self._calls < self.warmup:
            self._calls += 1
            if self._warmup_stream is None:
                self._warmup_stream = torch.cuda.Stream()
            side = self._warmup_stream
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = self._eager(inputs)
            torch.cuda.current_stream().wait_stream(side)
            return loss
        return self._capture(inputs)

    def _eager(self, inputs) -> torch.Tensor:
        self.opt._slots.begin_step()
        loss = self.loss_fn(*inputs)
        self.opt.backward(loss)
        self.opt.step()
        return loss.detach()

    def _capture(self, inputs) -> torch.Tensor:
        opt, slots = self.opt, self.opt._slots
        opt._resolve_stats()  # nothing of an earlier step read inside the capture
        self._static = tuple(t.detach().clone() for t in inputs)
        had_state = set(opt.state)
        saved = opt._host_counters(list(had_state))
        graph = torch.cuda.CUDAGraph()
        slots.begin_step()
        slots.defer = True
        entered_before = _one_sequence_entries()
        _clear_cublas_workspaces()
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
            new = [opt._recs[p].name if p in opt._recs else "a parameter" for p in opt.state if p not in had_state]
            if new:  # their state's zero fill would be in the graph: every replay would reset it
                raise RuntimeError(
                    f"forge_num.capture_step: {', '.join(new[:5])} had its first update in the captured step, "
                    "so its optimizer state would be created inside the graph; run more warm-up steps "
                    "(capture_step(..., warmup=)) so that every parameter is updated before the capture")
        except Exception as e:
            for p in [p for p in opt.state if p not in had_state]:
                del opt.state[p]
            opt._restore_host_counters(saved)
            opt._reset_step_fields()
            for group in opt.param_groups:  # gradients the aborted capture left hold nothing computed
                for p in group["params"]:
                    p.grad = None
            self.close()
            if isinstance(e, RuntimeError) and str(e).startswith("forge_num"):
                raise
            raise RuntimeError(
                "forge_num.capture_step: the step could not be captured in a CUDA graph: an operation in it "
                "is not allowed while a stream is captured (a host read of the device, such as .item() or a "
                "data-dependent shape, or an allocation of pinned memory). The optimizer is back to eager "
                f"steps, its state as before the call. Cause: {e}"
            ) from e
        finally:
            slots.defer = False
        caveat = _attention_capture_caveat(getattr(sys.modules.get("transformers"), "__version__", None),
                                           _one_sequence_entries() > entered_before)
        if caveat is not None:
            warnings.warn(f"forge_num.capture_step: {caveat}", stacklevel=3)
        self._graph, self._loss, self._summed = graph, loss.detach(), summed
        self._updates = list(dict.fromkeys(slots.written))
        self._addresses = _addresses(opt, self._updates)
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
                    f"{tuple(static.shape)} {static.dtype} on {static.device} (close() this step and capture "
                    "another for another shape)")
        opt = self.opt
        if _addresses(opt, self._updates) != self._addresses:
            raise RuntimeError(
                "forge_num: the parameters or the optimizer's state tensors were replaced since the capture "
                "(load_state_dict, .to(), an assignment to .data): the graph would train the old ones; close() "
                "this CapturedStep and capture the step again")
        for static, t in zip(self._static, inputs):
            static.copy_(t, non_blocking=True)
        opt._prepare_replayed_updates(self._updates)
        opt._slots.upload()
        self._graph.replay()
        opt._finish_step(summed=self._summed)
        return self._loss
