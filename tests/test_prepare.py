"""prepare()/unprepare(): what is swapped, what is kept, what is refused."""

from __future__ import annotations

import copy

import pytest
import torch

import forge_num as fn
import forge_num.rules  # noqa: F401  (fn.rules)
from forge_num import torch_backend as tb
from forge_num.fused import prepare, unprepare
from tests.torch_reference import ExactSqrt, needs_fused_aten  # noqa: E402




class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(10, 20)
        self.frozen = torch.nn.Linear(20, 20)
        self.frozen.requires_grad_(False)
        self.norm = torch.nn.LayerNorm(20)
        self.b = torch.nn.Linear(20, 5, bias=False)

    def forward(self, x):
        return self.b(self.norm(torch.relu(self.frozen(self.a(x))))).square().mean()


def test_prepare_keeps_parameters_names_and_state_dict_and_unprepare_restores():
    torch.manual_seed(0)
    m = Net()
    params = dict(m.named_parameters())
    keys = list(m.state_dict())
    opt = fn.AdamW([p for p in m.parameters() if p.requires_grad])
    assert fn.prepare(m, opt) is m  # forge_num.prepare is the function
    assert isinstance(m.a, torch.nn.Linear) and type(m.a).__name__ == "FusedLinear"
    assert type(m.frozen) is torch.nn.Linear  # frozen weight: not fused
    assert dict(m.named_parameters()) == params and list(m.state_dict()) == keys
    assert set(m._forge_num_handle.fused) == {"a", "b"}
    frozen = {n: p.detach().clone() for n, p in m.frozen.named_parameters()}
    m(torch.randn(3, 10)).backward()
    assert all(p.grad is None for p in m.parameters())  # nothing materialized, nothing left
    opt.step()
    assert all(torch.equal(p, frozen[n]) for n, p in m.frozen.named_parameters())
    with pytest.raises(RuntimeError, match="already prepared"):
        prepare(m, opt)
    unprepare(m)
    assert type(m.a) is torch.nn.Linear and not hasattr(m, "_forge_num_handle")
    m(torch.randn(3, 10)).backward()
    assert m.a.weight.grad is not None  # plain autograd again
    opt.step()  # plain mode: updates from .grad


@needs_fused_aten
def test_fused_layer_matches_torch_and_materializes_no_weight_gradient(monkeypatch):
    """With small blocks the weight is updated block by block; the blocks never hold the whole dW."""
    monkeypatch.setattr(tb, "BLOCK_ELEMS", 64)
    seen = []
    real = tb.weight_grad_blocks

    def spy(x, dy, M, N, accum=None):
        for rows, g in real(x, dy, M, N, accum):
            seen.append(tuple(g.shape))
            yield rows, g

    monkeypatch.setattr(tb, "weight_grad_blocks", spy)
    torch.manual_seed(0)
    m1 = torch.nn.Linear(16, 24)
    m2 = copy.deepcopy(m1)
    w0, b0 = m1.weight.detach().clone(), m1.bias.detach().clone()
    opt = fn.SGD(m1.parameters(), lr=0.1, momentum=0.9)
    prepare(m1, opt)
    x = torch.randn(5, 16)
    (m1(x) ** 2).sum().backward()
    opt.step()
    assert seen and all(r * c <= 64 for r, c in seen)
    ref = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9, foreach=False)
    (m2(x) ** 2).sum().backward()
    ref.step()
    assert torch.equal(m1.bias, m2.bias)
    # the weight: SGD's rule on the gradient the blocks computed (MKL's order per block may differ
    # from one full mm, so the reference takes the blocks' dW rather than autograd's)
    m0 = copy.deepcopy(m2)
    with torch.no_grad():
        m0.weight.copy_(w0)
        m0.bias.copy_(b0)
    dy = 2 * torch.nn.functional.linear(x, w0, b0)
    dw = torch.cat([g for _, g in real(x, dy, 24, 16)])
    w = w0.clone()
    tb.elementwise_update(
        w, dw, [torch.zeros_like(w)], fn.rules.SGD, fn.rules.SGD.scalars({"lr": 0.1, "momentum": 0.9}, 1)
    )
    assert torch.equal(m1.weight, w)


@needs_fused_aten
def test_conv1d_transposed_weight_bitwise():
    transformers = pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    m1 = torch.nn.Sequential(Conv1D(12, 8), torch.nn.Tanh(), Conv1D(4, 12))
    m2 = copy.deepcopy(m1)
    opt = fn.AdamW(m1.parameters(), lr=1e-2)
    prepare(m1, opt)
    assert [type(layer).__name__ for layer in m1] == ["FusedConv1D", "Tanh", "FusedConv1D"]
    ref = torch.optim.AdamW(m2.parameters(), lr=1e-2, foreach=False)
    for _ in range(3):
        x = torch.randn(2, 3, 8)
        (m1(x) ** 2).mean().backward()
        opt.step()
        (m2(x) ** 2).mean().backward()
        with ExactSqrt():
            ref.step()
        ref.zero_grad()
        for p, q in zip(m1.parameters(), m2.parameters()):
            assert torch.equal(p, q)
    assert transformers


