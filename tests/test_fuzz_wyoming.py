"""Fuzzing the Wyoming door: coverage-guided (atheris, libFuzzer) and corpus replays.

The target feeds arbitrary bytes, as a client would send them, to the real event handler
(``handler.Connections``, ``wire.read_event``) over a real socket pair, on a real
``TtsService`` whose engine is a stand-in (``stub_service``: instant noise, so the time
goes to parsing and dispatch). For every input it checks:

* no exception escapes the connection, nothing is logged at ERROR (no traceback, no
  "Task exception was never retrieved": asyncio's exception handler fails the input);
* what the server sends back is a well-formed stream of Wyoming events of the kinds a TTS
  server sends, every ``error`` with a ``code`` and a ``text``;
* a connection the server closes while input was still unread ends with an ``error``;
* the connection leaves no request open behind it (admission slots are not leaked).

``python -m tests.test_fuzz_wyoming [libFuzzer flags] CORPUS_DIR...`` runs atheris;
``test_coverage_guided_fuzzing`` runs it for ``QWEN3TTS_FUZZ_SECONDS`` (20 s) from the
committed corpus ``tests/corpus/wyoming`` (inputs found while fuzzing, minimised with
``-merge=1``). The corpus is also replayed in-process and against the real server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CORPUS = Path(__file__).parent / "corpus" / "wyoming"
#: Seconds of coverage-guided fuzzing in the test suite (CI); 0 skips it.
FUZZ_SECONDS = int(os.environ.get("QWEN3TTS_FUZZ_SECONDS", "20"))
#: Event types a TTS server sends.
_SERVER_EVENTS = {"info", "error", "audio-start", "audio-chunk", "audio-stop", "synthesize-stopped"}
#: Hang guard per input (the stand-in engine answers at once), not a speed assertion.
_GUARD_S = 10.0


class FuzzFailure(AssertionError):
    """An input broke a property (the message says which)."""


class _ErrorLog(logging.Handler):
    """Collects records at ERROR and above (a traceback, asyncio's unretrieved exceptions)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _quiet(*names: str) -> dict[str, int]:
    """Set these loggers to WARNING; returns their levels, to restore."""
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.WARNING)
    return levels


