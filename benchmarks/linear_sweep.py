"""The frame step's matrix products, cuBLAS against ``kernels.linear.fused_linear`` tiles.

``python -m benchmarks.linear_sweep`` on an NVIDIA GPU. For each product of the 1.7B talker
and code predictor (their shapes, with the neighbours the step folds in: RMSNorm before,
SiLU-multiply or residual add after) and each row count of ``--rows``, it times on the GPU:

* ``cublas``: the step's previous layout, the cuBLAS product plus its separate neighbour
  kernels (``add_rms_norm`` before a normed product, ``silu_mul`` after gate/up, the residual
  add after a residual product);
* ``fused``: ``fused_linear`` with the default ``tiles_for`` choice, and every tile of the
  sweep (``--tiles``).

Timing is GPU time: each variant is captured as a CUDA graph of ``REPS`` launches cycling
through weight copies that together exceed the L2 cache (as in the step, where a pass reads
its 5 layers' 155 MB before it reuses a weight), replayed, and timed with CUDA events; the
median replay over launches. Writes ``linear_sweep.json`` and prints a table to ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

#: Launches per captured graph.
REPS = 24
#: Bytes of weight copies cycled through (the H200's L2 is 50 MB).
COPY_BYTES = 256 << 20

#: (name, N outputs, K inputs, prologue/epilogue): the 1.7B model's step products.
SHAPES = [
    ("predictor qkv", 4096, 1024, "norm"),
    ("predictor o_proj", 1024, 2048, "residual"),
    ("predictor gate_up", 6144, 1024, "silu"),
    ("predictor down", 1024, 3072, "residual"),
    ("predictor lm_head", 2048, 1024, "norm"),
    ("projection", 1024, 2048, "bias"),
    ("talker qkv", 4096, 2048, "norm"),
    ("talker o_proj", 2048, 2048, "residual"),
    ("talker gate_up", 12288, 2048, "silu"),
    ("talker down", 2048, 6144, "residual"),
]


def graph_ms(fns: list[Callable[[], Any]]) -> float:
    """Median GPU ms per call of ``fns`` (captured once as a graph, in order)."""
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
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times)) / len(fns)


def sweep_tiles(m: int, element: int) -> list[Any]:
    """The tiles tried for ``m`` rows: broadcast tiles up to 4 rows, ``tl.dot`` tiles."""
    from wyoming_qwen3tts.engine.batched.kernels.linear import Tiles

    shrink = 2 if element >= 4 else 1
    out = []
    if m <= 4:
        bm = max(1, 1 << (m - 1).bit_length())
        for bn, bk, warps in [(4, 256, 4), (4, 512, 4), (8, 256, 4), (8, 512, 4), (16, 256, 4),
                              (16, 512, 4), (8, 512, 2), (8, 512, 8), (16, 512, 8)]:
            if bm * bn * bk // shrink <= 16384:
                out.append(Tiles(bm, bn, bk // shrink, warps=warps))
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    # The first sweep tried up to 256 inputs a step and 4 warps; at 32 rows the widest K won every
    # product but gate/up (``results/linear``), so wider K, more warps and wider outputs too.
    for bn, bk, warps in [(16, 64, 4), (16, 128, 4), (16, 256, 4), (32, 64, 4), (32, 128, 4), (32, 256, 4),
                          (16, 512, 4), (32, 512, 4), (16, 256, 8), (32, 256, 8), (64, 128, 4), (64, 256, 8)]:
        out.append(Tiles(bm, bn, bk // shrink, warps=warps, dot=True))
    return out


def main(argv: list[str] | None = None) -> None:
    from wyoming_qwen3tts.engine.batched.kernels.linear import Weight, fused_linear, tiles_for
    from wyoming_qwen3tts.engine.batched.kernels.rmsnorm import add_rms_norm
    from wyoming_qwen3tts.engine.batched.kernels.silu_mul import silu_mul

    parser = argparse.ArgumentParser(prog="python -m benchmarks.linear_sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/linear")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--tiles", action="store_true", help="also sweep tiles (compiles many kernels)")
    parser.add_argument("--tile-rows", default="1,32", help="row counts whose tiles are swept")
    parser.add_argument("--shapes", default="", help="comma-separated substrings of the shape names to keep")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16
    torch.manual_seed(0)
    keep = [s for s in args.shapes.split(",") if s]
    rows_list = [int(r) for r in args.rows.split(",")]
    results: list[dict[str, Any]] = []
    print(f"{'product':20} {'rows':>4} {'cublas+':>8} {'fused':>8} {'best tile':>8}  tile", flush=True)
    for name, n, k, kind in SHAPES:
        if keep and not any(s in name for s in keep):
            continue
        copies = max(2, COPY_BYTES // (n * k * 2))
        weights = [torch.randn(n, k, dtype=dtype, device="cuda") / k**0.5 for _ in range(copies)]
        bias = torch.randn(n, dtype=dtype, device="cuda") if kind == "bias" else None
        norm_w = torch.ones(k, dtype=dtype, device="cuda")
        for m in rows_list:
            x = torch.randn(m, k, dtype=dtype, device="cuda")
            half = n // 2
            res = torch.randn(m, n, dtype=dtype, device="cuda")
            picks = [weights[i % copies] for i in range(REPS)]

            def cublas(w: torch.Tensor) -> Callable[[], Any]:
                def run() -> Any:
                    h = add_rms_norm(x, None, norm_w, 1e-6)[1] if kind in ("norm", "silu") else x
                    y = F.linear(h, w, bias)
                    if kind == "silu":
                        return silu_mul(y)
                    return res + y if kind == "residual" else y
                return run

            def fused(w: torch.Tensor, tiles: Any = None) -> Callable[[], Any]:
                weight = Weight(w, None, bias)
                norm = (norm_w, 1e-6) if kind in ("norm", "silu") else None
                return lambda: fused_linear(x, weight, norm=norm, silu=kind == "silu",
                                            residual=res if kind == "residual" else None, tiles=tiles)

            base = graph_ms([cublas(w) for w in picks])
            ours = graph_ms([fused(w) for w in picks])
            default = tiles_for(m, half if kind == "silu" else n, k, 2)
            row: dict[str, Any] = {"product": name, "rows": m, "n": n, "k": k, "kind": kind,
                                   "cublas_ms": base, "fused_ms": ours, "default_tiles": vars(default)}
            best = (ours, default)
            if args.tiles and m in {int(r) for r in args.tile_rows.split(",")}:
                tried = []
                for tiles in sweep_tiles(m, 2):
                    try:
                        ms = graph_ms([fused(w, tiles) for w in picks])
                    except Exception as error:  # a tile that does not compile or fit
                        tried.append({"tiles": vars(tiles), "error": str(error)[:120]})
                        continue
                    tried.append({"tiles": vars(tiles), "ms": ms})
                    if ms < best[0]:
                        best = (ms, tiles)
                row["tried"] = tried
            row["best_ms"], row["best_tiles"] = best[0], vars(best[1])
            results.append(row)
            t = best[1]
            print(f"{name:20} {m:4d} {base * 1000:7.1f}u {ours * 1000:7.1f}u {best[0] * 1000:7.1f}u  "
                  f"{t.block_m}x{t.block_n}x{t.block_k} w{t.warps}{' dot' if t.dot else ''}", flush=True)
        del weights
        torch.cuda.empty_cache()
        info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": REPS, "results": results}
        (out / "linear_sweep.json").write_text(json.dumps(info, indent=1))  # after each product: a cut run keeps it


if __name__ == "__main__":
    main()
