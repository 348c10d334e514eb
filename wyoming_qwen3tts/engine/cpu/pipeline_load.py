"""Build the pipeline engine (``--engine pipeline``) for one model: its frame source (our
ggml generation graphs, ``native.GgmlFrameSource``), the codec's exported streaming step, and
the threads of each side.

Where the engine can run (``pipeline_support``): the wheel's ggml passes our declarations'
check (``native.api``: symbols, ggml version, the CPU's instructions), and ONNX Runtime's CPU
provider loads, with the exporter's ``onnx`` and ``onnxscript`` for the first start.

What the serving process holds: the GGUF weights once (ggml's buffers; the file's pages
released), a talker key/value cache a stream, and ONNX Runtime's codec session (shared by
every model). No PyTorch model: the checkpoint's conversion to GGUF and the codec's export
run in child processes, once (their results are kept in the data folder).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...common.vocabulary import ModelKind
from ..base import ModelMismatchError
from .ggml import check_checkpoint_widths, check_native_widths
from .gguf_files import DEFAULT_QUANT, find_pair, resolve_gguf
from .machine import ROOM_FOR_STREAMS, ThreadPlan, pipeline_threads, usable_cores
from .onnx_codec import onnxruntime_support, shared_codec
from .onnx_export import FOLDER as CODEC_FOLDER, EXPORT_VERSION, exported_codec_in_child
from .pipeline import PipelineEngine

_LOGGER = logging.getLogger(__name__)


def pipeline_support() -> tuple[bool, str]:
    """Whether the pipeline engine can run here, and why (one line for the log): the wheel's
    ggml accepted by ``native.api.load`` and ONNX Runtime's ``onnxruntime_support``."""
    from .native.api import GgmlApiError, load

    try:
        ggml = load()
    except GgmlApiError as err:
        return False, f"our ggml generation graphs cannot run: {err}"
    ok, why = onnxruntime_support()
    if not ok:
        return False, why
    return True, f"the wheel's ggml {ggml.version} passes our declarations' check and {why}"


def gguf_folder(checkpoint: Path, data_dir: Path, quant: str) -> Path:
    """The folder of ``checkpoint``'s two GGUF files: ``checkpoint`` itself when it holds
    them, else its conversion at ``quant`` (``gguf_files.resolve_gguf``: made once, in a child
    process, under ``DATA_DIR/models/gguf``).

    Raises:
        FileNotFoundError: neither GGUF files nor a checkpoint in the folder.
        ValueError: an unknown quantization, or the conversion failed.
    """
    talker, codec = resolve_gguf(str(checkpoint), data_dir / "models", quant or DEFAULT_QUANT, local_files_only=True)
    if talker.parent != codec.parent or find_pair(talker.parent) != (talker, codec):
        raise FileNotFoundError(f"{talker} and {codec} are not the only GGUF pair of one folder")
    return talker.parent


def codec_model(checkpoint: Path, data_dir: Path) -> Path:
    """The codec's exported streaming step for ``checkpoint`` (``onnx_export``): exported from
    its ``speech_tokenizer`` once. A folder of GGUF files alone has no codec weights ONNX can
    take: there the step exported before is used when the data folder holds exactly one (the
    released models share one codec).

    Raises:
        FileNotFoundError: no speech tokenizer in ``checkpoint`` and no single export to use.
        RuntimeError: the export failed.
    """
    if (checkpoint / "speech_tokenizer").is_dir():
        return exported_codec_in_child(checkpoint, data_dir)
    made = sorted((data_dir / CODEC_FOLDER).glob(f"codec-step-v{EXPORT_VERSION}-*.onnx"))
    if len(made) == 1:
        _LOGGER.info("%s holds no speech tokenizer: using the codec exported before, %s", checkpoint, made[0])
        return made[0]
    raise FileNotFoundError(
        f"{checkpoint} holds no speech tokenizer to export the codec from (and {data_dir / CODEC_FOLDER} holds "
        f"{len(made)} exported codecs, not one): give the Hugging Face checkpoint folder once"
    )


