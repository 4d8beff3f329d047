"""emulator/philox.py: Philox4x32-10 as Triton's tl.randint4x, the random-slice table, derive_seed.

Known-answer vectors are copied from /work/shared/research/lowbit-and-rounding.md §3.2:

* Random123 KATs (``kat_vectors`` of Random123, ``philox4x32_10``): counter, key -> output.
* Triton ``randint4x(seed, offset)`` words (c0 c1 c2 c3), which that note produced with a
  pure-Python implementation that reproduces the Random123 KATs; the interpreter test
  (tests/test_interpreter_rounding.py) holds them against the installed Triton as well.
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge_num.emulator import philox

pytestmark = pytest.mark.emulator

M64 = 2**64 - 1


def _words(ws):
    return tuple(int(np.asarray(w).reshape(-1)[0]) for w in ws)


# Random123 philox4x32_10 KATs: (ctr c0..c3, key k0 k1, expected output)
RANDOM123_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF,) * 4,
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

# Triton randint4x(seed, offset) -> (c0, c1, c2, c3); offset 2^32+5 is an int64 offset
TRITON_KAT = [
    (0, 0, (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (0, 1, (0xF8E4CCA4, 0x5CB200DB, 0xB1A574EB, 0x097EFF67)),
    (0, 2, (0x04FAA329, 0x51C732A6, 0x241513AD, 0x459135E4)),
    (0, 3, (0xC990EF29, 0x6A4474A6, 0x9AC9134F, 0x6D413E04)),
    (42, 0, (0x9CEAF053, 0x77F5493B, 0x12BF50AD, 0x5742B3D7)),
    (42, 1, (0xFCDB2127, 0x53BA6CFD, 0x838F5A6E, 0x744E06FB)),
    (42, 2, (0xD36C0225, 0xA8875DCB, 0x9A4D6D99, 0xC609A559)),
    (42, 3, (0xBAC70475, 0xABAF0DAB, 0x961E5543, 0x610E67F7)),
    (42, 5, (0x5099D809, 0x4B20B5D2, 0x0D41B5E2, 0x0A653407)),
    (42, 2**32 + 5, (0x131A8A04, 0x494EFEE7, 0xE24F0E03, 0x5128A584)),
    (0xFFFFFFFF, 0, (0xF60BA7E1, 0xFB0BD7A0, 0xC70CBD2D, 0x7DAD399C)),
    (0x0000000FCAFEB0BA, 0, (0xF219FB5B, 0xBE9182A4, 0xF573A172, 0x3952307C)),
    (0x0000000FCAFEB0BA, 1, (0xEECED75E, 0x021EFE62, 0xA9C0C1A0, 0xCE25ABD8)),
]
TRITON_KAT_7_ROUNDS = (42, 0, (0x92CBC19A, 0xCA38A8E0, 0x3263F2B4, 0x0153AD48))


@pytest.mark.parametrize("ctr,key,expected", RANDOM123_KAT)
def test_random123_known_answers(ctr, key, expected):
    seed = key[0] | (key[1] << 32)
    assert _words(philox.philox(seed, *ctr)) == expected


@pytest.mark.parametrize("seed,offset,expected", TRITON_KAT)
def test_triton_randint4x_known_answers(seed, offset, expected):
    assert _words(philox.randint4x(seed, np.array([offset], dtype=np.int64))) == expected
    assert int(philox.randint(seed, np.array([offset], dtype=np.int64))[0]) == expected[0]


def test_triton_randint4x_seven_rounds():
    seed, offset, expected = TRITON_KAT_7_ROUNDS
    assert _words(philox.randint4x(seed, np.array([offset]), n_rounds=7)) == expected


def test_vectorised_equals_scalar_and_counter_layout():
    seed = 0x0000000FCAFEB0BA
    off = np.array([0, 1, 7, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 3, 2**63 - 1], dtype=np.int64)
    got = np.stack(philox.randint4x(seed, off))
    for i, o in enumerate(off.tolist()):
        ref = philox.philox(seed, o & 0xFFFFFFFF, o >> 32, 0, 0)  # counter (lo, hi, 0, 0)
        assert tuple(got[:, i].tolist()) == _words(ref)


def test_offset_width_rules():
    """int32 offsets: reinterpreted as uint32, high word 0; int64: (lo, hi) with an arithmetic shift."""
    seed = 42
    small = np.arange(0, 100, dtype=np.int32)
    assert all(
        np.array_equal(a, b) for a, b in zip(philox.randint4x(seed, small), philox.randint4x(seed, small.astype(np.int64)))
    )
    neg32 = philox.randint4x(seed, np.array([-1], dtype=np.int32))
    assert _words(neg32) == _words(philox.philox(seed, 0xFFFFFFFF, 0, 0, 0))
    neg64 = philox.randint4x(seed, np.array([-1], dtype=np.int64))
    assert _words(neg64) == _words(philox.philox(seed, 0xFFFFFFFF, 0xFFFFFFFF, 0, 0))
    with pytest.raises(TypeError):
        philox.randint4x(seed, np.array([0.5]))


def test_seed_is_taken_mod_2_64():
    """A negative seed is sign-extended to 64 bits, as Triton's int -> uint64 cast does."""
    off = np.arange(4)
    assert all(np.array_equal(a, b) for a, b in zip(philox.randint4x(-1, off), philox.randint4x(M64, off)))


