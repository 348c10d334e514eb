"""RMSNorm with the residual add folded in: ``h = x + branch; y = rms_norm(h) * w``.

A pre-norm layer adds each branch's output to the residual stream and normalises the sum
for the next branch: two kernels in eager PyTorch, one here. ``h`` is rounded to the model
dtype before it is normalised, as the eager form does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def add_rms_norm_eager(
    hidden: torch.Tensor, branch: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager form of ``add_rms_norm``."""
    if branch is not None:
        hidden = hidden + branch
    return hidden, F.rms_norm(hidden, (hidden.shape[-1],), weight, eps)


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, b_ptr, w_ptr, h_ptr, y_ptr, n_cols, eps,
    HAS_BRANCH: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    gate(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_BRANCH:
        x = x + tl.load(b_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        x_round = x.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * n_cols + cols, x_round, mask=m)
        x = x_round.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (x * r * w).to(y_ptr.dtype.element_ty), mask=m)


def add_rms_norm(
    hidden: torch.Tensor, branch: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden + branch, RMSNorm of it) in one kernel; ``branch`` None: norm only.

    Args:
        hidden, branch: [..., D] in the model dtype (made contiguous if they are not).
        weight: [D]; eps: the norm's epsilon (its config's ``rms_norm_eps``).

    Returns:
        (the new residual stream [..., D] (``hidden`` itself when ``branch`` is None),
        the normalised [..., D]), both in ``hidden``'s dtype.
    """
    d = hidden.shape[-1]
    x = hidden.contiguous()
    y = torch.empty_like(x)
    if branch is None:
        h, b = x, x
    else:
        b = branch.contiguous()
        h = torch.empty_like(x)
    rows = x.numel() // d
    launcher(_add_rms_norm_kernel, x)[(rows,)](
        x, b, weight, h, y, d, eps, HAS_BRANCH=branch is not None, BLOCK=next_pow2(d)
    )
    return h, y
