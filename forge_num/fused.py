"""prepare(model, optimizer): move every parameter update of a model into its backward pass.

* Every ``nn.Linear`` (and transformers' GPT-2 ``Conv1D``, whose weight is stored [in, out]) whose
  weight the optimizer trains becomes a *fused layer*: the module keeps its class (a subclass of it
  is swapped in), its Parameter objects, names and state_dict keys; its forward is an autograd
  Function whose backward computes ``dX = dY·W`` with the pre-update W and then hands ``(X, dY)`` to
  the optimizer, which applies the rule to W from ``dW = dYᵀX`` block by block (the Triton kernel on
  CUDA, ``forge_num.torch_backend`` elsewhere): no weight gradient is materialized. The bias gradient
  (``dY`` summed over tokens) goes to autograd and the element-wise path.
* Every other trainable parameter the optimizer holds gets a post-accumulate-grad hook that applies
  the element-wise update and frees ``.grad`` at once. Frozen parameters are untouched.
* A parameter used more than once in a step takes the *materialized path*, for that parameter only:
  its layer returns ``dW`` to autograd, which sums all uses, and the hook applies the rule once after
  the last use. Tied weights (one Parameter in two modules, e.g. embedding and LM head) are found at
  prepare() time and those Linear modules are left as they are; a fused module called twice is found
  when its backward runs (two live uses of one weight in the graph). Where the tied head's dW comes
  from ``forge_num.linear_cross_entropy``, the embedding (``handle.tied_rows``) adds only the rows of
  its tokens into it in place (``_TiedRows``): autograd's sum bit for bit, without the embedding's
  dense [V, H] gradient beside the head's. Where a step is one micro-batch (in every regime since
  session 47) the tied weight's update is split by rows instead (``_SplitHeadUpdate``): the rows its
  tokens do not touch are updated in the head's backward, block by block as the loss hands it dY's
  slabs, the touched rows in the embedding's: no [V, H] gradient, nor dY, at all.
* Under FSDP2 (``fully_shard``) the Linear layers of FSDP2-managed weights stay unfused (FSDP2
  reduce-scatters their dW first) and every parameter is updated on its local shard in the hook that
  FSDP2 calls after the reduce-scatter (forge_num.distributed); ``handle.sharded`` names them.
* Under ``torch.autocast`` the layer computes its output and dX in the autocast dtype exactly as
  ``F.linear`` does, and dW in fp32 from the low-precision X and dY: never rounded to bf16, whereas
  torch's autocast rounds its dW to bf16 before the cast back to fp32 (so there the two differ, by
  design; in fp32 they are bitwise equal).
* Gradient checkpointing (Hugging Face's, ``use_reentrant=False`` by default, and reentrant) works:
  recomputed forwards are never counted as uses. Limitation: a fused module called in two different
  *reentrant* checkpointed segments is seen as two backwards (an error says so).

``unprepare(model)`` (or ``handle.remove()``) restores the modules and removes the hooks.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from forge_num.optim import ForgeOptimizer

__all__ = ["prepare", "unprepare", "PreparedHandle"]

_RUNTIME: "weakref.WeakKeyDictionary[nn.Module, _Layer]" = weakref.WeakKeyDictionary()
# (original class, forward) -> the subclass prepare() swaps in, one per pair: module classes keep
# their names' prefix, their Parameters and state_dict keys; unprepare() swaps the original back
_SWAPPED_CLASSES: dict[tuple[type, object], type] = {}


# --------------------------------------------------------------------------------------------
# Use tracking: how many live graph nodes use one weight
# --------------------------------------------------------------------------------------------


class _Group:
    """The uses of one weight that are alive in the autograd graph at the same time."""

    __slots__ = ("multi", "__weakref__")

    def __init__(self):
        self.multi = None  # decided at the first backward of the group, then fixed


class _Use:
    __slots__ = ("group", "done", "__weakref__")

    def __init__(self, group):
        self.group = group
        self.done = False


class _Layer:
    """What a fused module needs at run time."""

    def __init__(self, opt: ForgeOptimizer, layout: str):
        self.opt = opt
        self.layout = layout  # "linear": weight [out, in]; "conv1d": weight [in, out]
        # Weak references to this layer's uses that may still be pending: a use drops out once
        # backwarded (done) or once its graph is freed (dead). A list of weakrefs pruned on each read,
        # not a WeakSet: iterating a WeakSet of one or two uses cost ~7 us a call on this machine's
        # CPU (its iteration guard), on every fused forward and every backward.
        self._uses: list[weakref.ref] = []

    def pending_uses(self) -> list[_Use]:
        """The uses alive and not yet backwarded, oldest first; the others are dropped."""
        refs, pending = [], []
        for ref in self._uses:
            u = ref()
            if u is not None and not u.done:
                refs.append(ref)
                pending.append(u)
        self._uses = refs
        return pending

    def new_use(self) -> _Use:
        pending = self.pending_uses()
        group = pending[0].group if pending else _Group()
        use = _Use(group)
        self._uses.append(weakref.ref(use))
        return use

    def materialize(self, use: _Use) -> bool:
        group = use.group
        if group.multi is None:
            # A recomputed forward (activation checkpointing) made its own, already freed, nodes:
            # only uses still alive and not yet backwarded count.
            group.multi = sum(1 for u in self.pending_uses() if u.group is group) > 1
        return group.multi


# --------------------------------------------------------------------------------------------
# The fused layer
# --------------------------------------------------------------------------------------------


def _autocast_dtype(device_type: str):
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _autocast_operands(x, weight, bias):
    """(dt, x, weight, bias) as the layer computes with them: cast to the autocast dtype dt where
    autocast is on (as F.linear would), unchanged with dt None otherwise."""
    dt = _autocast_dtype(x.device.type)
    if dt is None:
        return None, x, weight, bias
    return dt, x.to(dt), weight.to(dt), bias.to(dt) if bias is not None else None


def _plain_forward(layout, x, weight, bias):
    if layout == "linear":
        return F.linear(x, weight, bias)
    size_out = x.size()[:-1] + (weight.shape[1],)
    return torch.addmm(bias, x.view(-1, x.size(-1)), weight).view(size_out)


def _cast_weight_is_free_to_keep() -> bool:
    """Whether a fused layer may keep its bf16 weight for dX without holding memory: inside a
    checkpointed segment. A plain forward does not keep it: that would hold 2 bytes per parameter
    until the backward, the autocast weight cache fused layers avoid, so its backward casts again.

    * Non-reentrant checkpointing: the first forward packs its saved tensors with
      torch.utils.checkpoint's hook, which keeps none of them, and the recomputed forward (under its
      recomputation hook) must save exactly what the first one saved: both keep it. A saved-tensor
      hook of the user's own on top (save_on_cpu inside the segment) makes both keep nothing.
    * Reentrant checkpointing: the first forward runs without a graph; the recomputed one runs
      inside the backward with no saved-tensor hook, and its graph is backwarded at once.
    The kept cast lives until this layer's backward, next, and equals weight.to(dt) then: W changes
    only in its own layer's backward, after dX. One cast of every weight per step fewer under
    checkpointing. If a torch version moves these private functions or renames the hooks, the
    check is False and the backward casts again: slower, never different."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
        inside_backward = torch._C._current_autograd_node() is not None
    except (AttributeError, RuntimeError, TypeError):
        return False
    if hooks is None:
        return inside_backward
    return _are_checkpoint_hooks(hooks)


