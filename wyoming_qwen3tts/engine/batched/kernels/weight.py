"""A projection's stored weight as the fused matrix kernels read it (no triton import, so
the layers can hold one on any machine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


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
