"""Join stall profile: what running streams wait for when requests join (GPU; a figure, not a test).

``python -m benchmarks.join_profile --ckpt .ckpt/full/base --out DIR`` loads the Base model
(full-size random checkpoint) in the batched CUDA-graph engine, the way the server does
(``load_engine``), and serves it from its own thread (``BatchedEngine.serve``: prompt worker,
planner, prefill graphs). With ``--running`` ICL clone streams (3 s reference) playing, it
sends single joiners ``--singles`` times, then bursts of ``--burst`` joiners at once,
``--bursts`` times, and reports the engine's own join-stall measurements (``on_join``: GPU time
from an admission's start to the next step's start, as ``tts_join_stall_seconds``): p50 / p95
/ max for each case, with the admissions' sizes. Then it profiles a few single joins with
``torch.profiler`` and writes the kernels by GPU time (``join-kernels.txt``), so a stall can be
split into the prefill replay, the rows' start (sampling, state) and idle time.

Writes ``DIR/join-profile.json`` and ``DIR/join-kernels.txt``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from wyoming_qwen3tts.engine import Segment, Work, load_engine
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference

from .bench import TEXTS

CLONE_TRANSCRIPT = "This is a short reference recording for the benchmark."


class _Sink:
    """Counts frames; records when the first chunk arrived."""

    def __init__(self) -> None:
        self.sent = time.perf_counter()
        self.first: float | None = None
        self.ended = threading.Event()

    def cancelled(self) -> bool:
        return False

    def audio(self, chunk: np.ndarray) -> None:
        if self.first is None:
            self.first = time.perf_counter() - self.sent

    def done(self, frames: int) -> None:
        self.ended.set()

    def failed(self, error: BaseException) -> None:
        print(f"request failed: {error!r}", flush=True)
        self.ended.set()


class _Source:
    """A blocking work source fed by this script."""

    def __init__(self) -> None:
        self.items: list[Work] = []
        self.lock = threading.Condition()
        self.stop = False

    def put(self, works: list[Work]) -> None:
        with self.lock:
            self.items.extend(works)
            self.lock.notify_all()

    def take(self, wait: float | None) -> Work | None:
        with self.lock:
            if not self.items:
                self.lock.wait(0.05 if wait is None else max(wait, 0.0))
            return self.items.pop(0) if self.items else None

    def closed(self) -> bool:
        return self.stop


def _summary(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50_ms": None, "p95_ms": None, "max_ms": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"n": len(values), "p50_ms": round(statistics.median(values), 2), "p95_ms": round(p95, 2),
            "max_ms": round(max(values), 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", type=Path, default=Path(".ckpt/full/base"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cuda (the figures); cpu only tries the script")
    parser.add_argument("--running", type=int, default=16, help="streams playing while others join")
    parser.add_argument("--singles", type=int, default=20)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--bursts", type=int, default=10)
    parser.add_argument("--frames", type=int, default=600, help="frames of a running stream (each is replaced when it ends)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    stalls: list[tuple[float, float]] = []  # (time, ms)
    engine = load_engine(ModelKind.BASE, args.ckpt, args.device, 4, "batched", 32,
                         on_join=lambda s: stalls.append((time.perf_counter(), s * 1000)))
    assert isinstance(engine, BatchedEngine)
    admitted: list[int] = []
    real_run = engine.prefill.run

    host_ms: list[float] = []
    real_admit = engine._admit_some

    def spy(start: int, batch: list, on_decoder=None) -> list[int]:  # type: ignore[no-untyped-def]
        admitted.append(len(batch))
        return real_run(start, batch, on_decoder)

    def timed_admit(intake, block, most):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        taken = real_admit(intake, block, most)
        if taken:
            host_ms.append((time.perf_counter() - began) * 1000)
        return taken

    engine.prefill.run = spy  # type: ignore[method-assign]
    engine._admit_some = timed_admit  # type: ignore[method-assign]
    t = np.arange(3 * 24_000) / 24_000
    clip = (0.2 * np.sin(2 * np.pi * 190 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    reference = Reference.from_audio(clip, 24_000, CLONE_TRANSCRIPT)

    def segment(i: int, frames: int) -> Segment:
        return Segment(TEXTS[i % len(TEXTS)], "english", frames, frames, seed=i, reference=reference)

    engine.warm(segment(0, 4))
    source = _Source()
    engine.start(source)
    result: dict[str, object] = {"running": args.running}

    def case(name: str, joiners: int, repeats: int, gap_s: float) -> None:
        firsts: list[float] = []
        stalls.clear()
        admitted.clear()
        host_ms.clear()
        for r in range(repeats):
            sinks = [_Sink() for _ in range(joiners)]
            source.put([Work(segment(1000 + r * joiners + i, 12), sink) for i, sink in enumerate(sinks)])
            for sink in sinks:
                sink.ended.wait(30)
                if sink.first is not None:
                    firsts.append(sink.first * 1000)
            time.sleep(gap_s)
        ms = [m for _, m in stalls]
        result[name] = {"stall": _summary(ms), "admissions": list(admitted), "first_audio": _summary(firsts),
                        "host": _summary(host_ms)}
        print(f"{name}: stall {_summary(ms)} admissions {admitted[:20]} first audio {_summary(firsts)} "
              f"host time of an admission {_summary(host_ms)}", flush=True)

    class _Running(_Sink):
        """A running stream that, when it ends, is replaced by another (so ``--running`` play throughout)."""

        def done(self, frames: int) -> None:
            if not source.stop:
                source.put([Work(segment(len(stalls), args.frames), _Running())])

    source.put([Work(segment(i, args.frames), _Running()) for i in range(args.running)])
    time.sleep(1.5)
    case("single", 1, args.singles, 0.05)
    case(f"burst{args.burst}", args.burst, args.bursts, 0.05)
    # the kernels of a few single joins
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        case("profiled single", 1, 5, 0.05)
    table = prof.key_averages().table(sort_by="cuda_time_total" if args.device == "cuda" else "cpu_time_total", row_limit=40)
    (args.out / "join-kernels.txt").write_text(table)
    print(table[:6000], flush=True)
    source.stop = True
    engine.join(30)
    (args.out / "join-profile.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
