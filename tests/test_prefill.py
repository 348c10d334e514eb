"""The graph-shaped prefill (``engine/batched/prefill.py``) on the real tiny VoiceDesign model, float32,
eager on the CPU (the same body is captured per (rows, token bucket) on CUDA): it matches the
talker's own forward, leaves padded positions out of the cache, and joins under the planner."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.engine import Sampling, Segment
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.engine.batched.planner import Planner
from wyoming_qwen3tts.common.vocabulary import ModelKind
from wyoming_qwen3tts.catalogue.voices import load_reference

from .engine_driver import Collect, load_tiny, run

INSTRUCT = "A calm, low voice."


@pytest.fixture(scope="module")
def design(checkpoints: Path) -> BatchedEngine:
    return load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN)


@pytest.fixture(scope="module", params=[
    "cpu", pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("cuda-turns", marks=pytest.mark.gpu),
])
def either(request: pytest.FixtureRequest, checkpoints: Path, design: BatchedEngine) -> BatchedEngine:
    """The CPU engine; on CUDA one whose prefill graphs were all captured at start, or one
    that, like a model taking turns on the card, captured them for a lone row only (a
    prefill of more rows runs the same forward eagerly)."""
    if request.param == "cpu":
        return design
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    request.addfinalizer(lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", saved))
    if request.param == "cuda-turns":
        from wyoming_qwen3tts.engine.gpu.sizing import TURNS_GRAPH_ROWS

        engine = load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, device="cuda",
                           prefill_graph_rows=TURNS_GRAPH_ROWS)
        assert len(engine.prefill.graphs) == TURNS_GRAPH_ROWS * len(engine.prefill.token_buckets)
        return engine
    engine = load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, device="cuda")
    assert len(engine.prefill.graphs) == engine.prefill.max_rows * len(engine.prefill.token_buckets)
    return engine


def seg(text: str, seed: int = 1, frames: int = 8, **kw: Any) -> Segment:
    kw.setdefault("instruct", INSTRUCT)
    return Segment(text, "english", max_new_tokens=frames, min_new_tokens=frames, seed=seed, **kw)


@contextlib.contextmanager
def replay_sizes(engine: BatchedEngine) -> Iterator[list[int]]:
    """The rows of each prefill the engine runs inside the block, in order."""
    sizes: list[int] = []
    real = engine.prefill.run

    def spy(start: int, batch: list[Any], on_decoder: Any = None) -> list[int]:
        sizes.append(len(batch))
        return real(start, batch, on_decoder)

    engine.prefill.run = spy  # type: ignore[method-assign]
    try:
        yield sizes
    finally:
        del engine.prefill.run


def test_bucketed_prefill_equals_the_talkers_own_forward(either: BatchedEngine) -> None:
    """Three prompts of different lengths, right-padded to one bucket: every row's keys and
    values of its own positions, last hidden state and logits equal those of the library's
    left-padded forward; positions past a prompt keep what the slot held (on CUDA: a replay
    of the graph captured for (3 rows, the bucket))."""
    design = either
    prefill, s = design.prefill, design.state
    batch = [(x, design.builder.build(x)) for x in (
        seg("Short."), seg("A somewhat longer sentence than that.", instruct="A bright, fast voice with a lilt."),
        seg("Middle length, this one."),
    )]
    lengths = [p.embeds.shape[0] for _, p in batch]
    assert len(set(lengths)) == 3 and prefill.bucket(max(lengths)) is not None
    with torch.inference_mode():
        for t in s.keys + s.values:
            t.fill_(7.0)
        hidden, logits = prefill._eager(0, batch, lengths)  # the library's forward into slots 0-2
        expected = [(k[:3].clone(), v[:3].clone()) for k, v in zip(s.keys, s.values, strict=True)]
        hidden, logits = hidden.clone(), logits.clone()
        for t in s.keys + s.values:
            t.fill_(7.0)
        assert prefill.run(0, batch) == lengths
    if design.use_graphs:
        torch.cuda.synchronize()
    assert prefill.eager_fallbacks == 0
    torch.testing.assert_close(prefill._hidden[:3], hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(prefill._logits[:3], logits, atol=1e-4, rtol=1e-5)
    for (keys, values), k, v in zip(expected, s.keys, s.values, strict=True):
        for row, length in enumerate(lengths):
            torch.testing.assert_close(k[row, :, :length], keys[row, :, :length], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v[row, :, :length], values[row, :, :length], atol=1e-5, rtol=1e-5)
            assert bool((k[row, :, length:] == 7.0).all()) and bool((v[row, :, length:] == 7.0).all())
        assert bool((k[3:] == 7.0).all())  # a slot no row owns is untouched


def test_a_prompt_over_the_largest_bucket_falls_back_to_eager_with_the_same_audio(design: BatchedEngine) -> None:
    segment = seg("Falls back, same audio.", seed=4)
    bucketed = Collect()
    run(design, {0: [(segment, bucketed)]})
    buckets = design.prefill.token_buckets
    counted: list[int] = []
    design._on_eager_prefill = counted.append  # the metric's observer (tts_prefill_eager_rows)
    design.prefill.token_buckets = [8]  # shorter than any prompt here
    try:
        eager = Collect()
        run(design, {0: [(segment, eager)]})
    finally:
        design.prefill.token_buckets = buckets
        design._on_eager_prefill = None
    assert design.prefill.eager_fallbacks >= 1 and counted == [1]
    np.testing.assert_allclose(eager.pcm, bucketed.pcm, atol=1e-4)


def test_a_burst_joins_one_replay_per_step_and_each_gets_its_own_audio(design: BatchedEngine) -> None:
    """Four slots, a planner of two rows a replay: one request runs, three arrive at once;
    two join at the next step, the third a step later; each gets what it gets alone."""
    segments = [seg(f"Burst request {i}.", seed=20 + i) for i in range(4)]
    alone = []
    for segment in segments:
        sink = Collect()
        run(design, {0: [(segment, sink)]})
        alone.append(sink.pcm)
    saved = design.planner
    design.planner = Planner(max_join=2, guard_ms=-1e9)
    try:
        with replay_sizes(design) as sizes:
            sinks = [Collect() for _ in segments]
            run(design, {0: [(segments[0], sinks[0])], 1: [(x, k) for x, k in zip(segments[1:], sinks[1:], strict=True)]})
    finally:
        design.planner = saved
    assert sizes == [1, 2, 1]
    for sink, pcm in zip(sinks, alone, strict=True):
        assert sink.error is None
        np.testing.assert_allclose(sink.pcm, pcm, atol=1e-4)


def test_a_failed_prefill_fails_only_its_rows(design: BatchedEngine) -> None:
    runner, expected = seg("Keeps running.", seed=8, frames=10), Collect()
    run(design, {0: [(runner, expected)]})
    real = design.prefill.graphs.run
    calls = {"n": 0}

    def broken(rows: int, length: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("prefill broke")
        real(rows, length)

    design.prefill.graphs.run = broken  # type: ignore[method-assign, assignment]
    try:
        kept, lost, cancelled = Collect(), Collect(), Collect()
        cancelled.cancel = True  # left before its prefill: never started
        run(design, {0: [(runner, kept)], 2: [(seg("Fails.", seed=9), lost), (seg("Gone.", seed=10), cancelled)]})
    finally:
        del design.prefill.graphs.run
    assert lost.error is not None and "prefill broke" in str(lost.error)
    assert cancelled.frames == 0 and cancelled.error is None
    assert kept.error is None
    np.testing.assert_allclose(kept.pcm, expected.pcm, atol=1e-4)


def test_a_burst_of_32_joins_while_two_stream(checkpoints: Path) -> None:
    """34 slots: two requests stream, 32 arrive at once. They join in replays of at most 8
    rows (as many per step as the running streams' buffers allow), every one ends with its
    frames, and the ones checked get exactly the audio they get alone."""
    engine = load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, slots=34)
    running = [(seg(f"Streaming {i}.", seed=40 + i, frames=12), Collect()) for i in range(2)]
    burst = [(seg(f"Burst {i}.", seed=50 + i, frames=4), Collect()) for i in range(32)]
    with replay_sizes(engine) as sizes:
        run(engine, {0: running, 2: burst})
    assert sizes[0] == 2 and sum(sizes[1:]) == 32 and max(sizes) <= 8
    for segment, sink in running + burst:
        assert sink.error is None and sink.frames == segment.max_new_tokens
    for segment, sink in (running[0], burst[0], burst[31]):
        alone = Collect()
        run(engine, {0: [(segment, alone)]})
        np.testing.assert_allclose(sink.pcm, alone.pcm, atol=1e-4)


def test_a_cancel_right_after_its_prefill_frees_the_slot_for_the_next(design: BatchedEngine) -> None:
    """A request cancelled after its prefill ran, before its first frame reached it, ends with
    no audio; its slot goes to the next request at once; the stream beside it is unchanged."""
    runner, expected = seg("Streams beside it.", seed=30, frames=10), Collect()
    run(design, {0: [(runner, expected)]})
    nxt, nxt_alone = seg("Takes the slot.", seed=32, frames=6), Collect()
    run(design, {0: [(nxt, nxt_alone)]})
    kept, cancelled, later = Collect(), Collect(), Collect()
    run(design, {0: [(runner, kept)], 2: [(seg("Cancelled mid-join.", seed=31), cancelled)], 4: [(nxt, later)]},
        cancel={3: [cancelled]})
    assert cancelled.frames == 0 and cancelled.error is None and not cancelled.chunks
    assert kept.error is None and later.error is None
    np.testing.assert_allclose(kept.pcm, expected.pcm, atol=1e-4)
    np.testing.assert_allclose(later.pcm, nxt_alone.pcm, atol=1e-4)


def test_chunks_grow_from_one_frame_up_to_the_chunk_size(checkpoints: Path) -> None:
    """With ``chunk_growth``: chunks of 1, 2, 4, 8 frames, then 8 each, the last what is left;
    the audio is the same as in one-frame chunks."""
    engine = load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, slots=2, chunk_frames=8)
    segment = seg("Growing chunks.", seed=3, frames=21)
    engine.chunk_growth = True
    grown = Collect()
    run(engine, {0: [(segment, grown)]})
    assert [len(c) // 1920 for c in grown.chunks] == [1, 2, 4, 8, 6]
    engine.chunk_growth, engine.chunk_frames = False, 1
    ones = Collect()
    run(engine, {0: [(segment, ones)]})
    assert [len(c) // 1920 for c in ones.chunks] == [1] * 21
    np.testing.assert_allclose(grown.pcm, ones.pcm, atol=1e-4)


def test_icl_and_xvector_clones_with_their_own_settings_join_in_one_replay(checkpoints: Path, voices_dir: Path) -> None:
    """One replay of three Base rows, started together: an ICL clone (its codec decoder state
    loaded from its reference), an x-vector clone (state reset) and another ICL clone with
    other sampling settings (each row's settings land in its own slot). Each gets exactly
    the audio it gets alone."""
    base = load_tiny(checkpoints / "base", ModelKind.BASE, slots=4)
    clone, xvec = (load_reference(voices_dir / name) for name in ("clone.wav", "xvec.wav"))
    greedy = Sampling.greedy()
    segments = [
        Segment("An in-context clone.", "english", 8, 8, seed=5, reference=clone),
        Segment("An x-vector clone.", "english", 8, 8, seed=6, reference=xvec),
        Segment("Greedy, in context.", "english", 8, 8, seed=7, reference=clone, sampling=greedy),
    ]
    alone = []
    for segment in segments:
        sink = Collect()
        run(base, {0: [(segment, sink)]})
        alone.append(sink.pcm)
    sinks = [Collect() for _ in segments]
    with replay_sizes(base) as sizes:
        codes = run(base, {0: list(zip(segments, sinks, strict=True))}, record_codes=True)
    assert sizes == [3]
    assert not np.allclose(alone[0], alone[2])  # the settings differ, and so does the audio
    for row, (segment, sink, pcm) in enumerate(zip(segments, sinks, alone, strict=True)):
        assert sink.error is None
        np.testing.assert_allclose(sink.pcm, pcm, atol=1e-4)
        # and it is the codec's own decode of the row's codes, after its reference's codes
        # for an ICL clone: the decoder state each row started from was its own
        ours = torch.from_numpy(np.stack(codes[row][:8]))
        ref_codes = base.builder.build(segment).ref_codes
        assert (ref_codes is not None) is (row != 1)
        whole_codes = ours if ref_codes is None else torch.cat([ref_codes.cpu(), ours])
        (whole,), _sr = base._model.speech_tokenizer.decode([{"audio_codes": whole_codes}])
        np.testing.assert_allclose(sink.pcm, np.asarray(whole)[-8 * 1920 :], atol=1e-4)
