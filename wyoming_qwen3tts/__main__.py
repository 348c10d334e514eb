"""Command line: load the models (on CUDA, capture their graphs), then serve Wyoming (and HTTP)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from wyoming.server import AsyncServer, AsyncTcpServer

from . import __version__
from .service.anchors import AnchorMode, Anchors, AnchorStore
from .service.clips import ClipPreparer, follow_default_voice
from .doors.wyoming.discovery import Announcer
from .engine import DTYPES, ENGINES, Engine, resolve_checkpoint
from .engine.gpu.on_demand import DEFAULT_IDLE_S
from .engine.gpu.precision import WEIGHT_QUANTS
from .engine.gpu.sizing import DESIGN_MEMORY
from .engine.cpu.defaults import CPU_DEFAULT_SPEAKER, cpu_default_voice
from .engine.cpu.ggml import GgmlEngine
from .engine.cpu.gguf_files import DEFAULT_QUANT as DEFAULT_GGUF_QUANT, QUANTS as GGUF_QUANTS, gguf_identity
from .common.metrics import Metrics
from .doors.wyoming.handler import DEFAULT_MAX_CONNECTIONS
from .doors.limits import DEFAULT_IDLE_TIMEOUT, DEFAULT_WRITE_TIMEOUT, MAX_SEED
from .common.quiet import drop_default_config_notes, quiet_compilers, quiet_dependencies, restore_console, route_hub_logs
from .startup import load_engines, no_voices_message, no_voices_warning, studio_address, survey_clips
from .service.speech import DEFAULT_MAX_CHARS, DEFAULT_MAX_QUEUE, TtsService
from .service.default_voice import DEFAULT_RULE, DEFAULT_VOICE, pick_default_voice
from .doors.http.studio import HA_INGRESS_PEER
from .common.vocabulary import ModelKind, Reference
from .catalogue.voices import VoiceCatalog
from .doors.http.ws_events import browser_can_offer_key, header_safe_key

if TYPE_CHECKING:
    from aiohttp import web

    from .doors.wyoming.handler import Connections

_LOGGER = logging.getLogger("wyoming_qwen3tts")

DEFAULT_MODELS = {
    ModelKind.BASE: "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
    ModelKind.VOICE_DESIGN: "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
    ModelKind.CUSTOM_VOICE: "none",
}
#: Seconds the open streams get to send their last events on shutdown (SIGTERM). With
#: the other steps' bounds below the process ends within 10 s (Docker's default grace).
SHUTDOWN_GRACE_S = 2.0


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default only where it says something (not None, "" or False) and the
    help text does not already name it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, "", False) or "default" in text:
            return text
        return super()._get_help_string(action)


def _voice_option(value: str) -> str | None:
    """``--voice``: the name, stripped; None (the server chooses) for ``auto`` in any case,
    as the add-on's option is written, or an empty value (voice names match any case too)."""
    value = value.strip()
    return None if value.casefold() in ("", "auto") else value


