"""A server started as users start it, at the default log level, keeps its dependencies'
start-up noise out of its log (``quiet.py``): no flash-attn banner, no ``sox: not found``
from a child shell, no "Loading weights" progress bars. A lazy import of the batched
engine's prefill module (for one constant) before ``quiet.import_models`` once let all of
it through on every engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import start_server, stop_server

NOISE = ("flash-attn", "sox: not found", "SoX could not be found", "Loading weights")


@pytest.mark.parametrize("engine", ["batched", "reference"])
def test_start_up_log_holds_no_dependency_banners(checkpoints: Path, voices_dir: Path, tmp_path: Path, engine: str) -> None:
    server = start_server(checkpoints, voices_dir, tmp_path / "server.log", engine=engine, extra=["--no-zeroconf"])
    try:
        log = server.output()
        assert "Ready: Wyoming" in log
        assert [noise for noise in NOISE if noise in log] == [], log[:3000]
    finally:
        stop_server(server)
