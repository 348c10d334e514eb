"""What the HTTP routes share (the speech API and the voice studio): OpenAI's error object,
JSON request bodies, the watch on a request body's progress, and a voice as
``GET /v1/audio/voices`` lists it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from aiohttp import StreamReader, web

from ...text import writing
from ...service.errors import EmptyTextError, LanguageError, RequestError, TextTooLongError, VoiceNotFoundError
from ...common.vocabulary import ModelKind
from ...catalogue.voices import Voice

#: The model name that speaks each kind (``GET /v1/models``, a voice's ``model``).
MODEL_OF_KIND = {
    ModelKind.BASE: "qwen3-tts-clone",
    ModelKind.VOICE_DESIGN: "qwen3-tts-voice-design",
    ModelKind.CUSTOM_VOICE: "qwen3-tts-custom-voice",
}
#: Longest ``instructions`` (VoiceDesign description), in characters: it sits in the prompt.
MAX_INSTRUCTIONS_CHARS = 2000


class ApiError(RequestError):
    """An HTTP-level refusal, sent as OpenAI's error JSON.

    Args:
        status: HTTP status code.
        message: human-readable reason.
        code: stable machine-readable id (also the metrics ``code`` label).
        param: the request field at fault, or None.
        kind: OpenAI's error ``type``; by default ``server_error`` for a 5xx status, else
            ``invalid_request_error``.
        retry_after: seconds for the ``Retry-After`` header (429, 503), or None.
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        kind: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param
        self.kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
        self.retry_after = retry_after


def error_body(
    message: str, code: str, param: str | None = None, kind: str = "invalid_request_error"
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_param(err: RequestError) -> str | None:
    """The request field a refusal names (OpenAI's error ``param``), the same on every door
    that speaks OpenAI's errors: an ``ApiError``'s own; ``input`` for the text (empty,
    nothing speakable, over ``--max-chars``: on the WebSocket the text of the
    ``input_text.append`` events), ``voice`` for an unknown voice, ``language`` for an
    unsupported language; None for the others."""
    if isinstance(err, ApiError):
        return err.param
    if isinstance(err, (TextTooLongError, EmptyTextError)):
        return "input"
    if isinstance(err, VoiceNotFoundError):
        return "voice"
    if isinstance(err, LanguageError):
        return "language"
    return getattr(err, "param", None)


def voice_json(voice: Voice) -> dict[str, Any]:
    """A voice as ``GET /v1/audio/voices`` lists it (the studio adds its own fields)."""
    return {
        "id": voice.name,
        "name": voice.name,
        "kind": voice.kind.value,
        "model": MODEL_OF_KIND[voice.kind],
        "summary": voice.summary,
        "languages": list(voice.languages),
        "aliases": list(voice.aliases),
    }


async def read_json(request: web.Request, replace_lone_surrogates: bool = False) -> Any:
    """The body as JSON whose strings are all valid Unicode.

    Args:
        replace_lone_surrogates: JSON's "\\ud800" (a lone surrogate, which no reply or
            tokenizer could encode) becomes U+FFFD (``writing.replace_lone_surrogates``;
            speech text then drops it, as the other doors do); else it is refused.

    Raises:
        ApiError: 400 invalid-json (not JSON, too deeply nested, an integer of over 4300
            digits, or, unless replaced, lone surrogates).
    """
    try:
        body = json.loads(await request.read())
        if replace_lone_surrogates:
            body = writing.replace_lone_surrogates(body)
        else:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeError, int digits
        reason = "has invalid Unicode" if isinstance(err, UnicodeError) else "is not valid JSON"
        detail = (
            "nested too deeply" if isinstance(err, RecursionError)
            else f"a number has more than {sys.get_int_max_str_digits()} digits"
            if "integer string conversion" in str(err)
            else str(err)[:200]
        )
        raise ApiError(400, f"The request body {reason}: {detail}", "invalid-json") from None
    return body


class BodyStalledError(asyncio.TimeoutError):
    """A request body made no progress for ``idle_timeout`` seconds (``watch_body``).

    Raised by the body's reads (``request.read()``, ``json()``, ``multipart()``...). A
    ``TimeoutError`` so that aiohttp's own read of an unfinished body after the response
    (its lingering close) ends on it at once, quietly, and closes the connection.
    """

    def __init__(self, idle_timeout: float) -> None:
        super().__init__(
            f"The request body stopped arriving: no bytes for {idle_timeout:g} s (--idle-timeout); "
            "the connection is closed"
        )
        self.idle_timeout = idle_timeout


def watch_body(request: web.Request, idle_timeout: float) -> asyncio.Task[None] | None:
    """Watch the progress of ``request``'s body while its handler runs: once no byte of it
    has arrived for ``idle_timeout`` seconds and it is not complete, its reads raise
    ``BodyStalledError`` (aiohttp's ``StreamReader.set_exception``: a read waiting for the
    client wakes up with it). The timeout is on progress, not on the total: a slow upload
    whose bytes keep coming is never cut. Every body read of every route goes through the
    one stream, so the HTTP door's middleware watches them all here.

    The handler must read its body before slow work (every route does): bytes held back
    by flow control while it does not read count as no progress.

    Returns:
        the watching task (cancel it when the handler returns), or None for a request
        without a body or whose body has arrived whole (a WebSocket handshake, a GET).
    """
    content = request.content
    if not request.body_exists or content.is_eof():
        return None
    return asyncio.create_task(_watch(content, idle_timeout), name="http-body-watch")


async def _watch(content: StreamReader, idle_timeout: float) -> None:
    loop = asyncio.get_running_loop()
    step = min(1.0, idle_timeout / 4)
    seen, since = content.total_bytes, loop.time()
    while not content.is_eof() and content.exception() is None:
        await asyncio.sleep(step)
        now = loop.time()
        if content.total_bytes != seen:
            seen, since = content.total_bytes, now
        elif now - since >= idle_timeout and not content.is_eof() and content.exception() is None:
            content.set_exception(BodyStalledError(idle_timeout))
            return
