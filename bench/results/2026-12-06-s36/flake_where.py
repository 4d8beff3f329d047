"""Where the 8bit-hf-wide flake (session 36: wrong weights with the Gluon 8bit route, not with the Triton tile)
writes wrong values: `python bench/results/2026-12-06-s36/flake_where.py RUNS TAG [--eager-eager] [--precision P]`.

Each run trains tests/test_gpu_graphs.py's wide model (Llama-1B widths, two layers, 1024 tokens) STEPS steps
twice from the same seed: eagerly, then through capture_step (or eagerly again with --eager-eager: if two eager
runs part, no capture is needed for the fault). Where the two differ it prints, per parameter and state: the
elements that differ, how many are not finite, and for a 2-D tensor the 64 x 128 tiles and the rows that hold
them (a whole tile differing says a tile was read from the wrong place; scattered elements a race on single
stores). The environment picks the tiles as for any step (FORGE_NUM_GLUON_Q8=1: the Gluon 8bit route)."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

import forge_num as fn  # noqa: E402
from tests.test_gpu_graphs import _batches, _loss_fn, _model  # noqa: E402


def tensors(model, opt):
    """(name, tensor) of every parameter and optimizer state, in the model's parameter order."""
    out = []
    for name, p in model.named_parameters():
        out.append((name, p.detach().clone()))
        for k, v in opt.state[p].items():
            if isinstance(v, dict):
                out += [(f"{name}.{k}.codes", v["codes"].clone()), (f"{name}.{k}.scales", v["scales"].clone())]
            elif isinstance(v, torch.Tensor):
                out.append((f"{name}.{k}", v.clone()))
    return out


def train(precision, captured):
    model, opt = _model("wide", precision)
    opt._capturable = True
    batches = _batches(1024)
    if captured:
        step = fn.capture_step(opt, _loss_fn(model, "hf"), warmup=2)
        losses = [step(ids).clone() for ids in batches]
    else:
        loss_of = _loss_fn(model, "hf")
        losses = []
        for ids in batches:
            loss = loss_of(ids)
            opt.backward(loss)
            opt.step()
            losses.append(loss.detach().clone())
    torch.cuda.synchronize()
    return torch.stack(losses).float().cpu(), tensors(model, opt)


def describe(name, a, b):
    bits = lambda t: t.view(torch.int16 if t.element_size() == 2 else torch.uint8 if t.element_size() == 1
                            else torch.int32 if t.element_size() == 4 else torch.int64)
    d = bits(a.reshape(a.shape or (1,))) != bits(b.reshape(b.shape or (1,)))
    n = int(d.sum())
    bad = int((~torch.isfinite(b)).sum()) if b.is_floating_point() else 0
    line = f"  {name} {tuple(a.shape)}: {n} of {a.numel()} differ, {bad} not finite in the second"
    if a.dim() == 2 and n:
        rows, cols = d.nonzero(as_tuple=True)
        tiles = sorted({(int(r) // 64, int(c) // 128) for r, c in zip(rows.tolist(), cols.tolist())})
        per_tile = d.view(a.shape[0] // 64, 64, a.shape[1] // 128, 128).sum((1, 3)) if a.shape[0] % 64 == 0 \
            and a.shape[1] % 128 == 0 else None
        full = int((per_tile == 64 * 128).sum()) if per_tile is not None else -1
        line += (f"; {len(tiles)} tiles of 64x128 ({full} wholly), first {tiles[:8]}; rows {sorted(set(rows.tolist()))[:8]}"
                 f"... cols {sorted(set(cols.tolist()))[:8]}...")
    return line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", type=int)
    ap.add_argument("tag")
    ap.add_argument("--eager-eager", action="store_true")
    ap.add_argument("--precision", default="8bit")
    a = ap.parse_args()
    parted = 0
    for i in range(a.runs):
        t0 = time.time()
        loss_a, ten_a = train(a.precision, False)
        loss_b, ten_b = train(a.precision, not a.eager_eager)
        differ = [(n, x, y) for (n, x), (_, y) in zip(ten_a, ten_b)
                  if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))]
        if not torch.equal(loss_a.view(torch.int32), loss_b.view(torch.int32)) or differ:
            parted += 1
            print(f"{a.tag} run {i}: PARTED ({time.time() - t0:.1f} s) losses {loss_a.tolist()} / {loss_b.tolist()}",
                  flush=True)
            for n, x, y in differ[:12]:
                print(describe(n, x, y), flush=True)
        else:
            print(f"{a.tag} run {i}: equal ({time.time() - t0:.1f} s)", flush=True)
    print(f"{a.tag}: {parted} of {a.runs} parted (FORGE_NUM_GLUON_Q8={os.environ.get('FORGE_NUM_GLUON_Q8', 'unset')}, "
          f"{'eager twice' if a.eager_eager else 'eager, captured'}, {a.precision})", flush=True)


if __name__ == "__main__":
    main()
