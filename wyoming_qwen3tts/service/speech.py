"""The speech service every front door calls: one request type in, one PCM stream out.

A front door turns its protocol into a ``SpeechRequest`` and calls ``TtsService.speak``
(whole text) or ``TtsService.open`` (text streamed in with ``add_text`` and ``finish``).
Either resolves the voice and language or raises a ``RequestError``; the stream yields
float32 [n_samples] chunks at 24 kHz, or raises ``GenerationError``. Segmentation, frame
caps, seeds, the engines, their schedulers and metrics live behind this module, so both
doors behave the same and neither imports the engine or the scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import numpy as np

from .anchors import ANCHOR_MAX_FRAMES, Anchors, AnchorSpec, AnchorState
from ..common.audio import SAMPLE_RATE
from ..engine import Engine, Segment
from ..text.languages import AUTO, SPEAKER_LANGUAGES, UnsupportedLanguageError, to_qwen
from ..common.metrics import Metrics
from .scheduler import GenerationError, Job, Scheduler
from ..text.segmenter import Segmenter, clean_text, frame_budget
from ..common.timeline import Timeline
from ..common.vocabulary import ModelKind, Reference
from ..catalogue.voices import UnknownVoiceError, Voice, VoiceCatalog, name_order

_LOGGER = logging.getLogger(__name__)

#: Default longest text of one request or one text stream, in characters (about ten
#: minutes of speech). OpenAI's own limit is 4096.
DEFAULT_MAX_CHARS = 10_000
#: Default cap on requests open at once over both doors (generating or waiting their turn).
DEFAULT_MAX_QUEUE = 32
#: Voice used when a request names none and ``--voice`` names none either, if the catalogue
#: has it and it can be spoken (else the first such voice by name: ``pick_default_voice``,
#: ``TtsService.default_voice``).
DEFAULT_VOICE = "aria"
#: What an out-of-memory error tells the client and the log to change.
OOM_ADVICE = (
    "The GPU ran out of memory for this request; the server goes on. Retry, or restart the server "
    "with fewer streams (--max-streams N), --gpu-memory GB, or --design-model-memory on-demand"
)


#: A count of streams or threads, "2 stream(s)", "1 threads": said as "2 streams", "1 thread".
_COUNTED = re.compile(r"\b(\d+) (stream|thread)(?:\(s\)|s)")


def _split_outside_parentheses(text: str) -> list[str]:
    """``text`` split at each ", " outside parentheses."""
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith(", ", i):
            pieces.append(text[start:i])
            start = i + 2
    return [*pieces, text[start:]]


def _backend_parts(backend: str) -> tuple[str, list[str]]:
    """An engine's ``backend`` as its name and its parts: those in parentheses after the
    name, then those after a comma ("qwentts.cpp GGML on the CPU (Q8_0, 2 stream(s) x 2
    threads, clones in context (ICL))", "batched engine (eager, cpu)", "batched CUDA-graph
    engine, on demand")."""
    head, *tail = _split_outside_parentheses(backend)
    name, paren, inner = head.partition(" (")
    if not paren or not inner.endswith(")"):
        return head, tail
    return name, [*_split_outside_parentheses(inner[:-1]), *tail]


def describe_backends(backends: Mapping[ModelKind, str]) -> str:
    """The models' engines (each model's ``Engine.backend``) in words, for Wyoming's ``info``
    (Home Assistant shows it): each engine named once, with the parts all its models share
    in parentheses, then what is a model's own, named by the model. For example a Base and a
    CustomVoice model on the GGML engine: "qwentts.cpp GGML on the CPU (Q8_0, 2 streams x 2
    threads): base model clones by x-vector". Engines of other names follow after " + "."""
    groups: dict[str, dict[ModelKind, list[str]]] = {}
    for kind, backend in backends.items():
        name, parts = _backend_parts(_COUNTED.sub(lambda m: f"{m[1]} {m[2]}{'' if m[1] == '1' else 's'}", backend))
        groups.setdefault(name, {})[kind] = parts
    said = []
    for name, models in sorted(groups.items()):
        first = next(iter(models.values()))
        common = [part for part in first if all(part in parts for parts in models.values())]
        text = f"{name} ({', '.join(common)})" if common else name
        own = [
            f"{kind.value} model {', '.join(extra)}"
            for kind in ModelKind
            if kind in models and (extra := [part for part in models[kind] if part not in common])
        ]
        said.append(f"{text}: {'; '.join(own)}" if own else text)
    return " + ".join(said)


class RequestError(Exception):
    """A request the server will not run. ``code`` is a stable machine-readable id."""

    code = "bad-request"


