"""The OpenAPI 3.1 description of the HTTP door, served at ``GET /openapi.json``.

It describes what ``api`` really accepts and returns (schemathesis checks the live
server against it in ``tests/test_openapi.py``): every optional request field may also be
``null`` (the server treats it as absent), unknown fields are ignored, and every error is
OpenAI's shape. Dynamic parts (the ``input`` length limit, whether the API key is
required) come from the running server.

Other modules add their routes with ``add_paths``: ``document`` merges every registered
path item and schema into the description. The voice studio's routes (``studio.py``) are
described here, in ``_studio_paths``, until that module registers its own.
"""

from __future__ import annotations

import copy
from typing import Any

from ... import __version__
from .encoders import FORMATS
from ..limits import MAX_SEED
from .tempo import MAX_SPEED, MIN_SPEED

#: Longest ``instructions`` (shared.MAX_INSTRUCTIONS_CHARS).
_MAX_INSTRUCTIONS = 2000

_ERROR = {"$ref": "#/components/schemas/Error"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or JSON null (the server treats null as absent)."""
    return {"anyOf": [schema, {"type": "null"}]}


def _json(schema: dict[str, Any], description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def _error(description: str, retry: bool = False) -> dict[str, Any]:
    headers = {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}} if retry else None
    return _json(_ERROR, description, headers)


_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "OpenAI's error object.",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string", "examples": ["invalid_request_error", "server_error", "rate_limit_error"]},
                    "param": {"type": ["string", "null"], "description": "The request field at fault."},
                    "code": {"type": ["string", "null"], "description": "Stable machine-readable id."},
                },
            }
        },
    },
    "Voice": {
        "type": "object",
        "required": ["id", "name", "kind", "model", "summary", "languages", "aliases"],
        "properties": {
            "id": {"type": "string"},
            "name": {"type": "string"},
            "kind": {"type": "string", "enum": ["base", "voice_design", "custom_voice"]},
            "model": {"type": "string", "description": "The model name that selects this voice's kind."},
            "summary": {"type": "string"},
            "languages": {"type": "array", "items": {"type": "string"}, "description": "BCP-47 codes."},
            "aliases": {"type": "array", "items": {"type": "string"}},
            "source": {"type": "string", "enum": ["shipped", "user", "clone", "builtin"]},
            "served": {"type": "string", "enum": ["anchor", "designed-live", "clone", "speaker"]},
            "anchor": {"type": "string", "enum": ["ready", "pending", "waiting", "failed", "off"]},
            "unservable": {
                "type": "string",
                "description": (
                    "Present only for a voice that cannot be spoken here: why (its model cannot be served on this "
                    "GPU). Its requests are refused with code model_not_found; Wyoming's info leaves it out, and it is "
                    "never the automatic default voice."
                ),
            },
            "overrides": {
                "type": "boolean",
                "description": "User presets only: it overrides a shipped preset of its name, which deleting it brings back.",
            },
            "shadows": {
                "type": ["string", "null"],
                "enum": ["shipped", "user", "builtin", None],
                "description": (
                    "User presets and clones only: the source of the voice of its name that it takes the place of "
                    "(a user preset over a shipped one; a clone over a preset or speaker), which deleting or renaming "
                    "it brings back; null: none, the name goes with it. The default voice may be deleted or renamed, "
                    "also when chosen with --voice, exactly when this is not null."
                ),
            },
        },
    },
    "VoiceList": {
        "type": "object",
        "required": ["default", "default_pinned", "voices", "voices_folder", "skipped", "default_served"],
        "properties": {
            "default": {"type": ["string", "null"], "description": "null while no voice exists yet"},
            "default_pinned": {
                "type": "boolean",
                "description": (
                    "The default was chosen with --voice: the studio cannot delete or rename it, unless it takes "
                    "the name of another voice (its shadows), which then serves the name"
                ),
            },
            "voices": {"type": "array", "items": {"$ref": "#/components/schemas/Voice"}},
            "voices_folder": {
                "type": ["string", "null"],
                "description": "The voices folder's absolute path on the server, for clips and transcripts copied in; null: none",
            },
            "skipped": {
                "type": "array",
                "description": (
                    "Clips of the voices folder that are no voice (shorter than the minimum, silent, unreadable). "
                    "DELETE /v1/audio/voices/{name} removes one (its clip and transcripts); an upload of its name "
                    "replaces it."
                ),
                "items": {
                    "type": "object",
                    "required": ["name", "file", "reason"],
                    "properties": {
                        "name": {"type": "string", "description": "The voice name it would give."},
                        "file": {"type": "string", "description": "Its file name in the voices folder."},
                        "reason": {"type": "string", "description": "Why it is skipped."},
                    },
                },
            },
            "default_served": {
                "type": "boolean",
                "description": (
                    "False while the --voice default is no longer served (its clip was removed or broken by hand): "
                    "requests naming no voice are refused with code default-voice-gone"
                ),
            },
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/Model"},
            },
        },
    },
    "Status": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string"}},
    },
    "Readiness": {
        "type": "object",
        "required": ["status", "models"],
        "properties": {
            "status": {"type": "string", "enum": ["ready", "not-ready"]},
            "models": {
                "type": "object",
                "additionalProperties": {"type": "string", "enum": ["ready", "loading", "failed"]},
            },
            "reason": {
                "type": "string", "enum": ["loading", "failed", "draining", "busy"],
                "description": "Why new work is not taken (absent when ready).",
            },
            "open_requests": {"type": "integer", "minimum": 0},
            "max_queue": {"type": "integer", "minimum": 1},
        },
    },
}

_HEADERS: dict[str, Any] = {
    "RetryAfter": {
        "description": "Seconds after which a retry may succeed.",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    },
    "SampleRate": {"description": "Sample rate of the audio: 24000.", "schema": {"type": "string"}},
    "Voice": {
        "description": (
            "The voice used (percent-encoded); exactly (designed) when the request named no voice and "
            "its instructions designed one for it alone."
        ),
        "schema": {"type": "string"},
    },
}

#: Path items added by other modules (``add_paths``).
_EXTRA_PATHS: dict[str, Any] = {}
_EXTRA_SCHEMAS: dict[str, Any] = {}


def add_paths(paths: dict[str, Any], schemas: dict[str, Any] | None = None) -> None:
    """Register more path items (OpenAPI ``paths`` entries) and component schemas; later
    ``document`` calls include them. Operations under ``/v1/`` get the API key
    requirement and its 401 answer added, as the server's middleware applies them."""
    _EXTRA_PATHS.update(copy.deepcopy(paths))
    _EXTRA_SCHEMAS.update(copy.deepcopy(schemas or {}))


def _speech_request(max_chars: int) -> dict[str, Any]:
    string = {"type": "string"}
    return {
        "type": "object",
        "required": ["input"],
        "description": "OpenAI's speech request, plus extensions. Unknown fields are ignored.",
        "properties": {
            "input": {
                "type": "string",
                "minLength": 1,
                "maxLength": max_chars,
                "description": "The text (413 above the limit; 400 when nothing speakable remains).",
            },
            "model": _nullable({**string, "description": "tts-1, tts-1-hd, gpt-4o-mini-tts, gpt-4o-mini-tts-2025-12-15, a qwen3-tts-* name, or a checkpoint's hub id or folder name (Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice). Empty or only spaces: as absent (the voice decides)."}),
            "voice": _nullable(
                {
                    "oneOf": [
                        {**string, "description": "A voice name or alias (GET /v1/audio/voices)."},
                        {"type": "object", "required": ["id"], "properties": {"id": string}},
                    ]
                }
            ),
            "instructions": _nullable({**string, "maxLength": _MAX_INSTRUCTIONS}),
            "response_format": _nullable({"type": "string", "enum": list(FORMATS)}),
            "stream_format": _nullable({"type": "string", "enum": ["audio", "sse"]}),
            "stream": _nullable({"type": "boolean", "description": "The serving engines' (vLLM-Omni, sglang-omni, VoxServe, nari-qwen3-tts): accepted; the audio streams either way, raw unless stream_format is sse."}),
            "non_streaming_mode": _nullable({"type": "boolean", "description": "vLLM-Omni's prompt-layout override; accepted, the engine's prompt is the same either way."}),
            "speed": _nullable({"type": "number", "minimum": MIN_SPEED, "maximum": MAX_SPEED}),
            "language": _nullable({**string, "description": "BCP-47 code or Qwen3-TTS language name."}),
            "seed": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_SEED}),
            "reference_voice": _nullable(
                {**string, "pattern": "\\S", "description": "A clone-library voice id."}
            ),
        },
    }


