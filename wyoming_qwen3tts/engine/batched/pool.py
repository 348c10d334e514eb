"""The slot pool's bookkeeping: which stream holds which slot, and compaction.

Active streams always hold slots ``[0, n)``, in admission order but for compaction, so
that a step over the first ``n`` rows (one graph per batch bucket) covers them all. When
streams end, each hole is filled by moving the last row into it; the device tensors of a
slot (talker and predictor positions, KV, sampling state, codec decoder state) are moved by
the ``move(src, dst)`` callback of the engine that owns them. No tensors here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..base import Work
from .planner import StreamClock


@dataclass
class Row:
    """One active segment in a slot.

    Attributes:
        work: the segment and its sink.
        max_frames: codec frames it may generate at most.
        prompt_len: its prompt's length (talker KV positions).
        frames: codec frames generated (delivered to the row) so far.
        pcm: float32 [samples_per_frame] frames buffered for its next chunk.
        finished: ended (EOS, cap, cache end, cancel, failure): its slot frees at ``retire``.
        admitted: monotonic seconds of its admission.
        first_audio: seconds from admission to its first chunk, or None.
        clock: when its client runs out of audio (the planner's deadline).
        chunks: chunks sent.
    """

    work: Work
    max_frames: int
    prompt_len: int
    frames: int = 0
    pcm: list[np.ndarray] = field(default_factory=list)
    finished: bool = False
    admitted: float = field(default_factory=time.monotonic)
    first_audio: float | None = None
    clock: StreamClock = field(default_factory=StreamClock)
    chunks: int = 0


class SlotPool:
    """Rows in slots ``[0, len(rows))`` of a pool of ``capacity``.

    Args:
        capacity: slots.
        move: copies slot ``src``'s device state into slot ``dst`` (compaction).
    """

    def __init__(self, capacity: int, move: Callable[[int, int], None]) -> None:
        self.capacity = capacity
        self.rows: list[Row] = []
        self._move = move

    @property
    def free(self) -> int:
        """Slots without a row."""
        return self.capacity - len(self.rows)

    def add(self, row: Row) -> int:
        """Put ``row`` in the next slot; returns that slot.

        Raises:
            RuntimeError: the pool is full.
        """
        if not self.free:
            raise RuntimeError("no free slot")
        self.rows.append(row)
        return len(self.rows) - 1

    def clocks(self) -> list[StreamClock]:
        """Each running row's playback clock, by slot."""
        return [row.clock for row in self.rows]

    def longest(self) -> int:
        """The most KV positions a row uses (prompt + frames); 0 when empty."""
        return max((row.prompt_len + row.frames for row in self.rows), default=0)

    def retire(self) -> list[tuple[int, int]]:
        """Free the slots of finished rows, moving the last running rows into the holes (a
        finished row is never moved); returns the moves made, (src, dst)."""
        moves: list[tuple[int, int]] = []
        rows = self.rows
        i = 0
        while True:
            while rows and rows[-1].finished:
                rows.pop()
            if i >= len(rows):
                return moves
            if rows[i].finished:
                last = len(rows) - 1
                self._move(last, i)
                moves.append((last, i))
                rows[i] = rows.pop()
            i += 1

    def clear(self) -> list[Row]:
        """Empty the pool; returns the rows it held."""
        rows, self.rows = self.rows, []
        return rows
