"""Prompts prepared off the engine thread (``engine/batched/stages/intake.py``) on the real tiny
models, float32, CPU: the engine loop (``BatchedEngine.serve``) only replays prefills; a
prompt that cannot be built fails its request alone; a request cancelled before it starts
ends empty; the join stall is reported for admissions that running streams waited for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wyoming_qwen3tts.engine import Segment, Work
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.engine.batched.prompt import Prompt
from wyoming_qwen3tts.engine.batched.stages.intake import Inline, PromptWorker
from wyoming_qwen3tts.common.vocabulary import ModelKind
from wyoming_qwen3tts.catalogue.voices import load_reference

from .engine_driver import Collect, Source, load_tiny, run

INSTRUCT = "A calm, low voice."


def seg(text: str, seed: int = 1, frames: int = 8, **kw: Any) -> Segment:
    kw.setdefault("instruct", INSTRUCT)
    return Segment(text, "english", max_new_tokens=frames, min_new_tokens=frames, seed=seed, **kw)


def wait_for(sinks: list[Collect], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not all(s.finished for s in sinks):
        assert time.monotonic() < deadline, "a request hangs"
        time.sleep(0.01)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def design(request: pytest.FixtureRequest, checkpoints: Path) -> BatchedEngine:
    """The CPU engine, or on CUDA one with its graphs captured (prompts then built on the
    worker's own CUDA stream), float32 without TF32."""
    if request.param == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

        def restore() -> None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

        request.addfinalizer(restore)
    return load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, device=request.param)


@pytest.fixture
def serve(design: BatchedEngine) -> Iterator[Callable[[], Source]]:
    """Starts the engine thread serving a source when called (closed after the test). Call it
    after any step-by-step run of the same engine: two threads must never drive one engine."""
    if not design._host:
        design._capture()  # what warm-up does before serving (host buffers; CUDA: graphs)
    source = Source()
    thread = threading.Thread(target=design.serve, args=(source,), name="engine-test", daemon=True)

    def start() -> Source:
        thread.start()
        return source

    yield start
    source.stop.set()
    if thread.is_alive():
        thread.join(30)
        assert not thread.is_alive()


@pytest.fixture
def serving(design: BatchedEngine, serve: Callable[[], Source]) -> tuple[BatchedEngine, Source]:
    """The engine thread serving a source from the start of the test."""
    return design, serve()


