"""One request's timeline: when its first segment passed each point on its way to first audio.

Every point is a ``time.perf_counter()`` reading (monotonic seconds, one clock for every thread
of the process), set once by whoever passes it: the door, the service, the scheduler, the
engine. Only a request's first segment carries a timeline into the engine, so a request costs
a few float assignments and nothing is done per frame. The service writes the points as
milliseconds after ``arrived`` in its per-request log line (``describe``), and
``benchmarks/lone_breakdown.py`` reads them back from there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

#: The points after arrival, in the order a request passes them, and their names in the log.
POINTS: dict[str, str] = {
    "queued": "queued",
    "taken": "taken",
    "prompted": "prompt",
    "admitted": "admitted",
    "prefilled": "prefill",
    "generated": "first frame",
    "decoded": "decoded",
    "delivered": "delivered",
    "written": "written",
}


@dataclass
class Timeline:
    """When one request reached each point (``time.perf_counter()`` seconds; None: not reached,
    or not measured by this engine).

    Attributes:
        arrived: the door has the request: Wyoming ``synthesize`` (or the first
            ``synthesize-chunk`` of a streamed text) handled, HTTP body parsed, WebSocket first
            ``input_text.append`` handled.
        queued: its first segment is in the engine's queue (``Job.submit``).
        taken: the engine took that segment from its queue (``Scheduler.take``).
        prompted: the segment's prompt is built (batched engine; on CUDA its stream synchronized).
        admitted: the prefill replay that admits it into a slot starts (host, before launch).
        prefilled: that prefill ended: on the CPU the host's time after it; on CUDA the end of
            its work on the talker's stream, placed by the GPU's own clock (timing events)
            before ``decoded``.
        generated: the step that makes its first codec frame ended (same clocks as ``prefilled``).
        decoded: the PCM of that frame is on the host: on CUDA when the engine's wait for that
            step's delivery returned (an existing synchronization), on the CPU after the decode.
        delivered: the service's stream got the first chunk in the event loop (what the
            log's "first audio" and ``tts_first_audio_seconds`` measure, from ``arrived``).
        written: the door wrote the first audio bytes (its write returned).
    """

    arrived: float | None = None
    queued: float | None = None
    taken: float | None = None
    prompted: float | None = None
    admitted: float | None = None
    prefilled: float | None = None
    generated: float | None = None
    decoded: float | None = None
    delivered: float | None = None
    written: float | None = None

    def mark(self, point: str, at: float | None = None) -> None:
        """Set ``point`` to ``at`` (default: now), unless it is already set.

        Raises:
            AttributeError: ``point`` is not a field of the timeline.
        """
        if getattr(self, point) is None:
            setattr(self, point, time.perf_counter() if at is None else at)

    def offsets_ms(self) -> dict[str, float]:
        """Each point reached, in milliseconds after ``arrived``, by the log's names, in order;
        {} before arrival."""
        if self.arrived is None:
            return {}
        out: dict[str, float] = {}
        for field in fields(self)[1:]:
            value = getattr(self, field.name)
            if value is not None:
                out[POINTS[field.name]] = (value - self.arrived) * 1000.0
        return out

    def describe(self) -> str:
        """The log's form: ``queued 0.1, taken 0.2, ..., written 12.4`` (ms after arrival,
        one decimal); "" when nothing was reached."""
        return ", ".join(f"{name} {ms:.1f}" for name, ms in self.offsets_ms().items())
