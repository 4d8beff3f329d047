"""Written in session 26 for the next call (not run: the device time ran out): where captured training
first differs from eager training (call 3's failures). For fp32 narrow, fp32 wide and 8bit wide, with
SDPA attention and with Hugging Face's eager attention: eager against eager (the reference's own
determinism: the hypothesis is that SDPA's backward is not deterministic there), eager slot-reading
steps (capture_step with warmup > steps: never captured) against eager, and captured against eager;
per run the first step whose loss differs and the parameters whose bits differ."""
import itertools
import os
import sys

# run as a script, sys.path[0] is this folder; the repository root (for tests/) goes behind
# site-packages, as bench/host_time.py does, so that its kernels/ shadows no installed package
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT] + [_ROOT]

import torch  # noqa: E402

import forge_num as fn  # noqa: E402
from tests.test_gpu_graphs import STEPS, _batches, _loss_fn, _model  # noqa: E402


def run(width, precision, loss, mode, tokens, attention):
    model, opt = _model(width, precision)
    model.set_attn_implementation(attention)
    lf = _loss_fn(model, loss)
    losses = []
    if mode == "eager":
        for ids in _batches(tokens):
            l_ = lf(ids)
            opt.backward(l_)
            opt.step()
            losses.append(l_.detach().clone())
    else:
        step = fn.capture_step(opt, lf, warmup=2 if mode == "captured" else STEPS + 1)
        losses = [step(ids).clone() for ids in _batches(tokens)]
    torch.cuda.synchronize()
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    states = {n: {k: (v["codes"].clone() if isinstance(v, dict) else v.clone()) for k, v in opt.state[p].items()}
              for n, p in model.named_parameters()}
    return losses, dict(zip(names, params)), states, opt.stats_history


for (width, precision, loss, tokens), attention in itertools.product(
        (("narrow", "fp32", "hf", 64), ("wide", "fp32", "hf", 1024), ("wide", "8bit", "hf", 1024)), ("sdpa", "eager")):
    ref = run(width, precision, loss, "eager", tokens, attention)
    for mode in ("eager", "slots", "captured"):
        got = run(width, precision, loss, mode, tokens, attention)
        first = next((k for k, (a, b) in enumerate(zip(ref[0], got[0])) if not torch.equal(a, b)), None)
        bad = [n for n in ref[1] if not torch.equal(ref[1][n].view(-1).view(torch.uint8), got[1][n].view(-1).view(torch.uint8))]
        bad_state = [f"{n}.{k}" for n in ref[2] for k in ref[2][n]
                     if not torch.equal(ref[2][n][k].reshape(-1).view(torch.uint8), got[2][n][k].reshape(-1).view(torch.uint8))]
        coefs = [(a["clip_coef"], b["clip_coef"]) for a, b in zip(ref[3], got[3]) if a["clip_coef"] != b["clip_coef"]]
        norms = [(a["grad_norm"], b["grad_norm"]) for a, b in zip(ref[3], got[3]) if a["grad_norm"] != b["grad_norm"]]
        print(f"{width} {precision} {loss} {attention} {mode:>8}: first loss differing at step {first}; params differing "
              f"{len(bad)}/{len(ref[1])} {bad[:4]}; states {len(bad_state)} {bad_state[:3]}; "
              f"clip {coefs[:2]} norm {norms[:2]}", flush=True)
    sys.stdout.flush()
