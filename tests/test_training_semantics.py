"""Training semantics of prepare() on real transformers models (CPU), against torch.optim.

Reference: the same model trained with torch.optim (``foreach=False``) from one seed on the same
batches. Its optimizer step runs under ExactSqrt (float32 ``sqrt`` correctly rounded, as forge_num's
rules are; torch's CPU float32 sqrt is not, see test_torch_backend.py). forge_num's weight
gradients come from the torch backend's row blocks; for these models every dW fits in one block,
which is torch's ``mm`` of the operands autograd uses, and MKL gives it bitwise equal to autograd's
(test_torch_backend.py::test_single_block_dw_equals_autograd). So the claims below are bitwise.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import forge_num as fn
from forge_num.fused import prepare, unprepare
from tests.torch_reference import ExactSqrt, needs_fused_aten  # noqa: E402


transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()



def training_bits(model, opt) -> list[torch.Tensor]:
    """Every parameter and optimizer-state tensor of a trained model as bytes on the CPU (an 8bit
    state's codes and scales; the step counters), in the model's parameter order (not the order of the
    states' first updates, which depends on the update path): two runs compared bit for bit."""
    out = [p.detach().clone() for p in model.parameters()]
    for st in (opt.state[p] for p in model.parameters()):
        for v in st.values():
            out += [v["codes"].clone(), v["scales"].clone()] if isinstance(v, dict) else [v.clone()]
    return [t.reshape(-1).view(torch.uint8).cpu() for t in out]


def tiny_llama(seed=0, tie=False):
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def tiny_gpt2(seed=0):
    cfg = transformers.GPT2Config(
        vocab_size=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(cfg)


def batches(n, micro=1, seed=1, batch=2, seq=16):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randint(0, 256, (batch, seq), generator=g) for _ in range(micro)] for _ in range(n)]


def lm_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def lion_reference_step(params, state, lr, betas, wd):
    """lion-pytorch's update_fn."""
    b1, b2 = betas
    with torch.no_grad():
        for p in params:
            if p.grad is None:
                continue
            m = state.setdefault(p, torch.zeros_like(p))
            p.data.mul_(1 - lr * wd)
            p.add_(m.clone().mul_(b1).add(p.grad, alpha=1 - b1).sign_(), alpha=-lr)
            m.mul_(b2).add_(p.grad, alpha=1 - b2)


def train_torch(model, make_opt, data, clip=None, lion=None):
    opt = make_opt(model.parameters()) if make_opt else None
    losses = []
    state = {}
    for micro in data:
        for ids in micro:
            loss = lm_loss(model, ids) / len(micro)
            loss.backward()
            losses.append(loss.item())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if lion is not None:
            lion_reference_step(list(model.parameters()), state, **lion)
        else:
            with ExactSqrt():
                opt.step()
        model.zero_grad(set_to_none=True)
    return losses


def train_forge(model, opt, data, use_opt_backward=False):
    losses = []
    for micro in data:
        for ids in micro:
            loss = lm_loss(model, ids) / len(micro)
            if use_opt_backward:
                opt.backward(loss)
            else:
                loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses


def assert_same_weights(m1, m2):
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), f"{n}: max |diff| {(a - b).abs().max().item():.3e}"


ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


@needs_fused_aten
@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2-conv1d-tied"])
def test_adamw_20_steps_bitwise(build):
    m1 = build()
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), **ADAMW)
    prepare(m1, opt)
    handle = m1._forge_num_handle
    if build is tiny_gpt2:
        assert handle.tied == ["lm_head"] and any(n.endswith("c_attn") for n in handle.fused)
    else:
        assert "lm_head" in handle.fused
    data = batches(20)
    l1 = train_forge(m1, opt, data)
    l2 = train_torch(m2, lambda ps: torch.optim.AdamW(ps, foreach=False, **ADAMW), data)
    assert l1 == l2
    assert_same_weights(m1, m2)
    assert all(p.grad is None for p in m1.parameters())  # no gradient left behind


@needs_fused_aten
def test_sgd_momentum_20_steps_bitwise():
    hyper = dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True)
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    opt = fn.SGD(m1.parameters(), **hyper)
    prepare(m1, opt)
    data = batches(20)
    assert train_forge(m1, opt, data) == train_torch(
        m2, lambda ps: torch.optim.SGD(ps, foreach=False, **hyper), data
    )
    assert_same_weights(m1, m2)


