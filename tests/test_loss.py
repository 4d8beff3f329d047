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
from forge_num.loss import _BYTES_PER_CHUNK_LOGIT, _chunk_log_probs, _chunk_logits_grad, _logits
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


def _small_slabs(monkeypatch, slab_bytes, tile=4):
    """Slabs of the head's cast (forge_num.loss._cast_slabs) of at most ``slab_bytes``, in tiles of ``tile``
    rows or columns: several of them on a small head."""
    from forge_num import loss as L

    monkeypatch.setattr(L, "DEFAULT_CHUNK_BYTES", slab_bytes)
    monkeypatch.setattr(L, "_SLAB_TILE", tile)


@pytest.mark.parametrize("slab_bytes", [None, 8 * 16 * 2, 12 * 16 * 2], ids=["whole", "5-row-slabs", "4-row-slabs"])
@pytest.mark.parametrize("chunks_a_group", [1, 2, 5], ids=lambda k: f"{k}-chunk-groups")
def test_slabs_of_the_cast_and_groups_give_the_same_bits(chunks_a_group, slab_bytes, monkeypatch):
    """Under autocast (the fp32 head cast to bf16 a slab at a time: forge_num.loss._logits, _input_grad) on
    exact logits: dX and dW are torch's bits (_chunked_against_torch) whatever the slabs, and the loss
    the same bits as a forward without backward in groups of chunks (forge_num.loss._group_rows: the chunk
    sums in the same order). 37 words in 8- or 12-row slabs leave a last slab of 5 or 1 rows; dX's slabs
    are one tile of 4 columns each (3 or 5 columns' bytes of 37 words a slab); 23 rows in chunks of 3 a last group of fewer chunks and a last chunk of 2 rows."""
    from forge_num import loss as L

    rows, hidden, vocab, chunk = 23, 16, 37, 3
    if slab_bytes is not None:
        _small_slabs(monkeypatch, slab_bytes)
        slabs = list(L._cast_slabs(vocab, hidden, 2))
        assert len(slabs) == (5 if slab_bytes == 8 * 16 * 2 else 4) and slabs[-1][1] == vocab  # not vacuous
        assert list(L._cast_slabs(hidden, vocab, 2)) == [(0, 4), (4, 8), (8, 12), (12, 16)]
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
def test_the_backwards_logits_in_dy_are_the_forwards(device, autocast, monkeypatch):
    """Random (inexact) operands, an unfused head, in bf16 (one GEMM each) or in fp32 under autocast (the
    cast by slabs: four of 256 vocabulary rows, the last of 232, and dX's four of 16 hidden columns): dX
    and dW equal, bit for bit, the products (by the same slabs) of the dY that autograd gives through
    F.cross_entropy for logits made by the same GEMMs into a buffer of their own. So the backward's
    recomputation into dY gives the forward's logits. On the CPU a GEMM's rows do not depend on how many
    there are, so there it checks the slabs' rows and columns and the labels; on the GPU, where cuBLAS picks
    its algorithm by shape and alignment, it checks the recomputation's bits too."""
    from forge_num import loss as L

    rows, hidden, vocab, chunk = 1000, 64, 1000, 64
    dt = torch.bfloat16 if autocast else None
    _small_slabs(monkeypatch, 256 * hidden * 2, tile=8)
    if autocast:
        assert len(list(L._cast_slabs(vocab, hidden, 2))) == 4 and len(list(L._cast_slabs(hidden, vocab, 2))) == 4
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
    upcast = L._logits(h, w, dt, 0, rows).float().requires_grad_()
    (dlogits,) = torch.autograd.grad(F.cross_entropy(upcast, y), upcast)
    dy = dlogits.to(torch.bfloat16)
    assert torch.equal(h1.grad, L._input_grad(dy, w, dt))
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


@pytest.mark.parametrize("length,other,itemsize", [(128256, 4096, 2), (128256, 2048, 2), (4096, 128256, 2),
                                                   (2048, 128256, 2), (37, 16, 2), (50257, 768, 4), (300, 10**7, 2)])
