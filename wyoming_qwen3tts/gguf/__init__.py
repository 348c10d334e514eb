"""Convert a Hugging Face Qwen3-TTS checkpoint folder into qwentts.cpp's two GGUF files.

``convert(checkpoint, out_dir, quant)`` writes

* ``qwen-talker-{size}-{type}-{quant}.gguf``: the talker LM, the code predictor, the speaker
  encoder (Base), the text tokenizer (byte-level BPE vocabulary and merges) and the model's
  special ids, languages and speakers as metadata;
* ``qwen-tokenizer-12hz-{quant}.gguf``: the speech tokenizer (codec decoder and encoder).

These are the file names of the published GGUF repository, so a folder written here can be
used where downloaded files would be. Quantizations: ``F32`` (exact: for comparisons with
the PyTorch model), ``BF16``, ``Q8_0`` (the default: 8-bit blocks of 32 with one scale) and
``Q4_0`` (4-bit blocks of 32 with one scale, for the talker's and the code predictor's layer
matrices only: the generation reads every such weight once a frame, so they set its memory
traffic; embeddings, output heads and the codec stay ``Q8_0``, and the codec file is the
``Q8_0`` one, shared with that format's models).
Only matrices are quantized; norms, biases, the speaker encoder, convolutions, codebooks and
SnakeBeta parameters stay float32, because qwentts.cpp reads those as float32 on the host or
converts them itself at load. A matrix whose rows are not a multiple of 32 values (tiny test
checkpoints) is stored F16 under Q8_0.

Written from the GGUF format's description (``gguf`` package from PyPI) and qwentts.cpp's
loaders; see ``names`` for where each name comes from.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .names import CODEBOOK_EPSILON, CODEBOOKS, CODEC_RULES, TALKER_RULES, gguf_name, is_codebook_part

_LOGGER = logging.getLogger(__name__)

#: Quantizations the converter writes (Q4_K_M exists only as a download: gguf-py cannot make it).
QUANTS = ("F32", "BF16", "Q8_0", "Q4_0")
#: The codec file's quantization for each talker quantization (Q4_0 is for generation only).
CODEC_QUANT = {"Q4_0": "Q8_0"}
ARCH = "qwen3-tts"
_SIZES = {"0b6": "0.6b", "1b7": "1.7b"}
_TYPES = {"base": "base", "custom_voice": "customvoice", "voice_design": "voicedesign"}


class ConversionError(ValueError):
    """The folder is not a Qwen3-TTS checkpoint this converter knows."""


#: Talker widths of the released sizes: a checkpoint of another width (a random test
#: checkpoint, whose ``tts_model_size`` says "1b7" for the packages' sake) is named by its width.
_WIDTHS = {1024: "0.6b", 2048: "1.7b"}


def output_names(config: dict[str, Any], quant: str) -> tuple[str, str]:
    """(talker file name, codec file name) for a checkpoint's ``config.json`` dict: the
    published names for the released sizes, ``qwen-talker-h{width}-...`` for any other width."""
    size = _SIZES.get(str(config.get("tts_model_size")), str(config.get("tts_model_size")))
    width = config.get("talker_config", {}).get("hidden_size")
    if width is not None:
        size = _WIDTHS.get(int(width), f"h{width}")
    kind = _TYPES.get(str(config.get("tts_model_type")), str(config.get("tts_model_type")))
    return f"qwen-talker-{size}-{kind}-{quant}.gguf", f"qwen-tokenizer-12hz-{CODEC_QUANT.get(quant, quant)}.gguf"


def _tensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 array) of every tensor in a safetensors file, one at a time."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        for name in f.keys():
            yield name, f.get_tensor(name).to(torch.float32).numpy()


def _store(writer: Any, name: str, data: np.ndarray, quant: str, quantize: bool) -> None:
    """Add ``data`` (float32, PyTorch layout) as ``name``: quantized if ``quantize`` and it is a matrix."""
    import gguf

    kind = gguf.GGMLQuantizationType
    if quant == "F32" or not quantize or data.ndim != 2:
        writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    elif quant == "BF16":
        writer.add_tensor(name, gguf.quants.quantize(data, kind.BF16), raw_dtype=kind.BF16)
    elif data.shape[-1] % 32 == 0:
        q = kind.Q4_0 if quant == "Q4_0" and _layer_matrix(name) else kind.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(data, q), raw_dtype=q)
    else:
        writer.add_tensor(name, data.astype(np.float16))


def _layer_matrix(name: str) -> bool:
    """A transformer layer's matrix of the talker or the code predictor (``Q4_0``'s share)."""
    return bool(re.match(r"^(talker|code_pred)\.blk\.\d+\.(attn_[qkv]|attn_output|ffn_up|ffn_down|ffn_gate)\.weight$", name))


def _talker_quantized(name: str) -> bool:
    """Talker matrices that may be quantized: every Linear and embedding, not the speaker encoder."""
    return not name.startswith("spk_enc.")


def _codec_quantized(name: str) -> bool:
    """Codec matrices that may be quantized: the transformers' and ConvNeXt's Linears only
    (codebooks are gathered and, on the encoder side, read back as float32 on the host)."""
    linear = re.search(r"\.(attn_[qkv]|attn_output|ffn_up|ffn_down|ffn_gate|pwconv[12]|input_proj|output_proj)\.weight$", name)
    return bool(linear) and not name.startswith(("tok_enc.vq_", "tok_dec.vq_"))


def _token_list(folder: Path) -> tuple[list[str], list[str]]:
    """(tokens by id, merges as "a b") from ``vocab.json``, ``tokenizer_config.json`` and
    ``merges.txt``. Ids without a token get unique ``<|unused_N|>`` placeholders, so the
    list index is the id.

    Raises:
        ConversionError: the tokenizer files are missing.
    """
    try:
        vocab: dict[str, int] = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        merges_text = (folder / "merges.txt").read_text(encoding="utf-8")
    except OSError as err:
        raise ConversionError(f"{folder} has no text tokenizer (vocab.json, merges.txt): {err}") from err
    by_id = {int(i): t for t, i in vocab.items()}
    config_path = folder / "tokenizer_config.json"
    if config_path.exists():
        added = json.loads(config_path.read_text(encoding="utf-8")).get("added_tokens_decoder", {})
        by_id.update({int(i): entry["content"] for i, entry in added.items()})
    tokens = [by_id.get(i, f"<|unused_{i}|>") for i in range(max(by_id) + 1)]
    merges = [line for line in merges_text.splitlines() if line and not line.startswith("#version")]
    return tokens, merges


def _talker_metadata(writer: Any, config: dict[str, Any], generation: dict[str, Any]) -> None:
    """The ``qwen3-tts.*``, ``generation.*`` keys qwentts.cpp reads from the talker file."""
    t = config["talker_config"]
    p = t["code_predictor_config"]
    u32 = writer.add_uint32
    f32 = writer.add_float32
    writer.add_string(f"{ARCH}.tokenizer_type", str(config.get("tokenizer_type", "qwen3_tts_tokenizer_12hz")))
    writer.add_string(f"{ARCH}.model_size", str(config.get("tts_model_size", "")))
    writer.add_string(f"{ARCH}.model_type", str(config["tts_model_type"]))
    u32(f"{ARCH}.num_code_groups", int(t["num_code_groups"]))
    for prefix, c in (("talker", t), ("code_pred", p)):
        u32(f"{ARCH}.{prefix}.embedding_length", int(c["hidden_size"]))
        u32(f"{ARCH}.{prefix}.feed_forward_length", int(c["intermediate_size"]))
        u32(f"{ARCH}.{prefix}.block_count", int(c["num_hidden_layers"]))
        u32(f"{ARCH}.{prefix}.attention.head_count", int(c["num_attention_heads"]))
        u32(f"{ARCH}.{prefix}.attention.head_count_kv", int(c["num_key_value_heads"]))
        u32(f"{ARCH}.{prefix}.attention.key_length", int(c["head_dim"]))
        u32(f"{ARCH}.{prefix}.vocab_size", int(c["vocab_size"]))
        f32(f"{ARCH}.{prefix}.rope.freq_base", float(c.get("rope_theta", 1e6)))
        f32(f"{ARCH}.{prefix}.attention.layer_norm_rms_epsilon", float(c.get("rms_norm_eps", 1e-6)))
    rope = t.get("rope_scaling") or {}
    writer.add_array(f"{ARCH}.talker.rope.mrope_section", [int(x) for x in rope.get("mrope_section", [])])
    writer.add_bool(f"{ARCH}.talker.rope.mrope_interleaved", bool(rope.get("interleaved", False)))
    for key, name in (
        ("codec_pad_id", "pad_id"), ("codec_bos_id", "bos_id"), ("codec_eos_token_id", "eos_id"),
        ("codec_think_id", "think_id"), ("codec_nothink_id", "nothink_id"),
        ("codec_think_bos_id", "think_bos_id"), ("codec_think_eos_id", "think_eos_id"),
    ):
        u32(f"{ARCH}.codec.{name}", int(t[key]))
    languages = t.get("codec_language_id") or {}
    writer.add_array(f"{ARCH}.codec.language_names", list(languages))
    writer.add_array(f"{ARCH}.codec.language_ids", [int(v) for v in languages.values()])
    speakers = t.get("spk_id") or {}
    if speakers:
        dialects = t.get("spk_is_dialect") or {}
        writer.add_array(f"{ARCH}.codec.speaker_names", list(speakers))
        writer.add_array(f"{ARCH}.codec.speaker_ids", [int(v) for v in speakers.values()])
        writer.add_array(f"{ARCH}.codec.speaker_dialects", [dialects.get(n) or "" for n in speakers])
    for key, name in (
        ("im_start_token_id", "im_start_id"), ("im_end_token_id", "im_end_id"),
        ("tts_pad_token_id", "tts_pad_id"), ("tts_bos_token_id", "tts_bos_id"), ("tts_eos_token_id", "tts_eos_id"),
    ):
        u32(f"{ARCH}.text.{name}", int(config[key]))
    spk = config.get("speaker_encoder_config") or {}
    u32(f"{ARCH}.spk_enc.embedding_length", int(spk.get("enc_dim", t["hidden_size"])))
    u32(f"{ARCH}.spk_enc.sample_rate", int(spk.get("sample_rate", 24000)))
    g = generation
    writer.add_bool("generation.do_sample", bool(g.get("do_sample", True)))
    u32("generation.top_k", int(g.get("top_k", 50)))
    f32("generation.top_p", float(g.get("top_p", 1.0)))
    f32("generation.temperature", float(g.get("temperature", 0.9)))
    f32("generation.repetition_penalty", float(g.get("repetition_penalty", 1.05)))
    writer.add_bool("generation.subtalker_do_sample", bool(g.get("subtalker_dosample", True)))
    u32("generation.subtalker_top_k", int(g.get("subtalker_top_k", 50)))
    f32("generation.subtalker_top_p", float(g.get("subtalker_top_p", 1.0)))
    f32("generation.subtalker_temperature", float(g.get("subtalker_temperature", 0.9)))
    u32("generation.max_new_tokens", int(g.get("max_new_tokens", 8192)))


def _codec_metadata(writer: Any, config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> None:
    """The ``qwen3-tts-tokenizer.*`` keys qwentts.cpp reads from the codec file."""
    d = config["decoder_config"]
    e = config["encoder_config"]
    u32 = writer.add_uint32
    f32 = writer.add_float32
    pre = "qwen3-tts-tokenizer.decoder"
    for key in ("codebook_size", "head_dim", "hidden_size", "intermediate_size", "latent_dim",
                "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "num_quantizers",
                "num_semantic_quantizers", "sliding_window"):
        u32(f"{pre}.{key}", int(d[key]))
    f32(f"{pre}.rms_norm_eps", float(d["rms_norm_eps"]))
    f32(f"{pre}.rope_theta", float(d["rope_theta"]))
    u32(f"{pre}.codebook_dim_internal", shapes["tok_dec.vq_first.0.codebook"][1])
    u32(f"{pre}.vector_quantization_hidden_dim", shapes["tok_dec.vq_first.output_proj.weight"][0])
    pre = "qwen3-tts-tokenizer.encoder"
    for key in ("codebook_size", "compress", "head_dim", "hidden_size", "intermediate_size", "kernel_size",
                "last_kernel_size", "num_attention_heads", "num_filters", "num_hidden_layers",
                "num_key_value_heads", "residual_kernel_size"):
        u32(f"{pre}.{key}", int(e[key]))
    f32(f"{pre}.norm_eps", float(e["norm_eps"]))
    f32(f"{pre}.rope_theta", float(e["rope_theta"]))
    writer.add_array(f"{pre}.upsampling_ratios", [int(x) for x in e["upsampling_ratios"]])
    u32(f"{pre}.vector_quantization_hidden_dim", shapes["tok_enc.vq_semantic.0.codebook"][1])


def _write_codec(folder: Path, path: Path, quant: str) -> None:
    import gguf

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    tensors = dict(_tensors(folder / "model.safetensors"))
    writer = gguf.GGUFWriter(str(path), "qwen3-tts-tokenizer")
    writer.add_string("general.name", "Qwen3-TTS-Tokenizer-12Hz")
    shapes: dict[str, tuple[int, ...]] = {}
    for hf_name, data in tensors.items():
        for pattern, usage_suffix, target in CODEBOOKS:
            if pattern.match(hf_name):
                usage = tensors[hf_name[: -len(usage_suffix)] + "cluster_usage"]
                book = pattern.sub(target, hf_name)
                codebook = data / np.maximum(usage, CODEBOOK_EPSILON)[:, None]
                shapes[book] = codebook.shape
                _store(writer, book, codebook, quant, quantize=False)
        if is_codebook_part(hf_name):
            continue
        name = gguf_name(CODEC_RULES, hf_name)
        if name is None:
            continue
        shapes[name] = data.shape
        _store(writer, name, data, quant, _codec_quantized(name))
    _codec_metadata(writer, config, shapes)
    _finish(writer)


def _write_talker(folder: Path, path: Path, quant: str) -> None:
    import gguf

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    generation_path = folder / "generation_config.json"
    generation = json.loads(generation_path.read_text(encoding="utf-8")) if generation_path.exists() else {}
    tokens, merges = _token_list(folder)
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_string("general.name", f"Qwen3-TTS-12Hz-{config.get('tts_model_size')}-{config['tts_model_type']}")
    _talker_metadata(writer, config, generation)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{folder} has no *.safetensors")
    for file in files:
        for hf_name, data in _tensors(file):
            name = gguf_name(TALKER_RULES, hf_name)
            if name is not None:
                _store(writer, name, data, quant, _talker_quantized(name))
    _finish(writer)


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def convert(checkpoint: Path, out_dir: Path, quant: str = "Q8_0") -> tuple[Path, Path]:
    """Write the talker and codec GGUF files of ``checkpoint`` into ``out_dir``.

    Args:
        checkpoint: a Qwen3-TTS checkpoint folder (``config.json``, ``*.safetensors``,
            the text tokenizer, ``speech_tokenizer/``).
        out_dir: created if missing; existing files of the same names are replaced.
        quant: one of ``QUANTS``.

    Returns:
        (talker path, codec path).

    Raises:
        ConversionError: not a Qwen3-TTS checkpoint, or an unknown ``quant``.
        KeyError: a tensor of a layout this converter does not know.
    """
    quant = quant.upper()
    if quant not in QUANTS:
        raise ConversionError(f"unknown quantization {quant!r}; one of {', '.join(QUANTS)}")
    try:
        config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConversionError(f"{checkpoint} is not a checkpoint folder: {err}") from err
    if config.get("model_type") != "qwen3_tts" or not (checkpoint / "speech_tokenizer").is_dir():
        raise ConversionError(f"{checkpoint} is not a Qwen3-TTS checkpoint (model_type {config.get('model_type')!r})")
    out_dir.mkdir(parents=True, exist_ok=True)
    talker_name, codec_name = output_names(config, quant)
    talker, codec = out_dir / talker_name, out_dir / codec_name
    _LOGGER.info("Writing %s", talker)
    _write_talker(checkpoint, talker, quant)
    _LOGGER.info("Writing %s", codec)
    _write_codec(checkpoint / "speech_tokenizer", codec, CODEC_QUANT.get(quant, quant))
    return talker, codec
