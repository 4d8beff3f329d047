"""forge_num's optimizers in plain mode (no prepare): torch.optim parity, state dicts, options, checks.

The torch reference runs ``foreach=False`` (the single-tensor code whose op order forge_num.rules
reproduces) under ``ExactSqrt``, a TorchFunctionMode that makes float32 ``sqrt`` correctly rounded:
torch's own CPU float32 sqrt is not (tests/test_torch_backend.py shows it), and forge_num's rules use
the IEEE square root. Everything else in torch's step is already correctly rounded fp32.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import forge_num as fn
from tests.torch_reference import ExactSqrt, needs_fused_aten  # noqa: E402




def lion_reference_step(params, lr, betas, weight_decay, state):
    """lion-pytorch's update (lucidrains/lion-pytorch, lion_pytorch.py, `update_fn`), foreach-free."""
    beta1, beta2 = betas
    with torch.no_grad():
        for p in params:
            if p.grad is None:
                continue
            exp_avg = state.setdefault(p, torch.zeros_like(p))
            p.data.mul_(1 - lr * weight_decay)
            update = exp_avg.clone().mul_(beta1).add(p.grad, alpha=1 - beta1).sign_()
            p.add_(update, alpha=-lr)
            exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(12, 24)
        self.norm = torch.nn.LayerNorm(24)
        self.b = torch.nn.Linear(24, 6)

    def forward(self, x):
        return self.b(torch.tanh(self.norm(self.a(x))))


def _data(n=8):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(16, 12, generator=g), torch.randn(16, 6, generator=g)) for _ in range(n)]


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def _same_params(m1, m2):
    return all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


def _groups(model):
    return [
        {"params": [model.a.weight, model.b.weight], "lr": 3e-3},
        {"params": [model.a.bias, model.b.bias, *model.norm.parameters()], "lr": 1e-2},
    ]


CASES = {
    "adamw": (
        lambda ps: fn.AdamW(ps, weight_decay=0.1),
        lambda ps: torch.optim.AdamW(ps, weight_decay=0.1, foreach=False),
    ),
    "adam": (
        lambda ps: fn.Adam(ps, betas=(0.8, 0.99), weight_decay=0.05),
        lambda ps: torch.optim.Adam(ps, betas=(0.8, 0.99), weight_decay=0.05, foreach=False),
    ),
    "adamw-beta1-0.3": (
        lambda ps: fn.AdamW(ps, betas=(0.3, 0.9)),
        lambda ps: torch.optim.AdamW(ps, betas=(0.3, 0.9), foreach=False),
    ),
    "sgd-momentum": (
        lambda ps: fn.SGD(ps, momentum=0.9, dampening=0.1, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, momentum=0.9, dampening=0.1, weight_decay=0.01, foreach=False),
    ),
    "sgd-nesterov": (
        lambda ps: fn.SGD(ps, momentum=0.9, nesterov=True),
        lambda ps: torch.optim.SGD(ps, momentum=0.9, nesterov=True, foreach=False),
    ),
    "sgd-plain": (
        lambda ps: fn.SGD(ps, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, weight_decay=0.01, foreach=False),
    ),
}


@needs_fused_aten
@pytest.mark.parametrize("case", sorted(CASES))
def test_plain_mode_matches_torch_with_groups_and_scheduler(case):
    make_fn, make_torch = CASES[case]
    torch.manual_seed(0)
    m1 = Net()
    m2 = copy.deepcopy(m1)
    o1, o2 = make_fn(_groups(m1)), make_torch(_groups(m2))
    s1 = torch.optim.lr_scheduler.OneCycleLR(o1, max_lr=[5e-3, 2e-2], total_steps=8)
    s2 = torch.optim.lr_scheduler.OneCycleLR(o2, max_lr=[5e-3, 2e-2], total_steps=8)
    for x, y in _data():
        l1, l2 = _loss(m1, x, y), _loss(m2, x, y)
        assert l1.item() == l2.item()
        l1.backward()
        o1.step()
        o1.zero_grad()
        l2.backward()
        with ExactSqrt():
            o2.step()
        o2.zero_grad()
        s1.step()
        s2.step()
        assert _same_params(m1, m2)
        assert [g["lr"] for g in o1.param_groups] == [g["lr"] for g in o2.param_groups]
    assert o1.state_dict()["state"].keys() == o2.state_dict()["state"].keys()