def test_cast_slabs_cover_the_head_in_whole_tiles_within_their_budget(length, other, itemsize):
    """_cast_slabs: consecutive, covering [0, length); every slab but the last whole _SLAB_TILE tiles within
    DEFAULT_CHUNK_BYTES of cast, or one tile where a tile exceeds it; as many tiles as fit. Llama-8B's head:
    8 slabs of 16384 vocabulary rows, dX's 8 of 512 columns."""
    from forge_num.loss import _SLAB_TILE, DEFAULT_CHUNK_BYTES, _cast_slabs

    slabs = list(_cast_slabs(length, other, itemsize))
    assert slabs[0][0] == 0 and slabs[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(slabs, slabs[1:]))
    size = slabs[0][1] - slabs[0][0]
    assert all(e - s == size for s, e in slabs[:-1]) and 0 < slabs[-1][1] - slabs[-1][0] <= size
    if len(slabs) > 1:
        assert size % _SLAB_TILE == 0
        fits = DEFAULT_CHUNK_BYTES // (other * itemsize)
        assert size == (_SLAB_TILE if fits < _SLAB_TILE else fits - fits % _SLAB_TILE)
    if (length, other) == (128256, 4096):
        assert (size, len(slabs)) == (16384, 8)
    if (length, other) == (4096, 128256):
        assert (size, len(slabs)) == (512, 8)


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
def test_a_chunks_gradient_is_autograds_bit_for_bit(seed, device):
    """The backward's chunk gradient (forge_num.loss._chunk_logits_grad: the aten calls without the
    graph) against torch.autograd.grad of the same chunk's cross-entropy sum, on random (inexact)
    logits in bf16 and fp32: equal as bits, with ignored rows (ignore_index -100, or 5 for odd seeds,
    a class some rows do take), a chunk with every row ignored, and a non-finite logit's row (NaN where
    autograd's is); on the GPU too where there is one."""
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
        upcast = F.linear(h, w).float().requires_grad_()
        (expected,) = torch.autograd.grad(F.cross_entropy(upcast, y, ignore_index=ignore, reduction="sum"), upcast,
                                          grad_outputs=grad_sum)
        got = _chunk_logits_grad(_chunk_log_probs(_logits(h, w, None, 0, rows)), y, ignore, grad_sum)
        assert got.dtype == torch.float32 and got.shape == expected.shape
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), (seed, dtype)


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


def test_the_backward_keeps_two_bytes_a_logit_where_hf_keeps_twelve():
    """The point of the chunked loss, measured on the CPU (autocast bf16, as in training): torch's loss
    peaks at >= 12 bytes a logit (bf16 logits, fp32 upcast, fp32 and bf16 gradients); the chunked one at
    2 bytes a logit (the forward's logits of all rows, then dY, in bf16) plus the larger of one chunk's
    temporaries (12 bytes a logit, _BYTES_PER_CHUNK_LOGIT) and one slab of the head's bf16 cast (here the
    whole head, 2 bytes a weight), beside the head's own tensors (fp32 weight, fp32 gradient, bf16 dW: 10
    bytes a weight) and the hidden states' (fp32, bf16 cast, fp32 gradient: 10 bytes an element). Logits of
    all rows held twice (a buffer of their own beside dY) would pass the bound by 28 MiB."""
    from forge_num import loss as L

    rows, hidden, vocab, chunk = 2048, 64, 8192, 128
    assert len(list(L._cast_slabs(vocab, hidden, 2))) == 1
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
    others = 10 * weights + 10 * rows * hidden
    assert _peak_cpu_bytes(lambda: step(False)) >= 12 * logits
    largest = max(_BYTES_PER_CHUNK_LOGIT * chunk * vocab, 2 * weights)
    assert _peak_cpu_bytes(lambda: step(True)) <= 2 * logits + largest + others


def test_an_unfused_heads_dw_cast_does_not_meet_dy():
    """Where the head's weights outweigh its logits (an unfused or tied head, few rows), the backward's
    peak is the head's own 10 bytes a weight at dW's cast (fp32 weight, bf16 dW, fp32 dW), not those
    plus dY's 2 bytes a logit or the head's bf16 cast's 2 bytes a weight: both are freed before dW is
    cast to fp32. Holding dY to the end would exceed the bound below by 2 bytes a logit (4 MiB here),
    the cast by 2 bytes a weight (8 MiB), against 0.75 MiB of chunk temporaries."""
    rows, hidden, vocab, chunk = 256, 512, 8192, 8
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
    assert 2 * logits > temporaries  # the test can tell dY from one chunk's temporaries
    assert _peak_cpu_bytes(step) <= 10 * weights + temporaries + 10 * rows * hidden


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
    time (forge_num.loss._cast_slabs), never the whole head's 2 bytes a weight at once (0.98 GiB at
    Llama-8B's head, beside dY at the step's peak). Measured on the CPU against the same backward with one
    slab of the whole head: with 8 slabs (1024 vocabulary rows, 64 hidden columns) the peak is lower by
    7/8 of the cast's bytes (7 MiB here), within one chunk's temporaries (0.75 MiB), which may move the
    peak from one phase of the backward to another. The update itself is left out (the optimizer's
    _on_linear_grad a no-op): on the CPU the torch backend materializes dW (4 bytes a weight and its
    temporaries, more than the cast), which the GPU's fused kernel never does."""
    rows, hidden, vocab, chunk = 256, 512, 8192, 8
    weights = vocab * hidden

    def peak(slab_bytes: int) -> int:
        from forge_num import loss as L

        with monkeypatch.context() as m:
            _small_slabs(m, slab_bytes, tile=8)
            assert len(list(L._cast_slabs(vocab, hidden, 2))) == len(list(L._cast_slabs(hidden, vocab, 2)))
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

    saved = peak(2 * weights) - peak(2 * weights // 8)
    assert abs(saved - 2 * weights * 7 // 8) <= _BYTES_PER_CHUNK_LOGIT * chunk * vocab
