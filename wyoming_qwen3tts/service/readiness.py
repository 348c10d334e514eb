"""Readiness and draining: whether the service takes a request now, and whether it is ready
for more work (``/ready``, a load balancer).

``Admission`` counts the requests open at once over every door (generating, queued, or with
audio not yet consumed) against ``max_queue``, refuses new ones once a shutdown began, and
ends the open ones at ``shutdown``. ``model_states`` reads each loaded model's warm-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from ..common.vocabulary import ModelKind
from ..engine import Engine
from .errors import OverloadedError, RequestError, ServerStoppingError


class Interruptible(Protocol):
    """An open request's stream, as admission sees it (``SpeechStream``)."""

    def interrupt(self, error: RequestError) -> None:
        """End the stream on the server's behalf: its iteration raises ``error``."""


def model_states(engines: Mapping[ModelKind, Engine]) -> dict[str, str]:
    """Each loaded model's state, by its kind's value: "ready", "loading" (its warm-up runs)
    or "failed" (its warm-up or serving failed)."""
    return {
        kind.value: "failed"
        if e.warm_error is not None or e.serve_error is not None
        else "ready"
        if e.ready.is_set()
        else "loading"
        for kind, e in engines.items()
    }


class Admission:
    """The requests open at once, and whether another is taken.

    Args:
        max_queue: most requests open at once (both doors); ``admit`` refuses the next one.
    """

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._open: set[Interruptible] = set()
        self.stopping = False  # ``shutdown`` was called: new requests are refused
        self._draining = False  # a shutdown began: not ready for a load balancer

    @property
    def open(self) -> int:
        """Requests open now."""
        return len(self._open)

    def admit(self) -> None:
        """Check that one more request may open (call ``add`` with its stream once it is).

        Raises:
            ServerStoppingError: ``shutdown`` was called.
            OverloadedError: ``max_queue`` requests are open already.
        """
        if self.stopping:
            raise ServerStoppingError("The server is shutting down")
        if len(self._open) >= self.max_queue:
            raise OverloadedError(
                f"The server is busy ({len(self._open)} requests open, the limit is "
                f"{self.max_queue}); retry in a few seconds"
            )

    def add(self, stream: Interruptible) -> None:
        """Count ``stream`` as open (after ``admit``)."""
        self._open.add(stream)

    def discard(self, stream: Interruptible) -> None:
        """``stream`` ended: its slot is free (nothing happens if it was not open)."""
        self._open.discard(stream)

    def readiness(self, states: Iterable[str]) -> str | None:
        """Why this server takes no new work now, or None when it does: "failed" or
        "loading" (a model's ``states``, ``model_states``), "draining" (``drain`` was called:
        a shutdown began), "busy" (``max_queue`` requests are open)."""
        states = set(states)
        if "failed" in states:
            return "failed"
        if "loading" in states:
            return "loading"
        if self._draining or self.stopping:
            return "draining"
        if len(self._open) >= self.max_queue:
            return "busy"
        return None

    def drain(self) -> None:
        """Turn not-ready (``readiness``) ahead of a shutdown, so that a load balancer sends
        new work elsewhere; requests are still taken until ``shutdown``."""
        self._draining = True

    def shutdown(self) -> None:
        """Refuse new requests and end every open stream with ``ServerStoppingError``."""
        self.stopping = True
        for stream in list(self._open):
            stream.interrupt(ServerStoppingError("The server is shutting down"))
