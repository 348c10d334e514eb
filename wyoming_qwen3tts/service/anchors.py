"""Anchors: each VoiceDesign preset rendered once, then cloned for every sentence.

VoiceDesign samples a new voice for every generation, so a preset designed afresh for
each sentence drifts from speaker to speaker. An *anchor* fixes it: the VoiceDesign model
renders the preset's description once, with a fixed seed, saying a neutral sentence of
about 6-10 s in the preset's language; from then on the Base model serves the preset as
an ICL clone of that clip and its transcript, so every sentence and every request has the
same voice.

Anchors live in ``<data-dir>/anchors`` as ``<key>.wav`` (24 kHz 16-bit mono), ``<key>.txt``
(the transcript) and ``<key>.json`` (what it was rendered from, written last: an anchor
without it is incomplete). The key is a digest of the description, language, seed,
sentence and the VoiceDesign model's identity (``model_identity``), so an edited
description or another model gets a new anchor and a restart reuses the stored one.

Missing anchors are rendered in the background after start-up, through the service's
queue, so they take turns with clients sentence by sentence: the default voice first, then
presets that were asked for, then (mode ``all``) the rest. Until a preset's anchor exists,
or when the Base model is off, the preset is designed live.

Servers sharing one data folder (one per GPU behind a load balancer) render each anchor
once: a server claims an anchor before rendering it by creating ``<key>.claim`` atomically
(``O_CREAT | O_EXCL``), touches the claim every ``CLAIM_HEARTBEAT_S`` while it renders and
removes it when done. The others skip a claimed anchor, design the preset live meanwhile,
and look every ``CLAIM_POLL_S`` for the finished files. A claim untouched for
``CLAIM_STALE_S`` (its server crashed) is taken over.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..common.audio import FRAMES_PER_SECOND, SAMPLE_RATE
from ..catalogue.library import wav_bytes, write_atomic
from .scheduler import background
from ..catalogue.voices import MAX_PRESET_SEED, Voice, VoiceCatalog, load_reference
from ..common.vocabulary import ModelKind, Reference

_LOGGER = logging.getLogger(__name__)

#: Longest anchor, in codec frames (10 s at 12.5 frames per second). The sentences below
#: take a real model about 6-8 s, so it ends them on its own; random weights never emit
#: EOS and run to this cap, which keeps their anchors at 10 s too.
ANCHOR_MAX_FRAMES = int(10 * FRAMES_PER_SECOND)

#: Neutral sentences an anchor says, by Qwen3-TTS language: plain statements with no names,
#: numbers in words, about 6-8 s of calm speech each.
ANCHOR_TEXTS: dict[str, str] = {
    "english": "Good morning. The weather is calm and clear today, and the kitchen lights will turn on at seven.",
    "german": "Guten Morgen. Das Wetter ist heute ruhig und klar, und das Licht in der Küche geht um sieben Uhr an.",
    "french": "Bonjour. Le temps est calme et dégagé aujourd'hui, et la lumière de la cuisine s'allumera à sept heures.",
    "spanish": "Buenos días. Hoy el tiempo está tranquilo y despejado, y la luz de la cocina se encenderá a las siete.",
    "italian": "Buongiorno. Oggi il tempo è calmo e sereno, e la luce della cucina si accenderà alle sette in punto.",
    "portuguese": "Bom dia. O tempo hoje está calmo e limpo, e a luz da cozinha vai acender às sete horas da manhã.",
    "russian": "Доброе утро. Сегодня погода тихая и ясная, а свет на кухне включится ровно в семь часов.",
    "chinese": "早上好。今天的天气平静而晴朗，厨房的灯会在七点钟准时打开，祝你度过美好的一天。",
    "japanese": "おはようございます。今日は穏やかに晴れています。台所の明かりは七時につきます。",
    "korean": "좋은 아침입니다. 오늘 날씨는 맑고 잔잔하며, 부엌 불은 일곱 시에 켜집니다.",
}


#: Seconds between a rendering server's touches of its claim file (its heartbeat).
CLAIM_HEARTBEAT_S = 5.0
#: Seconds after its last touch that a claim is stale (its server crashed or hangs) and
#: another server takes it over. Many heartbeats, so a busy event loop or a file system's
#: clock a few seconds off never looks like a crash.
CLAIM_STALE_S = 60.0
#: Seconds between looks for an anchor another server is rendering.
CLAIM_POLL_S = 2.0


class AnchorMode(str, enum.Enum):
    """Which presets get anchors (``--anchors``)."""

    ALL = "all"  # every preset, in the background after start-up
    USED = "used"  # the default voice, and each preset once it is spoken or auditioned
    KEPT = "kept"  # none rendered (the CPU: minutes each); kept designs and stored ones used
    OFF = "off"  # none: presets are designed live for every sentence


class AnchorState(str, enum.Enum):
    """Where a preset's anchor stands (``/v1/audio/voices`` field ``anchor``)."""

    READY = "ready"  # rendered and stored
    PENDING = "pending"  # waiting for its turn, or rendering
    WAITING = "waiting"  # mode ``used``: rendered once the preset is used
    FAILED = "failed"  # rendering failed (see the log); retried after a restart
    OFF = "off"  # anchors are off


