"""A model that is in GPU memory only while it has work: loaded on demand, dropped when idle.

``OnDemandEngine`` wraps the loading of an engine. Its thread waits for work; when a
segment comes and the model is out, it loads the model (from disk: the OS page cache
makes a reload a matter of seconds), warms it up, and lets it serve until it has had no
work for ``idle_s`` seconds; then the model is dropped and its memory returned to the
card. Segments that come while it is out wait in the work source (the scheduler) and are
served once it is back, in turn, as if the model had been busy.

Where two models do not fit on the card together (the 1.7B Base and VoiceDesign models
on an 8 GB card), both take turns through a ``GpuLease``: one model on the card at a
time. A model holding the lease lets it go as soon as it has no segment running and the
other one waits (it stops taking new work while the other waits, so neither starves).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable

from ..voices import ModelKind
from .base import Engine, Sink, Work, WorkSource
from .loader import load_fitting
from .segment import Segment

_LOGGER = logging.getLogger(__name__)

#: Seconds without work after which an on-demand model leaves GPU memory.
DEFAULT_IDLE_S = 60.0
#: How often a serving model checks whether the other model waits for the lease, in seconds.
_POLL_S = 0.1


class GpuLease:
    """One model on the GPU at a time, for models that do not fit there together."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: str | None = None
        self._waiting: set[str] = set()

    def acquire(self, who: str, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Block until ``who`` holds the lease; False if ``give_up()`` turned true first."""
        with self._cond:
            self._waiting.add(who)
            self._cond.notify_all()
            try:
                while self._holder not in (None, who):
                    if give_up():
                        return False
                    self._cond.wait(_POLL_S * 5)
                self._holder = who
                return True
            finally:
                self._waiting.discard(who)

    def try_acquire(self, who: str) -> bool:
        """Take the lease if it is free (or already ``who``'s); never blocks."""
        with self._cond:
            if self._holder in (None, who):
                self._holder = who
                return True
            return False

    def release(self, who: str) -> None:
        """Let the lease go (no-op unless ``who`` holds it)."""
        with self._cond:
            if self._holder == who:
                self._holder = None
                self._cond.notify_all()

    def wanted(self, by_other_than: str) -> bool:
        """True when a model other than ``by_other_than`` waits for the lease."""
        with self._cond:
            return bool(self._waiting - {by_other_than})


class _CountingSink:
    """Passes a segment's calls through and tells its ``_Relay`` when the segment ended."""

    def __init__(self, sink: Sink, relay: _Relay) -> None:
        self._sink = sink
        self._relay = relay

    def cancelled(self) -> bool:
        return self._sink.cancelled()

    def audio(self, chunk: object) -> None:
        self._sink.audio(chunk)  # type: ignore[arg-type]

    def done(self, frames: int) -> None:
        self._relay.ended()
        self._sink.done(frames)

    def failed(self, error: BaseException) -> None:
        self._relay.ended()
        self._sink.failed(error)


class _Relay:
    """The work source a loaded model serves: the real one, until the model should leave.

    It closes (the inner engine's ``serve`` returns) when the real source closes, or when
    no segment runs and either ``idle_s`` passed since the last one or another model waits
    for the lease.
    """

    def __init__(self, source: WorkSource, first: Work | None, idle_s: float | None, yield_to: Callable[[], bool]) -> None:
        self._source = source
        self._first: Work | None = first
        self._idle_s = idle_s
        self._yield_to = yield_to
        self._lock = threading.Lock()
        self._running = 0
        self._last = time.monotonic()

    def ended(self) -> None:
        with self._lock:
            self._running -= 1
            self._last = time.monotonic()

    def _leaving(self) -> bool:
        with self._lock:
            if self._running > 0 or self._first is not None:
                return False
            idle = self._idle_s is not None and time.monotonic() - self._last >= self._idle_s
        return idle or self._yield_to()

    def closed(self) -> bool:
        return self._source.closed() or self._leaving()

    def take(self, wait: float | None) -> Work | None:
        if self._first is not None:
            first, self._first = self._first, None
            return self._wrap(first)
        if self._yield_to():  # the other model waits: take nothing new, finish what runs
            return None
        bound = _POLL_S if self._idle_s is None else max(_POLL_S, min(self._idle_s, 1.0))
        work = self._source.take(bound if wait is None else min(wait, bound))
        return self._wrap(work) if work is not None else None

    def _wrap(self, work: Work) -> Work:
        with self._lock:
            self._running += 1
        return Work(work.segment, _CountingSink(work.sink, self))


class OnDemandEngine(Engine):
    """An engine loaded when work comes and dropped when idle (see the module docstring).

    Args:
        kind: the model kind.
        chunk_frames: codec frames per chunk (as the inner engine's).
        load: builds the inner engine, given the fraction of the planned streams to take
            (the real loader; may raise, e.g. ``torch.OutOfMemoryError``).
        warm_segment: the warm-up generation run after every load.
        idle_s: seconds without work before the model leaves GPU memory; None keeps it
            (a model that only takes turns through ``lease``).
        lease: shared with the models it cannot be on the card with, or None.
        why: what the model is needed for, for the log lines.
        speakers: the CustomVoice speaker ids while the model is out (from its config).
        home: comes back by itself whenever the lease is free (the Base model, taking turns
            with the VoiceDesign model: it is back before the next clone request).
        auto_streams: ``--max-streams auto``: an out-of-memory while loading is retried with
            fewer streams (``loader.load_fitting``).

    Attributes:
        loads: how many times the model was loaded (tests, logs).
    """

    def __init__(
        self,
        kind: ModelKind,
        chunk_frames: int,
        load: Callable[[float], Engine],
        warm_segment: Callable[[Engine], Segment],
        idle_s: float | None = DEFAULT_IDLE_S,
        lease: GpuLease | None = None,
        why: str = "",
        speakers: list[str] | None = None,
        home: bool = False,
        auto_streams: bool = False,
    ) -> None:
        super().__init__(kind, chunk_frames, capacity=1)
        self._load = load
        self._warm_segment = warm_segment
        self.idle_s = idle_s
        self.lease = lease
        self.why = why
        self._speakers = list(speakers or [])
        self.home = home and lease is not None
        self.auto_streams = auto_streams
        self.inner: Engine | None = None
        #: ``gc.get_freeze_count()`` once the model came in (see ``_collect``).
        self._freeze_mark: int | None = None
        self.loads = 0
        self.backend = "on demand"

    @property
    def resident(self) -> bool:
        """Whether the model is in GPU memory now."""
        return self.inner is not None

    def speakers(self) -> list[str]:
        return self.inner.speakers() if self.inner is not None else list(self._speakers)

    def warmup(self, segment: Segment) -> None:
        """Load and warm the model now if it may (the lease is free), so start-up proves the
        checkpoint loads; it then stays until idle. Otherwise it loads on first use."""
        if self.lease is not None and not self.lease.try_acquire(self.kind.value):
            _LOGGER.info("%s model: loads when first needed (it takes turns with the other model)", self.kind.value)
            return
        self._bring_in()

    def _bring_in(self) -> None:
        started = time.monotonic()
        engine: Engine | None = None
        try:
            engine = load_fitting(self._load, lambda e: e.warm(self._warm_segment(e)), self.kind, self.auto_streams)
        except BaseException:
            engine = None  # loaded but failed its warm-up: let it go before emptying the cache
            self._drop(None)
            raise
        self.inner = engine
        self._freeze_mark = gc.get_freeze_count()
        self.loads += 1
        self.capacity = engine.capacity
        self.backend = f"{engine.backend}, on demand"
        _LOGGER.info("%s model is in GPU memory (%.1f s to load)", self.kind.value, time.monotonic() - started)

    def _drop(self, why: str | None) -> None:
        """Release the model's GPU memory (and the lease)."""
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()  # a step launched before its rows ended may still run
        gone = weakref.ref(self.inner) if self.inner is not None else None
        self.inner = None
        self._collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            if gone is not None and gone() is not None:  # something still holds the model
                holders = sorted({type(r).__name__ for r in gc.get_referrers(gone())} - {"frame"})
                _LOGGER.warning("%s model: still referenced after leaving GPU memory (by %s): its memory is not freed",
                                self.kind.value, ", ".join(holders))
            stats = torch.cuda.memory_stats()
            _LOGGER.info(
                "%s model out: %.2f GB allocated, %.2f GB reserved (%.2f GB of it not releasable) stay in GPU memory",
                self.kind.value, torch.cuda.memory_allocated() / 1e9, torch.cuda.memory_reserved() / 1e9,
                stats.get("inactive_split_bytes.all.current", 0) / 1e9,
            )
        if why:
            _LOGGER.info("%s model left GPU memory (%s); it comes back when needed", self.kind.value, why)
        if self.lease is not None:
            self.lease.release(self.kind.value)

    def _collect(self) -> None:
        """Collect the model just let go (it sits in reference cycles: bound methods in its
        graphs), so that its GPU memory is freed.

        The server freezes what it loaded at start out of the collector's reach (``gc.freeze``
        in __main__). A model frozen so is never collected, and its memory never freed (the
        next model did not fit on an 8 GB card): thaw, collect, and freeze what stays again,
        a full collection that holds the GIL, and with it the other model's streams, about
        0.25 s (this project's CPU machine, ``qwen_tts`` imported). A model that came in after
        the last freeze is not frozen: a plain collection finds it without scanning the frozen
        heap (0.3 ms there). Freezing only ever adds objects (the model's own among them)
        while frozen ones that die lower the count, so a count not above the one taken when
        the model came in means no freeze since.
        """
        if self._freeze_mark is not None and gc.get_freeze_count() <= self._freeze_mark:
            gc.collect()
            return
        frozen = gc.get_freeze_count() > 0
        gc.unfreeze()
        gc.collect()
        if frozen:
            gc.freeze()

    def serve(self, source: WorkSource) -> None:
        me = self.kind.value
        while not source.closed():
            work: Work | None = None
            if self.inner is None:
                work = source.take(wait=1.0 if self.home else None)
                if work is None:
                    self._come_home()
                    continue
                if not self._come_back(work, source):
                    continue
            assert self.inner is not None
            lease = self.lease
            yield_to = (lambda: lease.wanted(me)) if lease is not None else (lambda: False)
            # No local reference to the engine: ``_drop`` must leave it unreferenced.
            self.inner.serve(_Relay(source, work, self.idle_s, yield_to))
            work = None
            if source.closed():
                break
            self._drop("another model needs the GPU" if yield_to() else f"no work for {self.idle_s:.0f} s")

    def _come_home(self) -> None:
        """A ``home`` model out of GPU memory reloads itself once the lease is free."""
        if not self.home or self.lease is None or not self.lease.try_acquire(self.kind.value):
            return
        try:
            self._bring_in()
        except Exception as err:  # noqa: BLE001 - retried at the next request
            _LOGGER.error("%s model could not come back into GPU memory: %s", self.kind.value, _oom_hint(err))
            time.sleep(5.0)

    def _come_back(self, work: Work, source: WorkSource) -> bool:
        """Load the model for ``work`` (waiting for the lease first); False if it could not,
        ``work`` then failed with the reason."""
        me = self.kind.value
        if self.lease is not None and not self.lease.try_acquire(me):
            _LOGGER.info("%s model: a request waits while the other model finishes its work%s", me, self.why)
            if not self.lease.acquire(me, source.closed):
                work.sink.failed(RuntimeError("The server is shutting down"))
                return False
        _LOGGER.info("%s model: loading it into GPU memory for a waiting request%s", me, self.why)
        try:
            self._bring_in()
        except Exception as err:  # noqa: BLE001 - the request fails, the server goes on
            _LOGGER.error("%s model could not be loaded: %s", me, _oom_hint(err))
            work.sink.failed(RuntimeError(f"The {me} model could not be loaded: {_oom_hint(err)}"))
            return False
        return True


def _oom_hint(err: BaseException) -> str:
    """The error in one line; for an out-of-memory, what to change."""
    if type(err).__name__ == "OutOfMemoryError":
        return (
            "it does not fit in the GPU memory left (CUDA out of memory); free GPU memory "
            "(another process?), lower --max-streams, or use --clone-model Qwen/Qwen3-TTS-12Hz-0.6B-Base"
        )
    return str(err).splitlines()[0] if str(err) else repr(err)
