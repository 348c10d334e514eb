"""A projection's stored weight as the fused matrix kernels read it, and which products they
serve (no triton import, so the layers can hold one on any machine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


#: Inputs up to which a one-row product runs as ``linear.fused_linear``: the talker's
#: 6,144 -> 2,048 ``down`` took 15.5 us there against 13.5 for cuBLAS and its residual add
#: (``benchmarks/results/linear``, H200); every narrower one-row product was faster fused.
FUSED_MAX_K = 4096


def use_fused(m: int, k: int) -> bool:
    """Whether a product of ``m`` rows and ``k`` inputs runs as ``linear.fused_linear``: one
    row only (a lone stream's step). With more rows cuBLAS and separate neighbour kernels
    were faster at every measured shape (2-64 rows, ``benchmarks/results/linear``)."""
    return m == 1 and k <= FUSED_MAX_K


@dataclass(frozen=True)
class Weight:
    """A projection's stored weight, as ``fused_linear`` reads it.

    Attributes:
        weight: [N, K], contiguous: the model dtype, or int8 with ``scale``.
        scale: float32 [N], each output channel's scale (int8 weights only), else None.
        bias: [N] in the model dtype, or None.
    """

    weight: torch.Tensor
    scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        """N."""
        return int(self.weight.shape[0])

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as [N, K] in ``dtype`` (int8 dequantized; for the eager form)."""
        if self.scale is None:
            return self.weight.to(dtype)
        return (self.weight.float() * self.scale[:, None]).to(dtype)

    @classmethod
    def of(cls, module: Any) -> Weight | None:
        """The weight of an ``nn.Linear`` or ``quant.Int8Linear``; None for anything else
        (e.g. an ``nn.Identity`` projection)."""
        from ..quant import Int8Linear

        if isinstance(module, Int8Linear):
            return cls(module.qweight, module.scale, module.bias)
        if isinstance(module, nn.Linear):
            return cls(module.weight.data, None, module.bias.data if module.bias is not None else None)
        return None
