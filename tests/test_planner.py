"""The planner's decisions (``engine/batched/planner.py``) with fake streams and fake stages: no
model, no tensors. A small simulated engine (``Sim``) runs the loop the batched engine runs
(admit per the planner, replay prefills of ``max_join`` rows, one frame step for every row,
deliver) on a virtual clock with fixed stage costs, and counts what clients would hear."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from wyoming_qwen3tts.engine.batched.planner import FRAME_MS, Planner, StreamClock


def test_buffered_audio_follows_playback_and_restarts_after_an_underrun() -> None:
    clock = StreamClock()
    assert clock.buffered_ms(10.0) is None
    clock.sent(5, 10.0)
    assert clock.buffered_ms(10.1) == pytest.approx(5 * FRAME_MS - 100)
    clock.sent(1, 10.2)  # queued behind the five
    assert clock.buffered_ms(10.2) == pytest.approx(6 * FRAME_MS - 200)
    assert clock.buffered_ms(11.0) == pytest.approx(-520)  # a client far behind: it ran out
    clock.sent(1, 11.0)  # a late chunk: playback restarts at its arrival
    assert clock.buffered_ms(11.0) == pytest.approx(FRAME_MS)


def ahead(ms: float, n: int = 4, now: float = 0.0) -> list[StreamClock]:
    return [StreamClock(now + ms / 1000) for _ in range(n)]


def test_nothing_running_admits_everything_that_fits() -> None:
    planner = Planner(max_join=8)
    assert planner.admissions(32, [], now=0.0) == 32
    assert planner.chunks(32) == [8, 8, 8, 8]
    assert planner.chunks(19) == [8, 8, 3]
    assert planner.admissions(0, [], now=0.0) == 0


def test_with_streams_running_a_step_admits_one_replay_unless_all_are_far_ahead() -> None:
    planner = Planner(max_join=8, guard_ms=40.0, join_ms=10.0, step_ms=25.0)
    assert planner.admissions(28, ahead(80), now=0.0) == 8  # 80 ms: room for one replay only
    assert planner.admissions(3, ahead(80), now=0.0) == 3
    assert planner.admissions(28, ahead(85), now=0.0) == 16  # two replays' worth of slack
    assert planner.admissions(32, ahead(2000), now=0.0) == 32  # far ahead: they yield the step
    waiting_first = [*ahead(2000), StreamClock()]  # a row still waiting for its first audio
    assert planner.admissions(32, waiting_first, now=0.0) == 8


def test_a_stream_about_to_starve_goes_first_but_not_forever() -> None:
    planner = Planner(max_join=8, guard_ms=40.0, max_defer=2)
    starving = [*ahead(2000, 1), StreamClock(0.03)]  # the second holds 30 ms of audio
    assert planner.admissions(10, starving, now=0.0) == 0
    assert planner.admissions(10, starving, now=0.0) == 0
    assert planner.admissions(10, starving, now=0.0) == 8  # a new request waits two steps at most
    assert planner.deferrals == 2
    assert planner.admissions(10, starving, now=0.0) == 0  # the count starts again


def test_new_streams_without_audio_have_no_deadline() -> None:
    planner = Planner(max_join=4)
    assert planner.admissions(10, [StreamClock()], now=5.0) == 4
    with pytest.raises(ValueError):
        Planner(max_join=0)


def test_measured_join_stalls_update_the_replay_estimate() -> None:
    planner = Planner(max_join=8, join_ms=10.0)
    planner.observe_join(60.0, replays=2)  # 30 ms a replay
    assert planner.join_ms == pytest.approx(14.0)
    planner.observe_join(0.0, replays=1)  # nothing measured: ignored
    assert planner.join_ms == pytest.approx(14.0)


def test_an_idle_engine_admits_a_lone_request_whatever_came_before() -> None:
    """Nothing running: every free slot is offered, at any time, also right after a deferral
    for a stream that has since ended (no deferral carried over to a request that waits for
    no one)."""
    planner = Planner(max_join=8, guard_ms=40.0, max_defer=2)
    assert planner.admissions(31, [StreamClock(0.01)], now=0.0) == 0  # held back for a starving stream
    for now in (0.0, 0.0037, 1.5, 86400.0):  # that stream ended; a lone request comes
        assert planner.admissions(32, [], now) == 32
    assert planner.admissions(31, [StreamClock(now + 0.01)], now) == 0  # a new count: 0 of max_defer used
    assert planner.deferrals == 2


# --- a simulated engine: fake stages on a virtual clock -------------------------------------


@dataclass
class Row:
    name: str
    frames: int
    arrived: float
    clock: StreamClock = field(default_factory=StreamClock)
    sent: int = 0
    first_audio: float | None = None
    underruns: int = 0
    cancelled: bool = False
    failed: bool = False


@dataclass
class Sim:
    """The batched engine's loop with fake stages: a prefill replay costs ``join_ms``, a frame
    step ``step_ms`` (every row, one frame each, delivered at once in chunks of one frame)."""

    planner: Planner
    slots: int = 32
    join_ms: float = 4.0
    step_ms: float = 12.0
    now: float = 0.0
    waiting: list[Row] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    done: list[Row] = field(default_factory=list)
    replays_per_step: list[int] = field(default_factory=list)
    fail_prefill_of: set[str] = field(default_factory=set)

    def arrive(self, name: str, frames: int, at: float | None = None) -> Row:
        row = Row(name, frames, self.now if at is None else at)
        self.waiting.append(row)
        return row

    def step(self) -> None:
        take = self.planner.admissions(self.slots - len(self.rows), [r.clock for r in self.rows], self.now)
        batch, self.waiting = self.waiting[:take], self.waiting[take:]
        replays = 0
        for chunk in self.planner.chunks(len(batch)):
            rows, batch = batch[:chunk], batch[chunk:]
            replays += 1
            self.now += self.join_ms / 1000
            alive = [r for r in rows if not r.cancelled]  # cancelled while prepared: never starts
            self.done += [r for r in rows if r.cancelled]
            if any(r.name in self.fail_prefill_of for r in alive):  # a failed replay fails its rows
                for r in alive:
                    r.failed = True
                self.done += alive
                continue
            self.rows += alive
        self.replays_per_step.append(replays)
        if not self.rows:
            return
        self.now += self.step_ms / 1000
        for row in self.rows:
            if row.cancelled:
                continue
            buffered = row.clock.buffered_ms(self.now)
            if buffered is not None and buffered < 0:
                row.underruns += 1
            row.clock.sent(1, self.now)
            row.sent += 1
            if row.first_audio is None:
                row.first_audio = self.now - row.arrived
        self.done += [r for r in self.rows if r.sent >= r.frames or r.cancelled]
        self.rows = [r for r in self.rows if r.sent < r.frames and not r.cancelled]

    def run_until(self, seconds: float) -> None:
        while self.now < seconds:
            self.step()
            if not self.rows and not self.waiting:
                return

    def serve(self, arrivals: list[tuple[float, str, int]]) -> list[Row]:
        """The engine's loop (``BatchedEngine._serve``) over requests arriving at given
        virtual times (seconds): with no row running it blocks in ``take`` until the next
        arrival and admits it then (``_admit(block=True)``); while rows run, an arrival
        waits for the next step's admission. Returns every request's row, in arrival order."""
        pending = sorted(arrivals)
        rows: list[Row] = []
        for _ in range(100_000):  # a hang guard: a planner that never admits a lone request
            while pending and pending[0][0] <= self.now:
                at, name, frames = pending.pop(0)
                rows.append(self.arrive(name, frames, at))
            if not self.rows and not self.waiting:
                if not pending:
                    return rows
                self.now = pending[0][0]  # idle: woken by the arrival itself
                continue
            self.step()
        raise AssertionError("the engine stopped admitting")


def test_a_burst_of_32_joins_while_others_stream_far_ahead() -> None:
    """Four streams 1.5 s ahead of playback; 28 requests arrive at once: the running streams
    yield, the burst joins in replays back to back before one step, and nobody underruns."""
    sim = Sim(Planner(max_join=8, join_ms=4.0, step_ms=12.0))
    running = [sim.arrive(f"r{i}", 200) for i in range(4)]
    sim.run_until(2.0)  # 2 s of 12 ms steps: each about 10 s of audio ahead of its playback
    burst = [sim.arrive(f"b{i}", 75) for i in range(28)]
    sim.step()
    assert sim.replays_per_step[-1] == 4 and not sim.waiting
    sim.run_until(30.0)
    assert all(r.underruns == 0 for r in running + burst)
    assert max(r.first_audio or 1e9 for r in burst) < 0.1  # 4 replays and one step


def test_a_burst_of_32_joins_into_streams_near_their_deadline_goes_one_replay_a_step() -> None:
    """A step as slow as playback (80 ms): streams hold only what they just got, so the burst
    joins one replay per step, a running stream's deadline first."""
    sim = Sim(Planner(max_join=8, join_ms=4.0, step_ms=80.0), step_ms=79.0)
    running = [sim.arrive(f"r{i}", 100) for i in range(4)]
    for _ in range(5):
        sim.step()
    burst = [sim.arrive(f"b{i}", 20) for i in range(28)]
    steps = len(sim.replays_per_step)
    while sim.waiting:
        sim.step()
    assert max(sim.replays_per_step[steps:]) == 1
    assert sum(sim.replays_per_step[steps:]) == math.ceil(28 / 8)
    sim.run_until(60.0)
    assert all(r.sent == r.frames for r in running + burst)


