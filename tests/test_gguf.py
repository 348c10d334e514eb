"""Our GGUF converter: names, types and metadata that qwentts.cpp reads, on tiny checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wyoming_qwen3tts.gguf import ConversionError, convert, output_names


def _fields(path: Path) -> tuple[dict, dict]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    return reader.fields, tensors


def _text(fields: dict, key: str) -> str:
    field = fields[key]
    return bytes(field.parts[field.data[0]]).decode()


def test_converts_every_tensor_with_the_library_names(checkpoints: Path, tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType as T

    talker, codec = convert(checkpoints / "custom_voice", tmp_path, "Q8_0")
    # a test checkpoint's talker is named by its width, not by the "1b7" its config carries
    width = json.loads((checkpoints / "custom_voice" / "config.json").read_text())["talker_config"]["hidden_size"]
    assert talker.name == f"qwen-talker-h{width}-customvoice-Q8_0.gguf" and codec.name == "qwen-tokenizer-12hz-Q8_0.gguf"
    assert output_names({"tts_model_size": "1b7", "talker_config": {"hidden_size": 1024}, "tts_model_type": "base"}, "Q8_0")[0] == "qwen-talker-0.6b-base-Q8_0.gguf"
    assert output_names({"tts_model_size": "0b6", "talker_config": {"hidden_size": 2048}, "tts_model_type": "base"}, "Q4_0") == (
        "qwen-talker-1.7b-base-Q4_0.gguf", "qwen-tokenizer-12hz-Q8_0.gguf")  # Q4_0: 4-bit generation, the Q8_0 codec
    fields, tensors = _fields(talker)
    assert _text(fields, "general.architecture") == "qwen3-tts"
    assert _text(fields, "qwen3-tts.model_type") == "custom_voice"
    for key in ("qwen3-tts.talker.block_count", "qwen3-tts.code_pred.vocab_size", "qwen3-tts.codec.eos_id",
                "qwen3-tts.text.tts_pad_id", "qwen3-tts.codec.speaker_names", "qwen3-tts.codec.language_ids",
                "tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert key in fields, key
    assert int(fields["qwen3-tts.codec.eos_id"].parts[-1][0]) == 2150
    for name in ("talker.codec_embd.weight", "talker.text_embd.weight", "talker.blk.1.attn_q.weight",
                 "code_pred.codec_embd.14.weight", "code_pred.lm_head.0.weight", "code_pred.mtp_proj.weight",
                 "talker.output_norm.weight"):
        assert name in tensors, name
    assert tensors["talker.codec_head.weight"].tensor_type == T.Q8_0  # rows of 32: quantized
    assert tensors["talker.text_embd.weight"].tensor_type == T.F16  # rows of 16 (tiny): F16
    assert tensors["talker.output_norm.weight"].tensor_type == T.F32
    fields, tensors = _fields(codec)
    for name in ("tok_dec.vq_first.0.codebook", "tok_dec.vq_rest.14.codebook", "tok_dec.pre_tfm.blk.0.attn_scale",
                 "tok_dec.dec.1.snake.alpha", "tok_dec.dec.4.res.2.conv1.weight", "tok_dec.dec.6.conv.weight",
                 "tok_dec.upsample.1.gamma", "tok_enc.conv.14.weight", "tok_enc.res.10.blk.3.bias",
                 "tok_enc.vq_acoustic.0.codebook", "tok_enc.blk.0.ffn_up.weight", "tok_enc.downsample.weight"):
        assert name in tensors, name
    assert "qwen3-tts-tokenizer.decoder.codebook_dim_internal" in fields
    assert list(tensors["tok_dec.dec.1.conv_t.weight"].shape) == [16, 32, 64]  # ggml order of [64, 32, 16]


def test_a_codebook_is_its_sum_over_its_usage(checkpoints: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    _, codec = convert(checkpoints / "base", tmp_path, "F32")
    _, tensors = _fields(codec)
    raw = load_file(str(checkpoints / "base" / "speech_tokenizer" / "model.safetensors"))
    prefix = "decoder.quantizer.rvq_rest.vq.layers.3._codebook."
    want = raw[prefix + "embedding_sum"] / np.maximum(raw[prefix + "cluster_usage"], 1e-5)[:, None]
    np.testing.assert_allclose(np.asarray(tensors["tok_dec.vq_rest.3.codebook"].data), want, rtol=1e-6)


def test_the_command_line_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="not a checkpoint folder"):
        convert(tmp_path, tmp_path / "out")
    result = subprocess.run(
        [sys.executable, "-m", "wyoming_qwen3tts.gguf", str(tmp_path), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "is not a checkpoint folder" in result.stderr


def test_the_command_line_refuses_a_checkpoint_whose_codec_qwentts_cpp_cannot_run(checkpoints: Path, tmp_path: Path) -> None:
    """The tiny test checkpoint (a codec narrower than the released one) was converted without
    complaint, and the server then refused the files ("this checkpoint needs --engine
    reference"). The command line now refuses it first, saying why, and writes nothing."""
    result = subprocess.run(
        [sys.executable, "-m", "wyoming_qwen3tts.gguf", str(checkpoints / "base"), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "qwentts.cpp runs only the released widths" in result.stderr and "--engine reference" in result.stderr
    assert "would not run" in result.stderr and not (tmp_path / "out").exists()


def test_the_server_side_conversion_reports_the_converters_error(tmp_path: Path) -> None:
    """``resolve_gguf`` converts in a child process; its refusal comes back as one clear line."""
    import json

    from wyoming_qwen3tts.engine.cpu.gguf_files import resolve_gguf

    folder = tmp_path / "not-tts"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ValueError, match="converting .* to GGUF failed: error: .* is not a Qwen3-TTS checkpoint"):
        resolve_gguf(str(folder), tmp_path / "models", "Q8_0", local_files_only=True)
    assert not list((tmp_path / "models").rglob(".complete"))  # nothing cached as done
