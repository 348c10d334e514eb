"""A server started as users start it, at the default log level, keeps its dependencies'
start-up noise out of its log (``quiet.py``): no flash-attn banner, no ``sox: not found``
from a child shell, no "Loading weights" progress bars. A lazy import of the batched
engine's prefill module (for one constant) before ``quiet.import_models`` once let all of
it through on every engine."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import start_server, stop_server

#: Slow: real server processes started as users start them.
pytestmark = pytest.mark.full

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


def test_debug_logging_keeps_numbas_compiler_trace_out() -> None:
    """With the root logger at DEBUG (``--debug``), numba compiling a function (as librosa's
    are on first use) floods the log; after ``quiet_compilers`` (called by the server at
    start, whatever the level) it logs nothing."""
    pytest.importorskip("numba")
    code = textwrap.dedent(
        """
        import logging, sys
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s %(levelname)s")
        if sys.argv[1] == "quiet":
            from wyoming_qwen3tts.common.quiet import quiet_compilers
            quiet_compilers()
        import numba
        @numba.njit
        def twice_plus_one(x):
            return x * 2 + 1
        assert twice_plus_one(3) == 7
        """
    )
    lines = {}
    for mode in ("debug", "quiet"):
        result = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        lines[mode] = [line for line in result.stdout.splitlines() if line.startswith("numba")]
    assert len(lines["debug"]) > 10  # the flood this guards against
    assert lines["quiet"] == []
