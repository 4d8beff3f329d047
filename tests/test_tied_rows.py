"""A tied embedding's gradient by its touched rows (forge_num/fused.py, _TiedRows and add_touched_rows).

Autograd sums a tied weight's two gradients, the head's G_head and the embedding's dense G_emb, each
[V, H]. forge_num's prepared embedding adds only its touched rows into the head's gradient, in place:
the same bits as autograd's sum (every row, signed zeros included), one [V, H] tensor fewer at the
backward's end. Checked here against torch's own dense embedding backward, on the CPU and (marked gpu)
on CUDA, whose kernel takes another algorithm above 3072 indices; and end to end in training.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import forge_num as fn
import forge_num.fused as fused
from forge_num.fused import add_touched_rows, prepare
from forge_num.loss import WeightGrad
from tests.test_loss import _peak_cpu_bytes, chunked_lm_loss
from tests.test_training_semantics import ADAMW, tiny_llama
from tests.torch_reference import ExactSqrt, needs_fused_aten

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def dense_sum(head_grad, grad, indices, padding_idx):
    """Autograd's sum of the two gradients: the head's plus torch's dense embedding gradient."""
    dense = torch.ops.aten.embedding_dense_backward(grad, indices, head_grad.shape[0], padding_idx, False)
    return head_grad + dense


# CUDA's dense backward takes its per-token kernel up to 3072 indices and its sorted segments above
SIZES = [("cpu", 37), ("cpu", 1024), ("cpu", 4096)] + [("cuda", t) for t in (1024, 4096) if "cuda" in DEVICES]


def kept_rows_sum(head_grad, grad, indices, padding_idx):
    """add_touched_rows's sum over a captured step's kept rows (fused._StaticTokenRows, as
    _StaticSplitHeadUpdate.finish adds them): G_head + 0.0 everywhere, the kept rows D G_head[D] + the
    embedding gradient summed over their slots (zero on the filler rows)."""
    rows = fused._StaticTokenRows(indices, *head_grad.shape)
    n = rows.touched.numel()
    compact = torch.ops.aten.embedding_dense_backward(grad, rows.slot(padding_idx), n + 1, n, False)[:n]
    summed = head_grad.index_select(0, rows.touched).add_(compact)
    return head_grad.add_(0.0).index_copy_(0, rows.touched, summed)


