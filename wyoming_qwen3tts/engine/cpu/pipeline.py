"""The pipeline engine: codec frames generated on one thread, decoded on another (ONNX Runtime).

A ``FrameSource`` makes each segment's codec frames (16 codes a frame, 80 ms of audio) and
hands them to Python as they come; the engine decodes them with ONNX Runtime's streaming
codec step (``onnx_codec``) on a second thread, so generation and decoding overlap on their
own cores (``machine.pipeline_threads``: 1 + 1 threads on 2 cores, 2 + 2 on 4):

* **Generation thread** (the engine thread): keeps up to ``capacity`` segments in
  generation and advances them one frame each in turn, so two clients are both heard from
  the start; it takes new work whenever one ends. Before each frame it checks the client's
  cancel flag (and the source checks it too), so a client that leaves stops its generation
  within a frame.
* **Codec thread**: takes one pending frame from each stream in turn (round robin: a new
  stream's first frame waits for at most one frame of each other stream), decodes it with
  that stream's own decoder state, and delivers chunks of ``chunk_frames`` frames to the
  stream's sink: the first chunk leaves as soon as its frames are decoded. Every sink call
  (audio, done, failed) is made from this thread. A cancelled stream's frames not yet
  decoded are dropped.

Between them, a board of streams: each with its frames not yet decoded, in order. The
generation side may run ahead of the codec; the codes are small (128 bytes a frame).

An ICL clone's reference codes are the codec's past before the first frame (as qwen_tts
decodes them): decoded once per clip, on the codec thread at its first use (about one step
a reference frame) or ahead by ``prime``, and the decoder state after them kept
(``CONTEXT_CACHE_SIZE`` clips, 5.3 MB each for the released codec).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ...common.audio import SAMPLES_PER_FRAME
from ...common.vocabulary import ModelKind, Reference
from ..base import Engine, Sink, Work, WorkSource
from ..segment import Segment
from .machine import ThreadPlan
from .onnx_codec import CodecStream, OnnxCodec

_LOGGER = logging.getLogger(__name__)

#: Decoder states after an ICL clip's reference codes kept (LRU), as the batched engine keeps
#: (``batched.prefill.PREFIX_CACHE_SIZE``).
CONTEXT_CACHE_SIZE = 16
#: Seconds the generation thread waits for work when it has none (then checks ``closed``).
IDLE_WAIT_S = 0.5


class FrameSource(Protocol):
    """What makes codec frames for the pipeline engine: one model's generation, without a codec.

    Attributes:
        streams: generators ``frames`` may have open at once (the engine's ``capacity``).
        backend: one line naming it, for the engine's description.
    """

    streams: int
    backend: str

    def speakers(self) -> list[str]:
        """CustomVoice speaker ids (lower case); [] for other kinds."""

    def prime(self, reference: Reference) -> bool:
        """Prepare a clone clip now (its x-vector, codes); True if something was prepared."""

    def decoder_context(self, reference: Reference) -> np.ndarray | None:
        """A clone clip's codec codes the decoder must decode before the segment's frames
        (ICL: int64 [n, 16]), or None."""

    def frames(self, segment: Segment, cancelled: Callable[[], bool]) -> Iterator[np.ndarray]:
        """Generate ``segment``: each codec frame's codes, int64 [16], as made; stops at EOS,
        ``max_new_tokens`` or within a frame of ``cancelled()``. Closing it stops generation.
        Up to ``streams`` generators are open at once, each advanced a frame at a time in
        turn from one thread (the engine's generation thread): each keeps its own state.

        Raises:
            ValueError (and what the model raises): a segment it cannot voice; the engine
                fails that segment alone.
        """


@dataclass(eq=False)
class _Stream:
    """One segment on its way through the pipeline.

    Attributes:
        work: the segment and its sink.
        pending: frames generated and not yet decoded (int64 [16] each), oldest first.
        generated: frames generated so far.
        ended: generation is over (EOS, cap, cancel or failure); ``error`` if it failed.
        stop: set by the codec thread when decoding failed: generation stops too.
        decoder: its codec state (made on the codec thread at its first frame).
        pcm: decoded frames (float32 [1920] each) of the chunk being filled.
        delivered: frames delivered to the sink.
    """

    work: Work
    pending: deque[np.ndarray] = field(default_factory=deque)
    generated: int = 0
    ended: bool = False
    error: BaseException | None = None
    stop: bool = False
    decoder: CodecStream | None = None
    pcm: list[np.ndarray] = field(default_factory=list)
    delivered: int = 0

    @property
    def sink(self) -> Sink:
        return self.work.sink

    def cancelled(self) -> bool:
        """The client left, or decoding failed: generation stops at its next frame."""
        return self.stop or self.work.sink.cancelled()


class _Board:
    """The streams between the two threads: generation posts frames and ends, the codec thread
    takes one frame (or an end) of each stream in turn."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._streams: list[_Stream] = []
        self._next = 0
        self._closed = False

    def add(self, stream: _Stream) -> None:
        with self._lock:
            self._streams.append(stream)
            self._lock.notify()

    def put(self, stream: _Stream, codes: np.ndarray) -> None:
        """A frame of ``stream``'s, to decode after its earlier ones."""
        with self._lock:
            stream.pending.append(codes)
            stream.generated += 1
            self._lock.notify()

    def end(self, stream: _Stream, error: BaseException | None = None) -> None:
        """``stream``'s generation is over (``error``: it failed)."""
        with self._lock:
            stream.ended = True
            stream.error = stream.error or error  # a decoding failure stays the reason
            self._lock.notify()

    def close(self) -> None:
        """Stop the codec thread after the frame it is decoding (the engine stops)."""
        with self._lock:
            self._closed = True
            self._lock.notify()

    def take(self) -> tuple[_Stream, np.ndarray | None] | None:
        """The next stream in turn with something to do, and its oldest pending frame (None: its
        generation ended and every frame is decoded: finish it). Blocks until there is one;
        None once closed (frames not yet decoded are abandoned: the engine stops)."""
        with self._lock:
            while not self._closed:
                count = len(self._streams)
                for offset in range(count):
                    index = (self._next + offset) % count
                    stream = self._streams[index]
                    if stream.pending:
                        self._next = index + 1
                        return stream, stream.pending.popleft()
                    if stream.ended:
                        self._streams.pop(index)
                        self._next = index
                        return stream, None
                self._lock.wait()
            return None

    def drop(self, stream: _Stream) -> None:
        """Forget ``stream``'s frames not yet decoded (its client left)."""
        with self._lock:
            stream.pending.clear()


class PipelineEngine(Engine):
    """Generation on one thread, the codec on another (see the module docstring).

    Args:
        kind: the model kind (the source checked it against its checkpoint).
        source: the model's frame source (``FrameSource``).
        codec: the codec step's ONNX Runtime session (``onnx_codec.OnnxCodec``).
        chunk_frames: codec frames per delivered chunk (1920 samples each).
        threads: the threads chosen (``machine.pipeline_threads``), for the log and ``describe``.

    Attributes:
        threads: as given.
    """

    def __init__(self, kind: ModelKind, source: FrameSource, codec: OnnxCodec, chunk_frames: int,
                 threads: ThreadPlan) -> None:
        super().__init__(kind, max(1, chunk_frames), capacity=max(1, source.streams))
        self.source = source
        self.codec = codec
        self.threads = threads
        self._board = _Board()
        self._contexts: OrderedDict[str, tuple[dict[str, np.ndarray], int]] = OrderedDict()
        self._contexts_lock = threading.Lock()
        self.backend = (f"{source.backend}, ONNX Runtime codec on its own thread(s) ({self.capacity} stream(s) at once, "
                        f"{threads.generation} + {threads.codec} threads)")
        _LOGGER.info("CPU pipeline engine, %s model: %s", kind.value, threads.describe())

    def speakers(self) -> list[str]:
        return self.source.speakers()

    def prime(self, reference: Reference) -> bool:
        """Prepare a clone clip before serving: the source's prompt pieces, and for an ICL clone
        the decoder state after its reference codes (else its first request's codec pays it).

        Raises:
            ValueError / RuntimeError: the source refused the clip.
        """
        primed = self.source.prime(reference)
        if self.kind is ModelKind.BASE:
            self._context(reference)
        return primed

    def warmup(self, segment: Segment) -> None:
        """Generate and decode ``segment`` on the calling thread (both sides' first runs).

        Raises:
            RuntimeError: no audio came out.
        """
        decoder = self._decoder(segment)
        samples = 0
        frames = self.source.frames(segment, lambda: False)
        try:
            for codes in frames:
                samples += len(decoder.decode(codes))
        finally:
            frames.close()  # type: ignore[attr-defined]
        if samples == 0:
            raise RuntimeError("warm-up generation produced no audio")

    def serve(self, source: WorkSource) -> None:
        """Generate on this thread, decode on a codec thread, until ``source`` closes."""
        codec = threading.Thread(target=self._decode_loop, name=f"codec-{self.kind.value}", daemon=True)
        codec.start()
        try:
            self._generate_loop(source)
        finally:
            self._board.close()
            codec.join(timeout=10)

    # --- the generation thread ----------------------------------------------------------

    def _generate_loop(self, source: WorkSource) -> None:
        """Keep up to ``capacity`` segments generating, one frame each in turn."""
        active: list[tuple[_Stream, Iterator[np.ndarray]]] = []
        while not source.closed():
            while len(active) < self.capacity:
                work = source.take(wait=0 if active else IDLE_WAIT_S)
                if work is None:
                    break
                stream = _Stream(work)
                if work.timeline is not None:
                    work.timeline.mark("admitted", time.perf_counter())
                self._board.add(stream)
                if work.sink.cancelled():
                    self._board.end(stream)
                    continue
                active.append((stream, self.source.frames(work.segment, stream.cancelled)))
            for item in list(active):
                if not self._advance(*item):
                    active.remove(item)
        for stream, frames in active:  # closing: the engine stops
            frames.close()  # type: ignore[attr-defined]
            self._board.end(stream)

    def _advance(self, stream: _Stream, frames: Iterator[np.ndarray]) -> bool:
        """Generate ``stream``'s next frame onto the board; False once its generation ended."""
        if stream.cancelled():  # the client left (or decoding failed): stop generating now
            frames.close()  # type: ignore[attr-defined]
            self._board.end(stream)
            return False
        try:
            codes = next(frames)
        except StopIteration:
            self._board.end(stream)
            return False
        except Exception as err:  # noqa: BLE001 - reported to the client, the engine lives on
            _LOGGER.exception("Generation failed for %r", stream.work.segment.text[:80])
            self._board.end(stream, err)
            return False
        timeline = stream.work.timeline
        if stream.generated == 0 and timeline is not None:
            timeline.mark("generated", time.perf_counter())
        self._board.put(stream, codes)
        return True

    # --- the codec thread -----------------------------------------------------------------

    def _decode_loop(self) -> None:
        """Decode one frame of each stream in turn and deliver chunks, until the board closes."""
        while (taken := self._board.take()) is not None:
            stream, codes = taken
            if codes is None:
                self._finish(stream)
            elif stream.error is not None or stream.sink.cancelled():
                self._board.drop(stream)
                stream.pcm.clear()
            else:
                try:
                    self._decode(stream, codes)
                except Exception as err:  # noqa: BLE001 - that stream fails, the others go on
                    _LOGGER.exception("Decoding failed for %r", stream.work.segment.text[:80])
                    stream.error, stream.stop = err, True  # its generation stops at the next frame
                    self._board.drop(stream)
                    stream.pcm.clear()

    def _decode(self, stream: _Stream, codes: np.ndarray) -> None:
        """Decode one frame of ``stream``'s; deliver a chunk once ``chunk_frames`` are decoded."""
        if stream.decoder is None:
            stream.decoder = self._decoder(stream.work.segment)
        stream.pcm.append(stream.decoder.decode(codes))
        timeline = stream.work.timeline
        if stream.delivered == 0 and len(stream.pcm) == 1 and timeline is not None:
            timeline.mark("decoded", time.perf_counter())
        if len(stream.pcm) >= self.chunk_frames:
            self._deliver(stream)

    def _deliver(self, stream: _Stream) -> None:
        """Send ``stream``'s decoded frames as one chunk, float32 [k * 1920]."""
        chunk = stream.pcm[0] if len(stream.pcm) == 1 else np.concatenate(stream.pcm)
        stream.pcm = []
        stream.delivered += len(chunk) // SAMPLES_PER_FRAME
        stream.sink.audio(chunk)

    def _finish(self, stream: _Stream) -> None:
        """``stream``'s generation ended and every frame of it is decoded: the last chunk, then
        ``done`` (frames delivered), or ``failed`` if generating or decoding it failed."""
        try:
            if stream.error is None and stream.pcm and not stream.sink.cancelled():
                self._deliver(stream)
        except Exception as err:  # noqa: BLE001 - the sink's own failure: reported to it
            stream.error = err
        if stream.error is not None:
            stream.sink.failed(stream.error)
            return
        if stream.sink.cancelled():
            _LOGGER.info("Generation stopped after %d codec frames (cap %d): request cancelled",
                         stream.generated, stream.work.segment.max_new_tokens)
        stream.sink.done(stream.delivered)

    # --- decoder states -------------------------------------------------------------------

    def _decoder(self, segment: Segment) -> CodecStream:
        """A decoder for ``segment``: fresh, or after its ICL clip's reference codes."""
        decoder = self.codec.stream()
        if self.kind is ModelKind.BASE and segment.reference is not None:
            saved = self._context(segment.reference)
            if saved is not None:
                decoder.restore(saved)
        return decoder

    def _context(self, reference: Reference) -> tuple[dict[str, np.ndarray], int] | None:
        """The decoder state after ``reference``'s ICL codes (decoded once, kept LRU), or None
        for a clip without them."""
        with self._contexts_lock:
            saved = self._contexts.get(reference.digest)
            if saved is not None:
                self._contexts.move_to_end(reference.digest)
                return saved
        codes = self.source.decoder_context(reference)
        if codes is None:
            return None
        started = time.monotonic()
        decoder = self.codec.stream()
        for frame in np.asarray(codes, dtype=np.int64).reshape(-1, 16):
            decoder.decode(frame)
        saved = decoder.save()
        _LOGGER.debug("Decoded a clone clip's %d reference frames as the codec's past in %.2f s",
                      len(codes), time.monotonic() - started)
        with self._contexts_lock:
            self._contexts[reference.digest] = saved
            if len(self._contexts) > CONTEXT_CACHE_SIZE:
                self._contexts.popitem(last=False)
        return saved

