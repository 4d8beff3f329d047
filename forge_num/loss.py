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

The head's copy in the compute dtype (autocast's bf16 cast of an fp32 head: 2 bytes a weight, 0.98 GiB at
Llama-8B's) never exists whole: each GEMM that needs it casts one slab of the head just before it runs,
at most DEFAULT_CHUNK_BYTES of cast weight (_cast_slabs), and frees it after. The logits are computed by
slabs of the vocabulary (the head's rows, _logits), dX = dY · W by slabs of the hidden features (the
head's columns, _input_grad: each a product over the whole vocabulary, as autograd's one GEMM). A slab
never meets a chunk's temporaries (the logits are made before the chunks run, dX after), so the
backward's peak is dY plus the larger of one chunk's temporaries and one slab: at Llama-8B and 4x1024
tokens about 0.9 GiB less than dY, the whole cast and a chunk together. Where no cast is needed (no autocast, or a head already
in the compute dtype) the products are one GEMM each, as before.

While the loss needs a backward, the logits of all rows are computed at once, slab by slab, into one
[rows, vocabulary] buffer: in the backward that buffer is dY's own (the chunks' gradients then overwrite
their logits), in the forward one of the same size, where the backward's dY and the slabs will exceed it
anyway, so the forward's peak stays below the backward's. Both are the same GEMMs (the same slabs into a
fresh buffer of the same shape: the same operands, leading dimension and alignment for cuBLAS), so the
recomputed logits are the forward's. Without a backward (evaluation under torch.no_grad) the forward
takes groups of chunks instead (_group_rows: about DEFAULT_GROUP_BYTES of logits, 512 rows at Llama's
128,256-token vocabulary), so that evaluating many tokens holds no [rows, vocabulary] buffer, with the head
cast once, whole, for all groups (a cast by slabs would repeat for every group: at 8B 3 GB of traffic each).

