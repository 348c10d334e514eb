"""Clone clips prepared when they appear (``clips.ClipPreparer``), on the real batched engine
(tiny Base checkpoint, on the CPU): at start, when a clip is added or changed, and again when
a model taking turns comes back; the first request then encodes nothing."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from wyoming_qwen3tts.service.clips import ClipPreparer
from wyoming_qwen3tts.engine import Engine, Segment, load_engine
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.engine.gpu.on_demand import OnDemandEngine
from wyoming_qwen3tts.common.metrics import Metrics
from wyoming_qwen3tts.service.speech import SpeechRequest, TtsService
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference
from wyoming_qwen3tts.catalogue.voices import VoiceCatalog, load_reference


def _load(checkpoints: Path) -> BatchedEngine:
    engine = load_engine(ModelKind.BASE, checkpoints / "base", "cpu", 1, "batched", 2, dtype="float32", max_len=512)
    assert isinstance(engine, BatchedEngine)
    return engine


def _warm_segment(_engine: Engine | None = None) -> Segment:
    tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)
    return Segment("Hello.", "auto", 2, seed=0, reference=Reference.from_audio(tone, 24000, None))


def _clones(catalog: VoiceCatalog) -> Any:
    return lambda: [v.reference for v in catalog.voices() if v.reference is not None]


def _prepared(engine: BatchedEngine, reference: Reference) -> bool:
    """Its speaker prompt is cached, and for an ICL clip the decoder's state after its codes."""
    cached = reference.digest in engine.prompts._cache
    return cached and (reference.transcript is None or reference.digest in engine.prefill._prefixes)


async def test_clips_are_prepared_at_start_and_when_added_or_changed(
    checkpoints: Path, voices_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "voices"
    folder.mkdir()
    for name in ("clone.wav", "clone.txt", "xvec.wav"):
        shutil.copy(voices_dir / name, folder / name)
    engine = _load(checkpoints)
    engine.warm(_warm_segment())
    catalog = VoiceCatalog(folder, {ModelKind.BASE})
    preparer = ClipPreparer(engine, [_clones(catalog)], catalog.refresh)
    assert await preparer.prepare_new() == 2
    for name in ("clone", "xvec"):
        reference = catalog.get(name).reference
        assert reference is not None and _prepared(engine, reference), name
    assert await preparer.prepare_new() == 0  # once each

    encodes: list[int] = []
    qwen = engine.prompts._qwen
    real = qwen.create_voice_clone_prompt
    monkeypatch.setattr(qwen, "create_voice_clone_prompt", lambda **kw: (encodes.append(1), real(**kw))[1])
    service = TtsService(catalog, {ModelKind.BASE: engine}, "clone", Metrics())
    preparer.start()
    try:
        samples = 0
        async for chunk in service.speak(SpeechRequest(voice="clone"), "The first request for this clip."):
            samples += len(chunk)
        assert samples > 0 and encodes == []  # nothing left to encode at its first request

        before = catalog.get("clone").reference
        assert before is not None
        t = np.arange(2 * 24000) / 24000
        sf.write(folder / "fresh.wav", (0.2 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 24000)
        (folder / "fresh.txt").write_text("A fresh clip for the library.")
        sf.write(folder / "clone.wav", (0.3 * np.sin(2 * np.pi * 210 * t)).astype(np.float32), 24000)  # changed
        deadline = time.monotonic() + 60  # a hang guard: the preparer looks every POLL_S
        while time.monotonic() < deadline:
            found, clone = catalog.find("fresh"), catalog.find("clone")  # the preparer re-reads the folder
            fresh = found.reference if found is not None else None
            changed = clone.reference if clone is not None else None
            if changed is not None and changed.digest == before.digest:
                changed = None  # not re-read yet
            if fresh is not None and changed is not None and _prepared(engine, fresh) and _prepared(engine, changed):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the added and the changed clip were not prepared")
        prepared_encodes = len(encodes)
        async for _chunk in service.speak(SpeechRequest(voice="fresh"), "The fresh clip speaks."):
            pass
        assert len(encodes) == prepared_encodes  # its first request encoded nothing either
    finally:
        await preparer.stop()
        await asyncio.to_thread(service.stop)


def test_a_model_taking_turns_prepares_its_clips_again_at_every_load(checkpoints: Path, voices_dir: Path) -> None:
    engine = OnDemandEngine(ModelKind.BASE, 1, lambda shrink=1.0: _load(checkpoints), _warm_segment, idle_s=None)
    engine.warm(_warm_segment())
    reference = load_reference(voices_dir / "clone.wav")
    assert engine.prime(reference)
    assert isinstance(engine.inner, BatchedEngine) and _prepared(engine.inner, reference)
    engine._drop("a test")
    assert not engine.resident and not engine.prime(load_reference(voices_dir / "xvec.wav"))  # kept for the next load
    engine._bring_in()
    assert isinstance(engine.inner, BatchedEngine) and engine.loads == 2
    assert _prepared(engine.inner, reference) and _prepared(engine.inner, load_reference(voices_dir / "xvec.wav"))
    engine.forget({reference.digest})
    engine._drop("a test")
    engine._bring_in()
    assert isinstance(engine.inner, BatchedEngine)
    assert _prepared(engine.inner, reference) and not _prepared(engine.inner, load_reference(voices_dir / "xvec.wav"))


def test_a_closed_engine_holds_no_weights_slots_or_graphs(checkpoints: Path) -> None:
    engine = _load(checkpoints)
    engine.warm(_warm_segment())
    engine.close()
    assert all(p.numel() == 0 for p in engine._model.parameters())
    assert all(t.numel() == 0 for t in engine.state.tensors()) and len(engine.graphs) == 0
