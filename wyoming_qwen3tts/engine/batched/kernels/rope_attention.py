"""A lone token's q/k norm + rotary, cache write and attention, in one kernel.

When each row adds one token (every talker step, and the code predictor's passes after its
first), ``rope.qk_rope_kv`` and ``attention.decode_attention`` can be one kernel: each
program takes one query head of one row, normalises and rotates its query, normalises and
rotates its key/value head's new key, writes that key and value into the cache at the row's
position, and attends over positions ``0..position``. The ``group`` programs of a key/value
head write the same values to the same place; each reads its own write back after a block
barrier. The arithmetic and the roundings are the two kernels' (the query and key rounded to
the model dtype, as stored), in the same order, so the result is theirs; the frame step saves
one kernel a layer (103 a frame on the 1.7B model).

Only for caches that one program covers (``splits`` 1); longer talker caches keep the split
kernels.

With ``window`` (the codec decoder's sliding-window transformer) the cache is a ring of
``window`` slots: position ``p`` is written at slot ``p % window`` and the query attends to
the ``min(p + 1, window)`` filled slots, which then hold exactly positions ``p - window + 1 ..
p`` (the window), in slot order rather than position order: the keys are stored rotated, so
the order does not change the attention. No cache is shifted or copied as the window slides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launcher, next_pow2
from .attention import BLOCK_N, _attend
from .rope import _rotate
from .pdl_gate import gate


@triton.jit
def _rope_attention_kernel(
    qkv_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, o_ptr, eps, scale,
    s_cos_b, s_pos_b, s_k_b, s_k_h, s_k_l, s_v_b, s_v_h, s_v_l,
    HEADS: tl.constexpr, KV: tl.constexpr, GROUP: tl.constexpr, HD: tl.constexpr,
    HAS_NORM: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr, WINDOW: tl.constexpr,
    PDL: tl.constexpr,
):
    gate(PDL)
    b = tl.program_id(0)
    head = tl.program_id(1)
    kvh = head // GROUP
    offs = tl.arange(0, HD)
    src = qkv_ptr + b * (HEADS + 2 * KV) * HD
    pos = tl.load(pos_ptr + b * s_pos_b)
    cos = cos_ptr + b * s_cos_b
    sin = sin_ptr + b * s_cos_b
    q = _rotate(src + head * HD, w_ptr + head * HD, cos, sin, offs, eps, HD, HAS_NORM)
    q = q.to(o_ptr.dtype.element_ty).to(tl.float32) * scale
    k = _rotate(src + (HEADS + kvh) * HD, w_ptr + (HEADS + kvh) * HD, cos, sin, offs, eps, HD, HAS_NORM)
    k_base = k_ptr + b * s_k_b + kvh * s_k_h
    v_base = v_ptr + b * s_v_b + kvh * s_v_h
    slot = pos
    end = pos + 1
    if WINDOW > 0:  # a ring of WINDOW slots
        slot = pos % WINDOW
        end = tl.minimum(end, WINDOW)
    tl.store(k_base + slot * s_k_l + offs, k.to(k_ptr.dtype.element_ty))
    v = tl.load(src + (HEADS + KV + kvh) * HD + offs)
    tl.store(v_base + slot * s_v_l + offs, v.to(v_ptr.dtype.element_ty))
    tl.debug_barrier()  # the block's writes are visible to all its threads
    m_i, l_i, acc = _attend(q, k_base, v_base, s_k_l, s_v_l, 0, end, offs, HD, BLOCK, ITERS)
    tl.store(o_ptr + (b * HEADS + head) * HD + offs, (acc / l_i).to(o_ptr.dtype.element_ty))


def rope_attention(
    qkv: torch.Tensor, norm: tuple[torch.Tensor, float] | None, cos: torch.Tensor, sin: torch.Tensor,
    positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, heads: int, scale: float,
    window: int = 0,
) -> torch.Tensor:
    """``decode_attention(qk_rope_kv(...), ...)`` for one token a row, in one kernel.

    Args:
        qkv: [B, 1, heads + 2 * kv_heads, head_dim], contiguous (the fused projection).
        norm: (weight [heads + kv_heads, head_dim], eps) of the per-head q/k RMSNorm, or None.
        cos, sin: ``layers.rope_tables`` output, [B or 1, 1, head_dim].
        positions: int64 [B or 1, 1]: each row's cache position (written, then attended to
            with everything before it).
        keys, values: the caches, [B, kv_heads, L, head_dim], last dim contiguous; written in
            place at each row's position.
        heads: query heads (a multiple of kv_heads).
        scale: the softmax scale (the module's ``scaling``).
        window: 0: the cache holds positions in order; else a ring of ``window`` slots (the
            caches' length: position ``p`` at slot ``p % window``; see the module docstring).

    Returns:
        [B, 1, heads * head_dim] in ``qkv``'s dtype (the output projection's input).

    Raises:
        ValueError: ``window`` is not the caches' length.
    """
    b, n, total, hd = qkv.shape
    kv_heads = keys.shape[1]
    assert n == 1 and total == heads + 2 * kv_heads and hd == next_pow2(hd) and qkv.is_contiguous()
    cos, sin = cos.expand(b, 1, hd), sin.expand(b, 1, hd)
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    assert keys.stride(-1) == 1 and values.stride(-1) == 1
    if window and window != keys.shape[2]:
        raise ValueError(f"a ring of {window} slots over a cache of {keys.shape[2]} positions")
    pos = positions.expand(b, 1)
    out = torch.empty((b, 1, heads * hd), dtype=qkv.dtype, device=qkv.device)
    block = min(BLOCK_N, next_pow2(keys.shape[2]))
    launcher(_rope_attention_kernel, qkv)[(b, heads)](
        qkv, norm[0] if norm is not None else qkv, cos, sin, pos, keys, values, out,
        norm[1] if norm is not None else 0.0, scale,
        cos.stride(0), pos.stride(0), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        HEADS=heads, KV=kv_heads, GROUP=heads // kv_heads, HD=hd, HAS_NORM=norm is not None,
        BLOCK=block, ITERS=triton.cdiv(keys.shape[2], block), WINDOW=window,
    )
    return out
