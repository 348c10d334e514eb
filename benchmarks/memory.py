"""Memory benchmark: the server on emulated 8, 12, 16 and 24 GB cards.

One real server process (``python -m wyoming_qwen3tts``, full-size random checkpoints)
per (card, options) row, with ``--gpu-memory`` capping its allocator at the card's size
less ``--context-gb`` (the CUDA context and driver buffers, which a real card also holds
but the allocator's cap does not count). For each row: whether it starts (and the reason
when not), the streams ``--max-streams auto`` gave the Base model, where the VoiceDesign
model lives (resident, on demand, taking turns), the peak GPU memory of the process
(nvidia-smi, context included), first audio (p50) and speed (audio seconds per wall second
per stream) with 1 and 4 Wyoming clients on a clone voice, and the first audio of a preset
designed live (in the "turns" mode it includes loading the VoiceDesign model).

Random weights never end a sentence, so every sentence is ``--fixed-frames`` frames.
Writes ``OUT/memory.json`` (``{"rows": [...]}``, the issue's fields; whole rows in
``memory-detail.json``) and ``OUT/memory.md`` (the table the
add-on's DOCS link) after every row.

Usage: ``python -m benchmarks.memory --out benchmarks/results/nvidia-h200`` (about 6 min
on the H200; ``benchmarks/gpu.sh ckpt memory`` builds the checkpoints first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from benchmarks.bench import _free_port, gpu_memory_by_pid, wyoming_request

SAMPLE_RATE = 24_000
CLONE_TRANSCRIPT = "This is a short reference recording."
TEXT = "The kitchen lights are on and the front door is locked."
#: (label, extra server flags); "{ckpt}" is the checkpoints folder.
OPTIONS: dict[str, list[str]] = {
    "defaults": [],
    "0.6B Base": ["--clone-model", "{ckpt}/base-0.6b"],
    "no VoiceDesign": ["--design-model", "none"],
    "VoiceDesign on demand": ["--design-model-memory", "on-demand"],
}
#: Rows run by default, (card GB, options), the defaults first (rows past --time-limit are skipped).
ROWS = (
    (8, "defaults"), (12, "defaults"), (16, "defaults"), (24, "defaults"),
    (8, "0.6B Base"), (8, "no VoiceDesign"), (12, "VoiceDesign on demand"),
)


@dataclass
class Row:
    """One (card, options) result; times in ms, speed in audio s per wall s per stream."""

    card_gb: int
    options: str
    started: bool
    cap_gb: float
    design_model: str | None = None
    streams: int | None = None
    peak_gb: float | None = None
    start_s: float | None = None
    ttfa_p50_ms: float | None = None
    speed: float | None = None
    ttfa_p50_ms_4: float | None = None
    speed_4: float | None = None
    preset_first_audio_ms: float | None = None
    note: str = ""


class PeakMemory:
    """Polls nvidia-smi for one process's GPU memory; ``peak`` in GB."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, gpu_memory_by_pid().get(self.pid, 0.0))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak, 2)


