"""One worker thread per model; clients take turns at segment (sentence) boundaries.

faster-qwen3-tts is neither thread-safe nor re-entrant: one model owns one static KV cache
and one set of CUDA graphs. ``ModelWorker`` is the only caller of its model. Each client
stream is a ``Job``: an ordered queue of segments. The worker picks jobs round-robin, runs
one whole segment, and hands every PCM chunk to the job's asyncio queue the moment it is
decoded, so the event loop never blocks on generation.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import numpy as np

from .engine import Segment, SpeechModel

_LOGGER = logging.getLogger(__name__)


class GenerationError(RuntimeError):
    """The model failed on a segment; the message says why."""


class _SegmentDone:
    """Queue marker: one segment finished (its audio is all in the queue before it)."""

    def __init__(self, queue_wait_s: float) -> None:
        self.queue_wait_s = queue_wait_s


_WAKE = object()  # queue marker: re-check whether the job is complete


class Job:
    """One client's ordered segments on one worker, and their audio as an async stream.

    Create with ``ModelWorker.open_job``. Call ``submit`` for each segment, ``close`` when
    no more will come, and iterate to receive float32 [n_samples] chunks at 24 kHz.
    ``cancel`` drops queued segments and stops the running one at its next chunk.
    """

    def __init__(self, worker: ModelWorker, loop: asyncio.AbstractEventLoop) -> None:
        self._worker = worker
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self.pending: deque[tuple[Segment, float]] = deque()  # guarded by worker lock
        self.cancelled = threading.Event()
        self._submitted = 0
        self._done = 0
        self._closed = False
        #: Seconds each finished segment waited in the queue before generation began.
        self.queue_waits: list[float] = []

    def submit(self, segment: Segment) -> None:
        """Queue a segment (call from the event loop)."""
        self._submitted += 1
        self._worker._enqueue(self, segment)

    def close(self) -> None:
        """No more segments; iteration ends after the last one's audio."""
        self._closed = True
        self._queue.put_nowait(_WAKE)

    def cancel(self) -> None:
        """Drop queued segments and stop the running one within one chunk. Idempotent."""
        self.cancelled.set()
        self._worker._drop(self)
        self._closed = True
        self._queue.put_nowait(_WAKE)

    def _post(self, item: object) -> None:
        """Hand an item to the event loop (call from the worker thread)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # loop closed: the client is gone
            self.cancelled.set()

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        while True:
            if self.cancelled.is_set():
                return
            if self._closed and self._done >= self._submitted:
                return
            item = await self._queue.get()
            if isinstance(item, np.ndarray):
                if not self.cancelled.is_set():
                    yield item
            elif isinstance(item, _SegmentDone):
                self._done += 1
                self.queue_waits.append(item.queue_wait_s)
            elif isinstance(item, BaseException):
                self.cancel()
                raise GenerationError(str(item)) from item


class ModelWorker:
    """The single thread that runs generations on one ``SpeechModel``.

    Args:
        model: the loaded model; nothing else may call it once the worker starts.
        on_error: called (in the worker thread) with each failure, for metrics.
    """

    def __init__(self, model: SpeechModel, on_error: Callable[[BaseException], None] | None = None) -> None:
        self.model = model
        self._on_error = on_error
        self._cond = threading.Condition()
        self._jobs: deque[Job] = deque()  # jobs with queued segments, in serving order
        self._stopping = False
        self._warm_segment: Segment | None = None
        #: Set once warm-up finished (``warm_error`` says whether it failed).
        self.ready = threading.Event()
        self.warm_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"model-{model.kind.value}", daemon=True)

    def start(self, warm_segment: Segment) -> None:
        """Start the thread: warm-up (graph capture, then ``warm_segment`` generated through
        the same path as requests) runs first, in this thread, then the queue is served."""
        self._warm_segment = warm_segment
        self._thread.start()

    def _warm(self) -> None:
        try:
            self.model.warmup()
            assert self._warm_segment is not None
            samples = sum(len(chunk) for chunk in self.model.stream(self._warm_segment))
            if samples == 0:
                raise RuntimeError("warm-up generation produced no audio")
        except BaseException as err:  # noqa: BLE001 - reported by whoever waits on ready
            self.warm_error = err
        finally:
            self.ready.set()

    def stop(self) -> None:
        """Ask the thread to end after the current segment, and wait for it."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def open_job(self, loop: asyncio.AbstractEventLoop) -> Job:
        """A new job for one client stream, delivering to ``loop``."""
        return Job(self, loop)

    def queue_depth(self) -> int:
        """Segments queued (not yet started) over all jobs."""
        with self._cond:
            return sum(len(job.pending) for job in self._jobs)

    def _enqueue(self, job: Job, segment: Segment) -> None:
        with self._cond:
            if job not in self._jobs:
                self._jobs.append(job)
            job.pending.append((segment, time.monotonic()))
            self._cond.notify()

    def _drop(self, job: Job) -> None:
        with self._cond:
            job.pending.clear()
            if job in self._jobs:
                self._jobs.remove(job)

    def _next(self) -> tuple[Job, Segment, float] | None:
        """Round-robin: the first job in line with a queued segment goes to the back.

        Jobs found idle leave the line and rejoin at the back on their next ``submit``.
        """
        while self._jobs:
            job = self._jobs.popleft()
            if job.pending:
                self._jobs.append(job)
                segment, queued_at = job.pending.popleft()
                return job, segment, queued_at
        return None

    def _run(self) -> None:
        self._warm()
        while True:
            with self._cond:
                picked = self._next()
                while picked is None and not self._stopping:
                    self._cond.wait()
                    picked = self._next()
                if self._stopping:
                    return
            assert picked is not None
            job, segment, queued_at = picked
            self._generate(job, segment, time.monotonic() - queued_at)

    def _generate(self, job: Job, segment: Segment, queue_wait_s: float) -> None:
        if job.cancelled.is_set():
            return
        chunks = self.model.stream(segment)
        try:
            for chunk in chunks:
                if job.cancelled.is_set():
                    break
                job._post(chunk)
        except Exception as err:  # noqa: BLE001 - reported to the client, the worker lives on
            _LOGGER.exception("Generation failed for %r", segment.text[:80])
            if self._on_error:
                self._on_error(err)
            job._post(err)
            return
        finally:
            chunks.close()  # type: ignore[attr-defined]
        job._post(_SegmentDone(queue_wait_s))