def _are_checkpoint_hooks(hooks) -> bool:
    """Whether saved-tensor hooks are non-reentrant checkpointing's (its first forward's or its recomputation's)."""
    return getattr(hooks[0], "__qualname__", "").startswith(("_checkpoint_hook.", "_recomputation_hook."))


def _in_non_reentrant_checkpoint() -> bool:
    """Whether this forward packs its saved tensors with non-reentrant checkpointing's hooks (False where
    the private function is gone: the fused layer then takes its one-node form, slower, never different)."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except (AttributeError, RuntimeError, TypeError):
        return False
    return hooks is not None and _are_checkpoint_hooks(hooks)


def _save_operands(ctx, x, weight, layer, use):
    """(dt, xc, wc): a fused layer's input and weight as it computes with them (_autocast_operands),
    saved for its backward with the bf16 weight where that costs no memory, and the backward's context."""
    dt, xc, wc, _ = _autocast_operands(x, weight, None)
    if dt is not None and _cast_weight_is_free_to_keep():
        ctx.save_for_backward(xc, weight, wc)
    else:
        ctx.save_for_backward(xc, weight)
    # The Parameter itself (checkpointing hands back a detached recomputed alias as the saved weight).
    ctx.param = weight
    ctx.layer, ctx.use, ctx.dt, ctx.x_dtype = layer, use, dt, x.dtype
    return dt, xc, wc


def _bias_operand(bias, dt):
    return bias.to(dt) if bias is not None and dt is not None else bias


