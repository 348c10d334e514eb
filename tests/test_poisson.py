"""The Poisson benchmark (``benchmarks/poisson.py``): its accounting, and a short run against a
real server on the tiny checkpoints (the figures themselves are GPU benchmark outputs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.poisson import JSON_FIELDS, Outcome, arrivals, histogram_quantile, main, percentile, stall_max

from .conftest import start_server, stop_server


def test_underruns_are_chunks_that_arrive_after_the_audio_before_them_has_played() -> None:
    # 80 ms chunks (1920 samples): the second is in time, the third 50 ms late, and after that
    # playback restarts from the late chunk's arrival, so the fourth is in time again.
    out = Outcome(0.0, True, chunks=[(0.10, 1920), (0.15, 1920), (0.31, 1920), (0.35, 1920)])
    out.account()
    assert out.first_audio == 0.10
    assert out.underruns == 1
    assert out.late_s == pytest.approx(0.05)
    assert out.samples == 4 * 1920


def test_arrivals_are_seeded_poisson() -> None:
    times = arrivals(20.0, 200.0, seed=3)
    assert times == arrivals(20.0, 200.0, seed=3) and times != arrivals(20.0, 200.0, seed=4)
    assert all(0 <= a < b < 200 for a, b in zip(times, times[1:]))
    assert len(times) == pytest.approx(4000, rel=0.05)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.05, rel=0.05)


def test_join_stall_quantile_from_histogram_increase() -> None:
    before = {0.005: 10.0, 0.01: 10.0, 0.02: 10.0, math.inf: 10.0}
    after = {0.005: 10.0, 0.01: 60.0, 0.02: 110.0, math.inf: 110.0}  # 100 new: 50 in (5, 10], 50 in (10, 20]
    value, count = histogram_quantile(0.95, before, after)
    assert count == 100 and value == pytest.approx(0.019)
    assert histogram_quantile(0.95, after, after) == (None, 0)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0 and percentile([], 95) is None
    assert stall_max(before, after) == 0.02  # the highest bucket any new observation reached
    assert stall_max(after, after) is None
    assert stall_max({}, {0.005: 1.0, math.inf: 2.0}) == math.inf


@pytest.mark.full
def test_a_short_run_against_a_real_server(checkpoints: Path, voices_dir: Path, tmp_path: Path) -> None:
    server = start_server(
        checkpoints, voices_dir, tmp_path / "server.log", engine="batched",
        extra=["--no-zeroconf", "--fixed-frames", "4", "--max-streams", "4", "--anchors", "off"],
    )
    try:
        code = main([
            "--wyoming-port", str(server.port), "--http-port", str(server.http_port), "--rates", "2",
            "--seconds", "2", "--warmup-s", "0.5", "--pause-s", "0", "--voices", "clone,custom_voice",
            "--http-voices", "custom_voice", "--seed", "1", "--out", str(tmp_path / "out"), "--gpu", "cpu",
            "--bursts", "1", "--burst-running", "2", "--burst-joiners", "2",
        ])
    finally:
        stop_server(server)
    assert code == 0
    exact = json.loads((tmp_path / "out" / "poisson.json").read_text())
    assert all(tuple(row) == JSON_FIELDS for row in exact["rows"])  # the fields, no more
    data = json.loads((tmp_path / "out" / "poisson-detail.json").read_text())
    assert [{k: r[k] for k in JSON_FIELDS} for r in data["rows"]] == exact["rows"]
    assert [(r["door"], r["voice"]) for r in data["rows"]] == [
        ("wyoming", "clone"), ("wyoming", "custom_voice"), ("http", "custom_voice")
    ]
    for row in data["rows"]:
        assert row["n"] == len([t for t in arrivals(2.0, 2.5, 1000 + 20) if t >= 0.5])
        assert (row["refused"], row["failed"]) == (0, 0), row["errors"]
        assert row["n"] == 0 or row["ttfa_p50_ms"] > 0
        assert row["n"] == 0 or row["audio_s_mean"] == pytest.approx(4 * 0.08)
        assert row["n"] == 0 or len(row["first_frames_db"]) == 4
        # Joins into running streams only (4-frame replies on the CPU rarely overlap); the stall
        # itself is checked on the engine in tests/test_intake.py.
        assert row["joins"] == 0 or row["join_stall_p95_ms"] > 0
    assert [(b["voice"], b["joiners"], b["failed"]) for b in data["bursts"]] == [("clone", 2, 0), ("custom_voice", 2, 0)]
    assert all(b["ttfa_p50_ms"] > 0 for b in data["bursts"])
    assert "| wyoming | clone | 2 |" in (tmp_path / "out" / "poisson.md").read_text()
    assert "| clone | 2 | 2 x 1 |" in (tmp_path / "out" / "poisson.md").read_text()
    assert (tmp_path / "out" / "poisson.png").stat().st_size > 1000


@pytest.mark.parametrize(("served", "anchor", "renders"), [
    ("designed-live", "ready", 0),  # rendered, but no Base model to clone it: final
    ("designed-live", "off", 0),
    ("anchor", "ready", 0),
    ("designed-live", "pending", 1),  # rendered by its first use: asked for until the deadline
])
def test_wait_ready_stops_once_the_presets_anchor_state_is_final(served: str, anchor: str, renders: int) -> None:
    """``wait_ready`` renders the preset's anchor (a speech request) only while that anchor is
    still to come; with the Base model off a rendered anchor leaves the preset designed live,
    and it waited out its whole deadline re-rendering it (stop 38's last device call).
    ``renders``: the least number of speech requests (0: none at all)."""
    import argparse
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from benchmarks.poisson import VOICES, wait_ready

    posts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"{}" if self.path == "/ready" else json.dumps(
                {"voices": [{"name": VOICES["preset"], "served": served, "anchor": anchor}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = argparse.Namespace(http_port=server.server_address[1], voices=["preset"], ready_s=2.5)
        wait_ready(args)
    finally:
        server.shutdown()
    assert set(posts) <= {"/v1/audio/speech"}
    assert len(posts) >= renders if renders else not posts
