"""GPU memory: stream sizing, residency, driver and dtype checks, the out-of-memory path and
the on-demand VoiceDesign model (real engines on the tiny checkpoints, on the CPU)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.__main__ import build_parser
from wyoming_qwen3tts.engine import Engine, Segment, load_engine
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.engine.gpu.cuda_env import CUDA12_INSTALL, driver_problem, parse_cuda_version, pick_dtype
from wyoming_qwen3tts.engine.loader import checkpoint_params, checkpoint_slot_bytes, checkpoint_speakers, slot_bytes
from wyoming_qwen3tts.engine.gpu.lease import GpuLease
from wyoming_qwen3tts.engine.gpu.on_demand import OnDemandEngine
from wyoming_qwen3tts.engine.gpu.sizing import (
    DRIVER_HEADROOM_BYTES,
    GB,
    WORKSPACE_BYTES,
    ModelNeed,
    cap_fraction,
    memory_budget,
    plan_residency,
    plan_streams,
    slot_positions,
)
from wyoming_qwen3tts.common.metrics import Metrics
from wyoming_qwen3tts.service.speech import OOM_ADVICE, SpeechRequest, TtsService
from wyoming_qwen3tts.service.errors import GenerationError
from wyoming_qwen3tts.common.audio import FRAMES_PER_SECOND
from wyoming_qwen3tts.common.vocabulary import MAX_SEGMENT_SECONDS, MAX_REFERENCE_SECONDS, ModelKind
from wyoming_qwen3tts.text.segmenter import frame_budget
from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

MB = 1_000_000


# --- sizing ------------------------------------------------------------------------------


def test_slot_positions_hold_the_longest_clone_segment() -> None:
    positions = slot_positions()
    reference_codes = MAX_REFERENCE_SECONDS * FRAMES_PER_SECOND
    speech = MAX_SEGMENT_SECONDS * FRAMES_PER_SECOND
    assert positions % 128 == 0
    assert positions >= reference_codes + 1.5 * speech  # codes of the reference + the speech
    assert positions < 2048  # half faster-qwen3-tts's default: twice the streams per GB
    assert slot_positions(reference_seconds=0, segment_seconds=5) < positions


def test_streams_fill_the_memory_after_the_workspace() -> None:
    plan = plan_streams(free=4 * GB, slot_bytes=120 * MB)
    assert plan.fits and plan.streams == (4 * GB - WORKSPACE_BYTES) // (120 * MB)
    assert "120 MB a stream" in plan.reason and "3.0 GB free" not in plan.reason


def test_streams_are_capped_and_reserve_counts() -> None:
    assert plan_streams(free=80 * GB, slot_bytes=120 * MB).streams == 32
    with_reserve = plan_streams(free=4 * GB, slot_bytes=120 * MB, reserve=2 * GB)
    assert with_reserve.streams == (2 * GB - WORKSPACE_BYTES) // (120 * MB)
    assert "kept for the VoiceDesign model" in with_reserve.reason


def test_no_room_is_a_plan_that_does_not_fit() -> None:
    from wyoming_qwen3tts.engine.gpu.sizing import LEAN_WORKSPACE_BYTES

    plan = plan_streams(free=LEAN_WORKSPACE_BYTES + 10 * MB, slot_bytes=120 * MB)
    assert not plan.fits and plan.streams == 0 and "not even 1 stream" in plan.reason
    with pytest.raises(ValueError):
        plan_streams(free=GB, slot_bytes=0)


def test_asked_streams_say_whether_they_fit() -> None:
    assert plan_streams(free=8 * GB, slot_bytes=GB, asked=4).fits
    assert not plan_streams(free=4 * GB, slot_bytes=GB, asked=8).fits


def test_a_model_loaded_again_keeps_its_streams_unless_the_memory_moved_more_than_a_stream() -> None:
    from wyoming_qwen3tts.engine.gpu.sizing import steady_streams

    assert steady_streams(11, None) == 11
    assert [steady_streams(p, 11) for p in (10, 11, 12, 13)] == [11, 11, 11, 11]
    assert steady_streams(9, 11) == 9 and steady_streams(14, 11) == 14  # a real change follows the plan


def test_a_model_loaded_again_takes_what_fitted_after_an_earlier_out_of_memory() -> None:
    """The 6 GB H200 log: planned 14-16 streams at every swap, 9 fitted after the retry. The
    next load takes 9 at once; only more memory than a stream's worth lifts the cap."""
    from wyoming_qwen3tts.engine.gpu.sizing import after_out_of_memory

    slot = 120 * 10**6
    fitted = (int(2.7 * GB), 9)
    assert after_out_of_memory(14, int(2.6 * GB), None, slot) == 14  # never ran out: the plan
    assert after_out_of_memory(14, int(2.6 * GB), fitted, slot) == 9
    assert after_out_of_memory(16, int(2.7 * GB) + slot, fitted, slot) == 9  # within a stream
    assert after_out_of_memory(6, int(2.0 * GB), fitted, slot) == 6  # less memory: the smaller plan
    assert after_out_of_memory(30, int(6.0 * GB), fitted, slot) == 30  # the other process let go