What is and is not the same as ``F.cross_entropy(model.lm_head(h).float(), y)``: per row, the
same operations (linear in the autocast dtype, upcast, log-softmax, the label's term). The logits come
from GEMMs of other shapes than the whole one (slabs of the vocabulary, groups of rows), which cuBLAS may
compute with other algorithms, so the logits (and from them the loss and dY) may differ in their last bits
from the whole GEMM's; so may dX, a product of fewer columns; the loss sums the chunks' sums in another
order than torch's mean (proofs/loss.md). The head's update from dY is the fused kernel's, bit-exact as
everywhere in forge_num given its dY.
"""

from __future__ import annotations

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
# A slab of the head cast to the compute dtype (module docstring) holds at most DEFAULT_CHUNK_BYTES, as a
# chunk's temporaries do, which it never meets: the backward's peak is dY and the larger of the two. Its
# vocabulary rows (or hidden columns) are whole _SLAB_TILE tiles where one fits, so that every slab starts
# its columns of the logits (or of dX) a multiple of 256 bytes into a row in bf16 (as aligned as the first
# slab's, for cuBLAS's vector loads): at Llama's 4096 features 16384 rows a slab (8 slabs), dX's at
# 128,256 words 512 columns (8 slabs).
_SLAB_TILE = 128
# Logits (in the compute dtype) one GEMM computes at most in a forward without backward (evaluation): 512
# rows of Llama's vocabulary in bf16, where the GEMM's arithmetic intensity (~rows FLOP a byte of the head)
# passes the H100/H200's ~230 FLOP a byte of bf16 tensor-core rate to memory bandwidth.
DEFAULT_GROUP_BYTES = 128 * 2**20


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
    """Rows of logits one GEMM computes in a forward without backward (module docstring): all rows where
    their logits fit DEFAULT_GROUP_BYTES, else as many whole chunks as fit, at least one."""
    if n * vocab * itemsize <= DEFAULT_GROUP_BYTES:
        return max(n, chunk_rows)
    return chunk_rows * max(1, DEFAULT_GROUP_BYTES // (chunk_rows * vocab * itemsize))


def _needs_cast(weight, dt) -> bool:
    return dt is not None and weight.dtype != dt


def _cast_slabs(length: int, other: int, itemsize: int):
    """[start, end) slabs of ``length`` rows (or columns) of the head, each cast with its ``other``
    elements a row to at most DEFAULT_CHUNK_BYTES of ``itemsize``-byte elements: whole _SLAB_TILE tiles
    where one fits, else one tile."""
    rows = max(1, DEFAULT_CHUNK_BYTES // (other * itemsize))
    rows = rows - rows % _SLAB_TILE if rows >= _SLAB_TILE else _SLAB_TILE
    return _chunks(length, rows)


def _logits(hc, weight, dt, g0, g1, out=None):
    """The logits of the rows [g0, g1) in the compute dtype, hc[g0:g1] · Wᵀ as F.linear's product, into
    ``out`` (dY in the backward) or a buffer of their own. Where the head needs a cast to ``dt``, by slabs
    of the vocabulary: each slab's rows of the head cast just before its GEMM, which writes the slab's
    columns of ``out``; else one GEMM. One definition for the forward and the backward's recomputation,
    which must give the same values."""
    if out is None:
        out = torch.empty((g1 - g0, weight.shape[0]), dtype=hc.dtype, device=hc.device)
    if not _needs_cast(weight, dt):
        return torch.mm(hc[g0:g1], weight.t(), out=out)
    for v0, v1 in _cast_slabs(weight.shape[0], weight.shape[1], hc.element_size()):
        torch.mm(hc[g0:g1], weight[v0:v1].to(dt).t(), out=out[:, v0:v1])
    return out


def _input_grad(dy, weight, dt):
    """dX = dY · W in the compute dtype. Where the head needs a cast to ``dt``, by slabs of its hidden
    columns: each slab's columns cast just before its GEMM, a product over the whole vocabulary as
    autograd's one GEMM, into the slab's columns of dX; else one GEMM."""
    if not _needs_cast(weight, dt):
        return dy @ weight
    dx = torch.empty((dy.shape[0], weight.shape[1]), dtype=dy.dtype, device=dy.device)
    for c0, c1 in _cast_slabs(weight.shape[1], weight.shape[0], dy.element_size()):
        torch.mm(dy, weight[:, c0:c1].to(dt), out=dx[:, c0:c1])
    return dx


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
        # torch's mean reduction divides by the sum of the class weights of the counted rows: their
        # number, in fp32 (NaN for no counted row, as torch)
        count = (labels != ignore_index).sum().to(torch.float32)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        n = hc.shape[0]
        if any(ctx.needs_input_grad[:2]):  # all rows at once, as the backward recomputes them (module docstring)
            group_rows, w, w_dt = n, weight, dt
        else:  # evaluation: groups of rows, the head cast once for all of them (nothing to recompute alike)
            group_rows = _group_rows(n, chunk_rows, weight.shape[0], hc.element_size())
            w, w_dt = (weight.to(dt), None) if _needs_cast(weight, dt) else (weight, dt)
        for g0, g1 in _chunks(n, group_rows):
            logits = _logits(hc, w, w_dt, g0, g1)
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
        # the value torch's mean nll backward writes at each counted label (negated): grad / total_weight
        row_grad = grad_loss.to(torch.float32) / count
        # every row's logits into dY, as the forward computed them; then each chunk's gradient over its logits
        dy = _logits(hc, weight, dt, 0, hc.shape[0],
                     out=torch.empty((hc.shape[0], weight.shape[0]), dtype=hc.dtype, device=hc.device))
        for r0, r1 in _chunks(hc.shape[0], ctx.chunk_rows):
            log_probs = _chunk_log_probs(dy[r0:r1])
            # rounded to the logits' dtype, as the upcast's backward does; over the chunk's own logits, read
            # (upcast) above
            dy[r0:r1] = _chunk_logits_grad(log_probs, labels[r0:r1], ctx.ignore_index, row_grad)
            del log_probs
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], False)
        # dX with the pre-update weight, before the head's update: by slabs of the head cast one at a time
        dx = _input_grad(dy, weight, dt).to(ctx.x_dtype) if needs[0] else None
        if ctx.layer is not None:  # a fused head: the update in its backward (or dW where materialized)
            _, dw, _ = fused_linear_backward(ctx.layer, ctx.use, ctx.param, hc, weight, None, dy, dt, ctx.x_dtype,
                                             False, (False, needs[1], False))
        else:  # as autograd for F.linear: dW = dYᵀ h in the compute dtype, cast back to the weight's
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
