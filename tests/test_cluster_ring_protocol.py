"""The two-CTA operand ring of bench/pair_tile.py (and bench/multicast_mainloop.py), modelled on the CPU, as
tests/test_ring_protocol.py models the one-CTA rings: a model of the kernel's loops and barrier formulas, run
over random interleavings of the two CTAs' warps and of the TMA transfers' landings. run_quad models the 2x2
cluster's ring the same way (its docstring; proofs/ring_protocol.md, Lemma 4).

What the model holds (pair_tile.pair_mma, load_and_advance, multiply_block):

* each CTA c has its own ready[s] (expect 24 KB: its dY half by its own copy, x's block by the lead's multicast,
  which lands in the two CTAs at independent times, each landing counted on that CTA's ready[s]);
* released[s] lives in the lead (CTA 0); each CTA's MMA warps arrive there once block i's wgmma retired (after
  issuing block i + 1's); the lead waits for phase j // STAGES - 1 before it loads use j (j >= STAGES) into
  slot j % STAGES, its dY half and x's multicast; the other CTA does not wait (Gluon predicates a two-CTA
  barrier's wait to the lead) and refills its own dY half in program order, after its own wgmma retired;
* ``released_count``: the arrivals that complete a phase of released[s]. Gluon 3.9's `mbarrier.init(bar,
  count)` on a two_ctas barrier writes count x 2 into the PTX (count per CTA); session 42's first call passed
  count=2 (4 in the PTX) and hung at the first slot reuse, as the model does with released_count=4.

Checked at every step: a parity wait passes for the phase the caller meant (Lemma 1 of proofs/ring_protocol.md),
a wgmma reads slots holding its use in both operands, no landing writes a slot under an unretired wgmma of that
CTA, no barrier gets more arrivals than its count, and the run ends. proofs/ring_protocol.md ("The pair's ring
across two CTAs") gives the argument.
"""

from __future__ import annotations

import random

import pytest

from tests.test_ring_protocol import Barrier, interleave, wait

LEAD = 0


