"""linear_cross_entropy: a language model's head and its cross-entropy loss, without the logits or their
gradient ever whole.

Under Hugging Face's loss the logits of a step cost 12 bytes each at their peak: the bf16 logits,
their fp32 upcast, and the fp32 and bf16 gradients. At 4096 tokens and Llama's 128,256-token
vocabulary that is 6.3 GB, more than the weight gradients forge_num never materializes at 1B
parameters. Here the logits are made by blocks: B(g, s) = h_g · W_sᵀ, the rows of a group g (_group_rows:
512 rows at Llama's vocabulary) against a slab s of the head's rows (_slab_rows: 16 Mi weights, 8192 words at
2048 features, 4096 at 4096: the tied head's split blocks, forge_num.fused._split_block_rows):

    forward    per group: its logits [rows, V] from its blocks; per chunk of its rows, torch's log-softmax
               in fp32 and the nll loss's sum; and per row the log-softmax's max and logsum
               (_row_normalizers). loss = Σ_chunks Σ_rows term / count.
    backward   per slab s: its blocks again (the same GEMMs, so the same logits); dY_s = dL/dlogits of its
               columns from the logits and the row normalizers, through the aten calls autograd makes
               (_slab_logits_grad: the bits of the whole row's backward); dX += dY_s · W_s in fp32
               (_add_input_grad); then dY_s to the head's update: a tied head's split update takes it as
               its block (forge_num.fused._SplitHeadUpdate), else it is copied into dY [tokens, V] for the
               fused kernel (a fused head) or F.linear's dW (a plain or tied head that does not split).

So a forward holds one group's logits and one chunk's temporaries; a backward one slab of dY (n x 8192 bf16 at
Llama-1B's head: 64 MiB at 4096 tokens) and one piece's temporaries, plus dY whole only where the head's
update takes it whole. The price: the head's GEMM once more in the backward, and where the head needs a cast
to the compute dtype (autocast's bf16 cast of an fp32 head) a cast of each slab for each group in the forward
(the head's bytes read once a group: 8 times at 4096 tokens) and once in the backward; the whole cast never
exists (0.98 GiB at Llama-8B's head).

Why by blocks of both: log-softmax needs whole rows (the forward's groups), the head's update whole
columns of dY (the slabs: dW_s = dY_sᵀ h over every row). A block's GEMM is the same call in both passes (the
same operands, shape, and a fresh output of the same leading dimension and alignment: _block_logits), so the
backward recomputes the forward's logits bit for bit, on cuBLAS too. And every element of the log-softmax's
backward depends on its row only through the row's max and logsum (saved by the forward, 8 bytes a row)
and through Σ_j dL/dlog_probs_j (−grad at the label, or 0), which one extra column carries into a slab.

What is and is not the same as ``F.cross_entropy(model.lm_head(h).float(), y)``: per row, the
same operations (linear in the autocast dtype, upcast, log-softmax, the label's term, and the backward's
aten calls). The logits come from GEMMs of other shapes than the whole one (blocks), which cuBLAS may
compute with other algorithms, so the logits (and from them the loss and dY) may differ in their last bits
from the whole GEMM's; dX is a sum of the slabs' products in fp32, rounded once, where torch's one GEMM sums
in its own order; the loss sums the chunks' sums in another order than torch's mean (proofs/loss.md). Given
the logits, dY is torch's bit for bit. The head's update from dY is the fused kernel's, bit-exact as
everywhere in forge_num given its dY.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["linear_cross_entropy"]

# Per-chunk temporaries, in bytes per logit: three fp32 tensors (the forward's upcast logits, their
# log-softmax and the nll loss's terms; the backward's log-probabilities and two gradients of a piece,
# _piece_rows), 12 (bench/NOTES.md, session 19). 128 MiB of them at most (64 rows of Llama's 128,256-token
# vocabulary, 94 MiB), each chunk whole 64-row tiles (_CHUNK_ROW_TILE). At 12 bytes a logit GPT-2's 50,257
# words take 192 rows, 32,000 take 320. The chunks set the order of the loss's sum (its last bits).
_BYTES_PER_CHUNK_LOGIT = 12
DEFAULT_CHUNK_BYTES = 128 * 2**20
_CHUNK_ROW_TILE = 64
_SUM = 2  # torch's reduction enum (at::Reduction::Sum), as F.nll_loss hands it to aten
# Logits (in the compute dtype) of one group of rows, which the forward computes at once and log-softmaxes
# chunk by chunk: 512 rows of Llama's vocabulary in bf16. Without a backward (evaluation) a group is one GEMM,
# whose arithmetic intensity (~rows FLOP a byte of the head) at 512 rows passes the H100/H200's ~230 FLOP a
# byte of bf16 tensor-core rate to memory bandwidth; with one, a GEMM a slab of the vocabulary (module
# docstring).
DEFAULT_GROUP_BYTES = 128 * 2**20


def linear_cross_entropy(hidden: torch.Tensor, head: nn.Linear, labels: torch.Tensor, *, ignore_index: int = -100,
                         chunk_rows: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``head(hidden)`` against ``labels`` over the labels that are not
    ``ignore_index``, without the full logits (module docstring). ``hidden`` [..., H], ``head`` an
    nn.Linear [V, H] without bias (a forge_num fused layer or not), ``labels`` [...] integer class
    indices (shift them for next-token prediction first). ``chunk_rows``: rows whose fp32 temporaries
    (the log-softmax and its gradients, 12 bytes a logit of a whole row) exist at once, in the forward and,
    as many bytes over slabs of the vocabulary, in the backward (default: default_chunk_rows(vocabulary),
    128 MiB of them). Returns a 0-d tensor."""
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


