"""forge_num.linear_cross_entropy (forge_num/loss.py) against torch's loss, on the CPU.

proofs/loss.md: where the logits are exact (small integers), the chunked loss's dY, dX and dW are
torch's bit for bit and its value lies within mean_order_bound of torch's; with a fused LM head,
training equals torch's training on the same chunked loss bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import forge_num as fn
from forge_num.emulator.bounds import mean_order_bound
from forge_num.fused import prepare
from forge_num.loss import _BYTES_PER_CHUNK_LOGIT, _chunk_log_probs
from tests.test_training_semantics import ADAMW, tiny_gpt2, tiny_llama
from tests.torch_reference import ExactSqrt, needs_fused_aten


CHUNK_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def integer_problem(rows, hidden, vocab, seed, ignore_every=0):
    """Operands whose logits are exact in any order of summation (and in bf16): entries in {-1, 0, 1},
    so every product is exact and every partial sum an integer of magnitude <= hidden <= 256."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randint(-1, 2, (rows, hidden), generator=g).float()
    head = nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randint(-1, 2, (vocab, hidden), generator=g).float())
    y = torch.randint(0, vocab, (rows,), generator=g)
    if ignore_every:
        y[::ignore_every] = -100
    return h, head, y


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 64])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "autocast-bf16"])
def test_exact_logits_give_torchs_gradients_bit_for_bit(chunk_rows, autocast):
    h, head, y = integer_problem(rows=23, hidden=16, vocab=37, seed=chunk_rows, ignore_every=5)
    loss, ref = _chunked_against_torch(h, head, y, chunk_rows, autocast)
    counted = int((y != -100).sum())
    assert abs(loss.item() - ref.item()) <= mean_order_bound(counted, ref.item())


def _chunked_against_torch(h, head, y, chunk_rows, autocast):
    """linear_cross_entropy's loss and torch's (F.cross_entropy of the head's output, on a copy of the
    head), both backward; asserts dX and dW the same bits. Returns (loss, torch's loss)."""
    ref_head = copy.deepcopy(head)
    h1 = h.clone().requires_grad_()
    h2 = h.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = fn.linear_cross_entropy(h1, head, y, chunk_rows=chunk_rows)
        ref = F.cross_entropy(ref_head(h2).float(), y)
    loss.backward()
    ref.backward()
    assert torch.equal(h1.grad, h2.grad)
    assert torch.equal(head.weight.grad, ref_head.weight.grad)
    return loss, ref


def _small_slabs(monkeypatch, rows, hidden):
    """Slabs of ``rows`` vocabulary rows (forge_num.loss._slab_rows, the tied head's split blocks) for a head
    of ``hidden`` features: several of them on a small head."""
    from forge_num import fused

    monkeypatch.setattr(fused, "_SPLIT_ROW_TILE", rows)
    monkeypatch.setattr(fused, "_SPLIT_BLOCK_ELEMENTS", rows * hidden)


def _slabs(vocab, hidden):
    from forge_num import loss as L

    return list(L._chunks(vocab, L._slab_rows(hidden)))


