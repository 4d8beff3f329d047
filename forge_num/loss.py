"""linear_cross_entropy: a language model's head and its cross-entropy loss, computed in row chunks.

Under Hugging Face's loss the logits of a step cost 12 bytes each at their peak: the bf16 logits,
their fp32 upcast, and the fp32 and bf16 gradients. At 4096 tokens and Llama's 128,256-token
vocabulary that is 6.3 GB, more than the weight gradients forge_num never materializes at 1B
parameters. Here the logits exist one chunk of rows at a time:

    forward    loss = Σ_chunks cross_entropy(float(h_c · Wᵀ), y_c, reduction="sum") / count
    backward   per chunk, again: dL/dlogits_c = the aten calls autograd would make for the same
               chunk (nll_loss_backward, _log_softmax_backward_data), with the scalar
               grad_loss / count (what torch's mean reduction hands every row: -(grad / total_weight)
               at the label, in fp32), stored in the logits' dtype (the upcast's backward rounds it
               to bf16 so) into dY [tokens, vocabulary]; then dX = dY · W and the head's update
               from dW = dYᵀ h (the fused kernel where the head is a fused layer, else returned
               to autograd as F.linear would)

so the backward holds 2 bytes per logit (dY, which the head's update needs whole) plus one chunk's
temporaries. The price is the head's GEMM once more in the backward.

The logits' GEMM runs over a group of chunks at once (_group_rows: about DEFAULT_GROUP_BYTES of logits,
512 rows at Llama's 128,256-token vocabulary), the fp32 work chunk by chunk: a 64-row GEMM reads the
whole head (0.5-1 GB in bf16) for 64 rows of output and is bound by those bytes, not by its arithmetic
(512 such GEMMs a step at Llama-1B and 8x2048 tokens, forward and backward: ~90 ms of the 0.577 s that
session 30 measured for the captured 8bit step with this loss, against 0.455 s with the model's own).
The forward's group logits are a buffer of their own; the backward's are dY's own rows, which the
group's chunks then overwrite with their gradients, so the backward holds nothing more than before.

What is and is not the same as ``F.cross_entropy(model.lm_head(h).float(), y)``: per row, the
same operations (linear in the autocast dtype, upcast, log-softmax, the label's term). A group's
logits come from a GEMM over fewer rows, which cuBLAS may compute with another algorithm, so the
logits (and from them the loss and dY) may differ in their last bits from the whole GEMM's; the
loss sums the chunks' sums in another order than torch's mean. The forward and the backward take the
same groups, the same GEMM (torch.mm into a buffer whose first byte lies at the same offset modulo
_GEMM_ALIGNMENT), so the recomputed logits are the forward's. The head's update from dY is the
fused kernel's, bit-exact as everywhere in forge_num given its dY.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["linear_cross_entropy"]

# Per-chunk temporaries, in bytes per logit: three fp32 [rows, V] tensors at the backward's
# recomputation (the log-softmax, the nll loss's gradient and the log-softmax's; the upcast logits are
# freed once their log-softmax exists), 12; four and 16 while the backward asked autograd for the
# chunk's gradient (bench/NOTES.md, session 19). They sit on top of the backward's dY (2 bytes a logit,
# all rows): with a tied head's update split by rows in the stochastic regimes
# (forge_num.fused._SplitHeadUpdate), that is the 8bit step's peak at Llama-1B and -3B, 4x1024 tokens.
# 128 MiB of them at most (64 rows of Llama's 128,256-token vocabulary, 94 MiB; 128 rows and 256 MiB
# before v28, 512 MiB before that), each chunk's GEMM whole 64-row tiles (_CHUNK_ROW_TILE). At 12
# bytes a logit other vocabularies take more rows than at 16 (GPT-2's 50,257: 192 rows, was 128;
# 32,000: 320, was 256), which regroups the loss's sum (its last bits) and may change the chunk GEMM's
# algorithm on the GPU.
_BYTES_PER_CHUNK_LOGIT = 12
DEFAULT_CHUNK_BYTES = 128 * 2**20
_CHUNK_ROW_TILE = 64
# Logits (in the compute dtype) one GEMM computes at most: 512 rows of Llama's vocabulary in bf16, where
# the GEMM's arithmetic intensity (~rows FLOP a byte of the head) passes the H100/H200's ~230 FLOP a byte
# of bf16 tensor-core rate to memory bandwidth. In the forward a buffer of its own (at the forward's end,
# where dY, at least this large, does not yet exist); in the backward dY's rows.
DEFAULT_GROUP_BYTES = 128 * 2**20
# PyTorch tells cuBLASLt the alignment of each operand's address, up to 256 bytes
# (aten/src/ATen/cuda/CUDABlas.cpp, _getAlignment): every group's logits start at a multiple of it in dY,
# as a fresh buffer does, so that the forward's and the backward's GEMMs are asked the same
_GEMM_ALIGNMENT = 256


def linear_cross_entropy(hidden: torch.Tensor, head: nn.Linear, labels: torch.Tensor, *, ignore_index: int = -100,
                         chunk_rows: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``head(hidden)`` against ``labels`` over the labels that are not
    ``ignore_index``, without the full logits (module docstring). ``hidden`` [..., H], ``head`` an
    nn.Linear [V, H] without bias (a forge_num fused layer or not), ``labels`` [...] integer class
    indices (shift them for next-token prediction first). ``chunk_rows``: rows of logits computed
    at once (default: default_chunk_rows(vocabulary)). Returns a 0-d tensor."""
    from forge_num.fused import _RUNTIME

    if not isinstance(head, nn.Linear):
        raise TypeError(f"linear_cross_entropy: head must be an nn.Linear, got {type(head).__name__}")
    if head.bias is not None:
        raise ValueError("linear_cross_entropy: an LM head with a bias is not supported")
    if type(head.weight).__name__ == "DTensor":
        raise ValueError("linear_cross_entropy: a sharded (DTensor: tensor parallel or FSDP2) LM head is not "
                         "supported; compute the loss from the model's logits there")
    if hidden.shape[-1] != head.in_features:
        raise ValueError(f"linear_cross_entropy: hidden has {hidden.shape[-1]} features, the head takes "
                         f"{head.in_features}")
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(f"linear_cross_entropy: labels of shape {tuple(labels.shape)} do not match hidden's "
                         f"leading shape {tuple(hidden.shape[:-1])}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"linear_cross_entropy: labels must be int64 or int32 class indices, got {labels.dtype}")
    if hidden.device != head.weight.device or labels.device != hidden.device:
        raise ValueError(f"linear_cross_entropy: hidden on {hidden.device}, head on {head.weight.device}, labels on "
                         f"{labels.device}: one device expected")
    vocab = head.out_features
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(vocab)
    if not (isinstance(chunk_rows, int) and chunk_rows >= 1):
        raise ValueError(f"linear_cross_entropy: chunk_rows must be a positive int, got {chunk_rows!r}")
    weight = head.weight
    layer = _RUNTIME.get(head) if torch.is_grad_enabled() and weight.requires_grad else None
    use = layer.new_use() if layer is not None else None
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1).long(), layer,
                                     use, ignore_index, chunk_rows)