def _slab_rows(hidden: int) -> int:
    """Vocabulary rows of the head a slab holds (module docstring): the tied head's split blocks
    (forge_num.fused._split_block_rows, 16 Mi weights: 8192 rows at 2048 features, 4096 at 4096), so that
    a slab's dY is the block the split update takes."""
    from forge_num.fused import _split_block_rows

    return _split_block_rows(hidden)


def _slab_weight(weight, dt, v0, v1):
    """The head's rows [v0, v1) as the GEMMs take them: cast to the compute dtype ``dt`` where it needs a
    cast (a fresh tensor, freed by the caller after its GEMMs), else a view."""
    return weight[v0:v1].to(dt) if _needs_cast(weight, dt) else weight[v0:v1]


def _block_logits(hc, slab_weight, g0, g1):
    """The logits of rows [g0, g1) and one slab of the vocabulary, hc[g0:g1] · W_slabᵀ, into a fresh
    [rows, slab] tensor: one definition for the forward and the backward's recomputation, which must
    give the same bits (the same operands, shape, leading dimension and alignment for the BLAS library)."""
    return torch.mm(hc[g0:g1], slab_weight.t())


def _row_normalizers(logits, log_probs):
    """(max, logsum) of each row, as the log-softmax ``log_probs`` of ``logits`` computed them: torch's
    log-softmax writes (x − max) − log Σ exp(x − max) (the CPU and CUDA kernels alike), so at the row's
    largest logit it wrote (max − max) − logsum = −logsum exactly. With these, (x − max) − logsum
    recomputes any element of the row from its logit alone, bit for bit (tests/test_loss.py)."""
    row_max, at = logits.max(1, keepdim=True)
    return row_max.float().squeeze(1), log_probs.gather(1, at).squeeze(1).neg()


def _slab_targets(labels, v0, w, ignore_index):
    """Each row's column in a slab [v0, v0 + w) plus its extra column w (_slab_logits_grad): its label's,
    w where the label lies in another slab, and -1 (the ignored index of the slab's aten calls: never a
    column) where the row is ignored."""
    inside = (labels >= v0) & (labels < v0 + w)
    return torch.where(labels == ignore_index, -1, torch.where(inside, labels - v0, w))


