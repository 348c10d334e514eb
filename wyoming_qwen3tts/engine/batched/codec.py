"""An incremental, batched codec decoder: codec frames in, PCM out, state kept per row.

The Qwen3-TTS-Tokenizer-12Hz decoder is causal end to end: causal convolutions (left
padding only), transposed convolutions trimmed on the right, and a transformer with a
sliding window of 72 frames. So a stream can be decoded frame by frame if every stage keeps
what it needs of the past: each convolution its last ``(kernel - 1) * dilation`` input
samples, each transposed convolution its previous input frame, and the transformer the keys
and values of its last 72 positions. Decoding then costs the same for every frame, however
long the stream, and equals decoding the whole sequence at once (``tests/test_codec.py``).

This module walks the loaded decoder's own modules and calls their own layers and weights;
only the bookkeeping of the past is ours. State lives in static buffers with one row per
slot, so a step over rows ``[0, B)`` can be captured in a CUDA graph.

On CUDA (``kernels.enabled``; ``QWEN3TTS_KERNELS=eager`` switches it off) the decoder
runs leaner, same arithmetic: the quantizer's decode is one lookup in a table of its
codebooks already projected (``kernels.codebooks``: one kernel instead of about 66), each
SnakeBeta is one Triton kernel (``kernels.snake``; its per-channel factors taken once,
here, instead of at every call: seven elementwise kernels become one), and every
convolution but ConvNeXt's depthwise ones is one matrix product on [B, C, T]
(``conv_products``: tensor cores, no cuDNN layout conversions; a causal convolution's
columns built by one kernel, ``kernels.im2col``, from the stream's past and the input where
they lie, the same kernel then moving the past on; from ``FOLDED_MIN_ROWS`` rows the
batch is folded into the columns for one product, the transposed convolutions' frames
too; ``QWEN3TTS_CONV`` chooses another form).
The transformer's rotary tables are one kernel too (``kernels.rope_tables``, about twelve
before), and its last residual add with the final norm. In the decoder
blocks a product's bias, and a residual unit's residual add, are left to the SnakeBeta that
always follows, which adds them in the same kernel. On the CPU the library's modules run as
they are.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
    Qwen3TTSTokenizerV2CausalConvNet as CausalConv,
)
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
    Qwen3TTSTokenizerV2CausalTransConvNet as CausalTransConv,
)
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
    Qwen3TTSTokenizerV2ConvNeXtBlock as ConvNeXtBlock,
)
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
    Qwen3TTSTokenizerV2DecoderDecoderBlock as DecoderBlock,
)
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
    Qwen3TTSTokenizerV2DecoderDecoderResidualUnit as ResidualUnit,
)
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import SnakeBeta

from . import kernels
from .conv_products import CONV_MODES, ConvProduct, TransConvProduct
from .layers import FusedLayer, attention_mask, rope_tables

#: Each quantizer's ``kernels.codebooks.projected_table`` ([16 * 2048, 512], 32 MiB in
#: bfloat16 at full size), built once and shared by every ``StreamingDecoder`` of it (the
#: engine's, the prefill's scratch one).
_TABLES: weakref.WeakKeyDictionary[Any, torch.Tensor] = weakref.WeakKeyDictionary()


def _settle(h: torch.Tensor, branch: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``h`` [B, C, T] plus a residual unit's unadded output ``branch`` [B, C, T] and a bias
    [C] not yet added (a unit's 1x1 convolution's, or a convolution product's); each None:
    nothing to add."""
    if branch is None:
        return h if bias is None else h + bias[:, None]
    return h + (branch if bias is None else branch + bias[:, None])


#: Rows from which ``QWEN3TTS_CONV=auto`` (the default) forms a causal convolution as
#: ``folded`` (the batch folded into the columns' samples: one product with the weight read
#: once); below it ``im2col`` (a batched product, the weight broadcast over the rows). On the
#: H200 (stop 44, ``benchmarks/results/profile/README.md``) the decode took 0.75 ms folded
#: against 0.68 at batch 1, 1.01 against 1.06 at 8 and 1.96 against 2.14 at 32; in stop 45's
#: engine loop at batch 32, 8.21 ms a frame against 8.43 (0.81 against 0.68 ms at batch 1).
#: The transposed convolutions fold from the same rows (``TransConvProduct``'s ``folded``): on
#: the H100 (stop 48, ``benchmarks/results/nvidia-h100/README.md``) the decode took 1.68 ms
#: with every product folded against 2.00 with only the causal ones, 0.93 against 1.00 at 8.
FOLDED_MIN_ROWS = 8


