"""Speech models: load a Qwen3-TTS checkpoint and stream PCM for one segment at a time.

Two back ends behind one interface (``SpeechModel.stream``):

* ``CudaGraphModel``: faster-qwen3-tts's CUDA-graph streaming generators. Each chunk of
  ``chunk_frames`` codec frames is decoded and yielded as soon as it is generated.
* ``ReferenceModel``: the ``qwen_tts`` reference implementation, for machines without
  CUDA. It has no streaming API, so a segment's audio arrives in one piece (slow).

Neither back end is thread-safe or re-entrant; ``scheduler.ModelWorker`` gives each model
exactly one generation at a time. This module knows nothing of Wyoming or HTTP.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .voices import ModelKind, Reference

_LOGGER = logging.getLogger(__name__)

#: Output sample rate of every Qwen3-TTS 12 Hz model, in Hz.
SAMPLE_RATE = 24000
#: Samples per codec frame (24000 Hz / 12.5 frames per second).
SAMPLES_PER_FRAME = 1920
#: Static KV-cache length of faster-qwen3-tts (its default): prompt + generated frames.
MAX_SEQ_LEN = 2048
#: Silence appended to an ICL reference so the prompt ends on silence, not on a phoneme
#: that would bleed into the first generated word (faster-qwen3-tts does the same), in s.
_REFERENCE_TAIL_SECONDS = 0.5
#: Speaker prompts kept in memory (each a few hundred KB at most).
_PROMPT_CACHE_SIZE = 64


class ModelMismatchError(ValueError):
    """The checkpoint's ``tts_model_type`` is not the kind it was loaded as."""


@dataclass(frozen=True)
class Segment:
    """One generation: a piece of text (a sentence or less) and how to voice it.

    Attributes:
        text: cleaned text, at most ``text.MAX_SEGMENT_SECONDS`` of speech.
        language: Qwen3-TTS language name ("english", ..., or "auto").
        max_new_tokens: cap on generated codec frames (80 ms each).
        min_new_tokens: frames generated before EOS is allowed (benchmarks fix the length
            by setting it to ``max_new_tokens``).
        seed: torch RNG seed set before this generation, or None.
        instruct: VoiceDesign description, or an optional style instruction for CustomVoice.
        speaker: CustomVoice speaker id.
        reference: clone reference for the Base model.
    """

    text: str
    language: str
    max_new_tokens: int
    min_new_tokens: int = 2
    seed: int | None = None
    instruct: str | None = None
    speaker: str | None = None
    reference: Reference | None = None


class SpeechModel(ABC):
    """One loaded Qwen3-TTS model of one kind.

    Attributes:
        kind: the model kind, checked against the checkpoint at load.
        chunk_frames: codec frames per streamed chunk (each 1920 samples).
    """

    def __init__(self, kind: ModelKind, qwen: Any, chunk_frames: int) -> None:
        self.kind = kind
        self.chunk_frames = chunk_frames
        self._qwen = qwen  # qwen_tts.Qwen3TTSModel
        self._prompts: OrderedDict[str, list[Any]] = OrderedDict()
        model_type = getattr(qwen.model, "tts_model_type", None)
        if model_type != kind.value:
            raise ModelMismatchError(f"checkpoint is a {model_type!r} model, expected {kind.value!r}")

    def speakers(self) -> list[str]:
        """CustomVoice speaker ids (lower case); [] for other kinds."""
        return list(self._qwen.get_supported_speakers() or []) if self.kind is ModelKind.CUSTOM_VOICE else []

    def clone_prompt(self, reference: Reference) -> list[Any]:
        """The speaker prompt for a reference, computed once per content digest (LRU).

        Returns qwen_tts ``VoiceClonePromptItem``s: ICL (codes + transcript) when the
        reference has a transcript, else x-vector only.
        """
        cached = self._prompts.get(reference.digest)
        if cached is not None:
            self._prompts.move_to_end(reference.digest)
            return cached
        audio = reference.audio
        if reference.transcript:
            tail = np.zeros(int(_REFERENCE_TAIL_SECONDS * reference.sample_rate), dtype=np.float32)
            audio = np.concatenate([audio, tail])
        items = self._qwen.create_voice_clone_prompt(
            ref_audio=(audio, reference.sample_rate),
            ref_text=reference.transcript,
            x_vector_only_mode=reference.transcript is None,
        )
        self._prompts[reference.digest] = items
        if len(self._prompts) > _PROMPT_CACHE_SIZE:
            self._prompts.popitem(last=False)
        return items

    @abstractmethod
    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        """Generate one segment, yielding float32 [n_samples] chunks at 24 kHz in [-1, 1].

        Closing the iterator between chunks stops generation. Raises ValueError or
        RuntimeError from the model for inputs it cannot take (e.g. a prompt longer
        than the KV cache).
        """

    def warmup(self) -> None:
        """Prepare for the first request (CUDA graph capture); no-op by default."""