@pytest.mark.parametrize("device,tokens", SIZES, ids=[f"{d}-{t}" for d, t in SIZES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("padding_idx", [-1, 3, 250], ids=["no-pad", "pad-touched", "pad-untouched"])
@pytest.mark.parametrize("add", [add_touched_rows, kept_rows_sum], ids=["eager", "captured"])
def test_touched_rows_equal_the_dense_sum_bit_for_bit(device, tokens, dtype, padding_idx, add):
    """Duplicated indices (a vocabulary of 251 for up to 4096 tokens: every touched row sums many token
    gradients, in an order the bits depend on), ±0.0 and subnormal entries in G_head, the padding row
    touched or not; on CUDA both of its embedding backward kernels. The eager path's distinct tokens and a
    captured step's kept rows (37 tokens: fillers among them; more tokens than rows: every row kept)."""
    g = torch.Generator().manual_seed(tokens + padding_idx)
    vocab, hidden = 251, 40
    indices = torch.randint(0, vocab - 1, (tokens,), generator=g)  # row 250 is never touched
    indices[::7] = 3
    grad = torch.randn(tokens, hidden, generator=g).to(dtype)
    head = torch.randn(vocab, hidden, generator=g).to(dtype)
    head[::5, ::3] = -0.0
    head[1::5, ::4] = 0.0
    head[2::5, 1] = torch.finfo(dtype).tiny / 4  # subnormal
    indices, grad, head = indices.to(device), grad.to(device), head.to(device)
    # G_emb's touched rows must not all be exact: the bits then depend on the order of the sums
    assert indices.unique().numel() < tokens
    expected = dense_sum(head, grad, indices, padding_idx)
    got = add(head.clone(), grad, indices, padding_idx)
    assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       expected.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,vocab,hidden", [(24, 4100, 64), (24, 4099, 64), (300, 1000, 96), (7, 3, 5)],
                         ids=["in-place", "unaligned", "cast", "small"])
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_weight_grad_is_autograds_cast_product_bit_for_bit(device, rows, vocab, hidden, low):
    """forge_num.loss.WeightGrad against ``(dy.t() @ x).to(fp32)``: widened in place where dY is the
    smaller (24 rows: the halving chunks and the tail, 4100 x 64 elements > _WIDEN_TAIL, a multiple of
    256), cast where the product would sit at a less aligned address (4099 x 64; on the H200 in
    session 14 that one too was widened in place and gave the cast's bits), where dY is not the
    smaller (300 rows of 96 columns), and where the product is too small to widen in place."""
    from forge_num.loss import _WIDEN_TAIL, WeightGrad

    g = torch.Generator().manual_seed(rows)
    dy = torch.randn(rows, vocab, generator=g).to(low).to(device)
    x = torch.randn(rows, hidden, generator=g).to(low).to(device)
    if vocab == 4100:
        assert vocab * hidden > _WIDEN_TAIL and vocab * hidden % 256 == 0 and dy.numel() < vocab * hidden
    expected = (dy.t() @ x).to(torch.float32)
    got = WeightGrad(dy, x, torch.float32)()
    assert got.dtype == torch.float32 and got.is_contiguous()
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


def test_weight_grad_in_place_holds_no_second_product():
    """Measured on the CPU by torch.profiler: the cast path holds the product (half the result's
    bytes) beside dY, X and the fp32 result; the in-place path does not (the product lives inside the
    result), holding besides them only the tail's copy and the CPU matmul's own small buffers (tens
    of KiB here, far below the product's 4 MiB)."""
    from forge_num.loss import _WIDEN_TAIL, WeightGrad

    rows, vocab, hidden = 16, 8192, 256
    g = torch.Generator().manual_seed(16)
    dy = torch.randn(rows, vocab, generator=g).bfloat16()
    x = torch.randn(rows, hidden, generator=g).bfloat16()
    result = vocab * hidden * 4
    inputs = (rows * vocab + rows * hidden) * 2
    with_product = inputs + result + result // 2
    assert _peak_cpu_bytes(lambda: (dy.t() @ x).to(torch.float32)) >= with_product
    assert _peak_cpu_bytes(lambda: WeightGrad(dy, x, torch.float32)()) < with_product - result // 4
    assert 2 * _WIDEN_TAIL < result // 4


def test_negative_zero_in_an_untouched_row_becomes_autograds_positive_zero():
    """-0.0 + 0.0 = +0.0: an untouched row of G_head is G_head + 0.0 in autograd's sum, not G_head."""
    head = torch.full((4, 2), -0.0)
    got = add_touched_rows(head, torch.ones(1, 2), torch.tensor([1]), -1)
    assert not torch.signbit(got[[0, 2, 3]]).any() and torch.equal(got[1], torch.ones(2))


def _spy_on_touched_rows(monkeypatch):
    calls = []
    original = fused.add_touched_rows

    def spy(head_grad, *args):
        out = original(head_grad, *args)
        calls.append(out.data_ptr())
        return out

    monkeypatch.setattr(fused, "add_touched_rows", spy)
    return calls


@needs_fused_aten
@pytest.mark.parametrize("seq,deposit", [(12, "WeightGrad"), (49, "Tensor")], ids=["deferred", "computed"])
def test_training_takes_the_touched_rows_and_hands_the_deposit_to_the_hook_uncopied(monkeypatch, seq, deposit):
    """With the chunked loss and a tied head, every step's embedding backward adds its rows into the
    head's deposited gradient, and the optimizer's hook receives that tensor itself as ``.grad``
    (autograd's AccumulateGrad steals it: no [V, H] copy); training equals torch bit for bit. The head
    defers its dW to the embedding's backward where dY and X are smaller than dW (2 x 11 rows of 256
    logits against 64 columns), and deposits dW itself where they are not (2 x 48 rows). (The split update,
    which a step of one micro-batch takes since session 47 in every regime, is turned off here: the deposit
    is what a step of several micro-batches takes.)"""
    calls = _spy_on_touched_rows(monkeypatch)
    monkeypatch.setattr(fn.optim.ForgeOptimizer, "_may_split_rows", lambda self, p: False)
    kinds = []
    original_deposit = fused._TiedRows.deposit_head_grad

    def deposit_spy(self, grad, *head):
        kinds.append(type(grad).__name__)
        return original_deposit(self, grad, *head)

    monkeypatch.setattr(fused._TiedRows, "deposit_head_grad", deposit_spy)
    m1 = tiny_llama(tie=True)
    m2 = copy.deepcopy(m1)
    handed = []
    m1.lm_head.weight.register_post_accumulate_grad_hook(lambda p: handed.append(p.grad.data_ptr()))
    opt = fn.AdamW(m1.parameters(), **ADAMW)
    prepare(m1, opt)
    assert list(m1._forge_num_handle.tied_rows) == ["model.embed_tokens"]
    ref = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    g = torch.Generator().manual_seed(11)
    for _ in range(3):
        ids = torch.randint(0, 256, (2, seq), generator=g)
        chunked_lm_loss(m1, ids).backward()
        opt.step()
        chunked_lm_loss(m2, ids).backward()
        with ExactSqrt():
            ref.step()
        ref.zero_grad(set_to_none=True)
    assert len(calls) == 3 and handed == calls and kinds == [deposit] * 3
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), name
    m1._forge_num_handle.remove()
    assert type(m1.model.embed_tokens) is torch.nn.Embedding and m1.lm_head.weight not in fused._TIED_ROWS


