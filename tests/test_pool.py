"""The slot pool's bookkeeping (``engine/batched/pool.py``): rows stay in slots [0, n), a finished
row's hole is filled by the last row, and the device move is asked for exactly those moves."""

from __future__ import annotations

import pytest

from wyoming_qwen3tts.engine import Segment, Work
from wyoming_qwen3tts.engine.batched.pool import Row, SlotPool

from .engine_driver import Collect


def row(name: str) -> Row:
    return Row(Work(Segment(name, "english", 4), Collect()), max_frames=4, prompt_len=10)


def test_finished_rows_free_their_slots_by_moving_the_last_rows_in() -> None:
    moved: list[tuple[int, int]] = []
    pool = SlotPool(5, lambda src, dst: moved.append((src, dst)))
    rows = [row(n) for n in "abcde"]
    assert [pool.add(r) for r in rows] == [0, 1, 2, 3, 4] and pool.free == 0
    with pytest.raises(RuntimeError):
        pool.add(row("f"))
    rows[1].finished = rows[4].finished = rows[2].finished = True  # b, c, e end
    assert pool.retire() == moved == [(3, 1)]  # e's slot just frees; d moves into b's, c's frees
    assert [r.work.segment.text for r in pool.rows] == ["a", "d"] and pool.free == 3
    rows[0].frames = 7
    assert pool.longest() == 17 and len(pool.clocks()) == 2
    assert pool.clear() == [rows[0], rows[3]] and pool.rows == [] and pool.longest() == 0


def test_retiring_everything_or_nothing_moves_nothing() -> None:
    moved: list[tuple[int, int]] = []
    pool = SlotPool(3, lambda src, dst: moved.append((src, dst)))
    rows = [row(n) for n in "abc"]
    for r in rows:
        pool.add(r)
    assert pool.retire() == [] and len(pool.rows) == 3
    for r in rows:
        r.finished = True
    assert pool.retire() == [] and pool.rows == [] and moved == []
