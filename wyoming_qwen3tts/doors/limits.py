"""Limits both front doors apply to their connections (the README's "Limits" section).

A client may stop reading, go idle, or never send anything; these bound what it can hold:

* ``write_timeout``: a write the client does not take within this many seconds drops its
  stream(s) and the connection (the generation stops);
* ``idle_timeout``: a connection with no traffic and no audio owed is closed after it;
* ``SEND_BUFFER_BYTES``: each connection's kernel send buffer, so that the audio of a
  client that does not read waits in at most that, asyncio's 64 KiB write buffer, and what
  the model makes in ``write_timeout`` seconds.

The cap on requests open at once is the service's (``TtsService.max_queue``).
"""

from __future__ import annotations

import contextlib
import socket

#: Seconds a write may wait for the client to read before its stream is dropped.
DEFAULT_WRITE_TIMEOUT = 20.0
#: Seconds without traffic (and no audio owed) before a connection is closed.
DEFAULT_IDLE_TIMEOUT = 120.0
#: Kernel send buffer of each connection (SO_SNDBUF; Linux doubles it), in bytes: over 1 s
#: of 24 kHz 16-bit PCM, and far more than a LAN needs in flight.
SEND_BUFFER_BYTES = 64 << 10


def limit_send_buffer(sock: socket.socket | None, size: int = SEND_BUFFER_BYTES) -> None:
    """Cap a connection's kernel send buffer (no-op without a socket, or one that refuses)."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)

#: Largest seed a request or ``--seed`` may give (torch seeds are 64-bit; 32 bits keep
#: them portable across clients and JSON parsers).
MAX_SEED = 2**32 - 1
