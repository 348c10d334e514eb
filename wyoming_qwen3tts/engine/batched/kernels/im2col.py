"""A causal convolution's im2col columns, read from the stream's past and the new input where
they lie, in one kernel.

``conv_products.ConvProduct`` runs a causal convolution (kernel ``k``, dilation ``d``) as one
matrix product over columns ``[B, C * k, T]``: column row ``c * k + j`` holds tap ``j`` of
channel ``c``, sample ``t`` of it the input at ``t + j * d - context`` (``context = (k - 1) *
d``; negative positions are the past's last samples). Stop 39 built them with PyTorch: the
past and the input concatenated (``CatArrayBatchedCopy``), then a strided view of that copied
by the generic strided-copy kernel (``elementwise_kernel``, 1.06 ms of the batch-32 decode's
3.6 on the H200: its 4-D index arithmetic runs far below the memory's bandwidth). Here each
program writes a tile of column rows by samples, contiguous along the samples, loading each
element from the past or the input directly: one launch, no concatenation. A copy, so the
columns are exactly PyTorch's (``im2col_eager``).

``folded`` writes the same columns as ``[C * k, B, T]``: the batch joins the samples, so the
product is one ``[out, C * k] @ [C * k, B * T]`` instead of a batched product with the weight
broadcast over the batch (which cuBLAS ran as an sm80 cutlass kernel, 0.68 ms for the last
block's three convolutions at batch 32 on the H200, stop 41).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def im2col_eager(past: torch.Tensor, x: torch.Tensor, taps: int, dilation: int, folded: bool = False) -> torch.Tensor:
    """The columns with PyTorch (stop 39's form): [B, C * taps, T], contiguous; ``folded``:
    [C * taps, B, T], contiguous.

    Args:
        past: [B, C, (taps - 1) * dilation], the stream's last input samples.
        x: [B, C, T], the new input.
        taps: the convolution's kernel size.
        dilation: samples between taps.
        folded: the batch inside the rows (see the module docstring).
    """
    full = torch.cat([past, x], dim=-1)
    b, channels, length = full.shape
    t = length - (taps - 1) * dilation
    s0, s1, s2 = full.stride()
    columns = full.as_strided((b, channels, taps, t), (s0, s1, dilation * s2, s2), full.storage_offset())
    columns = columns.reshape(b, channels * taps, t)
    return columns.transpose(0, 1).contiguous() if folded else columns


@triton.jit
def _im2col_kernel(
    past_ptr, x_ptr, out_ptr,
    rows, channels, batch, context, length, dilation,
    s_pb, s_pc, s_xb, s_xc,
    TAPS: tl.constexpr, ROWS: tl.constexpr, BLOCK_T: tl.constexpr, FOLDED: tl.constexpr, PDL: tl.constexpr,
):
    gate(PDL)
    # A tile of ROWS column rows ((b * C + c) * TAPS + tap) by BLOCK_T samples.
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
    tap = row % TAPS
    bc = row // TAPS
    b = bc // channels
    c = bc - b * channels
    ok = (row < rows) & (t < length)
    src = t + tap * dilation - context  # the input's sample; negative: the past's
    from_x = src >= 0
    xv = tl.load(x_ptr + b * s_xb + c * s_xc + src, mask=ok & from_x, other=0.0)
    pv = tl.load(past_ptr + b * s_pb + c * s_pc + src + context, mask=ok & (src < 0), other=0.0)
    if FOLDED:  # [C * TAPS, B, T]: column row c * TAPS + tap, then the batch row
        dst = ((c * TAPS + tap) * batch + b) * length + t
    else:  # [B, C * TAPS, T]
        dst = row * length + t
    tl.store(out_ptr + dst, tl.where(from_x, xv, pv), mask=ok)


#: Elements per program (a tile of ``TILE // BLOCK_T`` column rows).
TILE = 2048
#: Most samples per tile row: 128 divides the decoder's longer lengths at a frame (640, 1920
#: samples); 160 leaves a tile of 32 lanes idle in 256.
MAX_BLOCK_T = 128


def im2col(past: torch.Tensor, x: torch.Tensor, taps: int, dilation: int, folded: bool = False) -> torch.Tensor:
    """``im2col_eager`` in one kernel (CUDA, or Triton's interpreter on the CPU).

    Args:
        past: [B, C, (taps - 1) * dilation], last dimension contiguous (e.g. the first B rows
            of a state buffer).
        x: [B, C, T], last dimension contiguous (copied otherwise).
        taps: the convolution's kernel size (> 1).
        dilation: samples between taps.
        folded: write [C * taps, B, T] instead (see the module docstring).

    Returns:
        [B, C * taps, T] (``folded``: [C * taps, B, T]), contiguous, in ``x``'s dtype: row
        ``c * taps + j`` is ``(past ++ x)[:, c, j * dilation : j * dilation + T]``.

    Raises:
        ValueError: the past's shape does not fit ``x``, ``taps`` and ``dilation``.
    """
    b, channels, length = x.shape
    context = (taps - 1) * dilation
    if past.shape != (b, channels, context) or past.dtype != x.dtype:
        raise ValueError(f"past {tuple(past.shape)} {past.dtype}, input {tuple(x.shape)} {x.dtype}, "
                         f"{taps} taps, dilation {dilation}")
    if x.stride(2) != 1:
        x = x.contiguous()
    if past.stride(2) != 1:
        past = past.contiguous()
    shape = (channels * taps, b, length) if folded else (b, channels * taps, length)
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    rows = b * channels * taps
    block_t = min(MAX_BLOCK_T, next_pow2(length))
    tile_rows = TILE // block_t
    grid = (triton.cdiv(rows, tile_rows), triton.cdiv(length, block_t))
    launcher(_im2col_kernel, x)[grid](
        past, x, out, rows, channels, b, context, length, dilation,
        past.stride(0), past.stride(1), x.stride(0), x.stride(1),
        TAPS=taps, ROWS=tile_rows, BLOCK_T=block_t, FOLDED=folded,
    )
    return out
