"""``forge-num verify``: run the fused kernel on a built-in case and check it bit for bit.

For every rule, on a W [M, N] with X [K, N], dY [K, M] (shapes chosen to cut tiles and K blocks
unevenly), it runs the fused kernel, the unfused comparator (same mainloop storing dW, then the
element-wise kernel) and the NumPy emulator, and prints whether all three wrote the same bits.
On a machine without a CUDA GPU the kernels run in Triton's interpreter.

``--operands bf16`` checks the fp32 regime as mixed-precision training runs it: bf16 activations and
output gradients (the tensor cores' mainloop), fp32 weight and state. The fused update is launched as
the launcher picks its kernel for that shape on this GPU (kernels.launcher_tile names it: on Hopper a
Gluon kernel where routed, from 256 tokens and enough tiles, hence the larger default shape), and the
emulator mirrors the Hopper tensor cores (emulator/tensor_core.py) on the same tile.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="forge-num verify", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default=None, help="MxNxK (default 70x33x45; with --operands bf16 on a GPU "
                    f"{BF16_GPU_SHAPE}, 144 tiles of 64x128, where Hopper's Gluon routes apply)")
    ap.add_argument("--operands", choices=["fp32", "bf16"], default="fp32",
                    help="X and dY in fp32 (the ieee FMA mainloop) or bf16 (the tensor cores), weight and state fp32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    device = _prepare_backend()
    bf16 = args.operands == "bf16"
    shape = args.shape or (BF16_GPU_SHAPE if bf16 and device == "cuda" else "70x33x45")
    try:
        M, N, K = (int(v) for v in shape.split("x"))
    except ValueError:
        ap.error(f"--shape must be MxNxK (three integers), got {shape!r}")

    import numpy as np
    import torch

    from forge_num import kernels, rules
    from forge_num.emulator import emulate

    hypers = {
        "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
        "adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
        "sgd": {"lr": 0.01, "momentum": 0.9, "nesterov": True},
        "lion": {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.1},
    }
    mode = "GPU " + torch.cuda.get_device_name(0) if device == "cuda" else "CPU, Triton interpreter"
    operands = "bf16 operands (tensor cores)" if bf16 else "fp32 operands (ieee mainloop)"
    print(f"forge-num verify: W {M}x{N}, K = {K} tokens, {operands}, fp32 weight and state, {mode}")
    print(f"{'rule':<6} {'fused == unfused':>17} {'fused == emulator':>18} {'max |dW step|':>14} {'time':>7}")
    ok_all = True
    shown = None
    g = torch.Generator().manual_seed(args.seed)
    for name, hyper in hypers.items():
        rule = rules.get_rule(name)
        t0 = time.perf_counter()
        w = torch.randn(M, N, generator=g)
        x = torch.randn(K, N, generator=g)
        dy = torch.randn(K, M, generator=g) * 0.1
        if bf16:
            x, dy = x.bfloat16(), dy.bfloat16()
        states = [torch.zeros(M, N) for _ in range(rule.state_slots(hyper))]
        h = rule.scalars(hyper, 1)
        dev = torch.device(device)
        kernel, tile = kernels.launcher_tile(w.to(dev), x.to(dev), dy.to(dev), [s.to(dev) for s in states])
        if kernel != shown:
            print(f"  the launcher's kernel: {kernel}, tile {tile.label}")
            shown = kernel
        as_bits = (lambda t: t.view(torch.int16).numpy().view(np.uint16)) if bf16 else (lambda t: t.numpy())
        emu = emulate(w.numpy(), as_bits(x), as_bits(dy), [s.numpy() for s in states], rule=rule, h=h,
                      tile=(tile.BM, tile.BN, tile.BK))
        wf, sf = w.clone().to(dev), [s.clone().to(dev) for s in states]
        wu, su = w.clone().to(dev), [s.clone().to(dev) for s in states]
        kernels.fused_linear_update(wf, x.to(dev), dy.to(dev), sf, rule, h)
        kernels.unfused_linear_update(wu, x.to(dev), dy.to(dev), su, rule, h)
        same = lambda a, b: np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))  # noqa: E731
        fu = same(wf.cpu().numpy(), wu.cpu().numpy()) and all(same(a.cpu().numpy(), b.cpu().numpy()) for a, b in zip(sf, su))
        fe = same(wf.cpu().numpy(), emu.weight) and all(same(a.cpu().numpy(), b) for a, b in zip(sf, emu.states))
        ok_all &= fu and fe
        step = float((wf.cpu() - w).abs().max())
        print(f"{name:<6} {'bitwise' if fu else 'DIFFERENT':>17} {'bitwise' if fe else 'DIFFERENT':>18} "
              f"{step:14.3e} {time.perf_counter() - t0:6.2f}s")
    print("verify: OK, every update bit-identical" if ok_all else "verify: FAILED")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
