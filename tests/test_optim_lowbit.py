"""The optimizers in the bf16-sr and 8bit regimes: the same stream as the emulator, reproducible,
resumable, the same bits on both backends."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import forge_num as fn
from forge_num.emulator import emulate_elementwise
from forge_num.emulator.philox import derive_seed
from tests.test_training_semantics import tiny_llama

HYPER = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


def test_plain_step_equals_the_emulator():
    """Without prepare(): step() over .grad of bf16 parameters is the emulator's element-wise update
    with the key derive_seed(seed, step, parameter index), bit for bit, for two steps."""
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 7, generator=g).bfloat16()),
              torch.nn.Parameter(torch.randn(11, generator=g).bfloat16())]
    opt = fn.AdamW(params, precision="bf16-sr", seed=77, **HYPER)
    want = [(_bits(p), [np.zeros(p.shape, np.uint16)] * 2) for p in params]
    for step in (1, 2):
        grads = [torch.randn(p.shape, generator=g).bfloat16() for p in params]
        for i, (p, gr) in enumerate(zip(params, grads)):
            p.grad = gr
            w, st, _ = emulate_elementwise(want[i][0], gr.float().numpy(), want[i][1], rule="adamw", hyper=HYPER,
                                           step=step, seed=derive_seed(77, step, i))
            want[i] = (w, st)
        opt.step()
        opt.zero_grad()
        for p, (w, st) in zip(params, want):
            assert np.array_equal(_bits(p), w)
            assert np.array_equal(_bits(opt.state[p]["exp_avg"]), st[0])
            assert np.array_equal(_bits(opt.state[p]["exp_avg_sq"]), st[1])


def _train(model, opt, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 256, (2, 16), generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _prepared(seed):
    model = tiny_llama().to(torch.bfloat16)
    opt = fn.AdamW(model.parameters(), precision="bf16-sr", seed=seed, **HYPER)
    return fn.prepare(model, opt), opt


def test_prepared_model_is_reproducible_and_seeded():
    m1, o1 = _prepared(1)
    m2, o2 = _prepared(1)
    m3, o3 = _prepared(2)
    l1, l2 = _train(m1, o1, 4), _train(m2, o2, 4)
    _train(m3, o3, 4)
    assert l1 == l2
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert any(not torch.equal(a.view(torch.int16), c.view(torch.int16)) for a, c in zip(m1.parameters(), m3.parameters()))


def test_resume_replays_the_stream():
    m1, o1 = _prepared(5)
    _train(m1, o1, 2)
    ckpt = (copy.deepcopy(m1.state_dict()), copy.deepcopy(o1.state_dict()))
    rest = _train(m1, o1, 2, seed=9)
    m2, o2 = _prepared(5)
    m2.load_state_dict(ckpt[0])
    o2.load_state_dict(ckpt[1])
    assert _train(m2, o2, 2, seed=9) == rest
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    m3, o3 = _prepared(6)
    with pytest.raises(ValueError, match="seed"):
        o3.load_state_dict(ckpt[1])


def test_regime_dtype_is_checked():
    with pytest.raises(TypeError, match="bfloat16"):
        fn.AdamW([torch.nn.Parameter(torch.zeros(3))], precision="bf16-sr")
    with pytest.raises(TypeError, match="bfloat16"):
        fn.AdamW([torch.nn.Parameter(torch.zeros(3))], precision="8bit")


def test_kernels_and_torch_backends_round_alike():
    """The Triton element-wise kernel (CUDA, or the interpreter) and the torch backend give the same
    bf16-sr bits for the same gradient: one rule, one random stream."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 9, generator=g).bfloat16()
    grads = [torch.randn(6, 9, generator=g).bfloat16() for _ in range(3)]
    outs = []
    for backend in ("kernels", "torch"):
        p = torch.nn.Parameter(w.clone().to(dev))
        opt = fn.Lion([p], lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, precision="bf16-sr", seed=4, backend=backend)
        for gr in grads:
            p.grad = gr.to(dev)
            opt.step()
        outs.append((p.detach().cpu().view(torch.int16), opt.state[p]["exp_avg"].cpu().view(torch.int16)))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert not torch.equal(outs[0][0], w.view(torch.int16))