def _speech_operation() -> dict[str, Any]:
    audio = {"schema": {"type": "string", "format": "binary"}}
    content: dict[str, Any] = {fmt.content_type: audio for fmt in FORMATS.values()}
    # Each server-sent event (stream_format sse only): a JSON
    # ``data`` line, ``speech.audio.delta`` with base64 PCM, then ``speech.audio.done``.
    content["text/event-stream"] = {
        "schema": {
            "type": "object",
            "description": "One server-sent event (stream_format sse).",
            "properties": {
                "event": {"type": "string"},
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
            "required": ["data"],
        }
    }
    return {
        "operationId": "createSpeech",
        "summary": "Speak a text (streamed as it is generated; FLAC as a whole file)",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SpeechRequest"}}},
        },
        "responses": {
            "200": {
                "description": "The audio in the requested format.",
                "headers": {
                    "X-Sample-Rate": {"$ref": "#/components/headers/SampleRate"},
                    "X-Voice": {"$ref": "#/components/headers/Voice"},
                },
                "content": content,
            },
            "400": _error("Malformed body, wrong type or value, nothing speakable."),
            "404": _error(
                "Unknown voice (code unknown-voice), reference voice or model (model_not_found); no voice at all yet "
                "(no-voices); a request naming no voice while the --voice default is no longer served "
                "(default-voice-gone); a model, or a voice or instructions whose model, this GPU cannot hold even "
                "alone (model_not_found, param model, voice or instructions: GET /v1/models leaves that model out)."
            ),
            "413": _error("Input over the server's limit, or a body over its size limit."),
            "429": _error("Too many requests open: retry after Retry-After seconds.", retry=True),
            "500": _error("The model failed before any audio."),
            "503": _error("A model is not ready, or the server is stopping.", retry=True),
        },
    }


