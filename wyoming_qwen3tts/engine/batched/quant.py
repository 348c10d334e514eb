"""int8 weight-only quantization of the talker and code predictor (``--weight-quant int8``).

Every linear layer of the talker's 28 decoder layers and the code predictor's 5 (q, k, v, o,
gate, up, down: 1.49 G of the 1.7B models' 1.93 G parameters), and the talker's text
embedding (0.31 G), are stored as int8 with one float32 scale per output channel (per token
row for the embedding), symmetric: ``w ~ q * scale``, ``q = round(w / scale)`` in
[-127, 127], ``scale = max |w| of the row / 127``. Activations stay in the model's dtype
(bfloat16), and so do the norms, the codec, the speaker encoder, the heads and the other
embeddings. The weights of a 1.7B model then take 2.4 GB instead of 4.2 GB (codec included;
1,799,094,272 of its 2.10 G parameters are quantized).

On CUDA the products run in ``kernels.int8_matmul`` (the int8 tile widened in the kernel);
elsewhere, and under ``QWEN3TTS_KERNELS=eager``, in ``dequant_linear`` (the weight widened
per call: correct, and the reference the kernel is tested against).

``load_int8`` quantizes a model loaded on the CPU while it moves it to the GPU, one layer at
a time, so that the GPU never holds the bfloat16 weights of the quantized layers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: Largest magnitude of a quantized weight (symmetric: -128 is never used).
QMAX = 127


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization with one scale per row.

    Args:
        weight: [N, K], any float dtype, any device.

    Returns:
        (int8 [N, K] contiguous, float32 scales [N]) on ``weight``'s device, such that
        ``q * scale[:, None]`` is within ``scale / 2`` of ``weight``. An all-zero row gets
        scale 1 (and zeros).
    """
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale


#: Weights quantized at once when moving to the device (``quantize_to``): 16 M, so that the
#: float32 temporaries stay near 64 MB (the text embedding alone is 311 M).
CHUNK_ELEMENTS = 1 << 24


def quantize_to(weight: torch.Tensor, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` of ``weight`` [N, K] (on any device) onto ``device``, a block of rows
    at a time, so that the device never holds more than ``CHUNK_ELEMENTS`` of it in float."""
    rows = max(1, CHUNK_ELEMENTS // max(1, weight.shape[1]))
    q = torch.empty(weight.shape, dtype=torch.int8, device=device)
    scale = torch.empty(weight.shape[0], dtype=torch.float32, device=device)
    for start in range(0, weight.shape[0], rows):
        q[start : start + rows], scale[start : start + rows] = quantize_rows(weight[start : start + rows].to(device))
    return q, scale


def dequant_linear(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T + bias``, eagerly: the int8 weight is widened to
    ``x``'s dtype (exact: |q| <= 127 fits any float dtype's significand), multiplied, and the
    product scaled per output channel. Shapes as ``kernels.int8_matmul.int8_linear``."""
    y = F.linear(x, qweight.to(x.dtype)) * scale.to(x.dtype)
    return y + bias if bias is not None else y


class Int8Linear(nn.Module):
    """An ``nn.Linear`` stored as int8 weights with per-output-channel scales.

    Args:
        qweight: int8 [out_features, in_features]; scale: float32 [out_features];
        bias: [out_features] in the model's dtype, or None.
    """

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = (int(d) for d in qweight.shape)
        self.qweight: torch.Tensor
        self.scale: torch.Tensor
        self.bias: torch.Tensor | None
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, device: torch.device | str) -> Int8Linear:
        """Quantize ``linear`` (on any device) onto ``device``."""
        q, scale = quantize_to(linear.weight, device)
        bias = linear.bias.detach().to(device) if linear.bias is not None else None
        return cls(q, scale, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in_features] -> [..., out_features] in ``x``'s dtype."""
        from . import kernels

        if kernels.enabled(x):
            from .kernels.int8_matmul import int8_linear

            return int8_linear(x, self.qweight, self.scale, self.bias)
        return dequant_linear(x, self.qweight, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def fuse_int8(linears: list[Int8Linear]) -> Int8Linear:
    """One ``Int8Linear`` computing the ``linears`` side by side (outputs concatenated), whose
    storage the modules then share: each one's tensors become views into it (no copy stays)."""
    q = torch.cat([lin.qweight for lin in linears])
    scale = torch.cat([lin.scale for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = torch.cat(biases) if all(b is not None for b in biases) else None  # type: ignore[arg-type]
    start = 0
    for lin in linears:
        end = start + lin.out_features
        lin.qweight, lin.scale = q[start:end], scale[start:end]
        if bias is not None:
            lin.bias = bias[start:end]
        start = end
    return Int8Linear(q, scale, bias)


class Int8Embedding(nn.Module):
    """An ``nn.Embedding`` stored as int8 rows with one scale per row.

    Args:
        embedding: the loaded embedding (any device); quantized onto ``device``.
    """

    def __init__(self, embedding: nn.Embedding, device: torch.device | str) -> None:
        super().__init__()
        self.dtype = embedding.weight.dtype
        self.num_embeddings, self.embedding_dim = (int(d) for d in embedding.weight.shape)
        q, scale = quantize_to(embedding.weight, device)
        self.qweight: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """int64 ids [...] -> [..., embedding_dim] in the model's dtype."""
        return (self.qweight[ids].float() * self.scale[ids, None]).to(self.dtype)


def _quantize_linears(module: nn.Module, device: torch.device | str) -> int:
    """Replace every ``nn.Linear`` under ``module`` by an ``Int8Linear`` on ``device``;
    returns the parameters quantized."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear.from_linear(child, device))
                count += child.weight.numel()
    return count


def quantize_talker(talker: Any, device: torch.device | str) -> int:
    """Quantize the talker's and code predictor's decoder layers and the text embedding
    onto ``device`` (``Qwen3TTSTalkerForConditionalGeneration``, modified in place; the rest
    stays where it is). Returns the parameters quantized."""
    count = 0
    for layers in (talker.model.layers, talker.code_predictor.model.layers):
        for layer in layers:
            count += _quantize_linears(layer, device)
    embedding = talker.model.text_embedding
    talker.model.text_embedding = Int8Embedding(embedding, device)
    return count + embedding.weight.numel()


def load_int8(qwen: Any, device: str) -> int:
    """Quantize a ``qwen_tts.Qwen3TTSModel`` loaded on the CPU (``quantize_talker``) and move
    all of it, its codec included, to ``device``. Returns the parameters quantized.

    The GPU receives each quantized layer as int8 (its bfloat16 form stays on the CPU and is
    dropped), so loading needs no more GPU memory than the quantized model holds.
    """
    model = qwen.model
    count = quantize_talker(model.talker, device)
    model.to(device)
    tokenizer = model.speech_tokenizer
    tokenizer.model.to(device)
    qwen.device = tokenizer.device = next(model.parameters()).device  # "cuda:0", as a load onto it gives
    return count


def weight_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters and buffers (int8 weights and their scales included);
    a tensor reachable under two names (tied weights) counts once."""
    seen: dict[tuple[int, torch.dtype, tuple[int, ...]], int] = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
    return sum(seen.values())
