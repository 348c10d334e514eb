"""What the batched engine runs next: decisions only, no tensors (unit-tested with fake stages).

Each step the engine asks the planner how many waiting requests to prefill before the frame
step. A prefill is one graph replay for at most ``max_join`` rows (``prefill.MAX_JOIN``),
during which every running stream waits; so:

* with nothing running, admit everything that fits (a prefill per ``max_join`` rows, back to
  back: no one is waiting on the frame step);
* with streams running, admit at most ``max_join`` rows per step: each join costs the running
  streams one short replay, never a queue of them;
* a stream that is about to run out of buffered audio goes first: while the tightest stream's
  buffer is below ``guard_ms`` (one join plus one step, with margin), the join waits a step,
  but never more than ``max_defer`` steps in a row, so a new request still gets its first
  frame quickly.

A stream's buffered audio (its deadline) is what its client holds but has not yet played,
assuming playback starts at the first chunk: frames delivered x 80 ms minus the wall time
since its first chunk. A stream that has delivered nothing yet has no deadline (its clock
starts at its first chunk).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Audio per codec frame, ms (12.5 frames per second at 24 kHz: 1920 samples).
FRAME_MS = 80.0


@dataclass
class StreamClock:
    """A running stream as the planner sees it.

    Attributes:
        frames: codec frames delivered to its client so far.
        first_chunk: monotonic seconds of its first delivered chunk, or None (none yet).
    """

    frames: int
    first_chunk: float | None

    def buffered_ms(self, now: float) -> float | None:
        """Audio the client holds but has not played, ms (negative: it is starving); None
        before the first chunk."""
        if self.first_chunk is None:
            return None
        return self.frames * FRAME_MS - (now - self.first_chunk) * 1000.0


class Planner:
    """Per-step admission decisions (see the module docstring).

    Args:
        max_join: most rows one prefill replay admits.
        guard_ms: a running stream with less buffered audio than this goes first.
        max_defer: most consecutive steps a waiting request is held back for a stream's deadline.
    """

    def __init__(self, max_join: int, guard_ms: float = 40.0, max_defer: int = 2) -> None:
        if max_join < 1:
            raise ValueError("max_join must be >= 1")
        self.max_join = max_join
        self.guard_ms = guard_ms
        self.max_defer = max_defer
        self._deferred = 0
        #: Joins held back for a stream's deadline (for logs and tests).
        self.deferrals = 0

    def tightest_ms(self, streams: Iterable[StreamClock], now: float) -> float | None:
        """The smallest buffered audio among streams that have started, ms; None if none has."""
        buffers = [b for b in (s.buffered_ms(now) for s in streams) if b is not None]
        return min(buffers) if buffers else None

    def admissions(self, free: int, streams: list[StreamClock], now: float) -> int:
        """How many waiting requests to take before this step's frame (0..``free``).

        Args:
            free: free slots.
            streams: the running streams.
            now: monotonic seconds.
        """
        if free <= 0:
            return 0
        if not streams:
            self._deferred = 0
            return free
        tightest = self.tightest_ms(streams, now)
        if tightest is not None and tightest < self.guard_ms and self._deferred < self.max_defer:
            self._deferred += 1
            self.deferrals += 1
            return 0
        self._deferred = 0
        return min(free, self.max_join)

    def chunks(self, rows: int) -> list[int]:
        """Split ``rows`` admissions into prefill replays of at most ``max_join`` rows."""
        return [min(self.max_join, rows - i) for i in range(0, rows, self.max_join)]