def _server(ckpt: Path, work: Path, cap_gb: float, extra: list[str], frames: int, name: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = _free_port()
    log = work / f"server-{name}.log"
    args = [
        sys.executable, "-m", "wyoming_qwen3tts", "--uri", f"tcp://127.0.0.1:{port}", "--http-port", "0",
        "--data-dir", str(work / "data"), "--voices-dir", str(work / "voices"),
        "--clone-model", str(ckpt / "base"), "--design-model", str(ckpt / "voice_design"),
        "--device", "cuda", "--fixed-frames", str(frames), "--seed", "1", "--anchors", "off",
        "--no-zeroconf", "--local-files-only", "--gpu-memory", f"{cap_gb:g}", *extra,
    ]
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc, port, log


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> str | None:
    """None once ready, else why not (the last error line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "Ready: Wyoming" in text:
            return None
        if proc.poll() is not None:
            errors = [line for line in text.splitlines() if "ERROR" in line or line.startswith(("Cannot", "SystemExit"))]
            return (errors or text.splitlines() or ["exited"])[-1][-300:]
        time.sleep(0.25)
    return f"not ready in {timeout:.0f} s"


def parse_log(text: str) -> tuple[int | None, str | None]:
    """(the Base model's streams, where the VoiceDesign model lives) from a server's log:
    its last ``--max-streams auto`` line (after an out-of-memory at start, the streams it
    retried with: "21 stream(s), ...; 12 after an out-of-memory at start") and its "GPU
    memory:" line."""
    lines = [m.group(0) for m in re.finditer(r"base model: \d+ stream\(s\)[^\n]*", text)]
    retried = re.search(r"; (\d+) after an out-of-memory", lines[-1]) if lines else None
    found = retried or (re.search(r"(\d+) stream", lines[-1]) if lines else None)
    mode = re.search(r"GPU memory: .*?; (the VoiceDesign model [^(]*|the models do not fit[^(]*|no VoiceDesign model)", text)
    where = None
    if mode:
        said = mode.group(1)
        where = "none" if said.startswith("no ") else "turns" if "do not fit" in said else (
            "on demand" if "when needed" in said else "resident"
        )
    return (int(found.group(1)) if found else None), where


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


async def _measure(port: int, row: Row) -> None:
    await wyoming_request(port, "Warm up.", "clone")
    solo = [await wyoming_request(port, TEXT, "clone") for _ in range(3)]
    row.ttfa_p50_ms = _median([s.first_audio * 1000 for s in solo])
    row.speed = round(statistics.median([s.audio_s / s.done for s in solo]), 2)
    four = list(await asyncio.gather(*(wyoming_request(port, TEXT, "clone") for _ in range(4))))
    row.ttfa_p50_ms_4 = _median([s.first_audio * 1000 for s in four])
    row.speed_4 = round(statistics.median([s.audio_s / s.done for s in four]), 2)
    if row.design_model not in (None, "none"):
        preset = await wyoming_request(port, TEXT, "aria")
        row.preset_first_audio_ms = round(preset.first_audio * 1000, 1)
        await wyoming_request(port, TEXT, "clone")  # and back to the Base model


def run_row(ckpt: Path, work: Path, card_gb: int, options: str, context_gb: float, frames: int) -> Row:
    """Start, measure, stop one server."""
    cap = round(card_gb - context_gb, 2)
    extra = [a.replace("{ckpt}", str(ckpt)) for a in OPTIONS[options]]
    started = time.monotonic()
    slug = f"{card_gb}gb-" + re.sub(r"[^a-z0-9.]+", "-", options.lower())
    proc, port, log = _server(ckpt, work, cap, extra, frames, slug)
    peak = PeakMemory(proc.pid)
    row = Row(card_gb, options, False, cap)
    try:
        why = _wait_ready(proc, log, 240)
        row.start_s = round(time.monotonic() - started, 1)
        row.streams, row.design_model = parse_log(log.read_text(errors="replace"))
        if why is not None:
            row.note = why
            return row
        row.started = True
        try:
            asyncio.run(asyncio.wait_for(_measure(port, row), 150))
        except Exception as err:  # noqa: BLE001 - a failed measurement is a result too
            row.note = f"measurement failed: {err!r}"[:300]
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        row.peak_gb = peak.stop()
    return row


#: ``memory.json``'s row fields, exactly as the GPU-memory issue specifies them; the rest of a
#: row (4 clients, the preset, start time, notes) goes to ``memory-detail.json``.
JSON_FIELDS = ("card_gb", "options", "started", "streams", "peak_gb", "ttfa_p50_ms", "speed")


def write(rows: list[Row], out: Path, gpu: str) -> None:
    """memory.json (``JSON_FIELDS`` per row), memory-detail.json (whole rows) and memory.md."""
    out.mkdir(parents=True, exist_ok=True)
    whole = [asdict(r) for r in rows]
    (out / "memory.json").write_text(json.dumps({"rows": [{k: r[k] for k in JSON_FIELDS} for r in whole]}, indent=2))
    (out / "memory-detail.json").write_text(json.dumps({"gpu": gpu, "rows": whole}, indent=2))
    lines = [
        f"Measured on {gpu}, allocator capped with `--gpu-memory` at the card's size less the CUDA context; "
        "random full-size weights, 24-frame sentences, clone voice. Speed: seconds of audio per second, per stream.",
        "",
        "| card | options | starts | start (s) | VoiceDesign model | Base streams | peak GPU memory (GB) | first audio, 1 client (ms) "
        "| speed, 1 client | first audio, 4 clients (ms) | speed, 4 clients | preset first audio (ms) | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cells = [f"{r.card_gb} GB", r.options, "yes" if r.started else "no", r.start_s, r.design_model or "", r.streams, r.peak_gb,
                 r.ttfa_p50_ms, r.speed, r.ttfa_p50_ms_4, r.speed_4, r.preset_first_audio_ms, r.note.replace("|", "/")]
        lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    (out / "memory.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", type=Path, default=Path(".ckpt/full"), help="base, base-0.6b, voice_design inside")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", default=",".join(f"{c}:{o}" for c, o in ROWS), help="card:options, comma separated")
    parser.add_argument("--context-gb", type=float, default=0.5, help="GB a real card loses to the CUDA context")
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--time-limit", type=float, default=330, help="seconds; rows not started by then are skipped")
    args = parser.parse_args(argv)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    work = Path("/tmp/memory-bench")
    (work / "voices").mkdir(parents=True, exist_ok=True)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    sf.write(work / "voices" / "clone.wav", (0.2 * np.sin(2 * np.pi * 190 * t)).astype(np.float32), SAMPLE_RATE)
    (work / "voices" / "clone.txt").write_text(CLONE_TRANSCRIPT)
    began = time.monotonic()
    rows: list[Row] = []
    for spec in args.rows.split(","):
        card, options = spec.split(":", 1)
        if time.monotonic() - began > args.time_limit:
            print(f"skipped {spec}: past --time-limit", flush=True)
            continue
        row = run_row(args.ckpt, work, int(card), options, args.context_gb, args.frames)
        rows.append(row)
        print(json.dumps(asdict(row)), flush=True)
        write(rows, args.out, gpu)
    print((args.out / "memory.md").read_text())


if __name__ == "__main__":
    main()
