"""On an H200: Triton's bf16 ``acc = tl.dot(a, b, acc)`` against emulator.tensor_core.dot_sm90, bit for bit.

A small kernel computes d = acc + a b with bf16 operands and an fp32 accumulator, K in BK blocks,
with ``a`` either loaded directly ([BM, BK] tiles) or, as in the dW kernel (dW = dYᵀX), loaded as a
[BK, BM] tile of aᵀ and transposed with ``tl.trans``. Inputs:

* the targeted vectors of tests/data/tensor_core_h200/t_vectors.json (T1-T16, X1-X13), one k16
  instruction each; the table printed settles any `unmeasured` ones (none left: the first H200 run
  of 2026-12-02, bench/results/2026-12-02-h200/, measured T1-T16, X1-X11 and corrected T13 to +0;
  the second, bench/results/2026-12-02-h200-s2/, measured all 32, X12 and X13 included).
  With BK > 16 the kernel runs BK/16 instructions per tile, the ones after the vector's on zeros;
  the model is padded the same way (``dot_sm90(..., pad_k_to=BK)``), which changes no word since no
  instruction outputs -0 (T13) or a non-canonical NaN;
* more than 10^5 random outputs per tile configuration in regions the published data lacks: zeros
  and +-0 accumulators, bf16 subnormals and the floor, Inf/NaN, overflow, exponent spreads of
  120 binades, cancellation, K tails, and a normal region like the research note's run.

A mismatch is reported with its exact inputs, and narrowed to the first k16 instruction of the chain
whose output differs (its accumulator, 16 lanes, the model's and the GPU's result), so the model can
be corrected. A JSON summary goes to $FORGE_RESULTS_DIR/tensor_core_vectors.json when that is set.
Run: pytest -m exactness tests/test_gpu_tensor_core.py -s
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from forge_num.emulator import tensor_core as tc

pytestmark = [pytest.mark.exactness, pytest.mark.gpu]

DATA = Path(__file__).resolve().parent / "data" / "tensor_core_h200"
T_VECTORS = json.loads((DATA / "t_vectors.json").read_text())
SUMMARY_NAME = "tensor_core_vectors.json"
NAN = 0x7FFFFFFF


# =================================================================================================
# the kernel (addressing only: the maths is tl.dot)
# =================================================================================================
@triton.jit
def _dot_kernel(
    a_ptr, b_ptr, c_ptr, d_ptr, M, N, K,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, A_TRANSPOSED: tl.constexpr,
):
    """d[M, N] = tl.dot chain over K of a [M, K] (or aᵀ [K, M] when A_TRANSPOSED) and b [K, N], acc c."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    acc = tl.load(c_ptr + rm[:, None] * N + rn[None, :], mask=out_mask, other=0.0)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        if A_TRANSPOSED:  # the dW kernel's dY tile: [BK, BM], transposed in registers
            a_mask = (kk[:, None] < K) & (rm[None, :] < M)
            a_t = tl.load(a_ptr + kk[:, None] * M + rm[None, :], mask=a_mask, other=0.0)
            a = tl.trans(a_t)
        else:
            a_mask = (rm[:, None] < M) & (kk[None, :] < K)
            a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=a_mask, other=0.0)
        b_mask = (kk[:, None] < K) & (rn[None, :] < N)
        b = tl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(d_ptr + rm[:, None] * N + rn[None, :], acc, mask=out_mask)


@dataclass(frozen=True)
class Config:
    BM: int
    BN: int
    BK: int
    warps: int
    a_transposed: bool

    @property
    def name(self) -> str:
        return f"{self.BM}x{self.BN}x{self.BK}w{self.warps}{'-trans' if self.a_transposed else '-direct'}"


CONFIGS = [
    Config(BM, BN, BK, warps, trans)
    for (BM, BN, BK, warps) in [(64, 64, 64, 4), (128, 128, 64, 8), (128, 64, 32, 4), (64, 64, 16, 4)]
    for trans in (True, False)
]


