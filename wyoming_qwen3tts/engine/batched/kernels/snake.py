"""The codec decoder's SnakeBeta activation, with a residual unit's output add folded in:
``h = x + (branch + bias); y = h + inv_beta * sin(h * alpha) ** 2`` per channel.

The library's ``SnakeBeta`` computes ``x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha)) ** 2``
in about seven elementwise kernels, taking both exponentials again at every call. Here the
per-channel factors are taken once (``snake_factors``, float32) and the activation is one
kernel, computed in float32 and rounded once.

In the decoder a residual unit's output ``x + conv2(...)`` always goes next into a SnakeBeta
(the next unit's first activation, the next block's, or the last one before the output
convolution). So the unit's 1x1 convolution is left unadded (its matrix product, and the
bias apart) and this kernel adds it: ``h``, the residual stream, rounded to the model dtype
before the activation as the eager add does, and ``y = snake(h)``, in one pass over the
tensors instead of three.

``tl.sin`` of float32 compiles to CUDA's precise ``sinf`` (``__nv_sinf``, no ``sin.approx``
in its PTX; compiled for sm_80, 86, 89 and 90), the function ``torch.sin`` runs on CUDA.
Each program takes a tile of (batch, channel) rows by up to 64 samples, so the channel is
worked out once per row, not per element.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def snake_factors(module: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``SnakeBeta`` module's per-channel factors, taken once.

    Args:
        module: the library's ``SnakeBeta`` (parameters ``alpha``, ``beta``: [C], log scale).

    Returns:
        (``exp(alpha)``, ``1 / (exp(beta) + 1e-9)``), float32 [C] each, on the module's device.
    """
    alpha = module.alpha.detach().float()
    beta = module.beta.detach().float()
    return torch.exp(alpha), 1.0 / (torch.exp(beta) + module.no_div_by_zero)


def snake_eager(
    x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor,
    branch: torch.Tensor | None = None, bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager form of ``snake`` (float32 arithmetic, rounded once, as the kernel)."""
    if branch is not None or bias is not None:
        add = branch.float() if branch is not None else torch.zeros((), device=x.device)
        if bias is not None:
            add = add + bias.float()[:, None]
        x = (x.float() + add).to(x.dtype)
    h = x.float()
    y = h + inv_beta[:, None] * torch.sin(h * alpha[:, None]) ** 2
    return x, y.to(x.dtype)


@triton.jit
def _snake_kernel(
    x_ptr, r_ptr, bias_ptr, alpha_ptr, inv_beta_ptr, h_ptr, y_ptr,
    rows, channels, length, x_batch_stride, x_channel_stride,
    HAS_BRANCH: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
):
    gate(PDL)
    # A tile of ROWS (batch, channel) rows by BLOCK_T samples: the channel is worked out per
    # row, not per element.
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # b * C + c
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
    b = row // channels
    c = row - b * channels
    row_ok = row < rows
    m = row_ok & (t < length)
    offs = row * length + t
    x = tl.load(x_ptr + b * x_batch_stride + c * x_channel_stride + t, mask=m, other=0.0).to(tl.float32)
    if HAS_BRANCH or HAS_BIAS:
        r = tl.zeros([ROWS, BLOCK_T], dtype=tl.float32)
        if HAS_BRANCH:
            r += tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            r += tl.load(bias_ptr + c, mask=row_ok, other=0.0).to(tl.float32)
        h = (x + r).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + offs, h, mask=m)
        x = h.to(tl.float32)
    a = tl.load(alpha_ptr + c, mask=row_ok, other=0.0)
    ib = tl.load(inv_beta_ptr + c, mask=row_ok, other=0.0)
    s = tl.sin(x * a)
    tl.store(y_ptr + offs, (x + ib * s * s).to(y_ptr.dtype.element_ty), mask=m)


#: Elements per program (a tile of ``TILE // BLOCK_T`` rows).
TILE = 1024
#: Most samples per tile row: 64 divides the decoder's lengths at a frame (32, 160, 640,
#: 1920 samples), so few lanes idle.
MAX_BLOCK_T = 64


def snake(
    x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor,
    branch: torch.Tensor | None = None, bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``h = x + branch + bias``, SnakeBeta of ``h``) in one kernel; ``branch`` and ``bias``
    None: the activation only (``h`` is ``x`` itself).

    Args:
        x: [B, C, T] in the model dtype; read in place if its last dimension is contiguous
            (e.g. a trimmed transposed convolution's output, a slice along T), else copied.
        alpha, inv_beta: ``snake_factors``, float32 [C].
        branch: [B, C, T] (contiguous) to add to ``x`` first, or None.
        bias: [C] added with ``branch`` (a 1x1 convolution's bias), or to ``x`` alone when
            ``branch`` is None (the bias of a convolution run as a matrix product), or None.

    Returns:
        (the residual stream ``h`` [B, C, T], contiguous when ``branch`` or ``bias`` is given,
        the activation ``y`` [B, C, T], contiguous), both in ``x``'s dtype; computed in
        float32, ``h`` rounded before the activation.
    """
    b, channels, length = x.shape
    if x.stride(2) != 1 and length > 1:
        x = x.contiguous()
    y = torch.empty((b, channels, length), dtype=x.dtype, device=x.device)
    h = x if branch is None and bias is None else torch.empty_like(y)
    r = y if branch is None else branch.contiguous()
    rows = b * channels
    block_t = min(MAX_BLOCK_T, next_pow2(length))
    tile_rows = TILE // block_t
    grid = (triton.cdiv(rows, tile_rows), triton.cdiv(length, block_t))
    launcher(_snake_kernel, y)[grid](
        x, r, bias if bias is not None else alpha, alpha, inv_beta, h, y,
        rows, channels, length, x.stride(0), x.stride(1),
        HAS_BRANCH=branch is not None, HAS_BIAS=bias is not None, ROWS=tile_rows, BLOCK_T=block_t,
    )
    return h, y
