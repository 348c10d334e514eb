"""OpenAI-compatible HTTP door (aiohttp), served in the same process as Wyoming.

Routes:

* ``POST /v1/audio/speech``: OpenAI's speech request; audio streams back while the model
  generates, in any ``response_format``, raw (chunked transfer) or as server-sent events.
* ``GET /v1/audio/voices``: the voice catalogue. ``GET /v1/models``: OpenAI's model list.
* ``GET /health`` (liveness), ``GET /ready`` (every model warmed up), ``GET /metrics``
  (Prometheus), ``GET /openapi.json`` (this API's OpenAPI 3.1 description, ``openapi``).
  These never need the API key; ``/v1/*`` does when one is set.

Every error is OpenAI's JSON, ``{"error": {"message", "type", "param", "code"}}``, sent
before any audio: a request is validated and its first audio chunk awaited before the
response headers go out (FLAC: the whole file, see ``encoders``). A failure after that
ends the response without its final chunk (SSE: an ``error`` event, then the end), and
the failure is logged. The same goes for a server shutting down (code ``server-stopping``).

The speech request's body is validated by ``request`` (into ``SpeechParams``); this
module is the HTTP side: routes, streaming, errors, the application and its runner.

Limits: past the service's request cap a request gets 429 (code ``overloaded``) with
``Retry-After``, at once; a client that does not read for ``write_timeout`` seconds loses
its response (the generation stops); connections idle for ``idle_timeout`` are closed, and
a request whose body makes no progress for that long gets 408 ``idle-timeout``, then the
connection is closed (``shared.watch_body``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import ipaddress
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST

from .encoders import StreamEncoder, open_encoder
from ..limits import DEFAULT_IDLE_TIMEOUT, DEFAULT_WRITE_TIMEOUT, limit_send_buffer
from ...common.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from . import openapi, websocket
from .ws_events import KEY_PROTOCOL_PREFIX, PATH as WS_PATH, PROTOCOL, offered_subprotocols
from .shared import ApiError, BodyStalledError, error_body, error_param, read_json, watch_body
from .request import GENERIC_MODELS, HUB_MODEL, KIND_MODELS, SpeechParams, model_kind, parse_speech, pick_voice
from .studio import add_routes, from_ingress, is_page, listed_skipped, listed_voice  # the page is open, ingress is authenticated
from ...service.speech import DESIGNED_VOICE, SpeechRequest, SpeechStream, TtsService
from ...service.errors import (
    EmptyTextError,
    GenerationError,
    LanguageError,
    ModelUnservableError,
    OverloadedError,
    RequestError,
    ServerStoppingError,
    TextTooLongError,
    VoiceNotFoundError,
)
from .tempo import Tempo
from ...common.vocabulary import ModelKind
from ...catalogue.voices import name_order

_LOGGER = logging.getLogger(__name__)

_OPEN_PATHS = ("/health", "/ready", "/metrics", "/openapi.json")
_HTTP_CODES = {404: "not-found", 405: "method-not-allowed", 413: "body-too-large"}
_SERVICE_KEY = web.AppKey("service", TtsService)
_WRITE_TIMEOUT_KEY = web.AppKey("write_timeout", float)
_KEYED = web.AppKey("keyed", bool)
_BODY_LIMIT_KEY = web.AppKey("body_limit", int)
_NAMES_KEY = web.AppKey("model_names", dict[str, ModelKind])  # request.loaded_model_names
_CREATED = int(time.time())
#: The refusal of a wrong API key (its ``WWW-Authenticate`` header says so too: RFC 6750 3.1).
_WRONG_KEY = "Incorrect API key provided"


def _as_api_error(err: RequestError) -> ApiError:
    """Map a service refusal onto its HTTP status and request field."""
    if isinstance(err, ApiError):
        return err
    if isinstance(err, TextTooLongError):
        return ApiError(413, str(err), err.code, error_param(err))
    if isinstance(err, EmptyTextError):
        return ApiError(400, str(err), err.code, error_param(err))
    if isinstance(err, (VoiceNotFoundError, ModelUnservableError)):  # the latter: as a model not loaded
        return ApiError(404, str(err), err.code, error_param(err))
    if isinstance(err, LanguageError):
        return ApiError(400, str(err), err.code, error_param(err))
    if isinstance(err, OverloadedError):
        return ApiError(
            429, str(err), err.code, kind="rate_limit_error", retry_after=err.retry_after_s
        )
    if isinstance(err, ServerStoppingError):
        return ApiError(503, str(err), err.code, kind="server_error", retry_after=5)
    return ApiError(400, str(err), err.code)


# --- speech -----------------------------------------------------------------------------


async def speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech``: validate, open a stream, send audio as it is generated."""
    service = request.app[_SERVICE_KEY]
    body = await read_json(request, replace_lone_surrogates=True)  # (speech text drops them)
    arrived = time.perf_counter()  # the request's timeline starts with its body parsed
    params = parse_speech(body, service.max_chars, request.app[_NAMES_KEY])
    if not service.is_ready():
        raise ApiError(
            503, "The models are still warming up; retry shortly", "not-ready", kind="server_error"
        )
    await service.catalog.refresh_async()  # new clips read off the loop
    name = pick_voice(service, params)
    stream = service.speak(
        SpeechRequest(name, params.language, params.instructions, params.seed, door="http"),
        params.text,
        arrived,
    )
    finished = False
    try:
        response = await _send(request, stream, params)
        finished = True
        return response
    finally:
        if not finished:  # refused, client gone, handler cancelled or failed: stop the model
            stream.cancel()


