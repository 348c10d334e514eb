"""The CPU engine: qwentts.cpp (GGML) through its Python binding ``qwentts_cpp_cpu``.

realtimetts-qwen-native-cpu ships qwentts.cpp, a native Qwen3-TTS (talker, code predictor,
speaker encoder, codec) on GGML, as one shared library per platform. One ``QwenTTS`` context
holds one copy of the weights and generates one stream at a time; this engine keeps
``contexts`` of them, each served by its own thread that takes work from the scheduler, so
that many streams run at once and the rest wait in the queue as on the other engines.

The native generator streams audio through a callback as the codec decodes it, checks a
cancel callback at every frame (so a client that leaves stops its generation within a
frame), takes the request's seed (its sampler is a pure function of it), language and
sampling settings, and serves every voice kind: Base clones (by the clip's x-vector; with
``icl`` and a transcript in context, the clip's codec codes in the prompt too), CustomVoice
speakers (with an optional instruction) and VoiceDesign descriptions. A clip's x-vector and
codes are extracted once (natively) and cached by its digest.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from ...common.quiet import native_output
from ...common.vocabulary import ModelKind, Reference
from ..base import Engine, ModelMismatchError, Work, WorkSource
from ..prompts import PROMPT_CACHE_SIZE, REFERENCE_TAIL_SECONDS
from ..segment import Segment
from ..serial import deliver

_LOGGER = logging.getLogger(__name__)

#: x86-64 instructions the published wheels are built for (``GGML_NATIVE=OFF`` with a fixed
#: AVX2/FMA/F16C/BMI2 baseline and no runtime dispatch: without them the library faults).
REQUIRED_X86_FLAGS = ("avx2", "fma", "f16c", "bmi2")
#: Sample rate the native library takes reference clips at (Hz).
NATIVE_RATE = 24_000
#: Seconds a cancelled native generation gets to return before its context is reused.
CANCEL_JOIN_S = 5.0


def native_support() -> tuple[bool, str]:
    """Whether the GGML engine can run here, and why (one line for the log).

    Checks the CPU's instructions (x86-64: ``REQUIRED_X86_FLAGS`` in /proc/cpuinfo) before
    loading the library, because a wheel built for them crashes the process on a CPU without.
    """
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
        except OSError:
            text = ""
        flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
        missing = [flag for flag in REQUIRED_X86_FLAGS if flag not in flags]
        if missing:
            return False, f"the CPU lacks {'/'.join(f.upper() for f in missing)} (the qwentts.cpp wheel needs AVX2/FMA/F16C/BMI2)"
    elif not (machine in ("arm64", "aarch64") and platform.system() == "Darwin"):
        return False, f"no qwentts.cpp wheel for {platform.system()} {machine}"
    try:
        import qwentts_cpp_cpu

        library = qwentts_cpp_cpu.QwenLibrary()
        version = library.version()
    except Exception as err:  # noqa: BLE001 - not installed, ABI mismatch, missing libc: all "no"
        return False, f"the qwentts.cpp wheel (realtimetts-qwen-native-cpu) does not load: {err}"
    return True, f"qwentts.cpp {version} loads and the CPU has AVX2/FMA/F16C/BMI2"


def gguf_model_type(talker: Path) -> str:
    """The talker file's ``qwen3-tts.model_type`` ("base", "custom_voice", "voice_design").

    Raises:
        ValueError: not a readable qwen3-tts talker GGUF (message names the file).
    """
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(talker))
        fields = reader.fields

        def text(key: str) -> str:
            field = fields[key]
            return bytes(field.parts[field.data[0]]).decode()

        arch = text("general.architecture")
        if arch != "qwen3-tts":
            raise ValueError(f"architecture {arch!r}, expected 'qwen3-tts'")
        return text("qwen3-tts.model_type")
    except Exception as err:  # noqa: BLE001 - the reader raises many types on a bad file
        raise ValueError(f"{talker} is not a Qwen3-TTS talker GGUF: {err}") from err


#: Widths qwentts.cpp hard-codes (its streaming codec state and DAC, its ECAPA speaker
#: encoder), as (GGUF tensor, ggml dimension, value): every released checkpoint has them,
#: narrower test checkpoints abort the process inside the library instead of failing.
NATIVE_WIDTHS = (
    ("tok_dec.vq_first.output_proj.weight", 2, 512),  # RVQ output (pre-conv input) width
    ("tok_dec.pre_conv.weight", 2, 1024),  # codec latent width
    ("tok_dec.dec.0.conv.weight", 2, 1536),  # DAC input channels
    ("spk_enc.conv0.weight", 2, 512),  # ECAPA hidden channels (Base only)
)


class NativeWidthError(ValueError):
    """The files' widths are not those qwentts.cpp hard-codes (``NATIVE_WIDTHS``)."""


