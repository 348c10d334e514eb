"""One CUDA graph per (batch, length) bucket of the frame step, sharing one memory pool; and
the process's CUDA streams, one per role."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from . import kernels

_STREAMS: dict[tuple[str, str], torch.cuda.Stream] = {}
_STREAMS_LOCK = threading.Lock()
#: One capture at a time on the capture stream (models load one after another anyway).
_CAPTURE_LOCK = threading.Lock()


def role_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """The process's CUDA stream for ``role`` on ``device`` (e.g. "base-decode"), made once.

    A model loaded again (taking turns on the GPU) gets the same streams as before. cuBLAS
    keeps a workspace per (handle, stream), 32 MiB each on Hopper, that ``empty_cache`` never
    frees: new streams at every load left about 130 MB behind per swap on the H200.
    """
    key = (str(device), role)
    with _STREAMS_LOCK:
        stream = _STREAMS.get(key)
        if stream is None:
            stream = _STREAMS[key] = torch.cuda.Stream(device)
        return stream


def buckets(limit: int, sizes: tuple[int, ...]) -> list[int]:
    """The sizes up to ``limit``, always ending with ``limit`` itself (sorted, distinct)."""
    return sorted({s for s in sizes if s < limit} | {limit})


class StepGraphs:
    """The step ``body(b, length)`` for every bucket: captured on CUDA, eager elsewhere.

    A step for ``n`` active rows runs the smallest batch bucket ``b >= n`` (rows past ``n``
    are padding whose results are ignored) and the smallest length bucket that holds every
    row's next position, so short streams do not attend over the whole cache.

    Args:
        body: the step, ``body(b, length)``, reading and writing static buffers only.
        state: every buffer the body mutates (saved and restored around capture, which
            runs the body for real).
        batch_sizes, lengths: the buckets (see ``buckets``).
        lone_pdl: capture the batch-1 graphs with programmatic dependent launch
            (``kernels.pdl_scope``; the frame step and the codec decode of a lone stream).
        capture_role: the ``role_stream`` the graphs are captured on. Graphs that may replay
            at the same time as each other must be captured on different streams: PyTorch
            gives cuBLAS one workspace per (handle, stream), and a captured product keeps the
            capture stream's workspace address. Two graphs captured on one stream and replayed
            concurrently (the step and the overlapped decode) share it while both run split-K
            products: on the H200 the loop crawled (15 s a step) and every request timed out
            from 20 req/s (stops 37-38; pytorch#193402 reports the same sharing). Each role's
            stream is made once, so a model loaded again adds no workspace.
    """

    def __init__(
        self,
        body: Callable[[int, int], None],
        state: Callable[[], list[torch.Tensor]],
        batch_sizes: list[int],
        lengths: list[int],
        lone_pdl: bool = False,
        capture_role: str = "capture",
    ) -> None:
        self._body = body
        self.lone_pdl = lone_pdl
        self.capture_role = capture_role
        self._state = state
        self.batch_sizes = batch_sizes
        self.lengths = lengths
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def bucket(self, rows: int, need: int) -> tuple[int, int]:
        """(batch, length) for ``rows`` active rows that need ``need`` positions.

        Raises:
            StopIteration: more rows than the largest batch bucket.
        """
        b = next(x for x in self.batch_sizes if x >= rows)
        return b, next((x for x in self.lengths if x >= need), self.lengths[-1])

    def run(self, b: int, length: int) -> None:
        """Launch one step (a graph replay where captured; else the body, eagerly)."""
        graph = self._graphs.get((b, length))
        if graph is not None:
            graph.replay()
        else:
            self._body(b, length)

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every bucket (CUDA only); returns the seconds it took."""
        t0 = time.monotonic()
        self._graphs.clear()
        saved = [t.clone() for t in self._state()]
        stream = role_stream(torch.device("cuda", torch.cuda.current_device()), self.capture_role)
        stream.wait_stream(torch.cuda.current_stream())
        pool = None
        with _CAPTURE_LOCK, torch.cuda.stream(stream):
            for b in self.batch_sizes:
                for length in self.lengths:
                    with kernels.pdl_scope(self.lone_pdl and b == 1):
                        self._body(b, length)  # warm-up outside the graph (lazy inits, autotuning)
                        graph = torch.cuda.CUDAGraph()
                        # thread_local: another model's engine thread (or the prompt worker) keeps
                        # launching work while a model loaded on demand captures its graphs; in the
                        # default "global" mode CUDA would refuse their calls mid-capture.
                        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                            self._body(b, length)
                    pool = graph.pool()
                    self._graphs[(b, length)] = graph
        torch.cuda.current_stream().wait_stream(stream)
        for tensor, value in zip(self._state(), saved, strict=True):
            tensor.copy_(value)
        torch.cuda.synchronize()
        return time.monotonic() - t0

    def clear(self) -> None:
        """Drop every captured graph (their memory pool goes back to the allocator)."""
        self._graphs.clear()

    def __len__(self) -> int:
        return len(self._graphs)
