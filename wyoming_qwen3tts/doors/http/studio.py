"""The voice studio on the HTTP port: voice-management routes and the web page.

Routes (``/v1/*`` under the HTTP door's API-key rules; every error is OpenAI's JSON):

* ``GET /v1/audio/voices/{id}/sample``: the clip a voice speaks from, as WAV: a clone's
  reference (the first 20 s), a preset's anchor (rendered first if missing).
* ``POST /v1/audio/voices``: a clone voice from an uploaded clip. ``multipart/form-data``
  with ``name``, ``file`` (any format FFmpeg reads, at most 20 MB; the first 20 s are
  used) and an optional ``transcript``.
* ``PATCH /v1/audio/voices/{id}`` ``{"name": new}``: rename a clone voice or user preset.
* ``DELETE /v1/audio/voices/{id}``: delete one (shipped presets and built-in speakers
  cannot be deleted; the default voice neither), or the files of a clip the server skips
  (too short, silent, unreadable, a format it does not read, or its name: another clip gives
  it, control characters in it; the listing's ``skipped``). An upload of a skipped clip's
  name replaces it.
* ``POST /v1/audio/designs`` ``{"description", "language", "text"?, "count"?, "seed"?}``:
  VoiceDesign candidates, each with its own seed, rendered exactly as an anchor would be.
  ``GET /v1/audio/designs/{id}/sample`` plays one; ``POST /v1/audio/designs/{id}/keep``
  ``{"name", "summary"?, "replace"?}`` keeps it as a preset whose anchor is that clip.
* ``GET /``: the page (``web/``), plain HTML, CSS and JavaScript with relative URLs, so
  that it works under Home Assistant ingress's path prefix. It needs no key; its calls
  to ``/v1`` do, except through ingress from ``ingress_peer`` (Home Assistant has then
  authenticated the user).

The routes talk to the service only; the voices folder is written by ``library``.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import random
import re
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import numpy as np
from aiohttp import BodyPartReader, web

from ...service.anchors import AnchorSpec, anchor_text, preset_spec
from ...common.audio import SAMPLE_RATE
from .shared import MAX_INSTRUCTIONS_CHARS, ApiError, read_json
from .shared import voice_json as _listed_json
from ...text.languages import AUTO, QWEN_LANGUAGES, UnsupportedLanguageError, to_qwen
from ...catalogue.library import (
    MAX_UPLOAD_BYTES,
    DeletedSkipped,
    VoiceEditError,
    VoiceLibrary,
    check_transcript,
    decode_clip,
    overrides_shipped,
    too_large,
    wav_bytes,
)
from ...service.errors import GenerationError, VoiceNotFoundError
from ...service.speech import TtsService
from ...text.segmenter import clean_text, estimated_seconds
from ...catalogue.voices import MAX_PRESET_SEED, MAX_TRANSCRIPT_BYTES, TranscriptError, Voice, VoiceSource, decode_transcript
from ...common.vocabulary import ModelKind

_LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The page's files, served from the package.
WEB_DIR = Path(__file__).parent / "web"
#: Candidates per design request: default and most.
DEFAULT_CANDIDATES, MAX_CANDIDATES = 3, 4
#: Longest candidate text, in estimated seconds of speech: a candidate becomes an anchor,
#: which is at most ``anchors.ANCHOR_MAX_FRAMES`` (10 s) long.
MAX_DESIGN_SECONDS = 10.0
#: Design candidates kept for ``keep``, most recent first; older ones are forgotten.
KEPT_CANDIDATES = 32
#: Home Assistant's ingress proxy (the Supervisor) connects from this address.
HA_INGRESS_PEER = "172.30.32.2"
_INGRESS_PATH_RE = re.compile(r"/[A-Za-z0-9_./-]*")
_LIBRARY_KEY = web.AppKey("studio_library", VoiceLibrary)
_CANDIDATES_KEY = web.AppKey("studio_candidates", OrderedDict)
_SERVICE_KEY = web.AppKey("studio_service", TtsService)
#: One studio edit at a time on this server (``_edit``).
_EDITS_KEY = web.AppKey("studio_edits", asyncio.Lock)
#: How the log names a voice of each source.
_WHAT = {
    VoiceSource.SHIPPED: "shipped preset", VoiceSource.USER: "preset",
    VoiceSource.BUILTIN: "CustomVoice speaker", VoiceSource.CLONE: "clone voice",
}


@dataclass(frozen=True)
class Candidate:
    """One design candidate: its clip and the spec it was rendered from.

    Attributes:
        id: random token naming it in URLs.
        spec: the anchor spec (its ``model`` is the VoiceDesign identity, or "" if the
            server keeps no anchors).
        code: BCP-47 language code of the design.
        audio: float32 [n_samples] at 24 kHz.
    """

    id: str
    spec: AnchorSpec
    code: str
    audio: np.ndarray


# --- page and ingress -------------------------------------------------------------------


def is_page(path: str) -> bool:
    """True for the page's own paths, which never need the API key."""
    return path == "/" or path.startswith("/studio/")