#: The same widths in a Hugging Face checkpoint's ``speech_tokenizer/config.json``
#: (``decoder_config``), checked before a checkpoint is converted.
NATIVE_CONFIG_WIDTHS = (("codebook_dim", 512), ("latent_dim", 1024), ("decoder_dim", 1536))


def check_checkpoint_widths(checkpoint: Path) -> None:
    """Refuse a checkpoint folder whose codec qwentts.cpp cannot run, before converting it
    (reads ``speech_tokenizer/config.json``; a folder without one is left to the converter).

    Raises:
        NativeWidthError: a width differs from ``NATIVE_CONFIG_WIDTHS``.
    """
    import json

    config = checkpoint / "speech_tokenizer" / "config.json"
    if not config.is_file():
        return
    decoder = json.loads(config.read_text()).get("decoder_config", {})
    for key, width in NATIVE_CONFIG_WIDTHS:
        if key in decoder and decoder[key] != width:
            raise NativeWidthError(
                f"its codec's {key} is {decoder[key]}; qwentts.cpp runs only the released widths "
                f"({width}): this checkpoint needs --engine reference"
            )


def check_native_widths(talker: Path, codec: Path) -> None:
    """Refuse, with a clear message, files whose codec or speaker encoder qwentts.cpp cannot run.

    Raises:
        NativeWidthError: a width differs from ``NATIVE_WIDTHS`` (message names it and says what to do).
    """
    from gguf import GGUFReader

    shapes = {}
    for path in (talker, codec):
        shapes.update({t.name: [int(x) for x in t.shape] for t in GGUFReader(str(path)).tensors})
    for name, dim, width in NATIVE_WIDTHS:
        shape = shapes.get(name)
        if shape is not None and shape[dim] != width:
            raise NativeWidthError(
                f"{name} is {shape[dim]} wide; qwentts.cpp runs only the released widths ({width}): "
                "this checkpoint needs --engine reference"
            )


def thread_split(threads: int) -> tuple[int, int]:
    """(generating threads, codec threads) of one native context given ``threads`` in all.

    With two or more, the codec decodes beside generation on its own threads, half of them:
    one thread each, the library's own split of the work on this project's 2-core VM was
    about 100 ms of talker and code predictor (0.6B Q8_0; 140 ms for 1.7B) and 150 ms of
    codec per 80 ms frame (``benchmarks/results/cpu-2core``), so neither side waits long
    for the other. Taking turns on the same two threads ran at half the speed (0.16 vs 0.29),
    and a third thread (two generating beside the codec's, more threads than cores) cut
    first audio by 40 % but generation speed by 7 to 18 %. One thread: generation and codec
    take turns on it.
    """
    if threads < 2:
        return 1, 0
    return threads - threads // 2, threads // 2


class _Cancel:
    """The binding's ``cancel_event``: set once the client left or the stream was closed."""

    def __init__(self, cancelled: Any) -> None:
        self._cancelled = cancelled
        self.stop = False

    def is_set(self) -> bool:
        return self.stop or bool(self._cancelled())