def test_subclass_with_own_forward_is_left_alone():
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    m = torch.nn.Sequential(Scaled(4, 4), torch.nn.Linear(4, 1))
    opt = fn.AdamW(m.parameters())
    prepare(m, opt)
    assert type(m[0]) is Scaled and type(m[1]).__name__ == "FusedLinear"
    m(torch.randn(2, 4)).sum().backward()  # its weight goes through the hook path
    opt.step()


def test_refusals():
    m = Net()
    with pytest.raises(TypeError, match="forge_num optimizer.*torch.optim.adamw.AdamW"):
        prepare(m, torch.optim.AdamW(m.parameters()))
    extra = torch.nn.Parameter(torch.zeros(3))
    opt = fn.AdamW([*m.a.parameters(), extra], max_grad_norm=1.0)
    with pytest.raises(ValueError, match="not in the prepared model"):
        prepare(m, opt)
    with pytest.raises(RuntimeError, match="not prepared"):
        unprepare(Net())
    opt = fn.AdamW(m.parameters())
    prepare(m, opt)
    m(torch.randn(2, 10)).backward()
    with pytest.raises(RuntimeError, match="step in progress"):
        unprepare(m)


def test_optimizer_params_outside_the_model_stay_plain():
    m = torch.nn.Linear(4, 2)
    extra = torch.nn.Parameter(torch.ones(3))
    opt = fn.SGD([*m.parameters(), extra], lr=0.5)
    prepare(m, opt)
    (m(torch.randn(3, 4)).sum() + extra.sum()).backward()
    opt.step()
    assert torch.equal(extra.detach(), torch.full((3,), 0.5))


interpreter = pytest.mark.skipif(
    __import__("os").environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available(),
    reason="the kernels need a GPU or TRITON_INTERPRET=1",
)


@interpreter
def test_kernels_backend_through_prepare(monkeypatch):
    """The optimizer drives forge_num.kernels (Triton; the interpreter on a CPU) through the same calls.

    SGD, lr 0.1: w' = fma(g, -0.1, w), so the two backends' weights differ by at most
    0.1·|g_kernel - g_torch| + one rounding each, and each g is an fp32 dot product of K terms
    within γ_K·Σ|dy||x| of the exact one.
    """
    from forge_num import kernels

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    calls = []
    for name in (
        "fused_linear_update",
        "accumulate_weight_grad",
        "weight_grad_norm_sq",
        "elementwise_update",
    ):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _n=name, _r=real, **k: calls.append(_n) or _r(*a, **k))
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40).to(dev)
    w0 = lin.weight.detach().clone()
    ref = copy.deepcopy(lin)
    o1, o2 = (
        fn.SGD(lin.parameters(), lr=0.1, backend="kernels"),
        fn.SGD(ref.parameters(), lr=0.1, backend="torch"),
    )
    prepare(lin, o1)
    prepare(ref, o2)
    x = torch.randn(33, 24, device=dev)
    dy = torch.randn(33, 40, device=dev)
    (lin(x) * dy).sum().backward()
    (ref(x) * dy).sum().backward()
    o1.step()
    o2.step()
    assert calls == ["fused_linear_update", "elementwise_update"]
    K, u = 33, 2.0**-24
    gamma = K * u / (1 - K * u)
    gbound = 2 * gamma * (dy.abs().t() @ x.abs())
    ulp = lambda t: torch.nextafter(t.abs(), torch.full_like(t, float("inf"))) - t.abs()  # noqa: E731
    assert (
        (lin.weight - ref.weight).abs() <= 0.1 * gbound * (1 + 2 * u) + ulp(lin.weight) + ulp(ref.weight)
    ).all()
    assert torch.equal(lin.bias, ref.bias) and not torch.equal(lin.weight, w0)
    # exact clipping with accumulation: the norm pass, the accumulation buffer, the fused update
    calls.clear()
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dev)
    opt = fn.AdamW(net.parameters(), max_grad_norm=1e-3, accumulation_steps=2, backend="kernels")
    prepare(net, opt)
    for _ in range(2):
        opt.backward(net(torch.randn(5, 8, device=dev)).square().mean() / 2)
    opt.step()
    assert calls.count("accumulate_weight_grad") == 2 and calls.count("weight_grad_norm_sq") == 2
    assert calls.count("fused_linear_update") == 2 and calls.count("elementwise_update") == 2
    assert opt.stats["clip_coef"] < 1 and all(p.grad is None for p in net.parameters())