@pytest.mark.parametrize("slab_rows", [None, 8, 12], ids=["whole", "8-row-slabs", "12-row-slabs"])
@pytest.mark.parametrize("chunks_a_group", [1, 2, 5], ids=lambda k: f"{k}-chunk-groups")
def test_slabs_and_groups_give_the_same_bits(chunks_a_group, slab_rows, monkeypatch):
    """Under autocast (the fp32 head cast to bf16 a slab at a time) on exact logits: dX and dW are torch's
    bits (_chunked_against_torch) whatever the slabs and groups, and the loss the same bits as a forward
    without backward (one GEMM a group, the head cast once: the chunk sums in the same order). 37 words in
    8- or 12-row slabs leave a last slab of 5 or 1 rows; 23 rows in chunks of 3 a last group of fewer chunks
    and a last chunk of 2 rows."""
    from forge_num import loss as L

    rows, hidden, vocab, chunk = 23, 16, 37, 3
    if slab_rows is not None:
        _small_slabs(monkeypatch, slab_rows, hidden)
        slabs = _slabs(vocab, hidden)
        assert len(slabs) == (5 if slab_rows == 8 else 4) and slabs[-1][1] == vocab  # not vacuous
    else:
        assert _slabs(vocab, hidden) == [(0, vocab)]
    monkeypatch.setattr(L, "DEFAULT_GROUP_BYTES", chunks_a_group * chunk * vocab * 2)
    assert L._group_rows(rows, chunk, vocab, 2) == chunks_a_group * chunk
    h, head, y = integer_problem(rows=rows, hidden=hidden, vocab=vocab, seed=chunks_a_group, ignore_every=5)
    first = copy.deepcopy(head)
    loss, _ = _chunked_against_torch(h, head, y, chunk, True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        grouped = fn.linear_cross_entropy(h.clone(), first, y, chunk_rows=chunk)
    assert torch.equal(loss.detach().view(torch.int32), grouped.view(torch.int32))


@pytest.mark.parametrize("device", CHUNK_DEVICES)
@pytest.mark.parametrize("autocast", [False, True], ids=["bf16-head", "fp32-head-autocast"])
def test_the_backwards_logits_are_the_forwards(device, autocast, monkeypatch):
    """Random (inexact) operands, an unfused head in bf16 or in fp32 under autocast, 1000 rows in groups of
    320 (the last of 40) and 1000 words in slabs of 256 (the last of 232): dX and dW equal, bit for bit,
    what autograd gives through F.cross_entropy for logits made by the same block GEMMs
    (forge_num.loss._block_logits) into a buffer of their own: dW = dYᵀ h and dX = Σ_slabs dY_s · W_s
    summed in fp32 (_add_input_grad). So the backward's recomputation gives the forward's logits and its
    slabs autograd's dY. On the CPU a GEMM's rows do not depend on how many there are, so there it checks
    the blocks' rows and columns, the labels and the slabs' gradients; on the GPU, where cuBLAS picks its
    algorithm by shape and alignment, it checks the recomputation's bits too."""
    from forge_num import loss as L

    rows, hidden, vocab, chunk = 1000, 64, 1000, 64
    dt = torch.bfloat16 if autocast else None
    _small_slabs(monkeypatch, 256, hidden)
    monkeypatch.setattr(L, "DEFAULT_GROUP_BYTES", 5 * chunk * vocab * 2)
    slabs, groups = _slabs(vocab, hidden), list(L._chunks(rows, L._group_rows(rows, chunk, vocab, 2)))
    assert len(slabs) == 4 and len(groups) == 4
    g = torch.Generator().manual_seed(0)
    dtype = torch.float32 if autocast else torch.bfloat16
    h = torch.randn(rows, hidden, generator=g).bfloat16().to(device)
    w = torch.randn(vocab, hidden, generator=g).to(dtype).to(device)
    y = torch.randint(0, vocab, (rows,), generator=g).to(device)
    head = nn.Linear(hidden, vocab, bias=False, device=device, dtype=dtype)
    with torch.no_grad():
        head.weight.copy_(w)
    h1 = h.clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        fn.linear_cross_entropy(h1, head, y, chunk_rows=chunk).backward()
    logits = torch.empty((rows, vocab), dtype=torch.bfloat16, device=device)
    for v0, v1 in slabs:
        for g0, g1 in groups:
            logits[g0:g1, v0:v1] = L._block_logits(h, L._slab_weight(w, dt, v0, v1), g0, g1)
    upcast = logits.float().requires_grad_()
    (dlogits,) = torch.autograd.grad(F.cross_entropy(upcast, y), upcast)
    dy = dlogits.to(torch.bfloat16)
    dx32 = torch.zeros((rows, hidden), device=device)
    for v0, v1 in slabs:
        L._add_input_grad(dx32, dy[:, v0:v1].contiguous(), L._slab_weight(w, dt, v0, v1))
    assert torch.equal(h1.grad, dx32.to(torch.bfloat16))
    assert torch.equal(head.weight.grad, (dy.t() @ h).to(dtype))


@pytest.mark.parametrize("vocab", [37, 32000, 50257, 128256, 10**7])
@pytest.mark.parametrize("itemsize", [2, 4], ids=["bf16", "fp32"])
def test_a_group_is_whole_chunks_within_its_budget(vocab, itemsize):
    """_group_rows (a forward without backward) at the default chunks of 16384 rows: whole chunks;
    within DEFAULT_GROUP_BYTES, or one chunk; Llama's vocabulary in bf16: 512 rows, GPT-2's 1152."""
    from forge_num.loss import DEFAULT_GROUP_BYTES, _group_rows, default_chunk_rows

    chunk = default_chunk_rows(vocab)
    rows = _group_rows(16384, chunk, vocab, itemsize)
    assert rows % chunk == 0
    assert rows == chunk or rows * vocab * itemsize <= DEFAULT_GROUP_BYTES
    assert 16384 * vocab * itemsize <= DEFAULT_GROUP_BYTES or (rows + chunk) * vocab * itemsize > DEFAULT_GROUP_BYTES
    if itemsize == 2 and vocab in (128256, 50257):
        assert rows == {128256: 512, 50257: 1152}[vocab]
    assert _group_rows(100, chunk, vocab, itemsize) == max(100, chunk) or 100 * vocab * itemsize > DEFAULT_GROUP_BYTES


@pytest.mark.parametrize("rows,scale", [(19, 1 / 3), (23, 0.7), (29, 1 / 7), (31, 5 / 9), (37, 0.1)])
def test_grad_of_a_scaled_loss_is_torchs(rows, scale):
    """The backward takes the incoming gradient (a loss scaled by 1/accumulation, say) as torch's
    mean reduction does: grad / count in fp32 (not grad * (1 / count), which rounds twice), then the
    row-wise backward."""
    h, head, y = integer_problem(rows=rows, hidden=12, vocab=29, seed=rows)
    ref_head = copy.deepcopy(head)
    h1, h2 = h.clone().requires_grad_(), h.clone().requires_grad_()
    (fn.linear_cross_entropy(h1, head, y, chunk_rows=4) * scale).backward()
    (F.cross_entropy(ref_head(h2), y) * scale).backward()
    assert torch.equal(h1.grad, h2.grad) and torch.equal(head.weight.grad, ref_head.weight.grad)


@pytest.mark.parametrize("device", CHUNK_DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_a_slabs_gradient_is_autograds_bit_for_bit(seed, device):
    """The backward's gradient by slabs of the vocabulary (forge_num.loss._slab_logits_grad, from the
    forward's row normalizers: _row_normalizers of its log-softmax) against torch.autograd.grad of the rows'
    cross-entropy sum, on random (inexact) logits in bf16 and fp32, over slabs of 1, 149 and 151 words, of
    100 words, and one of all 301: equal as bits, with ignored rows (ignore_index -100, or 5 for odd seeds, a
    class some rows do take), every row ignored, and an infinite logit in a column (NaN where autograd's is,
    of either sign); on the GPU too where there is one."""
    from forge_num.loss import _row_normalizers, _slab_logits_grad, _slab_targets

    g = torch.Generator().manual_seed(seed)
    rows, hidden, vocab = 1 + seed * 7, 48, 301
    ignore = -100 if seed % 2 == 0 else 5
    for dtype in (torch.bfloat16, torch.float32):
        h = (torch.randn(rows, hidden, generator=g) * 2).to(dtype)
        w = torch.randn(vocab, hidden, generator=g).to(dtype)
        y = torch.randint(0, vocab, (rows,), generator=g)
        y[torch.rand(rows, generator=g) < 0.3] = ignore
        if seed == 4:
            y[:] = ignore
        if seed == 5:
            w[3, 0] = float("inf")
        grad_sum = torch.rand((), generator=g) * 3
        h, w, y, grad_sum = (t.to(device) for t in (h, w, y, grad_sum))
        logits = F.linear(h, w)
        upcast = logits.float().requires_grad_()
        (expected,) = torch.autograd.grad(F.cross_entropy(upcast, y, ignore_index=ignore, reduction="sum"), upcast,
                                          grad_outputs=grad_sum)
        row_max, row_logsum = _row_normalizers(logits, _chunk_log_probs(logits))
        for edges in ([0, 1, 150, 301], [0, 100, 200, 300, 301], [0, 301]):
            got = torch.full_like(logits, float("nan"))
            for v0, v1 in zip(edges, edges[1:]):
                _slab_logits_grad(logits[:, v0:v1], row_max, row_logsum, _slab_targets(y, v0, v1 - v0, ignore),
                                  grad_sum, got[:, v0:v1], piece_rows=3)
            want = expected.to(dtype)
            bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
            nan = torch.isnan(want)  # a NaN's sign and payload are no part of its value (the row's max is NaN)
            assert torch.equal(torch.isnan(got), nan), (seed, dtype, edges)
            assert torch.equal(got.masked_fill(nan, 0).view(bits), want.masked_fill(nan, 0).view(bits)), (seed, edges)


def test_leading_dimensions_and_all_ignored():
    h, head, y = integer_problem(rows=12, hidden=8, vocab=11, seed=4)
    loss = fn.linear_cross_entropy(h.view(3, 4, 8), head, y.view(3, 4), chunk_rows=5)
    assert torch.equal(loss, fn.linear_cross_entropy(h, head, y, chunk_rows=5))
    nothing = fn.linear_cross_entropy(h, head, torch.full_like(y, -100))
    assert torch.isnan(nothing) and torch.isnan(F.cross_entropy(head(h), torch.full_like(y, -100)))


def test_bad_inputs_are_named():
    h, head, y = integer_problem(rows=4, hidden=8, vocab=11, seed=5)
    with pytest.raises(ValueError, match="bias"):
        fn.linear_cross_entropy(h, nn.Linear(8, 11), y)
    with pytest.raises(ValueError, match="features"):
        fn.linear_cross_entropy(h[:, :4], head, y)
    with pytest.raises(ValueError, match="labels of shape"):
        fn.linear_cross_entropy(h, head, y[:3])
    with pytest.raises(TypeError, match="int64 or int32"):
        fn.linear_cross_entropy(h, head, y.float())
    with pytest.raises(TypeError, match="nn.Linear"):
        fn.linear_cross_entropy(h, nn.Embedding(11, 8), y)
    with pytest.raises(ValueError, match="chunk_rows"):
        fn.linear_cross_entropy(h, head, y, chunk_rows=0)


def chunked_lm_loss(model, ids):
    """Next-token loss through the model's body and linear_cross_entropy (5 rows a chunk)."""
    hidden = model.model(input_ids=ids).last_hidden_state
    return fn.linear_cross_entropy(hidden[:, :-1], model.lm_head, ids[:, 1:], chunk_rows=5)


@needs_fused_aten
@pytest.mark.parametrize("tie", [False, True], ids=["fused-head", "tied-head"])
def test_training_with_the_chunked_loss_equals_torch(tie):
    """A prepared model (its LM head fused, or left unfused where tied to the embedding) trained on the
    chunked loss equals torch.optim.AdamW on the same loss, bit for bit, after 6 steps."""
    m1 = tiny_llama(tie=tie)
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), **ADAMW)
    prepare(m1, opt)
    handle = m1._forge_num_handle
    assert ("lm_head" in handle.tied) if tie else ("lm_head" in handle.fused)
    ref = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    g = torch.Generator().manual_seed(7)
    for _ in range(6):
        ids = torch.randint(0, 256, (2, 12), generator=g)
        l1 = chunked_lm_loss(m1, ids)
        l1.backward()
        opt.step()
        opt.zero_grad()
        l2 = chunked_lm_loss(m2, ids)
        l2.backward()
        with ExactSqrt():
            ref.step()
        ref.zero_grad(set_to_none=True)
        assert torch.equal(l1, l2)
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), name
    assert all(p.grad is None for p in m1.parameters())


