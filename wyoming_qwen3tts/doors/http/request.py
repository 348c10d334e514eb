"""The ``POST /v1/audio/speech`` body: validated into ``SpeechParams`` (types, ranges, the
``model`` name as OpenAI's generic names, our names or the checkpoints' hub ids), and the
catalogue voice to ask the service for. Errors are ``ApiError``s in OpenAI's shape; nothing
here touches HTTP itself (``api`` does).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .encoders import FORMATS
from .shared import MAX_INSTRUCTIONS_CHARS, MODEL_OF_KIND, ApiError
from ..limits import MAX_SEED
from ...service.errors import DefaultVoiceGoneError, VoiceNotFoundError
from ...service.speech import TtsService, check_text
from .tempo import MAX_SPEED, MIN_SPEED
from ...common.vocabulary import ModelKind
from ...catalogue.voices import name_order

#: OpenAI's model names: accepted, the voice decides which Qwen3-TTS model speaks.
GENERIC_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
#: Names that select one Qwen3-TTS model kind (404 when that model is not loaded).
KIND_MODELS: dict[str, ModelKind] = {
    "qwen3-tts-base": ModelKind.BASE,
    "qwen3-tts-clone": ModelKind.BASE,
    "qwen3-tts-voice-design": ModelKind.VOICE_DESIGN,
    "qwen3-tts-custom-voice": ModelKind.CUSTOM_VOICE,
}
STREAM_FORMATS = ("audio", "sse")
#: The checkpoints' own names, as clients written for vLLM-Omni, sglang-omni or nari-qwen3-tts
#: send them in ``model``: the hub id (``Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice``), the bare
#: folder name (``Qwen3-TTS-12Hz-0.6B-Base``) or the Hugging Face cache folder
#: (``models--Qwen--Qwen3-TTS-12Hz-1.7B-Base``). Any size; the suffix names the kind.
HUB_MODEL = re.compile(r"^(?:qwen/|models--qwen--)?qwen3-tts-12hz-[0-9.]+b-(base|voicedesign|customvoice)$")
_HUB_KINDS = {"base": ModelKind.BASE, "voicedesign": ModelKind.VOICE_DESIGN, "customvoice": ModelKind.CUSTOM_VOICE}


@dataclass(frozen=True)
class SpeechParams:
    """A validated ``/v1/audio/speech`` body.

    Attributes:
        text: the ``input`` (1..max_chars characters, something speakable).
        kind: model kind named by ``model``, or None (any: the voice decides).
        model: the ``model`` as the client named it (our name, a hub id, a folder name), for
            error messages; None when absent.
        voice: voice name or alias; None for the server's choice.
        clone: True when ``voice`` came from ``reference_voice`` (must be a clone voice).
        instructions: VoiceDesign description / CustomVoice style, or None.
        response_format: a key of ``encoders.FORMATS``.
        stream_format: "audio" (raw bytes) or "sse".
        speed: tempo factor in [0.25, 4.0].
        language: BCP-47 code or Qwen3-TTS language name, or None.
        seed: RNG seed in [0, 2**32 - 1], or None.
    """

    text: str
    kind: ModelKind | None = None
    model: str | None = None
    voice: str | None = None
    clone: bool = False
    instructions: str | None = None
    response_format: str = "mp3"
    stream_format: str = "audio"
    speed: float = 1.0
    language: str | None = None
    seed: int | None = None


def _invalid(param: str | None, message: str, code: str = "invalid-value") -> ApiError:
    """A 400 for one request field."""
    return ApiError(400, message, code, param)


def _field(body: dict[str, Any], name: str, types: type | tuple[type, ...], what: str) -> Any:
    """``body[name]`` if present and of ``types`` (never a bool), else None.

    Raises:
        ApiError: 400 invalid-type.
    """
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
        raise _invalid(name, f"'{name}' must be {what}", "invalid-type")
    return value


def _text(body: dict[str, Any], name: str) -> str | None:
    """An optional string field, stripped; None when absent or blank."""
    value = _field(body, name, str, "a string")
    return value.strip() or None if value is not None else None


def _choice(body: dict[str, Any], name: str, choices: list[str], default: str) -> str:
    value = _field(body, name, str, "a string")
    if value is not None and value not in choices:
        raise _invalid(name, f"'{name}' must be one of {', '.join(choices)}; got {value!r}")
    return default if value is None else value


def loaded_model_names(sources: Mapping[ModelKind, str]) -> dict[str, ModelKind]:
    """The names that select each loaded model beyond ``model_kind``'s fixed ones: what the
    server was started with (``--clone-model`` etc.), as the serving engines' clients name
    the model they serve: the hub id as given (``Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice``), or
    a folder's own name (``my-finetune`` for ``/models/my-finetune``; a path ending in it
    selects it too). Also ``GET /v1/models``' extra entries.

    Args:
        sources: each loaded kind's source: a hub id or a checkpoint folder.

    Returns:
        name (as spelled, without a trailing ``/``) -> kind. A name two loaded models share
        (two folders of one name) selects neither.
    """
    names: dict[str, ModelKind | None] = {}
    for kind, source in sources.items():
        source = source.strip().rstrip("/")
        name = Path(source).expanduser().name if Path(source).expanduser().is_dir() else source
        if name:
            known = {n.lower(): n for n in names}.get(name.lower())
            names[known or name] = kind if known is None or names[known] is kind else None
    return {name: kind for name, kind in names.items() if kind is not None}


def model_kind(name: str, loaded: Mapping[str, ModelKind] | None = None) -> ModelKind | None:
    """The kind a ``model`` name selects: None for OpenAI's generic names (the voice decides).

    Accepts our names (``KIND_MODELS``), the loaded models' names (``loaded``, from
    ``loaded_model_names``) and any checkpoint's hub id or folder name (``HUB_MODEL``),
    case-insensitively, ignoring surrounding spaces and a trailing ``/``; a path selects what
    its last part does.

    Raises:
        ApiError: 404 ``model_not_found`` for any other name.
    """
    key = name.strip().rstrip("/").lower()
    if key in GENERIC_MODELS:
        return None
    if key in KIND_MODELS:
        return KIND_MODELS[key]
    by_name = {n.lower(): kind for n, kind in (loaded or {}).items()}
    last = key.rsplit("/", 1)[-1]  # a folder's path
    for candidate in (key, last):
        if candidate in by_name:
            return by_name[candidate]
    hub = HUB_MODEL.match(key) or HUB_MODEL.match(last)
    if hub is not None:
        return _HUB_KINDS[hub.group(1)]
    raise ApiError(404, f"The model {name!r} does not exist; see GET /v1/models", "model_not_found", "model")


def _model_kind(body: dict[str, Any], loaded: Mapping[str, ModelKind] | None) -> ModelKind | None:
    """``model``'s kind; a blank ``model`` (``""``, as clients send a field left empty, or
    only spaces) is taken as absent: the server's default."""
    model = _text(body, "model")
    return None if model is None else model_kind(model, loaded)


