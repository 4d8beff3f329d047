"""The Gluon kernel's ring protocol (kernels/gluon_update.py), modelled on the CPU: TMA loaders fill an
operand ring and a state ring in tile order; consumers wait on the rings' mbarriers by phase parity,
as the kernel does, and hand slots back. A model, not the kernel: it mirrors the kernel's loops and
barrier formulas (the parities, which slot each use takes, when a slot is handed back) and checks,
over random interleavings of the warps and of the TMA completions:

* every parity wait that passes is for the phase that just completed (a parity test cannot tell
  phase n from n - 2, so a barrier more than one phase off is a wrong pass or a hang);
* every slot read holds the use it was waited for, and is not refilled while in use;
* no barrier is arrived on beyond its count in a phase (undefined in PTX), and the run ends.

The routed design (one consumer a program), the ping-pong design with its turn barriers and the 8bit
kernel's two designs (kernels/gluon_q8.py: the accumulator through two g buffers, its operands loaded
by a loader warp or by the MMA warps themselves) pass at 1-16 tiles a program; the ping-pong design without turns fails once a program has two tiles: the
fault session 12's first GPU run of it hit (pingpong_consumer's docstring), which its GPU tests, one
tile a program at most, had not. proofs/ring_protocol.md states the argument these runs check.
"""

from __future__ import annotations

import random

import pytest


class Barrier:
    """An mbarrier: ``count`` arrivals (and all expected TMA bytes) complete a phase; ``completed``
    counts completed phases. try_wait.parity(p) passes iff the current phase's parity is not p."""

    def __init__(self, name: str, count: int = 1):
        self.name, self.count, self.pending, self.tx, self.completed = name, count, count, 0, 0

    def arrive(self, errors: list, tx: int = 0):
        self.tx += tx
        self.pending -= 1
        if self.pending < 0:
            errors.append(f"{self.name}: arrived on beyond its count")
        self._complete()

    def land(self, tx: int):  # a TMA transfer of tx bytes counted against the barrier lands
        self.tx -= tx
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count


def wait(bar: Barrier, phase: int, errors: list, who: str):
    """The kernel's ``mbarrier.wait(bar, phase & 1)`` for phase index ``phase`` (-1: the phase before
    the first, complete on a fresh barrier). Spins until the parity test passes, then checks that it
    passed for the phase the caller meant."""
    while (bar.completed & 1) == (phase & 1):  # the parity test (phase -1's parity is 1)
        yield
    if bar.completed != phase + 1:
        errors.append(f"{who}: wait on {bar.name} for phase {phase} passed with {bar.completed} phases completed")


