"""Can one frame's generation (talker step + the code predictor's 15 steps) run fast enough on
a CPU outside qwentts.cpp? Times it for several runtimes on one and two threads.

    python -m benchmarks.cpu_generation_probe --checkpoint CKPT [--frames 20] [--out JSON]

One codec frame of generation at batch 1 is one talker step (28 layers for 0.6B, one new
position against the KV cache of the prompt and the frames before it, then the codec head)
and the code predictor's loop (its 5 layers on [talker hidden, first code] then 14 one-token
steps, each with its own head): 15 codes after the talker's first. Candidates, all greedy:

* ``reference``: qwen_tts's own ``generate_custom_voice`` as the reference engine runs it
  (transformers' ``generate`` of the talker, which calls the predictor's ``generate`` every
  step; float32, SDPA attention). The time of a frame is the interval between two talker
  forwards (forward hooks). With ``--profile``, ``torch.profiler`` splits a frame (a run of
  ``--frames`` frames less one of 2, so the prefill drops out) into the matrix products
  (``aten::mm/addmm/bmm``, SDPA), the other ops and the wall time outside ops (Python).
* ``lean-fp32``: the same computation written as two plain ``nn.Module``s (``LeanTalker``:
  embeddings in, keys/values of the past in and out; ``LeanPredictor``: the whole 15-step loop
  with greedy picks in the module) on the same weights: what is left without transformers'
  generation machinery.
* ``lean-int8dyn``: ``lean-fp32`` after ``torch.ao.quantization.quantize_dynamic`` of every
  ``nn.Linear`` (int8 weights per output channel, activations quantized on the fly; fbgemm).
* ``lean-bf16``: ``lean-fp32`` cast to bfloat16 (oneDNN).
* ``ort-fp32``, ``ort-int8``, ``ort-nbits4``, ``ort-nbits8``: the two lean modules exported
  to ONNX (``torch.onnx.export(dynamo=True)``) and run by ONNX Runtime's CPU provider, the
  talker's keys/values kept as ORT values between steps (IO binding), both sessions on
  one global intra-op pool of ``threads`` threads (two per-session pools, each spinning
  after its run, slowed the other session's run by up to 2x); int8 is
  ``onnxruntime.quantization.quantize_dynamic`` (MatMulInteger, per-channel int8 weights),
  nbits is ``MatMulNBitsQuantizer`` (blockwise 4 or 8 bits, block 32, int8 compute:
  ``accuracy_level`` 4).

The predictor is exported with its 15 steps unrolled in one graph (its weights shared by
the 15 copies, stored pre-transposed so that the quantizers see plain MatMul initializers);
the talker with the prompt length and the past length dynamic.

All candidates are loaded in one worker process and, after a 2-frame warm-up, run in turn
within each repeat (so a slow spell of the shared machine hits them alike). Every candidate
starts from the same prompt (qwen_tts's prefill inputs for one CustomVoice
sentence, captured from the reference run; the lean and ORT candidates run their own
prefill) and makes ``--frames`` frames. Per candidate: ``ms_per_frame`` (median over the
frames after the first, then the median of ``--repeats`` runs), the talker and predictor
shares where they are separate calls, and ``codes_equal_reference``: the share of the
[frames, 16] codes identical to the reference's.

The driver runs one worker per thread count pinned with ``taskset`` (1 thread on core 0,
2 threads on cores 0-1), with ``ONEDNN_MAX_CPU_ISA=AVX2`` (caps oneDNN only: fbgemm's int8
kernels and ONNX Runtime's MLAS follow CPUID, i.e. AVX-512/VNNI where the CPU has them), and
writes the JSON (``uptime`` before and after each worker). Units: milliseconds a frame; a
frame is 80 ms of audio. Needs ``onnx``, ``onnxscript`` (export) and ``onnxruntime``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np

from wyoming_qwen3tts.testing.lean import Tables as _Tables
from wyoming_qwen3tts.testing.lean import greedy_frames as _greedy_frames
from wyoming_qwen3tts.testing.lean import lean_classes as _lean_classes
from wyoming_qwen3tts.testing.lean import lean_torch_run
from wyoming_qwen3tts.testing.lean import texts as _texts

TEXT = "The kitchen lights are now switched off for the night, and the doors are locked."
SPEAKER = "ryan"
#: ONNX opset of the exported steps.
OPSET = 18


# --- the reference run ------------------------------------------------------------------


def load(checkpoint: Path) -> Any:
    """qwen_tts's model as the reference engine loads it: float32 on the CPU, SDPA."""
    import torch
    from qwen_tts import Qwen3TTSModel

    return Qwen3TTSModel.from_pretrained(str(checkpoint), device_map="cpu", dtype=torch.float32,
                                         attn_implementation="sdpa")


