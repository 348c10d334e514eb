"""Find a checkpoint and load it through the real loaders into an engine."""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..common.vocabulary import ModelKind
from .base import Engine
from .gpu.cuda_env import cuda_bf16_supported, pick_dtype
from .gpu.memory import is_out_of_memory
from .cpu.gguf_files import hub_error, with_folder_note
from .gpu.sizing import MIN_STREAMS, after_out_of_memory, memory_budget, plan_streams, steady_streams

_LOGGER = logging.getLogger(__name__)

#: Talker KV positions per stream, prompt + generated frames (faster-qwen3-tts's default
#: ``max_seq_len``; ``vocabulary.MAX_SEGMENT_SECONDS`` keeps every segment inside it).
MAX_SEQ_LEN = 2048
#: Engines ``load_engine`` can build.
ENGINES = ("auto", "batched", "single", "reference", "ggml", "pipeline")
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
        _LOGGER.info("%s %s in %s", "Looking for" if local_files_only else "Fetching", source, models_dir)
        return Path(
            snapshot_download(source, cache_dir=str(models_dir), local_files_only=local_files_only)
        )
    except Exception as err:  # noqa: BLE001 - hub errors are many types; all mean "no model"
        hint = " (--local-files-only is set: start once without it to download, or give a folder)" if local_files_only else ""
        raise FileNotFoundError(with_folder_note(f"Cannot get model {source!r}{hint}: {hub_error(err)}", source)) from err


#: Why ``auto`` picked the GGML engine on the CPU, until the first GGML engine has loaded
#: and ``load_engine`` logs it: a checkpoint qwentts.cpp cannot run (narrower than the
#: release, the tiny test ones) goes to the reference engine instead, which start-up says,
#: so a line saying "ggml" before any model loaded could be false.
_ggml_why: str | None = None
#: The same for the pipeline engine (a checkpoint narrower than the release goes to the
#: reference engine, ``cpu.pipeline_load.check_pipeline_widths``): its line waits for its
#: first model to load.
_pipeline_why: str | None = None


def pick_engine(engine: str, device: str) -> str:
    """The engine ``auto`` means on ``device``: batched on CUDA; on the CPU the pipeline engine
    (our ggml graphs generating, the codec on ONNX Runtime) where it can run
    (``cpu.pipeline_load.pipeline_support``), else the GGML engine (qwentts.cpp) when its
    wheel loads and the CPU has its instructions, else the reference model (each fallback
    logged once with why; the GGML and pipeline engines' lines once one has loaded, see
    ``_ggml_why``).
    ``ggml`` and ``pipeline`` run on the CPU whatever ``device`` is; ``pipeline`` where it
    cannot run falls back to the wheel, then the reference, the log saying why once.

    Raises:
        ValueError: an engine that cannot run on ``device``.
    """
    if engine == "auto":
        return _auto_engine(device)
    if engine == "pipeline":
        return _pipeline_engine()
    if engine == "ggml":
        from .cpu.ggml import native_support

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
    return _pipeline_engine()


@functools.lru_cache(maxsize=1)
def _pipeline_engine() -> str:
    """``pipeline`` where the pipeline engine can run (``cpu.pipeline_load.pipeline_support``),
    else the CPU's fallback (``_wheel_or_reference``), saying why in one line."""
    from .cpu.pipeline_load import pipeline_support

    global _pipeline_why
    ok, why = pipeline_support()
    if ok:
        _LOGGER.debug("The pipeline engine can run here (%s): it takes each model whose checkpoint it can run", why)
        _pipeline_why = why
        return "pipeline"
    fallback = _wheel_or_reference()
    _LOGGER.warning("The pipeline engine cannot run here (%s): the CPU falls back to the %s engine", why, fallback)
    return fallback


@functools.lru_cache(maxsize=1)
def _wheel_or_reference() -> str:
    """The GGML engine (qwentts.cpp's wheel) where it loads, else the reference; the GGML
    engine's line waits for its first model to load (``_ggml_why``)."""
    global _ggml_why
    from .cpu.ggml import native_support

    ok, why = native_support()
    if ok:
        _LOGGER.debug("The GGML engine can run here (%s): it takes each model whose checkpoint it can run", why)
        _ggml_why = why
        return "ggml"
    _LOGGER.warning("Engine on the CPU: reference (qwen_tts, slow), because %s", why)
    return "reference"


