"""``forge-num verify``: run the fused kernel on a built-in case and check it bit for bit.

For every rule, on a W [M, N] with X [K, N], dY [K, M] (shapes chosen to cut tiles and K blocks
unevenly), it runs the fused kernel, the unfused comparator (same mainloop storing dW, then the
element-wise kernel) and the NumPy emulator, and prints whether all three wrote the same bits.
On a machine without a CUDA GPU the kernels run in Triton's interpreter.

``--operands bf16`` checks the fp32 regime as mixed-precision training runs it: bf16 activations and
output gradients (the tensor cores' mainloop), fp32 weight and state. The fused update is launched as
the launcher picks its kernel for that shape on this GPU (kernels.launcher_tile names it: on Hopper a
Gluon kernel where routed, from 256 tokens and enough tiles, hence the larger default shape), and the
emulator mirrors the Hopper tensor cores (emulator/tensor_core.py) on the same tile. ``--precision
bf16-sr`` and ``8bit`` check the stochastic regimes (bf16 operands), the emulator drawing the same
Philox stream under the same key (emulator/philox.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _prepare_backend() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before forge_num.kernels is imported
    from forge_num import interpreter

    interpreter.install()
    return "cpu"


# 16 x 9 = 144 tiles of 64x128 (at least one an SM of an H100 or H200) and 256 tokens: the Gluon fp32 routes'
# least work (kernels/gluon_f32.py, config_for); the emulator's tensor-core model takes ~8 s a rule here on a CPU
BF16_GPU_SHAPE = "1024x1152x256"


def _bits(t):
    """A CPU tensor's bit patterns as the emulator takes them: float32 as is, bf16 as uint16 encodings."""
    import numpy as np
    import torch

    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