class GgmlEngine(Engine):
    """qwentts.cpp on the CPU: ``contexts`` native contexts, each streaming one segment.

    Args:
        kind: the model kind (checked against the talker file's ``model_type``).
        talker: talker GGUF file; codec: codec GGUF file (see ``gguf_files``).
        chunk_frames: codec frames per native chunk (1, 2 or 4; 80 ms each): the library's
            ``cpu_stream_frames``. Larger values are clamped to 4.
        contexts: native contexts, i.e. streams generated at once (each holds the weights);
            0: chosen from the cores and memory (``machine.plan``, its reasons in ``plan``).
        threads: CPU threads per context (None: ``machine.plan``'s, 2 where there are two
            cores); with two or more, half of them decode audio beside generation (``thread_split``).
            One more than the cores (2 + 1 on 2 cores) starts speaking about 40 % sooner but
            generates 7 to 18 % slower (``benchmarks/results/cpu-2core``).
        quant: a label for ``backend`` (e.g. "Q8_0").
        icl: clone voices with a transcript are cloned in context (ICL: the clip's codec
            codes and transcript in the prompt, the closer likeness). The first time a
            context meets a clip, qwentts.cpp runs its codec over the whole reference before
            the first audio (it keeps the result), about 2 s per second of clip on 2 cores
            (``benchmarks/results/cpu-2core/clone_onset.md``), and a client that leaves
            meanwhile cannot stop it; ``prime`` pays it at start for the default voice, and
            ``prime_later`` for a default chosen while serving.
            False (the default): every clone by its x-vector alone, starting as a speaker does.

    Raises:
        ModelMismatchError: the talker file is of another kind.
        ValueError: not a Qwen3-TTS talker GGUF, widths qwentts.cpp cannot run, or more
            generating threads than CPUs.
        qwentts_cpp_cpu.QwenTTSError: the native library refused the files (message from it).
    """

    def __init__(
        self,
        kind: ModelKind,
        talker: Path,
        codec: Path,
        chunk_frames: int,
        contexts: int = 0,
        threads: int | None = None,
        quant: str = "",
        icl: bool = False,
    ) -> None:
        from .machine import available_memory, cpu_flags, plan, usable_cores

        model_type = gguf_model_type(talker)
        if model_type != kind.value:
            raise ModelMismatchError(f"{talker.name} is a {model_type!r} model, expected {kind.value!r}")
        check_native_widths(talker, codec)
        weights = sum(p.stat().st_size for p in (talker, codec))
        self.plan = plan(usable_cores(), cpu_flags(), available_memory(), weights, quant or "GGUF", contexts, threads or 0)
        contexts = self.plan.streams
        super().__init__(kind, chunk_frames, capacity=contexts)
        self.files = (talker, codec)
        self.icl = icl
        import qwentts_cpp_cpu

        _route_native_log()
        self.threads = self.plan.threads
        generating, decoding = thread_split(self.threads)
        if generating > (os.cpu_count() or 1):
            raise ValueError(f"{self.threads} threads a stream is more than twice this machine's {os.cpu_count()} CPUs")
        stream_frames = 1 if chunk_frames <= 1 else 2 if chunk_frames < 4 else 4
        with native_output(_LOGGER):  # the loader's own lines: at DEBUG in our log
            self._contexts = [
                qwentts_cpp_cpu.QwenTTS(
                    talker, codec, cpu_threads=generating,
                    cpu_codec_threads=decoding, cpu_stream_frames=stream_frames,
                )
                for _ in range(contexts)
            ]
        release_file_pages((talker, codec))
        self._speakers = [name.lower() for name in self._contexts[0].speaker_names()]
        self._refs: OrderedDict[str, Any] = OrderedDict()
        self._refs_lock = threading.Lock()
        #: Clips being extracted now, by digest: a second caller (a request and ``prime_later``'s
        #: preparer on another context) waits for the first one's result, never extracts too.
        self._extracting: dict[str, Future[Any]] = {}
        #: Digests of the clips each context has decoded in context (ICL): its first use of a
        #: clip pays that (``prime``, ``prime_later``, or the clip's first request there).
        self._decoded: list[set[str]] = [set() for _ in self._contexts]
        self._index = {id(c): i for i, c in enumerate(self._contexts)}
        #: The clip ``prime_later`` asked for, and its future; None once done or replaced.
        self._wanted: tuple[Reference, Future[bool]] | None = None
        self._wanted_lock = threading.Lock()
        #: Held by the context preparing a clip while serving: one at a time.
        self._preparing = threading.Lock()
        self.backend = (
            f"qwentts.cpp GGML on the CPU ({quant or 'GGUF'}, {contexts} stream(s) x {self.threads} threads"
            + ("" if kind is not ModelKind.BASE else ", clones in context (ICL)" if icl else ", clones by x-vector")
            + ")"
        )
        _LOGGER.info("CPU engine, %s model: %s", kind.value, self.plan.describe())
        _LOGGER.debug("CPU engine (GGML), %s model, its choices: %s", kind.value, self.plan.details())

    def speakers(self) -> list[str]:
        return list(self._speakers) if self.kind is ModelKind.CUSTOM_VOICE else []

    def warmup(self, segment: Segment) -> None:
        """One short generation per context, before serving: the library allocates its caches,
        and each context loads its speaker encoder and codec encoder on its first clip (a
        Base model's contexts each extract the warm-up clip here, not only the first: the
        prompt cache would serve the others from the first one's result, leaving their lazy
        loads, with their console lines and a second or more, to the first clone request
        they serve). The lines go to our log at DEBUG.

        Raises:
            RuntimeError: a context produced no audio.
        """
        with native_output(_LOGGER):
            for context in self._contexts:
                if segment.reference is not None and self.kind is ModelKind.BASE:
                    context.extract_voice_ref(_at_native_rate(segment.reference.audio, segment.reference.sample_rate))
                if sum(len(chunk) for chunk in self.stream(segment, context=context)) == 0:
                    raise RuntimeError("warm-up generation produced no audio")

    def prime(self, reference: Reference) -> bool:
        """Extract ``reference``'s x-vector and codec codes into the prompt cache, which the
        clip's first request would otherwise wait for (1.0 s for a 2.5 s clip on this
        project's 2-core machine); with ``icl`` and a transcript, also one frame of speech
        on every context, so that each pays its first-time decode of the clip now (about
        2 s per second of clip there). Call before ``start`` (while serving: ``prime_later``).
        The library's lines go to our log at DEBUG."""
        if self.kind is not ModelKind.BASE:
            return False
        with native_output(_LOGGER):
            for index in range(len(self._contexts) if self._per_context(reference) else 1):
                self._prepare(reference, index)
        return True

    def prime_later(self, reference: Reference) -> Future[bool] | None:
        """``prime`` for an engine that serves already (a default voice chosen after start):
        returns at once, and each context prepares the clip at its next idle moment, when no
        work waits for it (a segment in progress is never held up), one context at a time, so
        that work arriving meanwhile finds the other contexts free (a single context takes it
        once the clip is prepared: at most what the clip's first request would pay). A later
        call replaces a clip not yet prepared everywhere. The library's lines go to the
        console as while serving (``native_output`` is for start-up only).

        Returns:
            None when the clip is prepared already (or this model clones nothing); else a
            future: True once it is prepared on every context that needs it
            (``_per_context``), False if a later call replaced it first or the library
            refused it (logged; its request says why).
        """
        if self.kind is not ModelKind.BASE or self._ready(reference):
            return None
        future: Future[bool] = Future()
        with self._wanted_lock:
            if self._wanted is not None:
                self._wanted[1].set_result(False)
            self._wanted = (reference, future)
        return future

    def _per_context(self, reference: Reference) -> bool:
        """Whether every context prepares ``reference`` itself: an in-context clone, whose
        first-time decode each context pays; an x-vector is extracted once for all."""
        return self.icl and bool(reference.transcript)

    def _ready(self, reference: Reference) -> bool:
        """Whether ``reference`` is prepared where it needs to be: its x-vector and codes in
        the prompt cache, and for an in-context clone decoded once on every context."""
        with self._refs_lock:
            if reference.digest not in self._refs:
                return False
        return not self._per_context(reference) or all(reference.digest in d for d in self._decoded)

    def _prepare(self, reference: Reference, index: int) -> None:
        """Prepare ``reference`` on context ``index`` (on its thread, or before serving): its
        x-vector and codes (once for all contexts), and for an in-context clone one frame of
        speech, which makes the context decode the clip (``stream`` records it)."""
        context = self._contexts[index]
        self._voice_ref(reference, context)
        if self._per_context(reference) and reference.digest not in self._decoded[index]:
            segment = Segment(text="Hello.", language="auto", max_new_tokens=2, seed=0, reference=reference)
            for _chunk in self.stream(segment, context=context):
                pass
            self._decoded[index].add(reference.digest)

    def _prepare_wanted(self, index: int) -> None:
        """On context ``index``'s thread while it is idle: prepare the clip ``prime_later``
        asked for, if this context has a part in it and no other context is preparing."""
        wanted = self._wanted
        if wanted is None:
            return
        reference, future = wanted
        done: bool | None = None
        my_part = not self._per_context(reference) or reference.digest not in self._decoded[index]
        if self._ready(reference):
            done = True
        elif my_part and self._preparing.acquire(blocking=False):
            try:
                self._prepare(reference, index)
                done = True if self._ready(reference) else None
            except Exception as err:  # noqa: BLE001 - the clip's request fails with the reason later
                _LOGGER.warning("A clone clip could not be prepared (%s); its first request will say why", err)
                done = False
            finally:
                self._preparing.release()
        if done is None:
            return
        with self._wanted_lock:
            if self._wanted is not None and self._wanted[1] is future:
                future.set_result(done)
                self._wanted = None

    def serve(self, source: WorkSource) -> None:
        helpers = [
            threading.Thread(target=self._worker, args=(source, i), name=f"ggml-{self.kind.value}-{i}", daemon=True)
            for i in range(1, len(self._contexts))
        ]
        for helper in helpers:
            helper.start()
        self._worker(source, 0)
        for helper in helpers:
            helper.join()

    def close(self) -> None:
        """Free the native contexts (after the source closed and ``join``)."""
        for context in self._contexts:
            context.close()

    # --- one context's loop ---------------------------------------------------------

    def _worker(self, source: WorkSource, index: int) -> None:
        context = self._contexts[index]
        while not source.closed():
            work = source.take(wait=0.5)
            if work is not None:
                self._run(work, context)
            elif self._wanted is not None:  # idle: no work waits for this context
                self._prepare_wanted(index)

    def _run(self, work: Work, context: Any) -> None:
        sink = work.sink
        if sink.cancelled():
            sink.done(0)
            return
        deliver(work, self.stream(work.segment, context=context, cancelled=sink.cancelled))

    def stream(self, segment: Segment, context: Any = None, cancelled: Any = None) -> Iterator[np.ndarray]:
        """Generate ``segment``; yield float32 [n] chunks at 24 kHz as the library makes them.

        Closing the iterator, or ``cancelled()`` turning true, stops the native generation at
        its next frame.

        Raises:
            ValueError: a clone segment without a reference, or an unknown speaker.
            qwentts_cpp_cpu.QwenTTSError: the library refused the request (unknown speaker...).
        """
        context = context or self._contexts[0]
        cancel = _Cancel(cancelled or (lambda: False))
        s = segment.sampling
        kwargs: dict[str, Any] = dict(
            text=segment.text,
            lang=None if segment.language in ("", "auto") else segment.language,
            seed=-1 if segment.seed is None else int(segment.seed),
            max_new_tokens=segment.max_new_tokens,
            do_sample=s.temperature > 0,
            temperature=s.temperature or 1.0,
            top_k=s.top_k,
            top_p=s.top_p,
            repetition_penalty=s.repetition_penalty,
            subtalker_do_sample=s.predictor_temperature > 0,
            subtalker_temperature=s.predictor_temperature or 1.0,
            subtalker_top_k=s.predictor_top_k,
            subtalker_top_p=s.predictor_top_p,
            cancel_event=cancel,
        )
        if self.kind is ModelKind.BASE:
            if segment.reference is None:
                raise ValueError("a clone voice needs a reference clip")
            ref = self._voice_ref(segment.reference, context)
            kwargs["ref_spk_emb"] = ref.ref_spk_emb
            if segment.reference.transcript and self.icl:
                kwargs["ref_codes"] = ref.ref_codes
                kwargs["ref_text"] = segment.reference.transcript
        elif self.kind is ModelKind.VOICE_DESIGN:
            kwargs["instruct"] = segment.instruct or ""
        else:
            if (segment.speaker or "").lower() not in self._speakers:
                raise ValueError(f"unknown speaker {segment.speaker!r}; this model has {', '.join(self._speakers)}")
            kwargs["speaker"] = segment.speaker.lower() if segment.speaker else None
            kwargs["instruct"] = segment.instruct or None
        generator = context.stream(**kwargs)
        decoded = self._decoded[self._index[id(context)]] if "ref_codes" in kwargs else None
        try:
            for chunk, _rate in generator:
                if decoded is not None:  # audio: the context has decoded the clip
                    decoded.add(segment.reference.digest)  # type: ignore[union-attr]
                    decoded = None
                yield np.asarray(chunk, dtype=np.float32).reshape(-1)
        finally:
            cancel.stop = True
            generator.close()

    def _voice_ref(self, reference: Reference, context: Any) -> Any:
        """The clip's native x-vector and codec codes (``VoiceRef``), extracted once per digest:
        a caller that finds the clip being extracted by another context waits for that
        result (a request racing ``prime_later``'s preparer on one clip shares one extraction).

        Raises:
            qwentts_cpp_cpu.QwenTTSError: the library refused the clip (every waiter gets it).
        """
        with self._refs_lock:
            cached = self._refs.get(reference.digest)
            if cached is not None:
                self._refs.move_to_end(reference.digest)
                return cached
            pending = self._extracting.get(reference.digest)
            if pending is None:
                mine: Future[Any] = Future()
                self._extracting[reference.digest] = mine
        if pending is not None:
            return pending.result()
        try:
            audio = _at_native_rate(reference.audio, reference.sample_rate)
            if reference.transcript and self.icl:  # end the ICL prompt on silence, as the other engines do
                audio = np.concatenate([audio, np.zeros(int(REFERENCE_TAIL_SECONDS * NATIVE_RATE), np.float32)])
            ref = context.extract_voice_ref(audio)
        except BaseException as err:
            with self._refs_lock:
                del self._extracting[reference.digest]
            mine.set_exception(err)
            raise
        with self._refs_lock:
            self._refs[reference.digest] = ref
            if len(self._refs) > PROMPT_CACHE_SIZE:
                self._refs.popitem(last=False)
            del self._extracting[reference.digest]
        mine.set_result(ref)
        return ref


