"""Per-row token sampling with counter-based randomness, inside a captured graph.

Every row of a batch has its own temperature, top-k, top-p and repetition penalty, and its
own random numbers: a hash of (the request's seed, the frame index, the codebook, the
candidate rank). No generator state is shared between rows, so a request's samples do not
depend on what else is in the batch, and the whole sampler is free of host syncs.

Order, as faster-qwen3-tts's ``sample_logits`` (and HF): suppress -> repetition penalty ->
temperature -> top-k -> top-p -> draw. The draw is Gumbel-max over the candidates:
argmax(logit + Gumbel noise) has the distribution of softmax sampling. The candidates are the
``CANDIDATES`` most likely ids (one ``topk``, no full sort): top-k is at most that many
(0 means that many), and top-p is taken among them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Most candidates a draw considers; faster-qwen3-tts's default top-k is 50.
CANDIDATES = 64
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


def uniform(seed: torch.Tensor, counter: torch.Tensor, stream: torch.Tensor, n: int) -> torch.Tensor:
    """Counter-based uniforms: float32 [B, S, n] in (0, 1), a pure function of the inputs.

    Args:
        seed: int64 [B], the rows' seeds (any int64; the low 62 bits are used).
        counter: int64 [B, S], e.g. the frame index of each row for each draw.
        stream: int64 [S], which draw of the frame (0 = talker token, 1..15 = code predictor).
        n: numbers per (row, draw), one per candidate rank.
    """
    s_lo = (seed & _M32)[:, None]
    s_hi = ((seed >> 32) & 0x3FFFFFFF)[:, None]
    key = _mix32(s_lo ^ _mix32(s_hi ^ _mix32((counter & _M32) ^ _mix32(stream[None, :] + 0x632BE5AB))))
    rank = torch.arange(n, device=seed.device, dtype=torch.int64)
    bits = _mix32(_mix32(key[:, :, None] ^ rank) ^ 0x9E3779B9)
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def gumbel(seed: torch.Tensor, counter: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """Gumbel noise for ``CANDIDATES`` ranks per (row, draw): float32 [B, S, CANDIDATES]."""
    return -torch.log(-torch.log(uniform(seed, counter, stream, CANDIDATES)))


@dataclass
class RowParams:
    """Per-row sampling settings as tensors (all [B], on the model's device), as
    ``effective`` makes them.

    Attributes:
        temperature: float32; 0 = greedy.
        top_k: int64 in [1, CANDIDATES].
        top_p: float32; above 1 = off.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor


def effective(top_k: int, top_p: float) -> tuple[int, float]:
    """The (top_k, top_p) a row stores: top-k within [1, CANDIDATES] (0 = CANDIDATES), and
    top-p 2.0 when it is off (>= 1), so that no rounding of the cumulative mass drops ids."""
    k = top_k if 0 < top_k <= CANDIDATES else CANDIDATES
    return k, top_p if top_p < 1.0 else 2.0


def sample(logits: torch.Tensor, params: RowParams, noise: torch.Tensor) -> torch.Tensor:
    """Draw one token per row.

    Args:
        logits: float32 [B, V], already suppressed and penalised (-inf = never).
        params: the rows' settings.
        noise: the rows' Gumbel noise for this draw, float32 [B, CANDIDATES].

    Returns:
        int64 [B] token ids.
    """
    greedy = logits.argmax(dim=-1)
    top, ids = torch.topk(logits / params.temperature.clamp_min(1e-5)[:, None], CANDIDATES, dim=-1)
    rank = torch.arange(CANDIDATES, device=logits.device)
    top = top.masked_fill(rank >= params.top_k[:, None], float("-inf"))
    mass = torch.softmax(top, dim=-1).cumsum(dim=-1)
    top = top.masked_fill((mass > params.top_p[:, None]) & (rank > 0), float("-inf"))
    drawn = ids.gather(-1, (top + noise).argmax(dim=-1, keepdim=True)).squeeze(-1)
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
