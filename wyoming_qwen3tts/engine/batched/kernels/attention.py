"""Decode attention over each token's own filled cache positions.

Each query token at cache position ``p`` attends to keys ``0..p`` of its own row and nothing
else: a row 40 positions into a 2,048-position cache reads 41 keys, not 2,048, so the step
stops growing with the cache. Grouped-query attention reads the shared key/value head in
place. Long caches are split into chunks of ``CHUNK`` positions handled by separate programs
(flash-decoding: each chunk's partial softmax, then one combining kernel); a short cache
(the code predictor's 17 positions) is one program per query head and one kernel.
"""

from __future__ import annotations

import os
from typing import Any

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


def loop_form(iters: int) -> tuple[bool, int | None]:
    """(prefetch, num_stages) of ``_attend``'s loop over ``iters`` blocks, by
    ``QWEN3TTS_ATTENTION``: ``auto`` (the default) requests each block before the previous
    block's arithmetic, with Triton's own pipelining off (one stage), where the loop runs two
    blocks or more, and a lone block's keys and values together; ``together`` and
    ``prefetch`` force one form (Triton's default stages).

    Raises:
        ValueError: another value of ``QWEN3TTS_ATTENTION``."""
    mode = os.environ.get("QWEN3TTS_ATTENTION", "auto").strip().lower()
    if mode == "auto":
        return (True, 1) if iters >= 2 else (False, None)
    if mode in ("together", "prefetch"):
        return mode == "prefetch", None
    raise ValueError(f"QWEN3TTS_ATTENTION={mode!r}: expected auto, together or prefetch")


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
def _attend_block(q, k, v, n, valid, slot, k_new, v_new, m_i, l_i, acc, NEW: tl.constexpr):
    """One block of ``_attend``'s online softmax: keys and values [BLOCK, HD] at positions
    ``n`` (``valid`` where below the end), position ``slot``'s replaced by ``k_new``/``v_new``
    with ``NEW``; returns the updated (max, sum, output)."""
    if NEW:
        here = (n == slot)[:, None]
        k = tl.where(here, k_new[None, :], k)
        v = tl.where(here, v_new[None, :], v)
    scores = tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], axis=1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=0))
    p = tl.exp(scores - m_new)
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=0)
    acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
    return m_new, l_i, acc


@triton.jit
def _attend_prefetched(q, k_base, v_base, s_k_l, s_v_l, start, end, offs, slot, k_new, v_new, m_i, l_i, acc,
                       HD: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr, NEW: tl.constexpr):
    """``_attend``'s loop with each block's keys and values requested before the previous
    block's arithmetic."""
    n = start + tl.arange(0, BLOCK)
    valid = n < end
    read = valid
    if NEW:
        read = read & (n != slot)
    k = tl.load(k_base + n[:, None] * s_k_l + offs[None, :], mask=read[:, None], other=0.0)
    v = tl.load(v_base + n[:, None] * s_v_l + offs[None, :], mask=read[:, None], other=0.0)
    for it in range(0, ITERS):
        n_next = n + BLOCK
        valid_next = n_next < end
        read_next = valid_next
        if NEW:
            read_next = read_next & (n_next != slot)
        k_next = tl.load(k_base + n_next[:, None] * s_k_l + offs[None, :], mask=read_next[:, None], other=0.0)
        v_next = tl.load(v_base + n_next[:, None] * s_v_l + offs[None, :], mask=read_next[:, None], other=0.0)
        if start + it * BLOCK < end:
            m_i, l_i, acc = _attend_block(q, k, v, n, valid, slot, k_new, v_new, m_i, l_i, acc, NEW)
        n = n_next
        valid = valid_next
        k = k_next
        v = v_next
    return m_i, l_i, acc


