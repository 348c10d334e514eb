"""The transformer blocks of the talker and the code predictor, as ggml graph pieces.

Both stacks are Qwen3 decoder layers (transformers' ``Qwen3TTSTalkerDecoderLayer`` and the
predictor's): pre-RMSNorm; q/k/v products, RMSNorm of each query and key head (``q_norm``,
``k_norm``), rotary positions, grouped-query attention (``heads // kv_heads`` query heads
share a key/value head, as ``repeat_kv`` does) over a key/value cache, the output product and
a residual; then RMSNorm, SwiGLU MLP (``down(silu(gate(x)) * up(x))``) and a residual.

Rotary positions: the talker's M-RoPE (interleaved sections [24, 20, 20] at 1.7B / 0.6B)
gives each section its own position id, but for a text-only prompt qwen_tts passes the same
id to all three (``get_rope_index``: ``cumsum(attention_mask) - 1``, one row repeated), and
with equal ids M-RoPE is plain GPT-NeoX RoPE; the code predictor uses plain RoPE. So both
use ``ggml_rope_ext`` in NeoX mode (rotating halves, as ``rotate_half``), positions p0.. of
this call.

Shapes are ggml's, innermost first: the hidden states of T positions are [hidden, T].
"""

from __future__ import annotations

import math

from .api import ROPE_NEOX, Ggml
from .runtime import Graph, KvCache
from .weights import Stack, Weights

_F32_SIZE = 4


class Stacked:
    """Builds one stack's layers into graphs.

    Args:
        ggml: the API; weights: the uploaded tensors; prefix: "talker" or "code_pred";
        stack: its shape.
    """

    def __init__(self, ggml: Ggml, weights: Weights, prefix: str, stack: Stack) -> None:
        self.ggml, self.weights, self.prefix, self.stack = ggml, weights, prefix, stack
        self._layers = [
            {part: weights.tensor(f"{prefix}.blk.{i}.{part}.weight") for part in _LAYER_PARTS}
            for i in range(stack.layers)
        ]
        self.norm = weights.tensor(f"{prefix}.output_norm.weight")

    def linear(self, g: Graph, weight: int, x: int, bias: int | None = None) -> int:
        """``x @ W.T (+ b)``: weight ggml [in, out], x [in, T] -> [out, T]."""
        y = self.ggml.ggml_mul_mat(g.ctx, weight, x)
        return y if bias is None else self.ggml.ggml_add(g.ctx, y, bias)

    def rms(self, g: Graph, x: int, weight: int) -> int:
        """RMSNorm over the innermost dimension, times ``weight``."""
        return self.ggml.ggml_mul(g.ctx, self.ggml.ggml_rms_norm(g.ctx, x, self.stack.eps), weight)

    def forward(self, g: Graph, x: int, positions: int, cache: KvCache, p0: int, t: int) -> int:
        """All layers over ``x`` [hidden, t] at positions ``p0 .. p0 + t - 1`` (``positions``:
        an I32 [t] input holding them); writes their keys/values into ``cache`` at p0.. and
        attends to positions 0 .. p0 + t - 1. Returns the last layer's output [hidden, t]."""
        for i in range(self.stack.layers):
            x = self._layer(g, i, x, positions, cache, p0, t)
        return x

    def last_normed(self, g: Graph, x: int, t: int) -> int:
        """The final RMSNorm of the last position of ``x`` [hidden, t]: [hidden, 1]."""
        hidden = self.stack.hidden
        last = self.ggml.ggml_view_2d(g.ctx, x, hidden, 1, hidden * _F32_SIZE, (t - 1) * hidden * _F32_SIZE)
        return self.rms(g, last, self.norm)

    def _layer(self, g: Graph, i: int, x: int, positions: int, cache: KvCache, p0: int, t: int) -> int:
        ggml, ctx, s, w = self.ggml, g.ctx, self.stack, self._layers[i]
        d, width = s.head_dim, s.kv_heads * s.head_dim
        h = self.rms(g, x, w["attn_norm"])
        q = ggml.ggml_reshape_3d(ctx, self.linear(g, w["attn_q"], h), d, s.heads, t)
        k = ggml.ggml_reshape_3d(ctx, self.linear(g, w["attn_k"], h), d, s.kv_heads, t)
        v = self.linear(g, w["attn_v"], h)  # [width, t]
        q = self._rope(g, self.rms(g, q, w["attn_q_norm"]), positions)
        k = self._rope(g, self.rms(g, k, w["attn_k_norm"]), positions)
        # this call's keys and values into the cache (before the attention that reads them)
        keys, values, cap = cache.keys[i], cache.values[i], cache.capacity
        k_dst = ggml.ggml_view_2d(ctx, keys, width, t, width * _F32_SIZE, p0 * width * _F32_SIZE)
        g.expand(ggml.ggml_cpy(ctx, ggml.ggml_reshape_2d(ctx, k, width, t), k_dst))
        v_dst = ggml.ggml_view_2d(ctx, values, t, width, cap * _F32_SIZE, p0 * _F32_SIZE)
        g.expand(ggml.ggml_cpy(ctx, ggml.ggml_transpose(ctx, v), v_dst))
        # attention over positions 0 .. p0 + t - 1
        n = p0 + t
        k_all = ggml.ggml_view_3d(ctx, keys, d, s.kv_heads, n, d * _F32_SIZE, width * _F32_SIZE, 0)
        k_all = ggml.ggml_permute(ctx, k_all, 0, 2, 1, 3)  # [d, n, kv_heads]
        scores = ggml.ggml_mul_mat(ctx, k_all, ggml.ggml_permute(ctx, q, 0, 2, 1, 3))  # [n, t, heads]
        if t > 1:
            scores = ggml.ggml_diag_mask_inf(ctx, scores, p0)  # causal: row j sees keys <= p0 + j
        probs = ggml.ggml_soft_max_ext(ctx, scores, None, 1.0 / math.sqrt(d), 0.0)
        v_all = ggml.ggml_view_3d(ctx, values, n, d, s.kv_heads, cap * _F32_SIZE, cap * d * _F32_SIZE, 0)
        out = ggml.ggml_mul_mat(ctx, v_all, probs)  # [d, t, heads]
        out = ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, out, 0, 2, 1, 3))  # [d, heads, t]
        x = ggml.ggml_add(ctx, x, self.linear(g, w["attn_output"], ggml.ggml_reshape_2d(ctx, out, d * s.heads, t)))
        h = self.rms(g, x, w["ffn_norm"])
        act = ggml.ggml_swiglu_split(ctx, self.linear(g, w["ffn_gate"], h), self.linear(g, w["ffn_up"], h))
        return int(ggml.ggml_add(ctx, x, self.linear(g, w["ffn_down"], act)))

    def _rope(self, g: Graph, x: int, positions: int) -> int:
        """NeoX RoPE of ``x`` [head_dim, heads, t] at ``positions`` (see the module docstring)."""
        return int(self.ggml.ggml_rope_ext(
            g.ctx, x, positions, None, self.stack.head_dim, ROPE_NEOX, 0,
            self.stack.rope_theta, 1.0, 0.0, 1.0, 0.0, 0.0,
        ))


_LAYER_PARTS = (
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
)
