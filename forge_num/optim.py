"""forge_num's optimizers: AdamW, Adam, SGD and Lion as ``torch.optim.Optimizer`` subclasses.

Each optimizer applies the one definition of its rule (``forge_num.rules``) through a backend: the
Triton kernels (``forge_num.kernels``) for CUDA tensors, ``forge_num.torch_backend`` elsewhere.

Two ways to use them:

* **Plain** — like any torch optimizer: ``loss.backward(); opt.step()``. ``step()`` applies the
  guarded rule to every parameter's ``.grad``.
* **In backward** — ``model = forge_num.prepare(model, opt)``: every linear weight is updated inside
  its layer's backward from ``dW = dYᵀX`` block by block (dW never exists whole), every other
  trainable parameter in a post-accumulate-grad hook, and ``step()`` only finalizes the step (step
  counter, telemetry, checks); it never updates a parameter a second time.

torch compatibility: ``param_groups`` hold torch's keys (so every ``torch.optim.lr_scheduler`` works:
the learning rate is read from the group at each update), and ``state_dict()`` uses torch's state keys
(``step`` as a 0-d float32 tensor, ``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``): the fp32 state
dict of ``forge_num.AdamW`` loads into ``torch.optim.AdamW`` and back.

Options of the step (constructor keywords):

``max_grad_norm`` / ``clipping``
    Global gradient-norm clipping, ``g <- g * min(1, max_norm / (norm + 1e-6))`` computed with the
    same tensor operations as ``torch.nn.utils.clip_grad_norm_``.
    ``"exact"``: in backward mode the norm needs every gradient before any update, so the last
    micro-batch runs a *norm-only backward* first (linear weights: ``weight_grad_norm_sq``, no dW
    materialized; other parameters: their ordinary gradient, freed at once), then the real backward
    with the coefficient: one extra backward per step. Use ``opt.backward(loss)`` (or call
    ``.backward()`` on the ``loss`` of a Hugging Face model output, which prepare() wraps).
    ``"previous"``: scale by the coefficient of the previous step's norm (free, one step stale; the
    first step is not clipped). ``None`` / ``max_grad_norm=None``: no clipping.
``accumulation_steps``
    In backward mode: micro-batches per step. Linear weights accumulate ``dW`` into an fp32 buffer
    the size of the weight (4 bytes/parameter: the memory FORGE otherwise saves, for the duration of
    the step), consumed by the last micro-batch's update; other parameters accumulate ``.grad`` as
    autograd does. The result equals torch accumulating ``.grad`` over the micro-batches. A step()
    after fewer micro-batches applies what has been accumulated (as torch would).
``nonfinite``
    Non-finite gradient elements never reach weights or state (the guarded rule keeps those
    elements); ``"skip"`` records them in the telemetry, ``"raise"`` raises ``FloatingPointError``
    in ``step()``. With exact clipping a non-finite global norm skips the whole update.
``precision``
    ``"fp32"``: fp32 weights and states. ``"bf16-sr"``: bf16 weights and states (convert the model
    with ``model.to(torch.bfloat16)``), updated in fp32 registers and stored with stochastic
    rounding; the random stream is keyed by ``derive_seed(seed, step, parameter index)`` and
    countered by element index, so runs with one ``seed`` are bitwise identical and a resumed run
    replays the same stream. Linear weights under prepare() get the unrounded fp32 dW (the fused
    kernel's accumulator); other parameters get autograd's bf16 gradient. ``"8bit"``: bf16 weights as
    in bf16-sr, m and v as 8-bit codes with an fp32 scale per 128 elements of a row (state entries
    ``{"codes", "scales"}``); a parameter is quantized in rows of its last dimension.
``backend``
    ``"auto"`` (the Triton kernels for CUDA tensors, the torch backend elsewhere), ``"kernels"``,
    ``"torch"``, or an object with the four functions of ``forge_num.kernels`` named in
    ``BACKEND_FUNCTIONS`` and their signatures (tests use one as a reference that materializes dW).
``seed``
    The user seed of the stochastic rounding (bf16-sr); saved in and checked by the state dict.

Telemetry: ``opt.stats`` (the last step) and ``opt.stats_history``: dicts with ``step``,
``grad_norm`` (global L2 norm of the unscaled gradient, fp64 accumulation), ``nonfinite`` (count),
``clip_coef`` and ``skipped``. With sharded DTensor parameters (FSDP2, tensor parallelism) the norms
and counts are combined across ranks, replicated parameters counted once (forge_num.distributed).
``step()`` does not wait for its own step's work for them: the totals are summed on the device and
copied behind an event, read when ``opt.stats`` or ``opt.stats_history`` is asked for (a wait for that
step's work only) or at the next ``step()`` (by then, in a loop, the device has long finished the
previous step: the host runs up to a step ahead). A history entry is added once its totals are read,
complete. Two settings read them at once: ``nonfinite="raise"`` in ``step()`` (it must, to raise) and
``clipping="previous"`` at the next step's first update (its scale is the last step's norm).
"""

from __future__ import annotations

import math
import warnings
import weakref
from typing import Iterable

from typing import NamedTuple

import torch

from forge_num import rules as _rules
from forge_num import torch_backend
from forge_num.emulator.philox import STREAM_REVISION, derive_seed_of_param, step_key

__all__ = ["AdamW", "Adam", "SGD", "Lion", "ForgeOptimizer"]

# precision -> None (implemented) or why not yet
_PRECISIONS = {
    "fp32": None,
    "bf16-sr": None,
    "8bit": None,
}
_WEIGHT_DTYPE = {"fp32": torch.float32, "bf16-sr": torch.bfloat16, "8bit": torch.bfloat16}
_QBLOCK = 128  # 8bit: elements of a row per quantization block (kernels/quant8.py, emulator/quant8.py)


# A materialized gradient stored in bf16 (the bf16-sr and 8bit regimes' hooked parameters: the
# embedding, norms, an untied head without the chunked loss) is widened to fp32 for its update at
# most this many elements at a time: 64 Mi elements, 256 MiB of fp32. Widening a whole 8B model's
# embedding gradient at once (525 M elements) held 1.96 GiB beside its bf16 gradient at the end of
# the backward: the 8bit step's peak (bench/NOTES.md, session 12). The update is element-wise and
# each chunk is whole rows with its elements' Philox counters, so the bits are the same.
_WIDEN_CHUNK_ELEMENTS = 64 * 2**20


