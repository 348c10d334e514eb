"""Build randomly initialised Qwen3-TTS checkpoints offline.

The real Qwen3-TTS weights cannot be downloaded on the machines this project is developed
and tested on, so tests and benchmarks run the packages' REAL loading and generation code
(``qwen_tts.Qwen3TTSModel.from_pretrained(dir)``, ``faster_qwen3_tts.FasterQwen3TTS
.from_pretrained(dir)``) on checkpoint folders built here: the same files, config layout,
tensor names, vocabulary sizes, special token ids, speakers and languages as the released
``Qwen/Qwen3-TTS-12Hz-1.7B-{Base,VoiceDesign,CustomVoice}`` repositories, with random
weights. They "speak" noise: about 0.1 RMS, 24 kHz, 1920 samples per codec frame.

Two sizes:

* ``tiny``: small widths and few layers (12 MB a folder), but the real vocabularies (talker
  3072, code predictor 2048, text 151936), 16 code groups and special ids, so the packages'
  token suppression, prompt slicing and codec framing behave as with the real model. It
  builds, loads and generates a few frames on a CPU in about a second (with one torch
  thread; importing qwen_tts takes longer than that).
* ``full``: the real 1.7B architecture (1,928,677,440 parameters for Base, 1,916,676,352 for
  VoiceDesign/CustomVoice; codec 170,557,441), bf16, 4.3 GB on disk; about 35 s and 6.4 GB
  of RAM to build. For GPU benchmarks.

Command line::

    python -m wyoming_qwen3tts.testing.checkpoint OUT --type base --size tiny
    python -m wyoming_qwen3tts.testing.checkpoint --size tiny --all DIR
    # --all writes DIR/base, DIR/voice_design and DIR/custom_voice

A folder that already holds a complete checkpoint of the same type, size and seed (its
marker file, written last, says so) is left as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import functools
import hashlib
import json
import math
import sys
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# torch, safetensors and qwen_tts are imported inside the functions that need them, so
# importing this module (e.g. for its constants) stays cheap.

# ---------------------------------------------------------------------------------------
# Facts of the released checkpoints (qwen-tts-hf 0.1.1.post1, Qwen3-TTS-12Hz-1.7B-*).
# ---------------------------------------------------------------------------------------

MODEL_TYPES: tuple[str, ...] = ("base", "voice_design", "custom_voice")
SIZES: tuple[str, ...] = ("tiny", "full", "0.6b", "full-0.6b", "ggml")

SAMPLE_RATE = 24_000  #: Hz, codec input and output
SAMPLES_PER_FRAME = 1920  #: audio samples per codec frame (12.5 frames per second, 80 ms)
NUM_CODE_GROUPS = 16  #: codebooks per frame (1 from the talker + 15 from the code predictor)

TALKER_VOCAB_SIZE = 3072  #: codec ids 0..2047, control ids and speaker ids above
PREDICTOR_VOCAB_SIZE = 2048
CODEBOOK_SIZE = 2048
TEXT_VOCAB_SIZE = 151_936

#: Talker control ids (``talker_config`` keys -> id).
CODEC_IDS: dict[str, int] = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}

#: ``codec_language_id`` of every released model.
LANGUAGE_IDS: dict[str, int] = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
}
#: Dialect "languages" that only CustomVoice has (used for the dialect speakers).
DIALECT_IDS: dict[str, int] = {"beijing_dialect": 2074, "sichuan_dialect": 2062}

#: CustomVoice speakers: name -> (talker codec id, dialect language name or False).
SPEAKERS: dict[str, tuple[int, str | bool]] = {
    "serena": (3066, False),
    "vivian": (3065, False),
    "uncle_fu": (3010, False),
    "ryan": (3061, False),
    "aiden": (2861, False),
    "ono_anna": (2873, False),
    "sohee": (2864, False),
    "eric": (2875, "sichuan_dialect"),
    "dylan": (2878, "beijing_dialect"),
}

#: Special text tokens of the Qwen3-TTS text tokenizer, at their real ids.
SPECIAL_TEXT_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|fim_prefix|>": 151659,
    "<|fim_middle|>": 151660,
    "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663,
    "<|file_sep|>": 151664,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
    "<tts_pad>": 151671,
    "<tts_text_bos>": 151672,
    "<tts_text_eod>": 151673,
    "<tts_text_bos_single>": 151674,
    "<|audio_pad|>": 151675,
}
#: Tokens of the chat template that are words rather than special tokens (real Qwen ids).
#: The packages slice prompts by position (``[:3]``, ``[3:-5]``), so ``assistant`` and
#: ``"\n"`` must each be exactly one token.
WORD_TOKENS: dict[str, int] = {"user": 872, "system": 8948, "assistant": 77091}

#: The released ``generation_config.json``.
GENERATION_CONFIG: dict[str, Any] = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.9,
    "top_p": 1.0,
    "top_k": 50,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_p": 1.0,
    "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}

#: Decoded audio of random codes is scaled to this RMS (full scale 1.0).
TARGET_RMS = 0.1

#: Names this builder in config.json (``random_init``), whatever ``__name__`` is.
BUILDER = "wyoming_qwen3tts.testing.checkpoint"
#: Written last: its presence means the folder holds a complete checkpoint.
MARKER_NAME = ".random-checkpoint.json"
_BUILDER_VERSION = 2


@dataclass(frozen=True)
class Arch:
    """Widths and depths of one checkpoint size (everything else is fixed by the release)."""

    talker_hidden: int
    talker_intermediate: int
    talker_layers: int
    talker_heads: int
    talker_kv_heads: int
    talker_head_dim: int
    mrope_section: tuple[int, int, int]  # sums to talker_head_dim // 2
    text_hidden: int
    predictor_hidden: int
    predictor_intermediate: int
    predictor_layers: int
    predictor_heads: int
    predictor_kv_heads: int
    predictor_head_dim: int
    speaker_channels: tuple[int, ...]  # ECAPA-TDNN; last = 3 * the middle ones
    speaker_attention_channels: int
    speaker_se_channels: int
    codec_encoder: dict[str, Any] = field(default_factory=dict)  # MimiConfig keys
    codec_decoder: dict[str, Any] = field(default_factory=dict)  # decoder_config keys


FULL = Arch(
    talker_hidden=2048,
    talker_intermediate=6144,
    talker_layers=28,
    talker_heads=16,
    talker_kv_heads=8,
    talker_head_dim=128,
    mrope_section=(24, 20, 20),
    text_hidden=2048,
    predictor_hidden=1024,
    predictor_intermediate=3072,
    predictor_layers=5,
    predictor_heads=16,
    predictor_kv_heads=8,
    predictor_head_dim=128,
    speaker_channels=(512, 512, 512, 512, 1536),
    speaker_attention_channels=128,
    speaker_se_channels=128,
    codec_encoder={
        "hidden_size": 512,
        "num_filters": 64,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 2048,
        "codebook_dim": 256,
        "vector_quantization_hidden_dimension": 256,
        "num_quantizers": 32,
        "upsample_groups": 512,
    },
    codec_decoder={
        "latent_dim": 1024,
        "codebook_dim": 512,
        "vector_quantization_hidden_dimension": 512,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 64,
        "decoder_dim": 1536,
    },
)

TINY = Arch(
    talker_hidden=32,
    talker_intermediate=64,
    talker_layers=2,
    talker_heads=2,
    talker_kv_heads=1,
    talker_head_dim=16,
    mrope_section=(4, 2, 2),
    text_hidden=16,
    predictor_hidden=16,  # != talker_hidden, so small_to_mtp_projection exists as in 1.7B
    predictor_intermediate=32,
    predictor_layers=1,
    predictor_heads=2,
    predictor_kv_heads=1,
    predictor_head_dim=8,
    speaker_channels=(16, 16, 16, 16, 48),
    speaker_attention_channels=8,
    speaker_se_channels=8,
    codec_encoder={
        "hidden_size": 32,
        "num_filters": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 64,
        "codebook_dim": 8,
        "vector_quantization_hidden_dimension": 8,
        "num_quantizers": 16,
        "upsample_groups": 32,
    },
    codec_decoder={
        "latent_dim": 32,
        "codebook_dim": 16,
        "vector_quantization_hidden_dimension": 16,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "decoder_dim": 64,
    },
)

#: The real 0.6B architecture (talker 1024 wide, no small_to_mtp projection), for the CPU and memory benchmarks.
SMALL = replace(
    FULL,
    talker_hidden=1024,
    talker_intermediate=3072,
    text_hidden=2048,
)

#: The tiny talker with a speaker encoder and codec of the widths qwentts.cpp (the GGML
#: engine) hard-codes (ECAPA 512/1536 channels; codec latent 1024, RVQ hidden 512, DAC
#: 1536..96), their transformers cut to one small layer: the smallest checkpoint the native
#: library can run (about 100M codec parameters; tiny's codec trips its shape asserts).
GGML = replace(
    TINY,
    speaker_channels=FULL.speaker_channels,
    speaker_attention_channels=FULL.speaker_attention_channels,
    speaker_se_channels=FULL.speaker_se_channels,
    codec_encoder={**FULL.codec_encoder, "num_hidden_layers": 1, "num_quantizers": 16},
    codec_decoder={
        **FULL.codec_decoder,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
    },
)

#: "full-0.6b" is the same 0.6B build under the name the memory benchmark uses.
ARCHS: dict[str, Arch] = {"tiny": TINY, "full": FULL, "0.6b": SMALL, "full-0.6b": SMALL, "ggml": GGML}


# ---------------------------------------------------------------------------------------
# config files
# ---------------------------------------------------------------------------------------


def _check(model_type: str, size: str) -> Arch:
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, not {model_type!r}")
    if size not in ARCHS:
        raise ValueError(f"size must be one of {SIZES}, not {size!r}")
    return ARCHS[size]


def tts_config(model_type: str, size: str, seed: int = 0) -> dict[str, Any]:
    """The checkpoint's ``config.json`` as a dict, in the released layout.

    Written by hand rather than through ``PretrainedConfig.to_dict``: transformers 5
    serialises ``rope_parameters``, but the talker reads ``rope_scaling["mrope_section"]``;
    and ``speaker_encoder_config`` may hold only its own nine keys (no ``**kwargs``).
    """
    a = _check(model_type, size)
    speakers = SPEAKERS if model_type == "custom_voice" else {}
    languages = dict(LANGUAGE_IDS)
    if model_type == "custom_voice":
        languages.update(DIALECT_IDS)
    predictor = {
        "vocab_size": PREDICTOR_VOCAB_SIZE,
        "hidden_size": a.predictor_hidden,
        "intermediate_size": a.predictor_intermediate,
        "num_hidden_layers": a.predictor_layers,
        "num_attention_heads": a.predictor_heads,
        "num_key_value_heads": a.predictor_kv_heads,
        "head_dim": a.predictor_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "tie_word_embeddings": False,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 28,
        "layer_types": ["full_attention"] * a.predictor_layers,
        "attention_dropout": 0.0,
        "num_code_groups": NUM_CODE_GROUPS,
    }
    talker = {
        "code_predictor_config": predictor,
        "vocab_size": TALKER_VOCAB_SIZE,
        "hidden_size": a.talker_hidden,
        "intermediate_size": a.talker_intermediate,
        "num_hidden_layers": a.talker_layers,
        "num_attention_heads": a.talker_heads,
        "num_key_value_heads": a.talker_kv_heads,
        "head_dim": a.talker_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "tie_word_embeddings": False,
        "rope_theta": 1000000,
        "rope_scaling": {
            "interleaved": True,
            "mrope_section": list(a.mrope_section),
            "rope_type": "default",
        },
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "num_code_groups": NUM_CODE_GROUPS,
        "text_hidden_size": a.text_hidden,
        "text_vocab_size": TEXT_VOCAB_SIZE,
        "position_id_per_seconds": 13,
        **CODEC_IDS,
        "spk_id": {name: spk for name, (spk, _) in speakers.items()},
        "spk_is_dialect": {name: dialect for name, (_, dialect) in speakers.items()},
        "codec_language_id": languages,
    }
    speaker_encoder = {
        "mel_dim": 128,
        "enc_dim": a.talker_hidden,  # the x-vector is fed to the talker as one input embedding
        "enc_channels": list(a.speaker_channels),
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": a.speaker_attention_channels,
        "enc_res2net_scale": 8,
        "enc_se_channels": a.speaker_se_channels,
        "sample_rate": SAMPLE_RATE,
    }
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        # "1b7" for both sizes: the packages test `tts_model_size in "0b6"` to drop
        # `instruct`, and tiny stands in for the 1.7B models' feature set.
        "tts_model_size": "0b6" if size == "0.6b" else "1b7",
        "tts_model_type": model_type,
        "im_start_token_id": SPECIAL_TEXT_TOKENS["<|im_start|>"],
        "im_end_token_id": SPECIAL_TEXT_TOKENS["<|im_end|>"],
        "tts_pad_token_id": SPECIAL_TEXT_TOKENS["<tts_pad>"],
        "tts_bos_token_id": SPECIAL_TEXT_TOKENS["<tts_text_bos>"],
        "tts_eos_token_id": SPECIAL_TEXT_TOKENS["<tts_text_eod>"],
        "assistant_token_id": WORD_TOKENS["assistant"],
        "dtype": "bfloat16",
        "speaker_encoder_config": speaker_encoder,
        "talker_config": talker,
        "random_init": {"size": size, "seed": seed, "builder": BUILDER},
    }


def speech_tokenizer_config(size: str) -> dict[str, Any]:
    """``speech_tokenizer/config.json`` (Qwen3-TTS-Tokenizer-12Hz) for ``size`` as a dict."""
    a = ARCHS[size]
    encoder = {
        "model_type": "mimi",
        "sampling_rate": SAMPLE_RATE,
        "frame_rate": 12.5,
        "audio_channels": 1,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": CODEBOOK_SIZE,
        "use_conv_shortcut": False,
        "num_semantic_quantizers": 1,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "norm_eps": 1e-5,
        "use_cache": False,
        "rope_theta": 10000.0,
        "sliding_window": 250,
        "attention_dropout": 0.0,
        "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
        **a.codec_encoder,
    }
    decoder = {
        "codebook_size": CODEBOOK_SIZE,
        "semantic_codebook_size": 4096,
        "num_quantizers": NUM_CODE_GROUPS,
        "num_semantic_quantizers": 1,
        "max_position_embeddings": 8000,
        "rope_theta": 10000,
        "attention_bias": False,
        "sliding_window": 72,
        "hidden_act": "silu",
        "layer_scale_initial_scale": 0.01,
        "rms_norm_eps": 1e-5,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "attention_dropout": 0.0,
        **a.codec_decoder,
    }
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": NUM_CODE_GROUPS,
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": SAMPLES_PER_FRAME,
        "encode_downsample_rate": SAMPLES_PER_FRAME,
        "dtype": "float32",
        "encoder_config": encoder,
        "decoder_config": decoder,
    }


FEATURE_EXTRACTOR_CONFIG: dict[str, Any] = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": SAMPLE_RATE,
}


# ---------------------------------------------------------------------------------------
# text tokenizer
# ---------------------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (printable bytes first, as in its vocab)."""
    order = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    order += list(range(ord("®"), ord("ÿ") + 1))
    chars = [chr(b) for b in order]
    unprintable = [b for b in range(256) if b not in order]
    for n, b in enumerate(unprintable):
        order.append(b)
        chars.append(chr(256 + n))
    return dict(zip(order, chars))