class _FusedLinearFn(torch.autograd.Function):
    """A fused layer as one autograd node: y = x Wᵀ + b forward; dX, db and the fused update backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, use):
        dt, xc, wc = _save_operands(ctx, x, weight, layer, use)
        # every operand is in dt already, so autocast (still on in here) casts nothing: no need to
        # turn it off around the matmul (a context manager's host time, twice per layer and step)
        ctx.has_bias = bias is not None
        return _plain_forward(layer.layout, xc, wc, _bias_operand(bias, dt))

    @staticmethod
    def backward(ctx, dy):
        xc, weight, *kept = ctx.saved_tensors
        return (*fused_linear_backward(ctx.layer, ctx.use, ctx.param, xc, weight, kept[0] if kept else None, dy,
                                       ctx.dt, ctx.x_dtype, ctx.has_bias, ctx.needs_input_grad[:3]), None, None)


# Inside a non-reentrant checkpointed segment a fused layer is two nodes, so that its saved tensors are packed
# before its product. Checkpointing's recomputation stops at the pack of the last tensor the backward needs
# (torch.utils.checkpoint's early stop), and a custom Function packs what it saved only once its forward has
# returned: as one node, the segment's last fused layer (a Llama decoder layer's down_proj) recomputed its whole
# product, whose output nothing reads, in every backward. That is one GEMM of [tokens, intermediate] x
# [intermediate, hidden] a layer: at Llama-1B and 4x1024 tokens 16 of them, 2.2 TFLOP, about the 2.6 ms more
# that session 26's profile shows in forge's forward-layout GEMMs than in flashoptim's. Native ops save their
# inputs before they run, so F.linear stops before its product. The two nodes compute, save and update exactly
# what the one does (tests/test_training_semantics.py). The price is one more node: ~7 us of host time a
# forward on a CPU, so only checkpointed segments, where it saves a GEMM, take this form.


class _FusedLinearOperands(torch.autograd.Function):
    """First node: casts and saves x and W; returns xc, the input as computed with, and hands the weight as
    computed with to the product's forward (``product_weight``, dropped there). Its backward casts dX from
    the compute dtype to the input's; the product's node does the rest, with these saved tensors."""

    @staticmethod
    def forward(ctx, x, weight, layer, use):
        _, xc, ctx.product_weight = _save_operands(ctx, x, weight, layer, use)
        return xc

    @staticmethod
    def backward(ctx, dxc):
        return (dxc.to(ctx.x_dtype) if dxc is not None else None), None, None, None


class _FusedLinearProduct(torch.autograd.Function):
    """Second node: y = xc wcᵀ + b. Backward: dX, db and the fused update from the first node's saved
    tensors (``operands``, that node), and dW to ``weight`` itself where it is materialized (a Parameter's
    gradient, as the one node returns it)."""

    @staticmethod
    def forward(ctx, xc, weight, bias, operands):
        wc, operands.product_weight = operands.product_weight, None
        ctx.operands, ctx.has_bias = operands, bias is not None
        return _plain_forward(operands.layer.layout, xc, wc, _bias_operand(bias, operands.dt))

    @staticmethod
    def backward(ctx, dy):
        first = ctx.operands
        xc, weight, *kept = first.saved_tensors
        needs = (first.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        # dX stays in the compute dtype here; the first node casts it to the input's, as the one node does
        dx, dw, db = fused_linear_backward(first.layer, first.use, first.param, xc, weight, kept[0] if kept else None,
                                           dy, first.dt, xc.dtype, ctx.has_bias, needs)
        return dx, dw, db, None


def fused_linear_backward(layer, use, param, xc, weight, kept_cast, dy, dt, x_dtype, has_bias, needs):
    """(dX, dW, db) of a fused layer's use, given dY: dX with the pre-update weight first, then dW
    handed to the optimizer (the fused update; or returned, where the weight takes the materialized
    path). ``xc`` is the input as the layer computed with it (in the autocast dtype ``dt`` if any),
    ``weight`` the saved weight, ``kept_cast`` its ``dt`` copy if one was kept, ``needs`` the
    (input, weight, bias) entries of ``ctx.needs_input_grad``. Shared by the fused layer and by
    forge_num.loss.linear_cross_entropy, whose LM head hands in the logits' gradient (and computes dX
    itself, by slabs of the head's cast: needs[0] False)."""
    opt = layer.opt
    conv = layer.layout == "conv1d"
    x2 = xc.reshape(-1, xc.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    if dt is not None and dy2.dtype != dt:
        dy2 = dy2.to(dt)
    dx = None
    if needs[0]:  # dX with the pre-update weight, before anything else (the cast made only for it)
        wc = kept_cast if kept_cast is not None else weight.to(dt) if dt is not None else weight
        dx = torch.mm(dy2, wc.t() if conv else wc).view(*xc.shape[:-1], -1).to(x_dtype)
        del wc
    db = None
    if has_bias and needs[2]:
        db = dy2.sum(0).to(torch.float32)
    dw = None
    if needs[1]:
        if layer.materialize(use):
            x32, dy32 = x2.to(torch.float32), dy2.to(torch.float32)
            dw = torch.mm(x32.t(), dy32) if conv else torch.mm(dy32.t(), x32)
        elif conv:  # weight [in, out] = dyᵀx with the roles of x and dy swapped
            opt._on_linear_grad(param, dy2, x2)
        else:
            opt._on_linear_grad(param, x2, dy2)
    if opt._mode != "norm":
        use.done = True
    return dx, dw, db


def _fused_forward(self, input):
    layer = _RUNTIME.get(self)
    weight, bias = self.weight, self.bias
    if layer is None or not (torch.is_grad_enabled() and weight.requires_grad):
        return _plain_forward("conv1d" if _is_conv1d(type(self)) else "linear", input, weight, bias)
    if type(weight).__name__ == "DTensor":  # tensor parallel: the fused update of the local shard
        from forge_num.distributed import sharded_linear_forward

        return sharded_linear_forward(self, input, layer)
    if _in_non_reentrant_checkpoint():
        xc = _FusedLinearOperands.apply(input, weight, layer, layer.new_use())
        return _FusedLinearProduct.apply(xc, weight, bias, xc.grad_fn)
    return _FusedLinearFn.apply(input, weight, bias, layer, layer.new_use())


def _swapped_class(cls: type, forward, prefix: str) -> type:
    """The subclass of ``cls`` whose forward is ``forward``, named ``prefix + cls.__name__``."""
    swapped = _SWAPPED_CLASSES.get((cls, forward))
    if swapped is None:
        swapped = type(
            f"{prefix}{cls.__name__}",
            (cls,),
            {"forward": forward, "_forge_num_original_class": cls, "__module__": __name__},
        )
        _SWAPPED_CLASSES[(cls, forward)] = swapped
    return swapped


def _is_conv1d(cls: type) -> bool:
    for c in cls.__mro__:
        if c.__name__ == "Conv1D" and c.__module__.startswith("transformers"):
            return True
    return False


def _layout_of(module: nn.Module) -> str | None:
    """'linear', 'conv1d', or None where a subclass overrides the module's forward."""
    cls = type(module)
    if isinstance(module, nn.Linear):
        return "linear" if cls.forward is nn.Linear.forward else None
    if _is_conv1d(cls):
        base = next(c for c in cls.__mro__ if c.__name__ == "Conv1D")
        return "conv1d" if cls.forward is base.forward else None
    return None


# --------------------------------------------------------------------------------------------
# A tied embedding's gradient: its touched rows added into the head's gradient
# --------------------------------------------------------------------------------------------


class _TiedRows:
    """One weight tied between an ``nn.Embedding`` and an LM head whose gradient forge_num computes
    (forge_num.loss.linear_cross_entropy's unfused head). Autograd would sum the two gradients of the
    weight, ``G = G_head + G_emb``, both dense [V, H]: two such tensors alive at the embedding's
    backward (2 x 1.47 GiB of fp32 at Llama-3B), where G_emb is zero outside the rows of the tokens in
    the batch. Here the head *deposits* G_head instead of returning it, and the embedding's backward
    adds its touched rows into it in place and returns G (``add_touched_rows``): the same bits as
    autograd's sum, one [V, H] tensor fewer.

    The deposit is made only when the embedding's backward is sure to run later in the same backward
    pass (graph task): one of its nodes is in the task's graph (``torch._C._will_engine_execute_node``)
    and has not run in it yet. Otherwise (a head fed by ``inputs_embeds``, a detached embedding, the
    embedding's backward already run) the head returns G_head to autograd as before. Nor is it made
    where another use of the head (a second linear_cross_entropy over the same weight) will backward
    in the same pass: each head returns its gradient to autograd, which sums them all. A deposit the
    embedding does not take in its task (a backward that stops short of it: ``autograd.grad`` with
    ``inputs=``, where the weight's gradient is not accumulated either) is dropped when the task ends.
    Without those private functions (another torch version) nothing is deposited: more memory, the
    same bits."""

    __slots__ = ("nodes", "heads", "deposit", "task", "_opt", "split_last", "__weakref__")

    def __init__(self, opt: ForgeOptimizer | None = None):
        self.nodes: list[weakref.ref] = []  # the embedding's backward nodes that may still run
        self.heads: list[weakref.ref] = []  # the heads' backward nodes (linear_cross_entropy's) likewise
        self.deposit = None  # G_head, waiting for the embedding's backward of graph task ``task``
        self.task = None
        # the optimizer of the tied weight (the split update: split_head_update), held weakly: _TIED_ROWS
        # keys this entry by the weight, which the optimizer holds, so a strong reference would keep the
        # key, the entry and the optimizer alive for the process's life
        self._opt = weakref.ref(opt) if opt is not None else None
        # whether the embedding's last backward took a split update (the forward sorts its tokens for
        # the next one only then: _TokenRows; not under Hugging Face's own loss, where none follows)
        self.split_last = False

    @property
    def opt(self) -> ForgeOptimizer | None:
        return self._opt() if self._opt is not None else None

    def add_node(self, node) -> None:
        self.nodes = [r for r in self.nodes if r() is not None]
        self.nodes.append(weakref.ref(node))

    def add_head_node(self, node) -> None:
        self.heads = [r for r in self.heads if r() is not None]
        self.heads.append(weakref.ref(node))

    def _pending_nodes(self, task) -> list:
        """The embedding's backward nodes that will run later in graph task ``task``."""
        return [node for node in (r() for r in self.nodes)
                if node is not None and getattr(node, "forge_num_task", None) != task
                and torch._C._will_engine_execute_node(node)]

    def _other_heads(self, head) -> bool:
        """Whether a head's backward node other than ``head`` is in the current pass's graph (pending
        or run: either way its gradient is not this head's alone)."""
        return any(node is not None and node is not head and torch._C._will_engine_execute_node(node)
                   for node in (r() for r in self.heads))

    def deposit_head_grad(self, grad, head=None) -> bool:
        """Keep ``grad`` (G_head, or a callable that computes it, or a _SplitHeadUpdate) for the
        embedding's backward if that will run later in this backward pass and no other head of this
        weight backwards in it (``head``: the calling head's node); False (keep nothing) otherwise,
        and the caller returns G_head to autograd."""
        try:
            task = torch._C._current_graph_task_id()
            if not self._pending_nodes(task) or self._other_heads(head) or self.task == task:
                return False
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._drop(task))
        except (AttributeError, RuntimeError, TypeError):
            return False
        self.deposit, self.task = grad, task
        return True

    def split_head_update(self, param: torch.Tensor, dy_blocks, x: torch.Tensor, head=None) -> bool:
        """The tied weight's update split by rows (v26), where its optimizer allows it
        (ForgeOptimizer._can_split_rows), the weight's gradient is accumulated in this backward (not an
        ``autograd.grad`` that stops short of it), one embedding call and no other head (``head``: the
        calling head's node) will backward in it: the rows the embedding's tokens do not touch are
        updated now from the head's gradient dYᵀX, computed and updated in row blocks
        (_SplitHeadUpdate), and the touched rows' head gradient is kept for the embedding's backward,
        which adds its own and updates them. ``dy_blocks``: an iterable of (r0, dY's columns [r0, r1)),
        one a block of _split_block_rows(H) rows in order (forge_num.loss makes them; consumed only if
        the split is done). No [V, H] gradient exists. True if done (the caller returns no gradient),
        False (nothing done, nothing consumed) otherwise."""
        opt = self.opt
        if opt is None or param not in opt._recs or param.dim() != 2 or not opt._can_split_rows(param):
            return False
        try:
            pending = self._pending_nodes(torch._C._current_graph_task_id())
            accumulated = torch._C._will_engine_execute_node(torch.autograd.graph.get_gradient_edge(param).node)
        except (AttributeError, RuntimeError, TypeError):
            return False
        node = pending[0] if len(pending) == 1 else None
        indices = getattr(node, "forge_num_indices", None)
        if indices is None or not accumulated:
            return False
        tokens = getattr(node, "forge_num_tokens", None)  # the embedding's forward sorted them (v30)
        if (tokens is None or tokens.shape != tuple(param.shape)
                or isinstance(tokens, _StaticTokenRows) != opt._capturable):
            tokens = _token_rows(opt)(indices, *param.shape)  # eagerly: waits for the device here
        split = (_StaticSplitHeadUpdate if opt._capturable else _SplitHeadUpdate)(tokens)
        if not self.deposit_head_grad(split, head):
            return False
        self.split_last = True
        split.apply_head(opt._start_row_updates(param, split), dy_blocks, x, param.dtype)
        return True

    def take_head_grad(self, node):
        """The deposit made in the current backward pass (None if there is none), handed over once;
        marks ``node`` (the embedding's backward) as run in this pass."""
        try:
            task = torch._C._current_graph_task_id()
        except (AttributeError, RuntimeError):
            task = None
        node.forge_num_task = task
        grad = self.deposit if self.task == task and task is not None else None
        self.deposit = self.task = None
        return grad

    def _drop(self, task) -> None:
        if self.task == task:
            deposit, self.deposit, self.task = self.deposit, None, None
            if isinstance(deposit, _SplitHeadUpdate) and deposit.updater is not None:
                # the embedding's backward did not run after all: the touched rows take the head's
                # gradient alone, as the other rows did (ForgeOptimizer.step() does the same for a
                # backward that failed between the two)
                deposit.finish(None, -1)


