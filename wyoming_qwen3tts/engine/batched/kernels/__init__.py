"""Triton kernels of the frame step, each beside its eager PyTorch form.

Every module here holds one fused operation: the eager form (what runs on the CPU, and what
the parity tests compare against) and the Triton form. ``enabled(t)`` says whether the
Triton form serves a tensor: CUDA tensors of float32/bfloat16/float16, unless
``QWEN3TTS_KERNELS=eager`` is set. On CPU tensors a Triton form runs in Triton's interpreter
(for tests on small shapes; slow): that needs ``TRITON_INTERPRET=1`` set before the kernel
modules are first imported, which is why the engine imports them only when it uses them
(this package's ``__init__`` does not import triton). Kernels compile on first use, which the engine's graph
capture does at start (warm-up pass), and Triton caches them on disk (``~/.triton/cache``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

#: Whether triton is installed (torch's CUDA wheels ship it; CPU-only wheels do not).
HAVE_TRITON = importlib.util.find_spec("triton") is not None

#: Model dtypes the kernels are written for.
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


#: Oldest compute capability the kernels serve (Ampere: bfloat16 throughout); checked by
#: compiling every kernel for sm_80, 86, 89 and 90 (the H200 runs them).
MIN_CAPABILITY = (8, 0)


def enabled(t: torch.Tensor) -> bool:
    """Whether the Triton kernels serve tensors like ``t``: CUDA on a GPU of compute
    capability ``MIN_CAPABILITY`` or newer, a dtype of ``DTYPES``, triton installed, and not
    switched off with ``QWEN3TTS_KERNELS=eager``."""
    return (
        HAVE_TRITON
        and t.is_cuda
        and t.dtype in DTYPES
        and os.environ.get("QWEN3TTS_KERNELS", "triton").lower() != "eager"
        and torch.cuda.get_device_capability(t.device) >= MIN_CAPABILITY
    )


def fused_matmul(t: torch.Tensor) -> bool:
    """Whether the frame step's matrix products run as ``linear.fused_linear`` (with the norms,
    SiLU-multiply and residual adds around them folded in) for activations like ``t``:
    ``enabled(t)``, unless ``QWEN3TTS_MATMUL=cublas`` keeps them cuBLAS products with the
    neighbouring kernels separate (the layout of stop 35, for comparison)."""
    return enabled(t) and os.environ.get("QWEN3TTS_MATMUL", "fused").lower() != "cublas"


#: Compute capability from which kernels are launched with programmatic dependent launch
#: (PDL, Hopper's ``griddepcontrol``): a kernel's blocks are scheduled while the kernel before
#: it in the stream is still running, and wait (``pdl_gate.gate``) only for its results.
PDL_CAPABILITY = (9, 0)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


_SCOPE = threading.local()


@contextlib.contextmanager
def pdl_scope(on: bool) -> Iterator[None]:
    """Within: this thread's kernel launches use programmatic dependent launch if ``on`` and
    ``QWEN3TTS_PDL`` is ``auto`` (the default; see ``pdl``). ``StepGraphs`` opens it around
    the capture of the frame step's and the codec decode's batch-1 graphs."""
    before = getattr(_SCOPE, "on", False)
    _SCOPE.on = on
    try:
        yield
    finally:
        _SCOPE.on = before


def pdl_wanted() -> bool:
    """``QWEN3TTS_PDL``: ``auto`` (default) within an open ``pdl_scope(True)`` only; ``1``
    (``on``, ``true``) for every launch; ``0`` (``off``, ``false``) never."""
    mode = os.environ.get("QWEN3TTS_PDL", "auto").lower()
    if mode in ("0", "off", "false"):
        return False
    return mode in ("1", "on", "true") or bool(getattr(_SCOPE, "on", False))


def pdl(t: torch.Tensor) -> bool:
    """Whether kernels on ``t``'s device are launched with programmatic dependent launch:
    ``pdl_wanted()``, on a CUDA device of compute capability ``PDL_CAPABILITY`` or newer.

    Each such kernel waits for the kernel before it (``griddepcontrol.wait``) before it reads
    or writes anything, then lets the next one be scheduled (``launch_dependents``): the
    ramp-up of each of the frame's ~1,100 small kernels overlaps the tail of the one before.
    Captured into the CUDA graphs as programmatic edges. On the H200 it cut a lone stream's
    frame from 5.21 to 4.84 ms (4.87 in stop 38's run). With it on every graph the loop at
    batch 32 hung (stop 37); the cause turned out to be graphs sharing cuBLAS's workspace
    (``graphs.StepGraphs``' ``capture_role``), which PDL's overlap made worse. PDL at every
    batch size has not been measured since that fix, so by default only the batch-1 graphs
    use it (``benchmarks/results/profile/README.md``, "Stop 37" and "Stop 38")."""
    if not t.is_cuda or not pdl_wanted():
        return False
    return _capability(t.device.index if t.device.index is not None else torch.cuda.current_device()) >= PDL_CAPABILITY


class _Launch:
    """``kernel[grid]`` with the ``PDL`` constexpr (and, when on, the PDL launch attribute)."""

    def __init__(self, kernel: Any, use_pdl: bool) -> None:
        self.kernel, self.use_pdl = kernel, use_pdl

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]
        extra: dict[str, Any] = {"PDL": self.use_pdl}
        if self.use_pdl:
            extra["launch_pdl"] = True
        return lambda *args, **kwargs: launch(*args, **kwargs, **extra)


def launcher(kernel: Any, t: torch.Tensor) -> Any:
    """``kernel``, checked to be runnable on ``t``'s device, to be launched as
    ``launcher(kernel, t)[grid](args...)``. Every kernel launched so takes a ``PDL``
    constexpr and starts with ``pdl_gate.gate(PDL)`` (see ``pdl``).

    Raises:
        RuntimeError: ``t`` is on the CPU but the kernels were not imported under
            ``TRITON_INTERPRET=1``.
    """
    if not t.is_cuda and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError("Triton kernels run on CPU tensors only under TRITON_INTERPRET=1 (set before import)")
    return _Launch(kernel, pdl(t))


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (Triton block sizes)."""
    return 1 << max(0, (int(n) - 1).bit_length())