class WyomingHarness:
    """A stub-engine service and the Wyoming door's connection factory, on one event loop."""

    def __init__(self) -> None:
        from wyoming_qwen3tts.doors.wyoming.handler import Connections, WyomingLimits

        from .stub_service import stub_service

        self.loop = asyncio.new_event_loop()
        self.errors = _ErrorLog()
        logging.getLogger().addHandler(self.errors)
        self._levels = _quiet("wyoming_qwen3tts")  # INFO per refusal: noise here
        self.loop.set_exception_handler(self._loop_error)
        self._context = stub_service(max_queue=8)
        self.service = self.loop.run_until_complete(self._context.__aenter__())
        self.connections = Connections(self.service, WyomingLimits(write_timeout=5, idle_timeout=60))

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.errors.records.append(
            logging.LogRecord("asyncio", logging.ERROR, "", 0, str(context.get("message")), None, None)
        )

    def close(self) -> None:
        self.loop.run_until_complete(self._context.__aexit__(None, None, None))
        self.loop.close()
        logging.getLogger().removeHandler(self.errors)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)

    def run_one(self, data: bytes) -> list[Any]:
        """Send ``data`` on a fresh connection, then EOF; check the properties.

        Returns the events the server sent.

        Raises:
            FuzzFailure: a property does not hold.
        """
        self.errors.records.clear()
        events = self.loop.run_until_complete(asyncio.wait_for(self._exchange(data), _GUARD_S))
        if self.errors.records:
            raise FuzzFailure(f"logged at ERROR: {[r.getMessage() for r in self.errors.records]}")
        return events

    async def _exchange(self, data: bytes) -> list[Any]:
        from wyoming_qwen3tts.doors.wyoming.wire import read_event

        near, far = socket.socketpair()
        server_reader, server_writer = await asyncio.open_connection(sock=near)
        client_reader, client_writer = await asyncio.open_connection(sock=far)
        handler = self.connections(server_reader, server_writer)
        task = asyncio.create_task(handler.run())
        try:
            client_writer.write(data)
            await client_writer.drain()
            for _ in range(100):  # let the replies go out before the client's EOF
                if task.done() or (not server_reader._buffer and not handler.busy()):  # type: ignore[attr-defined]
                    break
                await asyncio.sleep(0.005)
            unread = bool(server_reader._buffer) and task.done()  # type: ignore[attr-defined]
            if client_writer.can_write_eof() and not client_writer.is_closing():
                client_writer.write_eof()
            raw = await client_reader.read()
            result = await task
        finally:
            client_writer.close()
        if result is not None:
            raise FuzzFailure(f"handler.run returned {result!r}")
        events = []
        reader = asyncio.StreamReader(limit=1 << 22)
        reader.feed_data(raw)
        reader.feed_eof()
        while True:
            try:
                event = await read_event(reader, 1 << 22)
            except Exception as err:  # noqa: BLE001 - any failure to parse the reply is a finding
                raise FuzzFailure(f"malformed reply {raw[:200]!r}: {err!r}") from err
            if event is None:
                break
            if event.type not in _SERVER_EVENTS:
                raise FuzzFailure(f"unexpected reply event {event.type!r}")
            if event.type == "error" and not (
                isinstance(event.data.get("text"), str) and isinstance(event.data.get("code"), str)
            ):
                raise FuzzFailure(f"error event without text and code: {event.data!r}")
            events.append(event)
        if unread and (not events or events[-1].type != "error"):
            raise FuzzFailure(f"closed with input unread and no error; replies {[e.type for e in events]}")
        await asyncio.sleep(0)  # let cancellations land
        if self.service.open_streams:
            raise FuzzFailure(f"{self.service.open_streams} request(s) left open after the connection closed")
        return events


# --- pytest -----------------------------------------------------------------------------


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.iterdir() if p.is_file())


@pytest.fixture(scope="module")
def harness() -> Any:
    h = WyomingHarness()
    yield h
    h.close()


def test_corpus_replays_in_process(harness: WyomingHarness) -> None:
    """Every committed input keeps every property (fast: the whole corpus in seconds)."""
    files = corpus_files()
    assert len(files) >= 20
    replied_error = 0
    for path in files:
        try:
            events = harness.run_one(path.read_bytes())
        except FuzzFailure as err:
            raise AssertionError(f"{path.name}: {err}") from None
        replied_error += any(e.type == "error" for e in events)
    assert replied_error >= len(files) // 4  # the corpus is mostly malformed input


@pytest.mark.parametrize(
    ("data", "then"),
    [
        (b"[" * 20000 + b"\n", "info"),  # nesting past the JSON recursion limit
        (b"[" * 80000 + b"\n", "closed"),  # a header line over the reader's limit
        (b'{"type": "describe", "data_length": "5"}\n', "closed"),
        (b'{"type": "describe", "data_length": 1e400}\n', "closed"),
        (b'{"type": "describe", "payload_length": -1}\n', "closed"),
        (b'{"type": "describe", "data_length": true}\nx', "closed"),
        (b'{"type": "audio-chunk", "payload_length": 2000000000}\n', "closed"),
        (b'{"type": "synthesize", "data_length": 2}\n[]', "closed"),  # a refused synthesize ends it
        (b'{"type": 5}\n', "info"),
        (b'{"type": "synthesize", "data": [1]}\n', "closed"),
        (b'{"type": "describe", "data_length": ' + b"9" * 5000 + b"}\n", "info"),
        (b'\xff\xfe{"type": "describe"}\n', "info"),
    ],
    ids=lambda v: v[:24].decode("latin-1") if isinstance(v, bytes) else str(v),
)
def test_known_bad_headers_get_an_error(harness: WyomingHarness, data: bytes, then: str) -> None:
    """Headers that escaped ``async_read_event`` or the handler as exceptions get one
    ``error`` (code ``malformed-event``); then the connection answers the next event, or is
    closed when the stream cannot be resynchronised or the event was a ``synthesize`` (a
    refused ``synthesize`` ends the connection)."""
    events = harness.run_one(data + b'{"type": "describe"}\n')
    assert events[0].type == "error" and events[0].data["code"] == "malformed-event", events
    assert [e.type for e in events[1:]] == (["info"] if then == "info" else [])