@needs_fused_aten
def test_exact_clipping_deposits_in_each_of_its_two_passes(monkeypatch):
    """Exact clipping backwards the graph twice (the norm, then the update): each pass is a graph task
    of its own, with its own deposit (the update pass's split turned off, as a step of several micro-batches
    has none)."""
    calls = _spy_on_touched_rows(monkeypatch)
    monkeypatch.setattr(fn.optim.ForgeOptimizer, "_may_split_rows", lambda self, p: False)
    m1 = tiny_llama(tie=True)
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), max_grad_norm=0.05, clipping="exact", **ADAMW)
    prepare(m1, opt)
    ref = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(12))
    opt.backward(chunked_lm_loss(m1, ids))
    opt.step()
    coef = opt.stats["clip_coef"]
    assert coef < 1 and len(calls) == 2
    chunked_lm_loss(m2, ids).backward()
    torch._foreach_mul_([p.grad for p in m2.parameters()], torch.tensor(coef, dtype=torch.float32))
    with ExactSqrt():
        ref.step()
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), name


@needs_fused_aten
def test_no_deposit_where_the_embedding_is_not_in_the_backward(monkeypatch):
    """The head fed by inputs_embeds (the embedding's node from an earlier forward is alive but not in
    this backward's graph): the head's gradient goes to autograd, and the update equals torch's. A
    backward that stops short of the embedding (autograd.grad with inputs=) leaves no deposit behind."""
    calls = _spy_on_touched_rows(monkeypatch)
    m1 = tiny_llama(tie=True)
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), **ADAMW)
    prepare(m1, opt)
    ref = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(13))

    def loss_from_embeds(model, embeds):
        hidden = model.model(inputs_embeds=embeds).last_hidden_state
        return fn.linear_cross_entropy(hidden[:, :-1], model.lm_head, ids[:, 1:], chunk_rows=5)

    alive = m1.model.embed_tokens(ids)  # an embedding node alive outside the loss's graph
    loss_from_embeds(m1, alive.detach()).backward()
    opt.step()
    loss_from_embeds(m2, m2.model.embed_tokens(ids).detach()).backward()
    with ExactSqrt():
        ref.step()
    assert calls == []
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), name

    rows = fused._TIED_ROWS[m1.lm_head.weight]
    hidden = m1.model(input_ids=ids).last_hidden_state
    loss = fn.linear_cross_entropy(hidden[:, :-1], m1.lm_head, ids[:, 1:], chunk_rows=5)
    torch.autograd.grad(loss, [hidden])
    assert rows.deposit is None and calls == []


def test_the_touched_rows_take_no_vocabulary_sized_temporary():
    """Measured on the CPU by torch.profiler: adding the touched rows holds G_head ([V, H], updated in
    place) and the embedding's incoming gradient, plus at most [touched, H] twice (the head's selected
    rows, the compact gradient) and three int64 index vectors of at most ``tokens`` entries (the
    touched ids, each token's slot, the padding row's lookup); autograd's dense sum holds a second [V, H].
    """
    vocab, hidden, tokens = 65536, 64, 24
    g = torch.Generator().manual_seed(15)
    head, grad = torch.randn(vocab, hidden, generator=g), torch.randn(tokens, hidden, generator=g)
    indices = torch.randint(0, vocab, (tokens,), generator=g)
    table = vocab * hidden * 4
    bound = table + tokens * hidden * 4 + 2 * tokens * hidden * 4 + 3 * tokens * 8
    assert _peak_cpu_bytes(lambda: add_touched_rows(head, grad, indices, 3)) <= bound
    assert _peak_cpu_bytes(lambda: dense_sum(head, grad, indices, 3)) >= 2 * table


@needs_fused_aten
@pytest.mark.parametrize("precision", ["fp32", "bf16-sr", "8bit"])
@pytest.mark.parametrize("micro,clip", [(1, False), (1, True), (2, False), (2, True)],
                         ids=["plain", "clip", "accumulate", "accumulate-clip"])