def _say_ggml_chosen() -> None:
    """Log, once, that ``auto`` put the CPU on the GGML engine and why: called when a GGML
    engine has loaded, so the line is true (a model that goes to the reference engine
    instead never says "ggml")."""
    global _ggml_why
    if _ggml_why is not None:
        _LOGGER.info("Engine on the CPU: ggml (qwentts.cpp), because %s", _ggml_why)
        _ggml_why = None


def _say_pipeline_chosen() -> None:
    """Log, once, that ``auto`` (or ``--engine pipeline``) put the CPU on the pipeline engine
    and why: called when a pipeline engine has loaded (as ``_say_ggml_chosen``)."""
    global _pipeline_why
    if _pipeline_why is not None:
        _LOGGER.info("Engine on the CPU: pipeline (our ggml graphs generating, the codec on ONNX Runtime on "
                     "its own threads), because %s", _pipeline_why)
        _pipeline_why = None


def load_engine(
    kind: ModelKind,
    checkpoint: Path,
    device: str,
    chunk_frames: int,
    engine: str = "auto",
    max_streams: int | None = 8,
    on_join: Callable[[float], None] | None = None,
    dtype: str = "auto",
    max_len: int = MAX_SEQ_LEN,
    reserve: int = 0,
    cap_gb: float | None = None,
    gguf: tuple[Path, Path] | None = None,
    contexts: int = 0,
    quant: str = "",
    on_eager_prefill: Callable[[int], None] | None = None,
    chunk_growth: bool = False,
    shrink: float = 1.0,
    ggml_threads: int = 0,
    ggml_icl: bool = False,
    weight_quant: str = "none",
    prefill_graph_rows: int | None = None,
    data_dir: Path | None = None,
    generation_threads: int = 0,
    codec_threads: int = 0,
) -> Engine:
    """Load a checkpoint through the real loaders (faster-qwen3-tts / qwen_tts).

    Args:
        kind: the kind the checkpoint must be.
        checkpoint: local folder (see ``resolve_checkpoint``).
        device: "cuda" or "cpu".
        chunk_frames: codec frames per streamed chunk.
        engine: "batched" (the slot pool; CUDA graphs on CUDA, eager elsewhere), "single"
            (faster-qwen3-tts's own single-stream generator, CUDA only), "reference"
            (qwen_tts's own generator, streamed by hooks; the CPU fallback), "ggml" (qwentts.cpp
            on GGML, quantized GGUF weights; the CPU's fallback where its wheel runs), "pipeline"
            (our ggml graphs generating on one thread, the codec on ONNX Runtime on another,
            ``cpu.pipeline``; the CPU default) or "auto" (see ``pick_engine``).
        max_streams: slots of the batched engine; None sizes them from the GPU memory left
            after the weights (``sizing.plan_streams``; 8 off CUDA).
        on_join: the batched engine's join-stall observer (seconds).
        shrink: ``--max-streams auto`` takes this fraction of the streams that the free memory
            seems to hold (``load_fitting`` lowers it after an out-of-memory at capture).
        dtype: one of ``DTYPES``; "auto" is bfloat16 on CUDA (float16 on GPUs without
            bfloat16, see ``cuda_env.pick_dtype``), float32 on the CPU. float32 on CUDA also
            turns TF32 off (exact float32), for exact comparisons.
        max_len: talker KV positions per slot of the batched engine (``sizing.slot_positions``).
        reserve: bytes the stream sizing leaves free for models loaded later.
        cap_gb: ``--gpu-memory`` (the sizing's budget; the cap itself is set by the caller).
        gguf: the GGML engine's (talker, codec) files (``cpu.gguf_files.resolve_gguf``); without
            them ``checkpoint`` must be a folder holding both.
        contexts: the GGML engine's native contexts (streams at once); 0: chosen from the machine (``cpu.machine.plan``).
        quant: the GGUF files' quantization: the GGML engine's description; the pipeline
            engine converts a checkpoint to it ("": ``gguf_files.DEFAULT_QUANT``).
        on_eager_prefill: the batched engine's observer of rows prefilled eagerly (no graph).
        chunk_growth: the batched engine's chunks grow 1, 2, 4... up to ``chunk_frames``.
        ggml_threads: the GGML engine's CPU threads per context; 0: chosen from the machine (``cpu.machine.plan``).
        ggml_icl: the GGML and pipeline engines clone in context where a voice has a transcript
            (``GgmlEngine``'s ``icl``); else by x-vector.
        weight_quant: "int8": the batched engine's talker and code predictor hold int8
            weights (``batched.quant``; loaded on the CPU, quantized onto ``device``);
            "none": ``dtype`` throughout (``precision.pick_weight_quant`` chooses).
        prefill_graph_rows: the batched engine captures prefill graphs for up to this many
            rows (``batched.prefill.Prefill``); None: all. A model taking turns on the card
            passes ``sizing.TURNS_GRAPH_ROWS``: it captures at every swap.
        data_dir: the server's data folder: the pipeline engine's exported codec lives there.
        generation_threads, codec_threads: the pipeline engine's threads of each side; 0:
            chosen from the machine (``cpu.machine.pipeline_threads``).

    Raises:
        ModelMismatchError: the checkpoint is of another kind.
        cpu.ggml.NativeWidthError: on the GGML or pipeline engine, a checkpoint narrower than
            the release (the tiny test ones: ``--engine auto`` start-up falls back to the reference).
        ValueError: an engine that cannot run on ``device``, or a dtype the GPU lacks.
        MemoryFitError: not even one stream fits next to the weights.
        torch.OutOfMemoryError: the weights do not fit.
        OSError: unreadable checkpoint.
    """
    engine = pick_engine(engine, device)
    if engine == "ggml":
        from .cpu.ggml import GgmlEngine
        from .cpu.gguf_files import find_pair

        pair = gguf or find_pair(checkpoint)
        if pair is None:
            raise FileNotFoundError(f"{checkpoint} holds no GGUF files for the GGML engine")
        loaded = GgmlEngine(  # contexts/threads 0: chosen from the machine (cpu.machine.plan)
            kind, pair[0], pair[1], chunk_frames, contexts, threads=ggml_threads or None, quant=quant, icl=ggml_icl,
        )
        _say_ggml_chosen()
        return loaded
    if engine == "pipeline":
        from .cpu.pipeline_load import load_pipeline

        if data_dir is None:
            raise ValueError("the pipeline engine needs a data folder for its GGUF files and exported codec")
        pipeline = load_pipeline(kind, checkpoint, chunk_frames, data_dir, generation_threads, codec_threads,
                                 quant=quant or "Q8_0", icl=ggml_icl)
        _say_pipeline_chosen()
        return pipeline
    from ..common.quiet import import_models

    import_models()  # qwen_tts, transformers and torch: imported here, never on the GGML engine
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    bf16 = device == "cuda" and cuda_bf16_supported()
    name, note = pick_dtype(dtype, device, bf16)
    if note:
        _log_once(note)
    weights = getattr(torch, name)
    if device == "cuda" and weights is torch.float32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    if engine == "single":
        from faster_qwen3_tts import FasterQwen3TTS

        tts = FasterQwen3TTS.from_pretrained(str(checkpoint), device="cuda", dtype=weights, max_seq_len=MAX_SEQ_LEN)
        from .single import SingleStreamEngine

        return SingleStreamEngine(kind, tts, chunk_frames)
    from qwen_tts import Qwen3TTSModel

    int8 = weight_quant == "int8" and engine == "batched"
    qwen = Qwen3TTSModel.from_pretrained(
        str(checkpoint), device_map="cpu" if int8 else device, dtype=weights, attn_implementation="sdpa"
    )
    if int8:
        from .batched.quant import load_int8

        load_int8(qwen, device)
    if engine == "reference":
        from .cpu.reference import ReferenceEngine

        return ReferenceEngine(kind, qwen, chunk_frames)
    from faster_qwen3_tts import FasterQwen3TTS

    from .batched.engine import BatchedEngine

    # Only its prompt building is used: its own single-stream graphs (and their 2,048-position
    # cache) are never built.
    tts = FasterQwen3TTS(qwen, None, None, device=device, dtype=weights, max_seq_len=max_len)
    if max_streams is None:
        max_streams = _plan_streams(kind, qwen, max_len, reserve, cap_gb, shrink) if device == "cuda" else 8
    return BatchedEngine(kind, tts, chunk_frames, max_streams, max_len, graphs=device == "cuda", on_join=on_join,
                         on_eager_prefill=on_eager_prefill, chunk_growth=chunk_growth,
                         prefill_graph_rows=prefill_graph_rows)


