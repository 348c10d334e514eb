"""The CPU path: qwen_tts's reference model, streamed frame by frame, stoppable within a frame.

qwen_tts has no streaming API: ``generate_*`` returns a whole sentence's waveform. Three
hooks on its talker (a ``transformers`` ``GenerationMixin``) make it stream without
changing what it computes:

* a forward hook reads each codec frame (16 codes) the moment the talker's step makes it
  (the talker's output ``hidden_states[1]``: the frame whose first code the previous step
  sampled, with the code predictor's 15 others);
* a ``StoppingCriteria`` ends the generation at the next frame once the request is
  cancelled;
* a wrapper of ``talker.generate`` passes both in, and when the talker is done it ends the
  call (``_TalkerDone``) before qwen_tts decodes the whole sentence again.

Generation runs on a helper thread; the engine thread decodes the frames as they come with
the batched engine's incremental decoder (``batched.codec.StreamingDecoder``, one row, over the
codec's own modules), so each frame is decoded once and the samples equal those of a
whole-sentence decode to within float rounding, and yields them.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...common.vocabulary import ModelKind
from ..base import Work, WorkSource
from ..batched.codec import StreamingDecoder
from ..segment import Segment
from ..serial import SerialEngine

_LOGGER = logging.getLogger(__name__)

#: Chunks grow from ``chunk_frames`` by doubling up to this many frames: the first audio
#: comes after ``chunk_frames`` frames, and a long sentence costs few decoder calls (each
#: has a fixed cost that, on the CPU, is worth several frames of generation).
MAX_CHUNK_FRAMES = 16

_END = object()  # queue marker: the talker finished (EOS, frame cap or stop)


class _TalkerDone(Exception):
    """Raised from the talker wrapper: the frames went out already, skip qwen_tts's decode."""


class _Run:
    """One segment's generation: its frames, as the helper thread makes them.

    Attributes:
        frames: int64 [16] codec frames, then ``_END``, or an exception.
        stop: set to end the generation at its next frame.
        made: frames generated so far.
    """

    def __init__(self, segment: Segment, cancelled: Callable[[], bool]) -> None:
        self.segment = segment
        self.frames: queue.Queue[Any] = queue.Queue()
        self.stop = threading.Event()
        self.made = 0
        self._cancelled = cancelled

    def stopped(self) -> bool:
        return self.stop.is_set() or self._cancelled()


class _TrackingSource:
    """A ``WorkSource`` that tells the engine whose work is running, so the generation can
    check that client's cancel flag at every frame (not only between chunks)."""

    def __init__(self, source: WorkSource, engine: ReferenceEngine) -> None:
        self._source = source
        self._engine = engine

    def take(self, wait: float | None) -> Work | None:
        work = self._source.take(wait)
        self._engine._cancelled = work.sink.cancelled if work is not None else _never
        return work

    def closed(self) -> bool:
        return self._source.closed()


def _never() -> bool:
    return False


