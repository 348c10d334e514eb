"""One token per row in one kernel: ``sampling.sample`` (and, for the talker, the repetition
penalty, the suppressed ids and the held-back EOS before it), with the same draws.

The kernel takes the logits in the model dtype (the float32 upcast is exact), applies the
penalty and the bans, keeps the ``CANDIDATES`` largest of ``logits / temperature`` (one
``tl.topk`` over keys that pack the value's order-preserving bits with the id, lower ids
first among equal values, as ``argmax``), masks ranks past top-k and past the top-p mass,
and draws Gumbel-max with the noise of ``sampling.gumbel`` for that rank, as the eager
sampler does. The draws are therefore the eager sampler's for the same seeds; they can
differ only where two float orders disagree: equal logits (ties), or a cumulative top-p
mass within rounding of ``top_p`` (the kernel sums in another order than ``cumsum``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..sampling import CANDIDATES, RowParams, penalise, sample
from . import launcher, next_pow2
from .pdl_gate import gate

#: Warps per program (one program per row). On the H200 (torch.profiler, batch 1, 2,048
#: ids) a draw took 18.7 us with 4 warps and 11.1 us with 16: the top-k network spreads
#: over more threads. The draw does not depend on it (beyond the rounding of the top-p mass).
WARPS = 16


def sample_eager(
    logits: torch.Tensor, params: RowParams, noise: torch.Tensor, out: torch.Tensor,
    seen: torch.Tensor | None = None, penalty: torch.Tensor | None = None,
    banned: torch.Tensor | None = None, hold: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    eos: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eager form of ``sample_fused`` (same arguments and effects)."""
    x = logits.float()
    if seen is not None and penalty is not None:
        x = penalise(x, seen, penalty)
    if banned is not None:
        x = x.masked_fill(banned, float("-inf"))
    if hold is not None:
        frame, min_new, eos_id = hold
        held = ((frame + 1) < min_new)[:, None] & (torch.arange(x.shape[1], device=x.device) == eos_id)
        x = x.masked_fill(held, float("-inf"))
    token = sample(x, params, noise)
    out.copy_(token)
    if eos is not None and hold is not None:
        eos.copy_(token == hold[2])
    return out


@triton.jit
def _sample_kernel(
    logits_ptr, s_logits, noise_ptr, s_noise, temp_ptr, topk_ptr, topp_ptr, out_ptr, s_out,
    seen_ptr, s_seen, penalty_ptr, banned_ptr, frame_ptr, min_new_ptr, eos_ptr, eos_id, vocab,
    V: tl.constexpr, K: tl.constexpr,
    HAS_PENALTY: tl.constexpr, HAS_BAN: tl.constexpr, HAS_HOLD: tl.constexpr,
    PDL: tl.constexpr,
):
    gate(PDL)
    row = tl.program_id(0)
    ids = tl.arange(0, V)
    inside = ids < vocab
    x = tl.load(logits_ptr + row * s_logits + ids, mask=inside, other=float("-inf")).to(tl.float32)
    if HAS_PENALTY:
        seen = tl.load(seen_ptr + row * s_seen + ids, mask=inside, other=0).to(tl.int32)
        p = tl.load(penalty_ptr + row)
        x = tl.where(seen != 0, tl.where(x > 0, x / p, x * p), x)
    if HAS_BAN:
        ban = tl.load(banned_ptr + ids, mask=inside, other=0).to(tl.int32)
        x = tl.where(ban != 0, float("-inf"), x)
    if HAS_HOLD:
        held = (tl.load(frame_ptr + row) + 1) < tl.load(min_new_ptr + row)
        x = tl.where(held & (ids == eos_id), float("-inf"), x)
    greedy = tl.argmax(x, axis=0)
    temperature = tl.load(temp_ptr + row)
    scaled = x / tl.maximum(temperature, 1e-5)
    # Order-preserving integer image of the float, the id (lower first) in the low bits.
    bits = scaled.to(tl.int32, bitcast=True)
    order = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = (order.to(tl.int64) << 32) | (V - 1 - ids).to(tl.int64)
    top = tl.topk(key, K, dim=0)
    cand = V - 1 - (top & 0xFFFFFFFF).to(tl.int32)
    hi = (top >> 32).to(tl.int32)
    val = tl.where(hi >= 0, hi, hi ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    rank = tl.arange(0, K)
    val = tl.where(rank >= tl.load(topk_ptr + row), float("-inf"), val)
    e = tl.exp(val - tl.max(val, axis=0))
    mass = tl.cumsum(e / tl.sum(e, axis=0), axis=0)
    val = tl.where((mass > tl.load(topp_ptr + row)) & (rank > 0), float("-inf"), val)
    pick = tl.argmax(val + tl.load(noise_ptr + row * s_noise + rank), axis=0)
    drawn = tl.sum(tl.where(rank == pick, cand, 0), axis=0)
    token = tl.where(temperature > 0, drawn, greedy)
    tl.store(out_ptr + row * s_out, token.to(tl.int64))
    if HAS_HOLD:
        tl.store(eos_ptr + row, token == eos_id)


def sample_fused(
    logits: torch.Tensor, params: RowParams, noise: torch.Tensor, out: torch.Tensor,
    seen: torch.Tensor | None = None, penalty: torch.Tensor | None = None,
    banned: torch.Tensor | None = None, hold: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    eos: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw one token per row into ``out`` (one kernel).

    Args:
        logits: [B, V] (any float dtype; last dim contiguous), V >= ``CANDIDATES``.
        params: the rows' ``RowParams``.
        noise: float32 [B, CANDIDATES] (``sampling.gumbel`` for this draw; last dim contiguous).
        out: int64 [B] (any stride) receiving the tokens.
        seen, penalty: bool [B, V] ids already generated and float32 [B] repetition penalty
            (both or neither).
        banned: bool [V] ids never drawn.
        hold: (frame int64 [B], min_new_tokens int64 [B], eos id): EOS is banned for rows with
            ``frame + 1 < min_new_tokens``; then ``eos`` (bool [B]) receives ``token == eos id``.

    Returns:
        ``out``.
    """
    b, vocab = logits.shape
    assert vocab >= CANDIDATES and logits.stride(1) == 1 and noise.stride(-1) == 1
    has_penalty = seen is not None and penalty is not None
    frame, min_new, eos_id = hold if hold is not None else (out, out, -1)
    launcher(_sample_kernel, logits)[(b,)](
        logits, logits.stride(0), noise, noise.stride(0), params.temperature, params.top_k, params.top_p,
        out, out.stride(0), seen if has_penalty else logits, seen.stride(0) if seen is not None else 0,
        penalty if penalty is not None else logits, banned if banned is not None else logits,
        frame, min_new, eos if eos is not None else out, eos_id, vocab,
        V=next_pow2(vocab), K=CANDIDATES, HAS_PENALTY=has_penalty, HAS_BAN=banned is not None,
        HAS_HOLD=hold is not None and eos is not None, num_warps=WARPS,
    )
    return out
