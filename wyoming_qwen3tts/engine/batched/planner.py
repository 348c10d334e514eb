"""What the batched engine runs next: decisions only, no tensors (unit-tested with fake stages).

Each step the engine asks the planner how many waiting (prepared) requests to prefill before
the frame step. A prefill is one graph replay for at most ``max_join`` rows
(``prefill.MAX_JOIN``), during which every running stream waits; the frame step (talker,
code predictor, and the codec decode overlapping the next one) always runs for every row,
since one graph per batch bucket serves them all. So the choice each step is how many
replays run before it:

* with nothing running, admit everything that fits (a replay per ``max_join`` rows, back to
  back: no one is waiting on the frame step);
* a stream about to run out of buffered audio goes first: while the tightest stream's buffer
  is below ``guard_ms`` (one join plus one step, with margin), joins wait a step, but never
  more than ``max_defer`` steps in a row, so a new request still gets its first frame soon;
* otherwise one replay (``max_join`` rows) per step; more only while every running stream is
  far enough ahead of playback to yield the time: ``k`` replays need ``k x join_ms`` of
  everyone's buffer beyond ``guard_ms`` and a step, and no row may be waiting for its first
  audio (extra replays would delay it). That is how streams far ahead yield to a burst of
  joins without breaking the one-graph-per-batch-bucket step: the step is not split, it is
  put off.

A stream's deadline is when its client runs out of audio: playback starts when the first
chunk arrives and plays each chunk after the one before; a chunk that arrives after the audio
before it has played restarts playback at its arrival (as the benchmark counts underruns).
A client far behind (it underran) is thus as urgent as its latest chunk says, not forever
behind; a stream with nothing sent yet has no deadline.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: Audio per codec frame, ms (12.5 frames per second at 24 kHz: 1920 samples).
FRAME_MS = 80.0


@dataclass
class StreamClock:
    """When a running stream's client runs out of audio.

    Attributes:
        play_end: monotonic seconds at which the audio sent so far has all played, or None
            (nothing sent yet).
    """

    play_end: float | None = None

    def sent(self, frames: int, now: float) -> None:
        """``frames`` codec frames reached the client at ``now`` (monotonic seconds); a chunk
        after an underrun restarts playback at its arrival."""
        start = now if self.play_end is None or self.play_end < now else self.play_end
        self.play_end = start + frames * FRAME_MS / 1000.0

    def buffered_ms(self, now: float) -> float | None:
        """Audio the client holds but has not played, ms (negative: it ran out that long ago);
        None before the first chunk."""
        if self.play_end is None:
            return None
        return (self.play_end - now) * 1000.0


class Planner:
    """Per-step admission decisions (see the module docstring).

    Args:
        max_join: most rows one prefill replay admits.
        guard_ms: a running stream with less buffered audio than this goes first.
        max_defer: most consecutive steps a waiting request is held back for a stream's deadline.
        join_ms: first estimate of one prefill replay's stall, ms (then measured: ``observe_join``).
        step_ms: a frame step's time, ms (a margin in the extra-replay rule).
        max_replays: most replays before one step while streams run.

    Raises:
        ValueError: ``max_join`` or ``max_replays`` below 1.
    """

    def __init__(self, max_join: int, guard_ms: float = 40.0, max_defer: int = 2, join_ms: float = 10.0,
                 step_ms: float = 25.0, max_replays: int = 4) -> None:
        if max_join < 1 or max_replays < 1:
            raise ValueError("max_join and max_replays must be >= 1")
        self.max_join = max_join
        self.guard_ms = guard_ms
        self.max_defer = max_defer
        self.join_ms = join_ms
        self.step_ms = step_ms
        self.max_replays = max_replays
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
        replays = 1
        if tightest is not None and all(s.play_end is not None for s in streams):
            spare = tightest - self.guard_ms - self.step_ms
            replays = max(1, math.floor(spare / max(self.join_ms, 1e-3)))
        return min(free, self.max_join * min(replays, self.max_replays))

    def observe_join(self, stall_ms: float, replays: int) -> None:
        """A measured stall of an admission of ``replays`` replays: updates ``join_ms``
        (exponential average, weight 0.2)."""
        if replays > 0 and stall_ms > 0:
            self.join_ms += 0.2 * (stall_ms / replays - self.join_ms)

    def chunks(self, rows: int) -> list[int]:
        """Split ``rows`` admissions into prefill replays of at most ``max_join`` rows."""
        return [min(self.max_join, rows - i) for i in range(0, rows, self.max_join)]
