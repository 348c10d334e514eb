"""Hugging Face tensor names -> the GGUF tensor names qwentts.cpp loads, and how each is stored.

The names and layouts were read from qwentts.cpp's weight loaders (``talker-weights.h``,
``code-predictor-weights.h``, ``speaker-encoder-weights.h``, ``quantizer-decode.h``,
``tokenizer-transformer.h``, ``convnext-block.h``, ``dac-decoder-v2.h``, ``seanet-encoder.h``,
``encoder-transformer.h``, ``encoder-downsample.h``, ``quantizer-encode.h``) and checked against
the strings of the ``libqwen.so`` that realtimetts-qwen-native-cpu 0.4.2 ships. Every tensor is
written in PyTorch's own layout (gguf reverses the shape, so a Linear ``[out, in]`` becomes ggml
``ne = [in, out]`` and a Conv1d ``[out, in, k]`` becomes ``ne = [k, in, out]``, which is what
those loaders expect); the only computed tensors are the RVQ codebooks (see ``codebook``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

# (pattern over the Hugging Face name, replacement). First match wins; None drops the tensor.
_Rule = tuple[re.Pattern[str], str | None]


def _rules(pairs: list[tuple[str, str | None]]) -> list[_Rule]:
    return [(re.compile(f"^{pattern}$"), repl) for pattern, repl in pairs]


_LAYER = {
    r"input_layernorm\.weight": "attn_norm.weight",
    r"post_attention_layernorm\.weight": "ffn_norm.weight",
    r"self_attn\.q_proj\.weight": "attn_q.weight",
    r"self_attn\.k_proj\.weight": "attn_k.weight",
    r"self_attn\.v_proj\.weight": "attn_v.weight",
    r"self_attn\.o_proj\.weight": "attn_output.weight",
    r"self_attn\.q_norm\.weight": "attn_q_norm.weight",
    r"self_attn\.k_norm\.weight": "attn_k_norm.weight",
    r"mlp\.gate_proj\.weight": "ffn_gate.weight",
    r"mlp\.up_proj\.weight": "ffn_up.weight",
    r"mlp\.down_proj\.weight": "ffn_down.weight",
}

TALKER_RULES: list[_Rule] = _rules(
    [
        (r"talker\.model\.codec_embedding\.weight", "talker.codec_embd.weight"),
        (r"talker\.model\.text_embedding\.weight", "talker.text_embd.weight"),
        (r"talker\.model\.norm\.weight", "talker.output_norm.weight"),
        (r"talker\.codec_head\.weight", "talker.codec_head.weight"),
        (r"talker\.text_projection\.linear_fc(\d)\.(weight|bias)", r"talker.text_proj.fc\1.\2"),
        *((rf"talker\.model\.layers\.(\d+)\.{k}", rf"talker.blk.\1.{v}") for k, v in _LAYER.items()),
        (r"talker\.code_predictor\.model\.norm\.weight", "code_pred.output_norm.weight"),
        (r"talker\.code_predictor\.small_to_mtp_projection\.(weight|bias)", r"code_pred.mtp_proj.\1"),
        (r"talker\.code_predictor\.model\.codec_embedding\.(\d+)\.weight", r"code_pred.codec_embd.\1.weight"),
        (r"talker\.code_predictor\.lm_head\.(\d+)\.weight", r"code_pred.lm_head.\1.weight"),
        *(
            (rf"talker\.code_predictor\.model\.layers\.(\d+)\.{k}", rf"code_pred.blk.\1.{v}")
            for k, v in _LAYER.items()
        ),
        (r"speaker_encoder\.blocks\.0\.conv\.(weight|bias)", r"spk_enc.conv0.\1"),
        (r"speaker_encoder\.blocks\.(\d+)\.tdnn([12])\.conv\.(weight|bias)", r"spk_enc.blk.\1.tdnn\2.\3"),
        (
            r"speaker_encoder\.blocks\.(\d+)\.res2net_block\.blocks\.(\d+)\.conv\.(weight|bias)",
            r"spk_enc.blk.\1.res2net.\2.\3",
        ),
        (r"speaker_encoder\.blocks\.(\d+)\.se_block\.conv([12])\.(weight|bias)", r"spk_enc.blk.\1.se.conv\2.\3"),
        (r"speaker_encoder\.mfa\.conv\.(weight|bias)", r"spk_enc.mfa.\1"),
        (r"speaker_encoder\.asp\.tdnn\.conv\.(weight|bias)", r"spk_enc.asp.tdnn.\1"),
        (r"speaker_encoder\.asp\.conv\.(weight|bias)", r"spk_enc.asp.conv.\1"),
        (r"speaker_encoder\.fc\.(weight|bias)", r"spk_enc.fc.\1"),
    ]
)

_CODEC_LAYER = {
    r"input_layernorm\.(weight|bias)": r"attn_norm.\2",
    r"post_attention_layernorm\.(weight|bias)": r"ffn_norm.\2",
    r"self_attn\.q_proj\.(weight)": r"attn_q.\2",
    r"self_attn\.k_proj\.(weight)": r"attn_k.\2",
    r"self_attn\.v_proj\.(weight)": r"attn_v.\2",
    r"self_attn\.o_proj\.(weight)": r"attn_output.\2",
    r"self_attn_layer_scale\.(scale)": "attn_scale",
    r"mlp_layer_scale\.(scale)": "ffn_scale",
    r"mlp\.gate_proj\.(weight)": r"ffn_gate.\2",
    r"mlp\.up_proj\.(weight)": r"ffn_up.\2",
    r"mlp\.down_proj\.(weight)": r"ffn_down.\2",
    r"mlp\.fc1\.(weight)": r"ffn_up.\2",  # the encoder's Mimi MLP: fc1 -> GELU -> fc2
    r"mlp\.fc2\.(weight)": r"ffn_down.\2",
}

CODEC_RULES: list[_Rule] = _rules(
    [
        # decoder: quantizer (codebooks are computed, see CODEBOOKS), pre-conv, transformer
        (r"decoder\.quantizer\.rvq_first\.output_proj\.weight", "tok_dec.vq_first.output_proj.weight"),
        (r"decoder\.quantizer\.rvq_rest\.output_proj\.weight", "tok_dec.vq_rest.output_proj.weight"),
        (r"decoder\.quantizer\.rvq_(first|rest)\.input_proj\.weight", None),  # encode side only
        (r"decoder\.pre_conv\.conv\.(weight|bias)", r"tok_dec.pre_conv.\1"),
        (r"decoder\.pre_transformer\.(input_proj|output_proj)\.(weight|bias)", r"tok_dec.pre_tfm.\1.\2"),
        (r"decoder\.pre_transformer\.norm\.weight", "tok_dec.pre_tfm.norm.weight"),
        *(
            (rf"decoder\.pre_transformer\.layers\.(\d+)\.{k}", rf"tok_dec.pre_tfm.blk.\1.{v}")
            for k, v in _CODEC_LAYER.items()
        ),
        # decoder: upsample stage (CausalTransConv + ConvNeXt per block)
        (r"decoder\.upsample\.(\d+)\.0\.conv\.(weight|bias)", r"tok_dec.upsample.\1.conv.\2"),
        (r"decoder\.upsample\.(\d+)\.1\.dwconv\.conv\.(weight|bias)", r"tok_dec.upsample.\1.dwconv.\2"),
        (r"decoder\.upsample\.(\d+)\.1\.(norm|pwconv1|pwconv2)\.(weight|bias)", r"tok_dec.upsample.\1.\2.\3"),
        (r"decoder\.upsample\.(\d+)\.1\.gamma", r"tok_dec.upsample.\1.gamma"),
        # decoder: DAC (0 conv_pre, 1..4 blocks, 5 snake, 6 conv_post)
        (r"decoder\.decoder\.(0|6)\.conv\.(weight|bias)", r"tok_dec.dec.\1.conv.\2"),
        (r"decoder\.decoder\.5\.(alpha|beta)", r"tok_dec.dec.5.snake.\1"),
        (r"decoder\.decoder\.(\d)\.block\.0\.(alpha|beta)", r"tok_dec.dec.\1.snake.\2"),
        (r"decoder\.decoder\.(\d)\.block\.1\.conv\.(weight|bias)", r"tok_dec.dec.\1.conv_t.\2"),
        # residual units sit at block indices 2, 3, 4 -> res.0, res.1, res.2 (see _residual_unit)
        (r"decoder\.decoder\.(\d)\.block\.([234])\.(act[12])\.(alpha|beta)", "RES:\\1:\\2:\\3.\\4"),
        (r"decoder\.decoder\.(\d)\.block\.([234])\.(conv[12])\.conv\.(weight|bias)", "RES:\\1:\\2:\\3.\\4"),
        # encoder: SEANet, transformer, downsample, quantizer projections
        (r"encoder\.encoder\.layers\.(\d+)\.conv\.(weight|bias)", r"tok_enc.conv.\1.\2"),
        (r"encoder\.encoder\.layers\.(\d+)\.block\.(\d+)\.conv\.(weight|bias)", r"tok_enc.res.\1.blk.\2.\3"),
        *(
            (rf"encoder\.encoder_transformer\.layers\.(\d+)\.{k}", rf"tok_enc.blk.\1.{v}")
            for k, v in _CODEC_LAYER.items()
        ),
        (r"encoder\.downsample\.conv\.weight", "tok_enc.downsample.weight"),
        (
            r"encoder\.quantizer\.(semantic|acoustic)_residual_vector_quantizer\.(input_proj|output_proj)\.weight",
            r"tok_enc.vq_\1.\2.weight",
        ),
        (r"encoder\.quantizer\..*\.codebook\.initialized", None),
    ]
)

#: RVQ codebooks: (pattern of the ``embedding_sum`` tensor, its ``cluster_usage`` suffix swap,
#: GGUF name). The released weights keep each codebook as a running sum and a usage count;
#: the codebook is ``sum / max(usage, 1e-5)`` per row (as qwen_tts/transformers compute it).
CODEBOOKS: list[tuple[re.Pattern[str], str, str]] = [
    (
        re.compile(r"^decoder\.quantizer\.rvq_(first|rest)\.vq\.layers\.(\d+)\._codebook\.embedding_sum$"),
        "embedding_sum",
        r"tok_dec.vq_\1.\2.codebook",
    ),
    (
        re.compile(r"^encoder\.quantizer\.(semantic|acoustic)_residual_vector_quantizer\.layers\.(\d+)\.codebook\.embed_sum$"),
        "embed_sum",
        r"tok_enc.vq_\1.\2.codebook",
    ),
]
#: Smallest usage count a codebook row is divided by (the codecs' ``epsilon``).
CODEBOOK_EPSILON = 1e-5


def _residual_unit(name: str) -> str:
    """``RES:block:index:rest`` -> ``tok_dec.dec.{block}.res.{index - 2}.{rest}``."""
    _, block, index, rest = name.split(":", 3)
    return f"tok_dec.dec.{block}.res.{int(index) - 2}.{rest}"


def gguf_name(rules: list[_Rule], hf_name: str) -> str | None:
    """The GGUF name of ``hf_name``, or None for a tensor qwentts.cpp does not load.

    Raises:
        KeyError: a tensor no rule knows (a checkpoint of another layout).
    """
    for pattern, repl in rules:
        if pattern.match(hf_name):
            if repl is None:
                return None
            name = pattern.sub(repl, hf_name)
            return _residual_unit(name) if name.startswith("RES:") else name
    raise KeyError(f"no GGUF name for tensor {hf_name!r}")


def is_codebook_part(hf_name: str) -> bool:
    """True for ``embedding_sum`` / ``embed_sum`` / ``cluster_usage`` (combined in ``CODEBOOKS``)."""
    return hf_name.endswith(("embedding_sum", "embed_sum", "cluster_usage"))


Namer = Callable[[str], str | None]