def _widen_rows(grad2: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """The rows [r0, r1) of a gradient, in fp32."""
    return grad2[r0:r1].float()


def _update_in_widened_row_chunks(grad2: torch.Tensor, update) -> None:
    """``update(first row, rows' gradient in fp32)`` over a [rows, cols] gradient: once with the gradient
    itself where it is fp32 (no copy), else on whole rows of at most _WIDEN_CHUNK_ELEMENTS elements.
    Each chunk goes straight into its call, so it is freed when the call returns, before the next one
    is widened. (A ``for`` loop over a generator of chunks keeps the previous chunk in its variable
    while the next is made: two chunks alive at once, 2 x 256 MiB beside the tied 1B embedding's bf16
    gradient at the 8bit step's peak, session 14.)"""
    rows, cols = grad2.shape
    if grad2.dtype == torch.float32:
        update(0, grad2)
        return
    step = max(1, _WIDEN_CHUNK_ELEMENTS // max(cols, 1))
    for r0 in range(0, max(rows, 1), step):
        update(r0, _widen_rows(grad2, r0, min(r0 + step, rows)))


_NO_TOKENS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _no_tokens(device: torch.device, width: int) -> torch.Tensor:
    """An fp32 [0, width] tensor on ``device``: the x or dy of an update from an fp32 gradient alone
    (K = 0 tokens). One per (device, width), shared: it has no elements to write, and a fresh one a
    call was two allocations a small parameter's update (the 8bit norm weights, each step)."""
    t = _NO_TOKENS.get((device, width))
    if t is None:
        t = _NO_TOKENS[(device, width)] = torch.zeros((0, width), dtype=torch.float32, device=device)
    return t


def _row_chunk_counter(r0: int, cols: int) -> dict:
    """``counter=`` of the rows [r0, ...) of a [rows, cols] parameter numbered by flat index: element
    (r, c) of the chunk is (r0 + r) * cols + c, the map (cols, row stride cols, base r0 * cols);
    nothing for r0 = 0, where the default (the chunk's own flat index) is that already."""
    return {"counter": (cols, cols, r0 * cols)} if r0 else {}


def _rows_cols(p: torch.Tensor) -> tuple[int, int]:
    """The 2-D shape a parameter is quantized in: rows of its last dimension (1-D: one row)."""
    cols = p.shape[-1] if p.dim() else 1
    return max(1, p.numel() // max(cols, 1)), cols


class _Q8(NamedTuple):
    """An 8bit state as the backends take it (forge_num.kernels.Q8State's fields)."""

    codes: torch.Tensor
    scales: torch.Tensor


BACKEND_FUNCTIONS = ("fused_linear_update", "elementwise_update", "weight_grad_norm_sq", "accumulate_weight_grad")


_PYTHON_NUMBERS = frozenset((int, float))


def _backend_for(t: torch.Tensor, choice):
    if not isinstance(choice, str):  # an object with BACKEND_FUNCTIONS (a reference backend in tests)
        return choice
    if choice == "torch" or (choice == "auto" and not t.is_cuda):
        return torch_backend
    from forge_num import kernels  # CUDA (or TRITON_INTERPRET=1)

    return kernels


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "_local_tensor")


def _local(t):
    """A DTensor's local shard (the same storage, so in-place updates land in the DTensor); else ``t``."""
    return t._local_tensor if _is_dtensor(t) else t


def _is_sharded(p) -> bool:
    """A DTensor parameter sharded across ranks (each rank holds a different part of it)."""
    return _is_dtensor(p) and any(pl.is_shard() for pl in p.placements)



class _Rec:
    """Book-keeping of one parameter updated in backward (registered by prepare())."""

    __slots__ = ("name", "events", "accum", "updated", "norm_seen", "fused_now", "in_flight")

    def __init__(self, name):
        self.name = name
        self.events = 0  # gradient contributions (one per backward) since the last step()
        self.accum = None  # fp32 dW accumulation buffer of a linear weight
        self.updated = False  # the rule was applied this step
        self.norm_seen = False  # visited by the current norm pass
        self.fused_now = (
            False  # the fused path took this backward's gradient (the hook that follows ignores it)
        )
        # an update applied in two halves (forge_num.fused._SplitHeadUpdate) whose second half has not
        # run yet: its finish(None, -1) completes it
        self.in_flight = None


class _StepSlots:
    """Each update's per-step scalars in device memory, for launches that read them when they run
    (kernels.fused_linear_update's ``step_slot``): the launches of a step captured in a CUDA graph
    (forge_num.graphs), replayed with each step's values. One row of int32 words a parameter
    (kernels.step_slot_words: h, grad_scale, the Philox key), given at its first update; ``written``
    lists the parameters whose rows were written since ``begin_step()``, in the order of their updates
    (a capture's: the updates its graph holds, which its replays' bookkeeping repeats).
    ``host_words`` is the rows' pinned twin, written by the host. A row is copied to the device as it
    is written (eager steps: the warm-up steps before a capture, or any step issued outside the graph;
    a synchronous copy, so each such update waits for the work before it: slow, and correct), or,
    while ``defer`` is set (a capture; the bookkeeping before a replay), with every other row by
    ``upload()``."""

    def __init__(self, device: torch.device, n_params: int, width: int):
        from forge_num.kernels import step_slot_words

        self._words = step_slot_words
        # rows of 16 bytes: every slot 16-byte aligned, so that the warm-up's launches and the capture's
        # share one compiled variant (the launch keys tell an unaligned slot apart)
        width = -(-width // 4) * 4
        self.rows: dict[torch.Tensor, int] = {}
        self.written: list[torch.Tensor] = []
        self.device_words = torch.zeros((n_params, width), dtype=torch.int32, device=device)
        self.host_words = torch.zeros((n_params, width), dtype=torch.int32, pin_memory=device.type == "cuda")
        self.defer = False
        self.uploaded = None  # the event after the last upload (its host rows are not rewritten before it)

    @classmethod
    def for_optimizer(cls, opt: "ForgeOptimizer", device: torch.device) -> "_StepSlots":
        """Slots for every parameter of ``opt``, each row wide enough for its group's rule."""
        from forge_num.kernels import step_slot_size

        return cls(device, sum(len(g["params"]) for g in opt.param_groups),
                   max(step_slot_size(opt._rule(g)) for g in opt.param_groups))

    def begin_step(self) -> None:
        self.written = []

    def write(self, p, h, grad_scale: float, seed) -> torch.Tensor:
        """Write p's row (a new parameter takes the next row) and return its slot on the device."""
        self.wait_for_upload()
        row = self.rows.get(p)
        if row is None:
            row = self.rows[p] = len(self.rows)
        self.written.append(p)
        words = self._words(h, grad_scale, seed)
        host = self.host_words[row, : len(words)]
        host.copy_(torch.tensor(words, dtype=torch.int32))
        slot = self.device_words[row, : len(words)]
        if not self.defer:
            slot.copy_(host)  # from pinned memory; synchronous (the class docstring)
        return slot

    def wait_for_upload(self) -> None:
        """Before the host rows are rewritten: the last upload has read them."""
        if self.uploaded is not None:
            self.uploaded.synchronize()
            self.uploaded = None

    def upload(self) -> None:
        """Every row to the device, ordered before the work issued next on the current stream."""
        self.device_words.copy_(self.host_words, non_blocking=True)
        if self.device_words.device.type == "cuda":
            self.uploaded = torch.cuda.Event()
            self.uploaded.record()


class _RowUpdater:
    """The rule's update of one parameter, seen as [rows, cols] (rows of its last dimension), applied
    to rows at a time from their fp32 gradient, with the step's (rule, h, states) prepared once:

    * ``rows(r0, g32)``: the rows [r0, r0 + len(g32)) in place, their Philox counters their flat
      indices (_row_chunk_counter);
    * ``gathered(index, g32)``: the rows ``index`` (an int64 tensor of distinct row indices), copied
      out, updated with counters CounterMap(cols, cols, 0, index) (each row draws its own counters,
      as in place) and copied back;
    * ``hold(index)`` / ``put_back(held)``: those rows' weight and state copied out and back (a row
      updated in a block before its whole gradient is known is put back as it was).

    The rule is element-wise and the 8bit quantization blocks lie within rows, so an element's new
    bits depend on its gradient, its state and its counter only: any split into rows gives the same
    bits as one update of the whole parameter. Each call records its telemetry."""

    def __init__(self, opt, p, name, rule, h, states, backend):
        self.opt, self.p, self.name, self.rule, self.h, self.backend = opt, p, name, rule, h, backend
        self.n_rows, self.cols = _rows_cols(p)
        self.w2 = _local(p.detach()).view(self.n_rows, self.cols)
        self.q8 = opt.precision == "8bit"
        if self.q8:
            self.states = opt._q8(states)
        else:
            self.states = [_local(s).view(self.n_rows, self.cols) for s in states]
        self.seed = opt._rounding_seed(p)
        self.slot = opt._slot_kw(p, h, self.seed)  # every piece's launch reads the one slot

    def _update(self, w, states, g32, counter):
        if self.q8:
            no_x = _no_tokens(w.device, self.cols)  # K = 0: the update from accum = g32
            no_dy = _no_tokens(w.device, w.shape[0])
            stats = self.backend.fused_linear_update(w, no_x, no_dy, states, self.rule, self.h,
                                                     grad_scale=self.opt._scale(), accum=g32, seed=self.seed,
                                                     **counter, **self.slot)
        else:
            stats = self.backend.elementwise_update(w, g32, states, self.rule, self.h,
                                                    grad_scale=self.opt._scale(), seed=self.seed, **counter,
                                                    **self.slot)
        self.opt._record(stats, self.name, self.p)

    def _states_at(self, index):
        if self.q8:
            return [_Q8(s.codes[index], s.scales[index]) for s in self.states]
        return [s[index] for s in self.states]

    def rows(self, r0: int, g32: torch.Tensor) -> None:
        if r0 == 0 and g32.shape[0] == self.n_rows:  # every row at once (a parameter's one chunk): no views
            self._update(self.w2, self.states, g32, {})
            return
        self._update(self.w2[r0:r0 + g32.shape[0]], self._states_at(slice(r0, r0 + g32.shape[0])), g32,
                     _row_chunk_counter(r0, self.cols))

    def _tensors(self, states) -> list[torch.Tensor]:
        """States' tensors, each [rows, ...]: (codes, scales) of each 8bit state, else the states."""
        return [t for s in states for t in (s if self.q8 else (s,))]

    def hold(self, index: torch.Tensor):
        """Copies of the rows ``index``: (weight, states), the states as _states_at gives them."""
        return self.w2.index_select(0, index), self._states_at(index)

    def put_back(self, index: torch.Tensor, held) -> None:
        w, states = held
        self.w2.index_copy_(0, index, w)
        for t, v in zip(self._tensors(self.states), self._tensors(states)):
            t.index_copy_(0, index, v)

    def done(self) -> None:
        """Every row updated: the step's update of this parameter is complete."""
        rec = self.opt._recs[self.p]
        rec.updated, rec.in_flight = True, None

    def gathered(self, index: torch.Tensor, g32: torch.Tensor) -> None:
        held = self.hold(index)
        self._update(*held, g32, {"counter": (self.cols, self.cols, 0, index)})
        self.put_back(index, held)


class ForgeOptimizer(torch.optim.Optimizer):
    """Base class: the bookkeeping shared by AdamW, Adam, SGD and Lion."""

    _GROUP_DEFAULTS: dict = {}  # torch's group keys and defaults (kept for state-dict compatibility)
    # Torch options that exist in the matching torch optimizer and are not supported: name -> allowed values.
    _UNSUPPORTED = {
        "maximize": (False,),
        "foreach": (None, False),
        "fused": (None, False),
        "differentiable": (False,),
    }

    def __init__(
        self,
        params,
        defaults: dict,
        *,
        precision: str = "fp32",
        max_grad_norm: float | None = None,
        clipping: str | None = "exact",
        accumulation_steps: int = 1,
        nonfinite: str = "skip",
        backend: str = "auto",
        seed: int = 0,
    ):
        if precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, got {precision!r}")
        if _PRECISIONS[precision] is not None:
            raise NotImplementedError(
                f"precision {precision!r} ({_PRECISIONS[precision]}) is not implemented yet; "
                "use precision='fp32'"
            )
        if clipping not in ("exact", "previous", None):
            raise ValueError(f"clipping must be 'exact', 'previous' or None, got {clipping!r}")
        if max_grad_norm is not None:
            max_grad_norm = float(max_grad_norm)
            if not (max_grad_norm > 0 and math.isfinite(max_grad_norm)):
                raise ValueError(
                    f"max_grad_norm must be a positive finite number or None, got {max_grad_norm}"
                )
        if int(accumulation_steps) != accumulation_steps or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}")
        if nonfinite not in ("skip", "raise"):
            raise ValueError(f"nonfinite must be 'skip' or 'raise', got {nonfinite!r}")
        if isinstance(backend, str) and backend not in ("auto", "torch", "kernels"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'kernels', got {backend!r}")
        if not isinstance(backend, str) and not all(callable(getattr(backend, f, None)) for f in BACKEND_FUNCTIONS):
            raise TypeError(f"a backend object must provide {', '.join(BACKEND_FUNCTIONS)}, got {backend!r}")
        if not (isinstance(seed, int) and 0 <= seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2^64), got {seed!r}")
        self.precision = precision
        self.seed = seed  # the user seed of the stochastic rounding stream (bf16-sr)
        self.max_grad_norm = max_grad_norm
        self.clipping = clipping if max_grad_norm is not None else None
        self.accumulation_steps = int(accumulation_steps)
        self.nonfinite = nonfinite
        self.backend = backend
        super().__init__(params, defaults)
        self._init_step_state()

    def _init_step_state(self):
        self._recs: dict[torch.Tensor, _Rec] = {}  # parameters updated in backward
        self._passive: list[torch.Tensor] = []  # trainable model parameters this optimizer does not hold
        self._grad_reducer = None  # set by forge_num.distributed.prepare_data_parallel
        # plain mode: (weak reference, version) of each .grad consumed by the last step(); a weak
        # reference, not id(): a new .grad can take a freed one's address, hence its id
        self._grad_seen: dict = {}
        self._mode = "idle"  # idle | norm | update | skip
        self._norms: list[tuple] = []  # (parameter, fp32 norm of its local gradient) of the norm pass
        self._stash: dict[torch.Tensor, torch.Tensor | None] = {}
        self._coef: torch.Tensor | None = None  # clipping coefficient of the current step
        self._coef_float: float | None = None
        self._skip_step = False
        # this step's telemetry records, one per update: (Σ g² partials fp64, non-finite count partials)
        self._parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._scalars_memo: dict[tuple, tuple[float, ...]] = {}  # (rule, step, hyper values) -> h, per step
        # ((seed, step), emulator.philox.step_key(seed, step)) of the last step whose keys were derived
        self._step_key_memo: tuple | None = None
        self._bad_names: list[str] = []
        self._stat_params: list[torch.Tensor] = []  # the parameter of each telemetry record
        self._max_events = 0
        self._global_step = 0
        self._prev_norm_value: float | None = None
        self._stats_history: list[dict] = []
        # the last step's telemetry while its totals are still on their way from the device: (the
        # stats dict to complete, the totals [sum of squares, non-finite count] as fp64, the event
        # after their copy to the host or None); completed and added to the history at first use
        # (_resolve_stats)
        self._stats_pending: tuple[dict, torch.Tensor, object] | None = None
        self._totals_host: dict[torch.device, torch.Tensor] = {}  # a pinned [2] fp64 buffer per device
        # None, or the step slots every update's launch reads its scalars from (_StepSlots; a captured
        # step's, forge_num.graphs)
        self._slots: _StepSlots | None = None
        # set by forge_num.capture_step for every step of the optimizer from then on: the paths that read
        # the device on the host (the tied head's token sort) take their capturable twins, so that the
        # eager warm-up steps and the replays take the same paths
        self._capturable = False

    # ---------------------------------------------------------------------------------------
    # Groups, hyper-parameters, state
    # ---------------------------------------------------------------------------------------

    def _add_param_group_checked(self, param_group: dict) -> None:
        torch.optim.Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        self._check_group(group)
        want = _WEIGHT_DTYPE[self.precision]
        for p in group["params"]:
            if self.precision == "8bit" and _is_sharded(p):
                # 8-bit states are laid out for the whole parameter, and a quantization block may
                # straddle a shard boundary (proofs/distributed.md, stochastic regimes)
                raise NotImplementedError(
                    f"{type(self).__name__}(precision='8bit') on a sharded DTensor parameter (placements "
                    f"{tuple(p.placements)}) is not supported yet: its block-wise states are laid out for "
                    "the whole parameter; use precision='bf16-sr' or 'fp32' under tensor parallelism or FSDP2"
                )
            if self.precision == "bf16-sr" and _is_sharded(p):
                from forge_num.distributed import shard_counter

                shard_counter(p)  # raises for a sharding whose counters are not supported
            if p.dtype != want:
                hint = ("Keep the weights in fp32 (use torch.autocast for bf16 compute)." if want == torch.float32
                        else "Convert the model with model.to(torch.bfloat16).")
                raise TypeError(
                    f"{type(self).__name__}(precision={self.precision!r}) keeps {str(want).removeprefix('torch.')} "
                    f"weights; a parameter of shape {tuple(p.shape)} has dtype {p.dtype}. {hint}"
                )

    def _check_group(self, group: dict) -> None:
        for key, allowed in self._UNSUPPORTED.items():
            if key in group and group[key] not in allowed:
                raise NotImplementedError(
                    f"forge_num.{type(self).__name__} does not support {key}={group[key]!r} "
                    f"(allowed: {', '.join(map(repr, allowed))})"
                )
        if group.get("capturable", False):
            raise NotImplementedError(
                f"forge_num.{type(self).__name__} does not support capturable=True (CUDA graphs)"
            )
        if group.get("amsgrad", False):
            raise NotImplementedError(f"forge_num.{type(self).__name__} does not support amsgrad=True")
        rule = self._rule(group)
        rule.scalars(self._hyper(group), 1)  # validates the hyper-parameters (ValueError)

    def __setstate__(self, state):
        super().__setstate__(state)
        for key, value in self._GROUP_DEFAULTS.items():
            for group in self.param_groups:
                group.setdefault(key, value)

    def _rule(self, group) -> _rules.Rule:
        raise NotImplementedError

    def _hyper(self, group) -> dict:
        return group

    def _prepare_state(self, p, group):
        """(rule, h, states) for the next update of ``p``; advances the rule's step counter if it has one."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------
    # Applying updates
    # ---------------------------------------------------------------------------------------

    def _index_groups(self):
        self._group_by_param = {p: g for g in self.param_groups for p in g["params"]}
        # parameter id of the rounding stream: the parameter's position in the optimizer's groups
        self._param_id = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def _new_state(self, p):
        """A zero state tensor for ``p``: like ``p`` (fp32, bf16-sr), or 8-bit codes and block scales
        ({"codes": uint8 [rows, cols], "scales": fp32 [rows, ceil(cols / 128)]}, scales 1)."""
        if self.precision != "8bit":
            return _zeros(p)
        rows, cols = _rows_cols(p)
        return {"codes": torch.zeros((rows, cols), dtype=torch.uint8, device=p.device),
                "scales": torch.ones((rows, -(-cols // _QBLOCK)), dtype=torch.float32, device=p.device)}

    @staticmethod
    def _q8(states):
        return [_Q8(s["codes"], s["scales"]) for s in states]

    def _rounding_seed(self, p):
        """The Philox key of ``p`` in the step being taken (bf16-sr): derive_seed(seed, step, id);
        None in the fp32 regime. Steps count from 1, so a resumed run replays the same stream."""
        if self.precision == "fp32":
            return None
        step = self._global_step + 1
        memo = self._step_key_memo
        if memo is None or memo[0] != (self.seed, step):  # the step's shared links, once a step
            memo = self._step_key_memo = ((self.seed, step), step_key(self.seed, step))
        return derive_seed_of_param(memo[1], self._param_id[p])

    def add_param_group(self, param_group: dict) -> None:
        self._add_param_group_checked(param_group)
        if hasattr(self, "_recs"):
            self._index_groups()

    def _scale(self, device=None) -> float:
        """The gradient scale of this step's updates (an fp32 value as a Python float; 1.0 unclipped)."""
        if self._coef is None and self.clipping == "previous" and self._prev_norm is not None:
            self._coef = self._clip_coef_from(torch.tensor(self._prev_norm, dtype=torch.float32))
        if self._coef is None:
            return 1.0
        if self._coef_float is None:
            self._coef_float = float(self._coef)  # exact: the coefficient is an fp32 value
        return self._coef_float

    def _record(self, stats, name, p):
        # the kernels' per-tile partials, summed once for the whole step in _finish_step (no
        # reduction per launch); other backends report 0-d totals
        parts = getattr(stats, "partials", None)
        self._parts.append(parts if parts is not None else (stats.norm_sq.reshape(1), stats.nonfinite.reshape(1)))
        self._bad_names.append(name)
        self._stat_params.append(p)

    def _apply_elementwise(self, p, grad, name):
        group = self._group_by_param[p]
        if _is_dtensor(grad):  # a DTensor parameter: reduce a Partial gradient, then work on the local shard
            from forge_num.distributed import local_grad

            grad = local_grad(p, grad)
        rule, h, states = self._prepare_state(p, group)
        backend = _backend_for(p, self.backend)
        rows, cols = _rows_cols(p)
        grad = grad.contiguous()
        counter_kw = self._counter_kw(p)
        if self.precision != "8bit" and (counter_kw or grad.dtype == torch.float32
                                         or grad.numel() <= _WIDEN_CHUNK_ELEMENTS):
            seed = self._rounding_seed(p)
            stats = backend.elementwise_update(
                _local(p.detach()), grad.float(), [_local(s) for s in states], rule, h,
                grad_scale=self._scale(), seed=seed, **counter_kw, **self._slot_kw(p, h, seed),
            )
            self._record(stats, name, p)
            return
        # 8bit (whole quantization blocks along rows), or a large bf16 gradient (bf16-sr): in row chunks
        update = _RowUpdater(self, p, name, rule, h, states, backend)
        _update_in_widened_row_chunks(grad.view(rows, cols), update.rows)

    def _start_row_updates(self, p, in_flight) -> "_RowUpdater":
        """The rule's update of ``p`` applied piece by piece (a tied head split between its backward and
        the embedding's: forge_num.fused): counts the event, advances the step once, and returns the
        updater, whose ``done()`` ends it once every row is updated. ``in_flight`` (with a ``finish(None,
        -1)``) is kept until then, so that step() can complete an update a failed backward left open."""
        rec = self._recs[p]
        self._next_event(p, rec)
        rule, h, states = self._prepare_state(p, self._group_by_param[p])
        rec.in_flight = in_flight
        return _RowUpdater(self, p, rec.name, rule, h, states, _backend_for(p, self.backend))

    def _may_split_rows(self, p) -> bool:
        """What _can_split_rows can say before the backward (an embedding's forward asks it: whether
        to sort its tokens for a split now): this micro-batch the step's last with no gradient from
        earlier ones, no data-parallel reduction, an unsharded parameter. (In a captured step's optimizer
        the split keeps a fixed number of rows: forge_num.fused._StaticTokenRows.) In every regime since
        session 47 (the fp32 regime's too: bench/NOTES.md, v51)."""
        rec = self._recs.get(p)
        return (rec is not None and rec.events + 1 == self.accumulation_steps
                and rec.accum is None and p.grad is None and self._grad_reducer is None and not _is_dtensor(p))

    def _can_split_rows(self, p) -> bool:
        """Whether this backward's update of ``p`` may be applied in pieces by rows from its gradient's
        pieces (forge_num.fused's tied head): a pass that updates (not the norm pass, not a skipped
        step), the step's last micro-batch with no gradient from earlier ones, no data-parallel
        reduction, an unsharded parameter (_may_split_rows, with the pass known)."""
        return self._mode in ("idle", "update") and self._may_split_rows(p)

    def _apply_linear(self, p, x, dy, accum, name):
        group = self._group_by_param[p]
        rule, h, states = self._prepare_state(p, group)
        backend = _backend_for(p, self.backend)
        states = self._q8(states) if self.precision == "8bit" else [_local(s) for s in states]
        seed = self._rounding_seed(p)
        stats = backend.fused_linear_update(
            _local(p.detach()), x, dy, states, rule, h, grad_scale=self._scale(),
            accum=accum, seed=seed, **self._counter_kw(p), **self._slot_kw(p, h, seed),
        )
        self._record(stats, name, p)

    def _slot_kw(self, p, h, seed) -> dict:
        """``step_slot=`` of p's update where the launches read their scalars from step slots (their
        row written here: the values passed beside it), nothing otherwise."""
        if self._slots is None:
            return {}
        return {"step_slot": self._slots.write(p, h, self._scale(), seed)}

    def _prepare_replayed_updates(self, updates: list) -> None:
        """The host's part of a captured step's updates (``updates``: the parameters the graph updates,
        in the order the capture updated them), before its replay: what each update's launch does to the
        optimizer in an eager backward (the rule's step counter advanced, _prepare_state; the scalars
        checked as the launcher checks them) and its scalars written into its slot. If anything raises
        (a hyper-parameter a scheduler made invalid), every counter is put back and the step's fields
        reset: no parameter is left a step ahead of the others."""
        from forge_num.kernels import _check_scalars

        slots = self._slots
        saved = self._host_counters(updates)
        slots.defer = True  # uploaded at once before the replay
        try:
            for p in updates:
                rule, h, _ = self._prepare_state(p, self._group_by_param[p])
                scale = self._scale()
                _check_scalars(rule, h, scale)
                slots.write(p, h, scale, self._rounding_seed(p))
        except BaseException:
            self._restore_host_counters(saved)
            self._reset_step_fields()
            raise
        finally:
            slots.defer = False

    def _host_counters(self, params) -> dict:
        """The host scalars of ``params``' state (Adam's step counters): what an update's bookkeeping
        advances, put back by _restore_host_counters when a step is abandoned."""
        return {(p, k): v.clone() for p in params for k, v in self.state[p].items()
                if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0}

    def _restore_host_counters(self, saved: dict) -> None:
        for (p, k), v in saved.items():
            self.state[p][k].copy_(v)

    def _counter_kw(self, p) -> dict:
        """``counter=`` for a sharded parameter in a stochastic regime (its elements' indices in the
        whole parameter); nothing otherwise, so backends without the keyword keep working."""
        if self.precision == "fp32" or not _is_sharded(p):
            return {}
        from forge_num.distributed import shard_counter

        counter = shard_counter(p)
        return {} if counter is None else {"counter": counter}

    # ---------------------------------------------------------------------------------------
    # Entry points used by prepare(): the in-backward events
    # ---------------------------------------------------------------------------------------

    def _register(self, p, name):
        self._recs[p] = _Rec(name)
        self._index_groups()

    def _unregister(self, p):
        self._recs.pop(p, None)

    def _next_event(self, p, rec):
        """Count one gradient contribution; returns True if it is the last micro-batch of the step."""
        if self._mode == "idle" and self.clipping == "exact" and rec.events + 1 == self.accumulation_steps:
            raise RuntimeError(
                "forge_num: exact gradient clipping (max_grad_norm with clipping='exact') needs a norm-only "
                "backward pass before the updating one; call opt.backward(loss) instead of loss.backward() "
                "(the loss of a Hugging Face model's output does this by itself after prepare()), or use "
                "clipping='previous'"
            )
        if rec.events >= self.accumulation_steps:
            raise RuntimeError(
                f"forge_num: {rec.name} received a gradient in a new backward, but it was already "
                f"updated in backward for this step ({rec.events} backward(s) since the last "
                f"optimizer.step(), accumulation_steps={self.accumulation_steps}). Call optimizer.step() "
                "after each backward (or after every accumulation_steps micro-batches); for gradient "
                "accumulation pass accumulation_steps= to the optimizer. (A parameter used in two "
                "reentrant-checkpointed segments also shows up like this: use use_reentrant=False.)"
            )
        rec.events += 1
        self._max_events = max(self._max_events, rec.events)
        return rec.events == self.accumulation_steps

    def _on_linear_grad(self, p, x, dy):
        """The fused path: dW = dyᵀx of one (single-use) linear weight, [M, N] = p's layout."""
        rec = self._recs[p]
        rec.fused_now = True
        if self._mode == "norm":
            rec.norm_seen = True
            backend = _backend_for(p, self.backend)
            n2 = backend.weight_grad_norm_sq(x, dy, accum=self._earlier(p, rec, self._stash.get(p)))
            self._norms.append((p, n2.sqrt().to(torch.float32)))
            return
        last = self._next_event(p, rec)
        if not last:
            if rec.accum is None:
                # -0.0 is the identity of IEEE addition: -0.0 + d == d bitwise, so the first
                # accumulation equals torch assigning the first .grad.
                rec.accum = torch.full_like(
                    _local(p.detach()), -0.0, dtype=torch.float32, memory_format=torch.contiguous_format
                )
                if p.grad is not None:  # an earlier micro-batch took the materialized path
                    rec.accum.add_(p.grad)
                    p.grad = None
            _backend_for(p, self.backend).accumulate_weight_grad(x, dy, rec.accum)
            return
        accum = self._earlier(p, rec, p.grad)
        rec.accum = None
        p.grad = None
        if self._mode == "skip":
            return
        self._apply_linear(p, x, dy, accum, rec.name)
        rec.updated = True

    @staticmethod
    def _earlier(p, rec, grad):
        """The gradient of earlier micro-batches (buffer and/or .grad) as one fp32 tensor, or None."""
        if grad is None:
            return rec.accum
        if rec.accum is None:
            return grad.contiguous()
        return torch.add(rec.accum, grad)

    def _on_grad_ready(self, p):
        """The hook path: p.grad holds autograd's (summed) gradient of this backward."""
        rec = self._recs[p]
        if rec.fused_now or p.grad is None:
            rec.fused_now = False
            return  # torch runs the hook even where the fused layer returned no gradient for p
        if self._mode == "norm":
            rec.norm_seen = True
            old = self._stash.get(p)
            total = p.grad if old is None else old + p.grad
            if rec.accum is not None:
                total = rec.accum + total
            if self._grad_reducer is not None:  # data parallel: the norm of the averaged gradient
                total = self._grad_reducer(p, total)  # (total is never the stash: in place is safe)
            self._norms.append((p, self._grad_norm(p, total)))
            p.grad = None  # restored from the stash after the norm pass
            return
        last = self._next_event(p, rec)
        if not last:
            return  # autograd keeps accumulating .grad, as torch does
        grad = p.grad
        if rec.accum is not None:
            grad = torch.add(rec.accum, grad)
            rec.accum = None
        p.grad = None
        if self._grad_reducer is not None:  # data parallel (forge_num.distributed): all-reduce first
            grad = self._grad_reducer(p, grad)
        if self._mode == "skip":
            return
        self._apply_elementwise(p, grad, rec.name)
        rec.updated = True

    # ---------------------------------------------------------------------------------------
    # Clipping passes
    # ---------------------------------------------------------------------------------------

    def _clip_coef_from(self, total_norm: torch.Tensor) -> torch.Tensor:
        # The operations of torch.nn.utils.clip_grad_norm_ (torch 2.13), on an fp32 0-d tensor.
        clip_coef = self.max_grad_norm / (total_norm + 1e-6)
        return torch.clamp(clip_coef, max=1.0)

    def _grad_norm(self, p, g) -> torch.Tensor:
        """The fp32 norm of ``p``'s gradient on this rank: a DTensor's local shard, after a Partial
        gradient is reduced to ``p``'s placements (so a replicated parameter's norm is its whole norm)."""
        if _is_dtensor(g):
            from forge_num.distributed import local_grad

            g = local_grad(p, g)
        return torch.linalg.vector_norm(g, 2.0)

    def _total_norm(self, norms: list[tuple]) -> torch.Tensor:
        """The global norm from (parameter, norm) pairs: the norm of the per-parameter norms taken in
        the optimizer's parameter order (as ``clip_grad_norm_`` stacks them in the order it is given);
        with sharded DTensor parameters, their shards' norms are combined across ranks first
        (``forge_num.distributed.global_total_norm``)."""
        if not norms:
            return torch.zeros((), dtype=torch.float32)
        norms = sorted(norms, key=lambda pn: self._param_id[pn[0]])
        if any(_is_sharded(p) for p, _ in norms):
            from forge_num.distributed import global_total_norm

            return global_total_norm(norms)
        device = norms[0][1].device
        return torch.linalg.vector_norm(torch.stack([n.to(device) for _, n in norms]), 2.0)

    def _run_backward(self, run) -> None:
        """run(retain_graph) runs one backward of the current loss; the passes of one micro-batch."""
        if self._mode != "idle":
            run(self._mode == "norm")  # nested (a wrapped loss inside opt.backward): one pass of the outer
            return
        last = self._max_events + 1 >= self.accumulation_steps
        try:
            if self._recs and self.clipping == "exact" and last:
                self._mode = "norm"
                for rec in self._recs.values():
                    rec.norm_seen = False
                for p in [*self._recs, *self._passive]:
                    if p.grad is not None:
                        self._stash[p] = p.grad
                        p.grad = None
                self._norms = []
                try:
                    run(True)
                    # parameters this micro-batch did not reach still carry earlier micro-batches' gradient
                    for p, rec in self._recs.items():
                        if not rec.norm_seen:
                            g = self._pending_total(p, rec)
                            if g is not None:
                                if self._grad_reducer is not None:  # data parallel: averaged first
                                    g = self._grad_reducer(p, g.clone())
                                self._norms.append((p, self._grad_norm(p, g)))
                finally:
                    for p in [*self._recs, *self._passive]:  # the norm pass leaves no gradient behind
                        p.grad = self._stash.pop(p, None)
                total = self._total_norm(self._norms)
                self._norms = []
                if torch.isfinite(total):
                    self._coef = self._clip_coef_from(total)
                    self._mode = "update"
                else:
                    self._skip_step = True
                    self._mode = "skip"
                run(False)
            else:
                self._mode = "update"
                run(False)
        finally:
            self._mode = "idle"

    def _pending_total(self, p, rec):
        g = p.grad
        if rec.accum is not None:
            g = rec.accum if g is None else torch.add(rec.accum, g)
        return g

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss.backward()``, with the norm-only pass first when exact clipping needs it."""
        if kwargs.get("retain_graph") or kwargs.get("create_graph"):
            raise ValueError("opt.backward(loss) does not take retain_graph/create_graph")
        self._run_backward(lambda retain: loss.backward(retain_graph=retain, **kwargs))

    # ---------------------------------------------------------------------------------------
    # step()
    # ---------------------------------------------------------------------------------------

    def _grad_consumed(self, p) -> bool:
        """Whether p.grad is the tensor the last step() consumed, unmodified since (same version)."""
        seen = self._grad_seen.get(p)
        return seen is not None and seen[0]() is p.grad and seen[1] == p.grad._version

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._index_groups()
        prepared = bool(self._recs)
        for rec in self._recs.values():
            if rec.in_flight is not None:
                # a split update whose second half never ran (a backward that failed or stopped between
                # the tied head's backward and the embedding's): its touched rows take the head's
                # gradient alone, as its other rows did
                rec.in_flight.finish(None, -1)
        pending = [(p, rec) for p, rec in self._recs.items() if rec.events and not rec.updated]
        plain = [
            p for g in self.param_groups for p in g["params"] if p not in self._recs and p.grad is not None
        ]
        # A .grad that is the same tensor, unmodified, as at the last step() came from no new backward.
        fresh = [p for p in plain if not self._grad_consumed(p)]
        if self._max_events == 0 and not fresh:
            what = (
                "no parameter of the prepared model received a gradient"
                if prepared
                else "every .grad is the one the last step() consumed"
                if plain
                else "no parameter has a .grad"
            )
            raise RuntimeError(
                f"forge_num: optimizer.step() was called but no backward ran since the last step ({what}). "
                "Call loss.backward() (or opt.backward(loss)) before each optimizer.step()."
            )
        # a parameter absent from the last micro-batch(es), or an early step(): its pending gradient
        # (data parallel: averaged across ranks first, in the same order on every rank)
        pending_grads = {p: self._pending_total(p, rec) for p, rec in pending}
        if self._grad_reducer is not None:
            pending_grads = {p: self._grad_reducer(p, g) for p, g in pending_grads.items()}
        if self._coef is None and self.clipping == "exact" and not self._skip_step and (plain or pending):
            # plain mode, or a step() before the last micro-batch: every gradient is materialized here
            norms = [(p, self._grad_norm(p, p.grad)) for p in plain]
            norms += [(p, self._grad_norm(p, g)) for p, g in pending_grads.items()]
            total = self._total_norm(norms)
            if torch.isfinite(total):
                self._coef = self._clip_coef_from(total)
            else:
                self._skip_step = True
        if not self._skip_step:
            for p, rec in pending:
                self._apply_elementwise(p, pending_grads[p], rec.name)
            where = {
                p: f"param_groups[{i}]['params'][{j}]"
                for i, g in enumerate(self.param_groups)
                for j, p in enumerate(g["params"])
            }
            for p in plain:
                self._apply_elementwise(p, p.grad, where[p])
        for p, rec in pending:
            rec.accum = None
            p.grad = None
        self._grad_seen = {p: (weakref.ref(p.grad), p.grad._version) for p in plain}
        self._finish_step()
        return loss

    # ---------------------------------------------------------------------------------------
    # Telemetry: the step's totals, read from the device only when asked for
    # ---------------------------------------------------------------------------------------

    @property
    def stats(self) -> dict | None:
        """The last step's telemetry (reading it waits for that step's totals, not for later work)."""
        self._resolve_stats()
        return self._stats_history[-1] if self._stats_history else None

    @property
    def stats_history(self) -> list[dict]:
        self._resolve_stats()
        return self._stats_history

    @property
    def _prev_norm(self) -> float | None:
        """The last finite global gradient norm (clipping="previous"; saved in the state dict)."""
        self._resolve_stats()
        return self._prev_norm_value

    @_prev_norm.setter
    def _prev_norm(self, value: float | None) -> None:
        self._resolve_stats()
        self._prev_norm_value = value

    def _resolve_stats(self) -> None:
        """Completes the pending step's telemetry from its totals (waiting for their copy if needed) and
        adds it to the history."""
        if self._stats_pending is None:
            return
        stats, totals, copied = self._stats_pending
        self._stats_pending = None
        if copied is not None:
            copied.synchronize()  # the event after the totals' copy: that step's work only
        sum_sq, nonfinite = totals.tolist()
        stats["grad_norm"] = math.sqrt(sum_sq)
        stats["nonfinite"] = int(nonfinite)
        self._stats_history.append(stats)
        if math.isfinite(stats["grad_norm"]):
            self._prev_norm_value = stats["grad_norm"]

    def _summed_partials(self) -> torch.Tensor:
        """[sum of squares, non-finite count] of the step's partials as fp64, summed on their device."""
        dev = self._parts[0][0].device
        return torch.stack(
            [
                torch.cat([n.to(dev, torch.float64) for n, _ in self._parts]).sum(),
                torch.cat([b.to(dev) for _, b in self._parts]).sum(dtype=torch.int64).to(torch.float64),
            ]
        )

    def _step_totals(self, summed: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
        """[sum of squares, non-finite count] of the step's partials as fp64, summed on their device at
        once (or ``summed``, a captured step's sum, on a CUDA device), and the event after their copy to
        a pinned host buffer (None where they are on the host): no wait for the device here, so a
        training loop's host can issue the next step meanwhile."""
        if summed is None and any(_is_sharded(p) for p in self._stat_params):
            # sharded parameters: their shards' sums added across ranks, replicated ones counted once
            from forge_num.distributed import global_step_totals

            return global_step_totals(self._stat_params, [n.sum() for n, _ in self._parts],
                                      [b.sum(dtype=torch.int64) for _, b in self._parts]), None  # on the host
        totals = self._summed_partials() if summed is None else summed
        dev = totals.device
        if dev.type != "cuda":
            return totals.cpu(), None
        host = self._totals_host.get(dev)
        if host is None:  # reused every step: the previous step's totals were read before this copy
            host = self._totals_host[dev] = torch.empty(2, dtype=torch.float64, pin_memory=True)
        host.copy_(totals, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(dev))
        return host, copied

    def _finish_step(self, summed: torch.Tensor | None = None):
        """The step's end: its telemetry, the step count, the per-step fields reset. ``summed``: the
        step's totals already summed on the device (a captured step's, whose partials are the graph's)."""
        self._resolve_stats()  # the previous step's (its pinned buffer is reused below)
        # before any state changes: the sharded totals run collectives, which may raise
        totals = self._step_totals(summed) if self._parts or summed is not None else None
        self._global_step += 1
        clip_coef = self._coef_float  # a Python float once the updates read it (an fp32 value)
        if clip_coef is None and self._coef is not None:
            clip_coef = float(self._coef)
        stats = {
            "step": self._global_step,
            "grad_norm": None,
            "nonfinite": 0,
            "clip_coef": clip_coef,
            "skipped": self._skip_step,
        }
        bad_names = []
        if totals is None:  # nothing was updated: no totals to wait for
            self._stats_history.append(stats)
        else:
            self._stats_pending = (stats, *totals)
            if self.nonfinite == "raise":  # the counts are needed now
                self._resolve_stats()
                if stats["nonfinite"]:
                    bad_counts = [int(b.sum()) for _, b in self._parts]
                    bad_names = [n for n, c in zip(self._bad_names, bad_counts) if c]
        nonfinite = stats["nonfinite"]
        skipped = self._skip_step
        self._reset_step_fields()
        if self.nonfinite == "raise" and (nonfinite or skipped):
            if skipped:
                raise FloatingPointError(
                    f"forge_num: step {self._global_step} had a non-finite global gradient norm (found by "
                    "the "
                    "exact-clipping norm pass); the whole update was skipped, weights and state are unchanged"
                )
            bad_names = list(dict.fromkeys(bad_names))  # a parameter updated in row chunks is named once
            where = f" in {', '.join(bad_names[:5])}" if bad_names else ""
            raise FloatingPointError(
                f"forge_num: step {self._global_step} had {nonfinite} non-finite gradient element(s){where}; "
                "those elements of the weights and optimizer state were left unchanged"
            )

    def _reset_step_fields(self) -> None:
        """What a step accumulates, back to a new step's (the end of step(); an abandoned capture)."""
        for rec in self._recs.values():
            rec.events = 0
            rec.updated = False
            rec.accum = None
            rec.in_flight = None
        self._max_events = 0
        self._coef = None
        self._coef_float = None
        self._skip_step = False
        self._parts, self._bad_names, self._stat_params = [], [], []
        self._scalars_memo.clear()

    # ---------------------------------------------------------------------------------------
    # Checkpoints
    # ---------------------------------------------------------------------------------------

    def state_dict(self):
        sd = super().state_dict()
        sd["forge_num"] = {"global_step": self._global_step, "prev_norm": self._prev_norm,
                           "precision": self.precision, "seed": self.seed, "stream": STREAM_REVISION}
        return sd

    def load_state_dict(self, state_dict):
        extra = state_dict.get("forge_num", {})
        state_dict = {k: v for k, v in state_dict.items() if k != "forge_num"}
        if any(rec.events for rec in getattr(self, "_recs", {}).values()):
            raise RuntimeError("forge_num: load_state_dict() in the middle of a step; call step() first")
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            self._check_group(group)
        for state in self.state.values():
            if "step" in state and not torch.is_tensor(state["step"]):
                state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32)
            for value in state.values():  # 8bit: torch casts every state tensor to the parameter's dtype
                if isinstance(value, dict) and "scales" in value:
                    value["scales"] = value["scales"].to(torch.float32)  # exact: powers of two and NaN
                    value["codes"] = value["codes"].to(torch.uint8)  # exact: integers 0..255 in bf16
        if extra.get("precision", self.precision) != self.precision or extra.get("seed", self.seed) != self.seed:
            raise ValueError(
                f"this checkpoint was written with precision={extra.get('precision')!r}, seed={extra.get('seed')!r}; "
                f"the optimizer has precision={self.precision!r}, seed={self.seed!r} (the rounding stream would differ)")
        written = extra.get("stream", 1)  # checkpoints from before the revision was written: revision 1
        if self.precision == "8bit" and extra and written != STREAM_REVISION:
            warnings.warn(f"forge_num: this checkpoint was written with random stream revision {written}, this "
                          f"version draws revision {STREAM_REVISION} (the 8bit regime's Philox table, "
                          "emulator/philox.py): the resumed run is as valid, but not bit for bit the run the "
                          "writing version would have continued", stacklevel=2)
        self._global_step = int(extra.get("global_step", 0))
        self._prev_norm = extra.get("prev_norm")
        self._index_groups()  # torch's load_state_dict replaces the group dicts


# --------------------------------------------------------------------------------------------
# The four optimizers
# --------------------------------------------------------------------------------------------


def _zeros(p):
    return torch.zeros_like(p, memory_format=torch.preserve_format)


class Adam(ForgeOptimizer):
    """Adam (L2 weight decay), as ``torch.optim.Adam(foreach=False)`` with an IEEE square root.

    ``decoupled_weight_decay=True`` makes it AdamW, as in torch.
    """

    _GROUP_DEFAULTS = {
        "amsgrad": False,
        "maximize": False,
        "foreach": None,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "decoupled_weight_decay": False,
    }

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
        **options,
    ):
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults, **options)

    def _rule(self, group):
        return _rules.ADAMW if group.get("decoupled_weight_decay", False) else _rules.ADAM

    def _prepare_state(self, p, group):
        state = self.state[p]
        if len(state) == 0:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = self._new_state(p)
            state["exp_avg_sq"] = self._new_state(p)
        step_t = state["step"]
        # in place, as torch's `step_t += 1`: the counter advances before the update. A fill with the
        # value read plus one (exact in a Python float below 2^53) stores the same rounding, RN(step + 1)
        # in the tensor's dtype, and costs the host less than the add (4.8 against 7.6 us a call in
        # bench/host_time.py --part cpu-step's step: the add's tensor-iterator set-up for one element)
        step_t.fill_(step_t.item() + 1)
        rule = self._rule(group)
        step = int(step_t.item())
        # h depends on the rule, the step and these four values only (rules._adam_scalars): every
        # layer of a group shares one computation per step. Python numbers only (a tensor lr can
        # change in place under the same hash).
        key = (rule.name, step, group["lr"], *group["betas"], group["eps"], group.get("weight_decay", 0.0))
        if set(map(type, key[2:])) <= _PYTHON_NUMBERS:
            h = self._scalars_memo.get(key)
            if h is None:
                h = self._scalars_memo[key] = rule.scalars(group, step)
        else:
            h = rule.scalars(group, step)
        return rule, h, [state["exp_avg"], state["exp_avg_sq"]]