class _Done(Exception):
    pass


def reference_run(qwen: Any, frames: int) -> dict[str, Any]:
    """Greedy generation of ``frames`` frames through qwen_tts (its decode skipped).

    Returns {"frame_ms": [frames - 1 intervals], "codes": int64 [frames, 16], "inputs": the
    talker's prefill inputs (inputs_embeds [1, T, H], trailing_text_hidden [1, n, H],
    tts_pad_embed [1, 1, H])}."""
    import torch

    talker = qwen.model.talker
    stamps: list[float] = []
    codes: list[Any] = []
    captured: dict[str, Any] = {}

    def on_step(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        stamps.append(time.perf_counter())
        if output.hidden_states[1] is not None:
            codes.append(output.hidden_states[1][0].clone())

    generate = talker.generate

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        captured.update(inputs_embeds=kwargs["inputs_embeds"].clone(),
                        trailing_text_hidden=kwargs["trailing_text_hidden"].clone(),
                        tts_pad_embed=kwargs["tts_pad_embed"].clone())
        kwargs["min_new_tokens"] = kwargs["max_new_tokens"]
        generate(*args, **kwargs)
        raise _Done

    handle = talker.register_forward_hook(on_step, with_kwargs=True)
    talker.generate = wrapped
    try:
        with torch.inference_mode():
            try:
                qwen.generate_custom_voice(text=TEXT, speaker=SPEAKER, language="english", non_streaming_mode=True,
                                           max_new_tokens=frames + 1, do_sample=False, subtalker_dosample=False,
                                           repetition_penalty=1.0)
            except _Done:
                pass
    finally:
        handle.remove()
        talker.generate = generate
    out: dict[str, Any] = {
        "frame_ms": [1000 * (b - a) for a, b in zip(stamps[1:], stamps[2:])],
        "codes": torch.stack(codes[:frames]).numpy(),
        "inputs": captured,
    }
    return out


def _op_times(run: Any) -> tuple[dict[str, tuple[float, int]], float]:
    """Profile ``run()`` (torch.profiler, CPU): ({op: (self ms, calls)}, median frame wall ms)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = run()
    ops = {r.key: (r.self_cpu_time_total / 1000.0, r.count) for r in prof.key_averages()}
    return ops, statistics.median(result["frame_ms"]) if result["frame_ms"] else float("nan")


def _split_profile(run: Any, frames: int) -> dict[str, Any]:
    """Where a frame's time goes: ``run(n)`` profiled for ``frames`` and for 2 frames, the
    difference divided by ``frames - 2`` (so the prompt's prefill drops out). Returns ms a
    frame of all torch ops' self time, of the matrix products (``aten::mm/addmm/bmm`` and
    SDPA), the wall time of a profiled frame, op calls a frame and the top ops."""
    many, wall = _op_times(lambda: run(frames))
    few, _ = _op_times(lambda: run(2))
    n = frames - 2
    diff = {k: ((v[0] - few.get(k, (0.0, 0))[0]) / n, (v[1] - few.get(k, (0.0, 0))[1]) / n) for k, v in many.items()}
    matmul_keys = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")
    top = sorted(diff.items(), key=lambda kv: -kv[1][0])[:12]
    return {
        "wall_ms_per_frame_profiled": round(wall, 2),
        "ops_self_ms_per_frame": round(sum(v[0] for v in diff.values()), 2),
        "matmul_self_ms_per_frame": round(sum(diff[k][0] for k in matmul_keys if k in diff), 2),
        "aten_calls_per_frame": round(sum(v[1] for k, v in diff.items() if k.startswith("aten::"))),
        "top_self_ms_per_frame": {k: [round(v[0], 2), round(v[1])] for k, v in top},
        "note": "self times of the calling thread's ops (profiler overhead included); "
                "wall minus ops self time is Python and dispatch outside ops",
    }


# --- the ONNX Runtime runs (the lean modules: ``wyoming_qwen3tts.testing.lean``) ----------


def _pretransposed(module: Any) -> Any:
    """``module`` with every ``nn.Linear`` replaced by ``x @ weight.T`` on a stored transposed
    copy. The unrolled predictor uses each weight 15 times, and the exporter leaves one
    ``Transpose`` node per weight in front of its MatMuls, which the quantizers cannot see
    through; a stored [in, out] weight is a plain initializer of every MatMul."""
    import torch
    from torch import nn

    class TransposedLinear(nn.Module):
        def __init__(self, linear: nn.Linear) -> None:
            super().__init__()
            self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
            self.bias = linear.bias

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.matmul(x, self.weight_t)
            return y if self.bias is None else y + self.bias

    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, TransposedLinear(child))
        elif isinstance(child, nn.ModuleList):
            for i, item in enumerate(child):
                child[i] = TransposedLinear(item) if isinstance(item, nn.Linear) else _pretransposed(item)
        else:
            _pretransposed(child)
    return module


def export_onnx(talker: Any, folder: Path, parts: tuple[str, ...] = ("talker", "predictor")) -> tuple[Path, Path]:
    """Write ``talker.onnx`` (LeanTalker, T and P dynamic) and ``predictor.onnx``
    (LeanPredictor, the loop unrolled) into ``folder``; weights in external data files."""
    import torch

    LeanTalker, LeanPredictor = _lean_classes()
    folder.mkdir(parents=True, exist_ok=True)
    t_mod, p_mod = LeanTalker(talker).eval(), _pretransposed(LeanPredictor(talker).eval())
    layers = len(t_mod.layers)
    h = talker.config.hidden_size
    kv = t_mod.layers[0]
    names = [f"{kind}_{i}" for i in range(layers) for kind in ("past_key", "past_value")]
    past = [torch.zeros(1, kv.kv_heads, 5, kv.head_dim) for _ in names]
    T, P = torch.export.Dim("T", min=1, max=4096), torch.export.Dim("P", min=0, max=8192)
    shapes = {"embeds": {1: T}, "past": [{2: P}] * len(names)}

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = t_mod

        def forward(self, embeds: torch.Tensor, past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
            return self.m(embeds, *past)

    talker_path, predictor_path = folder / "talker.onnx", folder / "predictor.onnx"
    with torch.no_grad():
        if "talker" in parts:
            program = torch.onnx.export(
                Wrapped(), (torch.zeros(1, 3, h), past), dynamo=True, opset_version=OPSET, dynamic_shapes=shapes,
                input_names=["embeds", *names],
                output_names=["hidden", "logits", *[n.replace("past", "present") for n in names]],
                external_data=True)
            program.save(str(talker_path), external_data=True)
        if "predictor" in parts:
            program = torch.onnx.export(
                p_mod, (torch.zeros(1, 1, h), torch.zeros(1, 1, h)), dynamo=True, opset_version=OPSET,
                input_names=["talker_hidden", "first_embed"], output_names=["codes"], external_data=True)
            program.save(str(predictor_path), external_data=True)
    return talker_path, predictor_path


def quantize_onnx(src: Path, dst: Path, how: str) -> Path:
    """Write ``src`` with its weight MatMuls quantized: ``int8`` (quantize_dynamic, per-channel
    int8 weights) or ``nbits4`` / ``nbits8`` (MatMulNBits, block 32, accuracy_level 4)."""
    import onnx

    if dst.exists():
        return dst
    if how == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"], use_external_data_format=True)
    else:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        model = onnx.load(str(src))
        q = MatMulNBitsQuantizer(model, bits=int(how[-1]), block_size=32, is_symmetric=True, accuracy_level=4)
        q.process()
        onnx.save_model(q.model.model, str(dst), save_as_external_data=True, location=dst.name + ".data")
    return dst


class OrtGeneration:
    """Greedy frames on ONNX Runtime: the talker step and the predictor loop, two sessions.

    Args:
        talker_path, predictor_path: the exported (possibly quantized) models.
        threads: intra-op threads of each session's own pool (inter-op 1); None: the
            process's global pool, which ``set_global_thread_pool_sizes`` must have made.
    """

    def __init__(self, talker_path: Path, predictor_path: Path, threads: int | None = None) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads is None:
            # the process's global pool (``set_global_thread_pool_sizes``), shared by both
            # sessions: two pools, each spinning after its run, would take the cores from
            # the other session's run
            opts.use_per_session_threads = False
        else:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        self.talker = ort.InferenceSession(str(talker_path), opts, providers=["CPUExecutionProvider"])
        self.predictor = ort.InferenceSession(str(predictor_path), opts, providers=["CPUExecutionProvider"])
        self.past_names = [i.name for i in self.talker.get_inputs()[1:]]
        self.present_names = [o.name for o in self.talker.get_outputs()[2:]]
        shape = self.talker.get_inputs()[1].shape
        self.kv_shape = (1, int(shape[1]), 0, int(shape[3]))

    def _talker_step(self, embeds: np.ndarray, past: list[Any]) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """One talker call; the presents stay ORT values (no copy) for the next call."""
        binding = self.talker.io_binding()
        binding.bind_cpu_input("embeds", np.ascontiguousarray(embeds, dtype=np.float32))
        for name, value in zip(self.past_names, past):
            binding.bind_ortvalue_input(name, value)
        for name in ["hidden", "logits", *self.present_names]:
            binding.bind_output(name, "cpu")
        self.talker.run_with_iobinding(binding)
        outs = binding.get_outputs()
        return outs[0].numpy(), outs[1].numpy(), outs[2:]

    def run(self, tables: _Tables, inputs: dict[str, Any], frames: int) -> dict[str, Any]:
        """Prefill ``inputs``, then ``frames`` greedy frames; times of frames 1.. (ms)."""
        import onnxruntime as ort

        empty = ort.OrtValue.ortvalue_from_numpy(np.zeros(self.kv_shape, dtype=np.float32))
        hidden, logits, past = self._talker_step(inputs["inputs_embeds"].float().numpy(),
                                                 [empty] * len(self.past_names))

        def step(embeds: np.ndarray | None) -> tuple[Any, Any]:
            nonlocal hidden, logits, past
            if embeds is not None:
                hidden, logits, past = self._talker_step(embeds, past)
            return hidden, logits

        def predict(hidden: Any, first_embed: np.ndarray) -> np.ndarray:
            return self.predictor.run(None, {"talker_hidden": hidden, "first_embed": first_embed})[0]

        return _greedy_frames(tables, _texts(inputs, frames), frames, step, predict)


# --- the worker and the driver ----------------------------------------------------------


def _median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    per_run = [statistics.median(r[key]) for r in runs if r.get(key)]
    return round(statistics.median(per_run), 2) if per_run else None


def _summary(runs: list[dict[str, Any]], reference_codes: np.ndarray) -> dict[str, Any]:
    codes = runs[-1]["codes"]
    n = min(len(codes), len(reference_codes))
    equal = codes[:n] == reference_codes[:n]
    first_diff = int(np.argmin(equal.all(1))) if not equal.all() else None
    return {
        "ms_per_frame": _median_of(runs, "frame_ms"),
        "talker_ms": _median_of(runs, "talker_ms"),
        "predictor_ms": _median_of(runs, "predictor_ms"),
        "runs_ms_per_frame": [round(statistics.median(r["frame_ms"]), 2) for r in runs],
        "codes_equal_reference": round(float(equal.mean()), 4),
        "first_frame_differing": first_diff,
        "frames_compared": n,
    }


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Every candidate at ``args.threads`` threads in this process; returns the results.

    All candidates are loaded first and warmed up (2 frames); then each repeat runs every
    candidate once, in turn, so that a slow spell of the shared machine hits them alike."""
    import copy

    import torch

    torch.set_num_threads(args.threads)
    only = set(args.only.split(",")) if args.only else None

    def wanted(name: str) -> bool:
        return only is None or name in only

    qwen = load(args.checkpoint)
    talker = qwen.model.talker
    results: dict[str, Any] = {"threads": args.threads, "torch_threads": torch.get_num_threads(),
                               "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"), "candidates": {}}
    first = reference_run(qwen, 2)
    inputs = first["inputs"]
    results["prompt_positions"] = int(inputs["inputs_embeds"].shape[1])
    tables = _Tables(talker)
    LeanTalker, LeanPredictor = _lean_classes()
    t_mod, p_mod = LeanTalker(talker).eval(), LeanPredictor(talker).eval()
    runners: dict[str, Any] = {"reference": lambda frames: reference_run(qwen, frames)}

    def lean(tm: Any, pm: Any, dtype: Any) -> Any:
        return lambda frames: lean_torch_run(tm, pm, tables, inputs, frames, dtype)

    if wanted("lean-fp32"):
        runners["lean-fp32"] = lean(t_mod, p_mod, torch.float32)
    if wanted("lean-int8dyn"):
        q = torch.ao.quantization.quantize_dynamic
        runners["lean-int8dyn"] = lean(q(copy.deepcopy(t_mod), {torch.nn.Linear}, dtype=torch.qint8),
                                       q(copy.deepcopy(p_mod), {torch.nn.Linear}, dtype=torch.qint8), torch.float32)
    if wanted("lean-bf16"):
        runners["lean-bf16"] = lean(copy.deepcopy(t_mod).to(torch.bfloat16), copy.deepcopy(p_mod).to(torch.bfloat16),
                                    torch.bfloat16)
    if args.onnx_dir is not None:
        from onnxruntime.capi import _pybind_state

        _pybind_state.set_global_thread_pool_sizes(args.threads, 1)
        for how in ("fp32", "int8", "nbits4", "nbits8"):
            name = f"ort-{how}"
            if not wanted(name):
                continue
            suffix = "" if how == "fp32" else f"-{how}"
            gen = OrtGeneration(args.onnx_dir / f"talker{suffix}.onnx", args.onnx_dir / f"predictor{suffix}.onnx")
            runners[name] = lambda frames, gen=gen: gen.run(tables, inputs, frames)
    for run in runners.values():
        run(2)  # warm-up
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    for repeat in range(args.repeats):
        for name, run in runners.items():
            runs[name].append(run(args.frames))
            print(f"repeat {repeat} {name}: {statistics.median(runs[name][-1]['frame_ms']):.1f} ms/frame", flush=True)
    ref_codes = runs["reference"][0]["codes"]
    results["reference_codes"] = ref_codes.tolist()
    for name, r in runs.items():
        results["candidates"][name] = _summary(r, ref_codes)
        print(json.dumps({name: results["candidates"][name]}), flush=True)
    if args.profile:
        results["candidates"]["reference"]["profile"] = _split_profile(runners["reference"], args.frames)
        if "lean-fp32" in runners:
            results["candidates"]["lean-fp32"]["profile"] = _split_profile(runners["lean-fp32"], args.frames)
    return results


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a 0.6B CustomVoice checkpoint folder")
    parser.add_argument("--frames", type=int, default=20, help="frames generated a run")
    parser.add_argument("--repeats", type=int, default=3, help="runs a candidate (the median is reported)")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="thread counts (driver)")
    parser.add_argument("--onnx-dir", type=Path, default=None,
                        help="folder for the exported/quantized ONNX models (made if missing); none: no ORT")
    parser.add_argument("--only", default="", help="comma-separated candidates besides the reference")
    parser.add_argument("--profile", action="store_true", help="profile the reference once (worker)")
    parser.add_argument("--out", type=Path, default=None, help="JSON to write (driver)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        args.threads = args.threads[0]  # type: ignore[assignment]
        result = worker(args)
        assert args.worker_out is not None
        args.worker_out.write_text(json.dumps(result))
        return

    if args.onnx_dir is not None and not (args.onnx_dir / "predictor.onnx").exists():
        print("exporting ...", flush=True)
        qwen = load(args.checkpoint)
        export_onnx(qwen.model.talker, args.onnx_dir)
        del qwen
    if args.onnx_dir is not None:
        for how in ("int8", "nbits4", "nbits8"):
            for part in ("talker", "predictor"):
                if not args.only or f"ort-{how}" in args.only.split(","):
                    print(f"quantizing {part} {how} ...", flush=True)
                    quantize_onnx(args.onnx_dir / f"{part}.onnx", args.onnx_dir / f"{part}-{how}.onnx", how)

    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=os.environ.get("ONEDNN_MAX_CPU_ISA", "AVX2"))
    report: dict[str, Any] = {"frames": args.frames, "repeats": args.repeats, "text": TEXT, "speaker": SPEAKER,
                              "runs": []}
    for threads in args.threads:
        cores = "0" if threads == 1 else f"0-{threads - 1}"
        part_json = Path(f"/tmp/cpu_generation_probe-{threads}.json")
        cmd = ["taskset", "-c", cores, sys.executable, "-m", "benchmarks.cpu_generation_probe", "--worker",
               "--checkpoint", str(args.checkpoint), "--frames", str(args.frames), "--repeats", str(args.repeats),
               "--threads", str(threads), "--worker-out", str(part_json), "--only", args.only]
        if args.onnx_dir is not None:
            cmd += ["--onnx-dir", str(args.onnx_dir)]
        if args.profile:
            cmd.append("--profile")
        before, start = _uptime(), time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        subprocess.run(cmd, env=env, check=True)
        result = json.loads(part_json.read_text())
        result.update(started=start, uptime_before=before, uptime_after=_uptime(), cores=cores)
        report["runs"].append(result)
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