def build_parser() -> argparse.ArgumentParser:
    """The CLI; flag names are stable (docs, the add-on and tests use them)."""
    parser = argparse.ArgumentParser(prog="wyoming-qwen3tts", description=__doc__, formatter_class=_HelpFormatter)
    parser.add_argument("--uri", default="tcp://0.0.0.0:10200", help="Wyoming listen URI (tcp:// or unix://)")
    parser.add_argument("--data-dir", default="data", help="Models download here (DIR/models)")
    parser.add_argument("--voices-dir", help="Clone library and presets.toml (default: DATA_DIR/voices)")
    parser.add_argument("--clone-model", default=DEFAULT_MODELS[ModelKind.BASE], help="Base model: hub id, folder or none (without a GPU, when neither this nor --custom-voice-model is named: the 0.6B Base model)")
    parser.add_argument("--design-model", default=DEFAULT_MODELS[ModelKind.VOICE_DESIGN], help="VoiceDesign model: hub id, folder or none")
    parser.add_argument("--custom-voice-model", default=DEFAULT_MODELS[ModelKind.CUSTOM_VOICE], help="CustomVoice model: hub id, folder or none (without a GPU, when neither this nor --clone-model is named: the 0.6B CustomVoice model, speaker ryan)")
    parser.add_argument("--voice", type=_voice_option, help=f"Default voice; auto (any case) or empty: {DEFAULT_VOICE!r} if available (without a GPU, with the CPU's CustomVoice model: {CPU_DEFAULT_SPEAKER!r}), else the first by name")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="auto: CUDA when available")
    parser.add_argument("--chunk-size", type=int, default=1, help="Codec frames per audio chunk (80 ms each); 1 starts soonest and, on the batched engine, costs no speed")
    parser.add_argument("--chunk-growth", action="store_true", help="Batched engine: first chunk of one frame, then 2, 4, 8... frames up to --chunk-size (first audio as with --chunk-size 1, fewer chunks after)")
    parser.add_argument("--engine", choices=ENGINES, default="auto", help="auto: batched on CUDA; on the CPU pipeline where it runs, else ggml (qwentts.cpp) when its wheel runs here, else reference; pipeline: on the CPU, our ggml graphs generating on one thread (GGUF weights, --gguf-quant) and the codec on ONNX Runtime on another (both converted/exported once into --data-dir)")
    parser.add_argument("--max-streams", type=_streams, default="auto", help="Streams generated at once per model (batched engine); auto: as many as the GPU memory left after the weights holds (8 on the CPU)")
    parser.add_argument("--gpu-memory", type=float, metavar="GB", help="Most GPU memory this server may use, in GB (to share the card with another program, e.g. an LLM); streams are sized within it (default: the whole card)")
    parser.add_argument("--design-model-memory", choices=DESIGN_MEMORY, default="auto", help="VoiceDesign model in GPU memory: resident (always), on-demand (loaded for anchors, designs and instructions, dropped when idle), auto (resident when both models fit, else the models take turns on the GPU)")
    parser.add_argument("--design-model-idle", type=float, default=DEFAULT_IDLE_S, metavar="SECONDS", help="--design-model-memory on-demand: seconds without work before the VoiceDesign model leaves GPU memory")
    parser.add_argument("--ggml-streams", type=int, default=0, help="GGML engine: streams generated at once per model, each a native context with its own copy of the weights (0: chosen from the machine: one per 2 cores, at least 2 so a second client is heard at once, at most 4, as many as free memory holds; the log says why)")
    parser.add_argument("--ggml-threads", type=int, default=0, help="GGML engine: CPU threads per stream, half of them decoding audio (0: by the machine, engine.cpu.machine.default_threads: 1 on one core, 2 on 2-7 cores, 4 on 8-11, 6 on 12-15, 8 from 16); 3 on 2 cores starts speaking sooner but generates slower")
    parser.add_argument("--ggml-icl", action="store_true", help="GGML and pipeline engines: clone voices with a transcript are cloned in context (closer likeness), but the first request of each clip on each stream waits about 2 s per second of reference clip (2 cores) before its first audio (the default voice pays it ahead: at start, or between requests for a default picked while serving); default: by x-vector, starting at once")
    parser.add_argument("--generation-threads", type=int, default=0, help="pipeline engine: CPU threads generating codec frames (0: by the machine, engine.cpu.machine.pipeline_threads: half the cores, the odd one included, at most 4; 1 on 2 cores, 2 on 4)")
    parser.add_argument("--codec-threads", type=int, default=0, help="pipeline engine: ONNX Runtime threads decoding audio (0: by the machine: half the cores, at least 1, at most 4; 1 on 2 cores, 2 on 4)")
    parser.add_argument("--gguf-quant", type=str.upper, choices=GGUF_QUANTS, default=DEFAULT_GGUF_QUANT, help="GGML and pipeline engines: weights fetched or converted at this quantization (Q4_0: 4-bit generation weights, converted from a checkpoint folder only; Q4_K_M: downloaded only)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="Weights: auto is bfloat16 on CUDA (float16 on GPUs without bfloat16, logged), float32 on the CPU")
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS, help="Longest text per request")
    parser.add_argument("--seed", type=int, help="Seed for requests that bring none (default: random per stream)")
    parser.add_argument("--fixed-frames", type=int, help="Benchmarks: generate exactly N codec frames per sentence")
    parser.add_argument("--zeroconf", nargs="?", const="", default="", metavar="NAME", help="Announce on the LAN (default on; optional service name)")
    parser.add_argument("--no-zeroconf", action="store_true", help="Do not announce on the LAN")
    parser.add_argument("--zeroconf-address", metavar="[HOST]:PORT", help="Announce this address instead of this server's (a load balancer in front of several servers: one of them announces it); HOST defaults to this machine's LAN address")
    parser.add_argument("--http-host", default="0.0.0.0", help="OpenAI-compatible endpoint address")
    parser.add_argument("--http-port", type=int, default=8880, help="OpenAI-compatible endpoint port (0 = off)")
    parser.add_argument("--api-key", help="Bearer key required by the HTTP endpoint")
    parser.add_argument("--local-files-only", action="store_true", help="Never download; use only local files")
    # GPU weights (engine/gpu/precision.py, engine/batched/quant.py)
    parser.add_argument("--weight-quant", choices=WEIGHT_QUANTS, default="auto", help="Batched engine: int8 stores the talker's and code predictor's weights in 8 bits (per-channel scales; a 1.7B model's weights take 2.4 GB instead of 4.2), none keeps --dtype's; auto: int8 when the GPU memory the card reports free is too short for every model at full precision with 4 streams each")
    # Voice studio (service/anchors.py, doors/http/studio.py)
    parser.add_argument("--anchors", choices=["auto", "all", "used", "kept", "off"], default="auto", help="Preset anchors: all (every VoiceDesign preset rendered once in the background, then cloned by the Base model), used (the default voice and presets once used), kept (none rendered: only designs kept in the voice studio, with the clip you heard), off (presets designed live for every sentence); auto: all with CUDA, kept on the CPU")
    parser.add_argument("--ingress-peer", default=HA_INGRESS_PEER if os.environ.get("SUPERVISOR_TOKEN") else None, help="Address of Home Assistant's ingress proxy: its requests (with X-Ingress-Path) need no API key (default: 172.30.32.2 inside a Home Assistant add-on, else none)")
    # Limits (hardening): admission, stalled and idle clients.
    parser.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE, help="Most requests open at once (Wyoming, HTTP and WebSocket doors together); more are refused at once (Wyoming and WebSocket error overloaded, HTTP 429)")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, help="Most Wyoming connections; past it the longest-idle one is closed")
    parser.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT, help="Seconds before an idle connection (no traffic, no audio owed) is closed")
    parser.add_argument("--write-timeout", type=float, default=DEFAULT_WRITE_TIMEOUT, help="Seconds a client may leave audio unread before its stream is dropped")
    parser.add_argument("--drain-seconds", type=float, default=0.0, help="On shutdown, seconds /ready says not-ready while requests are still served, so a load balancer's health check sends new work elsewhere first (behind a balancer: a few health-check intervals); then up to as long again for open requests to end")
    parser.add_argument("--debug", action="store_true", help="Debug logging")
    parser.add_argument("--version", action="version", version=__version__)
    return parser