def from_ingress(request: web.Request, ingress_peer: str | None) -> bool:
    """True when Home Assistant's ingress proxy sent the request (it has authenticated the
    user): an ``X-Ingress-Path`` header from the trusted proxy address."""
    return bool(ingress_peer) and "X-Ingress-Path" in request.headers and request.remote == ingress_peer


async def page(request: web.Request) -> web.Response:
    """``GET /``: the studio page. Under ingress (an ``X-Ingress-Path`` header) a ``<base>``
    element points its relative URLs at the ingress path."""
    text = (WEB_DIR / "index.html").read_text("utf-8")
    prefix = request.headers.get("X-Ingress-Path", "")
    if prefix and _INGRESS_PATH_RE.fullmatch(prefix) and ".." not in prefix:
        base = f'<base href="{html.escape(prefix.rstrip("/") + "/", quote=True)}">'
        text = text.replace("<head>", "<head>\n    " + base, 1)
    return web.Response(text=text, content_type="text/html", headers={"Cache-Control": "no-cache"})


# --- helpers ----------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _edits(handler: Handler) -> Handler:
    """Turn ``VoiceEditError`` into the HTTP door's OpenAI-shaped error."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except VoiceEditError as err:
            raise ApiError(err.status, str(err), err.code, err.param) from None

    wrapped.__doc__ = handler.__doc__
    return wrapped


async def _edit(request: web.Request, change: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``change(*args, **kwargs)``, a ``VoiceLibrary`` edit, on a worker thread, one at a time.

    An edit holds the voices folder's lock, which another server on the folder may keep for
    up to ``library.LOCK_TIMEOUT_S`` (10 s), and re-reads the catalogue under it: on the event
    loop that held every stream's audio and every other request for as long.

    Raises:
        VoiceEditError: what ``change`` raises.
    """
    async with request.app[_EDITS_KEY]:
        return await asyncio.to_thread(change, *args, **kwargs)


async def _json_body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object", "invalid-json")
    return body


def _string(body: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise ApiError(400, f"'{name}' is required", "missing-field", name)
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string", "invalid-type", name)
    return value.strip()


def listed_voice(service: TtsService, voice: Voice) -> dict[str, Any]:
    """A voice as ``GET /v1/audio/voices`` lists it: ``shared.voice_json``, how it is
    served (``TtsService.voice_info``) and, for the user's voices (a user preset or a clone):

    * ``shadows``: the source ("shipped", "user", "builtin") of the voice of its name that
      it takes the place of (``VoiceCatalog.beneath``), which deleting or renaming it brings
      back; None when there is none. The studio may delete or rename an explicit default
      voice (``--voice``) exactly when this is not None: the name stays served.
    * ``overrides`` (user presets only): whether it overrides a shipped preset of its name.
    """
    listed = {**_listed_json(voice), **service.voice_info(voice)}
    if voice.source in (VoiceSource.USER, VoiceSource.CLONE):
        under = service.catalog.beneath(voice)
        listed["shadows"] = under.source.value if under is not None else None
    if voice.source is VoiceSource.USER:
        listed["overrides"] = overrides_shipped(service.catalog, voice)
    return listed


def listed_skipped(service: TtsService) -> list[dict[str, str]]:
    """The clips of the voices folder that are no voice (``VoiceCatalog.skipped``: unusable,
    or skipped for their name, such as ``kim.mp3`` beside the ``kim.wav`` spoken), as
    ``GET /v1/audio/voices`` lists them under ``skipped``: ``{"name", "file", "reason"}``
    each, by file name. ``DELETE /v1/audio/voices/{name}?skipped=true`` removes those of a
    name (never the files of a voice spoken); an upload of its name replaces an unusable one."""
    return [{"name": c.name, "file": c.file, "reason": c.reason} for c in service.catalog.skipped()]


def _wav_response(audio: np.ndarray, sample_rate: int, name: str) -> web.Response:
    return web.Response(
        body=wav_bytes(audio, sample_rate),
        content_type="audio/wav",
        headers={
            "Cache-Control": "no-cache",
            "X-Voice": quote(name, safe=""),
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(name, safe='')}.wav",
        },
    )