def test_a_client_far_behind_playback_does_not_hold_joins_back_forever() -> None:
    """A stream that already ran out (its playback restarts at its next chunk) and a step
    slower than playback: joins still get in, at most ``max_defer`` steps late each time."""
    planner = Planner(max_join=8, guard_ms=40.0, max_defer=2)
    sim = Sim(planner, step_ms=90.0)  # slower than real time: every stream falls behind
    behind = sim.arrive("behind", 1000)
    sim.step()
    behind.clock.play_end = sim.now - 5.0  # as if its client were 5 s behind
    joiners = [sim.arrive(f"j{i}", 5) for i in range(3)]
    for _ in range(3):
        sim.step()
    assert all(j.first_audio is not None for j in joiners)
    assert planner.deferrals <= 2


def test_cancellations_mid_prefill_and_a_failed_replay_end_only_their_rows() -> None:
    """A request cancelled after it was prepared never takes a slot; a replay that fails
    fails only the rows it carried; everyone else streams on."""
    sim = Sim(Planner(max_join=3, guard_ms=-1e9), slots=8)
    running = sim.arrive("running", 30)
    sim.step()
    gone = sim.arrive("gone", 10)
    gone.cancelled = True
    sim.fail_prefill_of = {"broken"}
    broken, neighbour = sim.arrive("broken", 10), sim.arrive("neighbour", 10)  # one replay with gone
    later = sim.arrive("later", 10)  # the next replay
    sim.run_until(60.0)
    assert gone.sent == 0 and not gone.failed
    assert broken.failed and neighbour.failed and broken.sent == neighbour.sent == 0
    assert not later.failed and later.sent == 10
    assert not running.failed and running.sent == 30