#: Where docs/api.md describes the WebSocket door (OpenAPI 3.1 has no way to describe a
#: WebSocket's messages).
WEBSOCKET_DOCS = "https://github.com/wyoming-qwen3tts/wyoming-qwen3tts/blob/main/docs/api.md#streamed-text-over-a-websocket"


def _speech_ws_operation() -> dict[str, Any]:
    """``GET /v1/audio/speech/ws``: only its handshake can be described here."""
    return {
        "operationId": "speechWebSocket",
        "summary": "Streamed text in, PCM out, over a WebSocket (subprotocol nari.speech.v1)",
        "description": (
            "A WebSocket endpoint for voice agents: the text comes as it is written (input_text.append "
            "deltas), speech starts at the first clause, audio returns as binary messages of 24 kHz "
            "16-bit mono PCM. OpenAPI cannot describe WebSocket messages; this entry covers only the "
            "HTTP handshake (an Upgrade request offering the subprotocol nari.speech.v1, answered 101). "
            f"The messages, errors and limits are in the API documentation: {WEBSOCKET_DOCS}"
        ),
        "externalDocs": {"description": "The WebSocket protocol", "url": WEBSOCKET_DOCS},
        "responses": {
            "101": {"description": "Switching Protocols: the WebSocket session begins."},
            "400": _error("Not a WebSocket handshake (code websocket-required), or one offering only other subprotocols (code subprotocol-required)."),
        },
    }


def _get(operation_id: str, summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"operationId": operation_id, "summary": summary, "responses": responses}}


