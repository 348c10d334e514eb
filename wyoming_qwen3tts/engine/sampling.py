"""Per-row token sampling with counter-based randomness, inside a captured graph.

Every row of a batch has its own temperature, top-k, top-p and repetition penalty, and its
own random numbers: a hash of (the request's seed, the frame index, the codebook, the
candidate rank). No generator state is shared between rows, so a request's samples do not
depend on what else is in the batch, and the whole sampler is free of host syncs.

Order, as faster-qwen3-tts's ``sample_logits`` (and HF): suppress -> repetition penalty ->
temperature -> top-k -> top-p -> draw. The draw is Gumbel-max: argmax(logit + Gumbel noise)
has the distribution of softmax sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, k: int) -> torch.Tensor:
    """(x * k) mod 2**32 for int64 ``x`` in [0, 2**32), without int64 overflow."""
    lo, hi = k & 0xFFFF, k >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (Chris Wellons' "lowbias32"), on int64 tensors < 2**32."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(seed: torch.Tensor, counter: torch.Tensor, stream: int, n: int) -> torch.Tensor:
    """Counter-based uniforms: float32 [B, n] in (0, 1), a pure function of the inputs.

    Args:
        seed: int64 [B], the rows' seeds (any int64; the low 62 bits are used).
        counter: int64 [B], e.g. the frame index of each row.
        stream: which draw of the frame (0 = talker token, 1..15 = code predictor steps).
        n: numbers per row (one per candidate).
    """
    device = seed.device
    s_lo = seed & _M32
    s_hi = (seed >> 32) & 0x3FFFFFFF
    key = _mix32(s_lo ^ _mix32(s_hi ^ _mix32((counter & _M32) ^ _mix32(torch.full_like(seed, stream)))))
    idx = torch.arange(n, device=device, dtype=torch.int64)
    bits = _mix32(_mix32(key[:, None] ^ idx[None, :]) ^ 0x9E3779B9)
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


@dataclass
class RowParams:
    """Per-row sampling settings as tensors (all [B], on the model's device).

    Attributes:
        temperature: float32; 0 = greedy.
        top_k: int64; 0 = off.
        top_p: float32; 1 = off.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor


def sample(
    logits: torch.Tensor,
    params: RowParams,
    seed: torch.Tensor,
    counter: torch.Tensor,
    stream: int,
) -> torch.Tensor:
    """Draw one token per row.

    Args:
        logits: float32 [B, V], already suppressed and penalised (-inf = never).
        params: the rows' settings.
        seed, counter, stream: the randomness key (see ``uniform``).

    Returns:
        int64 [B] token ids.
    """
    vocab = logits.shape[-1]
    greedy = logits.argmax(dim=-1)
    temperature = params.temperature.clamp_min(1e-5)[:, None]
    ordered, order = torch.sort(logits / temperature, dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(params.top_k > 0, params.top_k, torch.full_like(params.top_k, vocab))
    ordered = ordered.masked_fill(rank >= k[:, None], float("-inf"))
    # top-p as faster-qwen3-tts: drop ranks whose cumulative mass exceeds top_p, keep the first
    mass = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
    drop = (mass > params.top_p[:, None]) & (rank > 0) & (params.top_p[:, None] < 1.0)
    ordered = ordered.masked_fill(drop, float("-inf"))
    gumbel = -torch.log(-torch.log(uniform(seed, counter, stream, vocab)))
    pick = (ordered + gumbel).argmax(dim=-1, keepdim=True)
    drawn = order.gather(-1, pick).squeeze(-1)
    return torch.where(params.temperature > 0, drawn, greedy)


def penalise(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """HF repetition penalty per row: seen ids' logits divided (if > 0) or multiplied by it.

    Args:
        logits: float32 [B, V].
        seen: bool [B, V], ids generated so far by each row.
        penalty: float32 [B]; 1 = off.
    """
    p = penalty[:, None]
    return torch.where(seen, torch.where(logits > 0, logits / p, logits * p), logits)