def _bf16_tensor(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).cuda()


def gpu_dot(a_bits: np.ndarray, b_bits: np.ndarray, acc: np.ndarray, cfg: Config) -> np.ndarray:
    """The kernel's fp32 words for a_bits [M, K], b_bits [K, N] (bf16 words), acc [M, N] float32."""
    (m, k), n = a_bits.shape, b_bits.shape[1]
    a = _bf16_tensor(a_bits.T if cfg.a_transposed else a_bits)
    b = _bf16_tensor(b_bits)
    c = torch.from_numpy(np.ascontiguousarray(acc, dtype=np.float32)).cuda()
    d = torch.empty_like(c)
    grid = (triton.cdiv(m, cfg.BM), triton.cdiv(n, cfg.BN))
    _dot_kernel[grid](a, b, c, d, m, n, k, BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, A_TRANSPOSED=cfg.a_transposed,
                      num_warps=cfg.warps)
    torch.cuda.synchronize()
    return d.cpu().numpy().view(np.uint32)


def model_dot(a_bits, b_bits, acc, bk: int = 16) -> np.ndarray:
    """The model of the kernel with K tiles of bk: K zero-padded to a multiple of bk (the kernel issues
    bk/16 instructions per tile, also on the zero-filled tail)."""
    return tc.dot_sm90(a_bits, b_bits, acc, pad_k_to=bk).view(np.uint32)


# =================================================================================================
# reporting
# =================================================================================================
def _hex(x) -> str:
    return "%08x" % int(x)


def _merge_summary(key: str, value) -> None:
    """Add one section to $FORGE_RESULTS_DIR/tensor_core_vectors.json (safe under pytest-xdist)."""
    out = os.environ.get("FORGE_RESULTS_DIR")
    if not out:
        return
    path = Path(out) / SUMMARY_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = json.loads(path.read_text()) if path.exists() else {}
        summary.setdefault("device", torch.cuda.get_device_name())
        summary.setdefault("capability", "sm_%d%d" % torch.cuda.get_device_capability())
        summary.setdefault("versions", {"torch": torch.__version__, "triton": triton.__version__})
        summary[key] = value
        path.write_text(json.dumps(summary, indent=1))