class CudaGraphModel(SpeechModel):
    """faster-qwen3-tts: CUDA graphs, audio streamed every ``chunk_frames`` frames."""

    def __init__(self, kind: ModelKind, tts: Any, chunk_frames: int) -> None:
        super().__init__(kind, tts.model, chunk_frames)
        self._tts = tts  # faster_qwen3_tts.FasterQwen3TTS

    def warmup(self) -> None:
        """Capture the talker and predictor CUDA graphs (they are otherwise captured lazily)."""
        self._tts.warmup()

    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        import torch

        if segment.seed is not None:
            torch.manual_seed(segment.seed)
        common = dict(
            language=segment.language,
            max_new_tokens=segment.max_new_tokens,
            min_new_tokens=segment.min_new_tokens,
            chunk_size=self.chunk_frames,
            # Whole text in the prefill: feeding it step by step makes long clone text drift.
            non_streaming_mode=True,
        )
        if self.kind is ModelKind.BASE:
            assert segment.reference is not None
            generator = self._tts.generate_voice_clone_streaming(
                text=segment.text,
                voice_clone_prompt=self.clone_prompt(segment.reference),
                ref_text=segment.reference.transcript or "",
                **common,
            )
        elif self.kind is ModelKind.VOICE_DESIGN:
            generator = self._tts.generate_voice_design_streaming(
                text=segment.text, instruct=segment.instruct or "", **common
            )
        else:
            generator = self._tts.generate_custom_voice_streaming(
                text=segment.text, speaker=segment.speaker, instruct=segment.instruct, **common
            )
        try:
            for audio, _sample_rate, _timing in generator:
                yield np.asarray(audio, dtype=np.float32).reshape(-1)
        finally:
            generator.close()


class ReferenceModel(SpeechModel):
    """qwen_tts on the CPU: one whole segment per call, then cut into chunks."""

    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        import torch

        if segment.seed is not None:
            torch.manual_seed(segment.seed)
        common = dict(
            language=segment.language, max_new_tokens=segment.max_new_tokens, non_streaming_mode=True
        )
        if self.kind is ModelKind.BASE:
            assert segment.reference is not None
            wavs, _sr = self._qwen.generate_voice_clone(
                text=segment.text, voice_clone_prompt=self.clone_prompt(segment.reference), **common
            )
        elif self.kind is ModelKind.VOICE_DESIGN:
            wavs, _sr = self._qwen.generate_voice_design(
                text=segment.text, instruct=segment.instruct or "", **common
            )
        else:
            wavs, _sr = self._qwen.generate_custom_voice(
                text=segment.text, speaker=segment.speaker, instruct=segment.instruct, **common
            )
        audio = np.asarray(wavs[0], dtype=np.float32).reshape(-1)
        step = self.chunk_frames * SAMPLES_PER_FRAME
        for start in range(0, len(audio), step):
            yield audio[start : start + step]


def resolve_checkpoint(source: str, models_dir: Path, local_files_only: bool) -> Path:
    """A local checkpoint folder for ``source`` (a folder, or a hub id downloaded here).

    Hub downloads go into ``models_dir`` through huggingface_hub, with its progress bars.

    Raises:
        FileNotFoundError: a hub id that is not downloaded while ``local_files_only``, or
            any download failure (message says which model and why).
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source.startswith(("/", ".", "~")) or path.exists():
        raise FileNotFoundError(f"Model folder {source!r} does not exist (or is not a folder)")
    from huggingface_hub import snapshot_download

    try:
        _LOGGER.info("Fetching %s into %s%s", source, models_dir, " (offline)" if local_files_only else "")
        return Path(
            snapshot_download(source, cache_dir=str(models_dir), local_files_only=local_files_only)
        )
    except Exception as err:  # noqa: BLE001 - hub errors are many types; all mean "no model"
        hint = " (--local-files-only is set: download it first or give a folder)" if local_files_only else ""
        raise FileNotFoundError(f"Cannot get model {source!r}{hint}: {err}") from err


def load_model(kind: ModelKind, checkpoint: Path, device: str, chunk_frames: int) -> SpeechModel:
    """Load a checkpoint through the real loaders.

    Args:
        kind: the kind the checkpoint must be.
        checkpoint: local folder (see ``resolve_checkpoint``).
        device: "cuda" (faster-qwen3-tts, bf16, CUDA graphs) or "cpu" (qwen_tts, float32).
        chunk_frames: codec frames per streamed chunk.

    Raises:
        ModelMismatchError: the checkpoint is of another kind.
        OSError / ValueError: unreadable checkpoint.
    """
    import torch

    if device == "cuda":
        from faster_qwen3_tts import FasterQwen3TTS

        tts = FasterQwen3TTS.from_pretrained(
            str(checkpoint), device="cuda", dtype=torch.bfloat16, max_seq_len=MAX_SEQ_LEN
        )
        return CudaGraphModel(kind, tts, chunk_frames)
    from qwen_tts import Qwen3TTSModel

    qwen = Qwen3TTSModel.from_pretrained(str(checkpoint), device_map="cpu", dtype=torch.float32)
    return ReferenceModel(kind, qwen, chunk_frames)


def to_pcm16(chunk: np.ndarray) -> bytes:
    """float32 [n_samples] in [-1, 1] -> little-endian signed 16-bit PCM bytes (2 per sample)."""
    return (np.clip(chunk, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
