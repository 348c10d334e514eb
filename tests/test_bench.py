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
    from benchmarks.memory import JSON_FIELDS, Row, parse_log, write

    log = (
        "INFO wyoming_qwen3tts: GPU memory: 7.4 GB for this server; weights base 3.9 GB, "
        "voice_design 3.9 GB; the models do not fit on the GPU together (9.9 GB needed with 2 streams each, "
        "7.4 GB available): one at a time\n"
        "INFO wyoming_qwen3tts.engine.gpu.on_demand: base model is in GPU memory (10.4 s to load, 12 stream(s))\n"
        "INFO wyoming_qwen3tts: Ready: Wyoming on tcp://127.0.0.1:1\n"
        "INFO wyoming_qwen3tts.engine.gpu.on_demand: base model out: 0.01 GB allocated, 0.02 GB reserved (0.00 GB of it not releasable)\n"
        "INFO wyoming_qwen3tts.engine.gpu.on_demand: voice_design model is in GPU memory (9.1 s to load, 11 stream(s))\n"
        "INFO wyoming_qwen3tts.engine.gpu.on_demand: voice_design model: the longest-waiting request waited 9.8 s for it\n"
        "INFO wyoming_qwen3tts.engine.gpu.on_demand: base model is in GPU memory (10.0 s to load, 12 stream(s))\n"
        "INFO wyoming_qwen3tts.engine.gpu.on_demand: base model: the longest-waiting request waited 10.2 s for it\n"
    )
    said = parse_log(log)
    assert said["resident"] == ["base"] and said["streams"] == {"base": 12, "voice_design": 11}
    assert said["streams_per_load"] == {"base": [12, 12], "voice_design": [11]}
    assert said["swap_waits_s"] == [9.8, 10.2] and said["allocated_after_leaving_gb"] == [0.01]
    assert said["precision"] is None and parse_log(log + "INFO x: weights precision: int8 (5.1 GB free)\n")["precision"] == "int8"
    both = parse_log(
        "GPU memory: 23.4 GB for this server; weights ...; the VoiceDesign model stays in GPU memory (...)\n"
        "INFO wyoming_qwen3tts: base model ready (batched CUDA-graph engine, 32 stream(s) at once)\n"
    )
    assert both["resident"] == ["base", "voice_design"] and both["streams"] == {"base": 32}
    row = Row(8, started=True, resident=["base"], streams={"base": 12}, first_audio_ms={"clone": 21.0}, swap_wait_max_ms=10200.0,
              leak_mb_per_swap=0.4, speed_1=11.8, speed_4=9.9, swaps=4)
    write([row, Row(4, note="Cannot load the base model: it does not fit")], tmp_path, "NVIDIA H200")
    rows = json.loads((tmp_path / "memory.json").read_text())["rows"]
    assert tuple(rows[0]) == JSON_FIELDS and rows[0]["free_gb"] == 8 and rows[0]["streams"] == {"base": 12}
    assert rows[1]["started"] is False and rows[1]["first_audio_ms"] == {}
    table = (tmp_path / "memory.md").read_text()
    assert "| 8 GB | yes |  | base | base 12 |  |  |  | 21.0 |  | 10200.0 | 0.4 | 11.8 / 9.9 |  |" in table
    assert "| 4 GB | no |" in table and "does not fit" in table