@needs_fused_aten
def test_without_exact_sqrt_torch_differs():
    """Why ExactSqrt: with torch's own float32 sqrt one AdamW step already differs (not a tolerance)."""
    g = torch.Generator().manual_seed(5)
    p1 = torch.nn.Parameter(torch.randn(1 << 16, generator=g))
    p2 = torch.nn.Parameter(p1.detach().clone())
    grad = torch.randn(1 << 16, generator=g) * torch.exp(torch.randn(1 << 16, generator=g) * 3)
    o1 = fn.AdamW([p1], lr=1e-2, eps=1e-30)
    o2 = torch.optim.AdamW([p2], lr=1e-2, eps=1e-30, foreach=False)
    p1.grad, p2.grad = grad.clone(), grad.clone()
    o1.step()
    o2.step()
    assert not torch.equal(p1, p2)
    p3 = torch.nn.Parameter(p1.detach().clone())
    o3 = torch.optim.AdamW([p3], lr=1e-2, eps=1e-30, foreach=False)
    o3.load_state_dict(copy.deepcopy(o1.state_dict()))
    p1.grad, p3.grad = grad.clone(), grad.clone()
    o1.step()
    with ExactSqrt():
        o3.step()
    assert torch.equal(p1, p3)


@needs_fused_aten
def test_lion_matches_reference():
    torch.manual_seed(0)
    m1 = Net()
    m2 = copy.deepcopy(m1)
    o1 = fn.Lion(m1.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    state = {}
    for x, y in _data():
        _loss(m1, x, y).backward()
        o1.step()
        o1.zero_grad()
        _loss(m2, x, y).backward()
        lion_reference_step(list(m2.parameters()), 1e-3, (0.9, 0.99), 0.1, state)
        m2.zero_grad()
        assert _same_params(m1, m2)
    assert all(
        torch.equal(o1.state[p]["exp_avg"], state[q]) for p, q in zip(m1.parameters(), m2.parameters())
    )


def _train(model, opt, data, exact=False):
    for x, y in data:
        _loss(model, x, y).backward()
        if exact:
            with ExactSqrt():
                opt.step()
        else:
            opt.step()
        opt.zero_grad()


@needs_fused_aten
@pytest.mark.parametrize("direction", ["forge_to_torch", "torch_to_forge"])
def test_state_dict_round_trips_with_torch_adamw(direction):
    torch.manual_seed(0)
    m = Net()
    data = _data(6)
    ma, mb = copy.deepcopy(m), copy.deepcopy(m)
    if direction == "forge_to_torch":
        oa = fn.AdamW(ma.parameters(), lr=3e-3)
        _train(ma, oa, data[:3])
        sd = copy.deepcopy(oa.state_dict())  # a checkpoint: torch's load_state_dict aliases live tensors
        assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
        assert sd["state"][0]["step"].dtype == torch.float32 and sd["state"][0]["step"].dim() == 0
        mb.load_state_dict(ma.state_dict())
        ob = torch.optim.AdamW(mb.parameters(), lr=1.0, foreach=False)
        ob.load_state_dict(sd)
        assert ob.param_groups[0]["lr"] == 3e-3 and ob.param_groups[0]["decoupled_weight_decay"]
        _train(ma, oa, data[3:])
        _train(mb, ob, data[3:], exact=True)
    else:
        oa = torch.optim.AdamW(ma.parameters(), lr=3e-3, foreach=False)
        _train(ma, oa, data[:3], exact=True)
        mb.load_state_dict(ma.state_dict())
        ob = fn.AdamW(mb.parameters(), lr=1.0)
        ob.load_state_dict(copy.deepcopy(oa.state_dict()))
        _train(ma, oa, data[3:], exact=True)
        _train(mb, ob, data[3:])
    assert _same_params(ma, mb)


def test_step_counter_advances_as_torch_adamws_at_float32_limits():
    """The step counter, a float32 tensor as torch's, advanced from 2^24 - 1 (the last step float32
    counts exactly) in both optimizers: the same stored values (2^24, then 2^24 again: RN(2^24 + 1)),
    whatever way each advances it."""
    torch.manual_seed(0)
    m = Net()
    ma, mb = copy.deepcopy(m), copy.deepcopy(m)
    ours, theirs = fn.AdamW(ma.parameters(), lr=1e-3), torch.optim.AdamW(mb.parameters(), lr=1e-3, foreach=False)
    _train(ma, ours, _data(1))
    sd = copy.deepcopy(ours.state_dict())
    for st in sd["state"].values():
        st["step"].fill_(2.0**24 - 1)
    mb.load_state_dict(ma.state_dict())
    ours.load_state_dict(copy.deepcopy(sd))
    theirs.load_state_dict(copy.deepcopy(sd))
    for expected in (2.0**24, 2.0**24):
        _train(ma, ours, _data(1))
        _train(mb, theirs, _data(1), exact=True)
        got = [ours.state[p]["step"] for p in ma.parameters()]
        want = [theirs.state[p]["step"] for p in mb.parameters()]
        assert all(g.dtype == w.dtype == torch.float32 and g.item() == w.item() == expected for g, w in zip(got, want))


def test_sgd_state_dict_keys_and_round_trip():
    torch.manual_seed(0)
    m = Net()
    o = fn.SGD(m.parameters(), lr=0.1, momentum=0.9)
    _train(m, o, _data(2))
    sd = o.state_dict()
    assert set(sd["state"][0]) == {"momentum_buffer"}
    t = torch.optim.SGD(copy.deepcopy(m).parameters(), lr=0.5, momentum=0.5)
    t.load_state_dict(sd)
    assert t.param_groups[0]["momentum"] == 0.9
    o2 = fn.SGD(m.parameters(), lr=1.0)
    o2.load_state_dict(t.state_dict())
    assert torch.equal(o2.state[m.a.weight]["momentum_buffer"], o.state[m.a.weight]["momentum_buffer"])


def test_unknown_regime_and_regime_dtypes():
    # bf16-sr and 8bit keep bf16 weights (tests/test_optim_lowbit.py)
    with pytest.raises(TypeError, match="precision='8bit'.*bfloat16"):
        fn.AdamW(Net().parameters(), precision="8bit")
    with pytest.raises(ValueError, match="precision must be one of"):
        fn.AdamW(Net().parameters(), precision="fp16")


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda ps: fn.AdamW(ps, amsgrad=True), "amsgrad"),
        (lambda ps: fn.Adam(ps, maximize=True), "maximize"),
        (lambda ps: fn.AdamW(ps, capturable=True), "capturable"),
        (lambda ps: fn.AdamW(ps, differentiable=True), "differentiable"),
        (lambda ps: fn.AdamW(ps, foreach=True), "foreach"),
        (lambda ps: fn.AdamW(ps, fused=True), "fused"),
        (lambda ps: fn.SGD(ps, lr=0.1, maximize=True), "maximize"),
        (lambda ps: fn.SGD(ps, lr=0.1, fused=True), "fused"),
    ],
)
def test_unsupported_torch_options_raise(make, match):
    with pytest.raises(NotImplementedError, match=match):
        make(Net().parameters())