def test_a_lone_surrogate_is_replaced_not_refused(harness: WyomingHarness) -> None:
    """JSON's "\\udfff" decodes to a lone surrogate, which no reply can encode: it is U+FFFD
    (in the text it is dropped: tests/test_text_e2e.py), so this voice is unknown, and the
    error naming it is sent; then the connection ends (a refused synthesize's end)."""
    events = harness.run_one(
        b'{"type": "synthesize", "data": {"text": "hi", "voice": {"name": "\\udfff"}}}\n{"type": "describe"}\n'
    )
    assert events[0].type == "error" and events[0].data["code"] == "unknown-voice", events
    assert "'\ufffd'" in events[0].data["text"] and len(events) == 1


@pytest.mark.full
@pytest.mark.skipif(FUZZ_SECONDS <= 0, reason="QWEN3TTS_FUZZ_SECONDS=0")
def test_coverage_guided_fuzzing(tmp_path: Path) -> None:
    """atheris for ``FUZZ_SECONDS`` from the committed corpus: no input breaks a property.
    New inputs go to a scratch folder (merge them into the corpus with ``-merge=1``)."""
    run_fuzzer("tests.test_fuzz_wyoming", CORPUS, tmp_path, FUZZ_SECONDS)


def run_fuzzer(module: str, corpus: Path, scratch: Path, seconds: int) -> None:
    """Run ``python -m module`` (an atheris target) for ``seconds``; fail with its crash."""
    found = scratch / "found"
    found.mkdir()
    proc = subprocess.run(
        [
            sys.executable, "-m", module,
            f"-max_total_time={seconds}", "-timeout=20", "-rss_limit_mb=4096",
            f"-artifact_prefix={scratch}/", "-print_final_stats=1",
            str(found), str(corpus),
        ],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=seconds + 240,
    )
    crashes = [p for p in scratch.iterdir() if p.is_file()]
    stats = [line for line in proc.stderr.splitlines() if line.startswith(("stat::", "#"))][-3:]
    print("\n".join(stats))
    assert proc.returncode == 0 and not crashes, (
        f"fuzzer exit {proc.returncode}; inputs {crashes}:\n{proc.stderr[-6000:]}"
    )
    assert any("stat::number_of_executed_units" in line for line in proc.stderr.splitlines())


# --- atheris ----------------------------------------------------------------------------


def main() -> None:
    """libFuzzer entry point: ``python -m tests.test_fuzz_wyoming [flags] [CORPUS...]``."""
    import atheris

    with atheris.instrument_imports(include=["wyoming_qwen3tts", "wyoming"]):
        import wyoming.event  # noqa: F401
        import wyoming_qwen3tts.doors.wyoming.handler  # noqa: F401
        import wyoming_qwen3tts.text.segmenter  # noqa: F401
        import wyoming_qwen3tts.doors.wyoming.wire  # noqa: F401
    harness = WyomingHarness()
    # -merge=1 re-runs argv[0] through the shell: script/fuzz passes itself as that.
    sys.argv[0] = os.environ.get("QWEN3TTS_FUZZ_ARGV0", sys.argv[0])
    atheris.Setup(sys.argv, harness.run_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
