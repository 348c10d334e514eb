"""The voice catalogue (presets, clone library, content-keyed references, bad files), the
voices folder's writable side (names, uploaded clips, atomic edits) and anchor keys."""

from __future__ import annotations

import logging

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wyoming_qwen3tts.service.anchors import (
    ANCHOR_TEXTS,
    AnchorSpec,
    AnchorStore,
    model_identity,
    preset_seed,
    preset_spec,
)
from wyoming_qwen3tts.catalogue.library import (
    LOCK_FILE,
    MAX_NAME_CHARS,
    DeletedSkipped,
    VoiceEditError,
    VoiceLibrary,
    check_name,
    decode_clip,
)
from wyoming_qwen3tts.catalogue import library, voices as voices_module
from wyoming_qwen3tts.catalogue.voices import (
    AUDIO_SUFFIXES,
    MAX_TRANSCRIPT_CHARS,
    MAX_TRANSCRIPT_CHARS_PER_SECOND,
    SkippedClip,
    TranscriptFault,
    UnknownVoiceError,
    VoiceCatalog,
    VoiceSource,
    load_presets,
    load_reference,
    overlong_transcript_reason,
)
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference

ALL = {ModelKind.BASE, ModelKind.VOICE_DESIGN, ModelKind.CUSTOM_VOICE}


