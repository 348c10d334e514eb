"""Loading the models at start: the device and engine, where each model lives in GPU memory,
the GGML engine on the CPU, and each engine's warm-up.

``load_engines`` is what ``__main__`` calls; it turns the command line's model flags into
warmed-up engines, or stops start-up with one line saying why (for memory, what to change).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import logging
from pathlib import Path

import numpy as np

from .common.audio import SAMPLE_RATE
from .engine import Engine, Segment, load_engine, pick_engine, resolve_checkpoint
from .engine.cpu.defaults import cpu_sources
from .engine.gpu.cuda_env import check_driver, cuda_bf16_supported, driver_cuda_version, pick_dtype
from .engine.cpu.ggml import NativeWidthError, check_checkpoint_widths
from .engine.cpu.gguf_files import resolve_gguf, with_folder_note
from .engine.gpu.memory import is_out_of_memory
from .engine.loader import (
    MemoryFitError, checkpoint_params, checkpoint_slot_bytes, checkpoint_speakers, free_after_weights, load_fitting,
)
from .engine.gpu.lease import GpuLease
from .engine.gpu.on_demand import OnDemandEngine
from .engine.gpu.precision import int8_weights, pick_weight_quant, quantized_params
from .engine.gpu.sizing import (
    GB, TURNS_GRAPH_ROWS, ModelNeed, Residency, cap_fraction, memory_budget, plan_residency, slot_positions, turns_fit,
)
from .common.metrics import Metrics
from .service.default_voice import shown_names
from .catalogue.voices import (
    AUDIO_SUFFIXES, MIN_CLIP_SECONDS, PRESETS_FILE, ClipSkip, VoiceCatalog, VoiceSource, clone_name, cut_off_reason,
    has_control_characters, load_presets, name_key, read_clone_clip, transcript_name, voice_clips,
)
from .common.vocabulary import ModelKind, Reference

_LOGGER = logging.getLogger("wyoming_qwen3tts")


def _device(choice: str, engine: str) -> str:
    """The device to run on, checked against the engine asked for.

    Raises:
        SystemExit: no CUDA for ``--device cuda``, or an engine the device cannot run.
    """
    if choice == "cpu" or (choice == "auto" and driver_cuda_version() is None):
        # The CPU asked for, or no NVIDIA driver: no CUDA whatever torch would say, and not
        # importing torch keeps it (0.5 GB resident) out of a server on the GGML engine.
        available, problem = False, None
    else:
        import torch

        available = torch.cuda.is_available()
        problem = None if available else check_driver()
    why = cpu_reason(choice)
    if choice == "auto":
        choice = "cuda" if available else "cpu"
        if problem:
            _LOGGER.error(problem)
    elif choice == "cuda" and not available:
        raise SystemExit(f"--device cuda: {problem or 'no CUDA device is available'}")
    try:
        engine = pick_engine(engine, choice)
    except ValueError as err:
        raise SystemExit(f"--engine: {err}") from None
    if engine == "pipeline" and choice != "cpu":  # the pipeline engine runs on the CPU whatever the device
        choice, why = "cpu", "--engine pipeline"
    if choice == "cpu" and engine not in ("ggml", "pipeline"):  # those: said once loaded (``cpu_engines_line``)
        how = (
            "the batched engine runs eagerly, frame by frame"
            if engine == "batched"
            else "the qwen_tts reference model, one request at a time"
        )
        _LOGGER.warning(
            "%s: running on the CPU (%s). This path is SLOW (the 1.7B models take "
            "several seconds per second of speech). Use an NVIDIA GPU for real-time speech.",
            why, how,
        )
    return choice


def cpu_reason(device: str) -> str:
    """Why the server runs on the CPU, in the log's words, given ``--device`` (``cpu``, or
    ``auto`` that found no usable CUDA GPU)."""
    return "--device cpu" if device == "cpu" else "No CUDA GPU"


#: Each native CPU engine as the start-up's engine line names it (``cpu_engines_line``), and
#: the one that could not run a checkpoint (in "every model fell back ..., as X cannot run it").
CPU_ENGINE_NAMES = {
    "ggml": ("qwentts.cpp (GGML, quantized weights)", "qwentts.cpp"),
    "pipeline": ("the pipeline engine (our ggml graphs generating, the codec on ONNX Runtime on its own threads)",
                 "the pipeline engine"),
}


def cpu_engines_line(why: str, on_ggml: list[ModelKind], fell_back: list[ModelKind], engine: str = "ggml") -> str:
    """The one log line of a CPU start on the GGML or pipeline engine, once its models are
    loaded: which run on it and which fell back to the reference engine (a checkpoint
    narrower than the release, each said in its own line before). On the pipeline engine
    with no model fallen back, the line the start-up gave before loading (a warning).

    Args:
        why: ``cpu_reason``.
        on_ggml: the models loaded on ``engine``; fell_back: those on the reference engine.
        engine: "ggml" or "pipeline" (``CPU_ENGINE_NAMES``).
    """
    name, short = CPU_ENGINE_NAMES[engine]
    reference = "the reference engine (qwen_tts, slower)"
    if not fell_back:
        if engine == "pipeline":
            return (f"{why}: running on the CPU (our ggml graphs generating on one thread, the codec on ONNX Runtime "
                    "on another). A GPU is much faster; see docs/cpu.md for what a few cores give.")
        return f"{why}: running on the CPU, every model on {name}"
    if not on_ggml:
        return (f"{why}: running on the CPU; every model fell back to {reference}, as {short} cannot "
                "run its checkpoint (each said above, with why)")
    return (f"{why}: running on the CPU, {_models(on_ggml)} on {name}; {_models(fell_back)} fell back to "
            f"{reference} (said above, with why)")


def _models(kinds: list[ModelKind]) -> str:
    """``the base model``, ``the base and custom_voice models``."""
    names = [kind.value for kind in kinds]
    return f"the {names[0]} model" if len(names) == 1 else f"the {', '.join(names[:-1])} and {names[-1]} models"


def _warm_segment(kind: ModelKind, engine: Engine) -> Segment:
    """A 2-frame generation that exercises the whole path once before serving."""
    tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(SAMPLE_RATE) / SAMPLE_RATE)
    return Segment(
        text="Hello.",
        language="auto",
        max_new_tokens=2,
        seed=0,
        instruct="A clear, neutral voice." if kind is ModelKind.VOICE_DESIGN else None,
        speaker=next(iter(engine.speakers()), None),
        reference=Reference.from_audio(tone, SAMPLE_RATE, None) if kind is ModelKind.BASE else None,
    )


#: Load order: the VoiceDesign model last, so the others' stream sizing keeps its room.
LOAD_ORDER = (ModelKind.BASE, ModelKind.CUSTOM_VOICE, ModelKind.VOICE_DESIGN)
#: What each ``--max-streams auto`` log and out-of-memory message suggests changing.
MEMORY_OPTIONS = (
    "--max-streams N, --gpu-memory GB, --design-model-memory on-demand, "
    "--clone-model Qwen/Qwen3-TTS-12Hz-0.6B-Base or --custom-voice-model none"
)


async def load_engines(args: argparse.Namespace, metrics: Metrics) -> dict[ModelKind, Engine]:
    """Load every enabled model and warm it up (graph capture and one short generation).

    On CUDA, decide first from the checkpoints' sizes and the GPU memory (``--gpu-memory``)
    whether the VoiceDesign model stays resident, comes on demand, or takes turns with the
    others (``sizing.plan_residency``); ``--max-streams auto`` then sizes each pool.

    Raises:
        SystemExit: no model enabled, or a model failed to load or warm up (the message
            names the options that make it fit when memory was the reason).
    """
    device = _device(args.device, args.engine)
    if args.engine == "pipeline" and pick_engine("pipeline", device) != "pipeline":
        args.engine = "auto"  # not offered here (logged): the CPU's fallbacks, as under auto
    models_dir = Path(args.data_dir) / "models"
    sources = {
        ModelKind.BASE: args.clone_model,
        ModelKind.VOICE_DESIGN: args.design_model,
        ModelKind.CUSTOM_VOICE: args.custom_voice_model,
    }
    args.on_cpu = device == "cpu"
    given = getattr(args, "given", None)  # flags on the command line (set by ``main``)
    # The CustomVoice model the CPU defaults load for the user: its speaker is the default voice.
    args.cpu_speaker_default = False
    # The configuration that speaks soonest without a GPU, when neither --clone-model nor
    # --custom-voice-model was given (the add-on always passes --design-model): a user who
    # names a model gets what they named and nothing added.
    if args.on_cpu and given is not None and not {"--clone-model", "--custom-voice-model"} & given:
        flags = {ModelKind.BASE: "--clone-model", ModelKind.VOICE_DESIGN: "--design-model", ModelKind.CUSTOM_VOICE: "--custom-voice-model"}
        chosen = cpu_sources(sources, {k for k, f in flags.items() if f in given})
        _LOGGER.info(
            "No GPU and no model named: the CPU defaults load %s (Base) and %s (CustomVoice), with "
            "its speaker as the default voice; name --clone-model / --custom-voice-model to choose",
            chosen[ModelKind.BASE], chosen[ModelKind.CUSTOM_VOICE],
        )
        sources = chosen
        args.cpu_speaker_default = sources[ModelKind.CUSTOM_VOICE].lower() != "none"
    args.model_sources = sources  # each model's hub id or folder: names the HTTP door accepts
    voices_dir = Path(args.voices_dir) if args.voices_dir else Path(args.data_dir) / "voices"
    kinds = {k for k, s in sources.items() if s and s.lower() != "none"}
    speakers = known_speakers(sources[ModelKind.CUSTOM_VOICE], models_dir) if ModelKind.CUSTOM_VOICE in kinds else None
    check_default_voice(args.voice, voices_dir, kinds, speakers)
    check_some_voice(voices_dir, kinds, studio=bool(args.http_port), clone_model=sources[ModelKind.BASE], models_dir=models_dir)
    if pick_engine(args.engine, device) == "ggml":
        return await _load_ggml_engines(args, sources, models_dir, metrics)
    checkpoints: dict[ModelKind, Path] = {}
    for kind in LOAD_ORDER:
        source = sources[kind]
        if not source or source.lower() == "none":
            continue
        try:
            checkpoints[kind] = await asyncio.to_thread(resolve_checkpoint, source, models_dir, args.local_files_only)
        except Exception as err:  # noqa: BLE001 - any failure ends start-up with its reason
            raise SystemExit(_load_failure(kind, source, err)) from err
    if not checkpoints:
        raise SystemExit("No model enabled: set at least one of --clone-model, --design-model, --custom-voice-model")
    max_len = max(slot_positions(), (args.fixed_frames or 0) + 512)
    # The weights the batched engine loads: what --weight-quant forces; on CUDA "auto" is
    # decided from the free memory by _residency.
    engine_name = pick_engine(args.engine, device)
    args.weight_quant_chosen = "int8" if args.weight_quant == "int8" and engine_name == "batched" else "none"
    if args.weight_quant == "int8" and engine_name != "batched":
        _LOGGER.warning("--weight-quant int8 has no effect on the %s engine: it serves the batched engine only", engine_name)
    plan = _residency(args, device, checkpoints, max_len)
    lease = GpuLease() if plan is not None and plan.design == "turns" else None
    unservable = plan.unservable if plan is not None else {}
    if unservable:  # one line: what this card cannot do, and why
        _say_unservable("; ".join(unservable.values()))
    engines: dict[ModelKind, Engine] = {}
    fell_back: list[ModelKind] = []  # the pipeline engine's models on the reference engine instead
    for kind, checkpoint in checkpoints.items():
        reserve = plan.reserves.get(kind.value, 0) if plan is not None else 0

        def load(shrink: float = 1.0, kind: ModelKind = kind, checkpoint: Path = checkpoint, reserve: int = reserve) -> Engine:
            # Taking turns, a model captures its graphs at every swap: fewer prefill graphs.
            return load_engine(
                kind, checkpoint, device, args.chunk_size, args.engine, args.max_streams,
                metrics.join_stall.labels(kind.value).observe, args.dtype, max_len, reserve, args.gpu_memory,
                on_eager_prefill=metrics.eager_prefill.labels(kind.value).inc, chunk_growth=args.chunk_growth,
                shrink=shrink, weight_quant=args.weight_quant_chosen,
                prefill_graph_rows=TURNS_GRAPH_ROWS if lease is not None else None,
                data_dir=Path(args.data_dir), generation_threads=getattr(args, "generation_threads", 0),
                codec_threads=getattr(args, "codec_threads", 0),
                quant=getattr(args, "gguf_quant", ""), ggml_icl=getattr(args, "ggml_icl", False),
            )

        engine: Engine
        if lease is not None or (kind is ModelKind.VOICE_DESIGN and plan is not None and plan.design == "on-demand"):
            design = kind is ModelKind.VOICE_DESIGN
            engine = OnDemandEngine(
                kind, args.chunk_size, load, functools.partial(_warm_segment, kind),
                idle_s=args.design_model_idle if design else None, lease=lease, auto_streams=args.max_streams is None,
                why=" (preset anchors, voice studio designs, instructions)" if design else "",
                speakers=checkpoint_speakers(checkpoint) if kind is ModelKind.CUSTOM_VOICE else [],
                home=kind is ModelKind.BASE, unservable=unservable.get(kind.value),
            )
            _LOGGER.info("Loading %s model from %s on %s (%s)", kind.value, checkpoint, device, "on demand" if design else "taking turns")
            try:
                await asyncio.to_thread(engine.warm, _warm_segment(kind, engine))
            except Exception as err:  # noqa: BLE001 - any load failure ends start-up with its reason
                raise SystemExit(_load_failure(kind, sources[kind], err)) from err
        else:
            _LOGGER.info("Loading %s model from %s on %s", kind.value, checkpoint, device)
            try:
                engine = await asyncio.to_thread(
                    load_fitting, load, functools.partial(_warm, kind), kind, args.max_streams is None,
                )
            except Exception as err:  # noqa: BLE001 - any load failure ends start-up with its reason
                if isinstance(err, NativeWidthError) and engine_name == "pipeline" and args.engine == "auto":
                    # A checkpoint narrower than the release (the tiny test ones): refused before conversion.
                    engines[kind] = await _load_reference_instead(args, kind, sources[kind], models_dir, metrics, err,
                                                                  "the pipeline engine")
                    fell_back.append(kind)
                    continue
                if not (kind is ModelKind.VOICE_DESIGN and engines and _is_memory(err)):
                    raise SystemExit(_load_failure(kind, sources[kind], err)) from err
                # The others are loaded and serve: start without this one rather than not at all.
                _LOGGER.error(
                    "%s. The server starts without it: it is loaded when needed (preset anchors, "
                    "studio designs, instructions), and those requests fail with this reason while it does not fit",
                    _load_failure(kind, sources[kind], err),
                )
                _free_gpu()
                engine = OnDemandEngine(
                    kind, args.chunk_size, load, functools.partial(_warm_segment, kind), idle_s=args.design_model_idle,
                    auto_streams=args.max_streams is None,
                )
                engine.ready.set()
        engines[kind] = engine
        _LOGGER.info("%s model ready (%s)", kind.value, _streams(engine))
    if lease is not None and plan is not None:
        _check_turns(engines, plan)
    if engine_name == "pipeline":
        line = cpu_engines_line(cpu_reason(args.device), [k for k in engines if k not in fell_back], fell_back, "pipeline")
        _LOGGER.log(logging.INFO if fell_back else logging.WARNING, "%s", line)
    return {kind: engines[kind] for kind in sorted(engines, key=list(sources).index)}


def known_speakers(source: str, models_dir: Path) -> set[str] | None:
    """A CustomVoice checkpoint's speaker names (casefolded) from its ``config.json``
    (``talker_config.spk_id``), without loading it: ``source`` a folder, or a hub id already
    downloaded into ``models_dir``. None where they cannot be read so (not downloaded yet, no
    such field): the loaded model then says."""
    path = Path(source).expanduser()
    config: Path | None = path / "config.json" if path.is_dir() else None
    if config is None:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(source, "config.json", cache_dir=str(models_dir))
        except Exception:  # noqa: BLE001 - not a hub id either: the loader says why
            return None
        config = Path(found) if isinstance(found, str) else None
    try:
        names = json.loads(config.read_text())["talker_config"]["spk_id"] if config is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {str(n).casefold() for n in names} if isinstance(names, dict) and names else None


def no_voices_message(voices_dir: Path) -> str:
    """What a server with the Base model alone and no clone voice says (it has nothing to speak)."""
    return (f"No voices: add a clone voice (<id>.wav and its transcript <id>.txt) to {voices_dir}, or enable "
            "the VoiceDesign model (--design-model) or the CustomVoice model (--custom-voice-model)")


def check_some_voice(
    voices_dir: Path, kinds: set[ModelKind], studio: bool = False, clone_model: str | None = None,
    models_dir: Path | None = None,
) -> None:
    """With the Base model alone and no voice studio (``--http-port 0``), refuse to start
    before any model loads (a download of several GB) when the voices folder holds no clip:
    nothing could ever be spoken. With the studio the server starts anyway, so that the
    first clip can be uploaded there (``no_voices_warning`` says so once it serves). Clips are
    judged as the folder scan judges them (``survey_clips``): a silent one, or one whose
    transcript is not UTF-8, is no voice here either.
    A ``clone_model`` that is plainly no model (``unfound_model``: a mistyped folder such as
    ``tny/base``) is named first in the same line, so that it is not found only after the
    first clip is added.

    Args:
        voices_dir: the clone library (it may not exist).
        kinds: the model kinds enabled on the command line.
        studio: whether the HTTP port, and with it the voice studio, is on.
        clone_model: ``--clone-model`` as given (a folder or a hub id), or None: not checked.
        models_dir: where hub models are downloaded (``<data-dir>/models``).

    Raises:
        SystemExit: ``no_voices_message``, naming the clips skipped and why, after what is
            wrong with ``clone_model`` if anything is.
    """
    if kinds != {ModelKind.BASE} or studio:
        return
    usable, skipped = survey_clips(voices_dir)
    if not usable:
        model = unfound_model("--clone-model", clone_model, models_dir) if clone_model and models_dir else None
        raise SystemExit((f"{model}. " if model else "") + no_voices_message(voices_dir)
                         + (f"; skipped: {', '.join(skipped)}" if skipped else ""))


def unfound_model(flag: str, source: str, models_dir: Path) -> str | None:
    """What is plainly wrong with a model option's value (``flag``, e.g. ``--clone-model``:
    ``source``, a folder or a hub id), told without the hub and without loading: a path
    (starting with "/", "." or "~") that is no folder; or a value that may be a relative
    folder ("tny/base": it holds "/" and no ":") and is neither a folder here nor a hub model
    already downloaded into ``models_dir``, nor one of Qwen's (the released models, fetched
    when loading). None where nothing is plainly wrong (loading may still fail, and says why)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return None
    if source.startswith(("/", ".", "~")) or path.exists():
        return f"{flag} {source!r}: the model folder does not exist (or is not a folder)"
    if "/" not in source or ":" in source or source.casefold().startswith("qwen/"):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(source, "config.json", cache_dir=str(models_dir))
    except Exception:  # noqa: BLE001 - not a valid hub id either
        found = None
    if isinstance(found, str):
        return None
    return with_folder_note(f"{flag} {source!r}: no model of that hub id is downloaded yet", source)


