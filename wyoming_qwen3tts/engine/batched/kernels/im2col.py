"""A causal convolution's im2col columns, read from the stream's past and the new input where
they lie, in one kernel.

``conv_products.ConvProduct`` runs a causal convolution (kernel ``k``, dilation ``d``) as one
matrix product over columns ``[B, C * k, T]``: column row ``c * k + j`` holds tap ``j`` of
channel ``c``, sample ``t`` of it the input at ``t + j * d - context`` (``context = (k - 1) *
d``; negative positions are the past's last samples). Stop 39 built them with PyTorch: the
past and the input concatenated (``CatArrayBatchedCopy``), then a strided view of that copied
by the generic strided-copy kernel (``elementwise_kernel``, 1.06 ms of the batch-32 decode's
3.6 on the H200: its 4-D index arithmetic runs far below the memory's bandwidth). Here each
program takes a tile of (batch, channel) rows by samples and writes every tap's column rows
of it, contiguous along the samples, loading each element from the past or the input
directly: one launch, no concatenation. A copy, so the columns are exactly PyTorch's
(``im2col_eager``).

With ``advance`` the same kernel also moves the past on: the programs of the first tile of
samples, the only ones that read the past, write each of their rows' new past once their
reads are done. That replaces the strided copy (``advance_eager``) that ran after each
convolution (15 a frame, among the decode's 67 generic strided-copy kernels at batch 32 on
the H200, stop 41).

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


def advance_eager(past: torch.Tensor, x: torch.Tensor) -> None:
    """Set ``past`` [B, C, context] to the last ``context`` samples of ``past`` followed by
    ``x`` [B, C, T] (after the convolution that read both): ``im2col(..., advance=True)``'s
    update of the past, with PyTorch (a strided copy; a concatenation first if T < context)."""
    context, length = past.shape[-1], x.shape[-1]
    if length >= context:
        past.copy_(x[..., length - context :])
    else:
        past.copy_(torch.cat([past[..., length:], x], dim=-1))


@triton.jit
def _im2col_kernel(
    past_ptr, x_ptr, out_ptr,
    rows, channels, batch, context, length, dilation,
    s_pb, s_pc, s_xb, s_xc,
    TAPS: tl.constexpr, ROWS: tl.constexpr, BLOCK_T: tl.constexpr, FOLDED: tl.constexpr,
    ADVANCE: tl.constexpr, CONTEXT: tl.constexpr, PDL: tl.constexpr,
):
    gate(PDL)
    # A tile of ROWS (batch, channel) rows (b * C + c) by BLOCK_T samples, every tap of each.
    bc = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
    b = bc // channels
    c = bc - b * channels
    ok = (bc < rows) & (t < length)
    x_row = x_ptr + b * s_xb + c * s_xc
    past_row = past_ptr + b * s_pb + c * s_pc
    for tap in tl.static_range(TAPS):
        src = t + tap * dilation - context  # the input's sample; negative: the past's
        from_x = src >= 0
        xv = tl.load(x_row + src, mask=ok & from_x, other=0.0)
        pv = tl.load(past_row + src + context, mask=ok & (src < 0), other=0.0)
        if FOLDED:  # [C * TAPS, B, T]: column row c * TAPS + tap, then the batch row
            dst = ((c * TAPS + tap) * batch + b) * length + t
        else:  # [B, C * TAPS, T]
            dst = (bc * TAPS + tap) * length + t
        tl.store(out_ptr + dst, tl.where(from_x, xv, pv), mask=ok)
    if ADVANCE:
        # Only the first tile of samples reads the past (BLOCK_T >= context, or one tile), so
        # its programs own their rows' pasts: read the new past, wait for every read of the
        # old one in this program, then write it.
        if tl.program_id(1) == 0:
            i = tl.arange(0, CONTEXT)[None, :]
            keep = (bc < rows) & (i < context)
            # New names: Triton refuses a name redefined with another shape inside a runtime if.
            at = length + i - context  # (past ++ x)[length + i], as an index into x
            new_x = tl.load(x_row + at, mask=keep & (at >= 0), other=0.0)
            new_past = tl.load(past_row + length + i, mask=keep & (at < 0), other=0.0)
            tl.debug_barrier()
            tl.store(past_row + i, tl.where(at >= 0, new_x, new_past), mask=keep)


#: Elements per program and tap (a tile of ``TILE // BLOCK_T`` rows, each with all its taps).
TILE = 1024
#: Most samples per tile row: 128 divides the decoder's longer lengths at a frame (640, 1920
#: samples); 160 leaves a tile of 32 lanes idle in 256. Also the longest context the past can
#: be advanced for in the kernel (``advance``): the decoder's longest is 54 (7 taps, dilation 9).
MAX_BLOCK_T = 128


def im2col(
    past: torch.Tensor, x: torch.Tensor, taps: int, dilation: int, folded: bool = False, advance: bool = False,
) -> torch.Tensor:
    """``im2col_eager`` in one kernel (CUDA, or Triton's interpreter on the CPU).

    Args:
        past: [B, C, (taps - 1) * dilation], last dimension contiguous (e.g. the first B rows
            of a state buffer).
        x: [B, C, T], last dimension contiguous (copied otherwise).
        taps: the convolution's kernel size (> 1).
        dilation: samples between taps.
        folded: write [C * taps, B, T] instead (see the module docstring).
        advance: also set ``past``, in place, to the last ``(taps - 1) * dilation`` samples of
            ``past ++ x`` (the stream's past for the next call), as ``advance_eager`` does
            after the columns: in the same kernel, no strided copy. Needs a context of at most
            ``MAX_BLOCK_T`` samples.

    Returns:
        [B, C * taps, T] (``folded``: [C * taps, B, T]), contiguous, in ``x``'s dtype: row
        ``c * taps + j`` is ``(past ++ x)[:, c, j * dilation : j * dilation + T]``.

    Raises:
        ValueError: the past's shape does not fit ``x``, ``taps`` and ``dilation``, or
            ``advance`` with a context past ``MAX_BLOCK_T``.
    """
    b, channels, length = x.shape
    context = (taps - 1) * dilation
    if past.shape != (b, channels, context) or past.dtype != x.dtype:
        raise ValueError(f"past {tuple(past.shape)} {past.dtype}, input {tuple(x.shape)} {x.dtype}, "
                         f"{taps} taps, dilation {dilation}")
    if advance and context > MAX_BLOCK_T:
        raise ValueError(f"a past of {context} samples is advanced by copy, not in the kernel")
    if x.stride(2) != 1 and length > 1:
        x = x.contiguous()
    if past.stride(2) != 1:
        if advance:
            raise ValueError("the past to advance must have its last dimension contiguous")
        past = past.contiguous()
    shape = (channels * taps, b, length) if folded else (b, channels * taps, length)
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    rows = b * channels
    block_t = min(MAX_BLOCK_T, next_pow2(length))  # >= context when there are several tiles
    tile_rows = max(1, TILE // block_t)
    grid = (triton.cdiv(rows, tile_rows), triton.cdiv(length, block_t))
    launcher(_im2col_kernel, x)[grid](
        past, x, out, rows, channels, b, context, length, dilation,
        past.stride(0), past.stride(1), x.stride(0), x.stride(1),
        TAPS=taps, ROWS=tile_rows, BLOCK_T=block_t, FOLDED=folded,
        ADVANCE=advance, CONTEXT=next_pow2(max(context, 1)),
    )
    return out