class EmptyTextError(RequestError):
    """The text is empty, whitespace, or nothing speakable once cleaned."""

    code = "empty-text"


class TextTooLongError(RequestError):
    """The text is longer than the server's limit."""

    code = "text-too-long"


def text_too_long(chars: int, max_chars: int, streamed: bool = False) -> TextTooLongError:
    """The refusal of a text of ``chars`` characters over ``max_chars`` (``--max-chars``), in
    the same words on every door and path: a whole text (``check_text``) and a streamed one
    (``SpeechStream.add_text``, ``streamed``: ``chars`` counts what came so far, up to the
    delta that passed the limit, so the message says "at least")."""
    size = f"at least {chars} characters (so far)" if streamed else f"{chars} characters"
    return TextTooLongError(f"Text is {size}, over the limit of {max_chars} (--max-chars)")


class VoiceNotFoundError(RequestError):
    """No available voice of that name."""

    code = "unknown-voice"


class NoVoicesError(VoiceNotFoundError):
    """The server has no voice at all yet (the clone model alone, and no usable clip in the
    voices folder): every request is refused with how to add one, until one is added.
    A ``VoiceNotFoundError``, so every door answers it where it answers an unknown voice
    (HTTP 404, param ``voice``), with its own code."""

    code = "no-voices"


class DefaultVoiceGoneError(VoiceNotFoundError):
    """A request named no voice, and the server's explicit default voice (``--voice``) is
    no longer served (its clip was removed or broken by hand): what to do about it. A
    ``VoiceNotFoundError``, so every door answers it where it answers an unknown voice
    (HTTP 404, param ``voice``), with its own code."""

    code = "default-voice-gone"


class ModelUnservableError(RequestError):
    """The request needs a model the GPU cannot hold even alone (``TtsService.unservable``):
    refused before it is queued, as a model the server has not loaded is (HTTP 404, OpenAI's
    code ``model_not_found``). The message says why (the start-up plan's reason) and what
    to ask for instead.

    Attributes:
        param: the request field at fault: ``voice`` (its voice, or the default voice, is
            spoken by that model) or ``instructions`` (they design a voice with it).
    """

    code = "model_not_found"

    def __init__(self, message: str, param: str = "voice") -> None:
        super().__init__(message)
        self.param = param


class LanguageError(RequestError):
    """The language is not one Qwen3-TTS speaks."""

    code = "unsupported-language"


class OverloadedError(RequestError):
    """The server already has ``max_queue`` requests open: refused at once, never queued.

    Attributes:
        retry_after_s: seconds after which a retry is worth trying (HTTP ``Retry-After``).
    """

    code = "overloaded"
    retry_after_s = 2


#: How the doors and the log name a voice designed from a request's ``instructions`` alone
#: (no voice named): no catalogue voice spoke (``SpeechStream.designed``). Never a
#: percent-encoded voice name (those encode "(" as %28).
DESIGNED_VOICE = "(designed)"