def _voice(service: TtsService, name: str) -> Voice:
    try:
        return service.resolve_voice(name)
    except VoiceNotFoundError as err:
        raise ApiError(404, str(err), err.code, "voice") from None


# --- voices -----------------------------------------------------------------------------


async def sample(request: web.Request) -> web.Response:
    """``GET /v1/audio/voices/{id}/sample``: WAV of the clip the voice speaks from."""
    service = request.app[_SERVICE_KEY]
    await service.catalog.refresh_async()
    voice = _voice(service, request.match_info["voice"])
    if voice.reference is not None:
        return _wav_response(voice.reference.audio, voice.reference.sample_rate, voice.name)
    if voice.kind is ModelKind.VOICE_DESIGN:
        if service.anchors is None:
            message = f"{voice.name!r} is designed live for every sentence (anchors are off): it has no clip"
            raise ApiError(404, message, "no-sample", "voice")
        try:
            reference = await service.anchors.wait(voice)
        except LookupError as err:
            raise ApiError(404, str(err), "no-sample", "voice") from None
        except RuntimeError as err:
            raise ApiError(500, str(err), "anchor-failed", kind="server_error") from None
        return _wav_response(reference.audio, reference.sample_rate, voice.name)
    message = f"{voice.name!r} is a built-in CustomVoice speaker: it speaks from no clip; try it with /v1/audio/speech"
    raise ApiError(404, message, "no-sample", "voice")


@_edits
async def create_clone(request: web.Request) -> web.Response:
    """``POST /v1/audio/voices`` (multipart ``name``, ``file``, ``transcript``): 201 and the
    new voice."""
    service, library = request.app[_SERVICE_KEY], request.app[_LIBRARY_KEY]
    if ModelKind.BASE not in service.kinds:
        message = "The cloning (Base) model is off on this server: clone voices cannot be spoken"
        raise VoiceEditError(409, "model-not-loaded", message)
    if request.content_type != "multipart/form-data":
        message = "Send multipart/form-data with the fields name, file and (optional) transcript"
        raise ApiError(400, message, "invalid-body")
    try:
        reader = await request.multipart()  # reads the header's boundary, none of the body
    except (LookupError, ValueError) as err:  # no boundary, or one over 70 characters
        message = (
            f"The Content-Type has no usable multipart boundary ({err}); "
            "send the form as a multipart client does (curl -F, a browser's FormData)"
        )
        raise ApiError(400, message, "invalid-body") from None
    _check_body_size(request.content_length)
    with contextlib.ExitStack() as held:
        name: str | None = None
        transcript: str | None = None
        data: bytes | None = None
        filename = ""
        seen: set[str] = set()
        try:
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name in ("name", "transcript", "file"):
                    if part.name in seen:  # which one was meant is not known: neither is taken
                        message = f"The form has more than one {part.name!r} field; send it once"
                        raise ApiError(400, message, "duplicate-field", part.name)
                    seen.add(part.name)
                if part.name == "name":
                    # a skipped clip of the name (too short, silent, unreadable) is replaced
                    name = held.enter_context(library.reserve(await part.text(), replace_skipped=True))
                elif part.name == "transcript":
                    transcript = check_transcript(await _transcript_text(part))
                elif part.name == "file":
                    filename = part.filename or ""
                    data = await _read_limited(part)
        except (ValueError, AssertionError, UnicodeDecodeError, LookupError) as err:  # malformed form
            raise ApiError(400, f"The form cannot be read: {err}", "invalid-body") from None
        if name is None:
            raise ApiError(400, "The form has no 'name' field", "missing-field", "name")
        if not data:
            raise ApiError(400, "The form has no 'file' field, or the file is empty", "missing-field", "file")
        audio = await asyncio.to_thread(decode_clip, data, transcript is not None)
        voice = await _edit(request, library.add_clone, name, audio, transcript)
    _LOGGER.info(
        "Voice studio: clone voice %s created from %s (%.1f s used, %s)",
        voice.name, filename or "an upload", len(audio) / SAMPLE_RATE,
        "with transcript" if transcript else "no transcript: x-vector only",
    )
    return web.json_response(listed_voice(service, voice), status=201)