def _streams(text: str) -> int | None:
    """``--max-streams``: "auto" (None) or a count."""
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number, got {text!r}") from None


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad settings before the (slow) model load.

    Raises:
        SystemExit: with a one-line reason.
    """
    for flag, value in (("--chunk-size", args.chunk_size), ("--max-chars", args.max_chars), ("--fixed-frames", args.fixed_frames), ("--max-streams", args.max_streams)):
        if value is not None and value < 1:
            raise SystemExit(f"{flag} must be at least 1, got {value}")
    if args.ggml_streams < 0:
        raise SystemExit(f"--ggml-streams must be 0 (auto) or more, got {args.ggml_streams}")
    if args.ggml_threads < 0:
        raise SystemExit(f"--ggml-threads must be 0 (auto) or more, got {args.ggml_threads}")
    for flag, value in (("--generation-threads", args.generation_threads), ("--codec-threads", args.codec_threads)):
        if value < 0:
            raise SystemExit(f"{flag} must be 0 (auto) or more, got {value}")
    for flag, value in (("--max-queue", args.max_queue), ("--max-connections", args.max_connections)):
        if value < 1:
            raise SystemExit(f"{flag} must be at least 1, got {value}")
    for flag, seconds in (("--idle-timeout", args.idle_timeout), ("--write-timeout", args.write_timeout)):
        if not seconds > 0:
            raise SystemExit(f"{flag} must be more than 0 seconds, got {seconds}")
    if not 0 <= args.drain_seconds <= 600:
        raise SystemExit(f"--drain-seconds must be 0..600, got {args.drain_seconds}")
    if args.zeroconf_address is not None:
        _zeroconf_address(args.zeroconf_address)
    if not args.design_model_idle > 0:
        raise SystemExit(f"--design-model-idle must be more than 0 seconds, got {args.design_model_idle}")
    if args.gpu_memory is not None and not args.gpu_memory > 0:
        raise SystemExit(f"--gpu-memory must be more than 0 GB, got {args.gpu_memory}")
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        raise SystemExit(f"--seed must be 0..{MAX_SEED}, got {args.seed}")
    _check_writable("--data-dir", Path(args.data_dir))
    _kernel_cache(Path(args.data_dir))
    if args.voices_dir is not None:
        _check_voices_dir(Path(args.voices_dir), Path(args.data_dir))
    if not 0 <= args.http_port <= 65535:
        raise SystemExit(f"--http-port must be 0..65535, got {args.http_port}")
    if args.api_key and not header_safe_key(args.api_key):
        raise SystemExit(
            "--api-key must be printable ASCII with no space at either end: it travels in an HTTP "
            "header, which the openai SDK and browsers cannot fill with other characters "
            "(openssl rand -hex 32 makes a key that works everywhere)"
        )
    if args.api_key and args.http_port and not browser_can_offer_key(args.api_key):
        _LOGGER.warning(
            "--api-key holds characters outside letters, digits and !#$%&'*+-.^_`|~: HTTP clients "
            "and the studio can send it, but a browser cannot offer it to the WebSocket door "
            "(openssl rand -hex 32 makes a key that works everywhere)"
        )
    try:
        AsyncServer.from_uri(args.uri)
    except ValueError as err:
        raise SystemExit(f"--uri {args.uri}: {err}") from None
    uri = urlparse(args.uri)
    ports = [("--uri", uri.hostname or "0.0.0.0", uri.port)] if uri.scheme == "tcp" else []
    ports += [("--http-port", args.http_host, args.http_port)] if args.http_port else []
    with contextlib.ExitStack() as probes:  # fail now, not after loading the models
        for flag, host, port in ports:  # held together: --http-port equal to --uri's port fails too
            probe = probes.enter_context(socket.socket())
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers do
            try:
                probe.bind((host, port))
                probe.listen()
            except OSError as err:
                raise SystemExit(f"{flag}: cannot listen on {host}:{port}: {err.strerror}") from None


def _kernel_cache(data_dir: Path) -> None:
    """Keep the compiled GPU kernels (Triton's cache) in ``data_dir/cache/triton``, so that a
    restart, e.g. a new add-on container, finds them: compiling them made an H200's cold start
    32 s longer (graph capture 40.3 s against 8.1 s with the cache filled,
    ``benchmarks/results/profile/README.md``). A ``TRITON_CACHE_DIR`` already set wins."""
    os.environ.setdefault("TRITON_CACHE_DIR", str((data_dir / "cache" / "triton").resolve()))


def _check_writable(flag: str, folder: Path, required: bool = True) -> None:
    """Create ``folder`` if missing and check that files can be written there.

    Args:
        required: whether an existing read-only folder is an error; if not (a voices folder
            mounted read-only on purpose) it is served as it is, with a warning that the
            voice studio cannot save there.

    Raises:
        SystemExit: it is a file, it cannot be created, or (``required``) written.
    """
    if folder.exists() and not folder.is_dir():
        raise SystemExit(f"{flag} {folder}: is a file, not a folder: name a folder (or move the file away)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SystemExit(f"{flag} {folder}: cannot write there: {err.strerror or err}") from None
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as err:
        if required:
            raise SystemExit(f"{flag} {folder}: cannot write there: {err.strerror or err}") from None
        _LOGGER.warning("%s %s is read-only (%s): voices are served, the voice studio cannot save there", flag, folder, err.strerror or err)


def _check_voices_dir(folder: Path, data_dir: Path) -> None:
    """Check the folder named with ``--voices-dir`` before the models load.

    An existing folder is checked as ``_check_writable`` does (a read-only one is served,
    with a warning). A folder that does not exist is created only where its parent does,
    with a WARNING naming it: a mistyped name (``/data/voises``) would otherwise give an
    empty library and nothing but "no voices" to notice it by. Where the parent is missing
    too, start-up stops. ``data_dir/voices``, the default's own path (the Docker image names
    it), is created quietly, as the default is.

    Raises:
        SystemExit: neither the folder nor its parent exists, or the folder cannot be created.
    """
    target = folder.resolve()
    new = not folder.exists() and target != (data_dir / "voices").resolve()
    if new and not target.parent.exists():
        raise SystemExit(
            f"--voices-dir {folder}: the folder {target} does not exist, nor its parent {target.parent}: "
            f"check the path for a typo, or create the folder first (mkdir -p {target})"
        )
    _check_writable("--voices-dir", folder, required=False)
    if new:
        _LOGGER.warning(
            "--voices-dir %s: the folder %s did not exist, so it was created, empty. If the path is mistyped, "
            "stop the server and name the right folder; else put clone voices there (<id>.wav and its "
            "transcript <id>.txt)", folder, target,
        )


async def _anchors(
    args: argparse.Namespace, engines: dict[ModelKind, Engine], catalog: VoiceCatalog, default_voice: str
) -> Anchors | None:
    """The presets' anchors per ``--anchors`` (None: presets are designed live)."""
    if ModelKind.VOICE_DESIGN not in engines:
        return None
    choice = args.anchors
    if choice == "auto":
        choice = "kept" if args.on_cpu else "all"  # on_cpu: set by load_engines (no torch import here)
    if choice == "off":
        _LOGGER.info("Preset anchors are off (--anchors off): presets are designed live for every sentence")
        return None
    try:
        design = engines[ModelKind.VOICE_DESIGN]
        checkpoint = await asyncio.to_thread(
            gguf_identity, design.files, Path(args.data_dir) / "models"
        ) if isinstance(design, GgmlEngine) else await asyncio.to_thread(
            resolve_checkpoint, args.design_model, Path(args.data_dir) / "models", True
        )
    except FileNotFoundError as err:
        _LOGGER.error("Preset anchors are off: cannot find the VoiceDesign checkpoint (%s)", err)
        return None
    store = AnchorStore(Path(args.data_dir) / "anchors")
    return Anchors(store, catalog, AnchorMode(choice), checkpoint, default_voice, ModelKind.BASE in engines)