def write_voice(folder: Path, name: str, freq: float = 200.0, transcript: str | None = "Hello there.") -> None:
    t = np.arange(24000) / 24000
    sf.write(folder / f"{name}.wav", (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 24000)
    if transcript is not None:
        (folder / f"{name}.txt").write_text(transcript)


def scanned_once(folder: Path, caplog: pytest.LogCaptureFixture) -> tuple[VoiceCatalog, list[tuple[int, str]]]:
    """A clone catalogue of ``folder`` and what its scan logged at WARNING or above, as
    (level, message); checks that a forced rescan logs nothing more (each said once)."""
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(folder, {ModelKind.BASE})
        said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
        caplog.clear()
        catalog.refresh(force=True)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # once
    return catalog, said


def skip_warnings(folder: Path, clips: list[SkippedClip]) -> list[tuple[int, str]]:
    """The WARNINGs a scan of ``folder`` logs for the skipped ``clips``, as ``scanned_once``
    returns them."""
    return [(logging.WARNING, f"Skipping clone voice {folder / clip.file}: {clip.reason}") for clip in clips]


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
    # a preset (or its OpenAI alias) without the VoiceDesign model: said so, not "unknown"
    with pytest.raises(UnknownVoiceError, match="Voice 'aria' is the preset 'aria', and presets need the VoiceDesign model"):
        only_clone.get("aria")
    with pytest.raises(UnknownVoiceError, match=r"Voice 'alloy' is the preset '\w+' \('alloy' is its alias\).*available: me"):
        only_clone.get("alloy")
    with pytest.raises(UnknownVoiceError, match="Unknown voice 'nobody'"):
        only_clone.get("nobody")
    speakers = VoiceCatalog(tmp_path, {ModelKind.CUSTOM_VOICE}, ["ryan", "serena"])
    assert {v.name for v in speakers.voices()} == {"ryan", "serena"}


def taken_logs(caplog: pytest.LogCaptureFixture, level: int, needle: str) -> list[str]:
    """The captured messages at ``level`` or above that mention ``needle``; clears the capture."""
    found = [r.getMessage() for r in caplog.records if r.levelno >= level and needle in r.getMessage()]
    caplog.clear()
    return found


def test_a_broken_clip_is_logged_once_until_it_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A rescan (another file of the folder changed) does not log an unchanged broken clip
    at WARNING again; the same clip rewritten, still broken, is logged again."""
    write_voice(tmp_path, "icl")
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF-not-really")

    def errors() -> list[str]:
        return taken_logs(caplog, logging.WARNING, "corrupt.wav")

    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
        assert len(errors()) == 1
        write_voice(tmp_path, "newcomer")
        catalog.refresh()
        assert catalog.get("newcomer").kind is ModelKind.BASE
        assert errors() == []
        catalog.refresh(force=True)
        assert errors() == []
        (tmp_path / "corrupt.wav").write_bytes(b"RIFF-still-not-a-wav")
        catalog.refresh()
        assert len(errors()) == 1
        with pytest.raises(UnknownVoiceError, match="could not be used"):
            catalog.get("corrupt")


def test_a_transcript_without_its_clip_is_reported_once_and_named_when_asked_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``orphan.txt`` with no ``orphan.wav`` (the clip not copied yet, or misnamed) is logged at
    WARNING once, a request for it says what to add, and the clip arriving makes it a voice
    (the new-user trial: it was ignored without a word, then "Unknown voice 'orphan'"). What
    to add names every format the folder reads: it said "orphan.wav or orphan.flac", though
    an MP3 or M4A clip is read too."""
    write_voice(tmp_path, "icl")
    (tmp_path / "orphan.txt").write_text("What the clip would say.")

    def warnings() -> list[str]:
        return taken_logs(caplog, logging.WARNING, "orphan.txt")

    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
        formats = "orphan.wav (or .flac, .mp3, .m4a, .ogg, ...)"  # formats people have, each one read
        assert {".flac", ".mp3", ".m4a", ".ogg"} <= set(AUDIO_SUFFIXES)
        assert warnings() == [f"Transcript {tmp_path / 'orphan.txt'} has no clip beside it: not a voice yet; add an "
                              f"audio clip {formats}"]
        with pytest.raises(UnknownVoiceError) as asked:
            catalog.get("Orphan")
        assert str(asked.value).startswith(f"Voice 'Orphan' has a transcript (orphan.txt) but no clip beside it: add "
                                           f"an audio clip {formats} to the voices folder; available: "), asked.value
        write_voice(tmp_path, "other")
        catalog.refresh()
        assert warnings() == []  # unchanged: not logged again
        with pytest.raises(UnknownVoiceError, match="Unknown voice 'nobody'"):
            catalog.get("nobody")
        write_voice(tmp_path, "orphan")
        catalog.refresh()
        assert catalog.get("orphan").reference is not None and warnings() == []


def test_a_clone_named_as_a_preset_takes_its_aliases_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A clone ``aria.wav`` shadows the shipped preset ``aria`` and takes over its OpenAI
    aliases (``nova`` and the others reach the clone, not a 404), a clone ``Ryan.wav`` the
    speaker ``ryan``; each shadow is logged once at WARNING, not at every lookup or rescan,
    and the preset is back, aliases and all, once the clip is gone. A clip named like an alias
    (``Nova.wav``) is that name, and the alias leaves the voice that had it, logged once."""
    write_voice(tmp_path, "aria")
    write_voice(tmp_path, "Ryan")
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL, custom_speakers=["ryan"])
        for name in ("aria", "alloy", "nova", "shimmer", "coral"):
            assert catalog.get(name).source is VoiceSource.CLONE and catalog.get(name).name == "aria", name
        assert catalog.get("ryan").source is VoiceSource.CLONE
        said = taken_logs(caplog, logging.WARNING, "takes the name")
        assert len(said) == 2, said
        assert any("shipped preset aria" in m and "nova" in m for m in said)
        assert any("CustomVoice speaker ryan" in m for m in said)
        catalog.refresh(force=True)
        catalog.voices()
        assert taken_logs(caplog, logging.WARNING, "takes the name") == []
        (tmp_path / "aria.wav").unlink()
        (tmp_path / "aria.txt").unlink()
        catalog.refresh()
        assert catalog.get("nova").source is VoiceSource.SHIPPED and catalog.get("nova").name == "aria"
        assert taken_logs(caplog, logging.WARNING, "takes the name") == []
        write_voice(tmp_path, "ARIA")
        catalog.refresh()
        assert catalog.get("nova").name == "ARIA"
        assert len(taken_logs(caplog, logging.WARNING, "shipped preset aria")) == 1
        # A clip named like an alias: the name wins, listed once, and the alias leaves ARIA.
        write_voice(tmp_path, "Nova")
        catalog.refresh()
        assert catalog.get("nova").name == "Nova" and catalog.get("alloy").name == "ARIA"
        aria = next(v for v in catalog.voices() if v.name == "ARIA")
        assert [a.casefold() for a in aria.aliases] == ["alloy", "shimmer", "coral"]
        said = taken_logs(caplog, logging.WARNING, "an alias of")
        assert len(said) == 1 and "takes the name nova, an alias of the clone voice ARIA" in said[0], said
        catalog.voices()
        assert taken_logs(caplog, logging.WARNING, "an alias of") == []


def test_clone_files_of_one_name_or_with_control_characters_are_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two clips naming one voice (``GOODIE.wav`` and ``goodie.wav``; ``dup.flac`` and
    ``dup.wav``): the first by ``clip_preference`` is used (of one format the first in name
    order, with ``goodie.txt``, its transcript in any case; WAV before FLAC) and the other
    named in a WARNING; a clip whose name holds a control character (a newline would split
    every log line naming it) is skipped with a WARNING that shows it escaped. Each once, not
    again at a rescan. All three are in the studio's Skipped files (``skipped``) with the
    reason: they were only in the log, so the page did not say why they gave no voice."""
    write_voice(tmp_path, "goodie", freq=200.0)
    write_voice(tmp_path, "GOODIE", freq=300.0, transcript=None)
    write_voice(tmp_path, "dup")
    t = np.arange(24000) / 24000
    sf.write(tmp_path / "dup.flac", 0.5 * np.sin(2 * np.pi * 250 * t), 24000)
    write_voice(tmp_path, "new\nline")
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
        control = [r for r in caplog.records if "control characters" in r.getMessage()]
        names = sorted(v.name for v in catalog.voices() if v.source is VoiceSource.CLONE)
        assert names == ["GOODIE", "dup"], names
        goodie = catalog.get("goodie").reference  # GOODIE.wav, with goodie.txt: names are case-insensitive
        assert goodie is not None and goodie.transcript == "Hello there."
        same = taken_logs(caplog, logging.WARNING, "same voice name")
        assert len(same) == 2, same
        assert any("using 'GOODIE.wav', ignoring 'goodie.wav' (the first by file name is used)" in m for m in same)
        assert ("Clone voice files 'dup.wav' and 'dup.flac' have the same voice name: using 'dup.wav', ignoring "
                "'dup.flac' (.wav comes before .flac in the order of formats: .wav, .flac, ") in " ".join(same), same
        assert {clip.file: clip.reason for clip in catalog.skipped()} == {
            "dup.flac": "dup.wav gives the same voice name and is used instead (.wav comes before .flac in the order "
                        f"of formats: {', '.join(AUDIO_SUFFIXES)}); rename or remove this file",
            "goodie.wav": "GOODIE.wav gives the same voice name and is used instead (the first by file name is used); "
                          "rename or remove this file",
            "new\nline.wav": "its name holds control characters; rename the file",
        }
        with pytest.raises(UnknownVoiceError):
            catalog.get("new\nline")
        catalog.refresh(force=True)
        control += [r for r in caplog.records if "control characters" in r.getMessage()]
        assert taken_logs(caplog, logging.WARNING, "same voice name") == []
    message = "Skipping clone voice 'new\\nline.wav': its name holds control characters; rename the file"
    assert [(r.levelno, r.getMessage()) for r in control] == [(logging.WARNING, message), (logging.DEBUG, message)]


def test_a_transcript_whose_name_differs_in_case_is_the_clips(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``Kim.wav`` beside ``kim.txt``: one voice, ``Kim``, cloned with its transcript (ICL),
    and no warning that the transcript has no clip; ``Lee.wav`` with ``Lee.txt`` and
    ``lee.txt`` takes its own ``Lee.txt``."""
    write_voice(tmp_path, "Kim", transcript=None)
    (tmp_path / "kim.txt").write_text("Kim speaking.")
    write_voice(tmp_path, "Lee", transcript="Lee exactly.")
    (tmp_path / "lee.txt").write_text("Not this one.")
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
        kim, lee = catalog.get("kim"), catalog.get("LEE")
        assert kim.name == "Kim" and kim.reference is not None and kim.reference.transcript == "Kim speaking."
        assert "reference transcript" in kim.summary
        assert lee.reference is not None and lee.reference.transcript == "Lee exactly."
        assert taken_logs(caplog, logging.WARNING, "no clip beside it") == []


def _tone_wav(seconds: float, freq: float = 200.0) -> bytes:
    """A 24 kHz WAV of a ``seconds`` long tone (what a user copies in, or uploads)."""
    out = io.BytesIO()
    t = np.arange(int(seconds * 24000)) / 24000
    sf.write(out, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 24000, format="WAV")
    return out.getvalue()


def test_a_clip_shorter_than_the_studio_takes_is_skipped_until_replaced_with_a_longer_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 0.5 s ``kim.wav`` copied into the folder is no voice, as the studio refuses such an
    upload (one constant, ``voices.MIN_CLIP_SECONDS``): one WARNING names the file and why,
    a rescan does not repeat it, a request is told why, the start-up survey skips it; the
    clip replaced by a 2 s one (written aside, renamed over it) is picked up by the next
    rescan like any other change, with its transcript."""
    import os

    from wyoming_qwen3tts.catalogue import library, voices
    from wyoming_qwen3tts.startup import survey_clips

    assert library.MIN_CLIP_SECONDS is voices.MIN_CLIP_SECONDS == 1.0
    write_voice(tmp_path, "icl")
    (tmp_path / "kim.wav").write_bytes(_tone_wav(0.5))
    (tmp_path / "kim.txt").write_text("Kim speaking.")
    with pytest.raises(VoiceEditError) as refused:  # the studio's refusal of the same clip
        decode_clip(_tone_wav(0.5))
    assert refused.value.code == "clip-too-short"
    decode_clip(_tone_wav(1.0))  # exactly the minimum: taken by both
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
        assert catalog.find("kim") is None and catalog.get("icl").kind is ModelKind.BASE
        said = [(r.levelno, r.getMessage()) for r in caplog.records if "kim.wav" in r.getMessage()]
        assert said == [(logging.WARNING, f"Skipping clone voice {tmp_path / 'kim.wav'}: the clip is 0.50 s long, "
                                          "under the 1 s a clone clip needs")]
        caplog.clear()
        with pytest.raises(UnknownVoiceError, match=r"'kim' is a clone whose clip could not be used \(kim.wav: the clip "
                                                     r"is 0.50 s long, under the 1 s a clone clip needs"):
            catalog.get("kim")
        assert catalog.skipped_clips() == ["kim.wav: the clip is 0.50 s long, under the 1 s a clone clip needs"]
        assert survey_clips(tmp_path) == (True, ["kim.wav (0.50 s long, under the 1 s a clone clip needs)"])
        write_voice(tmp_path, "other")  # another change: a rescan, kim's warning not repeated
        catalog.refresh()
        assert catalog.find("other") is not None and catalog.find("kim") is None
        assert taken_logs(caplog, logging.WARNING, "kim.wav") == []
        (tmp_path / ".kim.wav").write_bytes(_tone_wav(2.0))
        os.replace(tmp_path / ".kim.wav", tmp_path / "kim.wav")
        assert catalog.stale()
        catalog.refresh()
        kim = catalog.get("kim")
        assert kim.reference is not None and kim.reference.transcript == "Kim speaking."
        assert len(kim.reference.audio) == 2 * 24000 and catalog.skipped_clips() == []
        assert taken_logs(caplog, logging.WARNING, "kim") == []


def test_a_clip_cut_off_short_of_its_header_is_said_to_be_cut_off_as_an_upload_and_in_the_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 3 s WAV cut to its first 2000 bytes (an incomplete download; its header still says
    3 s) was refused as "The clip is 0.04 s long; at least 1 s is needed", baffling for a
    file a player calls 3 s long. The upload's refusal (still ``clip-too-short``) and the
    folder scan's reason now say the file looks cut off, with both lengths; a clip that is
    short in its header too keeps the short clip's words."""
    whole = _tone_wav(3.0)
    cut = whole[:2000]
    reason = ("the clip holds 0.04 s of audio though its header says 3.00 s: the file looks cut off, an incomplete "
              "download or copy")
    with pytest.raises(VoiceEditError) as refused:
        decode_clip(cut)
    assert (refused.value.status, refused.value.code) == (400, "clip-too-short")
    assert str(refused.value) == f"T{reason[1:]}; upload the whole file"
    with pytest.raises(VoiceEditError) as refused:
        decode_clip(_tone_wav(0.5))
    assert str(refused.value) == "The clip is 0.50 s long; at least 1 s is needed"

    write_voice(tmp_path, "icl")
    (tmp_path / "kim.wav").write_bytes(cut)
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
    assert catalog.find("kim") is None and catalog.skipped_clips() == [f"kim.wav: {reason}"]
    assert taken_logs(caplog, logging.WARNING, "kim.wav") == [f"Skipping clone voice {tmp_path / 'kim.wav'}: {reason}"]
    # The header's length: a WAV's own (FFmpeg and libsndfile trim it to the bytes present).
    from wyoming_qwen3tts.catalogue.voices import declared_seconds

    assert declared_seconds(io.BytesIO(cut)) == declared_seconds(str(tmp_path / "kim.wav")) == 3.0
    assert declared_seconds(io.BytesIO(b"not audio at all")) is None


def test_a_flac_clip_cut_short_is_said_to_be_cut_off_as_an_upload_and_in_the_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 3 s FLAC cut to half its bytes (an incomplete download) was refused as "not audio that
    FFmpeg can read (Invalid data found when processing input)" as an upload and "could not be
    decoded as audio: flac decoder lost sync" in the folder, though a player plays its first
    part. FFmpeg decodes its audio, then stops: the upload's refusal (400 ``clip-cut-off``)
    and the folder scan's reason now say it is cut off and after how much audio; a file with
    no decodable audio at all is still not audio. (A cut Ogg or MP3 decodes to its end without
    an error: it is a shorter clip, or a cut-off one by its header, ``cut_off_reason``.)"""
    buffer = io.BytesIO()
    sf.write(buffer, 0.3 * np.sin(2 * np.pi * 220 * np.arange(72000) / 24000), 24000, format="FLAC")
    cut = buffer.getvalue()[: len(buffer.getvalue()) // 2]
    suffix = "flac"
    with pytest.raises(VoiceEditError) as refused:
        decode_clip(cut)
    assert (refused.value.status, refused.value.code) == (400, "clip-cut-off"), refused.value
    message = str(refused.value)
    assert message.startswith("The file is cut off after ") and message.endswith("; upload the whole file"), message
    seconds = float(message.removeprefix("The file is cut off after ").split(" s ")[0])
    assert 0.5 <= seconds < 3.0, message  # its first part decoded
    with pytest.raises(VoiceEditError) as refused:
        decode_clip(cut[:200])  # no audio decodes at all: not audio, as before
    assert refused.value.code == "not-audio", refused.value

    write_voice(tmp_path, "icl")
    (tmp_path / f"kim.{suffix}").write_bytes(cut)
    (tmp_path / "junk.flac").write_bytes(b"not audio at all" * 100)
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
    assert catalog.find("kim") is None
    junk, kim = catalog.skipped_clips()
    assert kim.startswith(f"kim.{suffix}: the file is cut off after ") and "incomplete download" in kim, kim
    assert junk.startswith("junk.flac: the file could not be decoded as audio"), junk  # libsndfile's words stay
    assert len(taken_logs(caplog, logging.WARNING, f"kim.{suffix}")) == 1


def test_a_silent_clip_and_a_short_one_are_skipped_alike_at_warning_in_words_fit_for_the_studio_page(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A silent clip in the voices folder was logged at ERROR, a too-short one at WARNING,
    though both are the same event (the clip is skipped, the server goes on), and the
    short clip's reason ended "(the voice studio refuses such an upload too)", odd on the
    studio page's Skipped files list where it is shown. Now both are WARNINGs of one shape,
    "Skipping clone voice <path>: the clip is <what>, under the <minimum> a clone clip needs",
    their reasons free of any mention of the studio; a file that is no audio is a WARNING too
    (``test_a_corrupt_wav_or_flac_is_one_warning_...``)."""
    write_voice(tmp_path, "icl")
    (tmp_path / "kim.wav").write_bytes(_tone_wav(0.5))
    sf.write(tmp_path / "hush.wav", np.zeros(24000, np.float32), 24000)
    (tmp_path / "broken.wav").write_bytes(b"RIFF....not a wav file")
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
    said = {r.getMessage(): r.levelno for r in caplog.records if r.getMessage().startswith("Skipping clone voice")}
    assert said.pop(f"Skipping clone voice {tmp_path / 'kim.wav'}: the clip is 0.50 s long, "
                    "under the 1 s a clone clip needs") == logging.WARNING, said
    assert said.pop(f"Skipping clone voice {tmp_path / 'hush.wav'}: the clip is silent: only 0.00 s of it is "
                    "louder than -43 dBFS, under the 0.1 s a clone clip needs") == logging.WARNING, said
    assert list(said.values()) == [logging.WARNING] and "broken.wav" in next(iter(said)), said
    reasons = {clip.file: clip.reason for clip in catalog.skipped()}
    assert reasons["kim.wav"] == "the clip is 0.50 s long, under the 1 s a clone clip needs", reasons
    assert reasons["hush.wav"].endswith("under the 0.1 s a clone clip needs"), reasons
    assert not any("studio" in reason for reason in reasons.values()), reasons


def test_a_corrupt_wav_or_flac_is_one_warning_that_it_could_not_be_decoded_and_a_skipped_clip(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``.wav`` of random bytes or a ``.flac`` of text was an ERROR with libsndfile's bare
    "Error opening '<path>': Format not recognised.", and the start-up survey said only
    "no readable audio". Now, as a file FFmpeg cannot read: one WARNING naming the file and
    saying it could not be decoded as audio (libsndfile's reason kept), the clip listed among
    the skipped with that reason, the start-up checks giving the same reason."""
    from wyoming_qwen3tts.startup import check_default_voice, survey_clips

    write_voice(tmp_path, "icl")
    (tmp_path / "noise.wav").write_bytes(np.random.default_rng(0).bytes(4000))
    (tmp_path / "notes.flac").write_text("Not audio at all, a text file renamed.")
    unread = "the file could not be decoded as audio: Format not recognised"
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
        said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
        assert sorted(said) == [(logging.WARNING, f"Skipping clone voice {tmp_path / file}: {unread}")
                                for file in ("noise.wav", "notes.flac")], said
        caplog.clear()
        write_voice(tmp_path, "newcomer")
        catalog.refresh()
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # said once
    assert catalog.skipped() == [SkippedClip("noise", "noise.wav", unread), SkippedClip("notes", "notes.flac", unread)]
    assert catalog.skipped_clips() == [f"noise.wav: {unread}", f"notes.flac: {unread}"]
    with pytest.raises(UnknownVoiceError, match=rf"'noise' is a clone whose clip could not be used \(noise.wav: "
                                                rf"{unread}\); replace the file"):
        catalog.get("noise")
    assert survey_clips(tmp_path) == (True, [f"noise.wav ({unread})", f"notes.flac ({unread})"])
    with pytest.raises(SystemExit, match=rf"could not be used \(notes.flac: {unread}\)"):
        check_default_voice("notes", tmp_path, {ModelKind.BASE})


def test_a_clone_with_two_transcripts_reads_one_by_a_fixed_rule_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``kim.TXT`` and ``kim.txt`` beside ``kim.wav`` (a case-sensitive file system): the
    clip's own ``kim.txt`` is read; without one of its own stem, the first in name order
    (``Lee.wav``: ``lee.TXT`` before ``lee.txt``), as of two clips of one name. One WARNING
    names the files and the one used; a rescan does not repeat it, a third transcript
    says so again, and none is said once one transcript is left."""
    import os

    write_voice(tmp_path, "kim", transcript="The right one.")
    (tmp_path / "kim.TXT").write_text("The stray copy.")
    write_voice(tmp_path, "Lee", transcript=None)
    (tmp_path / "lee.txt").write_text("Lower case.")
    (tmp_path / "lee.TXT").write_text("Upper case extension.")
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
        kim, lee = catalog.get("kim"), catalog.get("lee")
        assert kim.reference is not None and kim.reference.transcript == "The right one."
        assert lee.reference is not None and lee.reference.transcript == "Upper case extension."
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warned == [
            "Clone voice 'Lee.wav' has 2 transcripts, 'lee.TXT' and 'lee.txt' (names are case-insensitive; spaces "
            "around a name and how its accents are encoded do not count): using 'lee.TXT', ignoring 'lee.txt'; "
            "remove or rename the others",
            "Clone voice 'kim.wav' has 2 transcripts, 'kim.txt' and 'kim.TXT' (names are case-insensitive; spaces "
            "around a name and how its accents are encoded do not count): using 'kim.txt', ignoring 'kim.TXT'; "
            "remove or rename the others",
        ], warned
        caplog.clear()
        write_voice(tmp_path, "other")
        catalog.refresh()
        assert taken_logs(caplog, logging.WARNING, "transcripts") == []
        (tmp_path / "Kim .txt").write_text("A third.")
        catalog.refresh()
        assert catalog.get("kim").reference.transcript == "The right one."  # type: ignore[union-attr]
        assert taken_logs(caplog, logging.WARNING, "transcripts") == [
            "Clone voice 'kim.wav' has 3 transcripts, 'kim.txt' and 'Kim .txt' and 'kim.TXT' (names are "
            "case-insensitive; spaces around a name and how its accents are encoded do not count): using "
            "'kim.txt', ignoring 'Kim .txt' and 'kim.TXT'; remove or rename the others"
        ]
        os.remove(tmp_path / "Kim .txt")
        os.remove(tmp_path / "kim.TXT")
        catalog.refresh()
        assert taken_logs(caplog, logging.WARNING, "transcripts") == []


def test_a_rescan_reads_only_the_clips_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rescan runs on the event loop: it reads again only a clip whose file or transcript
    changed (the new-user trial: touching any file of a 20-clip folder re-read every clip
    and held every client for 0.8 s)."""
    for name in ("ann", "bob", "cy"):
        write_voice(tmp_path, name)
    (tmp_path / "broken.wav").write_bytes(b"RIFF-not-really")
    read: list[str] = []
    original = voices_module.load_reference

    def counting(path: Path, transcript: Path | None = None) -> Reference:
        read.append(path.stem)
        return original(path, transcript)

    monkeypatch.setattr(voices_module, "load_reference", counting)
    catalog = VoiceCatalog(tmp_path, ALL)
    assert sorted(read) == ["ann", "bob", "broken", "cy"]
    read.clear()
    (tmp_path / "notes.txt").write_text("not a transcript of any clip")
    catalog.refresh()
    catalog.refresh(force=True)
    assert read == []
    (tmp_path / "bob.txt").write_text("A new transcript for Bob.")
    catalog.refresh()
    assert read == ["bob"]
    bob = catalog.get("bob").reference
    assert bob is not None and bob.transcript == "A new transcript for Bob."
    read.clear()
    write_voice(tmp_path, "cy", freq=300.0, transcript=None)  # the clip rewritten
    (tmp_path / "ann.wav").unlink()
    catalog.refresh()
    assert read == ["cy"]
    assert catalog.find("ann") is None and catalog.get("cy").reference is not None
    with pytest.raises(UnknownVoiceError, match="could not be used"):
        catalog.get("broken")  # still reported, from what was read before


def test_clone_library_modes_bad_files_and_live_refresh(tmp_path: Path) -> None:
    write_voice(tmp_path, "icl")
    write_voice(tmp_path, "xvec", transcript=None)
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF-not-really")
    write_voice(tmp_path, "tooshort")
    sf.write(tmp_path / "tooshort.wav", np.zeros(100, dtype=np.float32), 24000)
    write_voice(tmp_path, "hush")  # silent, as an upload would be refused for: skipped
    sf.write(tmp_path / "hush.wav", np.full(48000, 0.001, dtype=np.float32), 24000)
    catalog = VoiceCatalog(tmp_path, ALL)
    clones = {v.name: v for v in catalog.voices() if v.kind is ModelKind.BASE}
    assert set(clones) == {"icl", "xvec"}
    assert clones["icl"].reference and clones["icl"].reference.transcript == "Hello there."
    assert clones["xvec"].reference and clones["xvec"].reference.transcript is None
    # A client naming a skipped clip is told why, not only that the voice is unknown.
    with pytest.raises(UnknownVoiceError, match=r"'tooshort' is a clone whose clip could not be used \(tooshort.wav: the clip is 0.00 s long, under the 1 s "):
        catalog.get("tooshort")
    with pytest.raises(UnknownVoiceError, match=r"'Hush' is a clone whose clip could not be used \(hush.wav: the clip is silent"):
        catalog.get("Hush")
    with pytest.raises(UnknownVoiceError, match=r"'corrupt' is a clone whose clip could not be used \(corrupt.wav: ") as unreadable:
        catalog.get("corrupt")
    assert str(tmp_path) not in str(unreadable.value)  # the client is not told the server's folders

    write_voice(tmp_path, "newcomer")
    write_voice(tmp_path, "tooshort")  # fixed: served, no longer reported
    catalog.refresh()
    assert catalog.get("newcomer").kind is ModelKind.BASE and catalog.get("tooshort").kind is ModelKind.BASE


def test_reference_digest_follows_content_not_path(tmp_path: Path) -> None:
    write_voice(tmp_path, "a")
    write_voice(tmp_path, "b")
    write_voice(tmp_path, "c", freq=300.0)
    a, b, c = (load_reference(tmp_path / f"{n}.wav") for n in "abc")
    assert a.digest == b.digest != c.digest
    (tmp_path / "b.txt").write_text("Different words.")
    assert load_reference(tmp_path / "b.wav").digest != a.digest
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
    # A client asking for a voice that a broken entry or file hides is told why.
    with pytest.raises(UnknownVoiceError, match=r"Skipping preset 'broken' in .*presets.toml.*1 more"):
        catalog.get("broken")
    (tmp_path / "presets.toml").write_text('[captain]\nlanguage = "en"\ninstruct = "A captain."\n[oops')
    catalog.refresh()
    with pytest.raises(UnknownVoiceError, match=r"Skipping presets file .*presets.toml"):
        catalog.get("captain")
    # A number where a text belongs is named as such, not as Python's "'int' object has no attribute".
    (tmp_path / "presets.toml").write_text('[captain]\nlanguage = 5\ninstruct = "A captain."\n')
    catalog.refresh()
    with pytest.raises(UnknownVoiceError, match=r"Skipping preset 'captain' .*: language must be a string in quotes, e.g. language = \"en\"$"):
        catalog.get("captain")


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


# --- the voices folder's writable side (library) and anchor keys ------------------------------

@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"), ("   ", "empty"), (None, "empty"), ("x" * 49, "49 characters"),
        ("a/b", "path separator"), ("a\\b", "path separator"), ("..", "'..'"), ("a..b", "'..'"),
        (".hidden", "may hold only"), ("tab\there", "may hold only"), ("semi;colon", "may hold only"),
        ("trailing.", "may not end with a dot"), ("con", "device name"), ("NUL.txt", "device name"), ("com3", "device name"),
    ],
)
def test_bad_names_are_named(name: object, reason: str) -> None:
    with pytest.raises(VoiceEditError, match=reason) as caught:
        check_name(name)
    assert caught.value.code == "invalid-name" and caught.value.status == 400


def test_good_names() -> None:
    assert check_name("  Grandma Rose ") == "Grandma Rose"
    assert check_name("kitchen-2.0") == "kitchen-2.0"
    assert check_name("Zoë_o'neil") == "Zoë_o'neil"
    assert check_name("小明") == "小明"


def test_decode_clip_reads_any_format_and_refuses_bad_clips() -> None:
    t = np.arange(int(2.5 * 44100)) / 44100
    buffer = io.BytesIO()
    sf.write(buffer, np.stack([0.3 * np.sin(2 * np.pi * 220 * t)] * 2, axis=1), 44100, format="FLAC")
    audio = decode_clip(buffer.getvalue())  # stereo 44.1 kHz FLAC -> mono 24 kHz
    assert audio.dtype == np.float32 and abs(len(audio) - int(2.5 * 24000)) <= 64
    for data, code in [
        (b"plain text, not audio" * 20, "not-audio"),
        (b"", "not-audio"),
        (bytes(21_000_000), "clip-too-large"),
    ]:
        with pytest.raises(VoiceEditError) as caught:
            decode_clip(data)
        assert caught.value.code == code


def _library(folder: Path, default: str = "aria") -> VoiceLibrary:
    return VoiceLibrary(VoiceCatalog(folder, ALL, ["ryan"]), default)


def test_library_writes_keep_the_users_presets_file(tmp_path: Path) -> None:
    (tmp_path / "presets.toml").write_text('# my own comment\n[pirate]\nlanguage = "en"\ninstruct = "A gruff pirate."\n')
    library = _library(tmp_path)
    voice = library.add_preset("robot", instruct="A robot.", language="de", summary="Robot", seed=7, anchor_text="Hallo.")
    assert voice.source is VoiceSource.USER and voice.seed == 7 and voice.anchor_text == "Hallo." and voice.language == "german"
    text = (tmp_path / "presets.toml").read_text()
    assert text.startswith("# my own comment") and "[pirate]" in text and "[robot]" in text
    assert library.rename("robot", "robo 2").name == "robo 2"
    assert library.catalog.find("robot") is None and "robo 2" in (tmp_path / "presets.toml").read_text()
    library.delete("robo 2")
    assert library.catalog.find("robo 2") is None and "# my own comment" in (tmp_path / "presets.toml").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE]


def test_library_refusals(tmp_path: Path) -> None:
    write_voice(tmp_path, "mine")
    library = _library(tmp_path, default="mine")
    for call, code in [
        (lambda: library.delete("mine"), "default-voice"),
        (lambda: library.delete("aria"), "shipped-preset"),
        (lambda: library.delete("ryan"), "builtin-speaker"),
        (lambda: library.rename("mine", "x"), "default-voice"),
        (lambda: library.check_free("Alloy"), "name-taken"),
    ]:
        with pytest.raises(VoiceEditError) as caught:
            call()
        assert caught.value.code == code
    with library.reserve("newcomer"):
        with pytest.raises(VoiceEditError) as caught:
            library.check_free("NEWCOMER")
        assert caught.value.code == "name-busy"
    assert library.check_free("newcomer") == "newcomer"
    # a shipped preset's name is free only to override it
    assert library.check_free("james", replace_shipped=True) == "james"
    (tmp_path / "orphan.flac").write_bytes(b"not audio")
    with pytest.raises(VoiceEditError, match="orphan.flac"):
        library.check_free("orphan")
    broken = tmp_path / "presets.toml"
    broken.write_text("[this is not toml")
    with pytest.raises(VoiceEditError) as caught:
        library.add_preset("x", instruct="A.", language="en", summary="A", seed=1, anchor_text="Hi.")
    assert caught.value.code == "presets-unreadable" and broken.read_text() == "[this is not toml"


def test_anchor_specs_follow_description_language_seed_text_and_model(tmp_path: Path) -> None:
    catalog = VoiceCatalog(None, {ModelKind.VOICE_DESIGN})
    aria = catalog.get("aria")
    spec = preset_spec(aria, "model-a")
    assert spec.text == ANCHOR_TEXTS["english"] and spec.seed == preset_seed(aria.instruct or "", "english")
    assert preset_spec(aria, "model-a").key == spec.key  # stable
    variants = [
        AnchorSpec(spec.instruct + " Slower.", spec.language, spec.seed, spec.text, spec.model),
        AnchorSpec(spec.instruct, "german", spec.seed, spec.text, spec.model),
        AnchorSpec(spec.instruct, spec.language, spec.seed + 1, spec.text, spec.model),
        AnchorSpec(spec.instruct, spec.language, spec.seed, "Other words.", spec.model),
        AnchorSpec(spec.instruct, spec.language, spec.seed, spec.text, "model-b"),
    ]
    assert len({v.key for v in variants} | {spec.key}) == 6
    assert set(ANCHOR_TEXTS) == {"english", "german", "french", "spanish", "italian", "portuguese", "russian", "chinese", "japanese", "korean"}

    store = AnchorStore(tmp_path / "anchors")
    assert store.load(spec) is None
    audio = (0.2 * np.sin(np.arange(24000 * 7) / 10)).astype(np.float32)
    reference = store.save(spec, audio, "aria")
    assert reference.transcript == spec.text and AnchorStore(tmp_path / "anchors").load(spec) is not None
    assert AnchorStore(tmp_path / "anchors").load(spec).digest == reference.digest  # type: ignore[union-attr]
    (tmp_path / "anchors" / f"{spec.key}.json").unlink()  # incomplete: never used
    assert AnchorStore(tmp_path / "anchors").load(spec) is None


def test_model_identity_uses_hub_blob_names_and_content(tmp_path: Path) -> None:
    local = tmp_path / "local"
    (local / "speech_tokenizer").mkdir(parents=True)
    (local / "config.json").write_text("{}")
    (local / "model.safetensors").write_bytes(b"weights-1")
    (local / "speech_tokenizer" / "model.safetensors").write_bytes(b"codec")
    cache = tmp_path / "digests.json"
    first = model_identity(local, cache)
    assert model_identity(local, cache) == first and cache.is_file()
    (local / "model.safetensors").write_bytes(b"weights-2")
    assert model_identity(local, cache) != first
    # a Hugging Face snapshot: weight files are links to blobs named by their SHA-256
    blob = tmp_path / "blobs" / ("ab" * 32)
    blob.parent.mkdir()
    blob.write_bytes(b"anything")
    hub = tmp_path / "snapshot"
    hub.mkdir()
    (hub / "config.json").write_text("{}")
    (hub / "model.safetensors").symlink_to(blob)
    copy = tmp_path / "snapshot2"
    copy.mkdir()
    (copy / "config.json").write_text("{}")
    (copy / "model.safetensors").symlink_to(blob)
    assert model_identity(hub) == model_identity(copy)


def test_names_differing_only_in_case_are_one_voice(tmp_path: Path) -> None:
    """Names are case-insensitive everywhere: a user preset ``James`` overrides the shipped
    ``james`` (keeping its aliases), a clone ``Ryan.wav`` shadows the speaker ``ryan``, and a
    rename onto another voice's name in any case is refused with nothing changed."""
    write_voice(tmp_path, "Ryan")
    library = _library(tmp_path)
    james = library.add_preset(library.check_free("James", replace_shipped=True), instruct="A captain.",
                               language="en", summary="Captain", seed=3, anchor_text="Ahoy.")
    catalog = library.catalog
    spelled = [v.name for v in catalog.voices() if v.name.casefold() in ("james", "ryan")]
    assert sorted(spelled) == ["James", "Ryan"]
    assert catalog.get("james") == james and catalog.get("onyx").name == "James"  # the alias follows
    assert catalog.get("ryan").kind is ModelKind.BASE  # the clone shadows the built-in speaker
    assert library.rename("James", "JAMES").name == "JAMES"  # a change of case only
    library.add_preset("storyteller", instruct="A storyteller.", language="en", summary="Stories", seed=4, anchor_text="Once.")
    before = (tmp_path / "presets.toml").read_text()
    for target in ("ARIA", "jAmEs"):
        with pytest.raises(VoiceEditError) as caught:
            library.rename("storyteller", target)
        assert caught.value.code == "name-taken", target
    assert (tmp_path / "presets.toml").read_text() == before
    assert [v.name for v in catalog.voices() if v.name.casefold() == "aria"] == ["aria"]


def test_renaming_and_deleting_a_clone_take_its_transcript_in_any_case(tmp_path: Path) -> None:
    """``Kim.wav`` with ``kim.txt`` (the catalogue's transcript for it): a rename moves both,
    so the renamed voice keeps its transcript and no lone transcript is left behind; a delete
    removes both."""
    write_voice(tmp_path, "Kim", transcript=None)
    (tmp_path / "kim.txt").write_text("Kim speaking.")
    library = _library(tmp_path)
    renamed = library.rename("Kim", "Lee")
    assert renamed.reference is not None and renamed.reference.transcript == "Kim speaking."
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".wav", ".txt")) == ["Lee.txt", "Lee.wav"]
    library.delete("Lee")
    assert [p.name for p in tmp_path.iterdir() if p.suffix in (".wav", ".txt")] == []


def test_a_service_with_no_voice_refuses_with_the_way_out_then_adopts_the_first_voice(tmp_path: Path) -> None:
    """The clone model alone and an empty folder (the server started so that its studio can
    take the first clip): no default voice, every request refused with ``no-voices`` and
    where the studio is; the first clip that appears becomes the default voice (the studio's
    library then guards it as one) and a later, earlier-sorting clip does not take its place."""
    from wyoming_qwen3tts.common.metrics import Metrics
    from wyoming_qwen3tts.service.errors import NoVoicesError, VoiceNotFoundError
    from wyoming_qwen3tts.service.speech import TtsService
    from wyoming_qwen3tts.service.default_voice import pick_default_voice

    catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    service = TtsService(catalog, {}, None, Metrics(), studio="http://studio.test:8880/")
    library = VoiceLibrary(catalog, lambda: service.default_voice)
    assert service.default_voice is None and library.default_voice is None
    for name in (None, "alloy", "nosuch"):
        with pytest.raises(NoVoicesError) as caught:
            service.resolve_voice(name)
        assert isinstance(caught.value, VoiceNotFoundError) and caught.value.code == "no-voices"
        assert "voice studio (http://studio.test:8880/)" in str(caught.value) and "<id>.wav" in str(caught.value)
    assert "presets need the VoiceDesign model" in str(service.no_voices("alloy", str(_unknown(catalog, "alloy"))))
    write_voice(tmp_path, "mine")
    assert service.resolve_voice(None).name == "mine" and service.default_voice == "mine"
    with pytest.raises(VoiceEditError) as refused:
        library.delete("mine")
    assert refused.value.code == "default-voice"
    write_voice(tmp_path, "able")
    catalog.refresh()
    assert service.default_voice == "mine" and service.resolve_voice(None).name == "mine"
    with pytest.raises(VoiceNotFoundError) as unknown:  # voices exist now: an unknown name is only that
        service.resolve_voice("nosuch")
    assert unknown.value.code == "unknown-voice"
    assert pick_default_voice([]) is None and pick_default_voice(["zed", "aria"]) == "aria"
    assert pick_default_voice(["zed", "Bea"]) == "Bea"


def _unknown(catalog: VoiceCatalog, name: str) -> UnknownVoiceError:
    with pytest.raises(UnknownVoiceError) as caught:
        catalog.get(name)
    return caught.value


#: ``Renée`` and ``José`` spelled composed (NFC: what the studio writes, what clients type)
#: and decomposed (NFD: what macOS writes over Samba).
RENEE, RENEE_NFD = "Ren\u00e9e", "Rene\u0301e"
JOSE, JOSE_NFD = "Jos\u00e9", "Jose\u0301"


def test_a_clip_name_with_spaces_around_it_is_the_voice_name_without_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``"trail .wav"`` and ``" spaced .wav"`` are the voices ``trail`` and ``spaced``: listed
    so, found by that name and by the spelling with spaces (a request's name is stripped),
    read with a transcript spelled either way, and ``spaced`` (first by name) is the default
    voice of a clone-only service. ``"zed .wav"`` beside ``zed.wav`` is one voice by the
    duplicate rule, the other named in a WARNING: ``zed.wav``, whose name is the voice name
    as spoken (the stray copy ``"zed .wav"`` was spoken, as " " sorts before "."); ``" .wav"``,
    a blank name, is skipped with a WARNING."""
    from wyoming_qwen3tts.common.metrics import Metrics
    from wyoming_qwen3tts.service.speech import TtsService

    write_voice(tmp_path, "trail ", transcript="Trail speaking.")
    write_voice(tmp_path, " spaced ", transcript=None)
    (tmp_path / "spaced.txt").write_text("Spaced speaking.")
    write_voice(tmp_path, "zed ", freq=300.0, transcript=None)
    write_voice(tmp_path, "zed", freq=400.0, transcript=None)
    write_voice(tmp_path, " ", transcript=None)
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
        assert sorted(v.name for v in catalog.voices()) == ["spaced", "trail", "zed"]
        for asked, name in [("trail", "trail"), ("trail ", "trail"), (" Spaced ", "spaced"), ("spaced", "spaced"),
                            ("ZED", "zed")]:
            assert catalog.get(asked).name == name, asked
        trail, spaced = catalog.get("trail").reference, catalog.get("spaced").reference
        assert trail is not None and trail.transcript == "Trail speaking."
        assert spaced is not None and spaced.transcript == "Spaced speaking."
        zed = catalog.get("zed").reference
        assert zed is not None and zed.digest == load_reference(tmp_path / "zed.wav").digest
        warned = taken_logs(caplog, logging.WARNING, "")
        same = [m for m in warned if "same voice name" in m]
        assert len(same) == 1 and ("using 'zed.wav', ignoring 'zed .wav' (its file name is the voice name exactly, "
                                   "without spaces around it)") in same[0], warned
        assert [(c.file, c.reason) for c in catalog.skipped()] == [
            (" .wav", "its name is blank; rename the file"),
            ("zed .wav", "zed.wav gives the same voice name and is used instead (its file name is the voice name "
                         "exactly, without spaces around it); rename or remove this file"),
        ]
        assert "Skipping clone voice ' .wav': its name is blank; rename the file" in warned, warned
    service = TtsService(catalog, {}, None, Metrics())
    assert service.default_voice == "spaced" and service.resolve_voice(None).name == "spaced"


def test_voice_names_are_compared_in_unicode_nfc(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A clip written with decomposed accents (NFD ``Renée.wav``, as macOS writes over Samba)
    is the voice ``Renée`` in NFC, found by either spelling in any case, with its transcript
    spelled either way; NFD and NFC ``José.wav`` side by side are one voice by the duplicate
    rule (the one spelled as the voice name, NFC, the other named in a WARNING)."""
    write_voice(tmp_path, RENEE_NFD, transcript=None)
    (tmp_path / f"{RENEE}.txt").write_text("Renée speaking.")
    write_voice(tmp_path, JOSE, freq=300.0, transcript=None)
    write_voice(tmp_path, JOSE_NFD, freq=400.0, transcript=None)
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
        assert sorted(v.name for v in catalog.voices()) == [JOSE, RENEE]
        for asked, name in [(RENEE, RENEE), (RENEE_NFD, RENEE), ("REN\u00c9E", RENEE), (JOSE_NFD, JOSE), (JOSE, JOSE)]:
            assert catalog.get(asked).name == name, ascii(asked)
        renee = catalog.get(RENEE).reference
        assert renee is not None and renee.transcript == "Renée speaking."
        jose = catalog.get(JOSE).reference  # NFC, though NFD sorts first ("e" before "é")
        assert jose is not None and jose.digest == load_reference(tmp_path / f"{JOSE}.wav").digest
        same = taken_logs(caplog, logging.WARNING, "same voice name")
        assert len(same) == 1 and f"using {JOSE + '.wav'!r}, ignoring {JOSE_NFD + '.wav'!r}" in same[0], same


def test_the_studio_renames_and_deletes_a_voice_whose_file_name_is_spelled_otherwise(tmp_path: Path) -> None:
    """The studio finds the files of ``trail`` in ``"trail .wav"`` / ``"trail .txt"`` and of
    ``Renée`` in an NFD ``Renée.wav`` with an NFD transcript: a rename moves both files to the
    new name, a delete removes both, and a new voice ``Renée`` in NFC is refused while the NFD
    one is there (no two voices that look alike)."""
    write_voice(tmp_path, "trail ", transcript="Trail speaking.")
    write_voice(tmp_path, RENEE_NFD, transcript="Renée speaking.")
    write_voice(tmp_path, " spaced ", transcript=None)
    library = _library(tmp_path)
    with pytest.raises(VoiceEditError) as caught:
        library.check_free(RENEE)
    assert caught.value.code == "name-taken"
    renamed = library.rename("trail ", "Path")  # as a URL spells the listed name, or with its space
    assert renamed.name == "Path" and renamed.reference is not None and renamed.reference.transcript == "Trail speaking."
    assert library.delete(RENEE).name == RENEE  # asked in NFC
    assert library.delete("spaced").name == "spaced"
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".wav", ".txt")) == ["Path.txt", "Path.wav"]
    assert library.catalog.find(RENEE) is None and library.catalog.find("trail") is None


def test_a_clip_the_catalogue_cannot_read_still_holds_its_name_in_any_spelling(tmp_path: Path) -> None:
    """An unreadable clip (not audio) is no voice, but its file is there: a new voice of its
    name is refused as taken whether the file is spelled in NFD, with a space, or in
    another case, and the refused upload removes nothing of the user's."""
    for stem in (RENEE_NFD, "kim ", "ZED"):
        (tmp_path / f"{stem}.wav").write_bytes(b"not audio at all")
    library = _library(tmp_path)
    for name in (RENEE, "kim", "zed"):
        assert library.catalog.find(name) is None
        with pytest.raises(VoiceEditError) as caught:
            library.check_free(name)
        assert caught.value.code == "name-taken", name
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".wav") == sorted(
        f"{stem}.wav" for stem in (RENEE_NFD, "kim ", "ZED")
    )


