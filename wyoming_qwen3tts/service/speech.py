"""The speech service every front door calls: one request type in, one PCM stream out.

A front door turns its protocol into a ``SpeechRequest`` and calls ``TtsService.speak``
(whole text) or ``TtsService.open`` (text streamed in with ``add_text`` and ``finish``).
Either resolves the voice and language or raises a ``RequestError``; the stream yields
float32 [n_samples] chunks at 24 kHz, or raises ``GenerationError``. Segmentation, frame
caps, seeds, the engines, their schedulers and metrics live behind this module, so both
doors behave the same and neither imports the engine or the scheduler. Beside it in the
service: the default voice (``default_voice``), admission, readiness and draining
(``readiness``), and the refusals and failures (``errors``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from .anchors import ANCHOR_MAX_FRAMES, Anchors, AnchorSpec, AnchorState
from ..common.audio import SAMPLE_RATE
from ..engine import Engine, Segment
from ..text.languages import AUTO, SPEAKER_LANGUAGES, UnsupportedLanguageError, to_qwen
from ..common.metrics import Metrics
from .scheduler import Job, Scheduler
from ..text.segmenter import Segmenter, clean_text, frame_budget
from ..common.timeline import Timeline
from ..common.vocabulary import ModelKind, Reference
from ..catalogue.voices import UnknownVoiceError, Voice, VoiceCatalog
from .backends import describe_backends
from .default_voice import DefaultVoice, shown_names
from .errors import (
    DefaultVoiceGoneError, EmptyTextError, GenerationError, LanguageError, ModelUnservableError, NoVoicesError,
    RequestError, VoiceNotFoundError, text_too_long,
)
from .readiness import Admission, model_states

_LOGGER = logging.getLogger(__name__)

#: Default longest text of one request or one text stream, in characters (about ten
#: minutes of speech). OpenAI's own limit is 4096.
DEFAULT_MAX_CHARS = 10_000
#: Default cap on requests open at once over both doors (generating or waiting their turn).
DEFAULT_MAX_QUEUE = 32
#: What an out-of-memory error tells the client and the log to change.
OOM_ADVICE = (
    "The GPU ran out of memory for this request; the server goes on. Retry, or restart the server "
    "with fewer streams (--max-streams N), --gpu-memory GB, or --design-model-memory on-demand"
)


#: How the doors and the log name a voice designed from a request's ``instructions`` alone
#: (no voice named): no catalogue voice spoke (``SpeechStream.designed``). Never a
#: percent-encoded voice name (those encode "(" as %28).
DESIGNED_VOICE = "(designed)"


@dataclass(frozen=True)
class SpeechRequest:
    """What a client asked for, in protocol-neutral terms.

    Attributes:
        voice: catalogue name or alias; None for the server's default voice.
        language: BCP-47 code or Qwen3-TTS name; None for the voice's own language.
        instructions: per-request VoiceDesign description (replaces a preset's), or a style
            instruction for CustomVoice speakers; ignored for cloned voices.
        seed: RNG seed for every segment; None picks one per stream, so all sentences of a
            stream are sampled alike.
        door: "wyoming", "http" or "websocket", for metrics.
    """

    voice: str | None = None
    language: str | None = None
    instructions: str | None = None
    seed: int | None = None
    door: str = "wyoming"


__all__ = [
    "DEFAULT_MAX_CHARS",
    "DESIGNED_VOICE",
    "SpeechRequest",
    "SpeechStream",
    "TtsService",
    "check_text",
]


class TtsService:
    """Voices, engines and limits shared by every front door.

    Args:
        catalog: the voice catalogue.
        engines: one warmed-up engine per loaded model kind; the service starts them.
        default_voice: voice used when a request names none (None: none yet).
        metrics: where outcomes are counted.
        max_chars: longest text per request or stream.
        seed: seed for requests that bring none (None: a random one per stream).
        fixed_frames: generate exactly this many codec frames per segment (benchmarks with
            random weights, which rarely end on their own); None caps by ``frame_budget``.
        anchors: the presets' anchors (None: presets are always designed live).
        max_queue: most requests open at once (both doors); ``open`` refuses the next one.
        studio: where clients find the voice studio (its URL, in words), for the refusal
            of a request while the server has no voice (``NoVoicesError``); None: no studio.
        default_explicit: ``default_voice`` was chosen by the user (``--voice``): it is kept,
            and the studio may not remove it. False: it was picked by ``pick_default_voice``
            (or is None) and is picked again when its voice is gone (``default_voice``).
    """

    def __init__(
        self,
        catalog: VoiceCatalog,
        engines: dict[ModelKind, Engine],
        default_voice: str | None,
        metrics: Metrics,
        max_chars: int = DEFAULT_MAX_CHARS,
        seed: int | None = None,
        fixed_frames: int | None = None,
        anchors: Anchors | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        studio: str | None = None,
        default_explicit: bool = False,
    ) -> None:
        self.catalog = catalog
        self.anchors = anchors
        self.seed = seed
        self.fixed_frames = fixed_frames
        self._engines = engines
        self._schedulers = {kind: Scheduler() for kind in engines}
        for kind, engine in engines.items():
            metrics.track_queue(kind.value, self._schedulers[kind].queue_depth)
            engine.start(self._schedulers[kind])
        self._default = DefaultVoice(catalog, default_voice, default_explicit, self.unspeakable, studio)
        self.studio = studio
        self.metrics = metrics
        self.max_chars = max_chars
        self.admission = Admission(max_queue)

    @property
    def kinds(self) -> frozenset[ModelKind]:
        """The loaded model kinds."""
        return frozenset(self._engines)

    @property
    def servable_kinds(self) -> frozenset[ModelKind]:
        """The loaded model kinds a request can use: ``kinds`` less a model the GPU cannot
        hold even alone (an ``OnDemandEngine``'s ``unservable``: found by the plan at start,
        or when it first failed to load), whose requests are refused at once until a restart."""
        return frozenset(kind for kind in self._engines if self.unservable(kind) is None)

    def unservable(self, kind: ModelKind) -> str | None:
        """Why the loaded model ``kind`` cannot serve a request, in one sentence ("The
        voice_design model cannot be served on this GPU: <the plan's reason>"), while it is
        flagged so (an ``OnDemandEngine``'s ``unservable``: by the plan at start, or when it
        first failed to load; until a restart); None when it can, or is not loaded."""
        why = getattr(self._engines.get(kind), "unservable", None)
        return None if why is None else f"The {kind.value} model cannot be served on this GPU: {why}"

    def unspeakable(self, voice: Voice) -> str | None:
        """Why ``voice`` cannot be spoken on this server (``unservable`` of its model), or None
        when it can. A preset whose VoiceDesign model cannot be served is still spoken where
        its anchor is stored and the Base model serves (``open`` clones the anchor)."""
        why = self.unservable(voice.kind)
        if why is None or voice.kind is not ModelKind.VOICE_DESIGN or self.anchors is None:
            return why
        if self.unservable(ModelKind.BASE) is None and ModelKind.BASE in self._engines:
            if self.anchors.state(voice) is AnchorState.READY:
                return None
        return why

    def speakable_voices(self) -> list[Voice]:
        """The catalogue's voices that can be spoken here (``unspeakable``: not those of a model
        the GPU cannot hold), in catalogue order: those Wyoming's ``info`` announces, and those
        the automatic default voice is chosen from. Does not re-read the voices folder."""
        return [voice for voice in self.catalog.voices() if self.unspeakable(voice) is None]

    @property
    def default_voice(self) -> str | None:
        """The voice of requests that name none (``DefaultVoice.name``): an explicit one
        (``--voice``) as given, an automatic one picked anew when its voice is gone or cannot
        be spoken; None while the catalogue holds no voice at all."""
        return self._default.name

    @property
    def default_served(self) -> bool:
        """False while the explicit default voice (``--voice``) is no longer served: requests
        naming no voice are refused with ``DefaultVoiceGoneError`` (``DefaultVoice.served``)."""
        return self._default.served

    @property
    def pinned_default(self) -> str | None:
        """The default voice if it is explicit (``--voice``): the studio may not rename or
        delete it. None for an automatic default (``DefaultVoice.pinned``)."""
        return self._default.pinned

    def no_voices(self, name: str | None = None, why: str | None = None) -> NoVoicesError:
        """The refusal of a request while the server has no voice: what to do about it.

        Args:
            name: the voice the request named, if any.
            why: the catalogue's word on that name (a skipped clip says why), if any.
        """
        where = f" ({self.studio})" if self.studio else ""
        asked = f"{why.split('; available:')[0]}. " if why else (f"Unknown voice {name!r}. " if name else "")
        return NoVoicesError(
            f"{asked}This server has no voice yet: upload a clip under 'Clone a voice' in the voice "
            f"studio{where}, or add a clip <id>.wav and its transcript <id>.txt to the voices folder; "
            "it is spoken at once, without a restart"
        )

    @property
    def backend(self) -> str:
        """The engines' back end, in words, each engine named once (``describe_backends``;
        for ``describe``)."""
        return describe_backends({kind: engine.backend for kind, engine in self._engines.items()})

    def model_states(self) -> dict[str, str]:
        """Each loaded model's state: "ready", "loading" or "failed" (for ``/ready``)."""
        return model_states(self._engines)

    def is_ready(self) -> bool:
        """True when every model finished its warm-up without error."""
        return all(state == "ready" for state in self.model_states().values())

    def readiness(self) -> str | None:
        """Why this server takes no new work now (for ``/ready`` and a load balancer), or
        None when it does: "failed" or "loading" (a model), "draining" (``drain`` was
        called: a shutdown began), "busy" (``max_queue`` requests are open)."""
        return self.admission.readiness(self.model_states().values())

    @property
    def max_queue(self) -> int:
        """Most requests open at once (both doors): ``open`` refuses the next one."""
        return self.admission.max_queue

    @max_queue.setter
    def max_queue(self, value: int) -> None:
        self.admission.max_queue = value

    def drain(self) -> None:
        """Turn not-ready (``readiness``) ahead of a shutdown, so that a load balancer sends
        new work elsewhere; requests are still served until ``shutdown``."""
        self.admission.drain()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every engine after its current step (blocking)."""
        for scheduler in self._schedulers.values():
            scheduler.close()
        for engine in self._engines.values():
            engine.join(timeout)

    def count_error(self, door: str, error: RequestError) -> None:
        """Count a refused request (the doors call this for every ``RequestError``)."""
        self.metrics.requests.labels(door, "error").inc()
        self.metrics.errors.labels(door, error.code).inc()

    def resolve_voice(self, name: str | None) -> Voice:
        """The voice for a request's name (None/"" = default).

        Raises:
            VoiceNotFoundError: unknown name; ``NoVoicesError`` while the server has no
                voice at all (with how to add one).
        """
        # The doors awaited catalog.refresh_async (new clips read off the loop): this finds
        # nothing to read, and does not wait for a refresh another thread is running.
        self.catalog.refresh(wait=False)
        wanted = name or self.default_voice
        if wanted is None:
            raise self.no_voices()
        if not name and self._default.gone:
            # Refused, not spoken by another voice: the user chose this one (a clone in
            # their language); Home Assistant shows the error's text in its pipeline.
            raise DefaultVoiceGoneError(self._default.gone_message())
        try:
            return self.catalog.get(wanted)
        except UnknownVoiceError as err:
            if not self.catalog.voices():
                raise self.no_voices(name, str(err)) from None
            raise VoiceNotFoundError(str(err)) from None

    def _native_voice(self, default: Voice, language: str) -> Voice:
        """For a request that names a language but no voice: the default voice if that is
        its own language (or it has none), else the first voice, presets first, whose own
        language it is; the default voice when none is.

        Args:
            language: Qwen3-TTS language name ("korean", ...; "auto" keeps the default).
        """
        if language == AUTO or native_language(default) in (language, AUTO):
            return default
        natives = [v for v in self.speakable_voices() if native_language(v) == language]
        # Voices of the default's kind first (a preset for a preset; for a built-in speaker,
        # the default on the CPU, another speaker rather than a preset designed live), then
        # presets; stable: catalogue order.
        natives.sort(key=lambda v: (v.kind is not default.kind, v.kind is not ModelKind.VOICE_DESIGN))
        return natives[0] if natives else default

    def open(self, request: SpeechRequest, streamed: bool = True) -> SpeechStream:
        """Validate a request and open its stream (must run in the event loop).

        A VoiceDesign preset whose anchor is stored is spoken by the Base model as a clone
        of that anchor (same voice for every sentence); without its anchor, without the Base
        model, or with the request's own ``instructions``, it is designed live.

        Args:
            request: what the client asked for.
            streamed: the text comes as it is written (``add_text`` deltas): the first
                segment may end at a clause so speech starts sooner. False for a whole text.

        Raises:
            ServerStoppingError: ``shutdown`` was called.
            OverloadedError: ``max_queue`` requests are open already.
            VoiceNotFoundError, LanguageError: the request cannot be served.
            ModelUnservableError: the model that would speak it cannot be served on this GPU
                (``unservable``): refused before anything is queued.
        """
        self.admission.admit()
        designing = bool(request.instructions) and not request.voice and ModelKind.VOICE_DESIGN in self._engines
        designed = [v for v in self.catalog.voices() if v.kind is ModelKind.VOICE_DESIGN] if designing else []
        try:
            voice = self.resolve_voice(request.voice)
        except DefaultVoiceGoneError:
            if not designed:
                raise
            voice = designed[0]  # a description alone never used the default's voice
        if designed:
            # A description alone designs a voice: take the VoiceDesign model.
            voice = designed[0] if voice.kind is not ModelKind.VOICE_DESIGN else voice
        try:
            language = to_qwen(request.language) if request.language else voice.language
        except UnsupportedLanguageError as err:
            raise LanguageError(str(err)) from None
        if request.language and not request.voice and not request.instructions:
            voice = self._native_voice(voice, language)
        kind, instruct, reference = voice.kind, voice.instruct, voice.reference
        if request.instructions and voice.kind is not ModelKind.BASE:
            instruct = request.instructions.strip()  # a one-off design: always live
        elif (
            voice.kind is ModelKind.VOICE_DESIGN
            and self.anchors is not None
            and ModelKind.BASE in self._engines
        ):
            anchor = self.anchors.reference_for(voice)  # missing: asked for, designed live meanwhile
            if anchor is not None:
                kind, instruct, reference = ModelKind.BASE, None, anchor
        # No voice named and a description: a voice designed for this request alone.
        one_off = bool(request.instructions) and not request.voice and voice.kind is ModelKind.VOICE_DESIGN
        why = self.unservable(kind)
        if why is not None:  # refused now, never queued for a model that fails every request
            raise self._unservable_refusal(kind, why, request, voice, one_off)
        seed = next((s for s in (request.seed, self.seed) if s is not None), None)
        if seed is None:
            seed = random.randrange(2**31)
        job = self._schedulers[kind].open_job(asyncio.get_running_loop())
        stream = SpeechStream(
            self, job, voice, language, instruct, seed, request.door, streamed, reference, designed=one_off
        )
        self.admission.add(stream)
        return stream

    def _unservable_refusal(
        self, kind: ModelKind, why: str, request: SpeechRequest, voice: Voice, one_off: bool
    ) -> ModelUnservableError:
        """The refusal of ``request``, whose ``voice`` (or one-off design) needs the model
        ``kind``, which cannot be served on this GPU (``why``: ``unservable``'s sentence): the field at fault
        and what to ask for instead. A request naming no voice (Home Assistant's) gets a short
        message (the log has the detail: ``DefaultVoice.name``)."""
        others = f" (these can be spoken: {shown_names([v.name for v in self.speakable_voices()])})"
        if one_off:
            return ModelUnservableError(f"{why}. A voice designed from instructions alone needs it: name a voice of "
                                        f"another model instead{others}", "instructions")
        if request.instructions and self.unspeakable(voice) is None:  # spoken as it is, not designed anew
            return ModelUnservableError(f"{why}. The instructions design voice {voice.name!r} anew with it: send "
                                        "none to speak it as it is", "instructions")
        if not request.voice:
            return ModelUnservableError(f"The default voice {voice.name!r} cannot be spoken: the {kind.value} model "
                                        "cannot be served on this GPU (see the server log). Name a voice of another "
                                        "model, or choose another default voice (--voice)")
        return ModelUnservableError(f"{why}. Voice {voice.name!r} needs it: name a voice of another model "
                                    f"instead{others}")

    @property
    def open_streams(self) -> int:
        """Requests open now (generating, queued, or with audio not yet consumed)."""
        return self.admission.open

    def shutdown(self) -> None:
        """Refuse new requests and end every open stream: its generation stops within a
        frame and its iteration raises ``ServerStoppingError`` (must run in the event loop)."""
        self.admission.shutdown()

    async def render_design(self, spec: AnchorSpec) -> np.ndarray:
        """Render one VoiceDesign clip in a single generation (an anchor, or a design
        candidate rendered exactly as its anchor would be): ``spec.text`` is not split, and
        at most ``frame_budget(spec.text)`` codec frames, and never more than
        ``ANCHOR_MAX_FRAMES``, are generated. It queues with the clients.

        Returns:
            float32 [n_samples] at 24 kHz.

        Raises:
            GenerationError: the model failed. RuntimeError: no VoiceDesign model.
        """
        if ModelKind.VOICE_DESIGN not in self._engines:
            raise RuntimeError("the VoiceDesign model is not loaded")
        job = self._schedulers[ModelKind.VOICE_DESIGN].open_job(asyncio.get_running_loop())
        job.submit(
            Segment(
                text=spec.text,
                language=spec.language,
                max_new_tokens=min(frame_budget(spec.text), ANCHOR_MAX_FRAMES),
                seed=spec.seed,
                instruct=spec.instruct,
            )
        )
        job.close()
        chunks: list[np.ndarray] = []
        try:
            async for chunk in job:
                chunks.append(chunk)
        except GenerationError as err:
            job.cancel()
            explained = explain_oom(err)
            if explained is err:
                raise
            raise explained from err
        except BaseException:
            job.cancel()
            raise
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    def voice_info(self, voice: Voice) -> dict[str, object]:
        """How a voice is served, for ``/v1/audio/voices``: ``source`` (shipped, user, clone,
        builtin), ``served`` ("anchor": the Base model clones the preset's anchor;
        "designed-live"; "clone"; "speaker") and, for presets, ``anchor`` (ready, pending,
        waiting, failed, off) and, for a voice that cannot be spoken on this GPU, ``unservable``:
        why (``unspeakable``)."""
        info: dict[str, object] = {"source": voice.source.value}
        if voice.kind is ModelKind.VOICE_DESIGN:
            state = self.anchors.state(voice) if self.anchors is not None else AnchorState.OFF
            anchored = state is AnchorState.READY and ModelKind.BASE in self._engines
            info["served"] = "anchor" if anchored else "designed-live"
            info["anchor"] = state.value
        else:
            info["served"] = "clone" if voice.kind is ModelKind.BASE else "speaker"
        mute = self.unspeakable(voice)
        if mute is not None:
            info["unservable"] = mute
        return info

    def speak(self, request: SpeechRequest, text: str, arrived: float | None = None) -> SpeechStream:
        """Validate a whole-text request and start speaking it (must run in the event loop).

        Args:
            arrived: when the door had the request, ``time.perf_counter()`` seconds (the
                start of its ``timeline``); None: now.

        Raises:
            EmptyTextError, TextTooLongError, VoiceNotFoundError, LanguageError,
            ModelUnservableError (``open``).
        """
        check_text(text, self.max_chars)
        stream = self.open(request, streamed=False)
        stream.add_text(text, arrived)
        stream.finish()
        return stream


class SpeechStream:
    """One request's text in, its audio out. Create with ``TtsService.open``.

    Attributes:
        voice: the resolved voice.
        language: the Qwen3-TTS language used.
        anchored: True when a preset is spoken by the Base model from its anchor.
        designed: True when the request named no voice and its ``instructions`` designed
            one for it alone (``voice`` is then only the preset whose language it took).
        voice_name: ``voice``'s name, or ``DESIGNED_VOICE`` when ``designed``.
        first_audio_s: seconds from the request's arrival (its first text: ``timeline.arrived``;
            the stream's opening where no text came) to its first chunk, once it came. A
            streamed text's client may open the request long before its first words (a voice
            agent waiting for its LLM): that wait is not the server's.
        samples: samples delivered so far (24 kHz).
        timeline: when the request passed each point to its first audio (``timeline``); the
            door marks ``written`` through ``wrote``.
    """

    def __init__(
        self,
        service: TtsService,
        job: Job,
        voice: Voice,
        language: str,
        instruct: str | None,
        seed: int,
        door: str,
        streamed: bool = True,
        reference: Reference | None = None,
        designed: bool = False,
    ) -> None:
        self._service = service
        self._job = job
        self.voice = voice
        self.designed = designed
        self._reference = reference
        self.anchored = voice.kind is ModelKind.VOICE_DESIGN and reference is not None
        self.language = language
        self._instruct = instruct
        self._seed = seed
        self._door = door
        self._segmenter = Segmenter(streamed=streamed)
        self._chars = 0
        self._segments = 0
        self._opened = time.perf_counter()  # the timeline's clock
        self.first_audio_s: float | None = None
        self.samples = 0
        self._outcome: str | None = None
        self._interrupted: RequestError | None = None
        self.timeline = Timeline()
        job.timeline = self.timeline

    @property
    def voice_name(self) -> str:
        """The voice as the doors and the log name it: ``voice.name``, or ``DESIGNED_VOICE``
        for a voice designed from the request's ``instructions`` alone."""
        return DESIGNED_VOICE if self.designed else self.voice.name

    def add_text(self, delta: str, arrived: float | None = None) -> None:
        """Feed text (a whole message or an arbitrary delta); complete sentences start now.

        Args:
            arrived: when the door received this delta, ``time.perf_counter()`` seconds (None:
                now); the first non-empty delta's is the request's arrival (``timeline.arrived``).

        Raises:
            TextTooLongError: the stream's text passed the limit; nothing of this delta is kept.
        """
        if self._chars + len(delta) > self._service.max_chars:
            raise text_too_long(self._chars + len(delta), self._service.max_chars, streamed=True)
        self._chars += len(delta)
        if delta:
            self.timeline.mark("arrived", arrived)
        for text in self._segmenter.add(delta):
            self._submit(text)

    def finish(self) -> None:
        """No more text: the remainder is queued and iteration ends after its audio."""
        for text in self._segmenter.finish():
            self._submit(text)
        self._job.close()

    def wrote(self) -> None:
        """The door has written audio bytes of this stream (marks the first: ``timeline``)."""
        if self.timeline.written is None:
            self.timeline.written = time.perf_counter()

    def _submit(self, text: str) -> None:
        self._segments += 1
        if self._segments == 1:
            self.timeline.mark("queued")
        fixed = self._service.fixed_frames
        cap = fixed or frame_budget(text)
        _LOGGER.debug(
            "%s segment %d: %r, language %s, voice %s, cap %d frames",
            self._door, self._segments, text, self.language, self.voice.name, cap,
        )
        self._job.submit(
            Segment(
                text=text,
                language=self.language,
                max_new_tokens=cap,
                min_new_tokens=fixed or 2,
                seed=self._seed,
                instruct=self._instruct,
                speaker=self.voice.speaker,
                reference=self._reference,
            )
        )

    def cancel(self) -> None:
        """Stop: drop queued text, stop the running generation within one chunk."""
        self._job.cancel()
        self._record("cancelled")

    def refuse(self, error: RequestError) -> None:
        """Stop as ``cancel`` does, for a request its door refuses after it opened (its text
        went over the limit or had nothing speakable, its client went idle): logged as
        refused with ``error``'s code and reason, not as cancelled. Not counted in
        ``tts_requests_total`` here: the door counts the refusal (``TtsService.count_error``).
        Nothing happens when the stream has ended already."""
        self._job.cancel()
        self._record("refused", code=error.code, reason=str(error))

    def interrupt(self, error: RequestError) -> None:
        """Cancel on the server's behalf: iteration ends by raising ``error``."""
        self._interrupted = self._interrupted or error
        self.cancel()

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        """Audio chunks, float32 [n_samples] at 24 kHz, in text order, as they are decoded.

        Raises:
            GenerationError: the model failed; the stream is cancelled.
            ServerStoppingError: the server shut down before the stream's end.
        """
        try:
            async for chunk in self._job:
                if self.first_audio_s is None:
                    delivered = time.perf_counter()
                    self.timeline.mark("delivered", delivered)
                    arrived = self.timeline.arrived if self.timeline.arrived is not None else self._opened
                    self.first_audio_s = max(0.0, delivered - arrived)
                    self._service.metrics.first_audio.labels(self._door).observe(self.first_audio_s)
                self.samples += len(chunk)
                yield chunk
        except GenerationError as err:
            self._record("error", code="generation-failed")
            explained = explain_oom(err)
            if explained is err:
                raise
            raise explained from err
        if self._interrupted is not None:
            raise self._interrupted
        if not self._job.cancelled.is_set():
            self._record("ok")

    def _record(self, outcome: str, code: str | None = None, reason: str | None = None) -> None:
        """End the stream's accounting once: its admission slot, its metrics and the
        request's summary log line. ``outcome``: "ok", "cancelled", "error" (counted here,
        with ``code``) or "refused" (``refuse``: the door counts it; ``code`` and ``reason``
        go into the log line)."""
        if self._outcome is not None:
            return
        self._outcome = outcome
        self._service.admission.discard(self)
        m = self._service.metrics
        if outcome != "refused":
            m.requests.labels(self._door, outcome).inc()
            if code:
                m.errors.labels(self._door, code).inc()
        audio_s = self.samples / SAMPLE_RATE
        m.audio_seconds.labels(self._door).inc(audio_s)
        first = f"{self.first_audio_s * 1000:.0f} ms" if self.first_audio_s is not None else "none"
        points = self.timeline.describe()
        if points:  # where the milliseconds went: ms after the door had the request
            first += f" ({points})"
        said = outcome
        if outcome == "refused":
            said = f"refused ({code}: {reason})"
        elif outcome == "ok" and self._segments == 0:
            said = "ok (nothing speakable: no audio)"
        _LOGGER.info(
            "%s request %s: voice %s, %d chars, %d sentence(s), first audio %s, %.2f s of audio",
            self._door, said, self.voice_name + (" (anchor)" if self.anchored else ""),
            self._chars, self._segments, first, audio_s,
        )
        if outcome == "ok" and audio_s > 0:
            m.real_time_factor.labels(self._door).observe((time.perf_counter() - self._opened) / audio_s)
        for wait in self._job.queue_waits:
            m.queue_wait.labels(self._door).observe(wait)


def native_language(voice: Voice) -> str:
    """A voice's own Qwen3-TTS language: its ``language``, or for a CustomVoice speaker
    without one, the speaker's native language (``languages.SPEAKER_LANGUAGES``, from the
    Qwen3-TTS model card); "auto" when it has none."""
    if voice.language != AUTO or voice.kind is not ModelKind.CUSTOM_VOICE or not voice.speaker:
        return voice.language
    code = SPEAKER_LANGUAGES.get(voice.speaker.lower())
    return to_qwen(code) if code else AUTO


def explain_oom(error: GenerationError) -> GenerationError:
    """``error`` itself, or for a CUDA out-of-memory (``torch.OutOfMemoryError``, matched by
    name: this module does not import torch) a ``GenerationError`` saying what to change,
    also logged as a warning."""
    cause = error.__cause__
    if cause is None or type(cause).__name__ != "OutOfMemoryError":
        return error
    _LOGGER.warning("%s (%s)", OOM_ADVICE, str(cause).splitlines()[0] if str(cause) else "CUDA out of memory")
    return GenerationError(OOM_ADVICE)


def check_text(text: str, max_chars: int) -> str:
    """Validate a whole (non-streamed) text.

    Returns the text unchanged when it is speakable.

    Raises:
        EmptyTextError: empty, whitespace only, or nothing speakable after cleanup.
        TextTooLongError: longer than ``max_chars``.
    """
    if len(text) > max_chars:
        raise text_too_long(len(text), max_chars)
    if not clean_text(text):
        raise EmptyTextError("Text is empty or has nothing speakable")
    return text
