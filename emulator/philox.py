"""The project's random stream: Triton's Philox4x32-10, replayed in NumPy, and its key derivation.

Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC 2011; Random123's ``philox4x32_10``) exactly as Triton 3.6's ``tl.randint4x(seed, offset)``
computes it (``python/triton/language/random.py``; read from the installed triton 3.6.0):

    key      (k0, k1) = (seed64 & 0xFFFFFFFF, seed64 >> 32),   seed64 = seed as uint64
                        (a signed seed is sign-extended, i.e. taken mod 2^64)
    counter  (c0, c1, c2, c3) = (offset_lo32, offset_hi32, 0, 0)
                        offset_hi32 = (offset >> 32) mod 2^32 for a 64-bit offset, 0 for a 32-bit one
    round    (all words uint32, arithmetic mod 2^32; umulhi = high 32 bits of the 64-bit product)
             c0' = umulhi(B, c2) ^ c1 ^ k0          A = 0xD2511F53 (ROUND_A)
             c2' = umulhi(A, c0) ^ c3 ^ k1          B = 0xCD9E8D57 (ROUND_B)
             c1' = B * c2
             c3' = A * c0
             then k0 += 0x9E3779B9, k1 += 0xBB67AE85 (Weyl key bump, after the round)
    output   (c0, c1, c2, c3) after 10 rounds, in that order (Random123's output order)

``tl.randint`` is word c0. The multiplications are done on uint64 arrays: a product of two
32-bit words is below 2^64, so ``p >> 32`` is umulhi and ``p & 0xFFFFFFFF`` the low product,
exactly. tests/test_emulator_random.py holds the Random123 and Triton known-answer vectors and
tests/test_interpreter_rounding.py holds this module against ``tl.randint4x`` bit for bit.

Which 16- or 24-bit slice of which word rounds which stored value is the *random-slice table*; it
is defined once, in ``rounding_bits`` and ``q8_rounding_bits`` below (the Triton twins in
kernels/random.py have the same tables). Every element has a Philox counter n (``CounterMap``:
its flat row-major index in the whole, unsharded parameter, as int64); seed = derive_seed(user
seed, step, parameter id).

bf16-sr regime: one call ``randint4x(seed, n)`` an element, 48 of its 128 bits used:

     word  bits     name      rounds                                         random input
     ----  -------  --------  ---------------------------------------------  -----------------
     c0    15..0    r_p       the weight p, fp32 -> bf16 (SR)                 16 bits
     c0    31..16   r_m16     m, fp32 -> bf16 (SR)                            16 bits
     c1    15..0    r_v16     v, fp32 -> bf16 (SR)                            16 bits
     c1    31..16   -         reserved (a third bf16 state, e.g. AMSGrad's max v)
     c2, c3         -         unused

8bit regime: one call ``randint4x(seed, n >> 1)`` a *pair* of elements (counters 2k and 2k + 1
share call k), each element 64 of its 128 bits: the words (a, b) = (c0, c1) for the even counter,
(c2, c3) for the odd one (``q8_slices``):

     word  bits     name      rounds                                         random input
     ----  -------  --------  ---------------------------------------------  -----------------
     a     15..0    r_p       the weight p, fp32 -> bf16 (SR)                 16 bits
     b     31..8    r_m24     m, fp32 -> 8-bit code (SR)                      24 bits
     a     31..16   r_v24     v, fp32 -> 8-bit code (SR): bits 23..8          24 bits
     b     7..0               and bits 7..0

       a: |31   r_v24 23..8   16|15       r_p        0|
       b: |31             r_m24             8|7 r_v24 0|

Why pairs (bench/NOTES.md, session 32): the 8bit epilogue is bound by its instructions, Philox's
ten rounds were ~44 of its ~280 an element, and the regime uses 64 bits an element; one call a pair
halves them. Kernels whose threads hold both elements of a pair (the Gluon 8bit tiles, where a row
base R(r) row_stride + base is even) compute each call once; the others compute it for each
element and keep their half (the same bits either way).

Every stored value of one element in one step has its own bits, so the roundings of p, m and v
are independent of each other; distinct elements have distinct counters (8bit: distinct (call,
half) pairs: disjoint bits of one call, or distinct calls) and distinct steps or parameters have
distinct keys (see ``derive_seed``), so no two roundings share random bits.

Key derivation (``derive_seed``), run on the host for the kernels and the emulator alike:

    mix64(z):  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9      (mod 2^64)
               z = (z ^ (z >> 27)) * 0x94D049BB133111EB      (mod 2^64)
               return z ^ (z >> 31)
    h0 = 0x666F7267656E756D                     (ASCII "forgenum": a domain tag)
    h1 = mix64(((h0 ^ user_seed) + G) mod 2^64)  G = 0x9E3779B97F4A7C15 (SplitMix64's gamma)
    h2 = mix64(((h1 ^ step)      + G) mod 2^64)
    h3 = mix64(((h2 ^ param_id)  + G) mod 2^64)  ->  seed = h3  (a 64-bit value)

mix64 is SplitMix64's output function (Steele, Lea, Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014; Stafford's "Mix13" constants). Each step is a bijection of 64-bit words
(xor with a constant, adding a constant, ``z ^ (z >> s)`` with s >= 1, multiplication by an odd
constant), so for any two of the three arguments fixed the seed is an *injective* function of the
third: two parameters of one step, or two steps of one parameter, never share a key. Across
arguments a collision needs two 64-bit outputs of a well-mixed function to coincide (about
n^2 / 2^65 for n keys). The seed may exceed 2^63; Triton passes such a Python int as uint64 and
``seed.to(tl.uint64)`` keeps its bits.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import numpy as np

__all__ = [
    "PHILOX_ROUND_A",
    "PHILOX_ROUND_B",
    "PHILOX_KEY_A",
    "PHILOX_KEY_B",
    "N_ROUNDS_DEFAULT",
    "philox",
    "randint4x",
    "randint",
    "rounding_bits",
    "q8_rounding_bits",
    "q8_slices",
    "mix64",
    "derive_seed",
    "CounterMap",
    "check_counter_rows",
    "STREAM_REVISION",
]

# The random stream's revision, written into optimizer checkpoints (forge_num.optim): 1, the 8bit regime one
# call an element (to session 31); 2, one call a pair of elements (the 8bit table above, session 32). A run
# resumed from a checkpoint of another revision trains on, with other (equally valid) random bits than the
# version that wrote it would have drawn; the optimizer warns.
STREAM_REVISION = 2

PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
N_ROUNDS_DEFAULT = 10

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


def philox(seed, c0, c1, c2, c3, n_rounds: int = N_ROUNDS_DEFAULT):
    """Philox4x32 on counter words ``c0..c3`` (uint32 arrays, broadcast) under the 64-bit ``seed``.

    As Triton's ``tl.philox`` with 32-bit counters: key = (seed64 mod 2^32, seed64 >> 32).
    Returns four uint32 arrays.
    """
    seed64 = operator.index(seed) & _M64
    k0, k1 = seed64 & _M32, seed64 >> 32
    c = [np.asarray(w).astype(np.uint64) & np.uint64(_M32) for w in (c0, c1, c2, c3)]
    c0, c1, c2, c3 = np.broadcast_arrays(*c)
    a = np.uint64(PHILOX_ROUND_A)
    b = np.uint64(PHILOX_ROUND_B)
    m32 = np.uint64(_M32)
    s32 = np.uint64(32)
    for _ in range(n_rounds):
        pa = a * c0  # A * c0, exact in 64 bits
        pb = b * c2  # B * c2
        c0, c1, c2, c3 = (
            (pb >> s32) ^ c1 ^ np.uint64(k0),
            pb & m32,
            (pa >> s32) ^ c3 ^ np.uint64(k1),
            pa & m32,
        )
        k0 = (k0 + PHILOX_KEY_A) & _M32
        k1 = (k1 + PHILOX_KEY_B) & _M32
    return tuple(w.astype(np.uint32) for w in (c0, c1, c2, c3))


def _offset_words(offset):
    """(offset_lo32, offset_hi32) as ``tl.randint4x`` forms them from an integer offset block."""
    off = np.asarray(offset)
    if off.dtype.kind not in "iu":
        raise TypeError(f"offsets must be integers, got {off.dtype}")
    if off.dtype.itemsize > 4:
        lo = (off & 0xFFFFFFFF).astype(np.uint32)
        hi = ((off >> 32) & 0xFFFFFFFF).astype(np.uint32)  # arithmetic shift for int64, as Triton
    else:
        lo = off.astype(np.uint32)  # an int32 offset is reinterpreted as uint32
        hi = np.zeros_like(lo)
    return lo, hi


def randint4x(seed, offset, n_rounds: int = N_ROUNDS_DEFAULT):
    """Four uint32 words per offset, bit for bit ``tl.randint4x(seed, offset, n_rounds)``.

    ``offset``: an integer array (or int); a Python int or int list becomes int64, so offsets of
    2^32 and more use the high counter word exactly as a Triton int64 offset does.
    """
    lo, hi = _offset_words(offset)
    zero = np.zeros_like(lo)
    return philox(seed, lo, hi, zero, zero, n_rounds)


def randint(seed, offset, n_rounds: int = N_ROUNDS_DEFAULT):
    """Word c0 of ``randint4x``, as ``tl.randint``."""
    return randint4x(seed, offset, n_rounds)[0]


def rounding_bits(seed, offset):
    """The bf16-sr regime's random-slice table (module docstring): ``(r_p, r_m16, r_v16)``, uint32
    in [0, 2^16), each feeding ``bf16_sr_bits``, from one call an element."""
    c0, c1, _, _ = randint4x(seed, offset)
    return c0 & np.uint32(0xFFFF), c0 >> np.uint32(16), c1 & np.uint32(0xFFFF)


def q8_slices(a, b):
    """The 8bit regime's slices of an element's two words (a, b): ``(r_p, r_m24, r_v24)``, uint32;
    r_p in [0, 2^16) feeds ``bf16_sr_bits``, r_m24 and r_v24 in [0, 2^24) ``quantize_block_sr``."""
    a = np.asarray(a, np.uint32)
    b = np.asarray(b, np.uint32)
    r_p = a & np.uint32(0xFFFF)
    r_m24 = b >> np.uint32(8)
    r_v24 = ((a >> np.uint32(16)) << np.uint32(8)) | (b & np.uint32(0xFF))
    return r_p, r_m24, r_v24


def q8_rounding_bits(seed, offset):
    """The 8bit regime's random-slice table (module docstring): ``(r_p, r_m24, r_v24)`` of the
    elements with counters ``offset`` (integers >= 0): call ``randint4x(seed, offset >> 1)``, words
    (c0, c1) for an even counter and (c2, c3) for an odd one, sliced by ``q8_slices``."""
    off = np.asarray(offset)
    if off.dtype.kind not in "iu":
        raise TypeError(f"offsets must be integers, got {off.dtype}")
    off = off.astype(np.int64)
    if np.any(off < 0):
        raise ValueError("8bit counters must be >= 0")
    c0, c1, c2, c3 = randint4x(seed, off >> 1)
    odd = (off & 1).astype(bool)
    return q8_slices(np.where(odd, c2, c0), np.where(odd, c3, c1))


# ---------------------------------------------------------------------------------------------
# key derivation (host side, standard library only)

_DOMAIN = 0x666F7267656E756D  # b"forgenum"
_GAMMA = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's output function: a bijection of 64-bit words."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _u64(name: str, value) -> int:
    v = operator.index(value)
    if isinstance(value, bool) or not 0 <= v <= _M64:
        raise ValueError(f"{name} must be an integer in [0, 2^64), got {value!r}")
    return v


def derive_seed(user_seed: int, step: int, param_id: int) -> int:
    """The Philox key (a 64-bit int) of one parameter in one step (formula in the module docstring).

    Injective in each argument when the other two are fixed. All three must lie in [0, 2^64).
    """
    return derive_seed_of_param(step_key(user_seed, step), param_id)


def step_key(user_seed: int, step: int) -> int:
    """The chain of ``derive_seed`` through the user seed and the step: what every parameter's key
    of one step shares (an optimizer computes it once a step, then one link a parameter)."""
    h = _DOMAIN
    for name, w in (("user_seed", user_seed), ("step", step)):
        h = mix64(((h ^ _u64(name, w)) + _GAMMA) & _M64)
    return h


def derive_seed_of_param(step_key_: int, param_id: int) -> int:
    """``derive_seed``'s last link: the key of parameter ``param_id`` from its step's ``step_key``."""
    return mix64(((step_key_ ^ _u64("param_id", param_id)) + _GAMMA) & _M64)


def check_counter_rows(rows, n_rows: int) -> None:
    """The gathered rows of a counter map, checked alike by every backend: a 1-D int64 array or tensor
    (NumPy or torch, duck-typed: this module does not import torch) of one entry per row. Where the
    values are read (the emulator, the torch backend) they must be >= 0 too; the Triton kernels do
    not read them on the host (that would wait for the device) and check their device instead."""
    dtype, shape = str(getattr(rows, "dtype", type(rows).__name__)), tuple(getattr(rows, "shape", ()))
    if dtype.removeprefix("torch.") != "int64" or len(shape) != 1:
        raise TypeError(f"counter rows must be a 1-D int64 array or tensor, got {dtype} of shape {shape}")
    if shape[0] != n_rows:
        raise ValueError(f"counter rows has {shape[0]} entries, the tensor has {n_rows} rows")


class CounterMap(NamedTuple):
    """Which Philox counter each element of a stored tensor draws: the element at row r, column c of
    the tensor seen as [rows, cols] (row-major) gets ``R(r) * row_stride + c + base``, where R(r) = r,
    or ``rows[r]`` for a tensor of gathered rows.

    A whole parameter is ``CounterMap(cols, cols, 0)`` (or ``identity(cols)``): the counter is the
    element's flat index. A shard of a parameter [R, C] (any tensor, seen as [R, C] over its last
    dimension) draws the counters of its elements in the whole parameter, so that the bits do not
    depend on how it is sharded (proofs/distributed.md §6): rows [r0, r1) give
    ``CounterMap(C, C, r0 * C)``; columns [c0, c1) give ``CounterMap(c1 - c0, C, c0)``. Rows gathered
    from a parameter [R, C] (a tied head's rows touched by a batch, updated apart from the others:
    forge_num.fused) give ``CounterMap(C, C, 0, rows)`` with ``rows`` their row indices in it, so a
    row draws the same bits gathered or in place.
    """

    cols: int
    row_stride: int
    base: int
    rows: "np.ndarray | None" = None  # int64 [numel / cols]: row r is row rows[r] of the parameter

    @staticmethod
    def identity(cols: int) -> "CounterMap":
        return CounterMap(max(int(cols), 1), max(int(cols), 1), 0)

    @staticmethod
    def of(counter, numel: int, cols: int | None = None) -> "CounterMap":
        """``counter`` (cols, row_stride, base) or (cols, row_stride, base, rows) checked for a tensor
        of ``numel`` elements (and, where given, rows of ``cols`` elements: a linear weight's N); None:
        the flat index. ``rows``: a 1-D integer array (or tensor) of numel / cols entries >= 0."""
        if counter is None:
            return CounterMap.identity(cols if cols is not None else numel)
        try:
            c, stride, base = (operator.index(v) for v in counter[:3])
            if len(counter) not in (3, 4):
                raise TypeError
        except TypeError:
            raise TypeError(f"counter must be (cols, row_stride, base) integers, optionally with rows, got "
                            f"{counter!r}") from None
        if c < 1 or stride < c or base < 0:
            raise ValueError(f"counter needs cols >= 1, row_stride >= cols, base >= 0, got {counter!r}")
        if cols is not None and c != max(cols, 1):
            raise ValueError(f"a linear weight's counter map has cols = N = {cols}, got {counter!r}")
        if numel % c:
            raise ValueError(f"counter cols = {c} does not divide the tensor's {numel} elements")
        rows = counter[3] if len(counter) == 4 else None
        if rows is not None:
            check_counter_rows(rows, numel // c)
            rows = np.asarray(rows.cpu() if hasattr(rows, "cpu") else rows)  # a torch tensor, on any device
            if rows.size and rows.min() < 0:
                raise ValueError("counter rows must be >= 0")
        return CounterMap(c, stride, base, rows)

    def _row_ids(self, r):
        """R(r): the rows' indices in the parameter (0 for rows past the tensor's end: padding)."""
        r = np.asarray(r, dtype=np.int64)
        if self.rows is None:
            return r
        inside = r < self.rows.shape[0]
        return np.where(inside, self.rows[np.where(inside, r, 0)] if self.rows.size else 0, 0)

    def of_flat(self, flat):
        """The counters of flat (row-major) indices into the tensor seen as [rows, cols]."""
        flat = np.asarray(flat, dtype=np.int64)
        return self._row_ids(flat // self.cols) * self.row_stride + flat % self.cols + self.base

    def of_tile(self, offs_m, offs_n):
        """The counters of the tile rows offs_m x columns offs_n of a [rows, cols] tensor."""
        return (self._row_ids(offs_m)[:, None] * self.row_stride
                + np.asarray(offs_n, np.int64)[None, :] + self.base)