class AdamW(Adam):
    """AdamW (decoupled weight decay), as ``torch.optim.AdamW(foreach=False)`` with an IEEE square root."""

    _GROUP_DEFAULTS = {**Adam._GROUP_DEFAULTS, "decoupled_weight_decay": True}

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        **kwargs,
    ):
        if kwargs.pop("decoupled_weight_decay", True) is not True:
            raise ValueError("AdamW has decoupled weight decay; use forge_num.Adam for L2 weight decay")
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, decoupled_weight_decay=True, **kwargs)


class SGD(ForgeOptimizer):
    """SGD with momentum, dampening, Nesterov and L2 weight decay, as ``torch.optim.SGD(foreach=False)``."""

    _GROUP_DEFAULTS = {"maximize": False, "foreach": None, "differentiable": False, "fused": None}

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
        **options,
    ):
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=foreach,
            differentiable=differentiable,
            fused=fused,
        )
        super().__init__(params, defaults, **options)

    def _rule(self, group):
        return _rules.SGD

    def _prepare_state(self, p, group):
        rule = _rules.SGD
        if rule.state_slots(group) == 0:
            return rule, rule.scalars(group, 1), []
        state = self.state[p]
        first = "momentum_buffer" not in state or state["momentum_buffer"] is None
        if first:
            state["momentum_buffer"] = self._new_state(p)  # the rule sets it to the gradient (torch: clone(grad))
        return rule, rule.scalars(group, 1 if first else 2), [state["momentum_buffer"]]


class Lion(ForgeOptimizer):
    """Lion (Chen et al. 2023) as the reference implementation lion-pytorch computes it."""

    _GROUP_DEFAULTS = {}
    _UNSUPPORTED = {}

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        **options,
    ):
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay), **options)

    def _rule(self, group):
        return _rules.LION

    def _prepare_state(self, p, group):
        state = self.state[p]
        if len(state) == 0:
            state["exp_avg"] = self._new_state(p)
        return _rules.LION, _rules.LION.scalars(group, 1), [state["exp_avg"]]