def _wav(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {"X-Voice": {"$ref": "#/components/headers/Voice"}},
        "content": {"audio/wav": {"schema": {"type": "string", "format": "binary"}}},
    }


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _studio_paths() -> dict[str, Any]:
    """The voice studio's routes (``studio.add_routes``): voice management and design."""
    voice = {"$ref": "#/components/schemas/Voice"}
    name = {"in": "path", "required": True, "schema": {"type": "string"}}
    edits = {
        "400": _error("Bad name, transcript or clip."),
        "403": _error("A shipped preset or built-in speaker cannot be changed."),
        "404": _error("No such voice."),
        "409": _error(
            "Name taken or busy (name-taken says how: \"replace\": true to keep a design under a shipped "
            "preset's name, another name for a clone, or the skipped clip of that name), the default voice, other files of the voice's name (duplicate-files), "
            "presets.toml unreadable, no voices folder, or the model is off."
        ),
        "500": _error("The voices folder could not be written."),
    }
    return {
        "/": _get(
            "studioPage", "The voice studio page (HTML; needs no key)",
            {"200": {"description": "The page.", "content": {"text/html": {"schema": {"type": "string"}}}}},
        ),
        "/v1/audio/voices": {
            "post": {
                "operationId": "createCloneVoice",
                "summary": "A clone voice from an uploaded clip (the first 20 s are used); it replaces a clip of that name the server skips",
                "requestBody": {
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["name", "file"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "file": {"type": "string", "format": "binary", "description": "Any format FFmpeg reads, at most 20 MB."},
                                    "transcript": {"type": "string"},
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "201": _json(voice, "The new voice."),
                    **edits,
                    "413": _error("The request body, or the clip in it, is over 20 MB."),
                },
            }
        },
        "/v1/audio/voices/{voice}/sample": {
            "get": {
                "operationId": "voiceSample",
                "summary": "The clip a voice speaks from, as WAV",
                "parameters": [{"name": "voice", **name}],
                "responses": {
                    "200": _wav("A clone's reference, or a preset's anchor."),
                    "404": _error("No such voice, or it speaks from no clip."),
                    "500": _error("The preset's anchor could not be rendered."),
                },
            }
        },
        "/v1/audio/voices/{voice}": {
            "patch": {
                "operationId": "renameVoice",
                "summary": "Rename a clone voice or user preset",
                "parameters": [{"name": "voice", **name}],
                "requestBody": _json_body(
                    {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
                ),
                "responses": {"200": _json(voice, "The renamed voice."), **edits},
            },
            "delete": {
                "operationId": "deleteVoice",
                "summary": (
                    "Delete a clone voice (every file of its name) or user preset (a shipped one it overrode comes "
                    "back), or a skipped clip (the listing's skipped: its clip and transcripts)"
                ),
                "parameters": [
                    {"name": "voice", **name},
                    {
                        "name": "skipped",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "boolean"},
                        "description": (
                            "Delete the skipped clip of this name even where a preset or speaker serves the name "
                            "(the voice stays); without it, a name that is no voice deletes its skipped clip."
                        ),
                    },
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["deleted"],
                            "properties": {
                                "deleted": {"type": "string"},
                                "skipped": {"type": "string", "description": "The skipped clip's file, when one was deleted."},
                                "files": {
                                    "type": "array", "items": {"type": "string"},
                                    "description": "Every file removed, sorted (the skipped clips of the name, their "
                                                   "transcripts, an orphan transcript), when a skipped clip was deleted.",
                                },
                            },
                        },
                        "The deleted voice's name (and files, for a skipped clip).",
                    ),
                    **edits,
                },
            },
        },
        "/v1/audio/designs": {
            "post": {
                "operationId": "createDesign",
                "summary": "VoiceDesign candidates for a description, each with its own seed",
                "requestBody": _json_body(
                    {
                        "type": "object",
                        "required": ["description", "language"],
                        "properties": {
                            "description": {"type": "string", "maxLength": _MAX_INSTRUCTIONS},
                            "language": {"type": "string"},
                            "text": _nullable({"type": "string"}),
                            "count": {"type": "integer", "minimum": 1, "maximum": 4},
                            "seed": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_SEED - 4}),
                        },
                    }
                ),
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["description", "language", "text", "candidates"],
                            "properties": {
                                "description": {"type": "string"},
                                "language": {"type": "string"},
                                "text": {"type": "string"},
                                "candidates": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["id", "seed", "seconds", "sample"],
                                        "properties": {
                                            "id": {"type": "string"},
                                            "seed": {"type": "integer"},
                                            "seconds": {"type": "number"},
                                            "sample": {
                                                "type": "string",
                                                "description": "The clip's URL relative to the server's root (v1/audio/designs/{id}/sample).",
                                            },
                                        },
                                    },
                                },
                            },
                        },
                        "The candidates (keep one with .../keep).",
                    ),
                    "400": _error("Missing or bad field."),
                    "409": _error("The VoiceDesign model is off."),
                    "500": _error("Designing failed."),
                },
            }
        },
        "/v1/audio/designs/{candidate}/sample": {
            "get": {
                "operationId": "designSample",
                "summary": "A design candidate's clip, as WAV",
                "parameters": [{"name": "candidate", **name}],
                "responses": {"200": _wav("The clip."), "404": _error("No such candidate (they are kept until a restart).")},
            }
        },
        "/v1/audio/designs/{candidate}/keep": {
            "post": {
                "operationId": "keepDesign",
                "summary": "Keep a candidate as a preset whose anchor is its clip",
                "parameters": [{"name": "candidate", **name}],
                "requestBody": _json_body(
                    {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string"},
                            "summary": _nullable({"type": "string"}),
                            "replace": {"type": "boolean"},
                        },
                    }
                ),
                "responses": {"201": _json(voice, "The new preset."), **edits},
            }
        },
    }