# --- the default voice: explicit (--voice) or automatic ----------------------------------------


def test_an_automatic_default_is_picked_again_when_its_voice_goes_an_explicit_one_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An automatic default (no --voice) names a voice of the catalogue at each read: its clip
    removed, the next by ``pick_default_voice`` (logged once), None when no voice is left; the
    studio may delete it. An explicit default stays as given and the studio keeps it."""
    from wyoming_qwen3tts.engine import Engine
    from wyoming_qwen3tts.common.metrics import Metrics
    from wyoming_qwen3tts.service.errors import NoVoicesError, VoiceNotFoundError
    from wyoming_qwen3tts.service.speech import TtsService

    from .stub_service import StubEngine

    def service(folder: Path, default: str | None, explicit: bool) -> TtsService:
        engines: dict[ModelKind, Engine] = {ModelKind.BASE: StubEngine(ModelKind.BASE, frames=2)}
        return TtsService(VoiceCatalog(folder, set(engines)), engines, default, Metrics(), default_explicit=explicit)

    auto_dir, pinned_dir = tmp_path / "auto", tmp_path / "pinned"
    for folder in (auto_dir, pinned_dir):
        folder.mkdir()
        for name in ("bea", "cal", "dee"):
            write_voice(folder, name)
    auto, pinned = service(auto_dir, "bea", False), service(pinned_dir, "bea", True)
    try:
        with caplog.at_level(logging.INFO, logger="wyoming_qwen3tts"):
            assert auto.default_voice == "bea" and auto.pinned_default is None
            for path in auto_dir.glob("bea.*"):
                path.unlink()
            auto.catalog.refresh()
            assert auto.default_voice == "cal" and auto.default_voice == "cal"
            assert auto.resolve_voice(None).name == "cal"
            assert taken_logs(caplog, logging.INFO, "Default voice") == ["Default voice: cal, as bea is gone (--voice chooses one to keep)"]
            library = VoiceLibrary(auto.catalog, lambda: auto.pinned_default)
            assert library.delete("cal").name == "cal"  # an automatic default may go
            assert auto.default_voice == "dee"
            library.rename("dee", "eve")
            assert auto.default_voice == "eve"
            library.delete("eve")
            assert auto.default_voice is None
            with pytest.raises(NoVoicesError):  # no voice left: the no-voices refusal, not unknown-voice
                auto.resolve_voice(None)
            assert len(taken_logs(caplog, logging.INFO, "Default voice")) == 3

            assert pinned.default_voice == "bea" and pinned.pinned_default == "bea"
            pinned_library = VoiceLibrary(pinned.catalog, lambda: pinned.pinned_default)
            for edit in (lambda: pinned_library.delete("bea"), lambda: pinned_library.rename("bea", "bee")):
                with pytest.raises(VoiceEditError) as refused:
                    edit()
                assert (refused.value.status, refused.value.code) == (409, "default-voice")
            assert pinned_library.delete("cal").name == "cal"  # any other voice may go
            for path in pinned_dir.glob("bea.*"):  # removed by hand: --voice still names it
                path.unlink()
            pinned.catalog.refresh()
            assert pinned.default_voice == "bea"
            with pytest.raises(VoiceNotFoundError) as unknown:
                pinned.resolve_voice(None)
            # Not "Unknown voice 'bea'": the request named none; the server's --voice default is gone.
            assert not isinstance(unknown.value, NoVoicesError) and unknown.value.code == "default-voice-gone"
            assert "default voice 'bea' (--voice)" in str(unknown.value) and "Unknown voice" not in str(unknown.value)
            assert taken_logs(caplog, logging.INFO, "Default voice") == []
    finally:
        auto.stop(5)
        pinned.stop(5)


@pytest.mark.parametrize("name", ["bob", "b" * MAX_NAME_CHARS])  # the studio's longest name
def test_a_gone_default_voice_is_refused_in_a_short_message_and_logged_in_full_naming_the_voice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """The --voice default's clip removed by hand: a request naming no voice was refused in
    about 600 characters (why, both fixes, the voices still served), too long for Home
    Assistant's pipeline error. Now the refusal is under 200 characters, naming the voice,
    what is wrong and what to do, and the detail is in the server log's WARNING. A clip put
    back but unusable (too short): the refusal says it is skipped. The WARNING when the
    default goes and the one when it is served again both name it as "(--voice <name>)"
    (the second said "(--voice)")."""
    from wyoming_qwen3tts.engine import Engine
    from wyoming_qwen3tts.common.metrics import Metrics
    from wyoming_qwen3tts.service.errors import DefaultVoiceGoneError
    from wyoming_qwen3tts.service.speech import TtsService

    from .stub_service import StubEngine

    for voice in (name, "kim"):
        write_voice(tmp_path, voice)
    engines: dict[ModelKind, Engine] = {ModelKind.BASE: StubEngine(ModelKind.BASE, frames=2)}
    service = TtsService(VoiceCatalog(tmp_path, set(engines)), engines, name, Metrics(), default_explicit=True,
                         studio="http://127.0.0.1:1/")
    try:
        with caplog.at_level(logging.INFO, logger="wyoming_qwen3tts"):
            assert service.resolve_voice(None).name == name
            (tmp_path / f"{name}.wav").unlink()
            service.catalog.refresh()
            with pytest.raises(DefaultVoiceGoneError) as gone:
                service.resolve_voice(None)
            message = str(gone.value)
            assert len(message) < 200, (len(message), message)
            assert message == (f"The default voice {name!r} (--voice) is no longer in the voices folder. Put it back, "
                               "or choose another default voice"), message
            warned = taken_logs(caplog, logging.WARNING, "is no longer served")
            assert len(warned) == 1 and f"The default voice {name} (--voice {name}) is no longer served" in warned[0]
            assert f"put its clip back ({name}.wav" in warned[0] and "available: kim" in warned[0], warned

            (tmp_path / f"{name}.wav").write_bytes(_tone_wav(0.5))  # back, but too short: skipped
            service.catalog.refresh()
            with pytest.raises(DefaultVoiceGoneError) as skipped:
                service.resolve_voice(None)
            message = str(skipped.value)
            assert len(message) < 200 and f"{name!r} (--voice) cannot be used: its clip is skipped" in message, message
            assert taken_logs(caplog, logging.WARNING, f"{name}.wav: the clip is 0.50 s long")  # the detail: logged

            write_voice(tmp_path, name)  # a good clip: served again, said once
            service.catalog.refresh()
            assert service.resolve_voice(None).name == name
            back = taken_logs(caplog, logging.WARNING, "is served again")
            assert back == [f"The default voice {name} (--voice {name}) is served again: requests that name no "
                            "voice are spoken with it"], back
    finally:
        service.stop(5)


# --- an unreadable presets.toml ----------------------------------------------------------------


ARIA_OVERRIDE = '[aria]\nlanguage = "en"\ninstruct = "A bright, quick voice."\nsummary = "Bright"\n'


def test_while_presets_toml_is_unreadable_a_shipped_name_is_presets_unreadable_not_shipped_preset(tmp_path: Path) -> None:
    """The user's override of the shipped ``aria`` is not served while presets.toml cannot be
    parsed, so ``aria`` is the shipped preset: a delete or rename meant for the override was
    refused as ``shipped-preset`` (403); the real cause is ``presets-unreadable`` (409)."""
    presets = tmp_path / "presets.toml"
    presets.write_text(ARIA_OVERRIDE + "[broken\n")
    library = VoiceLibrary(VoiceCatalog(tmp_path, {ModelKind.BASE, ModelKind.VOICE_DESIGN}), None)
    for edit in (lambda: library.delete("aria"), lambda: library.rename("aria", "aria2")):
        with pytest.raises(VoiceEditError) as refused:
            edit()
        assert (refused.value.status, refused.value.code) == (409, "presets-unreadable"), refused.value
        assert str(presets) in str(refused.value)
    presets.write_text(ARIA_OVERRIDE)  # fixed: the override goes, the shipped preset stays
    assert library.delete("aria").source is VoiceSource.USER
    with pytest.raises(VoiceEditError) as refused:
        library.delete("aria")
    assert (refused.value.status, refused.value.code) == (403, "shipped-preset")


def test_an_unreadable_presets_file_is_logged_once_per_state_and_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every re-read of a broken presets.toml (each studio edit forces one) logged the same
    ERROR again: now once per (file state, error), and again when it changes, or when it is
    fixed and broken again."""
    presets = tmp_path / "presets.toml"
    presets.write_text(ARIA_OVERRIDE + "[broken\n")
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, {ModelKind.VOICE_DESIGN})
        assert len(taken_logs(caplog, logging.ERROR, "Skipping presets file")) == 1
        for _ in range(3):
            catalog.refresh(force=True)
            catalog.refresh()
        assert taken_logs(caplog, logging.ERROR, "Skipping presets file") == []
        presets.write_text(ARIA_OVERRIDE + "[still broken\n")  # another state, another error
        catalog.refresh()
        assert len(taken_logs(caplog, logging.ERROR, "Skipping presets file")) == 1
        catalog.refresh(force=True)
        assert taken_logs(caplog, logging.ERROR, "Skipping presets file") == []
        presets.write_text(ARIA_OVERRIDE)  # fixed
        catalog.refresh()
        assert taken_logs(caplog, logging.ERROR, "Skipping") == [] and catalog.get("aria").source is VoiceSource.USER
        presets.write_text(ARIA_OVERRIDE + "[broken\n")  # broken again, as the first time
        catalog.refresh()
        assert len(taken_logs(caplog, logging.ERROR, "Skipping presets file")) == 1
        catalog.refresh(force=True)
        assert taken_logs(caplog, logging.ERROR, "Skipping presets file") == []