def _same(a, b) -> bool:
    """Bit for bit (compared as bytes): two float32 arrays, two uint16 bf16 encodings, or two 8bit states'
    (codes, scales) pairs."""
    import numpy as np

    if isinstance(a, tuple):
        return all(_same(u, v) for u, v in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _as_arrays(weight, states) -> tuple:
    """A weight and its states on the host as the emulator writes them (8bit states as (codes, scales))."""
    from forge_num import kernels

    return _bits(weight.cpu()), [(st.codes.cpu().numpy(), st.scales.cpu().numpy()) if isinstance(st, kernels.Q8State)
                                 else _bits(st.cpu()) for st in states]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="forge-num verify", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default=None, help="MxNxK (default 70x33x45; with bf16 operands on a GPU "
                    f"{BF16_GPU_SHAPE}, 144 tiles of 64x128, where Hopper's Gluon routes apply)")
    ap.add_argument("--operands", choices=["fp32", "bf16"], default=None,
                    help="X and dY in fp32 (the ieee FMA mainloop; the fp32 regime's default) or bf16 (the tensor "
                    "cores; the only choice of the bf16-sr and 8bit regimes)")
    ap.add_argument("--precision", choices=["fp32", "bf16-sr", "8bit"], default="fp32",
                    help="the storage regime: fp32 weight and state; bf16 weight and state rounded stochastically; "
                    "bf16 weight and 8-bit block-quantized state")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    stochastic = args.precision != "fp32"
    operands = args.operands or ("bf16" if stochastic else "fp32")
    if stochastic and operands != "bf16":
        ap.error(f"the {args.precision} regime takes bf16 operands (--operands bf16), got --operands {operands}")
    device = _prepare_backend()
    bf16 = operands == "bf16"
    shape = args.shape or (BF16_GPU_SHAPE if bf16 and device == "cuda" else "70x33x45")
    try:
        M, N, K = (int(v) for v in shape.split("x"))
    except ValueError:
        ap.error(f"--shape must be MxNxK (three integers), got {shape!r}")

    import torch

    from forge_num import kernels, rules
    from forge_num.emulator import emulate
    from forge_num.emulator.philox import derive_seed

    hypers = {
        "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
        "adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
        "sgd": {"lr": 0.01, "momentum": 0.9, "nesterov": True},
        "lion": {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.1},
    }
    mode = "GPU " + torch.cuda.get_device_name(0) if device == "cuda" else "CPU, Triton interpreter"
    mainloop = "bf16 operands (tensor cores)" if bf16 else "fp32 operands (ieee mainloop)"
    storage = {"fp32": "fp32 weight and state", "bf16-sr": "bf16 weight and state, stochastic rounding",
               "8bit": "bf16 weight, 8-bit state, stochastic rounding"}[args.precision]
    print(f"forge-num verify: W {M}x{N}, K = {K} tokens, {mainloop}, {storage}, {mode}")
    print(f"{'rule':<6} {'fused == unfused':>17} {'fused == emulator':>18} {'max |dW step|':>14} {'time':>7}")
    ok_all = True
    shown = None
    g = torch.Generator().manual_seed(args.seed)
    dev = torch.device(device)
    for i, (name, hyper) in enumerate(hypers.items()):
        rule = rules.get_rule(name)
        t0 = time.perf_counter()
        w = torch.randn(M, N, generator=g)
        x = torch.randn(K, N, generator=g)
        dy = torch.randn(K, M, generator=g) * 0.1
        if bf16:
            x, dy = x.bfloat16(), dy.bfloat16()
        n_state = rule.state_slots(hyper)
        if args.precision == "fp32":
            states = [torch.zeros(M, N) for _ in range(n_state)]
        elif args.precision == "bf16-sr":
            w, states = w.bfloat16(), [torch.zeros(M, N, dtype=torch.bfloat16) for _ in range(n_state)]
        else:
            w, states = w.bfloat16(), [kernels.Q8State.zeros(M, N) for _ in range(n_state)]
        key = derive_seed(args.seed, 1, i) if stochastic else None  # the Philox key of this parameter and step
        h = rule.scalars(hyper, 1)
        # copies on the device (each launch updates its own in place; .to() of a CPU tensor to the CPU is no copy)
        to_dev = lambda sts: [kernels.Q8State(*(t.to(dev, copy=True) for t in st))  # noqa: E731
                              if isinstance(st, kernels.Q8State) else st.to(dev, copy=True) for st in sts]
        kernel, tile = kernels.launcher_tile(w.to(dev), x.to(dev), dy.to(dev), to_dev(states))  # (names only)
        if kernel != shown:
            print(f"  the launcher's kernel: {kernel}, tile {tile.label}")
            shown = kernel
        w0, s0 = _as_arrays(w, states)
        emu = emulate(w0, _bits(x), _bits(dy), s0, rule=rule, h=h, tile=(tile.BM, tile.BN, tile.BK),
                      precision=args.precision, seed=key)
        wf, sf = w.clone().to(dev), to_dev(states)
        wu, su = w.clone().to(dev), to_dev(states)
        kernels.fused_linear_update(wf, x.to(dev), dy.to(dev), sf, rule, h, seed=key)
        kernels.unfused_linear_update(wu, x.to(dev), dy.to(dev), su, rule, h, seed=key)
        (wf_a, sf_a), (wu_a, su_a) = _as_arrays(wf, sf), _as_arrays(wu, su)
        fu = _same(wf_a, wu_a) and all(_same(a, b) for a, b in zip(sf_a, su_a))
        fe = _same(wf_a, emu.weight) and all(_same(a, b) for a, b in zip(sf_a, emu.states))
        ok_all &= fu and fe
        step = float((wf.cpu().float() - w.float()).abs().max())
        print(f"{name:<6} {'bitwise' if fu else 'DIFFERENT':>17} {'bitwise' if fe else 'DIFFERENT':>18} "
              f"{step:14.3e} {time.perf_counter() - t0:6.2f}s")
    print("verify: OK, every update bit-identical" if ok_all else "verify: FAILED")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
