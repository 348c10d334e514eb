"""What int8 weights cost: greedy codes against full precision, frame time, weight memory.

``python -m benchmarks.int8_parity --out DIR`` on an NVIDIA GPU, with the full-size random
checkpoints in ``--checkpoints`` (``base``, ``voice_design``, ``custom_voice``; built by
``python -m wyoming_qwen3tts.testing.checkpoint .ckpt/full/<kind> --type <kind> --size full``).
Each model is loaded twice through ``load_engine`` (the batched CUDA-graph engine), at the
model's dtype (bfloat16) and with ``weight_quant="int8"``, and for each:

* **codes**: every voice kind of that model (ICL clone and x-vector clone on Base, a
  VoiceDesign preset's description, a CustomVoice speaker) generates ``--frames`` frames
  greedily (argmax everywhere, no repetition penalty), alone in the batch. The int8 codes are
  compared with the full-precision ones: the share of identical codes (all 16 codebooks of
  every frame), of identical first codebooks, and the first frame that differs. And the same
  shares teacher-forced (``int8_vs_full_teacher_forced``): int8 predicting each frame from the
  full-precision codes so far, so that each code is compared on the same history. With random
  weights the logits are nearly flat, so one flipped argmax changes everything after it; the
  floor to read them against is full precision against itself batched (the same request with
  ``--streams`` - 1 other requests beside it: bf16 GEMMs of another shape round differently,
  as they do in service), reported as ``full_batched_vs_alone``.
* **speed**: with ``b`` rows of ``--batches`` running, the engine loop's wall time per frame
  (step, decode on its side stream, delivery) and the step graph's GPU time (talker + code
  predictor, CUDA events over replays).
* **memory**: bytes of the model's weights on the device (parameters and buffers, int8 and
  scales included), memory allocated after loading (weights and ``--streams`` slots), and
  the peak while loading.

Writes ``int8_parity.json`` under ``--out`` and prints a summary. ``--device cpu`` runs the
same on the tiny checkpoints (float32, eager, no graphs: a check of the script, not figures).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wyoming_qwen3tts.engine import Segment, Work, load_engine
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.engine.batched.quant import weight_bytes
from wyoming_qwen3tts.engine.segment import Sampling
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference

from .profile_step import _List

TEXT = "The kitchen lights are now switched off for the night, and the front door is locked."
OTHER = "Tomorrow will be cloudy in the morning with sunny spells later and a light breeze."
PRESET = (
    "A warm and friendly female voice in her early thirties, speaking clear General American English "
    "at a relaxed, natural pace with a gentle smile in her tone."
)  # voices/presets.toml, aria
TRANSCRIPT = "This is a short reference recording for the benchmark."
#: Voice kinds by model: name -> Segment arguments (the references are made in ``voices``).
KINDS = {
    ModelKind.BASE: ("clone_icl", "clone_xvector"),
    ModelKind.VOICE_DESIGN: ("voice_design_preset",),
    ModelKind.CUSTOM_VOICE: ("custom_voice",),
}


def voices() -> dict[str, dict[str, Any]]:
    """Segment arguments of each voice kind: a 3 s voiced tone as the clone clip (with its
    transcript: ICL; without: x-vector), the ``aria`` preset's description, speaker ryan."""
    t = np.arange(72000) / 24000
    clip = (0.2 * np.sin(2 * np.pi * 190 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return {
        "clone_icl": {"reference": Reference.from_audio(clip, 24000, TRANSCRIPT)},
        "clone_xvector": {"reference": Reference.from_audio(clip, 24000, None)},
        "voice_design_preset": {"instruct": PRESET},
        "custom_voice": {"speaker": "ryan"},
    }


@dataclass
class _Sink:
    """Keeps nothing but the end; cancellable."""

    frames: int | None = None
    cancel: bool = False

    def cancelled(self) -> bool:
        return self.cancel

    def audio(self, chunk: np.ndarray) -> None:
        pass

    def done(self, frames: int) -> None:
        self.frames = frames

    def failed(self, error: BaseException) -> None:
        raise error


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def admit(engine: BatchedEngine, segments: list[Segment]) -> list[_Sink]:
    """Start ``segments`` in rows 0, 1, ... (all of them before the first step)."""
    sinks = [_Sink() for _ in segments]
    source = _List([Work(s, k) for s, k in zip(segments, sinks, strict=True)])
    while source.works:  # the planner may admit a few per call
        before = len(engine._rows)
        engine._admit(source, block=False)
        if len(engine._rows) == before:
            break
    assert len(engine._rows) == len(segments), "the pool is smaller than the batch"
    return sinks


def loop(engine: BatchedEngine, steps: int | None = None, record: bool = False) -> tuple[list[np.ndarray], float]:
    """The engine loop (launch, deliver the previous step, retire), ``steps`` frames or until
    the rows end. Returns (row 0's codes [16] per step when ``record``, wall seconds)."""
    codes: list[np.ndarray] = []
    pending = None
    t0 = time.perf_counter()
    n = 0
    while (engine._rows and (steps is None or n < steps)) or pending is not None:
        launched = engine._launch() if engine._rows and (steps is None or n < steps) else None
        if launched is not None:
            n += 1
            if record:
                codes.append(engine.state.codes[0].cpu().numpy().copy())
        if pending is not None:
            engine._deliver(pending)
        pending = launched
        engine._retire()
    _sync()
    return codes, time.perf_counter() - t0


def greedy(text: str, frames: int, voice: dict[str, Any]) -> Segment:
    return Segment(text, "english", frames, frames, seed=0, sampling=Sampling.greedy(), **voice)


def codes_of(engine: BatchedEngine, voice: dict[str, Any], frames: int, neighbours: int = 0) -> np.ndarray:
    """Row 0's greedy codes [frames, 16] for ``voice``, with ``neighbours`` other requests
    (the same voice, another text) running beside it."""
    admit(engine, [greedy(TEXT, frames, voice)] + [greedy(f"{OTHER} ({i})", frames, voice) for i in range(neighbours)])
    codes, _ = loop(engine, record=True)
    return np.stack(codes[:frames])


def compare(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Identical shares of two code arrays [frames, 16], and the first frame that differs."""
    same = a == b
    frames = same.all(axis=1)
    first = int(np.argmin(frames)) if not frames.all() else None
    return {
        "identical_codes": float(same.mean()),
        "identical_first_codebook": float(same[:, 0].mean()),
        "identical_frames": float(frames.mean()),
        "first_differing_frame": first,
    }


def teacher_forced(engine: BatchedEngine, voice: dict[str, Any], reference: np.ndarray) -> np.ndarray:
    """Which codes ``engine`` predicts as ``reference`` [frames, 16] does, given the same
    history: every frame's step runs on the reference's codes so far (the first codebook
    forced into the row's token before each step, the other 15 forced into the talker's input
    through a wrapped code predictor, which records its own predictions), so one differing
    code does not change everything after it. Re-captures the step graphs with the wrapper;
    leave the engine to be dropped after. Returns bool [frames, 16]."""
    frames = len(reference)
    step, s = engine.step, engine.state
    original = step._predict
    forced = torch.zeros(s.slots, step.groups - 1, dtype=torch.int64, device=engine.device)
    predicted = torch.zeros_like(forced)

    def predict(past_hidden: torch.Tensor, first: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        b = first.shape[0]
        predicted[:b].copy_(original(past_hidden, first, noise))
        return forced[:b]

    step._predict = predict  # type: ignore[method-assign]
    if engine.use_graphs:
        engine.graphs.capture()
    sinks = admit(engine, [greedy(TEXT, frames + 2, voice)])
    ref = torch.as_tensor(reference, device=engine.device)
    same = np.zeros((frames, 16), dtype=bool)
    with torch.inference_mode():
        for f in range(frames):
            same[f, 0] = int(s.token[0]) == int(reference[f, 0])  # predicted by the step before (or the prefill)
            s.token[0] = ref[f, 0]
            forced[0] = ref[f, 1:]
            engine.graphs.run(*engine.graphs.bucket(1, int(s.position[0]) + 2))
            same[f, 1:] = predicted[0].cpu().numpy() == reference[f, 1:]
    for sink in sinks:  # the row leaves, so the next voice's row is alone in the pool
        sink.cancel = True
    loop(engine)
    del step._predict  # the class's own again: the next voice wraps it afresh, not this wrapper
    if engine.use_graphs:
        engine.graphs.capture()
    return same


def speed(engine: BatchedEngine, voice: dict[str, Any], rows: int, frames: int) -> dict[str, float]:
    """Frame time with ``rows`` rows running: loop wall ms per frame, step graph GPU ms."""
    long = frames * 3 + 20
    sinks = admit(engine, [greedy(f"{TEXT} ({i})", long, voice) for i in range(rows)])
    loop(engine, steps=5)  # warm
    _, wall = loop(engine, steps=frames)
    out = {"loop_ms_per_frame": wall * 1000 / frames}
    if engine.use_graphs:
        b, length = engine.graphs.bucket(rows, engine.pool.longest() + frames + 2)
        times = []
        for _ in range(frames):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            engine.graphs.run(b, length)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        out["step_graph_ms"] = float(np.median(times))
    for sink in sinks:
        sink.cancel = True
    loop(engine)
    return out


def measure(
    kind: ModelKind, path: Path, quant: str, args: argparse.Namespace, reference: dict[str, np.ndarray] | None = None
) -> dict[str, Any]:
    """One model at one precision: load, codes of each voice kind, speed, memory; with the
    full-precision codes as ``reference``, also the teacher-forced agreement with them."""
    gc.collect()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    engine = load_engine(kind, path, args.device, 1, engine="batched", max_streams=args.streams, dtype=args.dtype,
                         max_len=args.max_len, weight_quant=quant)
    assert isinstance(engine, BatchedEngine)
    load_s = time.perf_counter() - t0
    result: dict[str, Any] = {"load_s": round(load_s, 2)}
    model = engine._model
    result["weight_bytes"] = weight_bytes(model) + weight_bytes(model.speech_tokenizer.model)
    if cuda:
        result["allocated_after_load_bytes"] = torch.cuda.memory_allocated() - before
        result["peak_while_loading_bytes"] = torch.cuda.max_memory_allocated() - before
    t0 = time.perf_counter()
    engine._capture()
    result["capture_s"] = round(time.perf_counter() - t0, 2)
    all_voices = voices()
    result["codes"] = {name: codes_of(engine, all_voices[name], args.frames) for name in KINDS[kind]}
    if quant == "none":
        first = KINDS[kind][0]
        result["codes_batched"] = {first: codes_of(engine, all_voices[first], args.frames, neighbours=args.streams - 1)}
    result["speed"] = {str(b): speed(engine, all_voices[KINDS[kind][0]], b, args.timed_frames) for b in args.batches}
    if reference is not None:  # last: it re-captures the step graphs with a wrapped predictor
        result["forced"] = {name: teacher_forced(engine, all_voices[name], reference[name]) for name in KINDS[kind]}
    del engine, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    """Measure and write (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.int8_parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", default=".ckpt/full", help="folder with base, voice_design, custom_voice")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dtype", default="auto", help="the full-precision dtype (auto: bfloat16 on CUDA)")
    parser.add_argument("--frames", type=int, default=200, help="greedy frames compared per voice kind")
    parser.add_argument("--timed-frames", type=int, default=40, help="frames timed per batch size")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--streams", type=int, default=16, help="slots of each engine (the batched floor uses them all)")
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--kinds", default="base,voice_design,custom_voice")
    parser.add_argument("--out", default="benchmarks/results/int8")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    if max(args.batches) > args.streams:
        parser.error("--batches larger than --streams")
    kinds = [ModelKind(k) for k in args.kinds.split(",")]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "frames": args.frames, "dtype": args.dtype, "streams": args.streams, "models": {},
    }
    t_start = time.perf_counter()
    for kind in kinds:
        path = Path(args.checkpoints) / kind.value
        full = measure(kind, path, "none", args)
        int8 = measure(kind, path, "int8", args, reference=full["codes"])
        entry: dict[str, Any] = {"voices": {}}
        for name, codes in full["codes"].items():
            same = int8["forced"][name]
            entry["voices"][name] = {
                "int8_vs_full": compare(int8["codes"][name], codes),
                "int8_vs_full_teacher_forced": {
                    "identical_codes": float(same.mean()), "identical_first_codebook": float(same[:, 0].mean()),
                    "identical_frames": float(same.all(axis=1).mean()),
                },
            }
        for name, codes in full["codes_batched"].items():
            entry["voices"][name]["full_batched_vs_alone"] = compare(codes, full["codes"][name])
        for label, r in (("full", full), ("int8", int8)):
            entry[label] = {k: v for k, v in r.items() if not k.startswith("codes") and k != "forced"}
        entry["weight_saving"] = 1 - int8["weight_bytes"] / full["weight_bytes"]
        report["models"][kind.value] = entry
        print(f"{kind.value}: weights {full['weight_bytes'] / 1e9:.2f} -> {int8['weight_bytes'] / 1e9:.2f} GB "
              f"({entry['weight_saving']:.0%} less); load {full['load_s']} / {int8['load_s']} s", flush=True)
        for name, v in entry["voices"].items():
            c, t = v["int8_vs_full"], v["int8_vs_full_teacher_forced"]
            floor = v.get("full_batched_vs_alone")
            print(f"  {name}: int8 vs full, same history: {t['identical_codes']:.1%} codes identical (first codebook "
                  f"{t['identical_first_codebook']:.1%}); free-running: {c['identical_codes']:.1%}, first codebook "
                  f"{c['identical_first_codebook']:.1%}, first difference at frame {c['first_differing_frame']}"
                  + (f"; floor (full precision at batch {args.streams} vs alone) {floor['identical_codes']:.1%}, first at {floor['first_differing_frame']}"
                     if floor else ""), flush=True)
        for b in args.batches:
            f, q = full["speed"][str(b)], int8["speed"][str(b)]
            print(f"  batch {b}: loop {f['loop_ms_per_frame']:.2f} -> {q['loop_ms_per_frame']:.2f} ms/frame"
                  + (f", step graph {f['step_graph_ms']:.2f} -> {q['step_graph_ms']:.2f} ms" if "step_graph_ms" in f else ""),
                  flush=True)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "int8_parity.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'int8_parity.json'} in {report['seconds']} s")


if __name__ == "__main__":
    main()
