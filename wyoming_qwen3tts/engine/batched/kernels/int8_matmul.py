"""Weight-only int8 matrix product: ``y = x @ (q * scale[:, None]).T + bias``.

The int8 weights of ``quant.Int8Linear`` (one scale per output channel) are read as they
are stored and widened to the activations' dtype inside the kernel, one tile at a time, so no
dequantized copy of a weight ever exists in memory: the product reads half the bytes of a
bfloat16 one, and the frame step is the same number of kernels. The accumulation is float32,
the scale and bias are applied to it, and the result is rounded once.

Why not a library kernel (torch 2.11): ``torch._weight_int8pack_mm``'s CUDA kernel takes
float32 activations (it converts bfloat16 ones in two extra kernels) and gives each thread
one output, reading a weight row per thread (uncoalesced); ``torch._int_mm`` multiplies int8
by int8 (activations would be quantized too, and it needs more than 16 rows);
``torch._scaled_mm`` (FP8) needs FP8 activations as well, i.e. a quantizing kernel before
every product of a step that is bound by its kernel count.

The eager form is ``quant.dequant_linear`` (no triton import, for the CPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launcher
from .pdl_gate import gate


@triton.jit
def _int8_linear_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    gate(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        k_ok = ks < K
        x = tl.load(x_ptr + rm[:, None] * K + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        # The weight tile [BLOCK_K, BLOCK_N], read along K (each row's bytes are contiguous).
        w = tl.load(w_ptr + rn[None, :] * K + ks[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0)
        if IEEE:
            acc = tl.dot(x, w.to(x.dtype), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w.to(x.dtype), acc)
    acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def blocks(m: int, n: int, element: int) -> tuple[int, int, int]:
    """Tile sizes (BLOCK_M, BLOCK_N, BLOCK_K) for ``m`` rows of ``n`` outputs.

    A frame step has 1-64 rows (the talker's batch, twice that in the predictor's first
    step): one row tile, narrow column tiles so that even a 1,024-output product spreads over
    64+ programs, long K tiles. A prefill has up to ``MAX_JOIN`` x 512 rows: square-ish tiles.
    float32 (``element`` 4) halves K so that the pipelined tiles stay in shared memory.
    """
    if m <= 16:
        tiles = (16, 16 if n < 4096 else 32, 256)
    elif m <= 64:
        tiles = (32 if m <= 32 else 64, 32, 128)
    else:
        tiles = (64, 64, 64)
    return tiles[0], tiles[1], tiles[2] // (2 if element >= 4 else 1)


def int8_linear(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T + bias`` in one kernel.

    Args:
        x: activations [..., K] (float32, bfloat16 or float16).
        qweight: int8 [N, K], contiguous (``quant.quantize_rows``).
        scale: float32 [N], each output channel's scale.
        bias: [N] or None.

    Returns:
        [..., N] in ``x``'s dtype (accumulated in float32, rounded once). float32 ``x`` is
        multiplied in exact float32 (no TF32).
    """
    k = x.shape[-1]
    n = qweight.shape[0]
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm, bn, bk = blocks(m, n, x.element_size())
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm))
    launcher(_int8_linear_kernel, x2)[grid](
        x2, qweight, scale, bias if bias is not None else scale, y, m, n,
        K=k, HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
    )
    return y.view(*x.shape[:-1], n)