async def _send(
    request: web.Request, stream: SpeechStream, params: SpeechParams
) -> web.StreamResponse:
    """Await the first chunk (errors before it are still JSON), then stream the rest.

    Raises:
        ApiError: 500 when the model fails before any audio.
        asyncio.CancelledError: the client went away (the handler is cancelled).
    """
    chunks: Any = aiter(stream)  # an async generator: closed below, whatever happens
    async with contextlib.aclosing(chunks):
        try:
            first = await anext(chunks, None)
        except GenerationError as err:
            message = f"Speech generation failed: {err}"
            raise ApiError(500, message, "generation-failed", kind="server_error") from None
        encoder = open_encoder(params.response_format)
        try:
            if encoder.format.whole_file and params.stream_format == "audio":
                return await _whole_body(request, stream, params, encoder, first, chunks)
            return await _stream_body(request, stream, params, encoder, first, chunks)
        finally:
            encoder.close()


def _headers(stream: SpeechStream, content_type: str) -> dict[str, str]:
    return {
        "Content-Type": content_type,
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # reverse proxies: pass chunks through as they come
        "X-Sample-Rate": str(SAMPLE_RATE),
        # Clone ids are file names: any script. A voice designed from the instructions alone
        # is "(designed)", which no encoded name can be ("(" is %28).
        "X-Voice": DESIGNED_VOICE if stream.designed else quote(stream.voice.name, safe=""),
    }


async def _whole_body(
    request: web.Request,
    stream: SpeechStream,
    params: SpeechParams,
    encoder: StreamEncoder,
    first: np.ndarray | None,
    chunks: AsyncIterator[np.ndarray],
) -> web.StreamResponse:
    """A format whose header needs the total length (FLAC): encode every chunk, then send
    the complete file with its ``Content-Length``; until then errors are still JSON.

    Raises:
        ApiError: 500 when the model fails; ServerStoppingError when the server stops.
    """
    tempo = Tempo(params.speed)
    try:
        audio = first
        while audio is not None:
            encoder.encode(tempo.process(audio))
            audio = await anext(chunks, None)
    except GenerationError as err:
        message = f"Speech generation failed: {err}"
        raise ApiError(500, message, "generation-failed", kind="server_error") from None
    encoder.encode(tempo.finish())
    body = encoder.finish()
    response = web.StreamResponse(headers=_headers(stream, encoder.format.content_type))
    response.content_length = len(body)
    limit_send_buffer(request.get_extra_info("socket"))
    await response.prepare(request)
    try:
        await _write(request, response, body)
        stream.wrote()
        await response.write_eof()
    except ConnectionError as err:
        _LOGGER.info("HTTP client left before the end of its %s file (%s)", encoder.format.name, err)
    return response


async def _write(request: web.Request, response: web.StreamResponse, data: bytes) -> None:
    """``response.write`` that gives up on a client not reading for ``write_timeout`` s.

    Raises:
        ConnectionResetError: the client did not take the bytes in time (the connection is
            aborted) or is gone.
    """
    timeout = request.app[_WRITE_TIMEOUT_KEY]
    try:
        await asyncio.wait_for(response.write(data), timeout)
    except asyncio.TimeoutError:
        _LOGGER.info(
            "HTTP client %s stopped reading for %g s: dropping its response", request.remote, timeout
        )
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("client stopped reading") from None