# --- a lone request: the engine idle, no step boundary to wait for ---------------------------


def test_a_lone_request_waits_for_no_step_boundary() -> None:
    """Requests one at a time (each arrives after the last has finished, at times unaligned
    with any step): each is admitted at its arrival, so its first audio is exactly one prefill
    replay and one frame step later, and the planner never held one back."""
    planner = Planner(max_join=8)
    sim = Sim(planner, join_ms=3.0, step_ms=6.44)
    arrivals = [(t, f"lone{i}", 62) for i, t in enumerate((0.1234, 1.5, 2.71828, 3.99999, 7.0001))]
    rows = sim.serve(arrivals)
    assert all(r.sent == 62 for r in rows)
    for row in rows:
        assert row.first_audio == pytest.approx((3.0 + 6.44) / 1000, abs=1e-9)
    assert planner.deferrals == 0 and sim.replays_per_step.count(1) == len(rows)


def test_poisson_arrivals_at_one_per_second_wait_at_most_the_step_in_flight() -> None:
    """Poisson arrivals at 1 req/s, 5 s replies (62 frames), for 200 requests: a request that
    finds the engine idle starts at once; one that finds a stream running waits for the
    replay and step in flight and no more (the running one is far ahead of playback: no
    deferral); nobody underruns."""
    rng = np.random.default_rng(27)
    times = np.cumsum(rng.exponential(1.0, 200))
    planner = Planner(max_join=8, join_ms=3.0, step_ms=6.44)
    sim = Sim(planner, join_ms=3.0, step_ms=6.44)
    rows = sim.serve([(float(t), f"p{i}", 62) for i, t in enumerate(times)])
    floor = (3.0 + 6.44) / 1000
    alone = [r for r, prev_end in zip(rows[1:], times[:-1] + 62 * 0.01, strict=True) if r.arrived > prev_end]
    assert len(alone) > 100  # most arrive to an idle engine at this rate
    assert all(r.first_audio == pytest.approx(floor, abs=1e-9) for r in [rows[0], *alone])
    assert all(r.first_audio is not None and r.first_audio <= 2 * floor + 1e-9 for r in rows)  # one loop late at most
    assert planner.deferrals == 0 and all(r.underruns == 0 and r.sent == 62 for r in rows)
