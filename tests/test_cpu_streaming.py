"""The CPU engine (qwen_tts reference model) streams: same audio as qwen_tts's own
whole-sentence generation, delivered in growing chunks, and it stops at the next frame
when its client is gone. The real model on the tiny checkpoints, in process."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.common.audio import SAMPLES_PER_FRAME
from wyoming_qwen3tts.engine import Segment
from wyoming_qwen3tts.engine.cpu.reference import MAX_CHUNK_FRAMES, ReferenceEngine
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference

from .conftest import CLONE_TRANSCRIPT

TEXT = "Hello there, this is a streamed sentence."


def _engine(checkpoints: Path, kind: ModelKind) -> tuple[ReferenceEngine, object]:
    from qwen_tts import Qwen3TTSModel

    qwen = Qwen3TTSModel.from_pretrained(str(checkpoints / kind.value), device_map="cpu", dtype=torch.float32)
    return ReferenceEngine(kind, qwen, chunk_frames=2), qwen


def _clone_reference() -> Reference:
    t = np.arange(2 * 24000) / 24000
    tone = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    return Reference.from_audio(tone, 24000, CLONE_TRANSCRIPT)


@pytest.mark.parametrize("kind", [ModelKind.VOICE_DESIGN, ModelKind.BASE])
def test_streamed_audio_equals_the_whole_sentence(checkpoints: Path, kind: ModelKind) -> None:
    """Chunk by chunk (2, 4, 8, 16, 16... frames), the audio is qwen_tts's own
    ``generate_*`` output for the same seed, to float rounding (an ICL clone's decode has
    its reference codes as context, as qwen_tts's has)."""
    engine, qwen = _engine(checkpoints, kind)
    reference = _clone_reference() if kind is ModelKind.BASE else None
    segment = Segment(TEXT, "english", max_new_tokens=35, seed=11, instruct="A calm voice.", reference=reference)
    chunks = list(engine.stream(segment))
    sizes = [len(c) // SAMPLES_PER_FRAME for c in chunks]
    assert all(len(c) % SAMPLES_PER_FRAME == 0 for c in chunks)
    assert sizes[:4] == [2, 4, 8, 16] and max(sizes) == MAX_CHUNK_FRAMES and sum(sizes) == 34
    torch.manual_seed(11)
    common = dict(language="english", max_new_tokens=35, non_streaming_mode=True)
    if kind is ModelKind.BASE:
        wavs, _ = qwen.generate_voice_clone(text=TEXT, voice_clone_prompt=engine.prompts.get(reference), **common)  # type: ignore[attr-defined]
    else:
        wavs, _ = qwen.generate_voice_design(text=TEXT, instruct="A calm voice.", **common)  # type: ignore[attr-defined]
    whole = np.asarray(wavs[0], dtype=np.float32)
    streamed = np.concatenate(chunks)
    assert streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() < 1e-4 < np.abs(whole).max()


def test_cancel_stops_at_the_next_frame(checkpoints: Path) -> None:
    """The client's cancel flag is checked at every frame: raised after the first chunk, the
    generation ends one or two frames later, far from its cap."""
    engine, _ = _engine(checkpoints, ModelKind.VOICE_DESIGN)
    gone = threading.Event()
    made = []

    def cancelled() -> bool:
        """The client's flag, as serve() installs it from the work's sink. The generating
        helper thread checks it after every frame; from its second frame on it waits there
        until the client has left, so that the frames made before the cancel do not depend
        on how long this thread takes to get its first chunk and set the flag (on a loaded
        machine the helper ran ahead meanwhile, past the bound checked below). A helper that
        does not check the flag at every frame is not held, and runs on to its cap."""
        if threading.current_thread().name == "qwen-tts-generate" and made and made[0].made >= 2:
            gone.wait(60)
        return gone.is_set()

    engine._cancelled = cancelled

    def spy(run: object) -> None:
        made.append(run)
        original(run)

    original = engine._generate
    engine._generate = spy  # type: ignore[method-assign]
    stream = engine.stream(Segment(TEXT, "english", max_new_tokens=400, seed=3, instruct="A calm voice."))
    first = next(stream)
    gone.set()
    rest = list(stream)
    assert len(first) == 2 * SAMPLES_PER_FRAME and rest == []
    assert made[0].made <= 2 + 3  # type: ignore[attr-defined]