@triton.jit
def _attend(q, k_base, v_base, s_k_l, s_v_l, start, end, offs, slot, k_new, v_new, HD: tl.constexpr,
            BLOCK: tl.constexpr, ITERS: tl.constexpr, NEW: tl.constexpr, PREFETCH: tl.constexpr):
    """Online softmax of one scaled query (float32 [HD]) over cache positions [start, end):
    (running max, running sum, unnormalised output float32 [HD]).

    Each block's keys and values are requested together; with ``PREFETCH``, before the
    previous block's arithmetic (``_attend_prefetched``). With ``NEW``, position ``slot``'s
    key and value are ``k_new``/``v_new`` ([HD], the caches' dtype) rather than what the
    cache holds there (which is not read): a kernel that writes this step's key can attend
    before its write, so no program reads a slot that another is writing. The arithmetic and
    its order are those of a cache that already held them."""
    m_i = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    acc = tl.zeros([HD], tl.float32)
    if PREFETCH:
        m_i, l_i, acc = _attend_prefetched(q, k_base, v_base, s_k_l, s_v_l, start, end, offs, slot, k_new, v_new,
                                           m_i, l_i, acc, HD, BLOCK, ITERS, NEW)
    else:
        # A fixed trip count with the blocks past the row's length skipped (a loop bounded by
        # loaded values does not run in Triton's interpreter, which the CPU tests use).
        for it in range(0, ITERS):
            j = start + it * BLOCK
            if j < end:
                n = j + tl.arange(0, BLOCK)
                valid = n < end
                read = valid
                if NEW:
                    read = read & (n != slot)
                k = tl.load(k_base + n[:, None] * s_k_l + offs[None, :], mask=read[:, None], other=0.0)
                v = tl.load(v_base + n[:, None] * s_v_l + offs[None, :], mask=read[:, None], other=0.0)
                m_i, l_i, acc = _attend_block(q, k, v, n, valid, slot, k_new, v_new, m_i, l_i, acc, NEW)
    return m_i, l_i, acc


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, m_ptr, l_ptr, n_tok, scale,
    s_k_b, s_k_h, s_k_l, s_v_b, s_v_h, s_v_l, s_pos_b, s_pos_t,
    HEADS: tl.constexpr, GROUP: tl.constexpr, HD: tl.constexpr, BLOCK: tl.constexpr,
    CHUNK_N: tl.constexpr, ITERS: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr,
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
    m_i, l_i, acc = _attend(q, k_base, v_base, s_k_l, s_v_l, start, end, offs, -1, q, q, HD, BLOCK, ITERS, False, PREFETCH)
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
    splits: int = 1, prefetch: bool | None = None, stages: int | None = None,
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
        prefetch, stages: the loop's form (``_attend``'s ``PREFETCH``) and Triton's
            ``num_stages``; None: ``loop_form``'s.

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
    block = min(BLOCK_N, next_pow2(keys.shape[2])) if splits <= 1 else BLOCK_N
    iters = triton.cdiv(keys.shape[2] if splits <= 1 else CHUNK, block)
    form = loop_form(iters)
    prefetch = form[0] if prefetch is None else prefetch
    stages = form[1] if stages is None and prefetch == form[0] else stages
    meta: dict[str, Any] = {"HEADS": heads, "GROUP": heads // kv_heads, "HD": hd, "PREFETCH": prefetch}
    if stages is not None:
        meta["num_stages"] = stages
    if splits <= 1:
        launcher(_decode_attention_kernel, q)[(b * n, heads, 1)](
            q, keys, values, pos, out, out, out, n, scale, *common,
            BLOCK=block, CHUNK_N=keys.shape[2], ITERS=iters, SPLIT=False, **meta,
        )
        return out
    rows = b * n * heads
    acc = torch.empty((rows, splits, hd), dtype=torch.float32, device=q.device)
    m = torch.empty((rows, splits), dtype=torch.float32, device=q.device)
    l_sum = torch.empty((rows, splits), dtype=torch.float32, device=q.device)
    launcher(_decode_attention_kernel, q)[(b * n, heads, splits)](
        q, keys, values, pos, acc, m, l_sum, n, scale, *common,
        BLOCK=BLOCK_N, CHUNK_N=CHUNK, ITERS=iters, SPLIT=True, **meta,
    )
    launcher(_combine_kernel, q)[(rows,)](acc, m, l_sum, out, SPLITS=splits, S_BLOCK=next_pow2(splits), HD=hd)
    return out
