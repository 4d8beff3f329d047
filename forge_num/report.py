"""``forge-num report bias``: measured bias and error of forge_num's stochastic roundings.

Runs the rounding code that the kernels run, through the emulator's bit-exact twins (emulator/
rounding.py, emulator/quant8.py) on the project's own random stream (Philox4x32-10 keyed by
``derive_seed`` and countered by element index, emulator/philox.py), and reports:

1. **bf16 stochastic rounding, per binade** (every bf16 binade, subnormals and negatives
   included): for each test value x, ``draws`` roundings with distinct counters; the mean signed
   error in units of the bf16 ulp at x with a 95% confidence interval, and the exact two-sided
   binomial p-value of the number of roundings away from zero against its probability lo/2^16
   (proofs/stochastic_rounding.md, Theorem 1). A Bonferroni-corrected minimum p-value per binade.
2. **8-bit states** (emulator/quant8.py): for random blocks over many magnitudes, the largest
   |dequant(Q(x)) - x| / quant8_error_bound (the proved bound; must stay below 1), and the mean
   relative bias of the dequantized values with its confidence interval.
3. **Drift of tiny updates**: a bf16 weight receiving ``steps`` updates of a fixed size below half
   a bf16 ulp, stored each step by round-to-nearest-even (which cancels every update) and by
   stochastic rounding (which keeps them on average), against the fp64 sum.

Writes ``bias.md``, ``bias.json`` and, when matplotlib is installed, ``bias.png`` under ``--out``.
The GPU variant of (1) and (2) is tests/test_statistical_rounding.py's `gpu` test; this report
measures the emulator, which the `exactness` tests hold bit for bit to the kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from forge_num.emulator import quant8
from forge_num.emulator.philox import derive_seed, rounding_bits
from forge_num.emulator.rounding import bf16_rne_bits, bf16_sr_bits, bf16_to_f32

_Z95 = 1.959963984540054  # two-sided 95% normal quantile


def _ulp_bf16(x: np.ndarray) -> np.ndarray:
    """The bf16 spacing at |x| (binary32 x): 2^(max(e, 1) - 134) for exponent field e."""
    e = (x.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
    return np.ldexp(1.0, np.maximum(e.astype(np.int64), 1) - 134)


def binade_values(per_binade: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Test values: for every bf16 binade (exponent fields 0 = subnormal .. 254) ``per_binade``
    binary32 values with random low bits, alternating sign. Returns (values, exponent fields)."""
    exps = np.repeat(np.arange(0, 255, dtype=np.uint32), per_binade)
    mant = rng.integers(1, 1 << 23, size=exps.size, dtype=np.uint32)
    sign = (np.arange(exps.size) % 2).astype(np.uint32) << np.uint32(31)
    bits = sign | (exps << np.uint32(23)) | mant
    return bits.view(np.float32), exps


def _gpu_sr_bits(key: int, values: np.ndarray, d0: int, d: int) -> np.ndarray:
    """The GPU's stochastic roundings (kernels/random.py, kernels/rounding.py) of values[j] with
    counters (d0 + i) * n + j, as uint16 [d, n]: what the kernels store."""
    import torch
    import triton

    from forge_num.report_kernels import sr_draws_kernel

    n = values.size
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: under TRITON_INTERPRET=1 (tests)
    x = torch.from_numpy(values).to(dev)
    out = torch.empty(d * n, dtype=torch.int16, device=dev)
    sr_draws_kernel[(triton.cdiv(d * n, 1024),)](x, out, key, d0, n, d * n, BLOCK=1024)
    return out.cpu().numpy().view(np.uint16).reshape(d, n)


