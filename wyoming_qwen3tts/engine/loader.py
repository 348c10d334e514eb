"""Find a checkpoint and load it through the real loaders into an engine."""

from __future__ import annotations

import logging
from pathlib import Path

from ..voices import ModelKind
from .base import Engine

_LOGGER = logging.getLogger(__name__)

#: Static KV-cache length of faster-qwen3-tts (its default): prompt + generated frames.
MAX_SEQ_LEN = 2048


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


def load_engine(kind: ModelKind, checkpoint: Path, device: str, chunk_frames: int) -> Engine:
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

        from .single import SingleStreamEngine

        tts = FasterQwen3TTS.from_pretrained(
            str(checkpoint), device="cuda", dtype=torch.bfloat16, max_seq_len=MAX_SEQ_LEN
        )
        return SingleStreamEngine(kind, tts, chunk_frames)
    from qwen_tts import Qwen3TTSModel

    from .reference import ReferenceEngine

    qwen = Qwen3TTSModel.from_pretrained(str(checkpoint), device_map="cpu", dtype=torch.float32)
    return ReferenceEngine(kind, qwen, chunk_frames)
