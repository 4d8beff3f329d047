"""Fidelity benchmark: how far each optimizer's weights drift from exact (fp64) AdamW.

The claim under test (issue 4, item 5): forge_num never rounds the gradient (the fused kernel's fp32
accumulator reaches the rule, proofs/regimes.md Proposition 1), so its updates keep a fidelity that
optimizers fed a bf16 gradient, or storing bf16 weights with round-to-nearest, lose.

Part 1, per-step update error on Llama-shaped linear layers [M, N] with K tokens. For each trial (a
data seed) the same W0 (bf16-representable, std 0.02 as Llama's init: every method starts from the
same values) and the same T batches (X [K, N], dY [K, M], bf16) are given to every method; AdamW
starts from a zero state (so bitsandbytes and torchao, whose state cannot be injected, start where
the others do). The reference is AdamW in fp64 with dW = dYᵀX computed in fp64 from the bf16
values. Methods:

    forge_fp32     forge_num.kernels.fused_linear_update on fp32 W and states (CPU: torch_backend)
    forge_bf16sr   the same, bf16 W and states, stochastic rounding (Philox key derive_seed(s, t, 0))
    forge_8bit     the same, bf16 W and Q8 states (8-bit codes + scale per 128 elements of a row)
    torch_amp      torch.optim.AdamW on fp32 W and states, gradient = bf16 dW (cuBLAS, as autocast) in fp32
    torch_bf16     torch.optim.AdamW on bf16 W (states bf16), bf16 gradient
    bnb_adamw8bit  bitsandbytes.optim.AdamW8bit on bf16 W, bf16 gradient (CUDA only)
    ao_adamw8bit   torchao.optim.AdamW8bit(bf16_stochastic_round=True) on bf16 W, bf16 gradient

Stochastic methods (forge_bf16sr, forge_8bit, ao_adamw8bit) are repeated R times on the same data
with different rounding seeds. Reported per method (at step 1 and at step T, mean over trials):

    update_err       ||ΔW − ΔW_ref|| / ||ΔW_ref|| of one run (ΔW = W_t − W_{t−1}; mean over repeats)
    update_err_mean  the same for the update averaged over the R repeats: the error "in expectation".
                     For an unbiased rounding it falls like 1/sqrt(R); a bias does not average out
    w_err            ||W_t − W_t_ref|| / ||W_t_ref − W0||: the stored weight's error relative to the
                     distance the exact trajectory moved
    lost             fraction of elements with W_t == W_{t−1} although ΔW_ref != 0

Expectations that the tests check (tests/test_fidelity.py; u32 = 2^-24, u_bf16 = 2^-8 unit roundoffs):

* forge_fp32 at step 1: storing W_t in fp32 alone may move each element by up to u32·|W_t| (rounding
  to nearest, |fl(x) − x| ≤ u·|x|), so ||ΔW − ΔW_ref|| ≤ u32·||W_t|| + (error of ΔW before the store).
  Before the store: the gradient is an fp32 sum of K products of bf16 values, each product exact in
  fp32 (8 + 8 significant bits ≤ 24), so |dW − dW_exact| ≤ γ_{K−1}·(|dY|ᵀ|X|) with
  γ_n = n·u32/(1 − n·u32) (Higham, eq. 3.5). At step 1 from a zero state the bias corrections
  make m̂ = g and v̂ = g², so AdamW's update is ΔW = −lr·g/(|g| + eps) (≈ −lr·sign(g)), whose
  relative sensitivity to g is eps/(|g| + eps) ≤ 1, and its ~12 fp32 operations (rules.adamw_update)
  add at most (1 + u32)^12 − 1 ≈ 12·u32 relative error. To first order, in L2:
      update_err ≤ fp32_bound := u32·||W_1||/||ΔW_ref|| + 12·u32 + γ_{K−1}·|| |dY|ᵀ|X| ||/||dW||
  (reported per shape; a first-order bound with the sensitivity taken as 1, not a theorem). On the
  H200 the mainloop runs on bf16 tensor cores, not fp32 FMA chains; their proved bound
  (proofs/tensor_core_model.md, Theorem 1, no subnormal operands) is ⌈K/16⌉·10·2^-24·Σ|p_k|
  ≈ 0.63·K·u32·Σ|p_k|, below γ_{K−1}·Σ|p_k| for K ≥ 16, so the same fp32_bound applies there. With
  lr = 1e-5 and |W| ≈ 0.02 the storage term dominates (≈ 1e-4). It is far below u_bf16 = 3.9e-3,
  the relative error that one bf16 rounding of the gradient (or of anything in the update path)
  may introduce per element. From step 2 on ΔW depends on g through m and v and no longer only
  through sign(g), so a bf16 gradient (torch_amp) shows there: expect its update_err_T near
  u_bf16·(1 − β1)·|g|/|m| ~ 1e-3, and forge_fp32's to stay at the storage level.
* torch_bf16 at step 1: rounding W + ΔW to nearest bf16 returns W when |ΔW| < ulp_below(W)/2, where
  ulp_below is the spacing just below |W| in the direction of the step (half the binade's ulp at a
  power of two). At step 1 |ΔW| ≤ lr·(1 + 2^-6) (exactly lr·|g|/(|g| + eps) ≤ lr, plus at most a
  few bf16 roundings of 2^-8 each in torch's step), so every element with
  lr·(1 + 2^-6) < ulp_below(W0)/2 keeps its value: lost ≥ rne_lost_bound (reported). For
  lr = 1e-5 that is every |W| ≥ 2^-8, about 85% of the elements at std 0.02: P(|Z| ≥ 0.195).
* forge_bf16sr at step 1: every repeat starts from the same W0 and zero state, so the R stored
  weights are independent (distinct Philox keys), and E[W_1] equals the fp32 value (proofs/stochastic_rounding.md, Thm 1).
  Then E||mean − ΔW_ref||² = ||fp32 error||² + E||single − ΔW_ref||²/R (up to the fp32 error's cross
  term), so update_err_mean ≈ update_err/sqrt(R): the loss of single updates (lost > 0 as well) is
  recovered in expectation. torch_bf16's rounding is deterministic: its update_err_mean equals its
  update_err (≈ sqrt(lost): each lost element misses its whole update of ≈ lr).

Part 2, a short training run: a tiny Llama (transformers' LlamaConfig, random init rounded to bf16
so that every method starts from the same weights), one fixed batch of random bytes repeated, N
steps at a small lr (default 1e-5, where round-to-nearest bf16 cancels most updates), no weight
decay, no clipping. Methods: torch_amp (fp32 params + autocast bf16 + torch AdamW: the reference),
forge_fp32 (+ prepare, autocast), forge_bf16sr, forge_8bit (bf16 model + prepare), torch_bf16 (bf16
params, torch AdamW), bnb_adamw8bit, ao_adamw8bit. Reported: the loss per step, the final loss gap
to the reference, and, more sensitive at small lr, the parameter displacement ||θ_N − θ_0|| as a
ratio to the reference's and the distance ||θ_N − θ_N_ref|| relative to the reference's
displacement, and the loss drop (loss[0] − loss[N]) as a ratio to the reference's. The training
losses are each method's own forward (autocast for fp32 params, plain bf16 for bf16 params), and the
forward precision alone changes the measured drop: on the tiny CPU run the same fp32 AdamW trajectory
showed a drop of 0.0118 in an fp32 forward and 0.0084 under autocast. So the initial and final
weights of every method are also evaluated in one common fp32 forward (eval_loss_init/final,
eval_drop_vs_ref): compare methods on that.

Weight decay is 0 throughout: 1 − lr·wd (1 − 1e-7 at lr 1e-5, wd 0.01) is not representable in fp32
(ulp(1)/2 = 6e-8), so every fp32 implementation would apply a decay 19% off; that is a
hyper-parameter representation effect, not the subject here.

    python bench/fidelity.py [--methods M,..] [--shapes 4096x4096,14336x4096] [--tokens 4096] [--steps 4] [--trials 2]
        [--repeats 4] [--lr 1e-5] [--train-steps 200] [--parts update,train] [--out FILE.json]
    python bench/fidelity.py --tiny       # CPU, seconds: the CI smoke test (tests/test_fidelity.py)

A method that cannot run is reported with status 'unavailable' or 'error' and the reason. With CUDA
each (part, method) runs in a fresh interpreter (a crash of one baseline does not take the others
down); on the CPU (--tiny) everything runs in this process.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback

# Run as `python bench/fidelity.py`, sys.path[0] is bench/, whose kernels.py would shadow the PyPI package
# `kernels` (bitsandbytes and transformers >= 5.25 import it); the repository root, whose kernels/
# would shadow it too, goes behind site-packages (tests/conftest.py says more).
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (_HERE, _ROOT)] + [_ROOT]

METHODS = ["forge_fp32", "forge_bf16sr", "forge_8bit", "torch_amp", "torch_bf16", "bnb_adamw8bit",
           "ao_adamw8bit"]
STOCHASTIC = {"forge_bf16sr", "forge_8bit", "ao_adamw8bit"}
_NEEDS = {"bnb_adamw8bit": "bitsandbytes", "ao_adamw8bit": "torchao"}
BETAS = (0.9, 0.999)
EPS = 1e-8
U32 = 2.0**-24
U_BF16 = 2.0**-8
W_STD = 0.02

TINY_TRAIN = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                  max_position_embeddings=512)
GPU_TRAIN = dict(vocab_size=256, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False,
                 max_position_embeddings=1024)


def unavailable_reason(method: str, cuda: bool) -> str | None:
    if method not in METHODS:
        return f"unknown method (known: {', '.join(METHODS)})"
    mod = _NEEDS.get(method)
    hidden = os.environ.get("BENCH_HIDE_MODULES", "").split(",")
    if mod and (mod in hidden or importlib.util.find_spec(mod) is None):
        return f"not installed: python module {mod!r} not importable (see bench/README.md for the wheel)"
    return None


# --------------------------------------------------------------------------------------------
# Part 1: per-step update error of one linear layer
# --------------------------------------------------------------------------------------------


def _data(shape, trial, step, device):
    """(X [K, N], dY [K, M]) bf16 of one trial and step; the same for every method."""
    import torch

    M, N, K = shape
    # drawn on the device (CUDA: fast; the values differ from the CPU's, but not between methods)
    g = torch.Generator(device=device).manual_seed(1_000_003 * trial + 7919 * step + 17)
    x = torch.randn(K, N, generator=g, device=device).to(torch.bfloat16)
    dy = (torch.randn(K, M, generator=g, device=device) * 1e-3).to(torch.bfloat16)
    return x, dy


def _w0(shape, trial, device):
    import torch

    M, N, _ = shape
    g = torch.Generator(device=device).manual_seed(424_242 + trial)
    return (torch.randn(M, N, generator=g, device=device) * W_STD).to(torch.bfloat16)


def _reference(shape, trial, steps, lr, device):
    """The fp64 trajectory: lists W_t (t = 0..T) and dW_t, plus the bound quantities of step 1."""
    import torch

    w = _w0(shape, trial, device).double()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    ws, extra = [w.clone()], {}
    b1, b2 = BETAS
    for t in range(1, steps + 1):
        x, dy = _data(shape, trial, t, device)
        g = dy.double().t() @ x.double()
        if t == 1:
            absdot = dy.double().abs().t() @ x.double().abs()
            K = shape[2]
            gamma = (K - 1) * U32 / (1 - (K - 1) * U32)
            extra["dot_term"] = float(gamma * absdot.norm() / g.norm())
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step_size = lr / (1 - b1**t)
        denom = v.sqrt() / math.sqrt(1 - b2**t) + EPS
        w = w - step_size * m / denom
        ws.append(w.clone())
    return ws, extra


def _ulp_below_bf16(w):
    """Spacing of bf16 numbers just below |w| (toward zero), as float64."""
    import torch

    a = w.double().abs()
    e = torch.floor(torch.log2(a.clamp_min(2.0**-126)))
    ulp = torch.exp2(e - 7)
    pow2 = a == torch.exp2(e)
    return torch.where(pow2, ulp / 2, ulp)


class _Runner:
    """One method on one layer: .step(x, dy, t) updates self.w in place."""

    def __init__(self, method, w0, lr, device, seed):
        import torch

        self.method, self.lr, self.device, self.seed = method, lr, device, seed
        cuda = device.type == "cuda"
        hyper = {"lr": lr, "betas": BETAS, "eps": EPS, "weight_decay": 0.0}
        if method.startswith("forge_"):
            from forge_num import rules

            if cuda:
                from forge_num import kernels as backend
            else:
                from forge_num import torch_backend as backend
            self.backend, self.rule, self.hyper = backend, rules.get_rule("adamw"), hyper
            M, N = w0.shape
            if method == "forge_fp32":
                self.w = w0.float().clone()
                self.states = [torch.zeros(M, N, device=device), torch.zeros(M, N, device=device)]
            elif method == "forge_bf16sr":
                self.w = w0.clone()
                self.states = [torch.zeros(M, N, dtype=torch.bfloat16, device=device) for _ in range(2)]
            else:
                from forge_num.kernels import Q8State

                self.w = w0.clone()
                self.states = [Q8State.zeros(M, N, device=device) for _ in range(2)]
            return
        if method == "torch_amp":
            self.w = torch.nn.Parameter(w0.float().clone())
            self.opt = torch.optim.AdamW([self.w], fused=cuda or None, **hyper)
        elif method == "torch_bf16":
            self.w = torch.nn.Parameter(w0.clone())
            self.opt = torch.optim.AdamW([self.w], fused=cuda or None, **hyper)
        elif method == "bnb_adamw8bit":
            import bitsandbytes as bnb

            self.w = torch.nn.Parameter(w0.clone())
            # min_8bit_size=0: quantize the state of this layer whatever its size (the default,
            # 4096, keeps small tensors in fp32, which would not be the 8-bit optimizer).
            self.opt = bnb.optim.AdamW8bit([self.w], min_8bit_size=0, **hyper)
        elif method == "ao_adamw8bit":
            from torchao.optim import AdamW8bit

            self.w = torch.nn.Parameter(w0.clone())
            self.opt = AdamW8bit([self.w], bf16_stochastic_round=True, **hyper)
        else:
            raise ValueError(method)

    def step(self, x, dy, t):
        import torch

        if self.method.startswith("forge_"):
            from forge_num.emulator.philox import derive_seed

            h = self.rule.scalars(self.hyper, t)
            key = None if self.method == "forge_fp32" else derive_seed(self.seed, t, 0)
            self.backend.fused_linear_update(self.w, x, dy, self.states, self.rule, h, seed=key)
            return
        g = dy.t() @ x  # bf16 inputs, bf16 output: cuBLAS (CPU: ATen) accumulates in fp32, rounds to bf16
        self.w.grad = g.to(self.w.dtype)
        if self.method == "ao_adamw8bit":
            torch.manual_seed(self.seed * 1009 + t)  # torchao's stochastic rounding draws torch's RNG
        self.opt.step()
        self.w.grad = None


def _rel(a, b, denom):
    d = float(denom)
    return float((a - b).norm()) / d if d > 0 else float("nan")


def run_update_method(spec: dict) -> dict:
    """Part 1 for one method: every shape, trial, repeat. Never raises."""
    import torch

    cuda = torch.cuda.is_available() and not spec.get("cpu", False)
    device = torch.device("cuda" if cuda else "cpu")
    method = spec["method"]
    row = {"method": method, "status": "error", "reason": None, "shapes": []}
    t0 = time.perf_counter()
    try:
        for shape in spec["shapes"]:
            shape = tuple(shape)
            T, R = spec["steps"], (spec["repeats"] if method in STOCHASTIC else 1)
            acc = {k: [] for k in ("update_err_1", "update_err_mean_1", "w_err_1", "lost_1",
                                   "update_err_T", "update_err_mean_T", "w_err_T", "lost_T")}
            per_step = {"update_err": [0.0] * T, "w_err": [0.0] * T, "lost": [0.0] * T}
            bounds = {"fp32_bound": [], "rne_lost_bound": []}
            for trial in range(spec["trials"]):
                ws, extra = _reference(shape, trial, T, spec["lr"], device)
                w0 = _w0(shape, trial, device)
                upd = {t: [] for t in (1, T)}  # per repeat, fp64 updates
                for r in range(R):
                    run = _Runner(method, w0, spec["lr"], device, seed=1 + r + 1000 * trial)
                    prev = run.w.detach().double().clone()
                    for t in range(1, T + 1):
                        x, dy = _data(shape, trial, t, device)
                        run.step(x, dy, t)
                        cur = run.w.detach().double().clone()
                        d, d_ref = cur - prev, ws[t] - ws[t - 1]
                        ue = _rel(d, d_ref, d_ref.norm())
                        we = _rel(cur, ws[t], (ws[t] - ws[0]).norm())
                        lost = float(((d == 0) & (d_ref != 0)).double().sum() / (d_ref != 0).sum().clamp_min(1))
                        per_step["update_err"][t - 1] += ue / (R * spec["trials"])
                        per_step["w_err"][t - 1] += we / (R * spec["trials"])
                        per_step["lost"][t - 1] += lost / (R * spec["trials"])
                        if t in (1, T):
                            upd[t].append(d)
                            for k, val in (("update_err", ue), ("w_err", we), ("lost", lost)):
                                acc[f"{k}_{'1' if t == 1 else 'T'}"].append(val)
                        prev = cur
                for t, tag in ((1, "1"), (T, "T")):
                    mean = torch.stack(upd[t]).mean(0) if len(upd[t]) > 1 else upd[t][0]
                    d_ref = ws[t] - ws[t - 1]
                    acc[f"update_err_mean_{tag}"].append(_rel(mean, d_ref, d_ref.norm()))
                d1 = ws[1] - ws[0]
                bounds["fp32_bound"].append(U32 * float(ws[1].norm()) / float(d1.norm()) + 12 * U32
                                            + extra["dot_term"])
                lim = _ulp_below_bf16(w0) / 2
                bounds["rne_lost_bound"].append(float((spec["lr"] * (1 + 2.0**-6) < lim).double().mean()))
                del ws
            res = {"shape": list(shape), "repeats": R, "trials": spec["trials"], "steps": T}
            for k, vals in acc.items():
                res[k] = sum(vals) / len(vals)
            res.update({k: max(v) for k, v in bounds.items()})
            res["per_step"] = per_step
            row["shapes"].append(res)
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported, never dropped
        row["status"] = "error"
        row["reason"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
        row["traceback"] = traceback.format_exc()[-2000:]
    row["wall_s"] = time.perf_counter() - t0
    return row


# --------------------------------------------------------------------------------------------
# Part 2: a short training run
# --------------------------------------------------------------------------------------------


def _init_state(cfg: dict, device):
    """The common initial weights: a random-init Llama whose parameters are rounded to bf16."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**cfg, attn_implementation="sdpa", use_cache=False)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    return config, {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_train_method(spec: dict) -> dict:
    """Part 2 for one method. Returns losses and the final parameters' metrics (against the
    reference's final parameters, passed as a file, or computed by the caller). Never raises."""
    import torch
    from transformers import LlamaForCausalLM

    cuda = torch.cuda.is_available() and not spec.get("cpu", False)
    device = torch.device("cuda" if cuda else "cpu")
    method = spec["method"]
    row = {"method": method, "status": "error", "reason": None, "losses": []}
    t0 = time.perf_counter()
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    try:
        config, init = _init_state(spec["config"], device)
        bf16_params = method not in ("torch_amp", "forge_fp32")
        with torch.device(device):
            model = LlamaForCausalLM(config)
        model.load_state_dict(init)
        if bf16_params:
            model.to(torch.bfloat16)
        model.train()
        hyper = {"lr": spec["lr"], "betas": BETAS, "eps": EPS, "weight_decay": 0.0}
        params = list(model.parameters())
        after = None
        if method.startswith("forge_"):
            import forge_num

            precision = {"forge_fp32": "fp32", "forge_bf16sr": "bf16-sr", "forge_8bit": "8bit"}[method]
            opt = forge_num.AdamW(params, max_grad_norm=None, precision=precision, seed=spec.get("seed", 1),
                                  backend="auto" if cuda else "torch", **hyper)
            forge_num.prepare(model, opt)
            after = opt.step
        else:
            if method in ("torch_amp", "torch_bf16"):
                opt = torch.optim.AdamW(params, fused=cuda or None, **hyper)
            elif method == "bnb_adamw8bit":
                import bitsandbytes as bnb

                opt = bnb.optim.AdamW8bit(params, min_8bit_size=0, **hyper)
            elif method == "ao_adamw8bit":
                from torchao.optim import AdamW8bit

                opt = AdamW8bit(params, bf16_stochastic_round=True, **hyper)
            else:
                raise ValueError(method)

            def after():
                opt.step()
                opt.zero_grad(set_to_none=True)

        amp = not bf16_params
        g = torch.Generator(device="cpu").manual_seed(12345)
        ids = torch.randint(0, config.vocab_size, (spec["batch"], spec["seq"]), generator=g).to(device)
        for _ in range(spec["steps"]):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            after()
            row["losses"].append(float(loss.detach()))
        with torch.no_grad():
            final = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
            # the initial and final weights in one common fp32 forward (no autocast): the losses
            # above are each method's own forward (autocast or bf16), whose precision alone shifts
            # the loss by about as much as a few steps at lr 1e-5 move it
            with torch.device(device):
                ev = LlamaForCausalLM(config)
            ev.eval()
            ev.load_state_dict(init)
            row["eval_loss_init"] = float(ev(input_ids=ids, labels=ids).loss)
            ev.load_state_dict({k: v.to(device) for k, v in final.items()})
            row["eval_loss_final"] = float(ev(input_ids=ids, labels=ids).loss)
            del ev
        if not all(math.isfinite(x) for x in row["losses"]):
            raise FloatingPointError(f"non-finite loss: {row['losses'][-5:]}")
        init_cpu = {k: v.float().cpu() for k, v in init.items()}
        keys = sorted(k for k in init_cpu if k in final)
        disp = math.sqrt(sum(float((final[k] - init_cpu[k]).double().pow(2).sum()) for k in keys))
        row["displacement"] = disp
        if spec.get("ref_params"):
            ref = torch.load(spec["ref_params"])
            ref_disp = math.sqrt(sum(float((ref[k] - init_cpu[k]).double().pow(2).sum()) for k in keys))
            dist = math.sqrt(sum(float((final[k] - ref[k]).double().pow(2).sum()) for k in keys))
            row["displacement_vs_ref"] = disp / ref_disp if ref_disp > 0 else float("nan")
            row["distance_to_ref"] = dist / ref_disp if ref_disp > 0 else float("nan")
        if spec.get("save_params"):
            torch.save(final, spec["save_params"])
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001
        row["status"] = "oom" if "out of memory" in str(e).lower() else "error"
        row["reason"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
        row["traceback"] = traceback.format_exc()[-2000:]
    row["wall_s"] = time.perf_counter() - t0
    return row


# --------------------------------------------------------------------------------------------
# Isolation and driver
# --------------------------------------------------------------------------------------------

_MARK = "FIDELITY_RESULT "


def run_isolated(part: str, spec: dict, isolate: bool, timeout: float) -> dict:
    fn = run_update_method if part == "update" else run_train_method
    if not isolate:
        return fn(spec)
    t0 = time.perf_counter()
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps({"part": part, "spec": spec})]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"method": spec["method"], "status": "timeout",
                "reason": f"no result within {timeout:.0f} s (killed)", "wall_s": time.perf_counter() - t0}
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
    return {"method": spec["method"], "status": "error",
            "reason": f"worker exit code {proc.returncode}: " + " | ".join(tail)[-400:],
            "wall_s": time.perf_counter() - t0}