def run(design: str, tiles: int, nk: int, stages: int, slots: int, seed: int, subtiles: int = 4,
        g_buffers: int = 2, stage_state: bool = False, stage_ahead: int | None = None) -> list:
    """One random interleaving of one program's warps over ``tiles`` tiles of ``nk`` K blocks; returns
    the errors found (empty: the run was sound). design: "routed" (one consumer takes every tile),
    "pingpong" (two consumers on alternate tiles, sharing the rings, as written in session 11),
    "pingpong_turns" (the same with mma_turn and epi_turn, as the kernel has it now), "q8" and "q8_self"
    (the split design of gluon_q8.py, also gluon_f32.py's, with ``g_buffers`` g buffers; stage_state: its
    epilogue streaming each sub-tile's state through ``slots`` slots by copies it issues itself, each sub-tile's
    ``stage_ahead`` (the kernels': ``slots``) sub-tiles ahead)."""
    rng = random.Random(seed)
    errors: list = []
    op_ready = [Barrier(f"op_ready[{s}]") for s in range(stages)]
    op_empty = [Barrier(f"op_empty[{s}]") for s in range(stages)]
    st_ready = [Barrier(f"st_ready[{s}]") for s in range(slots)]
    st_empty = [Barrier(f"st_empty[{s}]") for s in range(slots)]
    mma_turn = [Barrier(f"mma_turn[{p}]") for p in range(2)]
    epi_turn = [Barrier(f"epi_turn[{p}]") for p in range(2)]
    op_slot, st_slot = [None] * stages, [None] * slots  # the use whose data a slot holds
    in_flight = []  # TMA loads: (ring contents, slot, use, barrier)

    def operand_loader():
        for i in range(tiles * nk):  # use i: K block i % nk of tile i // nk
            s = i % stages
            yield from wait(op_empty[s], i // stages - 1, errors, "operand loader")
            op_slot[s] = None  # being overwritten
            op_ready[s].arrive(errors, tx=1)  # expect + the copies
            in_flight.append((op_slot, s, i, op_ready[s]))
            yield

    def state_loader():
        for j in range(tiles * subtiles):
            s = j % slots
            yield from wait(st_empty[s], j // slots - 1, errors, "state loader")
            st_slot[s] = None
            st_ready[s].arrive(errors, tx=1)
            in_flight.append((st_slot, s, j, st_ready[s]))
            yield

    def mainloop(i: int, who: str):  # gluon_update.mainloop: slot i - 1 handed back once i's wgmma is issued
        first = i
        for _ in range(nk):
            s = i % stages
            yield from wait(op_ready[s], i // stages, errors, who)
            if op_slot[s] != i:
                errors.append(f"{who}: operand use {i} read slot {s} holding {op_slot[s]}")
            yield  # the wgmma reads the slot
            if op_slot[s] != i:
                errors.append(f"{who}: operand slot {s} refilled under use {i}'s wgmma")
            if i > first:
                op_empty[(i - 1) % stages].arrive(errors)
            i += 1
        yield  # warpgroup_mma_wait(0)
        op_empty[(i - 1) % stages].arrive(errors)

    def update(j: int, who: str):  # update_tile: each sub-tile's state read, then its slot handed back
        for _ in range(subtiles):
            s = j % slots
            yield from wait(st_ready[s], j // slots, errors, who)
            if st_slot[s] != j:
                errors.append(f"{who}: state use {j} read slot {s} holding {st_slot[s]}")
            st_empty[s].arrive(errors)
            for _ in range(rng.randint(1, 4)):  # the rule and the stores
                yield
            j += 1

    def consumer(parity: int, stride: int, turns: bool):
        who = f"consumer {parity}"
        for t, lt in enumerate(range(parity, tiles, stride)):
            if turns:  # pingpong_consumer: (t + PARITY + 1) & 1 is phase t - 1 + PARITY's parity
                yield from wait(mma_turn[parity], t - 1 + parity, errors, who)
            yield from mainloop(lt * nk, who)
            if turns:
                mma_turn[1 - parity].arrive(errors)
                yield from wait(epi_turn[parity], t - 1 + parity, errors, who)
            yield from update(lt * subtiles, who)
            if turns:
                epi_turn[1 - parity].arrive(errors)

    # -- the split design (kernels/gluon_q8.py, kernels/gluon_f32.py): the accumulator whole through G g buffers
    # to the epilogue warps; "q8" with the loader partition above, "q8_self" with the MMA warps loading
    G = g_buffers
    g_ready = [Barrier(f"g_ready[{b}]") for b in range(G)]
    g_empty = [Barrier(f"g_empty[{b}]") for b in range(G)]
    g_slot = [None] * G  # the tile whose accumulator a g buffer holds
    reading = {}  # operand slot -> the use an issued, not yet retired wgmma reads there

    def load(i: int):  # gluon_q8.load_k_block: use i's TMA loads, where its tile exists
        if i < tiles * nk:
            s = i % stages
            if s in reading:
                errors.append(f"MMA warps: load {i} into slot {s} under use {reading[s]}'s wgmma")
            op_slot[s] = None
            op_ready[s].arrive(errors, tx=1)
            in_flight.append((op_slot, s, i, op_ready[s]))

    def hand_over(t: int):  # mma_whole_tiles / mma_self_loaded_tiles: the accumulator into g buffer t % G
        b = t % G
        yield from wait(g_empty[b], t // G - 1, errors, "MMA warps")
        g_slot[b] = t
        g_ready[b].arrive(errors)

    def mma_whole_tiles():
        for t in range(tiles):
            yield from mainloop(t * nk, "MMA warps")
            yield from hand_over(t)

    def mma_self_loaded_tiles():
        for j in range(stages - 1):
            load(j)
        i = 0
        for t in range(tiles):
            for _ in range(nk):
                s = i % stages
                yield from wait(op_ready[s], i // stages, errors, "MMA warps")
                if op_slot[s] != i:
                    errors.append(f"MMA warps: operand use {i} read slot {s} holding {op_slot[s]}")
                reading[s] = i  # the wgmma, issued
                yield
                reading.pop((i - 1) % stages, None) if stages > 1 else None  # wait(1): use i - 1's retired
                load(i + stages - 1)
                i += 1
                yield
            reading.clear()  # wait(0)
            yield from hand_over(t)

    def stage(u: int):  # gluon_q8.stage_row_blocks: sub-tile u's copies into slot u % slots, counted on st_ready
        s = u % slots
        st_slot[s] = None
        st_ready[s].arrive(errors, tx=1)  # expect + the copies
        in_flight.append((st_slot, s, u, st_ready[s]))

    def q8_epilogue():
        # stage_state (q8_epilogue's STAGE_STATE, f32_epilogue's): the program's first ``slots`` sub-tiles
        # staged before the loop; sub-tile u + slots into u's slot once u's reads are done (past the program's
        # last tile: copies never read, waited for after the loop)
        ahead = slots if stage_ahead is None else stage_ahead
        if stage_state:
            for a in range(ahead):
                stage(a)
        u = 0
        for t in range(tiles):
            b = t % G
            yield from wait(g_ready[b], t // G, errors, "epilogue")
            for _ in range(subtiles):  # the row sub-tiles' reads of g (and of their staged state)
                if g_slot[b] != t:
                    errors.append(f"epilogue: tile {t} read g buffer {b} holding {g_slot[b]}")
                if stage_state:
                    s = u % slots
                    yield from wait(st_ready[s], u // slots, errors, "epilogue")
                    if st_slot[s] != u:
                        errors.append(f"epilogue: state use {u} read slot {s} holding {st_slot[s]}")
                    yield  # the reads
                    stage(u + ahead)
                u += 1
                yield
            g_empty[b].arrive(errors)
            for _ in range(rng.randint(1, 4)):  # the update
                yield
        if stage_state:
            for a in range(ahead):
                yield from wait(st_ready[(u + a) % slots], (u + a) // slots, errors, "epilogue")
            if any(contents is st_slot for contents, *_ in in_flight):
                errors.append("epilogue: a staged copy outlives the program")

    if design == "q8":
        agents = [operand_loader(), mma_whole_tiles(), q8_epilogue()]
    elif design == "q8_self":
        agents = [mma_self_loaded_tiles(), q8_epilogue()]
    elif design == "routed":
        agents = [operand_loader(), state_loader(), consumer(0, 1, False)]
    else:
        agents = [operand_loader(), state_loader()] + [consumer(p, 2, design == "pingpong_turns") for p in (0, 1)]

    def land(transfer):  # a TMA load lands
        contents, s, use, bar = transfer
        if contents is op_slot and s in reading:
            errors.append(f"TMA: use {use} landed in slot {s} under use {reading[s]}'s wgmma")
        contents[s] = use
        bar.land(1)

    return interleave(rng, agents, in_flight, land, errors, 100_000)


def interleave(rng, agents: list, in_flight: list, land, errors: list, steps: int) -> list:
    """One random interleaving: at each step a transfer of ``in_flight`` lands (``land(transfer)``; 3 steps in 10
    while agents remain) or an agent (a generator) runs to its next yield, until an error, the end of every agent
    and transfer, or ``steps`` steps; returns the errors, a hang appended if the run did not end."""
    for _ in range(steps):
        if errors or (not agents and not in_flight):
            return errors
        if in_flight and (not agents or rng.random() < 0.3):
            land(in_flight.pop(rng.randrange(len(in_flight))))
            continue
        agent = rng.choice(agents)
        try:
            next(agent)
        except StopIteration:
            agents.remove(agent)
    return errors + ["hang: the run did not end"]


SHAPES = [(tiles, nk, stages, slots) for tiles in (1, 2, 3, 4, 15, 16) for nk, stages in ((1, 2), (4, 4), (5, 3), (4, 2))
          for slots in (1, 2, 3)]


@pytest.mark.parametrize("design", ["routed", "pingpong_turns", "q8", "q8_self"])
def test_the_kernels_designs_are_sound_in_every_interleaving_tried(design):
    for tiles, nk, stages, slots in SHAPES:
        for seed in range(12):
            errors = run(design, tiles, nk, stages, slots, seed)
            assert not errors, (design, tiles, nk, stages, slots, seed, errors[:3])


@pytest.mark.parametrize("design", ["q8", "q8_self"])
def test_the_split_design_with_one_g_buffer_is_sound(design):
    """gluon_f32's one-buffer tiles (F32WSConfig(g_buffers=1)): the MMA warps hand tile t over once the
    epilogue has read tile t - 1's g (g_empty's phase t - 1), the epilogue waits g_ready's phase t."""
    for tiles, nk, stages, _ in SHAPES:
        for seed in range(12):
            errors = run(design, tiles, nk, stages, 1, seed, g_buffers=1)
            assert not errors, (design, tiles, nk, stages, seed, errors[:3])


@pytest.mark.parametrize("design", ["q8", "q8_self"])
@pytest.mark.parametrize("g_buffers", [1, 2])
def test_the_split_epilogue_streaming_its_state_is_sound(design, g_buffers):
    """gluon_f32's staged tiles (F32WSConfig(stage_slots=S), S = 2-3 here) and gluon_q8's stage_state: the
    epilogue waits for sub-tile u's copies (st_ready's phase u // S), reads them, then stages sub-tile u + S
    into the same slot; every read holds its use, and no copy outlives the program."""
    for tiles, nk, stages, slots in SHAPES:
        if slots < 2:
            continue
        for seed in range(12):
            errors = run(design, tiles, nk, stages, slots, seed, g_buffers=g_buffers, stage_state=True)
            assert not errors, (design, tiles, nk, stages, slots, seed, errors[:3])


def test_the_staged_epilogue_model_sees_a_wrong_distance():
    """Not vacuous: staging S + 1 sub-tiles ahead through S slots (a copy into the slot the next sub-tile is to
    read) is caught, S - 1 ahead is sound (one slot idle)."""
    found = [run("q8_self", tiles, 4, 3, 3, seed, stage_state=True, stage_ahead=4) for tiles in (2, 4)
             for seed in range(12)]
    assert sum(bool(e) for e in found) >= 6, found
    assert not any(run("q8_self", tiles, 4, 3, 3, seed, stage_state=True, stage_ahead=2) for tiles in (2, 4)
                   for seed in range(12))


def test_pingpong_without_turns_reads_unloaded_slots_from_two_tiles_a_program():
    """The model finds the fault the first GPU run met: one tile a program is sound (the GPU tests'
    shapes), two or more are not, in some interleavings."""
    for tiles in (1,):
        for seed in range(50):
            assert not run("pingpong", tiles, 4, 4, 2, seed)
    for tiles in (2, 4, 16):
        found = [run("pingpong", tiles, 4, 4, 2, seed) for seed in range(50)]
        assert sum(bool(e) for e in found) >= 10, tiles
        assert any("passed with" in m for e in found for m in e)


def test_the_8bit_kernels_self_loading_ring_needs_two_stages():
    """mma_self_loaded_tiles with one operand stage would wait for a block it has not loaded (its loads
    run STAGES - 1 ahead): the model hangs, as Q8WSConfig refuses STAGES=1. Not vacuous: the same run
    with two stages is sound."""
    assert run("q8_self", 2, 4, 1, 1, seed=0) == ["hang: the run did not end"]
    assert run("q8_self", 2, 4, 2, 1, seed=0) == []
