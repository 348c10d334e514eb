"""The CPU's limits, measured: what the codec costs (FLOPs per frame by stage, counted from the
loaded architecture), how fast each codec runtime decodes the same codes on 1 and 2 threads,
and how many bytes a frame of generation reads at each weight format. Figures, not tests.

    python -m benchmarks.cpu_limits --checkpoint CKPT --gguf-dir DIR [--frames 40] --out FILE.json

* ``CKPT``: a Qwen3-TTS checkpoint folder (the random full-size 0.6B of
  ``wyoming_qwen3tts.testing.checkpoint --size 0.6b`` will do: costs depend on shapes only);
  ``DIR``: its GGUF conversions, ``DIR/<QUANT>/`` for each format (``python -m
  wyoming_qwen3tts.gguf CKPT DIR/Q8_0 --quant Q8_0``...).
* FLOPs: forward hooks on every Conv1d/ConvTranspose1d/Linear of the decoder while it decodes
  ``frames`` frames at once (2 x multiply-adds), plus the sliding-window attention's two
  matrix products (window 72), divided by the frames.
* Codecs on the same codes (greedy codes of the 0.6B talker, from qwentts.cpp's
  ``dump_dir``): qwentts.cpp's own (its ``[Perf] CodecDecode`` over a buffered request: the
  wheel decodes inside generation and has no codes-in API), PyTorch's oneDNN convolutions
  through the project's incremental decoder (``engine.batched.codec.StreamingDecoder``,
  frame by frame), and ONNX Runtime's CPU provider on that same step exported to ONNX with
  its state as inputs and outputs (``benchmarks.onnx_codec``; exported at the start unless
  ``--onnx`` names a file; left out, saying why, where onnxruntime, onnx or onnxscript is
  not installed: the project depends on none of them directly). ``max_abs_diff``: largest
  sample difference from PyTorch's whole-sequence decode (the reference decoder). Threads:
  ``torch.set_num_threads``/the library's ``cpu_threads``/``intra_op_num_threads``; pin the
  process with ``taskset`` to count cores.
* 4-bit against 8-bit (``--share-frames N``): greedy codes of a ``Q4_0`` talker against the
  ``Q8_0`` one's over N frames, same prompt and seed: the share of the 16 codes a frame that
  are identical, frame by frame until the first differing first code (after it the two
  streams say different things) and over all N. Random weights: a proxy only; the released
  weights are what decides a default.
* Generation bytes per frame: the talker's layer matrices and codec head once, the code
  predictor's layer matrices 15 times (one step per residual codebook), one of its 15 heads
  per step, embedding rows negligible; from the GGUF files' own tensor sizes.

Set ``ONEDNN_MAX_CPU_ISA=AVX2`` in the environment to hold PyTorch to a desktop's ISA.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank, and then it runs home."


def stage_of(name: str) -> str:
    """Report stage of a decoder module name (``decoder.3.block.2...`` -> ``dac block 3``)."""
    if name.startswith("quantizer"):
        return "rvq output"
    if name.startswith("pre_conv"):
        return "pre conv"
    if name.startswith("pre_transformer"):
        return "transformer"
    if name.startswith("upsample"):
        return "upsample + convnext"
    m = re.match(r"decoder\.(\d+)", name)
    return f"dac {m.group(1)}" if m else name.split(".")[0]


def codec_flops(decoder: Any, frames: int) -> dict[str, float]:
    """FLOPs per frame by stage (2 per multiply-add) of decoding ``frames`` frames at once."""
    import torch

    totals: dict[str, float] = {}
    hooks = []
    for name, module in decoder.named_modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear)):
            def hook(mod: Any, inputs: Any, output: Any, stage: str = stage_of(name)) -> None:
                if isinstance(mod, torch.nn.Linear):
                    macs = output.numel() * mod.in_features
                elif isinstance(mod, torch.nn.Conv1d):
                    macs = output.numel() * mod.in_channels // mod.groups * mod.kernel_size[0]
                else:  # transposed: every input sample meets every kernel tap of its group
                    macs = inputs[0].numel() * mod.out_channels // mod.groups * mod.kernel_size[0]
                totals[stage] = totals.get(stage, 0.0) + 2.0 * macs
            hooks.append(module.register_forward_hook(hook))
    codes = torch.randint(0, 2048, (1, 16, frames), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        decoder(codes)
    for h in hooks:
        h.remove()
    cfg = decoder.pre_transformer.config
    attention = 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * min(frames, cfg.sliding_window) * frames
    totals["transformer"] = totals.get("transformer", 0.0) + attention
    return {k: v / frames for k, v in totals.items()}


def torch_codec(decoder: Any, codes: np.ndarray, threads: int, reference: np.ndarray) -> dict[str, Any]:
    """PyTorch, frame by frame through ``StreamingDecoder``: ms per frame (median after 5
    warm-up frames) and the largest difference from the whole-sequence decode."""
    import torch

    from wyoming_qwen3tts.engine.batched.codec import StreamingDecoder

    torch.set_num_threads(threads)
    stream = StreamingDecoder(decoder, 1)
    c = torch.from_numpy(codes.astype(np.int64))[None]
    times, parts = [], []
    with torch.inference_mode():
        for t in range(c.shape[-1]):
            start = time.perf_counter()
            parts.append(stream.step(c[:, :, t : t + 1])[0].numpy())
            times.append(time.perf_counter() - start)
    audio = np.concatenate(parts)
    return {"ms_per_frame": round(1000 * statistics.median(times[5:]), 1), "max_abs_diff": float(np.abs(audio - reference).max())}


def onnx_codec(model: Path, codes: np.ndarray, threads: int, reference: np.ndarray) -> dict[str, Any]:
    """ONNX Runtime's CPU provider on the exported streaming step (``benchmarks.onnx_codec``),
    frame by frame with its state passed in and out: same figures as ``torch_codec`` (over
    the whole calls of the model's ``frames`` a call that ``codes`` holds)."""
    from benchmarks.onnx_codec import OnnxStreamingDecoder

    stream = OnnxStreamingDecoder(model, threads)
    usable = codes.shape[-1] // stream.frames * stream.frames
    times, parts = [], []
    for t in range(0, usable, stream.frames):
        start = time.perf_counter()
        parts.append(stream.step(codes[:, t : t + stream.frames]))
        times.append(time.perf_counter() - start)
    audio = np.concatenate(parts)
    return {"ms_per_frame": round(1000 * statistics.median(times[5:]) / stream.frames, 1),
            "max_abs_diff": float(np.abs(audio - reference[: len(audio)]).max())}


def onnx_model(decoder: Any, given: Path | None, frames: int) -> tuple[Path | None, str]:
    """The ONNX model to race: ``given``, else the decoder exported now (``frames`` codec
    frames a call, into a temporary folder). (None, why) where a package is missing."""
    import importlib.util
    import tempfile

    needed = ["onnxruntime"] + ([] if given else ["onnx", "onnxscript"])
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        return None, f"skipped: {', '.join(missing)} not installed (pip install {' '.join(missing)}; not project dependencies)"
    if given:
        return given, f"given: {given}"
    from benchmarks.onnx_codec import export

    start = time.perf_counter()
    path = export(decoder, Path(tempfile.mkdtemp(prefix="cpu-limits-onnx-")) / "codec.onnx", frames)
    return path, f"exported: {frames} frame(s) a call, {time.perf_counter() - start:.0f} s"


#: Library objects holding our log callbacks (freed, the library would call freed memory).
_LOG_OWNERS: list[Any] = []


def _read_dump(path: Path) -> np.ndarray:
    """A qwentts.cpp dump (int32 ndim, int32 dims..., float32 values; ggml order)."""
    raw = np.fromfile(path, dtype=np.int32)
    ndim = int(raw[0])
    dims = [int(x) for x in raw[1 : 1 + ndim]]
    return raw[1 + ndim :].view(np.float32).reshape(dims)


def ggml_codec(talker: Path, codec: Path, frames: int, threads: int, dump: Path) -> dict[str, Any]:
    """qwentts.cpp: one buffered greedy request of ``frames`` frames on ``threads`` threads (no
    codec overlap, so the codec runs on all of them); its own ``[Perf]`` split; its codes and
    audio from ``dump_dir``."""
    import qwentts_cpp_cpu

    lines: list[str] = []
    library = qwentts_cpp_cpu.QwenLibrary()
    library.set_log_callback(lambda level, message: lines.append(message))
    _LOG_OWNERS.append(library)  # the native callback is process-wide: its owner must outlive it
    context = qwentts_cpp_cpu.QwenTTS(talker, codec, cpu_threads=threads)
    dump.mkdir(parents=True, exist_ok=True)
    audio, _ = context.synthesize(text=TEXT, speaker="ryan", seed=0, max_new_tokens=frames, do_sample=False,
                                  subtalker_do_sample=False, repetition_penalty=1.0, dump_dir=str(dump))
    context.close()
    text = "\n".join(lines)

    def perf(key: str) -> float:
        found = re.findall(rf"\[Perf\] {key} ([\d.]+) ms", text)
        return float(found[-1]) if found else float("nan")

    codes = _read_dump(dump / "codes-full.bin").astype(np.int64)  # [frames, 16]
    n = codes.shape[0]
    return {
        "frames": n,
        "codec_ms_per_frame": round(perf("CodecDecode") / n, 1),
        "talker_ms_per_frame": round(perf("TalkerDecode") / n, 1),
        "predictor_ms_per_frame": round(float(re.findall(r"CodePredictor [\d.]+ ms \(([\d.]+) ms/frame", text)[-1]), 1)
        if "CodePredictor" in text else float("nan"),
        "prefill_ms": perf("Prefill"),
        "codes": codes.T,  # [16, frames]
        "audio": np.asarray(audio, dtype=np.float32),
    }


def greedy_codes(talker: Path, codec: Path, frames: int, dump: Path) -> np.ndarray:
    """Greedy codes [frames, 16] of one CustomVoice request (``TEXT`` x 4, speaker ryan)."""
    import qwentts_cpp_cpu

    context = qwentts_cpp_cpu.QwenTTS(talker, codec, cpu_threads=1)
    dump.mkdir(parents=True, exist_ok=True)
    context.synthesize(text=TEXT * 4, speaker="ryan", seed=0, max_new_tokens=frames, do_sample=False,
                       subtalker_do_sample=False, repetition_penalty=1.0, dump_dir=str(dump))
    context.close()
    return _read_dump(dump / "codes-full.bin").astype(np.int64)


def code_share(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Identical codes of two greedy runs [frames, 16]: overall, and until the first frame
    whose first code (the talker's) differs."""
    n = min(len(a), len(b))
    same = a[:n] == b[:n]
    diverge = next((i for i in range(n) if not same[i, 0]), n)
    return {"frames": n, "identical_share": round(float(same.mean()), 4),
            "first_code_diverges_at_frame": diverge,
            "identical_share_before_divergence": round(float(same[:diverge].mean()), 4) if diverge else None}


def generation_bytes(talker: Path) -> dict[str, float]:
    """Bytes read per frame by generation, from the talker GGUF's tensor sizes."""
    from gguf import GGUFReader

    out = {"talker layers": 0.0, "talker head": 0.0, "predictor layers x15": 0.0, "predictor heads": 0.0}
    for t in GGUFReader(str(talker)).tensors:
        size = float(t.n_bytes)
        if re.match(r"talker\.blk\.", t.name):
            out["talker layers"] += size
        elif t.name == "talker.codec_head.weight":
            out["talker head"] += size
        elif re.match(r"code_pred\.blk\.", t.name):
            out["predictor layers x15"] += 15 * size
        elif re.match(r"code_pred\.lm_head\.", t.name):
            out["predictor heads"] += size  # one of 15 a step, each once a frame
    out["total"] = sum(out.values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--gguf-dir", type=Path, required=True, help="holds Q8_0/ (and Q4_0/, BF16/) conversions")
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--share-frames", type=int, default=0, help="greedy Q4_0 vs Q8_0 codes over this many frames")
    parser.add_argument("--onnx", type=Path, help="an exported streaming codec (benchmarks.onnx_codec); default: export one now")
    parser.add_argument("--onnx-frames", type=int, default=1, help="codec frames a call of the exported step")
    parser.add_argument("--no-onnx", action="store_true", help="leave ONNX Runtime out of the race")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cores": len(os.sched_getaffinity(0)),
        "cpu": next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")), ""),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "(not set)"),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    pairs = {}
    for folder in sorted(p for p in args.gguf_dir.iterdir() if p.is_dir()):
        talkers = list(folder.glob("*talker*.gguf"))
        codecs = list(folder.glob("*tokenizer*.gguf"))
        if talkers and codecs:
            pairs[folder.name] = (talkers[0], codecs[0])
    result["generation_bytes_per_frame"] = {q: generation_bytes(t) for q, (t, _) in pairs.items()}
    quant = "Q8_0" if "Q8_0" in pairs else next(iter(pairs))
    ggml = {n: ggml_codec(*pairs[quant], args.frames, n, Path(f"/tmp/cpu-limits-dump-{n}")) for n in args.threads}
    codes = ggml[args.threads[0]]["codes"]
    result["codes"] = {"frames": int(codes.shape[-1]), "sha256": hashlib.sha256(codes.astype(np.int64).tobytes()).hexdigest()[:16]}
    share = {}
    if args.share_frames and {"Q8_0", "Q4_0"} <= set(pairs):
        runs = {q: greedy_codes(*pairs[q], args.share_frames, Path(f"/tmp/cpu-limits-share-{q}")) for q in ("Q8_0", "Q4_0")}
        share = code_share(runs["Q8_0"], runs["Q4_0"])
    import torch
    from qwen_tts import Qwen3TTSModel

    torch.set_num_threads(max(args.threads))
    qwen = Qwen3TTSModel.from_pretrained(str(args.checkpoint), device_map="cpu", dtype=torch.float32)
    decoder = qwen.model.speech_tokenizer.model.decoder
    result["codec_flops_per_frame"] = {k: round(v / 1e9, 3) for k, v in codec_flops(decoder, args.frames).items()}
    total = sum(result["codec_flops_per_frame"].values())
    result["codec_gflop_per_frame"] = round(total, 3)
    with torch.inference_mode():
        reference = decoder(torch.from_numpy(codes)[None])[0, 0].numpy()
    onnx, result["onnx_model"] = (None, "left out (--no-onnx)") if args.no_onnx else onnx_model(decoder, args.onnx, args.onnx_frames)
    if onnx is None:
        print(f"ONNX Runtime racer {result['onnx_model']}", file=sys.stderr)
    else:
        import onnxruntime

        result["onnxruntime"] = onnxruntime.__version__
        avx512 = "avx512f" in Path("/proc/cpuinfo").read_text()
        result["onnxruntime_isa"] = ("AVX-512F: its MLAS kernels follow CPUID, ONEDNN_MAX_CPU_ISA does not cap them"
                                     if avx512 else "AVX2 or less (no avx512f flag)")
    result["torch"] = torch.__version__
    runtimes: dict[str, dict[str, Any]] = {}
    for n in args.threads:
        g = ggml[n]
        m = min(len(g["audio"]), len(reference))
        runtimes.setdefault("qwentts.cpp (ggml, f16 convolutions)", {})[f"{n} thread(s)"] = {
            "ms_per_frame": g["codec_ms_per_frame"], "gflops": round(total / g["codec_ms_per_frame"] * 1e3, 1),
            "max_abs_diff": float(np.abs(g["audio"][:m] - reference[:m]).max()),
            "generation_ms_per_frame": {"talker": g["talker_ms_per_frame"], "code predictor": g["predictor_ms_per_frame"]},
            "prefill_ms": g["prefill_ms"],
        }
        t = torch_codec(decoder, codes, n, reference)
        t["gflops"] = round(total / t["ms_per_frame"] * 1e3, 1)
        runtimes.setdefault("pytorch (oneDNN) streaming", {})[f"{n} thread(s)"] = t
        if onnx is not None:
            o = onnx_codec(onnx, codes, n, reference)
            o["gflops"] = round(total / o["ms_per_frame"] * 1e3, 1)
            runtimes.setdefault("onnxruntime CPU streaming", {})[f"{n} thread(s)"] = o
        print(n, runtimes, flush=True, file=sys.stderr)
    result["codec_runtimes"] = runtimes
    if share:
        result["q4_0_vs_q8_0_greedy_codes"] = {"custom_voice ryan": share}
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