class ReferenceEngine(SerialEngine):
    """qwen_tts on the CPU (float32), one segment at a time, streamed.

    Chunks are whole codec frames: ``chunk_frames`` first, then doubling up to
    ``MAX_CHUNK_FRAMES``. A cancelled segment stops at the next frame.
    """

    backend = "qwen_tts reference model (CPU)"

    def __init__(self, kind: ModelKind, qwen: Any, chunk_frames: int) -> None:
        super().__init__(kind, qwen, chunk_frames)
        self._run: _Run | None = None
        self._cancelled: Callable[[], bool] = _never
        self._install_hooks(qwen.model.talker)
        self._decoder = StreamingDecoder(qwen.model.speech_tokenizer.model.decoder, 1)

    def serve(self, source: WorkSource) -> None:
        super().serve(_TrackingSource(source, self))

    # --- the talker hooks (called on the helper thread) -------------------------------

    def _install_hooks(self, talker: Any) -> None:
        from transformers import StoppingCriteria, StoppingCriteriaList

        engine = self

        class _Stop(StoppingCriteria):  # type: ignore[misc]
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                import torch

                run = engine._run
                stop = run is not None and run.stopped()
                return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

        def on_step(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            run = engine._run
            frame = output.hidden_states[1]  # None for the prefill step
            if run is not None and frame is not None:
                run.made += 1
                run.frames.put(frame[0].detach().clone())

        generate = talker.generate  # the bound GenerationMixin method

        def generate_streamed(*args: Any, **kwargs: Any) -> Any:
            run = engine._run
            if run is None:
                return generate(*args, **kwargs)
            kwargs["stopping_criteria"] = StoppingCriteriaList([_Stop()])
            kwargs["min_new_tokens"] = run.segment.min_new_tokens
            generate(*args, **kwargs)
            raise _TalkerDone

        talker.register_forward_hook(on_step, with_kwargs=True)
        talker.generate = generate_streamed

    def _generate(self, run: _Run) -> None:
        """Helper thread: run qwen_tts's generate for ``run.segment``; frames go to the queue."""
        import torch

        segment = run.segment
        try:
            if segment.seed is not None:
                torch.manual_seed(segment.seed)
            common = dict(
                language=segment.language,
                max_new_tokens=segment.max_new_tokens,
                non_streaming_mode=True,
            )
            self._run = run
            if self.kind is ModelKind.BASE:
                assert segment.reference is not None
                self._qwen.generate_voice_clone(
                    text=segment.text, voice_clone_prompt=self.prompts.get(segment.reference), **common
                )
            elif self.kind is ModelKind.VOICE_DESIGN:
                self._qwen.generate_voice_design(
                    text=segment.text, instruct=segment.instruct or "", **common
                )
            else:
                self._qwen.generate_custom_voice(
                    text=segment.text, speaker=segment.speaker, instruct=segment.instruct, **common
                )
            raise RuntimeError("qwen_tts returned without running its talker")
        except _TalkerDone:
            run.frames.put(_END)
        except BaseException as err:  # noqa: BLE001 - handed to the engine thread, raised there
            run.frames.put(err)
        finally:
            self._run = None

    # --- the engine thread -------------------------------------------------------------

    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        """Generate ``segment``; yield float32 [k * 1920] chunks at 24 kHz as frames come.

        Closing the iterator stops the generation at its next frame.

        Raises:
            ValueError / RuntimeError: from qwen_tts, for inputs it cannot take.
        """
        self._start_decoder(segment)
        run = _Run(segment, self._cancelled)
        helper = threading.Thread(target=self._generate, args=(run,), name="qwen-tts-generate", daemon=True)
        helper.start()
        frames: list[Any] = []
        sent = 0
        size = self.chunk_frames
        try:
            while True:
                item = run.frames.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                frames.append(item)
                if len(frames) - sent >= size:
                    yield self._decode(frames[sent:])
                    sent, size = len(frames), min(2 * size, max(MAX_CHUNK_FRAMES, self.chunk_frames))
            if run.stopped():
                _LOGGER.info(
                    "Generation stopped after %d codec frames (cap %d): request cancelled",
                    run.made, segment.max_new_tokens,
                )
                return
            if len(frames) > sent:
                yield self._decode(frames[sent:])
        finally:
            run.stop.set()
            helper.join()

    def _start_decoder(self, segment: Segment) -> None:
        """Forget the last segment's decoder state; an ICL clone's reference codes (int64
        [n, 16]) then become the decoder's past, as qwen_tts decodes them before the new
        frames."""
        import torch

        self._decoder.reset(0)
        if self.kind is not ModelKind.BASE or segment.reference is None:
            return
        items = self.prompts.get(segment.reference)
        context = getattr(items[0], "ref_code", None)
        if context is not None:
            with torch.inference_mode():
                self._decoder.step(context.to(self._decoder.device).T[None])

    def _decode(self, frames: list[Any]) -> np.ndarray:
        """Samples of the next ``frames`` (each int64 [16]): float32 [len(frames) * 1920]."""
        import torch

        codes = torch.stack(frames).to(self._decoder.device).T[None]
        with torch.inference_mode():
            pcm = self._decoder.step(codes)
        return pcm[0].float().cpu().numpy()
