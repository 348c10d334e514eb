"""The batched engine: a pool of slots, every active stream one codec frame per step.

One thread per model runs this loop:

0. **Prepare** (``stages.intake.PromptWorker``, a thread of its own, on CUDA a stream of its
   own): while the engine steps, waiting segments are taken from the source (as many as there
   are free slots) and their prompts built: tokens, embeddings, a clone reference's codes and
   the codec decoder's state after them. The engine thread waits for that host work only
   briefly, while the GPU runs the step in flight: a prompt whose building began less than
   ``stages.intake.BUILD_HOLD_S`` ago is waited for, so that it is prefilled before the next
   step is launched rather than behind it.
1. **Admit.** The planner (``planner.Planner``) says how many prepared segments to take
   (round-robin between clients) before this step: everything that fits when nothing runs,
   else at most one prefill's worth (``prefill.MAX_JOIN`` rows), held back a step or two
   while a running stream is about to run out of buffered audio. Their prompts are prefilled
   together: one replay of the graph captured for (rows, token bucket), which writes each new
   row's keys and values straight into its slot (``prefill.Prefill``); its first token is
   sampled, and its codec decoder state is reset (or, for an ICL clone, set to the state after
   the reference codes, computed once per reference).
2. **Step.** Replay the captured graph of the smallest (batch, length) bucket that holds the
   active rows: talker + code predictor for every row at once (``step.FrameStep``). On CUDA
   the frame's codes are then decoded by a second graph, per batch bucket, on its own CUDA
   stream (``codec.StreamingDecoder``), so that decoding frame ``t`` overlaps the talker and
   predictor of frame ``t + 1``. The frame's PCM and EOS flags are copied to pinned host
   memory asynchronously. Work on the decoder's state (admission resets or loads new rows,
   compaction moves them) is queued on the decoder's stream, after the decode in flight, so
   the talker's stream never waits for a decode (``_on_decoder``).
3. **Deliver.** While that step runs, read the previous step's PCM and flags (no ``.item()``
   in the step), hand each row's audio to its sink every ``chunk_frames`` frames (with
   ``chunk_growth``: its first chunk at its first frame, then chunks of 2, 4, 8... frames up
   to ``chunk_frames``), and retire
   rows that hit EOS, their frame cap or the end of the cache, or whose client left. A
   retired row's slot is filled at once by moving the last row into it (``pool.SlotPool``
   keeps the bookkeeping; ``_move`` moves the device state).

On the CPU (tests) the same step runs eagerly, synchronously.

A request's first segment carries its timeline (``Work.timeline``): ``first_frame.FirstFrames``
marks its admission, prefill, first frame and first PCM on it, adding no synchronization.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...common.vocabulary import ModelKind, Reference
from ..base import Engine, ModelMismatchError, Work, WorkSource
from ..gpu.memory import is_out_of_memory, serving_error
from .codec import StreamingDecoder
from .first_frame import FirstFrames, Probe
from .graphs import StepGraphs, buckets, role_stream
from .planner import Planner
from .pool import Row, SlotPool
from .prefill import Prefill
from .prompt import Prompt, PromptBuilder
from ..prompts import ClonePrompts
from ..segment import Segment
from ..gpu.sizing import PRIME_HEADROOM_BYTES
from .stages.intake import Inline, PromptWorker, hold
from .step import FrameStep, SlotState

Intake = PromptWorker | Inline

_LOGGER = logging.getLogger(__name__)

#: Seconds a step's GPU work may keep ``_deliver`` waiting before it is logged as a stall. A
#: frame takes 5-10 ms on an H200 and must take under 80 ms (realtime) on any card served, so
#: a second means the GPU is stuck or taken by another process. Stop 38's stall (steps of 15 s,
#: every request timing out) left nothing in the log.
STEP_STALL_S = 1.0
#: Seconds between two stall warnings (the slow steps between are counted in the next one).
STALL_LOG_EVERY_S = 30.0

#: Free device memory under which ``prime`` returns its stream's cached blocks to the driver
#: (``empty_cache`` makes the running streams wait for a few ms; with more free it is not
#: needed).
_TIGHT_BYTES = 4 * PRIME_HEADROOM_BYTES


@dataclass
class _Launched:
    """A step in flight: which row was where, and where its outputs land."""

    rows: list[Row]
    pcm: torch.Tensor  # float32 [b, samples_per_frame], host (pinned on CUDA)
    eos: torch.Tensor  # bool [b], host
    done: torch.cuda.Event | None
    probes: list[Probe] | None = None  # timed requests whose first frame this step makes


class BatchedEngine(Engine):
    """Many streams of one model in one batched step (see the module docstring).

    Args:
        kind: the model kind (checked against the checkpoint).
        tts: ``faster_qwen3_tts.FasterQwen3TTS`` around the loaded model (its prompt building
            is reused; its own single-stream graphs are not).
        chunk_frames: codec frames per delivered chunk.
        chunk_growth: a stream's first chunk is its first frame, and each next one twice the
            one before up to ``chunk_frames`` (1, 2, 4, 8, ...): the first audio as soon as
            with one-frame chunks, fewer chunks after it. False: every chunk ``chunk_frames``.
        max_streams: slots (streams generated at once).
        max_len: talker KV positions per slot (prompt + frames).
        graphs: capture CUDA graphs (True on CUDA; False runs eagerly, e.g. on the CPU).
        batch_buckets, length_buckets: graph shapes captured (the pool size and ``max_len``
            are always included).
        on_join: called with the stall each admission caused the streams already running,
            in seconds, for metrics: from the start of the admission to the start of the next
            step, in GPU time on CUDA (events), in wall time on the CPU. Admissions into an
            idle pool stall no one and are not reported.
        overlap_decode: on CUDA, decode on a side stream, overlapping the next step (see the
            module docstring); False decodes in line, after the step, on one stream.
        on_eager_prefill: called with the number of rows of each prefill that ran eagerly
            (a prompt over the largest token bucket: no captured graph), for metrics.
        prefill_graph_rows: prefills of at most this many rows replay captured graphs, more
            run eagerly (``prefill.Prefill``'s ``graph_rows``); None: every row count.

    Raises:
        ModelMismatchError: the checkpoint is of another kind.
    """

    def __init__(
        self,
        kind: ModelKind,
        tts: Any,
        chunk_frames: int,
        max_streams: int,
        max_len: int,
        graphs: bool,
        batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
        length_buckets: tuple[int, ...] = (256, 1024),
        on_join: Callable[[float], None] | None = None,
        overlap_decode: bool = True,
        on_eager_prefill: Callable[[int], None] | None = None,
        chunk_growth: bool = False,
        prefill_graph_rows: int | None = None,
    ) -> None:
        super().__init__(kind, chunk_frames, capacity=max_streams)
        qwen = tts.model
        model = qwen.model
        if getattr(model, "tts_model_type", None) != kind.value:
            raise ModelMismatchError(
                f"checkpoint is a {getattr(model, 'tts_model_type', None)!r} model, expected {kind.value!r}"
            )
        self._qwen = qwen
        self._model = model
        self.talker = model.talker
        self.device = next(self.talker.parameters()).device
        self.use_graphs = graphs and self.device.type == "cuda"
        self.backend = (
            "batched CUDA-graph engine" if self.use_graphs else f"batched engine (eager, {self.device.type})"
        )
        self.prompts = ClonePrompts(qwen)
        self.builder = PromptBuilder(kind, tts, self.prompts)
        self.max_len = max_len
        self.state = SlotState(self.talker, max_streams, max_len)
        with torch.inference_mode():
            pad_id = torch.tensor([[model.config.tts_pad_token_id]], device=self.device)
            pad = self.talker.text_projection(self.talker.get_text_embeddings()(pad_id)).reshape(-1)
        self.step = FrameStep(self.talker, self.state, pad)
        self.decoder = StreamingDecoder(model.speech_tokenizer.model.decoder, max_streams)
        self.prefill = Prefill(self.talker, self.state, self.step, self.decoder, graph_rows=prefill_graph_rows)
        self.planner = Planner(self.prefill.max_rows)
        self.samples_per_frame = self.decoder.samples_per_frame
        self._pcm = torch.zeros(max_streams, self.samples_per_frame, dtype=torch.float32, device=self.device)
        #: The step's codes, clamped into the codebook (int64 [slots, 16]), and the decoder's
        #: copy of them (the next step may overwrite the first while a decode reads the second).
        self._codes = torch.zeros(max_streams, 16, dtype=torch.int64, device=self.device)
        self._codes_dec = torch.zeros_like(self._codes)
        batches = buckets(max_streams, batch_buckets)
        self.graphs = StepGraphs(self._step_body, self.state.tensors, batches, buckets(max_len, length_buckets),
                                 lone_pdl=True)
        # The decode replays beside the step (and the other models' decodes): captured on a
        # stream of its own, so that its cuBLAS products have a workspace of their own.
        self.decode_graphs = StepGraphs(self._decode_body, self.decoder.state, batches, [1], lone_pdl=True,
                                        capture_role=f"{kind.value}-capture-decode")
        self.overlap = self.use_graphs and overlap_decode
        # Every stream at the default priority: with the step's at the highest, the loop crawled
        # (15 s a step) at batch 32 and hung at 64 on the H200 (profile README, "Stop 38").
        self._side = role_stream(self.device, f"{kind.value}-decode") if self.overlap else None
        self._prime_lock = threading.Lock()
        self._prime_skipped = False  # said once: clips are no longer prepared ahead (memory)
        self._copied: torch.cuda.Event | None = None  # the last decode has taken its codes
        self._decoded: torch.cuda.Event | None = None  # the last decode has finished
        self._host: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._flip = 0
        self.pool = SlotPool(max_streams, self._move)
        self._on_join = on_join
        self._on_eager_prefill = on_eager_prefill
        self.chunk_growth = chunk_growth
        self._joins: list[tuple[torch.cuda.Event, torch.cuda.Event, int]] = []
        self._stall: torch.cuda.Event | float | None = None  # an admission's start, until the next step
        self._stall_replays = 0  # prefill replays in that admission
        #: Out-of-memory errors while serving (``_failure``).
        self.out_of_memory = 0
        #: Marks the points of timed requests' first frames (``first_frame``).
        self.first_frames = FirstFrames(self.device)
        self._slow_steps = 0  # steps over STEP_STALL_S since the last warning
        self._stall_logged = -math.inf  # time.monotonic() of that warning

    def close(self) -> None:
        """Give the GPU memory back now, even if something still holds this engine: drop its
        graphs and empty every weight, buffer and slot tensor (the engine is unusable after).
        ``loader.load_fitting`` calls it on an engine that failed its warm-up: on the H200
        with 6 GB free, such an engine's 4.2 GB stayed allocated and the retry found room for
        no stream."""
        for graphs in (self.graphs, self.decode_graphs, self.prefill.graphs):
            graphs.clear()
        tensors = [*self._model.parameters(), *self._model.buffers(), *self.state.tensors(), *self.decoder.state(),
                   self._pcm, self._codes, self._codes_dec]
        with torch.no_grad():
            for tensor in tensors:
                try:
                    tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
                except RuntimeError:  # an inference tensor: it goes with its owner
                    pass

    def slot_bytes(self) -> int:
        """Device memory held per slot: talker and predictor KV, codec decoder state, the rest."""
        tensors = [*self.state.tensors(), *self.step.pred_keys, *self.step.pred_values, *self.decoder.state(), self._pcm]  # noqa: E501
        return sum(t.numel() * t.element_size() for t in tensors) // self.capacity

    # --- Engine -----------------------------------------------------------------------------

    def speakers(self) -> list[str]:
        if self.kind is not ModelKind.CUSTOM_VOICE:
            return []
        return list(self._qwen.get_supported_speakers() or [])

    #: ``prime`` may be called while the engine serves (``clips.ClipPreparer``).
    prime_any_time = True

    def prime(self, reference: Reference) -> bool:
        """Prepare a clone clip now, so that its first request starts like any other: its
        speaker embedding and ICL codes (``ClonePrompts``, the codec encoder's first run
        included) and the codec decoder's state after those codes (``Prefill.prefix``). Runs
        on a CUDA stream of its own; safe while the engine serves. True if prepared (the Base
        model only); False also where the driver shows less than
        ``sizing.PRIME_HEADROOM_BYTES`` free (serving needs it; the clip's first request then
        prepares it). What the preparation cached for its stream goes back to the driver
        when less than ``_TIGHT_BYTES`` is left.

        Raises:
            ValueError / RuntimeError: a clip the model cannot encode.
        """
        if self.kind is not ModelKind.BASE:
            return False
        segment = Segment(text="Hello.", language="auto", max_new_tokens=2, seed=0, reference=reference)
        with self._prime_lock:
            if self.device.type != "cuda":
                self._build(segment)
                return True
            free = torch.cuda.mem_get_info(self.device)[0]
            if free < PRIME_HEADROOM_BYTES:
                if not self._prime_skipped:
                    _LOGGER.warning(
                        "%s model: clone clips are no longer prepared ahead (%d MB free on the GPU, %d MB kept for "
                        "serving): each is prepared by its first request", self.kind.value, free >> 20,
                        PRIME_HEADROOM_BYTES >> 20,
                    )
                self._prime_skipped = True
                return False
            stream = role_stream(self.device, f"{self.kind.value}-prime")
            stream.wait_stream(torch.cuda.current_stream(self.device))
            try:
                with torch.cuda.stream(stream):
                    self._build(segment)
                stream.synchronize()
            finally:  # also after a failed preparation (an out-of-memory, say)
                if torch.cuda.mem_get_info(self.device)[0] < _TIGHT_BYTES:
                    # The codec encoder's activations stay cached for the prime stream alone, where
                    # no other stream (nor cuBLAS, which allocates outside the cache) can use them.
                    stream.synchronize()
                    torch.cuda.empty_cache()
        return True

    def warmup(self, segment: Segment) -> None:
        """Capture every (batch, length) graph, then generate ``segment`` through the pool."""
        self._capture()

        class _Collect:
            samples = 0
            error: BaseException | None = None

            def cancelled(self) -> bool:
                return False

            def audio(self, chunk: np.ndarray) -> None:
                self.samples += len(chunk)

            def done(self, frames: int) -> None:
                pass

            def failed(self, error: BaseException) -> None:
                self.error = error

        sink = _Collect()

        class _One:
            given = False

            def take(self, wait: float | None) -> Work | None:
                if self.given:
                    return None
                self.given = True
                return Work(segment, sink)

            def closed(self) -> bool:
                return self.given

        source = _One()
        self._admit(source, block=False)
        pending = None
        while self._rows or pending is not None:
            launched = self._launch() if self._rows else None
            if pending is not None:
                self._deliver(pending)
            pending = launched
            self._retire()
        if sink.error is not None:
            raise sink.error
        if sink.samples == 0:
            raise RuntimeError("warm-up generation produced no audio")
        if self.use_graphs:
            self._warm_prompt_thread(segment)

    def _warm_prompt_thread(self, segment: Segment) -> None:
        """Build ``segment``'s prompt as ``serve``'s prompt worker will: on a thread other than
        this one, on the prompts stream. That thread's cuBLAS handle (made outside PyTorch's
        allocator) and its workspace for the stream are then made now, while an out-of-memory
        still makes the loader retry with fewer streams; a handle goes back to PyTorch's pool
        when its thread ends, and the prompt worker takes it from there. On the H200 with 4 GB
        free the first prompt worker's ``cublasCreate`` failed every request.

        Raises:
            whatever building the prompt raised (an out-of-memory included).
        """
        stream = role_stream(self.device, f"{self.kind.value}-prompts")
        errors: list[BaseException] = []

        def build() -> None:
            try:
                with torch.cuda.stream(stream):
                    self._build(segment)
                stream.synchronize()
            except BaseException as err:  # noqa: BLE001 - raised on the caller's thread
                errors.append(err)

        thread = threading.Thread(target=build, name=f"prompts-warm-{self.kind.value}", daemon=True)
        thread.start()
        thread.join()
        if errors:
            raise errors[0]

    def serve(self, source: WorkSource) -> None:
        """Generate until ``source`` closes; prompts are prepared by a ``PromptWorker``."""
        intake = PromptWorker(source, self._build, self.device, name=f"prompts-{self.kind.value}",
                              stream=role_stream(self.device, f"{self.kind.value}-prompts") if self.use_graphs else None)
        intake.start()
        try:
            self._serve(source, intake)
        finally:
            for item in intake.stop():  # taken from the source, never admitted
                item.work.sink.failed(RuntimeError(f"The {self.kind.value} engine stopped"))

    def _serve(self, source: WorkSource, intake: PromptWorker) -> None:
        pending: _Launched | None = None
        while not self._stopping(source, intake):
            try:
                self._admit(intake, block=not self._rows and pending is None)
            except Exception:  # noqa: BLE001 - a broken work source: keep serving, but not in a spin
                _LOGGER.exception("Admission failed")
                time.sleep(0.1)
            launched = None
            if self._rows:
                try:
                    launched = self._launch()
                except Exception as err:  # noqa: BLE001 - a broken step fails its rows, not the server
                    _LOGGER.exception("Batched step failed; failing %d stream(s)", len(self._rows))
                    self._stall = None
                    for row in self._rows:
                        if not row.finished:
                            row.finished = True
                            row.work.sink.failed(self._failure(err))
            try:
                if pending is not None:
                    self._deliver(pending)
                pending = launched
                self._retire()
            except Exception as err:  # noqa: BLE001 - fail what runs, keep serving the rest
                _LOGGER.exception("Batched engine error; failing %d stream(s)", len(self._rows))
                self._fail_all(err)
                pending = None
        for row in self._rows:  # stopping: end what is running
            if not row.finished:
                row.finished = True
                row.work.sink.done(row.frames)
        self.pool.clear()
        self._stall = None  # an admission's stall that no step closed: nobody waits any more
        self._joins.clear()

    @staticmethod
    def _stopping(source: WorkSource, intake: PromptWorker) -> bool:
        """Whether the source closed, with the worker paused so that it cannot be taking work
        meanwhile (a source may open again: ``on_demand``'s relay)."""
        if not source.closed():
            return False
        intake.pause()
        if source.closed():
            return True
        intake.resume()
        return False

    # --- admission ----------------------------------------------------------------------------

    def _build(self, segment: Segment) -> Prompt:
        """A segment's prompt, and for an ICL clone the codec decoder's state after its
        reference (cached per reference): everything a join needs but the prefill replay.
        Runs on the prompt worker's thread (see ``stages.intake``).

        Raises:
            RuntimeError: the prompt does not fit the cache.
            ValueError / NotImplementedError: from ``PromptBuilder.build``.
        """
        prompt = self.builder.build(segment)
        if prompt.embeds.shape[0] + 1 >= self.max_len:
            raise RuntimeError(
                f"Input is too long: the prompt has {prompt.embeds.shape[0]} positions, "
                f"the cache {self.max_len}. Use shorter text or a shorter reference clip."
            )
        self.prefill.prefix(prompt)
        return prompt

    def _admit(self, source: WorkSource | Intake, block: bool) -> None:
        """Take as much prepared work as the planner allows and prefill it, ``max_join`` rows a
        replay. ``source``: the prompt worker, or a plain work source (prompts then built
        here, on the engine thread: warm-up and step-by-step tests)."""
        intake = source if isinstance(source, (PromptWorker, Inline)) else Inline(source, self._build)
        now = time.monotonic()
        intake.set_free(self.pool.free)
        take = self.planner.admissions(self.pool.free, self.pool.clocks(), now)
        while take > 0:
            taken = self._admit_some(intake, block, min(take, self.prefill.max_rows))
            if taken < self.prefill.max_rows:
                return  # the source is empty (or slots are)
            take -= taken
            block = False

    def _admit_some(self, intake: Intake, block: bool, most: int) -> int:
        """Take up to ``most`` prepared segments and prefill them in one replay; returns how
        many it took (started, failed or cancelled)."""
        # While streams run, a prompt being built now is waited for (briefly): prefilled before
        # the next step rather than behind it (``PromptWorker.take``).
        items = intake.take(min(most, self.pool.free), wait=None if block else 0, building=bool(self._rows))
        batch: list[tuple[Work, Prompt]] = []
        for item in items:
            sink = item.work.sink
            if sink.cancelled():
                sink.done(0)
            elif item.error is not None or item.prompt is None:
                sink.failed(self._failure(item.error or RuntimeError("no prompt")))
            else:
                batch.append((item.work, item.prompt))
        if not batch:
            return len(items)
        if self._rows and self._stall is None:  # running streams wait from here to the next step
            self._stall = self._mark()
            self._stall_replays = 0
        self._stall_replays += 1
        if self.device.type == "cuda":  # prompts made on the worker's stream, read on this one
            main = torch.cuda.current_stream(self.device)
            for _work, prompt in batch:
                hold(prompt, main)
        timed = self.first_frames.admitting(work for work, _prompt in batch)
        try:
            lengths = self.prefill.run(len(self._rows), [(w.segment, p) for w, p in batch], self._on_decoder)
        except Exception as err:  # noqa: BLE001 - fail these requests only
            _LOGGER.exception("Prefill failed for %d request(s)", len(batch))
            for work, _prompt in batch:
                work.sink.failed(self._failure(err))
            return len(items)
        self.first_frames.prefilled(timed)
        if self.prefill.bucket(max(lengths)) is None and self._on_eager_prefill is not None:
            self._on_eager_prefill(len(batch))
        for (work, _prompt), length in zip(batch, lengths, strict=True):
            self.pool.add(Row(work, max(1, work.segment.max_new_tokens), length))
        _LOGGER.debug("Admitted %d stream(s): prompts of %s positions", len(batch), lengths)
        return len(items)

    def _mark(self) -> torch.cuda.Event | float:
        """Now: an event on the main stream (CUDA), else ``time.perf_counter()``."""
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _end_stall(self) -> None:
        """Close the join stall opened by an admission, just before the next step's graph.

        On CUDA the stall is the GPU time between the start event (recorded when admission
        began: it completes once the step before has run) and this one: the prefill's work,
        the waits it adds, and any time the GPU idled while the host admitted. On the CPU, the
        wall time of the same span. Reported once complete (``_report_joins``).
        """
        start, self._stall = self._stall, None
        if isinstance(start, float):
            self._joined(time.perf_counter() - start, self._stall_replays)
        elif start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._joins.append((start, end, self._stall_replays))

    def _joined(self, stall: float, replays: int) -> None:
        """A measured join stall (seconds) of ``replays`` prefill replays: to the metric and
        to the planner's estimate of a replay's cost."""
        _LOGGER.debug("Join stall %.1f ms (%d replay(s))", stall * 1000, replays)
        self.planner.observe_join(stall * 1000, replays)
        if self._on_join is not None:
            self._on_join(stall)

    # --- stepping -----------------------------------------------------------------------------

    def _step_body(self, b: int, length: int) -> None:
        """Talker + predictor for rows [0, b); the codes go to ``_codes`` (graph-captured)."""
        codes = self.step.run(b, length)
        # A row whose token was EOS runs one more (discarded) step; keep its ids in range.
        self._codes[:b].copy_(codes.clamp(max=self.decoder.codebook_size - 1))

    def _decode_body(self, b: int, _length: int) -> None:
        """Decode ``_codes_dec`` of rows [0, b) into ``_pcm`` (graph-captured)."""
        self._pcm[:b].copy_(self.decoder.step(self._codes_dec[:b, :, None]))

    def _body(self, b: int, length: int) -> None:
        """One whole frame, step then decode, in line (eager; ``benchmarks/profile_step``)."""
        self._step_body(b, length)
        self._codes_dec[:b].copy_(self._codes[:b])
        self._decode_body(b, 1)

    @contextlib.contextmanager
    def _on_decoder(self) -> Iterator[None]:
        """Where work on the codec decoder's state runs (admission resets or loads new rows,
        compaction moves them): with the decode on its own stream, on that stream, after the
        decode in flight (which may write any row of its batch bucket) and after the main
        stream's work so far; the next decode follows it in order. So the talker's stream
        never waits for a decode. Without a side stream, in line."""
        if self._side is None:
            yield
            return
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            yield

    def _bucket(self) -> tuple[int, int]:
        # a row's next position is prompt + frames delivered + (at most) one step in flight
        return self.graphs.bucket(len(self._rows), self.pool.longest() + 2)

    def _host_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        pin = self.device.type == "cuda"
        pcm = torch.zeros(self.capacity, self.samples_per_frame, dtype=torch.float32, pin_memory=pin)
        eos = torch.zeros(self.capacity, dtype=torch.bool, pin_memory=pin)
        return pcm, eos

    @torch.inference_mode()
    def _launch(self) -> _Launched:
        """Start one step for the active rows; its outputs are read by ``_deliver``."""
        b, length = self._bucket()
        pcm, eos = self._host[self._flip]
        self._flip ^= 1
        n = len(self._rows)
        probes = self.first_frames.launching()
        if self._side is None:  # in line, one stream
            self._end_stall()
            self.graphs.run(b, length)
            if probes:
                self.first_frames.stepped(probes)
            self._codes_dec[:b].copy_(self._codes[:b])
            self.decode_graphs.run(b, 1)
            if probes:
                self.first_frames.decoded(probes)
            pcm[:n].copy_(self._pcm[:n], non_blocking=True)
            eos[:n].copy_(self.state.eos[:n], non_blocking=True)
            done = None
            if self.use_graphs:
                done = torch.cuda.Event(enable_timing=bool(probes))
                done.record()
            return _Launched(list(self._rows), pcm[:n], eos[:n], done, probes)
        main = torch.cuda.current_stream(self.device)
        if self._copied is not None:
            main.wait_event(self._copied)  # the last decode has its codes: they may change now
        self._end_stall()
        self.graphs.run(b, length)
        if probes:
            self.first_frames.stepped(probes)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            self._codes_dec[:b].copy_(self._codes[:b])
            eos[:n].copy_(self.state.eos[:n], non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
            self.decode_graphs.run(b, 1)
            pcm[:n].copy_(self._pcm[:n], non_blocking=True)
            done = torch.cuda.Event(enable_timing=bool(probes))
            done.record()
        self._copied, self._decoded = copied, done
        return _Launched(list(self._rows), pcm[:n], eos[:n], done, probes)

    def _deliver(self, launched: _Launched) -> None:
        """Hand out a finished step's audio; mark rows that ended."""
        if launched.done is not None:
            t0 = time.perf_counter()
            launched.done.synchronize()
            waited = time.perf_counter() - t0
            if waited > STEP_STALL_S:
                self._slow_step(waited, len(launched.rows))
        if launched.probes:
            self.first_frames.delivered(launched.probes, launched.done)
        self._report_joins()
        pcm = launched.pcm.numpy()
        eos = launched.eos.numpy()
        for i, row in enumerate(launched.rows):
            if row.finished:
                continue
            try:
                self._deliver_row(row, pcm[i], bool(eos[i]), len(launched.rows))
            except Exception as err:  # noqa: BLE001 - a broken sink ends its own row only
                _LOGGER.exception("Delivering audio failed; ending that stream")
                row.finished = True
                row.work.sink.failed(err)

    def _slow_step(self, waited: float, rows: int) -> None:
        """Log a step that kept delivery waiting ``waited`` seconds (over ``STEP_STALL_S``), at
        most once every ``STALL_LOG_EVERY_S``, with the count of slow steps since the last."""
        self._slow_steps += 1
        now = time.monotonic()
        if now - self._stall_logged < STALL_LOG_EVERY_S:
            return
        _LOGGER.warning(
            "%s model: a step of %d stream(s) kept its audio %.1f s on the GPU (a frame takes "
            "milliseconds; %d slow step(s) since the last warning): the GPU is stalled or busy "
            "with another process", self.kind.value, rows, waited, self._slow_steps,
        )
        self._stall_logged, self._slow_steps = now, 0

    def chunk_size(self, sent: int) -> int:
        """Frames in a stream's chunk after ``sent`` chunks (see ``chunk_growth``)."""
        if not self.chunk_growth:
            return self.chunk_frames
        return min(self.chunk_frames, 1 << min(sent, 16))

    def _deliver_row(self, row: Row, pcm: np.ndarray, eos: bool, rows: int) -> None:
        """One row's frame of a finished step: buffer it, send a chunk when one is full, and
        end the row at EOS, its frame cap, the end of its cache, or its client's cancel."""
        sink = row.work.sink
        if sink.cancelled():
            row.finished = True
            sink.done(row.frames)
            return
        row.frames += 1
        row.pcm.append(pcm.copy())
        ended = eos or row.frames >= row.max_frames or row.prompt_len + row.frames - 1 >= self.max_len - 1
        if len(row.pcm) >= self.chunk_size(row.chunks) or ended:
            now = time.monotonic()
            if row.first_audio is None:
                row.first_audio = now - row.admitted
            row.clock.sent(len(row.pcm), now)
            row.chunks += 1
            sink.audio(np.concatenate(row.pcm))
            row.pcm.clear()
        if ended:
            row.finished = True
            sink.done(row.frames)
            if _LOGGER.isEnabledFor(logging.DEBUG):
                reason = "EOS" if eos else "frame cap" if row.frames >= row.max_frames else "cache end"
                _LOGGER.debug(
                    "%s: %d frames (%s), first audio %.0f ms after admission, %.2f s in all, %d rows",
                    self.kind.value, row.frames, reason, (row.first_audio or 0) * 1000,
                    time.monotonic() - row.admitted, rows,
                )

    @property
    def _rows(self) -> list[Row]:
        """The running rows, by slot (``pool.rows``)."""
        return self.pool.rows

    def _retire(self) -> None:
        """Free the slots of finished rows (``SlotPool.retire``)."""
        self.pool.retire()

    @torch.inference_mode()
    def _move(self, src: int, dst: int) -> None:
        """Slot ``src``'s device state into slot ``dst`` (the decoder's on its stream: ``_on_decoder``)."""
        if self._copied is not None:  # the decode in flight has read the step's codes and flags
            torch.cuda.current_stream(self.device).wait_event(self._copied)
        self.state.move_row(src, dst)
        with self._on_decoder():
            self.decoder.move_row(src, dst)

    def _failure(self, error: BaseException) -> BaseException:
        """What a request that failed with ``error`` is told (``gpu.memory.serving_error``: an
        out-of-memory names its cause); an out-of-memory is also counted in ``out_of_memory``
        (an on-demand model then reloads with the streams the free memory holds)."""
        if is_out_of_memory(error):
            self.out_of_memory += 1
            _LOGGER.warning("%s model: out of GPU memory while serving (%s)", self.kind.value,
                            str(error).splitlines()[0] if str(error) else "CUDA out of memory")
        return serving_error(error, self.kind)

    def _fail_all(self, error: BaseException) -> None:
        """End every row with ``error`` and free all slots (after an unexpected error)."""
        error = self._failure(error)
        if self.use_graphs:
            torch.cuda.synchronize(self.device)
        for row in self._rows:
            if not row.finished:
                row.finished = True
                try:
                    row.work.sink.failed(error)
                except Exception:  # noqa: BLE001 - one broken sink must not stop the others
                    _LOGGER.exception("Reporting a failure to a stream failed")
        self.pool.clear()
        self._joins.clear()
        self._stall = None
        self.first_frames.clear()

    def _report_joins(self) -> None:
        """Report the stall of each admission whose prefill has finished on the GPU.

        A prefill recorded after the step being delivered may still run: it stays queued
        until a later delivery finds its end event complete.
        """
        while self._joins and self._joins[0][1].query():
            start, end, replays = self._joins.pop(0)
            self._joined(start.elapsed_time(end) / 1000.0, replays)

    def _capture(self) -> None:
        """Host buffers, and on CUDA one step graph per (batch, length) bucket and one
        decode graph per batch bucket."""
        self._host = [self._host_buffers() for _ in range(2)]
        if not self.use_graphs:
            return
        seconds = self.graphs.capture() + self.decode_graphs.capture()
        prefill_s = self.prefill.capture()
        _LOGGER.info(
            "%s: captured %d step graphs (batch %s x length %s) and %d decode graphs in %.1f s; "
            "%d prefill graphs (rows 1-%d x tokens %s) in %.1f s; decoding %s; %d slots of %.0f MB",
            self.kind.value, len(self.graphs), self.graphs.batch_sizes, self.graphs.lengths,
            len(self.decode_graphs), seconds, len(self.prefill.graphs), self.prefill.graph_rows,
            self.prefill.token_buckets, prefill_s, "on its own stream" if self.overlap else "in line",
            self.capacity, self.slot_bytes() / 1e6,
        )
