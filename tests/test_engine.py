"""The batched engine on the real tiny models (float32, CPU; the graph-captured CUDA path
under ``pytest -m gpu``): parity with the reference generator, row isolation, seeds, and
the pool's lifecycle (join, leave, cancel, queue, failure)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.engine import Engine, Sampling, Segment, Work, WorkSource
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.common.vocabulary import ModelKind
from wyoming_qwen3tts.catalogue.voices import load_reference

from .conftest import CLONE_TRANSCRIPT
from .engine_driver import Collect, Source, load_tiny, run

FRAMES = 12
INSTRUCT = "A calm, low voice."
#: Eager on the CPU; graph-captured on CUDA under ``pytest -m gpu`` (both float32).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _need(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.fixture(scope="module", autouse=True)
def exact_float32() -> Iterator[None]:
    """Float32 without TF32 on the GPU: the checks here compare to 1e-4, and TF32 rounds
    matrix products and convolutions to 10 bits, differently for differently shaped calls."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module", params=DEVICES)
def design(request: pytest.FixtureRequest, checkpoints: Path) -> Iterator[BatchedEngine]:
    """A VoiceDesign engine with 4 slots, chunks of one frame."""
    _need(request.param)
    yield load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, device=request.param)


def seg(text: str, seed: int = 1, frames: int = FRAMES, **kw: Any) -> Segment:
    kw.setdefault("instruct", INSTRUCT)
    return Segment(text, "english", max_new_tokens=frames, min_new_tokens=frames, seed=seed, **kw)


def solo(engine: BatchedEngine, segment: Segment) -> Collect:
    sink = Collect()
    run(engine, {0: [(segment, sink)]})
    return sink


def reference_codes(qwen: Any, generate: str, frames: int, **kwargs: Any) -> torch.Tensor:
    """Codes [frames - 1, 16] from qwen_tts's own (HF generate) path, greedy everywhere."""
    seen: dict[str, Any] = {}
    original = qwen.model.generate

    def spy(*args: Any, **kw: Any) -> Any:
        seen["out"] = original(*args, **kw)
        return seen["out"]

    qwen.model.generate = spy
    try:
        getattr(qwen, generate)(
            max_new_tokens=frames, non_streaming_mode=True, do_sample=False,
            subtalker_dosample=False, repetition_penalty=1.0, **kwargs,
        )
    finally:
        qwen.model.generate = original
    return seen["out"][0][0]


def engine_codes(engine: BatchedEngine, segment: Segment) -> tuple[np.ndarray, Collect]:
    sink = Collect()
    codes = run(engine, {0: [(segment, sink)]}, record_codes=True)
    return np.stack(codes[0])[: sink.frames], sink


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["voice_design", "custom_voice", "clone", "xvec"])
def test_greedy_codes_equal_the_reference_generator(kind: str, device: str, checkpoints: Path, voices_dir: Path) -> None:
    """Greedy, float32: every code of every frame equals qwen_tts's own generator's (which
    stops one frame before ``max_new_tokens``), and the streamed PCM equals its whole decode."""
    _need(device)
    text, frames = "Parity of codes, frame by frame.", 16
    greedy = Sampling.greedy()
    if kind == "voice_design":
        engine = load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, slots=2, device=device)
        segment = Segment(text, "english", frames, 2, seed=3, instruct=INSTRUCT, sampling=greedy)
        args: dict[str, Any] = dict(text=text, instruct=INSTRUCT, language="english")
        method = "generate_voice_design"
    elif kind == "custom_voice":
        engine = load_tiny(checkpoints / "custom_voice", ModelKind.CUSTOM_VOICE, slots=2, device=device)
        segment = Segment(text, "german", frames, 2, seed=3, speaker="ryan", sampling=greedy)
        args = dict(text=text, speaker="ryan", language="german")
        method = "generate_custom_voice"
    else:
        engine = load_tiny(checkpoints / "base", ModelKind.BASE, slots=2, device=device)
        clip = voices_dir / ("clone.wav" if kind == "clone" else "xvec.wav")
        reference = load_reference(clip)
        assert (reference.transcript == CLONE_TRANSCRIPT) is (kind == "clone")
        segment = Segment(text, "english", frames, 2, seed=3, reference=reference, sampling=greedy)
        args = dict(text=text, language="english", voice_clone_prompt=engine.prompts.get(reference))
        method = "generate_voice_clone"
    expected = reference_codes(engine._qwen, method, frames, **args).cpu().numpy()
    ours, sink = engine_codes(engine, segment)
    assert sink.frames == frames and len(expected) == frames - 1
    np.testing.assert_array_equal(ours[: frames - 1], expected)
    # Our PCM, decoded frame by frame, against the library's decode of the same codes (with
    # the ICL reference codes in front, as the library decodes a clone).
    codes = torch.from_numpy(ours)
    ref_codes = engine.builder.build(segment).ref_codes
    if ref_codes is not None:
        codes = torch.cat([ref_codes.cpu(), codes])
    (whole,), _sr = engine._model.speech_tokenizer.decode([{"audio_codes": codes.to(engine.device)}])
    whole = np.asarray(whole)[-frames * 1920 :]
    assert len(sink.pcm) == frames * 1920
    np.testing.assert_allclose(sink.pcm, whole, atol=1e-4)


