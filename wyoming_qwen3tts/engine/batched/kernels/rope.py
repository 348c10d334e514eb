"""Per-head q/k RMSNorm, the rotary embedding and the key/value cache write, in one kernel.

After the fused q/k/v projection each token holds ``heads`` query, ``kv_heads`` key and
``kv_heads`` value vectors of ``head_dim``. This kernel normalises q and k per head (the
Qwen3 ``q_norm``/``k_norm``; skipped for layers without it), rotates them
(``x * cos + roll(x, half) * signed_sin``, ``layers.rope_tables``), writes the query out and
the key and value straight into the cache at each token's own position. Eager PyTorch needs
about eight kernels for it (norm, weight, two products, roll, two cache writes, a layout copy).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def qk_rope_kv_eager(
    qkv: torch.Tensor, norm: tuple[torch.Tensor, float] | None, cos: torch.Tensor, sin: torch.Tensor,
    positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, heads: int,
) -> torch.Tensor:
    """Eager form of ``qk_rope_kv`` (same arguments and result)."""
    b, n, _, hd = qkv.shape
    kv_heads = keys.shape[1]
    qk = qkv[:, :, : heads + kv_heads]
    if norm is not None:
        qk = F.rms_norm(qk, (hd,), None, norm[1]) * norm[0]
    qk = torch.addcmul(qk * cos[:, :, None], qk.roll(hd // 2, dims=-1), sin[:, :, None])
    index = positions.expand(b, n).reshape(b, 1, n, 1).expand(b, kv_heads, n, hd)
    keys.scatter_(2, index, qk[:, :, heads:].transpose(1, 2).to(keys.dtype))
    values.scatter_(2, index, qkv[:, :, heads + kv_heads :].transpose(1, 2).to(values.dtype))
    return qk[:, :, :heads].contiguous()


@triton.jit
def _rotate(src, w, cos, sin, offs, eps, HD: tl.constexpr, HAS_NORM: tl.constexpr):
    """One head's vector at ``src`` (HD values), RMS-normalised with weights ``w`` if
    ``HAS_NORM``, rotated by the token's ``cos``/``sin`` rows: float32 [HD]."""
    rolled = (offs + HD // 2) % HD
    x = tl.load(src + offs).to(tl.float32)
    xr = tl.load(src + rolled).to(tl.float32)
    if HAS_NORM:
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / HD + eps)
        x = x * r * tl.load(w + offs).to(tl.float32)
        xr = xr * r * tl.load(w + rolled).to(tl.float32)
    return x * tl.load(cos + offs).to(tl.float32) + xr * tl.load(sin + offs).to(tl.float32)


@triton.jit
def _qk_rope_kv_kernel(
    qkv_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr, n_tok, eps,
    s_cos_b, s_cos_t, s_pos_b, s_pos_t, s_k_b, s_k_h, s_k_l, s_v_b, s_v_h, s_v_l,
    HEADS: tl.constexpr, KV: tl.constexpr, HD: tl.constexpr, HAS_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    gate(PDL)
    bt = tl.program_id(0)
    head = tl.program_id(1)
    b = bt // n_tok
    t = bt % n_tok
    offs = tl.arange(0, HD)
    src = qkv_ptr + bt * (HEADS + 2 * KV) * HD + head * HD
    pos = tl.load(pos_ptr + b * s_pos_b + t * s_pos_t)
    if head < HEADS + KV:
        y = _rotate(src, w_ptr + head * HD, cos_ptr + b * s_cos_b + t * s_cos_t,
                    sin_ptr + b * s_cos_b + t * s_cos_t, offs, eps, HD, HAS_NORM)
        if head < HEADS:
            tl.store(q_ptr + (bt * HEADS + head) * HD + offs, y.to(q_ptr.dtype.element_ty))
        else:
            dst = k_ptr + b * s_k_b + (head - HEADS) * s_k_h + pos * s_k_l
            tl.store(dst + offs, y.to(k_ptr.dtype.element_ty))
    else:
        v = tl.load(src + offs)
        dst = v_ptr + b * s_v_b + (head - HEADS - KV) * s_v_h + pos * s_v_l
        tl.store(dst + offs, v.to(v_ptr.dtype.element_ty))


def qk_rope_kv(
    qkv: torch.Tensor, norm: tuple[torch.Tensor, float] | None, cos: torch.Tensor, sin: torch.Tensor,
    positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, heads: int,
) -> torch.Tensor:
    """Normalise and rotate q/k, write k/v into the cache; return the rotated queries.

    Args:
        qkv: [B, n, heads + 2 * kv_heads, head_dim], contiguous (the fused projection).
        norm: (weight [heads + kv_heads, head_dim], eps) of the per-head q/k RMSNorm, or None.
        cos, sin: ``layers.rope_tables`` output, [B or 1, n, head_dim] (broadcast rows may have
            stride 0).
        positions: int64 [B or 1, n] (broadcastable to [B, n]): the cache position of each token.
        keys, values: the caches, [B, kv_heads, L, head_dim] (any strides but the last,
            which must be 1); written in place.
        heads: query heads.

    Returns:
        The queries, [B, n, heads, head_dim], contiguous, in ``qkv``'s dtype.
    """
    b, n, total, hd = qkv.shape
    kv_heads = keys.shape[1]
    assert total == heads + 2 * kv_heads and hd == next_pow2(hd) and qkv.is_contiguous()
    q = torch.empty((b, n, heads, hd), dtype=qkv.dtype, device=qkv.device)
    cos, sin = cos.expand(b, n, hd), sin.expand(b, n, hd)
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    pos = positions.expand(b, n)
    weight = norm[0] if norm is not None else qkv
    eps = norm[1] if norm is not None else 0.0
    launcher(_qk_rope_kv_kernel, qkv)[(b * n, total)](
        qkv, weight, cos, sin, pos, q, keys, values, n, eps,
        cos.stride(0), cos.stride(1), pos.stride(0), pos.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        HEADS=heads, KV=kv_heads, HD=hd, HAS_NORM=norm is not None,
    )
    return q