def test_one_stream_takes_a_lean_workspace_only_where_the_full_one_leaves_no_room() -> None:
    """The Base model back after a swap with 4 GB free: 1.0 GB beside its weights, which the
    1.0 GB workspace filled; one stream with the lean workspace fits. More memory: the full
    workspace as before; less than the lean one and a stream: no fit. A fixed --max-streams
    is judged with the full workspace."""
    from wyoming_qwen3tts.engine.gpu.sizing import LEAN_WORKSPACE_BYTES, WORKSPACE_BYTES

    slot = 120 * 10**6
    lean = plan_streams(free=int(1.0 * GB), slot_bytes=slot)
    assert lean.fits and lean.streams == 1 and "lean workspace" in lean.reason
    full = plan_streams(free=int(1.5 * GB), slot_bytes=slot)
    assert full.streams == (int(1.5 * GB) - WORKSPACE_BYTES) // slot and "lean" not in full.reason
    assert not plan_streams(free=LEAN_WORKSPACE_BYTES + slot - 1, slot_bytes=slot).fits
    assert not plan_streams(free=int(1.0 * GB), slot_bytes=slot, asked=1).fits


def test_a_model_taking_turns_is_judged_by_what_the_home_models_load_left() -> None:
    """4 GB free on the H200: the Base model's load had about 1.12 GB beside its weights (one
    stream and the full workspace, just); the VoiceDesign model, as large, would have less once
    the context grew: it is not swapped in. With 6 GB free (2.8 GB beside) it is."""
    from wyoming_qwen3tts.engine.gpu.sizing import ModelNeed, turns_fit

    weights, slot = int(2.2 * GB), 120 * 10**6
    design = ModelNeed("voice_design", weights, slot)
    why = turns_fit(int(1.13 * GB), weights, design)
    assert why is not None and "voice_design model does not fit when the other model leaves" in why
    assert turns_fit(int(2.8 * GB), weights, design) is None
    bigger = ModelNeed("voice_design", weights + int(1.0 * GB), slot)  # e.g. bfloat16 beside int8
    assert turns_fit(int(2.0 * GB), weights, bigger) is not None


def test_budget_respects_the_cap_not_the_card() -> None:
    # an H200 (140 GB) capped at 8 GB, 4 GB already allocated: 4 GB left, not 130
    assert memory_budget(140 * GB, 4 * GB, 130 * GB, 8.0) == 4 * GB
    assert memory_budget(140 * GB, 4 * GB, 130 * GB, None) == 130 * GB
    assert memory_budget(140 * GB, 9 * GB, 130 * GB, 8.0) == 0
    assert cap_fraction(8, 140 * GB) == pytest.approx(8 / 140)
    for bad in (0, 200):
        with pytest.raises(ValueError):
            cap_fraction(bad, 140 * GB)


def _needs(base_gb: float, design_gb: float = 4.2) -> list[ModelNeed]:
    return [ModelNeed("base", int(base_gb * GB), 130 * MB), ModelNeed("voice_design", int(design_gb * GB), 130 * MB)]