# keyed by the Parameter's identity (a WeakKeyDictionary would compare tensors with ==)
_TIED_ROWS: "WeakIdKeyDictionary[torch.Tensor, _TiedRows]" = WeakIdKeyDictionary()


# rows of the tied head's gradient computed and updated at once by _SplitHeadUpdate: 16 Mi elements
# (a 32 MiB bf16 block and its 64 MiB fp32 widening), below the chunked loss's 128 MiB of temporaries
# (forge_num.loss.DEFAULT_CHUNK_BYTES), which the head's backward follows; whole 256-row tiles
_SPLIT_BLOCK_ELEMENTS = 16 * 2**20
_SPLIT_ROW_TILE = 256
# kept rows a captured step's split gathers from a block at once (_StaticSplitHeadUpdate): 2 MiB of bf16 at
# Llama-1B's 2048 columns, where all of them (4096 at 4x1024 tokens) would be 16 MiB more at the step's peak
_STATIC_GATHER_ROWS = 512


class _TokenRows:
    """The distinct tokens T of one embedding call, sorted (int64: the row indices of index_select and
    index_copy_; an int32 input_ids works as well), each token's slot in T, and where each of
    _SplitHeadUpdate's row blocks of a [n_rows, cols] weight begins and ends in T, as host integers
    (one transfer for all blocks), and the embedding's padding index's slot in T (_padding_slot, for the
    embedding's backward; -1 for none). torch.unique and those transfers wait for the device: made in
    the embedding's forward where a split may follow (the embedding's last backward took one, and
    ForgeOptimizer._may_split_rows), where the device has little queued (v30, bench/NOTES.md), not in
    the backward, where the host would wait for the loss's chunks and the forward's tail instead of
    issuing the layers' backward. (A step's first split, or one after a backward without it, sorts in
    the head's backward.)"""

    __slots__ = ("touched", "slot", "shape", "block_rows", "starts", "edges", "padding_idx", "padding_slot")

    def __init__(self, indices: torch.Tensor, n_rows: int, cols: int, padding_idx=None):
        self.touched, self.slot = torch.unique(indices.reshape(-1).long(), sorted=True, return_inverse=True)
        self.padding_idx, self.padding_slot = padding_idx, _padding_slot(self.touched, padding_idx)
        self.shape = (n_rows, cols)
        self.block_rows = _split_block_rows(cols)
        self.starts = list(range(0, n_rows, self.block_rows))
        bounds = torch.tensor(self.starts + [n_rows], device=self.touched.device)
        self.edges = torch.searchsorted(self.touched, bounds).tolist()


