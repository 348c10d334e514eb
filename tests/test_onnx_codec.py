"""The codec's streaming step on ONNX Runtime (``engine.cpu.onnx_codec`` / ``onnx_export``):
frame by frame it is the library's whole-sequence decode; the exported file is made once,
reused at later starts, and made again when it is unusable. The tiny checkpoints' codec,
exported once a session (``conftest.onnx_data_dir``)."""

from __future__ import annotations

import json
import logging
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.engine.cpu import onnx_export
from wyoming_qwen3tts.engine.cpu.onnx_codec import OnnxCodec
from wyoming_qwen3tts.engine.cpu.onnx_export import FOLDER, codec_identity, exported_codec, tokenizer_file

#: Largest sample difference allowed from the whole-sequence decode (float32 both; the
#: released 0.6B codec's export measured 6.5e-5, ``benchmarks/results/cpu-2core/limits.md``;
#: the tiny one about 1.5e-5).
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def decoder(checkpoints: Path) -> torch.nn.Module:
    from qwen_tts import Qwen3TTSModel

    torch.set_num_threads(1)
    qwen = Qwen3TTSModel.from_pretrained(str(checkpoints / "base"), device_map="cpu", dtype=torch.float32)
    return qwen.model.speech_tokenizer.model.decoder


@pytest.fixture(scope="module")
def exported(checkpoints: Path, onnx_data_dir: Path) -> Path:
    """The session's exported step (found again, not exported: no decoder is given)."""
    return exported_codec(checkpoints / "base", onnx_data_dir, _never_export)


def _never_export() -> torch.nn.Module:
    raise AssertionError("exported again")


def test_frame_by_frame_equals_the_whole_sequence_decode(decoder: torch.nn.Module, exported: Path) -> None:
    """100 frames (past the transformer's 72-frame window), each decoded alone with the
    stream's past carried between calls: the library's decode of all 100 at once."""
    frames = 100
    codes = torch.randint(0, 2048, (1, 16, frames), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        whole = decoder(codes)[0, 0].numpy()
    stream = OnnxCodec(exported, threads=1).stream()
    parts = [stream.decode(codes[0, :, t].numpy()) for t in range(frames)]
    assert all(p.dtype == np.float32 and p.shape == (1920,) for p in parts)
    streamed = np.concatenate(parts)
    assert stream.frames == frames and streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() < TOLERANCE < np.abs(whole).max()
    assert np.abs(streamed).max() <= 1.0


def test_a_saved_past_continues_in_another_stream(decoder: torch.nn.Module, exported: Path) -> None:
    """An ICL clone's reference frames decoded once, their past saved and restored into new
    streams: each continues as the whole sequence (reference + frames) decodes, and two
    streams from one saved past do not disturb each other."""
    codes = torch.randint(0, 2048, (1, 16, 30), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        whole = decoder(codes)[0, 0].numpy()
    codec = OnnxCodec(exported, threads=1)
    reference = codec.stream()
    for t in range(20):
        reference.decode(codes[0, :, t].numpy())
    saved = reference.save()
    first, second = codec.stream(), codec.stream()
    first.restore(saved)
    second.restore(saved)
    a = np.concatenate([first.decode(codes[0, :, t].numpy()) for t in range(20, 30)])
    b = np.concatenate([second.decode(codes[0, :, t].numpy()) for t in range(20, 30)])
    assert np.abs(a - whole[20 * 1920:]).max() < TOLERANCE
    assert np.array_equal(a, b) and first.frames == 30


def test_a_frame_is_sixteen_codes(exported: Path) -> None:
    with pytest.raises(ValueError, match="16 codes"):
        OnnxCodec(exported, threads=1).stream().decode(np.zeros(15, dtype=np.int64))


def test_a_second_start_reuses_the_file(checkpoints: Path, onnx_data_dir: Path, exported: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """Another load of any tiny model (they share one codec) finds the file: no export, the
    file untouched."""
    before = exported.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="wyoming_qwen3tts.engine.cpu.onnx_export"):
        for kind in ("base", "custom_voice", "voice_design"):
            assert exported_codec(checkpoints / kind, onnx_data_dir, _never_export) == exported
    assert exported.stat().st_mtime_ns == before and "Exporting" not in caplog.text


def test_an_unusable_file_is_exported_again_and_a_half_written_one_never_used(
    checkpoints: Path, exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The file cut short (a crash mid-copy) or garbage: the next start says so and exports
    again, then uses the new file. An export that dies midway leaves only its temporary file
    (removed), never the file a later start would take for whole. (The export is the
    session's file copied: ``test_frame_by_frame_equals_the_whole_sequence_decode`` checks
    the real exporter.)"""
    folder = tmp_path / FOLDER
    folder.mkdir(parents=True)
    target = folder / exported.name
    exports: list[Path] = []

    def export_step(decoder: object, out: Path, frames: int = 1) -> Path:
        exports.append(out)
        shutil.copyfile(exported, out)
        return out

    monkeypatch.setattr(onnx_export, "export_step", export_step)
    good = exported.read_bytes()
    for damage in (good[: len(good) // 2], b"not an onnx file"):
        target.write_bytes(damage)
        with caplog.at_level(logging.INFO, logger="wyoming_qwen3tts.engine.cpu.onnx_export"):
            assert exported_codec(checkpoints / "base", tmp_path, lambda: object()) == target
        assert "cannot be used" in caplog.text and "Exported the codec's streaming step in" in caplog.text
        assert target.read_bytes() == good and exports[-1] != target
        caplog.clear()

    def dies(decoder: object, out: Path, frames: int = 1) -> Path:
        out.write_bytes(good[:1000])  # half written, then the process is stopped
        raise KeyboardInterrupt

    target.unlink()
    monkeypatch.setattr(onnx_export, "export_step", dies)
    with pytest.raises(KeyboardInterrupt):
        exported_codec(checkpoints / "base", tmp_path, lambda: object())
    assert not target.exists() and not list(folder.glob("*.tmp"))
    # a process killed hard leaves its temporary file: the next export removes it, never uses it
    stale = folder / f".{target.stem}.dead.onnx.tmp"
    stale.write_bytes(good)
    monkeypatch.setattr(onnx_export, "export_step", export_step)
    assert exported_codec(checkpoints / "base", tmp_path, lambda: object()) == target
    assert not stale.exists() and exports[-1] != stale


def _flip_byte(weights: Path, out: Path, prefix: str) -> Path:
    """A copy of a safetensors file with one byte of its first tensor named ``prefix...`` changed."""
    data = bytearray(weights.read_bytes())
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    name = next(k for k in sorted(header) if k.startswith(prefix))
    data[8 + size + header[name]["data_offsets"][0]] ^= 0xFF
    out.write_bytes(data)
    return out


def test_the_identity_follows_the_decoders_weights_only(checkpoints: Path, tmp_path: Path) -> None:
    """A changed decoder weight gives another file name (a changed checkpoint exports
    again); the encoder's weights (not exported) and the file's place do not."""
    weights = tokenizer_file(checkpoints / "base")
    same = codec_identity(weights)
    assert codec_identity(shutil.copyfile(weights, tmp_path / "copy.safetensors")) == same
    assert codec_identity(_flip_byte(weights, tmp_path / "encoder.safetensors", "encoder.")) == same
    assert codec_identity(_flip_byte(weights, tmp_path / "decoder.safetensors", "decoder.")) != same
    with pytest.raises(FileNotFoundError, match="speech tokenizer"):
        tokenizer_file(tmp_path)