def release_file_pages(paths: tuple[Path, ...]) -> int:
    """Drop this process's resident pages of the mapped GGUF files; returns bytes released.

    qwentts.cpp copies the weights into its own buffers at load but keeps each file mapped
    (it reads a few embedding rows from the talker's mapping per frame, and the codec's
    encoder half on first use). The pages touched by the copy would otherwise stay resident,
    counting the weights twice (1.3 GB for 0.6B at Q8_0). ``MADV_DONTNEED`` on these
    read-only private mappings only drops clean pages: a later read faults the rows it needs
    back in from the file (Linux; elsewhere nothing happens).
    """
    import ctypes

    if not Path("/proc/self/maps").exists():
        return 0
    targets = {str(p.resolve()) for p in paths}
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    released = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] in targets and "w" not in parts[1]:
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if madvise(start, end - start, 4) == 0:  # MADV_DONTNEED
                released += end - start
    return released


def _at_native_rate(audio: np.ndarray, rate: int) -> np.ndarray:
    """float32 [n] at ``NATIVE_RATE`` (polyphase resampling when ``rate`` differs)."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if rate == NATIVE_RATE:
        return audio
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(rate, NATIVE_RATE)
    return resample_poly(audio, NATIVE_RATE // g, rate // g).astype(np.float32)


#: The library object that holds our log callback. The native callback is process-wide and
#: the binding keeps its ctypes wrapper on the library object that installed it: installing
#: it from a context would leave the library calling freed memory once that context is gone.
_LOG_OWNER: Any = None


def _route_native_log() -> None:
    """Send the library's log lines to ours, once per process."""
    global _LOG_OWNER
    if _LOG_OWNER is None:
        import qwentts_cpp_cpu

        _LOG_OWNER = qwentts_cpp_cpu.QwenLibrary()
        _LOG_OWNER.set_log_callback(_native_log)


def _native_log(level: int, message: str) -> None:
    """The library's log lines (0 debug .. 3 error) into ours; routine ones at debug."""
    _LOGGER.log(logging.WARNING if level >= 2 else logging.DEBUG, "%s", message)
