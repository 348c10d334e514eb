"""Feeds an engine: clients take turns at segment (sentence) boundaries.

Each client stream is a ``Job``: an ordered queue of segments whose audio must come out in
order, so a job has at most one segment in the engine at a time. The ``Scheduler`` is the
engine's ``WorkSource``: whenever the engine has room (a free slot of the batched pool, or
the serial engine's one), it takes the next segment round-robin from the jobs that have one
waiting. Audio chunks are handed to the job's asyncio queue the moment they are decoded, so
the event loop never blocks on generation.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator

import numpy as np

from .audio import SAMPLE_RATE
from .engine import Segment, Work

#: Audio a client may leave unread before its next segment is held back, in seconds. A client
#: that stops reading thus holds at most this much (plus the running segment) in memory; the
#: front doors drop a stream whose writes stall (see their timeouts).
MAX_BACKLOG_SECONDS = 20.0
#: How often a waiting engine re-checks held-back jobs, in seconds.
_RECHECK_S = 0.05


class GenerationError(RuntimeError):
    """The model failed on a segment; the message says why."""


class _SegmentDone:
    """Queue marker: one segment finished (its audio is all in the queue before it)."""

    def __init__(self, queue_wait_s: float) -> None:
        self.queue_wait_s = queue_wait_s


_WAKE = object()  # queue marker: re-check whether the job is complete


class _SegmentSink:
    """The engine's ``Sink`` for one segment of a job (called from the engine thread)."""

    def __init__(self, job: Job, queued_at: float) -> None:
        self._job = job
        self._queue_wait = time.monotonic() - queued_at

    def cancelled(self) -> bool:
        return self._job.cancelled.is_set()

    def audio(self, chunk: np.ndarray) -> None:
        self._job.posted += len(chunk)
        self._job._post(chunk)

    def done(self, frames: int) -> None:
        self._job._finished(_SegmentDone(self._queue_wait))

    def failed(self, error: BaseException) -> None:
        self._job._finished(error)


class Job:
    """One client's ordered segments on one model, and their audio as an async stream.

    Create with ``Scheduler.open_job``. Call ``submit`` for each segment, ``close`` when no
    more will come, and iterate to receive float32 [n_samples] chunks at 24 kHz.
    ``cancel`` drops queued segments and stops the running one within a frame (a chunk on
    the serial engine).
    """

    def __init__(self, scheduler: Scheduler, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduler = scheduler
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self.pending: deque[tuple[Segment, float]] = deque()  # guarded by the scheduler lock
        self.cancelled = threading.Event()
        self._submitted = 0
        self._done = 0
        self._closed = False
        #: Seconds each finished segment waited in the queue before generation began.
        self.queue_waits: list[float] = []
        #: Samples handed over by the engine / taken by the client (one writer each).
        self.posted = 0
        self.consumed = 0

    @property
    def backlog_seconds(self) -> float:
        """Audio generated for this job that its client has not taken yet, in seconds."""
        return (self.posted - self.consumed) / SAMPLE_RATE

    def submit(self, segment: Segment) -> None:
        """Queue a segment (call from the event loop)."""
        self._submitted += 1
        self._scheduler._enqueue(self, segment)

    def close(self) -> None:
        """No more segments; iteration ends after the last one's audio."""
        self._closed = True
        self._queue.put_nowait(_WAKE)

    def cancel(self) -> None:
        """Drop queued segments and stop the running one. Idempotent."""
        self.cancelled.set()
        self._scheduler._drop(self)
        self._closed = True
        self._queue.put_nowait(_WAKE)

    def _post(self, item: object) -> None:
        """Hand an item to the event loop (call from the engine thread)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # loop closed: the client is gone
            self.cancelled.set()

    def _finished(self, item: object) -> None:
        """The running segment ended (engine thread): report it, let the next one start."""
        self._post(item)
        self._scheduler._segment_ended(self)

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        while True:
            if self.cancelled.is_set():
                return
            if self._closed and self._done >= self._submitted:
                return
            item = await self._queue.get()
            if isinstance(item, np.ndarray):
                self.consumed += len(item)
                if not self.cancelled.is_set():
                    yield item
            elif isinstance(item, _SegmentDone):
                self._done += 1
                self.queue_waits.append(item.queue_wait_s)
            elif isinstance(item, BaseException):
                self.cancel()
                raise GenerationError(str(item)) from item


class Scheduler:
    """Round-robin work source of one engine: jobs in line, one segment each at a time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: deque[Job] = deque()  # jobs with queued segments, in serving order
        self._running: set[Job] = set()  # jobs with a segment in the engine (out of the line)
        self._closed = False

    def open_job(self, loop: asyncio.AbstractEventLoop) -> Job:
        """A new job for one client stream, delivering to ``loop``."""
        return Job(self, loop)

    def queue_depth(self) -> int:
        """Segments queued (not yet started) over all jobs."""
        with self._cond:
            return sum(len(job.pending) for job in self._running.union(self._jobs))

    def close(self) -> None:
        """Tell the engine to stop taking work."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def closed(self) -> bool:
        return self._closed

    def take(self, wait: float | None) -> Work | None:
        """The next segment, round-robin: the first job in line that has a segment queued and
        less than ``MAX_BACKLOG_SECONDS`` of unread audio starts its next segment and leaves
        the line; it rejoins at the back when that segment ends (if it has another), so a
        client that arrived meanwhile goes before the running one's next sentence. Jobs
        found empty leave the line and rejoin at the back on their next ``submit``."""
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            while True:
                picked, held = self._next()
                if picked is not None or self._closed:
                    return picked
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                if held:  # reading clients free held jobs without notifying: look again soon
                    remaining = _RECHECK_S if remaining is None else min(remaining, _RECHECK_S)
                self._cond.wait(remaining)

    def _next(self) -> tuple[Work | None, bool]:
        """(the work picked or None, whether a job was held back for its unread audio)."""
        held = False
        for _ in range(len(self._jobs)):
            job = self._jobs.popleft()
            if not job.pending or job in self._running:
                continue  # leaves the line: rejoins on its next submit, or when its segment ends
            if job.backlog_seconds > MAX_BACKLOG_SECONDS:
                self._jobs.append(job)
                held = True
                continue
            segment, queued_at = job.pending.popleft()
            self._running.add(job)
            return Work(segment, _SegmentSink(job, queued_at)), held
        return None, held

    def _enqueue(self, job: Job, segment: Segment) -> None:
        with self._cond:
            if job not in self._running and job not in self._jobs:  # a running job rejoins when it ends
                self._jobs.append(job)
            job.pending.append((segment, time.monotonic()))
            self._cond.notify_all()

    def _drop(self, job: Job) -> None:
        with self._cond:
            job.pending.clear()
            if job in self._jobs:
                self._jobs.remove(job)

    def _segment_ended(self, job: Job) -> None:
        with self._cond:
            self._running.discard(job)
            if job.pending and job not in self._jobs:  # to the back: those who came meanwhile first
                self._jobs.append(job)
            self._cond.notify_all()