async def _stream_body(
    request: web.Request,
    stream: SpeechStream,
    params: SpeechParams,
    encoder: StreamEncoder,
    first: np.ndarray | None,
    chunks: AsyncIterator[np.ndarray],
) -> web.StreamResponse:
    """Send the headers, then each chunk through tempo and encoder as it comes."""
    sse = params.stream_format == "sse"
    content_type = "text/event-stream" if sse else encoder.format.content_type
    response = web.StreamResponse(headers=_headers(stream, content_type))
    response.enable_chunked_encoding()
    limit_send_buffer(request.get_extra_info("socket"))
    await response.prepare(request)
    send = _sse_sender(request, response) if sse else _raw_sender(request, response)
    tempo = Tempo(params.speed)
    try:
        audio = first
        while audio is not None:
            await send(encoder.encode(tempo.process(audio)))
            stream.wrote()
            audio = await anext(chunks, None)
        await send(encoder.encode(tempo.finish()) + encoder.finish())
    except ConnectionError as err:  # the client went away between two chunks
        _LOGGER.info(
            "HTTP client left after %d samples; speech cancelled (%s)", stream.samples, err
        )
        stream.cancel()
        return response
    except (GenerationError, ServerStoppingError) as err:
        stopping = isinstance(err, ServerStoppingError)
        _LOGGER.log(
            logging.INFO if stopping else logging.ERROR,
            "Speech %s after %d samples; ending the response: %s",
            "cut" if stopping else "failed", stream.samples, err,
        )
        if not sse:
            # No final chunk: the client sees an incomplete body, not a short "complete" file.
            response.force_close()
            if request.transport is not None:
                request.transport.close()
            return response
        if stopping:
            error = error_body(f"{err}; the audio is incomplete", "server-stopping", kind="server_error")
        else:
            error = error_body(
                f"Speech generation failed: {err}", "generation-failed", kind="server_error"
            )
        with contextlib.suppress(ConnectionError):
            await _send_event(request, response, {"type": "error", **error})
    else:
        if sse:  # usage: input characters, output codec frames (80 ms each)
            frames = math.ceil(stream.samples / SAMPLES_PER_FRAME)
            usage = {"input_tokens": len(params.text), "output_tokens": frames}
            usage["total_tokens"] = usage["input_tokens"] + frames
            try:
                await _send_event(request, response, {"type": "speech.audio.done", "usage": usage})
            except ConnectionError:
                return response
    await response.write_eof()
    return response


def _raw_sender(
    request: web.Request, response: web.StreamResponse
) -> Callable[[bytes], Awaitable[None]]:
    async def send(data: bytes) -> None:
        if data:  # an empty write would end the chunked body
            await _write(request, response, data)

    return send


def _sse_sender(
    request: web.Request, response: web.StreamResponse
) -> Callable[[bytes], Awaitable[None]]:
    async def send(data: bytes) -> None:
        if data:
            await _send_event(
                request,
                response,
                {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()},
            )

    return send


async def _send_event(
    request: web.Request, response: web.StreamResponse, event: dict[str, Any]
) -> None:
    line = b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
    await _write(request, response, line)


# --- catalogue, models, probes ----------------------------------------------------------


async def voices(request: web.Request) -> web.Response:
    """``GET /v1/audio/voices``: ``{"default": name, "default_pinned": bool, "voices": [voice,
    ...]}``, by name. ``default_pinned``: the default was chosen with ``--voice``, so the
    studio may not delete or rename it; an automatic default may go (the next is picked).

    Each voice: ``id`` and ``name`` (the same), ``kind``, ``model`` (the model name that
    selects its kind), ``summary``, ``languages`` (BCP-47), ``aliases``, and the studio's
    ``source``, ``served``, ``anchor``, ``shadows`` and ``overrides`` (``studio.listed_voice``). A
    server with no voice yet (the clone model alone, no clip) answers ``{"default": null, ...,
    "voices": []}``. ``voices_folder``: the voices folder's absolute path on the server (null:
    none), where clips and their transcripts may be copied (the studio's hint names it).
    ``skipped``: the clips of that folder that are no voice (``studio.listed_skipped``: name,
    file, reason). ``default_served``: false while the ``--voice`` default is no longer served.
    """
    service = request.app[_SERVICE_KEY]
    await service.catalog.refresh_async()
    listed = sorted(service.catalog.voices(), key=lambda v: name_order(v.name))
    folder = service.catalog.voices_dir
    return web.json_response(
        {
            "default": service.default_voice,
            "default_pinned": service.pinned_default is not None,  # --voice: the studio keeps it
            "voices": [listed_voice(service, v) for v in listed],  # with the studio's fields
            "voices_folder": str(folder.resolve()) if folder is not None else None,
            "skipped": listed_skipped(service),  # clips that are no voice, and why
            "default_served": service.default_served,  # False: the --voice default's clip is gone
        }
    )


