"""Is a Gluon split kernel nondeterministic on its own? (session 36: tests/test_gpu_graphs.py's 8bit-hf-wide
case differed in 8 of 24 runs with the 8bit route at 1024 tokens, the staged deep cursor; 1 of 24 with the deep
cursor forced; 0 of 12 with the Triton 8bit tile; the weight that differed, when the losses agreed, was layer 0's
down_proj, 2048 x 8192, its states equal.)

`python bench/results/2026-12-06-s36/stress.py REPEATS [8bit]`: per tile (8bit: the 8bit tiles only) and shape, one update from fixed inputs as the
reference, then REPEATS more from the same inputs (each with a cuBLAS product of another size queued before it,
so that the launches meet the GPU in different states), each compared bit for bit with the reference; prints a
line per (tile, shape): runs differing, and for the first one the tensors, elements and tiles that differ."""

import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from forge_num import kernels  # noqa: E402
from forge_num.emulator.philox import derive_seed  # noqa: E402
from forge_num.kernels import gluon_f32, gluon_q8  # noqa: E402
from tests.test_gpu_gluon import _case, _q8_clone, _q8_states  # noqa: E402


def where(a, b, N, BM, BN):
    """Differing elements of two same-shape tensors: count, NaNs in b, the first few (row, col) and tiles."""
    d = (a.view(-1) != b.view(-1)).nonzero().flatten()
    rows, cols = (d // N).tolist()[:4], (d % N).tolist()[:4]
    tiles = sorted({(int(r) // BM, int(c) // BN) for r, c in zip((d // N).tolist(), (d % N).tolist())})
    return f"{d.numel()} elements ({tuple(zip(rows, cols))}... tiles {tiles[:6]}{'...' if len(tiles) > 6 else ''})"


def run_q8(config, M, N, K, repeats, noise, slotted=False):
    """slotted: through kernels.fused_linear_update with the tile forced (FORGE_NUM_GLUON_Q8=<label>) and the
    scalars read from a step slot, as a training step's launches are."""
    rule, h, w32, s32, x, dy = _case("adamw", M, N, K, seed=11)
    w0, s0 = w32.bfloat16(), _q8_states(s32, 11)
    key = derive_seed(11, 3, 2**40 + M)
    slot = torch.tensor(kernels.step_slot_words(h, 1.0, key), dtype=torch.int32, device="cuda")
    if slotted:
        os.environ["FORGE_NUM_GLUON_Q8"] = config.label.replace(" ", "_")

    def once():
        w, s = w0.clone(), _q8_clone(s0)
        noise()
        if slotted:
            kernels.fused_linear_update(w, x, dy, s, rule, h, seed=key, step_slot=slot)
        elif config is None:
            kernels.fused_linear_update(w, x, dy, s, rule, h, config=kernels.DEFAULT_Q8_CONFIGS["tma"], seed=key)
        else:
            gluon_q8.fused_linear_update_q8_ws(w, x, dy, s, rule, h, config=config, seed=key)
        return [w.view(torch.int16)] + [t for q in s for t in (q.codes, q.scales.view(torch.int32))]
    return compare(once, repeats, N, ("W", "m codes", "m scales", "v codes", "v scales"), config)


def run_f32(config, M, N, K, repeats, noise):
    rule, h, w0, s0, x, dy = _case("adamw", M, N, K, seed=11)

    def once():
        w, s = w0.clone(), [t.clone() for t in s0]
        noise()
        if config is None:
            kernels.fused_linear_update(w, x, dy, s, rule, h, config=kernels.DEFAULT_TMA_CONFIGS["small_k"])
        else:
            gluon_f32.fused_linear_update_f32_ws(w, x, dy, s, rule, h, config=config)
        return [w.view(torch.int32)] + [t.view(torch.int32) for t in s]
    return compare(once, repeats, N, ("W", "m", "v"), config)


def compare(once, repeats, N, names, config):
    ref = [t.clone() for t in once()]
    differing, first = 0, None
    for _ in range(repeats):
        got = once()
        bad = [i for i, (a, b) in enumerate(zip(ref, got)) if not torch.equal(a, b)]
        if bad:
            differing += 1
            if first is None:
                BM, BN = (config.BM, config.BN) if config is not None else (64, 128)
                first = "; ".join(f"{names[i]}: {where(ref[i], got[i], N if ref[i].numel() % N == 0 and ref[i].numel() > N else ref[i].shape[-1], BM, BN)}"
                                  for i in bad)
    torch.cuda.synchronize()
    return differing, first


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    only_8bit = sys.argv[2:] == ["8bit"]
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    sink = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
    step = [0]

    def noise():  # a product of varying length before each launch
        step[0] += 1
        n = 512 * (1 + step[0] % 8)
        torch.mm(a[:n], a[:, :n], out=sink[:n, :n])

    q8_tiles = [("staged", gluon_q8.MMA_STAGED_CONFIG), ("deep", gluon_q8.DEEP_CURSOR_CONFIG),
                ("wide", gluon_q8.WIDE_EPILOGUE_CONFIG), ("cursor", gluon_q8.CURSOR_CONFIG),
                ("k128", gluon_q8.K128_CURSOR_CONFIG), ("triton8", None)]
    f32_tiles = [("f32 default", gluon_f32.DEFAULT_F32_WS_CONFIG), ("f32 tall", gluon_f32.TALL_F32_WS_CONFIG),
                 ("f32 triton", None)]
    f32_tiles += [(c.label, c) for c in gluon_f32.F32_WS_CANDIDATE_CONFIGS if c.g_buffers == 1 or c.stage_slots]
    for M, N in ((2048, 8192), (8192, 2048)):
        for name, c in q8_tiles:
            n, first = run_q8(c, M, N, 1024, repeats, noise)
            print(f"8bit {name:12s} {M}x{N} K=1024: {n} of {repeats} differ{'; first: ' + first if first else ''}",
                  flush=True)
        for name, c in q8_tiles[:2]:
            n, first = run_q8(c, M, N, 1024, repeats, noise, slotted=True)
            os.environ.pop("FORGE_NUM_GLUON_Q8", None)
            print(f"8bit {name + ' slot':12s} {M}x{N} K=1024: {n} of {repeats} differ"
                  f"{'; first: ' + first if first else ''}", flush=True)
        for name, c in [] if only_8bit else f32_tiles:
            n, first = run_f32(c, M, N, 1024, repeats // 2, noise)
            print(f"fp32 {name:12s} {M}x{N} K=1024: {n} of {repeats // 2} differ{'; first: ' + first if first else ''}",
                  flush=True)


if __name__ == "__main__":
    main()