def _stream_format(body: dict[str, Any]) -> str:
    """``stream_format`` (OpenAI's field): ``sse`` for server-sent events, else (``audio``, or
    absent) the raw audio bytes in ``response_format``, sent as they are generated.

    ``stream`` is not OpenAI's: the serving engines' clients send ``"stream": true`` to mean
    "stream the audio", and read raw bytes (sglang-omni, VoxServe, nari-qwen3-tts; vLLM-Omni
    adds ``stream_format: audio``). So it is validated and never selects SSE: every response
    streams as it is generated anyway.

    Raises:
        ApiError: 400 for a wrong type or value of either field.
    """
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid("stream", "'stream' must be a boolean", "invalid-type")
    return _choice(body, "stream_format", list(STREAM_FORMATS), "audio")


def _voice(body: dict[str, Any]) -> str | None:
    """``voice`` as a name: a string, or OpenAI's custom-voice object ``{"id": name}``."""
    voice = body.get("voice")
    if isinstance(voice, dict):
        voice = voice.get("id")
        if not isinstance(voice, str):
            raise _invalid("voice", "'voice' must be a string or {\"id\": string}", "invalid-type")
    if voice is not None and not isinstance(voice, str):
        raise _invalid("voice", "'voice' must be a string or {\"id\": string}", "invalid-type")
    return voice.strip() or None if voice is not None else None


def parse_speech(body: Any, max_chars: int, loaded: Mapping[str, ModelKind] | None = None) -> SpeechParams:
    """Validate a decoded JSON body (types, ranges, names; not yet the voice). ``loaded``:
    the loaded models' names (``loaded_model_names``), which ``model`` may name.

    Raises:
        ApiError: 400 for a wrong type or value, 404 (model_not_found) for an unknown model.
        EmptyTextError, TextTooLongError: the ``input`` is empty / over ``max_chars``.
    """
    if not isinstance(body, dict):
        raise _invalid(None, "The request body must be a JSON object", "invalid-json")
    text = _field(body, "input", str, "a string")
    if text is None:
        raise _invalid("input", "'input' is required", "missing-field")
    check_text(text, max_chars)
    kind = _model_kind(body, loaded)
    voice = _voice(body)
    reference = _field(body, "reference_voice", str, "a string (a clone-library voice id)")
    if reference is not None and not reference.strip():
        raise _invalid("reference_voice", "'reference_voice' must not be empty")
    raw_instructions = _field(body, "instructions", str, "a string")
    if raw_instructions and len(raw_instructions) > MAX_INSTRUCTIONS_CHARS:
        raise _invalid(
            "instructions", f"'instructions' is over {MAX_INSTRUCTIONS_CHARS} characters"
        )
    instructions = _text(body, "instructions")
    speed = _field(body, "speed", (int, float), "a number")
    speed = 1.0 if speed is None else float(speed)
    if not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise _invalid("speed", f"'speed' must be from {MIN_SPEED} to {MAX_SPEED}; got {speed}")
    seed = _field(body, "seed", int, "an integer")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise _invalid("seed", f"'seed' must be from 0 to {MAX_SEED}")
    # vLLM-Omni's prompt-layout override: accepted for drop-in clients; the engine always
    # builds the model's non-streaming prompt (whole text in the prefill), the layout that
    # keeps long clone text aligned, so either value gives the same prompt.
    if body.get("non_streaming_mode") is not None and not isinstance(body["non_streaming_mode"], bool):
        raise _invalid("non_streaming_mode", "'non_streaming_mode' must be a boolean", "invalid-type")
    model = body.get("model")
    return SpeechParams(
        text=text,
        kind=kind,
        model=model if isinstance(model, str) and kind is not None else None,
        voice=reference.strip() if reference else voice,
        clone=reference is not None,
        instructions=instructions,
        response_format=_choice(body, "response_format", list(FORMATS), "mp3"),
        stream_format=_stream_format(body),
        speed=speed,
        language=_text(body, "language"),
        seed=seed,
    )


