"""The planner's decisions (``engine/planner.py``), with fake streams: no model, no tensors."""

from __future__ import annotations

import pytest

from wyoming_qwen3tts.engine.planner import FRAME_MS, Planner, StreamClock


def test_buffered_audio_is_frames_sent_minus_time_since_the_first_chunk() -> None:
    assert StreamClock(5, None).buffered_ms(10.0) is None
    assert StreamClock(5, 10.0).buffered_ms(10.1) == pytest.approx(5 * FRAME_MS - 100)
    assert StreamClock(1, 10.0).buffered_ms(10.5) == pytest.approx(-420)  # a client far behind


def test_nothing_running_admits_everything_that_fits() -> None:
    planner = Planner(max_join=8)
    assert planner.admissions(32, [], now=0.0) == 32
    assert planner.chunks(32) == [8, 8, 8, 8]
    assert planner.chunks(19) == [8, 8, 3]
    assert planner.admissions(0, [], now=0.0) == 0


def test_with_streams_running_a_step_admits_at_most_one_replay() -> None:
    planner = Planner(max_join=8)
    ahead = [StreamClock(40, 0.0) for _ in range(4)]  # 3.2 s sent, 1 s played
    assert planner.admissions(28, ahead, now=1.0) == 8
    assert planner.admissions(3, ahead, now=1.0) == 3


def test_a_stream_about_to_starve_goes_first_but_not_forever() -> None:
    planner = Planner(max_join=8, guard_ms=40.0, max_defer=2)
    starving = [StreamClock(40, 0.0), StreamClock(2, 0.0)]  # the second: 160 ms sent, 130 played
    assert planner.admissions(10, starving, now=0.13) == 0
    assert planner.admissions(10, starving, now=0.13) == 0
    assert planner.admissions(10, starving, now=0.13) == 8  # a new request waits two steps at most
    assert planner.deferrals == 2
    assert planner.admissions(10, starving, now=0.13) == 0  # the count starts again


def test_new_streams_without_audio_have_no_deadline() -> None:
    planner = Planner(max_join=4)
    assert planner.admissions(10, [StreamClock(0, None)], now=5.0) == 4
    with pytest.raises(ValueError):
        Planner(max_join=0)