def test_the_deposit_changes_no_bit_in_any_regime(monkeypatch, precision, micro, clip):
    """The same prepared model and data trained twice, with the tied rows and with the head's gradient
    handed to autograd (the deposit refused): equal weights and optimizer state after 3 steps,
    in each regime (bf16 weights and dW for bf16-sr and 8bit), with gradient accumulation and exact
    clipping (whose norm pass backwards the last micro-batch's graph once more). Where the update pass
    may split the head's update (a step's only micro-batch, in any regime since session 47:
    _SplitHeadUpdate, here one block, the whole product), it does, in place of adding the touched rows."""
    calls = _spy_on_touched_rows(monkeypatch)
    original_finish = fused._SplitHeadUpdate.finish
    monkeypatch.setattr(fused._SplitHeadUpdate, "finish",
                        lambda self, *a: (calls.append("split"), original_finish(self, *a))[1])

    def train(deposit):
        m = tiny_llama(tie=True)
        if precision != "fp32":
            m = m.to(torch.bfloat16)
        opt = fn.AdamW(m.parameters(), precision=precision, seed=5, accumulation_steps=micro,
                       max_grad_norm=0.05 if clip else None, **ADAMW)
        prepare(m, opt)
        with monkeypatch.context() as patch:
            if not deposit:
                patch.setattr(fused._TiedRows, "deposit_head_grad", lambda self, grad, *head: False)
            g = torch.Generator().manual_seed(17)
            for _ in range(3):
                for _ in range(micro):
                    loss = chunked_lm_loss(m, torch.randint(0, 256, (2, 12), generator=g)) / micro
                    opt.backward(loss) if clip else loss.backward()
                opt.step()
        return m, opt

    passes = 3 * (micro + clip)  # an update pass per micro-batch, and the norm pass of a step's last
    m1, opt1 = train(True)
    assert len(calls) == passes
    split = micro == 1
    assert calls.count("split") == (3 if split else 0)
    m2, opt2 = train(False)
    assert len(calls) == passes  # none more without the deposit
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), name
    s1, s2 = opt1.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys()
    for index, a in s1.items():  # by parameter index (a split update creates its state earlier in the step)
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], s2[index][key]), key


def _tied_pair(vocab=300, hidden=8):
    """An embedding and an LM head sharing one bf16 weight [vocab, hidden], as a prepared model."""

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, hidden, padding_idx=7)
            self.head = torch.nn.Linear(hidden, vocab, bias=False)
            self.head.weight = self.embed.weight

    torch.manual_seed(3)
    return Tied().to(torch.bfloat16)


@pytest.mark.parametrize("precision,rule", [("bf16-sr", "adamw"), ("8bit", "adamw"), ("bf16-sr", "sgd")])
def test_split_update_is_the_whole_update_across_blocks(monkeypatch, precision, rule):
    """_SplitHeadUpdate against the unsplit path (the whole G_head, the touched rows added, the
    element-wise update), bit for bit, weight and state, over blocks of 32 rows: touched rows in
    several blocks and at block edges (rows 0, 31, 32, 299), repeated tokens, the padding row touched;
    in step 1 an inf in an untouched row, and in every step an untouched row of -0.0 in G_head on a
    -0.0 weight row, which autograd's sum makes +0.0 (with SGD, -0.0 - lr * -0.0 would be +0.0: the
    check fails without the split's `+ 0.0`). The blocks are the whole product's rows (the split's
    premise; tests/test_tied_rows.py::test_block_products_are_the_whole_products_rows checks it for
    cuBLAS), so this checks the split's own logic whatever the BLAS kernels do."""
    monkeypatch.setattr(fused, "_SPLIT_ROW_TILE", 32)
    monkeypatch.setattr(fused, "_SPLIT_BLOCK_ELEMENTS", 32 * 8)
    monkeypatch.setattr(fused, "_STATIC_GATHER_ROWS", 3)  # the captured split's kept rows gathered 3 at a time
    tokens = torch.tensor([0, 31, 32, 5, 5, 7, 299, 150, 31, 64], dtype=torch.int32)  # int32 ids work too
    g = torch.Generator().manual_seed(4)
    dy = torch.randint(-3, 4, (tokens.numel(), 300), generator=g).to(torch.bfloat16)
    x = torch.randint(-4, 5, (tokens.numel(), 8), generator=g).to(torch.bfloat16)
    bad = dy.clone()
    bad[2, 200] = float("inf")  # non-finite gradients in an untouched row (step 1): kept out of its elements
    emb_grad = (torch.randint(-2, 3, (tokens.numel(), 8), generator=g) / 4).to(torch.bfloat16)

    def head_grad(dy_step, dtype):
        whole = WeightGrad(dy_step, x, dtype)()
        whole[100] = -0.0
        return whole

    at = []  # the block being computed: its first row (the blocks below record it)

    def blocks(dy_step, rows=32):
        for r0 in range(0, dy_step.shape[1], rows):
            at[:] = [r0]
            yield r0, dy_step[:, r0:r0 + rows]

    monkeypatch.setattr(fused, "head_grad_rows",
                        lambda d, x_, dtype: head_grad(dy_now[0], dtype)[at[0]:at[0] + d.shape[1]].clone())
    dy_now = []

    def fresh():
        m = _tied_pair()
        with torch.no_grad():
            m.embed.weight[100] = -0.0
        opt = (fn.AdamW(m.parameters(), precision=precision, seed=9, **ADAMW) if rule == "adamw"
               else fn.SGD(m.parameters(), lr=0.1, precision=precision, seed=9))
        prepare(m, opt)
        return m, opt

    def unsplit(m, opt, dy):
        p = m.embed.weight
        p.grad = fused.add_touched_rows(head_grad(dy, p.dtype), emb_grad, tokens, 7)
        opt._on_grad_ready(p)
        opt.step()

    def split(m, opt, dy, update=fused._SplitHeadUpdate, rows=fused._TokenRows):
        p = m.embed.weight
        s = update(rows(tokens, *p.shape))
        dy_now[:] = [dy]
        s.apply_head(opt._start_row_updates(p, s), blocks(dy), x, p.dtype)
        s.finish(emb_grad, 7)
        opt.step()

    def static_split(m, opt, dy):  # a captured step's: 10 kept rows, the 8 touched and rows 1 and 2
        split(m, opt, dy, fused._StaticSplitHeadUpdate, fused._StaticTokenRows)

    results = []
    for apply in (unsplit, split, static_split):
        m, opt = fresh()
        for dy_step in (bad, dy):  # the second step from a state that is not zero
            apply(m, opt, dy_step)
        results.append((m, opt))
    m1, o1 = results[0]
    for m2, o2 in results[1:]:
        assert torch.equal(m1.embed.weight.view(torch.int16), m2.embed.weight.view(torch.int16))
        _assert_same_state(o1, o2)
        first, second = o1.stats_history, o2.stats_history
        assert first[0]["nonfinite"] == second[0]["nonfinite"] > 0
        assert first[1]["nonfinite"] == second[1]["nonfinite"] == 0
        # the same Σ g² in fp64, summed in another grouping (blocks and kept rows): equal to rounding
        assert first[1]["grad_norm"] == pytest.approx(second[1]["grad_norm"], rel=1e-12)
    kept = fused._StaticTokenRows(tokens, 300, 8)
    assert kept.touched.tolist() == [0, 1, 2, 5, 7, 31, 32, 64, 150, 299]  # not vacuous: fillers 1 and 2


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1024, 4096])
def test_block_products_are_the_whole_products_rows(tokens):
    """The split's premise on cuBLAS, at Llama-1B's head (128,256 x 2048, bf16) in its 8192-row blocks:
    each block's product is the whole product's rows, bit for bit (a GEMM over fewer rows could take
    another kernel; on this project's CPU one did, for one shape of four). Where this fails, the split
    update differs from the unsplit one by those products' differences."""
    g = torch.Generator(device="cuda").manual_seed(tokens)
    vocab, hidden = 128256, 2048
    dy = (torch.randn(tokens, vocab, generator=g, device="cuda") * 1e-4).to(torch.bfloat16)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(torch.bfloat16)
    whole = WeightGrad(dy, x, torch.bfloat16)()
    rows = fused._SPLIT_BLOCK_ELEMENTS // hidden // fused._SPLIT_ROW_TILE * fused._SPLIT_ROW_TILE
    for r0 in range(0, vocab, rows):
        block = fused.head_grad_rows(dy[:, r0:r0 + rows].contiguous(), x, torch.bfloat16)  # as the loss's slabs
        assert torch.equal(block.view(torch.int16), whole[r0:r0 + rows].view(torch.int16)), r0


