"""Fuzzing the HTTP door's request handling: coverage-guided (atheris) and corpus replays.

An input is ``[route byte][auth byte][body...]``: the first byte picks the method and path
(mostly ``POST /v1/audio/speech``), the second whether the right API key is sent, the rest
is the request body, sent as raw HTTP/1.1 over TCP to the real aiohttp application
(``doors.http.api.create_app``, with an API key) on a ``TtsService`` with a stand-in engine
(``stub_service``). For every input it checks:

* no 5xx, only the statuses the OpenAPI description lists;
* every error is OpenAI's JSON (``message``, ``type``, ``param``, ``code``);
* a 200 speech response is complete (chunked body ends with its last chunk, or as long as
  its ``Content-Length``) and of the requested media type;
* nothing logged at ERROR, no asyncio exception, no request left open afterwards.

``python -m tests.test_fuzz_http [libFuzzer flags] CORPUS_DIR...`` runs atheris; the
committed corpus is ``tests/corpus/http``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from .test_fuzz_wyoming import FUZZ_SECONDS, FuzzFailure, _ErrorLog, _quiet, run_fuzzer

CORPUS = Path(__file__).parent / "corpus" / "http"
API_KEY = "fuzz-key"
#: (method, path) by the input's first byte (modulo): the speech route most of the time.
ROUTES = [("POST", "/v1/audio/speech")] * 10 + [
    ("GET", "/v1/audio/voices"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/audio/speech"),
    ("POST", "/v1/nothing"),
    ("PUT", "/v1/models"),
]
#: Statuses ``openapi.document`` lists for these routes (405: aiohttp, with ``Allow``).
_STATUSES = {200, 400, 401, 404, 405, 413, 429}
_GUARD_S = 20.0


class HttpHarness:
    """The aiohttp application on a stub-engine service, listening on 127.0.0.1."""

    def __init__(self) -> None:
        from aiohttp import web

        from wyoming_qwen3tts.doors.http.api import create_app

        from .stub_service import stub_service

        self.loop = asyncio.new_event_loop()
        self.errors = _ErrorLog()
        logging.getLogger().addHandler(self.errors)
        self._levels = _quiet("wyoming_qwen3tts", "aiohttp.access")
        self.loop.set_exception_handler(
            lambda loop, ctx: self.errors.records.append(
                logging.LogRecord("asyncio", logging.ERROR, "", 0, str(ctx.get("message")), None, None)
            )
        )
        self._context = stub_service(max_queue=8)
        self.service = self.loop.run_until_complete(self._context.__aenter__())
        self.runner = web.AppRunner(create_app(self.service, API_KEY, write_timeout=5), handler_cancellation=True)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def close(self) -> None:
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.run_until_complete(self._context.__aexit__(None, None, None))
        self.loop.close()
        logging.getLogger().removeHandler(self.errors)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)

    def run_one(self, data: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send the request ``data`` encodes; check the properties.

        Returns status, headers (lower-case names) and the de-chunked body.

        Raises:
            FuzzFailure: a property does not hold.
        """
        self.errors.records.clear()
        result = self.loop.run_until_complete(asyncio.wait_for(self._exchange(data), _GUARD_S))
        if self.errors.records:
            raise FuzzFailure(f"logged at ERROR: {[r.getMessage() for r in self.errors.records]}")
        return result

    async def _exchange(self, data: bytes) -> tuple[int, dict[str, str], bytes]:
        method, path = ROUTES[data[0] % len(ROUTES)] if data else ROUTES[0]
        keyed = len(data) < 2 or data[1] % 4 != 0
        body = data[2:]
        head = [
            f"{method} {path} HTTP/1.1",
            "Host: 127.0.0.1",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ] + ([f"Authorization: Bearer {API_KEY}"] if keyed else [])
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write("\r\n".join(head).encode() + b"\r\n\r\n" + body)
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        status, headers, payload = _parse_response(raw)
        _check(method, path, keyed, body, status, headers, payload)
        for _ in range(20):  # the handler's finally (cancel) may land just after the reply
            if not self.service.open_streams:
                break
            await asyncio.sleep(0.005)
        if self.service.open_streams:
            raise FuzzFailure(f"{self.service.open_streams} request(s) left open")
        return status, headers, payload


def _parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one HTTP/1.1 response; a truncated body is a failure."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise FuzzFailure(f"no complete response head: {raw[:200]!r}")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = bytearray()
        while True:
            size_line, sep, rest = rest.partition(b"\r\n")
            if not sep:
                raise FuzzFailure("chunked body ends without its last chunk")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            body += rest[:size]
            rest = rest[size + 2 :]
        return status, headers, bytes(body)
    length = int(headers.get("content-length", len(rest)))
    if len(rest) != length:
        raise FuzzFailure(f"body of {len(rest)} bytes, Content-Length {length}")
    return status, headers, rest


