"""The codec decoder's first stage, its quantizer's decode, as one table lookup and sum.

The library's ``SplitResidualVectorQuantizer.decode`` turns a frame's 16 codes into the
decoder's input in about 66 kernels a call: for each of the 16 codebooks it divides the
embedding sums by their usage again (a clamp and a division), gathers, and adds the
(transposed, so not vectorised) result to the running sum; then one 1x1 convolution for the
first codebook's sum and one for the other 15's. All of it is linear in the embeddings, so
each codebook's rows can be projected once (``projected_table``): the decode is then the sum
of 16 rows of one table, here one kernel that writes the decoder's [B, C, n] layout.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def projected_table(quantizer: Any) -> torch.Tensor:
    """Each codebook's entries through its group's output projection, stacked.

    Args:
        quantizer: the library's ``SplitResidualVectorQuantizer`` (``decoder.quantizer``):
            ``rvq_first`` (the semantic codebook) and ``rvq_rest`` (the acoustic ones), each
            a ``ResidualVectorQuantizer`` of ``EuclideanCodebook``s (``embedding_sum``
            [bins, dim] divided by ``cluster_usage`` [bins] clamped at ``epsilon``) and an
            ``output_proj`` 1x1 convolution (no bias, as the library builds it).

    Returns:
        [n_q * bins, out] in the quantizer's dtype, contiguous: row ``q * bins + c`` is code
        ``c`` of codebook ``q`` (0: the semantic one) as the decoder's input sees it, computed
        in float32 and rounded once.

    Raises:
        ValueError: a projection with a bias or a kernel wider than 1, or a codebook with an
            input projection (``project_out`` not the identity).
    """
    rows = []
    with torch.no_grad():
        for group in (quantizer.rvq_first, quantizer.rvq_rest):
            proj = group.output_proj
            if not isinstance(proj, torch.nn.Conv1d) or proj.bias is not None or proj.kernel_size != (1,):
                raise ValueError(f"unexpected quantizer projection {proj!r}")
            weight = proj.weight.detach().float()[:, :, 0]  # [out, dim]
            for layer in group.vq.layers:
                if not isinstance(layer.project_out, torch.nn.Identity):
                    raise ValueError("codebooks with their own projection are not supported")
                book = layer._codebook
                usage = book.cluster_usage.detach().float().clamp(min=book.epsilon)
                rows.append((book.embedding_sum.detach().float() / usage[:, None]) @ weight.T)
    return torch.cat(rows).to(weight.device, quantizer.rvq_first.output_proj.weight.dtype).contiguous()


def codebook_sum_eager(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Eager form of ``codebook_sum``: the rows summed in float32 in codebook order, as the
    kernel sums them, and rounded once."""
    groups = codes.shape[1]
    offsets = torch.arange(groups, device=codes.device) * (table.shape[0] // groups)
    rows = table[codes + offsets[None, :, None]].float()  # [B, G, n, out]
    total = rows[:, 0]
    for g in range(1, groups):
        total = total + rows[:, g]
    return total.to(table.dtype).transpose(1, 2).contiguous()


@triton.jit
def _codebook_sum_kernel(
    codes_ptr, table_ptr, out_ptr, frames, width, bins, s_cb, s_cg, s_cn,
    GROUPS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    gate(PDL)
    bt = tl.program_id(0)  # a (row, frame) pair
    b = bt // frames
    t = bt - b * frames
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for g in range(GROUPS):
        code = tl.load(codes_ptr + b * s_cb + g * s_cg + t * s_cn)
        acc += tl.load(table_ptr + (code + g * bins) * width + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + (b * width + cols) * frames + t, acc.to(out_ptr.dtype.element_ty), mask=ok)


def codebook_sum(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The quantizer's decode of ``codes`` from its ``projected_table``, in one kernel.

    Args:
        table: [G * bins, C] (``projected_table``), contiguous.
        codes: int64 [B, G, n], each below ``bins``; any strides.

    Returns:
        [B, C, n] in the table's dtype, contiguous: ``sum_g table[g * bins + codes[:, g]]``
        summed in float32 and rounded once (the library's decode within rounding).
    """
    b, groups, n = codes.shape
    width = table.shape[1]
    assert table.is_contiguous() and table.shape[0] % groups == 0
    out = torch.empty((b, width, n), dtype=table.dtype, device=table.device)
    block = min(1024, next_pow2(width))
    launcher(_codebook_sum_kernel, table)[(b * n, triton.cdiv(width, block))](
        codes, table, out, n, width, table.shape[0] // groups, *codes.stride(), GROUPS=groups, BLOCK=block,
    )
    return out
