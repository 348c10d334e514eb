"""Where a frame's time goes on the GPU: the batched step by part and batch size, in one run
next to faster-qwen3-tts's own single-stream generator.

``python -m benchmarks.profile_step [--checkpoint DIR]`` on an NVIDIA GPU (a full-size random
VoiceDesign checkpoint is built offline if missing). It prints a table and writes
``profile.json`` to ``--out``:

* the bare engine (faster-qwen3-tts streaming generator): first audio and time per frame at
  chunk sizes 1 and 4;
* our batched step for the batch sizes of ``--batches`` (default 1 and 32): the whole captured graph (talker + code predictor +
  codec decode of one frame per row), and each part captured on its own (talker position,
  code predictor, codec decoder), all timed with CUDA events over graph replays;
* the host: the engine loop's wall time per frame against its graph time, and the first
  audio of one stream through the loop (prefill, first step, delivery);
* kernels per frame of each part at each batch size (torch.profiler over an eager step), and
  the 8 kernels that take the most GPU time in each part (each row's ``kernels_<part>["top"]``;
  batch 1's also as ``top_kernels_<part>``).

The step runs the Triton kernels (``wyoming_qwen3tts/engine/batched/kernels``) unless
``QWEN3TTS_KERNELS=eager`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wyoming_qwen3tts.engine import MAX_SEQ_LEN, Segment, Work
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.engine.batched.conv_products import CONV_MODES
from wyoming_qwen3tts.engine.batched.kernels import pdl_scope
from wyoming_qwen3tts.testing.checkpoint import build_checkpoint
from wyoming_qwen3tts.common.vocabulary import ModelKind

INSTRUCT = "A warm and friendly female voice, speaking clear English at a relaxed pace."
TEXT = "The kitchen lights are now switched off for the night, and the doors are locked."


def timed_replay(fn: Callable[[], Any], reps: int = 30) -> float:
    """Capture ``fn`` as a graph and return the median ms per replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def kernels(fn: Callable[[], Any]) -> tuple[int, float, list[tuple[str, int, float]]]:
    """(CUDA kernels launched, their summed ms, the 8 kernel names with the most GPU time as
    (name, count, ms)) for one eager call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name[:80], []).append(e.device_time / 1000.0)
    top = sorted(((n, len(t), sum(t)) for n, t in by_name.items()), key=lambda x: -x[2])[:8]
    return len(events), sum(e.device_time for e in events) / 1000.0, top


class _Sink:
    def __init__(self) -> None:
        self.first: float | None = None
        self.frames: int | None = None
        self.t0 = time.perf_counter()

    def cancelled(self) -> bool:
        return False

    def audio(self, chunk: np.ndarray) -> None:
        if self.first is None:
            self.first = time.perf_counter() - self.t0

    def done(self, frames: int) -> None:
        self.frames = frames

    def failed(self, error: BaseException) -> None:
        raise error


class _List:
    def __init__(self, works: list[Work]) -> None:
        self.works = works

    def take(self, wait: float | None) -> Work | None:
        return self.works.pop(0) if self.works else None

    def closed(self) -> bool:
        return False


def fill(engine: BatchedEngine, rows: int, frames: int) -> list[_Sink]:
    """Admit ``rows`` long streams (fixed length) so that steps run at batch ``rows``."""
    sinks = [_Sink() for _ in range(rows)]
    works = [
        Work(Segment(f"{TEXT} ({i})", "english", frames, frames, seed=i, instruct=INSTRUCT), sink)
        for i, sink in enumerate(sinks)
    ]
    engine._admit(_List(works), block=False)
    torch.cuda.synchronize()
    return sinks


def drain(engine: BatchedEngine) -> tuple[int, float]:
    """Run the engine loop until its rows end: (steps, wall seconds)."""
    steps, pending = 0, None
    t0 = time.perf_counter()
    while engine._rows or pending is not None:
        launched = engine._launch() if engine._rows else None
        steps += launched is not None
        if pending is not None:
            engine._deliver(pending)
        pending = launched
        engine._retire()
    return steps, time.perf_counter() - t0


def drain_steps(engine: BatchedEngine, count: int) -> tuple[int, float]:
    """Run ``count`` steps of the engine loop (the rows go on): (steps, wall seconds)."""
    pending = None
    t0 = time.perf_counter()
    for _ in range(count):
        launched = engine._launch()
        if pending is not None:
            engine._deliver(pending)
        pending = launched
        engine._retire()
    if pending is not None:
        engine._deliver(pending)
    return count, time.perf_counter() - t0


def bare_engine(tts: Any, frames: int) -> dict[str, Any]:
    """faster-qwen3-tts's streaming generator: first audio and ms per frame by chunk size."""
    out = {}
    for chunk in (1, 4):
        firsts, per_frame = [], []
        for rep in range(4):
            torch.manual_seed(rep)
            t0 = time.perf_counter()
            first = None
            n = 0
            for audio, _sr, _timing in tts.generate_voice_design_streaming(
                text=TEXT, instruct=INSTRUCT, language="english", max_new_tokens=frames,
                min_new_tokens=frames, chunk_size=chunk, non_streaming_mode=True,
            ):
                if first is None:
                    torch.cuda.synchronize()
                    first = time.perf_counter() - t0
                n += len(audio)
            total = time.perf_counter() - t0
            if rep:  # the first run warms up
                assert first is not None
                firsts.append(first * 1000)
                per_frame.append((total - first) * 1000 / max(1, frames - chunk))
        out[f"chunk {chunk}"] = {
            "first_audio_ms": float(np.median(firsts)),
            "ms_per_frame": float(np.median(per_frame)),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    """Profile and print (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=".ckpt/full/voice_design")
    parser.add_argument("--out", default="benchmarks/results/profile")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--no-bare", action="store_true", help="skip faster-qwen3-tts's own generator")
    parser.add_argument("--chunk", type=int, default=0,
                        help="talker cache positions per attention program (kernels.attention.CHUNK, "
                             "a power of two; 0: the engine's own): a cache longer than it is split")
    args = parser.parse_args(argv)
    if args.chunk:
        from wyoming_qwen3tts.engine.batched.kernels import attention

        attention.CHUNK = args.chunk  # read at each call, so the captured graphs split by it
    from faster_qwen3_tts import FasterQwen3TTS

    path = build_checkpoint(Path(args.checkpoint), "voice_design", "full")
    batches = [int(b) for b in args.batches.split(",")]
    tts = FasterQwen3TTS.from_pretrained(str(path), device="cuda", dtype=torch.bfloat16, max_seq_len=MAX_SEQ_LEN)
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    report["kernels"] = os.environ.get("QWEN3TTS_KERNELS", "triton")
    report["matmul"] = os.environ.get("QWEN3TTS_MATMUL", "fused")
    report["chunk"] = args.chunk or None
    if not args.no_bare:
        tts.warmup()
        report["bare_engine"] = bare_engine(tts, args.frames)
        print("bare engine:", json.dumps(report["bare_engine"]), flush=True)

    engine = BatchedEngine(ModelKind.VOICE_DESIGN, tts, 1, max(batches), MAX_SEQ_LEN, graphs=True)
    t0 = time.perf_counter()
    engine._capture()
    report["capture_s"] = time.perf_counter() - t0
    report["slot_mb"] = engine.slot_bytes() / 1e6
    step, state = engine.step, engine.state

    # One stream through the loop: first audio (prefill + first step + delivery), then steady.
    firsts = []
    for rep in range(6):
        sinks = fill(engine, 1, args.frames)
        steps, wall = drain(engine)
        firsts.append((sinks[0].first or 0) * 1000)
    report["engine_first_audio_ms_chunk1"] = float(np.median(firsts[1:]))

    rows: list[dict[str, Any]] = []
    for b in batches:
        fill(engine, b, 10_000)
        length = engine._bucket()[1]
        embeds = torch.zeros(b, state.past_hidden.shape[-1], dtype=state.past_hidden.dtype, device="cuda")
        codes = state.codes[:b, :, None].clone().clamp(max=2047)
        noise = torch.zeros(b, 15, 64, device="cuda")
        saved = [t.clone() for t in (state.position, state.frame)]
        with pdl_scope(b == 1):  # as the engine captures its own graphs (kernels.pdl)
            row: dict[str, Any] = {
                "batch": b,
                "length": length,
                "whole_ms": timed_replay(lambda: engine._body(b, length)),
                "talker_ms": timed_replay(lambda: step._talker(embeds, length)),
                "predictor_ms": timed_replay(lambda: step._predict(state.past_hidden[:b], state.token[:b], noise)),
                "decoder_ms": timed_replay(lambda: engine.decoder.step(codes)),
            }
        state.position.copy_(saved[0])  # the timed replays moved the rows on
        state.frame.copy_(saved[1])
        # The loop: wall time per frame over 24 steps (graphs + host work + delivery).
        # The same loop with the decode in line (one stream), then on its own stream (the
        # engine's layout). Each loop gives the rows 48 more frames, so that none ends within
        # it (stop 37's third loop ran while rows were ending, and looked faster).
        side = engine._side
        for label, engine._side in (("loop_ms_per_frame_inline", None), ("loop_ms_per_frame", side)):
            for active in engine._rows:
                active.max_frames = active.frames + 48
            torch.cuda.synchronize()
            engine._copied, engine._decoded = None, None
            steps, wall = drain_steps(engine, 24)
            torch.cuda.synchronize()
            row[label] = wall * 1000 / max(1, steps)
        engine._side = side
        for part, fn in (
            ("whole", lambda: engine._body(b, length)),
            ("talker", lambda: step._talker(embeds, length)),
            ("predictor", lambda: step._predict(state.past_hidden[:b], state.token[:b], noise)),
            ("decoder", lambda: engine.decoder.step(codes)),
        ):
            n, ms, top = kernels(fn)
            named = [{"name": k, "count": c, "gpu_ms": t} for k, c, t in top]
            row[f"kernels_{part}"] = {"count": n, "gpu_ms": ms, "top": named}  # at every batch size
            if b == 1:
                report[f"kernels_{part}"] = {"count": n, "gpu_ms": ms}
                report[f"top_kernels_{part}"] = named
        # The codec decode again with cuDNN's autotuner choosing each convolution's algorithm
        # (``torch.backends.cudnn.benchmark``; the engine uses cuDNN's heuristics), last, so
        # that nothing above runs on the tuned plans.
        torch.backends.cudnn.benchmark = True
        try:
            row["decoder_ms_cudnn_benchmark"] = timed_replay(lambda: engine.decoder.step(codes))
        finally:
            torch.backends.cudnn.benchmark = False
        # And with the causal convolutions formed each other way (QWEN3TTS_CONV's modes: the
        # columns by kernels.im2col or by PyTorch, the long ones as kernels.causal_conv).
        mode = engine.decoder.conv_mode
        row["decoder_conv_mode"] = mode
        row["decoder_ms_by_mode"] = {mode: row["decoder_ms"]}
        row["decoder_kernels_by_mode"] = {mode: row["kernels_decoder"]["count"]}
        try:
            for other in CONV_MODES:
                if other != mode:
                    engine.decoder.conv_mode = other
                    row["decoder_ms_by_mode"][other] = timed_replay(lambda: engine.decoder.step(codes))
                    row["decoder_kernels_by_mode"][other] = kernels(lambda: engine.decoder.step(codes))[0]
        finally:
            engine.decoder.conv_mode = mode
        steps, wall = drain(engine)
        rows.append(row)
        print(json.dumps(row), flush=True)
        report["rows"] = rows
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.json").write_text(json.dumps(report, indent=2))  # after each batch: a cut run keeps it
    print("\n| batch | length | whole step (ms) | talker | predictor | decoder | loop ms/frame, decode in line | loop ms/frame, decode overlapped | per row | kernels (talker / predictor / decoder) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        counts = " / ".join(str(r[f"kernels_{p}"]["count"]) for p in ("talker", "predictor", "decoder"))
        print(f"| {r['batch']} | {r['length']} | {r['whole_ms']:.2f} | {r['talker_ms']:.2f} | "
              f"{r['predictor_ms']:.2f} | {r['decoder_ms']:.2f} | {r['loop_ms_per_frame_inline']:.2f} | "
              f"{r['loop_ms_per_frame']:.2f} | {r['loop_ms_per_frame'] / r['batch']:.2f} | {counts} |")
    for r in rows:
        print(f"| batch {r['batch']}: decoder with cudnn.benchmark | {r['decoder_ms_cudnn_benchmark']:.2f} ms "
              f"(heuristics {r['decoder_ms']:.2f}) |")
        print(f"| batch {r['batch']}: decoder by convolution mode | " + "; ".join(
            f"{m} {ms:.2f} ms ({r['decoder_kernels_by_mode'][m]} kernels)" for m, ms in r["decoder_ms_by_mode"].items())
            + f" (engine: {r['decoder_conv_mode']}) |")
    for r in rows:
        top = r["kernels_decoder"]["top"][:5]
        print(f"| batch {r['batch']}: decoder's top kernels | " + "; ".join(
            f"{k['name'][:60]} x{k['count']} {k['gpu_ms']:.2f} ms" for k in top) + " |")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
