"""Clone clips prepared before they are asked for.

A clone's first request used to wait for its reference to be encoded (speaker embedding,
ICL codec codes, the codec decoder's state after them): 0.3-1.3 s on the H200, on every
card. ``ClipPreparer`` hands every clip to the Base engine's ``prime`` as it appears: at
start (before the server says it is ready), and whenever the clone library shows a new or
changed clip or a preset's anchor is stored (it looks every ``POLL_S``). So a clip's first
request starts like any other. An engine that loads on demand prepares them again at every
load (``engine.gpu.on_demand.OnDemandEngine.prime``).

Only engines whose ``prime`` is safe while they serve (``prime_any_time``: the batched CUDA
engine, on-demand models) are watched. The GGML engine prepares its default voice's clip
at start (``__main__``; on a small CPU a clip costs seconds on every stream, so the
library's other clips are not prepared then), and ``DefaultVoicePreparer`` hands it each
default voice chosen while serving (the first clip added to a server that had none, the
next one once the default is deleted, a default whose clip was replaced) and each clip that
appears while serving (an upload, a copy), one at a time, which the engine prepares between
requests (``GgmlEngine.prime_later``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from ..engine import Engine
from ..common.vocabulary import ModelKind, Reference

if TYPE_CHECKING:
    from ..engine.cpu.ggml import GgmlEngine
    from .speech import TtsService

_LOGGER = logging.getLogger(__name__)

#: Seconds between looks for new or changed clips.
POLL_S = 1.0


class ClipPreparer:
    """Prepares each clone reference once on ``engine`` (call from the event loop).

    Args:
        engine: the Base model's engine (``prime_any_time``).
        sources: each returns the references to prepare now (the clone library's clips,
            the presets' stored anchors).
        refresh: re-reads the clone library before each look: ``VoiceCatalog.refresh_async``
            (new clips decoded on a worker thread, not the event loop), or a plain function.
    """

    def __init__(
        self,
        engine: Engine,
        sources: Sequence[Callable[[], Iterable[Reference]]],
        refresh: Callable[[], Awaitable[None] | None] = lambda: None,
    ) -> None:
        self.engine = engine
        self.sources = sources
        self.refresh = refresh
        self._done: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    @property
    def prepared(self) -> set[str]:
        """Digests of the references prepared (or tried) so far."""
        return set(self._done)

    def references(self) -> dict[str, Reference]:
        """Every reference the sources give now, by digest (as of the last refresh)."""
        found: dict[str, Reference] = {}
        for source in self.sources:
            for reference in source():
                found.setdefault(reference.digest, reference)
        return found

    async def prepare_new(self) -> int:
        """Prepare the references not prepared yet; returns how many it prepared. A clip the
        model cannot encode is logged and not tried again (its request says why)."""
        refreshed = self.refresh()
        if inspect.isawaitable(refreshed):
            await refreshed
        found = self.references()
        forget = getattr(self.engine, "forget", None)
        if forget is not None:
            forget(set(found))
        count = 0
        for digest, reference in found.items():
            if digest in self._done:
                continue
            self._done.add(digest)
            started = time.monotonic()
            try:
                if await asyncio.to_thread(self.engine.prime, reference):
                    count += 1
                    _LOGGER.debug("Clone clip %s... prepared in %.0f ms", digest[:12], (time.monotonic() - started) * 1000)
            except Exception as err:  # noqa: BLE001 - that clip's request fails with the reason later
                _LOGGER.warning("A clone clip could not be prepared (%s); its first request will say why", err)
        return count

    def poke(self) -> None:
        """Look for new clips now (a clip was just added)."""
        if self._wake is not None:
            self._wake.set()

    def start(self) -> None:
        """Keep looking every ``POLL_S`` (a task of the running event loop)."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="clip preparer")

    async def stop(self) -> None:
        """Stop looking."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                count = await self.prepare_new()
            except Exception:  # noqa: BLE001 - keep looking; a broken folder is logged by the catalogue
                _LOGGER.exception("Looking for new clone clips failed")
                continue
            if count:
                _LOGGER.info("%d new clone clip(s) prepared before their first request", count)


class DefaultVoicePreparer:
    """Keeps the default voice's clone clip prepared on the GGML engine while it serves (call
    from the event loop).

    The server's default voice may change after start: an automatic default is picked again
    when its voice is gone, and a server that started with no voice takes the first clip
    added (``TtsService.default_voice``); a clip may also be replaced under its name. Every
    ``POLL_S`` this re-reads the voices folder (``refresh``, off the loop), reads the default
    (which picks a new one by the service's rule, logged there), and hands a clip not
    prepared yet to ``GgmlEngine.prime_later``, which prepares it between requests; the log
    says when it is done, as at start.

    Each clone clip that appears after this is made (an upload, a clip copied in, a clip
    replaced) is handed too, once the default's is prepared and no clip handed earlier waits:
    its first request then need not wait for its extraction (``GgmlEngine.prime``: about 1 s
    for a 2.5 s clip on 2 cores, in proportion for longer ones). The clips there when it is
    made (at start) are not (the start-up rule: only the default's). A clip that a later default
    replaced in the engine's hands before it was prepared is handed again.

    Args:
        engine: the Base model's GGML engine.
        default: the default voice's name and clip now, or None (no default, or one that is
            no clone: a preset, a speaker).
        refresh: re-reads the clone library (``VoiceCatalog.refresh_async``).
        clips: the clone voices' names and clips now (none: only the default is prepared).

    The clip prepared at start (``GgmlEngine.prime``) is not prepared again: the engine knows
    it (``prime_later`` returns None), and so is any clip prepared by its own requests.
    """

    def __init__(
        self,
        engine: GgmlEngine,
        default: Callable[[], tuple[str, Reference] | None],
        refresh: Callable[[], Awaitable[None]],
        clips: Callable[[], Iterable[tuple[str, Reference]]] = lambda: (),
    ) -> None:
        self.engine = engine
        self.default = default
        self.refresh = refresh
        self.clips = clips
        found = default()  # prepared at start (``__main__``): not handed again
        self._digest: str | None = found[1].digest if found is not None else None  # the default's clip last handed
        self._task: asyncio.Task[None] | None = None
        self._said: asyncio.Task[None] | None = None
        self._known = {reference.digest for _, reference in clips()}  # the clips' digests seen: at start, then since
        self._waiting: dict[str, tuple[str, Reference]] = {}  # new clips not handed yet, by digest
        self._handed: asyncio.Task[bool] | None = None  # the new clip being prepared
        self._again: set[str] = set()  # new clips handed a second time (never a third)

    async def look(self) -> bool:
        """Hand the default voice's clip to the engine if it is not the one last handed, else
        a new clip (``clips``) when nothing handed waits; True if one was handed (and is
        being prepared)."""
        await self.refresh()
        self._note_new_clips()
        found = self.default()
        if found is not None and found[1].digest != self._digest:
            name, reference = found
            self._digest = reference.digest
            self._waiting.pop(reference.digest, None)
            future = self.engine.prime_later(reference)
            if future is not None:
                self._said = asyncio.create_task(self._say(name, asyncio.wrap_future(future), time.monotonic()))
                return True
            # An earlier default's clip, one prepared as a new clip, or by its requests
            _LOGGER.info("Default voice %s: its clip prepared already", name)
        return self._hand_new_clip()

    def _note_new_clips(self) -> None:
        """Queue the clips not seen before."""
        now = {reference.digest: (name, reference) for name, reference in self.clips()}
        self._waiting.update((digest, clip) for digest, clip in now.items() if digest not in self._known)
        self._known |= set(now)
        for digest in [d for d in self._waiting if d not in now]:  # gone before its turn
            del self._waiting[digest]

    def _hand_new_clip(self) -> bool:
        """Hand the oldest waiting new clip, if the default's and the last one's are done."""
        busy = [task for task in (self._said, self._handed) if task is not None and not task.done()]
        if busy or not self._waiting:
            return False
        digest = next(iter(self._waiting))
        name, reference = self._waiting.pop(digest)
        future = self.engine.prime_later(reference)
        if future is None:  # prepared already (by its first request)
            return False
        self._handed = asyncio.create_task(self._prepared(name, reference, asyncio.wrap_future(future), time.monotonic()))
        return True

    async def _prepared(self, name: str, reference: Reference, done: Awaitable[bool], started: float) -> bool:
        """Log a new clip prepared. One not prepared (a default replaced it in the engine's
        hands, or the library refused it: its request says why) waits for one more turn."""
        if await done:
            _LOGGER.info("Clone voice %s: its clip prepared in %.1f s", name, time.monotonic() - started)
            return True
        if reference.digest != self._digest and reference.digest not in self._again:
            self._again.add(reference.digest)
            self._waiting.setdefault(reference.digest, (name, reference))
        return False

    async def _say(self, name: str, done: Awaitable[bool], started: float) -> None:
        if await done:
            _LOGGER.info("Default voice %s: its clip prepared in %.1f s", name, time.monotonic() - started)

    def start(self) -> None:
        """Keep looking every ``POLL_S`` (a task of the running event loop)."""
        self._task = asyncio.create_task(self._run(), name="default voice preparer")

    async def stop(self) -> None:
        """Stop looking."""
        for task in (self._task, self._said, self._handed):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self.look()
            except Exception:  # noqa: BLE001 - keep looking; a broken folder is logged by the catalogue
                _LOGGER.exception("Looking for a new default voice failed")


def follow_default_voice(service: TtsService, engines: dict[ModelKind, Engine]) -> DefaultVoicePreparer | None:
    """Start a ``DefaultVoicePreparer`` for ``service`` where the Base model runs on the GGML
    engine (the others prepare every clip: ``ClipPreparer``); None elsewhere."""
    from ..engine.cpu.ggml import GgmlEngine

    engine = engines.get(ModelKind.BASE)
    if not isinstance(engine, GgmlEngine):
        return None

    def default() -> tuple[str, Reference] | None:
        name = service.default_voice
        voice = service.catalog.find(name) if name is not None else None
        if voice is None or voice.kind is not ModelKind.BASE or voice.reference is None:
            return None
        return voice.name, voice.reference

    def clips() -> list[tuple[str, Reference]]:
        return [
            (voice.name, voice.reference)
            for voice in service.catalog.voices()
            if voice.kind is ModelKind.BASE and voice.reference is not None
        ]

    preparer = DefaultVoicePreparer(engine, default, service.catalog.refresh_async, clips)
    preparer.start()
    return preparer