def _check_body_size(size: int | None) -> None:
    """Refuse a clip upload whose whole body (its ``Content-Length``, ``size`` bytes; None
    when not announced) is over ``MAX_UPLOAD_BYTES`` and the form's room, before reading it.
    Whether such a body is a valid form is not known without reading it, so the message
    speaks of the body, not of the clip.

    Raises:
        VoiceEditError: 413 ``clip-too-large``.
    """
    if size is not None and size > MAX_UPLOAD_BYTES + (64 << 10):
        limit = MAX_UPLOAD_BYTES // 1_000_000
        message = f"The request body is over the {limit} MB limit ({size:,} bytes): a clip upload must be under {limit} MB"
        raise VoiceEditError(413, "clip-too-large", message, "file")


async def _read_limited(part: BodyPartReader) -> bytes:
    data = bytearray()
    while chunk := await part.read_chunk(1 << 16):
        data += chunk
        if len(data) > MAX_UPLOAD_BYTES:
            raise too_large(len(data))
    return bytes(data)


async def _transcript_text(part: BodyPartReader) -> str:
    """A form's ``transcript`` part as text: in the charset its header names, else decoded as
    the voices folder reads a transcript file (``voices.decode_transcript``: UTF-8, its BOM
    dropped, or UTF-16/32 with a BOM, Windows Notepad's "Unicode"), so a file attached as the
    transcript reads as it would in the folder.

    Raises:
        ApiError: 400 ``invalid-transcript`` (another encoding, or too long).
    """
    if part.get_charset(default=""):
        return await part.text()
    data = await part.read_chunk(MAX_TRANSCRIPT_BYTES + 1)
    while len(data) <= MAX_TRANSCRIPT_BYTES and (more := await part.read_chunk(MAX_TRANSCRIPT_BYTES + 1)):
        data += more
    try:
        return decode_transcript(data, part.filename or "transcript")
    except TranscriptError as err:
        said = str(err).removeprefix(f"its transcript {err.file} ")
        raise ApiError(400, f"The transcript {said}", "invalid-transcript", "transcript") from None


@_edits
async def rename(request: web.Request) -> web.Response:
    """``PATCH /v1/audio/voices/{id}`` ``{"name": new}``: the renamed voice."""
    service, library = request.app[_SERVICE_KEY], request.app[_LIBRARY_KEY]
    old = request.match_info["voice"]
    body = await _json_body(request)
    if "name" not in body:
        raise ApiError(400, "The body has no 'name' field: the voice's new name", "missing-field", "name")
    new = body.get("name")
    voice = await _edit(request, library.rename, old, new)
    if service.anchors is not None:
        service.anchors.changed()
    _LOGGER.info("Voice studio: %s renamed to %s", old, voice.name)
    return web.json_response(listed_voice(service, voice))


