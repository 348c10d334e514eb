"""Prompts prepared ahead of admission, so that the running streams never wait for them.

Turning a segment into its prompt (tokenization, text embeddings, a clone reference's codec
codes and speaker embedding, the codec decoder's state after the reference) is host work of
milliseconds, tens of them for a reference seen for the first time. Done on the engine thread
between two steps, every running stream would wait for it. ``PromptWorker`` does it on a
thread of its own, on CUDA on a stream of its own, while the engine steps: it takes work from
the ``WorkSource`` only while the engine has a free slot for it, and hands ready
``Prepared`` items to the engine loop, which only replays the prefill.

``Inline`` does the same work on the caller's thread, at the moment it is asked (warm-up, and
tests that say at which step a request joins).

Sinks are called from the engine thread only: the worker never calls one. A segment whose
prompt cannot be built comes out as a ``Prepared`` with its ``error``, for the engine to fail
that request alone; one cancelled before its prompt was built comes out without a prompt.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...base import Work, WorkSource
from ..prompt import Prompt
from ...segment import Segment

_LOGGER = logging.getLogger(__name__)

#: How often a waiting worker or engine re-checks whether its source closed, in seconds.
_POLL_S = 0.05
#: How long after a prompt's preparation began the engine may hold its next step for it, in
#: seconds (``PromptWorker.take``'s ``building``). A prompt takes 1.7 ms (p50) and 3.9 ms
#: (p99) on the H200 (``benchmarks/results/nvidia-h200/breakdown``); a step in flight 5-10 ms,
#: so the GPU does not idle while the engine thread waits.
BUILD_HOLD_S = 0.004


@dataclass
class Prepared:
    """A segment taken from the work source, ready to be admitted.

    Attributes:
        work: the segment and its sink.
        prompt: its prompt; None if it failed (``error``) or was cancelled before it was built.
        error: why its prompt could not be built (the request fails with it), or None.
        prepared_s: seconds spent preparing it (host and, on CUDA, its stream's GPU work).
    """

    work: Work
    prompt: Prompt | None = None
    error: BaseException | None = None
    prepared_s: float = 0.0


def prepare(work: Work, build: Callable[[Segment], Prompt], stream: torch.cuda.Stream | None = None) -> Prepared:
    """Build ``work``'s prompt (on ``stream`` when given, waiting for it), catching its error."""
    if work.sink.cancelled():
        return Prepared(work)
    started = time.perf_counter()
    try:
        prompt = build(work.segment)
        if stream is not None:
            stream.synchronize()  # the engine reads these tensors on its own stream
    except Exception as err:  # noqa: BLE001 - this request fails, the others go on
        _LOGGER.warning("Cannot start %r: %s", work.segment.text[:80], err)
        return Prepared(work, error=err, prepared_s=time.perf_counter() - started)
    done = time.perf_counter()
    if work.timeline is not None:
        work.timeline.mark("prompted", done)
    return Prepared(work, prompt, prepared_s=done - started)


def hold(prompt: Prompt, stream: torch.cuda.Stream) -> None:
    """Tell the caching allocator that ``stream`` uses ``prompt``'s tensors (made on another
    stream), so that their memory is not handed out again before that stream's work on them
    has run."""
    for tensor in (prompt.embeds, prompt.pad_embed, prompt.ref_codes):
        if tensor is not None and tensor.is_cuda:
            tensor.record_stream(stream)


class Inline:
    """Prepares work on the caller's thread when asked (warm-up, step-by-step tests)."""

    def __init__(self, source: WorkSource, build: Callable[[Segment], Prompt]) -> None:
        self._source = source
        self._build = build

    def set_free(self, free: int) -> None:
        """Nothing to do: work is taken when asked for."""

    def take(self, most: int, wait: float | None, building: bool = False) -> list[Prepared]:
        """Up to ``most`` prepared segments: waits ``wait`` seconds (None: until one comes) for
        the first, takes the others only if they are already there. (``building``: nothing
        is built ahead here.)"""
        out: list[Prepared] = []
        while len(out) < most:
            work = self._source.take(wait=wait if not out else 0)
            if work is None:
                break
            out.append(prepare(work, self._build))
        return out


class PromptWorker:
    """Prepares work on a thread of its own (on CUDA, on its own stream) ahead of admission.

    It takes a segment from ``source`` only while the engine has more free slots than there
    are prepared segments waiting (``set_free``), so work is never taken from the source
    (and its round-robin order) before a slot can hold it.

    A source may close for a while and open again (``on_demand``'s relay closes when its
    model is idle, unless a segment it handed out still runs). Before the engine stops on a
    closed source it calls ``pause``: the worker is then not inside ``source.take``, so if the
    source still says closed, nothing was taken behind the engine's back.

    Args:
        source: where work comes from (``scheduler.Scheduler``).
        build: a segment's prompt (raises for a segment that cannot start).
        device: where the prompts' tensors live.
        name: the thread's name.
        stream: the CUDA stream to prepare on (``graphs.role_stream``: the same one at every
            load of a model); None makes one on CUDA.
    """

    def __init__(self, source: WorkSource, build: Callable[[Segment], Prompt], device: torch.device,
                 name: str = "prompts", stream: torch.cuda.Stream | None = None) -> None:
        self._source = source
        self._build = build
        self._stream = stream if stream is not None or device.type != "cuda" else torch.cuda.Stream(device)
        self._cond = threading.Condition()
        self._ready: deque[Prepared] = deque()
        self._free = 0
        self._stop = False
        self._paused = False
        self._taking = False  # inside source.take or preparing what it gave
        self._building_since: float | None = None  # ``time.monotonic()`` a prompt's building began
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> list[Prepared]:
        """Stop the worker; returns what it had prepared and the engine never took."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            left = list(self._ready)
            self._ready.clear()
        return left

    def pause(self) -> None:
        """Stop taking from the source; returns once the worker is not inside ``take``."""
        with self._cond:
            self._paused = True
            self._cond.notify_all()
            while self._taking and not self._done:
                self._cond.wait(_POLL_S)

    def resume(self) -> None:
        """Take from the source again (after ``pause``)."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def set_free(self, free: int) -> None:
        """The engine's free slots now (before it takes anything this step)."""
        with self._cond:
            if free != self._free:
                self._free = free
                self._cond.notify_all()

    def take(self, most: int, wait: float | None, building: bool = False) -> list[Prepared]:
        """Up to ``most`` prepared segments, in the order taken from the source: waits
        ``wait`` seconds (None: until one is ready or the source closes) for the first.

        ``building``: also wait for a prompt being built now, until ``BUILD_HOLD_S`` after
        its building began. The engine passes it while streams run: a prompt that is ready
        before the next step is launched is prefilled before that step, not after the next
        one (the engine keeps one step in flight), which saves the new stream one step of
        first audio (5-6 ms on the H200); the wait runs while the GPU works through the step
        in flight."""
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            while not self._ready and not self._done and not self._source.closed():
                limit = deadline
                if building and self._building_since is not None:
                    hold = self._building_since + BUILD_HOLD_S
                    limit = hold if limit is None else max(limit, hold)
                remaining = _POLL_S if limit is None else min(_POLL_S, limit - time.monotonic())
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            out = [self._ready.popleft() for _ in range(min(most, len(self._ready)))]
            self._free -= len(out)
            return out

    def _take_one(self) -> Prepared | None:
        """One segment from the source, prepared; None if none came."""
        try:
            work = self._source.take(wait=_POLL_S)
        except Exception:  # noqa: BLE001 - a broken work source: keep going, not in a spin
            _LOGGER.exception("Taking work failed")
            time.sleep(0.1)
            return None
        if work is None:
            return None
        with self._cond:
            self._building_since = time.monotonic()
        return prepare(work, self._build, self._stream)

    def _room(self) -> bool:
        return self._free > len(self._ready)

    def _run(self) -> None:
        context = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        try:
            with context:
                while True:
                    with self._cond:
                        while not self._stop and (self._paused or self._source.closed() or not self._room()):
                            self._cond.wait(_POLL_S)
                        if self._stop:
                            return
                        self._taking = True
                    item = self._take_one()
                    with self._cond:
                        if item is not None:
                            self._ready.append(item)
                        self._building_since = None
                        self._taking = False
                        self._cond.notify_all()
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()