def test_a_transcript_saved_by_windows_notepad_is_read_or_its_skip_names_the_transcript(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The new-user trial: a transcript saved as UTF-16 (Notepad's "Unicode", with a byte-order
    mark) or Windows-1252 ("ANSI", ``Caf\\xe9``) skipped its voice at ERROR with "'utf-8'
    codec can't decode byte 0xe9", a reason the studio's Skipped list showed under the clip.
    Now UTF-8 with or without a byte-order mark and UTF-16 with one are read; any other
    bytes skip the voice at WARNING with a reason that names the transcript and says to save
    it as UTF-8 (in the log, the studio's ``skipped``, a request's refusal). The refusals
    around that reason blamed the clip ("a clone whose clip could not be used ...; replace
    the file"; "Upload a good clip ... to replace it"): now they name the transcript."""
    text = "Café au lait, s'il vous plaît."
    write_voice(tmp_path, "u16", transcript=None)
    (tmp_path / "u16.txt").write_bytes(text.encode("utf-16"))  # with its byte-order mark, as Notepad writes
    write_voice(tmp_path, "u16be", transcript=None)
    (tmp_path / "u16be.txt").write_bytes(b"\xfe\xff" + text.encode("utf-16-be"))
    write_voice(tmp_path, "bom", transcript=None)
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    write_voice(tmp_path, "lat", transcript=None)
    (tmp_path / "lat.txt").write_bytes(text.encode("cp1252"))
    write_voice(tmp_path, "cut", transcript=None)
    (tmp_path / "cut.txt").write_bytes(text.encode("utf-16")[:-1])  # an odd number of bytes
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, ALL)
    for name in ("u16", "u16be", "bom"):
        reference = catalog.get(name).reference
        assert reference is not None and reference.transcript == text, name
    assert catalog.find("lat") is None and catalog.find("cut") is None
    lat = "its transcript lat.txt is not UTF-8 text, it was saved in another encoding; save it as UTF-8"
    cut = "its transcript cut.txt starts as UTF-16 text but is cut short or broken; save it as UTF-8"
    assert {clip.file: clip.reason for clip in catalog.skipped()} == {"cut.wav": cut, "lat.wav": lat}
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [
        (logging.WARNING, f"Skipping clone voice {tmp_path / 'cut.wav'}: {cut}"),
        (logging.WARNING, f"Skipping clone voice {tmp_path / 'lat.wav'}: {lat}"),
    ], said
    with pytest.raises(UnknownVoiceError) as asked:
        catalog.get("lat")
    assert str(asked.value).startswith(f"Voice 'lat' is a clone whose transcript could not be used (lat.wav: {lat}); "
                                       "available: "), asked.value
    assert [clip.transcript for clip in catalog.skipped()] == ["cut.txt", "lat.txt"]
    with pytest.raises(VoiceEditError) as refused:  # a preset or rename onto the name
        VoiceLibrary(catalog, None).check_free("lat")
    assert refused.value.code == "name-taken" and (
        f"it is skipped ({lat}). Save its transcript lat.txt again as UTF-8 to make it a voice, upload a clip named "
        "'lat' under 'Clone a voice' to replace both, or delete it first") in str(refused.value), refused.value
    (tmp_path / "lat.txt").write_text(text, encoding="utf-8")  # saved again as UTF-8: a voice at once
    catalog.refresh()
    reference = catalog.get("lat").reference
    assert reference is not None and reference.transcript == text


#: How ``_write_with_pyav`` writes a clip of each suffix of ``AUDIO_SUFFIXES``: (PyAV's
#: container format, codec, sample rate in Hz, codec options), as the apps that save each
#: one would (an M4A of AAC as a phone's voice recorder saves, an AMR voice memo at 8 kHz...).
_PYAV_WRITERS: dict[str, tuple[str, str, int, dict[str, int]]] = {
    ".wav": ("wav", "pcm_s16le", 24000, {}),
    ".flac": ("flac", "flac", 24000, {}),
    ".aiff": ("aiff", "pcm_s16be", 44100, {}),
    ".aif": ("aiff", "pcm_s16be", 22050, {}),
    ".aifc": ("aiff", "pcm_s16be", 24000, {}),
    ".caf": ("caf", "alac", 24000, {}),
    ".w64": ("w64", "pcm_s16le", 24000, {}),
    ".wv": ("wv", "wavpack", 24000, {}),
    ".tta": ("tta", "tta", 24000, {}),
    ".au": ("au", "pcm_s16be", 24000, {}),
    ".mp3": ("mp3", "mp3", 24000, {}),
    ".ogg": ("ogg", "libopus", 48000, {}),
    ".oga": ("ogg", "libopus", 48000, {}),
    ".opus": ("opus", "libopus", 48000, {}),
    ".m4a": ("ipod", "aac", 24000, {}),
    ".m4b": ("ipod", "aac", 24000, {}),
    ".mp4": ("mp4", "aac", 24000, {}),
    ".aac": ("adts", "aac", 24000, {}),
    ".wma": ("asf", "wmav2", 44100, {"bit_rate": 64000}),
    ".webm": ("webm", "libopus", 48000, {}),
    ".mka": ("matroska", "libopus", 48000, {}),
    ".3gp": ("3gp", "aac", 24000, {}),
    ".amr": ("amr", "libopencore_amrnb", 8000, {}),
    ".mp2": ("mp2", "mp2", 24000, {}),
    ".ac3": ("ac3", "ac3", 48000, {}),
}


def _write_with_pyav(path: Path, seconds: float, freq: float = 200.0) -> None:
    """A ``seconds`` long tone of level 0.3 in the format of ``path``'s suffix
    (``_PYAV_WRITERS``), written by PyAV."""
    import av

    container_format, codec, rate, options = _PYAV_WRITERS[path.suffix.lower()]
    t = np.arange(int(seconds * rate)) / rate
    frame = av.AudioFrame.from_ndarray((0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32).reshape(1, -1),
                                       format="flt", layout="mono")
    frame.sample_rate = rate
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        for option, value in options.items():
            setattr(stream, option, value)
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=rate)
        for piece in [*resampler.resample(frame), None]:
            for packet in stream.encode(piece):
                container.mux(packet)