class ServerStoppingError(RequestError):
    """The server is shutting down: new requests are refused and open streams end with it."""

    code = "server-stopping"


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
    "DefaultVoiceGoneError",
    "EmptyTextError",
    "GenerationError",
    "LanguageError",
    "ModelUnservableError",
    "NoVoicesError",
    "OverloadedError",
    "RequestError",
    "ServerStoppingError",
    "SpeechRequest",
    "SpeechStream",
    "TextTooLongError",
    "TtsService",
    "VoiceNotFoundError",
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
        self._default_voice = default_voice
        self._default_explicit = default_explicit and default_voice is not None
        self._pinned_gone = False  # the explicit default is no longer served (logged once)
        self._pinned_mute_said = False  # the explicit default cannot be spoken on this GPU (logged once)
        self.studio = studio
        self.metrics = metrics
        self.max_chars = max_chars
        self.max_queue = max_queue
        self._open: set[SpeechStream] = set()  # streams not yet ended (the admission count)
        self._stopping = False
        self._draining = False  # a shutdown began: not ready for a load balancer

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
        """The voice of requests that name none. An explicit default (``--voice``,
        ``default_explicit``) is kept as given. An automatic one (chosen at start, or the
        first time it is needed by a server that started with no voice) follows the rule
        of ``pick_default_voice`` among the voices that can be spoken (``speakable_voices``:
        not a preset of a VoiceDesign model this GPU cannot hold; among all voices where none
        can) at each read: while the voice it names is in the catalogue and can be spoken it
        stays; once that voice is gone (its clip deleted or renamed, in the studio or the
        folder) or cannot be spoken another is picked by the same rule, and the change is
        logged once. An explicit default that cannot be spoken is kept, and said once at
        ERROR (``_check_pinned``). None while the catalogue holds no voice at all. Reading it does not re-read
        the voices folder (the doors refresh the catalogue); it costs one pass over the
        catalogue's voices."""
        if self._default_explicit:
            self._check_pinned()
            return self._default_voice
        voices = self.catalog.voices()
        current = self._default_voice
        held = next((v for v in voices if v.name == current), None)
        mute = self.unspeakable(held) if held is not None else None
        if held is not None and mute is None:
            return current
        spoken = [v.name for v in voices if self.unspeakable(v) is None]
        chosen = pick_default_voice(spoken or [v.name for v in voices])  # none spoken: the refusal says why
        if chosen != current:
            self._default_voice = chosen
            if chosen is None:
                _LOGGER.info("Default voice: none, %s is gone and no voice is left", current)
            elif current is None:
                _LOGGER.info("Default voice: %s, %s (--voice chooses another)", chosen, first_default_reason(chosen, len(voices)))
            elif mute is not None:
                _LOGGER.info("Default voice: %s, as %s cannot be spoken (%s; --voice chooses one to keep)", chosen,
                             current, mute)
            else:
                _LOGGER.info("Default voice: %s, as %s is gone (--voice chooses one to keep)", chosen, current)
        return chosen

    def _check_pinned(self) -> bool:
        """Whether the explicit default voice is served now; logs a WARNING once when it
        stops being served, and once when it is back; an ERROR once when its model cannot be
        served on this GPU (``unspeakable``: it is still "served", and its requests are
        refused with ``ModelUnservableError``)."""
        assert self._default_voice is not None
        voice = self.catalog.find(self._default_voice)
        served = voice is not None
        mute = self.unspeakable(voice) if voice is not None and not self._pinned_mute_said else None
        if mute is not None:
            self._pinned_mute_said = True
            name = self._default_voice
            _LOGGER.error(
                "The default voice %s (--voice %s) cannot be spoken: %s. Requests that name no voice are refused "
                "until you choose a default voice of another model (--voice, the add-on's voice option; these can "
                "be spoken: %s) and restart, or free the GPU memory that model needs and restart", name, name, mute,
                shown_names([v.name for v in self.speakable_voices()]),
            )
        if served == self._pinned_gone:  # it changed
            self._pinned_gone = not served
            if served:
                _LOGGER.warning("The default voice %s (--voice %s) is served again: requests that name no voice "
                                "are spoken with it", self._default_voice, self._default_voice)
            else:
                _LOGGER.warning("%s", self._default_gone_message(log=True))
        return served

    @property
    def default_served(self) -> bool:
        """False while the explicit default voice (``--voice``) is no longer served (its clip
        was removed or broken by hand): requests naming no voice are refused with
        ``DefaultVoiceGoneError``. True otherwise (an automatic default is always served)."""
        return not self._default_explicit or self._check_pinned()

    def _default_gone_message(self, log: bool = False) -> str:
        """Why the explicit default voice is not served, and how to fix it. ``log``: the
        server log's WARNING, in full (why, the two fixes, the voices still served). Else a
        refused request's message: two short sentences, short enough for Home Assistant's pipeline
        error (under 200 characters for a name of the studio's ``MAX_NAME_CHARS``), naming
        the voice, what is wrong and what to do; the log holds the detail."""
        name = self._default_voice
        clip = self.catalog.skipped_clip(name) if name is not None else None
        # The skipped record names the transcript where it is the fault (the clip is fine).
        transcript = clip.transcript if clip is not None else None
        if not log:
            if transcript is not None:
                assert clip is not None
                return (f"The default voice {name!r} (--voice) cannot be used: its transcript {transcript} could not "
                        f"be used (see the server log). Save it {clip.transcript_fix}, or choose another default voice")
            if clip is not None:
                return (f"The default voice {name!r} (--voice) cannot be used: its clip is skipped (see the server "
                        "log). Replace the clip, or choose another default voice")
            return (f"The default voice {name!r} (--voice) is no longer in the voices folder. Put it back, or "
                    "choose another default voice")
        if clip is not None and transcript is not None:
            why = f"its transcript {transcript} could not be used, so its clip {clip.file} is skipped ({clip.reason})"
            put_back = f"save its transcript {transcript} {clip.transcript_fix}"
        else:
            why = (f"its clip {clip.file} is skipped ({clip.reason})" if clip is not None
                   else "no clip or preset of that name is in the voices folder any more")
            put_back = (f"put its clip back ({name}.wav and its transcript {name}.txt in the voices folder"
                        + (", or upload one in the voice studio" if self.studio else "") + ")")
        names = [v.name for v in self.catalog.voices()]
        shown = shown_names(names)
        fix = f"{put_back}, or choose another default voice (--voice, the add-on's voice option) and restart"
        served = f"; requests that name a voice are served (available: {shown})" if names else "; no voice is left"
        return (f"The default voice {name} (--voice {name}) is no longer served: {why}. Requests that name no "
                f"voice are refused until you {fix}{served}")

    @property
    def pinned_default(self) -> str | None:
        """The default voice if it is explicit (``--voice``): the studio may not rename or
        delete it. None for an automatic default, which may go (the next request picks
        another, ``default_voice``)."""
        return self._default_voice if self._default_explicit else None

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
        return {
            kind.value: "failed"
            if e.warm_error is not None or e.serve_error is not None
            else "ready"
            if e.ready.is_set()
            else "loading"
            for kind, e in self._engines.items()
        }

    def is_ready(self) -> bool:
        """True when every model finished its warm-up without error."""
        return all(state == "ready" for state in self.model_states().values())

    def readiness(self) -> str | None:
        """Why this server takes no new work now (for ``/ready`` and a load balancer), or
        None when it does: "failed" or "loading" (a model), "draining" (``drain`` was
        called: a shutdown began), "busy" (``max_queue`` requests are open)."""
        states = self.model_states().values()
        if "failed" in states:
            return "failed"
        if "loading" in states:
            return "loading"
        if self._draining or self._stopping:
            return "draining"
        if len(self._open) >= self.max_queue:
            return "busy"
        return None

    def drain(self) -> None:
        """Turn not-ready (``readiness``) ahead of a shutdown, so that a load balancer sends
        new work elsewhere; requests are still served until ``shutdown``."""
        self._draining = True

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
        if not name and self._default_explicit and self._pinned_gone:
            # Refused, not spoken by another voice: the user chose this one (a clone in
            # their language); Home Assistant shows the error's text in its pipeline.
            raise DefaultVoiceGoneError(self._default_gone_message())
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
        if self._stopping:
            raise ServerStoppingError("The server is shutting down")
        if len(self._open) >= self.max_queue:
            raise OverloadedError(
                f"The server is busy ({len(self._open)} requests open, the limit is "
                f"{self.max_queue}); retry in a few seconds"
            )
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
        self._open.add(stream)
        return stream

    def _unservable_refusal(
        self, kind: ModelKind, why: str, request: SpeechRequest, voice: Voice, one_off: bool
    ) -> ModelUnservableError:
        """The refusal of ``request``, whose ``voice`` (or one-off design) needs the model
        ``kind``, which cannot be served on this GPU (``why``: ``unservable``'s sentence): the field at fault
        and what to ask for instead. A request naming no voice (Home Assistant's) gets a short
        message (the log has the detail: ``_check_pinned``)."""
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
        return len(self._open)

    def shutdown(self) -> None:
        """Refuse new requests and end every open stream: its generation stops within a
        frame and its iteration raises ``ServerStoppingError`` (must run in the event loop)."""
        self._stopping = True
        for stream in list(self._open):
            stream.interrupt(ServerStoppingError("The server is shutting down"))

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
        self._service._open.discard(self)
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


