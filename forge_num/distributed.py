"""forge_num inside torch.distributed: tensor parallelism (DTensor), data parallelism and FSDP2.

Tensor parallelism (``torch.distributed.tensor.parallel``: ColwiseParallel, RowwiseParallel,
SequenceParallel, on a 1-D device mesh). ``forge_num.prepare(model, opt)`` after
``parallelize_module`` needs nothing else:

* A Linear whose weight is a DTensor sharded ``Shard(0)`` (Colwise, weight [out, in]) or ``Shard(1)``
  (Rowwise) holds, on each rank, the *complete* gradient of its local shard: Colwise
  ``dW_r = dY_rᵀ X`` (X replicated, dY sharded on the output features), Rowwise ``dW_r = dYᵀ X_r``
  (dY replicated, X sharded on the input features). So the fused layer applies the rule to the local
  shard from the local ``(X, dY)`` with no communication at all (``sharded_linear_forward``): the
  forward is the local ``F.linear`` wrapped back into a DTensor with the placements DTensor itself
  would give (Colwise: ``Shard(-1)``; Rowwise: ``Partial``, reduced by the parallel style's output
  hook), and dX goes back labelled ``Partial`` (Colwise, reduced by the input hook's backward) or
  ``Shard(-1)`` (Rowwise). The update is element-wise, so updating shards equals updating the whole
  (proofs/distributed.md). A Colwise input in another layout (sequence parallelism) is redistributed
  to ``Replicate`` explicitly, so each consumer's dX is reduce-scattered before the consumers' grads
  are added; declare it (``ColwiseParallel(input_layouts=Shard(1))``, as torch's tutorials do) and
  torch's own layers do the same. Left to DTensor's implicit dispatch, torch would add the Partial
  grads first and reduce once: the same sum associated differently (proofs/distributed.md §1).
* Under ``torch.autocast`` the sharded fused layer computes as the unsharded one (forge_num/fused.py):
  its local output and dX in the autocast dtype, as ``F.linear`` would, and the local dW in fp32
  from the low-precision X and dY, never rounded to bf16. A Rowwise bias is added to the reduced
  output in the autocast dtype; torch's own tensor-parallel forward under autocast rounds that sum
  differently (one bf16 ulp was seen), so there the two forwards are not bitwise equal.
* Every other parameter is updated in its post-accumulate-grad hook, on its local shard. A gradient
  that DTensor leaves ``Partial`` (a replicated norm weight under SequenceParallel, whose gradient is a
  sum over the sequence shards) is first reduced to the parameter's placements (``local_grad``: one
  all-reduce of that one parameter), then updated, then freed.
* Optimizer states are created with ``zeros_like(param)``: DTensors with the parameter's placements,
  so ``torch.distributed.checkpoint`` saves and reloads them sharded.

Data parallelism (``prepare_data_parallel``). torch's ``DistributedDataParallel`` cannot carry FORGE:
its reducer copies every gradient into flat buckets allocated for the whole model (all gradients
held at once) and writes the averaged gradient back only when the whole backward is over. Instead,
every trainable parameter's gradient is averaged as autograd produces it, with DDP's arithmetic
(``grad * (1/world)`` then an all-reduce sum, as DDP's reducer does when it copies into its bucket),
then updated by the element-wise rule and freed at once. Linear weights cannot take the fused path:
the fused epilogue would consume a *local* dW tile, and the rule needs the *averaged* one. The honest
choice made here: linear weights are left unfused, so autograd materializes that one layer's dW, the
hook all-reduces it and updates the weight, and it is freed before the next layer's dW exists. Memory:
one layer's weight gradient at a time (4 bytes x the largest layer's parameters, fp32) instead of
FORGE's none, and instead of DDP's 4 bytes x every parameter (plus its bucket copies). Communication
is one all-reduce per parameter, not bucketed (more latency-bound than DDP on many small tensors).

With exactly 2 ranks an all-reduce sum is ``a + b`` per element whatever the algorithm (IEEE addition
is commutative), so this equals DDP bit for bit; with more ranks the association order of the sum
depends on the collective's algorithm and chunking, and two implementations can differ within the
bound of proofs/distributed.md §3.

Data parallelism with accumulation and clipping. ``accumulation_steps=k``: each rank accumulates its
local ``.grad`` over the micro-batches (autograd), and the last micro-batch's hook averages the sum
across ranks once, then updates: DDP's ``no_sync()`` arithmetic (one reduction per step; every rank
holds its local gradients for the step, as under ``no_sync``). ``clipping="exact"``: the norm-only
pass averages each gradient as the update pass will (the same collective on the same bits, so the
same result), so every rank holds the averaged gradient and the norm is ``clip_grad_norm_``'s on it,
bit for bit (per-parameter fp32 norms stacked in parameter order); cost: one more backward and one
more all-reduce per parameter per step. ``clipping="previous"``: the previous step's telemetry norm,
which is already that of the averaged (replicated) gradient.

FSDP2 (``torch.distributed.fsdp.fully_shard``). Call ``fully_shard`` on the blocks and on the root
as torchtitan does, build the optimizer on ``model.parameters()`` (the sharded DTensors), then
``forge_num.prepare(model, opt)``: it finds the FSDP2 units and needs nothing else. FSDP2 itself
reduce-scatters each unit's gradients as its backward ends and calls the post-accumulate-grad hooks
of the sharded parameters by hand (``_fsdp_collectives.foreach_reduce``, torch 2.13); forge_num's hook
applies the element-wise rule to the local shard (parameter, states and gradient all local) and frees
the sharded gradient at once, so no rank ever holds the model's gradients: one unit's unsharded
gradients (freed by FSDP2 after the reduce-scatter's copy-in) and one parameter's sharded gradient.
Linear weights are left unfused (``handle.sharded`` names them): as under data parallelism the
epilogue would consume a local, unreduced dW. Optimizer states are ``zeros_like(param)``: sharded
DTensors, saved and loaded by ``torch.distributed.checkpoint`` (``checkpoint_state``). The gradient is
FSDP2's: with an fp32 or bf16 reduce dtype and no divide factor, ``ReduceOp.AVG``, which gloo computes
as the sum, then ``/ P`` (proofs/distributed.md §4). ``accumulation_steps=k`` with FSDP2's gradient
sync left on (its default): every micro-batch is reduce-scattered and FSDP2 adds the shards into the
sharded ``.grad`` (1/P of the gradients held between micro-batches); the last micro-batch's hook
updates. (FSDP2's ``set_requires_gradient_sync(False)`` keeps whole unsharded gradients instead, and
its hooks then run only on the synced micro-batch; combined with exact clipping the norm pass would
add its gradients to FSDP2's accumulation: not supported.)

Clipping with sharded parameters (FSDP2, tensor parallelism). Each rank takes the fp32 norm of its
local part of each gradient (a Partial gradient is reduced first, as for the update); one all-gather
of these per-parameter norms, then on every rank alike a sharded parameter's norm is
``fl32(sqrt(Σ_r fl64(n_r)²))`` in rank order, a replicated one's is taken once, and the total is the
norm of the per-parameter norms in parameter order (``global_total_norm``). Every rank gets the same
bits, so the same coefficient; against ``clip_grad_norm_`` on the whole gradient the coefficient is
within the bound of proofs/distributed.md §5, not bitwise (the shards' sums are associated
differently). Exact clipping under FSDP2 runs FSDP2's backward twice (all-gathers and reduce-scatters
included); ``opt.backward(loss)`` runs both passes. Telemetry: ``opt.stats['grad_norm']`` and the
non-finite count are global: the shards' sums are added across ranks (one all-gather of four numbers
per step), replicated parameters counted once; ``clipping="previous"`` uses that global norm.

Stochastic rounding on sharded parameters (``bf16-sr``): each shard draws the Philox counters of its
elements' indices in the whole parameter (``shard_counter``), so the rounding does not
depend on the number of ranks (proofs/distributed.md §6).

Not supported yet (errors say so where they can): the ``8bit`` regime on sharded parameters (its
block-wise states are laid out for the whole parameter; proofs/distributed.md §6), a 2-D mesh (HSDP, FSDP2 x tensor parallelism), parameters outside every ``fully_shard`` unit,
and exact clipping with FSDP2's ``set_requires_gradient_sync(False)``; a fused tensor-parallel layer
called twice in one step, transformers' Conv1D under tensor parallelism, 2-D meshes (TP x DP).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

__all__ = [
    "sharded_linear_forward",
    "shard_counter",
    "local_grad",
    "prepare_data_parallel",
    "fully_sharded_params",
    "global_total_norm",
    "global_step_totals",
    "init_optimizer_state",
    "checkpoint_state",
    "load_checkpoint_state",
]


def _one_placement(t: DTensor):
    if t.device_mesh.ndim != 1:
        raise NotImplementedError("forge_num: tensor parallelism on a 1-D device mesh only")
    return t.placements[0]


def local_grad(param: torch.Tensor, grad: DTensor) -> torch.Tensor:
    """The gradient of ``param``'s local shard: a ``Partial`` gradient is reduced to the parameter's
    placements first (one all-reduce, or reduce-scatter, of this one parameter)."""
    if not isinstance(grad, DTensor):
        return grad
    want = param.placements if isinstance(param, DTensor) else (Replicate(),) * grad.device_mesh.ndim
    if tuple(grad.placements) != tuple(want):
        grad = grad.redistribute(grad.device_mesh, want)
    return grad.to_local()


def _save_sharded_operands(ctx, x, w_local, param, layer, use):
    """(dt, xc, wc): x and the local weight shard as the layer computes with them (cast to the autocast dtype
    as the unsharded fused layer, fused.py: output and dX in it, as F.linear computes them; dW in fp32 from
    the low-precision x and dy, never rounded), saved for the backward, and the backward's context."""
    from forge_num.fused import _autocast_operands

    dt, xc, wc, _ = _autocast_operands(x, w_local, None)
    ctx.save_for_backward(xc, w_local)
    ctx.param, ctx.layer, ctx.use, ctx.dt, ctx.x_dtype = param, layer, use, dt, x.dtype
    return dt, xc, wc


