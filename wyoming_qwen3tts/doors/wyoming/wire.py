"""Reading Wyoming events strictly: every byte sequence is an event, a refusal, or the end.

The wire format (``wyoming.event``): one JSON header line ``{"type", "data"?,
"data_length"?, "payload_length"?, "version"?}`` ending in ``\\n``, then ``data_length``
bytes of UTF-8 JSON (an object merged over ``data``), then ``payload_length`` bytes of
binary payload. ``wyoming.event.async_read_event`` trusts what it reads (a list header, a
string length or a deeply nested line raise from inside it); this reader checks each part
and says, for a bad event, whether the stream is still in step:

* the header line is not JSON, not an object, or its ``type``/``data`` are wrong, or the
  data part is not a JSON object: the event's bytes are all consumed, the next line starts
  a new event (``MalformedEventError.resync`` is True);
* a length is not a non-negative integer, or is over ``max_bytes``, or the header line is
  over the reader's limit: nobody knows where the next event starts (``resync`` False: the
  connection must be closed);
* the stream ends inside an event (its header line, or fewer data or payload bytes than
  its header announced): ``EventCutOffError`` (``resync`` False), so that the client is
  told why, not closed silently.

``MalformedEventError.event_type`` names the bad event's type where the header said it
(a ``synthesize`` whose data is malformed is refused as any refused ``synthesize`` is).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from wyoming.event import Event

from ...service.errors import RequestError
from ...text.writing import replace_lone_surrogates

#: Largest data or payload part a client may announce, in bytes. A TTS request is text:
#: 10,000 characters of JSON stay far below this.
MAX_EVENT_BYTES = 1 << 20


class MalformedEventError(RequestError):
    """Bytes that are not a usable Wyoming event (error code ``malformed-event``).

    Attributes:
        resync: True when the bad event's bytes were consumed and reading may go on.
        event_type: the event's type where its header named one, else None.
    """

    def __init__(self, message: str, resync: bool, event_type: str | None = None) -> None:
        super().__init__(message)
        self.resync = resync
        self.event_type = event_type

    code = "malformed-event"


class EventCutOffError(MalformedEventError):
    """The stream ended inside an event (error code ``incomplete-event``): the client ended
    its side, or its connection, before sending all the bytes its header announced."""

    def __init__(self, message: str) -> None:
        super().__init__(message, resync=False)

    code = "incomplete-event"


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    """Parse ``raw`` as a JSON object whose strings are all valid Unicode: lone surrogates
    ("\\ud800", which parse but no reply, log or tokenizer can encode) become U+FFFD
    (``writing.replace_lone_surrogates``), which speech text drops, as the other doors do.

    Raises:
        MalformedEventError: (resync True) not JSON (or not UTF-8), or not an object.
    """
    try:
        value = replace_lone_surrogates(json.loads(raw))
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeError, int digits
        reason = (
            "invalid Unicode" if isinstance(err, UnicodeError)
            else "JSON nested too deeply" if isinstance(err, RecursionError)
            else "not valid JSON"
        )
        raise MalformedEventError(f"Malformed event: {what} is {reason}", resync=True) from None
    if not isinstance(value, dict):
        raise MalformedEventError(f"Malformed event: {what} is not a JSON object", resync=True)
    return value


def _length(header: dict[str, Any], key: str, max_bytes: int) -> int:
    """``header[key]`` as a byte count (0 when absent or null).

    Raises:
        MalformedEventError: (resync False) not a non-negative integer, or over ``max_bytes``.
    """
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedEventError(f"Malformed event: {key} is not a byte count; closing", resync=False)
    if value > max_bytes:
        raise MalformedEventError(f"Event {key} is over {max_bytes} bytes; closing", resync=False)
    return value


async def _read_part(reader: asyncio.StreamReader, length: int, what: str) -> bytes:
    """The event's next ``length`` bytes, its ``what`` (data or payload).

    Raises:
        EventCutOffError: the stream ended first.
    """
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as err:
        raise EventCutOffError(
            f"Event cut off: {len(err.partial)} of {length} bytes of its {what} arrived before the connection ended"
        ) from None


async def read_event(reader: asyncio.StreamReader, max_bytes: int = MAX_EVENT_BYTES) -> Event | None:
    """The next event from ``reader``; None at the end of the stream.

    Returns:
        An ``Event`` whose ``type`` is a non-empty string and ``data`` a dict (payload bytes
        or None).

    Raises:
        MalformedEventError: a bad event (see the module docstring for ``resync``);
            ``EventCutOffError``: the stream ended inside an event.
        ConnectionError: the connection broke.
    """
    try:
        line = await reader.readline()
    except ValueError:  # asyncio.LimitOverrunError: over the reader's line limit
        raise MalformedEventError("Event header line is too long; closing", resync=False) from None
    if not line:
        return None
    if not line.endswith(b"\n"):
        raise EventCutOffError(f"Event cut off: the connection ended inside its header line ({len(line)} bytes, no newline)")
    header = _json_object(line, "the header line")
    data_length = _length(header, "data_length", max_bytes)
    payload_length = _length(header, "payload_length", max_bytes)
    raw_data = await _read_part(reader, data_length, "data") if data_length else b""
    payload = await _read_part(reader, payload_length, "payload") if payload_length else None
    event_type = header.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise MalformedEventError("Malformed event: no \"type\" string in the header", resync=True)
    data = header.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MalformedEventError("Malformed event: \"data\" is not a JSON object", resync=True, event_type=event_type)
    if raw_data:
        try:
            data = {**data, **_json_object(raw_data, "the data part")}
        except MalformedEventError as err:
            err.event_type = event_type
            raise
    return Event(type=event_type, data=data, payload=payload)