def test_clips_in_the_formats_the_studio_takes_are_voices_when_copied_into_the_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The new-user trial: ``grandma.mp3`` and ``grandma.txt`` copied into the voices folder
    logged "Transcript grandma.txt has no clip beside it", and ``grandpa.ogg`` nothing at all,
    though the studio takes MP3 and Ogg uploads. The folder now reads the formats the
    studio's form offers (FFmpeg, as uploads are decoded): each is a voice, with its
    transcript; the start-up check knows them; a broken one is skipped naming the file; the
    studio deletes such a voice's files."""
    from wyoming_qwen3tts.startup import check_default_voice, survey_clips

    t = np.arange(2 * 24000) / 24000
    tone = (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    sf.write(tmp_path / "grandma.mp3", tone, 24000, format="MP3")
    (tmp_path / "grandma.txt").write_text("Hello, it is Grandma.")
    sf.write(tmp_path / "grandpa.ogg", tone, 24000, format="OGG", subtype="VORBIS")
    sf.write(tmp_path / "Uncle.OPUS", tone, 24000, format="OGG", subtype="OPUS")
    _write_with_pyav(tmp_path / "aunt.m4a", 2.0)
    (tmp_path / "broken.mp3").write_bytes(b"ID3 not really an mp3" * 10)
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    clones = {v.name: v.reference for v in catalog.voices()}
    assert set(clones) == {"grandma", "grandpa", "Uncle", "aunt"}, clones
    for name, reference in clones.items():
        assert reference is not None and abs(len(reference.audio) / reference.sample_rate - 2.0) < 0.1, name
        assert float(np.abs(reference.audio).max()) > 0.2, name
    assert clones["grandma"] is not None and clones["grandma"].transcript == "Hello, it is Grandma."
    # A file FFmpeg cannot read was an ERROR with its raw error ("[Errno 1094995529] Invalid
    # data found when processing input: '<path>'"), in the listing and refusals too: now a
    # WARNING in plain words, the decoder's short message kept, as every other skip.
    unread = "the file is not audio FFmpeg can read: Invalid data found when processing input"
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [(logging.WARNING, f"Skipping clone voice {tmp_path / 'broken.mp3'}: {unread}")], said
    assert catalog.skipped() == [SkippedClip("broken", "broken.mp3", unread)]
    with pytest.raises(UnknownVoiceError, match=rf"'broken' is a clone whose clip could not be used \(broken.mp3: "
                                                rf"{unread}\); replace the file"):
        catalog.get("broken")
    check_default_voice("grandpa", tmp_path, {ModelKind.BASE})
    assert survey_clips(tmp_path) == (True, [f"broken.mp3 ({unread})"])
    library = VoiceLibrary(catalog, None)
    library.delete("grandma")
    assert not (tmp_path / "grandma.mp3").exists() and not (tmp_path / "grandma.txt").exists()


def test_every_audio_format_the_folder_reads_is_a_voice_and_audio_it_does_not_read_is_skipped_with_a_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An AIFF, CAF, WMA, M4B or MP4 clip copied into the voices folder was ignored without a
    word, though FFmpeg reads each (a clip of each is written here by PyAV). Now every
    suffix of ``AUDIO_SUFFIXES`` is a voice, and a file that looks like audio but is in a
    format the folder does not read (a MIDI file, an Audacity project) is skipped with a
    WARNING once and listed in ``skipped``, its reason naming the formats it reads; a request
    for its name says why. Other files (a picture) stay unmentioned."""
    for suffix in _PYAV_WRITERS:
        _write_with_pyav(tmp_path / f"clip{suffix.replace('.', '_')}{suffix.upper()}", 1.5)
    (tmp_path / "song.mid").write_bytes(b"MThd\0\0\0\6\0\0\0\1\0\x60")
    (tmp_path / "Take.AUP3").write_bytes(b"SQLite format 3\0")
    (tmp_path / "cover.jpg").write_bytes(b"\xff\xd8\xff\xe0 not audio")
    catalog, said = scanned_once(tmp_path, caplog)
    clones = {v.name: v.reference for v in catalog.voices()}
    assert sorted(clones) == sorted(f"clip{s.replace('.', '_')}" for s in _PYAV_WRITERS), sorted(clones)
    assert set(_PYAV_WRITERS) == set(AUDIO_SUFFIXES)  # a new suffix needs a clip here
    for name, reference in clones.items():
        assert reference is not None and abs(len(reference.audio) / reference.sample_rate - 1.5) < 0.1, name
        assert float(np.abs(reference.audio).max()) > 0.2, name
    formats = ".flac, .mp3, .m4a, .ogg, ..."
    mid = f"the voices folder does not read .mid files; save the clip as song.wav (or {formats})"
    aup = f"the voices folder does not read .aup3 files; save the clip as Take.wav (or {formats})"
    skipped = [SkippedClip("Take", "Take.AUP3", aup), SkippedClip("song", "song.mid", mid)]
    assert said == skip_warnings(tmp_path, skipped) and catalog.skipped() == skipped, said
    with pytest.raises(UnknownVoiceError, match=r"'song' is a clone whose clip could not be used \(song.mid: the "
                                                r"voices folder does not read .mid files"):
        catalog.get("song")
    # The studio deletes such a file like any skipped clip, and its name is free again.
    library = VoiceLibrary(catalog, None)
    assert library.delete("song") == DeletedSkipped("song", "song.mid", mid, files=("song.mid",))
    assert not (tmp_path / "song.mid").exists() and library.check_free("song") == "song"


def test_of_two_clips_of_one_voice_name_the_better_source_is_spoken_and_the_other_is_listed_and_deletable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``kim.mp3`` and ``kim.wav``: the first in file-name order was spoken, the lossy MP3.
    Now one rule (``clip_preference``) picks the clip of a voice name, whether the names
    differ in suffix or in case (``LEE.mp3`` and ``lee.flac``): the format first, lossless
    before lossy, then the name. The log says once which file is ignored and why; the
    ignored file is in ``skipped`` with that reason; deleting the skipped files of the name
    (the studio's ``?skipped=true``) removes only it, never the clip spoken or its
    transcript; without ``?skipped`` the voice goes with every file of its name."""
    t = np.arange(int(1.5 * 24000)) / 24000
    sf.write(tmp_path / "kim.mp3", 0.5 * np.sin(2 * np.pi * 300 * t), 24000, format="MP3")
    sf.write(tmp_path / "kim.wav", 0.2 * np.sin(2 * np.pi * 200 * t), 24000)
    (tmp_path / "kim.txt").write_text("Kim speaking.")
    sf.write(tmp_path / "LEE.mp3", 0.5 * np.sin(2 * np.pi * 300 * t), 24000, format="MP3")
    sf.write(tmp_path / "lee.flac", 0.2 * np.sin(2 * np.pi * 200 * t), 24000, format="FLAC")
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        caplog.clear()
        catalog.refresh(force=True)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # once
    for name in ("kim", "LEE"):  # the lossless clip: a peak of 0.2, not the MP3's 0.5
        reference = catalog.get(name).reference
        assert reference is not None and float(np.abs(reference.audio).max()) < 0.25, name
    assert catalog.get("kim").name == "kim" and catalog.get("lee").name == "lee"
    assert catalog.get("kim").reference.transcript == "Kim speaking."  # type: ignore[union-attr]
    assert said == [
        "Clone voice files 'lee.flac' and 'LEE.mp3' have the same voice name (names are case-insensitive; spaces "
        "around a name and how its accents are encoded do not count): using 'lee.flac', ignoring 'LEE.mp3' "
        "(lossless .flac is preferred to lossy .mp3); rename or remove one",
        "Clone voice files 'kim.wav' and 'kim.mp3' have the same voice name: using 'kim.wav', ignoring 'kim.mp3' "
        "(lossless .wav is preferred to lossy .mp3); rename or remove one",
    ], said
    assert catalog.skipped() == [
        SkippedClip("LEE", "LEE.mp3", "lee.flac gives the same voice name and is used instead (lossless .flac is "
                                      "preferred to lossy .mp3); rename or remove this file"),
        SkippedClip("kim", "kim.mp3", "kim.wav gives the same voice name and is used instead (lossless .wav is "
                                      "preferred to lossy .mp3); rename or remove this file"),
    ]
    library = VoiceLibrary(catalog, None)
    assert library.delete("KIM", skipped=True).file == "kim.mp3"
    assert sorted(p.name for p in tmp_path.iterdir() if p.stem == "kim") == ["kim.txt", "kim.wav"]
    assert catalog.get("kim").reference.transcript == "Kim speaking."  # type: ignore[union-attr]
    assert [clip.file for clip in catalog.skipped()] == ["LEE.mp3"]
    with pytest.raises(VoiceEditError) as caught:
        library.delete("kim", skipped=True)
    assert caught.value.code == "unknown-voice"
    assert library.delete("lee").name == "lee"  # the voice, and every clip of its name
    assert not [p for p in tmp_path.iterdir() if p.stem.casefold() == "lee"] and catalog.skipped() == []


def test_a_clip_skipped_for_the_control_characters_in_its_name_is_listed_and_deleted_with_its_transcript(
    tmp_path: Path,
) -> None:
    """A clip whose name holds a newline was only logged: the studio's Skipped files did not
    show it, and nothing could delete it from the page. Now it is listed, and deleting the
    skipped files of its name removes it and its transcript, and nothing else."""
    write_voice(tmp_path, "new\nline", transcript="Two lines.")
    write_voice(tmp_path, "new line", transcript="One line.")
    catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    reason = "its name holds control characters; rename the file"
    assert catalog.skipped() == [SkippedClip("new\nline", "new\nline.wav", reason)]
    assert [v.name for v in catalog.voices()] == ["new line"]
    assert VoiceLibrary(catalog, None).delete("new\nline", skipped=True).file == "new\nline.wav"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["new line.txt", "new line.wav"]
    assert catalog.skipped() == [] and catalog.get("new line").reference.transcript == "One line."  # type: ignore[union-attr]


def test_a_transcript_far_longer_than_its_clip_could_hold_is_warned_of_once_and_still_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 900-character transcript beside a 2 s clip (a script pasted in) was taken without a
    word. A transcript is what its clip says: now one over
    ``MAX_TRANSCRIPT_CHARS_PER_SECOND`` characters a second of the clip the voice uses is
    warned of once per file (the voice is still served with it: the user decides); fast
    real speech (20 characters a second of English; the fastest talkers on record reach
    57) is far from it, and so is a transcript whose clip the voice cuts at 20 s. (Over
    ``MAX_TRANSCRIPT_CHARS`` the clip is skipped instead: the next test.)"""
    assert MAX_TRANSCRIPT_CHARS_PER_SECOND > 57
    (tmp_path / "script.wav").write_bytes(_tone_wav(2.0))
    (tmp_path / "script.txt").write_text("All the world's a stage. " * 36)
    (tmp_path / "fast.wav").write_bytes(_tone_wav(2.0))
    (tmp_path / "fast.txt").write_text("Quick brown fox, lazy dog! " * 4 + "\n" * 50)  # 107 characters: 54 a second
    (tmp_path / "long.wav").write_bytes(_tone_wav(30.0))  # the voice uses 20 s of it
    (tmp_path / "long.txt").write_text("Twenty characters... " * 45)  # 30 s at 31 a second
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        caplog.clear()
        write_voice(tmp_path, "other")
        catalog.refresh()
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        (tmp_path / "script.txt").write_text("To be or not to be. " * 40)  # edited, still too long
        catalog.refresh()
        again = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        f"Clone voice {tmp_path / 'script.wav'}: its transcript script.txt is 899 characters long, more than "
        "2.0 s of speech could hold (at most 160: 80 characters a second, where fast speech is 15 to 20); a transcript "
        "should be what the clip says, word for word: cut it to that, or remove it to clone from the sound of the "
        "voice alone (it is used all the same)"
    ], warned
    assert len(again) == 1 and "script.txt is 799 characters long" in again[0], again
    assert {v.name for v in catalog.voices()} == {"script", "fast", "long", "other"} and catalog.skipped() == []
    assert catalog.get("script").reference.transcript.startswith("To be")  # type: ignore[union-attr]
    cut = overlong_transcript_reason("long.txt", "word " * 400, 20.0)  # a clip cut to the 20 s used: said so
    assert cut is not None and "more than 20.0 s of speech (the first 20 s of the clip, all a voice uses) could" in cut


def test_a_transcript_over_the_studios_limit_skips_its_clip_as_other_transcript_faults_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A clone whose transcript was 2,000,001 bytes (or 5,001 characters) was only warned of
    and served: every request prefilled the whole text (3.2 s to first audio at 25,001; minutes,
    deaf to cancellation and holding every other clone voice, at two million). The studio's
    upload refuses a transcript over ``MAX_TRANSCRIPT_CHARS``; now the folder scan skips such a
    clip with the same limit (one constant), as a transcript not saved as UTF-8 is skipped: in
    ``skipped`` with a reason naming the file and the limit, refused on request with it, logged
    once at WARNING. A file far over it is refused by its size, never read whole. At the limit
    (white space runs counted as one, as the upload counts) the voice is served."""
    assert MAX_TRANSCRIPT_CHARS == library.MAX_TRANSCRIPT_CHARS == 1000
    (tmp_path / "huh.wav").write_bytes(_tone_wav(2.0))
    (tmp_path / "huh.txt").write_bytes(b"a" * 2_000_001)
    (tmp_path / "long.wav").write_bytes(_tone_wav(2.0))
    (tmp_path / "long.txt").write_text("a" * 5_001)
    (tmp_path / "full.wav").write_bytes(_tone_wav(20.0))
    (tmp_path / "full.txt").write_text("Say it. " * 125 + "\n\n  \n" * 100)  # 999 characters and white space
    catalog, warned = scanned_once(tmp_path, caplog)
    fix = ("characters a transcript may hold; cut it to what the clip says, word for word, or remove it to clone from "
           "the sound of the voice alone")
    huh = f"its transcript huh.txt is 2,000,001 bytes long, over the 1,000 {fix}"
    long = f"its transcript long.txt is 5,001 characters long, over the 1,000 {fix}"
    too_long = TranscriptFault.TOO_LONG
    skipped = [SkippedClip("huh", "huh.wav", huh, "huh.txt", fault=too_long),
               SkippedClip("long", "long.wav", long, "long.txt", fault=too_long)]
    assert warned == skip_warnings(tmp_path, skipped) and catalog.skipped() == skipped, warned
    assert [v.name for v in catalog.voices()] == ["full"]
    assert catalog.get("full").reference.transcript.startswith("Say it.")  # type: ignore[union-attr]
    with pytest.raises(UnknownVoiceError) as asked:
        catalog.get("huh")
    assert str(asked.value).startswith(f"Voice 'huh' is a clone whose transcript could not be used (huh.wav: {huh}); "
                                       "available: full"), asked.value
    with pytest.raises(VoiceEditError) as refused:  # a preset or rename onto the name: what to do with it
        VoiceLibrary(catalog, None).check_free("long")
    assert "Save its transcript long.txt with only what the clip says to make it a voice" in str(refused.value)
    # The advice of every message that names the transcript (the studio's, the default voice's).
    assert [clip.transcript_fix for clip in catalog.skipped()] == ["with only what the clip says"] * 2
    (tmp_path / "long.txt").write_text("Hello there.")  # cut to what the clip says: a voice at once
    catalog.refresh()
    assert catalog.get("long").reference.transcript == "Hello there."  # type: ignore[union-attr]


def test_a_skipped_transcript_gets_the_fix_of_its_fault_not_of_its_wording(tmp_path: Path) -> None:
    """``transcript_fix`` told a transcript not saved as UTF-8 from one too long by whether
    the reason's words ended in "UTF-8": a reason worded otherwise would get the other fix.
    The kind now comes from where the transcript was refused (``TranscriptFault``): real
    files through the catalogue's loader, each fault its fix, and the fix follows the kind
    whatever the reason says."""
    text = "Café au lait."
    for name, data in [("lat", text.encode("cp1252")), ("cut", text.encode("utf-16")[:-1]),
                       ("long", b"a" * (MAX_TRANSCRIPT_CHARS + 1)), ("huge", b"a" * 2_000_001)]:
        (tmp_path / f"{name}.wav").write_bytes(_tone_wav(2.0))
        (tmp_path / f"{name}.txt").write_bytes(data)
    catalog = VoiceCatalog(tmp_path, ALL)
    faults = {clip.file: (clip.transcript, clip.fault, clip.transcript_fix) for clip in catalog.skipped()}
    utf8, cut = (TranscriptFault.ENCODING, "again as UTF-8"), (TranscriptFault.TOO_LONG, "with only what the clip says")
    assert faults == {"cut.wav": ("cut.txt", *utf8), "huge.wav": ("huge.txt", *cut), "lat.wav": ("lat.txt", *utf8),
                      "long.wav": ("long.txt", *cut)}, faults
    worded = SkippedClip("k", "k.wav", "its transcript k.txt is too long for UTF-8", "k.txt", fault=TranscriptFault.TOO_LONG)
    assert worded.transcript_fix == "with only what the clip says"
    assert SkippedClip("k", "k.wav", "too short").transcript_fix == ""  # no transcript fault


def test_deleting_skipped_files_names_every_file_removed_and_an_orphan_transcript_is_listed_and_deletable(
    tmp_path: Path,
) -> None:
    """Deleting the skipped files of a name (the studio's ``?skipped=true``) removed two
    skipped twins (``Kim.AIFF`` beside a silent ``kim.wav``) but named one, and a clip skipped
    for its Latin-1 transcript but not the transcript that went with it: now the answer lists
    every file removed (``DeletedSkipped.files``). A transcript with no clip beside it was
    logged and refused but not in ``skipped``, so the studio could neither show nor delete it:
    now it is listed with why, and deleting it removes the ``.txt``."""
    sf.write(tmp_path / "kim.wav", np.zeros(48000, np.float32), 24000)  # silent: skipped
    sf.write(tmp_path / "Kim.AIFF", np.zeros(48000, np.float32), 24000, format="AIFF")  # skipped for its name
    write_voice(tmp_path, "latin", transcript=None)
    (tmp_path / "latin.txt").write_bytes("Café".encode("cp1252"))
    (tmp_path / "wavv.txt").write_text("A clip's words, its clip misnamed.")
    write_voice(tmp_path, "other")
    catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    orphan = "no clip beside it: not a voice yet; add an audio clip wavv.wav (or .flac, .mp3, .m4a, .ogg, ...)"
    assert [clip.file for clip in catalog.skipped()] == ["Kim.AIFF", "kim.wav", "latin.wav", "wavv.txt"]
    assert catalog.skipped()[-1] == SkippedClip("wavv", "wavv.txt", orphan)
    library = VoiceLibrary(catalog, None)
    gone = library.delete("kim", skipped=True)
    assert isinstance(gone, DeletedSkipped) and (gone.file, gone.files) == ("kim.wav", ("Kim.AIFF", "kim.wav"))
    gone = library.delete("latin", skipped=True)
    assert isinstance(gone, DeletedSkipped) and (gone.file, gone.files) == ("latin.wav", ("latin.txt", "latin.wav"))
    assert gone.transcript_fix == "again as UTF-8"  # the deleted record keeps its fault's kind
    gone = library.delete("WAVV")  # no voice: its skipped files, as for a clip
    assert isinstance(gone, DeletedSkipped) and (gone.file, gone.files) == ("wavv.txt", ("wavv.txt",))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["other.txt", "other.wav"]
    assert catalog.skipped() == []


def test_a_constant_offset_or_one_click_in_silence_is_silent_for_the_folder_and_the_studio(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The new-user trial: the silence rule looked at the loudest sample only, so 3 s of a
    constant 0.5 (a DC offset) and 3 s of zeros with one click at 0.9 became voices (the
    click even the default). Now a clip needs ``MIN_SOUND_SECONDS`` of 20 ms frames whose
    RMS, its DC offset removed, reaches ``SILENCE_RMS`` (the RMS of a sine at the old -40
    dBFS peak): both are refused as uploads and skipped in the folder with one reason, while
    a steady tone just over the old peak rule, a quiet word in silence and speech riding on
    a DC offset are taken, as before."""
    from wyoming_qwen3tts.catalogue.voices import MIN_SOUND_SECONDS, SILENCE_PEAK, SILENCE_RMS, sound_seconds

    rate = 24000
    t = np.arange(3 * rate) / rate
    click = np.zeros(3 * rate, np.float32)
    click[-1] = 0.9
    word = np.zeros(3 * rate, np.float32)  # 0.2 s of a 0.05 tone (-26 dBFS) in 3 s of silence
    word[rate : rate + rate // 5] = 0.05 * np.sin(2 * np.pi * 180 * t[: rate // 5])
    clips = {
        "dc": np.full(3 * rate, 0.5, np.float32),
        "click": click,
        "faint": (0.009 * np.random.default_rng(0).uniform(-1, 1, 3 * rate)).astype(np.float32),
        "steady": (1.05 * SILENCE_PEAK * np.sin(2 * np.pi * 200 * t)).astype(np.float32),
        "word": word,
        "offset": (0.4 + 0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32),
    }
    assert SILENCE_RMS == pytest.approx(0.00707, abs=1e-5) and MIN_SOUND_SECONDS == 0.1
    assert sound_seconds(clips["dc"], rate) == 0.0 and sound_seconds(clips["click"], rate) == pytest.approx(0.02)
    assert sound_seconds(clips["word"], rate) == pytest.approx(0.2) and sound_seconds(clips["steady"], rate) == 3.0
    assert sound_seconds(np.zeros(10, np.float32), rate) == 0.0  # shorter than a frame
    for name, audio in clips.items():
        sf.write(tmp_path / f"{name}.wav", audio, rate, subtype="FLOAT")
    with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts"):
        catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    assert {v.name for v in catalog.voices()} == {"steady", "word", "offset"}
    reasons = {clip.file: clip.reason for clip in catalog.skipped()}
    assert reasons == {
        "click.wav": "the clip is silent: only 0.02 s of it is louder than -43 dBFS, under the 0.1 s a clone clip needs",
        "dc.wav": "the clip is silent: only 0.00 s of it is louder than -43 dBFS, under the 0.1 s a clone clip needs",
        "faint.wav": "the clip is silent: only 0.00 s of it is louder than -43 dBFS, under the 0.1 s a clone clip needs",
    }, reasons
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.getMessage().startswith("Skipping"))
    for name, audio in clips.items():  # the studio's upload: the same rule, the same words
        buffer = io.BytesIO()
        sf.write(buffer, audio, rate, format="WAV", subtype="FLOAT")
        if name in ("steady", "word", "offset"):
            decode_clip(buffer.getvalue())
            continue
        with pytest.raises(VoiceEditError) as refused:
            decode_clip(buffer.getvalue())
        assert refused.value.code == "clip-silent", name
        assert str(refused.value) == "T" + reasons[f"{name}.wav"][1:], name


async def test_voice_names_are_listed_and_picked_by_name_regardless_of_case(tmp_path: Path) -> None:
    """With clips ``bob``, ``Zoe`` and ``alina``, the default voice (no ``--voice``),
    ``GET /v1/audio/voices``, Wyoming's ``info`` and an
    unknown voice's message all put capitals first ("Zoe, alina, bob"), though names are
    compared regardless of case and the studio lists them so. Now every one goes by
    ``voices.name_order``: "alina, bob, Zoe"."""
    from aiohttp.test_utils import TestClient, TestServer

    from wyoming_qwen3tts.doors.wyoming.handler import build_info
    from wyoming_qwen3tts.doors.http.api import create_app
    from wyoming_qwen3tts.common.metrics import Metrics
    from wyoming_qwen3tts.service.speech import TtsService
    from wyoming_qwen3tts.service.default_voice import pick_default_voice

    for name in ("bob", "Zoe", "alina"):
        write_voice(tmp_path, name)
    catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    ordered = ["alina", "bob", "Zoe"]
    assert pick_default_voice([v.name for v in catalog.voices()]) == "alina"
    assert pick_default_voice(["Zoe", "bob"]) == "bob"
    assert str(_unknown(catalog, "nosuch")).endswith("available: alina, bob, Zoe"), str(_unknown(catalog, "nosuch"))
    assert [v.name for v in build_info(catalog.voices(), "x").tts[0].voices] == ordered
    service = TtsService(catalog, {}, None, Metrics())
    assert service.default_voice == "alina"
    async with TestClient(TestServer(create_app(service))) as client:
        resp = await client.get("/v1/audio/voices")
        assert resp.status == 200
        assert [v["name"] for v in (await resp.json())["voices"]] == ordered


def test_an_upload_with_a_transcript_must_be_the_audio_the_transcript_says(tmp_path: Path) -> None:
    """A 30 s clip uploaded with its transcript was kept as its first 20 s beside the whole
    transcript, and a 3 s WAV cut to 2 s (its header still saying 3 s) was kept with a
    transcript of 3 s: in-context cloning then pairs text with audio that does not say it.
    With a transcript, both are refused now (``clip-too-long``, ``clip-cut-off``); without
    one (x-vector cloning, no text to match) the first 20 s, or what the file holds, are used."""
    long = _tone_wav(30.0)
    with pytest.raises(VoiceEditError) as refused:
        decode_clip(long, with_transcript=True)
    assert (refused.value.status, refused.value.code) == (400, "clip-too-long")
    assert "trim the clip (at a pause) and its transcript to match" in str(refused.value)
    assert len(decode_clip(long)) == 20 * 24000
    assert len(decode_clip(_tone_wav(20.0), with_transcript=True)) == 20 * 24000  # exactly the limit: whole

    whole = _tone_wav(3.0)
    cut = whole[: 44 + 2 * 24000 * 2]  # its header, then 2 s of 16-bit samples
    with pytest.raises(VoiceEditError) as refused:
        decode_clip(cut, with_transcript=True)
    assert (refused.value.status, refused.value.code) == (400, "clip-cut-off")
    assert str(refused.value).startswith("The clip holds 2.00 s of audio though its header says 3.00 s"), refused.value
    assert len(decode_clip(cut)) == 2 * 24000
    assert len(decode_clip(whole, with_transcript=True)) == 3 * 24000