def _sharded_product(xc, wc, bias, dt):
    with torch.autocast(xc.device.type, enabled=False):
        return F.linear(xc, wc, bias.to(dt) if bias is not None and dt is not None else bias)


def _sharded_backward(first, dy, needs_x, needs_bias, has_bias, dx_dtype):
    """(dX, db) of a sharded fused layer's use given dY, and the fused update of the local shard; ``first``
    the node that saved x and the shard (_save_sharded_operands), ``dx_dtype`` the dtype dX is returned in
    (None: the saved x's, the compute dtype)."""
    x, w = first.saved_tensors
    layer, use, dt = first.layer, first.use, first.dt
    opt = layer.opt
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    if dt is not None and dy2.dtype != dt:
        dy2 = dy2.to(dt)
    dx = None
    if needs_x:  # with the pre-update weight shard
        dx = torch.mm(dy2, w.to(dt) if dt is not None else w).view(*x.shape[:-1], -1).to(dx_dtype or x.dtype)
    db = dy2.sum(0).to(torch.float32) if has_bias and needs_bias else None
    if layer.materialize(use):
        raise NotImplementedError(
            "forge_num: a tensor-parallel fused Linear was used twice in one step; not supported yet"
        )
    opt._on_linear_grad(first.param, x2, dy2)  # the local shard's complete dW, consumed block by block
    if opt._mode != "norm":
        use.done = True
    return dx, db