#: The streams each model kind got at its last load in this process (``_plan_streams``).
_LAST_STREAMS: dict[str, int] = {}
#: Per model kind: (bytes it could use, streams) of its last load that shrank after an
#: out-of-memory (``sizing.after_out_of_memory``).
_FITTED_AFTER_OOM: dict[str, tuple[int, int]] = {}
#: Per model kind: bytes it could use beside its weights at its last load (``free_after_weights``).
_FREE_AFTER_WEIGHTS: dict[str, int] = {}


def free_after_weights(kind: ModelKind) -> int | None:
    """Bytes the model could use beside its weights at its last load in this process (the
    budget its stream sizing saw, with ``--max-streams auto`` on CUDA), or None if it has
    not been sized so."""
    return _FREE_AFTER_WEIGHTS.get(kind.value)


class MemoryFitError(RuntimeError):
    """Not even one stream of a model fits in the GPU memory left after its weights."""


def _plan_streams(kind: ModelKind, qwen: Any, max_len: int, reserve: int, cap_gb: float | None, shrink: float = 1.0) -> int:
    """``--max-streams auto`` on CUDA: the slots that fit now, logged with the reason.

    Raises:
        MemoryFitError: not even one fits.
    """
    import torch

    # Cached blocks go back to the card first; what stays reserved is held by tensors and by
    # the private pools of captured CUDA graphs (other models' or earlier loads'), which no
    # other allocation may use, and the --gpu-memory cap counts all of it.
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    budget = memory_budget(total, torch.cuda.memory_reserved(), free, cap_gb)
    slot = slot_bytes(qwen, max_len)
    plan = plan_streams(budget, slot, reserve=reserve)
    if not plan.fits:
        raise MemoryFitError(f"{kind.value} model: {plan.reason}")
    streams = plan.streams if shrink >= 1.0 else max(MIN_STREAMS, int(plan.streams * shrink))
    note = f"; {streams} after an out-of-memory at start" if streams != plan.streams else ""
    if shrink < 1.0:
        _FITTED_AFTER_OOM[kind.value] = (budget, streams)  # the last retry's is the one that fitted
    else:
        capped = after_out_of_memory(streams, budget, _FITTED_AFTER_OOM.get(kind.value), slot)
        kept = steady_streams(capped, _LAST_STREAMS.get(kind.value))
        if capped != streams:
            note = f"; {capped}, what fitted after an out-of-memory at an earlier load"
        elif kept != streams:
            note = f"; {kept} as at its last load"
        streams = kept
    _LAST_STREAMS[kind.value] = streams
    _FREE_AFTER_WEIGHTS[kind.value] = budget
    _LOGGER.info("%s model: %s%s; KV for %d positions a stream", kind.value, plan.reason, note, max_len)
    return streams