def _first_differing_instruction(a_row, b_col, c_word, cfg: Config):
    """Narrow a mismatching output to the first k16 instruction whose output differs.

    Runs this one output (a 1x1 problem) through the kernel with BK = 16 on K prefixes 16, 32, ...,
    so that prefix j holds exactly j instructions, and the model's chain alongside; returns the first
    differing instruction's exact inputs and both outputs. None when no instruction differs there:
    then the zero-filled padding instructions of the configuration (BK > 16) make the difference."""
    cfg16 = Config(64, 64, 16, 4, cfg.a_transposed)
    k = a_row.size
    acc_in = np.array([[c_word]], dtype=np.uint32).view(np.float32)
    model_acc = acc_in
    for j in range(-(-k // 16)):
        stop = min(16 * (j + 1), k)
        a_blk = np.zeros(16, np.uint16)
        b_blk = np.zeros(16, np.uint16)
        a_blk[: stop - 16 * j] = a_row[16 * j : stop]
        b_blk[: stop - 16 * j] = b_col[16 * j : stop]
        model_next = tc.block_fma_sm90(model_acc, a_blk[None, None], b_blk[None, None])
        gpu_next = gpu_dot(a_row[None, :stop], b_col[:stop, None], acc_in, cfg16)
        if int(gpu_next[0, 0]) != int(model_next.view(np.uint32)[0, 0]):
            return {
                "instruction": j,
                "c": _hex(model_acc.view(np.uint32)[0, 0]),
                "a": ["%04x" % x for x in a_blk],
                "b": ["%04x" % x for x in b_blk],
                "model": _hex(model_next.view(np.uint32)[0, 0]),
                "gpu": _hex(gpu_next[0, 0]),
            }
        model_acc = model_next
    return None


def _mismatch_record(a_bits, b_bits, acc, model, got, i, j, cfg, narrow: bool):
    rec = {
        "m": int(i), "n": int(j), "K": int(a_bits.shape[1]),
        "model": _hex(model[i, j]), "gpu": _hex(got[i, j]),
        "acc": _hex(acc.view(np.uint32)[i, j]),
        "a_row": ["%04x" % x for x in a_bits[i]],
        "b_col": ["%04x" % x for x in b_bits[:, j]],
    }
    if narrow:
        rec["first_differing_instruction"] = _first_differing_instruction(
            a_bits[i], b_bits[:, j], int(acc.view(np.uint32)[i, j]), cfg
        )
    return rec


def _is_nan(words: np.ndarray) -> np.ndarray:
    return (words & 0x7FFFFFFF) > 0x7F800000


def compare(a_bits, b_bits, acc, model, cfg: Config, keep: int = 5) -> dict:
    """Mismatch counts of the kernel against the model's words ``model`` for one problem."""
    got = gpu_dot(a_bits, b_bits, acc, cfg)
    bad = model != got
    nan_payload_only = bad & _is_nan(model) & _is_nan(got)
    rows, cols = np.nonzero(bad)
    examples = [
        _mismatch_record(a_bits, b_bits, acc, model, got, i, j, cfg, narrow=n < 2)
        for n, (i, j) in enumerate(zip(rows[:keep], cols[:keep]))
    ]
    gpu_nan_words = sorted({_hex(w) for w in np.unique(got[_is_nan(got)])[:8]})
    return {
        "outputs": int(model.size),
        "mismatches": int(bad.sum()),
        "nan_payload_only": int(nan_payload_only.sum()),
        "gpu_nan_words": gpu_nan_words,
        "examples": examples,
    }


# =================================================================================================
# the targeted vectors
# =================================================================================================
def _vector_problem():
    """All vectors in one problem: a row i and b column i are vector i's lanes, acc row i its c.

    Output (i, i) is vector i; the off-diagonal outputs mix vectors and are compared too."""
    vectors = T_VECTORS["vectors"]
    a = np.array([[int(x, 16) for x in v["a"]] for v in vectors], dtype=np.uint16)
    b = np.array([[int(x, 16) for x in v["b"]] for v in vectors], dtype=np.uint16).T.copy()
    c = np.array([int(v["c"], 16) for v in vectors], dtype=np.uint32)
    acc = np.repeat(c[:, None], len(vectors), axis=1).view(np.float32)
    return vectors, a, b, acc


def test_t_vectors_on_gpu():
    vectors, a, b, acc = _vector_problem()
    per_vector = {v["id"]: {"expected": v["expected"], "status": v["status"], "gpu": {}, "model": {}}
                  for v in vectors}
    off_diagonal = {}
    for cfg in CONFIGS:
        got = gpu_dot(a, b, acc, cfg)
        model = model_dot(a, b, acc, cfg.BK)  # BK > 16: zero-filled instructions follow the vector's
        for i, v in enumerate(vectors):
            per_vector[v["id"]]["gpu"][cfg.name] = _hex(got[i, i])
            per_vector[v["id"]]["model"][cfg.name] = _hex(model[i, i])
        off = ~np.eye(len(vectors), dtype=bool) & (got != model)
        off_diagonal[cfg.name] = [
            {"a_vector": vectors[i]["id"], "b_vector": vectors[j]["id"], "c": _hex(acc.view(np.uint32)[i, j]),
             "model": _hex(model[i, j]), "gpu": _hex(got[i, j])}
            for i, j in zip(*np.nonzero(off))
        ][:20]
    lines = [f"{'vector':7} {'status':10} {'model':8}  {'gpu (all configurations)':26} verdict"]
    failures = []
    for v in vectors:
        rec = per_vector[v["id"]]
        outs = sorted(set(rec["gpu"].values()))
        agrees = rec["gpu"] == rec["model"]
        differing = {out for c, out in rec["gpu"].items() if out != rec["model"][c]}
        matching_alternatives = [alt for alt, out in v.get("alternatives", {}).items() if out in differing]
        rec["agrees"] = agrees
        rec["alternatives_matching_gpu"] = matching_alternatives
        verdict = "model" if agrees else "MISMATCH"
        if matching_alternatives:
            verdict += f" (= {', '.join(matching_alternatives)})"
        if sorted(set(rec["model"].values())) != [v["expected"]]:
            verdict += f" [model with BK > 16: {','.join(sorted(set(rec['model'].values())))}]"
        lines.append(f"{v['id']:7} {v['status']:10} {v['expected']:8}  {','.join(outs):26} {verdict}")
        if not agrees:
            failures.append({"id": v["id"], "feature": v["feature"], "a": v["a"], "b": v["b"], "c": v["c"],
                             "model": rec["model"], "gpu": rec["gpu"]})
    print("\n" + "\n".join(lines))
    _merge_summary("t_vectors", {"per_vector": per_vector, "off_diagonal_mismatches": off_diagonal})
    assert not failures, json.dumps(failures, indent=1)
    assert not any(off_diagonal.values()), json.dumps(off_diagonal, indent=1)


# =================================================================================================
# random regions
# =================================================================================================
M = N = 256


def _words(rng, shape, lo_exp, hi_exp, zero=0.0, subnormal=0.0) -> np.ndarray:
    """bf16 words: random sign, exponent uniform in [lo_exp, hi_exp], random fraction; some zeros and
    subnormals."""
    field = rng.integers(lo_exp + 127, hi_exp + 128, size=shape)
    w = field << 7 | rng.integers(0, 128, size=shape)
    r = rng.random(shape)
    w = np.where(r < subnormal, rng.integers(1, 128, size=shape), w)
    w = np.where((r >= subnormal) & (r < subnormal + zero), 0, w)
    return (w | rng.integers(0, 2, size=shape) << 15).astype(np.uint16)


def _acc(rng, shape, lo_exp, hi_exp, zero=0.0, subnormal=0.0) -> np.ndarray:
    field = rng.integers(lo_exp + 127, hi_exp + 128, size=shape)
    w = field << 23 | rng.integers(0, 1 << 23, size=shape)
    r = rng.random(shape)
    w = np.where(r < subnormal, rng.integers(1, 1 << 23, size=shape), w)
    w = np.where((r >= subnormal) & (r < subnormal + zero), 0, w)
    return (w | rng.integers(0, 2, size=shape) << 31).astype(np.uint32).view(np.float32)


def _sprinkle(rng, words, share, choices, bits=16):
    dtype = np.uint16 if bits == 16 else np.uint32
    hit = rng.random(words.shape) < share
    return np.where(hit, rng.choice(np.array(choices, dtype=dtype), size=words.shape), words).astype(dtype)


def _region(name: str, rng):
    """(a [M, K], b [K, N], acc [M, N]) of one region."""
    if name == "normal, randn * 2^U[-10,10] (the note's run)":
        k = 64

        def randn_scaled(shape):
            x = rng.standard_normal(shape) * 2.0 ** rng.uniform(-10, 10, shape)
            return tc.bf16_bits_from_f32_rne(x.astype(np.float32))

        a, b = randn_scaled((M, k)), randn_scaled((k, N))
        return a, b, _acc(rng, (M, N), -5, 5, zero=0.3)
    if name == "one instruction, mixed":
        k = 16
        a, b = _words(rng, (M, k), -40, 40, 0.2, 0.05), _words(rng, (k, N), -40, 40, 0.2, 0.05)
        return a, b, _acc(rng, (M, N), -60, 60, 0.2, 0.05)
    if name == "exponent spread of 120 binades":
        k = 64
        return _words(rng, (M, k), -30, 30), _words(rng, (k, N), -30, 30), _acc(rng, (M, N), -60, 60, 0.1)
    if name == "zeros, +-0 accumulators, zero rows":
        k = 64
        a, b = _words(rng, (M, k), -8, 8, zero=0.5), _words(rng, (k, N), -8, 8, zero=0.5)
        a[rng.random(M) < 0.1] = rng.choice(np.array([0, 0x8000], np.uint16), size=k)  # whole rows of +-0
        return a, b, _acc(rng, (M, N), -8, 8, zero=0.6)
    if name == "bf16 subnormals, the floor, fp32 subnormal results":
        k = 64  # products below 2^-125: the alignment floor acts and most results are fp32 subnormals
        a = _words(rng, (M, k), -126, -118, zero=0.1, subnormal=0.3)
        b = _words(rng, (k, N), -25, -8, zero=0.1, subnormal=0.1)
        return a, b, _acc(rng, (M, N), -126, -120, zero=0.3, subnormal=0.4)
    if name == "underflow to +-0, tiny subnormal results":
        k = 16  # products 2^-161 .. 2^-143: results of a few subnormal ulps, or zeros of either sign
        a = _words(rng, (M, k), -126, -120, zero=0.1, subnormal=0.5)
        b = _words(rng, (k, N), -36, -25, zero=0.1)
        return a, b, _acc(rng, (M, N), -126, -126, zero=0.8, subnormal=0.15)
    if name == "overflow":
        k = 32
        a, b = _words(rng, (M, k), 60, 64), _words(rng, (k, N), 60, 64)
        return a, b, _acc(rng, (M, N), 120, 127, zero=0.1)
    if name == "Inf and NaN sprinkled":
        k = 64
        specials = [0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x7FFF]
        a = _sprinkle(rng, _words(rng, (M, k), -8, 8, zero=0.1), 0.0005, specials)
        b = _sprinkle(rng, _words(rng, (k, N), -8, 8, zero=0.1), 0.0005, specials)
        acc = _sprinkle(rng, _acc(rng, (M, N), -4, 4).view(np.uint32), 0.01,
                        [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001], bits=32)
        return a, b, acc.view(np.float32)
    if name == "cancellation":
        k = 64
        a, b = _words(rng, (M, k), -8, 8), _words(rng, (k, N), -8, 8)
        pairs = np.flatnonzero((rng.random(k // 2) < 0.6) | (np.arange(k // 2) == 0)) * 2
        a[:, pairs + 1] = a[:, pairs] ^ 0x8000  # lane 2i+1 cancels lane 2i in every output
        b[pairs + 1, :] = b[pairs, :]
        unpaired = np.setdiff1d(np.arange(k), np.concatenate([pairs, pairs + 1]))
        zero_cols = np.flatnonzero(rng.random(N) < 0.15)  # there every product cancels or is +-0
        signed_zeros = np.array([0, 0x8000], np.uint16)
        b[np.ix_(unpaired, zero_cols)] = rng.choice(signed_zeros, size=(unpaired.size, zero_cols.size))
        # the accumulator: the exact negative of an unpaired product (an fp32 number: 16 significant
        # bits, exponent within range), +-0, or random
        u0 = unpaired[0]
        a_u0 = tc.f32_from_bf16_bits(a[:, u0 : u0 + 1]).astype(np.float64)
        first = a_u0 * tc.f32_from_bf16_bits(b[u0 : u0 + 1, :]).astype(np.float64)
        kind = rng.integers(0, 3, size=(M, N))
        random_acc = _acc(rng, (M, N), -8, 8).astype(np.float64)
        acc = np.where(kind == 0, -first, np.where(kind == 1, 0.0, random_acc))
        acc = np.where((kind == 1) & (rng.random((M, N)) < 0.5), -0.0, acc)
        return a, b, acc.astype(np.float32)
    if name == "K tail (K = 50), mixed":
        k = 50
        a, b = _words(rng, (M, k), -20, 20, 0.1, 0.02), _words(rng, (k, N), -20, 20, 0.1, 0.02)
        return a, b, _acc(rng, (M, N), -30, 30, 0.2)
    raise KeyError(name)


REGIONS = [
    "normal, randn * 2^U[-10,10] (the note's run)",
    "one instruction, mixed",
    "exponent spread of 120 binades",
    "zeros, +-0 accumulators, zero rows",
    "bf16 subnormals, the floor, fp32 subnormal results",
    "underflow to +-0, tiny subnormal results",
    "overflow",
    "Inf and NaN sprinkled",
    "cancellation",
    "K tail (K = 50), mixed",
]


def test_random_regions_on_gpu():
    rng = np.random.default_rng(20261202)
    problems = {name: _region(name, rng) for name in REGIONS}
    tiles_k = {c.BK for c in CONFIGS}
    models = {(name, bk): model_dot(*problem, bk) for name, problem in problems.items() for bk in tiles_k}
    results = {name: {} for name in REGIONS}
    for cfg in CONFIGS:
        for name, (a, b, acc) in problems.items():
            results[name][cfg.name] = compare(a, b, acc, models[name, cfg.BK], cfg)
    total = sum(r["outputs"] for by_cfg in results.values() for r in by_cfg.values()) // len(CONFIGS)
    width = max(map(len, REGIONS))
    lines = [f"{'region':{width}}  " + "  ".join(f"{c.name:>22}" for c in CONFIGS)]
    for name in REGIONS:
        cells = []
        for cfg in CONFIGS:
            r = results[name][cfg.name]
            cell = f"{r['mismatches']}/{r['outputs']}"
            if r["nan_payload_only"]:
                cell += f" ({r['nan_payload_only']} NaN)"
            cells.append(f"{cell:>22}")
        lines.append(f"{name:{width}}  " + "  ".join(cells))
    nan_words = sorted(
        {w for by_cfg in results.values() for r in by_cfg.values() for w in r["gpu_nan_words"]}
    )
    lines.append(f"NaN words the GPU produced: {', '.join(nan_words) or 'none'}")
    print("\n" + "\n".join(lines))
    _merge_summary("random_regions", {"outputs_per_configuration": total, "nan_words_seen": nan_words,
                                      "regions": results})
    bad = {name: {c: r for c, r in by_cfg.items() if r["mismatches"]} for name, by_cfg in results.items()}
    bad = {name: v for name, v in bad.items() if v}
    assert not bad, json.dumps(bad, indent=1)[:20000]
    assert total >= 10**5, f"only {total} outputs per configuration"


@pytest.mark.parametrize("config", [None, *__import__("forge_num.kernels", fromlist=["BF16_CONFIGS"]).BF16_CONFIGS],
                         ids=str)
def test_t_vectors_through_forge_nums_own_mainloop(config):
    """The vectors through the project's own kernel: kernels.linear_mainloop computes
    dW = dYᵀ X starting from the accumulation buffer, so with dY[k, i] = a_i[k], X[k, j] = b_j[k]
    and accum[i, j] = c_i, output (i, j) is the instruction sequence of the fused kernel's mainloop
    on vector i's lanes (the same wgmma path, tl.trans of the dY tile, zero-filled K tail)."""
    from forge_num import kernels

    vectors, a, b, acc = _vector_problem()  # a [V, 16] (rows = vectors), b [16, V]
    dy = _bf16_tensor(a.T.copy())  # [K=16, M=V]: dY[k, i] = a_i[k]
    x = _bf16_tensor(b)  # [K=16, N=V]: X[k, j] = b_j[k]
    accum = torch.from_numpy(np.ascontiguousarray(acc)).cuda()
    got = kernels.linear_mainloop(x, dy, accum=accum, config=config).cpu().numpy().view(np.uint32)
    cfg_bk = (config or kernels.default_config(0, 0, 0, torch.bfloat16)).BK
    want = model_dot(a, b, acc, bk=cfg_bk)
    bad = [(v["id"], _hex(got[i, i]), _hex(want[i, i])) for i, v in enumerate(vectors) if got[i, i] != want[i, i]]
    assert not bad, f"vectors where the project's kernel and the model differ (id, gpu, model): {bad}"
    assert np.array_equal(got, want), "an off-diagonal output differs"