def test_residency_by_card() -> None:
    on_8 = plan_residency(_needs(4.2), int(7.6 * GB))
    assert on_8.design == "turns" and on_8.reserves == {"base": 0, "voice_design": 0}
    assert "0.6B-Base" in on_8.reason
    on_12 = plan_residency(_needs(4.2), int(11.5 * GB))
    assert on_12.design == "resident"
    # the Base model's sizing keeps the VoiceDesign model's weights, workspace and share, and
    # both keep the driver's headroom (cuBLAS handles of threads that start later)
    share = (int(11.5 * GB) - 2 * (int(4.2 * GB) + WORKSPACE_BYTES) - DRIVER_HEADROOM_BYTES) // 2
    assert on_12.reserves == {
        "base": int(4.2 * GB) + WORKSPACE_BYTES + share + DRIVER_HEADROOM_BYTES, "voice_design": DRIVER_HEADROOM_BYTES,
    }
    # 8 GB with int8 weights (2.2 GB each): together with the headroom, just
    assert plan_residency(_needs(2.2, 2.2), int(7.5 * GB)).design == "resident"
    tight = sum(n.footprint(2) for n in _needs(2.2, 2.2))
    assert plan_residency(_needs(2.2, 2.2), tight).design == "turns"  # fitted to the last byte: not together
    # the 0.6B Base model (2.2 GB with the codec) fits next to the VoiceDesign model on a 10 GB card
    assert plan_residency(_needs(2.2), int(9.5 * GB)).design == "resident"
    assert plan_residency(_needs(2.2), int(9.5 * GB), "on-demand").design == "on-demand"
    assert plan_residency(_needs(4.2), int(7.6 * GB), "resident").design == "resident"
    alone = plan_residency(_needs(4.2)[:1], int(7.6 * GB))
    assert alone.design == "none" and alone.reserves == {"base": 0}  # no headroom kept for a model alone
    with pytest.raises(ValueError):
        plan_residency(_needs(4.2), GB, "sometimes")


def test_a_model_that_does_not_fit_even_alone_is_named_before_any_swap() -> None:
    """4 GB free with int8 weights: the models take turns, and one whose weights, workspace
    and one stream exceed the whole budget is never swapped in (``unservable``)."""
    needs = [ModelNeed("base", int(2.0 * GB), 120 * MB), ModelNeed("voice_design", int(2.6 * GB), 120 * MB)]
    plan = plan_residency(needs, int(3.5 * GB))
    assert plan.design == "turns" and set(plan.unservable) == {"voice_design"}
    line = plan.unservable["voice_design"]
    assert "3.5 GB even alone" in line and "needs 3.7 GB (2.6 GB weights, 1.0 GB workspace, 120 MB for 1 stream)" in line
    assert plan_residency(needs, int(3.8 * GB)).unservable == {}  # each fits alone: they take turns
    assert plan_residency(needs, int(2.5 * GB)).unservable == {}  # none fits: start-up fails loading instead
    assert plan_residency(needs, int(8 * GB)).unservable == {}  # together: resident


def test_checkpoint_estimates_match_the_loaded_model(checkpoints: Path) -> None:
    engine = load_engine(ModelKind.BASE, checkpoints / "base", "cpu", 1, "batched", 2, dtype="float32", max_len=256)
    assert isinstance(engine, BatchedEngine)
    model = engine._qwen.model
    loaded = sum(t.numel() for m in (model, model.speech_tokenizer.model) for t in (*m.parameters(), *m.buffers()))
    assert checkpoint_params(checkpoints / "base") == pytest.approx(loaded, rel=0.1)
    measured = slot_bytes(engine._qwen, 256)
    assert measured == engine.slot_bytes()
    estimate = checkpoint_slot_bytes(checkpoints / "base", 256, 4)
    assert 0.5 * measured < estimate < 4 * measured  # an estimate for the plan, before loading
    assert checkpoint_speakers(checkpoints / "custom_voice")[:2] == ["aiden", "dylan"]


# --- driver and dtype --------------------------------------------------------------------


def test_driver_too_old_for_the_torch_build() -> None:
    message = driver_problem((12, 8), (13, 0))
    assert message is not None and "CUDA up to 12.8" in message and "13.0" in message
    assert CUDA12_INSTALL in message and "TORCH_INDEX_URL" in message
    assert driver_problem((13, 0), (13, 0)) is None
    assert driver_problem((13, 1), (13, 0)) is None
    assert driver_problem((12, 2), (12, 8)) is None  # minor-version compatibility
    assert driver_problem(None, (13, 0)) is None  # no driver: nothing to say about it
    assert driver_problem((12, 8), None) is None  # CPU-only torch
    assert parse_cuda_version("13.0") == (13, 0) and parse_cuda_version(None) is None
    assert parse_cuda_version("x") is None


