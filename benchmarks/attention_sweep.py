"""The frame step's one-token attention (``kernels.rope_attention``) in each loop form.

``python -m benchmarks.attention_sweep`` on an NVIDIA GPU. For the 1.7B model's three caches
(the talker's 256-position bucket, the code predictor's 17 positions, the codec
transformer's ring of 72) at batch 1, 8 and 32, it times on the GPU each form of the kernel:
the loop requesting each block's keys and values together (``prefetch=False``) or before the
previous block's arithmetic (``prefetch=True``), under Triton's default pipelining and with
``num_stages`` 1 and 2; and, with ``--old MODULE``, a previous version of the kernel (a module
with the same ``rope_attention`` function) beside them.

Timing is GPU time: 28 launches (one a layer, each on its own cache) captured as one CUDA
graph, replayed, timed with CUDA events; the median replay over launches, in microseconds.
Prints a table and writes ``attention_sweep.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: (name, query heads, key/value heads, head_dim, cache positions, ring window, q/k norm,
#: each row's position): the 1.7B model's attention shapes in a frame step.
SHAPES = [
    ("talker pos 120", 16, 8, 128, 256, 0, True, 120),
    ("talker pos 250", 16, 8, 128, 256, 0, True, 250),
    ("predictor pos 9", 16, 8, 128, 17, 0, True, 9),
    ("codec ring", 16, 16, 64, 72, 72, False, 300),
]
#: Launches per captured graph (the talker's 28 layers).
LAYERS = 28
#: (label, prefetch, num_stages: 3 is Triton's default on NVIDIA GPUs).
FORMS = [("together", False, 3), ("together s1", False, 1), ("prefetch", True, 3),
         ("prefetch s1", True, 1), ("prefetch s2", True, 2)]


def graph_us(fns: list[Callable[[], Any]]) -> float:
    """Median GPU microseconds per call of ``fns`` (captured once as a graph, in order)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns[:2]:
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times)) * 1000 / len(fns)


def main(argv: list[str] | None = None) -> None:
    from wyoming_qwen3tts.engine.batched.kernels.rope_attention import rope_attention

    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention_sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/attention")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--old", default="", help="module of a previous rope_attention to time beside")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    old = importlib.import_module(args.old).rope_attention if args.old else None
    dtype, device = torch.bfloat16, "cuda"
    torch.manual_seed(0)
    forms: list[tuple[str, Callable[..., Any], dict[str, Any]]] = []
    if old is not None:
        forms.append(("old", old, {}))
    forms += [(label, rope_attention, {"prefetch": p, "stages": s}) for label, p, s in FORMS]
    results: list[dict[str, Any]] = []
    print(f"{'shape':18} {'rows':>4} " + " ".join(f"{label:>12}" for label, *_ in forms), flush=True)
    for name, heads, kv, hd, length, window, has_norm, position in SHAPES:
        for b in [int(x) for x in args.batches.split(",")]:
            qkv = torch.randn(b, 1, heads + 2 * kv, hd, dtype=dtype, device=device)
            norm = (torch.ones(heads + kv, hd, dtype=dtype, device=device), 1e-6) if has_norm else None
            angle = torch.rand(b, 1, hd, device=device) * 6.28
            cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
            pos = torch.full((b, 1), position, dtype=torch.int64, device=device)
            caches = [(torch.randn(b, kv, length, hd, dtype=dtype, device=device),
                       torch.randn(b, kv, length, hd, dtype=dtype, device=device)) for _ in range(LAYERS)]
            row: dict[str, Any] = {"shape": name, "rows": b, "us": {}}
            for label, fn, extra in forms:
                def launch(keys: torch.Tensor, values: torch.Tensor, fn: Any = fn, extra: Any = extra) -> Callable[[], Any]:
                    return lambda: fn(qkv, norm, cos, sin, pos, keys, values, heads, 0.1, window, **extra)
                try:
                    row["us"][label] = graph_us([launch(k, v) for k, v in caches])
                except Exception as error:  # a form that does not compile or fit
                    row["us"][label] = None
                    row.setdefault("errors", {})[label] = str(error)[:200]
            results.append(row)
            cells = " ".join(f"{row['us'][label]:12.2f}" if row["us"][label] is not None else f"{'error':>12}"
                             for label, *_ in forms)
            print(f"{name:18} {b:4d} {cells}", flush=True)
            del caches
            info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": LAYERS,
                    "results": results}
            (out / "attention_sweep.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