@_edits
async def delete(request: web.Request) -> web.Response:
    """``DELETE /v1/audio/voices/{id}``: ``{"deleted": name}``. Deleting a voice that took
    another's name (a user preset over a shipped one, a clone over a preset or speaker: the
    listing's ``shadows``; the default voice's too) brings that one back.

    A name that is no voice but a skipped clip's (the listing's ``skipped``) deletes that
    clip and its transcripts: ``{"deleted": name, "skipped": file, "files": [removed...]}``:
    ``skipped`` is the clip that would give the voice (else the first of the name), ``files``
    every file removed, sorted (twins skipped for the name, transcripts). ``?skipped=true``
    deletes the skipped clips of a name that a voice serves (the voice and its files stay:
    a preset, a speaker, or a clone whose clip is preferred to the skipped one)."""
    service, library = request.app[_SERVICE_KEY], request.app[_LIBRARY_KEY]
    only_skipped = request.query.get("skipped", "").lower() in ("1", "true", "yes")
    gone = await _edit(request, library.delete, request.match_info["voice"], only_skipped)
    if isinstance(gone, DeletedSkipped):
        return web.json_response({"deleted": gone.name, "skipped": gone.file, "files": list(gone.files)})
    voice = gone
    back = service.catalog.find(voice.name)  # the voice it took the name of, if any
    if back is not None and back.kind is ModelKind.VOICE_DESIGN and service.anchors is not None:
        service.anchors.changed()  # the preset's anchor, if it has none yet
    restored = f"; the {_WHAT[back.source]} {back.name} is back" if back is not None else ""
    _LOGGER.info("Voice studio: %s voice %s deleted%s", voice.source.value, voice.name, restored)
    return web.json_response({"deleted": voice.name})


# --- design -----------------------------------------------------------------------------


async def design(request: web.Request) -> web.Response:
    """``POST /v1/audio/designs``: render candidates, return their ids and seeds."""
    service = request.app[_SERVICE_KEY]
    if ModelKind.VOICE_DESIGN not in service.kinds:
        raise ApiError(409, "The VoiceDesign model is off on this server", "model-not-loaded")
    body = await _json_body(request)
    description = _string(body, "description", required=True)
    assert description is not None
    if len(description) > MAX_INSTRUCTIONS_CHARS:
        message = f"'description' is over {MAX_INSTRUCTIONS_CHARS} characters"
        raise ApiError(400, message, "invalid-value", "description")
    language_in = _string(body, "language", required=True)
    try:
        language = to_qwen(language_in)
    except UnsupportedLanguageError as err:
        raise ApiError(400, str(err), "unsupported-language", "language") from None
    if language == AUTO:
        raise ApiError(400, "Pick the language the voice speaks, not 'auto'", "invalid-value", "language")
    code = next(c for c, q in QWEN_LANGUAGES.items() if q == language)
    text = clean_text(_string(body, "text") or anchor_text(language))
    if not text:
        raise ApiError(400, "'text' has nothing speakable", "empty-text", "text")
    if estimated_seconds(text) > MAX_DESIGN_SECONDS:
        message = f"'text' is too long for a clip of at most {MAX_DESIGN_SECONDS:.0f} s; use one or two short sentences"
        raise ApiError(400, message, "text-too-long", "text")
    count = body.get("count", DEFAULT_CANDIDATES)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_CANDIDATES:
        code = "invalid-value" if isinstance(count, int) and not isinstance(count, bool) else "invalid-type"
        raise ApiError(400, f"'count' must be an integer from 1 to {MAX_CANDIDATES}", code, "count")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_PRESET_SEED - MAX_CANDIDATES):
        code = "invalid-value" if isinstance(seed, int) and not isinstance(seed, bool) else "invalid-type"
        raise ApiError(400, f"'seed' must be an integer from 0 to {MAX_PRESET_SEED - MAX_CANDIDATES}", code, "seed")
    first = seed if seed is not None else random.randrange(MAX_PRESET_SEED - MAX_CANDIDATES)
    model = ""  # no anchors: a kept candidate's preset is designed live
    if service.anchors is not None:
        with contextlib.suppress(RuntimeError):
            model = await service.anchors.wait_identity()
    specs = [AnchorSpec(description, language, first + i, text, model) for i in range(count)]
    try:
        clips = await asyncio.gather(*(service.render_design(spec) for spec in specs))
    except GenerationError as err:
        raise ApiError(500, f"Designing failed: {err}", "generation-failed", kind="server_error") from None
    kept = request.app[_CANDIDATES_KEY]
    answer = []
    for spec, audio in zip(specs, clips, strict=True):
        candidate = Candidate(secrets.token_urlsafe(12), spec, code, audio)
        kept[candidate.id] = candidate
        answer.append(
            {
                "id": candidate.id,
                "seed": spec.seed,
                "seconds": round(len(audio) / SAMPLE_RATE, 2),
                "sample": f"v1/audio/designs/{candidate.id}/sample",
            }
        )
    while len(kept) > KEPT_CANDIDATES:
        kept.popitem(last=False)
    _LOGGER.info("Voice studio: %d design candidate(s) for %r (%s)", count, description[:60], code)
    return web.json_response(
        {"description": description, "language": code, "text": text, "candidates": answer}
    )