@needs_fused_aten
def test_exact_clipping_runs_both_passes_through_the_chunked_loss():
    """Exact clipping with the chunked loss (opt.backward: a norm-only pass, then the update): the update
    equals torch.optim.AdamW on the same loss's gradients multiplied by forge_num's coefficient, as
    clip_grad_norm_ applies one (test_training_semantics.py::test_exact_clipping says why not against
    clip_grad_norm_'s own coefficient bit for bit)."""
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), max_grad_norm=0.05, clipping="exact", **ADAMW)
    prepare(m1, opt)
    ref = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    g = torch.Generator().manual_seed(8)
    for _ in range(3):
        ids = torch.randint(0, 256, (2, 12), generator=g)
        opt.backward(chunked_lm_loss(m1, ids))
        opt.step()
        coef = opt.stats["clip_coef"]
        assert coef < 1
        chunked_lm_loss(m2, ids).backward()
        torch._foreach_mul_([p.grad for p in m2.parameters()], torch.tensor(coef, dtype=torch.float32))
        with ExactSqrt():
            ref.step()
        ref.zero_grad(set_to_none=True)
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), name


def _peak_cpu_bytes(step) -> int:
    """The largest total of live CPU tensor memory during step(), from torch.profiler's memory timeline
    (every category: inputs, parameters, activations, gradients, temporaries)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return max(sum(s) for s in sizes)


def test_the_backward_keeps_two_bytes_a_logit_where_hf_keeps_twelve(monkeypatch):
    """The point of the chunked loss, measured on the CPU (autocast bf16, as in training): torch's loss
    peaks at >= 12 bytes a logit (bf16 logits, fp32 upcast, fp32 and bf16 gradients); the chunked one, with
    an unfused head whose dW takes dY whole, at 2 bytes a logit (dY, bf16) plus, in 8 slabs, one slab's dY
    and its block of logits (2/8 bytes a logit each), one chunk's temporaries (12 bytes a logit of 128 rows,
    _BYTES_PER_CHUNK_LOGIT) and one slab of the head's bf16 cast and of its fp32 widening for dX's fp32 sum
    on the CPU (6 bytes a weight of 1/8 of the head), beside the head's own tensors (fp32 weight, fp32
    gradient, bf16 dW: 10 bytes a weight) and the hidden states' (fp32, bf16 cast, fp32 gradient, dX's fp32
    sum: 14 bytes an element). Logits held twice (a second [rows, vocabulary] buffer, 32 MiB) would pass the
    bound by 24 MiB."""
    rows, hidden, vocab, chunk = 2048, 64, 8192, 128
    _small_slabs(monkeypatch, vocab // 8, hidden)
    assert len(_slabs(vocab, hidden)) == 8
    torch.manual_seed(0)
    head = nn.Linear(hidden, vocab, bias=False)
    h = torch.randn(rows, hidden, requires_grad=True)
    y = torch.randint(0, vocab, (rows,))

    def step(chunked):
        head.weight.grad = h.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (fn.linear_cross_entropy(h, head, y, chunk_rows=chunk) if chunked
                    else F.cross_entropy(head(h).float(), y))
        loss.backward()

    logits, weights = rows * vocab, vocab * hidden
    others = 10 * weights + 14 * rows * hidden
    assert _peak_cpu_bytes(lambda: step(False)) >= 12 * logits
    slab = 2 * logits // 8 + 2 * logits // 8 + 6 * weights // 8
    assert _peak_cpu_bytes(lambda: step(True)) <= 2 * logits + slab + _BYTES_PER_CHUNK_LOGIT * chunk * vocab + others


def test_an_unfused_heads_dw_holds_only_its_own_bytes_and_dy(monkeypatch):
    """Where the head's weights outweigh its logits (an unfused or tied head, few rows), the backward's
    peak is dW's product: the head's own 8 bytes a weight (the fp32 weight and the fp32 dW, whose upper half
    holds the bf16 product: WeightGrad's in-place widening, as dY has fewer elements than dW) beside dY's 2
    bytes a logit, which the product reads. Nothing else of the head's size is alive then: not the bf16 cast
    (its last slab freed after dX's share, 2 bytes a weight of the whole head: 8 MiB here, 1 MiB a slab),
    nor a separate bf16 product (2 bytes a weight); the measured peak leaves 0.8 MiB of the bound below
    (with 0.75 MiB of chunk temporaries in it)."""
    rows, hidden, vocab, chunk = 256, 512, 8192, 8
    _small_slabs(monkeypatch, vocab // 8, hidden)
    torch.manual_seed(0)
    head = nn.Linear(hidden, vocab, bias=False)
    h = torch.randn(rows, hidden, requires_grad=True)
    y = torch.randint(0, vocab, (rows,))

    def step():
        head.weight.grad = h.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fn.linear_cross_entropy(h, head, y, chunk_rows=chunk)
        loss.backward()

    weights, logits = vocab * hidden, rows * vocab
    temporaries = _BYTES_PER_CHUNK_LOGIT * chunk * vocab
    assert rows * vocab < weights  # WeightGrad widens in place
    assert _peak_cpu_bytes(step) <= 8 * weights + 2 * logits + temporaries + 14 * rows * hidden


@pytest.mark.parametrize("build", ["llama", "gpt2-tied"])
def test_causal_lm_loss_is_transformers_loss(build):
    """forge_num.hf.causal_lm_loss with one chunk: every gradient is transformers' own bit for bit, the
    loss within proofs/loss.md's bound; with several chunks it trains (same loss within the GEMM's
    rounding: not asserted bit for bit)."""
    from forge_num.hf import causal_lm_loss

    m1 = tiny_llama() if build == "llama" else tiny_gpt2()
    m2 = copy.deepcopy(m1)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(9))
    labels = ids.clone()
    labels[0, :3] = -100
    loss = causal_lm_loss(m1, ids, labels, chunk_rows=24)
    ref = m2(input_ids=ids, labels=labels).loss
    loss.backward()
    ref.backward()
    assert abs(loss.item() - ref.item()) <= mean_order_bound(int((labels[:, 1:] != -100).sum()), ref.item())
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a.grad, b.grad), name
    several = causal_lm_loss(m1, ids, labels, chunk_rows=5)
    assert torch.isfinite(several)


def test_causal_lm_loss_refuses_a_transformed_head_output():
    from forge_num.hf import causal_lm_loss

    m = tiny_llama()
    m.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        causal_lm_loss(m, torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize("vocab", [37, 32000, 50257, 128256, 10**7])
def test_default_chunks_hold_their_byte_budget_in_whole_row_tiles(vocab):
    """A default chunk's temporaries (12 bytes a logit) stay within DEFAULT_CHUNK_BYTES, in whole
    row tiles of its GEMM where one fits, and a vocabulary too large for one row still gets one."""
    from forge_num.loss import _CHUNK_ROW_TILE, DEFAULT_CHUNK_BYTES, default_chunk_rows

    rows = default_chunk_rows(vocab)
    assert rows >= 1
    if rows > 1:
        assert rows * vocab * _BYTES_PER_CHUNK_LOGIT <= DEFAULT_CHUNK_BYTES
    fits = DEFAULT_CHUNK_BYTES // (_BYTES_PER_CHUNK_LOGIT * vocab)
    assert rows % _CHUNK_ROW_TILE == 0 if fits >= _CHUNK_ROW_TILE else rows == max(1, fits)


def test_a_fused_heads_backward_never_holds_its_whole_cast(monkeypatch):
    """A fused head under autocast: the logits and dX are computed with the head cast to bf16 one slab at a
    time, never the whole head's 2 bytes a weight at once (0.98 GiB at Llama-8B's head, beside dY at the
    step's peak). Measured on the CPU against the same backward with one slab of the whole head: with 8
    slabs (1024 vocabulary rows) the peak, at dX's fp32 sum of a slab's product, is lower by 7/8 of the
    slab's cast and, on the CPU, its fp32 widening (2 + 4 bytes a weight: 21 MiB here), and of the slab's dY
    and its fp32 widening (2 + 4 bytes a logit: 10.5 MiB), within one chunk's temporaries (0.75 MiB), which
    may move the peak from one phase of the backward to another. The update itself is left out (the
    optimizer's _on_linear_grad a no-op): on the CPU the torch backend materializes dW (4 bytes a weight and
    its temporaries, more than the cast), which the GPU's fused kernel never does."""
    rows, hidden, vocab, chunk = 256, 512, 8192, 8
    weights = vocab * hidden

    def peak(slab_rows: int) -> int:
        with monkeypatch.context() as m:
            _small_slabs(m, slab_rows, hidden)
            assert len(_slabs(vocab, hidden)) == vocab // slab_rows
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(hidden, vocab, bias=False))
            opt = fn.AdamW(model.parameters(), **ADAMW)
            prepare(model, opt)
            updates = []
            m.setattr(opt, "_on_linear_grad", lambda p, x, dy: updates.append(p))
            head = model[0]
            h = torch.randn(rows, hidden, requires_grad=True)
            y = torch.randint(0, vocab, (rows,))

            def backward():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = fn.linear_cross_entropy(h, head, y, chunk_rows=chunk)
                loss.backward()

            result = _peak_cpu_bytes(backward)
            assert updates == [head.weight] and h.grad is not None  # the fused path, dX computed
            return result

    saved = peak(vocab) - peak(vocab // 8)
    assert abs(saved - 6 * (weights + rows * vocab) * 7 // 8) <= _BYTES_PER_CHUNK_LOGIT * chunk * vocab