@needs_fused_aten
@pytest.mark.parametrize("capturable", [False, True], ids=["eager", "captured-paths"])
@pytest.mark.parametrize("precision", ["8bit", "fp32"])
def test_split_update_holds_no_vocabulary_sized_tensor(monkeypatch, capturable, precision):
    """With the head's update split (blocks of 32 rows), no tensor of the backward has as many elements as
    the tied weight [V, H], nor as the loss's dY [rows, V] (v51): the head's product and dY exist one block
    (one slab of the vocabulary) at a time, in a captured step's optimizer too (opt._capturable:
    fused._StaticSplitHeadUpdate). Without the split (the deposit refused) the [V, H] product is there, and
    dY: the check can fail."""
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    monkeypatch.setattr(fused, "_SPLIT_ROW_TILE", 32)
    monkeypatch.setattr(fused, "_SPLIT_BLOCK_ELEMENTS", 32 * 64)

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor)}
            for t in pytree.tree_leaves(out):  # new memory only: not a view of an input, nor an input updated
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                    Largest.largest = max(Largest.largest, t.numel())
            return out

    def largest_in_backward(split):
        m = tiny_llama(tie=True)
        if precision != "fp32":
            m = m.to(torch.bfloat16)
        opt = fn.AdamW(m.parameters(), precision=precision, seed=1, **ADAMW)
        prepare(m, opt)
        opt._capturable = capturable
        g = torch.Generator().manual_seed(2)
        with monkeypatch.context() as patch:
            if not split:
                patch.setattr(fused._TiedRows, "split_head_update", lambda self, *a: False)
            for step in range(2):  # the second step's: the first creates the optimizer's state
                loss = chunked_lm_loss(m, torch.randint(0, 256, (4, 24), generator=g))
                Largest.largest = 0
                with Largest():
                    loss.backward()
                opt.step()
        return Largest.largest

    vh, dy = 256 * 64, 4 * 23 * 256  # dY [rows, V] outweighs the weight here, and every other tensor
    assert largest_in_backward(True) < vh < dy <= largest_in_backward(False)