@needs_fused_aten
def test_lion_20_steps_bitwise():
    hyper = dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    opt = fn.Lion(m1.parameters(), **hyper)
    prepare(m1, opt)
    data = batches(20)
    lion = dict(lr=hyper["lr"], betas=hyper["betas"], wd=hyper["weight_decay"])
    assert train_forge(m1, opt, data) == train_torch(m2, None, data, lion=lion)
    assert_same_weights(m1, m2)


def _checkpoint(model, opt, sched):
    # what torch.save/torch.load of these dicts gives: independent copies
    return copy.deepcopy((model.state_dict(), opt.state_dict(), sched.state_dict()))


def test_resume_at_step_10_equals_uninterrupted_and_runs_repeat():
    data = batches(20)

    def fresh():
        m = tiny_llama()
        o = fn.AdamW(m.parameters(), max_grad_norm=1.0, clipping="previous", **ADAMW)
        s = torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20)
        prepare(m, o)
        return m, o, s

    def run(m, o, s, part):
        losses = []
        for micro in part:
            loss = lm_loss(m, micro[0])
            loss.backward()
            o.step()
            s.step()
            losses.append(loss.item())
        return losses

    m1, o1, s1 = fresh()
    full = run(m1, o1, s1, data)
    m2, o2, s2 = fresh()
    first = run(m2, o2, s2, data[:10])
    ckpt = _checkpoint(m2, o2, s2)
    m3, o3, s3 = fresh()
    m3.load_state_dict(ckpt[0])
    o3.load_state_dict(ckpt[1])
    s3.load_state_dict(ckpt[2])
    rest = run(m3, o3, s3, data[10:])
    assert first + rest == full
    assert_same_weights(m1, m3)
    assert o1.stats["step"] == o3.stats["step"] == 20 and o1.stats["clip_coef"] == o3.stats["clip_coef"]
    m4, o4, s4 = fresh()
    assert run(m4, o4, s4, data) == full  # two runs with one seed
    assert_same_weights(m1, m4)


@needs_fused_aten
def test_accumulation_over_4_micro_batches_equals_torch_accumulating_grad():
    """Reference: torch accumulating .grad over the 4 micro-batches (loss / 4 each), then one step."""
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), accumulation_steps=4, **ADAMW)
    prepare(m1, opt)
    data = batches(4, micro=4)
    l1 = train_forge(m1, opt, data)
    l2 = train_torch(m2, lambda ps: torch.optim.AdamW(ps, foreach=False, **ADAMW), data)
    assert l1 == l2
    assert_same_weights(m1, m2)
    assert opt.stats["step"] == 4


@needs_fused_aten
def test_step_after_fewer_micro_batches_applies_what_was_accumulated():
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), accumulation_steps=4, **ADAMW)
    prepare(m1, opt)
    data = batches(2, micro=3)  # three of four, as Trainer's last, short accumulation
    train_forge(m1, opt, data)
    train_torch(m2, lambda ps: torch.optim.AdamW(ps, foreach=False, **ADAMW), data)
    assert_same_weights(m1, m2)


def _clip_reference(m2, data, max_norm, coefs):
    """torch.optim.AdamW on gradients multiplied by the given coefficients, as clip_grad_norm_ does."""
    o2 = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    for micro, coef in zip(data, coefs):
        for ids in micro:
            (lm_loss(m2, ids) / len(micro)).backward()
        grads = [p.grad for p in m2.parameters()]
        torch._foreach_mul_(grads, torch.tensor(coef, dtype=torch.float32))
        with ExactSqrt():
            o2.step()
        o2.zero_grad()


