"""Audio facts shared by every module: the codec's sample rate and frame size, and PCM.

A leaf: it imports nothing of the project. Every Qwen3-TTS 12 Hz model speaks 24 kHz mono;
its codec (Qwen3-TTS-Tokenizer-12Hz) turns one codec frame of 16 codes into 1920 samples.
"""

from __future__ import annotations

import numpy as np

#: Output sample rate of every Qwen3-TTS 12 Hz model, in Hz.
SAMPLE_RATE = 24000
#: Samples per codec frame: the codec's total upsampling (8*5*4*3*2*2 = 1920), i.e. 80 ms.
SAMPLES_PER_FRAME = 1920
#: Codec frames per second of audio (24000 / 1920).
FRAMES_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_FRAME
#: Bytes per sample of the PCM every front door sends (signed 16-bit little-endian).
PCM_WIDTH = 2


def to_pcm16(chunk: np.ndarray) -> bytes:
    """float32 [n_samples] in [-1, 1] -> little-endian signed 16-bit PCM bytes (2 per sample).

    Values outside [-1, 1] are clipped.
    """
    return (np.clip(chunk, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