def test_a_row_is_byte_identical_whatever_its_neighbours(design: BatchedEngine) -> None:
    """Same batch size and slot, different other rows: the same codes and PCM, byte for byte."""
    target = seg("The one we watch.", seed=11)
    results = []
    for variant in range(3):
        mine = Collect()
        others = [(seg(f"Neighbour {variant}{i}, other words.", seed=100 * variant + i), Collect()) for i in range(3)]
        run(design, {0: [(target, mine)], 1: others})
        assert mine.frames == FRAMES and all(o.frames == FRAMES for _, o in others)
        results.append(mine.pcm.tobytes())
        assert others[0][1].pcm.tobytes() != mine.pcm.tobytes()
    assert results[0] == results[1] == results[2]


def test_a_seed_gives_the_same_audio_alone_and_under_load(design: BatchedEngine) -> None:
    """Randomness is keyed by (seed, frame, codebook), not by a shared generator: the same
    seed samples the same codes alone (batch 1) and among three other streams (batch 4); the
    PCM differs only by rounding of other-shaped matrix kernels. A different seed differs."""
    target = seg("Sampled, not greedy.", seed=42)
    alone = Collect()
    codes_alone = run(design, {0: [(target, alone)]}, record_codes=True)[0]
    loaded = Collect()
    others = [(seg(f"Other stream {i}.", seed=i), Collect()) for i in range(3)]
    codes_loaded = run(design, {0: [(target, loaded), *others]}, record_codes=True)[0]
    np.testing.assert_array_equal(np.stack(codes_alone)[:FRAMES], np.stack(codes_loaded)[:FRAMES])
    np.testing.assert_allclose(alone.pcm, loaded.pcm, atol=1e-4)
    other_seed = solo(design, seg("Sampled, not greedy.", seed=43))
    assert np.abs(other_seed.pcm - alone.pcm).max() > 0.01


def test_join_leave_cancel_queue_and_failure(design: BatchedEngine) -> None:
    """Four slots, six requests: two join at once, more join mid-run as slots free up, one is
    cancelled mid-stream (its slot is reused at once), one cannot start (prompt longer than
    the cache) and fails alone. Everyone else gets exactly the audio they get alone."""
    a, b, c, d, e = (seg(f"Request {name}, lifecycle.", seed=i, frames=8 + 2 * i) for i, name in enumerate("abcde"))
    too_long = seg("word " * 3000, seed=9)
    sinks = {name: Collect() for name in ("a", "b", "c", "d", "e", "long")}
    run(
        design,
        {
            0: [(a, sinks["a"]), (b, sinks["b"])],
            2: [(c, sinks["c"]), (too_long, sinks["long"])],
            3: [(d, sinks["d"]), (e, sinks["e"])],  # e waits: the pool is full until b leaves
        },
        cancel={5: [sinks["b"]]},
    )
    assert sinks["long"].error is not None and "too long" in str(sinks["long"].error)
    assert sinks["b"].error is None and sinks["b"].frames is not None and 3 <= sinks["b"].frames < 10
    for name, segment in zip("acde", (a, c, d, e), strict=True):
        got = sinks[name]
        assert got.error is None and got.frames == segment.max_new_tokens, name
        np.testing.assert_allclose(got.pcm, solo(design, segment).pcm, atol=1e-4, err_msg=name)