def shown_names(names: list[str], most: int = 12) -> str:
    """Voice ``names`` for a message, by name regardless of case (as the studio and
    ``GET /v1/audio/voices`` list them): the first ``most``, then how many in all; "none"
    for none."""
    ordered = sorted(names, key=name_order)
    return ", ".join(ordered[:most]) + (f", ... ({len(ordered)} in all)" if len(ordered) > most else "") or "none"


def pick_default_voice(names: list[str]) -> str | None:
    """The default voice among the catalogue's voice ``names`` when ``--voice`` names none:
    ``DEFAULT_VOICE`` if it is one of them, else the first by name; None when there are none."""
    if not names:
        return None
    return DEFAULT_VOICE if DEFAULT_VOICE in names else min(names, key=name_order)


#: How ``pick_default_voice`` chooses, in the log's words.
DEFAULT_RULE = f"{DEFAULT_VOICE} if there is one, else the first by name"


def first_default_reason(chosen: str, added: int) -> str:
    """Why a server that had no voice took ``chosen`` as its default from the ``added``
    voices (at least one) that came in together, for the log line that names it: "the first
    voice added", or for several (a copy of clips into the voices folder, found by one scan)
    which rule of ``pick_default_voice`` chose it among them."""
    if added == 1:
        return "the first voice added"
    if chosen == DEFAULT_VOICE:
        return f"of the {added} voices added together, {DEFAULT_VOICE} (taken first when there is one)"
    return f"the first by name of the {added} voices added together"


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