def test_bad_arguments_raise_clear_errors():
    ps = list(Net().parameters())
    with pytest.raises(ValueError, match="betas"):
        fn.AdamW(ps, betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="lr"):
        fn.AdamW(ps, lr=-1.0)
    with pytest.raises(ValueError, match="Nesterov"):
        fn.SGD(ps, lr=0.1, nesterov=True)
    with pytest.raises(TypeError, match="float32 weights.*bfloat16"):
        fn.AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))])
    with pytest.raises(ValueError, match="clipping"):
        fn.AdamW(ps, max_grad_norm=1.0, clipping="sometimes")
    with pytest.raises(ValueError, match="accumulation_steps"):
        fn.AdamW(ps, accumulation_steps=0)
    with pytest.raises(ValueError, match="nonfinite"):
        fn.AdamW(ps, nonfinite="ignore")
    with pytest.raises(ValueError, match="Adam for L2"):
        fn.AdamW(ps, decoupled_weight_decay=False)


def test_step_without_backward_is_explained():
    m = Net()
    o = fn.AdamW(m.parameters())
    with pytest.raises(RuntimeError, match="no backward ran since the last step.*no parameter has a .grad"):
        o.step()
    x, y = _data(1)[0]
    _loss(m, x, y).backward()
    o.step()
    with pytest.raises(RuntimeError, match="every .grad is the one the last step"):
        o.step()  # the same .grad again: it would be applied twice
    _loss(m, x, y).backward()  # accumulates into the same .grad tensor (a new version): fine
    o.step()


