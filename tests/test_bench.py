"""The benchmark's report (the measurements themselves need a GPU: python -m benchmarks.bench)."""

import json
from pathlib import Path

import pytest

from benchmarks.bench import Sample, summarize, write_report


def test_summarize_and_report(tmp_path: Path) -> None:
    blocks = [[Sample(0.1, 1.0, 2.0), Sample(0.3, 2.0, 2.0)], [Sample(0.2, 1.0, 2.0), Sample(0.4, 2.0, 2.0)]]
    row = summarize("wyoming", "aria", 2, 2, blocks, queue_wait_ms=12.0)
    assert row.first_audio_p50_ms == pytest.approx(250)
    assert row.speed_per_stream == pytest.approx(1.5)  # median of 2.0, 1.0, 2.0, 1.0
    assert row.speed_aggregate == pytest.approx(2.0)  # 4 s of audio in 2 s of wall time
    engine = summarize("engine", "aria", 2, 2, blocks)
    table = write_report([engine, row], {"gpu": "Test GPU", "settings": {}, "ratios": {"x": 1.05}}, tmp_path)
    assert "| wyoming | aria | 2 | 2 | 2 | 250 |" in table and "| x | 1.050 |" in table
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["rows"][1]["queue_wait_ms"] == 12.0
    assert (tmp_path / "results.md").read_text().startswith("# Benchmark on Test GPU")
    assert (tmp_path / "first_audio.png").stat().st_size > 1000