def spy_threads(engine: BatchedEngine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the thread that builds each prompt."""
    names: list[str] = []
    real: Callable[[Segment], Prompt] = engine.builder.build

    def build(segment: Segment) -> Prompt:
        names.append(threading.current_thread().name)
        return real(segment)

    monkeypatch.setattr(engine.builder, "build", build)
    return names


def test_prompts_are_built_off_the_engine_thread_and_a_bad_one_fails_alone(
    design: BatchedEngine, serve: Callable[[], Source], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = design
    good = seg("Built by the worker.", seed=3)
    expected = Collect()
    run(engine, {0: [(good, expected)]})  # prompts built inline, step by step
    names = spy_threads(engine, monkeypatch)
    source = serve()
    got, long, cancelled = Collect(), Collect(), Collect()
    cancelled.cancel = True
    for segment, sink in ((seg("word " * 3000, seed=9), long), (seg("Gone.", seed=4), cancelled), (good, got)):
        source.items.put(Work(segment, sink))
    wait_for([got, long, cancelled])
    assert names and all(n == "prompts-voice_design" for n in names), names
    assert len(names) == 2  # the cancelled request's prompt is never built
    assert long.error is not None and "too long" in str(long.error)
    assert cancelled.frames == 0 and cancelled.error is None and not cancelled.chunks
    assert got.error is None and got.frames == good.max_new_tokens
    np.testing.assert_allclose(got.pcm, expected.pcm, atol=1e-4)


def test_a_prompt_that_raises_fails_only_its_request(
    serving: tuple[BatchedEngine, Source], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, source = serving
    real = engine.builder.build

    def build(segment: Segment) -> Prompt:
        if segment.text.startswith("Broken"):
            raise ValueError("Unsupported language 'klingon'")
        return real(segment)

    monkeypatch.setattr(engine.builder, "build", build)
    running, broken, after = Collect(), Collect(), Collect()
    source.items.put(Work(seg("Running meanwhile.", seed=5, frames=30), running))
    time.sleep(0.2)
    source.items.put(Work(seg("Broken prompt.", seed=6), broken))
    source.items.put(Work(seg("After it.", seed=7), after))
    wait_for([running, broken, after])
    assert broken.error is not None and "klingon" in str(broken.error)
    assert running.error is None and running.frames == 30
    assert after.error is None and after.frames == 8


class _UntilFinished(Collect):
    """A sink whose client leaves once ``other`` has finished."""

    def __init__(self, other: Collect) -> None:
        super().__init__()
        self.other = other

    def cancelled(self) -> bool:
        return self.cancel or self.other.finished


def test_the_join_stall_counts_only_admissions_that_running_streams_wait_for(
    serving: tuple[BatchedEngine, Source]
) -> None:
    engine, source = serving
    stalls: list[float] = []
    saved = engine._on_join
    engine._on_join = stalls.append
    try:
        alone = Collect()
        source.items.put(Work(seg("Alone in the pool.", seed=1, frames=4), alone))
        wait_for([alone])
        assert alone.error is None and stalls == []  # nobody was running: nobody waited
        joiner = Collect()
        # The first stream runs until the joiner has finished (its client then leaves): the
        # joiner is admitted while it runs however slowly the prompt worker gets to it (with
        # a fixed 120 frames, a loaded machine could end it before the joiner came). Its
        # 1500-frame cap is far beyond any wait for one prompt.
        first = _UntilFinished(joiner)
        source.items.put(Work(seg("Running first.", seed=2, frames=1500), first))
        deadline = time.monotonic() + 60
        while not first.chunks and not first.finished and time.monotonic() < deadline:
            time.sleep(0.005)
        assert first.chunks and not first.finished, first.error
        source.items.put(Work(seg("Joins it.", seed=3, frames=4), joiner))
        wait_for([first, joiner])
        assert first.error is None and joiner.error is None
    finally:
        engine._on_join = saved
    assert len(stalls) == 1 and stalls[0] > 0


def test_the_worker_takes_work_only_for_free_slots() -> None:
    """With two free slots, two segments are prepared and the third stays with the source
    (its round-robin turn is not taken early); closing the source ends the worker."""
    source = Source()
    for i in range(3):
        source.items.put(Work(seg(f"r{i}"), Collect()))
    built: list[str] = []

    def build(segment: Segment) -> Prompt:
        built.append(segment.text)
        return Prompt(np.zeros(1), np.zeros(1))  # type: ignore[arg-type]

    import torch

    worker = PromptWorker(source, build, torch.device("cpu"))
    worker.set_free(2)
    worker.start()
    deadline = time.monotonic() + 10
    while len(built) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    got = worker.take(8, wait=10)
    while len(got) < 2 and time.monotonic() < deadline:
        got += worker.take(8, wait=1)
    time.sleep(0.2)  # were it to take more, it would have by now
    assert built == ["r0", "r1"] and source.items.qsize() == 1
    assert [p.work.segment.text for p in got] == ["r0", "r1"]
    worker.set_free(1)
    assert [p.work.segment.text for p in worker.take(8, wait=5)] == ["r2"]
    source.stop.set()
    assert worker.take(8, wait=None) == []
    assert worker.stop() == []


def test_an_icl_reference_is_prepared_by_the_worker_with_the_same_audio(
    checkpoints: Path, voices_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone reference's codec decoder state is computed ahead of admission, on the worker
    thread; the audio equals the one of a step-by-step run that builds it inline."""
    engine = load_tiny(checkpoints / "base", ModelKind.BASE, slots=2)
    segment = Segment("Cloned.", "english", 6, 6, seed=2, reference=load_reference(voices_dir / "clone.wav"))
    expected = Collect()
    run(engine, {0: [(segment, expected)]})
    engine.prefill._prefixes.clear()
    threads: list[str] = []
    real = engine.prefill._scratch.step

    def step(codes: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(codes)

    monkeypatch.setattr(engine.prefill._scratch, "step", step)
    source = Source()
    thread = threading.Thread(target=engine.serve, args=(source,), daemon=True)
    thread.start()
    try:
        got = Collect()
        source.items.put(Work(segment, got))
        wait_for([got])
    finally:
        source.stop.set()
        thread.join(30)
    assert threads == ["prompts-base"]
    assert got.error is None
    np.testing.assert_allclose(got.pcm, expected.pcm, atol=1e-4)


def test_inline_intake_builds_on_the_callers_thread() -> None:
    source = Source()
    source.items.put(Work(seg("x"), Collect()))
    names: list[str] = []

    def build(segment: Segment) -> Prompt:
        names.append(threading.current_thread().name)
        raise ValueError("no such speaker")

    (item,) = Inline(source, build).take(4, wait=0)
    assert names == [threading.current_thread().name]
    assert item.prompt is None and isinstance(item.error, ValueError)


def test_pause_waits_for_a_take_in_progress() -> None:
    """``pause`` returns only once the worker is out of ``source.take`` (with what it took
    ready), so an engine that then finds its source closed has not lost work to the worker
    (on-demand models: their source closes when idle and opens again)."""
    inside, release = threading.Event(), threading.Event()

    class Slow(Source):
        def take(self, wait: float | None) -> Work | None:
            if self.items.empty():
                return None
            inside.set()
            release.wait(10)
            return self.items.get()

    import torch

    source = Slow()
    source.items.put(Work(seg("Taken while closing."), Collect()))
    worker = PromptWorker(source, lambda s: Prompt(torch.zeros(1), torch.zeros(1)), torch.device("cpu"))
    worker.set_free(4)
    worker.start()
    assert inside.wait(10)
    paused = threading.Thread(target=worker.pause)
    paused.start()
    paused.join(0.3)
    assert paused.is_alive()  # still inside take
    release.set()
    paused.join(10)
    assert not paused.is_alive()
    assert [p.work.segment.text for p in worker.take(4, wait=0)] == ["Taken while closing."]
    source.items.put(Work(seg("Not while paused."), Collect()))
    time.sleep(0.2)
    assert worker.take(4, wait=0) == [] and source.items.qsize() == 1
    worker.resume()
    assert [p.work.segment.text for p in worker.take(4, wait=5)] == ["Not while paused."]
    assert worker.stop() == []


def test_joins_and_compaction_while_streaming_keep_every_streams_audio(
    design: BatchedEngine, serve: Callable[[], Source], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own loop, with requests of different lengths arriving while others stream:
    joins land next to running rows, short rows end and the last row is moved into their
    slot (on CUDA the codec decoder's state is set and moved on the decode stream, behind the
    decode in flight). Each request's audio equals what it gets alone, step by step."""
    from wyoming_qwen3tts.engine import Sampling

    greedy = Sampling.greedy()  # no tie-breaking by noise: only the rows' own state matters
    segments = [
        seg("The long one runs throughout.", seed=11, frames=24, sampling=greedy),
        seg("Short.", seed=12, frames=3, sampling=greedy),
        seg("A middle one joins.", seed=13, frames=9, sampling=greedy),
        seg("Another short one.", seed=14, frames=4, sampling=greedy),
        seg("The last joins late.", seed=15, frames=7, sampling=greedy),
    ]
    alone = []
    for segment in segments:
        sink = Collect()
        run(design, {0: [(segment, sink)]})
        alone.append(sink.pcm)
    moves: list[tuple[int, int]] = []
    real_move = design.decoder.move_row

    def move_row(src: int, dst: int) -> None:
        moves.append((src, dst))
        real_move(src, dst)

    monkeypatch.setattr(design.decoder, "move_row", move_row)
    source = serve()
    sinks = [Collect() for _ in segments]
    source.items.put(Work(segments[0], sinks[0]))
    for i in range(1, len(segments)):
        while not sinks[0].chunks:  # the long one streams before the others join
            time.sleep(0.001)
        source.items.put(Work(segments[i], sinks[i]))
        time.sleep(0.002 * i)
    wait_for(sinks)
    assert moves  # a row ended before the last one: the last was moved into its slot
    for segment, sink, pcm in zip(segments, sinks, alone, strict=True):
        assert sink.error is None and sink.frames == segment.max_new_tokens
        np.testing.assert_allclose(sink.pcm, pcm, atol=1e-4)


def test_a_prompt_being_built_is_waited_for_until_the_hold_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """``take(..., building=True)`` (the engine's, while streams run) waits for a prompt whose
    building is under way, up to ``BUILD_HOLD_S`` after it began; without ``building`` it
    returns at once. So a prompt ready before the next step is prefilled before it."""
    import torch

    from wyoming_qwen3tts.engine.batched.stages import intake

    building, release = threading.Event(), threading.Event()

    def build(segment: Segment) -> Prompt:
        building.set()
        release.wait(30)
        return Prompt(torch.zeros(1), torch.zeros(1))

    source = Source()
    worker = PromptWorker(source, build, torch.device("cpu"))
    worker.set_free(4)
    worker.start()
    try:
        # A hold longer than the build: the take returns with the prompt once it is built.
        monkeypatch.setattr(intake, "BUILD_HOLD_S", 60.0)
        source.items.put(Work(seg("first"), Collect()))
        assert building.wait(10)
        assert worker.take(4, wait=0) == []  # not while streams are idle-polled
        threading.Timer(0.2, release.set).start()
        got = worker.take(4, wait=0, building=True)
        assert [p.work.segment.text for p in got] == ["first"]
        # A hold that runs out first: the take gives up, the prompt comes at a later take.
        building.clear()
        release.clear()
        monkeypatch.setattr(intake, "BUILD_HOLD_S", 0.05)
        source.items.put(Work(seg("second"), Collect()))
        assert building.wait(10)
        assert worker.take(4, wait=0, building=True) == []
        release.set()
        assert [p.work.segment.text for p in worker.take(4, wait=10)] == ["second"]
    finally:
        release.set()
        source.stop.set()
        worker.stop()
