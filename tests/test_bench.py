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


def test_memory_benchmark_reads_the_server_log_and_writes_its_table(tmp_path: Path) -> None:
    from benchmarks.memory import Row, parse_log, write

    log = (
        "INFO wyoming_qwen3tts: GPU memory: 7.5 GB for this server (--gpu-memory 7.5); weights base 3.9 GB, "
        "voice_design 3.9 GB; the models do not fit on the GPU together (9.9 GB needed with 2 streams each, "
        "7.5 GB available): one at a time\n"
        "INFO wyoming_qwen3tts.engine.loader: base model: 19 stream(s), what the memory holds (2.5 GB free ...)\n"
    )
    assert parse_log(log) == (19, "turns")
    assert parse_log(log.replace("the models do not fit on the GPU together", "the VoiceDesign model stays in GPU memory")) == (19, "resident")
    assert parse_log("nothing") == (None, None)
    retried = log + (
        "WARNING wyoming_qwen3tts.engine.loader: base model: out of GPU memory while loading or capturing its graphs\n"
        "INFO wyoming_qwen3tts.engine.loader: base model: 19 stream(s), what the memory holds (2.4 GB free ...); "
        "11 after an out-of-memory at start; KV for 1024 positions a stream\n"
    )
    assert parse_log(retried) == (11, "turns")  # the streams it serves with, not the first plan
    write([Row(8, "defaults", True, 7.5, "turns", 19, 7.9, 40.0, 45.0, 3.1, 60.0, 2.4, 9000.0)], tmp_path, "NVIDIA H200")
    rows = json.loads((tmp_path / "memory.json").read_text())["rows"]
    assert set(rows[0]) == {"card_gb", "options", "started", "streams", "peak_gb", "ttfa_p50_ms", "speed"}
    assert rows[0]["card_gb"] == 8 and rows[0]["streams"] == 19 and rows[0]["started"] is True
    assert "| 8 GB | defaults | yes | 40.0 | turns | 19 | 7.9 | 45.0 | 3.1 | 60.0 | 2.4 | 9000.0 |  |" in (tmp_path / "memory.md").read_text()
