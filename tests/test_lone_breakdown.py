"""A request's timeline to first audio (``timeline``, issue 27 item 2): every point in the
server's log line, in order, for real requests through a real server; and the parser
(``benchmarks/lone_breakdown.py``) on a recorded log. No timing asserts beyond the order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import lone_breakdown, poisson
from wyoming_qwen3tts.common.timeline import POINTS, Timeline

from .conftest import start_server, stop_server

#: Three requests as a server logs them, with other lines between (the third lacks points).
RECORDED = """\
2026-12-02 15:00:00,001 INFO wyoming_qwen3tts.startup: Ready: Wyoming on tcp://127.0.0.1:10300
2026-12-02 15:00:01,100 INFO wyoming_qwen3tts.service.speech: wyoming request ok: voice ryan, 40 chars, 1 sentence(s), \
first audio 20 ms (queued 0.1, taken 0.2, prompt 1.0, admitted 2.0, prefill 4.0, first frame 10.0, decoded 12.0, \
delivered 12.5, written 13.0), 6.00 s of audio
2026-12-02 15:00:02,100 INFO wyoming_qwen3tts.service.speech: http request ok: voice ryan, 40 chars, 1 sentence(s), \
first audio 90 ms (queued 0.1, written 95.0), 6.00 s of audio
2026-12-02 15:00:03,100 INFO wyoming_qwen3tts.service.speech: wyoming request ok: voice aria (anchor), 40 chars, \
1 sentence(s), first audio 30 ms (queued 0.3, taken 0.4, prompt 2.0, admitted 3.0, prefill 6.0, first frame 14.0, \
decoded 18.0, delivered 18.5, written 21.0), 6.00 s of audio
2026-12-02 15:00:04,100 INFO wyoming_qwen3tts.service.speech: wyoming request cancelled: voice ryan, 4 chars, \
1 sentence(s), first audio none, 0.00 s of audio
2026-12-02 15:00:05,100 INFO wyoming_qwen3tts.service.speech: wyoming request ok: voice ryan, 40 chars, 1 sentence(s), \
first audio 40 ms (queued 0.5, taken 0.6, prompt 3.0, admitted 4.0, prefill 8.0, first frame 18.0, decoded 24.0, \
delivered 24.5, written 29.0), 6.00 s of audio
"""


def test_a_timeline_keeps_each_points_first_time_and_says_them_in_order() -> None:
    timeline = Timeline(arrived=10.0)
    assert timeline.describe() == ""
    timeline.mark("decoded", 10.0125)
    timeline.mark("queued", 10.0001)
    timeline.mark("queued", 10.5)  # a later segment does not move it
    assert timeline.describe() == "queued 0.1, decoded 12.5"
    with pytest.raises(AttributeError):
        timeline.mark("nowhere")


def test_the_parser_gives_percentiles_of_points_and_phases_of_a_recorded_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(RECORDED)
    requests = lone_breakdown.parse(RECORDED.splitlines(), "wyoming")
    assert [r.first_audio_ms for r in requests] == [20.0, 30.0, 40.0]  # ok only, this door only
    summary = lone_breakdown.summarize(requests)
    assert list(summary["points"]) == list(POINTS.values())
    frame = summary["points"]["first frame"]
    assert (frame["at_p50_ms"], frame["at_p99_ms"]) == (14.0, 17.92)  # linear between 14 and 18
    assert (frame["phase_p50_ms"], frame["phase_p99_ms"]) == (8.0, 9.96)  # 6, 8, 10 after the prefill
    assert summary["points"]["queued"]["phase_p50_ms"] == 0.3  # the first phase is from arrival
    assert summary["server_first_audio"] == {"p50_ms": 30.0, "p99_ms": 39.8, "n": 3}
    # a window on the log's clock, and the last N of it
    assert len(lone_breakdown.parse(RECORDED.splitlines(), "wyoming", since=lone_breakdown._when("2026-12-02 15:00:02"))) == 2
    client = tmp_path / "poisson.json"
    client.write_text(json.dumps({"rows": [{"door": "wyoming", "n": 2, "ttfa_p50_ms": 25.0, "ttfa_p99_ms": 33.0}]}))
    out = tmp_path / "out"
    assert lone_breakdown.main([str(log), "--last", "2", "--client", str(client), "--out", str(out)]) == 0
    written = json.loads((out / "lone_breakdown.json").read_text())
    assert written["n"] == 2 and written["points"]["written"]["at_p50_ms"] == 25.0
    assert written["client_first_audio"] == {"p50_ms": 25.0, "p99_ms": 33.0, "n": 2}
    assert "| first frame | 16.0 | 18.0 | 9.0 | 10.0 |" in (out / "lone_breakdown.md").read_text()
    assert lone_breakdown.main([str(log), "--door", "websocket", "--out", str(out)]) == 1


@pytest.mark.full
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_every_point_is_logged_in_order_for_requests_through_a_real_server(
    checkpoints: Path, voices_dir: Path, tmp_path: Path, device: str
) -> None:
    # As ``benchmarks/gpu.sh breakdown`` runs it: the CustomVoice model alone, the Poisson
    # client at 2 req/s on both doors, then the parser on the server's log. On CUDA the
    # prefill's and first frame's points come from timing events.
    server = start_server(
        checkpoints, voices_dir, tmp_path / "server.log", device=device, engine="batched" if device == "cpu" else None,
        extra=["--no-zeroconf", "--clone-model", "none", "--design-model", "none", "--voice", "ryan",
               "--fixed-frames", "3", "--max-streams", "4"],
    )
    try:
        code = poisson.main([
            "--wyoming-port", str(server.port), "--http-port", str(server.http_port), "--rates", "2",
            "--seconds", "1.5", "--warmup-s", "0", "--pause-s", "0", "--voices", "custom_voice",
            "--seed", "1", "--out", str(tmp_path / "out"), "--gpu", "cpu",
        ])
    finally:
        stop_server(server)
    assert code == 0
    lines = server.output().splitlines()
    for door in ("wyoming", "http"):
        requests = lone_breakdown.parse(lines, door)
        assert requests, server.output()[-3000:]
        for request in requests:
            assert list(request.points) == list(POINTS.values()), request
            offsets = list(request.points.values())
            assert offsets[0] >= 0 and offsets == sorted(offsets), request
    out = tmp_path / "breakdown"
    args = [str(server.log), "--door", "wyoming", "--client", str(tmp_path / "out" / "poisson.json"), "--out", str(out)]
    assert lone_breakdown.main(args) == 0
    summary = json.loads((out / "lone_breakdown.json").read_text())
    assert list(summary["points"]) == list(POINTS.values()) and summary["client_first_audio"]["p50_ms"] is not None