async def main(argv: list[str] | None = None) -> None:
    """Start everything, serve until SIGINT/SIGTERM, then shut down cleanly."""
    args = build_parser().parse_args(argv)
    args.given = {a.split("=", 1)[0] for a in (sys.argv[1:] if argv is None else argv) if a.startswith("--")}
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    route_hub_logs()
    drop_default_config_notes()
    quiet_compilers()
    for sig in (signal.SIGINT, signal.SIGTERM):  # until serving: see _stop_during_start_up
        signal.signal(sig, _stop_during_start_up)
    check_args(args)
    if not args.debug:  # third-party chatter: banners, optional SoX binary, progress bars
        quiet_dependencies(models=False)  # qwen_tts is imported where a PyTorch engine loads
    metrics = Metrics()
    engines = await load_engines(args, metrics)
    custom = engines.get(ModelKind.CUSTOM_VOICE)
    voices_dir = Path(args.voices_dir) if args.voices_dir else Path(args.data_dir) / "voices"
    voices_dir.mkdir(parents=True, exist_ok=True)
    if ModelKind.BASE in engines:
        _LOGGER.info("Clone voices: put <id>.wav and <id>.txt in %s", voices_dir.resolve())
    catalog = VoiceCatalog(voices_dir, set(engines), custom.speakers() if custom else [])
    names = [v.name for v in catalog.voices()]
    studio = studio_address(args.http_host, args.http_port, bool(args.ingress_peer)) if args.http_port else None
    no_voice: str | None = None  # the warning of a server that starts with no voice
    if not names:
        _, skipped = survey_clips(voices_dir)
        named = {item.rsplit(" (", 1)[0] for item in skipped}  # and the clips read but unusable (silent...)
        unusable = [item.split(": ", 1) for item in catalog.skipped_clips()]
        skipped += [f"{name} ({why})" for name, why in unusable if name not in named]
        if studio is None:  # no studio (--http-port 0): nothing could ever add a voice
            raise SystemExit(no_voices_message(voices_dir) + (f"; skipped: {', '.join(skipped)}" if skipped else ""))
        no_voice = no_voices_warning(voices_dir.resolve(), studio, skipped)
    default_voice = args.voice or pick_default_voice(names)
    if not args.voice and custom is not None and getattr(args, "cpu_speaker_default", False) and default_voice:
        default_voice = cpu_default_voice(custom.speakers(), default_voice)  # a speaker: no design on the CPU
    if default_voice is not None:
        try:
            default_voice = catalog.get(default_voice).name  # the catalogue's spelling (or an alias's voice)
        except KeyError as err:
            raise SystemExit(f"--voice: {err}") from None
        await _prime_default_voice(catalog, default_voice, engines)
    anchors = await _anchors(args, engines, catalog, default_voice) if default_voice is not None else None  # voice studio
    service = TtsService(
        catalog, engines, default_voice, metrics,
        max_chars=args.max_chars, seed=args.seed, fixed_frames=args.fixed_frames, anchors=anchors,
        max_queue=args.max_queue, studio=studio,
        default_explicit=bool(args.voice),  # the add-on's voice: auto passes no --voice
    )
    if anchors is not None:  # a VoiceDesign model that can never load renders none: stored ones still serve
        await anchors.begin(service.render_design, rendering=service.unservable(ModelKind.VOICE_DESIGN) is None)
    # Now that the stored anchors are known: an automatic default is a voice that can be spoken
    # (not a preset of a VoiceDesign model this GPU cannot hold); a --voice one that cannot is said at ERROR.
    default_voice = service.default_voice
    await _prepare_clips(engines, catalog, anchors)
    follow_default_voice(service, engines)  # GGML: a default chosen from now on, prepared between requests
    _LOGGER.info("%d voice(s); default %s", len(names), default_voice or f"none yet: the first voice added ({DEFAULT_RULE}, where several are added together)")
    # The models and libraries loaded so far live as long as the process: keep them out of
    # every garbage collection (no pauses scanning them while serving, and no 10 s final
    # collection at exit, which would outlast Docker's stop grace).
    gc.freeze()

    from .doors.wyoming.handler import Connections, WyomingLimits

    connections = Connections(
        service,
        WyomingLimits(
            write_timeout=args.write_timeout, idle_timeout=args.idle_timeout, max_connections=args.max_connections
        ),
    )
    server = AsyncServer.from_uri(args.uri)
    await server.start(connections)
    http_runner = None
    if args.http_port:
        from .doors.http.api import start_http
        from .doors.http.request import loaded_model_names

        sources = {kind: source for kind, source in getattr(args, "model_sources", {}).items() if kind in engines}
        http_runner = await start_http(
            service, args.http_host, args.http_port, args.api_key, ingress_peer=args.ingress_peer,
            write_timeout=args.write_timeout, idle_timeout=args.idle_timeout,
            model_names=loaded_model_names(sources),
        )
    announcer = None
    if isinstance(server, AsyncTcpServer) and not args.no_zeroconf:
        uri = urlparse(args.uri)
        host, port = uri.hostname or "0.0.0.0", uri.port or 10200
        if args.zeroconf_address is not None:  # the load balancer's address, not this server's
            host, port = _zeroconf_address(args.zeroconf_address)
        announcer = Announcer(args.zeroconf or f"qwen3tts-{socket.gethostname()}", host, port)
        await announcer.start()
    if no_voice is not None:  # said once it serves: the studio's address now answers
        _LOGGER.warning("%s", no_voice)
    _LOGGER.info("Ready: Wyoming on %s", args.uri)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal ends the process at once
        loop.remove_signal_handler(sig)
    await shutdown(server, connections, http_runner, announcer, service, anchors, args.drain_seconds)