class _ShardedFusedLinearFn(torch.autograd.Function):
    """out = x_local · W_localᵀ (+ b_local); backward: dX, then the fused update of the local shard.

    ``anchor`` is an empty leaf that requires grad, so the node exists even where neither x nor the
    bias needs a gradient; the weight itself is not an input (its gradient never reaches autograd).
    """

    @staticmethod
    def forward(ctx, x, anchor, bias, w_local, param, layer, use):
        dt, xc, wc = _save_sharded_operands(ctx, x, w_local, param, layer, use)
        ctx.has_bias = bias is not None
        return _sharded_product(xc, wc, bias, dt)

    @staticmethod
    def backward(ctx, dy):
        dx, db = _sharded_backward(ctx, dy, ctx.needs_input_grad[0], ctx.needs_input_grad[2], ctx.has_bias,
                                   ctx.x_dtype)
        return dx, None, db, None, None, None, None


# Inside a non-reentrant checkpointed segment, two nodes, as the unsharded fused layer (fused.py's
# _FusedLinearOperands says why: checkpointing's recomputation then stops before the product).


class _ShardedFusedLinearOperands(torch.autograd.Function):
    """First node: saves x and the local shard, returns xc (the anchor keeps it in the graph); hands the
    shard as computed with to the product's forward. Backward: dX cast from the compute dtype to x's."""

    @staticmethod
    def forward(ctx, x, anchor, w_local, param, layer, use):
        _, xc, ctx.product_weight = _save_sharded_operands(ctx, x, w_local, param, layer, use)
        return xc

    @staticmethod
    def backward(ctx, dxc):
        return (dxc.to(ctx.x_dtype) if dxc is not None else None), None, None, None, None, None


