"""The ``nari.speech.v1`` WebSocket protocol's messages: client events parsed and checked,
server events built. Nothing here does I/O (``websocket`` runs the sessions).

The protocol is the one of nari-labs/nari-qwen3-tts (``docs/websocket.md``) as the public
benchmark harness nari-labs/benchmarks (``tts_bench``, its ``--transport websocket``) speaks
it; this module was written from reading both, not copied. One request per connection:

1. The client opens the WebSocket offering the subprotocol ``nari.speech.v1``; the server
   sends ``session.created`` {protocol, audio}.
2. Client ``request.start`` {model?, voice?, language?, speed?, seed?, instructions?,
   reference_voice?, response_format?: "pcm"}; server ``request.configured``
   {request_id, voice, language, audio}.
3. Client ``input_text.append`` {sequence, text}, any number; each gets ``input_text.ack``
   {event: "input_text.append", sequence, request_id}.
4. Client ``input_text.end`` {sequence}; server ``input_text.ack`` {event: "input_text.end",
   sequence, request_id}. (Or client ``response.cancel``: the response ends "cancelled".)
5. Meanwhile, as speech is generated: ``response.started`` {request_id, audio} once, just
   before the first binary message; binary messages of PCM (signed 16-bit little-endian,
   24 kHz, mono); after the last, ``response.done`` {request_id, stop_reason: "stop" or
   "cancelled", audio_chunks, audio_samples}; then the server closes the WebSocket (1000).
6. Anywhere: ``error`` {request_id, error: {message, type, param, code}}.

``audio`` is always ``{"encoding": "pcm_s16le", "sample_rate": 24000, "channels": 1}``
(the harness compares it with exactly that object). ``audio_chunks`` counts the binary
messages of the response. Sequences count from 0 over the appends and the end together
(the harness sends appends 0..n-1, then the end with n); a client may leave them out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ...common.audio import SAMPLE_RATE
from .shared import error_body
from ...service.errors import RequestError
from ...text.writing import replace_lone_surrogates

#: The WebSocket subprotocol a client must offer (``Sec-WebSocket-Protocol``).
PROTOCOL = "nari.speech.v1"
#: A browser cannot set headers on a WebSocket: it may offer the API key as a second
#: subprotocol, ``openai-insecure-api-key.<key>`` (the form OpenAI's Realtime API takes from
#: browsers), beside ``PROTOCOL``, which the server selects. "Insecure": the key is in the
#: handshake as a header would be, and readable by the page's script.
KEY_PROTOCOL_PREFIX = "openai-insecure-api-key."


def offered_subprotocols(values: list[str]) -> list[str]:
    """The subprotocols a handshake offers, in order: ``values`` are its
    ``Sec-WebSocket-Protocol`` header values (each a comma-separated list, RFC 6455 4.1)."""
    return [token.strip() for value in values for token in value.split(",") if token.strip()]


#: An HTTP token (RFC 9110 5.6.2, ``tchar``): all a subprotocol may hold (RFC 6455 4.1).
_TOKEN_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def browser_can_offer_key(key: str) -> bool:
    """True when a browser can offer ``key`` in the ``KEY_PROTOCOL_PREFIX`` subprotocol: it
    holds only token characters (RFC 9110 ``tchar``). A base64 key's ``/`` or ``=`` makes
    the browser's ``new WebSocket(url, protocols)`` throw ``SyntaxError`` before connecting."""
    return _TOKEN_RE.fullmatch(key) is not None


def header_safe_key(key: str) -> bool:
    """True when ``key`` can travel as ``Authorization: Bearer <key>`` from any client:
    printable ASCII (U+0020-U+007E), not empty, and no space at either end (the server strips
    the header's token). The openai SDK (httpx) refuses other characters in a header, and a
    browser's ``fetch`` throws for characters beyond ISO-8859-1."""
    return bool(key) and key == key.strip() and all(" " <= c <= "~" for c in key)


#: Where the door listens, on the HTTP port (where the harness looks for it).
PATH = "/v1/audio/speech/ws"
#: The audio format of every binary message, as ``session.created`` and
#: ``response.started`` announce it.
AUDIO = {"encoding": "pcm_s16le", "sample_rate": SAMPLE_RATE, "channels": 1}
#: Client event types.
START, APPEND, END, CANCEL = "request.start", "input_text.append", "input_text.end", "response.cancel"
CLIENT_EVENTS = (START, APPEND, END, CANCEL)


