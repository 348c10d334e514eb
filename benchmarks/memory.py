"""Memory benchmark: the server on a GPU shared with another program, the honest way.

A second process (``hold_gpu``: a small Python that ``torch.empty``s all but N GB of the card
and sleeps) holds the rest of the GPU, as an LLM would, so that the server sees what such a
card shows: the driver's free memory, its own CUDA context taken from it, and whatever the
caching allocator, graph pools and fragmentation keep. No ``--gpu-memory`` cap (an allocator
cap hid all of that: the 8 GB row passed under the cap and failed for real).

One real server process (``python -m wyoming_qwen3tts``, defaults, full-size random
checkpoints, a fresh data folder so that no preset anchor exists yet) per row, N GB free. Each
row records (``memory.json``, the GPU-memory issue's fields):

- whether it started, the models resident after start, the streams each model got, the
  precision the server reports (None where it reports none);
- first audio (client side, ms) for: the default voice before its anchor exists
  (``preset_unrendered``), another preset (``preset``), a clone's first and second request
  (``clone_first``, ``clone``), a clip dropped into the library while the server runs, its
  first request once the server says it prepared it (``new_clip_first_ms``, in
  memory-detail.json only), CustomVoice (None: the defaults load no CustomVoice model);
- where the models take turns: swaps forced by alternating a design request (``instructions``,
  always the VoiceDesign model) and a clone, the server process's GPU memory (nvidia-smi)
  each time the Base model is back, ``leak_mb_per_swap`` (the slope), the streams at every
  load, and ``swap_wait_max_ms`` (the longest a request waited for a model to load, from the
  server's log);
- speed with 1 and 4 clients on the clone (seconds of audio per wall second, per stream).

Random weights never end a sentence, so every sentence is ``--fixed-frames`` frames.
Writes ``OUT/memory.json``, ``OUT/memory-detail.json`` (whole rows) and ``OUT/memory.md``
after every row; the servers' logs go to ``/tmp/memory-bench/server-<N>gb.log``.

Usage: ``python -m benchmarks.memory --out benchmarks/results/nvidia-h200`` (about 6 min on
the H200; ``benchmarks/gpu.sh memory`` builds the checkpoints first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from benchmarks.bench import _free_port, gpu_memory_by_pid

SAMPLE_RATE = 24_000
GiB = 2**30
CLONE_TRANSCRIPT = "This is a short reference recording for the memory benchmark."
TEXT = "The kitchen lights are on and the front door is locked."
#: Free GPU memory of each row, in GiB, the most telling first (rows past --time-limit are skipped).
FREE_GB = (8, 6, 4, 12, 24)
#: Swaps forced in each row where the models take turns (``--swaps``).
SWAPS = 4
#: The holder: allocate all but argv[1] GiB of the free memory, say so, sleep until killed.
HOLDER = (
    "import sys, time, torch\n"
    "torch.cuda.init()\n"
    "free, total = torch.cuda.mem_get_info()\n"
    "keep = int(float(sys.argv[1]) * 2**30)\n"
    "held = torch.empty(max(0, free - keep), dtype=torch.uint8, device='cuda')\n"
    "print('held', held.numel(), torch.cuda.mem_get_info()[0], flush=True)\n"
    "time.sleep(1e9)\n"
)


@dataclass
class Row:
    """One server at ``free_gb`` GiB free; times in ms, speed in audio s per wall s per stream."""

    free_gb: float
    options: str = "defaults"
    started: bool = False
    precision: str | None = None
    resident: list[str] = field(default_factory=list)
    streams: dict[str, int] = field(default_factory=dict)
    first_audio_ms: dict[str, float | None] = field(default_factory=dict)
    swap_wait_max_ms: float | None = None
    leak_mb_per_swap: float | None = None
    speed_1: float | None = None
    speed_4: float | None = None
    # detail (memory-detail.json)
    free_seen_gb: float | None = None
    start_s: float | None = None
    swaps: int = 0
    memory_after_swaps_gb: list[float] = field(default_factory=list)
    allocated_after_leaving_gb: list[float] = field(default_factory=list)
    streams_per_load: dict[str, list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    note: str = ""
    anchors_seeded: int = 0
    new_clip_first_ms: float | None = None


#: ``memory.json``'s row fields, exactly as the GPU-memory issue specifies them.
JSON_FIELDS = (
    "free_gb", "options", "started", "precision", "resident", "streams", "first_audio_ms",
    "swap_wait_max_ms", "leak_mb_per_swap", "speed_1", "speed_4",
)


def hold_gpu(free_gb: float, timeout: float = 60.0) -> tuple[subprocess.Popen[str], float]:
    """Start the holder leaving ``free_gb`` GiB free; returns it and the free GiB it left.

    Raises:
        RuntimeError: it exited or did not say it holds the memory in ``timeout`` seconds.
    """
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(free_gb)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("held"):
            return proc, int(line.split()[2]) / GiB
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"the memory holder did not start (exit {proc.poll()})")


def _server(ckpt: Path, work: Path, name: str, frames: int, extra: list[str]) -> tuple[subprocess.Popen[bytes], int, int, Path]:
    port, http_port = _free_port(), _free_port()
    log = work / f"server-{name}.log"
    args = [
        sys.executable, "-m", "wyoming_qwen3tts", "--uri", f"tcp://127.0.0.1:{port}", "--http-host", "127.0.0.1",
        "--http-port", str(http_port), "--data-dir", str(work / f"data-{name}"), "--voices-dir", str(work / "voices"),
        "--clone-model", str(ckpt / "base"), "--design-model", str(ckpt / "voice_design"),
        "--device", "cuda", "--fixed-frames", str(frames), "--seed", "1", "--no-zeroconf", "--local-files-only", *extra,
    ]
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc, port, http_port, log


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> str | None:
    """None once ready, else why not (the last error line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "Ready: Wyoming" in text:
            return None
        if proc.poll() is not None:
            errors = [line for line in text.splitlines() if "ERROR" in line or line.startswith(("Cannot", "SystemExit"))]
            return (errors or text.splitlines() or ["exited"])[-1][-400:]
        time.sleep(0.25)
    return f"not ready in {timeout:.0f} s"


def parse_log(text: str) -> dict[str, Any]:
    """What a server's log says: ``resident`` models after start, ``streams`` per model (the
    last sizing), ``streams_per_load`` (every load's), ``precision`` (None if it says none),
    ``swap_waits_s`` (each load's longest-waiting request) and ``allocated_after_leaving_gb``."""
    streams_per_load: dict[str, list[int]] = {}
    for kind, count in re.findall(r"(\w+) model is in GPU memory \([\d.]+ s to load, (\d+) stream", text):
        streams_per_load.setdefault(kind, []).append(int(count))
    for kind, count in re.findall(r"(\w+) model ready \(.*?(\d+) stream\(s\) at once", text):
        if kind not in streams_per_load:  # a model loaded once, for good (on demand: the load's line said it)
            streams_per_load[kind] = [int(count)]
    streams = {kind: counts[-1] for kind, counts in streams_per_load.items()}
    mode = re.search(r"GPU memory: .*?; (the VoiceDesign model [^(]*|the models do not fit[^(]*|no VoiceDesign model)", text)
    resident: list[str] = []
    if mode:
        said = mode.group(1)
        if "do not fit" in said:
            resident = sorted({m for m in re.findall(r"(\w+) model is in GPU memory", text.split("Ready: Wyoming")[0])}) or ["base"]
        elif said.startswith("no "):
            resident = ["base"]
        else:
            resident = ["base"] + (["voice_design"] if "stays" in said else [])
    precision = re.search(r"[Pp]recision[^\n]*?\b(int8|fp8|float8|bfloat16|bf16|float16|float32)\b", text)
    waits = [float(s) for s in re.findall(r"the longest-waiting request waited ([\d.]+) s", text)]
    left = [float(g) for g in re.findall(r"model out: ([\d.]+) GB allocated", text)]
    return {
        "resident": resident, "streams": streams, "streams_per_load": streams_per_load,
        "precision": precision.group(1) if precision else None, "swap_waits_s": waits, "allocated_after_leaving_gb": left,
    }


async def _wyoming(port: int, text: str, voice: str, timeout: float = 120.0) -> tuple[float | None, float, float, str | None]:
    """One Wyoming request: (first audio s or None, done s, audio s, error text or None)."""
    from wyoming.audio import AudioChunk
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async def run() -> tuple[float | None, float, float, str | None]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            start = time.perf_counter()
            await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
            first, samples = None, 0
            while True:
                event = await client.read_event()
                if event is None:
                    return first, time.perf_counter() - start, samples / SAMPLE_RATE, "connection closed"
                if AudioChunk.is_type(event.type):
                    first = first or time.perf_counter() - start
                    samples += len(AudioChunk.from_event(event).audio) // 2
                elif event.type == "error":
                    return first, time.perf_counter() - start, samples / SAMPLE_RATE, str((event.data or {}).get("text"))
                elif event.type == "audio-stop":
                    return first, time.perf_counter() - start, samples / SAMPLE_RATE, None

    return await asyncio.wait_for(run(), timeout)


def _design(http_port: int, timeout: float = 120.0) -> str | None:
    """A request with instructions (always the VoiceDesign model); None or the error."""
    body = {"model": "tts-1", "input": TEXT, "voice": "aria", "instructions": "A calm, low voice.", "response_format": "pcm"}
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/audio/speech", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return None if resp.read() else "no audio"
    except Exception as err:  # noqa: BLE001 - recorded in the row
        return repr(err)[:300]


def _median_speed(results: list[tuple[float | None, float, float, str | None]]) -> float | None:
    """Median seconds of audio per wall second over the requests that succeeded (None: none did)."""
    speeds = [audio / took for _first, took, audio, error in results if not error and took]
    return round(statistics.median(speeds), 2) if speeds else None


async def _arrive(voices: Path, name: str, log: Path, hz: float, timeout: float = 30.0) -> None:
    """Drop a new clip ``name`` (3 s, its own pitch ``hz`` so its digest is new) into the running
    server's clone library and wait until the server logs that it prepared new clips."""
    marker = "new clone clip(s) prepared before their first request"
    before = log.read_text(errors="replace").count(marker)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    (voices / f"{name}.txt").write_text(CLONE_TRANSCRIPT)
    partial = voices / f"{name}.partial"  # a suffix the library skips, renamed once whole
    sf.write(partial, (0.2 * np.sin(2 * np.pi * hz * t)).astype(np.float32), SAMPLE_RATE, format="FLAC")
    partial.rename(voices / f"{name}.flac")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and log.read_text(errors="replace").count(marker) <= before:
        await asyncio.sleep(0.2)


async def _measure(
    port: int, http_port: int, pid: int, log: Path, row: Row, swaps: int, turns: bool, voices: Path | None = None,
) -> None:
    fa = row.first_audio_ms

    async def first(key: str, voice: str) -> float | None:
        got, _done, _audio, error = await _wyoming(port, TEXT, voice)
        ms = round(got * 1000, 1) if got is not None and error is None else None
        if error:
            row.errors.append(f"{key}: {error}"[:300])
        return ms

    for key, voice in (("preset_unrendered", "aria"), ("preset", "lena"), ("clone_first", "clone"), ("clone", "clone")):
        fa[key] = await first(key, voice)

    if voices is not None:
        # A clip that appears while the server runs (the Base model is home after the clone):
        # prepared on arrival, its first request must start like any other's.
        name = f"arrived-{row.free_gb:g}gb"
        await _arrive(voices, name, log, 150 + 10 * row.free_gb)
        row.new_clip_first_ms = await first("new clip", name)  # detail only: memory.json keeps the fields
    fa["custom_voice"] = None  # the defaults load no CustomVoice model
    solo = [await _wyoming(port, TEXT, "clone") for _ in range(2)]
    row.speed_1 = _median_speed(solo)
    four = await asyncio.gather(*(_wyoming(port, TEXT, "clone") for _ in range(4)))
    row.speed_4 = _median_speed(four)
    if not turns or swaps <= 0:
        return
    # The models take turns: force swaps once the anchors are rendered (the VoiceDesign model
    # then comes only for designs), and read the server's GPU memory each time Base is back.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(re.findall(r"anchor rendered", log.read_text(errors="replace"))) < 13:
        await asyncio.sleep(0.5)
    for _ in range(max(1, swaps // 2)):
        error = await asyncio.to_thread(_design, http_port)
        if error:
            row.errors.append(f"design: {error}")
        _f, _d, _a, error = await _wyoming(port, TEXT, "clone")
        if error:
            row.errors.append(f"clone after a swap: {error}"[:300])
        row.swaps += 2
        row.memory_after_swaps_gb.append(round(gpu_memory_by_pid().get(pid, 0.0), 3))
    after = row.memory_after_swaps_gb
    if len(after) >= 2:
        slope = float(np.polyfit(np.arange(len(after)) * 2.0, np.array(after), 1)[0])  # GB a swap
        row.leak_mb_per_swap = round(slope * 1024, 1)


#: The preset whose anchor a seeded row leaves out, so that ``preset_unrendered`` still asks
#: for a preset without one (the defaults' default voice).
UNRENDERED = "aria"


def seed_anchors(source: Path, data: Path, leave_out: str = UNRENDERED) -> int:
    """Copy the preset anchors an earlier row rendered (``source``: its data folder's
    ``anchors``) into ``data``'s, all but ``leave_out``'s; returns the anchors copied. Rows
    where the VoiceDesign model cannot come in serve presets only from anchors that exist."""
    target = data / "anchors"
    target.mkdir(parents=True, exist_ok=True)
    copied = 0
    for meta in sorted(source.glob("*.json")):
        preset = json.loads(meta.read_text()).get("preset")
        if preset is None or preset == leave_out:  # (model-digests.json: a cache, not an anchor)
            continue
        for file in source.glob(meta.stem + ".*"):
            shutil.copy2(file, target / file.name)
        copied += 1
    return copied


def run_row(
    ckpt: Path, work: Path, free_gb: float, frames: int, swaps: int, extra: list[str], seed: Path | None = None,
) -> Row:
    """Hold all but ``free_gb`` GiB, start a server (its data folder holding the anchors of
    ``seed``, an earlier row's, but ``UNRENDERED``'s), measure it, stop both."""
    row = Row(free_gb)
    name = f"{free_gb:g}gb"
    shutil.rmtree(work / f"data-{name}", ignore_errors=True)  # a fresh data folder, even on a machine used before
    if seed is not None:
        row.anchors_seeded = seed_anchors(seed, work / f"data-{name}")
    try:
        holder, row.free_seen_gb = hold_gpu(free_gb)
    except RuntimeError as err:
        row.note = str(err)
        return row
    row.free_seen_gb = round(row.free_seen_gb, 2)
    proc = None
    try:
        started = time.monotonic()
        proc, port, http_port, log = _server(ckpt, work, name, frames, extra)
        why = _wait_ready(proc, log, 200)
        row.start_s = round(time.monotonic() - started, 1)
        if why is not None:
            row.note = why
            return row
        row.started = True
        text = log.read_text(errors="replace")
        # Taking turns, unless the VoiceDesign model was found never to fit (no swaps then).
        turns = "do not fit on the GPU together" in text and "Not served with this GPU memory" not in text
        try:
            voices = work / "voices"
            asyncio.run(asyncio.wait_for(_measure(port, http_port, proc.pid, log, row, swaps, turns, voices), 300))
        except Exception as err:  # noqa: BLE001 - a failed measurement is a result too
            row.note = f"measurement failed: {err!r}"[:300]
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            said = parse_log((work / f"server-{name}.log").read_text(errors="replace"))
            row.resident = said["resident"] if row.started else []
            row.streams, row.precision = said["streams"], said["precision"]
            row.streams_per_load = said["streams_per_load"]
            row.allocated_after_leaving_gb = said["allocated_after_leaving_gb"]
            if said["swap_waits_s"]:
                row.swap_wait_max_ms = round(max(said["swap_waits_s"]) * 1000, 0)
        holder.kill()
        holder.wait(10)
        for file in (work / "voices").glob(f"arrived-{name}.*"):
            file.unlink()
    return row


def write(rows: list[Row], out: Path, gpu: str) -> None:
    """memory.json (``JSON_FIELDS`` per row), memory-detail.json (whole rows) and memory.md."""
    out.mkdir(parents=True, exist_ok=True)
    whole = [asdict(r) for r in rows]
    (out / "memory.json").write_text(json.dumps({"rows": [{k: r[k] for k in JSON_FIELDS} for r in whole]}, indent=2) + "\n")
    (out / "memory-detail.json").write_text(json.dumps({"gpu": gpu, "rows": whole}, indent=2) + "\n")
    lines = [
        f"Measured on {gpu}, another process holding all but N GiB of the GPU (no --gpu-memory cap); "
        "defaults (1.7B Base and VoiceDesign), random full-size weights, fixed-length sentences, a fresh data "
        "folder (no preset anchor yet). First audio in ms at the client; speed in seconds of audio per second, per stream.",
        "",
        "| free | starts | precision | resident | streams | default preset, unrendered | lena | clone, first | clone | new clip, first "
        "| longest swap wait (ms) | leak / swap (MB) | speed 1 / 4 clients | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        fa = r.first_audio_ms
        note = "; ".join([r.note, *r.errors]).strip("; ").replace("|", "/")
        cells = [
            f"{r.free_gb:g} GB", "yes" if r.started else "no", r.precision or "", ", ".join(r.resident),
            ", ".join(f"{k} {v}" for k, v in r.streams.items()), fa.get("preset_unrendered"), fa.get("preset"),
            fa.get("clone_first"), fa.get("clone"), r.new_clip_first_ms, r.swap_wait_max_ms, r.leak_mb_per_swap,
            f"{r.speed_1} / {r.speed_4}" if r.speed_1 is not None else "", note[:400],
        ]
        lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    (out / "memory.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", type=Path, default=Path(".ckpt/full"), help="base and voice_design inside")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--free", default=",".join(f"{g:g}" for g in FREE_GB), help="GiB free per row, comma separated")
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--swaps", type=int, default=SWAPS, help="swaps forced where the models take turns")
    parser.add_argument("--server-args", default="", help="extra server flags for every row")
    parser.add_argument("--time-limit", type=float, default=420, help="seconds; rows not started by then are skipped")
    parser.add_argument("--seed-anchors-below", type=float, default=5.0,
                        help="rows with less GiB free start with the preset anchors an earlier row rendered")
    args = parser.parse_args(argv)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    work = Path("/tmp/memory-bench")
    (work / "voices").mkdir(parents=True, exist_ok=True)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    voice = 0.2 * np.sin(2 * np.pi * 190 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    sf.write(work / "voices" / "clone.wav", voice.astype(np.float32), SAMPLE_RATE)
    (work / "voices" / "clone.txt").write_text(CLONE_TRANSCRIPT)
    began = time.monotonic()
    rows: list[Row] = []
    for spec in args.free.split(","):
        if time.monotonic() - began > args.time_limit:
            print(f"skipped {spec} GB: past --time-limit", flush=True)
            continue
        free = float(spec)
        rendered = [r for r in rows if any((work / f"data-{r.free_gb:g}gb" / "anchors").glob("*.json"))]
        seed = work / f"data-{rendered[-1].free_gb:g}gb" / "anchors" if rendered and free < args.seed_anchors_below else None
        row = run_row(args.ckpt, work, free, args.frames, args.swaps, args.server_args.split(), seed)
        if seed is not None:
            row.note = (f"started with the {row.anchors_seeded} preset anchors the {rendered[-1].free_gb:g} GB row "
                        f"rendered ({UNRENDERED}'s left out); " + row.note).rstrip("; ")
        rows.append(row)
        print(json.dumps(asdict(row)), flush=True)
        write(rows, args.out, gpu)
    print((args.out / "memory.md").read_text() if rows else "no rows")


if __name__ == "__main__":
    main()