class _ShardedFusedLinearProduct(torch.autograd.Function):
    """Second node: the product; backward: dX, db and the update from the first node's saved tensors."""

    @staticmethod
    def forward(ctx, xc, bias, operands):
        wc, operands.product_weight = operands.product_weight, None
        ctx.operands, ctx.has_bias = operands, bias is not None
        return _sharded_product(xc, wc, bias, operands.dt)

    @staticmethod
    def backward(ctx, dy):
        first = ctx.operands
        dx, db = _sharded_backward(first, dy, first.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias, None)
        return dx, db, None


def sharded_linear_forward(module: nn.Module, input, layer):
    """The forward of a fused ``nn.Linear`` whose weight is a DTensor (called by fused.py)."""
    if layer.layout != "linear":
        raise NotImplementedError("forge_num: tensor parallelism for nn.Linear only (not Conv1D)")
    weight, bias = module.weight, module.bias
    wp = _one_placement(weight)
    mesh = weight.device_mesh
    if not isinstance(input, DTensor):
        raise TypeError(
            "forge_num: a Linear with a DTensor weight needs a DTensor input (parallelize_module's "
            "ColwiseParallel/RowwiseParallel install the input hooks that make one)"
        )
    if wp == Shard(0):  # Colwise: X replicated, out sharded on its features, dX a partial sum
        x = input.redistribute(mesh, [Replicate()]) if tuple(input.placements) != (Replicate(),) else input
        x_local = x.to_local(grad_placements=[Partial()])
        out_place, b_local, b_after = Shard(x.ndim - 1), (bias.to_local() if bias is not None else None), None
    elif wp == Shard(1):  # Rowwise: X sharded on its features, out a partial sum
        want = Shard(input.ndim - 1)
        x = input.redistribute(mesh, [want]) if tuple(input.placements) != (want,) else input
        x_local = x.to_local()
        out_place, b_local, b_after = Partial(), None, bias  # a replicated bias is added once, by DTensor
    else:
        raise NotImplementedError(f"forge_num: a Linear weight with placement {wp} (Shard(0)/Shard(1) only)")
    anchor = torch.empty(0, requires_grad=True)
    w_local = weight.detach().to_local()
    from forge_num.fused import _in_non_reentrant_checkpoint

    if _in_non_reentrant_checkpoint():
        xc = _ShardedFusedLinearOperands.apply(x_local, anchor, w_local, weight, layer, layer.new_use())
        out_local = _ShardedFusedLinearProduct.apply(xc, b_local, xc.grad_fn)
    else:
        out_local = _ShardedFusedLinearFn.apply(x_local, anchor, b_local, w_local, weight, layer, layer.new_use())
    out = DTensor.from_local(out_local, mesh, [out_place], run_check=False)
    if b_after is not None:  # autocast: added in the autocast dtype, as F.linear adds its bias
        out = out + (b_after.to(out.dtype) if torch.is_autocast_enabled(input.device.type) else b_after)
    return out


def shard_counter(p) -> tuple[int, int, int] | None:
    """The Philox counter map (cols, row_stride, base) of this rank's shard of a sharded DTensor
    parameter: each local element draws the counter of its flat index in the whole parameter, so the
    stochastic rounding does not depend on the number of ranks (proofs/distributed.md §6). The
    parameter is seen as [rows, C] over its last dimension: a shard of the first dimension (rows, as
    Colwise and FSDP2 make) is (C, C, first element); a shard of the last dimension only (Rowwise)
    is (local C, C, first column); other shardings are refused. None for an unsharded parameter."""
    if not (isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements)):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape = tuple(p.shape)
    local, offset = compute_local_shape_and_global_offset(shape, p.device_mesh, p.placements)
    sharded = [d for d in range(len(shape)) if local[d] != shape[d] or offset[d] != 0]
    if not sharded:  # this rank holds all of it
        return None
    if sharded == [0]:  # leading rows: a contiguous range of the parameter's flat indices
        cols = int(shape[-1]) if len(shape) > 1 else max(int(local[0]), 1)
        return cols, cols, int(offset[0]) * math.prod(shape[1:])
    if len(shape) >= 2 and sharded == [len(shape) - 1]:  # the last dimension only
        return max(int(local[-1]), 1), int(shape[-1]), int(offset[-1])
    raise NotImplementedError(
        f"forge_num: stochastic rounding on a parameter of shape {shape} sharded as {tuple(p.placements)} "
        "(rows or the last dimension only)"
    )


