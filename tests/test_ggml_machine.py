"""The CPU engines' settings chosen from the machine (``engine.cpu.machine``: the GGML engine's plan,
the pipeline engine's threads), from faked core counts, CPU flags and free memory: no library, no timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from wyoming_qwen3tts.engine.cpu.machine import available_memory, cpu_flags, plan

GB = 2**30
AVX2 = {"avx2", "fma", "f16c", "bmi2"}


def test_two_cores_get_two_streams_of_two_threads_and_say_why() -> None:
    chosen = plan(2, AVX2, 16 * GB, int(1.4 * GB), "Q8_0")
    assert (chosen.streams, chosen.threads, chosen.quant, chosen.codec) == (2, 2, "Q8_0", "qwentts.cpp")
    text = chosen.details()
    assert "1 generating, 1 decoding" in text and "second client" in text and "weights Q8_0" in text


def test_the_info_line_is_short_and_plain() -> None:
    """What a Home Assistant user reads at start-up: the choices in words, no jargon (the
    reasons are ``details``, logged at DEBUG)."""
    assert plan(4, AVX2, int(11.3 * GB), int(1.4 * GB), "Q8_0").describe() == (
        "2 requests at once, 2 threads each, 8-bit weights (4 cores, 11.3 GB free)"
    )
    assert plan(8, AVX2, 4 * GB, int(1.4 * GB), "Q4_0").describe() == (
        "1 request at once (as memory allows), 4 threads each, 4-bit weights (8 cores, 4.0 GB free)"
    )
    assert plan(2, AVX2, None, GB, "Q8_0", streams=3, threads=1).describe() == (
        "3 requests at once (--ggml-streams), 1 thread each (--ggml-threads), 8-bit weights (2 cores)"
    )
    for line in (plan(n, AVX2 | {"avx512f"}, 16 * GB, GB, "Q8_0").describe() for n in (1, 2, 8, 64)):
        assert len(line) < 90 and not any(word in line for word in ("Q8_0", "qwentts", "codec", "AVX", ";"))


def test_more_cores_give_a_stream_more_threads_leaving_room_for_two_streams() -> None:
    cores = (1, 2, 4, 6, 8, 12, 16, 32, 64)
    assert [plan(n, AVX2, None, GB, "Q8_0").threads for n in cores] == [1, 2, 2, 2, 4, 6, 8, 8, 8]
    assert [plan(n, AVX2, None, GB, "Q8_0").streams for n in cores] == [2, 2, 2, 3, 2, 2, 2, 4, 4]
    eight = plan(8, AVX2, None, GB, "Q8_0").details()
    assert "4 thread(s) a stream (2 generating, 2 decoding audio" in eight and "one per 4 threads" in eight


def test_memory_caps_the_streams_and_the_log_says_so() -> None:
    weights = int(1.4 * GB)  # 0.6B Q8_0: talker + codec files
    tight = plan(8, AVX2, 4 * GB, weights, "Q8_0")
    assert tight.streams == 1 and "free holds 1" in tight.details()
    assert plan(8, AVX2, 7 * GB, weights, "Q8_0").streams == 2  # 2.4 GB a context: its weights and KV cache
    assert plan(8, AVX2, 1 * GB, weights, "Q8_0").streams == 1  # never fewer than one


def test_options_override_each_choice() -> None:
    given = plan(2, AVX2, 1 * GB, GB, "Q4_0", streams=3, threads=1)
    assert (given.streams, given.threads, given.quant) == (3, 1, "Q4_0")
    assert "(--ggml-streams)" in given.details() and "(--ggml-threads)" in given.details()


def test_wider_isas_are_named_as_unused_by_the_avx2_build() -> None:
    assert "AVX512F/AMX_TILE here unused" in plan(2, AVX2 | {"avx512f", "amx_tile"}, None, GB, "Q8_0").details()
    assert "unused" not in plan(2, AVX2, None, GB, "Q8_0").details()


def test_flags_and_memory_are_read_from_proc_files(tmp_path: Path) -> None:
    cpuinfo, meminfo = tmp_path / "cpuinfo", tmp_path / "meminfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma avx512f\n")
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    2000000 kB\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "fma", "avx512f"}
    assert available_memory(meminfo) == 2_000_000 * 1024
    assert cpu_flags(tmp_path / "none") == set() and available_memory(tmp_path / "none") is None


# --- the pipeline engine's threads (``machine.pipeline_threads``) ------------------------


def test_pipeline_threads_split_the_cores_between_generation_and_the_codec() -> None:
    """1 + 1 on 2 cores, 2 + 2 on 4, at most 4 a side; never more threads than cores but on
    one core, where the pipeline's two sides take turns (and the log says they share it)."""
    from wyoming_qwen3tts.engine.cpu.machine import pipeline_threads

    chosen = {n: (pipeline_threads(n).generation, pipeline_threads(n).codec) for n in (1, 2, 4, 8, 16)}
    assert chosen == {1: (1, 1), 2: (1, 1), 4: (2, 2), 8: (4, 4), 16: (4, 4)}
    assert (pipeline_threads(3).generation, pipeline_threads(3).codec) == (2, 1)  # the odd core generates
    for n in (2, 3, 4, 5, 6, 7, 8, 12, 16, 64):
        plan = pipeline_threads(n)
        assert plan.generation + plan.codec <= n and "shared" not in plan.describe()
    assert pipeline_threads(2).describe() == "1 thread generating, 1 decoding audio (2 cores)"
    assert pipeline_threads(4).describe() == "2 threads generating, 2 decoding audio (4 cores)"
    assert pipeline_threads(1).describe() == "1 thread generating, 1 decoding audio (1 core, shared: more threads than cores)"


def test_pipeline_thread_options_override_and_the_other_side_takes_what_is_left() -> None:
    from wyoming_qwen3tts.engine.cpu.machine import pipeline_threads

    assert (pipeline_threads(8, generation=2).generation, pipeline_threads(8, generation=2).codec) == (2, 4)
    assert (pipeline_threads(4, codec=1).generation, pipeline_threads(4, codec=1).codec) == (3, 1)
    assert (pipeline_threads(2, generation=2).codec, pipeline_threads(16, 6, 6).codec) == (1, 6)
    given = pipeline_threads(2, 3, 2)
    assert (given.generation, given.codec) == (3, 2)
    assert given.describe() == (
        "3 threads generating (--generation-threads), 2 decoding audio (--codec-threads) (2 cores, shared: more threads than cores)"
    )
    with pytest.raises(ValueError):
        pipeline_threads(4, generation=-1)