async def _prime_default_voice(catalog: VoiceCatalog, name: str, engines: dict[ModelKind, Engine]) -> None:
    """A clone default voice's prompt, prepared before serving where the engine's first use
    of a clip is slow (the GGML engine: seconds on a small CPU), so that the first request,
    most likely for the default voice, does not wait for it."""
    voice = catalog.get(name)
    engine = engines.get(voice.kind)
    if voice.reference is None or engine is None:
        return
    started = time.monotonic()
    if await asyncio.to_thread(engine.prime, voice.reference):
        _LOGGER.info("Default voice %s: its clip prepared in %.1f s", name, time.monotonic() - started)


# --- GPU memory (issue 25): clone clips prepared before they are asked for ---------------


async def _prepare_clips(engines: dict[ModelKind, Engine], catalog: VoiceCatalog, anchors: Anchors | None) -> ClipPreparer | None:
    """Prepare every clone clip (and stored preset anchor) on the Base engine now, and keep
    preparing new or changed ones as they appear (``clips.ClipPreparer``); None where the
    Base engine cannot prepare while it serves (the GGML engine: ``_prime_default_voice``)."""
    base = engines.get(ModelKind.BASE)
    if base is None or not getattr(base, "prime_any_time", False):
        return None

    def clones() -> list[Reference]:
        return [v.reference for v in catalog.voices() if v.kind is ModelKind.BASE and v.reference is not None]

    preparer = ClipPreparer(base, [clones] + ([anchors.ready_references] if anchors is not None else []), catalog.refresh_async)
    started = time.monotonic()
    count = await preparer.prepare_new()
    if count:
        _LOGGER.info("%d clone clip(s) prepared in %.1f s", count, time.monotonic() - started)
    preparer.start()
    return preparer