def survey_clips(voices_dir: Path) -> tuple[bool, list[str]]:
    """Whether the voices folder holds a clip that is a voice, as the folder scan judges it
    (``read_clone_clip``: a readable clip of at least ``MIN_CLIP_SECONDS``, not silent, its
    transcript if any readable; a name without control characters and not blank; the first
    clip of its voice name), and every clip it skips, each named with why
    (``'tab\\there.wav' (control characters in its name)``, ``' .wav' (a blank name)``,
    ``broken.wav (the file could not be decoded as audio: Format not recognised)``, ``locked.wav
    (no readable audio)`` (a file that cannot be opened), ``short.wav (0.50 s long, under the 1 s a clone clip
    needs)``, ``cut.wav (the clip holds 0.04 s of audio though its header says 3.00 s: the file
    looks cut off, an incomplete download or copy)``, ``hush.wav (the clip is silent: ...)``), by file name. Reads each clip's
    samples (at most ``MAX_REFERENCE_SECONDS``) and transcript."""
    skipped, usable = [], False
    for clip, read in _clone_clips(voices_dir):
        if has_control_characters(clip.stem):
            skipped.append(f"{clip.name!r} (control characters in its name)")
        elif not clone_name(clip.stem):
            skipped.append(f"{clip.name!r} (a blank name)")
        elif isinstance(read, Reference):
            usable = True
        elif isinstance(read, ClipSkip):
            seconds = _audio_seconds(clip)
            if read.level >= logging.ERROR:
                skipped.append(f"{clip.name} (no readable audio)")
            elif seconds is not None and seconds < MIN_CLIP_SECONDS:
                short = cut_off_reason(seconds, str(clip)) or f"{seconds:.2f} s long, under the {MIN_CLIP_SECONDS:g} s a clone clip needs"
                skipped.append(f"{clip.name} ({short})")
            else:
                skipped.append(f"{clip.name} ({_for_clients(read, clip)})")
    return usable, skipped