def _model_list(service: TtsService, loaded: dict[str, ModelKind]) -> list[dict[str, Any]]:
    """OpenAI's model objects: the generic names, the loaded kinds' names and the loaded
    models' own names (hub ids, folder names); of the loaded models only those a request can
    use (``TtsService.servable_kinds``: not one the GPU cannot hold)."""
    kinds = service.servable_kinds
    names = list(GENERIC_MODELS) + [name for name, kind in KIND_MODELS.items() if kind in kinds]
    names += [name for name, kind in loaded.items() if kind in kinds]
    return [{"id": n, "object": "model", "created": _CREATED, "owned_by": "wyoming-qwen3tts"} for n in names]


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: OpenAI's list; the generic names, the loaded kinds' names and the
    loaded models' own names (their hub ids or folder names), leaving out a model the GPU
    cannot hold (``_model_list``)."""
    return web.json_response({"object": "list", "data": _model_list(request.app[_SERVICE_KEY], request.app[_NAMES_KEY])})


async def model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}``: one model of the list (OpenAI's ``models.retrieve``).

    Raises:
        ApiError: 404 ``model_not_found``.
    """
    wanted = request.match_info["model"]
    service = request.app[_SERVICE_KEY]
    for item in _model_list(service, request.app[_NAMES_KEY]):
        if item["id"].lower() == wanted.strip().lower():  # as /v1/audio/speech reads ``model``
            return web.json_response(item)
    if HUB_MODEL.match(wanted.strip().lower()) and model_kind(wanted) in service.servable_kinds:
        return web.json_response({"id": wanted.strip(), "object": "model", "created": _CREATED, "owned_by": "wyoming-qwen3tts"})
    raise ApiError(404, f"The model {wanted!r} does not exist; see GET /v1/models", "model_not_found", "model")


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 whenever the process serves HTTP."""
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """``GET /ready``: whether this server takes new work (a load balancer's health check):
    200 when every model is warmed up, no shutdown has begun and fewer than ``--max-queue``
    requests are open; else 503 with ``reason`` ("loading", "failed", "draining", "busy").
    Per-model states, and the open requests against the limit. A server with no voice yet
    (the clone model alone, no clip) is ready: its studio must take the first clip, also
    through a load balancer that routes by this check, and its speech requests are refused
    at once with how to add one (``service.NoVoicesError``)."""
    service = request.app[_SERVICE_KEY]
    reason = service.readiness()
    body: dict[str, Any] = {
        "status": "not-ready" if reason else "ready",
        "models": service.model_states(),
        "open_requests": service.open_streams,
        "max_queue": service.max_queue,
    }
    if reason:
        body["reason"] = reason
    return web.json_response(body, status=503 if reason else 200)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text exposition."""
    body = request.app[_SERVICE_KEY].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the OpenAPI 3.1 description of the routes of this server."""
    service = request.app[_SERVICE_KEY]
    return web.json_response(openapi.document(service.max_chars, request.app[_KEYED]))


# --- application ------------------------------------------------------------------------


def _www_authenticate(message: str) -> str:
    """A 401's ``WWW-Authenticate`` header (RFC 6750 3.1): "Bearer" for a missing key (no error
    code, as the RFC asks), with ``error="invalid_token"`` and ``message`` for a wrong one. A
    client that cannot read a refused response's body (aiohttp's ``WSServerHandshakeError``
    for a WebSocket handshake) reads the reason here."""
    if message != _WRONG_KEY:
        return "Bearer"
    return f'Bearer error="invalid_token", error_description="{message}"'


def _key_subprotocol(request: web.Request) -> str | None:
    """The API key a WebSocket handshake offers as a subprotocol (``ws_events.KEY_PROTOCOL_PREFIX``
    and the key; browsers cannot set the ``Authorization`` header), or None."""
    if request.path != WS_PATH:
        return None
    for token in offered_subprotocols(request.headers.getall("Sec-WebSocket-Protocol", [])):
        if token.startswith(KEY_PROTOCOL_PREFIX):
            return token[len(KEY_PROTOCOL_PREFIX):]
    return None


def _middleware(
    service: TtsService,
    api_key: str | None,
    ingress_peer: str | None = None,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
) -> Any:
    expected = api_key.encode() if api_key else None

    @web.middleware
    async def handle(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        counted = request.path.startswith("/v1/")
        door = websocket.DOOR if request.path == WS_PATH else "http"  # the metrics' door label
        try:
            if (
                expected is not None
                and request.path not in _OPEN_PATHS
                and not isinstance(request.match_info.http_exception, web.HTTPNotFound)  # no such route: 404
                and not is_page(request.path)
                and not from_ingress(request, ingress_peer)
            ):
                scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
                given = token.strip().encode() if scheme.lower() == "bearer" else b""  # RFC 7235
                offered = _key_subprotocol(request) if not scheme else None
                if offered is not None:  # a browser's WebSocket (ws_events.KEY_PROTOCOL_PREFIX)
                    given = offered.encode()
                elif not scheme:
                    browser = (
                        f" (a browser's WebSocket: offer the subprotocol '{KEY_PROTOCOL_PREFIX}<key>' beside '{PROTOCOL}')"
                        if request.path == WS_PATH else ""
                    )
                    raise ApiError(
                        401, f"Missing API key: send 'Authorization: Bearer <key>'{browser}", "invalid_api_key",
                    )
                if not hmac.compare_digest(given, expected):
                    raise ApiError(401, _WRONG_KEY, "invalid_api_key")
            watch = watch_body(request, idle_timeout)  # every route's body reads, in one place
            try:
                return await handler(request)
            except BodyStalledError as err:  # 408: a client that stops sending cannot hold a handler
                raise ApiError(408, str(err), "idle-timeout") from None
            finally:
                if watch is not None:
                    watch.cancel()
        except RequestError as err:
            api = _as_api_error(err)
            if counted:
                service.count_error(door, api)
            _LOGGER.info(
                "HTTP %s %s refused (%d %s): %s",
                request.method,
                request.path,
                api.status,
                api.code,
                api,
            )
            body = error_body(str(api), api.code, api.param, api.kind)
            headers = {"WWW-Authenticate": _www_authenticate(str(api))} if api.status == 401 else {}
            if api.retry_after is not None:
                headers["Retry-After"] = str(api.retry_after)
            response = web.json_response(body, status=api.status, headers=headers)
            if api.status == 408:  # the rest of the body may still come: close after the answer
                response.force_close()
            return response
        except web.HTTPException as err:
            if err.status < 400:
                raise
            code = _HTTP_CODES.get(err.status, "http-error")
            message = err.reason
            if err.status == 413:
                limit = request.app[_BODY_LIMIT_KEY]
                message = f"The request body is over the server's limit of {limit} bytes ({limit / (1 << 20):.1f} MiB)"
            if counted:
                service.count_error(door, ApiError(err.status, message, code))
                # logged as the other refusals are (the new-user trial: counted, never logged)
                _LOGGER.info("HTTP %s %s refused (%d %s): %s", request.method, request.path, err.status, code, message)
            keep = {k: v for k, v in err.headers.items() if k in ("Allow",)}  # 405 names methods
            return web.json_response(error_body(message, code), status=err.status, headers=keep)
        except HttpProcessingError as err:
            # The body turned out malformed while a handler read it (a multipart part's
            # headers, a cut chunked body): the client's fault, found late.
            reason = str(err.message).strip().splitlines()[0] if err.message else "malformed"
            _LOGGER.info("HTTP %s %s refused (400 invalid-body): %s", request.method, request.path, reason)
            body = error_body(f"The request body is malformed: {reason}", "invalid-body")
            if counted:
                service.count_error(door, ApiError(400, reason, "invalid-body"))
            return web.json_response(body, status=400)
        except ConnectionError:
            raise
        except Exception:  # noqa: BLE001 - a bug: logged in full, answered in OpenAI's shape
            _LOGGER.exception("HTTP %s %s failed", request.method, request.path)
            body = error_body("Internal server error (logged)", "internal-error", kind="server_error")
            if counted:
                service.count_error(door, ApiError(500, "internal error", "internal-error"))
            return web.json_response(body, status=500)

    return handle


def create_app(
    service: TtsService,
    api_key: str | None = None,
    ingress_peer: str | None = None,
    write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    model_names: Mapping[str, ModelKind] | None = None,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
) -> web.Application:
    """The aiohttp application (routes and middleware) for ``service``.

    Args:
        service: the speech service.
        api_key: Bearer key required by ``/v1/*``, or None.
        ingress_peer: address of Home Assistant's ingress proxy; its requests need no key.
        write_timeout: seconds a response write may wait for the client to read.
        model_names: the loaded models' own names (``request.loaded_model_names``).
        idle_timeout: seconds a WebSocket session with open text may send nothing, and a
            request body may make no progress (then 408 ``idle-timeout``).
    """
    body_limit = max(1 << 20, 8 * service.max_chars + (64 << 10))
    app = web.Application(
        middlewares=[_middleware(service, api_key, ingress_peer, idle_timeout)], client_max_size=body_limit
    )
    app[_BODY_LIMIT_KEY] = body_limit
    app[_SERVICE_KEY] = service
    app[_WRITE_TIMEOUT_KEY] = write_timeout
    app[_KEYED] = bool(api_key)
    app[_NAMES_KEY] = dict(model_names or {})
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", voices)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)  # hub ids have a "/"
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi_json)
    websocket.add_route(app, service, write_timeout, idle_timeout, app[_NAMES_KEY])  # /v1/audio/speech/ws
    add_routes(app, service)  # the voice studio's routes and page
    return app


class _MalformedHttpFilter(logging.Filter):
    """aiohttp logs an unparseable request (a NUL in a header, a bad request line) at
    ERROR with a traceback, after answering it with 400. It is the client's fault: one
    INFO line without traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and not _raised_in_a_handler(error):
            reason = str(error.message).strip().splitlines()[0] if error.message else ""
            record.msg, record.args = "Malformed HTTP request refused (%d): %s", (error.code, reason)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def _raised_in_a_handler(error: BaseException) -> bool:
    """True when ``error`` came out of a request handler (a 500: a bug, logged in full),
    not out of aiohttp's request parser (a 400)."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_handle_request":
            return True
        tb = tb.tb_next
    return False


_MALFORMED_FILTER = _MalformedHttpFilter()


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def start_http(
    service: TtsService,
    host: str,
    port: int,
    api_key: str | None,
    ingress_peer: str | None = None,
    write_timeout: float = DEFAULT_WRITE_TIMEOUT,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    model_names: Mapping[str, ModelKind] | None = None,
) -> web.AppRunner:
    """Serve the HTTP door on ``host``:``port``; returns the started runner.

    ``runner.cleanup()`` stops it (in-flight responses get 2 s, then are cancelled); call
    ``stop_listening`` first, then ``TtsService.shutdown``, to end them cleanly.

    A client that disconnects cancels its request handler, which cancels its generation.
    ``write_timeout``: see ``create_app``; ``idle_timeout``: seconds a connection with no
    request in progress is kept open (aiohttp's keep-alive timeout, also for a new one);
    ``model_names``: see ``create_app``.

    Raises:
        OSError: the address cannot be bound.
    """
    if not api_key and not _is_loopback(host):
        _LOGGER.warning(
            "The HTTP endpoint on %s:%d has no --api-key: anyone who can reach this address can "
            "generate speech with it. Set --api-key, or bind --http-host 127.0.0.1.",
            host,
            port,
        )
    server_logger = logging.getLogger("aiohttp.server")
    if _MALFORMED_FILTER not in server_logger.filters:
        server_logger.addFilter(_MALFORMED_FILTER)
    runner = web.AppRunner(
        create_app(service, api_key, ingress_peer, write_timeout, model_names, idle_timeout),
        access_log=None,  # each request has its own line ("http request ok: ..."), cut or whole
        handler_cancellation=True,
        shutdown_timeout=2.0,
        keepalive_timeout=idle_timeout,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    _LOGGER.info(
        "Ready: OpenAI-compatible HTTP on http://%s:%d/v1 (API key %s)",
        host,
        port,
        "required" if api_key else "not required",
    )
    return runner


async def stop_listening(runner: web.AppRunner) -> None:
    """Close the HTTP listening sockets: no new connections; open ones carry on."""
    for site in list(runner.sites):
        await site.stop()