def document(max_chars: int, api_key: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 description of this server.

    Args:
        max_chars: the server's ``--max-chars`` (``input``'s ``maxLength``).
        api_key: True when ``/v1/*`` requires ``Authorization: Bearer <key>``.
    """
    paths: dict[str, Any] = {
        "/v1/audio/speech": {"post": _speech_operation()},
        "/v1/audio/speech/ws": {"get": _speech_ws_operation()},
        "/v1/audio/voices": _get(
            "listVoices", "The voice catalogue",
            {"200": _json({"$ref": "#/components/schemas/VoiceList"}, "Every voice, by name.")},
        ),
        "/v1/models": _get(
            "listModels", "OpenAI's model list",
            {"200": _json(
                {"$ref": "#/components/schemas/ModelList"},
                "Generic names, and those of the loaded models a request can use (not one the GPU cannot hold).",
            )},
        ),
        "/v1/models/{model}": {
            "get": {
                "operationId": "retrieveModel",
                "summary": "One model of OpenAI's model list",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {
                    "200": _json({"$ref": "#/components/schemas/Model"}, "The model."),
                    "404": _error("No such model on this server."),
                },
            }
        },
        "/health": _get(
            "health", "Liveness",
            {"200": _json({"$ref": "#/components/schemas/Status"}, "The process serves.")},
        ),
        "/ready": _get(
            "ready", "Readiness (a load balancer's health check): models warmed up, not shutting down, under the queue limit",
            {
                "200": _json({"$ref": "#/components/schemas/Readiness"}, "Ready."),
                "503": _json(
                    {"$ref": "#/components/schemas/Readiness"},
                    "A model is loading or failed, a shutdown began, or --max-queue requests are open.",
                ),
            },
        ),
        "/metrics": _get(
            "metrics", "Prometheus metrics",
            {"200": {"description": "Text exposition format.", "content": {"text/plain": {"schema": {"type": "string"}}}}},
        ),
        "/openapi.json": _get(
            "openapi", "This description",
            {"200": _json({"type": "object"}, "OpenAPI 3.1.")},
        ),
    }
    for path, item in _studio_paths().items():
        paths.setdefault(path, {}).update(item)
    paths.update(copy.deepcopy(_EXTRA_PATHS))
    for path, item in paths.items():
        for operation in item.values():
            if "requestBody" in operation:  # shared.watch_body
                operation["responses"].setdefault(
                    "408", _error("The request body stopped arriving for --idle-timeout seconds; the connection is closed.")
                )
        if not path.startswith("/v1/"):
            continue
        for operation in item.values():
            if api_key:
                operation["security"] = [{"bearerAuth": []}]
                operation["responses"].setdefault("401", _error("Missing or wrong API key."))
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "wyoming-qwen3tts",
            "version": __version__,
            "description": "OpenAI-compatible text-to-speech for Qwen3-TTS.",
        },
        "paths": paths,
        "components": {
            "schemas": {**copy.deepcopy(_SCHEMAS), "SpeechRequest": _speech_request(max_chars), **copy.deepcopy(_EXTRA_SCHEMAS)},
            "headers": copy.deepcopy(_HEADERS),
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }
    return doc