def test_dtype_choice() -> None:
    assert pick_dtype("auto", "cuda", True) == ("bfloat16", None)
    name, note = pick_dtype("auto", "cuda", False)
    assert name == "float16" and note is not None and "no bfloat16" in note
    assert pick_dtype("auto", "cpu", False) == ("float32", None)
    assert pick_dtype("float32", "cuda", False) == ("float32", None)
    with pytest.raises(ValueError, match="float16"):
        pick_dtype("bfloat16", "cuda", False)


def test_cli_memory_flags() -> None:
    args = build_parser().parse_args([])
    assert args.max_streams is None and args.gpu_memory is None and args.design_model_memory == "auto"
    args = build_parser().parse_args(["--max-streams", "3", "--gpu-memory", "7.5", "--design-model-memory", "on-demand"])
    assert (args.max_streams, args.gpu_memory, args.design_model_memory) == (3, 7.5, "on-demand")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-streams", "many"])


# --- out of memory mid-request -----------------------------------------------------------


@pytest.fixture(scope="module")
def design_engine(checkpoints: Path) -> BatchedEngine:
    engine = load_engine(ModelKind.VOICE_DESIGN, checkpoints / "voice_design", "cpu", 1, "batched", 2, dtype="float32", max_len=512)
    assert isinstance(engine, BatchedEngine)
    engine.warm(Segment("Hello.", "auto", 2, seed=0, instruct="A calm voice."))
    return engine


async def _speak(service: TtsService, text: str, voice: str = "aria") -> int:
    stream = service.speak(SpeechRequest(voice=voice), text)
    samples = 0
    async for chunk in stream:
        samples += len(chunk)
    return samples


