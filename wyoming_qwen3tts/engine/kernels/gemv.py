"""Matrix products of a few rows (``x @ W.T + b`` with 1..64 rows of x), for the frame step.

A frame step multiplies one token per row by each weight matrix: the product is bound by
reading the weights, not by arithmetic. For some of these shapes cuBLAS picks a tile of 64
outputs and launches 16 blocks for a 1,024-output product, which reads its 4 MB at a tenth
of the card's bandwidth (the H200 profile, ``benchmarks/results/profile``). This kernel
gives each program ``BLOCK_N`` outputs (8 for one row, so a 1,024-output product is 128
programs), and uses the tensor cores (``tl.dot``) from two rows up.

``linear`` chooses per shape, once, by timing both on the device the first time a shape is
seen outside graph capture (the engine's warm-up pass before it captures): the kernel where it
is at least ``FASTER`` times quicker than ``F.linear``, cuBLAS elsewhere. ``CHOICES`` records
the timings (``benchmarks/profile_step`` reports them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import enabled, launcher, next_pow2

#: The kernel must beat cuBLAS by this factor to be chosen (keeps the choice stable).
FASTER = 1.15
#: (rows, out, in, dtype, bias) -> (kernel ms, cuBLAS ms, kernel chosen).
CHOICES: dict[tuple[int, int, int, str, bool], tuple[float, float, bool]] = {}


def linear_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Eager form of ``gemv``."""
    return F.linear(x, weight, bias)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M,
    N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, IEEE: tl.constexpr,
):
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    n_ok = rn < N
    if BM == 1:
        acc = tl.zeros([BN], tl.float32)
        for k0 in range(0, K, BK):
            k_ok = (k0 + rk) < K
            x = tl.load(x_ptr + k0 + rk, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rn[:, None] * K + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + rn, acc.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        m_ok = rm < M
        acc2 = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            k_ok = (k0 + rk) < K
            x = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + rn[:, None] * K + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if IEEE:
                acc2 += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc2 += tl.dot(x, tl.trans(w))
        if HAS_BIAS:
            acc2 += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = y_ptr + rm[:, None] * N + rn[None, :]
        tl.store(out, acc2.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in the kernel.

    Args:
        x: [..., K] (made contiguous), few rows (the kernel is written for up to 64).
        weight: [N, K], contiguous; bias: [N] or None. Same dtype as ``x``.

    Returns:
        [..., N] in ``x``'s dtype (float32 accumulation, rounded once).
    """
    n, k = weight.shape
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 1:
        bm, bn, bk = 1, 8, min(512, next_pow2(k))
    else:
        bm, bn, bk = min(64, max(16, next_pow2(m))), 16, max(16, min(128, next_pow2(k)))
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm))
    launcher(_gemv_kernel, x2)[grid](
        x2, weight, bias if bias is not None else weight, y, m, N=n, K=k, HAS_BIAS=bias is not None,
        BM=bm, BN=bn, BK=bk, IEEE=x.dtype == torch.float32,
    )
    return y.view(*x.shape[:-1], n)


def _time(fn: object, reps: int = 20) -> float:
    """Median ms of ``fn()`` on the current CUDA stream."""
    times = []
    for _ in range(reps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()  # type: ignore[operator]
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times[3:])[reps // 2]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` by the kernel or by cuBLAS, whichever this shape was timed faster with.

    The first call for a shape must run outside CUDA graph capture (it times both); during
    capture an unseen shape takes cuBLAS. On the CPU, or over 64 rows, always ``F.linear``.
    """
    m = x.numel() // x.shape[-1]
    if not enabled(x) or m > 64 or not weight.is_contiguous():
        return F.linear(x, weight, bias)
    key = (m, weight.shape[0], weight.shape[1], str(x.dtype), bias is not None)
    choice = CHOICES.get(key)
    if choice is None:
        if torch.cuda.is_current_stream_capturing():
            return F.linear(x, weight, bias)
        ours = _time(lambda: gemv(x, weight, bias))
        theirs = _time(lambda: F.linear(x, weight, bias))
        choice = CHOICES[key] = (ours, theirs, ours * FASTER < theirs)
    return gemv(x, weight, bias) if choice[2] else F.linear(x, weight, bias)
