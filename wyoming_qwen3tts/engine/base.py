"""What every engine is: it pulls segments from a work source and pushes PCM to sinks.

An engine owns one loaded model and one thread. The thread takes ``Work`` (a segment and
the sink its audio goes to) from a ``WorkSource`` whenever it has room (one segment at a
time for the serial reference engine, a slot pool's worth for the batched engine), and
calls the sink from that thread. The engine knows nothing of clients, protocols or asyncio.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..common.timeline import Timeline
from ..common.vocabulary import ModelKind, Reference
from .segment import Segment

_LOGGER = logging.getLogger(__name__)


class ModelMismatchError(ValueError):
    """The checkpoint's ``tts_model_type`` is not the kind it was loaded as."""


class Sink(Protocol):
    """Receives one segment's audio. Called from the engine thread only."""

    def cancelled(self) -> bool:
        """True once the client no longer wants this audio: the engine stops within a frame."""

    def audio(self, chunk: np.ndarray) -> None:
        """A chunk of float32 [n_samples] at 24 kHz in [-1, 1], in order."""

    def done(self, frames: int) -> None:
        """The segment ended (EOS, frame cap or cancel) after ``frames`` codec frames."""

    def failed(self, error: BaseException) -> None:
        """The segment failed; no more calls follow."""


@dataclass(frozen=True)
class Work:
    """One segment to generate and where its audio goes.

    Attributes:
        timeline: its request's timeline (``timeline.Timeline``) on a request's first segment
            only, else None: the engine marks the points it passes (once each, never per frame).
    """

    segment: Segment
    sink: Sink
    timeline: Timeline | None = None


class WorkSource(Protocol):
    """Where an engine takes its work (``scheduler.Scheduler``)."""

    def take(self, wait: float | None) -> Work | None:
        """The next segment to start, or None if there is none within ``wait`` seconds
        (None: wait until there is one or the source closes; 0: do not wait)."""

    def closed(self) -> bool:
        """True once the engine should stop."""


class Engine(ABC):
    """One loaded model, generating on its own thread.

    Attributes:
        kind: the model kind (checked against the checkpoint at load).
        chunk_frames: codec frames per delivered chunk (1920 samples each).
        capacity: segments generated at the same time (slots).
        ready: set once warm-up ended; ``warm_error`` says whether it failed.
        serve_error: set if the engine thread stopped on an unexpected error; from then
            on every segment it is given fails at once (see ``start``).
        backend: one line naming the back end, for ``describe`` and logs.
    """

    backend = "engine"

    def __init__(self, kind: ModelKind, chunk_frames: int, capacity: int) -> None:
        self.kind = kind
        self.chunk_frames = chunk_frames
        self.capacity = capacity
        self.ready = threading.Event()
        self.warm_error: BaseException | None = None
        self.serve_error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @abstractmethod
    def speakers(self) -> list[str]:
        """CustomVoice speaker ids (lower case); [] for other kinds."""

    @abstractmethod
    def warmup(self, segment: Segment) -> None:
        """Prepare (graph capture) and generate ``segment`` once; raise on failure."""

    @abstractmethod
    def serve(self, source: WorkSource) -> None:
        """Generate work from ``source`` until it closes (runs on the engine thread)."""

    def prime(self, reference: Reference) -> bool:
        """Prepare a clone clip's prompt now, before ``start``, where its first use is slow;
        True if something was prepared. Engines whose first use costs little (a GPU's codec
        encode) keep this default: nothing, False."""
        return False

    def warm(self, segment: Segment) -> None:
        """Run ``warmup`` (blocking), recording the outcome in ``ready`` / ``warm_error``.

        Raises:
            Whatever ``warmup`` raised.
        """
        try:
            self.warmup(segment)
        except BaseException as err:
            self.warm_error = err
            raise
        finally:
            self.ready.set()

    def start(self, source: WorkSource) -> None:
        """Start the engine thread, serving ``source`` until it closes."""
        self._thread = threading.Thread(
            target=self._serve_guarded, args=(source,), name=f"engine-{self.kind.value}", daemon=True
        )
        self._thread.start()

    def _serve_guarded(self, source: WorkSource) -> None:
        """``serve``, and if it ever raises, fail every later segment instead of hanging it."""
        try:
            self.serve(source)
        except BaseException as err:  # noqa: BLE001 - the thread must not die silently
            _LOGGER.exception("The %s engine stopped on an unexpected error", self.kind.value)
            self.serve_error = err
            error = RuntimeError(f"The {self.kind.value} engine stopped: {err}")
            while not source.closed():
                work = source.take(wait=0.5)
                if work is not None:
                    work.sink.failed(error)

    def join(self, timeout: float) -> None:
        """Wait for the engine thread to end (after its source closed)."""
        if self._thread is not None:
            self._thread.join(timeout)
