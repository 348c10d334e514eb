"""The rotary tables of the codec transformer's new positions, in one kernel.

The codec decoder's transformer rotates by absolute positions that grow with the stream (a
frame each; no bound to precompute a table for), so its tables are made at every step. The
library's rotary embedding takes about ten kernels for it (a product of the inverse
frequencies and the positions, a concatenation, a cosine, a sine, the scaling, two casts),
and ``layers.rope_tables`` two more (the negated half of the sine). Here one kernel writes
``layers.rope_tables``' (cos, signed sin) from the positions: the same float32 product of
each position and inverse frequency, the same cosine and sine (``tl.cos`` / ``tl.sin``
compile to CUDA's precise ``cosf`` / ``sinf``, which ``torch.cos`` / ``torch.sin`` run),
scaled, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def rope_cos_sin_eager(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager form of ``rope_cos_sin``: the library's rotary embedding (default type), then
    ``layers.rope_tables``."""
    freqs = positions.float()[..., None] * inv_freq.float()  # [B, n, head_dim / 2]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos = (emb.cos() * scaling).to(dtype)
    sin = (emb.sin() * scaling).to(dtype)
    half = freqs.shape[-1]
    return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


@triton.jit
def _rope_cos_sin_kernel(
    pos_ptr, freq_ptr, cos_ptr, sin_ptr, scaling, s_pb, n,
    HALF: tl.constexpr, PDL: tl.constexpr,
):
    gate(PDL)
    bt = tl.program_id(0)  # a (row, new position) pair
    b = bt // n
    t = bt - b * n
    j = tl.arange(0, 2 * HALF)
    pos = tl.load(pos_ptr + b * s_pb + t).to(tl.float32)
    f = pos * tl.load(freq_ptr + j % HALF)
    c = tl.cos(f) * scaling
    s = tl.sin(f) * scaling
    dtype = cos_ptr.dtype.element_ty
    s = tl.where(j < HALF, -(s.to(dtype)), s.to(dtype))
    tl.store(cos_ptr + bt * 2 * HALF + j, c.to(dtype))
    tl.store(sin_ptr + bt * 2 * HALF + j, s)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``layers.rope_tables`` of the library's rotary embedding at ``positions``, in one kernel.

    Args:
        positions: int64 [B, n], each row's new positions; the last dimension contiguous.
        inv_freq: float32 [head_dim / 2] (the rotary module's ``inv_freq``; default rope type:
            no position-dependent scaling), a power of two long, contiguous.
        scaling: the module's ``attention_scaling`` (1.0 for the default type).
        dtype: the model's dtype.

    Returns:
        (cos, signed sin), each [B, n, head_dim] in ``dtype``, contiguous: ``cos`` and
        ``sin`` of ``positions * inv_freq`` (repeated over both halves) times ``scaling``,
        the first half of the sine negated.
    """
    b, n = positions.shape
    half = inv_freq.shape[0]
    assert half == next_pow2(half) and inv_freq.dtype == torch.float32 and inv_freq.is_contiguous()
    assert positions.stride(1) == 1 or n == 1
    cos = torch.empty((b, n, 2 * half), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    launcher(_rope_cos_sin_kernel, inv_freq)[(b * n,)](
        positions, inv_freq, cos, sin, float(scaling), positions.stride(0), n, HALF=half,
    )
    return cos, sin