#: ``load_fitting``: each retry after an out-of-memory keeps this fraction of the streams.
RETRY_SHRINK = 0.6
#: ... and gives up below this fraction of the first plan.
MIN_SHRINK = 0.1


def load_fitting(load: Callable[[float], Engine], warm: Callable[[Engine], None], kind: ModelKind, auto: bool) -> Engine:
    """Load an engine and warm it up (graph capture); with ``--max-streams auto`` an
    out-of-memory during either is retried with fewer streams (``RETRY_SHRINK`` each time),
    since the stream sizing can only estimate what graph capture needs.

    Args:
        load: builds the engine, given the fraction of the planned streams to take.
        warm: warms it up (captures its graphs).
        kind: for the log.
        auto: the streams are sized automatically (a fixed ``--max-streams`` is never changed).

    A load or warm-up that fails, whether retried or not, gives back what it placed on the
    GPU before the error goes on (``let_go``, ``return_gpu_memory``): a model whose sizing found no
    room (``MemoryFitError``, its weights already on the card) must not keep them there, or
    the model taking turns with it cannot come back (the H200 with 4 GB free: 2.4 GB of int8
    weights stayed allocated after the VoiceDesign model failed to load).

    Raises:
        torch.OutOfMemoryError: it does not fit even with ``MIN_SHRINK`` of the streams (or a
            fixed ``--max-streams`` does not fit); any other error of ``load`` or ``warm``.
    """
    shrink = 1.0
    while True:
        engine: Engine | None = None
        try:
            engine = load(shrink)
            warm(engine)
            return engine
        except Exception as err:  # noqa: BLE001 - re-raised unless it is a retryable out-of-memory
            retry = auto and is_out_of_memory(err) and shrink * RETRY_SHRINK >= MIN_SHRINK
            let_go(err, engine)
            engine = None  # this frame's reference, before the collection
            return_gpu_memory()
            if not retry:
                raise
        shrink *= RETRY_SHRINK
        _LOGGER.warning(
            "%s model: out of GPU memory while loading or capturing its graphs; trying again with "
            "%.0f%% of the streams the free memory seemed to hold", kind.value, shrink * 100,
        )