class ClusterRing:
    """What every CTA of a cluster model holds (its ready[s], which use each slot's dY and x parts hold, the slots
    its issued, unretired wgmma reads) and does: its MMA warps' loop (``mma``) and a TMA transfer's landing
    (``land``). The cluster's own part is ``load(c, j)`` (waits, expect, copies) and ``release(c, s)`` (a CTA's
    arrivals once its wgmma on slot s retired), passed in."""

    def __init__(self, n_ctas: int, tiles: int, nk: int, stages: int, rng, errors: list):
        self.tiles, self.nk, self.stages, self.rng, self.errors = tiles, nk, stages, rng, errors
        self.ready = [[Barrier(f"ready[{c}][{s}]") for s in range(stages)] for c in range(n_ctas)]
        self.dy_slot = [[None] * stages for _ in range(n_ctas)]  # the use whose dY part a CTA's slot holds
        self.x_slot = [[None] * stages for _ in range(n_ctas)]
        self.reading: list = [{} for _ in range(n_ctas)]  # per CTA: slot -> the use its unretired wgmma reads
        self.in_flight: list = []  # (cta, contents, slot, use, barrier)

    def mma(self, c: int, load, release, release_ahead: bool = False):
        """CTA c's MMA warps: STAGES - 1 loads ahead, then per use i the wait on ready, the wgmma, the release of
        use i - 1's slot once warpgroup_mma_wait(1) retired it (release_ahead: use i's, at its issue), the next
        load; warpgroup_mma_wait(0) and the hand-over between tiles."""
        who, stages, uses = f"CTA {c} MMA", self.stages, self.tiles * self.nk
        loaded = 0
        for _ in range(stages - 1):
            if loaded < uses:
                yield from load(c, loaded)
            loaded += 1
        i = 0
        for _t in range(self.tiles):
            for _kb in range(self.nk):
                s = i % stages
                yield from wait(self.ready[c][s], i // stages, self.errors, who)
                if self.dy_slot[c][s] != i or self.x_slot[c][s] != i:
                    self.errors.append(f"{who}: use {i} read slot {s} holding dY {self.dy_slot[c][s]}, "
                                       f"x {self.x_slot[c][s]}")
                self.reading[c][s] = i  # the wgmma, issued
                if release_ahead:
                    release(c, s)
                yield
                if i > 0:  # warpgroup_mma_wait(1): use i - 1's wgmma retired
                    self.reading[c].pop((i - 1) % stages, None)
                    if not release_ahead:
                        release(c, (i - 1) % stages)
                if loaded < uses:
                    yield from load(c, loaded)
                loaded += 1
                i += 1
                yield
            self.reading[c].clear()  # warpgroup_mma_wait(0) before the hand-over
            for _ in range(self.rng.randint(0, 3)):  # hand_over's wait on the epilogue
                yield

    def land(self, transfer):
        """A TMA transfer lands: in its CTA's slot (an error under that CTA's unretired wgmma), counted on its
        ready barrier."""
        c, contents, s, use, bar = transfer
        if s in self.reading[c]:
            self.errors.append(f"TMA: use {use} landed in CTA {c}'s slot {s} under use {self.reading[c][s]}'s wgmma")
        contents[c][s] = use
        bar.land(1)

    def run(self, mmas, steps: int) -> list:
        return interleave(self.rng, mmas, self.in_flight, self.land, self.errors, steps)


def run_pair(tiles: int, nk: int, stages: int, seed: int, released_count: int = 2, lead_waits: bool = True,
             follower_waits: bool = False, follower_arrives: bool = True, release_ahead: bool = False,
             multicast: bool = True, shared_release: bool = True) -> list:
    """One random interleaving of one cluster's MMA warps (both CTAs) over ``tiles`` cluster tiles of ``nk`` K
    blocks; returns the errors found. The mutations: released_count (4: session 42's count=2), lead_waits
    (False: the lead refills without both releases), follower_waits (True: the other CTA also waits, at a local
    barrier its own warps arrive at unless follower_arrives is False: a release routed to the lead only, waited
    for locally), release_ahead (a CTA releases block i as soon as it issued it, before its
    wgmma retired). multicast=False: the plain twin (each CTA copies x's block for itself), with
    shared_release the lead's released[s] kept (session 44's hang: nothing holds CTA 1 back, so its arrivals
    run ahead into phases of uses the lead has not issued), without it no release at all (each CTA's refills
    ordered by its own wgmma's retirement, as in one CTA)."""
    errors: list = []
    ring = ClusterRing(2, tiles, nk, stages, random.Random(seed), errors)
    released = [Barrier(f"released[{s}]", count=released_count) for s in range(stages)]
    own_released = [Barrier(f"released[{s}] of CTA 1", count=1) for s in range(stages)]  # follower_waits only

    def load(c: int, j: int):
        """load_and_advance for use j in CTA c: the lead's wait on released, then expect and the copies."""
        s = j % stages
        if j >= stages and shared_release:
            if c == LEAD and lead_waits:
                yield from wait(released[s], j // stages - 1, errors, f"CTA {c} load {j}")
            if c != LEAD and follower_waits:
                yield from wait(own_released[s], j // stages - 1, errors, f"CTA {c} load {j}")
        ring.ready[c][s].arrive(errors, tx=2)  # expect(dY's 8 KB + x's 16 KB): two transfers
        ring.in_flight.append((c, ring.dy_slot, s, j, ring.ready[c][s]))
        if not multicast:  # the plain twin: each CTA's own copy of x's block
            ring.in_flight.append((c, ring.x_slot, s, j, ring.ready[c][s]))
        elif c == LEAD:  # the multicast: one copy from the lead lands in both CTAs
            for d in (0, 1):
                ring.in_flight.append((d, ring.x_slot, s, j, ring.ready[d][s]))

    def release(c: int, s: int):  # the slot released to the lead (and, follower_waits, to CTA 1's own copy)
        if not shared_release:
            return
        released[s].arrive(errors)
        if c != LEAD and follower_arrives and not release_ahead:
            own_released[s].arrive(errors)

    return ring.run([ring.mma(c, load, release, release_ahead) for c in (0, 1)], 200_000)


SHAPES = [(tiles, nk, stages) for tiles in (1, 2, 3, 5) for nk, stages in ((1, 2), (2, 4), (4, 4), (8, 4), (5, 3),
                                                                          (16, 6))]


def test_the_pair_ring_is_sound_in_every_interleaving_tried():
    for tiles, nk, stages in SHAPES:
        for seed in range(10):
            errors = run_pair(tiles, nk, stages, seed)
            assert not errors, (tiles, nk, stages, seed, errors[:3])


@pytest.mark.parametrize("nk,stages", [(8, 4), (5, 3)])
def test_a_release_count_per_cta_doubled_hangs_at_the_first_reuse(nk, stages):
    """Session 42's hang: init(count=2) on a two_ctas barrier is 4 arrivals in the PTX; with two a phase the
    lead's first wait for a reused slot never passes. Up to STAGES blocks no slot is reused and the run ends
    (the first call's bits were right up to K = 256, four blocks of four stages)."""
    assert run_pair(1, nk, stages, seed=0, released_count=4) == ["hang: the run did not end"]
    assert run_pair(1, stages, stages, seed=0, released_count=4) == []


def test_the_model_sees_a_lead_that_refills_without_both_releases():
    found = [run_pair(2, 8, 4, seed, lead_waits=False) for seed in range(30)]
    assert sum(bool(e) for e in found) >= 5
    assert any("under use" in m for e in found for m in e)


def test_the_model_sees_a_release_before_the_wgmma_retired():
    found = [run_pair(2, 8, 4, seed, release_ahead=True) for seed in range(30)]
    assert sum(bool(e) for e in found) >= 5


def test_a_follower_waiting_at_its_own_copy_of_the_barrier_is_sound_only_with_its_own_arrivals():
    """Not vacuous on the follower's side: its refills are ordered by its own wgmma's retirement alone; a wait on
    a barrier only its own warps arrive at changes nothing (sound), and the same barrier left without arrivals
    hangs (the release routed to the lead only, waited on locally)."""
    assert not any(run_pair(2, 8, 4, seed, follower_waits=True) for seed in range(10))
    assert run_pair(2, 8, 4, 0, follower_waits=True, follower_arrives=False) == ["hang: the run did not end"]


def test_the_plain_twin_with_the_leads_release_goes_wrong_and_without_it_is_sound():
    """Session 44's hang on the H100 (bench/pair_tile.py's plain twin, first run with several cluster tiles a
    program): without the multicast nothing holds CTA 1 back, so its arrivals at the lead's released[s] for use
    u + R can come before the lead's for use u, and the lead's parity waits pass for the wrong phase or never.
    Lemma 3's step "phase n + 1 needs arrivals for use u, whose copies the lead has not issued" holds only when
    the lead issues CTA 1's x. Without the shared release each CTA is a one-CTA ring (Lemma 2)."""
    for tiles, nk, stages in SHAPES:
        for seed in range(10):
            errors = run_pair(tiles, nk, stages, seed, multicast=False, shared_release=False)
            assert not errors, (tiles, nk, stages, seed, errors[:3])
    found = [run_pair(5, 16, 4, seed, multicast=False) for seed in range(40)]
    assert sum(bool(e) for e in found) >= 5, found


def run_quad(tiles: int, nk: int, stages: int, seed: int, released_count: int = 2, roles: bool = True) -> list:
    """The 2x2 cluster's ring (bench/quad_mainloop.py's mma_partition), one random interleaving of
    its four CTAs' MMA warps; returns the errors found. Rank bit 0 picks the CTA's row half (its dY half), bit 1 its
    column half (its x half): dY's half is shared by the CTAs differing in bit 1 and issued by the one with bit 1
    clear, x's half by those differing in bit 0 and issued by the one with bit 0 clear (the multicast lowering's
    lowest rank). Each CTA expects its two halves on its own ready[s]; once block i's wgmma retired it releases the
    slot twice, at dY's issuer's dy_released[s] and at x's issuer's x_released[s] (ordinary barriers: the count is
    literal, two CTAs arrive at each); an issuer waits for its barrier's phase before refilling the slot.
    Mutations: released_count (1: an issuer refills once the first of its two sharers released), roles (False:
    every CTA waits on both of its own release barriers, where only an issuer's get arrivals)."""
    errors: list = []
    ring = ClusterRing(4, tiles, nk, stages, random.Random(seed), errors)
    dy_released = [[Barrier(f"dy_released[{c}][{s}]", count=released_count) for s in range(stages)] for c in range(4)]
    x_released = [[Barrier(f"x_released[{c}][{s}]", count=released_count) for s in range(stages)] for c in range(4)]

    def issues_dy(c: int) -> bool:
        return not c & 2

    def issues_x(c: int) -> bool:
        return not c & 1

    def load(c: int, j: int):
        s = j % stages
        if j >= stages:
            if issues_dy(c) or not roles:
                yield from wait(dy_released[c][s], j // stages - 1, errors, f"CTA {c} load {j} (dY)")
            if issues_x(c) or not roles:
                yield from wait(x_released[c][s], j // stages - 1, errors, f"CTA {c} load {j} (x)")
        ring.ready[c][s].arrive(errors, tx=2)  # expect(its dY half's 8 KB + its x half's 16 KB): two transfers
        if issues_dy(c):
            for d in (c, c | 2):
                ring.in_flight.append((d, ring.dy_slot, s, j, ring.ready[d][s]))
        if issues_x(c):
            for d in (c, c | 1):
                ring.in_flight.append((d, ring.x_slot, s, j, ring.ready[d][s]))

    def release(c: int, s: int):  # to both issuers
        dy_released[c & ~2][s].arrive(errors)
        x_released[c & ~1][s].arrive(errors)

    return ring.run([ring.mma(c, load, release) for c in range(4)], 400_000)


QUAD_SHAPES = [(tiles, nk, stages) for tiles in (1, 2, 3) for nk, stages in ((1, 2), (4, 4), (8, 4), (5, 3), (12, 6))]


def test_the_2x2_ring_is_sound_in_every_interleaving_tried():
    for tiles, nk, stages in QUAD_SHAPES:
        for seed in range(8):
            errors = run_quad(tiles, nk, stages, seed)
            assert not errors, (tiles, nk, stages, seed, errors[:3])


def test_the_model_sees_a_2x2_issuer_that_refills_after_one_of_its_two_sharers():
    found = [run_quad(2, 8, 4, seed, released_count=1) for seed in range(30)]
    assert sum(bool(e) for e in found) >= 5
    assert any("under use" in m or "holding" in m or "beyond its count" in m for e in found for m in e)


def test_a_2x2_cta_waiting_at_release_barriers_it_does_not_hold_hangs():
    """Why the probe predicates its waits by the issuer's role: a CTA that issues neither operand (rank 3) gets no
    arrivals at its own release barriers, so its first wait for a reused slot never passes."""
    assert run_quad(1, 8, 4, 0, roles=False) == ["hang: the run did not end"]
    assert run_quad(1, 4, 4, 0, roles=False) == []  # no slot reused: no wait