def _two_heads_loss(m, ids):
    """Two uses of the tied head in one backward, over one embedding call."""
    hidden = m.model(input_ids=ids).last_hidden_state[:, :-1]
    return (fn.linear_cross_entropy(hidden, m.lm_head, ids[:, 1:], chunk_rows=5)
            + fn.linear_cross_entropy(hidden * 0.5, m.lm_head, ids[:, 1:], chunk_rows=7))


@needs_fused_aten
@pytest.mark.parametrize("precision", ["fp32", "bf16-sr"])
def test_two_heads_in_one_backward_keep_autograds_sum(monkeypatch, precision):
    """Two linear_cross_entropy calls over one tied head backward in one pass: neither deposits nor
    splits (the first would otherwise be overwritten by the second, or change the weight before the
    second's dX), so training equals the path that hands every gradient to autograd, bit for bit."""
    def train(refuse):
        m = tiny_llama(tie=True)
        if precision != "fp32":
            m = m.to(torch.bfloat16)
        opt = fn.AdamW(m.parameters(), precision=precision, seed=3, **ADAMW)
        prepare(m, opt)
        with monkeypatch.context() as patch:
            if refuse:
                patch.setattr(fused._TiedRows, "deposit_head_grad", lambda self, grad, *head: False)
                patch.setattr(fused._TiedRows, "split_head_update", lambda self, *a: False)
            g = torch.Generator().manual_seed(21)
            for _ in range(2):
                _two_heads_loss(m, torch.randint(0, 256, (2, 12), generator=g)).backward()
                opt.step()
        return m

    for (name, a), b in zip(train(False).named_parameters(), train(True).parameters()):
        assert torch.equal(a, b), name


@needs_fused_aten
def test_autograd_grad_short_of_the_weight_does_not_split():
    """autograd.grad(loss, [the embedding's output]) accumulates no gradient into the tied weight: the
    head does not split its update there (the embedding's node runs, the weight's accumulator does
    not), and the weight keeps its value."""
    m = tiny_llama(tie=True).to(torch.bfloat16)
    opt = fn.AdamW(m.parameters(), precision="bf16-sr", seed=3, **ADAMW)
    prepare(m, opt)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(22))
    embeds = m.model.embed_tokens(ids)
    hidden = m.model(inputs_embeds=embeds).last_hidden_state[:, :-1]
    loss = fn.linear_cross_entropy(hidden, m.lm_head, ids[:, 1:], chunk_rows=5)
    before = m.lm_head.weight.detach().clone()
    torch.autograd.grad(loss, [embeds])
    assert torch.equal(m.lm_head.weight, before) and opt._recs[m.lm_head.weight].events == 0


@needs_fused_aten
def test_a_backward_failing_between_head_and_embedding_leaves_step_working():
    """An error between the tied head's backward (which split and began its update) and the
    embedding's: optimizer.step() completes the update (the touched rows with the head's gradient
    alone) instead of failing, and training goes on."""
    m = tiny_llama(tie=True).to(torch.bfloat16)
    opt = fn.AdamW(m.parameters(), precision="8bit", seed=3, **ADAMW)
    prepare(m, opt)
    calls = []

    def hook(grad):  # on the embedding's output: after the head's backward, before the embedding's
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")

    def register(module, args, out):
        out.register_hook(hook)

    m.model.embed_tokens.register_forward_hook(register)
    g = torch.Generator().manual_seed(23)
    with pytest.raises(RuntimeError, match="injected"):
        chunked_lm_loss(m, torch.randint(0, 256, (2, 12), generator=g)).backward()
    rec = opt._recs[m.lm_head.weight]
    assert rec.events == 1 and rec.in_flight is not None  # the split began, its second half never ran
    before = m.lm_head.weight.detach().clone()
    opt.step()
    assert rec.events == 0 and rec.in_flight is None and not torch.equal(m.lm_head.weight, before)
    for _ in range(2):
        chunked_lm_loss(m, torch.randint(0, 256, (2, 12), generator=g)).backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in m.parameters())


@pytest.mark.interpreter
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="the interpreter runs where there is no GPU")
@pytest.mark.parametrize("precision", ["bf16-sr", "8bit"])
def test_split_update_through_the_kernels_equals_the_torch_backend(monkeypatch, precision):
    """The split path as it runs on CUDA (the Triton kernels: the blocks' element-wise updates and the
    gathered rows' counter map), here under the interpreter, against the torch backend, bit for bit:
    an embedding tied to its head and nothing else (no fused layer, whose dW would differ by backend),
    300 rows in 32-row blocks, 2 steps."""
    monkeypatch.setattr(fused, "_SPLIT_ROW_TILE", 32)
    monkeypatch.setattr(fused, "_SPLIT_BLOCK_ELEMENTS", 32 * 128)
    splits = []
    original = fused._SplitHeadUpdate.finish
    monkeypatch.setattr(fused._SplitHeadUpdate, "finish", lambda self, *a: (splits.append(1), original(self, *a))[1])

    def train(backend):
        m = _tied_pair(hidden=128)
        opt = fn.AdamW(m.parameters(), precision=precision, seed=2, backend=backend, **ADAMW)
        prepare(m, opt)
        g = torch.Generator().manual_seed(24)
        for _ in range(2):
            ids = torch.randint(0, 300, (2, 9), generator=g)
            fn.linear_cross_entropy(m.embed(ids[:, :-1]), m.head, ids[:, 1:], chunk_rows=4).backward()
            opt.step()
        return m, opt

    (m1, o1), (m2, o2) = train("kernels"), train("torch")
    assert len(splits) == 4
    assert torch.equal(m1.embed.weight.view(torch.int16), m2.embed.weight.view(torch.int16))
    _assert_same_state(o1, o2)


