"""Build the pipeline engine (``--engine onnx``) for one model: its frame source, the codec's
exported streaming step, and the threads of each side.

Where the engine can run (``pipeline_support``): ONNX Runtime's CPU provider, and the
exporter's ``onnx`` and ``onnxscript`` for the first start. The frame source is the
checkpoint's own PyTorch modules (``torch_frames.TorchFrameSource``, float32); issue 50's
ggml generation graphs take its place once they serve (``GgmlFrameSource``, with their own
symbol check added to ``pipeline_support``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...common.vocabulary import ModelKind
from .machine import ROOM_FOR_STREAMS, pipeline_threads, usable_cores
from .onnx_codec import onnxruntime_support, shared_codec
from .onnx_export import exported_codec
from .pipeline import PipelineEngine

_LOGGER = logging.getLogger(__name__)


def pipeline_support() -> tuple[bool, str]:
    """Whether the pipeline engine can run here, and why (one line for the log)."""
    return onnxruntime_support()


def load_pipeline(
    kind: ModelKind,
    checkpoint: Path,
    chunk_frames: int,
    data_dir: Path,
    generation_threads: int = 0,
    codec_threads: int = 0,
    streams: int = ROOM_FOR_STREAMS,
) -> PipelineEngine:
    """Load ``checkpoint`` into a pipeline engine.

    The codec's streaming step is exported into ``data_dir`` at the first start (logged, with
    its time: seconds for the test checkpoints, longer for the released codec) and reused
    after (``onnx_export.exported_codec``); every model of the server shares its session
    (``onnx_codec.shared_codec``).

    Args:
        kind: the kind the checkpoint must be.
        checkpoint: a Qwen3-TTS checkpoint folder.
        chunk_frames: codec frames per delivered chunk (80 ms each).
        data_dir: the server's data folder (``--data-dir``).
        generation_threads, codec_threads: ``--generation-threads`` / ``--codec-threads``
            (0: chosen from the cores, ``machine.pipeline_threads``).
        streams: segments generated at once (2: a second client is heard at once).

    Raises:
        ModelMismatchError: the checkpoint is of another kind.
        FileNotFoundError: the checkpoint has no speech tokenizer weights.
        ImportError: the exporter's packages are missing (``pipeline_support`` says so first).
        OSError: unreadable checkpoint, or a data folder that cannot be written.
    """
    import torch

    from ...common.quiet import import_models

    threads = pipeline_threads(usable_cores(), generation_threads, codec_threads)
    import_models()
    from qwen_tts import Qwen3TTSModel

    from .torch_frames import TorchFrameSource

    # PyTorch's intra-op threads are the process's: every model of this engine uses the same plan.
    torch.set_num_threads(threads.generation)
    qwen = Qwen3TTSModel.from_pretrained(str(checkpoint), device_map="cpu", dtype=torch.float32,
                                         attn_implementation="sdpa")
    source = TorchFrameSource(kind, qwen, streams=streams)
    model = exported_codec(checkpoint, data_dir, lambda: qwen.model.speech_tokenizer.model.decoder)
    return PipelineEngine(kind, source, shared_codec(model, threads.codec), chunk_frames, threads)
