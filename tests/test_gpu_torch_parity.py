"""On the GPU: the largest ulp distance between forge_num's AdamW rule and torch.optim.AdamW given
the same gradient, for torch's single-tensor, foreach and fused CUDA implementations. forge_num's
rule follows torch's single-tensor op order (forge_num/rules.py); torch's CUDA kernels differ from
its CPU ones (contraction by nvcc, reciprocal multiplication), so the distances are measured and
reported, not assumed. The report goes to $FORGE_RESULTS_DIR/torch_adamw_ulp.json."""

from __future__ import annotations

import json
import os

import pytest
import torch

from forge_num import kernels, rules

pytestmark = [pytest.mark.exactness, pytest.mark.gpu]


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|ordinal(a) - ordinal(b)| of fp32 encodings (monotone integer map of the floats)."""
    def ordinal(t):
        i = t.view(torch.int32).to(torch.int64)
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)
    return (ordinal(a) - ordinal(b)).abs()


def test_adamw_ulp_distance_to_torch():
    torch.manual_seed(0)
    n = 1 << 22
    hyper = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    p0 = torch.randn(n, device="cuda")
    g = torch.randn(n, device="cuda") * torch.exp2(torch.randint(-8, 8, (n,), device="cuda").float())
    m0 = torch.randn(n, device="cuda") * 0.1
    v0 = torch.rand(n, device="cuda") * 1e-2
    step = 5
    report = {}
    ours_p, ours_m, ours_v = p0.clone(), m0.clone(), v0.clone()
    kernels.elementwise_update(ours_p, g, [ours_m, ours_v], rules.ADAMW, rules.ADAMW.scalars(hyper, step))
    for impl, kw in {"single_tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}.items():
        p = p0.clone().requires_grad_(True)
        p.grad = g.clone()
        opt = torch.optim.AdamW([p], lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"],
                                weight_decay=hyper["weight_decay"], **kw)
        opt.state[p] = {"step": torch.tensor(float(step - 1), device="cuda" if impl == "fused" else "cpu"),
                        "exp_avg": m0.clone(), "exp_avg_sq": v0.clone()}
        opt.step()
        st = opt.state[p]
        report[impl] = {
            name: {"max_ulp": int(ulp_distance(a, b).max()), "frac_differing": float((a != b).float().mean())}
            for name, a, b in (("param", ours_p, p.detach()), ("exp_avg", ours_m, st["exp_avg"]),
                               ("exp_avg_sq", ours_v, st["exp_avg_sq"]))
        }
    out = os.environ.get("FORGE_RESULTS_DIR")
    if out:
        with open(os.path.join(out, "torch_adamw_ulp.json"), "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    # the state updates use no sqrt or division: torch's single-tensor CUDA path must agree on m
    assert report["single_tensor"]["exp_avg"]["max_ulp"] <= 1
