"""The voice catalogue: presets, clone library, content-keyed references, bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wyoming_qwen3tts.voices import ModelKind, Reference, UnknownVoiceError, VoiceCatalog, load_presets

ALL = {ModelKind.BASE, ModelKind.VOICE_DESIGN, ModelKind.CUSTOM_VOICE}


def write_voice(folder: Path, name: str, freq: float = 200.0, transcript: str | None = "Hello there.") -> None:
    t = np.arange(24000) / 24000
    sf.write(folder / f"{name}.wav", (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 24000)
    if transcript is not None:
        (folder / f"{name}.txt").write_text(transcript)


def test_shipped_presets_cover_several_languages_and_openai_names() -> None:
    catalog = VoiceCatalog(None, {ModelKind.VOICE_DESIGN})
    voices = catalog.voices()
    assert len({v.languages[0] for v in voices}) >= 6
    for name in ["alloy", "echo", "fable", "onyx", "nova", "shimmer", "ash", "coral", "sage", "ballad", "verse", "marin", "cedar"]:
        assert catalog.get(name).kind is ModelKind.VOICE_DESIGN
    assert all(v.instruct and v.summary for v in voices)


def test_voices_need_their_model(tmp_path: Path) -> None:
    write_voice(tmp_path, "me")
    only_clone = VoiceCatalog(tmp_path, {ModelKind.BASE})
    assert [v.name for v in only_clone.voices()] == ["me"]
    with pytest.raises(UnknownVoiceError, match="Unknown voice 'aria'"):
        only_clone.get("aria")
    speakers = VoiceCatalog(tmp_path, {ModelKind.CUSTOM_VOICE}, ["ryan", "serena"])
    assert {v.name for v in speakers.voices()} == {"ryan", "serena"}


def test_clone_library_modes_bad_files_and_live_refresh(tmp_path: Path) -> None:
    write_voice(tmp_path, "icl")
    write_voice(tmp_path, "xvec", transcript=None)
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF-not-really")
    write_voice(tmp_path, "tooshort")
    sf.write(tmp_path / "tooshort.wav", np.zeros(100, dtype=np.float32), 24000)
    catalog = VoiceCatalog(tmp_path, ALL)
    clones = {v.name: v for v in catalog.voices() if v.kind is ModelKind.BASE}
    assert set(clones) == {"icl", "xvec"}
    assert clones["icl"].reference and clones["icl"].reference.transcript == "Hello there."
    assert clones["xvec"].reference and clones["xvec"].reference.transcript is None

    write_voice(tmp_path, "newcomer")
    catalog.refresh()
    assert catalog.get("newcomer").kind is ModelKind.BASE


def test_reference_digest_follows_content_not_path(tmp_path: Path) -> None:
    write_voice(tmp_path, "a")
    write_voice(tmp_path, "b")
    write_voice(tmp_path, "c", freq=300.0)
    a, b, c = (Reference.load(tmp_path / f"{n}.wav") for n in "abc")
    assert a.digest == b.digest != c.digest
    (tmp_path / "b.txt").write_text("Different words.")
    assert Reference.load(tmp_path / "b.wav").digest != a.digest
    long = Reference.from_audio(np.zeros(24000 * 60, dtype=np.float32) + 0.1, 24000, None)
    assert len(long.audio) == 20 * 24000  # capped at MAX_REFERENCE_SECONDS


def test_user_presets_add_and_override_and_bad_entries_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "presets.toml").write_text(
        '[aria]\nlanguage = "en"\ninstruct = "A robot."\n'
        '[pirate]\nlanguage = "en"\ninstruct = "A gruff pirate."\nsummary = "Arr"\n'
        '[broken]\nlanguage = "xx"\ninstruct = "nope"\n'
        '[nodesc]\nlanguage = "en"\n'
    )
    catalog = VoiceCatalog(tmp_path, {ModelKind.VOICE_DESIGN})
    assert catalog.get("aria").instruct == "A robot."
    assert catalog.get("pirate").summary == "Arr"
    names = {v.name for v in catalog.voices()}
    assert "broken" not in names and "nodesc" not in names
    (tmp_path / "bad.toml").write_text("this is [not toml")
    assert load_presets([tmp_path / "bad.toml"]) == {}


def test_dangling_links_long_clips_and_alias_rules(tmp_path: Path) -> None:
    write_voice(tmp_path, "ok")
    (tmp_path / "ghost.wav").symlink_to(tmp_path / "does-not-exist.wav")
    t = np.arange(24000 * 90) / 24000
    sf.write(tmp_path / "long.wav", np.stack([0.2 * np.sin(2 * np.pi * 150 * t)] * 2, axis=1).astype(np.float32), 24000)
    (tmp_path / "presets.toml").write_text(
        '[aria]\nlanguage = "de"\ninstruct = "Eine Robotersprache."\n'
        '[robo]\nlanguage = "en"\ninstruct = "A robot."\naliases = "rb"\n'
    )
    catalog = VoiceCatalog(tmp_path, ALL)
    assert {"ok", "long"} <= {v.name for v in catalog.voices()} and "ghost" not in {v.name for v in catalog.voices()}
    long = catalog.get("long").reference
    assert long is not None and len(long.audio) == 20 * 24000  # only the first 20 s were read
    assert catalog.get("alloy").name == "aria" and catalog.get("aria").language == "german"  # override keeps aliases
    with pytest.raises(UnknownVoiceError, match="Unknown voice .robo."):
        catalog.get("robo")  # a string instead of a list of aliases: entry refused
