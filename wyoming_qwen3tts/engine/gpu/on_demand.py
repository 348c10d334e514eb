"""A model that is in GPU memory only while it has work: loaded on demand, dropped when idle.

``OnDemandEngine`` wraps the loading of an engine. Its thread waits for work; when a
segment comes and the model is out, it loads the model (from disk: the OS page cache
makes a reload a matter of seconds), warms it up, and lets it serve until it has had no
work for ``idle_s`` seconds; then the model is dropped and its memory returned to the
card. Segments that come while it is out wait in the work source (the scheduler) and are
served once it is back, in turn, as if the model had been busy.

Where two models do not fit on the card together (the 1.7B Base and VoiceDesign models
on an 8 GB card), both take turns through a ``GpuLease``: one model on the card at a
time, and the lease (``lease.py``) decides whose turn it is from what waits for each
(``next_turn``, ``must_yield``, from each scheduler's ``Demand``):

- a client's request goes before background work (anchor rendering): the model holding
  the card takes no new work once a client waits for the other one, finishes the requests
  it started, and leaves; the lease then goes to the model whose client waits longest, so
  a request waits for at most one swap;
- a model comes in for background work only when the holder has nothing to do, and then
  stays while it has any (every missing anchor in one visit) unless a client waits for the
  other model;
- with nothing waiting anywhere, the ``home`` model (Base) comes back, ``TURNS_IDLE_S``
  after the other one's last work, ready for the next clone request.

A model that leaves gives back everything it held: the engine and its slots, graphs and
their pools, the cuBLAS workspaces of its streams (``release_gpu_memory``).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable

from ...common.vocabulary import ModelKind, Reference
from ..base import Engine, Sink, Work, WorkSource
from .memory import gpu_memory_note, is_out_of_memory
from .lease import Demand, GpuLease
from ..loader import MemoryFitError, load_fitting
from ..segment import Segment

_LOGGER = logging.getLogger(__name__)

#: Seconds without work after which an on-demand model leaves GPU memory.
DEFAULT_IDLE_S = 60.0
#: Seconds without work after which a model taking turns with a ``home`` model gives the
#: card back to it (the Base model is then in GPU memory again for the next clone request).
TURNS_IDLE_S = 5.0
#: How often a serving model checks whether the other model waits for the lease, in seconds.
_POLL_S = 0.1
#: Seconds between attempts to load a model that did not fit (another process holds the memory).
RETRY_S = 5.0


def release_gpu_memory(exclusive: bool) -> None:
    """Return the allocator's cached blocks to the card after a model was let go and
    collected. ``exclusive`` (no other model on the GPU: taking turns) also frees the cuBLAS
    workspaces (one per handle and stream, 32 MiB each on Hopper; ``empty_cache`` keeps them,
    and captured graphs of a model still loaded may point into them)."""
    import torch

    if not torch.cuda.is_available():
        return
    torch.cuda.synchronize()
    if exclusive:
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
    torch.cuda.empty_cache()


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
    no segment runs and either ``idle_s`` passed since the last one, or ``shed()`` (the model
    ran out of GPU memory while serving: it reloads with the streams the memory holds now),
    or (taking turns) the lease says to yield and no request it started has a segment waiting.
    """

    def __init__(
        self, source: WorkSource, first: Work | None, idle_s: float | None, who: str, lease: GpuLease | None,
        clock: Callable[[], float] = time.monotonic, shed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._source = source
        self._shed = shed
        self._first: Work | None = first
        self._idle_s = idle_s
        self._who = who
        self._lease = lease
        self._clock = clock
        self._lock = threading.Lock()
        self._running = 0
        self._last = clock()

    def ended(self) -> None:
        with self._lock:
            self._running -= 1
            self._last = self._clock()

    def _yielding(self) -> bool:
        if self._lease is None:
            return False
        with self._lock:
            busy = self._running > 0
            idle_s = self._clock() - self._last
        return self._lease.must_yield(self._who, busy, idle_s)

    def _started_waiting(self) -> bool:
        has_started = getattr(self._source, "has_started", None)
        return bool(has_started()) if has_started is not None else False

    def _leaving(self) -> bool:
        with self._lock:
            if self._running > 0 or self._first is not None:
                return False
            idle = self._idle_s is not None and self._clock() - self._last >= self._idle_s
        return idle or self._shed() or (self._yielding() and not self._started_waiting())

    def closed(self) -> bool:
        return self._source.closed() or self._leaving()

    def take(self, wait: float | None) -> Work | None:
        if self._first is not None:
            first, self._first = self._first, None
            return self._wrap(first)
        # Short waits: a segment that comes while the model is about to leave is taken only
        # within this much of the decision.
        wait = _POLL_S if wait is None else min(wait, _POLL_S)
        if self._shed():  # out of memory: take nothing new, leave once what runs ended, reload
            time.sleep(min(wait, _POLL_S / 2))
            return None
        if self._yielding():  # another model's client waits: finish the requests started here only
            work = None
            if self._started_waiting():  # only a source with ``has_started`` (the scheduler) says so
                work = self._source.take(wait, started_only=True)  # type: ignore[call-arg]
            if work is None and wait > 0:
                time.sleep(min(wait, _POLL_S / 2))
            return self._wrap(work) if work is not None else None
        work = self._source.take(wait)
        return self._wrap(work) if work is not None else None

    def _wrap(self, work: Work) -> Work:
        with self._lock:
            self._running += 1
        return Work(work.segment, _CountingSink(work.sink, self), work.timeline)


class OnDemandEngine(Engine):
    """An engine loaded when work comes and dropped when idle (see the module docstring).

    Args:
        kind: the model kind.
        chunk_frames: codec frames per chunk (as the inner engine's).
        load: builds the inner engine, given the fraction of the planned streams to take
            (the real loader; may raise, e.g. ``torch.OutOfMemoryError``).
        warm_segment: the warm-up generation run after every load.
        idle_s: seconds without work before the model leaves GPU memory; None keeps it
            (a model that only takes turns through ``lease``). Taking turns with a ``home``
            model, at most ``TURNS_IDLE_S``.
        lease: shared with the models it cannot be on the card with, or None.
        why: what the model is needed for, for the log lines.
        speakers: the CustomVoice speaker ids while the model is out (from its config).
        home: comes back by itself when nothing waits for any model (the Base model, taking
            turns with the VoiceDesign model: it is back before the next clone request).
        auto_streams: ``--max-streams auto``: an out-of-memory while loading is retried with
            fewer streams (``loader.load_fitting``).
        clock: seconds, monotonic (tests pass a fake one).
        unservable: why the model can never be on this card, even with the others gone
            (``sizing.unservable``), or None. Such a model is never loaded and never takes
            the lease from the model on the card: its requests fail at once with this reason.

    Attributes:
        loads: how many times the model was loaded (tests, logs).
    """

    #: ``prime`` may be called while the engine serves (``clips.ClipPreparer``).
    prime_any_time = True

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
        clock: Callable[[], float] = time.monotonic,
        unservable: str | None = None,
    ) -> None:
        super().__init__(kind, chunk_frames, capacity=1)
        self.unservable = unservable
        self._load = load
        self._warm_segment = warm_segment
        self.idle_s = idle_s
        self.lease = lease
        self.why = why
        self._speakers = list(speakers or [])
        self.home = home and lease is not None
        self.auto_streams = auto_streams
        self._clock = clock
        self.inner: Engine | None = None
        #: ``gc.get_freeze_count()`` once the model came in (see ``_collect``).
        self._freeze_mark: int | None = None
        #: Clone references to prepare on every load (``prime``), by digest.
        self._references: dict[str, Reference] = {}
        self._inner_lock = threading.Lock()  # priming holds the inner engine; dropping waits
        self.loads = 0
        #: Seconds the longest-waiting request waited for each load (a swap), for the log and benchmarks.
        self.swap_waits: list[float] = []
        self.backend = "on demand"

    @property
    def resident(self) -> bool:
        """Whether the model is in GPU memory now."""
        return self.inner is not None

    def speakers(self) -> list[str]:
        return self.inner.speakers() if self.inner is not None else list(self._speakers)

    def prime(self, reference: Reference) -> bool:
        """Prepare a clone reference now if the model is in GPU memory, and again after every
        load (the prompt caches leave with the model). Safe while serving. True if the inner
        engine prepared it now."""
        if self.kind is not ModelKind.BASE:
            return False
        with self._inner_lock:
            self._references[reference.digest] = reference
            inner = self.inner
            return bool(inner is not None and inner.prime(reference))

    def forget(self, digests: set[str]) -> None:
        """Stop preparing references whose digest is not in ``digests`` (clips removed)."""
        with self._inner_lock:
            for digest in set(self._references) - digests:
                del self._references[digest]

    def warmup(self, segment: Segment) -> None:
        """Load and warm the model now if it may (the lease is free), so start-up proves the
        checkpoint loads; it then stays until idle. Otherwise it loads on first use (never
        when ``unservable``)."""
        if self.unservable is not None:
            return
        if self.lease is not None and not self.lease.try_acquire(self.kind.value):
            _LOGGER.info("%s model: loads when first needed (it takes turns with the other model)", self.kind.value)
            return
        self._bring_in()

    def _bring_in(self) -> None:
        started = time.monotonic()
        _reset_peak()  # the log's peak is this load's, not the other model's stay
        engine: Engine | None = None
        try:
            engine = load_fitting(self._load, lambda e: e.warm(self._warm_segment(e)), self.kind, self.auto_streams)
        except BaseException:
            engine = None  # loaded but failed its warm-up: let it go before emptying the cache
            self._drop(None)
            raise
        primed = 0
        for reference in list(self._references.values()):
            try:
                primed += bool(engine.prime(reference))
            except Exception as err:  # noqa: BLE001 - its first request then prepares it (and fails if it must)
                _LOGGER.warning("%s model: could not prepare a clone clip: %s", self.kind.value, err)
        with self._inner_lock:
            self.inner = engine
        engine = None
        self._freeze_mark = gc.get_freeze_count()
        self.loads += 1
        self.capacity = self.inner.capacity
        self.backend = f"{self.inner.backend}, on demand"
        _LOGGER.info(
            "%s model is in GPU memory (%.1f s to load, %d stream(s)%s%s)", self.kind.value, time.monotonic() - started,
            self.capacity, f", {primed} clone clip(s) prepared" if primed else "", _reserved_note(),
        )

    def _drop(self, why: str | None) -> None:
        """Release the model's GPU memory (and the lease)."""
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()  # a step launched before its rows ended may still run
        with self._inner_lock:
            gone = weakref.ref(self.inner) if self.inner is not None else None
            self.inner = None
        self._collect()
        release_gpu_memory(exclusive=self.lease is not None)
        if torch.cuda.is_available():
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

    def _out_of_memory(self) -> bool:
        """The loaded engine ran out of GPU memory while serving (another process took it)."""
        return getattr(self.inner, "out_of_memory", 0) > 0

    def _idle_bound(self) -> float | None:
        """Seconds without work before leaving: ``idle_s``, at most ``TURNS_IDLE_S`` while a
        ``home`` model waits to come back."""
        lease = self.lease
        if lease is not None and lease.home not in (None, self.kind.value):
            return TURNS_IDLE_S if self.idle_s is None else min(self.idle_s, TURNS_IDLE_S)
        return self.idle_s

    def serve(self, source: WorkSource) -> None:
        me = self.kind.value
        if self.unservable is not None:
            self._refuse(source)
            return
        lease = self.lease
        if lease is not None:
            demand = getattr(source, "demand", None)
            lease.register(me, demand if demand is not None else Demand, self.home)
        while not source.closed():
            work: Work | None = None
            if self.inner is None:
                if lease is not None:
                    if not self._take_turn(lease, source):
                        if self.unservable is not None:  # found not to fit even alone
                            self._refuse(source)
                            return
                        continue
                else:
                    work = source.take(wait=None)
                    if work is None or not self._come_back(work):
                        continue
            assert self.inner is not None
            relay = _Relay(source, work, self._idle_bound(), me, lease, self._clock, self._out_of_memory)
            # No local reference to the engine: ``_drop`` must leave it unreferenced.
            self.inner.serve(relay)
            work = None
            if source.closed():
                break
            yielded = lease is not None and lease.must_yield(me, busy=False)
            self._drop(
                "out of GPU memory while serving: it comes back with the streams the free memory holds"
                if self._out_of_memory() else "another model needs the GPU" if yielded
                else f"no work for {self._idle_bound():.0f} s"
            )
            del relay

    def _take_turn(self, lease: GpuLease, source: WorkSource) -> bool:
        """Wait for this model's turn on the GPU and load it; False if it could not (the work
        waiting for it then failed with the reason) or the source closed."""
        me = self.kind.value
        waiting = lease.demand(me)
        if waiting.clients and lease.holder not in (None, me):
            _LOGGER.info("%s model: %d request(s) wait while the other model finishes its work%s",
                         me, waiting.clients, self.why)
        if not lease.wait_turn(me, source.closed):
            return False
        waiting = lease.demand(me)
        what = "a waiting request" if waiting.clients else "background work" if waiting.background else "the next request"
        _LOGGER.info("%s model: loading it into GPU memory for %s%s", me, what, self.why)
        since = waiting.since
        try:
            self._bring_in()
        except Exception as err:  # noqa: BLE001 - what waits fails, the server goes on
            reason = _oom_hint(err)
            _LOGGER.error("%s model could not be loaded: %s", me, reason)
            # What waits now is taken before the failure is made known: a request that comes
            # once the first of them failed (2-core CI: before this loop ended) gets the
            # lasting reason below, not this try's.
            waiting_now = self._take_waiting(source)
            error = RuntimeError(f"The {me} model could not be loaded: {reason}")
            if isinstance(err, MemoryFitError) and not self.home:
                # Not one stream beside its weights with the other models out: each try would
                # send the model on the card out for nothing. Tried again after a restart
                # (another process may have let memory go by then).
                self.unservable = f"{reason} (with the other model out of GPU memory)"
                lease.unregister(me)
                _LOGGER.error(
                    "Not served with this GPU memory: the %s model does not fit even alone; until the server "
                    "restarts, requests that need it fail at once and the other model stays on the GPU (free GPU "
                    "memory: another process holds it?)", me,
                )
                self._fail(waiting_now, error)
                lease.release(me)
                return False
            self._fail(waiting_now, error)
            lease.release(me)
            deadline = time.monotonic() + RETRY_S  # before trying again: what holds the memory may let go
            while time.monotonic() < deadline and not source.closed():
                time.sleep(_POLL_S)
            return False
        if since is not None:
            self.swap_waits.append(time.monotonic() - since)
            _LOGGER.info("%s model: the longest-waiting request waited %.1f s for it", me, self.swap_waits[-1])
        return True

    def _refuse(self, source: WorkSource) -> None:
        """Fail every segment for a model that can never be on this card, at once (the model
        on the card stays: this one never registers with the lease)."""
        error = RuntimeError(f"The {self.kind.value} model cannot be served on this GPU: {self.unservable}")
        while not source.closed():
            work = source.take(wait=_POLL_S)
            if work is not None:
                work.sink.failed(error)

    @staticmethod
    def _take_waiting(source: WorkSource) -> list[Work]:
        """Every segment queued now, taken off the queue (the model they wait for could not
        be loaded); ``_fail`` then fails them."""
        taken: list[Work] = []
        while (work := source.take(wait=0)) is not None:
            taken.append(work)
        return taken

    @staticmethod
    def _fail(works: list[Work], error: BaseException) -> None:
        """Fail each of ``works`` with ``error``."""
        for work in works:
            work.sink.failed(error)

    def _come_back(self, work: Work) -> bool:
        """Load the model for ``work`` (no lease); False if it could not, ``work`` then
        failed with the reason."""
        me = self.kind.value
        _LOGGER.info("%s model: loading it into GPU memory for a waiting request%s", me, self.why)
        try:
            self._bring_in()
        except Exception as err:  # noqa: BLE001 - the request fails, the server goes on
            _LOGGER.error("%s model could not be loaded: %s", me, _oom_hint(err))
            work.sink.failed(RuntimeError(f"The {me} model could not be loaded: {_oom_hint(err)}"))
            return False
        return True


def _reserved_note() -> str:
    """", X GB reserved (peak Y GB)": what this process's allocator holds after a load and its
    peak since ``_reset_peak`` at the load's start (weights, slots and workspace; empty
    without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return ""
    return f", {torch.cuda.memory_reserved() / 1e9:.2f} GB reserved (peak {torch.cuda.max_memory_reserved() / 1e9:.2f} GB)"


def _reset_peak() -> None:
    """Start ``_reserved_note``'s peak now (nothing without CUDA)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _oom_hint(err: BaseException) -> str:
    """The error in one line; for an out-of-memory, what to change."""
    if is_out_of_memory(err):
        note = f": {gpu_memory_note()}" if gpu_memory_note() else ""
        return (
            f"it does not fit in the GPU memory left (CUDA out of memory{note}); free GPU memory "
            "(another process?), lower --max-streams, or use --clone-model Qwen/Qwen3-TTS-12Hz-0.6B-Base"
        )
    return str(err).splitlines()[0] if str(err) else repr(err)
