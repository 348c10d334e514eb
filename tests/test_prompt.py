"""The prompt builder against faster-qwen3-tts's own builders (``_prepare_generation`` and
``_prepare_generation_custom``, ``non_streaming_mode=True``), on the real tiny models in
float32: the same embeddings bit for bit, for every voice kind, first build and cached
pieces alike, and the same errors. Under ``pytest -m gpu`` also on CUDA, where the pieces
are built on one thread's stream and read on another's."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from wyoming_qwen3tts.engine import Segment
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.engine.batched.prompt import PIECES_KEPT, Prompt, PromptBuilder
from wyoming_qwen3tts.common.vocabulary import ModelKind
from wyoming_qwen3tts.catalogue.voices import load_reference

from .engine_driver import load_tiny

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

#: Texts whose tokens meet the template's edges: a leading newline (BPE joins it with the
#: role's), trailing spaces and newlines, punctuation, other scripts, a single character.
TEXTS = [
    "Hello there, the kitchen lights are now off for the night.",
    "\nA line that starts with a newline.",
    "Trailing spaces and a newline  \n",
    "Zürich, 12:30 Uhr — the \"quoted\" part; and (brackets)!",
    "你好，今天天气很好。",
    "x",
]


@pytest.fixture(scope="module", params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return str(request.param)


@pytest.fixture(scope="module")
def engines(checkpoints: Path, device: str) -> Iterator[dict[ModelKind, BatchedEngine]]:
    yield {kind: load_tiny(checkpoints / kind.value, kind, slots=1, device=device) for kind in ModelKind}


def library(engine: BatchedEngine, segment: Segment) -> Prompt:
    """The prompt as faster-qwen3-tts builds it (the code this builder replaced)."""
    tts = engine.builder._tts
    with torch.inference_mode():
        if engine.kind is ModelKind.BASE:
            reference = segment.reference
            assert reference is not None
            out = tts._prepare_generation(
                text=segment.text, language=segment.language, ref_text=reference.transcript or "",
                non_streaming_mode=True, voice_clone_prompt=engine.prompts.get(reference),
            )
            return Prompt(out[3][0], out[6].reshape(-1), out[7])
        instruct = segment.instruct
        if engine.kind is ModelKind.VOICE_DESIGN:
            instruct = instruct or ""
        elif engine._model.tts_model_size in "0b6":  # the 0.6B CustomVoice takes no instruct
            instruct = None
        out = tts._prepare_generation_custom(
            text=segment.text, language=segment.language,
            speaker=segment.speaker if engine.kind is ModelKind.CUSTOM_VOICE else None,
            instruct=instruct, non_streaming_mode=True,
        )
        return Prompt(out[3][0], out[6].reshape(-1))


def same(ours: Prompt, theirs: Prompt) -> None:
    assert ours.embeds.dtype == theirs.embeds.dtype and ours.embeds.shape == theirs.embeds.shape
    assert torch.equal(ours.embeds, theirs.embeds)
    assert torch.equal(ours.pad_embed, theirs.pad_embed)
    if theirs.ref_codes is None:
        assert ours.ref_codes is None
    else:
        assert ours.ref_codes is not None and torch.equal(ours.ref_codes, theirs.ref_codes)


def cases(kind: ModelKind, voices_dir: Path) -> list[Segment]:
    out: list[Segment] = []
    for text in TEXTS:
        for language in ("english", "auto", "chinese"):
            if kind is ModelKind.BASE:
                for clip in ("clone.wav", "xvec.wav"):
                    out.append(Segment(text, language, 8, reference=load_reference(voices_dir / clip)))
            elif kind is ModelKind.CUSTOM_VOICE:
                out.append(Segment(text, language, 8, speaker="ryan"))
                out.append(Segment(text, language, 8, speaker="Ryan", instruct="Whisper."))
            else:
                out.append(Segment(text, language, 8, instruct="A calm, low voice."))
                out.append(Segment(text, language, 8, instruct=None))
    return out


@pytest.mark.parametrize("kind", list(ModelKind), ids=lambda k: k.value)
def test_prompts_equal_the_librarys_bit_for_bit(engines: dict[ModelKind, BatchedEngine], voices_dir: Path, kind: ModelKind) -> None:
    engine = engines[kind]
    for segment in cases(kind, voices_dir):
        first = engine.builder.build(segment)
        same(first, library(engine, segment))
        same(engine.builder.build(segment), first)  # from the cached pieces


def test_a_clone_prompt_carries_its_references_codes_and_key(engines: dict[ModelKind, BatchedEngine], voices_dir: Path) -> None:
    reference = load_reference(voices_dir / "clone.wav")
    prompt = engines[ModelKind.BASE].builder.build(Segment("Hello.", "english", 8, reference=reference))
    assert prompt.ref_codes is not None and prompt.ref_codes.shape[1] == 16
    assert prompt.ref_key == reference.digest
    xvec = engines[ModelKind.BASE].builder.build(Segment("Hello.", "english", 8, reference=load_reference(voices_dir / "xvec.wav")))
    assert xvec.ref_codes is None and xvec.ref_key is None


@pytest.mark.parametrize(("kind", "change", "error"), [
    (ModelKind.CUSTOM_VOICE, dict(language="klingon"), ValueError),
    (ModelKind.CUSTOM_VOICE, dict(speaker="nobody"), ValueError),
    (ModelKind.VOICE_DESIGN, dict(language="klingon"), ValueError),
    (ModelKind.BASE, dict(language="klingon"), NotImplementedError),
    (ModelKind.BASE, dict(reference=None), ValueError),
], ids=["custom-language", "custom-speaker", "design-language", "base-language", "base-no-reference"])
def test_unknown_languages_and_speakers_fail(
    engines: dict[ModelKind, BatchedEngine], voices_dir: Path, kind: ModelKind, change: dict[str, Any], error: type[Exception],
) -> None:
    fields: dict[str, Any] = dict(text="Hello.", language="english", max_new_tokens=8)
    if kind is ModelKind.CUSTOM_VOICE:
        fields["speaker"] = "ryan"
    if kind is ModelKind.BASE:
        fields["reference"] = load_reference(voices_dir / "clone.wav")
    fields.update(change)
    segment = Segment(**fields)
    with pytest.raises(error):
        engines[kind].builder.build(segment)
    if "reference" not in change:  # the library fails too (its own checks: NotImplementedError)
        with pytest.raises((ValueError, NotImplementedError)):
            library(engines[kind], segment)


def test_instructs_beyond_the_cache_are_built_again_the_same(engines: dict[ModelKind, BatchedEngine]) -> None:
    engine = engines[ModelKind.VOICE_DESIGN]
    builder: PromptBuilder = engine.builder
    first = Segment("Hello.", "english", 8, instruct="voice 0")
    kept = builder.build(first)
    for i in range(1, PIECES_KEPT + 2):
        builder.build(Segment("Hello.", "english", 8, instruct=f"voice {i}"))
    assert len(builder._instructs) == PIECES_KEPT and "voice 0" not in builder._instructs
    same(builder.build(first), kept)
    same(kept, library(engine, first))


def test_threads_building_at_once_get_the_librarys_prompts(engines: dict[ModelKind, BatchedEngine], voices_dir: Path, device: str) -> None:
    """Four threads (on CUDA each on a stream of its own, as the prompt worker, a clip's
    preparation and the warm-up are) build the same mix while the pieces are made."""
    engine = engines[ModelKind.BASE]
    engine.builder = PromptBuilder(ModelKind.BASE, engine.builder._tts, engine.prompts)  # no pieces yet
    segments = cases(ModelKind.BASE, voices_dir)[:8]
    expected = [library(engine, s) for s in segments]
    results: dict[int, list[Prompt]] = {}
    errors: list[BaseException] = []

    def build(n: int) -> None:
        try:
            stream = torch.cuda.Stream() if device == "cuda" else None
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                results[n] = [engine.builder.build(s) for s in segments]
            if stream is not None:
                stream.synchronize()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=build, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for n in range(4):
        for ours, theirs in zip(results[n], expected, strict=True):
            same(ours, theirs)