def check_pipeline_widths(checkpoint: Path) -> None:
    """Refuse a checkpoint narrower than the release (the tiny test ones) before anything is
    converted or exported: our GGUF converter writes only the released widths (the files
    qwentts.cpp's readers take: ``gguf.__main__`` refuses others), and a Base model's clone
    clips are extracted by the wheel (``native.voice_refs``), whose speaker and codec encoders
    hard-code them (``ggml.NATIVE_WIDTHS``). A checkpoint folder is judged by its
    ``speech_tokenizer/config.json``, a folder of GGUF files by its tensors.

    Raises:
        NativeWidthError: a width differs from the release's (the message names it and says
            "this checkpoint needs --engine reference").
    """
    pair = find_pair(checkpoint)
    if pair is not None:
        check_native_widths(*pair)
    else:
        check_checkpoint_widths(checkpoint)


def fitted_threads(cores: int, generation: int, codec: int) -> ThreadPlan:
    """``machine.pipeline_threads``, with ggml's pool cut so that the two sides together take
    no more threads than ``cores`` (ggml's workers busy-wait between a graph's nodes: a pool
    sharing its cores with the codec stalls); at least 1 each. A cut is logged."""
    threads = pipeline_threads(cores, generation, codec)
    if threads.generation + threads.codec <= cores or threads.generation == 1:
        return threads
    fitted = max(1, cores - threads.codec)
    _LOGGER.warning("Generation on %d thread(s), not %d: with %d decoding audio that is all %d core(s) hold "
                    "(ggml's threads spin while they wait: more threads than cores stall)",
                    fitted, threads.generation, threads.codec, cores)
    return ThreadPlan(fitted, threads.codec, cores, threads.given)


def load_pipeline(
    kind: ModelKind,
    checkpoint: Path,
    chunk_frames: int,
    data_dir: Path,
    generation_threads: int = 0,
    codec_threads: int = 0,
    streams: int = ROOM_FOR_STREAMS,
    quant: str = DEFAULT_QUANT,
    icl: bool = False,
) -> PipelineEngine:
    """Load ``checkpoint`` into a pipeline engine on our ggml graphs.

    A checkpoint narrower than the release is refused first (``check_pipeline_widths``). The checkpoint is converted to GGUF (``quant``) and its codec's streaming step exported
    into ``data_dir`` at the first start (each in a child process, logged), and both reused
    after; every model of the server shares the codec's session (``onnx_codec.shared_codec``).

    Args:
        kind: the kind the checkpoint must be.
        checkpoint: a Qwen3-TTS checkpoint folder, or a folder of its two GGUF files.
        chunk_frames: codec frames per delivered chunk (80 ms each).
        data_dir: the server's data folder (``--data-dir``).
        generation_threads, codec_threads: ``--generation-threads`` / ``--codec-threads``
            (0: chosen from the cores, ``fitted_threads``).
        streams: segments generated at once (2: a second client is heard at once), each with
            its own talker cache over the one copy of the weights.
        quant: ``--gguf-quant``, the conversion's weights (Q8_0 by default; Q4_0; BF16).
        icl: ``--ggml-icl``: a clone clip with a transcript is cloned in context; else by its
            x-vector.

    Raises:
        ModelMismatchError: the checkpoint is of another kind.
        ggml.NativeWidthError: a checkpoint narrower than the release (``check_pipeline_widths``).
        FileNotFoundError: no checkpoint or GGUF files, or no codec to export.
        ValueError: the conversion failed, or an unknown quantization.
        RuntimeError: the codec's export failed.
        native.api.GgmlApiError: the wheel's ggml is refused (``pipeline_support`` says so first).
    """
    from .native.generator import GgmlFrameSource

    check_pipeline_widths(checkpoint)
    threads = fitted_threads(usable_cores(), generation_threads, codec_threads)
    folder = gguf_folder(checkpoint, data_dir, quant)
    model = codec_model(checkpoint, data_dir)
    source = GgmlFrameSource(folder, threads.generation, icl=icl, streams=streams)
    if source.kind is not kind:
        source.close()
        raise ModelMismatchError(f"checkpoint is a {source.kind.value!r} model, expected {kind.value!r}")
    return PipelineEngine(kind, source, shared_codec(model, threads.codec), chunk_frames, threads)
