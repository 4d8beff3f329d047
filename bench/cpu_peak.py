"""What is alive at a forge_num training step's memory peak, found on the CPU.

The GPU's allocator history (`bench/train_step.py --memory-snapshot`) names the peak's allocations
but costs device time. The tensors a step allocates beside the weights and the optimizer state are
mostly the same on the CPU (the torch backend runs the same Python: the chunked loss, the tied
rows, the hooks' row chunks; only the kernels' own temporaries differ), so a width-true model with
few layers shows them here. Session 14 found the 8bit step's 0.99 GiB transient at Llama-1B this way
to the hundredth of the H200's (the tied embedding's gradient and two row chunks where one was meant).

    python bench/cpu_peak.py [--model llama-1b] [--layers 2] [--tokens 1x1024] [--precision 8bit]

The step runs twice (the optimizer state is made in the first); in the second, every new storage an
operator returns is counted until it is freed (a TorchDispatchMode with weakref finalizers; the
weights' and states' storages, and views of them, are not new). Prints the largest total of such
bytes, the phase it falls in (forward, backward, step) and the storages alive then, largest first,
each with the operator, shape and dtype that made it. The loss is forge_num.hf.causal_lm_loss (the
chunked loss), under bf16 autocast, with checkpointing.
"""

from __future__ import annotations

import argparse
import os
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (_HERE, _ROOT)] + [_ROOT]  # train_step.py says why

from bench.train_step import GIB, MODELS  # noqa: E402


class LiveStorages(TorchDispatchMode):
    """Counts the bytes of the storages operators create while it is on, until each is freed."""

    def __init__(self, known_storages):
        super().__init__()
        self.live = {ptr: None for ptr in known_storages}  # data_ptr -> (bytes, label) or None (known)
        self.total = self.peak = 0
        self.at_peak: list = []
        self.peak_phase = None
        self.phase = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or ptr in self.live:
                continue
            self.live[ptr] = (nbytes, f"{self.phase}: {func.__name__} {tuple(t.shape)} {t.dtype}")
            self.total += nbytes
            weakref.finalize(storage, self._freed, ptr)
            if self.total > self.peak:
                self.peak, self.peak_phase = self.total, self.phase
                self.at_peak = sorted((v for v in self.live.values() if v), key=lambda v: -v[0])
        return out

    def _freed(self, ptr):
        entry = self.live.pop(ptr, None)
        if entry:
            self.total -= entry[0]


def run(model: str, layers: int, tokens: str, precision: str, top: int = 8, capturable: bool = False) -> dict:
    import transformers

    import forge_num as fn
    from forge_num.hf import causal_lm_loss

    cfg = dict(MODELS[model], num_hidden_layers=layers)
    batch, seq = (int(v) for v in tokens.split("x"))
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, bos_token_id=None, eos_token_id=None,
                                                                pad_token_id=None))
    if precision != "fp32":
        m = m.to(torch.bfloat16)
    m.gradient_checkpointing_enable()
    opt = fn.AdamW(m.parameters(), precision=precision, lr=1e-5)
    fn.prepare(m, opt)
    opt._capturable = capturable  # a captured step's paths (forge_num.graphs), without a capture
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1))

    def step(probe=None):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = causal_lm_loss(m, ids)
        if probe:
            probe.phase = "backward"
        loss.backward()
        if probe:
            probe.phase = "step"
        opt.step()
        opt.zero_grad()

    step()  # the optimizer state is made here
    known = {p.untyped_storage().data_ptr() for p in m.parameters()}
    for state in opt.state.values():
        for value in state.values():
            for t in value.values() if isinstance(value, dict) else (value,):
                if isinstance(t, torch.Tensor):
                    known.add(t.untyped_storage().data_ptr())
    probe = LiveStorages(known)
    with probe:
        step(probe)
    return {"model": model, "layers": layers, "tokens": tokens, "precision": precision, "capturable": capturable,
            "peak_gib": probe.peak / GIB, "phase": probe.peak_phase,
            "alive": [{"gib": b / GIB, "made_by": label} for b, label in probe.at_peak[:top]],
            "other_gib": sum(b for b, _ in probe.at_peak[top:]) / GIB}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-1b", choices=sorted(MODELS))
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (the width and vocabulary stay the model's)")
    ap.add_argument("--tokens", default="1x1024", help="BATCHxSEQ")
    ap.add_argument("--precision", default="8bit", choices=["fp32", "bf16-sr", "8bit"])
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--capturable", action="store_true", help="the paths a step captured by forge_num.capture_step "
                    "takes (opt._capturable), run eagerly")
    args = ap.parse_args(argv)
    r = run(args.model, args.layers, args.tokens, args.precision, args.top, args.capturable)
    print(f"{r['model']} ({r['layers']} layers) {r['tokens']} {r['precision']}"
          f"{' (capturable paths)' if r['capturable'] else ''}: the step's peak {r['peak_gib']:.3f} GiB "
          f"above the weights and state, in the {r['phase']}; alive then:")
    for a in r["alive"]:
        print(f"  {a['gib']:8.3f} GiB  {a['made_by']}")
    print(f"  {r['other_gib']:8.3f} GiB  the rest")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
