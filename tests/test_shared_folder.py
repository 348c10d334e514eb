"""One voices folder and one data folder shared by several server processes: studio edits
of ``presets.toml`` from two processes at once merge, two uploads of one name from two
processes cannot both win, and an anchor's render is claimed by one process at a time (a
crashed claimer's claim goes stale). Real ``VoiceLibrary`` / ``AnchorStore`` objects in
separate processes (``multiprocessing`` spawn), no models."""

from __future__ import annotations

import multiprocessing
import os
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wyoming_qwen3tts.service.anchors import CLAIM_STALE_S, AnchorStore
from wyoming_qwen3tts.catalogue.library import LOCK_FILE, VoiceEditError, VoiceLibrary
from wyoming_qwen3tts.catalogue.voices import PRESETS_FILE, VoiceCatalog
from wyoming_qwen3tts.common.vocabulary import ModelKind

#: Presets each process adds.
PER_PROCESS = 12


def _library(folder: Path) -> VoiceLibrary:
    return VoiceLibrary(VoiceCatalog(folder, {ModelKind.BASE, ModelKind.VOICE_DESIGN}), "aria")


def _add_presets(folder: str, prefix: str, start: Any) -> list[str]:
    """A server's studio keeping ``PER_PROCESS`` designs, as fast as it can."""
    library = _library(Path(folder))
    start.wait()
    for i in range(PER_PROCESS):
        with library.reserve(f"{prefix} {i}") as name:
            library.add_preset(
                name, instruct=f"A voice number {i}.", language="en", summary=f"{prefix} {i}",
                seed=i, anchor_text="Hello there.",
            )
    return [v.name for v in library.catalog.voices() if v.name.startswith(prefix)]


def _add_clone(folder: str, name: str, start: Any) -> str:
    """A server's studio adding the clone voice ``name``: "ok" or the refusal's code."""
    library = _library(Path(folder))
    t = np.arange(24000 * 2) / 24000
    audio = (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    start.wait()
    try:
        with library.reserve(name) as held:
            library.add_clone(held, audio, None)
    except VoiceEditError as err:
        return err.code
    return "ok"


def _pool(n: int) -> tuple[Any, Any]:
    context = multiprocessing.get_context("spawn")
    return context.Pool(n), context.Manager()


def test_two_processes_adding_presets_at_once_lose_nothing(tmp_path: Path) -> None:
    """Without the folder's lock, each process's read-modify-write of presets.toml would
    drop the other's tables written in between."""
    pool, manager = _pool(2)
    with pool, manager:
        start = manager.Barrier(2)
        jobs = [pool.apply_async(_add_presets, (str(tmp_path), prefix, start)) for prefix in ("left", "right")]
        seen = [job.get(120) for job in jobs]
    tables = tomllib.loads((tmp_path / PRESETS_FILE).read_text())
    assert sorted(tables) == sorted(f"{p} {i}" for p in ("left", "right") for i in range(PER_PROCESS))
    assert [len(names) for names in seen] == [PER_PROCESS, PER_PROCESS]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary left behind
    assert (tmp_path / LOCK_FILE).exists()
    catalog = VoiceCatalog(tmp_path, {ModelKind.VOICE_DESIGN})
    assert {v.name for v in catalog.voices()} >= set(tables)


def test_two_processes_uploading_one_name_at_once_one_wins(tmp_path: Path) -> None:
    pool, manager = _pool(2)
    with pool, manager:
        start = manager.Barrier(2)
        jobs = [pool.apply_async(_add_clone, (str(tmp_path), name, start)) for name in ("Dup", "dup")]
        outcomes = sorted(job.get(120) for job in jobs)
    assert outcomes == ["name-taken", "ok"], outcomes
    assert len(list(tmp_path.glob("*.wav"))) == 1


def test_a_library_change_checks_what_another_server_wrote(tmp_path: Path) -> None:
    """Server B's catalogue is stale (it read the folder before A wrote): B's change is
    still checked against A's, under the lock."""
    a, b = _library(tmp_path), _library(tmp_path)
    with b.reserve("Shared") as name_b:  # B checked the name while it was free
        with a.reserve("Shared") as name_a:
            a.add_preset(name_a, instruct="A calm voice.", language="en", summary="a", seed=1, anchor_text="Hi.")
        with pytest.raises(VoiceEditError) as taken:
            b.add_preset(name_b, instruct="A loud voice.", language="en", summary="b", seed=2, anchor_text="Hi.")
    assert taken.value.code == "name-taken"
    assert tomllib.loads((tmp_path / PRESETS_FILE).read_text())["Shared"]["summary"] == "a"
    # A rename through B of a preset A just deleted is refused with nothing written.
    a.delete("Shared")
    with pytest.raises(VoiceEditError) as gone:
        b.rename("Shared", "Other")
    assert gone.value.code == "unknown-voice"
    assert tomllib.loads((tmp_path / PRESETS_FILE).read_text()) == {}


def test_a_held_lock_makes_a_change_wait_then_refuses_it_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wyoming_qwen3tts.catalogue import library as library_module

    monkeypatch.setattr(library_module, "LOCK_TIMEOUT_S", 0.3)
    lib = _library(tmp_path)
    held = tmp_path / ".held"
    holder = multiprocessing.get_context("spawn").Process(target=_hold_lock, args=(str(tmp_path / LOCK_FILE), str(held)))
    holder.start()
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert time.monotonic() < deadline and holder.is_alive()
            time.sleep(0.05)
        with pytest.raises(VoiceEditError) as busy:
            with lib.reserve("Late") as name:
                lib.add_preset(name, instruct="A voice.", language="en", summary="s", seed=1, anchor_text="Hi.")
        assert busy.value.code == "voices-busy" and "locked" in str(busy.value)
        assert not (tmp_path / PRESETS_FILE).exists()
    finally:
        holder.terminate()
        holder.join()
    with lib.reserve("Late") as name:  # the holder is gone: the lock is free again
        lib.add_preset(name, instruct="A voice.", language="en", summary="s", seed=1, anchor_text="Hi.")


def _hold_lock(path: str, marker: str) -> None:
    import filelock

    with filelock.FileLock(path):
        Path(marker).touch()
        time.sleep(60)


def test_an_anchor_claim_is_held_by_one_process_until_released_or_stale(tmp_path: Path) -> None:
    """Two stores on one folder are two servers (each has its own owner token)."""
    one, other = AnchorStore(tmp_path), AnchorStore(tmp_path)
    assert one.owner != other.owner
    assert one.claim("k") and not other.claim("k")
    assert other.claimed_elsewhere("k") == one.owner and one.claimed_elsewhere("k") is None
    other.release("k")  # not its claim: left alone
    assert (tmp_path / "k.claim").exists()
    one.release("k")
    assert not (tmp_path / "k.claim").exists()
    assert other.claim("k")
    # Its server crashed: no heartbeat for CLAIM_STALE_S, so another takes it over.
    old = time.time() - CLAIM_STALE_S - 1
    os.utime(tmp_path / "k.claim", (old, old))
    assert one.claimed_elsewhere("k") is None and one.claim("k")
    assert other.claimed_elsewhere("k") == one.owner
    one.touch_claim("k")
    assert time.time() - (tmp_path / "k.claim").stat().st_mtime < 5
