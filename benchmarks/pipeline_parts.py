"""Where the pipeline engine's time goes: its two halves timed apart, on the cores it is given.

    python -m benchmarks.pipeline_parts --checkpoint CKPT --data DIR [--threads 1 2] [--frames 30] [--out JSON]

The pipeline engine (``--engine pipeline``) generates codec frames with our ggml graphs
(``engine.cpu.native.GgmlFrameSource``: one talker step and the code predictor's 15 passes a
frame) on one set of threads and decodes them with ONNX Runtime's streaming codec step
(``engine.cpu.onnx_codec``) on another; the slower half sets the pace. For each thread count
``t`` this times, in one process, on the checkpoint's GGUF files (converted once into
``DATA/models`` as the server does, ``--quant``) and its exported codec (``DATA/models/onnx-codec``):

* ``first_frame_ms``: the prompt's prefill and the first frame (``frames()``'s first code);
* ``generation_ms``: one frame after the first (median of ``--frames``), ``t`` ggml threads;
* ``codec_ms``: one frame through the codec step (median), ``t`` ONNX Runtime threads;
* ``pace_ms`` = max(generation, codec) and ``speed`` = 80 / pace: what the two halves give
  side by side on ``2 t`` cores when neither slows the other (a bound: they share caches and
  memory bandwidth), and ``serial_speed`` = 80 / (generation + codec): both on the same ``t``.

Greedy sampling, EOS held back (``min_new_tokens``), CustomVoice ``ryan``, the sentence of
``benchmarks.cpu_bench``. A frame is 80 ms of audio. Figures, not tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.cpu_bench import TEXT


def _time_generation(folder: Path, threads: int, frames: int) -> tuple[float, list[float], list]:
    """(first frame ms, per-frame ms after it, the codes) of one greedy segment."""
    from wyoming_qwen3tts.engine.cpu.native.generator import GgmlFrameSource
    from wyoming_qwen3tts.engine.segment import Sampling, Segment

    source = GgmlFrameSource(folder, threads)
    try:
        segment = Segment(text=TEXT, language="english", max_new_tokens=frames, min_new_tokens=frames,
                          speaker="ryan", seed=1, sampling=Sampling.greedy())
        codes = []
        stamps = [time.perf_counter()]
        for frame in source.frames(segment):
            stamps.append(time.perf_counter())
            codes.append(frame)
    finally:
        source.close()
    steps = [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])]
    return steps[0], steps[1:], codes


def _time_codec(model: Path, threads: int, codes: list) -> list[float]:
    """Per-frame ms of decoding ``codes`` one frame a call, after one warm-up frame."""
    from wyoming_qwen3tts.engine.cpu.onnx_codec import OnnxCodec

    stream = OnnxCodec(model, threads).stream()
    stream.decode(codes[0])
    times = []
    for frame in codes[1:]:
        started = time.perf_counter()
        stream.decode(frame)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a Qwen3-TTS checkpoint folder")
    parser.add_argument("--data", type=Path, required=True, help="a data folder (conversions and export kept there)")
    parser.add_argument("--quant", default="Q8_0")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from wyoming_qwen3tts.engine.cpu.gguf_files import resolve_gguf
    from wyoming_qwen3tts.engine.cpu.onnx_export import exported_codec_in_child

    talker, _ = resolve_gguf(str(args.checkpoint), args.data / "models", args.quant, local_files_only=True)
    model = exported_codec_in_child(args.checkpoint, args.data)
    rows = []
    for threads in args.threads:
        load = os.getloadavg()[0]
        first, steps, codes = _time_generation(talker.parent, threads, args.frames)
        codec = _time_codec(model, threads, codes)
        generation, decode = statistics.median(steps), statistics.median(codec)
        row = {
            "threads": threads, "quant": args.quant, "first_frame_ms": round(first, 1),
            "generation_ms": round(generation, 1), "codec_ms": round(decode, 1),
            "pace_ms": round(max(generation, decode), 1), "speed": round(80 / max(generation, decode), 3),
            "serial_speed": round(80 / (generation + decode), 3), "loadavg_1min": round(load, 2),
        }
        print(row, flush=True)
        rows.append(row)
    result = {"checkpoint": str(args.checkpoint), "frames": args.frames, "cores": len(os.sched_getaffinity(0)),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