@needs_fused_aten
@pytest.mark.parametrize("micro", [1, 2])
def test_exact_clipping(micro):
    """Exact global clipping: a norm-only backward, then the update with min(1, max/(norm + 1e-6)).

    Bitwise: the update equals torch's AdamW on the gradients multiplied by forge_num's coefficient
    (``torch._foreach_mul_``, as clip_grad_norm_). Not bitwise against clip_grad_norm_ itself: its
    per-tensor norms are fp32 reductions (torch.linalg.vector_norm on CPU does not accumulate in fp64),
    forge_num's are fp64 sums of squares rounded once, so the coefficients differ in the last bits.
    Bound (any summation order of n squares in fp32: relative error <= γ_{n+1}; sqrt halves it, plus
    one rounding; the same for the stacked per-tensor norms): |c_torch/c_forge - 1| <= γ_{n+1} + γ_{P+1} + 4u
    (proofs/clipping.md).
    """
    max_norm = 0.05
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    m3 = copy.deepcopy(m1)
    opt = fn.AdamW(
        m1.parameters(), max_grad_norm=max_norm, clipping="exact", accumulation_steps=micro, **ADAMW
    )
    prepare(m1, opt)
    data = batches(5, micro=micro)
    coefs = []
    for step in data:
        for ids in step:
            (lm_loss(m1, ids) / micro).backward()  # the HF output loss runs both passes itself
        opt.step()
        coefs.append(opt.stats["clip_coef"])
    assert all(c < 1 for c in coefs)
    _clip_reference(m2, data, max_norm, coefs)
    assert_same_weights(m1, m2)
    # against clip_grad_norm_: the coefficient within the summation-order bound
    o3 = torch.optim.AdamW(m3.parameters(), foreach=False, **ADAMW)
    u = 2.0**-24
    n = max(p.numel() for p in m3.parameters())
    P = len(list(m3.parameters()))
    gamma = lambda k: k * u / (1 - k * u)  # noqa: E731
    bound = gamma(n + 1) + gamma(P + 1) + 4 * u
    for ids_list in data[:1]:
        for ids in ids_list:
            (lm_loss(m3, ids) / micro).backward()
        total = torch.nn.utils.clip_grad_norm_(m3.parameters(), max_norm)
        c_torch = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        assert abs(c_torch / coefs[0] - 1) <= bound
        with ExactSqrt():
            o3.step()


def test_plain_backward_with_exact_clipping_is_explained():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = fn.AdamW(m.parameters(), max_grad_norm=1.0)
    prepare(m, opt)
    w0 = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(RuntimeError, match=r"norm-only backward.*opt.backward\(loss\)"):
        m(torch.randn(4, 8)).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(w0, m.parameters()))
    opt.backward(m(torch.randn(4, 8)).sum())
    opt.step()


@needs_fused_aten
def test_clipping_by_previous_norm():
    """Step t scales by min(1, max/(norm_{t-1} + 1e-6)); step 1 is not clipped."""
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), max_grad_norm=0.5, clipping="previous", **ADAMW)
    prepare(m1, opt)
    data = batches(4)
    train_forge(m1, opt, data)
    norms = [s["grad_norm"] for s in opt.stats_history]
    coefs = [1.0] + [
        float(torch.clamp(0.5 / (torch.tensor(n, dtype=torch.float32) + 1e-6), max=1.0)) for n in norms[:-1]
    ]
    assert [s["clip_coef"] for s in opt.stats_history] == [None] + coefs[1:]
    assert all(c < 1 for c in coefs[1:])
    _clip_reference(m2, data, 0.5, coefs)
    assert_same_weights(m1, m2)


@needs_fused_aten
def test_injected_nonfinite_gradients_leave_weights_finite_and_unchanged_there():
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), **ADAMW)
    prepare(m1, opt)
    ref = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    ids = batches(1)[0][0]

    def poison(model):
        # dY of one output feature of one token of down_proj is inf: dW row 5 non-finite (all columns
        # where x is nonzero); the poisoned dX makes every upstream gradient non-finite too
        layer = model.model.layers[1].mlp.down_proj
        handle = layer.register_full_backward_pre_hook(
            lambda mod, gout: (
                gout[0].index_put(
                    (torch.tensor([0]), torch.tensor([3]), torch.tensor([5])), torch.tensor(float("inf"))
                ),
            )
        )
        return handle

    h1 = poison(m1)
    before = {n: p.detach().clone() for n, p in m1.named_parameters()}
    lm_loss(m1, ids).backward()
    opt.step()
    h1.remove()
    h2 = poison(m2)
    lm_loss(m2, ids).backward()
    h2.remove()
    grads = {n: p.grad.clone() for n, p in m2.named_parameters()}
    with ExactSqrt():
        ref.step()  # torch writes NaN/inf where the gradient was bad
    assert opt.stats["nonfinite"] == sum(int((~torch.isfinite(g)).sum()) for g in grads.values()) > 0
    for (n, p), q in zip(m1.named_parameters(), m2.parameters()):
        bad = ~torch.isfinite(grads[n])
        assert torch.isfinite(p).all(), n
        assert torch.equal(p[bad], before[n][bad]), n
        assert torch.equal(p[~bad], q[~bad]), n  # elsewhere exactly torch's update
        assert (opt.state[p]["exp_avg"][bad] == 0).all() and (opt.state[p]["exp_avg_sq"][bad] == 0).all()
    r = fn.AdamW(m1.parameters(), nonfinite="raise", **ADAMW)
    unprepare(m1)
    prepare(m1, r)
    h = poison(m1)
    lm_loss(m1, ids).backward()
    with pytest.raises(FloatingPointError, match="non-finite gradient element"):
        r.step()
    h.remove()


