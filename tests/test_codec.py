"""The incremental codec decoder against the library's whole-sequence decode (tiny, float32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.engine.batched.codec import StreamingDecoder


@pytest.fixture(scope="module")
def decoder(checkpoints: Path) -> torch.nn.Module:
    from qwen_tts import Qwen3TTSModel

    torch.set_num_threads(1)
    qwen = Qwen3TTSModel.from_pretrained(str(checkpoints / "base"), device_map="cpu", dtype=torch.float32)
    return qwen.model.speech_tokenizer.model.decoder


@pytest.mark.parametrize("chunk", [1, 2, 5, 13, 100])
def test_incremental_equals_whole_at_every_boundary(decoder: torch.nn.Module, chunk: int) -> None:
    """Two streams decoded ``chunk`` frames at a time (past the 72-frame attention window)
    give the whole-sequence decode sample for sample: no click, gap or repeat at a boundary."""
    frames = 100
    codes = torch.randint(0, 2048, (2, 16, frames), generator=torch.Generator().manual_seed(chunk))
    with torch.inference_mode():
        whole = decoder(codes)[:, 0].numpy()
        streaming = StreamingDecoder(decoder, slots=3)
        parts = [streaming.step(codes[:, :, t : t + chunk]).numpy() for t in range(0, frames, chunk)]
    assert all(p.shape[-1] == min(chunk, frames - i * chunk) * 1920 for i, p in enumerate(parts))
    np.testing.assert_allclose(np.concatenate(parts, axis=-1), whole, atol=5e-5)


def test_a_first_chunk_longer_than_the_window_then_frame_by_frame_is_the_whole(decoder: torch.nn.Module) -> None:
    """A reference clip's codes decoded at once (80 frames, past the 72-frame window: its last
    72 keys fill the ring), then the stream frame by frame: the whole-sequence decode."""
    frames, first = 90, 80
    codes = torch.randint(0, 2048, (1, 16, frames), generator=torch.Generator().manual_seed(31))
    with torch.inference_mode():
        whole = decoder(codes)[:, 0].numpy()
        streaming = StreamingDecoder(decoder, slots=1)
        parts = [streaming.step(codes[:, :, :first]).numpy()]
        parts += [streaming.step(codes[:, :, t : t + 1]).numpy() for t in range(first, frames)]
    np.testing.assert_allclose(np.concatenate(parts, axis=-1), whole, atol=5e-5)


def test_rows_are_independent_and_movable(decoder: torch.nn.Module) -> None:
    """Each row continues its own past; a reset row starts afresh; a moved row carries on."""
    codes = torch.randint(0, 2048, (2, 16, 20), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        whole = decoder(codes)[:, 0].numpy()
        streaming = StreamingDecoder(decoder, slots=2)
        first = streaming.step(codes[:, :, :10]).numpy()
        streaming.move_row(1, 0)  # row 1's stream now lives in row 0
        streaming.reset(1)
        second = streaming.step(torch.stack([codes[1, :, 10:], codes[0, :, :10]])).numpy()
    np.testing.assert_allclose(np.concatenate([first[1], second[0]]), whole[1], atol=5e-5)
    np.testing.assert_allclose(second[1][: 10 * 1920], whole[0][: 10 * 1920], atol=5e-5)