def default_chunk_rows(vocab: int) -> int:
    """Rows of logits a chunk computes by default: as many as DEFAULT_CHUNK_BYTES of temporaries
    hold, rounded down to whole row tiles of the chunk's GEMM where there is at least one."""
    rows = max(1, DEFAULT_CHUNK_BYTES // (_BYTES_PER_CHUNK_LOGIT * vocab))
    return rows - rows % _CHUNK_ROW_TILE if rows >= _CHUNK_ROW_TILE else rows


def _chunks(n: int, rows: int):
    return ((r, min(r + rows, n)) for r in range(0, n, rows))


def _group_rows(n: int, chunk_rows: int, vocab: int, itemsize: int) -> int:
    """Rows of logits one GEMM computes (module docstring): a whole number of chunks, as many as
    DEFAULT_GROUP_BYTES of logits hold, and a multiple of the chunks whose logits fill whole
    _GEMM_ALIGNMENT-byte units, so that every group starts aligned in dY; one chunk where no such multiple
    fits the budget (each chunk's GEMM as before, its logits a buffer of their own), all rows where they
    fit."""
    if n * vocab * itemsize <= DEFAULT_GROUP_BYTES:
        return max(n, chunk_rows)
    chunks = DEFAULT_GROUP_BYTES // (chunk_rows * vocab * itemsize)
    aligned = _GEMM_ALIGNMENT // math.gcd(_GEMM_ALIGNMENT, chunk_rows * vocab * itemsize)  # chunks a unit
    return chunk_rows * (chunks - chunks % aligned) if chunks >= aligned else chunk_rows


def _group_logits(hc, wc, g0, g1, out=None):
    """The logits of the rows [g0, g1) in the compute dtype, one GEMM (as F.linear's: hc · wcᵀ), into
    ``out`` (dY's rows in the backward) or a buffer of their own. One definition for the forward and the
    backward's recomputation, which must give the same values."""
    if out is None:
        out = torch.empty((g1 - g0, wc.shape[0]), dtype=hc.dtype, device=hc.device)
    return torch.mm(hc[g0:g1], wc.t(), out=out)


def _chunk_log_probs(logits):
    """The fp32 log-softmax of one chunk's logits, as torch's cross-entropy computes it: upcast to fp32,
    log-softmax over the vocabulary (the upcast freed on return)."""
    return torch.log_softmax(logits.float(), 1)


def _chunk_loss_sum(log_probs, labels, ignore_index):
    """Σ of the rows' cross-entropy terms: torch's nll loss with reduction "sum", as F.cross_entropy
    ends."""
    return F.nll_loss(log_probs, labels, ignore_index=ignore_index, reduction="sum")


_SUM = 2  # torch's reduction enum (at::Reduction::Sum), as F.nll_loss hands it to aten


def _chunk_logits_grad(log_probs, labels, ignore_index, grad_sum):
    """d(Σ_rows loss) / d(upcast logits) for one chunk, scaled by ``grad_sum`` (a 0-d fp32 tensor): the
    aten calls autograd makes for it, nll_loss_forward's total weight, nll_loss_backward, then
    _log_softmax_backward_data, so the bits are autograd's by construction, without its graph (a third
    of the host time a chunk) and without holding the upcast logits beside the gradients (three fp32
    [rows, V] tensors alive, not four)."""
    aten = torch.ops.aten
    total_weight = aten.nll_loss_forward(log_probs, labels, None, _SUM, ignore_index)[1]
    grad_log_probs = aten.nll_loss_backward(grad_sum, log_probs, labels, None, _SUM, ignore_index, total_weight)
    return aten._log_softmax_backward_data(grad_log_probs, log_probs, 1, torch.float32)


class WeightGrad:
    """F.linear's weight gradient as autograd computes it, ``(dy.t() @ x).to(dtype)`` (the product in
    the operands' dtype, then cast to the weight's), bit for bit, computed when called: held by the
    caller, or deposited for a tied embedding's backward (forge_num.fused._TiedRows). It owns dY and X
    (the caller drops its own references) and lets go of them once the product is taken, so that the
    bytes alive at once are the least of two ways, where the cast widens bf16 or fp16 to fp32 (p the
    product's bytes, 2p the result's):

    * the cast: the product with dY (dY + p), then the product with the result (3p);
    * in place, where dY < p (fewer rows than columns of X): the product written into the upper half
      of the fp32 result's own bytes and widened there (dY + 2p, then 2p). With n elements, source
      element j lies at 16-bit slot n + j and result element i covers slots [2i, 2i + 2): widening the
      elements [a, b) in one copy reads slots [n + a, n + b) and writes [2a, 2b), disjoint while
      2b <= n + a, and never reaches an unread source (2b <= n + b). The chunks halve what is left,
      b = (n + a) // 2, about log2(n) copies; the last _WIDEN_TAIL elements go through a copy of their
      own. Widening is exact, so the bits are the cast's.

    At Llama-3B's head and 1024 tokens: 1.72 GiB instead of 2.2."""

    __slots__ = ("dy", "x", "dtype")

    def __init__(self, dy: torch.Tensor, x: torch.Tensor, dtype: torch.dtype):
        self.dy, self.x, self.dtype = dy, x, dtype

    def nbytes(self) -> int:
        """What this holds until called: dY and X."""
        return self.dy.numel() * self.dy.element_size() + self.x.numel() * self.x.element_size()

    def __call__(self) -> torch.Tensor:
        rows, cols = self.dy.shape[1], self.x.shape[1]
        n, low = rows * cols, self.dy.dtype
        # n % 256: the product's address (n 16-bit slots into the result) keeps a fresh tensor's 512-byte
        # alignment, so cuBLAS is asked the same as for ``dy.t() @ x`` and picks its algorithm alike
        in_place = (self.dtype == torch.float32 and low in (torch.bfloat16, torch.float16) and self.x.dtype == low
                    and n > _WIDEN_TAIL and n % 256 == 0 and self.dy.numel() < n)
        if not in_place:
            product = self.dy.t() @ self.x
            self.dy = self.x = None
            return product.to(self.dtype)
        out = torch.empty((rows, cols), dtype=self.dtype, device=self.dy.device)
        flat = out.view(-1)
        slots = flat.view(low)  # 2n 16-bit slots; the product goes into the upper n
        torch.mm(self.dy.t(), self.x, out=slots[n:].view(rows, cols))
        self.dy = self.x = None
        a = 0
        while n - a > _WIDEN_TAIL:
            b = (n + a) // 2
            flat[a:b].copy_(slots[n + a:n + b])
            a = b
        flat[a:].copy_(slots[n + a:].clone())
        return out


# the in-place widening's last elements, copied out of the result before they are widened
_WIDEN_TAIL = 1 << 16


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, layer, use, ignore_index, chunk_rows):
        from forge_num.fused import _autocast_dtype

        dt = _autocast_dtype(hidden.device.type)
        hc = hidden.to(dt) if dt is not None else hidden
        wc = weight.to(dt) if dt is not None else weight
        # torch's mean reduction divides by the sum of the class weights of the counted rows: their
        # number, in fp32 (NaN for no counted row, as torch)
        count = (labels != ignore_index).sum().to(torch.float32)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        group_rows = _group_rows(hc.shape[0], chunk_rows, weight.shape[0], hc.element_size())
        for g0, g1 in _chunks(hc.shape[0], group_rows):
            logits = _group_logits(hc, wc, g0, g1)
            for r0, r1 in _chunks(g1 - g0, chunk_rows):
                log_probs = _chunk_log_probs(logits[r0:r1])
                loss_sum = loss_sum + _chunk_loss_sum(log_probs, labels[g0 + r0:g0 + r1], ignore_index)
            del logits, log_probs
        ctx.save_for_backward(hc, weight, labels, count)
        ctx.param, ctx.layer, ctx.use, ctx.dt, ctx.x_dtype = weight, layer, use, dt, hidden.dtype
        ctx.ignore_index, ctx.chunk_rows = ignore_index, chunk_rows
        if ctx.needs_input_grad[1]:
            from forge_num.fused import _TIED_ROWS

            rows = _TIED_ROWS.get(weight)
            if rows is not None:  # a tied head: its other uses in a backward keep its gradient whole
                rows.add_head_node(ctx)
        return loss_sum / count

    @staticmethod
    def backward(ctx, grad_loss):
        from forge_num.fused import _TIED_ROWS, fused_linear_backward

        hc, weight, labels, count = ctx.saved_tensors
        dt = ctx.dt
        wc = weight.to(dt) if dt is not None else weight
        # the value torch's mean nll backward writes at each counted label (negated): grad / total_weight
        row_grad = grad_loss.to(torch.float32) / count
        dy = torch.empty((hc.shape[0], weight.shape[0]), dtype=hc.dtype, device=hc.device)
        group_rows = _group_rows(hc.shape[0], ctx.chunk_rows, weight.shape[0], hc.element_size())
        for g0, g1 in _chunks(hc.shape[0], group_rows):
            # the group's logits in dY's rows where they start aligned as a fresh buffer does (every group of
            # several chunks: _group_rows), else in a buffer of their own as in the forward
            in_dy = (g0 * dy.shape[1] * dy.element_size()) % _GEMM_ALIGNMENT == 0
            logits = _group_logits(hc, wc, g0, g1, out=dy[g0:g1] if in_dy else None)
            for r0, r1 in _chunks(g1 - g0, ctx.chunk_rows):
                log_probs = _chunk_log_probs(logits[r0:r1])
                # rounded to the logits' dtype, as the upcast's backward does; over the chunk's own logits,
                # read (upcast) above
                dy[g0 + r0:g0 + r1] = _chunk_logits_grad(log_probs, labels[g0 + r0:g0 + r1], ctx.ignore_index,
                                                         row_grad)
                del log_probs
            del logits
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], False)
        if ctx.layer is not None:  # a fused head: dX first, then the update in its backward (or dW where materialized)
            # dX takes the cast the chunks were recomputed with (equal to weight.to(dt): the weight
            # changes only in this update, after dX), not a second one: one bf16 copy of the head alive
            # instead of two (0.98 GiB at Llama-8B's head, at the step's peak)
            dx, dw, _ = fused_linear_backward(ctx.layer, ctx.use, ctx.param, hc, weight, wc if dt is not None else None,
                                              dy, dt, ctx.x_dtype, False, needs)
        else:  # as autograd for F.linear: both products in the compute dtype, dW cast back to the weight's
            dx = (dy @ wc).to(ctx.x_dtype) if needs[0] else None
            del wc  # the head's bf16 cast (2 bytes a weight; 0.73 GiB at Llama-3B) is dead before dW
            dw = None
            rows = _TIED_ROWS.get(ctx.param) if needs[1] else None
            # tied, in a stochastic regime: the rows the batch's tokens do not touch are updated now, in
            # row blocks, and the touched rows' gradient waits for the embedding's backward
            # (forge_num.fused._SplitHeadUpdate): no [V, H] product at all
            split = rows is not None and rows.split_head_update(ctx.param, dy, hc, ctx)
            if needs[1] and not split:
                weight_grad = WeightGrad(dy, hc, weight.dtype)
                del dy
                if rows is not None and weight_grad.nbytes() < weight.numel() * weight.element_size():
                    # a head tied to a prepared model's embedding, whose dY and input take less memory
                    # than its dW: dW is computed in the embedding's backward (forge_num.fused.
                    # _TiedRows), after every layer's backward, and no [V, H] tensor is held through them
                    if not rows.deposit_head_grad(weight_grad, ctx):
                        dw = weight_grad()
                else:
                    dw = weight_grad()
                    # tied: dW waits for the embedding's backward, which adds its touched rows into it,
                    # instead of going to autograd, which would sum it with a second dense [V, H] gradient
                    if rows is not None and rows.deposit_head_grad(dw, ctx):
                        dw = None
        return dx, dw, None, None, None, None, None
