"""One pre-norm transformer layer of a Qwen3-TTS module, run lean on our own KV storage.

The talker, the code predictor and the codec decoder's transformer are stacks of the same
layer shape: RMSNorm -> attention (q/k/v projections, optional per-head q/k RMSNorm, rotary
embedding) -> output projection -> residual, then RMSNorm -> gated MLP -> residual (the
codec's layers also scale both residual branches).

A frame step runs these layers hundreds of times with tiny batches, so its cost is the number
of kernels, not arithmetic. ``FusedLayer`` runs the same computation in fewer kernels:

* q, k and v are one matrix product, and so are the MLP's gate and up projections: their
  weights are laid out once, side by side, and the modules' own ``weight`` parameters become
  views into that block (the modules still work, e.g. for the prefill; nothing is copied);
  int8 layers (``quant.Int8Linear``) are fused the same way and run the int8 kernel;
* each RMSNorm is one ``F.rms_norm``, and q and k are normalised together;
* the rotary embedding is applied to q and k at once;
* grouped-query attention uses the kv heads as they are (the ``group`` query heads sharing a
  kv head become ``group * n`` queries of it), with an additive mask built once per step.

Keys and values go where the caller says (``KvStore``), so every batch row can sit at its own
position.

``FusedLayer.fast`` is the same layer in Triton kernels (``kernels``), for CUDA: the residual
add folded into the next RMSNorm, q/k norm + rotary + cache write in one kernel, attention
over each row's own filled positions only (one kernel with the previous one when each row
adds one token: ``kernels.rope_attention``), and SiLU-multiply in one kernel: eight or nine
kernels a layer (four of them the matrix products). A SiLU layer without layer scales (the
talker's and the code predictor's) goes further for a lone token (``FusedLayer._lean``,
``kernels.linear``): each matrix product carries its neighbours (the RMSNorm before it, the
SiLU-multiply or residual add after it), five kernels a layer.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .kernels.weight import Weight, use_fused

#: ``kv(k, v) -> (keys, values)``: store this step's keys/values ([B, kv_heads, n, head_dim])
#: and return everything to attend over ([B, kv_heads, L, head_dim]).
KvStore = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


#: A linear projection: [..., in] -> [..., out] in the activations' dtype.
Projection = Callable[[torch.Tensor], torch.Tensor]


def _fuse(linears: list[nn.Module]) -> tuple[Projection, Weight]:
    """Lay the linears' weights (and biases) out as one block; rebind each module's
    parameters to views into it. Returns the projection onto their outputs side by side, and
    that block as a ``Weight`` (for ``kernels.linear``).

    ``quant.Int8Linear`` modules (``--weight-quant int8``) are fused the same way, int8
    weights and scales side by side (per-output-channel scales concatenate)."""
    from .quant import Int8Linear, fuse_int8

    if all(isinstance(lin, Int8Linear) for lin in linears):
        fused = fuse_int8(linears)  # type: ignore[arg-type]
        return fused, Weight(fused.qweight, fused.scale, fused.bias)
    plain: list[nn.Linear] = linears  # type: ignore[assignment]
    weight = torch.cat([lin.weight.data for lin in plain])
    bias = None
    if plain[0].bias is not None:
        bias = torch.cat([lin.bias.data for lin in plain])  # type: ignore[union-attr]
    start = 0
    for lin in plain:
        end = start + lin.out_features
        lin.weight = nn.Parameter(weight[start:end], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return (lambda x: F.linear(x, weight, bias)), Weight(weight, None, bias)


def _is_silu(act: nn.Module) -> bool:
    """Whether ``act`` is SiLU: ``nn.SiLU``, or transformers' ``SiLUActivation`` (what
    ``ACT2FN["silu"]`` gives from transformers 5; the same ``F.silu``)."""
    try:
        from transformers.activations import SiLUActivation
    except ImportError:  # older transformers map "silu" to nn.SiLU
        return isinstance(act, nn.SiLU)
    return isinstance(act, (nn.SiLU, SiLUActivation))


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed sin) for ``FusedLayer``: x * cos + roll(x, half) * signed_sin equals the
    library's ``x * cos + rotate_half(x) * sin``. Shapes [..., head_dim]."""
    half = sin.shape[-1] // 2
    return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def attention_mask(allowed: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask ``FusedLayer`` expects, from bool [B, n, L] (True: may attend).

    Returns [B, 1, 1, L] for n == 1 (broadcast over the group), else [B, 1, group * n, L].
    """
    b, n, length = allowed.shape
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask = mask.masked_fill(~allowed, float("-inf"))
    if n == 1:
        return mask[:, None]
    return mask[:, None, None].expand(b, 1, group, n, length).reshape(b, 1, group * n, length)


#: ``FusedLayer.fold_layer_scales``' weights by projection module, shared by every
#: ``FusedLayer`` of it (the engine's decoder and the prefill's scratch one).
_SCALED: weakref.WeakKeyDictionary[nn.Linear, tuple[torch.Tensor, torch.Tensor | None]] = weakref.WeakKeyDictionary()


class FusedLayer:
    """A loaded decoder layer, run with fused kernels (see the module docstring).

    Args:
        layer: ``Qwen3TTSTalkerDecoderLayer``, ``Qwen3TTSDecoderLayer`` (code predictor) or
            ``Qwen3TTSTokenizerV2DecoderTransformerLayer`` (codec). Its q/k/v and gate/up
            weights are re-laid out in place (same values).
    """

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.head_dim = hd = int(attn.head_dim)
        self.heads = attn.q_proj.out_features // hd
        self.kv_heads = attn.k_proj.out_features // hd
        self.group = self.heads // self.kv_heads
        self.scale = float(attn.scaling)
        self.qkv, self.qkv_weight = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        self.gate_up, self.gate_up_weight = _fuse([mlp.gate_proj, mlp.up_proj])
        self.intermediate = mlp.gate_proj.out_features
        self.act = mlp.act_fn
        self.o_proj, self.down = attn.o_proj, mlp.down_proj
        self.norm1 = (layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon))
        self.norm2 = (layer.post_attention_layernorm.weight, float(layer.post_attention_layernorm.variance_epsilon))
        self.qk_norm: tuple[torch.Tensor, float] | None = None
        if hasattr(attn.q_norm, "weight"):
            weight = torch.cat([
                attn.q_norm.weight[None].expand(self.heads, hd), attn.k_norm.weight[None].expand(self.kv_heads, hd)
            ])
            self.qk_norm = (weight, float(attn.q_norm.variance_epsilon))
        scale_attn = getattr(layer, "self_attn_layer_scale", None)
        scale_mlp = getattr(layer, "mlp_layer_scale", None)
        self.scale_attn = scale_attn.scale if scale_attn is not None else None
        self.scale_mlp = scale_mlp.scale if scale_mlp is not None else None
        #: What ``fast`` runs for the output and down projections and the scales it then
        #: multiplies by: the library's modules and scales, or folded (``fold_layer_scales``).
        self._fast_o: Any = attn.o_proj
        self._fast_down: Any = mlp.down_proj
        self._fast_scales = (self.scale_attn, self.scale_mlp)
        self.silu = _is_silu(self.act)
        o_weight, down_weight = Weight.of(self.o_proj), Weight.of(self.down)
        #: The layer as five kernels with the matrix products' neighbours folded in
        #: (``kernels.linear``): a SiLU MLP, no layer scales, plain or int8 projections.
        self.lean: tuple[Weight, Weight] | None = None
        if self.silu and self.scale_attn is None and self.scale_mlp is None and o_weight and down_weight:
            self.lean = (o_weight, down_weight)

    def __call__(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KvStore, mask: torch.Tensor
    ) -> torch.Tensor:
        """One layer.

        Args:
            hidden: [B, n, hidden] in the model's dtype.
            cos, sin: ``rope_tables`` output, [B, n, head_dim].
            kv: where this step's keys and values go.
            mask: ``attention_mask`` output for the keys ``kv`` returns.

        Returns:
            [B, n, hidden].
        """
        b, n, _ = hidden.shape
        hd, heads, kv_heads = self.head_dim, self.heads, self.kv_heads
        x = F.rms_norm(hidden, (hidden.shape[-1],), self.norm1[0], self.norm1[1])
        qkv = self.qkv(x).view(b, n, heads + 2 * kv_heads, hd)
        qk = qkv[:, :, : heads + kv_heads]
        if self.qk_norm is not None:
            qk = F.rms_norm(qk, (hd,), None, self.qk_norm[1]) * self.qk_norm[0]
        cos4, sin4 = cos[:, :, None], sin[:, :, None]
        qk = torch.addcmul(qk * cos4, qk.roll(hd // 2, dims=-1), sin4)
        keys, values = kv(qk[:, :, heads:].transpose(1, 2), qkv[:, :, heads + kv_heads :].transpose(1, 2))
        q = qk[:, :, :heads].reshape(b, n, kv_heads, self.group, hd).permute(0, 2, 3, 1, 4)
        q = q.reshape(b, kv_heads, self.group * n, hd)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        out = out.view(b, kv_heads, self.group, n, hd).permute(0, 3, 1, 2, 4).reshape(b, n, heads * hd)
        out = self.o_proj(out)
        hidden = hidden + (out * self.scale_attn if self.scale_attn is not None else out)
        x = F.rms_norm(hidden, (hidden.shape[-1],), self.norm2[0], self.norm2[1])
        gate_up = self.gate_up(x)
        out = self.down(self.act(gate_up[..., : self.intermediate]) * gate_up[..., self.intermediate :])
        return hidden + (out * self.scale_mlp if self.scale_mlp is not None else out)

    def fast(
        self, hidden: torch.Tensor, branch: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
        positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, splits: int = 1,
        window: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One layer in Triton kernels (CUDA; see ``kernels``).

        A lone token through a ``lean`` layer runs as five kernels (``_lean``) and returns
        (residual stream, None).
        Otherwise the residual add is deferred: the layer's MLP output is returned, not added,
        and the next layer's (or the final) RMSNorm adds it (``kernels.rmsnorm.add_rms_norm``).

        Args:
            hidden: the residual stream, [B, n, hidden] in the model's dtype.
            branch: the previous layer's unadded MLP output [B, n, hidden], or None (callers
                pass on what the previous layer returned).
            cos, sin: ``rope_tables`` output, [B or 1, n, head_dim].
            positions: int64 [B or 1, n], each token's cache position; it attends to its
                row's keys ``0..position``.
            keys, values: this layer's cache, [B, kv_heads, L, head_dim]; written in place.
            splits: programs per head along the cache (``kernels.attention``).
            window: 0, or the cache is a ring of ``window`` slots (one token a row, one
                program a head: ``kernels.rope_attention``; the codec's sliding window).

        Returns:
            (the residual stream [B, n, hidden], the MLP output still to add [B, n, hidden] or
            None when the stream already holds it).
        """
        from .kernels import fused_matmul
        from .kernels.rmsnorm import add_rms_norm
        from .kernels.silu_mul import silu_mul

        b, n, _ = hidden.shape
        if self.lean is not None and b * n == 1 and fused_matmul(hidden) and not window:
            return self._lean(hidden if branch is None else hidden + branch, cos, sin, positions, keys, values, splits)
        hidden, x = add_rms_norm(hidden, branch, *self.norm1)
        qkv = self.qkv(x).view(b, n, self.heads + 2 * self.kv_heads, self.head_dim)
        scale_attn, scale_mlp = self._fast_scales
        out = self._fast_o(self._attention(qkv, cos, sin, positions, keys, values, splits, window))
        if scale_attn is not None:
            out = out * scale_attn
        hidden, x = add_rms_norm(hidden, out, *self.norm2)
        gate_up = self.gate_up(x)
        if self.silu:
            act = silu_mul(gate_up)
        else:
            act = self.act(gate_up[..., : self.intermediate]) * gate_up[..., self.intermediate :]
        out = self._fast_down(act)
        return hidden, (out * scale_mlp if scale_mlp is not None else out)

    def fold_layer_scales(self) -> None:
        """Let ``fast`` run without the layer scales' multiplications (the codec's layers have
        them: two elementwise kernels a layer, 16 a frame): each scale [hidden] multiplied
        into a copy of its projection's weight [hidden, in] (and bias), in float32, rounded
        once to the weight's dtype, so the product comes out scaled. The copies cost the
        two projections' weights again (16 MiB for the codec's eight layers in bfloat16),
        once whatever the number of decoders of the layer.
        Plain ``nn.Linear`` projections only; ``__call__`` keeps the library's order."""
        folded = []
        for proj, scale in ((self.o_proj, self.scale_attn), (self.down, self.scale_mlp)):
            if scale is None or type(proj) is not nn.Linear:
                folded.append((proj, scale))
                continue
            if proj not in _SCALED:  # one copy per projection, whichever decoders share it
                with torch.no_grad():
                    factor = scale.detach().float()[:, None]
                    weight = (proj.weight.detach().float() * factor).to(proj.weight.dtype)
                    bias = None if proj.bias is None else (proj.bias.detach().float() * factor[:, 0]).to(proj.bias.dtype)
                _SCALED[proj] = (weight, bias)
            weight, bias = _SCALED[proj]
            folded.append((functools.partial(F.linear, weight=weight, bias=bias), None))
        (self._fast_o, scale_attn), (self._fast_down, scale_mlp) = folded
        self._fast_scales = (scale_attn, scale_mlp)

    def _lean(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
        keys: torch.Tensor, values: torch.Tensor, splits: int,
    ) -> tuple[torch.Tensor, None]:
        """``fast`` for a lone token (``self.lean``), in five kernels: RMSNorm + q/k/v product;
        q/k norm + rotary + cache write + attention (``_attention``); output product + residual
        add; RMSNorm + gate/up product + SiLU-multiply; down product + residual add (each product as
        ``kernels.linear.fused_linear`` where ``use_fused`` says it is faster, else cuBLAS with
        its neighbours as kernels of their own). Returns (the residual stream after the layer,
        None): nothing is left to add."""
        assert self.lean is not None
        o_weight, down_weight = self.lean
        b, n, _ = hidden.shape
        qkv = self._product(hidden, self.qkv_weight, self.qkv, norm=self.norm1)
        qkv = qkv.view(b, n, self.heads + 2 * self.kv_heads, self.head_dim)
        attention = self._attention(qkv, cos, sin, positions, keys, values, splits)
        hidden = self._product(attention, o_weight, self.o_proj, residual=hidden)
        act = self._product(hidden, self.gate_up_weight, self.gate_up, norm=self.norm2, silu=True)
        return self._product(act, down_weight, self.down, residual=hidden), None

    def _attention(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
        keys: torch.Tensor, values: torch.Tensor, splits: int, window: int = 0,
    ) -> torch.Tensor:
        """q/k norm + rotary + cache write + attention of ``qkv`` [B, n, heads + 2 kv, hd]:
        one kernel for one token a row over a one-program cache (``kernels.rope_attention``;
        a ring of ``window`` slots if ``window``), else two (``qk_rope_kv``,
        ``decode_attention``). Returns [B, n, heads * hd].

        Raises:
            ValueError: a ring (``window``) for more than one token a row or a split cache."""
        from .kernels.attention import decode_attention
        from .kernels.rope import qk_rope_kv
        from .kernels.rope_attention import rope_attention

        if qkv.shape[1] == 1 and splits <= 1:
            return rope_attention(qkv, self.qk_norm, cos, sin, positions, keys, values, self.heads, self.scale, window)
        if window:
            raise ValueError("a ring cache takes one token a row over one program a head")
        q = qk_rope_kv(qkv, self.qk_norm, cos, sin, positions, keys, values, self.heads)
        return decode_attention(q, keys, values, positions, self.scale, splits)

    @staticmethod
    def _product(
        x: torch.Tensor, weight: Weight, projection: Projection, norm: tuple[torch.Tensor, float] | None = None,
        silu: bool = False, residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``kernels.linear.fused_linear(x, weight, ...)``, or the same as cuBLAS
        (``projection``) with the norm, SiLU-multiply and residual add as kernels of their own
        where ``use_fused`` prefers that."""
        from .kernels.linear import fused_linear
        from .kernels.rmsnorm import add_rms_norm
        from .kernels.silu_mul import silu_mul

        if use_fused(x.numel() // x.shape[-1], x.shape[-1]):
            return fused_linear(x, weight, norm=norm, silu=silu, residual=residual)
        if norm is not None:
            x = add_rms_norm(x, None, *norm)[1]
        y = projection(x)
        if silu:
            y = silu_mul(y)
        return y if residual is None else residual + y


def write_rows(store: torch.Tensor, new: torch.Tensor, positions: torch.Tensor) -> None:
    """Write each row's new key (or value) at that row's own position, in place.

    Args:
        store: [B, kv_heads, L, head_dim], the rows' slot regions.
        new: [B, kv_heads, 1, head_dim].
        positions: int64 [B], where each row's entry goes.
    """
    index = positions.view(-1, 1, 1, 1).expand(new.shape)
    store.scatter_(2, index, new)