def _slab_logits_grad(logits, row_max, row_logsum, targets, row_grad, out, piece_rows):
    """dL/dlogits of one slab of the vocabulary [v0, v0 + w) for some rows, from their logits and the
    forward's row normalizers, into ``out`` (the logits' dtype; ``logits`` itself may be it: each piece
    reads its rows before it writes them): the bits torch's backward of the whole row gives those columns
    (nll_loss_backward, then _log_softmax_backward_data, as autograd calls them). Each element of that
    backward depends on the row only through Σ_j dL/dlog_probs_j, which is −row_grad for a counted row
    (its label's entry) and 0 for an ignored one: so a slab takes one extra column that carries the
    label's entry where the label lies in another slab (``targets``: _slab_targets), with log-probability
    −inf (exp = 0), and the same aten calls then compute every other element as on the whole row. The
    log-probabilities are (x − max) − logsum (_row_normalizers). In pieces of ``piece_rows`` rows
    (_piece_rows), three fp32 [rows, w + 1] temporaries each."""
    aten = torch.ops.aten
    w = logits.shape[1]
    unused_total_weight = row_grad  # a sum reduction does not divide by it
    for a, b in _chunks(logits.shape[0], piece_rows):
        log_probs = torch.empty((b - a, w + 1), dtype=torch.float32, device=logits.device)
        log_probs[:, w] = float("-inf")
        shifted = log_probs[:, :w]
        shifted.copy_(logits[a:b]).sub_(row_max[a:b, None]).sub_(row_logsum[a:b, None])
        grad_log_probs = aten.nll_loss_backward(row_grad, log_probs, targets[a:b], None, _SUM, -1,
                                                unused_total_weight)
        out[a:b] = aten._log_softmax_backward_data(grad_log_probs, log_probs, 1, torch.float32)[:, :w]
        del log_probs, shifted, grad_log_probs