def text_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A small byte-level BPE vocabulary with the real special and chat-template ids.

    Returns:
        (vocab, merges): ``vocab`` maps token strings (GPT-2 byte alphabet) to ids < 151936:
        the 256 bytes at 0..255, the prefixes needed to merge ``user``/``system``/
        ``assistant`` into one token each, those words at their real ids, and every
        special token at its real id. ``merges`` are the BPE merge rules, in priority order.
        Any Unicode text tokenises (byte-level): German, Chinese, emoji.
    """
    vocab: dict[str, int] = {}
    for i, ch in enumerate(_bytes_to_unicode().values()):
        vocab[ch] = i
    merges: list[tuple[str, str]] = []
    next_id = 256
    for word, word_id in WORD_TOKENS.items():
        for end in range(2, len(word) + 1):
            left, right, whole = word[: end - 1], word[end - 1], word[:end]
            if (left, right) in merges:
                continue
            merges.append((left, right))
            if whole == word:
                vocab[whole] = word_id
            elif whole not in vocab:
                vocab[whole] = next_id
                next_id += 1
    vocab.update(SPECIAL_TEXT_TOKENS)
    return vocab, merges


def _tokenizer_config() -> dict[str, Any]:
    added = {
        str(i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tok, i in SPECIAL_TEXT_TOKENS.items()
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_text_tokenizer(out_dir: Path) -> None:
    """Write ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` into ``out_dir``."""
    vocab, merges = text_vocab()
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (out_dir / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config())


# ---------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------


def _tts_model(config: dict[str, Any], device: str):
    """``Qwen3TTSForConditionalGeneration`` for a ``tts_config`` dict, built on ``device``."""
    import torch

    with contextlib.redirect_stdout(sys.stderr):  # qwen_tts prints a flash-attn notice
        from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    with torch.device(device):
        return Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**copy.deepcopy(config)))


def _codec_model(config: dict[str, Any], device: str):
    """``Qwen3TTSTokenizerV2Model`` for a ``speech_tokenizer_config`` dict, built on ``device``."""
    import torch

    with contextlib.redirect_stdout(sys.stderr):
        from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
            Qwen3TTSTokenizerV2Config,
        )
        from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
            Qwen3TTSTokenizerV2Model,
        )
    with torch.device(device):
        return Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**copy.deepcopy(config)))


def _counts(model) -> tuple[int, int]:
    sd = model.state_dict()
    return sum(t.numel() for t in sd.values()), len(sd)


def count_parameters(model_type: str, size: str) -> tuple[int, int]:
    """(parameter count, tensor count) of ``model.safetensors``; nothing is materialised
    (the model is constructed on the meta device)."""
    return _counts(_tts_model(tts_config(model_type, size), "meta"))


def count_codec_parameters(size: str) -> tuple[int, int]:
    """(parameter count, tensor count) of ``speech_tokenizer/model.safetensors``."""
    return _counts(_codec_model(speech_tokenizer_config(size), "meta"))


def _normal(shape, std: float, seed: int, name: str, dtype):  # -> torch.Tensor
    """N(0, std) of ``shape``, a pure function of (seed, name): independent of build order."""
    import torch

    g = torch.Generator(device="cpu")
    g.manual_seed(zlib.crc32(f"{seed}:{name}".encode()))  # CPU generators use 32 bits
    t = torch.empty(tuple(shape), dtype=torch.float32)
    t.normal_(0.0, std, generator=g)
    return t.to(dtype)


def tts_state_dict(config: dict[str, Any], seed: int, dtype=None) -> dict[str, Any]:
    """Random weights for ``Qwen3TTSForConditionalGeneration`` (talker, code predictor and,
    for Base, the speaker encoder).

    The model is built on the meta device (no memory), then each tensor of its state dict is
    drawn on its own: Linear and Embedding weights N(0, 0.02) (the HF initializer range),
    RMSNorm weights 1, biases 0, speaker-encoder convolutions He-normal (ReLU network).
    Peak memory is the result plus one float32 copy of the largest tensor.

    Args:
        config: ``tts_config(...)``.
        seed: tensors are a pure function of (seed, tensor name).
        dtype: torch dtype of the tensors; default bfloat16 (as released).

    Returns:
        name -> contiguous CPU tensor, exactly the keys and shapes of the released files.
    """
    import torch

    dtype = dtype or torch.bfloat16
    model = _tts_model(config, "meta")
    wanted = model.state_dict().keys()
    out: dict[str, Any] = {}
    for mod_name, module in model.named_modules():
        kind = type(module).__name__
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for p_name, p in own:
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            if name not in wanted:
                continue  # non-persistent buffer (rotary inv_freq)
            if p_name == "bias":
                t = torch.zeros(p.shape, dtype=dtype)
            elif kind in ("Linear", "Embedding"):
                t = _normal(p.shape, 0.02, seed, name, dtype)
            elif kind.endswith("RMSNorm"):
                t = torch.ones(p.shape, dtype=dtype)
            elif kind == "Conv1d":
                t = _normal(p.shape, math.sqrt(2.0 / p[0].numel()), seed, name, dtype)
            else:
                raise TypeError(f"no init rule for {name} ({kind})")
            out[name] = t
    missing = wanted - out.keys()
    if missing:
        raise RuntimeError(f"tensors without an init rule: {sorted(missing)[:5]}")
    # EOS gets logit 0 whatever the state: never among the top-50 of ~2000 random logits, so a
    # random model never ends a segment early (lengths in tests are exact; EOS handling is
    # tested by forcing it).
    out["talker.codec_head.weight"][CODEC_IDS["codec_eos_token_id"]] = 0
    return out


def codec_state_dict(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Random float32 weights for the 12 Hz speech tokenizer (Mimi encoder + Qwen decoder).

    The codec is small (170M parameters at full size), so it is built for real on the CPU.
    Convolutions and linear layers get fan-in scaled normal weights (a plain N(0, 0.02)
    decodes to near-silence), codebooks N(0, 1); the constants the constructors set
    (layer scales, Snake parameters, norm weights, codebook usage) are kept. Finally the
    decoder's last convolution is scaled so that random codes decode to RMS ``TARGET_RMS``.

    Returns:
        name -> contiguous float32 CPU tensor.
    """
    import torch
    from torch import nn

    model = _codec_model(config, "cpu").eval()
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            kind = type(module).__name__
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)):
                w = module.weight
                if isinstance(module, nn.ConvTranspose1d):
                    # each output sample sums in_channels * kernel / stride inputs
                    fan_in = w.shape[0] * w.shape[2] / module.stride[0]
                else:
                    fan_in = w[0].numel()
                std = 1.0 / math.sqrt(fan_in)
                w.copy_(_normal(w.shape, std, seed, f"{mod_name}.weight", w.dtype))
                if module.bias is not None:
                    module.bias.zero_()
            elif kind == "MimiEuclideanCodebook":
                e = module.embed_sum
                e.copy_(_normal(e.shape, 1.0, seed, f"{mod_name}.embed_sum", e.dtype))
                module._embed = None  # cached embed_sum / cluster_usage
            elif kind == "EuclideanCodebook":
                e = module.embedding_sum
                e.copy_(_normal(e.shape, 1.0, seed, f"{mod_name}.embedding_sum", e.dtype))
        _calibrate_decoder(model.decoder, seed)
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


@functools.lru_cache(maxsize=1)
def _codec_state_for(size: str, seed: int) -> dict[str, Any]:
    """``codec_state_dict`` of a size, kept for the next type of ``build_all``."""
    return codec_state_dict(speech_tokenizer_config(size), seed)


def _calibrate_decoder(decoder, seed: int, frames: int = 24) -> None:
    """Scale the decoder's final convolution so random codes decode to RMS ``TARGET_RMS``."""
    import torch

    last = decoder.decoder[-1].conv
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    codes = torch.randint(0, CODEBOOK_SIZE, (2, NUM_CODE_GROUPS, frames), generator=g)
    for _ in range(3):  # the clamp at +-1 makes it slightly nonlinear
        rms = decoder(codes).float().pow(2).mean().sqrt().item()
        if not math.isfinite(rms) or rms == 0.0:
            raise RuntimeError(f"random codec decodes to RMS {rms}")
        last.weight.mul_(TARGET_RMS / rms)
        if abs(rms / TARGET_RMS - 1.0) < 0.02:
            break


# ---------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _marker(model_type: str, size: str, seed: int) -> dict[str, Any]:
    """Marker contents; a changed config (or builder version) makes old folders stale."""
    configs = json.dumps([tts_config(model_type, size, seed), speech_tokenizer_config(size)])
    return {
        "type": model_type,
        "size": size,
        "seed": seed,
        "version": _BUILDER_VERSION,
        "config_sha256": hashlib.sha256(configs.encode()).hexdigest(),
    }


def is_complete(out_dir: Path, model_type: str, size: str, seed: int = 0) -> bool:
    """Whether ``out_dir`` already holds the finished checkpoint of this type, size and seed."""
    try:
        data = json.loads((Path(out_dir) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return data == _marker(model_type, size, seed)


def build_checkpoint(out_dir: Path, model_type: str, size: str, seed: int = 0) -> Path:
    """Write a random Qwen3-TTS checkpoint folder that the real loaders accept.

    Files: ``config.json``, ``generation_config.json``, ``model.safetensors`` (bf16),
    ``vocab.json``, ``merges.txt``, ``tokenizer_config.json``, ``preprocessor_config.json``,
    ``speech_tokenizer/{config.json, configuration.json, preprocessor_config.json,
    model.safetensors (float32)}``, and the marker ``.random-checkpoint.json`` last.

    Args:
        out_dir: folder to write (created if needed; existing files of the same names are
            replaced). Left untouched if it already holds this exact checkpoint.
        model_type: ``"base"`` (voice cloning, with speaker encoder), ``"voice_design"``
            (voice from an ``instruct`` text) or ``"custom_voice"`` (the nine speakers).
        size: ``"tiny"`` (12 MB, CPU) or ``"full"`` (the 1.7B architecture, 4.3 GB; about
            35 s and 6.4 GB of RAM to build).
        seed: the weights are a pure function of (seed, size, type).

    Returns:
        ``out_dir`` as a Path.
    """
    _check(model_type, size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".random-checkpoint.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes building the same folder wait
        if is_complete(out_dir, model_type, size, seed):
            return out_dir
        (out_dir / MARKER_NAME).unlink(missing_ok=True)
        with _torch_threads(1 if size in ("tiny", "ggml") else None):
            _write_checkpoint(out_dir, model_type, size, seed)
        _write_json(out_dir / MARKER_NAME, _marker(model_type, size, seed))
    return out_dir


@contextlib.contextmanager
def _torch_threads(n: int | None):
    """Run with ``n`` torch threads (None: unchanged). The tiny models' operations are too
    small for threads: on a 2-core VM two threads made a tiny build 15x slower."""
    import torch

    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _write_checkpoint(out_dir: Path, model_type: str, size: str, seed: int) -> None:
    """Write every file of the checkpoint but the marker."""
    import torch
    from safetensors.torch import save_file

    config = tts_config(model_type, size, seed)
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", GENERATION_CONFIG)
    _write_json(out_dir / "preprocessor_config.json", FEATURE_EXTRACTOR_CONFIG)
    write_text_tokenizer(out_dir)

    st_dir = out_dir / "speech_tokenizer"
    st_dir.mkdir(exist_ok=True)
    _write_json(st_dir / "config.json", speech_tokenizer_config(size))
    configuration = {"framework": "pytorch", "task": "feature-extraction"}
    _write_json(st_dir / "configuration.json", configuration)
    _write_json(st_dir / "preprocessor_config.json", FEATURE_EXTRACTOR_CONFIG)
    # The three types share one codec, as the released repositories do.
    save_file(_codec_state_for(size, seed), str(st_dir / "model.safetensors"), {"format": "pt"})

    with torch.inference_mode():
        tensors = tts_state_dict(config, seed)
    save_file(tensors, str(out_dir / "model.safetensors"), {"format": "pt"})
    del tensors
    for path in (out_dir / "model.safetensors", st_dir / "model.safetensors"):
        path.chmod(0o644)  # safetensors creates files readable by the owner only


def build_all(out_dir: Path, size: str, seed: int = 0) -> dict[str, Path]:
    """Build the three types into ``out_dir/base``, ``out_dir/voice_design`` and
    ``out_dir/custom_voice``.

    Returns:
        model type -> checkpoint folder.
    """
    try:
        return {t: build_checkpoint(Path(out_dir) / t, t, size, seed) for t in MODEL_TYPES}
    finally:
        _codec_state_for.cache_clear()


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_qwen3tts.testing.checkpoint",
        description="Build randomly initialised Qwen3-TTS checkpoints (offline, for tests).",
    )
    parser.add_argument("out", nargs="?", type=Path, help="checkpoint folder to write")
    parser.add_argument("--type", choices=MODEL_TYPES, dest="model_type", help="model type")
    parser.add_argument("--size", choices=SIZES, default="tiny", help="tiny: seconds to build, runs on the reference engine (default); ggml: the tiny talker with the codec widths qwentts.cpp needs, for the GGML engine (about 440 MB a type); 0.6b / full: the released 0.6B / 1.7B shapes (for benchmarks; 0.6b is the CPU's default size); full-0.6b: 0.6B shapes under a 1.7B name")
    parser.add_argument("--all", type=Path, metavar="DIR", help="write all three types under DIR")
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    parser.add_argument("--debug", action="store_true", help="show the dependencies' banners and warnings")
    args = parser.parse_args(argv)
    if not args.debug:  # qwen_tts's flash-attn and SoX banners, as the server hides them
        from ..common.quiet import quiet_dependencies

        quiet_dependencies()

    start = time.monotonic()
    if args.all is not None:
        if args.out is not None or args.model_type is not None:
            parser.error("--all DIR takes neither OUT nor --type")
        paths = list(build_all(args.all, args.size, args.seed).values())
    else:
        if args.out is None or args.model_type is None:
            parser.error("give OUT and --type, or --all DIR")
        paths = [build_checkpoint(args.out, args.model_type, args.size, args.seed)]
    for path in paths:
        print(path)
    print(f"done in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
