"""Session 27's second diagnostic of captured against eager training (call 1's diag_graphs.py: with SDPA the
narrow fp32 model's eager runs agree with each other and with slot-reading eager steps, but the captured
run's loss first differs at step 3, i.e. the first replay's update already differs; HF's eager attention
cannot be captured, its mask is a host-to-device copy). Per step: the loss, the gradient norm and clip
coefficient of the telemetry, the parameters whose bits differ after the step (with the largest
difference), and the scalars each update was given (h, grad_scale, key: from the launch arguments in the
eager run, from the slot rows in the captured one). A norm that differs at a step whose weights before it
agree means the captured backward computed another gradient; equal norms and different weights mean the
update differs. Attention: SDPA as chosen by torch, or its math backend (deterministic, capturable)."""
import contextlib
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT] + [_ROOT]

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import forge_num as fn  # noqa: E402
from forge_num import optim as fo  # noqa: E402
from tests.test_gpu_graphs import _batches, _model  # noqa: E402

STEPS = 5
LOG: list = []  # (step call index, param name, h, scale, seed) of every update's scalars


def loss_fn(model, amp, backend):
    def loss_of(ids):
        ctx = sdpa_kernel(SDPBackend.MATH) if backend == "math" else contextlib.nullcontext()
        with ctx, torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            return model(input_ids=ids, labels=ids).loss
    return loss_of


def snapshot(model, opt):
    torch.cuda.synchronize()
    out = {}
    for n, p in model.named_parameters():
        out[n] = p.detach().float().cpu().clone()
        for k, v in opt.state[p].items():
            out[f"{n}.{k}"] = (v["codes"].cpu().clone() if isinstance(v, dict) else v.detach().cpu().clone())
    return out


def run(width, precision, amp, backend, mode, tokens):
    model, opt = _model(width, precision)
    model.set_attn_implementation("sdpa")
    name = {p: n for n, p in model.named_parameters()}
    lf = loss_fn(model, amp, backend)
    log, call = [], [0]
    real_slot_kw, real_write = fo.ForgeOptimizer._slot_kw, fo._StepSlots.write

    def slot_kw(self, p, h, seed):
        if self._slots is None:
            log.append((call[0], name[p], tuple(h) if isinstance(h, (tuple, list)) else h, self._scale(), seed))
        return real_slot_kw(self, p, h, seed)

    def write(self, p, h, scale, seed):
        log.append((call[0], name[p], tuple(h) if isinstance(h, (tuple, list)) else h, scale, seed))
        return real_write(self, p, h, scale, seed)

    parts = {}  # step -> [(param name, its gradient's sum of squares)], where the step's partials are known
    real_finish = fo.ForgeOptimizer._finish_step

    def finish(self, summed=None):
        if self._parts:  # eager steps and the capture's own step (its partials: the graph's, replayed once)
            parts[call[0]] = [(name[q], float(n.double().sum())) for q, (n, _) in zip(self._stat_params, self._parts)]
        return real_finish(self, summed)

    fo.ForgeOptimizer._slot_kw, fo._StepSlots.write, fo.ForgeOptimizer._finish_step = slot_kw, write, finish
    losses, snaps = [], []
    try:
        step = None if mode == "eager" else fn.capture_step(opt, lf, warmup=2)
        for k, ids in enumerate(_batches(tokens)):
            call[0] = k
            if step is None:
                loss = lf(ids)
                opt.backward(loss)
                opt.step()
                losses.append(loss.detach().clone())
            else:
                losses.append(step(ids).clone())
            snaps.append(snapshot(model, opt))
    finally:
        fo.ForgeOptimizer._slot_kw, fo._StepSlots.write, fo.ForgeOptimizer._finish_step = (
            real_slot_kw, real_write, real_finish)
    return losses, snaps, opt.stats_history, log, parts


def compare(tag, ref, got):
    for k in range(STEPS):
        lr, lg = ref[0][k], got[0][k]
        sr, sg = ref[2][k], got[2][k]
        bad = [(n, float((ref[1][k][n].float() - got[1][k][n].float()).abs().max()))
               for n in ref[1][k] if not torch.equal(ref[1][k][n], got[1][k][n])]
        scal_r = sorted(e[1:] for e in ref[3] if e[0] == k)
        scal_g = sorted(e[1:] for e in got[3] if e[0] == k)
        scal = "same" if scal_r == scal_g else (
            f"DIFFER ({len(scal_r)} vs {len(scal_g)}; first {[a for a in scal_r if a not in scal_g][:2]} vs "
            f"{[a for a in scal_g if a not in scal_r][:2]})")
        pr, pg = ref[4].get(k), got[4].get(k)
        if pr is not None and pg is not None:
            diff = [(a[0], a[1], b[1]) for a, b in zip(pr, pg) if a != b]
            parts = f"; per-parameter sums of squares: {len(diff)} of {len(pr)} differ {diff[:3]}"
        else:
            parts = ""
        print(f"{tag} step {k}: loss {'same' if torch.equal(lr, lg) else f'{lr.item():.9g} vs {lg.item():.9g}'}; "
              f"norm {sr['grad_norm']!r} vs {sg['grad_norm']!r}; clip {sr['clip_coef']!r} vs {sg['clip_coef']!r}; "
              f"scalars {scal}; differing after it {len(bad)}: {bad[:6]}{parts}", flush=True)


CASES = [("narrow", "fp32", True, "default", 64), ("narrow", "fp32", True, "math", 64),
         ("narrow", "fp32", False, "math", 64), ("narrow", "8bit", False, "math", 64),
         ("wide", "8bit", False, "math", 1024), ("wide", "fp32", True, "math", 1024)]
for width, precision, amp, backend, tokens in CASES:
    tag = f"{width} {precision} amp={int(amp)} {backend}"
    try:
        ref = run(width, precision, amp, backend, "eager", tokens)
        again = run(width, precision, amp, backend, "eager", tokens)
        compare(tag + " eager-again", ref, again)
        cap = run(width, precision, amp, backend, "captured", tokens)
        compare(tag + " captured", ref, cap)
    except Exception as e:  # noqa: BLE001 - a diagnostic: report and go on
        print(f"{tag}: {type(e).__name__}: {str(e)[:600]}", flush=True)