def _candidate(request: web.Request) -> Candidate:
    candidate = request.app[_CANDIDATES_KEY].get(request.match_info["candidate"])
    if candidate is None:
        message = "No such design candidate (the server keeps the latest ones until it restarts); design again"
        raise ApiError(404, message, "unknown-candidate", "candidate")
    assert isinstance(candidate, Candidate)
    return candidate


async def candidate_sample(request: web.Request) -> web.Response:
    """``GET /v1/audio/designs/{id}/sample``: the candidate's clip as WAV."""
    candidate = _candidate(request)
    return _wav_response(candidate.audio, SAMPLE_RATE, f"candidate-{candidate.spec.seed}")


@_edits
async def keep(request: web.Request) -> web.Response:
    """``POST /v1/audio/designs/{id}/keep`` ``{"name", "summary"?, "replace"?}``: 201 and
    the new preset, whose anchor is the candidate's clip."""
    service, library = request.app[_SERVICE_KEY], request.app[_LIBRARY_KEY]
    candidate = _candidate(request)
    body = await _json_body(request)
    summary = _string(body, "summary") or candidate.spec.instruct
    if len(summary) > 200:
        summary = summary[:199].rstrip() + "…"
    replace = body.get("replace", False)
    if not isinstance(replace, bool):
        raise ApiError(400, "'replace' must be true or false", "invalid-type", "replace")
    with library.reserve(body.get("name"), replace_shipped=replace) as name:
        spec = candidate.spec
        voice = await _edit(
            request, library.add_preset, name, instruct=spec.instruct, language=candidate.code, summary=summary,
            seed=spec.seed, anchor_text=spec.text,
        )
    anchors = service.anchors
    if anchors is not None and anchors.identity:
        stored = preset_spec(voice, anchors.identity)
        if stored == spec:
            try:
                anchors.adopt(stored, candidate.audio, voice.name)
            except OSError as err:
                _LOGGER.error("Cannot store the anchor of %s (%s); it will be rendered again", voice.name, err)
        else:
            _LOGGER.warning("Preset %s does not match its candidate; its anchor will be rendered", voice.name)
        anchors.changed()
    _LOGGER.info("Voice studio: design candidate (seed %d) kept as preset %s", spec.seed, voice.name)
    return web.json_response(listed_voice(service, voice), status=201)


# --- wiring -----------------------------------------------------------------------------


def add_routes(app: web.Application, service: TtsService) -> None:
    """Register the studio's routes and page on the HTTP door's application."""
    app[_SERVICE_KEY] = service
    # Read at each edit: only an explicit default (--voice) is protected; an automatic one
    # may go, and the next request picks another (TtsService.default_voice).
    app[_LIBRARY_KEY] = VoiceLibrary(service.catalog, lambda: service.pinned_default)
    app[_CANDIDATES_KEY] = OrderedDict()
    app[_EDITS_KEY] = asyncio.Lock()
    app.router.add_get("/", page)
    app.router.add_static("/studio/", WEB_DIR, append_version=False)
    app.router.add_post("/v1/audio/voices", create_clone)
    app.router.add_get("/v1/audio/voices/{voice}/sample", sample)
    app.router.add_patch("/v1/audio/voices/{voice}", rename)
    app.router.add_delete("/v1/audio/voices/{voice}", delete)
    app.router.add_post("/v1/audio/designs", design)
    app.router.add_get("/v1/audio/designs/{candidate}/sample", candidate_sample)
    app.router.add_post("/v1/audio/designs/{candidate}/keep", keep)