# --------------------------------------------------------------------------------------------
# Data parallelism
# --------------------------------------------------------------------------------------------


def prepare_data_parallel(model: nn.Module, optimizer, process_group=None) -> nn.Module:
    """Data-parallel FORGE: ``prepare(model, optimizer)`` with every gradient averaged across ranks
    (DDP's arithmetic) as it is produced, then updated and freed; linear weights unfused (their
    layer's dW is materialized for its all-reduce, one layer at a time). Parameters and buffers are
    broadcast from rank 0 first, as DDP does. Use instead of DistributedDataParallel, not with it.

    ``accumulation_steps`` > 1: local gradients accumulate over the micro-batches and are averaged
    once, at the last one (DDP's ``no_sync`` arithmetic). Clipping: ``"exact"`` (the norm pass
    averages the gradients too: the norm is ``clip_grad_norm_``'s on the averaged gradient) and
    ``"previous"`` (the previous step's norm of the averaged gradient); see the module docstring."""
    from forge_num.fused import _RUNTIME, prepare

    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError(
            "forge_num: prepare_data_parallel takes the bare model, not a DistributedDataParallel "
            "(DDP's reducer holds every gradient in its buckets and averages them after backward)"
        )
    world = dist.get_world_size(process_group)
    src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src, group=process_group)
    prepare(model, optimizer)
    handle = model._forge_num_handle
    for module in handle.fused.values():  # the fused path would consume the un-averaged local dW
        module.__class__ = module._forge_num_original_class
        _RUNTIME.pop(module, None)
    handle.fused.clear()
    inv = 1.0 / world

    def reduce(p, grad):
        grad = grad.mul_(inv)  # DDP: at::mul_out(bucket_view, grad, 1/world) before the all-reduce
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=process_group)
        return grad

    optimizer._grad_reducer = reduce
    return model


# --------------------------------------------------------------------------------------------
# FSDP2 (fully_shard)
# --------------------------------------------------------------------------------------------


