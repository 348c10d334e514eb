"""Feeds an engine: clients take turns at segment (sentence) boundaries.

Each client stream is a ``Job``: an ordered queue of segments whose audio must come out in
order, so a job has at most one segment in the engine at a time. The ``Scheduler`` is the
engine's ``WorkSource``: whenever the engine has room (a free slot of the batched pool, or
the serial engine's one), it takes the next segment round-robin from the jobs that have one
waiting. Audio chunks are handed to the job's asyncio queue the moment they are decoded, so
the event loop never blocks on generation.

A job opened inside ``background()`` (the anchors' rendering) is background work: a client's
segment always goes first, and ``demand`` tells a model that takes turns on the GPU
(``engine.gpu.on_demand``) whether a client or only background work waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator

import numpy as np

from ..common.audio import SAMPLE_RATE
from ..engine import Segment, Work
from ..engine.gpu.lease import Demand
from ..common.timeline import Timeline
from .errors import GenerationError

#: Audio a client may leave unread before its next segment is held back, in seconds. A client
#: that stops reading thus holds at most this much (plus the running segment) in memory; the
#: front doors drop a stream whose writes stall (see their timeouts).
MAX_BACKLOG_SECONDS = 20.0
#: How often a waiting engine re-checks held-back jobs, in seconds.
_RECHECK_S = 0.05
#: True inside ``background()``: jobs opened there are background work.
_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("background_work", default=False)


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Jobs opened inside (in this asyncio task) are background work (anchor rendering): they
    wait while a client's segment waits, and they do not call a model that takes turns on the
    GPU away from a client (``Demand``)."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


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
        #: Opened inside ``background()``: served after every client's segment.
        self.background = _BACKGROUND.get()
        #: A segment of it was taken by the engine (a request being spoken, not a new one).
        self.started = False
        self._submitted = 0
        self._done = 0
        self._closed = False
        #: Seconds each finished segment waited in the queue before generation began.
        self.queue_waits: list[float] = []
        #: Samples handed over by the engine / taken by the client (one writer each).
        self.posted = 0
        self.consumed = 0
        #: The request's timeline: given to the engine with its first segment only.
        self.timeline: Timeline | None = None

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

    def take(self, wait: float | None, started_only: bool = False) -> Work | None:
        """The next segment, round-robin: the first job in line that has a segment queued and
        less than ``MAX_BACKLOG_SECONDS`` of unread audio starts its next segment and leaves
        the line; it rejoins at the back when that segment ends (if it has another), so a
        client that arrived meanwhile goes before the running one's next sentence. Jobs
        found empty leave the line and rejoin at the back on their next ``submit``. Client
        jobs go before background jobs (``background``).

        Args:
            wait: seconds to wait for a segment (None: until one comes or the source closes).
            started_only: only a next segment of a client job already being spoken (a model
                about to give the GPU to another one finishes the requests it started, but
                starts no new one).
        """
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            while True:
                picked, held = self._next(started_only)
                if picked is not None or self._closed:
                    return picked
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                if held:  # reading clients free held jobs without notifying: look again soon
                    remaining = _RECHECK_S if remaining is None else min(remaining, _RECHECK_S)
                self._cond.wait(remaining)

    def demand(self) -> Demand:
        """What waits here now: queued client and background segments (``Demand``)."""
        with self._cond:
            clients = background = 0
            since: float | None = None
            for job in self._running.union(self._jobs):
                if job.background:
                    background += len(job.pending)
                elif job.pending:
                    clients += len(job.pending)
                    queued = job.pending[0][1]
                    since = queued if since is None else min(since, queued)
            return Demand(clients, background, since)

    def has_started(self) -> bool:
        """Whether a client job already being spoken has a segment queued (``take``'s
        ``started_only`` would give one)."""
        with self._cond:
            return any(j.started and not j.background and j.pending for j in self._jobs)

    def _next(self, started_only: bool = False) -> tuple[Work | None, bool]:
        """(the work picked or None, whether a job was held back for its unread audio)."""
        held = False
        picked: Job | None = None
        for job in list(self._jobs):
            if not job.pending or job in self._running:
                self._jobs.remove(job)  # leaves the line: rejoins on its next submit, or when its segment ends
                continue
            if started_only and (job.background or not job.started):
                continue
            if job.backlog_seconds > MAX_BACKLOG_SECONDS:
                held = True
                continue
            if picked is None or (picked.background and not job.background):
                picked = job
        if picked is None:
            return None, held
        self._jobs.remove(picked)
        segment, queued_at = picked.pending.popleft()
        timeline = None if picked.started else picked.timeline
        if timeline is not None:
            timeline.mark("taken")
        picked.started = True
        self._running.add(picked)
        return Work(segment, _SegmentSink(picked, queued_at), timeline), held

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