@needs_fused_aten
@pytest.mark.parametrize("precision,micro,padding", [("8bit", 1, None), ("bf16-sr", 1, None), ("8bit", 1, 3),
                                                     ("fp32", 1, None), ("8bit", 2, None)])
def test_the_split_sorts_its_tokens_in_the_forward(monkeypatch, precision, micro, padding):
    """v30: where the head's update may split (the step's last micro-batch, and the embedding's last
    backward took a split), the embedding's forward sorts the tokens, finds the
    blocks' edges and the padding index's slot (torch.unique, transfers and a nonzero, each waiting for
    the device), and the split in the head's backward uses them: neither torch.unique nor nonzero runs
    in the backward (here made to fail there, where the unsplit path would call them too). The first
    step sorts in its backward (no split before it); accumulated micro-batches sort nothing. The weights are
    those of the split sorting in its backward, bit for bit."""
    monkeypatch.setattr(fused, "_SPLIT_ROW_TILE", 32)
    monkeypatch.setattr(fused, "_SPLIT_BLOCK_ELEMENTS", 32 * 64)
    real_unique = torch.unique

    def train(sort_in_forward):
        m = tiny_llama(tie=True)
        m.model.embed_tokens.padding_idx = padding
        if precision != "fp32":
            m = m.to(torch.bfloat16)
        opt = fn.AdamW(m.parameters(), precision=precision, seed=1, accumulation_steps=micro, **ADAMW)
        prepare(m, opt)
        g = torch.Generator().manual_seed(2)
        sorted_in_forward = []
        with monkeypatch.context() as patch:
            if not sort_in_forward:
                patch.setattr(fn.optim.ForgeOptimizer, "_may_split_rows", lambda self, p: False)
            for step in range(2):
                for k in range(micro):
                    ids = torch.randint(0, 256, (2, 12), generator=g)
                    ids[0, 0] = 3  # the padding index, where there is one
                    loss = chunked_lm_loss(m, ids)
                    node = next(n for n in _graph_nodes(loss) if hasattr(n, "forge_num_tokens"))
                    sorted_in_forward.append(node.forge_num_tokens is not None)
                    if sort_in_forward and sorted_in_forward[-1]:
                        def no_unique(*a, **kw):
                            raise AssertionError("torch.unique in the backward")
                        with monkeypatch.context() as inner:
                            inner.setattr(torch, "unique", no_unique)
                            inner.setattr(torch.Tensor, "nonzero", no_unique)
                            loss.backward()
                    else:
                        loss.backward()
                opt.step()
        assert torch.unique is real_unique
        return m.model.embed_tokens.weight.detach().clone(), sorted_in_forward

    w_forward, sorted_in_forward = train(True)
    # accumulated micro-batches keep an fp32 buffer, so none of them splits (nor sorts); the first step
    # has no split before it
    expected = [False] * micro + [micro == 1] * micro
    assert sorted_in_forward == expected
    w_backward, sorted_never = train(False)
    assert not any(sorted_never)
    assert torch.equal(w_forward.view(torch.int16) if w_forward.dtype == torch.bfloat16 else w_forward,
                       w_backward.view(torch.int16) if w_backward.dtype == torch.bfloat16 else w_backward)