class _StaticTokenRows:
    """_TokenRows for a captured step's optimizer (forge_num.graphs): the split without reading the device
    on the host, every shape the tokens' count's, none the distinct tokens'. The rows kept for the
    embedding's backward are R = min(tokens, n_rows) distinct rows D, ascending (``touched``): every row a
    token touches, then the lowest untouched rows to fill R (their embedding gradient is zero, so in the
    embedding's backward they take G_head + 0.0, the sum a block gives them):

        touched[v]  = some token is v                                     (index_fill_)
        filler[v]   = not touched[v], and at most R - #touched untouched rows are <= v   (cumsum)
        D           = the R rows touched or filler, ascending             (a stable sort of the mask)
        position[i] = token i's index in D                                (searchsorted)

    Each block masks its rows of D (``mask``) where _TokenRows slices them by host edges. ``slot(padding)``
    maps a padding index's tokens past D (index R, skipped by embedding_dense_backward as its padding
    index), where _TokenRows finds its slot on the host. The slots keep the tokens' order and equalities, as
    torch.unique's, so embedding_dense_backward sums each row's token gradients as it does there
    (add_touched_rows). ``padding_idx`` is taken as _TokenRows takes it and not used: slot() is given the
    embedding's at its backward."""

    __slots__ = ("touched", "mask", "indices", "position", "shape", "block_rows", "starts")

    def __init__(self, indices: torch.Tensor, n_rows: int, cols: int, padding_idx=None):
        flat = indices.reshape(-1).long()
        kept = min(flat.numel(), n_rows)
        touched = torch.zeros(n_rows, dtype=torch.bool, device=flat.device).index_fill_(0, flat, True)
        untouched_rank = torch.cumsum(~touched, 0)  # 1 for the first untouched row
        self.mask = touched | (~touched & (untouched_rank <= kept - touched.sum()))
        self.touched = torch.sort((~self.mask).to(torch.uint8), stable=True).indices[:kept]
        self.indices, self.position = flat, torch.searchsorted(self.touched, flat)
        self.shape = (n_rows, cols)
        self.block_rows = _split_block_rows(cols)
        self.starts = list(range(0, n_rows, self.block_rows))

    def slot(self, padding_idx: int) -> torch.Tensor:
        """Each token's slot for embedding_dense_backward over len(D) + 1 rows: its index in D, or len(D)
        (the padding index there) for a token equal to ``padding_idx`` (negative: none)."""
        if padding_idx < 0:
            return self.position
        return torch.where(self.indices == padding_idx, self.touched.numel(), self.position)


def _token_rows(opt):
    """The tokens' rows class for ``opt``'s split: _StaticTokenRows in a captured step (no host read),
    else _TokenRows."""
    return _StaticTokenRows if opt._capturable else _TokenRows


def _split_block_rows(cols: int) -> int:
    """Rows of a split block: _SPLIT_BLOCK_ELEMENTS in whole _SPLIT_ROW_TILE-row tiles, at least one tile."""
    rows = _SPLIT_BLOCK_ELEMENTS // max(cols, 1) // _SPLIT_ROW_TILE * _SPLIT_ROW_TILE
    return max(_SPLIT_ROW_TILE, rows)


class _SplitHeadUpdate:
    """A tied weight's update split between the head's backward and the embedding's (v26; bench/NOTES.md).

    The tied gradient is G = G_head + G_emb, where G_emb is zero outside the rows the batch's tokens
    touch (T). Rows outside T take G_head + 0.0 (autograd's sum with the embedding's dense zero row,
    which turns a -0.0 into +0.0), rows in T take G_head + G_emb (autograd's add, in the gradient's
    dtype). So:

    * ``apply_head`` (the head's backward): G_head = (dYᵀX).to(weight dtype) as F.linear's autograd
      computes it, but in blocks of rows [r0, r1); each block's rows in T are copied out (kept for the
      embedding: at most tokens x H elements) and zeroed, the block (widened to fp32, + 0.0) is updated
      in place, and the rows in T are put back as they were before it (ForgeOptimizer's row updater:
      their weight and state copied out before the block's update, in after it). Zeroing them keeps
      their head part out of the block's telemetry; it is counted once, with the embedding's.
    * ``finish`` (the embedding's backward): their G_emb rows as add_touched_rows computes them, added
      to the kept rows, and those rows updated gathered, each drawing its own Philox counters.

    Every element's gradient is autograd's where each block's product equals the whole product's rows,
    and the update is element-wise (8bit blocks lie within rows), so the bits are the unsplit update's.
    Caveat, as for the chunked loss's logits: a GEMM over fewer rows may be computed by the library
    with another kernel, so a block's product may differ from the whole one's: in its last bits (seen
    on the CPU for one shape of four) and, on this machine's CPU, where one kernel flushes a subnormal
    result to zero and the other does not. tests/test_tied_rows.py checks the split's own logic against
    the unsplit path with blocks that are the whole product's rows (on the CPU), and the premise on the
    GPU: cuBLAS's 8192-row block products at a Llama-1B-wide head against the whole product. Peak memory: one
    block (about 96 MiB) and the kept rows, instead of the [V, H] product. A backward that fails
    between the head's and the embedding's leaves the split open: ForgeOptimizer.step() finishes it
    with the head's gradient alone (the layers the backward reached are updated too)."""

    __slots__ = ("touched", "slot", "tokens", "head_rows", "updater")

    def __init__(self, tokens: _TokenRows):
        self.tokens, self.touched, self.slot = tokens, tokens.touched, tokens.slot
        self.head_rows = None  # G_head's rows in T, [len(T), H] in the weight's dtype
        self.updater = None

    def apply_head(self, updater, dy_blocks, x: torch.Tensor, dtype: torch.dtype) -> None:
        """``dy_blocks``: (r0, dY's columns [r0, r1)) for each of the tokens' blocks, in order
        (split_head_update)."""
        self.updater = updater
        n_rows, cols = updater.n_rows, updater.cols
        # split_head_update made the tokens for this weight's [V, H] (its rows and columns: the updater's)
        assert (n_rows, cols) == self.tokens.shape, (self.tokens.shape, (n_rows, cols))
        edges = self.tokens.edges
        # zeros, not empty: should a block fail (out of memory), finish() applies no garbage
        self.head_rows = torch.zeros((self.touched.numel(), cols), dtype=dtype, device=x.device)
        for i, (r0, dy_block) in enumerate(_each_block(dy_blocks, self.tokens)):
            block = head_grad_rows(dy_block, x, dtype)
            del dy_block
            t0, t1 = edges[i], edges[i + 1]
            held = None
            if t1 > t0:
                index = self.touched[t0:t1]
                local = index - r0
                self.head_rows[t0:t1] = block.index_select(0, local)
                block.index_fill_(0, local, 0.0)
                held = updater.hold(index)
            g32 = block.float().add_(0.0)  # + the embedding's dense zero row (-0.0 -> +0.0)
            del block
            updater.rows(r0, g32)
            del g32
            if held is not None:
                updater.put_back(index, held)

    def finish(self, grad: torch.Tensor | None, padding_idx: int) -> None:
        """The rows in T updated with G_head + G_emb; ``grad`` the embedding output's gradient (None:
        the embedding's backward did not run in this pass, so G_emb is not added)."""
        summed = self.head_rows
        if grad is not None:
            tokens = self.tokens
            padding_slot = (tokens.padding_slot if tokens.padding_idx == padding_idx
                            else _padding_slot(self.touched, padding_idx))
            compact = _compact_embedding_grad(grad, self.touched, self.slot, padding_slot)
            summed = summed.add_(compact)  # autograd's add on these rows (add_touched_rows)
            del compact
        self.head_rows = None
        self.updater.gathered(self.touched, summed.float())
        self.updater.done()


