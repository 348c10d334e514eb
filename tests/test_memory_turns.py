"""Models taking turns on one GPU (``engine.gpu.on_demand``): who goes first, how many swaps a
request waits, anchors rendered in one visit. Fake engines that only record what they say
and when they load (ordering logic only), the real schedulers, lease and on-demand wrappers,
and a fake clock for the idle time after which the VoiceDesign model gives the card back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from wyoming_qwen3tts.engine import Engine, Segment, WorkSource
from wyoming_qwen3tts.engine.gpu.lease import BACKGROUND_AFTER_IDLE_S, Demand, GpuLease, must_yield, next_turn
from wyoming_qwen3tts.engine.gpu.on_demand import TURNS_IDLE_S, OnDemandEngine
from wyoming_qwen3tts.service.scheduler import Job, Scheduler, background
from wyoming_qwen3tts.common.vocabulary import ModelKind

BASE, DESIGN = ModelKind.BASE, ModelKind.VOICE_DESIGN


# --- the policy, as pure functions -------------------------------------------------------


def test_the_client_that_waits_longest_gets_the_card_then_background_then_home() -> None:
    waiting = {"base": Demand(clients=1, since=20.0), "voice_design": Demand(clients=2, since=10.0)}
    assert next_turn(waiting, "base") == "voice_design"  # its client waits since 10
    assert next_turn({"base": Demand(), "voice_design": Demand(background=3)}, "base") == "voice_design"
    assert next_turn({"base": Demand(clients=1, since=5.0), "voice_design": Demand(background=3)}, "base") == "base"
    assert next_turn({"base": Demand(), "voice_design": Demand()}, "base") == "base"
    assert next_turn({"base": Demand(), "voice_design": Demand()}, None) is None


def test_the_holder_yields_to_a_client_and_to_background_work_only_when_idle() -> None:
    assert must_yield("voice_design", {"voice_design": Demand(background=5), "base": Demand(clients=1, since=1.0)}, busy=True)
    assert not must_yield("voice_design", {"voice_design": Demand(background=5), "base": Demand()}, busy=False)
    # background for the other model: only once the holder has had nothing to do for a while
    assert not must_yield("base", {"base": Demand(), "voice_design": Demand(background=1)}, busy=True)
    assert not must_yield("base", {"base": Demand(clients=1, since=1.0), "voice_design": Demand(background=1)}, busy=False)
    assert not must_yield("base", {"base": Demand(), "voice_design": Demand(background=1)}, busy=False, idle_s=0.5)
    assert must_yield("base", {"base": Demand(), "voice_design": Demand(background=1)}, busy=False,
                      idle_s=BACKGROUND_AFTER_IDLE_S)
    # between two anchors the VoiceDesign model has nothing queued: it stays
    assert not must_yield("voice_design", {"voice_design": Demand(), "base": Demand()}, busy=False)


def test_a_client_segment_goes_before_queued_background_work() -> None:
    async def run() -> list[str]:
        scheduler = Scheduler()
        loop = asyncio.get_running_loop()
        with background():
            anchor = scheduler.open_job(loop)
        client = scheduler.open_job(loop)
        anchor.submit(Segment("anchor", "auto", 1))
        client.submit(Segment("client", "auto", 1))
        assert scheduler.demand().clients == 1 and scheduler.demand().background == 1
        taken = [scheduler.take(0), scheduler.take(0)]
        return [w.segment.text for w in taken if w is not None]

    assert asyncio.run(run()) == ["client", "anchor"]


def test_a_yielding_model_takes_only_the_next_sentence_of_a_request_it_started() -> None:
    async def run() -> None:
        scheduler = Scheduler()
        loop = asyncio.get_running_loop()
        started, new = scheduler.open_job(loop), scheduler.open_job(loop)
        started.submit(Segment("one", "auto", 1))
        first = scheduler.take(0)
        assert first is not None
        started.submit(Segment("two", "auto", 1))
        new.submit(Segment("new", "auto", 1))
        first.sink.done(1)
        assert scheduler.has_started()
        work = scheduler.take(0, started_only=True)
        assert work is not None and work.segment.text == "two"
        assert scheduler.take(0, started_only=True) is None  # the new request waits for the other model
        late = scheduler.take(0)
        assert late is not None and late.segment.text == "new"

    asyncio.run(run())


# --- the engines taking turns (threads; the fake clock only drives the idle time) ---------


class FakeClock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeModel(Engine):
    """Says each segment at once (or when its gate opens) and records it."""

    def __init__(self, kind: ModelKind, events: list[tuple[str, str]], gates: dict[str, threading.Event]) -> None:
        super().__init__(kind, 1, capacity=1)
        self.events = events
        self.gates = gates

    def speakers(self) -> list[str]:
        return []

    def warmup(self, segment: Segment) -> None:
        pass

    def serve(self, source: WorkSource) -> None:
        while not source.closed():
            work = source.take(0.01)
            if work is None:
                continue
            text = work.segment.text
            self.events.append(("start", text))
            gate = self.gates.get(text)
            if gate is not None:
                assert gate.wait(30), f"gate {text} never opened"
            self.events.append(("say", text))
            work.sink.audio(np.zeros(1920, dtype=np.float32))
            work.sink.done(1)


class Turns:
    """Base (home) and VoiceDesign models taking turns, each on its scheduler."""

    def __init__(self, design_unservable: str | None = None) -> None:
        self.events: list[tuple[str, str]] = []
        self.gates: dict[str, threading.Event] = {}
        self.clock = FakeClock()
        self.lease = GpuLease()
        self.schedulers = {BASE: Scheduler(), DESIGN: Scheduler()}

        def loader(kind: ModelKind) -> Callable[[float], Engine]:
            def load(shrink: float = 1.0) -> Engine:
                self.events.append(("load", kind.value))
                return FakeModel(kind, self.events, self.gates)

            return load

        warm = lambda _engine: Segment("warm", "auto", 1)  # noqa: E731
        self.base = OnDemandEngine(BASE, 1, loader(BASE), warm, idle_s=None, lease=self.lease, home=True, clock=self.clock)
        self.design = OnDemandEngine(DESIGN, 1, loader(DESIGN), warm, idle_s=60, lease=self.lease, clock=self.clock,
                                     unservable=design_unservable)
        self.base.warm(Segment("warm", "auto", 1))
        self.design.warm(Segment("warm", "auto", 1))
        assert self.base.resident and not self.design.resident

    def start(self) -> None:
        for kind, engine in ((BASE, self.base), (DESIGN, self.design)):
            engine.start(self.schedulers[kind])

    def stop(self) -> None:
        for gate in self.gates.values():
            gate.set()
        for scheduler in self.schedulers.values():
            scheduler.close()
        self.base.join(5)
        self.design.join(5)

    def said(self) -> list[str]:
        return [text for what, text in self.events if what == "say"]

    def loads(self) -> list[str]:
        return [kind for what, kind in self.events if what == "load"]

    def job(self, kind: ModelKind, text: str) -> Job:
        job = self.schedulers[kind].open_job(asyncio.get_running_loop())
        job.submit(Segment(text, "auto", 1))
        job.close()
        return job


async def _drain(job: Job) -> None:
    async for _chunk in job:
        pass


async def _anchors(turns: Turns, names: list[str]) -> None:
    """As ``anchors.Anchors`` renders them: one after the other, each as background work."""
    for name in names:
        with background():
            job = turns.job(DESIGN, name)
        await _drain(job)


async def _until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout  # a hang guard, not a timing assertion
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.01)


async def test_voice_design_renders_every_missing_anchor_in_one_visit_then_base_comes_home() -> None:
    turns = Turns()
    turns.start()
    try:
        anchors = asyncio.create_task(_anchors(turns, ["a1", "a2", "a3", "a4"]))
        await _until(lambda: turns.lease.demand("voice_design").background == 1, "the first anchor queued")
        await asyncio.sleep(0.3)
        assert turns.base.resident and turns.said() == []  # the Base model was busy a moment ago: it stays
        turns.clock.now += BACKGROUND_AFTER_IDLE_S  # now it has been idle long enough
        await asyncio.wait_for(anchors, 30)
        assert turns.said() == ["a1", "a2", "a3", "a4"]
        assert turns.loads() == ["base", "voice_design"]  # one visit for all four
        assert turns.design.resident
        turns.clock.now += TURNS_IDLE_S + 1  # no work since: it gives the card back
        await _until(lambda: turns.base.resident, "the Base model came home")
        assert turns.loads() == ["base", "voice_design", "base"] and not turns.design.resident
    finally:
        turns.stop()


async def test_a_client_waiting_for_base_goes_before_the_remaining_anchors_and_waits_one_swap() -> None:
    turns = Turns()
    turns.gates["a1"] = threading.Event()
    turns.start()
    try:
        anchors = asyncio.create_task(_anchors(turns, ["a1", "a2", "a3"]))
        await _until(lambda: turns.lease.demand("voice_design").background == 1, "the first anchor queued")
        turns.clock.now += BACKGROUND_AFTER_IDLE_S  # the Base model has been idle since it loaded
        await _until(lambda: ("start", "a1") in turns.events, "the first anchor started")
        loads_before = len(turns.loads())
        clone = turns.job(BASE, "clone")
        await _until(lambda: turns.lease.demand("base").clients == 1, "the clone queued")
        turns.gates["a1"].set()  # the running anchor ends; the next one is queued at once
        await asyncio.wait_for(_drain(clone), 30)
        assert turns.loads()[loads_before:] == ["base"]  # the request waited for one swap
        await _until(lambda: turns.lease.demand("voice_design").background == 1, "the next anchor queued")
        turns.clock.now += BACKGROUND_AFTER_IDLE_S  # the Base model idle again: the anchors go on
        await asyncio.wait_for(anchors, 30)
        assert turns.said() == ["a1", "clone", "a2", "a3"]
        assert turns.loads() == ["base", "voice_design", "base", "voice_design"]  # a2 and a3 in one visit
    finally:
        turns.stop()


async def test_clients_of_both_models_each_wait_at_most_one_swap() -> None:
    turns = Turns()
    turns.gates["p1"] = threading.Event()
    turns.start()
    try:
        preset = turns.job(DESIGN, "p1")  # a preset designed live: the VoiceDesign model comes in
        await _until(lambda: ("start", "p1") in turns.events, "the preset started")
        clones = [turns.job(BASE, f"c{i}") for i in range(3)]
        await _until(lambda: turns.lease.demand("base").clients == 3, "the clones queued")
        later = turns.job(DESIGN, "p2")  # comes after the clones: waits for them
        turns.gates["p1"].set()
        await asyncio.wait_for(asyncio.gather(_drain(preset), *map(_drain, clones), _drain(later)), 30)
        said = turns.said()
        assert said[:4] == ["p1", "c0", "c1", "c2"] and said[4] == "p2"
        assert turns.loads() == ["base", "voice_design", "base", "voice_design"]
    finally:
        turns.stop()


async def test_a_model_that_cannot_load_fails_what_waits_for_it_and_the_other_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import wyoming_qwen3tts.engine.gpu.on_demand as on_demand

    monkeypatch.setattr(on_demand, "RETRY_S", 0.2)
    turns = Turns()

    def no_room(shrink: float = 1.0) -> Engine:
        raise RuntimeError("voice_design model: not even 1 stream fits (1.1 GB free after the weights)")

    turns.design._load = no_room
    turns.start()
    try:
        preset = turns.job(DESIGN, "p1")
        from wyoming_qwen3tts.service.errors import GenerationError

        with pytest.raises(GenerationError, match="could not be loaded: voice_design model: not even 1 stream fits"):
            await asyncio.wait_for(_drain(preset), 30)
        clone = turns.job(BASE, "c1")
        await asyncio.wait_for(_drain(clone), 30)  # the Base model comes back and serves
        assert "c1" in turns.said() and turns.base.resident
    finally:
        turns.stop()


async def test_a_model_that_can_never_fit_fails_its_requests_at_once_and_the_one_on_the_card_stays() -> None:
    """4 GB free: the sizing says the VoiceDesign model does not fit even alone. Its requests
    (and anchors) fail at once with the reason; the Base model is never swapped out for it."""
    turns = Turns(design_unservable="the voice_design model does not fit in this GPU's 3.5 GB even alone")
    turns.start()
    try:
        with pytest.raises(Exception, match="cannot be served on this GPU: the voice_design model does not fit"):
            await asyncio.wait_for(_drain(turns.job(DESIGN, "p1")), 30)
        with pytest.raises(Exception, match="cannot be served on this GPU"):
            await asyncio.wait_for(_anchors(turns, ["a1"]), 30)
        turns.clock.now += BACKGROUND_AFTER_IDLE_S + TURNS_IDLE_S
        await asyncio.wait_for(_drain(turns.job(BASE, "clone")), 30)
        assert turns.said() == ["clone"] and turns.loads() == ["base"]
        assert turns.base.resident and not turns.design.resident and turns.lease.holder == "base"
    finally:
        turns.stop()


async def test_a_model_found_not_to_fit_alone_is_never_swapped_in_again() -> None:
    """4 GB free on the H200: the VoiceDesign model came in, found no room for one stream
    beside its weights (``MemoryFitError``) with the Base model out, and every later request
    and anchor sent the Base model out for it again. Now its first failure is its last try:
    later requests fail at once, and the Base model comes back and stays."""
    from wyoming_qwen3tts.engine.loader import MemoryFitError
    from wyoming_qwen3tts.service.errors import GenerationError

    turns = Turns()

    def no_room(shrink: float = 1.0) -> Engine:
        turns.events.append(("load", "voice_design"))
        raise MemoryFitError("voice_design model: not even 1 stream fits (1.0 GB free after the weights)")

    turns.design._load = no_room
    turns.start()
    try:
        with pytest.raises(GenerationError, match="could not be loaded: voice_design model: not even 1 stream fits"):
            await asyncio.wait_for(_drain(turns.job(DESIGN, "p1")), 30)
        await asyncio.wait_for(_drain(turns.job(BASE, "c1")), 30)
        with pytest.raises(GenerationError, match="cannot be served on this GPU: .*not even 1 stream fits"):
            await asyncio.wait_for(_drain(turns.job(DESIGN, "p2")), 30)
        with pytest.raises(GenerationError, match="cannot be served on this GPU"):
            await asyncio.wait_for(_anchors(turns, ["a1"]), 30)
        turns.clock.now += BACKGROUND_AFTER_IDLE_S + TURNS_IDLE_S
        await asyncio.wait_for(_drain(turns.job(BASE, "c2")), 30)
        assert turns.loads() == ["base", "voice_design", "base"], turns.loads()  # one try, one return
        assert turns.said() == ["c1", "c2"] and turns.base.resident and turns.lease.holder == "base"
        assert turns.design.unservable is not None
    finally:
        turns.stop()


async def test_where_the_voice_design_model_cannot_load_stored_anchors_still_serve_their_presets(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """4 GB free on the H200: the VoiceDesign model can never come in, so no anchor is
    rendered; the anchors already in the data folder must still serve their presets (through
    the Base model). The 4 GB row asked for ``lena``, whose anchor was there, and got the
    VoiceDesign model's refusal: the model was never identified without the renderer."""
    from wyoming_qwen3tts.service.anchors import AnchorMode, Anchors, AnchorStore, model_identity, preset_spec
    from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

    catalog = VoiceCatalog(voices_dir, {BASE, DESIGN})
    store = AnchorStore(tmp_path / "anchors")
    checkpoint = checkpoints / "voice_design"
    lena, aria = catalog.get("lena"), catalog.get("aria")
    tone = (0.1 * np.sin(2 * np.pi * 200 * np.arange(24000 * 3) / 24000)).astype(np.float32)
    store.save(preset_spec(lena, model_identity(checkpoint)), tone, "lena")
    anchors = Anchors(store, catalog, AnchorMode.ALL, checkpoint, "aria", clone_loaded=True)
    rendered: list[str] = []

    async def render(*args: object, **kwargs: object) -> np.ndarray:
        rendered.append(str(args[:1]))
        return tone

    # The server says it is ready once this returns: a request may come at once (the GPU
    # run's came 0.6 s after, while the checkpoint was being hashed, and were refused).
    await asyncio.wait_for(anchors.begin(render, rendering=False), 30)  # type: ignore[arg-type]
    try:
        reference = anchors.reference_for(lena)
        assert reference is not None and reference.audio.shape[0] > 0
        assert anchors.reference_for(aria) is None  # missing: designed live, i.e. refused
        await asyncio.sleep(0.2)
        assert rendered == [] and len(list((tmp_path / "anchors").glob("*.wav"))) == 1  # lena's only
    finally:
        await anchors.stop()