def _piece_rows(chunk_rows: int, vocab: int, slab: int) -> int:
    """Rows of one piece of the backward's gradient over a slab of ``slab`` words: as many as hold no more
    temporaries than a chunk of the forward (chunk_rows whole rows, _BYTES_PER_CHUNK_LOGIT a logit), the
    memory bound linear_cross_entropy's chunk_rows sets. At Llama's vocabulary and 8192-word slabs ~1000
    rows (8 million elements an op), where rows of the chunk's 64 would take ~16 times the launches."""
    return max(1, chunk_rows * vocab // (slab + 1))


def _add_input_grad(dx32, dy_slab, slab_weight):
    """dx32 += dY_slab · W_slab with every product's terms summed in fp32 (cuBLAS's fp32 output of a
    bf16 or fp16 GEMM on CUDA; the operands widened, exactly, elsewhere): dX = Σ_slabs dY_s · W_s, one
    rounding to the compute dtype at the end, where autograd's one GEMM sums the whole vocabulary in fp32
    and rounds once too."""
    if dy_slab.dtype == torch.float32:
        dx32.addmm_(dy_slab, slab_weight)
    elif dy_slab.is_cuda:
        dx32.add_(torch.mm(dy_slab, slab_weight, out_dtype=torch.float32))
    else:
        wide = slab_weight.float()
        for a, b in _chunks(dy_slab.shape[0], max(1, DEFAULT_CHUNK_BYTES // (4 * dy_slab.shape[1]))):
            dx32[a:b].addmm_(dy_slab[a:b].float(), wide)


def _chunk_log_probs(logits):
    """The fp32 log-softmax of one chunk's logits, as torch's cross-entropy computes it: upcast to fp32,
    log-softmax over the vocabulary (the upcast freed on return)."""
    return torch.log_softmax(logits.float(), 1)


def _chunk_loss_sum(log_probs, labels, ignore_index):
    """Σ of the rows' cross-entropy terms: torch's nll loss with reduction "sum", as F.cross_entropy
    ends."""
    return F.nll_loss(log_probs, labels, ignore_index=ignore_index, reduction="sum")


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
        n, vocab = hc.shape[0], weight.shape[0]
        group_rows = _group_rows(n, chunk_rows, vocab, hc.element_size())
        backward = any(ctx.needs_input_grad[:2])
        if backward:  # the logits by blocks of a group's rows and a slab, as the backward recomputes them
            slabs = list(_chunks(vocab, _slab_rows(weight.shape[1])))
            row_max = torch.empty(n, dtype=torch.float32, device=hidden.device)
            row_logsum = torch.empty_like(row_max)
        else:  # evaluation: the head cast once for all groups (nothing to recompute alike)
            whole = weight.to(dt) if _needs_cast(weight, dt) else weight
        for g0, g1 in _chunks(n, group_rows):
            if backward:
                logits = torch.empty((g1 - g0, vocab), dtype=hc.dtype, device=hc.device)
                for v0, v1 in slabs:
                    logits[:, v0:v1] = _block_logits(hc, _slab_weight(weight, dt, v0, v1), g0, g1)
            else:
                logits = torch.mm(hc[g0:g1], whole.t())
            for r0, r1 in _chunks(g1 - g0, chunk_rows):
                log_probs = _chunk_log_probs(logits[r0:r1])
                chunk = slice(g0 + r0, g0 + r1)
                loss_sum = loss_sum + _chunk_loss_sum(log_probs, labels[chunk], ignore_index)
                if backward:
                    row_max[chunk], row_logsum[chunk] = _row_normalizers(logits[r0:r1], log_probs)
            del logits, log_probs
        if backward:
            ctx.save_for_backward(hc, weight, labels, count, row_max, row_logsum)
            ctx.group_rows, ctx.slabs = group_rows, slabs
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

        hc, weight, labels, count, row_max, row_logsum = ctx.saved_tensors
        dt, n = ctx.dt, hc.shape[0]
        # the value torch's mean nll backward writes at each counted label (negated): grad / total_weight
        row_grad = grad_loss.to(torch.float32) / count
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], False)
        dx32 = torch.zeros((n, hc.shape[1]), dtype=torch.float32, device=hc.device) if needs[0] else None

        def slab_grads():
            """(v0, dY's columns [v0, v1)) for each slab, dX's share of it added before the slab is handed
            on (with the slab's weight before any update of its rows)."""
            for v0, v1 in ctx.slabs:
                slab_weight = _slab_weight(weight, dt, v0, v1)
                # the slab's logits, block by block as the forward made them, then its gradient in place
                dy_slab = torch.empty((n, v1 - v0), dtype=hc.dtype, device=hc.device)
                for g0, g1 in _chunks(n, ctx.group_rows):
                    dy_slab[g0:g1] = _block_logits(hc, slab_weight, g0, g1)
                _slab_logits_grad(dy_slab, row_max, row_logsum, _slab_targets(labels, v0, v1 - v0, ctx.ignore_index),
                                  row_grad, dy_slab, _piece_rows(ctx.chunk_rows, weight.shape[0], v1 - v0))
                if dx32 is not None:
                    _add_input_grad(dx32, dy_slab, slab_weight)
                del slab_weight
                yield v0, dy_slab
                del dy_slab  # before the next slab: one alive at a time

        dw = None
        rows = _TIED_ROWS.get(ctx.param) if needs[1] and ctx.layer is None else None
        # tied, where the optimizer splits the update: the rows the batch's tokens do not touch are updated
        # slab by slab as dY's slabs come, the touched rows' gradient waits for the embedding's backward
        # (forge_num.fused._SplitHeadUpdate): neither dY nor a [V, H] product ever exists whole
        if rows is None or not rows.split_head_update(ctx.param, slab_grads(), hc, ctx):
            dy = torch.empty((n, weight.shape[0]), dtype=hc.dtype, device=hc.device) if needs[1] else None
            for v0, dy_slab in slab_grads():
                if dy is not None:
                    dy[:, v0:v0 + dy_slab.shape[1]] = dy_slab
                del dy_slab
            if ctx.layer is not None and needs[1]:  # a fused head: its update here (or dW, materialized)
                _, dw, _ = fused_linear_backward(ctx.layer, ctx.use, ctx.param, hc, weight, None, dy, dt,
                                                 ctx.x_dtype, False, (False, True, False))
            elif needs[1]:  # as autograd for F.linear: dW = dYᵀ h in the compute dtype, cast to the weight's
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
        # dX as autograd's linear gives it in the compute dtype, then cast back to the input's
        dx = dx32.to(hc.dtype).to(ctx.x_dtype) if dx32 is not None else None
        return dx, dw, None, None, None, None, None