def _clone_clips(voices_dir: Path) -> list[tuple[Path, Reference | ClipSkip | None]]:
    """Every audio file of the voices folder (``_clip_files``, by file name) and how the folder
    scan reads it (``read_clone_clip``, with the transcript the catalogue gives it): None for a
    file the catalogue reads no voice from (a name with control characters, a blank name, a
    clip of a voice name another clip gives: of ``kim.mp3`` and ``kim.wav`` the catalogue reads
    the one ``clip_preference`` puts first, ``kim.wav``, whatever ``kim.mp3`` holds)."""
    clips = _clip_files(voices_dir)
    texts = [p.name for p in voices_dir.iterdir() if p.suffix.lower() == ".txt"] if clips else []
    chosen = voice_clips(clips)  # voice name key: the clip that gives it, as the catalogue chooses
    found: list[tuple[Path, Reference | ClipSkip | None]] = []
    for clip in clips:
        if chosen.get(name_key(clip.stem)) != clip:
            found.append((clip, None))
            continue
        text = transcript_name(clip, texts)
        found.append((clip, read_clone_clip(clip, clip.with_name(text) if text else None)))
    return found


def _for_clients(skip: ClipSkip, clip: Path) -> str:
    """A skipped clip's reason without the server's folders (soundfile names the path), as
    the catalogue gives it to clients."""
    return skip.why.replace(str(clip), clip.name)


