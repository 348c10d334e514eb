"""The scheduler's ordering, cancellation and failure handling (a fake serial engine stands
in for the model here; the real engines are exercised end to end in test_wyoming.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from wyoming_qwen3tts.engine import Engine, Segment
from wyoming_qwen3tts.engine.serial import SerialEngine
from wyoming_qwen3tts.service.errors import GenerationError
from wyoming_qwen3tts.service.scheduler import Job, Scheduler
from wyoming_qwen3tts.common.vocabulary import ModelKind


class RecordingModel(SerialEngine):
    """Yields ``max_new_tokens`` one-sample chunks whose value encodes the segment text."""

    def __init__(self) -> None:
        Engine.__init__(self, ModelKind.VOICE_DESIGN, chunk_frames=1, capacity=1)
        self.order: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.active = 0
        self.max_active = 0

    def speakers(self) -> list[str]:
        return []

    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        if segment.text == "boom":
            raise RuntimeError("prefill has 5000 tokens but max_seq_len=2048")
        self.order.append(segment.text)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            for _ in range(segment.max_new_tokens):
                self.gate.wait()
                yield np.full(1, float(len(self.order)), dtype=np.float32)
        finally:
            self.active -= 1


def seg(text: str, frames: int = 3) -> Segment:
    return Segment(text=text, language="auto", max_new_tokens=frames)


async def drain(job: Job) -> list[float]:
    return [float(c[0]) async for c in job]


@pytest.fixture
def engine_and_scheduler() -> Iterator[tuple[RecordingModel, Scheduler]]:
    model = RecordingModel()
    model.warm(seg("warm", 1))
    model.order.clear()
    scheduler = Scheduler()
    model.start(scheduler)
    yield model, scheduler
    model.gate.set()
    scheduler.close()
    model.join(10)


async def test_clients_take_turns_at_segment_boundaries(engine_and_scheduler: tuple[RecordingModel, Scheduler]) -> None:
    model, scheduler = engine_and_scheduler
    loop = asyncio.get_running_loop()
    model.gate.clear()  # hold the engine so both queues fill first
    a, b = scheduler.open_job(loop), scheduler.open_job(loop)
    for i in range(3):
        a.submit(seg(f"a{i}"))
    for i in range(2):
        b.submit(seg(f"b{i}"))
    a.close()
    b.close()
    model.gate.set()
    chunks_a, chunks_b = await asyncio.wait_for(asyncio.gather(drain(a), drain(b)), 30)
    assert model.order == ["a0", "b0", "a1", "b1", "a2"]
    assert model.max_active == 1  # one generation at a time
    assert len(chunks_a) == 9 and len(chunks_b) == 6  # every chunk delivered, none duplicated


async def test_a_client_arriving_mid_sentence_goes_before_the_running_clients_next(
    engine_and_scheduler: tuple[RecordingModel, Scheduler],
) -> None:
    """One engine slot, client A with four sentences, B asks while A's first is spoken: B's
    sentence is next, not after A's second (a second satellite waits one sentence, not two)."""
    model, scheduler = engine_and_scheduler
    loop = asyncio.get_running_loop()
    model.gate.clear()
    a = scheduler.open_job(loop)
    for i in range(4):
        a.submit(seg(f"a{i}"))
    a.close()
    while model.order != ["a0"]:
        await asyncio.sleep(0.01)
    b = scheduler.open_job(loop)
    b.submit(seg("b0"))
    b.close()
    assert scheduler.queue_depth() == 4  # A's three waiting (A is out of the line) and B's one
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(drain(a), drain(b)), 30)
    assert model.order == ["a0", "b0", "a1", "a2", "a3"] and scheduler.queue_depth() == 0


async def test_cancel_drops_queued_work_and_stops_the_running_segment(engine_and_scheduler: tuple[RecordingModel, Scheduler]) -> None:
    model, scheduler = engine_and_scheduler
    loop = asyncio.get_running_loop()
    job = scheduler.open_job(loop)
    model.gate.clear()
    for i in range(5):
        job.submit(seg(f"s{i}", frames=1000))
    job.close()
    while not model.order:
        await asyncio.sleep(0.01)
    job.cancel()
    model.gate.set()
    other = scheduler.open_job(loop)
    other.submit(seg("next"))
    other.close()
    assert len(await asyncio.wait_for(drain(other), 30)) == 3
    assert model.order == ["s0", "next"]  # s1..s4 never ran
    assert await drain(job) == []


async def test_a_failing_segment_raises_for_its_client_only(engine_and_scheduler: tuple[RecordingModel, Scheduler]) -> None:
    _model, scheduler = engine_and_scheduler
    loop = asyncio.get_running_loop()
    bad = scheduler.open_job(loop)
    bad.submit(seg("boom"))
    bad.close()
    with pytest.raises(GenerationError, match="max_seq_len"):
        await asyncio.wait_for(drain(bad), 30)
    good = scheduler.open_job(loop)
    good.submit(seg("fine"))
    good.close()
    assert len(await asyncio.wait_for(drain(good), 30)) == 3
    assert scheduler.queue_depth() == 0


async def test_a_client_that_does_not_read_gets_no_new_segments(
    engine_and_scheduler: tuple[RecordingModel, Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-pressure: while a job's unread audio is over the limit its next segment waits
    (others go on); once its client reads, it continues, losing nothing."""
    from wyoming_qwen3tts.service import scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "MAX_BACKLOG_SECONDS", 2 / 24000)  # two samples
    model, scheduler = engine_and_scheduler
    loop = asyncio.get_running_loop()
    stalled = scheduler.open_job(loop)
    for i in range(3):
        stalled.submit(seg(f"s{i}"))
    stalled.close()
    while not model.order:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # its first segment's three chunks are unread
    other = scheduler.open_job(loop)
    other.submit(seg("o0"))
    other.close()
    assert len(await asyncio.wait_for(drain(other), 30)) == 3
    assert model.order == ["s0", "o0"]  # s1 held back, o0 went ahead
    assert len(await asyncio.wait_for(drain(stalled), 30)) == 9  # reading resumes it
    assert model.order == ["s0", "o0", "s1", "s2"]