def test_rounding_bits_table():
    """The bf16-sr slices are exactly the documented bit ranges of words c0, c1 of one call an
    element, and lie in range."""
    seed = philox.derive_seed(7, 3, 11)
    off = np.arange(5000, dtype=np.int64) + 2**32 - 2500
    c0, c1, _, _ = philox.randint4x(seed, off)
    r_p, r_m16, r_v16 = philox.rounding_bits(seed, off)
    assert np.array_equal(r_p, c0 & 0xFFFF) and np.array_equal(r_m16, c0 >> 16)
    assert np.array_equal(r_v16, c1 & 0xFFFF)
    for r, width in ((r_p, 16), (r_m16, 16), (r_v16, 16)):
        assert r.dtype == np.uint32 and int(r.max()) < 2**width
        # every slice uses its full width on 5000 draws (a wrong shift would leave top bits 0)
        assert int(r.max()) >= 2 ** (width - 1)


def test_q8_rounding_bits_table():
    """The 8bit slices: counters 2k and 2k + 1 share call k, the even one words (c0, c1), the odd one
    (c2, c3), each sliced as documented; an element's three slices are disjoint bits of its two
    words (together all 64 of them), so the two elements of a pair share no bit."""
    seed = philox.derive_seed(7, 3, 11)
    off = np.arange(5000, dtype=np.int64) + 2**33 - 2500  # both halves of every pair, across 2^32
    c0, c1, c2, c3 = philox.randint4x(seed, off >> 1)
    r_p, r_m24, r_v24 = philox.q8_rounding_bits(seed, off)
    odd = (off & 1) == 1
    a = np.where(odd, c2, c0)
    b = np.where(odd, c3, c1)
    assert np.array_equal(r_p, a & 0xFFFF) and np.array_equal(r_m24, b >> 8)
    assert np.array_equal(r_v24, ((a >> 16) << 8) | (b & 0xFF))
    # the slices, put back in place, give the two words whole: disjoint, and every bit used
    a_back = r_p | ((r_v24 >> 8) << 16)
    b_back = (r_m24 << 8) | (r_v24 & 0xFF)
    assert np.array_equal(a_back, a) and np.array_equal(b_back, b)
    # the even element of a pair reads the call's first two words, the odd one its last two
    words = [int(w) for w in philox.randint4x(seed, 3)]
    assert int(philox.q8_rounding_bits(seed, np.array([6]))[0][0]) == words[0] & 0xFFFF
    assert int(philox.q8_rounding_bits(seed, np.array([7]))[0][0]) == words[2] & 0xFFFF
    for r, width in ((r_p, 16), (r_m24, 24), (r_v24, 24)):
        assert r.dtype == np.uint32 and int(r.max()) < 2**width
        assert int(r.max()) >= 2 ** (width - 1)
    with pytest.raises(ValueError):
        philox.q8_rounding_bits(seed, np.array([-1]))
    with pytest.raises(TypeError):
        philox.q8_rounding_bits(seed, np.array([0.5]))