def environment(cuda: bool) -> dict:
    import torch

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": "cuda" if cuda else "cpu", "torch": torch.__version__,
            "python": platform.python_version(),
            "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])}
    if cuda:
        code = "import torch; print(torch.cuda.get_device_name(0))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        meta["gpu"] = (out.stdout.strip().splitlines() or ["?"])[-1]
    from importlib.metadata import version

    for mod in ("triton", "transformers", "bitsandbytes", "torchao"):
        try:
            meta[mod] = version(mod) if importlib.util.find_spec(mod) is not None else None
        except Exception as e:  # noqa: BLE001
            meta[mod] = f"? ({type(e).__name__})"
    return meta


def _f(x, fmt="{:.3e}"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def markdown(result: dict) -> str:
    out = []
    up = result.get("update")
    if up:
        out.append(f"### Per-step update error (lr {result['meta']['lr']:g}, vs fp64 AdamW; step 1 | step T)\n")
        out.append("| method | shape MxNxK | update_err 1 | update_err_mean 1 | lost 1 | update_err T "
                   "| update_err_mean T | w_err T | lost T |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in up["rows"]:
            if r["status"] != "ok":
                out.append(f"| {r['method']} | {r['status']}: {r.get('reason')} |||||||| ")
                continue
            for s in r["shapes"]:
                out.append(f"| {r['method']} | {'x'.join(map(str, s['shape']))} | {_f(s['update_err_1'])} | "
                           f"{_f(s['update_err_mean_1'])} | {_f(s['lost_1'], '{:.3f}')} | {_f(s['update_err_T'])} | "
                           f"{_f(s['update_err_mean_T'])} | {_f(s['w_err_T'])} | {_f(s['lost_T'], '{:.3f}')} |")
        ok = [r for r in up["rows"] if r["status"] == "ok"]
        if ok:
            for s in ok[0]["shapes"]:
                out.append(f"\n{'x'.join(map(str, s['shape']))}: fp32_bound (step 1) {_f(s['fp32_bound'])}, "
                           f"u_bf16 {_f(U_BF16)}, rne_lost_bound {_f(s['rne_lost_bound'], '{:.3f}')}")
    tr = result.get("train")
    if tr:
        out.append(f"\n### Training ({tr['steps']} steps, lr {result['meta']['lr']:g}, one repeated batch)\n")
        out.append("| method | loss[0] | loss[-1] | gap to torch_amp | loss drop / ref's | fp32-eval loss "
                   "| fp32-eval drop / ref's | displacement / ref | distance to ref / ref disp. | wall s |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in tr["rows"]:
            if r["status"] != "ok":
                out.append(f"| {r['method']} | {r['status']}: {r.get('reason')} |||||||||")
                continue
            out.append(f"| {r['method']} | {_f(r['losses'][0], '{:.5f}')} | {_f(r['losses'][-1], '{:.5f}')} | "
                       f"{_f(r.get('final_gap'))} | {_f(r.get('loss_drop_vs_ref'), '{:.3f}')} | "
                       f"{_f(r.get('eval_loss_final'), '{:.6f}')} | {_f(r.get('eval_drop_vs_ref'), '{:.3f}')} | "
                       f"{_f(r.get('displacement_vs_ref'), '{:.4f}')} | "
                       f"{_f(r.get('distance_to_ref'), '{:.4f}')} | {_f(r.get('wall_s'), '{:.1f}')} |")
    return "\n".join(out)


def parse_shapes(s: str, k: int) -> list[list[int]]:
    out = []
    for part in s.split(","):
        dims = [int(d) for d in part.lower().split("x")]
        out.append(dims if len(dims) == 3 else dims + [k])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--parts", default="update,train")
    ap.add_argument("--shapes", default=None,
                    help="MxN or MxNxK (weight [M, N]); default 4096x4096,14336x4096 (--tiny: 64x256x64)")
    ap.add_argument("--tokens", type=int, default=4096, help="K when a shape gives MxN")
    ap.add_argument("--steps", type=int, default=None, help="part 1: AdamW steps per trajectory T (4; --tiny 3)")
    ap.add_argument("--trials", type=int, default=2, help="part 1: data seeds")
    ap.add_argument("--repeats", type=int, default=None,
                    help="part 1: rounding seeds of the stochastic methods (4; --tiny 16)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--train-steps", type=int, default=None, help="part 2: steps (200; --tiny 6)")
    ap.add_argument("--train-batch", default=None, help="part 2: batch x sequence (8x256; --tiny 2x32)")
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny shapes and model (seconds)")
    ap.add_argument("--run-timeout", type=float, default=400.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker is not None:
        w = json.loads(args.worker)
        fn = run_update_method if w["part"] == "update" else run_train_method
        print(_MARK + json.dumps(fn(w["spec"])), flush=True)
        return 0

    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    defaults = ({"shapes": "64x256x64", "repeats": 16, "steps": 3, "train_steps": 6, "train_batch": "2x32"}
                if args.tiny else
                {"shapes": "4096x4096,14336x4096", "repeats": 4, "steps": 4, "train_steps": 200,
                 "train_batch": "8x256"})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.tiny:
        torch.set_num_threads(1)
    shapes = parse_shapes(args.shapes, args.tokens)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    meta = environment(cuda)
    meta.update(lr=args.lr, betas=BETAS, eps=EPS, weight_decay=0.0, u32=U32, u_bf16=U_BF16, w_std=W_STD)
    result = {"meta": meta}
    print(f"# {meta.get('gpu') or 'CPU'}  torch {meta['torch']}  transformers {meta['transformers']}  "
          f"bitsandbytes {meta['bitsandbytes']}  torchao {meta['torchao']}", flush=True)

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    t_begin = time.perf_counter()
    if "update" in parts:
        result["update"] = {"shapes": shapes, "steps": args.steps, "trials": args.trials,
                            "repeats": args.repeats, "rows": []}
        for m in methods:
            reason = unavailable_reason(m, cuda)
            if reason:
                row = {"method": m, "status": "unavailable", "reason": reason}
            else:
                spec = {"method": m, "shapes": shapes, "steps": args.steps, "trials": args.trials,
                        "repeats": args.repeats, "lr": args.lr, "cpu": not cuda}
                row = run_isolated("update", spec, cuda, args.run_timeout)
            result["update"]["rows"].append(row)
            s = row.get("shapes") or [{}]
            print(f"update {m:<14} {row['status']:<11} " + (
                "  ".join(f"{'x'.join(map(str, x['shape']))}: err1 {_f(x['update_err_1'])} mean {_f(x['update_err_mean_1'])} "
                          f"lost1 {_f(x['lost_1'], '{:.3f}')} errT {_f(x['update_err_T'])}" for x in s if x)
                if row["status"] == "ok" else str(row.get("reason"))), flush=True)
            save()
    if "train" in parts:
        b, q = (int(v) for v in args.train_batch.lower().split("x"))
        cfg = TINY_TRAIN if args.tiny or not cuda else GPU_TRAIN
        result["train"] = {"config": cfg, "steps": args.train_steps, "batch": b, "seq": q, "rows": []}
        import tempfile

        tmp = tempfile.mkdtemp(prefix="fidelity_")
        ref_path = os.path.join(tmp, "ref.pt")
        order = ["torch_amp"] + [m for m in methods if m != "torch_amp"]  # the reference first
        ref_row = None
        for m in order:
            if m not in methods and m != "torch_amp":
                continue
            reason = unavailable_reason(m, cuda)
            if reason:
                row = {"method": m, "status": "unavailable", "reason": reason}
            else:
                spec = {"method": m, "config": cfg, "steps": args.train_steps, "batch": b, "seq": q,
                        "lr": args.lr, "cpu": not cuda, "threads": 1 if not cuda else None,
                        "save_params": ref_path if m == "torch_amp" else None,
                        "ref_params": ref_path if (m != "torch_amp" and os.path.exists(ref_path)) else None}
                row = run_isolated("train", spec, cuda, args.run_timeout)
            if m == "torch_amp":
                ref_row = row
                if row["status"] == "ok":
                    row["displacement_vs_ref"], row["distance_to_ref"] = 1.0, 0.0
            if row["status"] == "ok" and ref_row is not None and ref_row["status"] == "ok":
                row["final_gap"] = row["losses"][-1] - ref_row["losses"][-1]
                ref_drop = ref_row["losses"][0] - ref_row["losses"][-1]
                drop = row["losses"][0] - row["losses"][-1]
                row["loss_drop_vs_ref"] = drop / ref_drop if ref_drop != 0 else float("nan")
                ref_ev = ref_row["eval_loss_init"] - ref_row["eval_loss_final"]
                ev = row["eval_loss_init"] - row["eval_loss_final"]
                row["eval_drop_vs_ref"] = ev / ref_ev if ref_ev != 0 else float("nan")
                row["loss_gap"] = [a - r for a, r in zip(row["losses"], ref_row["losses"])]
            result["train"]["rows"].append(row)
            print(f"train  {m:<14} {row['status']:<11} " + (
                f"loss {row['losses'][0]:.5f} -> {row['losses'][-1]:.5f}  gap {_f(row.get('final_gap'))}  "
                f"disp/ref {_f(row.get('displacement_vs_ref'), '{:.4f}')}  dist/ref {_f(row.get('distance_to_ref'), '{:.4f}')}"
                if row["status"] == "ok" else str(row.get("reason"))), flush=True)
            save()
        if os.path.exists(ref_path):
            os.remove(ref_path)
        os.rmdir(tmp)
    result["meta"]["wall_s"] = time.perf_counter() - t_begin
    save()
    print()
    print(markdown(result))
    print(f"\n{time.perf_counter() - t_begin:.1f} s" + (f"; wrote {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
