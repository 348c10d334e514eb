"""One pre-norm transformer layer of a Qwen3-TTS module, run on our own KV storage.

The talker, the code predictor and the codec decoder's transformer are stacks of the same
layer shape: RMSNorm -> attention (q/k/v projections, optional q/k RMSNorm, rotary
embedding) -> output projection -> residual, then RMSNorm -> gated MLP -> residual (the
codec's layers also scale both residual branches). This module runs such a layer with the
loaded modules' own weights and submodules, but lets the caller say where keys and values
live, so that every batch row can sit at its own position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from qwen_tts.core.models.modeling_qwen3_tts import apply_rotary_pos_emb

#: ``kv(k, v) -> (keys, values)``: store this step's keys/values ([B, kv_heads, n, head_dim])
#: and return everything to attend over ([B, kv_heads, L, head_dim]).
KvStore = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Grouped-query attention without copying keys per head.

    Args:
        q: [B, heads, n, head_dim].
        keys, values: [B, kv_heads, L, head_dim] (heads = kv_heads * group).
        allowed: bool [B, n, L], True where query t may see key l (each query sees >= 1 key).
        scale: softmax scale (1/sqrt(head_dim) for every Qwen3-TTS module).

    Returns:
        [B, n, heads * head_dim].
    """
    b, heads, n, hd = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    # The `group` query heads that share a kv head become `group * n` queries of it.
    q = q.reshape(b, kv_heads, group * n, hd)
    mask = allowed[:, None, None, :, :].expand(b, 1, group, n, allowed.shape[-1])
    mask = mask.reshape(b, 1, group * n, allowed.shape[-1])
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(b, heads, n, hd).transpose(1, 2).reshape(b, n, heads * hd)


def layer_step(
    layer: Any, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KvStore, allowed: torch.Tensor
) -> torch.Tensor:
    """Run one decoder layer of the talker, predictor or codec transformer.

    Args:
        layer: a loaded ``Qwen3TTSTalkerDecoderLayer`` / ``Qwen3TTSDecoderLayer`` /
            ``Qwen3TTSTokenizerV2DecoderTransformerLayer``.
        hidden: [B, n, hidden] in the model's dtype.
        cos, sin: rotary tables [B, n, head_dim].
        kv: where this step's keys and values go (see ``KvStore``).
        allowed: bool [B, n, L], which stored keys each query sees.

    Returns:
        [B, n, hidden].
    """
    attn = layer.self_attn
    b, n, _ = hidden.shape
    hd = attn.head_dim
    x = layer.input_layernorm(hidden)
    q = attn.q_norm(attn.q_proj(x).view(b, n, -1, hd)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(x).view(b, n, -1, hd)).transpose(1, 2)
    v = attn.v_proj(x).view(b, n, -1, hd).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    keys, values = kv(k, v)
    out = attn.o_proj(attend(q, keys, values, allowed, attn.scaling))
    scale_attn = getattr(layer, "self_attn_layer_scale", None)
    hidden = hidden + (scale_attn(out) if scale_attn is not None else out)
    out = layer.mlp(layer.post_attention_layernorm(hidden))
    scale_mlp = getattr(layer, "mlp_layer_scale", None)
    return hidden + (scale_mlp(out) if scale_mlp is not None else out)


def write_rows(store: torch.Tensor, new: torch.Tensor, positions: torch.Tensor) -> None:
    """Write each row's new keys (or values) at that row's own positions, in place.

    Args:
        store: [B, kv_heads, L, head_dim], the rows' slot regions.
        new: [B, kv_heads, n, head_dim].
        positions: int64 [B, n], where each new entry goes (distinct within a row).
    """
    rows = torch.arange(store.shape[0], device=store.device)[:, None].expand_as(positions)
    store[rows, :, positions] = new.transpose(1, 2)