class _StaticSplitHeadUpdate(_SplitHeadUpdate):
    """_SplitHeadUpdate over _StaticTokenRows (a captured step's optimizer): the same element updates, by
    masks where the eager split slices by the host's block edges.

    * ``apply_head``: the kept rows' weight and state held once (they are every block's zeroed rows); each
      block's product, its kept rows copied into ``head_rows`` (gathers of _STATIC_GATHER_ROWS kept rows,
      those in the block selected) and zeroed, the block updated; the held rows put back after the last
      block.
    * ``finish``: ``head_rows`` + the embedding's gradient on D (zero on the filler rows: G_head + 0.0, as
      in a block), the R rows updated gathered, each with its own row's counters.

    So every row is updated once, from G_head + G_emb (touched) or G_head + 0.0 (the others), as the
    unsplit update; the telemetry sums the same terms in other groups."""

    __slots__ = ()

    def apply_head(self, updater, dy_blocks, x: torch.Tensor, dtype: torch.dtype) -> None:
        self.updater = updater
        n_rows, cols = updater.n_rows, updater.cols
        assert (n_rows, cols) == self.tokens.shape, (self.tokens.shape, (n_rows, cols))
        kept, mask = self.touched, self.tokens.mask
        self.head_rows = torch.zeros((kept.numel(), cols), dtype=dtype, device=x.device)
        held = updater.hold(kept)
        for r0, dy_block in _each_block(dy_blocks, self.tokens):
            r1 = r0 + dy_block.shape[1]
            block = head_grad_rows(dy_block, x, dtype)
            del dy_block
            in_block = ((kept >= r0) & (kept < r1)).unsqueeze(1)
            local = (kept - r0).clamp_(0, r1 - r0 - 1)
            for s0 in range(0, kept.numel(), _STATIC_GATHER_ROWS):  # a few MiB gathered at a time, not [R, H]
                s1 = min(s0 + _STATIC_GATHER_ROWS, kept.numel())
                torch.where(in_block[s0:s1], block.index_select(0, local[s0:s1]), self.head_rows[s0:s1],
                            out=self.head_rows[s0:s1])
            block.masked_fill_(mask[r0:r1].unsqueeze(1), 0.0)
            g32 = block.float().add_(0.0)  # + the embedding's dense zero row (-0.0 -> +0.0)
            del block
            updater.rows(r0, g32)
            del g32
        updater.put_back(kept, held)

    def finish(self, grad: torch.Tensor | None, padding_idx: int) -> None:
        summed = self.head_rows
        if grad is not None:
            n = self.touched.numel()
            slot = self.tokens.slot(padding_idx)
            compact = torch.ops.aten.embedding_dense_backward(grad, slot, n + 1, n, False)
            summed = summed.add_(compact[:n])  # autograd's add on these rows (add_touched_rows)
            del compact
        self.head_rows = None
        self.updater.gathered(self.touched, summed.float())
        self.updater.done()


