"""Drive a batched engine frame by frame from a test, with the real model on tiny checkpoints.

The engine's own loop (``BatchedEngine.serve``) admits work whenever a slot is free; here the
same admission, step and delivery functions run one frame at a time, so that a test can say
at which step a request joins or is cancelled.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wyoming_qwen3tts.engine import Segment, Work
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.common.vocabulary import ModelKind


@dataclass
class Collect:
    """A sink that keeps everything, and can be cancelled."""

    chunks: list[np.ndarray] = field(default_factory=list)
    frames: int | None = None
    error: BaseException | None = None
    cancel: bool = False

    def cancelled(self) -> bool:
        return self.cancel

    def audio(self, chunk: np.ndarray) -> None:
        self.chunks.append(chunk)

    def done(self, frames: int) -> None:
        self.frames = frames

    def failed(self, error: BaseException) -> None:
        self.error = error

    @property
    def pcm(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    @property
    def finished(self) -> bool:
        return self.frames is not None or self.error is not None


class _Queue:
    """A work source holding a list (what the scheduler would hand out)."""

    def __init__(self) -> None:
        self.items: list[Work] = []

    def take(self, wait: float | None) -> Work | None:
        return self.items.pop(0) if self.items else None

    def closed(self) -> bool:
        return False


class Source:
    """A closable work source with blocking ``take``, as the engine thread sees the scheduler (``Engine.start``)."""

    def __init__(self) -> None:
        self.items: queue.Queue[Work] = queue.Queue()
        self.stop = threading.Event()

    def take(self, wait: float | None) -> Work | None:
        try:
            return self.items.get(timeout=0.05 if wait is None else max(wait, 0.001))
        except queue.Empty:
            return None

    def closed(self) -> bool:
        return self.stop.is_set()


def run(engine: BatchedEngine, schedule: dict[int, list[tuple[Segment, Collect]]],
        cancel: dict[int, list[Collect]] | None = None, record_codes: bool = False,
        max_steps: int = 10_000) -> dict[int, list[np.ndarray]]:
    """Run until every scheduled request ended. Work in ``schedule[t]`` is offered before step
    ``t``; sinks in ``cancel[t]`` are cancelled before step ``t``.

    Returns:
        With ``record_codes``: slot row -> the codes [16] of each step it ran (for debugging).
    """
    queue = _Queue()
    codes: dict[int, list[np.ndarray]] = {}
    sinks = [sink for works in schedule.values() for _, sink in works]
    cancel = cancel or {}
    pending = None
    if not engine._host:
        engine._capture()
    for t in range(max_steps):
        queue.items.extend(Work(segment, sink) for segment, sink in schedule.get(t, []))
        for sink in cancel.get(t, []):
            sink.cancel = True
        engine._admit(queue, block=False)
        launched = engine._launch() if engine._rows else None
        if record_codes and launched is not None:
            for i in range(len(launched.rows)):
                codes.setdefault(i, []).append(engine.state.codes[i].cpu().numpy().copy())
        if pending is not None:
            engine._deliver(pending)
        pending = launched
        engine._retire()
        if t > max(schedule) and all(s.finished for s in sinks) and pending is None and not queue.items:
            return codes
    raise AssertionError("requests did not finish")


def load_tiny(kind_dir: Path, kind: ModelKind, slots: int = 4, chunk_frames: int = 1,
              device: str = "cpu", prefill_graph_rows: int | None = None) -> BatchedEngine:
    """A batched engine on a tiny checkpoint in float32: eager on the CPU, or with its CUDA
    graphs captured (warm-up included) on "cuda" (prefill graphs for up to
    ``prefill_graph_rows`` rows; None: all). Loaded through the real loaders."""
    from faster_qwen3_tts import FasterQwen3TTS

    from wyoming_qwen3tts.engine import MAX_SEQ_LEN, load_engine

    torch.set_num_threads(1)
    if device == "cpu":
        engine = load_engine(kind, kind_dir, "cpu", chunk_frames, engine="batched", max_streams=slots)
        assert isinstance(engine, BatchedEngine)
        return engine
    tts = FasterQwen3TTS.from_pretrained(str(kind_dir), device="cuda", dtype=torch.float32, max_seq_len=MAX_SEQ_LEN)
    engine = BatchedEngine(kind, tts, chunk_frames, slots, MAX_SEQ_LEN, graphs=True, prefill_graph_rows=prefill_graph_rows)
    warm = Segment("Warm.", "english", 2, instruct="A voice." if kind is ModelKind.VOICE_DESIGN else None,
                   speaker="ryan" if kind is ModelKind.CUSTOM_VOICE else None)
    if kind is not ModelKind.BASE:
        engine.warm(warm)
    else:
        engine._capture()
    return engine
