"""Find a checkpoint and load it through the real loaders into an engine."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path

from ..voices import ModelKind
from .base import Engine

_LOGGER = logging.getLogger(__name__)

#: Talker KV positions per stream, prompt + generated frames (faster-qwen3-tts's default
#: ``max_seq_len``; ``text.MAX_SEGMENT_SECONDS`` keeps every segment inside it).
MAX_SEQ_LEN = 2048
#: Engines ``load_engine`` can build.
ENGINES = ("auto", "batched", "single", "reference", "ggml")
#: Weight dtypes ``load_engine`` accepts ("auto": bfloat16 on CUDA, float32 on the CPU).
DTYPES = ("auto", "bfloat16", "float16", "float32")


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


def pick_engine(engine: str, device: str) -> str:
    """The engine ``auto`` means on ``device``: batched on CUDA; on the CPU the GGML engine
    (qwentts.cpp) when its wheel loads and the CPU has its instructions, else the reference
    model (the log says which and why). ``ggml`` runs on the CPU whatever ``device`` is.

    Raises:
        ValueError: an engine that cannot run on ``device``.
    """
    if engine == "auto":
        return _auto_engine(device)
    if engine == "ggml":
        from .ggml import native_support

        ok, why = native_support()
        if not ok:
            raise ValueError(f"the GGML engine cannot run here: {why}")
        return engine
    if engine == "single" and device != "cuda":
        raise ValueError("the single-stream engine (faster-qwen3-tts) needs CUDA")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    return engine


@functools.lru_cache(maxsize=4)
def _auto_engine(device: str) -> str:
    """What ``auto`` picks on ``device``; logs the choice and why, once per device."""
    if device == "cuda":
        _LOGGER.info("Engine: batched (CUDA graphs), because a CUDA GPU is available")
        return "batched"
    from .ggml import native_support

    ok, why = native_support()
    if ok:
        _LOGGER.info("Engine on the CPU: ggml (qwentts.cpp), because %s", why)
        return "ggml"
    _LOGGER.warning("Engine on the CPU: reference (qwen_tts, slow), because %s", why)
    return "reference"


def load_engine(
    kind: ModelKind,
    checkpoint: Path,
    device: str,
    chunk_frames: int,
    engine: str = "auto",
    max_streams: int = 8,
    on_join: Callable[[float], None] | None = None,
    dtype: str = "auto",
    gguf: tuple[Path, Path] | None = None,
    contexts: int = 0,
    quant: str = "",
) -> Engine:
    """Load a checkpoint through the real loaders (faster-qwen3-tts / qwen_tts).

    Args:
        kind: the kind the checkpoint must be.
        checkpoint: local folder (see ``resolve_checkpoint``).
        device: "cuda" (bf16) or "cpu" (float32).
        chunk_frames: codec frames per streamed chunk.
        engine: "batched" (the slot pool; CUDA graphs on CUDA, eager elsewhere), "single"
            (faster-qwen3-tts's own single-stream generator, CUDA only), "reference"
            (qwen_tts's own generator, streamed by hooks; the CPU path) or "auto" (see ``pick_engine``).
        max_streams: slots of the batched engine.
        on_join: the batched engine's join-stall observer (seconds).
        dtype: one of ``DTYPES``. float32 on CUDA also turns TF32 off (exact float32), for GPUs
            without bfloat16 and for exact comparisons.
        gguf: the GGML engine's (talker, codec) files (``gguf_files.resolve_gguf``); without
            them ``checkpoint`` must be a folder holding both.
        contexts: the GGML engine's native contexts (streams at once); 0: ``default_contexts``.
        quant: the GGUF files' quantization, for the GGML engine's description.

    Raises:
        ModelMismatchError: the checkpoint is of another kind.
        ValueError: an engine that cannot run on ``device``.
        OSError: unreadable checkpoint.
    """
    engine = pick_engine(engine, device)
    if engine == "ggml":
        import os

        from .ggml import GgmlEngine, default_contexts
        from .gguf_files import find_pair

        pair = gguf or find_pair(checkpoint)
        if pair is None:
            raise FileNotFoundError(f"{checkpoint} holds no GGUF files for the GGML engine")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return GgmlEngine(kind, pair[0], pair[1], chunk_frames, contexts or default_contexts(cores), quant=quant)
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    weights = getattr(torch, dtype if dtype != "auto" else "bfloat16" if device == "cuda" else "float32")
    if device == "cuda":
        from faster_qwen3_tts import FasterQwen3TTS

        if weights is torch.float32:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        tts = FasterQwen3TTS.from_pretrained(str(checkpoint), device="cuda", dtype=weights, max_seq_len=MAX_SEQ_LEN)
        qwen = tts.model
    else:
        from qwen_tts import Qwen3TTSModel

        qwen = Qwen3TTSModel.from_pretrained(str(checkpoint), device_map=device, dtype=weights)
        tts = None
    if engine == "batched":
        from .batched import BatchedEngine

        if tts is None:
            from faster_qwen3_tts import FasterQwen3TTS

            # Only its prompt building is used off CUDA; from_pretrained refuses the CPU.
            tts = FasterQwen3TTS(qwen, None, None, device=device, dtype=weights, max_seq_len=MAX_SEQ_LEN)
        return BatchedEngine(
            kind, tts, chunk_frames, max_streams, MAX_SEQ_LEN, graphs=device == "cuda", on_join=on_join
        )
    if engine == "single":
        from .single import SingleStreamEngine

        return SingleStreamEngine(kind, tts, chunk_frames)
    from .reference import ReferenceEngine

    return ReferenceEngine(kind, qwen, chunk_frames)