def _check(
    method: str, path: str, keyed: bool, body: bytes, status: int, headers: dict[str, str], payload: bytes
) -> None:
    if status not in _STATUSES:
        raise FuzzFailure(f"{method} {path} -> {status}: {payload[:300]!r}")
    if status != 200:
        if not headers.get("content-type", "").startswith("application/json"):
            raise FuzzFailure(f"{status} is not JSON: {headers}")
        error = json.loads(payload)["error"]
        if set(error) != {"message", "type", "param", "code"} or not error["message"]:
            raise FuzzFailure(f"not OpenAI's error shape: {error}")
        if status == 405 and "allow" not in headers:
            raise FuzzFailure("405 without Allow")
        if status == 429 and not headers.get("retry-after", "").isdigit():
            raise FuzzFailure("429 without Retry-After")
        return
    if not keyed and path.startswith("/v1/"):
        raise FuzzFailure(f"{path} answered 200 without the API key")
    if (method, path) == ("POST", "/v1/audio/speech"):
        from wyoming_qwen3tts.doors.http.encoders import FORMATS

        request = json.loads(body)
        sse = request.get("stream_format") == "sse"
        fmt = FORMATS[request.get("response_format") or "mp3"]
        want = "text/event-stream" if sse else fmt.content_type
        if headers.get("content-type") != want:
            raise FuzzFailure(f"content type {headers.get('content-type')} for {want}")
        if sse and b"speech.audio.done" not in payload:
            raise FuzzFailure("SSE stream without speech.audio.done")
        if not payload:
            raise FuzzFailure("empty audio")


# --- pytest -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def harness() -> Any:
    h = HttpHarness()
    yield h
    h.close()


def test_corpus_replays_in_process(harness: HttpHarness) -> None:
    files = sorted(p for p in CORPUS.iterdir() if p.is_file())
    assert len(files) >= 20
    statuses = set()
    for path in files:
        try:
            statuses.add(harness.run_one(path.read_bytes())[0])
        except FuzzFailure as err:
            raise AssertionError(f"{path.name}: {err}") from None
    assert {200, 400, 401, 404} <= statuses


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"input": "Hi", "seed": ' + b"9" * 5000 + b"}", "invalid-json"),  # int over 4300 digits
        (b"[" * 5000 + b"]" * 5000, "invalid-json"),  # nesting past the recursion limit
        (b'{"input": "\\ud800 \\udfff"}', "empty-text"),  # lone surrogates: no text (dropped), nothing to say
        (b'{"input": "Hi", "voice": {}}', "invalid-type"),
        (b'{"input": "Hi", "voice": {"id": 3}}', "invalid-type"),
        (b'{"input": "Hi", "instructions": "' + b" " * 2001 + b'"}', "invalid-value"),
        (b'{"input": "Hi", "speed": 1e400}', "invalid-value"),
    ],
    ids=["huge-int", "nested", "surrogate", "voice-no-id", "voice-id-int", "instructions-spaces", "speed-inf"],
)
def test_known_bad_bodies_are_400(harness: HttpHarness, body: bytes, code: str) -> None:
    """Bodies that used to end in a 500, or were accepted against the OpenAPI schema."""
    status, _, payload = harness.run_one(b"\x00\x01" + body)
    assert status == 400 and json.loads(payload)["error"]["code"] == code, payload
    if b"9" * 5000 in body:  # says what is wrong, not Python's advice to raise its limit
        message = json.loads(payload)["error"]["message"]
        assert "a number has more than 4300 digits" in message and "sys." not in message, message


@pytest.mark.full
@pytest.mark.skipif(FUZZ_SECONDS <= 0, reason="QWEN3TTS_FUZZ_SECONDS=0")
def test_coverage_guided_fuzzing(tmp_path: Path) -> None:
    run_fuzzer("tests.test_fuzz_http", CORPUS, tmp_path, FUZZ_SECONDS)


# --- atheris ----------------------------------------------------------------------------


def main() -> None:
    """libFuzzer entry point: ``python -m tests.test_fuzz_http [flags] [CORPUS...]``."""
    import atheris

    with atheris.instrument_imports(include=["wyoming_qwen3tts"]):
        import wyoming_qwen3tts.doors.http.api  # noqa: F401
        import wyoming_qwen3tts.text.segmenter  # noqa: F401
    harness = HttpHarness()
    # -merge=1 re-runs argv[0] through the shell: script/fuzz passes itself as that.
    sys.argv[0] = os.environ.get("QWEN3TTS_FUZZ_ARGV0", sys.argv[0])
    atheris.Setup(sys.argv, harness.run_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