@needs_fused_aten
@pytest.mark.parametrize("precision,padding", [("8bit", None), ("bf16-sr", 3), ("8bit", 3)])
def test_a_captured_steps_split_reads_nothing_on_the_host_and_gives_the_eager_bits(monkeypatch, precision, padding):
    """In a captured step's optimizer (opt._capturable; run eagerly here) the tied head's update splits with a
    fixed number of kept rows (fused._StaticTokenRows): no host read by forge_num.fused in the step's forward
    and backward (Tensor.tolist, item, nonzero and torch.unique called from fused.py counted: the eager
    split's sorts use them, so the count can fail; the optimizer's step counters, CPU tensors as torch's, are
    read in optim.py under capture too), and the eager split's weights and states, bit for bit, over three
    steps in blocks of 32 rows, with the padding index among the tokens."""
    monkeypatch.setattr(fused, "_SPLIT_ROW_TILE", 32)
    monkeypatch.setattr(fused, "_SPLIT_BLOCK_ELEMENTS", 32 * 64)
    monkeypatch.setattr(fused, "_STATIC_GATHER_ROWS", 5)

    def counted(reads, real):
        def read(*a, **kw):
            if sys._getframe(1).f_code.co_filename == fused.__file__:
                reads.append(real)
            return real(*a, **kw)
        return read

    def train(capturable):
        m = tiny_llama(tie=True)
        m.model.embed_tokens.padding_idx = padding
        m = m.to(torch.bfloat16)
        opt = fn.AdamW(m.parameters(), precision=precision, seed=1, **ADAMW)
        prepare(m, opt)
        opt._capturable = capturable
        splits, reads = [], []
        g = torch.Generator().manual_seed(2)
        for step in range(3):
            ids = torch.randint(0, 256, (2, 12), generator=g)
            ids[0, 0] = 3  # the padding index, where there is one
            with monkeypatch.context() as patch:
                for owner, name in ((torch.Tensor, "tolist"), (torch.Tensor, "item"), (torch.Tensor, "nonzero"),
                                    (torch, "unique")):
                    patch.setattr(owner, name, counted(reads, getattr(owner, name)))
                for cls in (fused._SplitHeadUpdate, fused._StaticSplitHeadUpdate):  # which split ran
                    patch.setattr(cls, "finish", lambda self, *a, real=cls.__dict__["finish"]:
                                  (splits.append(type(self)), real(self, *a))[1])
                chunked_lm_loss(m, ids).backward()
            opt.step()
        return m, opt, splits, reads

    m1, o1, splits1, reads1 = train(False)
    m2, o2, splits2, reads2 = train(True)
    assert reads1 and not reads2, (reads1, reads2)
    assert splits1 == [fused._SplitHeadUpdate] * 3 and splits2 == [fused._StaticSplitHeadUpdate] * 3
    assert torch.equal(m1.model.embed_tokens.weight.view(torch.int16), m2.model.embed_tokens.weight.view(torch.int16))
    _assert_same_state(o1, o2)


def _assert_same_state(o1, o2) -> None:
    """The two optimizers' states of their first parameter, bit for bit: tensors, and the 8bit states'
    dicts of codes and scales (SGD without momentum keeps none)."""
    s1, s2 = o1.state_dict()["state"], o2.state_dict()["state"]
    assert s1.keys() == s2.keys()
    for key, value in s1.get(0, {}).items():
        other = s2[0][key]
        if isinstance(value, dict):
            assert value.keys() == other.keys() and all(torch.equal(v, other[k]) for k, v in value.items()), key
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, other), key


def _graph_nodes(t):
    """The autograd graph's nodes reachable from ``t`` (depth first)."""
    seen, todo = set(), [t.grad_fn]
    while todo:
        n = todo.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        yield n
        todo.extend(f for f, _ in n.next_functions)


@needs_fused_aten
def test_a_loss_without_the_split_stops_the_forward_sorting(monkeypatch):
    """A tied model trained in 8bit on Hugging Face's own loss (its head's gradient goes to autograd,
    no split follows): after one backward without a split, the embedding's forward sorts nothing (it
    would wait for the device each step for nothing); after a chunked-loss step with a split it sorts
    again."""
    m = tiny_llama(tie=True).to(torch.bfloat16)
    opt = fn.AdamW(m.parameters(), precision="8bit", seed=1, **ADAMW)
    prepare(m, opt)
    g = torch.Generator().manual_seed(2)
    built = []
    real = fused._TokenRows.__init__

    def counting(self, *a, **kw):
        built.append(1)
        real(self, *a, **kw)

    monkeypatch.setattr(fused._TokenRows, "__init__", counting)
    for loss_kind in ("chunked", "chunked", "hf", "hf", "chunked", "chunked"):
        ids = torch.randint(0, 256, (2, 12), generator=g)
        before = len(built)
        loss = chunked_lm_loss(m, ids) if loss_kind == "chunked" else m(input_ids=ids, labels=ids).loss
        sorted_in_forward = len(built) > before
        loss.backward()
        opt.step()
        built.append((loss_kind, sorted_in_forward))
    seen = [x for x in built if isinstance(x, tuple)]
    assert [s for _, s in seen] == [False, True, True, False, False, True]


def test_a_negative_padding_index_counts_from_the_end_as_torchs():
    """An embedding whose padding_idx is set negative after it was built: F.embedding counts it from
    the end (row V - 1 gets no gradient); the tied embedding's backward does the same."""
    torch.manual_seed(0)
    V, H = 11, 4
    w = torch.randn(V, H, requires_grad=True)
    idx = torch.tensor([[1, V - 1, 3, V - 1]])
    grad = torch.randn(1, 4, H)
    (expected,) = torch.autograd.grad(F.embedding(idx, w, -1), w, grad)
    rows = fused._TiedRows()
    (got,) = torch.autograd.grad(fused._TouchedRowsEmbeddingFn.apply(idx, w, rows, -1), w, grad)
    assert torch.equal(got, expected) and not got[V - 1].any()