def test_eos_ends_a_row_after_min_new_tokens(design: BatchedEngine) -> None:
    """With EOS made the most likely token, a row ends exactly at ``min_new_tokens`` frames
    (EOS is held back until then), read back a step later without stalling the others."""
    eos = torch.tensor([design.step.eos_id], device=design.device)  # made outside any capture
    favour_eos = design.talker.codec_head.register_forward_hook(
        lambda _module, _args, logits: logits.index_fill(-1, eos, 100.0)
    )
    if design.use_graphs:  # a hook only acts where it is captured
        design.graphs.capture()
    try:
        short = Segment("Stops early.", "english", max_new_tokens=40, min_new_tokens=3, seed=1,
                        instruct=INSTRUCT)
        sink = Collect()
        run(design, {0: [(short, sink)]})
    finally:
        favour_eos.remove()
        if design.use_graphs:
            design.graphs.capture()
    assert sink.frames == 3 and len(sink.pcm) == 3 * 1920


def _wait(sink: Collect, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not sink.finished:
        assert time.monotonic() < deadline, "the request hangs"
        time.sleep(0.01)


def test_an_unexpected_engine_error_fails_running_streams_and_serving_goes_on(
    design: BatchedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error outside any one row (here in the join-stall report, which once raised on the
    GPU when a prefill's events were still pending) fails the streams then running, with the
    error; the engine thread lives on and the next request gets the audio it gets alone."""
    expected = solo(design, seg("After the failure.", seed=5)).pcm
    real = design._report_joins
    calls = {"n": 0}

    def broken() -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        real()

    monkeypatch.setattr(design, "_report_joins", broken)
    source = Source()
    thread = threading.Thread(target=design.serve, args=(source,), daemon=True)
    thread.start()
    try:
        victim = Collect()
        source.items.put(Work(seg("Running when it breaks.", seed=4, frames=40), victim))
        _wait(victim)
        assert victim.error is not None and "elapsed time" in str(victim.error)
        after = Collect()
        source.items.put(Work(seg("After the failure.", seed=5), after))
        _wait(after)
        assert after.error is None and after.frames == FRAMES
        np.testing.assert_allclose(after.pcm, expected, atol=1e-4)
    finally:
        source.stop.set()
        thread.join(30)
    assert not thread.is_alive()


class _Event:
    """Stands in for a ``torch.cuda.Event`` pair's end: complete or not."""

    def __init__(self, done: bool) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: _Event) -> float:
        if not (self.done and end.done):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return 12.0


def test_a_join_stall_is_reported_once_its_prefill_has_finished(design: BatchedEngine) -> None:
    """A prefill enqueued after the step being delivered may still be running on the GPU: its
    stall is reported by a later delivery, never read early (which raises in torch)."""
    stalls: list[float] = []
    saved = design._on_join
    design._on_join = stalls.append
    try:
        start, end = _Event(True), _Event(False)
        design._joins.append((start, end, 1))  # type: ignore[arg-type]
        design._report_joins()
        assert stalls == [] and len(design._joins) == 1
        start.done = end.done = True
        design._report_joins()
        assert stalls == [0.012] and design._joins == []
    finally:
        design._on_join = saved
        design._joins.clear()


def test_an_engine_thread_that_dies_fails_later_work_instead_of_hanging() -> None:
    """If ``serve`` itself raises, the thread logs it, the engine reports ``serve_error``
    (``/ready`` then says "failed"), and every later segment fails at once."""

    class Broken(Engine):
        def speakers(self) -> list[str]:
            return []

        def warmup(self, segment: Segment) -> None:
            pass

        def serve(self, source: WorkSource) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    engine = Broken(ModelKind.BASE, 1, 1)
    source = Source()
    engine.start(source)
    try:
        sink = Collect()
        source.items.put(Work(seg("Anyone there?"), sink))
        _wait(sink, 10)
        assert isinstance(engine.serve_error, RuntimeError)
        assert sink.error is not None and "base engine stopped" in str(sink.error)
    finally:
        source.stop.set()
        engine.join(10)


@pytest.mark.gpu
def test_greedy_codes_equal_faster_qwen3_tts_own_generator(checkpoints: Path) -> None:
    """On CUDA, float32, greedy: our graph-captured batched step gives the codes of
    faster-qwen3-tts's own CUDA-graph single-stream generator, frame for frame."""
    _need("cuda")
    from faster_qwen3_tts import FasterQwen3TTS
    from faster_qwen3_tts.streaming import fast_generate_streaming

    from wyoming_qwen3tts.engine import MAX_SEQ_LEN

    text, frames = "Parity with the single-stream generator.", 20
    tts = FasterQwen3TTS.from_pretrained(str(checkpoints / "voice_design"), device="cuda", dtype=torch.float32)
    tts.predictor_graph.do_sample = False  # its code predictor samples at capture-time settings
    tts.warmup()
    _m, talker, config, embeds, mask, trailing, pad = tts._prepare_generation_custom(
        text=text, language="english", speaker=None, instruct=INSTRUCT, non_streaming_mode=True
    )
    theirs = torch.cat([
        chunk for chunk, _timing in fast_generate_streaming(
            talker, embeds, mask, trailing, pad, config, tts.predictor_graph, tts.talker_graph,
            max_new_tokens=frames, min_new_tokens=2, do_sample=False, repetition_penalty=1.0,
            chunk_size=4,
        )
    ]).cpu().numpy()
    engine = BatchedEngine(ModelKind.VOICE_DESIGN, tts, 1, 2, MAX_SEQ_LEN, graphs=True)
    engine._capture()
    ours, sink = engine_codes(
        engine, Segment(text, "english", frames, 2, seed=1, instruct=INSTRUCT, sampling=Sampling.greedy())
    )
    assert sink.frames == frames == len(theirs)
    np.testing.assert_array_equal(ours, theirs)


def test_chunks_carry_chunk_frames_each(checkpoints: Path) -> None:
    """Audio leaves in chunks of ``chunk_frames`` frames; the last may be shorter."""
    engine = load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, slots=1, chunk_frames=3)
    sink = solo(engine, seg("Chunked.", frames=8))
    assert [len(c) // 1920 for c in sink.chunks] == [3, 3, 2]


def test_graphs_that_replay_together_are_captured_on_different_streams(design: BatchedEngine) -> None:
    """The decode replays beside the step (and the other models' decodes), so its graphs are
    captured on a stream of their own, one per model: PyTorch keys cuBLAS's workspace by the
    capture stream, and two graphs sharing one spun on each other's split-K counters (every
    request timed out from 20 req/s on the H200). The step and the prefill replay one after
    the other on one stream and may share."""
    roles = {design.graphs.capture_role, design.decode_graphs.capture_role}
    assert len(roles) == 2
    assert design.decode_graphs.capture_role == f"{design.kind.value}-capture-decode"
    assert design.prefill.graphs.capture_role == design.graphs.capture_role


def test_a_step_that_stalls_on_the_gpu_is_logged_once_per_interval(
    design: BatchedEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A step whose GPU work keeps delivery waiting past ``STEP_STALL_S`` is a WARNING naming
    the model, the streams and the wait; further slow steps within ``STALL_LOG_EVERY_S`` are
    counted into the next warning, not logged each. The audio is still delivered. (The GPU's
    completion event is stood in for by a slow ``synchronize``: on the CPU a step has none.)"""
    import logging

    from wyoming_qwen3tts.engine.batched import engine as engine_module

    class SlowEvent:
        def synchronize(self) -> None:
            time.sleep(0.03)

    launch = design._launch
    launches: list[int] = []

    def slow_launch() -> Any:
        launches.append(1)
        launched = launch()
        launched.done = SlowEvent()
        return launched

    monkeypatch.setattr(engine_module, "STEP_STALL_S", 0.01)
    monkeypatch.setattr(design, "_launch", slow_launch)
    monkeypatch.setattr(design, "_stall_logged", -math.inf)
    monkeypatch.setattr(design, "_slow_steps", 0)
    caplog.set_level(logging.WARNING, logger=engine_module.__name__)
    sink = solo(design, seg("Stalled but spoken.", frames=4))
    assert sink.error is None and sink.frames == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "voice_design model: a step of 1 stream(s) kept its audio" in warnings[0]
    assert "1 slow step(s) since the last warning" in warnings[0]
    assert len(launches) >= 4 and design._slow_steps == len(launches) - 1  # for the next warning
    design._slow_steps = 0