def studio_address(host: str, port: int, ingress: bool = False) -> str:
    """Where the voice studio is, in words, for the no-voice warning and refusals: its URL on
    ``host``:``port`` (``--http-host``, ``--http-port``; a wildcard host as "this machine"),
    and under Home Assistant (``ingress``: an ``--ingress-peer``) the add-on's panel."""
    shown = "<this machine>" if host in ("", "0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    where = f"http://{shown}:{port}/"
    return f"{where}, or the add-on's panel in Home Assistant" if ingress else where


def no_voices_warning(voices_dir: Path, studio: str, skipped: list[str]) -> str:
    """The one WARNING of a server that starts with no voice (the clone model alone, no usable
    clip): where to add the first one, and the clips skipped (``survey_clips``, and the
    catalogue's ``skipped_clips``)."""
    return (
        f"No voice yet: the clone (Base) model is the only model, and the voices folder {voices_dir} holds no "
        f"usable clip. Upload one in the voice studio ({studio}) or copy <id>.wav and its transcript <id>.txt "
        "into that folder: it is spoken at once, without a restart, and becomes the default voice. Until then "
        "every speech request is refused with this advice"
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
    )


def check_default_voice(
    name: str | None, voices_dir: Path, kinds: set[ModelKind], speakers: set[str] | None = None
) -> None:
    """Refuse an unknown ``--voice`` before any model loads, where that can be known.

    Clone voices (audio files in ``voices_dir``, served by the Base model) and presets
    (shipped, and the user's ``presets.toml``, served by the VoiceDesign model) are known
    without a model; a CustomVoice speaker's name from the checkpoint's config
    (``known_speakers``), or else only from the loaded model: with the CustomVoice model
    enabled and ``speakers`` None nothing is refused here (the catalogue checks the name after
    loading). Names and aliases match as in ``VoiceCatalog.get`` (``name_key``: in any case, accents
    composed or decomposed, spaces around them aside), a clip by its voice name (``clone_name``). A clone
    file is judged as the folder scan judges it (``read_clone_clip``): one that cannot be a voice
    (shorter than ``MIN_CLIP_SECONDS``, silent, a transcript not saved as UTF-8, unreadable) is
    refused with the scan's reason and never offered among the valid voices.

    Args:
        name: the ``--voice`` given (None: the server chooses, nothing to check).
        voices_dir: the clone library and user presets folder (it may not exist).
        kinds: the model kinds enabled on the command line.
        speakers: the CustomVoice model's speakers, casefolded (``known_speakers``), or None.

    Raises:
        SystemExit: one line naming the voice, why it cannot be served, and the valid voices
            as the running server's messages list them (``service.shown_names``: by name, a
            name another voice takes listed once, the first 12 and how many in all).
    """
    custom = ModelKind.CUSTOM_VOICE in kinds
    if not name or not kinds or (custom and speakers is None):
        return
    wanted = name_key(name)
    if custom and speakers is not None and wanted in speakers:
        return
    clones: list[str] = []
    unusable: dict[str, tuple[str, str, str | None]] = {}  # name_key: a clip the catalogue skips (file, why, transcript)
    if ModelKind.BASE in kinds:
        for clip, read in _clone_clips(voices_dir):
            if isinstance(read, ClipSkip):  # the catalogue skips it (too short, silent, ...)
                unusable[name_key(clip.stem)] = (clip.name, _for_clients(read, clip), read.transcript)
            elif read is not None:
                clones.append(clone_name(clip.stem))
    if wanted in {name_key(clone) for clone in clones}:
        return
    presets = dict(VoiceCatalog(None, {ModelKind.VOICE_DESIGN}).shipped)  # no folder read, no log line
    presets.update(load_presets([voices_dir / PRESETS_FILE], VoiceSource.USER, presets))
    preset = next((v for v in presets.values() if wanted in {name_key(n) for n in (v.name, *v.aliases)}), None)
    if preset is not None and ModelKind.VOICE_DESIGN in kinds:
        return
    # The names the catalogue will serve, as every other message lists them (``shown_names``):
    # one per name key, a later layer's spelling winning (presets, speakers, clones).
    valid = {name_key(n): n for n in [
        *([v.name for v in presets.values()] if ModelKind.VOICE_DESIGN in kinds else []),
        *(sorted(speakers) if custom and speakers else []), *clones,
    ]}
    shown = shown_names(list(valid.values()))
    skipped = unusable.get(wanted)
    if skipped is not None:  # the folder scan's reason, as the catalogue's refusal after loading says it
        file, reason, transcript = skipped
        # A transcript's reason says what to do with it (save it as UTF-8); the clip is fine.
        why = (f"a clone whose transcript could not be used ({file}: {reason})" if transcript else
               f"a clone whose clip could not be used ({file}: {reason}); replace the file in the voices folder")
    elif preset is not None:
        why = f"the preset {preset.name!r} needs the VoiceDesign model (--design-model)"
    else:
        why = (f"neither a clone voice in {voices_dir}{'' if voices_dir.is_dir() else ' (no such folder)'}, a preset "
               f"nor a {'CustomVoice speaker' if custom else 'CustomVoice speaker (they need --custom-voice-model)'}")
    raise SystemExit(f"--voice {name!r}: {why}; valid voices: {shown}")


def _clip_files(voices_dir: Path) -> list[Path]:
    """The audio files of the voices folder (not dot-named ones: files being written), sorted;
    none when there is no folder."""
    if not voices_dir.is_dir():
        return []
    return sorted(p for p in voices_dir.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES and not p.name.startswith("."))


def _audio_seconds(path: Path) -> float | None:
    """The length of the clip at ``path`` in seconds, by its audio header; None: no readable header."""
    import soundfile

    try:
        info = soundfile.info(str(path))
    except Exception:  # noqa: BLE001 - any unreadable file is simply not offered
        return None
    return float(info.frames / info.samplerate) if info.samplerate else None


def _check_turns(engines: dict[ModelKind, Engine], plan: Residency) -> None:
    """Models taking turns: judge from what the Base model's load really left beside its
    weights (``sizing.turns_fit``) whether each other model can come in when it leaves; one
    that cannot is never loaded (its requests fail at once, the Base model stays), said in
    one log line."""
    home = engines.get(ModelKind.BASE)
    home_free = free_after_weights(ModelKind.BASE)
    needs = {n.kind: n for n in plan.needs}
    if not isinstance(home, OnDemandEngine) or not home.resident or home_free is None or "base" not in needs:
        return
    for kind, engine in engines.items():
        if kind is ModelKind.BASE or not isinstance(engine, OnDemandEngine) or engine.unservable is not None:
            continue
        why = turns_fit(home_free, needs["base"].weights, needs[kind.value]) if kind.value in needs else None
        if why is not None:
            engine.unservable = why
            _say_unservable(why)


def _say_unservable(why: str) -> None:
    """The one log line naming what this card cannot serve, and why."""
    _LOGGER.error(
        "Not served with this GPU memory: %s. Requests that need it fail at once; the other model stays "
        "on the GPU (free GPU memory: another process holds it?)", why,
    )


async def _load_ggml_engines(
    args: argparse.Namespace, sources: dict[ModelKind, str], models_dir: Path, metrics: Metrics
) -> dict[ModelKind, Engine]:
    """The CPU's GGML engines (qwentts.cpp), one per enabled model, warmed up; a checkpoint
    narrower than the widths the native library hard-codes (the tiny test checkpoints) falls
    back to the reference engine under ``--engine auto``.

    Raises:
        SystemExit: no model enabled, or a model failed to load or warm up.
    """
    engines: dict[ModelKind, Engine] = {}
    fell_back: list[ModelKind] = []  # on the reference engine instead
    for kind, source in sources.items():
        if not source or source.lower() == "none":
            continue
        engine: Engine
        try:
            if Path(source).expanduser().is_dir():  # a checkpoint qwentts.cpp cannot run: no conversion
                try:
                    check_checkpoint_widths(Path(source).expanduser())
                except NativeWidthError as err:
                    if args.engine != "auto":
                        raise
                    engines[kind] = await _load_reference_instead(args, kind, source, models_dir, metrics, err)
                    fell_back.append(kind)
                    continue
            pair = await asyncio.to_thread(resolve_gguf, source, models_dir, args.gguf_quant, args.local_files_only)
            _LOGGER.info("Loading %s model from %s and %s (GGML, CPU)", kind.value, *pair)
            try:
                engine = await asyncio.to_thread(
                    load_engine, kind, pair[0].parent, "cpu", args.chunk_size, "ggml",
                    gguf=pair, contexts=args.ggml_streams, quant=args.gguf_quant, ggml_threads=args.ggml_threads,
                    ggml_icl=args.ggml_icl,
                )
            except NativeWidthError as err:  # test checkpoints narrower than the release
                if args.engine != "auto":
                    raise
                engines[kind] = await _load_reference_instead(args, kind, source, models_dir, metrics, err)
                fell_back.append(kind)
                continue
        except SystemExit:
            raise
        except Exception as err:  # noqa: BLE001 - any load failure ends start-up with its reason
            raise SystemExit(_load_failure(kind, source, err)) from err
        engines[kind] = await _warmed(kind, engine)
    if not engines:
        raise SystemExit("No model enabled: set at least one of --clone-model, --design-model, --custom-voice-model")
    _LOGGER.info("%s", cpu_engines_line(cpu_reason(args.device), [k for k in engines if k not in fell_back], fell_back))
    return engines


async def _load_reference_instead(
    args: argparse.Namespace, kind: ModelKind, source: str, models_dir: Path, metrics: Metrics, why: BaseException,
    instead_of: str = "GGML",
) -> Engine:
    """Under ``--engine auto`` on the CPU: the reference engine for a checkpoint the GGML
    or pipeline engine (``instead_of``, named in the log line) cannot run (narrower than the
    release, e.g. the tiny test checkpoints), warmed up.

    Raises:
        SystemExit: it cannot load or warm up either.
    """
    reason = str(why).replace(": this checkpoint needs --engine reference", "")
    # Only checkpoints narrower than the release get here (the tiny test ones): no fault of the user's.
    _LOGGER.info("The %s model runs on the reference engine (slower), not on %s: %s", kind.value, instead_of, reason)
    try:
        checkpoint = await asyncio.to_thread(resolve_checkpoint, source, models_dir, args.local_files_only)
        _LOGGER.info("Loading %s model from %s on cpu", kind.value, checkpoint)
        engine = await asyncio.to_thread(
            load_engine, kind, checkpoint, "cpu", args.chunk_size, "reference", args.max_streams,
            metrics.join_stall.labels(kind.value).observe, args.dtype,
        )
    except Exception as err:  # noqa: BLE001 - any load failure ends start-up with its reason
        raise SystemExit(_load_failure(kind, source, err)) from err
    return await _warmed(kind, engine)


async def _warmed(kind: ModelKind, engine: Engine) -> Engine:
    """``engine`` after its warm-up, logged as ready.

    Raises:
        SystemExit: the warm-up failed.
    """
    try:
        await asyncio.to_thread(engine.warm, _warm_segment(kind, engine))
    except Exception as err:  # noqa: BLE001 - any warm-up failure ends start-up with its reason
        raise SystemExit(f"Warm-up of the {kind.value} model failed: {err!r}") from err
    _LOGGER.info("%s model ready (%s)", kind.value, _streams(engine))
    return engine


def _warm(kind: ModelKind, engine: Engine) -> None:
    """Warm ``engine`` up (graph capture and one short generation; blocking)."""
    engine.warm(_warm_segment(kind, engine))


def _is_memory(err: BaseException) -> bool:
    """A CUDA out-of-memory, or no room for even one stream."""
    return isinstance(err, MemoryFitError) or is_out_of_memory(err)


def _streams(engine: Engine) -> str:
    """A model's engine and how many streams it generates at once, for its "ready" line."""
    if "stream" in engine.backend:  # the GGML engine says it itself
        return engine.backend
    if isinstance(engine, OnDemandEngine) and not engine.resident:
        return f"{engine.backend}, streams sized when it loads"
    return f"{engine.backend}, {engine.capacity} stream(s) at once"


def _free_gpu() -> None:
    """Return what a failed load left in the allocator's cache to the card."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _load_failure(kind: ModelKind, source: str, err: BaseException) -> str:
    """The start-up failure in one line; for memory, the options to change; for a torchaudio
    that cannot load, whether it matches the installed torch (``torchaudio_mismatch``)."""
    if _is_memory(err):
        reason = str(err) if isinstance(err, MemoryFitError) else "CUDA out of memory"
        return f"Cannot load the {kind.value} model {source!r}: it does not fit in GPU memory ({reason}). Change one of: {MEMORY_OPTIONS}"
    hint = torchaudio_mismatch() if "torchaudio" in str(err) else None
    return f"Cannot load the {kind.value} model {source!r}: {err}" + (f" ({hint})" if hint else "")


def torchaudio_mismatch() -> str | None:
    """Why torchaudio cannot load beside the installed torch, or None where their versions
    agree (or either is missing). pip pairs a newer torch with the newest torchaudio on PyPI,
    whose metadata asks only for ``torch>=`` its own version, yet its compiled library loads
    only beside its own torch minor version (torchaudio 2.11.1 beside torch 2.13:
    "Could not load this library: .../_torchaudio.so")."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version, audio_version = version("torch"), version("torchaudio")
    except PackageNotFoundError:
        return None

    def minor(v: str) -> tuple[str, ...]:
        return tuple(v.split("+")[0].split(".")[:2])

    if minor(torch_version) == minor(audio_version):
        return None
    want = ".".join(minor(torch_version))
    return (f"torchaudio {audio_version} is built for torch {'.'.join(minor(audio_version))}, but torch "
            f"{torch_version} is installed: install the torchaudio of your torch "
            f"(pip install 'torchaudio=={want}.*'), or the pair the project pins (-c constraints.txt)")


def _residency(args: argparse.Namespace, device: str, checkpoints: dict[ModelKind, Path], max_len: int) -> Residency | None:
    """On CUDA: apply ``--gpu-memory``, then plan the models' residency (logged); None on the CPU."""
    if device != "cuda":
        for flag, given in (("--gpu-memory", args.gpu_memory is not None), ("--design-model-memory", args.design_model_memory != "auto")):
            if given:
                _LOGGER.warning("%s is ignored on the CPU: every model stays loaded in RAM", flag)
        if args.weight_quant_chosen == "int8":
            _LOGGER.info("Weight precision: int8 (--weight-quant int8), computed eagerly on the CPU")
        return None
    import torch

    free, total = torch.cuda.mem_get_info()
    if args.gpu_memory is not None:
        try:
            torch.cuda.set_per_process_memory_fraction(cap_fraction(args.gpu_memory, total))
        except ValueError as err:
            raise SystemExit(str(err)) from None
    budget = memory_budget(total, torch.cuda.memory_allocated(), free, args.gpu_memory)
    dtype, _note = pick_dtype(args.dtype, device, cuda_bf16_supported())
    element = 4 if dtype == "float32" else 2
    needs = [
        ModelNeed(kind.value, checkpoint_params(path) * element, checkpoint_slot_bytes(path, max_len, element))
        for kind, path in checkpoints.items()
    ]
    needs = _weights(args, budget, checkpoints, needs, element, dtype)
    plan = plan_residency(needs, budget, args.design_model_memory)
    _LOGGER.info(
        "GPU memory: %.1f GB for this server%s; weights %s; %s",
        budget / GB, f" (--gpu-memory {args.gpu_memory:g})" if args.gpu_memory else "",
        ", ".join(f"{n.kind} {n.weights / GB:.1f} GB" for n in needs), plan.reason,
    )
    return plan


def _weights(
    args: argparse.Namespace, budget: int, checkpoints: dict[ModelKind, Path], needs: list[ModelNeed], element: int,
    dtype: str,
) -> list[ModelNeed]:
    """``--weight-quant`` on CUDA: choose the weights the batched engine loads (sets
    ``args.weight_quant_chosen``; one "Weight precision: ..." log line saying which and why,
    which ``benchmarks/memory.py`` reads) and return the models' needs with them."""
    small = [
        ModelNeed(n.kind, int8_weights(n.weights, quantized_params(path), element), n.slot)
        for n, path in zip(needs, checkpoints.values(), strict=True)
    ]
    quant, why = pick_weight_quant(args.weight_quant, budget, needs, small, dtype=dtype)
    if quant == "int8" and pick_engine(args.engine, "cuda") != "batched":
        quant, why = "none", f"{dtype}: --weight-quant int8 serves the batched engine only, not --engine {args.engine}"
    args.weight_quant_chosen = quant
    _LOGGER.info("Weight precision: %s", why)
    return small if quant == "int8" else needs