def fully_sharded_params(model: nn.Module, optimizer) -> set:
    """The parameters of ``model`` that FSDP2 (``fully_shard``) manages: their sharded DTensors, whose
    gradients FSDP2 reduce-scatters and hands to their post-accumulate-grad hooks. Empty where no
    module is an ``FSDPModule``. Called by ``forge_num.prepare``, which leaves the Linear layers of
    these weights unfused (the fused epilogue would consume a local, unreduced dW) and lets every one
    of them be updated in its hook on its local shard. Raises NotImplementedError for what is not
    supported: a trainable parameter outside every ``fully_shard`` unit (its gradient would not be
    reduced), a 2-D mesh (HSDP, FSDP x TP), and the stochastic regimes (bf16-sr, 8bit; see the module
    docstring)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - builds without torch.distributed
        return set()
    managed = {}
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group  # None for a unit that holds no parameter
        for fsdp_param in group.fsdp_params if group is not None else ():
            managed[fsdp_param.sharded_param] = fsdp_param
    if not managed:
        return set()
    for p in managed:
        if p.device_mesh.ndim != 1:
            raise NotImplementedError(
                "forge_num: FSDP2 on a 1-D device mesh only (not HSDP or FSDP x tensor parallel yet)"
            )
    if optimizer.precision == "8bit":
        raise NotImplementedError(
            "forge_num: FSDP2 with precision='8bit' is not supported yet: the 8-bit states are laid out "
            "for the whole parameter; use precision='bf16-sr' or 'fp32' (proofs/distributed.md section 6)"
        )
    opt_params = {p for g in optimizer.param_groups for p in g["params"]}
    outside = [
        n for n, p in model.named_parameters() if p.requires_grad and p in opt_params and p not in managed
    ]
    if outside:
        raise NotImplementedError(
            f"forge_num: under FSDP2 every trained parameter must belong to a fully_shard unit (apply "
            f"fully_shard to the root module too); not sharded: {', '.join(outside[:5])}"
        )
    return set(managed)


# --------------------------------------------------------------------------------------------
# Norms across ranks (clipping and telemetry with sharded parameters)
# --------------------------------------------------------------------------------------------


def _is_sharded(p) -> bool:
    return isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements)


def _shard_group(params):
    """The process group over which the sharded parameters among ``params`` are sharded."""
    groups = {}
    for p in params:
        if _is_sharded(p):
            if p.device_mesh.ndim != 1:
                raise NotImplementedError("forge_num: norms of parameters sharded on a 2-D mesh")
            g = p.device_mesh.get_group()
            groups.setdefault(tuple(dist.get_process_group_ranks(g)), g)
    if len(groups) != 1:
        raise NotImplementedError("forge_num: sharded parameters on more than one group of ranks")
    return next(iter(groups.values()))


def _gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts  # in rank order, the same bits on every rank


def global_total_norm(pairs) -> torch.Tensor:
    """The global gradient norm (fp32, 0-d) from ``(parameter, norm)`` pairs in the optimizer's
    parameter order, each norm the fp32 norm of that parameter's gradient on this rank (of its local
    shard for a sharded DTensor parameter). One all-gather of the per-parameter norms; then, on every
    rank alike, a sharded parameter's norm is ``fl32(sqrt(Σ_r fl64(n_r)²))`` summed in rank order
    (binary64: each square is exact), a replicated parameter's is rank 0's (counted once), and the
    total is ``torch.linalg.vector_norm`` of these in parameter order, as a single process and
    ``clip_grad_norm_`` stack them. Every rank computes the same bits (proofs/distributed.md §5)."""
    params = [p for p, _ in pairs]
    group = _shard_group(params)
    device = pairs[0][1].device
    local = torch.stack([n.to(device, torch.float32) for _, n in pairs])
    parts = _gather(local, group)
    sq = parts[0].double() ** 2
    for t in parts[1:]:
        sq = sq + t.double() ** 2
    sharded = torch.tensor([_is_sharded(p) for p in params], device=device)
    per = torch.where(sharded, sq.sqrt().float(), parts[0])
    return torch.linalg.vector_norm(per, 2.0)


def global_step_totals(params, norm_sq, bad) -> torch.Tensor:
    """(Σ g² in binary64, number of non-finite elements) of a step's updates across ranks, as a CPU
    float64 tensor of two: each rank's records of sharded parameters summed on the rank, then added
    in rank order; the records of replicated parameters (the same on every rank) counted once."""
    group = _shard_group(params)
    device = norm_sq[0].device
    sharded = torch.tensor([_is_sharded(p) for p in params], device=device)
    n2 = torch.stack([n.to(device, torch.float64) for n in norm_sq])
    b = torch.stack([x.to(device, torch.float64) for x in bad])
    local = torch.stack([n2[sharded].sum(), b[sharded].sum(), n2[~sharded].sum(), b[~sharded].sum()])
    parts = _gather(local, group)
    acc = parts[0][:2].clone()
    for t in parts[1:]:
        acc = acc + t[:2]
    return (acc + parts[0][2:]).cpu()


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


def init_optimizer_state(optimizer) -> None:
    """Create every parameter's optimizer state (zeros; DTensors shaped like their parameters) without
    a step, so that a fresh optimizer has tensors for ``torch.distributed.checkpoint`` to load into.

    (``torch.distributed.checkpoint.state_dict`` would otherwise initialize an empty optimizer by
    calling ``step()`` on zero gradients, which a prepared forge_num optimizer refuses: no backward
    ran.) Only for loading: the values are meant to be overwritten by the checkpoint.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            if optimizer.state.get(p):
                continue
            optimizer._prepare_state(p, group)
            state = optimizer.state[p]
            if "step" in state:
                state["step"].zero_()


def checkpoint_state(model: nn.Module, optimizer) -> dict:
    """What to hand to ``torch.distributed.checkpoint.save``: the model's and optimizer's state dicts
    as ``torch.distributed.checkpoint.state_dict.get_state_dict`` gives them (sharded DTensors keyed
    by parameter names), plus forge_num's own step bookkeeping, which that function drops."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if not optimizer.state:
        init_optimizer_state(optimizer)
    msd, osd = get_state_dict(model, optimizer)
    extra = optimizer.state_dict().get("forge_num", {})
    return {"model": msd, "optim": osd, "forge_num": dict(extra)}


def load_checkpoint_state(model: nn.Module, optimizer, state: dict) -> None:
    """Apply a state loaded into ``checkpoint_state(model, optimizer)``'s structure (by
    ``torch.distributed.checkpoint.load``) to the model and the optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra = state.get("forge_num", {})
    optimizer._global_step = int(extra.get("global_step", 0))
    optimizer._prev_norm = extra.get("prev_norm")
