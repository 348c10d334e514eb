"""The talker's next input from a finished frame, in one kernel.

After the code predictor, each row's talker input is the embedding of the frame's first
codebook token (the talker's own table) plus the sum of the other 15 codes' embeddings (the
predictor's 15 tables, stacked into one) plus the ``tts_pad`` text embedding; the frame's 16
codes are also stored for the codec decoder. Eager PyTorch takes eight kernels for it (a
gather, an offset add, a gather, a sum, two adds, two copies); this is one. The roundings are
eager PyTorch's: the 15 embeddings summed in float32 and rounded once, then each add rounded
to the model dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def frame_embeds_eager(
    token: torch.Tensor, codes: torch.Tensor, token_table: torch.Tensor, code_table: torch.Tensor,
    pad: torch.Tensor, frame_codes: torch.Tensor,
) -> torch.Tensor:
    """Eager form of ``frame_embeds`` (what ``step.FrameStep.run`` did before it)."""
    vocab = code_table.shape[0] // codes.shape[1]
    offsets = torch.arange(codes.shape[1], device=codes.device) * vocab
    frame_codes[:, 0] = token
    frame_codes[:, 1:] = codes
    return token_table[token] + code_table[codes + offsets].sum(dim=1) + pad


@triton.jit
def _frame_embeds_kernel(
    tok_ptr, codes_ptr, s_codes, tt_ptr, ct_ptr, pad_ptr, out_ptr, fc_ptr, s_fc, vocab, hidden,
    GROUPS: tl.constexpr, BLOCK: tl.constexpr, G_BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    gate(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < hidden
    dtype = out_ptr.dtype.element_ty
    token = tl.load(tok_ptr + row)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(GROUPS):  # in order, as the eager sum runs over its 15 terms
        code = tl.load(codes_ptr + row * s_codes + j)
        acc += tl.load(ct_ptr + (code + j * vocab) * hidden + cols, mask=ok, other=0.0).to(tl.float32)
    summed = acc.to(dtype).to(tl.float32)
    e = (tl.load(tt_ptr + token * hidden + cols, mask=ok, other=0.0).to(tl.float32) + summed).to(dtype)
    e = (e.to(tl.float32) + tl.load(pad_ptr + cols, mask=ok, other=0.0).to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * hidden + cols, e, mask=ok)
    if tl.program_id(1) == 0:  # the frame's 16 codes, once per row
        g = tl.arange(0, G_BLOCK)
        rest = tl.load(codes_ptr + row * s_codes + g, mask=g < GROUPS, other=0)
        tl.store(fc_ptr + row * s_fc + 1 + g, rest, mask=g < GROUPS)
        tl.store(fc_ptr + row * s_fc, token)


def frame_embeds(
    token: torch.Tensor, codes: torch.Tensor, token_table: torch.Tensor, code_table: torch.Tensor,
    pad: torch.Tensor, frame_codes: torch.Tensor,
) -> torch.Tensor:
    """The talker's input for each row's next position, and the frame's codes stored.

    Args:
        token: int64 [B], each row's first-codebook token (the talker's vocabulary).
        codes: int64 [B, G], codebooks 2..G+1 (each in ``[0, vocab)``); rows may be strided.
        token_table: the talker's codec embedding, [talker vocab, hidden], contiguous.
        code_table: the predictor's G codebook embeddings stacked, [G * vocab, hidden],
            contiguous (codebook ``j``'s id ``c`` at row ``j * vocab + c``).
        pad: the ``tts_pad`` text embedding, [hidden].
        frame_codes: int64 [B, G + 1], last dim contiguous: written with ``token`` then ``codes``.

    Returns:
        [B, hidden] in the tables' dtype: ``token_table[token] + sum_j code_table[...] + pad``.
    """
    b, groups = codes.shape
    hidden = token_table.shape[1]
    assert token_table.is_contiguous() and code_table.is_contiguous() and frame_codes.stride(1) == 1
    assert codes.stride(1) == 1 and pad.is_contiguous()
    out = torch.empty((b, hidden), dtype=token_table.dtype, device=token_table.device)
    block = min(1024, next_pow2(hidden))
    launcher(_frame_embeds_kernel, token_table)[(b, triton.cdiv(hidden, block))](
        token, codes, codes.stride(0), token_table, code_table, pad, out, frame_codes, frame_codes.stride(0),
        code_table.shape[0] // groups, hidden, GROUPS=groups, BLOCK=block, G_BLOCK=next_pow2(groups),
    )
    return out