def test_a_new_gradient_where_a_freed_one_was_is_fresh(monkeypatch):
    """A .grad freed by zero_grad() and made anew by the next backward can take the freed tensor's
    address, so its id(), with the same version, 0: it is a new gradient all the same, and step()
    applies it. (Telling them apart by (id, version) raised "no backward ran" now and then in a plain
    training loop: CI, session 22.) Here every id() collides, as the worst case of that reuse."""
    import forge_num.optim as optim_module

    monkeypatch.setattr(optim_module, "id", lambda obj: 0, raising=False)
    m = Net()
    o = fn.AdamW(m.parameters())
    for _ in range(3):
        o.zero_grad(set_to_none=True)
        for p in m.parameters():
            p.grad = torch.ones_like(p)  # a new tensor, version 0, as a backward's
        o.step()
    with pytest.raises(RuntimeError, match="every .grad is the one the last step"):
        o.step()  # the same tensor, unmodified, is still refused


def test_telemetry_and_nonfinite_policy():
    torch.manual_seed(0)
    m = Net()
    o = fn.AdamW(m.parameters(), lr=1e-2)
    x, y = _data(1)[0]
    _loss(m, x, y).backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.a.weight.grad[0, :3] = float("inf")
    before = m.a.weight.detach().clone()
    o.step()
    assert o.stats["nonfinite"] == 3 and o.stats["step"] == 1
    assert torch.equal(m.a.weight[0, :3], before[0, :3]) and not torch.equal(m.a.weight[1], before[1])
    assert (o.state[m.a.weight]["exp_avg"][0, :3] == 0).all()
    assert math.isinf(o.stats["grad_norm"])
    o.zero_grad()
    _loss(m, x, y).backward()
    o.step()
    n64 = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in m.parameters()))
    assert o.stats["nonfinite"] == 0
    # fp64 sums of the same squares in two orders: relative difference below n * 2^-52
    assert abs(o.stats["grad_norm"] - n64) <= 1e-12 * n64
    assert len(o.stats_history) == 2 and grads
    r = fn.AdamW(m.parameters(), nonfinite="raise")
    o.zero_grad()
    _loss(m, x, y).backward()
    m.b.bias.grad[1] = float("nan")
    with pytest.raises(FloatingPointError, match="1 non-finite gradient element"):
        r.step()


def test_telemetry_is_read_when_asked_and_the_history_holds_complete_entries():
    """step() leaves its totals unread (on a GPU: in flight behind an event); the history a caller
    holds gains each step's entry once its totals are read, complete, never a placeholder; opt.stats
    reads the last step's; the values equal those of nonfinite="raise", which reads in step()."""
    torch.manual_seed(0)
    nets = [Net(), Net()]
    nets[1].load_state_dict(nets[0].state_dict())
    lazy, eager = (fn.AdamW(n.parameters(), lr=1e-2, nonfinite=nf) for n, nf in zip(nets, ("skip", "raise")))
    held = lazy.stats_history  # the list itself, as a logger may keep it
    for step, (x, y) in enumerate(_data(3), start=1):
        for net, opt in zip(nets, (lazy, eager)):
            opt.zero_grad()
            _loss(net, x, y).backward()
            opt.step()
        assert [e["step"] for e in held] == list(range(1, step))  # the last step's totals not read yet
        assert all(e["grad_norm"] is not None for e in held)
        assert [e["step"] for e in eager.stats_history] == list(range(1, step + 1))  # "raise" reads at once
        assert lazy.stats == eager.stats and lazy.stats["step"] == step and math.isfinite(lazy.stats["grad_norm"])
        assert held == eager.stats_history
    sd = lazy.state_dict()["forge_num"]
    assert sd["prev_norm"] == eager.stats["grad_norm"] == held[-1]["grad_norm"]


@needs_fused_aten
def test_plain_exact_clipping_equals_clip_grad_norm():
    """In plain mode the norm is torch's own (vector_norm per tensor, then of the stack): bitwise."""
    torch.manual_seed(0)
    m1 = Net()
    m2 = copy.deepcopy(m1)
    o1 = fn.AdamW(m1.parameters(), lr=1e-2, max_grad_norm=0.05)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2, foreach=False)
    for x, y in _data(5):
        _loss(m1, x, y).backward()
        o1.step()
        o1.zero_grad()
        _loss(m2, x, y).backward()
        torch.nn.utils.clip_grad_norm_(m2.parameters(), 0.05)
        with ExactSqrt():
            o2.step()
        o2.zero_grad()
        assert o1.stats["clip_coef"] < 1.0
        assert _same_params(m1, m2)


def test_closure():
    m = Net()
    o = fn.SGD(m.parameters(), lr=0.1)
    x, y = _data(1)[0]

    def closure():
        o.zero_grad()
        loss = _loss(m, x, y)
        loss.backward()
        return loss

    assert isinstance(o.step(closure), torch.Tensor)