def sr_bias(values: np.ndarray, draws: int, seed: int, device: str = "emulator") -> dict:
    """Per value: mean error of SR in ulps with a 95% CI, and the exact binomial p-value.
    ``device="gpu"``: the roundings come from the Triton kernels on CUDA instead of the emulator."""
    from scipy.stats import binomtest

    key = derive_seed(seed, 1, 0)
    n = values.size
    ups = np.zeros(n, dtype=np.int64)
    err_sum = np.zeros(n)
    err_sq = np.zeros(n)
    chunk = max(1, (1 << 22) // n)
    for d0 in range(0, draws, chunk):
        d = min(chunk, draws - d0)
        x = np.broadcast_to(values, (d, n))
        if device == "gpu":
            y = _gpu_sr_bits(key, values, d0, d)
        else:
            offs = (np.arange(d0, d0 + d, dtype=np.int64)[:, None] * n + np.arange(n)[None, :])
            y = bf16_sr_bits(x, rounding_bits(key, offs)[0])
        ups += np.sum(y.astype(np.int64) != (x.view(np.uint32) >> np.uint32(16)), axis=0)
        err = (bf16_to_f32(y).astype(np.float64) - x.astype(np.float64)) / _ulp_bf16(values)
        err_sum += err.sum(axis=0)
        err_sq += (err * err).sum(axis=0)
    mean = err_sum / draws
    sd = np.sqrt(np.maximum(err_sq / draws - mean * mean, 0.0))
    lo16 = (values.view(np.uint32) & np.uint32(0xFFFF)).astype(np.float64)
    p_up = lo16 / 65536.0
    pvals = np.array([binomtest(int(k), draws, float(p)).pvalue if 0 < p < 1 else 1.0 for k, p in zip(ups, p_up)])
    return {"mean_err_ulp": mean, "ci95_ulp": _Z95 * sd / math.sqrt(draws), "p_value": pvals,
            "max_abs_err_ulp_bound": 1.0}


def quant8_check(blocks: int, draws: int, seed: int) -> dict:
    """8-bit SR over random blocks: the worst error against the proved bound, and unbiasedness by an
    exact test. Each element x lies between two neighbouring grid values y_dn <= x <= y_up (the
    results with the random input 2^24 - 1 and 0), and is unbiased exactly when it rounds up with
    probability p = (x - y_dn) / (y_up - y_dn) (the 24-bit draw makes the implementation's p differ
    from it by < 2^-24: below what these draws resolve). The count of roundings up over the draws is
    tested against Binomial(draws, p) (exact two-sided p-value), Bonferroni over the elements that
    can round either way. Also the mean relative error over the normal range, for scale."""
    from scipy.stats import binomtest

    rng = np.random.default_rng(seed)
    out = {}
    for signed, name in ((True, "m (E4M3, signed)"), (False, "v (E5M3, unsigned)")):
        mags = np.exp2(rng.uniform(-60, 20, size=(blocks, 1)))
        x = (rng.standard_normal((blocks, quant8.QBLOCK)) * mags).astype(np.float32)
        if not signed:
            x = np.abs(x) * np.exp2(rng.uniform(-40, 0, size=x.shape)).astype(np.float32)

        def dequant(rand):
            codes, scales = quant8.quantize_block_sr(x, rand, signed)
            return dequant_with(codes, scales), scales

        def dequant_with(codes, scales):
            return quant8.dequantize(codes, scales, signed).astype(np.float64)

        y_lo, scales = dequant(np.full(x.shape, (1 << 24) - 1, dtype=np.uint32))
        y_hi, _ = dequant(np.zeros(x.shape, dtype=np.uint32))
        y_dn, y_up = np.minimum(y_lo, y_hi), np.maximum(y_lo, y_hi)
        x64 = x.astype(np.float64)
        worst, ups, err_sum = 0.0, np.zeros(x.shape, dtype=np.int64), np.zeros(x.shape)
        bound = quant8.quant8_error_bound(x, np.repeat(scales, quant8.QBLOCK, axis=1), signed)
        for _ in range(draws):
            rand = rng.integers(0, 1 << 24, size=x.shape, dtype=np.uint32)
            y, _ = dequant(rand)
            worst = max(worst, float(np.max(np.abs(y - x64) / bound)))
            ups += y == y_up
            err_sum += y - x64
        two_way = y_up > y_dn
        p_up = np.where(two_way, (x64 - y_dn) / np.where(two_way, y_up - y_dn, 1.0), 0.0)
        pvals = np.array([binomtest(int(k), draws, float(p)).pvalue if 0 < p < 1 else 1.0
                          for k, p in zip(ups[two_way], p_up[two_way])])
        rel = err_sum / draws / np.maximum(np.abs(x64), 1e-300)
        big = np.abs(x) >= np.repeat(scales, quant8.QBLOCK, axis=1) * 2.0**-6  # normal code range
        out[name] = {"worst_error_over_bound": worst, "elements": int(x.size), "draws": draws,
                     "elements_two_way": int(two_way.sum()),
                     "min_p_bonferroni": float(min(1.0, pvals.min() * pvals.size)) if pvals.size else 1.0,
                     # rel is a mean over the draws already: its standard error divides by sqrt(elements)
                     "mean_rel_bias_normal_range": float(np.mean(rel[big])),
                     "rel_bias_sd_normal_range": float(np.std(rel[big])),
                     "elements_normal_range": int(np.count_nonzero(big))}
    return out


def tiny_update_drift(steps: int, seed: int) -> dict:
    """A bf16 weight 1.0 receiving +0.1 ulp per step: RNE, SR and the exact sum."""
    key0 = seed
    delta = 0.1 * 2.0**-7  # bf16 ulp at 1.0 is 2^-7
    p_rne = np.array([1.0], np.float32)
    p_sr = np.array([1.0], np.float32)
    trace = {"step": [], "rne": [], "sr": [], "exact": []}
    for t in range(1, steps + 1):
        p_rne = bf16_to_f32(bf16_rne_bits(np.float32(p_rne + np.float32(delta))))
        r = rounding_bits(derive_seed(key0, t, 0), np.array([0], np.int64))[0]
        p_sr = bf16_to_f32(bf16_sr_bits(np.float32(p_sr + np.float32(delta)), r))
        if t % max(1, steps // 200) == 0 or t == steps:
            trace["step"].append(t)
            trace["rne"].append(float(p_rne[0]))
            trace["sr"].append(float(p_sr[0]))
            trace["exact"].append(1.0 + t * delta)
    return {"delta": delta, "steps": steps, "final": {k: v[-1] for k, v in trace.items() if k != "step"},
            "trace": trace}


def run(draws: int = 100_000, per_binade: int = 2, seed: int = 0, blocks: int = 64, q_draws: int = 64,
        steps: int = 2000, device: str = "emulator") -> dict:
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    values, exps = binade_values(per_binade, rng)
    sr = sr_bias(values, draws, seed, device)
    n_tests = values.size
    binades = []
    for e in np.unique(exps):
        sel = exps == e
        binades.append({
            "exponent_field": int(e), "kind": "subnormal" if e == 0 else "normal",
            "mean_err_ulp": float(np.mean(sr["mean_err_ulp"][sel])),
            "max_ci95_ulp": float(np.max(sr["ci95_ulp"][sel])),
            "min_p_value": float(np.min(sr["p_value"][sel])),
            "min_p_bonferroni": float(min(1.0, np.min(sr["p_value"][sel]) * n_tests)),
        })
    return {
        "sr_bf16": {"draws_per_value": draws, "values": int(n_tests), "binades": binades,
                    "worst_abs_mean_err_ulp": float(np.max(np.abs(sr["mean_err_ulp"]))),
                    "min_p_bonferroni": float(min(1.0, np.min(sr["p_value"]) * n_tests))},
        "quant8": quant8_check(blocks, q_draws, seed),
        "tiny_updates": tiny_update_drift(steps, seed),
        "seconds": time.perf_counter() - t0,
        "source": ("GPU: the Triton kernels' rounding (kernels/random.py, kernels/rounding.py) for the bf16 "
                   "SR section; the emulator for the 8-bit and tiny-update sections" if device == "gpu" else
                   "emulator (bit-exact twin of the kernels' rounding; Philox stream of derive_seed)"),
    }


def write(report: dict, out: str) -> list[str]:
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, "bias.json"), os.path.join(out, "bias.md")]
    with open(paths[0], "w") as f:
        json.dump(report, f, indent=1)
    sr, q8, tiny = report["sr_bf16"], report["quant8"], report["tiny_updates"]
    lines = [
        "# forge_num rounding bias report", "",
        f"Source: {report['source']}. {report['seconds']:.1f} s.", "",
        "## bf16 stochastic rounding", "",
        f"{sr['values']} values over all 255 bf16 exponent fields (both signs), {sr['draws_per_value']:,} "
        "draws each. Mean error in ulps (exactly 0 in expectation, Theorem 1), 95% CI half-width, and the "
        "exact binomial p-value of the count of roundings away from zero (Bonferroni over all values).", "",
        f"Worst |mean error|: {sr['worst_abs_mean_err_ulp']:.2e} ulp; smallest Bonferroni p-value: "
        f"{sr['min_p_bonferroni']:.3g} (a bias would show as p < 0.001).", "",
        "| exponent field | kind | mean error (ulp) | 95% CI ± | min p (Bonferroni) |", "|---|---|---|---|---|",
    ]
    for b in sr["binades"][:: max(1, len(sr["binades"]) // 24)]:
        lines.append(f"| {b['exponent_field']} | {b['kind']} | {b['mean_err_ulp']:+.2e} | {b['max_ci95_ulp']:.1e} "
                     f"| {b['min_p_bonferroni']:.3g} |")
    lines += ["", "(every 10th binade shown; bias.json has all)", "", "## 8-bit states", "",
              "Unbiasedness: the count of roundings up of each element against Binomial(draws, p), p the "
              "exact probability that makes the rounding unbiased (exact two-sided p-value, Bonferroni over "
              "the elements that can round either way).", "",
              "| state | elements | draws | worst error / proved bound | min p (Bonferroni) | "
              "mean relative error (normal range) |",
              "|---|---|---|---|---|---|"]
    for name, r in q8.items():
        lines.append(f"| {name} | {r['elements']} | {r['draws']} | {r['worst_error_over_bound']:.4f} | "
                     f"{r['min_p_bonferroni']:.3g} | {r['mean_rel_bias_normal_range']:+.2e} ± "
                     f"{_Z95 * r['rel_bias_sd_normal_range'] / math.sqrt(r['elements_normal_range']):.1e} |")
    f_ = tiny["final"]
    lines += ["", "## Tiny updates", "",
              f"A bf16 weight 1.0 receiving {tiny['steps']} updates of +{tiny['delta']:.3g} (0.1 ulp): "
              f"round-to-nearest ends at {f_['rne']:.6f} (every update cancelled), stochastic rounding at "
              f"{f_['sr']:.6f}, the exact sum is {f_['exact']:.6f}.", ""]
    with open(paths[1], "w") as f:
        f.write("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    e = [b["exponent_field"] for b in sr["binades"]]
    ax[0].errorbar(e, [b["mean_err_ulp"] for b in sr["binades"]], yerr=[b["max_ci95_ulp"] for b in sr["binades"]],
                   fmt=".", ms=3)
    ax[0].axhline(0, color="k", lw=0.5)
    ax[0].set(xlabel="bf16 exponent field", ylabel="mean SR error (ulp)", title="bf16 SR bias by binade (95% CI)")
    tr = tiny["trace"]
    for k in ("exact", "sr", "rne"):
        ax[1].plot(tr["step"], tr[k], label=k)
    ax[1].set(xlabel="step", ylabel="weight", title="tiny updates (0.1 ulp each)")
    ax[1].legend()
    fig.tight_layout()
    paths.append(os.path.join(out, "bias.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="forge-num report bias", description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=100_000, help="SR draws per test value (default 100,000)")
    ap.add_argument("--per-binade", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2000, help="tiny-update steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bias-report")
    ap.add_argument("--device", choices=("emulator", "gpu"), default="emulator",
                    help="where the bf16 roundings are drawn: the emulator, or the Triton kernels on CUDA")
    args = ap.parse_args(argv)
    report = run(args.draws, args.per_binade, args.seed, steps=args.steps, device=args.device)
    for p in write(report, args.out):
        print("wrote", p)
    sr = report["sr_bf16"]
    print(f"bf16 SR: worst |mean error| {sr['worst_abs_mean_err_ulp']:.2e} ulp, min Bonferroni p {sr['min_p_bonferroni']:.3g}")
    for name, r in report["quant8"].items():
        print(f"8-bit {name}: worst error / bound {r['worst_error_over_bound']:.4f} (proved < 1), "
              f"min Bonferroni p {r['min_p_bonferroni']:.3g}")
    fin = report["tiny_updates"]["final"]
    print(f"tiny updates: rne {fin['rne']:.6f}, sr {fin['sr']:.6f}, exact {fin['exact']:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