@pytest.mark.parametrize("opt_cls,kw", [(fn.AdamW, HYPER), (fn.Lion, {"lr": 1e-3}), (fn.SGD, {"lr": 0.1, "momentum": 0.9})])
def test_8bit_optimizers_train_reproducibly_and_resume(opt_cls, kw):
    """precision='8bit': 8-bit m/v (codes + block scales) in the state; runs with one seed are
    identical; a resumed run equals the uninterrupted one bit for bit; the kernels and the torch
    backend agree on a plain step."""
    def make(seed=1):
        model = tiny_llama().to(torch.bfloat16)
        opt = opt_cls(model.parameters(), precision="8bit", seed=seed, **kw)
        return fn.prepare(model, opt), opt

    m1, o1 = make()
    m2, o2 = make()
    assert _train(m1, o1, 3) == _train(m2, o2, 3)
    st = next(iter(o1.state.values()))
    key = "momentum_buffer" if opt_cls is fn.SGD else "exp_avg"
    assert st[key]["codes"].dtype == torch.uint8 and st[key]["scales"].dtype == torch.float32
    ckpt = (copy.deepcopy(m1.state_dict()), copy.deepcopy(o1.state_dict()))
    rest = _train(m1, o1, 2, seed=4)
    m3, o3 = make()
    m3.load_state_dict(ckpt[0])
    o3.load_state_dict(ckpt[1])
    assert _train(m3, o3, 2, seed=4) == rest
    for a, b in zip(m1.parameters(), m3.parameters()):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_a_checkpoint_of_another_stream_revision_warns_in_8bit():
    """Checkpoints name the random stream's revision; an 8bit optimizer resuming one of another revision (or
    one written before revisions were, revision 1: one Philox call an element) warns, the other regimes and
    the same revision do not."""
    import warnings

    from forge_num.emulator.philox import STREAM_REVISION

    for precision in ("8bit", "bf16-sr"):
        p = torch.nn.Parameter(torch.randn(4, 128).bfloat16())
        opt = fn.AdamW([p], precision=precision, seed=5, **HYPER)
        sd = opt.state_dict()
        assert sd["forge_num"]["stream"] == STREAM_REVISION
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            opt.load_state_dict(copy.deepcopy(sd))
        old = copy.deepcopy(sd)
        del old["forge_num"]["stream"]
        if precision == "8bit":
            with pytest.warns(UserWarning, match="stream revision 1"):
                opt.load_state_dict(old)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                opt.load_state_dict(old)


def test_8bit_plain_step_kernels_equal_torch_backend():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(5, 140, generator=g).bfloat16()
    b = torch.randn(140, generator=g).bfloat16()
    grads = [(torch.randn(5, 140, generator=g).bfloat16(), torch.randn(140, generator=g).bfloat16()) for _ in range(2)]
    outs = []
    for backend in ("kernels", "torch"):
        ps = [torch.nn.Parameter(w.clone()), torch.nn.Parameter(b.clone())]
        opt = fn.AdamW(ps, precision="8bit", seed=3, backend=backend, **HYPER)
        for gw, gb in grads:
            ps[0].grad, ps[1].grad = gw, gb
            opt.step()
        outs.append([p.detach().view(torch.int16).clone() for p in ps]
                    + [opt.state[p]["exp_avg_sq"]["codes"].clone() for p in ps])
    for a, c in zip(*outs):
        assert torch.equal(a, c)


@pytest.mark.parametrize("backend", ["kernels", "torch"])
@pytest.mark.parametrize("precision", ["8bit", "bf16-sr"])
def test_a_bf16_gradient_widened_in_row_chunks_updates_the_same_bits(precision, backend, monkeypatch):
    """The element-wise update of a large bf16 gradient widens it to fp32 in chunks of whole rows
    (optim._WIDEN_CHUNK_ELEMENTS; the 8B embedding's 1.96 GiB at once was the 8bit step's peak):
    each chunk's elements keep their Philox counters and quantization blocks, so weights and every
    state are the same bits as with the gradient widened at once, over two steps. The caller lets go
    of each chunk before the next is widened: one fp32 chunk alive at a time, not two (session 14:
    the tied 1B embedding's 8bit step held two 256 MiB chunks at its peak)."""
    import weakref

    import forge_num.optim as optim

    g = torch.Generator().manual_seed(5)
    w = torch.randn(7, 300, generator=g).bfloat16()
    grads = [torch.randn(7, 300, generator=g).bfloat16() for _ in range(2)]
    outs, first_rows, alive_at_widening = [], [], []
    widen, previous = optim._widen_rows, [None]

    def counted(grad2, r0, r1):
        alive_at_widening.append(previous[0] is not None and previous[0]() is not None)
        first_rows.append(r0)
        g32 = widen(grad2, r0, r1)
        previous[0] = weakref.ref(g32)
        return g32

    monkeypatch.setattr(optim, "_widen_rows", counted)
    for chunk in (None, 2 * 300):  # whole; then 2 rows a chunk (rows 0-1, 2-3, 4-5, 6)
        if chunk is not None:
            monkeypatch.setattr(optim, "_WIDEN_CHUNK_ELEMENTS", chunk)
        p = torch.nn.Parameter(w.clone())
        opt = fn.AdamW([p], precision=precision, seed=9, backend=backend, **HYPER)
        for gr in grads:
            p.grad = gr.clone()
            opt.step()
        st = opt.state[p]
        states = ([st[k]["codes"].clone() for k in ("exp_avg", "exp_avg_sq")]
                  + [st[k]["scales"].clone() for k in ("exp_avg", "exp_avg_sq")]) if precision == "8bit" else \
            [st[k].view(torch.int16).clone() for k in ("exp_avg", "exp_avg_sq")]
        outs.append(([p.detach().view(torch.int16).clone(), *states], opt.stats["nonfinite"]))
    (whole, bad_whole), (chunked, bad_chunked) = outs
    # the whole gradient at once (8bit) or not through the chunks (bf16-sr), then four chunks a step
    assert first_rows == ([0, 0] if precision == "8bit" else []) + [0, 2, 4, 6] * 2
    for a, c in zip(whole, chunked):
        assert torch.equal(a, c)
    assert bad_whole == bad_chunked == 0
    assert len(alive_at_widening) > 2 and not any(alive_at_widening)
