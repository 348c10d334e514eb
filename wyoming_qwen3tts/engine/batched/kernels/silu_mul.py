"""The gated MLP's activation: ``silu(gate) * up`` from the fused gate/up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def silu_mul_eager(gate_up: torch.Tensor) -> torch.Tensor:
    """Eager form of ``silu_mul``."""
    half = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :half]) * gate_up[..., half:]


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    gate(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < n
    g = tl.load(x_ptr + row * 2 * n + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * n + n + cols, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + row * n + cols, y.to(y_ptr.dtype.element_ty), mask=m)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in one kernel.

    Args:
        gate_up: [..., 2 * I], gate then up (``FusedLayer``'s fused projection), contiguous.

    Returns:
        [..., I] in the same dtype (computed in float32, rounded once).
    """
    n = gate_up.shape[-1] // 2
    x = gate_up.contiguous()
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    rows = x.numel() // (2 * n)
    block = min(1024, next_pow2(n))
    launcher(_silu_mul_kernel, x)[(rows, triton.cdiv(n, block))](x, y, n, BLOCK=block)
    return y