def _conv_mode(value: str) -> str:
    """``QWEN3TTS_CONV``'s value: ``auto``, or one of ``conv_products.CONV_MODES``.

    Raises:
        ValueError: another value (named with the ones accepted).
    """
    mode = value.strip().lower()
    if mode != "auto" and mode not in CONV_MODES:
        raise ValueError(f"QWEN3TTS_CONV={value!r}: expected one of auto, {', '.join(CONV_MODES)}")
    return mode


def product_mode(mode: str, rows: int) -> str:
    """The ``conv_products.CONV_MODES`` mode a decode of ``rows`` streams runs in ``mode``
    (``StreamingDecoder.conv_mode``): ``auto`` is ``folded`` from ``FOLDED_MIN_ROWS`` rows
    and ``im2col`` below; any other mode is itself."""
    if mode != "auto":
        return mode
    return "folded" if rows >= FOLDED_MIN_ROWS else "im2col"


class StreamingDecoder:
    """Decode codec frames of up to ``slots`` streams at once, each continuing its past.

    Args:
        decoder: the loaded ``Qwen3TTSTokenizerV2Decoder`` (``model.speech_tokenizer.model.decoder``).
        slots: rows of state kept (one per stream).
        fused: run the decoder blocks on the Triton kernels (see the module docstring); None:
            where ``kernels.enabled`` says so (CUDA). True on the CPU runs them in Triton's
            interpreter (tests only: ``TRITON_INTERPRET=1`` set before triton is imported).

    Attributes:
        samples_per_frame: PCM samples per codec frame (the decoder's total upsampling, 1920).
        fused: whether the decoder blocks run on the kernels.
    """

    def __init__(self, decoder: Any, slots: int, fused: bool | None = None) -> None:
        self.decoder = decoder
        self.slots = slots
        param = next(decoder.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.fused = kernels.enabled(param) if fused is None else fused
        #: How the fused path forms a causal convolution's product: ``QWEN3TTS_CONV``, default
        #: ``auto`` (``product_mode``: ``im2col`` for a few rows, ``folded`` from
        #: ``FOLDED_MIN_ROWS``), or one ``conv_products.CONV_MODES`` mode for every batch:
        #: ``im2col`` (columns by ``kernels.im2col``, then a batched cuBLAS product), ``copy``
        #: (the columns by PyTorch, stop 39), ``kernel`` (the long ones as
        #: ``kernels.causal_conv``; no faster on the H200: ``conv_products.KERNEL_MIN_SAMPLES``),
        #: ``folded`` (the batch folded into the columns, one product; the transposed
        #: convolutions' too, as ``auto`` does from ``FOLDED_MIN_ROWS`` rows).
        #: Read at each call: set it before capture.
        self.conv_mode = _conv_mode(os.environ.get("QWEN3TTS_CONV", "auto"))
        self.samples_per_frame = int(decoder.total_upsample)
        #: Ids per codebook (2048): codes must be below it.
        self.codebook_size = int(decoder.config.codebook_size)
        transformer = decoder.pre_transformer
        self.window = int(transformer.config.sliding_window)
        self._conv_state: dict[int, torch.Tensor] = {}
        self._build_conv_state()
        self._layers = [FusedLayer(layer) for layer in transformer.layers]
        if self.fused:  # the layer scales in the projections' weights: 16 kernels a frame fewer
            for fused_layer in self._layers:
                fused_layer.fold_layer_scales()
        heads = transformer.config.num_key_value_heads
        head_dim = self._layers[0].head_dim
        shape = (slots, heads, self.window, head_dim)
        self._keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in transformer.layers]
        self._values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in transformer.layers]
        #: Absolute position of each remembered key (-1: empty), int64 [slots, window].
        self._key_pos = torch.full((slots, self.window), -1, dtype=torch.int64, device=self.device)
        #: Frames decoded so far by each row, int64 [slots].
        self._frames = torch.zeros(slots, dtype=torch.int64, device=self.device)
        #: The fused path's tables (empty unless ``fused``): each SnakeBeta's factors
        #: (``snake_factors``), each convolution's and transposed convolution's product form,
        #: by ``id`` of the library's causal wrapper module.
        self._snake: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._products: dict[int, ConvProduct] = {}
        self._trans_products: dict[int, TransConvProduct] = {}
        self._codebooks: torch.Tensor | None = None
        #: The transformer's inverse rotary frequencies, float32 [head_dim / 2], as its rotary
        #: module uses them (``kernels.rope_tables``; fused path, default rope type only).
        self._inv_freq: torch.Tensor | None = None
        if self.fused:
            self._build_fused()

    # --- state ------------------------------------------------------------------------------

    def _build_conv_state(self) -> None:
        """One zeroed buffer [slots, channels, context] per stateful convolution."""
        for module in self.decoder.modules():
            if isinstance(module, CausalConv):
                if module.stride != 1:
                    raise ValueError("strided causal convolutions are not supported")
                context, channels = module.padding, module.conv.in_channels
            elif isinstance(module, CausalTransConv):
                kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
                if kernel not in (stride, 2 * stride):
                    raise ValueError(f"transposed convolution kernel {kernel} / stride {stride}")
                context, channels = (kernel - stride) // stride, module.conv.in_channels
            else:
                continue
            if context > 0:
                self._conv_state[id(module)] = torch.zeros(
                    self.slots, channels, context, dtype=self.dtype, device=self.device
                )

    def _build_fused(self) -> None:
        """The kernels' tables, taken once from the weights as loaded (the convolutions'
        product weights are views of theirs, the transposed ones' copies)."""
        from .kernels.codebooks import projected_table
        from .kernels.snake import snake_factors

        quantizer = self.decoder.quantizer
        if quantizer not in _TABLES:
            _TABLES[quantizer] = projected_table(quantizer)
        self._codebooks = _TABLES[quantizer]
        rotary = self.decoder.pre_transformer.rotary_emb
        if rotary.rope_type == "default":
            self._inv_freq = rotary.inv_freq.detach().float().contiguous()
        with torch.no_grad():
            for module in self.decoder.modules():
                if isinstance(module, SnakeBeta):
                    self._snake[id(module)] = snake_factors(module)
                elif isinstance(module, CausalConv):
                    product = ConvProduct.of(module.conv)
                    if product is not None and product.context == self._context(module):
                        self._products[id(module)] = product
                elif isinstance(module, CausalTransConv):
                    trans = TransConvProduct.of(module.conv)
                    if trans is not None:
                        self._trans_products[id(module)] = trans

    def _context(self, module: Any) -> int:
        """Past samples kept for ``module`` (0: none)."""
        state = self._conv_state.get(id(module))
        return 0 if state is None else state.shape[-1]

    def state(self) -> list[torch.Tensor]:
        """Every state buffer (each with the slot as its first dimension)."""
        return [*self._conv_state.values(), *self._keys, *self._values, self._key_pos, self._frames]

    def reset(self, row: int, rows: int = 1) -> None:
        """Forget the past of rows ``[row, row + rows)`` (new streams start there): one
        multi-tensor zeroing and one fill, whatever the number of buffers."""
        span = slice(row, row + rows)
        torch._foreach_zero_([buffer[span] for buffer in self.state() if buffer is not self._key_pos])
        self._key_pos[span].fill_(-1)

    def load_row(self, row: int, saved: list[torch.Tensor]) -> None:
        """Set row ``row``'s past to ``saved`` (one row of each ``state()`` buffer, in order:
        e.g. the state after an ICL reference's codes), as one multi-tensor copy."""
        torch._foreach_copy_([buffer[row] for buffer in self.state()], saved)

    # --- stages ------------------------------------------------------------------------------

    def _conv(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        return _settle(*self._conv_parts(module, x))

    def _conv_parts(self, module: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """A causal convolution of ``x`` [B, C, T], continuing each row's past, as
        (output [B, out, T], None, bias not yet added or None): ``_settle``'s arguments."""
        state = self._conv_state.get(id(module))
        product = self._products.get(id(module))
        rows = None if state is None else state[: x.shape[0]]
        if product is not None:  # the product moves the past on (``ConvProduct``'s ``advance``)
            mode = product_mode(self.conv_mode, x.shape[0])
            return product(rows, x, mode, advance=rows is not None), None, product.bias
        if rows is None:
            return module.conv(x), None, None
        full = torch.cat([rows, x], dim=-1)
        rows.copy_(full[..., -rows.shape[-1]:])
        return module.conv(full), None, None

    def _trans_conv(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        return _settle(*self._trans_conv_parts(module, x))

    def _trans_conv_parts(self, module: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """A transposed convolution of frames ``x`` [B, C, n], continuing each row's past:
        (output [B, out, n * stride], None, bias not yet added or None)."""
        state = self._conv_state.get(id(module))
        product = self._trans_products.get(id(module))
        stride = module.conv.stride[0]
        frames = x.shape[-1]
        # Folded where the causal convolutions are (``product_mode``): at batch 32 on the H100
        # (stop 48) the decode took 1.68 ms with these folded too against 2.00 without, 0.93
        # against 1.00 at batch 8.
        folded = product_mode(self.conv_mode, x.shape[0]) == "folded"
        if state is None:  # kernel == stride: frames do not overlap
            if product is None:
                return module.conv(x), None, None
            return product(x, None, folded), None, product.bias
        rows = state[: x.shape[0]]
        if product is None:
            full = torch.cat([rows, x], dim=-1)
            rows.copy_(x[..., -1:])
            return module.conv(full)[..., stride : stride + frames * stride], None, None
        previous = rows if frames == 1 else torch.cat([rows, x[..., :-1]], dim=-1)
        y = product(x, previous, folded)
        rows.copy_(x[..., -1:])
        return y, None, product.bias

    def _convnext(self, block: Any, x: torch.Tensor) -> torch.Tensor:
        h = self._conv(block.dwconv, x).permute(0, 2, 1)
        h = block.pwconv2(block.act(block.pwconv1(block.norm(h))))
        return x + (block.gamma * h).permute(0, 2, 1)

    def _residual_unit(self, unit: Any, x: torch.Tensor) -> torch.Tensor:
        h = self._conv(unit.conv1, unit.act1(x))
        return x + self._conv(unit.conv2, unit.act2(h))

    def _residual_unit_fused(
        self, unit: Any, x: torch.Tensor, branch: torch.Tensor | None, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A residual unit on the kernels, its input ``x`` plus the previous unit's unadded
        ``branch`` (+ ``bias``). Returns (its residual stream, its own unadded output, that
        output's bias): all [B, C, T] but the bias ([C] or None)."""
        from .kernels.snake import snake

        x, a = snake(x, *self._snake[id(unit.act1)], branch, bias)
        h, _, conv_bias = self._conv_parts(unit.conv1, a)
        _, a = snake(h, *self._snake[id(unit.act2)], None, conv_bias)
        h, _, conv_bias = self._conv_parts(unit.conv2, a)
        return x, h, conv_bias

    def _decoder_fused(self, h: torch.Tensor) -> torch.Tensor:
        """The decoder blocks (``decoder.decoder``) on the kernels: [B, latent, n] -> [B, 1, samples]."""
        from .kernels.snake import snake

        branch: torch.Tensor | None = None  # a residual unit's output, not yet added
        bias: torch.Tensor | None = None
        for module in self.decoder.decoder:
            for inner in module.block if isinstance(module, DecoderBlock) else [module]:
                if isinstance(inner, ResidualUnit):
                    h, branch, bias = self._residual_unit_fused(inner, h, branch, bias)
                    continue
                if isinstance(inner, SnakeBeta):
                    h = snake(h, *self._snake[id(inner)], branch, bias)[1]
                    branch = bias = None
                elif isinstance(inner, CausalConv):  # its bias left to the next SnakeBeta
                    h, branch, bias = self._conv_parts(inner, _settle(h, branch, bias))
                elif isinstance(inner, CausalTransConv):
                    h, branch, bias = self._trans_conv_parts(inner, _settle(h, branch, bias))
                else:
                    h = self._stage(inner, _settle(h, branch, bias))
                    branch = bias = None
        return _settle(h, branch, bias)

    def _stage(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        if isinstance(module, CausalConv):
            return self._conv(module, x)
        if isinstance(module, CausalTransConv):
            return self._trans_conv(module, x)
        if isinstance(module, ConvNeXtBlock):
            return self._convnext(module, x)
        if isinstance(module, ResidualUnit):
            return self._residual_unit(module, x)
        if isinstance(module, DecoderBlock):
            for inner in module.block:
                x = self._stage(inner, x)
            return x
        return module(x)  # pointwise (SnakeBeta)

    def _transformer(self, x: torch.Tensor) -> torch.Tensor:
        """[B, n, latent] -> [B, n, latent] through the sliding-window transformer.

        Each layer's keys and values are a ring of ``window`` slots per row: position ``p``
        lives at slot ``p % window`` (``_key_pos`` says which position each slot holds), so
        the window slides by writing the new positions' slots, with nothing shifted or copied.
        On the kernels, one frame a row runs each layer as ``FusedLayer.fast`` (the ring
        written and attended in one kernel, ``kernels.rope_attention``); otherwise the
        library's arithmetic with a mask over the ring and the new positions."""
        model = self.decoder.pre_transformer
        b, n, _ = x.shape
        h = model.input_proj(x)
        positions = self._frames[:b, None] + torch.arange(n, device=self.device)[None, :]
        rotary = model.rotary_emb
        if self._inv_freq is not None:
            from .kernels.rope_tables import rope_cos_sin

            cos, sin = rope_cos_sin(positions, self._inv_freq, rotary.attention_scaling, h.dtype)
        else:
            cos, sin = rope_tables(*rotary(h, positions))
        branch: torch.Tensor | None = None
        if self.fused and n == 1:
            for i, layer in enumerate(self._layers):
                h, branch = layer.fast(h, branch, cos, sin, positions, self._keys[i][:b], self._values[i][:b],
                                       window=self.window)
            self._key_pos[:b].scatter_(1, positions % self.window, positions)
        else:
            h = self._transformer_eager(h, cos, sin, positions)
        self._frames[:b] += n
        if self.fused:  # the last layer's MLP output added and the final norm, in one kernel
            from .kernels.rmsnorm import add_rms_norm

            return model.output_proj(add_rms_norm(h, branch, model.norm.weight, model.norm.variance_epsilon)[1])
        return model.output_proj(model.norm(h))

    def _transformer_eager(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``_transformer``'s layers with the library's arithmetic (``FusedLayer.__call__``):
        each of the ``n`` new positions attends to the ring's keys and the new ones within the
        window, then the last ``min(n, window)`` new keys and values go to their slots."""
        b, n = positions.shape
        key_pos = torch.cat([self._key_pos[:b], positions], dim=-1)  # [B, window + n]
        q = positions[:, :, None]
        k = key_pos[:, None, :]
        allowed = (k >= 0) & (k <= q) & (k > q - self.window)
        mask = attention_mask(allowed, self._layers[0].group, h.dtype)
        keep = min(n, self.window)  # the positions still in the window after this step
        newest = positions[:, n - keep :]
        slots = (newest % self.window)[:, None, :, None]  # [B, 1, keep, 1]
        for i, layer in enumerate(self._layers):
            keys, values = self._keys[i][:b], self._values[i][:b]

            def kv(k_new: torch.Tensor, v_new: torch.Tensor, keys: torch.Tensor = keys, values: torch.Tensor = values) -> tuple[torch.Tensor, torch.Tensor]:
                all_k = torch.cat([keys, k_new], dim=2)
                all_v = torch.cat([values, v_new], dim=2)
                index = slots.expand(-1, k_new.shape[1], -1, k_new.shape[3])
                keys.scatter_(2, index, k_new[:, :, n - keep :])
                values.scatter_(2, index, v_new[:, :, n - keep :])
                return all_k, all_v

            h = layer(h, cos, sin, kv, mask)
        self._key_pos[:b].scatter_(1, newest % self.window, newest)
        return h

    # --- decoding -----------------------------------------------------------------------------

    def step(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode the next ``n`` frames of rows ``[0, B)``.

        Args:
            codes: int64 [B, 16, n], codebook ids in [0, 2048).

        Returns:
            PCM [B, n * 1920] in [-1, 1], in the decoder's dtype.
        """
        d = self.decoder
        if self._codebooks is not None:
            from .kernels.codebooks import codebook_sum

            h = self._conv(d.pre_conv, codebook_sum(self._codebooks, codes))
        else:
            h = self._conv(d.pre_conv, d.quantizer.decode(codes))
        h = self._transformer(h.transpose(1, 2)).permute(0, 2, 1)
        for blocks in d.upsample:
            for block in blocks:
                h = self._stage(block, h)
        if self.fused:
            h = self._decoder_fused(h)
        else:
            for block in d.decoder:
                h = self._stage(block, h)
        return h.clamp(min=-1, max=1)[:, 0]

    def copy_row(self, source: StreamingDecoder, source_row: int, row: int) -> None:
        """Make row ``row``'s past equal to row ``source_row`` of ``source`` (same decoder)."""
        for mine, theirs in zip(self.state(), source.state(), strict=True):
            mine[row].copy_(theirs[source_row])

    def move_row(self, src: int, dst: int) -> None:
        """Move a stream's past from row ``src`` to row ``dst`` (compaction of the pool)."""
        state = self.state()
        torch._foreach_copy_([buffer[dst] for buffer in state], [buffer[src] for buffer in state])
