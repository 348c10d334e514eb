"""How long a clone voice waits for its first audio on the GGML engine, by reference length.

qwentts.cpp runs its codec over a clone's reference codes (ICL: a clip with its transcript)
before the first chunk of the new speech comes out, the first time a context meets those
codes (it keeps the result: later requests with the same codes start at once). That first
chunk waits about one codec frame's decode (150 ms on one core of this project's CPU
machine) per 80 ms of reference. An x-vector clone (no transcript) has no reference codes
in its prompt and starts at once. This script measures, for clips of several lengths, the
x-vector stream and two ICL streams in a row (``ICL`` the first, ``ICL again`` the second),
with the thread split the server uses for ``threads`` threads a stream
(``engine.ggml.thread_split``), greedy, a frame cap of 8. The clips are a 220 Hz tone: only
their length matters here.

    python -m benchmarks.ggml_clone_onset --talker T.gguf --codec C.gguf [--threads 2] [--out FILE.json]

Prints a Markdown table; ``--out`` also writes ``{"rows": [{"clip_s", "ref_frames",
"mode", "first_chunk_ms", "total_ms"}]}`` (mode: "x-vector", "ICL", "ICL again"). Figures, not tests: the machine's load moves them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from wyoming_qwen3tts.engine.cpu.ggml import thread_split

RATE = 24000
CLIPS_S = (1.0, 2.5, 5.0, 10.0)
TEXT = "Hello there, this is a test of the first audio."


def measure(talker: Path, codec: Path, threads: int) -> list[dict[str, object]]:
    """One row per (clip length, mode): first chunk and whole request, in ms."""
    import qwentts_cpp_cpu

    generating, decoding = thread_split(threads)
    context = qwentts_cpp_cpu.QwenTTS(
        talker, codec, cpu_threads=generating, cpu_codec_threads=decoding, cpu_stream_frames=1
    )
    rows: list[dict[str, object]] = []
    for clip_s in CLIPS_S:
        tone = (0.1 * np.sin(2 * np.pi * 220 * np.arange(int(RATE * clip_s)) / RATE)).astype(np.float32)
        ref = context.extract_voice_ref(tone)
        icl = dict(ref_spk_emb=ref.ref_spk_emb, ref_codes=ref.ref_codes, ref_text="A tone.")
        modes = [("x-vector", dict(ref_spk_emb=ref.ref_spk_emb)), ("ICL", icl), ("ICL again", icl)]
        for mode, kwargs in modes:
            started = time.perf_counter()
            first = None
            for _chunk, _rate in context.stream(
                text=TEXT, lang="english", seed=1, max_new_tokens=8, do_sample=False, **kwargs
            ):
                first = first if first is not None else time.perf_counter() - started
            rows.append({
                "clip_s": clip_s, "ref_frames": int(ref.ref_codes.shape[1]), "mode": mode,
                "first_chunk_ms": round((first or 0.0) * 1e3), "total_ms": round((time.perf_counter() - started) * 1e3),
            })
            print(rows[-1], flush=True)
    context.close()
    return rows


def table(rows: list[dict[str, object]]) -> str:
    """The rows as Markdown: one line per clip, first chunk of both modes."""
    lines = [
        "| reference clip | reference frames | first audio, ICL, first time | ICL, next time | x-vector |",
        "| --- | --- | --- | --- | --- |",
    ]
    for clip_s in CLIPS_S:
        by_mode = {r["mode"]: r for r in rows if r["clip_s"] == clip_s}
        lines.append(
            f"| {clip_s:g} s | {by_mode['ICL']['ref_frames']} | {by_mode['ICL']['first_chunk_ms']} ms "
            f"| {by_mode['ICL again']['first_chunk_ms']} ms | {by_mode['x-vector']['first_chunk_ms']} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--talker", type=Path, required=True)
    parser.add_argument("--codec", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2, help="threads a stream, split as the server splits them")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = measure(args.talker, args.codec, args.threads)
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