class ProtocolError(RequestError):
    """A client event this protocol does not allow now. ``code`` (kebab-case, like every
    error code of the server): ``invalid-json``, ``unknown-event``, ``invalid-event``,
    ``invalid-sequence``, ``not-configured``, ``already-configured``, ``input-ended``,
    ``idle-timeout``, ``subprotocol-required``, ``unsupported-format``; ``too-many-errors``
    is only logged (the request of a session closed for it is logged as refused)."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(frozen=True)
class ClientEvent:
    """One parsed client event.

    Attributes:
        type: one of ``CLIENT_EVENTS``.
        data: the whole JSON object (``request.start``'s fields are checked by the door,
            as ``POST /v1/audio/speech`` checks its body).
        sequence: the event's ``sequence`` (appends and the end), or None when absent.
        text: an append's text delta ("" for other events).
    """

    type: str
    data: dict[str, Any]
    sequence: int | None = None
    text: str = ""


def parse_client_event(message: str) -> ClientEvent:
    """A text message as a client event; a lone surrogate in its strings (JSON's "\\ud800")
    is U+FFFD, which speech text drops, as on the other doors (``writing.replace_lone_surrogates``).

    Raises:
        ProtocolError: ``invalid-json`` (not JSON, or not an object), ``unknown-event``
            (a ``type`` this protocol does not have), ``invalid-event`` (a field of the
            wrong type: ``sequence`` must be a non-negative integer, ``text`` a string; or
            text in ``input_text.end``, which carries none).
    """
    try:
        data = replace_lone_surrogates(json.loads(message))
    except (ValueError, RecursionError) as err:
        raise ProtocolError("invalid-json", f"The message is not valid JSON: {str(err)[:200]}") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid-json", "A message must be a JSON object with a 'type'")
    kind = data.get("type")
    if kind is None:
        raise ProtocolError("unknown-event", f"A message needs a 'type': one of {', '.join(CLIENT_EVENTS)}", "type")
    if kind not in CLIENT_EVENTS:
        raise ProtocolError(
            "unknown-event",
            f"Unknown event type {kind!r}; this protocol has {', '.join(CLIENT_EVENTS)}",
            "type",
        )
    sequence = data.get("sequence")
    if sequence is not None and (isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0):
        raise ProtocolError("invalid-event", "'sequence' must be a non-negative integer", "sequence")
    text = data.get("text", "") if kind == APPEND else ""
    if kind == APPEND and not isinstance(text, str):
        raise ProtocolError("invalid-event", "'text' must be a string", "text")
    if kind == END and data.get("text"):  # else the client's last words would be lost quietly
        raise ProtocolError(
            "invalid-event", f"{END} carries no text: send it in {APPEND} first, then {END}", "text"
        )
    return ClientEvent(kind, data, sequence if kind in (APPEND, END) else None, text)


def session_created() -> dict[str, Any]:
    """The first server event: the protocol and the audio format."""
    return {"type": "session.created", "protocol": PROTOCOL, "audio": dict(AUDIO)}


def request_configured(request_id: str, voice: str, language: str) -> dict[str, Any]:
    """The answer to an accepted ``request.start``: the request's id, the resolved voice
    and Qwen3-TTS language."""
    return {
        "type": "request.configured",
        "request_id": request_id,
        "voice": voice,
        "language": language,
        "audio": dict(AUDIO),
    }


def ack(event: str, sequence: int, request_id: str) -> dict[str, Any]:
    """The acknowledgement of an append or the end (``event``: its type)."""
    return {"type": "input_text.ack", "event": event, "sequence": sequence, "request_id": request_id}


def response_started(request_id: str) -> dict[str, Any]:
    """Sent once, just before the first binary message (or ``response.done``)."""
    return {"type": "response.started", "request_id": request_id, "audio": dict(AUDIO)}


def response_done(request_id: str, stop_reason: str, audio_chunks: int, samples: int) -> dict[str, Any]:
    """The last event of a response: ``stop_reason`` "stop" (the whole text was spoken) or
    "cancelled" (``response.cancel``); ``audio_chunks`` binary messages were sent, holding
    ``samples`` samples at 24 kHz."""
    return {
        "type": "response.done",
        "request_id": request_id,
        "stop_reason": stop_reason,
        "audio_chunks": audio_chunks,
        "audio_samples": samples,
    }


def error(
    request_id: str | None, message: str, code: str, param: str | None = None, kind: str | None = None
) -> dict[str, Any]:
    """An ``error`` event: OpenAI's error object (``shared.error_body``) with the
    request's id (a refused ``request.start``'s own; None for an event before any
    ``request.start``). ``kind`` defaults to the type the HTTP door gives the same code:
    ``rate_limit_error`` for ``overloaded`` (HTTP's 429), ``server_error`` for the server's
    own failures and ``invalid_request_error`` else."""
    server_side = code in (
        "server-stopping",
        "generation-failed",
        "internal-error",
        "not-ready",
    )
    default = "rate_limit_error" if code == "overloaded" else "server_error" if server_side else "invalid_request_error"
    kind = kind or default
    return {"type": "error", "request_id": request_id, **error_body(message, code, param, kind)}
