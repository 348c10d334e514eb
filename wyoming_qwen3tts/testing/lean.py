"""The float32 "lean" generation modules: the talker and the code predictor written as two
plain ``nn.Module``s over a loaded qwen_tts model's own weights, with explicit keys/values
and greedy picks, and a greedy frame loop over them.

Their greedy codes equal qwen_tts's reference generator's (``benchmarks.cpu_generation_probe``
measures that every run; ``codes_equal_reference`` 1.0), so they are the check of other
implementations of the same computation: ``tests/test_ggml_graphs.py`` compares our ggml
graphs' codes with theirs. Needs torch (imported inside the functions, so this module
imports without it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def lean_classes() -> tuple[Any, Any]:
    """(LeanTalker, LeanPredictor); defined here so the module imports without torch."""
    import torch
    from torch import nn

    def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(dtype)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Layer(nn.Module):
        """One pre-norm layer over the HF layer's own modules; keys/values explicit."""

        def __init__(self, layer: Any, heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
            super().__init__()
            a = layer.self_attn
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = a.q_proj, a.k_proj, a.v_proj, a.o_proj
            self.gate_proj, self.up_proj, self.down_proj = layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj
            self.q_norm, self.k_norm = a.q_norm.weight, a.k_norm.weight
            self.in_norm, self.post_norm = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
            self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                    past_k: torch.Tensor, past_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            b, t, _ = x.shape
            d, g = self.head_dim, self.heads // self.kv_heads
            h = rms(x, self.in_norm, self.eps)
            q = rms(self.q_proj(h).view(b, t, self.heads, d), self.q_norm, self.eps).transpose(1, 2)
            k = rms(self.k_proj(h).view(b, t, self.kv_heads, d), self.k_norm, self.eps).transpose(1, 2)
            v = self.v_proj(h).view(b, t, self.kv_heads, d).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = torch.cat((past_k, k), dim=2)
            v = torch.cat((past_v, v), dim=2)
            # grouped queries: the g query heads of a kv head become g * t rows of it
            qg = q.reshape(b, self.kv_heads, g * t, d)
            scores = torch.matmul(qg, k.transpose(2, 3)) * (d ** -0.5)
            if mask is not None:
                scores = scores + mask
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            out = torch.matmul(probs, v).reshape(b, self.heads, t, d).transpose(1, 2).reshape(b, t, -1)
            x = x + self.o_proj(out)
            h = rms(x, self.post_norm, self.eps)
            x = x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))
            return x, k, v

    def rope(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def causal_mask(t: int, total: Any, groups: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [g * t, total]: row (g, i) sees keys j <= total - t + i."""
        rows = torch.arange(t)[:, None] + (total - t)
        cols = torch.arange(total)[None, :]
        mask = torch.where(cols <= rows, 0.0, float("-inf")).to(dtype)
        return mask.repeat(groups, 1)

    class LeanTalker(nn.Module):
        """The talker's layers, norm and codec head on explicit keys/values.

        ``forward(embeds [1, T, H], *past)`` with ``past`` = k_0, v_0, ..., k_27, v_27 (each
        [1, kv_heads, P, head_dim], P >= 0) returns (hidden [1, 1, H] of the last position after
        the final norm, logits [1, vocab] of it, *present) with present [1, kv_heads, P + T,
        head_dim]. Positions are P .. P + T - 1 (the text-only mrope equals plain rope)."""

        def __init__(self, talker: Any) -> None:
            super().__init__()
            c = talker.config
            self.layers = nn.ModuleList(
                Layer(l, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps)
                for l in talker.model.layers)
            self.norm = talker.model.norm.weight
            self.eps = c.rms_norm_eps
            self.head = talker.codec_head
            self.register_buffer("inv_freq", talker.model.rotary_emb.inv_freq.clone().float(), persistent=False)
            self.groups = c.num_attention_heads // c.num_key_value_heads

        def forward(self, embeds: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
            t = embeds.shape[1]
            p = past[0].shape[2]
            cos, sin = rope(self.inv_freq, torch.arange(t) + p, embeds.dtype)
            mask = causal_mask(t, p + t, self.groups, embeds.dtype) if t > 1 else None
            x = embeds
            present = []
            for i, layer in enumerate(self.layers):
                x, k, v = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
                present += [k, v]
            hidden = rms(x[:, -1:], self.norm, self.eps)
            return (hidden, self.head(hidden)[:, 0], *present)

    class LeanPredictor(nn.Module):
        """The code predictor's whole loop for one frame, greedy.

        ``forward(talker_hidden [1, 1, H], first_embed [1, 1, H])`` (the talker's hidden and
        its codec embedding of the frame's first code) returns int64 [15]: codes 1-15."""

        def __init__(self, talker: Any) -> None:
            super().__init__()
            cp = talker.code_predictor
            c = cp.config
            self.layers = nn.ModuleList(
                Layer(l, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps)
                for l in cp.model.layers)
            self.norm = cp.model.norm.weight
            self.eps = c.rms_norm_eps
            self.heads = nn.ModuleList(list(cp.lm_head))
            self.embeds = nn.ModuleList(list(cp.model.codec_embedding))
            self.project = cp.small_to_mtp_projection
            self.kv_heads, self.head_dim = c.num_key_value_heads, c.head_dim
            self.groups = c.num_attention_heads // c.num_key_value_heads
            self.register_buffer("inv_freq", cp.model.rotary_emb.inv_freq.clone().float(), persistent=False)

        def forward(self, talker_hidden: torch.Tensor, first_embed: torch.Tensor) -> torch.Tensor:
            dtype = talker_hidden.dtype
            empty = talker_hidden.new_zeros(1, self.kv_heads, 0, self.head_dim)
            ks = [empty] * len(self.layers)
            vs = [empty] * len(self.layers)
            x = self.project(torch.cat((talker_hidden, first_embed), dim=1))
            codes = []
            for step in range(len(self.heads)):
                t = x.shape[1]
                p = ks[0].shape[2]
                cos, sin = rope(self.inv_freq, torch.arange(t) + p, dtype)
                mask = causal_mask(t, p + t, self.groups, dtype) if t > 1 else None
                for i, layer in enumerate(self.layers):
                    x, ks[i], vs[i] = layer(x, cos, sin, mask, ks[i], vs[i])
                logits = self.heads[step](rms(x[:, -1], self.norm, self.eps))
                code = torch.argmax(logits, dim=-1)
                codes.append(code)
                if step + 1 < len(self.heads):
                    x = self.project(self.embeds[step](code)[:, None])
            return torch.cat(codes)

    return LeanTalker, LeanPredictor


class Tables:
    """The embedding rows a frame needs, float32 numpy: talker codec embedding [3072, H] and
    the predictor's 15 codec embeddings [15, 2048, H]."""

    def __init__(self, talker: Any) -> None:
        self.first = talker.model.codec_embedding.weight.detach().float().numpy()
        self.rest = np.stack([e.weight.detach().float().numpy() for e in talker.code_predictor.model.codec_embedding])
        c = talker.config
        self.suppress = np.zeros(c.vocab_size, dtype=bool)
        self.suppress[c.vocab_size - 1024:] = True  # qwen_tts suppresses this band except EOS ...
        self.suppress[c.codec_eos_token_id] = True  # ... and min_new_tokens holds EOS back here

    def pick_first(self, logits: np.ndarray) -> int:
        return int(np.argmax(np.where(self.suppress, -np.inf, logits.reshape(-1))))

    def next_input(self, first: int, rest: np.ndarray, text: np.ndarray) -> np.ndarray:
        """The talker's next input [1, 1, H]: the frame's 16 code embeddings summed + text."""
        e = self.first[first] + self.rest[np.arange(15), rest].sum(0)
        return (e + text).astype(np.float32)[None, None]


def texts(inputs: dict[str, Any], frames: int) -> list[np.ndarray]:
    """The text hidden added at each decode step: trailing text, then tts_pad."""
    trailing = inputs["trailing_text_hidden"][0].float().numpy()
    pad = inputs["tts_pad_embed"][0, 0].float().numpy()
    return [trailing[i] if i < len(trailing) else pad for i in range(frames)]


def greedy_frames(
    tables: Tables, texts: list[np.ndarray], frames: int, step: Callable[[np.ndarray | None], tuple[Any, Any]],
    predict: Callable[[Any, np.ndarray], np.ndarray], logits_to_numpy: Callable[[Any], np.ndarray] = np.asarray,
) -> dict[str, Any]:
    """``frames`` greedy frames after a prefill: ``step(None)`` gives the prefill's (hidden,
    logits), ``step(embeds [1, 1, H] float32)`` runs one talker step (keeping its own KV);
    ``predict(hidden, first code's embedding [1, 1, H])`` gives the 15 residual codes. Times
    of frames 1.. in ms (frame 0 is the prefill's); codes int64 [frames, 16]."""
    codes, talker_ms, predictor_ms, frame_ms = [], [], [], []
    embeds: np.ndarray | None = None
    for f in range(frames):
        t0 = time.perf_counter()
        hidden, logits = step(embeds)
        t1 = time.perf_counter()
        first = tables.pick_first(logits_to_numpy(logits))
        rest = predict(hidden, tables.first[first][None, None])
        t2 = time.perf_counter()
        codes.append([first, *rest.tolist()])
        embeds = tables.next_input(first, rest, texts[f])
        if f > 0:
            talker_ms.append(1000 * (t1 - t0))
            predictor_ms.append(1000 * (t2 - t1))
            frame_ms.append(1000 * (time.perf_counter() - t0))
    return {"frame_ms": frame_ms, "talker_ms": talker_ms, "predictor_ms": predictor_ms,
            "codes": np.array(codes, dtype=np.int64)}


def lean_torch_run(talker_mod: Any, predictor_mod: Any, tables: Tables, inputs: dict[str, Any], frames: int,
                   dtype: Any) -> dict[str, Any]:
    """Greedy frames with the (possibly quantized or cast) lean torch modules."""
    import torch

    layers = len(talker_mod.layers)
    kv = talker_mod.layers[0]
    empty = torch.zeros(1, kv.kv_heads, 0, kv.head_dim, dtype=dtype)
    with torch.inference_mode():
        out = talker_mod(inputs["inputs_embeds"].to(dtype), *([empty] * (2 * layers)))

        def step(embeds: np.ndarray | None) -> tuple[Any, Any]:
            nonlocal out
            if embeds is not None:
                out = talker_mod(torch.from_numpy(embeds).to(dtype), *out[2:])
            return out[0], out[1]

        def predict(hidden: Any, first_embed: np.ndarray) -> np.ndarray:
            return predictor_mod(hidden, torch.from_numpy(first_embed).to(dtype)).numpy()

        return greedy_frames(tables, texts(inputs, frames), frames, step, predict, lambda x: x.float().numpy())


class _Captured(Exception):
    """Raised from the wrapped ``talker.generate`` once its inputs are captured."""


def talker_inputs(qwen: Any, generate: Callable[[], Any]) -> dict[str, Any]:
    """The talker's prefill inputs of one qwen_tts call: ``generate()`` runs e.g.
    ``qwen.generate_custom_voice(...)``, which is stopped at its ``talker.generate`` (not run).

    Returns:
        {"inputs_embeds": [1, P, H], "trailing_text_hidden": [1, n, H], "tts_pad_embed":
        [1, 1, H]} (torch tensors, the model's dtype).
    """
    talker = qwen.model.talker
    captured: dict[str, Any] = {}
    real = talker.generate

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        captured.update({k: kwargs[k].clone() for k in ("inputs_embeds", "trailing_text_hidden", "tts_pad_embed")})
        raise _Captured

    talker.generate = wrapped
    try:
        generate()
    except _Captured:
        pass
    finally:
        talker.generate = real
    if not captured:
        raise RuntimeError("the call never reached the talker")
    return captured


def lean_codes(qwen: Any, inputs: dict[str, Any], frames: int) -> np.ndarray:
    """Greedy codes int64 [frames, 16] of the float32 lean modules from ``inputs``
    (``talker_inputs``); EOS is never picked (as with ``min_new_tokens`` = ``frames``)."""
    import torch

    talker = qwen.model.talker
    lean_talker, lean_predictor = lean_classes()
    run = lean_torch_run(lean_talker(talker).eval(), lean_predictor(talker).eval(), Tables(talker),
                         inputs, frames, torch.float32)
    return np.asarray(run["codes"], dtype=np.int64)