def _stop_during_start_up(signum: int, _frame: object) -> None:
    """SIGTERM or SIGINT before the server serves (a model download, conversion, load or
    graph capture can take minutes; ``docker stop`` or the add-on's restart comes meanwhile):
    say so in the log and exit at once with status 0. Nothing is open to close yet, and the
    loading threads cannot be interrupted (without this the process died silently with 143,
    or waited for the load to end on Ctrl-C). Nothing half written is taken for whole at the
    next start: a Hugging Face download resumes from its ``.incomplete`` file, and a GGUF
    conversion without its ``.complete`` marker is done again. The serving loop's own
    handlers replace this one once the server is ready."""
    restore_console()  # a model import may have the console pointed at /dev/null meanwhile
    _LOGGER.info("Stopped during start-up (%s): nothing was served yet", signal.Signals(signum).name)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _zeroconf_address(value: str) -> tuple[str, int]:
    """``--zeroconf-address``'s ``HOST:PORT`` or ``:PORT`` as (host, port); host "0.0.0.0"
    (this machine's LAN address) when absent.

    Raises:
        SystemExit: not of that form.
    """
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit(f"--zeroconf-address must be HOST:PORT or :PORT, got {value!r}")
    return host or "0.0.0.0", int(port)


async def shutdown(
    server: AsyncServer,
    connections: Connections,
    http_runner: web.AppRunner | None,
    announcer: Announcer | None,
    service: TtsService,
    anchors: Anchors | None,
    drain_seconds: float = 0.0,
) -> None:
    """Stop cleanly in under 10 s (after the drain, if any): stop accepting, withdraw the
    zeroconf announcement, end every open stream (Wyoming: ``error`` ``server-stopping``
    then ``audio-stop``; HTTP: an SSE ``error`` event, or a body cut without its final
    chunk), close every connection, stop the engines (their threads are daemons: a generation mid-frame does not hold the
    exit); a preset anchor being rendered is cancelled. Before all that, ``/ready`` turns
    not-ready and the server serves on for ``drain_seconds`` (``--drain-seconds``: a load
    balancer takes it out of rotation meanwhile), then waits up to ``drain_seconds`` more
    for the requests still open to end."""
    started = time.monotonic()
    _LOGGER.info("Shutting down: %d request(s) open, %d Wyoming connection(s)", service.open_streams, len(connections))
    service.drain()  # /ready turns 503 first: a load balancer stops sending new work
    if drain_seconds > 0:
        _LOGGER.info("Draining for %.1f s: /ready says not-ready, requests are still served", drain_seconds)
        await asyncio.sleep(drain_seconds)
        finish_by = time.monotonic() + drain_seconds  # then as long again for open requests to end
        if service.open_streams:
            _LOGGER.info("Drained: waiting up to %.1f s for %d open request(s)", drain_seconds, service.open_streams)
        while service.open_streams and time.monotonic() < finish_by:
            await asyncio.sleep(0.1)
    listener = getattr(server, "_server", None)  # wyoming 1.10's AsyncTcpServer/AsyncUnixServer
    if listener is not None:
        listener.close()  # no new connections; open ones carry on
    if http_runner is not None:
        from .doors.http.api import stop_listening

        await stop_listening(http_runner)
    if announcer is not None:
        try:
            await asyncio.wait_for(announcer.stop(), 2.0)
        except (asyncio.TimeoutError, OSError) as err:
            _LOGGER.warning("Zeroconf: could not withdraw the announcement: %r", err)
    service.shutdown()
    if anchors is not None:
        await anchors.stop()
    await connections.shutdown(SHUTDOWN_GRACE_S)
    await server.stop()
    if http_runner is not None:
        await http_runner.cleanup()  # responses still open get aiohttp's 2 s, then are cancelled
    await asyncio.to_thread(service.stop, 1.0)
    _LOGGER.info("Stopped in %.1f s", time.monotonic() - started)


def run() -> None:
    """Console-script entry point."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    # Served and shut down cleanly: everything is closed. Skip the interpreter's teardown
    # of torch and co (seconds on a busy machine, counted against Docker's stop grace).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    run()
