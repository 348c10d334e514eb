"""Decode attention over each token's own filled cache positions.

Each query token at cache position ``p`` attends to keys ``0..p`` of its own row and nothing
else: a row 40 positions into a 2,048-position cache reads 41 keys, not 2,048, so the step
stops growing with the cache. Grouped-query attention reads the shared key/value head in
place. Long caches are split into chunks of ``CHUNK`` positions handled by separate programs
(flash-decoding: each chunk's partial softmax, then one combining kernel); a short cache
(the code predictor's 17 positions) is one program per query head and one kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate

#: Cache positions per program when a cache is split (``splits`` > 1).
CHUNK = 256
#: Keys loaded per loop iteration.
BLOCK_N = 64


def decode_attention_eager(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, scale: float,
    splits: int = 1,
) -> torch.Tensor:
    """Eager form of ``decode_attention`` (``splits`` is ignored)."""
    b, n, heads, hd = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    pos = positions.expand(b, n)
    allowed = torch.arange(length, device=q.device)[None, None, :] <= pos[:, :, None]  # [B, n, L]
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf"))
    qq = q.reshape(b, n, kv_heads, group, hd).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * n, hd)
    mask = mask[:, None, None].expand(b, 1, group, n, length).reshape(b, 1, group * n, length)
    out = F.scaled_dot_product_attention(qq, keys, values, attn_mask=mask, scale=scale)
    return out.view(b, kv_heads, group, n, hd).permute(0, 3, 1, 2, 4).reshape(b, n, heads * hd)


@triton.jit
def _attend(q, k_base, v_base, s_k_l, s_v_l, start, end, offs, HD: tl.constexpr, BLOCK: tl.constexpr,
            ITERS: tl.constexpr):
    """Online softmax of one scaled query (float32 [HD]) over cache positions [start, end):
    (running max, running sum, unnormalised output float32 [HD])."""
    m_i = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    acc = tl.zeros([HD], tl.float32)
    # A fixed trip count with the blocks past the row's length skipped (a loop bounded by
    # loaded values does not run in Triton's interpreter, which the CPU tests use).
    for it in range(0, ITERS):
        j = start + it * BLOCK
        if j < end:
            n = j + tl.arange(0, BLOCK)
            valid = n < end
            k = tl.load(k_base + n[:, None] * s_k_l + offs[None, :], mask=valid[:, None], other=0.0)
            scores = tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], axis=1), float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=0))
            p = tl.exp(scores - m_new)
            alpha = tl.exp(m_i - m_new)
            v = tl.load(v_base + n[:, None] * s_v_l + offs[None, :], mask=valid[:, None], other=0.0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, m_ptr, l_ptr, n_tok, scale,
    s_k_b, s_k_h, s_k_l, s_v_b, s_v_h, s_v_l, s_pos_b, s_pos_t,
    HEADS: tl.constexpr, GROUP: tl.constexpr, HD: tl.constexpr, BLOCK: tl.constexpr,
    CHUNK_N: tl.constexpr, ITERS: tl.constexpr, SPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    gate(PDL)
    bt = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    b = bt // n_tok
    t = bt % n_tok
    kvh = head // GROUP
    offs = tl.arange(0, HD)
    keys_n = tl.load(pos_ptr + b * s_pos_b + t * s_pos_t) + 1
    start = split * CHUNK_N
    end = tl.minimum(start + CHUNK_N, keys_n)
    q = tl.load(q_ptr + (bt * HEADS + head) * HD + offs).to(tl.float32) * scale
    k_base = k_ptr + b * s_k_b + kvh * s_k_h
    v_base = v_ptr + b * s_v_b + kvh * s_v_h
    m_i, l_i, acc = _attend(q, k_base, v_base, s_k_l, s_v_l, start, end, offs, HD, BLOCK, ITERS)
    row = bt * HEADS + head
    if SPLIT:
        n_split = tl.num_programs(2)
        tl.store(o_ptr + (row * n_split + split) * HD + offs, acc)
        tl.store(m_ptr + row * n_split + split, m_i)
        tl.store(l_ptr + row * n_split + split, l_i)
    else:
        tl.store(o_ptr + row * HD + offs, (acc / l_i).to(o_ptr.dtype.element_ty))

@triton.jit
def _combine_kernel(acc_ptr, m_ptr, l_ptr, o_ptr, SPLITS: tl.constexpr, S_BLOCK: tl.constexpr, HD: tl.constexpr, PDL: tl.constexpr):
    gate(PDL)
    row = tl.program_id(0)
    s = tl.arange(0, S_BLOCK)
    valid = s < SPLITS
    offs = tl.arange(0, HD)
    m = tl.load(m_ptr + row * SPLITS + s, mask=valid, other=float("-inf"))
    l_s = tl.load(l_ptr + row * SPLITS + s, mask=valid, other=0.0)
    top = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))
    acc = tl.load(acc_ptr + (row * SPLITS + s[:, None]) * HD + offs[None, :], mask=valid[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
    tl.store(o_ptr + row * HD + offs, out.to(o_ptr.dtype.element_ty))


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, scale: float,
    splits: int = 1,
) -> torch.Tensor:
    """Attention of each query token over its row's keys ``0..position``.

    Args:
        q: [B, n, heads, head_dim], contiguous (``rope.qk_rope_kv`` output).
        keys, values: [B, kv_heads, L, head_dim], last dim contiguous; ``heads`` is a multiple
            of ``kv_heads``.
        positions: int64 [B or 1, n] (broadcastable to [B, n]), each token's own cache
            position (it attends to it and everything before).
        scale: the softmax scale (the module's ``scaling``).
        splits: programs per query head along the cache, each ``CHUNK`` positions; must
            cover every position used (``splits * CHUNK >= max(positions) + 1``) when > 1.

    Returns:
        [B, n, heads * head_dim] in ``q``'s dtype (the output projection's input).
    """
    b, n, heads, hd = q.shape
    kv_heads = keys.shape[1]
    pos = positions.expand(b, n)
    out = torch.empty((b, n, heads * hd), dtype=q.dtype, device=q.device)
    common = (
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        pos.stride(0), pos.stride(1),
    )
    meta = {"HEADS": heads, "GROUP": heads // kv_heads, "HD": hd}
    if splits <= 1:
        block = min(BLOCK_N, next_pow2(keys.shape[2]))
        launcher(_decode_attention_kernel, q)[(b * n, heads, 1)](
            q, keys, values, pos, out, out, out, n, scale, *common,
            BLOCK=block, CHUNK_N=keys.shape[2], ITERS=triton.cdiv(keys.shape[2], block), SPLIT=False, **meta,
        )
        return out
    rows = b * n * heads
    acc = torch.empty((rows, splits, hd), dtype=torch.float32, device=q.device)
    m = torch.empty((rows, splits), dtype=torch.float32, device=q.device)
    l_sum = torch.empty((rows, splits), dtype=torch.float32, device=q.device)
    launcher(_decode_attention_kernel, q)[(b * n, heads, splits)](
        q, keys, values, pos, acc, m, l_sum, n, scale, *common,
        BLOCK=BLOCK_N, CHUNK_N=CHUNK, ITERS=CHUNK // BLOCK_N, SPLIT=True, **meta,
    )
    launcher(_combine_kernel, q)[(rows,)](acc, m, l_sum, out, SPLITS=splits, S_BLOCK=next_pow2(splits), HD=hd)
    return out