def let_go(err: BaseException, engine: Engine | None) -> None:
    """Drop what holds a failed load's GPU memory, before ``err`` goes on; the caller then
    drops its own reference to ``engine`` and calls ``return_gpu_memory``.

    What holds it: the locals of the frames ``err``'s traceback runs through (the loader's
    ``qwen`` with its weights; the engine with its slots and graphs), cleared here (the
    traceback keeps its files and line numbers for the log; frames still running are
    skipped); the engine's ``warm_error`` (a cycle through that traceback); and the engine
    itself, whose ``close`` empties its tensors even if something else still holds it. On the
    H200 with 6 GB free a failed capture's 4.2 GB stayed allocated without this; with 4 GB
    free, a failed sizing's 2.4 GB of int8 weights.

    Args:
        err: the error the load or warm-up raised.
        engine: the engine built before the failure, or None (it failed in the loader).
    """
    traceback.clear_frames(err.__traceback__)
    if engine is not None:
        if hasattr(engine, "warm_error"):
            engine.warm_error = None
        if hasattr(engine, "close"):
            engine.close()


def return_gpu_memory() -> None:
    """Collect what was let go (models sit in reference cycles) and give the allocator's
    cached blocks back to the card (``torch.cuda.empty_cache``; nothing without CUDA)."""
    import gc

    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def slot_bytes(qwen: Any, max_len: int) -> int:
    """Device bytes one slot of the batched engine takes for this model: the talker's KV of
    ``max_len`` positions and the per-slot buffers (``batched.step.SlotState``), the code predictor's
    KV and the codec decoder's streaming state, measured on a one-slot probe.

    Args:
        qwen: the loaded ``qwen_tts.Qwen3TTSModel``.
    """
    import torch

    from .batched.codec import StreamingDecoder
    from .batched.step import PREDICTOR_POSITIONS, SlotState

    model = qwen.model
    state = SlotState(model.talker, 1, max_len)
    decoder = StreamingDecoder(model.speech_tokenizer.model.decoder, 1)
    tensors = [*state.tensors(), *decoder.state()]
    size = sum(t.numel() * t.element_size() for t in tensors)
    pred = model.talker.code_predictor.model
    attn = pred.layers[0].self_attn
    element = state.keys[0].element_size()
    size += 2 * len(pred.layers) * pred.config.num_key_value_heads * PREDICTOR_POSITIONS * attn.head_dim * element
    size += decoder.samples_per_frame * 4  # the step's PCM row (float32)
    del state, decoder, tensors
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return int(size)


_SAID: set[str] = set()


def _log_once(line: str) -> None:
    """Log a start-up fact once, however many models load."""
    if line not in _SAID:
        _SAID.add(line)
        _LOGGER.warning(line)


def checkpoint_params(checkpoint: Path) -> int:
    """Parameters in a checkpoint folder's ``*.safetensors`` files (the speech tokenizer's
    included), read from their headers without loading any tensor.

    Raises:
        OSError: an unreadable file. ValueError: a malformed header.
    """
    import json
    import math
    import struct

    total = 0
    for path in sorted(checkpoint.rglob("*.safetensors")):
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def checkpoint_speakers(checkpoint: Path) -> list[str]:
    """A CustomVoice checkpoint's speaker ids (lower case, sorted), from its config.json,
    as ``Qwen3TTSModel.get_supported_speakers`` lists them."""
    import json

    config = json.loads((checkpoint / "config.json").read_text())
    return sorted(str(name).lower() for name in (config.get("talker_config", {}).get("spk_id") or {}))


def checkpoint_slot_bytes(checkpoint: Path, max_len: int, element: int) -> int:
    """Estimated bytes of one slot, from config.json, before loading: the talker's KV of
    ``max_len`` positions (which ``slot_bytes`` measures once loaded; the codec state and
    buffers add about a tenth on the 1.7B models)."""
    import json

    talker = json.loads((checkpoint / "config.json").read_text())["talker_config"]
    head_dim = talker.get("head_dim") or talker["hidden_size"] // talker["num_attention_heads"]
    kv = 2 * talker["num_hidden_layers"] * talker["num_key_value_heads"] * head_dim * max_len * element
    return int(kv * 1.1)
