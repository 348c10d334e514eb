"""A CUDA out-of-memory while serving: how it is recognised, and what the client is told.

Shared by the loader (retries with fewer streams), the on-demand models (reload with the
streams the memory then holds) and the batched engine (a request that ran out fails with
the cause named): another process, an LLM say, may take GPU memory while this server runs.
"""

from __future__ import annotations

from ...common.vocabulary import ModelKind


#: What a CUDA library says when the driver has no memory left for it: cuBLAS's
#: ``cublasCreate`` in a thread's first matrix product (on the H200 with 4 GB free, every
#: request of the Base model failed with it once 13 clone clips were prepared), cuDNN likewise.
_LIBRARY_OUT_OF_MEMORY = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def is_out_of_memory(err: BaseException) -> bool:
    """A CUDA out-of-memory (``torch.OutOfMemoryError``, also when wrapped by a library, and a
    CUDA library's allocation failure, ``_LIBRARY_OUT_OF_MEMORY``)."""
    text = str(err)
    return (
        type(err).__name__ == "OutOfMemoryError"
        or "CUDA out of memory" in text
        or any(status in text for status in _LIBRARY_OUT_OF_MEMORY)
    )


class GpuMemoryError(RuntimeError):
    """CUDA ran out of memory while serving; the message names the cause (what the card has
    free and what other processes hold) and what the server does about it."""


def gpu_memory_note() -> str:
    """"X GB free on the card, Y GB held by other processes and the CUDA contexts, Z GB by
    this server" (empty without CUDA): what an out-of-memory message names as its cause."""
    try:
        import torch

        if not torch.cuda.is_available():
            return ""
        free, total = torch.cuda.mem_get_info()
        ours = torch.cuda.memory_reserved()
    except Exception:  # noqa: BLE001 - a note only
        return ""
    others = max(0, total - free - ours)
    return (
        f"{free / 2**30:.1f} GB free on the card, {others / 2**30:.1f} GB held by other processes "
        f"and the CUDA contexts, {ours / 2**30:.1f} GB by this server"
    )


def serving_error(err: BaseException, kind: ModelKind) -> BaseException:
    """``err`` itself, or for a CUDA out-of-memory while serving a ``GpuMemoryError`` that
    says so, with the card's figures (another process, e.g. an LLM, took memory meanwhile)."""
    if not is_out_of_memory(err) or isinstance(err, GpuMemoryError):
        return err
    note = gpu_memory_note()
    return GpuMemoryError(
        f"The GPU ran out of memory for this request ({note or 'CUDA out of memory'}): another program "
        f"probably took GPU memory while this server ran. The {kind.value} model serves on; if it loads on "
        "demand or takes turns, it comes back with the streams the free memory holds. Retry, or free GPU memory"
    )
