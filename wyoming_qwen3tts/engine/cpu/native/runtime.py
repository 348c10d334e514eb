"""ggml's CPU backend as the graphs use it: one backend with a persistent thread pool, graphs
built in a metadata-only context and placed by a graph allocator, and key/value caches.

This is how qwentts.cpp runs the same kernels (``ggml_backend_cpu_init``, weights in backend
buffers, one graph a step): a ``Backend`` owns the thread pool (its threads park between
graphs, so a frame's 16 graphs start no threads), a ``Graph`` is one step's computation.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from .api import (
    ABORT_CALLBACK,
    DEV_GET_EXTRA_BUFTS,
    F32,
    REPACK_BUFFER_TYPE,
    STATUS_ABORTED,
    STATUS_SUCCESS,
    Ggml,
    InitParams,
    ThreadpoolParams,
)

#: Nodes a graph may hold: the talker's 28 layers take about 30 each.
GRAPH_NODES = 4096


class GraphError(RuntimeError):
    """ggml could not allocate or compute a graph."""


class Backend:
    """The ggml CPU backend and its thread pool.

    Args:
        ggml: the loaded API.
        threads: threads each graph runs on (>= 1); ``set_threads`` changes it.
    """

    def __init__(self, ggml: Ggml, threads: int) -> None:
        self.ggml = ggml
        self.handle = ggml.ggml_backend_cpu_init()
        if not self.handle:
            raise GraphError("ggml_backend_cpu_init failed")
        self.buffer_type = ggml.ggml_backend_cpu_buffer_type()
        self.repack_type = self._repack_buffer_type()
        self._pool = 0
        self.threads = 0
        self.set_threads(threads)

    def _repack_buffer_type(self) -> int | None:
        """The CPU backend's ``CPU_REPACK`` buffer type (weights placed there are repacked
        for its tiled matrix kernels), found among its device's extra buffer types, as
        qwentts.cpp places its weights; None where the backend has none."""
        ggml = self.ggml
        reg = ggml.ggml_backend_cpu_reg()
        address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
        if not address:
            return None
        types = DEV_GET_EXTRA_BUFTS(address)(ggml.ggml_backend_reg_dev_get(reg, 0))
        i = 0
        while types and types[i]:
            if ggml.ggml_backend_buft_name(types[i]) == REPACK_BUFFER_TYPE.encode():
                return int(types[i])
            i += 1
        return None

    def set_threads(self, threads: int) -> None:
        """Run graphs on ``threads`` threads (a new pool of that size replaces the old one).

        Raises:
            ValueError: fewer than 1.
        """
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        if threads == self.threads:
            return
        params = ThreadpoolParams()
        self.ggml.ggml_threadpool_params_init(ctypes.byref(params), threads)
        pool = self.ggml.ggml_threadpool_new(ctypes.byref(params))
        if not pool:
            raise GraphError(f"ggml_threadpool_new({threads}) failed")
        self.ggml.ggml_backend_cpu_set_n_threads(self.handle, threads)
        self.ggml.ggml_backend_cpu_set_threadpool(self.handle, pool)
        if self._pool:
            self.ggml.ggml_threadpool_free(self._pool)
        self._pool, self.threads = pool, threads

    def compute(self, graph: int, stop: Callable[[], bool] | None = None) -> bool:
        """Run an allocated graph. With ``stop``, ggml asks it between the graph's nodes (on
        the calling thread) and ends the graph early once it is true (for a long prefill).

        Returns:
            False if ``stop`` ended it (its outputs are then undefined), else True.

        Raises:
            GraphError: ggml reported a failure.
        """
        callback = None
        if stop is not None:
            callback = ABORT_CALLBACK(lambda _data: bool(stop()))
            self.ggml.ggml_backend_cpu_set_abort_callback(self.handle, callback, None)
        try:
            status = self.ggml.ggml_backend_graph_compute(self.handle, graph)
        finally:
            if callback is not None:
                self.ggml.ggml_backend_cpu_set_abort_callback(self.handle, ABORT_CALLBACK(), None)
        if status == STATUS_ABORTED and stop is not None:
            return False
        if status != STATUS_SUCCESS:
            raise GraphError(f"ggml_backend_graph_compute returned status {status}")
        return True

    def close(self) -> None:
        if self.handle:
            self.ggml.ggml_backend_free(self.handle)
            self.handle = 0
        if self._pool:
            self.ggml.ggml_threadpool_free(self._pool)
            self._pool = 0


class Allocator:
    """A graph allocator (``ggml_gallocr``): places a graph's intermediate tensors in one
    backend buffer that it keeps and grows, so graphs of the same shape reuse it."""

    def __init__(self, backend: Backend) -> None:
        self.ggml = backend.ggml
        self.handle = self.ggml.ggml_gallocr_new(backend.buffer_type)

    def close(self) -> None:
        if self.handle:
            self.ggml.ggml_gallocr_free(self.handle)
            self.handle = 0


class Graph:
    """One computation: tensors and ops in a metadata-only context, then allocated and run.

    Build with the ops of ``ggml`` on ``ctx`` (``ggml.ggml_add(g.ctx, a, b)``), mark inputs
    with ``input`` and results with ``output``, then ``allocate``, ``set`` the inputs,
    ``backend.compute(g.graph)`` and ``get`` the outputs. A graph may be computed again with
    new inputs as long as its allocator places no other graph in between.
    """

    def __init__(self, ggml: Ggml, nodes: int = GRAPH_NODES) -> None:
        self.ggml = ggml
        size = ggml.ggml_tensor_overhead() * nodes * 2 + ggml.ggml_graph_overhead_custom(nodes, False)
        self.ctx = ggml.ggml_init(InitParams(size, None, True))
        if not self.ctx:
            raise GraphError("ggml_init failed")
        self.graph = ggml.ggml_new_graph_custom(self.ctx, nodes, False)

    def input(self, type_: int, *ne: int) -> int:
        """A new input tensor of ``type_`` and ggml shape ``ne`` (innermost first)."""
        new = (self.ggml.ggml_new_tensor_1d, self.ggml.ggml_new_tensor_2d, self.ggml.ggml_new_tensor_3d)[len(ne) - 1]
        tensor = new(self.ctx, type_, *ne)
        self.ggml.ggml_set_input(tensor)
        return int(tensor)

    def expand(self, tensor: int) -> None:
        """Add ``tensor`` and what it depends on to the graph, in order (a cache write added
        before the attention that reads the cache runs before it)."""
        self.ggml.ggml_build_forward_expand(self.graph, tensor)

    def output(self, tensor: int) -> int:
        self.ggml.ggml_set_output(tensor)
        self.expand(tensor)
        return tensor

    def allocate(self, allocator: Allocator) -> None:
        if not self.ggml.ggml_gallocr_alloc_graph(allocator.handle, self.graph):
            raise GraphError("ggml_gallocr_alloc_graph failed")

    def set(self, tensor: int, values: np.ndarray) -> None:
        """Copy ``values`` (of the tensor's dtype and size) into an allocated input."""
        data = np.ascontiguousarray(values)
        self.ggml.ggml_backend_tensor_set(tensor, data.ctypes.data, 0, data.nbytes)

    def get(self, tensor: int, shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
        """An allocated output's values as a new array of ``shape`` (numpy order: outermost first)."""
        out: np.ndarray = np.empty(shape, dtype=dtype)
        self.ggml.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, out.nbytes)
        return out

    def close(self) -> None:
        if self.ctx:
            self.ggml.ggml_free(self.ctx)
            self.ctx = 0


class KvCache:
    """Keys and values of one transformer stack, float32, for ``capacity`` positions.

    Per layer, keys are ggml [kv_heads * head_dim, capacity] (a position's heads together)
    and values are stored transposed, [capacity, kv_heads * head_dim], so that attention
    multiplies by them without a copy.
    """

    def __init__(self, backend: Backend, layers: int, width: int, capacity: int) -> None:
        ggml = backend.ggml
        self.ggml, self.width, self.capacity = ggml, width, capacity
        self._ctx = ggml.ggml_init(InitParams(ggml.ggml_tensor_overhead() * (2 * layers + 2), None, True))
        self.keys = [int(ggml.ggml_new_tensor_2d(self._ctx, F32, width, capacity)) for _ in range(layers)]
        self.values = [int(ggml.ggml_new_tensor_2d(self._ctx, F32, capacity, width)) for _ in range(layers)]
        self.buffer = ggml.ggml_backend_alloc_ctx_tensors(self._ctx, backend.handle)
        if not self.buffer:
            ggml.ggml_free(self._ctx)
            raise MemoryError(f"no memory for a key/value cache of {capacity} positions")
        ggml.ggml_backend_buffer_clear(self.buffer, 0)
        self.nbytes = int(ggml.ggml_backend_buffer_get_size(self.buffer))

    def close(self) -> None:
        if self.buffer:
            self.ggml.ggml_backend_buffer_free(self.buffer)
            self.ggml.ggml_free(self._ctx)
            self.buffer = 0
