"""Health check: ask a running Wyoming server to describe itself.

Connects to the server (``tcp://127.0.0.1:10200`` unless ``--uri`` says
otherwise), sends a Wyoming ``describe`` event and waits at most ``--timeout``
seconds (5) for the ``info`` answer. Exits 0 when that answer lists at least
one text-to-speech program, 1 otherwise (connection refused, timeout, no TTS
program), with a one-line reason on stderr. This is what the container image's
``HEALTHCHECK`` and the add-on's discovery service run::

    python -m wyoming_qwen3tts.healthcheck [--uri tcp://127.0.0.1:10200] [--timeout 5]

It imports only the ``wyoming`` package and the standard library, so it starts
in a fraction of a second and never loads torch or a model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from wyoming.client import AsyncClient
from wyoming.info import Describe, Info

DEFAULT_URI = "tcp://127.0.0.1:10200"
DEFAULT_TIMEOUT = 5.0


async def describe(uri: str) -> Info:
    """Send ``describe`` to the server at ``uri`` and return its ``info``.

    Raises ConnectionError when the server closes the connection first.
    """
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Describe().event())
        while True:
            event = await client.read_event()
            if event is None:
                raise ConnectionError("connection closed before info")
            if Info.is_type(event.type):
                return Info.from_event(event)


async def check(uri: str = DEFAULT_URI, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """Return None when the server at ``uri`` is healthy, else the reason."""
    try:
        info = await asyncio.wait_for(describe(uri), timeout=timeout)
    except asyncio.TimeoutError:
        return f"no info from {uri} within {timeout:g} s"
    except (OSError, ValueError) as err:
        # OSError covers refused/reset connections; ValueError a bad URI or reply.
        return f"cannot describe {uri}: {err}"
    if not info.tts:
        return f"{uri} answered, but offers no text-to-speech program"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_qwen3tts.healthcheck",
        description="Exit 0 if the Wyoming server answers describe with a TTS program.",
    )
    parser.add_argument("--uri", default=DEFAULT_URI, help=f"server to ask (default {DEFAULT_URI})")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for the answer (default {DEFAULT_TIMEOUT:g})",
    )
    args = parser.parse_args(argv)

    reason = asyncio.run(check(args.uri, args.timeout))
    if reason is not None:
        print(f"unhealthy: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
