"""The CPU engines in process, without a door: first audio, speed and the longest silence.

    python -m benchmarks.cpu_engine_bench --checkpoint CKPT --data DIR [--engines pipeline ggml reference]
        [--clients 1 2] [--texts short long] [--frames 25] [--out JSON]

Each engine is loaded as the server loads it (``engine.load_engine`` on the CPU, the server's
defaults: one frame a chunk, threads chosen from the cores, GGUF Q8_0 converted once into
``DATA/models``) and fed segments the way the server's scheduler does (a queue the engine takes
work from). For each number of clients, the segments of a round are given at once, and every
figure is per client, as ``benchmarks.cpu_bench`` measures at a Wyoming client:

* ``ttfa_ms``: segment given -> first audio chunk delivered (median over the requests);
* ``speed``: seconds of audio per second of wall time, whole segments (median);
* ``gap_ms``: the longest silence a listener hears between two chunks, playing each as it
  arrives (or when the audio before it ends) (largest of the requests);
* ``rss_gb``: the process's resident memory after the rows of that engine (``VmRSS``).

It needs no door, so none of the doors' packages (PyAV, aiohttp's server): a machine that
lacks them measures the engines. CustomVoice ``ryan``, the server's default sampling (seeded),
EOS held back for ``--frames`` (random weights rarely stop), ``REQUESTS`` rounds a row, the
short sentence of ``benchmarks.cpu_bench`` and a long one. A frame is 80 ms (1920 samples at
24 kHz). Figures, not tests.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.cpu_bench import TEXT, _status_gb

#: A reply of an LLM assistant, about 50 text tokens: a prompt four times the short one's.
LONG_TEXT = ("Sure, I turned off the kitchen lights and locked the front door; the thermostat is set to "
             "nineteen degrees for the night, and tomorrow will be cloudy with a little rain after noon.")
REQUESTS = 2
RATE = 24_000


class _Sink:
    """Records when each chunk of one segment arrives."""

    def __init__(self) -> None:
        self.given = time.perf_counter()
        self.arrivals: list[tuple[float, int]] = []
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def cancelled(self) -> bool:
        return False

    def audio(self, chunk: np.ndarray) -> None:
        self.arrivals.append((time.perf_counter(), len(chunk)))

    def done(self, frames: int) -> None:
        self.end = time.perf_counter()
        self.finished.set()

    def failed(self, error: BaseException) -> None:
        self.error = error
        self.end = time.perf_counter()
        self.finished.set()

    def figures(self) -> tuple[float, float, float]:
        """(first audio ms, audio s per wall s, longest silence ms)."""
        if self.error is not None or not self.arrivals:
            raise RuntimeError(f"the segment failed: {self.error!r}")
        gap, played_until, samples = 0.0, 0.0, 0
        for at, n in self.arrivals:
            if samples:
                gap = max(gap, at - played_until)
            played_until = max(at, played_until) + n / RATE
            samples += n
        return ((self.arrivals[0][0] - self.given) * 1000, samples / RATE / (self.end - self.given), gap * 1000)


class _Source:
    """The engine's work source: a queue, as the server's scheduler is."""

    def __init__(self) -> None:
        self.items: queue.Queue = queue.Queue()
        self.stop = threading.Event()

    def take(self, wait: float | None):
        try:
            return self.items.get(timeout=0.05 if wait is None else max(wait, 0.0) or 0.001)
        except queue.Empty:
            return None

    def closed(self) -> bool:
        return self.stop.is_set()


def run_engine(name: str, checkpoint: Path, data: Path, frames: int, clients: list[int], texts: list[str]) -> list[dict]:
    """Rows of one engine: each text at each number of clients."""
    from wyoming_qwen3tts.common.vocabulary import ModelKind
    from wyoming_qwen3tts.engine import Segment, Work, load_engine
    from wyoming_qwen3tts.engine.cpu.gguf_files import resolve_gguf

    started = time.perf_counter()
    gguf = resolve_gguf(str(checkpoint), data / "models", "Q8_0", local_files_only=True) if name == "ggml" else None
    engine = load_engine(ModelKind.CUSTOM_VOICE, checkpoint, "cpu", 1, engine=name, data_dir=data, gguf=gguf)
    source = _Source()
    engine.warm(Segment("Warm.", "english", 2, seed=0, speaker="ryan"))
    engine.start(source)
    load_s = time.perf_counter() - started
    rows = []
    seed = 1
    try:
        for label, text in (("short", TEXT), ("long", LONG_TEXT)):
            if label not in texts:
                continue
            for n in clients:
                load = os.getloadavg()[0]
                results = []
                for _ in range(REQUESTS):
                    sinks = []
                    for _ in range(n):
                        sink = _Sink()
                        seed += 1
                        source.items.put(Work(Segment(text, "english", frames, min_new_tokens=frames, seed=seed,
                                                      speaker="ryan"), sink))
                        sinks.append(sink)
                    for sink in sinks:
                        if not sink.finished.wait(600):
                            raise RuntimeError(f"{name}: a segment did not finish in 600 s")
                    results += [sink.figures() for sink in sinks]
                row = {"engine": name, "text": label, "clients": n, "ttfa_ms": round(statistics.median(r[0] for r in results), 1),
                       "ttfa_ms_max": round(max(r[0] for r in results), 1),
                       "speed": round(statistics.median(r[1] for r in results), 4),
                       "speed_min": round(min(r[1] for r in results), 4),
                       "gap_ms": round(max(r[2] for r in results), 1), "loadavg_1min": round(load, 2),
                       "load_s": round(load_s, 1)}
                print(row, flush=True)
                rows.append(row)
    finally:
        source.stop.set()
        engine.join(30)
    rss = _status_gb(os.getpid(), "VmRSS")
    for row in rows:
        row["rss_gb"] = round(rss, 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a CustomVoice checkpoint folder")
    parser.add_argument("--data", type=Path, required=True, help="a data folder (conversions and export kept there)")
    parser.add_argument("--engines", nargs="+", default=["pipeline", "ggml"], choices=["pipeline", "ggml", "reference"])
    parser.add_argument("--texts", nargs="+", default=["short", "long"], choices=["short", "long"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--frames", type=int, default=25, help="codec frames a segment (80 ms each)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    before = os.getloadavg()
    rows = []
    for name in args.engines:  # one process an engine: its RSS is its own
        if len(args.engines) > 1:
            import subprocess
            import sys

            out = args.out.with_suffix(f".{name}.json") if args.out else None
            cmd = [sys.executable, "-m", "benchmarks.cpu_engine_bench", "--checkpoint", str(args.checkpoint),
                   "--data", str(args.data), "--engines", name, "--frames", str(args.frames),
                   "--clients", *map(str, args.clients), "--texts", *args.texts, *(["--out", str(out)] if out else [])]
            subprocess.run(cmd, check=False)
            if out and out.exists():
                rows += json.loads(out.read_text())["rows"]
        else:
            rows += run_engine(name, args.checkpoint, args.data, args.frames, args.clients, args.texts)
    result = {"checkpoint": str(args.checkpoint), "cores": len(os.sched_getaffinity(0)), "frames": args.frames,
              "requests_per_row": REQUESTS, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "loadavg_before": [round(x, 2) for x in before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
              "texts": {"short": TEXT, "long": LONG_TEXT}, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