def head_grad_rows(dy_block: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows [r0, r1) of F.linear's weight gradient, ``(dy_blockᵀ x).to(dtype)``, from dY's columns [r0, r1)
    (forge_num.loss.WeightGrad's product, over fewer rows)."""
    return (dy_block.t() @ x).to(dtype)


def _each_block(dy_blocks, tokens):
    """The (r0, dY's columns) of ``dy_blocks``, checked to be the tokens' blocks in order: every block's
    rows are the split's (its edges, kept rows and counters are computed for them)."""
    count = 0
    for i, (r0, dy_block) in enumerate(dy_blocks):
        r1 = min(r0 + tokens.block_rows, tokens.shape[0])
        if i >= len(tokens.starts) or r0 != tokens.starts[i] or dy_block.shape[1] != r1 - r0:
            raise RuntimeError(f"forge_num: the tied head's dY block {i} covers rows [{r0}, {r0 + dy_block.shape[1]}),"
                               f" the split's block is [{tokens.starts[i] if i < len(tokens.starts) else None}, ..)")
        count += 1
        yield r0, dy_block
        del dy_block
    if count != len(tokens.starts):
        raise RuntimeError(f"forge_num: the tied head's dY came in {count} blocks, the split has {len(tokens.starts)}")


def _padding_slot(touched: torch.Tensor, padding_idx) -> int:
    """The slot of ``padding_idx`` in the sorted distinct tokens ``touched``, -1 where it is not among
    them or there is none (None or negative). Reads the device (a transfer) only for a padding index."""
    if padding_idx is None or padding_idx < 0:
        return -1
    hit = (touched == padding_idx).nonzero()
    return int(hit[0, 0]) if hit.numel() else -1


def _compact_embedding_grad(grad: torch.Tensor, touched: torch.Tensor, slot: torch.Tensor,
                            padding_slot: int) -> torch.Tensor:
    """torch's dense embedding gradient's rows ``touched`` ([len(touched), H]), from the indices
    renumbered to their slots in ``touched`` (add_touched_rows says why the bits are the dense op's);
    ``padding_slot``: _padding_slot's."""
    return torch.ops.aten.embedding_dense_backward(grad, slot, touched.numel(), padding_slot, False)


def add_touched_rows(head_grad: torch.Tensor, grad: torch.Tensor, indices: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """``head_grad + embedding_dense_backward(grad, indices, V, padding_idx)`` bit for bit (autograd's sum
    of a tied weight's two gradients, head's first), written into ``head_grad`` ([V, H]) and returned,
    without the dense [V, H] embedding gradient:

        touched, slot = unique(indices)                (sorted; indices == touched[slot])
        compact       = embedding_dense_backward(grad, slot, len(touched), slot of padding_idx)
        head_grad[touched] = head_grad[touched] + compact        (the one rounding autograd's add does)
        head_grad[other]   = head_grad[other] + 0.0              (the dense gradient's +0.0 there)

    compact's rows are the dense gradient's touched rows, bit for bit: the renumbering keeps the
    indices' order (sorted ids map to sorted ids, equal to equal), and torch's kernels sum a row's
    token gradients in an order that depends only on that (the CPU in token order; CUDA after a stable
    sort by index, or per token for few indices), tested against the dense op on the CPU and the GPU
    (tests/test_tied_rows.py). ``x + 0.0`` is ``x`` except ``-0.0 + 0.0 = +0.0``: kept so that the
    untouched rows are autograd's too. Extra memory: ~3 [tokens, H] tensors."""
    touched, slot = torch.unique(indices.reshape(-1).long(), sorted=True, return_inverse=True)
    compact = _compact_embedding_grad(grad, touched, slot, _padding_slot(touched, padding_idx))
    summed = head_grad.index_select(0, touched).add_(compact)
    del compact
    head_grad.add_(0.0)
    head_grad.index_copy_(0, touched, summed)
    return head_grad


class _TouchedRowsEmbeddingFn(torch.autograd.Function):
    """F.embedding(indices, weight, padding_idx), whose weight gradient is torch's dense one, or, where
    the tied head deposited its gradient, that gradient with the touched rows added (add_touched_rows)."""

    @staticmethod
    def forward(ctx, indices, weight, rows, padding_idx):
        if padding_idx is not None and padding_idx < 0:  # as F.embedding: counted from the end
            padding_idx += weight.shape[0]
        out = F.embedding(indices, weight, padding_idx)
        ctx.save_for_backward(indices)
        ctx.rows, ctx.num_weights, ctx.padding_idx = rows, weight.shape[0], padding_idx
        # the tokens, for a head's split update (_TiedRows.split_head_update) before this backward runs,
        # sorted now where such a split may follow
        ctx.forge_num_indices = indices
        opt = rows.opt
        split = rows.split_last and opt is not None and opt._may_split_rows(weight)
        ctx.forge_num_tokens = (_token_rows(opt)(indices, *weight.shape, -1 if padding_idx is None else padding_idx)
                                if split else None)
        rows.add_node(ctx)  # ctx is this call's backward node (out.grad_fn)
        return out

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        pad = -1 if ctx.padding_idx is None else ctx.padding_idx
        head_grad = ctx.rows.take_head_grad(ctx)
        if isinstance(head_grad, _SplitHeadUpdate):  # the head updated the other rows: these now
            head_grad.finish(grad, pad)
            return None, None, None, None
        ctx.rows.split_last = False
        if head_grad is None:  # as torch's EmbeddingBackward for a dense weight
            dw = torch.ops.aten.embedding_dense_backward(grad, indices, ctx.num_weights, pad, False)
        else:
            if callable(head_grad):  # deferred by the head (forge_num.loss.WeightGrad): computed now
                head_grad = head_grad()
            opt = ctx.rows.opt
            if opt is not None and opt._capturable:
                # a captured step's optimizer (forge_num.graphs) without the split (the fp32 regime):
                # add_touched_rows sorts the tokens with torch.unique (a host read); autograd's sum itself
                # instead, with the dense [V, H] embedding gradient: the same bits
                dw = head_grad.add_(torch.ops.aten.embedding_dense_backward(grad, indices, ctx.num_weights, pad, False))
            else:
                dw = add_touched_rows(head_grad, grad, indices, pad)
            del head_grad
        return None, dw, None, None


def _tied_embedding_forward(self, input):
    rows = _TIED_ROWS.get(self.weight)
    if (rows is None or not (torch.is_grad_enabled() and self.weight.requires_grad) or self.max_norm is not None
            or self.scale_grad_by_freq or self.sparse or type(self.weight).__name__ == "DTensor"):
        return nn.Embedding.forward(self, input)  # torch's own backward: its dense gradient to autograd
    return _TouchedRowsEmbeddingFn.apply(input, self.weight, rows, self.padding_idx)


# --------------------------------------------------------------------------------------------
# The loss of a Hugging Face model output: both backward passes from one loss.backward()
# --------------------------------------------------------------------------------------------


class _LossHolder:
    __slots__ = ("loss",)

    def __init__(self, loss):
        self.loss = loss


class _TwoPassLoss(torch.autograd.Function):
    """A copy of the loss whose backward runs the optimizer's passes (norm, then update) on the real graph."""

    @staticmethod
    def forward(ctx, anchor, holder, opt):
        ctx.holder, ctx.opt = holder, opt
        return holder.loss.detach().clone()

    @staticmethod
    def backward(ctx, grad):
        holder, opt = ctx.holder, ctx.opt
        if holder.loss is None:
            raise RuntimeError("forge_num: this loss was already backpropagated (its graph is freed)")

        def run(retain):
            torch.autograd.backward(holder.loss, grad, retain_graph=retain)
            if not retain:
                holder.loss = None

        opt._run_backward(run)
        return None, None, None


def _wrap_output_loss(opt, output):
    loss = None
    if isinstance(output, dict) or hasattr(output, "keys"):
        try:
            loss = output["loss"]
        except (KeyError, TypeError):
            loss = None
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad and loss.dim() == 0):
        return output
    anchor = torch.zeros((), device=loss.device, requires_grad=True)
    wrapped = _TwoPassLoss.apply(anchor, _LossHolder(loss), opt)
    output["loss"] = wrapped
    return output


# --------------------------------------------------------------------------------------------
# prepare / unprepare
# --------------------------------------------------------------------------------------------


@dataclass
class PreparedHandle:
    """What prepare() changed on a model; ``remove()`` undoes it."""

    model: nn.Module
    optimizer: ForgeOptimizer
    fused: dict = field(default_factory=dict)  # name -> module swapped to a fused class
    hooked: dict = field(default_factory=dict)  # name -> parameter with an in-backward hook
    tied: list = field(default_factory=list)  # names of Linear modules left unfused (tied weights)
    # names of nn.Embedding modules tied to a head, whose backward adds its touched rows into the
    # head's gradient (where forge_num.linear_cross_entropy computes it; _TiedRows)
    tied_rows: dict = field(default_factory=dict)
    sharded: list = field(default_factory=list)  # names of Linear modules left unfused (FSDP2 reduces dW)
    hooks: list = field(default_factory=list)

    def remove(self) -> None:
        unprepare(self.model)


def _grad_ready_hook(optimizer: ForgeOptimizer):
    """The post-accumulate-grad hook prepare() puts on each trained parameter: ``optimizer._on_grad_ready``
    through a weak reference. A tensor does not show the garbage collector its post-accumulate-grad hooks
    (torch 2.13: tests/test_lifetime.py), so a hook holding the optimizer, which holds the parameter, would
    be a cycle never collected: the model's weights and optimizer state kept for the process's life. The
    model's PreparedHandle holds the optimizer while the model is prepared; once the optimizer is gone the
    hook does nothing (the gradient stays in ``.grad``, as with no hook)."""
    ref = weakref.ref(optimizer)

    def on_grad_ready(p: torch.Tensor) -> None:
        opt = ref()
        if opt is not None:
            opt._on_grad_ready(p)

    return on_grad_ready


def prepare(model: nn.Module, optimizer: ForgeOptimizer) -> nn.Module:
    """Fold ``optimizer``'s updates into ``model``'s backward; returns ``model`` (changed in place)."""
    if not isinstance(optimizer, ForgeOptimizer):
        raise TypeError(
            f"prepare() needs a forge_num optimizer (forge_num.AdamW, Adam, SGD, Lion), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        )
    if not isinstance(model, nn.Module):
        raise TypeError(f"prepare() needs an nn.Module, got {type(model).__name__}")
    if getattr(model, "_forge_num_handle", None) is not None:
        raise RuntimeError("forge_num: this model is already prepared; unprepare(model) first")
    if optimizer._recs:
        raise RuntimeError("forge_num: this optimizer is already attached to a prepared model")

    opt_params = {p for g in optimizer.param_groups for p in g["params"]}
    names: dict[torch.Tensor, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(p, []).append(name)
    outside = [p for p in opt_params if p not in names]
    if outside and optimizer.clipping == "exact":
        raise ValueError(
            f"forge_num: exact clipping needs every gradient in the norm pass, but {len(outside)} of the "
            "optimizer's parameters are not in the prepared model"
        )

    fsdp = set()
    if any(hasattr(m, "_get_fsdp_state") for m in model.modules()):  # FSDP2's fully_shard
        from forge_num.distributed import fully_sharded_params

        fsdp = fully_sharded_params(model, optimizer)

    handle = PreparedHandle(model, optimizer)
    for mname, module in model.named_modules(remove_duplicate=False):
        layout = _layout_of(module)
        if layout is None or module in _RUNTIME:
            continue
        w = module.weight
        if w not in opt_params or not w.requires_grad:
            continue
        if len(names.get(w, ())) > 1:
            handle.tied.append(mname)  # a tied weight: autograd sums its uses, the hook updates it
            continue
        if w in fsdp:  # FSDP2 reduce-scatters dW, then the hook updates the local shard
            handle.sharded.append(mname)
            continue
        if w.dim() != 2 or not w.is_contiguous():
            continue
        _RUNTIME[module] = _Layer(optimizer, layout)
        module.__class__ = _swapped_class(type(module), _fused_forward, "Fused")
        handle.fused[mname] = module

    for mname, module in model.named_modules(remove_duplicate=False):
        if (type(module).forward is nn.Embedding.forward and module.weight in opt_params
                and module.weight.requires_grad and len(names.get(module.weight, ())) > 1
                and module.weight not in fsdp and module.weight not in _TIED_ROWS
                and type(module.weight).__name__ != "DTensor"
                and sum(isinstance(m, nn.Embedding) and m.weight is module.weight for m in model.modules()) == 1):
            _TIED_ROWS[module.weight] = _TiedRows(optimizer)
            module.__class__ = _swapped_class(type(module), _tied_embedding_forward, "TiedRows")
            handle.tied_rows[mname] = module

    passive = []
    for p, pnames in names.items():
        if not p.requires_grad:
            continue  # frozen: untouched
        if p not in opt_params:
            passive.append(p)  # trained by nobody: only kept out of the norm pass
            continue
        optimizer._register(p, pnames[0])
        handle.hooks.append(p.register_post_accumulate_grad_hook(_grad_ready_hook(optimizer)))
        handle.hooked[pnames[0]] = p
    optimizer._passive = passive

    def _loss_hook(module, args, output):
        if optimizer.clipping == "exact" and torch.is_grad_enabled():
            return _wrap_output_loss(optimizer, output)
        return output

    handle.hooks.append(model.register_forward_hook(_loss_hook))
    model._forge_num_handle = handle
    return model


def unprepare(model: nn.Module) -> nn.Module:
    """Undo prepare(): original module classes, no hooks, the optimizer back to plain mode."""
    handle = getattr(model, "_forge_num_handle", None)
    if handle is None:
        raise RuntimeError("forge_num: this model is not prepared")
    opt = handle.optimizer
    busy = [rec.name for rec in opt._recs.values() if rec.events]
    if busy:
        raise RuntimeError(
            f"forge_num: unprepare() with a step in progress ({', '.join(busy[:3])} received gradients "
            "since the last step()); call optimizer.step() first"
        )
    for p in list(opt._recs):
        opt._unregister(p)
    opt._passive = []
    opt._grad_reducer = None  # set by forge_num.distributed.prepare_data_parallel
    for module in handle.fused.values():
        module.__class__ = module._forge_num_original_class
        _RUNTIME.pop(module, None)
    for module in handle.tied_rows.values():
        module.__class__ = module._forge_num_original_class
        _TIED_ROWS.pop(module.weight, None)
    for h in handle.hooks:
        h.remove()
    del model._forge_num_handle
    return model