@dataclass(frozen=True)
class AnchorSpec:
    """Everything an anchor's audio depends on.

    Attributes:
        instruct: the VoiceDesign description.
        language: Qwen3-TTS language name ("english", ...).
        seed: the generation's seed.
        text: the sentence it says (its transcript).
        model: the VoiceDesign model's identity (``model_identity``).
    """

    instruct: str
    language: str
    seed: int
    text: str
    model: str

    @property
    def key(self) -> str:
        """File name stem: 24 hex digits of a SHA-256 of every field."""
        fields = json.dumps(asdict(self), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(fields.encode("utf-8")).hexdigest()[:24]


def preset_seed(instruct: str, language: str) -> int:
    """The seed of a preset that names none: a digest of its description and language, so
    a preset keeps its seed when renamed and gets a new one when its description changes."""
    digest = hashlib.sha256(f"{language}\n{instruct}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (MAX_PRESET_SEED + 1)


def anchor_text(language: str) -> str:
    """The neutral sentence for a Qwen3-TTS language (English for "auto")."""
    return ANCHOR_TEXTS.get(language, ANCHOR_TEXTS["english"])


def preset_spec(voice: Voice, model: str) -> AnchorSpec:
    """The anchor of a VoiceDesign preset, rendered by the model of identity ``model``."""
    assert voice.instruct is not None, "not a VoiceDesign preset"
    return AnchorSpec(
        instruct=voice.instruct,
        language=voice.language,
        seed=voice.seed if voice.seed is not None else preset_seed(voice.instruct, voice.language),
        text=voice.anchor_text or anchor_text(voice.language),
        model=model,
    )


_HEX64 = re.compile(r"[0-9a-f]{64}")


def model_identity(checkpoint: Path, cache: Path | None = None) -> str:
    """A checkpoint's identity: 16 hex digits of a SHA-256 over its ``config.json`` and the
    SHA-256 of every ``*.safetensors`` file (speech tokenizer included).

    A Hugging Face cache snapshot links each weight file to a blob named by its SHA-256,
    which is used as is; other files are hashed once and remembered in ``cache`` (a JSON
    file) by path, size and modification time. So a re-download of the same revision keeps
    the identity, and any change of weights or config gives a new one.

    Raises:
        OSError: the checkpoint cannot be read.
    """
    known: dict[str, str] = {}
    if cache is not None and cache.is_file():
        try:
            known = dict(json.loads(cache.read_text("utf-8")))
        except (OSError, ValueError, TypeError):
            known = {}
    digest = hashlib.sha256((checkpoint / "config.json").read_bytes())
    changed = False
    for path in sorted(checkpoint.rglob("*.safetensors")):
        resolved = path.resolve()
        if _HEX64.fullmatch(resolved.name):
            file_digest = resolved.name
        else:
            st = resolved.stat()
            stamp = f"{resolved}|{st.st_size}|{st.st_mtime_ns}"
            file_digest = known.get(stamp, "")
            if not file_digest:
                file_digest = _sha256_file(resolved)
                known[stamp] = file_digest
                changed = True
        digest.update(f"{path.relative_to(checkpoint).as_posix()}={file_digest}\n".encode())
    if changed and cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(cache, json.dumps(known, indent=1).encode())
        except OSError as err:
            _LOGGER.warning("Cannot remember model digests in %s: %s", cache, err)
    return digest.hexdigest()[:16]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class AnchorStore:
    """The anchors folder: ``<key>.wav``, ``<key>.txt`` and ``<key>.json`` per anchor.

    Args:
        folder: ``<data-dir>/anchors`` (created on the first save).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._loaded: dict[str, Reference] = {}
        #: This process's claim token (a pid alone is not unique across containers).
        self.owner = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"

    # --- claims: one renderer per anchor across the servers sharing the folder ----------

    def _claim_path(self, key: str) -> Path:
        return self.folder / f"{key}.claim"

    def claim(self, key: str) -> bool:
        """Claim the rendering of anchor ``key``: True when this process now holds it (a
        stale claim is taken over), False when another live server does.

        Raises:
            OSError: the folder cannot be written.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._claim_path(key)
        for _ in range(2):
            try:
                handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                holder = self.claimed_elsewhere(key)
                if holder is not None:
                    return False
                _LOGGER.warning("Anchor %s: taking over a stale claim (%s)", key, path)
                path.unlink(missing_ok=True)
                continue
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(self.owner + "\n")
            return True
        return False

    def claimed_elsewhere(self, key: str) -> str | None:
        """The owner of a live claim on ``key`` by another process, or None (no claim,
        this process's own, or stale: untouched for ``CLAIM_STALE_S``)."""
        path = self._claim_path(key)
        try:
            age = time.time() - path.stat().st_mtime
            holder = path.read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        if holder == self.owner or age > CLAIM_STALE_S:
            return None
        return holder or "another server"

    def touch_claim(self, key: str) -> None:
        """Renew this process's claim on ``key`` (its heartbeat); errors are logged."""
        try:
            os.utime(self._claim_path(key))
        except OSError as err:
            _LOGGER.warning("Anchor %s: cannot renew its claim: %s", key, err)

    def release(self, key: str) -> None:
        """Remove this process's claim on ``key`` (another's is left alone)."""
        path = self._claim_path(key)
        try:
            if path.read_text("utf-8").strip() == self.owner:
                path.unlink()
        except (OSError, UnicodeDecodeError):
            pass

    def load(self, spec: AnchorSpec) -> Reference | None:
        """The stored anchor of ``spec`` as a clone reference, or None if there is none (or
        it is incomplete or unreadable, which is logged)."""
        key = spec.key
        if key in self._loaded:
            return self._loaded[key]
        wav = self.folder / f"{key}.wav"
        if not (self.folder / f"{key}.json").is_file() or not wav.is_file():
            return None
        try:
            reference = load_reference(wav)
        except Exception as err:  # noqa: BLE001 - a broken anchor is rendered again
            _LOGGER.error("Anchor %s is unreadable, rendering it again: %s", wav, err)
            return None
        self._loaded[key] = reference
        return reference

    def save(self, spec: AnchorSpec, audio: np.ndarray, preset: str) -> Reference:
        """Store an anchor (float32 [n_samples] at 24 kHz) and return it as read back, so
        that a stored anchor and a reloaded one are the same reference.

        Raises:
            OSError: the folder cannot be written.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        key = spec.key
        write_atomic(self.folder / f"{key}.txt", spec.text.encode("utf-8") + b"\n")
        write_atomic(self.folder / f"{key}.wav", wav_bytes(audio, SAMPLE_RATE))
        meta = {
            **asdict(spec),
            "preset": preset,
            "seconds": round(len(audio) / SAMPLE_RATE, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        write_atomic(
            self.folder / f"{key}.json",
            json.dumps(meta, indent=2, ensure_ascii=False).encode("utf-8") + b"\n",
        )
        self._loaded.pop(key, None)
        reference = self.load(spec)
        if reference is None:
            raise OSError(f"anchor {key} was written but cannot be read back")
        return reference


#: Renders one anchor: float32 [n_samples] at 24 kHz (``TtsService.render_design``).
Renderer = Callable[[AnchorSpec], Awaitable[np.ndarray]]


class Anchors:
    """Which presets are served from an anchor, and the background task that renders them.

    Args:
        store: the anchors folder.
        catalog: the voice catalogue (its VoiceDesign presets get anchors).
        mode: ``AnchorMode.ALL``, ``USED`` or ``KEPT`` (``OFF`` means no ``Anchors`` at all).
        checkpoint: the VoiceDesign checkpoint folder (for ``model_identity``).
        default_voice: rendered first.
        clone_loaded: whether the Base model is loaded (else anchors only give samples).
    """

    def __init__(
        self,
        store: AnchorStore,
        catalog: VoiceCatalog,
        mode: AnchorMode,
        checkpoint: Path,
        default_voice: str,
        clone_loaded: bool,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.mode = mode
        self.checkpoint = checkpoint
        self.default_voice = default_voice
        self.clone_loaded = clone_loaded
        self.identity: str | None = None
        #: Whether missing anchors are rendered (``start``).
        self.rendering = True
        self._wanted: list[str] = [default_voice]  # preset names, first come first served
        self._failed: dict[str, str] = {}  # spec key -> error
        self._waiters: dict[str, list[asyncio.Future[Reference]]] = {}
        self._waited: dict[str, AnchorSpec] = {}  # spec key -> spec, for the waiters
        self._elsewhere: set[str] = set()  # spec keys another server is rendering
        self._wake: asyncio.Event | None = None
        self._identity_ready: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # --- queries (event loop) ---------------------------------------------------------

    def spec(self, voice: Voice) -> AnchorSpec | None:
        """The anchor ``voice`` is served from, or None (not a preset, identity not known)."""
        if voice.instruct is None or voice.kind is not ModelKind.VOICE_DESIGN or self.identity is None:
            return None
        return preset_spec(voice, self.identity)

    def reference_for(self, voice: Voice) -> Reference | None:
        """The stored anchor of a preset, or None (it is then asked for: mode ``used``
        renders it in the background)."""
        spec = self.spec(voice)
        reference = self.store.load(spec) if spec else None
        if reference is None and voice.kind is ModelKind.VOICE_DESIGN and self.mode is not AnchorMode.KEPT:
            self.want(voice.name)
        return reference

    def ready_references(self) -> list[Reference]:
        """The stored anchor of every preset that has one: the clone references the Base model
        serves presets from (``clips.ClipPreparer`` prepares them before they are asked for)."""
        if self.identity is None:
            return []
        found = []
        for voice in self.catalog.voices():
            spec = self.spec(voice)
            reference = self.store.load(spec) if spec is not None else None
            if reference is not None:
                found.append(reference)
        return found

    def state(self, voice: Voice) -> AnchorState:
        """Where the anchor of a preset stands."""
        spec = self.spec(voice)
        if spec is not None and self.store.load(spec) is not None:
            return AnchorState.READY
        if spec is not None and spec.key in self._failed:
            return AnchorState.FAILED
        if self.mode is AnchorMode.KEPT:
            return AnchorState.OFF
        if self.mode is AnchorMode.USED and voice.name not in self._wanted:
            return AnchorState.WAITING
        return AnchorState.PENDING

    def want(self, name: str, urgent: bool = False) -> None:
        """Queue a preset's anchor: at the back, or (``urgent``) next after the running one."""
        if name in self._wanted:
            if not urgent:
                return
            self._wanted.remove(name)
        if urgent:
            self._wanted.insert(0, name)
        else:
            self._wanted.append(name)
        if self._wake is not None:
            self._wake.set()

    def changed(self) -> None:
        """Presets were added or edited: look for missing anchors now."""
        if self._wake is not None:
            self._wake.set()

    async def wait_identity(self) -> str:
        """The VoiceDesign model's identity, once computed.

        Raises:
            RuntimeError: the checkpoint could not be read (anchors are then off).
        """
        if self.identity is None:
            assert self._identity_ready is not None, "start() first"
            await self._identity_ready.wait()
        if self.identity is None:
            raise RuntimeError("the VoiceDesign model could not be identified: anchors are off")
        return self.identity

    async def wait(self, voice: Voice) -> Reference:
        """The anchor of a preset, rendered next if missing (for auditioning).

        Raises:
            RuntimeError: rendering failed (the message says why).
            LookupError: mode ``KEPT`` and the preset has no stored anchor.
        """
        await self.wait_identity()
        spec = self.spec(voice)
        assert spec is not None, "not a VoiceDesign preset"
        reference = self.store.load(spec)
        if reference is not None:
            return reference
        if spec.key in self._failed:
            raise RuntimeError(self._failed[spec.key])
        if self.mode is AnchorMode.KEPT:
            raise LookupError(
                f"{voice.name!r} is designed live for every sentence: anchors are 'kept' here "
                "(--anchors kept, or auto on the CPU), so only designs kept in the voice studio "
                "have a clip"
            )
        future: asyncio.Future[Reference] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(spec.key, []).append(future)
        self._waited[spec.key] = spec
        self.want(voice.name, urgent=True)
        return await future

    def adopt(self, spec: AnchorSpec, audio: np.ndarray, preset: str) -> Reference:
        """Store an anchor rendered elsewhere (a kept design candidate, rendered with
        ``spec``).

        Raises:
            OSError: the folder cannot be written.
        """
        reference = self.store.save(spec, audio, preset)
        self._failed.pop(spec.key, None)
        self._resolve(spec.key, reference)
        return reference

    # --- background task --------------------------------------------------------------

    def start(self, render: Renderer, rendering: bool = True) -> None:
        """Start the background task (call from the event loop). ``rendering`` False: it
        only identifies the model, so that the anchors already stored serve their presets,
        and renders none (the VoiceDesign model cannot be served on this GPU); the other
        presets are asked of the VoiceDesign model, which refuses them at once."""
        self._wake = asyncio.Event()
        self._identity_ready = asyncio.Event()
        self.rendering = rendering
        self._task = asyncio.create_task(self._run(render), name="anchors")

    async def begin(self, render: Renderer, rendering: bool = True) -> None:
        """``start``, and where nothing will be rendered (``rendering`` False) return only once
        the model is identified: the stored anchors are then the only way presets are
        served, so the server must not say it is ready before it can find them (the 4 GiB
        row's first requests came 0.6 s after start-up, while the checkpoint was still being
        hashed, and were refused). Elsewhere a preset asked for meanwhile is designed live."""
        self.start(render, rendering)
        if not rendering:
            try:
                await self.wait_identity()
            except RuntimeError:
                pass  # logged by the task: presets stay designed live, i.e. refused

    async def stop(self) -> None:
        """Stop the background task; a render in progress is cancelled."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.cancel()

    async def _run(self, render: Renderer) -> None:
        assert self._wake is not None and self._identity_ready is not None
        cache = self.store.folder / "model-digests.json"
        try:
            self.identity = await asyncio.to_thread(model_identity, self.checkpoint, cache)
        except OSError as err:
            _LOGGER.error("Cannot identify the VoiceDesign model (%s): presets stay designed live", err)
            return
        finally:
            self._identity_ready.set()
        self._log_states()
        if not self.rendering:
            return
        while True:
            self._resolve_arrived()
            voice = self._next_missing()
            if voice is None:
                self._wake.clear()
                # Hand edits of presets.toml are noticed within a minute; anchors another
                # server renders, within CLAIM_POLL_S of being stored.
                timeout = CLAIM_POLL_S if self._elsewhere else 60.0
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
                await self.catalog.refresh_async()
                continue
            await self._render_one(voice, render)

    def _next_missing(self) -> Voice | None:
        """The next preset whose anchor is missing (wanted ones first), or None."""
        presets = {v.name: v for v in self.catalog.voices() if v.kind is ModelKind.VOICE_DESIGN}
        if self.mode is AnchorMode.KEPT:
            return None
        order = [n for n in self._wanted if n in presets]
        if self.mode is AnchorMode.ALL:
            order += sorted(n for n in presets if n not in order)
        elsewhere: set[str] = set()
        found = None
        for name in order:
            spec = self.spec(presets[name])
            if spec is None or spec.key in self._failed or self.store.load(spec) is not None:
                continue
            holder = self.store.claimed_elsewhere(spec.key)
            if holder is None:
                found = presets[name]
                break
            if spec.key not in self._elsewhere:
                _LOGGER.info(
                    "Preset %s: its anchor is being rendered by %s; designed live until it is stored",
                    name, holder,
                )
            elsewhere.add(spec.key)
        self._elsewhere = elsewhere
        return found

    def _resolve_arrived(self) -> None:
        """Resolve the waiters of anchors that another server stored."""
        for key in list(self._waiters):
            spec = self._waited.get(key)
            reference = self.store.load(spec) if spec is not None else None
            if reference is not None:
                self._resolve(key, reference)

    async def _render_one(self, voice: Voice, render: Renderer) -> None:
        spec = self.spec(voice)
        assert spec is not None
        started = time.monotonic()
        heartbeat: asyncio.Task[None] | None = None
        try:
            if not self.store.claim(spec.key):
                return  # another server claimed it first: _next_missing now skips it
            heartbeat = asyncio.create_task(self._heartbeat(spec.key), name="anchor claim")
            _LOGGER.info("Rendering the anchor of preset %s (seed %d)", voice.name, spec.seed)
            with background():  # a client's request goes first, and never waits for a swap for it
                audio = await render(spec)
            reference = self.store.save(spec, audio, voice.name)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a failed anchor leaves the preset designed live
            self._failed[spec.key] = f"Rendering the anchor of {voice.name!r} failed: {err}"
            _LOGGER.error("%s; it stays designed live", self._failed[spec.key])
            for future in self._waiters.pop(spec.key, []):
                if not future.done():
                    future.set_exception(RuntimeError(self._failed[spec.key]))
            return
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
                self.store.release(spec.key)
        served = "now served by the Base model as a clone of it" if self.clone_loaded else (
            "the Base model is off, so it stays designed live"
        )
        _LOGGER.info(
            "Preset %s: anchor rendered (%.1f s of audio in %.1f s, %s); %s",
            voice.name, len(audio) / SAMPLE_RATE, time.monotonic() - started,
            self.store.folder / f"{spec.key}.wav", served,
        )
        self._resolve(spec.key, reference)

    async def _heartbeat(self, key: str) -> None:
        """Touch the claim on ``key`` every ``CLAIM_HEARTBEAT_S`` until cancelled."""
        while True:
            await asyncio.sleep(CLAIM_HEARTBEAT_S)
            self.store.touch_claim(key)

    def _resolve(self, key: str, reference: Reference) -> None:
        self._waited.pop(key, None)
        for future in self._waiters.pop(key, []):
            if not future.done():
                future.set_result(reference)

    def _log_states(self) -> None:
        presets = [v for v in self.catalog.voices() if v.kind is ModelKind.VOICE_DESIGN]
        ready = sorted(v.name for v in presets if self.state(v) is AnchorState.READY)
        missing = sorted(v.name for v in presets if v.name not in ready)
        how = "served by the Base model as clones of their anchors" if self.clone_loaded else (
            "anchors give their samples only: the Base model is off, so presets are designed live"
        )
        live = (
            "designed live (this mode renders none: only designs kept in the voice studio keep the "
            "clip you heard; --anchors auto chooses it on the CPU, where one anchor takes minutes)"
            if self.mode is AnchorMode.KEPT else "designed live until rendered" if self.rendering
            else "not served here (the VoiceDesign model cannot be served on this GPU, so none is rendered)"
        )
        _LOGGER.info(
            "Preset anchors (%s, VoiceDesign model %s) in %s: %d ready (%s); %s: %s",
            self.mode.value, self.identity, self.store.folder, len(ready), how, live,
            ", ".join(missing) or "none",
        )