# ---------------------------------------------------------------------------------------------
# derive_seed


def _unmix64(z: int) -> int:
    """Inverse of SplitMix64's mix64 (xorshift inverses and modular inverses of the odd multipliers)."""

    def unxorshift(y, s):
        x = y
        for _ in range(64 // s + 1):
            x = y ^ (x >> s)
        return x & M64

    z = unxorshift(z, 31)
    z = (z * pow(0x94D049BB133111EB, -1, 2**64)) & M64
    z = unxorshift(z, 27)
    z = (z * pow(0xBF58476D1CE4E5B9, -1, 2**64)) & M64
    return unxorshift(z, 30)


@given(st.integers(0, M64))
def test_mix64_is_a_bijection(z):
    assert _unmix64(philox.mix64(z)) == z


def _derive_seed_reference(user_seed, step, param_id):
    """The formula of emulator/philox.py's docstring, transcribed independently."""
    g = 0x9E3779B97F4A7C15
    h = int.from_bytes(b"forgenum", "big")
    for w in (user_seed, step, param_id):
        z = ((h ^ w) + g) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        h = z ^ (z >> 31)
    return h


@given(st.integers(0, M64), st.integers(0, M64), st.integers(0, M64))
def test_derive_seed_matches_documented_formula(u, s, p):
    v = philox.derive_seed(u, s, p)
    assert v == _derive_seed_reference(u, s, p)
    assert 0 <= v <= M64


def test_derive_seed_pinned_values():
    """Pinned so the stream of a checkpointed run can never change silently."""
    assert philox.derive_seed(0, 0, 0) == 0x99A048BC91DE3958
    assert philox.derive_seed(42, 7, 3) == 0xCE70CC1A65351E9E
    assert philox.derive_seed(M64, M64, M64) == 0x768164D7EB529249


@given(st.integers(0, M64), st.integers(0, M64), st.integers(0, M64))
def test_derive_seed_injective_in_each_argument(u, s, p):
    """Undo the last absorption: param_id is recovered from the seed given (user_seed, step), so two
    parameters of one step never share a key; the same inversion one level up covers steps."""
    g = 0x9E3779B97F4A7C15
    h = int.from_bytes(b"forgenum", "big")
    h1 = philox.mix64(((h ^ u) + g) % 2**64)
    h2 = philox.mix64(((h1 ^ s) + g) % 2**64)
    seed = philox.derive_seed(u, s, p)
    assert ((_unmix64(seed) - g) % 2**64) ^ h2 == p
    assert ((_unmix64(h2) - g) % 2**64) ^ h1 == s


def test_derive_seed_no_collisions_on_a_training_grid():
    seeds = {philox.derive_seed(u, s, p) for u in (0, 1, 2**63) for s in range(300) for p in range(100)}
    assert len(seeds) == 3 * 300 * 100


@pytest.mark.parametrize("bad", [-1, 2**64, 1.0, True])
def test_derive_seed_rejects_out_of_range(bad):
    with pytest.raises((ValueError, TypeError)):
        philox.derive_seed(bad, 0, 0)
    with pytest.raises((ValueError, TypeError)):
        philox.derive_seed(0, bad, 0)
    with pytest.raises((ValueError, TypeError)):
        philox.derive_seed(0, 0, bad)