async def test_out_of_memory_fails_the_request_and_the_next_one_works(
    design_engine: BatchedEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_run = design_engine.step.run
    calls = {"n": 0}

    def run_once_out_of_memory(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_run(*args)

    monkeypatch.setattr(design_engine.step, "run", run_once_out_of_memory)
    service = TtsService(VoiceCatalog(None, {ModelKind.VOICE_DESIGN}), {ModelKind.VOICE_DESIGN: design_engine}, "aria", Metrics())
    try:
        with caplog.at_level(logging.WARNING):
            with pytest.raises(GenerationError) as failed:
                await _speak(service, "This sentence meets an injected out of memory error.")
        message = str(failed.value)
        assert "ran out of memory" in message and "another program" in message and "serves on" in message
        assert any("out of GPU memory while serving" in r.getMessage() and "Tried to allocate" in r.getMessage() for r in caplog.records)
        assert design_engine.out_of_memory == 1
        assert await _speak(service, "And this one is spoken.") > 0
        assert service.open_streams == 0
    finally:
        await asyncio.to_thread(service.stop)


async def test_a_cublas_allocation_failure_building_a_prompt_is_named_as_out_of_memory(
    design_engine: BatchedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the H200 with 4 GB free, every request failed with "CUDA error:
    CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`" from the prompt worker: an
    out-of-memory (the driver had nothing left for the thread's cuBLAS handle) that the client
    was not told was one, and that did not make an on-demand model reload smaller."""
    real_build = design_engine.builder.build
    calls = {"n": 0}

    def build_once_without_cublas(segment: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        return real_build(segment)

    monkeypatch.setattr(design_engine.builder, "build", build_once_without_cublas)
    before = design_engine.out_of_memory  # the engine is shared by this module's tests
    service = TtsService(VoiceCatalog(None, {ModelKind.VOICE_DESIGN}), {ModelKind.VOICE_DESIGN: design_engine}, "aria", Metrics())
    try:
        with pytest.raises(GenerationError) as failed:
            await _speak(service, "This sentence finds no memory for cuBLAS.")
        assert "ran out of memory" in str(failed.value) and "another program" in str(failed.value)
        assert design_engine.out_of_memory == before + 1
        assert await _speak(service, "And this one is spoken.") > 0
    finally:
        await asyncio.to_thread(service.stop)


async def test_an_on_demand_model_out_of_memory_while_serving_comes_back_and_serves_on(
    checkpoints: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process took GPU memory: the request that hit it fails with the cause, the
    model reloads (its streams sized again from what is free) and the next request is spoken."""
    loaded: list[BatchedEngine] = []

    def load(shrink: float = 1.0) -> Engine:
        engine = load_engine(ModelKind.VOICE_DESIGN, checkpoints / "voice_design", "cpu", 1, "batched", 2, dtype="float32", max_len=512)
        assert isinstance(engine, BatchedEngine)
        if not loaded:  # the first load meets the out-of-memory at its second step
            real_run, calls = engine.step.run, {"n": 0}

            def run(*args: Any) -> Any:
                calls["n"] += 1
                if calls["n"] == 4:  # the warm-up's two steps, then the request's second
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
                return real_run(*args)

            engine.step.run = run  # type: ignore[method-assign]
        loaded.append(engine)
        return engine

    engine = OnDemandEngine(ModelKind.VOICE_DESIGN, 1, load, _warm, idle_s=60.0)
    await asyncio.to_thread(engine.warm, _warm(engine))
    service = TtsService(VoiceCatalog(None, {ModelKind.VOICE_DESIGN}), {ModelKind.VOICE_DESIGN: engine}, "aria", Metrics())
    try:
        with caplog.at_level(logging.INFO):
            with pytest.raises(GenerationError, match="ran out of memory"):
                await _speak(service, "This sentence meets an injected out of memory error.")
            deadline = time.monotonic() + 60  # a hang guard: it leaves once nothing runs
            while engine.resident and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not engine.resident
            assert await _speak(service, "And this one is spoken after the reload.") > 0
        assert engine.loads == 2 and len(loaded) == 2
        assert any("out of GPU memory while serving: it comes back" in r.getMessage() for r in caplog.records)
    finally:
        await asyncio.to_thread(service.stop)


# --- the on-demand VoiceDesign model ------------------------------------------------------


def _warm(engine: Engine) -> Segment:
    return Segment("Hello.", "auto", 2, seed=0, instruct="A calm voice.")


async def test_on_demand_model_leaves_when_idle_and_comes_back(checkpoints: Path, caplog: pytest.LogCaptureFixture) -> None:
    def load(shrink: float = 1.0) -> Engine:
        return load_engine(ModelKind.VOICE_DESIGN, checkpoints / "voice_design", "cpu", 1, "batched", 2, dtype="float32", max_len=512)

    # idle_s counts from the service's start: the first request must reach the engine within
    # it to be served while resident (else it reloads, and loads ends at 3). 0.5 s was little
    # on a loaded machine; 2 s costs 1.5 s more here.
    engine = OnDemandEngine(ModelKind.VOICE_DESIGN, 1, load, _warm, idle_s=2.0)
    await asyncio.to_thread(engine.warm, _warm(engine))
    assert engine.resident and engine.loads == 1
    first = weakref.ref(engine.inner)
    service = TtsService(VoiceCatalog(None, {ModelKind.VOICE_DESIGN}), {ModelKind.VOICE_DESIGN: engine}, "aria", Metrics())
    try:
        with caplog.at_level(logging.INFO):
            assert await _speak(service, "Served while resident.") > 0
            assert engine.loads == 1  # served by the model warmed at start, not a reload
            deadline = time.monotonic() + 60  # a hang guard (it leaves after idle_s)
            while engine.resident and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert not engine.resident  # left GPU memory after idle_s
            gc.collect()
            assert first() is None  # nothing holds the dropped model: its memory is free
            assert await _speak(service, "Served after coming back.") > 0
        assert engine.loads == 2
        messages = [r.getMessage() for r in caplog.records]
        assert any("left GPU memory (no work for" in m for m in messages)
        assert any("loading it into GPU memory for a waiting request" in m for m in messages)
    finally:
        await asyncio.to_thread(service.stop)


async def test_models_that_do_not_fit_together_take_turns(
    checkpoints: Path, voices_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Base and VoiceDesign take turns through one lease, after the server's ``gc.freeze``:
    each model that leaves is freed. The Base model, frozen with the start-up heap, needs the
    heap thawed for that; the VoiceDesign model, loaded after the freeze, is found by a plain
    collection, without thawing (a full collection pauses the other model's streams)."""
    lease = GpuLease()
    thaws: list[int] = []
    unfreeze = gc.unfreeze
    monkeypatch.setattr(gc, "unfreeze", lambda: (thaws.append(1), unfreeze())[1])

    def loader(kind: ModelKind, folder: str) -> Any:
        return lambda shrink=1.0: load_engine(kind, checkpoints / folder, "cpu", 1, "batched", 2, dtype="float32", max_len=512)

    base = OnDemandEngine(ModelKind.BASE, 1, loader(ModelKind.BASE, "base"), lambda e: _clone_warm(), idle_s=None, lease=lease)
    design = OnDemandEngine(ModelKind.VOICE_DESIGN, 1, loader(ModelKind.VOICE_DESIGN, "voice_design"), _warm, idle_s=60, lease=lease)
    await asyncio.to_thread(base.warm, _clone_warm())
    await asyncio.to_thread(design.warm, _warm(design))
    assert base.resident and not design.resident  # the second waits for its turn
    kinds = {ModelKind.BASE, ModelKind.VOICE_DESIGN}
    service = TtsService(VoiceCatalog(voices_dir, kinds), {ModelKind.BASE: base, ModelKind.VOICE_DESIGN: design}, "aria", Metrics())
    gc.freeze()  # as the server does once its models are loaded (__main__)
    try:
        first_base = weakref.ref(base.inner)
        assert await _speak(service, "A clone first, by the Base model.", voice="clone") > 0
        assert await _speak(service, "A preset, designed live.") > 0
        assert design.resident and not base.resident
        assert first_base() is None and len(thaws) == 1  # nothing holds the model that left: its memory is free
        from wyoming_qwen3tts.service.anchors import AnchorSpec

        clip = await service.render_design(AnchorSpec("A warm voice.", "english", 3, "A short clip.", "model"))
        assert clip.dtype == np.float32 and len(clip) > 0
        first_design = weakref.ref(design.inner)
        assert await _speak(service, "A clone, by the Base model.", voice="clone") > 0
        assert base.resident and not design.resident and (base.loads, design.loads) == (2, 1)
        assert first_design() is None and len(thaws) == 1  # freed without thawing the heap
    finally:
        gc.unfreeze()
        await asyncio.to_thread(service.stop)


def _clone_warm() -> Segment:
    from wyoming_qwen3tts.common.vocabulary import Reference

    tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)
    return Segment("Hello.", "auto", 2, seed=0, reference=Reference.from_audio(tone, 24000, None))


# --- start-up wiring (the CUDA branch's planning, run on the CPU with the GPU's answers faked) --


def _args(checkpoints: Path, tmp_path: Path, *extra: str) -> Any:
    return build_parser().parse_args([
        "--data-dir", str(tmp_path), "--clone-model", str(checkpoints / "base"),
        "--design-model", str(checkpoints / "voice_design"), "--custom-voice-model", "none",
        "--engine", "batched", "--dtype", "float32", *extra,
    ])


def test_residency_plan_reads_the_cap_and_the_checkpoints(
    checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from wyoming_qwen3tts import startup as main

    fraction: list[float] = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (140 * GB, 141 * GB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fraction.append)
    monkeypatch.setattr(main, "cuda_bf16_supported", lambda: True)
    args = _args(checkpoints, tmp_path, "--gpu-memory", "8")
    paths = {ModelKind.BASE: checkpoints / "base", ModelKind.VOICE_DESIGN: checkpoints / "voice_design"}
    with caplog.at_level(logging.INFO):
        plan = main._residency(args, "cuda", paths, 1024)
    assert fraction == [pytest.approx(8 / 141)]
    assert plan is not None and plan.design == "resident"  # tiny weights: everything fits in 8 GB
    assert any("GPU memory: 8.0 GB for this server (--gpu-memory 8)" in r.getMessage() for r in caplog.records)


async def test_models_taking_turns_are_wired_at_start(
    checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wyoming_qwen3tts import startup as main
    from wyoming_qwen3tts.engine.gpu.sizing import Residency

    monkeypatch.setattr(main, "_residency", lambda *a: Residency("turns", {}, "faked: they do not fit"))
    engines = await main.load_engines(_args(checkpoints, tmp_path, "--device", "cpu"), Metrics())
    base, design = engines[ModelKind.BASE], engines[ModelKind.VOICE_DESIGN]
    assert isinstance(base, OnDemandEngine) and isinstance(design, OnDemandEngine)
    assert base.lease is design.lease is not None and base.home and not design.home
    assert base.resident and not design.resident and design.ready.is_set()


async def test_a_model_that_cannot_fit_even_alone_is_logged_once_at_start_and_never_loaded(
    checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from wyoming_qwen3tts import startup as main
    from wyoming_qwen3tts.engine.gpu.sizing import Residency

    why = "the voice_design model does not fit in this GPU's 3.5 GB even alone: it needs 3.7 GB"
    monkeypatch.setattr(main, "_residency", lambda *a: Residency("turns", {}, "faked", {"voice_design": why}))
    with caplog.at_level(logging.INFO):
        engines = await main.load_engines(_args(checkpoints, tmp_path, "--device", "cpu"), Metrics())
    base, design = engines[ModelKind.BASE], engines[ModelKind.VOICE_DESIGN]
    assert isinstance(base, OnDemandEngine) and isinstance(design, OnDemandEngine)
    assert design.unservable == why and base.unservable is None and base.resident and design.loads == 0
    lines = [r.getMessage() for r in caplog.records if why in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("Not served with this GPU memory: ")


def test_auto_streams_from_the_memory_torch_reports(design_engine: BatchedEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    from wyoming_qwen3tts.engine import loader

    slot = slot_bytes(design_engine._qwen, 512)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 2 * GB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 2 * GB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (100 * GB, 141 * GB))
    # an 8 GB cap with 2 GB of weights in it: 6 GB, less the workspace and a 3 GB reserve
    expected = min(32, (6 * GB - WORKSPACE_BYTES - 3 * GB) // slot)
    assert loader._plan_streams(ModelKind.VOICE_DESIGN, design_engine._qwen, 512, 3 * GB, 8.0) == expected
    with pytest.raises(loader.MemoryFitError, match="not even 1 stream fits"):
        loader._plan_streams(ModelKind.VOICE_DESIGN, design_engine._qwen, 512, 5 * GB, 8.0)


async def test_a_voice_design_model_that_does_not_fit_at_start_does_not_stop_the_server(
    checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from wyoming_qwen3tts import startup as main

    real = main.load_engine

    def design_out_of_memory(kind: ModelKind, *args: Any, **kwargs: Any) -> Engine:
        if kind is ModelKind.VOICE_DESIGN:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(kind, *args, **kwargs)

    monkeypatch.setattr(main, "load_engine", design_out_of_memory)
    with caplog.at_level(logging.ERROR):
        engines = await main.load_engines(_args(checkpoints, tmp_path, "--device", "cpu"), Metrics())
    design = engines[ModelKind.VOICE_DESIGN]
    assert isinstance(design, OnDemandEngine) and not design.resident and design.ready.is_set()
    assert isinstance(engines[ModelKind.BASE], BatchedEngine)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "does not fit in GPU memory (CUDA out of memory)" in line and "--gpu-memory" in line and "starts without it" in line
    service = TtsService(VoiceCatalog(None, set(engines)), engines, "aria", Metrics())
    try:
        with pytest.raises(GenerationError, match="could not be loaded: it does not fit"):
            await _speak(service, "A preset needs the VoiceDesign model.")
    finally:
        await asyncio.to_thread(service.stop)


def test_auto_streams_retry_with_fewer_after_an_out_of_memory_at_capture(caplog: pytest.LogCaptureFixture) -> None:
    """Graph capture needs more than the sizing can know: under ``--max-streams auto`` an
    out-of-memory while loading or warming up is retried with fewer streams, a fixed
    ``--max-streams`` is not, and a model that never fits gives up with the error."""
    import torch

    from wyoming_qwen3tts.engine.loader import MIN_SHRINK, RETRY_SHRINK, load_fitting

    tried: list[float] = []
    failed: list[weakref.ref[Any]] = []

    closed: list[float] = []

    class Fake:
        def __init__(self, shrink: float) -> None:
            self.shrink = shrink
            self.warm_error: BaseException | None = None

        def close(self) -> None:
            closed.append(self.shrink)

    def load(shrink: float) -> Any:
        # the engine that failed before is gone (its weights, slots and graphs back on the card)
        assert all(ref() is None for ref in failed), "the failed engine is still held"
        tried.append(shrink)
        return Fake(shrink)

    def warm_fits_below(limit: float) -> Any:
        def warm(engine: Any) -> None:
            if engine.shrink > limit:
                failed.append(weakref.ref(engine))
                try:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                except BaseException as err:
                    engine.warm_error = err  # as Engine.warm keeps it: a cycle through the traceback
                    raise
        return warm

    with caplog.at_level(logging.WARNING):
        engine = load_fitting(load, warm_fits_below(0.5), ModelKind.BASE, auto=True)
    assert engine.shrink == pytest.approx(RETRY_SHRINK**2) and tried == pytest.approx([1.0, RETRY_SHRINK, RETRY_SHRINK**2])
    assert "out of GPU memory while loading or capturing its graphs; trying again with 60%" in caplog.text
    assert closed == pytest.approx([1.0, RETRY_SHRINK])  # each failed engine emptied before the retry

    tried.clear()
    failed.clear()
    with pytest.raises(torch.OutOfMemoryError):
        load_fitting(load, warm_fits_below(0.5), ModelKind.BASE, auto=False)
    assert tried == [1.0]

    tried.clear()
    failed.clear()  # the one raised to the caller is held by its traceback, as it should be
    with pytest.raises(torch.OutOfMemoryError):
        load_fitting(load, warm_fits_below(MIN_SHRINK / 10), ModelKind.BASE, auto=True)
    assert min(tried) >= MIN_SHRINK and len(tried) > 2

    tried.clear()
    failed.clear()
    with pytest.raises(ValueError):  # not a memory error: never retried
        load_fitting(load, lambda e: (_ for _ in ()).throw(ValueError("bad checkpoint")), ModelKind.BASE, auto=True)
    assert tried == [1.0]


def test_a_load_that_fails_at_sizing_gives_its_weights_back_before_the_error_goes_on(
    checkpoints: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The H200 with 4 GB free: the VoiceDesign model's int8 weights were on the card when its
    stream sizing found no room (``MemoryFitError``), and stayed allocated (held by the
    error's traceback), so the Base model could not come back. The real loader loads the
    tiny checkpoint; the sizing (CUDA only) is replaced by one that finds no room. By the time
    the error reaches the on-demand model's caller, nothing holds the loaded model."""
    from wyoming_qwen3tts.engine import loader
    from wyoming_qwen3tts.engine.batched import engine as batched

    loaded: list[weakref.ref[Any]] = []

    def no_stream_fits(kind: ModelKind, tts: Any, *args: Any, **kwargs: Any) -> Engine:
        qwen = tts.model  # the weights are on the device; the sizing comes next
        loaded.append(weakref.ref(qwen))
        raise loader.MemoryFitError(f"{kind.value} model: not even 1 stream fits (1.0 GB free after the weights)")

    monkeypatch.setattr(batched, "BatchedEngine", no_stream_fits)

    def load(shrink: float = 1.0) -> Engine:
        return load_engine(ModelKind.VOICE_DESIGN, checkpoints / "voice_design", "cpu", 1, "batched", None,
                           dtype="float32", max_len=512, shrink=shrink)

    design = OnDemandEngine(ModelKind.VOICE_DESIGN, 1, load, lambda _e: Segment("Hi.", "auto", 1), idle_s=None,
                            lease=GpuLease(), auto_streams=True)
    gc.disable()  # nothing collects behind the test's back: the load must let go by itself
    try:
        with pytest.raises(loader.MemoryFitError, match="not even 1 stream fits") as raised:
            design._bring_in()
        assert len(loaded) == 1 and loaded[0]() is None, "the failed load's model is still held"
        assert raised.value.__traceback__ is not None  # the error keeps its traceback for the log
        assert not design.resident
    finally:
        gc.enable()