class TwiceNet(torch.nn.Module):
    """A Linear applied twice, and an embedding tied to the output Linear."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.mid = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 50, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        h = torch.tanh(self.mid(h))
        h = torch.tanh(self.mid(h))  # the same module again
        return torch.nn.functional.cross_entropy(self.out(h).flatten(0, 1), ids.flatten())


@pytest.mark.parametrize(
    "clip,micro", [(None, 1), ("exact", 1), ("exact", 3)], ids=["plain", "clip", "clip-accum3"]
)
@needs_fused_aten
def test_module_called_twice_and_tied_weights_match_torch(clip, micro):
    """The reused Linear and the tied embedding take the materialized path; clipping and accumulation too."""
    torch.manual_seed(0)
    m1 = TwiceNet()
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), max_grad_norm=0.05 if clip else None, accumulation_steps=micro, **ADAMW)
    prepare(m1, opt)
    assert m1._forge_num_handle.tied == ["out"] and "mid" in m1._forge_num_handle.fused
    ref = torch.optim.AdamW(m2.parameters(), foreach=False, **ADAMW)
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        ids = [torch.randint(0, 50, (4, 7), generator=g) for _ in range(micro)]
        l1 = [m1(i) / micro for i in ids]
        for loss in l1:
            opt.backward(loss)
        opt.step()
        l2 = [m2(i) / micro for i in ids]
        for loss in l2:
            loss.backward()
        if clip:
            assert opt.stats["clip_coef"] < 1
            torch._foreach_mul_([p.grad for p in m2.parameters()], torch.tensor(opt.stats["clip_coef"]))
        with ExactSqrt():
            ref.step()
        ref.zero_grad()
        assert [x.item() for x in l1] == [x.item() for x in l2]
        assert_same_weights(m1, m2)


def test_exact_clipping_skips_the_whole_step_on_a_nonfinite_norm():
    m = tiny_llama()
    opt = fn.AdamW(m.parameters(), max_grad_norm=1.0, **ADAMW)
    prepare(m, opt)
    ids = batches(2)
    lm_loss(m, ids[0][0]).backward()
    opt.step()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    state = copy.deepcopy(opt.state_dict()["state"])
    layer = m.model.layers[0].mlp.up_proj
    h = layer.register_full_backward_pre_hook(lambda mod, gout: (gout[0] * float("nan"),))
    lm_loss(m, ids[1][0]).backward()
    h.remove()
    opt.step()
    assert opt.stats["skipped"]
    for n, p in m.named_parameters():
        assert torch.equal(p, before[n]), n
    after = opt.state_dict()["state"]
    for i, s in state.items():
        assert all(torch.equal(s[k], after[i][k]) for k in s)  # step counters included
    lm_loss(m, ids[0][0]).backward()  # and training goes on
    opt.step()
    assert not opt.stats["skipped"] and opt.stats["clip_coef"] is not None


def test_two_backwards_without_step_and_step_without_backward_are_explained():
    m = tiny_llama()
    opt = fn.AdamW(m.parameters(), **ADAMW)
    prepare(m, opt)
    ids = batches(1)[0][0]
    with pytest.raises(RuntimeError, match="no backward ran since the last step"):
        opt.step()
    lm_loss(m, ids).backward()
    after_one = {n: p.detach().clone() for n, p in m.named_parameters()}
    with pytest.raises(
        RuntimeError, match=r"already\s+updated in backward for this step.*Call optimizer.step\(\)"
    ):
        lm_loss(m, ids).backward()
    for n, p in m.named_parameters():
        assert torch.equal(p, after_one[n]), n  # never updated twice
    opt.step()
    lm_loss(m, ids).backward()
    opt.step()


@needs_fused_aten
@pytest.mark.parametrize("reentrant", [False, True])
def test_hf_gradient_checkpointing_bitwise(reentrant):
    m1 = tiny_llama()
    m2 = copy.deepcopy(m1)
    m1.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    m1.train()
    opt = fn.AdamW(m1.parameters(), **ADAMW)
    prepare(m1, opt)
    data = batches(4)
    assert train_forge(m1, opt, data) == train_torch(
        m2, lambda ps: torch.optim.AdamW(ps, foreach=False, **ADAMW), data
    )
    assert_same_weights(m1, m2)


class _WeightCastCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts fp32 -> bf16 copies of the given parameters' storage (autocast's weight casts)."""

    def __init__(self, params):
        super().__init__()
        self.ptrs = {p.data_ptr() for p in params}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16
                and args[0].dtype == torch.float32 and args[0].data_ptr() in self.ptrs):
            self.count += 1
        return func(*args, **kwargs)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_autocast_casts_each_weight_twice_and_trains_the_same_bits(reentrant):
    """With gradient checkpointing under autocast, a fused layer keeps the bf16 weight its
    recomputed forward cast, for dX in its backward: each weight is cast twice per step (forward,
    recompute), as without checkpointing (forward, backward), not three times; and the weights
    after training are bitwise those of the same training without checkpointing."""
    m1, m2 = tiny_llama(), tiny_llama()
    m1.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    models = []
    for m in (m1, m2):
        m.train()
        opt = fn.AdamW(m.parameters(), **ADAMW)
        prepare(m, opt)
        weights = [mod.weight for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
        assert weights and len(m._forge_num_handle.fused) == len(weights)  # every Linear fused (untied head)
        casts = []
        for (ids,) in batches(3):
            with _WeightCastCounter(weights) as counter:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = lm_loss(m, ids)
                loss.backward()
            opt.step()
            opt.zero_grad()
            casts.append(counter.count)
        assert casts == [2 * len(weights)] * 3, casts
        models.append(m)
    assert_same_weights(*models)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_segment_with_its_own_saved_tensor_hooks(reentrant):
    """A saved-tensor hook of the user's own inside a checkpointed segment (save_on_cpu, which keeps
    what it packs): the fused layers keep no cast there, the step runs in both checkpointing modes,
    and the update equals the one without checkpointing."""
    results = []
    for ckpt in (True, False):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
        opt = fn.SGD(net.parameters(), lr=0.5)
        prepare(net, opt)
        x = torch.randn(4, 16, requires_grad=True)  # reentrant checkpointing needs an input that does

        def segment(inp):
            with torch.autograd.graph.save_on_cpu():
                return net(inp)

        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.utils.checkpoint.checkpoint(segment, x, use_reentrant=reentrant) if ckpt else segment(x)
        y.float().square().sum().backward()
        opt.step()
        results.append([p.detach().clone() for p in net.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


class _ProductCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the matrix products (mm, addmm) whose output has the given shape."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.count = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) and tuple(out.shape) == self.shape:
            self.count += 1
        return out


@pytest.mark.parametrize("amp", [False, True])
def test_checkpoint_recomputation_stops_before_the_last_fused_product(amp):
    """Non-reentrant checkpointing stops recomputing at the last saved tensor the backward needs. F.linear
    saves its inputs before its product, so the segment's last layer is never multiplied again; a fused
    layer must not be either (it was, as one autograd node: session 28). Its product [5, 3] is the only
    [5, 3] product of this step (dX is [5, 11], dW [3, 11] or row chunks of it)."""
    counts = {}
    for fused in (False, True):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(7, 11), torch.nn.Tanh(), torch.nn.Linear(11, 3))
        if fused:
            prepare(net, fn.SGD(net.parameters(), lr=0.1))
        x = torch.randn(5, 7, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            y = torch.utils.checkpoint.checkpoint(net, x, use_reentrant=False)
        with _ProductCounter((5, 3)) as counter:
            y.float().sum().backward()
        counts[fused] = counter.count
    assert counts == {False: 0, True: 0}


@pytest.mark.parametrize("amp", [False, True])
def test_checkpointed_fused_layers_train_as_uncheckpointed(amp):
    """Inside a non-reentrant checkpointed segment a fused layer is two autograd nodes; outside, one. The
    same training either way, bit for bit: a bias, an input that needs no gradient, and a weight used
    twice in the segment (its gradient materialized and returned to autograd, in the weight's dtype)."""
    results = []
    for ckpt in (True, False):
        torch.manual_seed(0)
        first, shared = torch.nn.Linear(7, 11), torch.nn.Linear(11, 11, bias=False)
        net = torch.nn.ModuleList([first, shared])
        opt = fn.AdamW(net.parameters(), **ADAMW)
        prepare(net, opt)

        def segment(inp):
            return shared(torch.tanh(shared(torch.tanh(first(inp)))))

        for step in range(3):
            x = torch.randn(5, 7, generator=torch.Generator().manual_seed(step))  # needs no gradient
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                y = torch.utils.checkpoint.checkpoint(segment, x, use_reentrant=False) if ckpt else segment(x)
            y.float().square().sum().backward()
            opt.step()
            opt.zero_grad()
        results.append([p.detach().clone() for p in net.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("amp", [False, True])
def test_checkpointed_gpt2_trains_as_uncheckpointed(amp):
    """The two-node form with the Conv1D layout (GPT-2's weight [in, out], its product an addmm): a
    checkpointed tiny GPT-2 trains bit for bit as the same model without checkpointing."""
    models = []
    for ckpt in (True, False):
        m = tiny_gpt2()
        if ckpt:
            m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        m.train()
        opt = fn.AdamW(m.parameters(), **ADAMW)
        prepare(m, opt)
        for (ids,) in batches(3):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = lm_loss(m, ids)
            loss.backward()
            opt.step()
            opt.zero_grad()
        models.append(m)
    assert_same_weights(*models)


def test_autocast_bf16_trains_with_fp32_weight_gradient():
    """Under autocast the layer computes in bf16 like F.linear; dW = dyᵀx from the bf16 x, dy in fp32."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16, bias=False)
    w0 = lin.weight.detach().clone()
    opt = fn.SGD(lin.parameters(), lr=1.0)
    prepare(lin, opt)
    x = torch.randn(8, 32)
    seen = {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
        assert y.dtype == torch.bfloat16
        assert torch.equal(y, torch.nn.functional.linear(x, w0))  # autocast's own result
    y.register_hook(lambda g: seen.setdefault("dy", g))
    (y.float() ** 2).sum().backward()
    opt.step()
    dw = seen["dy"].float().t() @ x.to(torch.bfloat16).float()  # fp32, never rounded to bf16
    assert torch.equal(lin.weight, w0 - dw)  # SGD lr=1: fma(dw, -1, w) = w - dw, rounded once
    assert lin.weight.dtype == torch.float32
    # a Llama under autocast: trains, all finite
    m = tiny_llama()
    o = fn.AdamW(m.parameters(), **ADAMW)
    prepare(m, o)
    for micro in batches(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = lm_loss(m, micro[0])
        loss.backward()
        o.step()
    assert all(torch.isfinite(p).all() and p.dtype == torch.float32 for p in m.parameters())
    assert o.stats["nonfinite"] == 0 and math.isfinite(o.stats["grad_norm"])


def test_opt_backward_on_a_wrapped_hf_loss_equals_loss_backward():
    """The HF output loss runs both clipping passes itself; opt.backward on it does not run four."""

    def run(use_opt_backward):
        m = tiny_llama()
        opt = fn.AdamW(m.parameters(), max_grad_norm=0.05, accumulation_steps=2, **ADAMW)
        prepare(m, opt)
        train_forge(m, opt, batches(3, micro=2), use_opt_backward=use_opt_backward)
        return m, [s["clip_coef"] for s in opt.stats_history]

    m1, c1 = run(False)
    m2, c2 = run(True)
    assert c1 == c2 and all(c < 1 for c in c1)
    assert_same_weights(m1, m2)