def pick_voice(service: TtsService, params: SpeechParams) -> str | None:
    """The catalogue name to ask the service for (None: the service's default choice).

    Raises:
        ApiError: 404 model_not_found (model kind not loaded, or one the GPU cannot hold:
            ``TtsService.unservable``, left out of ``GET /v1/models``) or unknown-voice (also
            for an unknown ``reference_voice``), 400 voice/model mismatch.
    """
    kind = params.kind
    named = params.model or (MODEL_OF_KIND[kind] if kind is not None else "")
    if kind is not None and kind not in service.kinds:
        message = f"The model {named!r} is not loaded on this server"
        raise ApiError(404, message, "model_not_found", "model")
    if kind is not None and (unservable := service.unservable(kind)) is not None:  # as one not loaded
        raise ApiError(404, f"{unservable}. Choose another model (GET /v1/models lists those this server can use)",
                       "model_not_found", "model")
    param = "reference_voice" if params.clone else "voice"
    if params.voice is not None:
        try:
            voice = service.resolve_voice(params.voice)
        except VoiceNotFoundError as err:
            message = _clone_choices(service, params.voice, str(err)) if params.clone else str(err)
            raise ApiError(404, message, err.code, param) from None
        # The voice as the client named it, then the catalogue's name (an OpenAI alias: 'nova' (aria)).
        said = repr(params.voice) + ("" if params.voice == voice.name else f" ({voice.name})")
        if params.clone and voice.kind is not ModelKind.BASE:
            raise _invalid(param, f"{said} is a {voice.kind.value} voice, not a clone")
        if kind is not None and voice.kind is not kind:
            message = f"Voice {said} is spoken by {MODEL_OF_KIND[voice.kind]!r}, not {named!r}"
            raise _invalid(param, message, "voice-model-mismatch")
        return voice.name
    if kind is None or (kind is ModelKind.VOICE_DESIGN and params.instructions):
        return None  # the default voice, or a voice designed from the instructions
    try:
        default = service.resolve_voice(None)
    except DefaultVoiceGoneError:
        # The --voice default is gone. A clone model's request would have been spoken by it
        # (a clip removed by hand is how a default goes): refused as a request naming no
        # voice is. Another model's request never was: its first voice, as when the default is served.
        if kind is ModelKind.BASE:
            raise
        default = None
    if default is not None and default.kind is kind:
        return default.name
    names = sorted((v.name for v in service.catalog.voices() if v.kind is kind), key=name_order)
    if not names:
        how = f": {_ADD_A_CLONE}" if kind is ModelKind.BASE else ""
        raise _invalid("voice", f"The model {named!r} has no voices{how}")
    return names[0]


#: How to get a clone voice, for the errors that find none.
_ADD_A_CLONE = "add a clone voice (<id>.wav and its transcript <id>.txt) to the voices folder, or make one under 'Clone a voice' in the voice studio"
#: Clone voices an unknown ``reference_voice``'s error names at most.
_SHOWN_CLONES = 12


def _clone_choices(service: TtsService, name: str, message: str) -> str:
    """An unknown ``reference_voice``'s error: the catalogue's message (``voices.UnknownVoiceError``:
    "Unknown voice 'x'", or why a clone's clip was skipped) with its list of every voice
    replaced by the clone voices, the only ones ``reference_voice`` takes (or how to add
    one when there are none). ``name``: the voice asked for, as the message quotes it (the
    list is looked for after it: a name may hold "; available: " too)."""
    said = repr(name)
    at = message.find(said)
    cut = message.find("; available: ", at + len(said) if at >= 0 else 0)
    head = message[:cut] if cut >= 0 else message
    names = sorted((v.name for v in service.catalog.voices() if v.kind is ModelKind.BASE), key=name_order)
    if not names:
        return f"{head}; there are no clone voices: {_ADD_A_CLONE}"
    shown = ", ".join(names[:_SHOWN_CLONES])
    more = f", ... ({len(names)} in all)" if len(names) > _SHOWN_CLONES else ""
    return f"{head}; clone voices: {shown}{more}"
