"""Writing the voices folder: clone voices from uploaded clips, user presets, renames, deletes.

Everything stays human-readable in the voices folder, in the same shapes a user writes by
hand (see ``voices``): a clone voice is ``<name>.wav`` (24 kHz mono 16-bit PCM, at most
``MAX_REFERENCE_SECONDS``) with ``<name>.txt`` holding its transcript; a user preset is a
table of ``presets.toml``, edited with tomlkit so that the user's comments and layout stay.
Every file is written to a hidden temporary file in the same folder, then renamed over its
target (atomic on POSIX file systems), so a crash or a concurrent reader never sees half a
file. Each change is checked in full before anything is written: a refused change leaves
the folder as it was.

Several servers may share one voices folder (one server per GPU behind a load balancer):
every change takes the folder's lock (``.studio.lock``, a ``filelock`` file lock) and
re-reads the folder under it, so two servers' edits of ``presets.toml`` merge (each
re-reads the file, then adds its table) and two uploads of one name cannot both succeed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import tempfile
import tomllib
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import av
import filelock
import numpy as np
import soundfile as sf
import tomlkit

from ..common.audio import SAMPLE_RATE
from .voices import (
    AUDIO_SUFFIXES,
    MAX_TRANSCRIPT_CHARS,
    MIN_CLIP_SECONDS,
    MIN_SOUND_SECONDS,
    UNREAD_AUDIO_SUFFIXES,
    CutOffAudioError,
    NoAudioTrackError,
    SkippedClip,
    Voice,
    VoiceCatalog,
    VoiceSource,
    clip_preference,
    clone_files,
    cut_off_reason,
    decode_audio,
    has_control_characters,
    name_key,
    silent_reason,
    sound_seconds,
    transcript_names,
)
from ..common.vocabulary import MAX_REFERENCE_SECONDS, ModelKind

#: Largest uploaded clip, in bytes (20 MB: a 20 s WAV at 48 kHz stereo 32-bit is 7.7 MB).
MAX_UPLOAD_BYTES = 20 * 1000 * 1000
#: Longest voice name, in characters.
MAX_NAME_CHARS = 48
_NAME_RE = re.compile(r"[\w][\w .'-]*")
#: Device names Windows reserves (with any extension): such files cannot be opened over
#: Samba from Windows, which the add-on's docs suggest for managing the voices folder.
#: The voices folder's lock file, taken by every change (hidden: the catalogue skips it).
LOCK_FILE = ".studio.lock"
#: Seconds a change waits for another server's change to the same voices folder (each
#: holds the lock for a few file writes, milliseconds on a local disk).
LOCK_TIMEOUT_S = 10.0
#: The suffixes of the files that hold a voice name in the voices folder besides transcripts:
#: clips, and files that look like clips but that the catalogue does not read (it skips them
#: with that reason, so they hold their name as an unusable clip does).
_CLIP_SUFFIXES = AUDIO_SUFFIXES + UNREAD_AUDIO_SUFFIXES
_WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


@dataclass(frozen=True)
class DeletedSkipped(SkippedClip):
    """A skipped clip that ``VoiceLibrary.delete`` removed (the one that would give the voice,
    else the first of its name), and ``files``: the names of every file removed with it, sorted
    (its twins skipped too, transcripts: ``Kim.AIFF`` and ``kim.wav``; ``latin.wav`` and
    ``latin.txt``)."""

    files: tuple[str, ...] = ()


class VoiceEditError(Exception):
    """A change to the voices the server refuses; nothing was changed.

    Attributes:
        status: HTTP status (400 bad input, 403 not allowed, 404 unknown, 409 conflict,
            413 too large).
        code: stable machine-readable id.
        param: the request field at fault, or None.
    """

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def check_name(name: object) -> str:
    """A new voice name, stripped, or the reason it cannot be one.

    Names become file names (``<name>.wav``) and presets.toml keys, so they may hold
    letters, digits, spaces and ``_ - . '``, start with a letter, digit or ``_``, never end
    with a dot, and never hold a path separator or ``..``.

    Raises:
        VoiceEditError: 400 ``invalid-type`` (not a string: a JSON body's number, list...),
            ``invalid-name`` (None or blank: "empty", or not a valid name).
    """
    if name is not None and not isinstance(name, str):  # as doors.http.request reports wrong types
        raise VoiceEditError(400, "invalid-type", "'name' must be a string", "name")
    if name is None or not name.strip():
        raise VoiceEditError(400, "invalid-name", "The voice name is empty", "name")
    name = unicodedata.normalize("NFC", name.strip())
    if len(name) > MAX_NAME_CHARS:
        message = f"The voice name is {len(name)} characters long; at most {MAX_NAME_CHARS} are allowed"
        raise VoiceEditError(400, "invalid-name", message, "name")
    if "/" in name or "\\" in name:
        raise VoiceEditError(400, "invalid-name", f"The voice name {name!r} holds a path separator", "name")
    if ".." in name:
        raise VoiceEditError(400, "invalid-name", f"The voice name {name!r} holds '..'", "name")
    if name.split(".")[0].strip().upper() in _WINDOWS_RESERVED:
        message = f"The voice name {name!r} is a device name on Windows; its files could not be opened there"
        raise VoiceEditError(400, "invalid-name", message, "name")
    if name.endswith("."):
        message = f"The voice name {name!r} may not end with a dot"
        raise VoiceEditError(400, "invalid-name", message, "name")
    if not _NAME_RE.fullmatch(name):
        message = (
            f"The voice name {name!r} may hold only letters, digits, spaces and _ - . ' "
            "and must start with a letter, digit or _"
        )
        raise VoiceEditError(400, "invalid-name", message, "name")
    return name


def decode_clip(data: bytes, with_transcript: bool = False) -> np.ndarray:
    """Decode an uploaded clip in any format FFmpeg reads (PyAV): float32 [n_samples], mono,
    24 kHz, at most the first ``MAX_REFERENCE_SECONDS``.

    Args:
        with_transcript: the clip comes with a transcript (in-context cloning), which must say
            what the audio used says: a longer clip is refused (``clip-too-long``), and a
            WAV shorter than its header says (cut off) is refused whatever its length.

    Raises:
        VoiceEditError: 413 ``clip-too-large`` (over ``MAX_UPLOAD_BYTES``), 400
            ``not-audio`` (no audio track, or FFmpeg cannot read it), ``clip-cut-off`` (audio
            that FFmpeg stops decoding part way: a file cut short), ``clip-too-short``
            (under ``MIN_CLIP_SECONDS``; one cut off, shorter than its header says, is said
            to be, ``voices.cut_off_reason``), ``clip-silent`` (under ``MIN_SOUND_SECONDS`` of sound,
            ``voices.sound_seconds``), ``clip-too-long`` (with a transcript, over
            ``MAX_REFERENCE_SECONDS``); with a transcript, ``clip-cut-off`` for a cut-off WAV too.
    """
    if len(data) > MAX_UPLOAD_BYTES:
        raise too_large(len(data))
    try:
        # A little past the limit: whether there is more than is used
        audio, _ = decode_audio(io.BytesIO(data), MAX_REFERENCE_SECONDS + _OVER_SECONDS, SAMPLE_RATE)
    except NoAudioTrackError:
        raise VoiceEditError(400, "not-audio", "The file has no audio track", "file") from None
    except CutOffAudioError as err:
        raise VoiceEditError(400, "clip-cut-off", _upload_whole(str(err)), "file") from None
    except (av.error.FFmpegError, ValueError, EOFError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        message = f"The file is not audio that FFmpeg can read ({reason})"
        raise VoiceEditError(400, "not-audio", message, "file") from None
    longer = len(audio) > MAX_REFERENCE_SECONDS * SAMPLE_RATE
    audio = audio[: int(MAX_REFERENCE_SECONDS * SAMPLE_RATE)]
    seconds = len(audio) / SAMPLE_RATE
    if with_transcript and longer:
        message = (
            f"The clip is longer than the {MAX_REFERENCE_SECONDS:.0f} s a clone uses, and a transcript must say "
            f"just what those first {MAX_REFERENCE_SECONDS:.0f} s say: trim the clip (at a pause) and its "
            "transcript to match, or upload it without a transcript (x-vector cloning)"
        )
        raise VoiceEditError(400, "clip-too-long", message, "file")
    too_short = seconds < MIN_CLIP_SECONDS
    # Its header may say more: a cut-off file. With a transcript, which would then say more
    # than the audio holds, at any length (a WAV's header is exact; others' may be estimates).
    check_header = too_short or (with_transcript and data[:4] == b"RIFF")
    cut_off = cut_off_reason(seconds, io.BytesIO(data)) if check_header else None
    if cut_off:
        raise VoiceEditError(400, "clip-too-short" if too_short else "clip-cut-off", _upload_whole(cut_off), "file")
    if too_short:
        message = f"The clip is {seconds:.2f} s long; at least {MIN_CLIP_SECONDS:.0f} s is needed"
        raise VoiceEditError(400, "clip-too-short", message, "file")
    sound = sound_seconds(audio, SAMPLE_RATE)
    if sound < MIN_SOUND_SECONDS:  # the folder scan's rule and words (``voices.read_clone_clip``)
        message = silent_reason(sound)
        raise VoiceEditError(400, "clip-silent", message[0].upper() + message[1:], "file")
    return np.ascontiguousarray(audio, dtype=np.float32)


def _upload_whole(reason: str) -> str:
    """A cut-off clip's refusal: ``reason`` (a phrase of ``voices``) as a sentence, and what to do."""
    return f"{reason[0].upper()}{reason[1:]}; upload the whole file"


#: How far past ``MAX_REFERENCE_SECONDS`` an upload is decoded, in seconds: enough to tell a
#: longer clip from one of exactly that length (a codec's padding is under 0.1 s).
_OVER_SECONDS = 0.25


def too_large(size: int) -> VoiceEditError:
    """The refusal of an upload of ``size`` bytes (or more)."""
    message = f"The clip is over the {MAX_UPLOAD_BYTES // 1_000_000} MB limit ({size:,} bytes or more)"
    return VoiceEditError(413, "clip-too-large", message, "file")


def check_transcript(text: object) -> str | None:
    """An optional transcript, stripped (None when absent or blank).

    Raises:
        VoiceEditError: 400 ``invalid-transcript``.
    """
    if text is None:
        return None
    if not isinstance(text, str):
        raise VoiceEditError(400, "invalid-transcript", "The transcript must be text", "transcript")
    text = " ".join(text.split())
    if len(text) > MAX_TRANSCRIPT_CHARS:
        message = f"The transcript is over {MAX_TRANSCRIPT_CHARS} characters"
        raise VoiceEditError(400, "invalid-transcript", message, "transcript")
    return text or None


_LOGGER = logging.getLogger(__name__)
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a hidden temporary file in the same folder and a
    rename, with the permissions a plain ``open`` would give (0666 less the umask).

    Raises:
        OSError: the folder cannot be written.
    """
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o666 & ~_UMASK)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """float32 [n_samples] in [-1, 1] -> a 16-bit PCM mono WAV file's bytes (soundfile).
    The same samples always give the same bytes."""
    out = io.BytesIO()
    sf.write(out, np.clip(audio, -1.0, 1.0), sample_rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def _named_files(folder: Path, name: str) -> list[Path]:
    """Every file of ``folder`` that names the clone voice ``name``, sorted: the clip the
    catalogue speaks, the clips it ignores because they give the same voice name
    (``KIMBERLY.wav`` and ``kimberly.flac``: the first by ``voices.clip_preference`` is
    used, the log and the catalogue's ``skipped`` name the others), files of that name in an
    audio format the folder does not read (``kimberly.mid``), and every transcript of that
    name (``voices.name_key``: in any case or Unicode form), read or not. Hidden files and
    names with control characters, which the catalogue skips, are never among them."""
    key = name_key(name)
    return sorted(
        p for p in folder.iterdir()
        if not p.name.startswith(".")
        and p.suffix.lower() in _CLIP_SUFFIXES + (".txt",)
        and not has_control_characters(p.stem)
        and name_key(p.stem) == key
    )


def overrides_shipped(catalog: VoiceCatalog, voice: Voice) -> bool:
    """Whether ``voice`` is a user preset that overrides a shipped preset of its name
    (any case): deleting or renaming it brings the shipped one back under that name."""
    shipped = {n.casefold() for n in catalog.shipped}
    return voice.source is VoiceSource.USER and voice.name.casefold() in shipped


class VoiceLibrary:
    """The voices folder's writable side, kept consistent with ``catalog``.

    Every method checks its change in full, writes, then re-reads the catalogue, so the
    change is served at once. Call from the event loop (one change at a time); clips are
    decoded before, off the loop, with ``decode_clip``.

    Args:
        catalog: the server's catalogue; its ``voices_dir`` is written.
        default_voice: the server's explicit default voice (``--voice``), which cannot be
            renamed or deleted unless another voice of its name lies beneath it
            (``editable``): its name, or a function that says it at each edit
            (``TtsService.pinned_default``); None: none is protected (an automatic default
            may go: the next request picks another, ``TtsService.default_voice``).
    """

    def __init__(self, catalog: VoiceCatalog, default_voice: str | Callable[[], str | None] | None) -> None:
        self.catalog = catalog
        self._default_voice = default_voice
        self._reserved: set[str] = set()

    @property
    def default_voice(self) -> str | None:
        """The server's default voice now (None: it has none yet)."""
        return self._default_voice() if callable(self._default_voice) else self._default_voice

    @property
    def folder(self) -> Path:
        """The voices folder.

        Raises:
            VoiceEditError: 409 ``no-voices-folder`` when the server has none.
        """
        if self.catalog.voices_dir is None:
            raise VoiceEditError(409, "no-voices-folder", "The server has no voices folder")
        return self.catalog.voices_dir

    # --- checks -----------------------------------------------------------------------

    def check_free(
        self,
        name: object,
        replace_shipped: bool = False,
        renaming: Voice | None = None,
        replace_skipped: bool = False,
        for_clone: bool = False,
    ) -> str:
        """A valid name that no voice, alias, file or running upload uses yet.

        Args:
            replace_shipped: allow the name of a shipped preset that has no user override
                yet (the new preset overrides it).
            replace_skipped: allow the name of a clip the catalogue skips (too short, silent,
                unreadable: ``VoiceCatalog.skipped``): an upload replaces it, and no voice is lost.
                Only an upload's check allows it: it implies ``for_clone``.
            renaming: the voice being renamed: its own name and files do not count (a
                change of case only is allowed).
            for_clone: the name is for a clone voice (an upload, a clone voice's rename): a
                shipped preset's name is refused with a clone's way to take it (a clip copied
                into the voices folder by hand), not ``"replace": true``, which only a kept
                design has.

        Raises:
            VoiceEditError: 400 ``invalid-type`` / ``invalid-name`` (``check_name``), 409
                ``name-taken`` / ``name-busy``.
        """
        name = check_name(name)
        key = name.casefold()
        if key in self._reserved:
            message = f"Another change to a voice named {name!r} is in progress; try again"
            raise VoiceEditError(409, "name-busy", message, "name")
        self._check_taken(name, replace_shipped, renaming, replace_skipped, for_clone or replace_skipped)
        return name

    def _check_taken(
        self,
        name: str,
        replace_shipped: bool,
        renaming: Voice | None = None,
        replace_skipped: bool = False,
        for_clone: bool = False,
    ) -> None:
        """``check_free`` without the in-process reservations (raises 409 ``name-taken``)."""
        key = name.casefold()
        taken = self.catalog.find(name)
        if renaming is not None and taken is not None and taken.name == renaming.name:
            taken = None
        shipped = {n.casefold() for n in self.catalog.shipped}
        if taken is not None:
            overridable = (
                replace_shipped
                and taken.source is VoiceSource.SHIPPED
                and taken.name.casefold() == key
            )
            if not overridable:
                what = "an alias of" if taken.name.casefold() != key else "the name of"
                message = f"{name!r} is already {what} the {taken.source.value} voice {taken.name!r}"
                if taken.source is VoiceSource.SHIPPED and taken.name.casefold() == key and for_clone:
                    message += self._shipped_name_for_clone(name)
                elif taken.source is VoiceSource.SHIPPED and taken.name.casefold() == key and renaming is not None:
                    message += self._shipped_name_for_rename(name, renaming)
                elif taken.source is VoiceSource.SHIPPED and taken.name.casefold() == key:
                    message += (
                        '; to override it with your preset, keep it again with "replace": true (deleting '
                        "yours brings the shipped one back), or choose another name"
                    )
                elif taken.source in (VoiceSource.USER, VoiceSource.CLONE):
                    message += "; choose another name, or delete or rename that voice first"
                else:
                    message += "; choose another name"
                message += self._skipped_note(name, "an upload or rename cannot replace it under this name: replace the file in the folder, or delete it")
                raise VoiceEditError(409, "name-taken", message, "name")
        elif key in shipped and not replace_shipped:
            message = f"{name!r} is the name of a shipped preset"
            if for_clone:
                message += self._shipped_name_for_clone(name)
            elif renaming is not None:
                message += self._shipped_name_for_rename(name, renaming)
            else:
                message += '; set "replace": true to override it'
            raise VoiceEditError(409, "name-taken", message, "name")
        if ModelKind.VOICE_DESIGN in self.catalog.kinds:
            # The user's presets.toml as written, not as served: a table the catalogue skips
            # (a syntax error skips the whole file) would be shadowed once it is fixed.
            own = renaming is not None and name_key(renaming.name) == name_key(name)
            if taken is None and not own and name_key(name) in self._preset_tables():
                message = (
                    f"{name!r} is a table of {self.catalog.presets_path} that is not served (it has a "
                    "mistake, see the log); fix or remove that table first"
                )
                raise VoiceEditError(409, "name-taken", message, "name")
        if self.catalog.voices_dir is not None and self.catalog.voices_dir.is_dir():
            for path in self.catalog.voices_dir.iterdir():  # unreadable clips too: the same name rule
                if renaming is not None and name_key(path.stem) == name_key(renaming.name):
                    continue
                if name_key(path.stem) == name_key(name) and path.suffix.lower() in _CLIP_SUFFIXES:
                    skipped = self.catalog.skipped_clip(name)
                    if skipped is None:
                        message = f"A file {path.name!r} already exists in the voices folder"
                        raise VoiceEditError(409, "name-taken", message, "name")
                    if replace_skipped:
                        continue  # an upload replaces it: it serves no voice
                    fix = (  # the clip is fine: its transcript is not
                        f"Save its transcript {skipped.transcript} {skipped.transcript_fix} to make it a voice, upload a clip "
                        f"named {skipped.name!r} under 'Clone a voice' to replace both"
                        if skipped.transcript else
                        f"Upload a good clip named {skipped.name!r} under 'Clone a voice' to replace it"
                    )
                    message = (
                        f"A file {skipped.file!r} of the voices folder has that name, but it is no voice: it is "
                        f"skipped ({skipped.reason}). {fix}, or delete it first (DELETE /v1/audio/voices/"
                        f"{quote(skipped.name, safe='')}; the studio's Skipped files list)"
                    )
                    raise VoiceEditError(409, "name-taken", message, "name")

    @staticmethod
    def _shipped_name_for_rename(name: str, preset: Voice) -> str:
        """The advice ending a user preset's rename onto the shipped preset ``name``: a
        rename cannot override it (``PATCH`` has no ``"replace"``); keeping a design can
        (``POST /v1/audio/designs/{id}/keep`` with ``"replace": true``)."""
        return (
            "; a rename cannot override a shipped preset, only keeping a design can: choose another "
            f"name, or design the voice again (the studio's 'Design a voice', or POST /v1/audio/designs "
            f"with its description), keep it as {name!r} with \"replace\": true, then delete {preset.name!r}"
        )

    def _shipped_name_for_clone(self, name: str) -> str:
        """The advice ending a clone voice's refusal of the shipped preset ``name``: an upload
        or rename cannot take it (``"replace": true`` is a kept design's), a clip copied into
        the voices folder by hand can (``VoiceCatalog.voices``: a clone shadows a preset)."""
        folder = self.catalog.voices_dir
        where = f"as {folder / (name + '.wav')}" if folder is not None else f"as {name}.wav"
        return (
            "; choose another name. A clone voice takes a shipped preset's name only from a clip "
            f"copied by hand into the voices folder {where}: it is then spoken in the preset's "
            "place, and deleting it brings the preset back"
        )

    def _skipped_note(self, name: str, how: str) -> str:
        """For a refusal of a name that a preset or speaker serves: "" or, when a skipped
        clip (too short, silent, unreadable) also has that name, a note naming it, ``how`` to
        clear it, and the request that deletes it alone (``?skipped=true``)."""
        clip = self.catalog.skipped_clip(name)
        if clip is None:
            return ""
        return (
            f". The voices folder also holds {clip.file!r} of that name, skipped ({clip.reason}); {how}: "
            f"DELETE /v1/audio/voices/{quote(clip.name, safe='')}?skipped=true (the studio's Skipped files list)"
        )

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the voices folder's lock (shared by every server on the folder), with the
        catalogue re-read under it, so a change is checked against what other servers
        wrote. Blocks the caller for at most ``LOCK_TIMEOUT_S``.

        Raises:
            VoiceEditError: 409 ``voices-busy`` (another server held the lock too long),
                500 ``write-failed`` (the lock file cannot be made: e.g. a read-only folder).
        """
        folder = self.folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with filelock.FileLock(folder / LOCK_FILE, timeout=LOCK_TIMEOUT_S):
                self.catalog.refresh(force=True)
                yield
        except filelock.Timeout:
            message = (
                f"Another server kept the voices folder locked for over {LOCK_TIMEOUT_S:.0f} s "
                f"({folder / LOCK_FILE}); nothing was changed, try again"
            )
            raise VoiceEditError(409, "voices-busy", message) from None
        except OSError as err:
            raise VoiceEditError(500, "write-failed", f"Cannot lock the voices folder: {err}") from None

    @contextlib.contextmanager
    def reserve(self, name: object, replace_shipped: bool = False, replace_skipped: bool = False) -> Iterator[str]:
        """Hold a free name (see ``check_free``) for the duration of the block, so that two
        changes to one name at once cannot both pass their checks."""
        name = self.check_free(name, replace_shipped, replace_skipped=replace_skipped)
        self._reserved.add(name.casefold())
        try:
            yield name
        finally:
            self._reserved.discard(name.casefold())

    def editable(self, name: str) -> Voice:
        """The voice ``name`` (or alias), if the studio may rename or delete it. An explicit
        default voice (``--voice``) may not go, unless it takes the name of another voice
        (``VoiceCatalog.beneath``: a user preset's shipped preset; a clone's preset or
        speaker): the name stays, spoken by that voice again.

        Raises:
            VoiceEditError: 404 ``unknown-voice`` or 403 ``shipped-preset`` (409
                ``presets-unreadable`` instead while the user's presets.toml cannot be read: the
                voice may be one of its presets, or its override of the shipped one),
                403 ``shipped-preset`` / ``builtin-speaker``, 409 ``default-voice``.
        """
        self.catalog.refresh()
        voice = self.catalog.find(name)
        if voice is None:
            if ModelKind.VOICE_DESIGN in self.catalog.kinds:
                self._preset_tables()  # 409 presets-unreadable: it may be one of that file's presets
            raise VoiceEditError(404, "unknown-voice", f"There is no voice {name!r}", "voice")
        if voice.source is VoiceSource.SHIPPED:
            if ModelKind.VOICE_DESIGN in self.catalog.kinds:
                self._preset_tables()  # 409 presets-unreadable: it may be the user's override, not served
            message = (
                f"{voice.name!r} is a shipped preset: it cannot be renamed or deleted, only "
                "overridden by a preset of the same name"
            )
            raise VoiceEditError(403, "shipped-preset", message + self._skipped_note(name, "delete it"), "voice")
        if voice.source is VoiceSource.BUILTIN:
            message = f"{voice.name!r} is a built-in speaker of the CustomVoice model"
            raise VoiceEditError(403, "builtin-speaker", message + self._skipped_note(name, "delete it"), "voice")
        default = self.default_voice
        # A voice over another of its name may go: the one beneath serves the name again.
        if default is not None and voice.name.casefold() == default.casefold() and self.catalog.beneath(voice) is None:
            message = (
                f"{voice.name!r} is the server's default voice (--voice), spoken when a request names "
                "none: choose another first (--voice, the add-on's voice option) and restart"
            )
            raise VoiceEditError(409, "default-voice", message, "voice")
        if voice.name.casefold() in self._reserved:
            message = f"Another change to {voice.name!r} is in progress; try again"
            raise VoiceEditError(409, "name-busy", message, "voice")
        return voice

    # --- changes ----------------------------------------------------------------------

    def add_clone(self, name: str, audio: np.ndarray, transcript: str | None) -> Voice:
        """Write ``<name>.wav`` (and ``<name>.txt`` when there is a transcript). A clip of that
        name the catalogue skips (``VoiceCatalog.skipped``: too short, silent, unreadable) is
        replaced: its files (the clip, in any case or format, and its transcripts) go.

        Args:
            name: a name from ``reserve`` (checked again here).
            audio: float32 [n_samples], mono, 24 kHz (``decode_clip``).
            transcript: what the clip says, or None (x-vector-only cloning).

        Raises:
            VoiceEditError: 409 when the Base model is off or the name is taken; 500
                ``write-failed`` when the folder cannot be written (nothing is left behind).
        """
        if ModelKind.BASE not in self.catalog.kinds:
            message = "The cloning (Base) model is off on this server: clone voices cannot be spoken"
            raise VoiceEditError(409, "model-not-loaded", message)
        folder = self.folder
        wav, txt = folder / f"{name}.wav", folder / f"{name}.txt"
        with self.locked():
            # another server may have taken it; a skipped clip of the name is replaced
            self._check_taken(name, replace_shipped=False, replace_skipped=True, for_clone=True)
            skipped = self.catalog.skipped_clip(name)
            try:
                # Orphan transcripts of the name (in any case or form: the catalogue reads them
                # so) go first: without a transcript one would turn this into ICL, with one they
                # would stay beside it, stale. So do the files of a skipped clip of the name
                # (no other clip of the name is here: _check_taken); <name>.wav is overwritten.
                orphans = [p for p in _named_files(folder, name) if p != wav and not (transcript and p == txt)]
                if skipped is not None:
                    _LOGGER.info("Clone voice %s: replacing the skipped clip %s (%s)", name, skipped.file,
                                 skipped.reason)
                elif orphans:
                    _LOGGER.info("Clone voice %s: removing the transcripts %s left without a clip", name,
                                 ", ".join(repr(p.name) for p in orphans))
                for orphan in orphans:
                    orphan.unlink(missing_ok=True)
                if transcript:
                    write_atomic(txt, transcript.encode("utf-8") + b"\n")
                write_atomic(wav, wav_bytes(audio, SAMPLE_RATE))
            except OSError as err:
                with contextlib.suppress(OSError):
                    txt.unlink(missing_ok=True)
                raise VoiceEditError(500, "write-failed", f"Cannot write the voices folder: {err}") from None
            return self._reloaded(name)

    def add_preset(
        self,
        name: str,
        *,
        instruct: str,
        language: str,
        summary: str,
        seed: int,
        anchor_text: str,
    ) -> Voice:
        """Add (or, for a shipped preset's name, override with) a table of ``presets.toml``.

        Args:
            name: a name from ``reserve``.
            instruct: the VoiceDesign description.
            language: BCP-47 code ("en").
            summary: one line for voice pickers.
            seed, anchor_text: what the preset's anchor was rendered with.

        Raises:
            VoiceEditError: 409 when the VoiceDesign model is off; 500 ``write-failed``.
        """
        if ModelKind.VOICE_DESIGN not in self.catalog.kinds:
            raise VoiceEditError(409, "model-not-loaded", "The VoiceDesign model is off on this server")
        with self.locked():  # re-read under the lock: another server's new tables are kept
            taken = self.catalog.find(name)
            if taken is not None and taken.source is not VoiceSource.SHIPPED:  # written meanwhile
                message = f"{name!r} was just taken by the {taken.source.value} voice {taken.name!r}"
                raise VoiceEditError(409, "name-taken", message, "name")
            self._check_taken(name, replace_shipped=True)  # a clone file of that name
            document = self._presets_document()
            table = tomlkit.table()
            table.add("language", language)
            table.add("summary", summary)
            table.add("instruct", instruct)
            table.add("seed", seed)
            table.add("anchor_text", anchor_text)
            document[name] = table
            self._write_presets(document)
            return self._reloaded(name)

    def rename(self, old: str, new: object) -> Voice:
        """Rename a clone voice's files or a user preset's table.

        Raises:
            VoiceEditError: as ``editable`` for ``old``, as ``check_free`` for ``new``;
                as ``locked``; 500 ``write-failed``.
        """
        with self.locked():
            return self._rename(old, new)

    def _rename(self, old: str, new: object) -> Voice:
        """``rename`` under the lock.

        Raises:
            VoiceEditError: as ``rename``; 409 ``duplicate-files`` when other clips of the
                folder name a clone voice too (``_named_files``): they would keep its name.
                Its transcripts the catalogue does not read are removed after the rename.
        """
        voice = self.editable(old)
        if voice.source is VoiceSource.CLONE:
            self._check_no_twins(voice)
        # A user preset that overrides a shipped one may change its name's case; a rename
        # onto another shipped preset's name is refused (keep a design with replace for that).
        case_only = isinstance(new, str) and new.strip().casefold() == voice.name.casefold()
        new_name = self.check_free(new, replace_shipped=voice.source is VoiceSource.USER and case_only, renaming=voice,
                                   for_clone=voice.source is VoiceSource.CLONE)
        if new_name == voice.name:
            return voice
        if voice.source is VoiceSource.CLONE:
            folder = self.folder
            moved = clone_files(folder, voice.name)
            # Transcripts of the name the catalogue does not read ("Kim.TXT" beside the read
            # "kim.txt"): unused, and left behind they would be read by a later clip of the old
            # name; removed once the rename is done (other clips of the name refuse it above).
            unread = [p for p in _named_files(folder, voice.name) if p not in moved and p.suffix.lower() == ".txt"]
            moves = [(path, folder / f"{new_name}{path.suffix}") for path in moved]
            moves.sort(key=lambda move: move[0].suffix.lower() != ".txt")  # transcript first
            done: list[tuple[Path, Path]] = []
            try:
                for source, target in moves:
                    os.rename(source, target)
                    done.append((source, target))
            except OSError as err:
                for source, target in reversed(done):
                    with contextlib.suppress(OSError):
                        os.rename(target, source)
                raise VoiceEditError(500, "write-failed", f"Cannot rename: {err}") from None
            unread = [p for p in unread if p not in {target for _, target in moves}]
            if unread:
                _LOGGER.info("Renaming clone voice %s to %s: removing its unread transcripts %s", voice.name,
                             new_name, ", ".join(repr(p.name) for p in unread))
            for path in unread:
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
        else:
            document = self._presets_document()
            table = document[voice.name]
            del document[voice.name]
            document[new_name] = table
            self._write_presets(document)
        return self._reloaded(new_name)

    def delete(self, name: str, skipped: bool = False) -> Voice | DeletedSkipped:
        """Delete a clone voice's files or a user preset's table (a shipped preset it
        overrode comes back). Requests already speaking with it finish: they hold the voice.
        A clone voice's files are every file that names it (``_named_files``): the clip spoken,
        clips of the same voice name the catalogue ignores, and every transcript of the name.

        A name that is no voice but a skipped clip's (``VoiceCatalog.skipped``: too short,
        silent, unreadable...) deletes that clip's files (the clip and its transcripts), so that
        a user without access to the folder can clear it. ``skipped``: delete the skipped
        clips of the name even where the name is a voice (``_delete_skipped``): the voice and
        its files are kept (a preset or speaker of that name; a clone voice whose clip is
        preferred to the skipped one, ``kim.wav`` over ``kim.mp3``).

        Returns:
            the deleted voice, or the deleted skipped clip (the one that would give the
            voice, ``VoiceCatalog.skipped_clip``, else the first of the name) with every file
            removed (``DeletedSkipped.files``: the skipped clips, their transcripts, and the
            other files of the name).

        Raises:
            VoiceEditError: as ``editable``; as ``locked``; 500 ``write-failed``; 404
                ``unknown-voice`` when ``skipped`` and no skipped clip has that name.
        """
        with self.locked():
            clips = self.catalog.skipped_files(name)
            if clips and (skipped or self.catalog.find(name) is None):
                return self._delete_skipped(name, clips)
            if skipped:
                message = f"There is no skipped clip {name!r} in the voices folder"
                raise VoiceEditError(404, "unknown-voice", message, "voice")
            return self._delete(name)

    def _delete_skipped(self, name: str, clips: list[SkippedClip]) -> DeletedSkipped:
        """Remove the skipped ``clips`` of the voice name ``name`` (``VoiceCatalog.skipped_files``),
        audio first, under the lock. Where a clone voice of that name is served (the clips were
        skipped for its name: ``kim.mp3`` beside the ``kim.wav`` spoken) only they go, never the
        clip spoken or its transcript; else every file of the name goes too
        (``_named_files``: other clips and transcripts, which would otherwise be read again),
        and the transcripts of the skipped clips (``voices.transcript_names``: also those of a
        name with control characters)."""
        folder = self.folder
        voice = self.catalog.find(name)
        files = {folder / clip.file for clip in clips}  # never the clip spoken: it is not skipped
        if voice is None or voice.source is not VoiceSource.CLONE or name_key(voice.name) != name_key(name):
            texts = [p.name for p in folder.iterdir() if p.suffix.lower() == ".txt"]
            files |= {folder / text for clip in clips for text in transcript_names(folder / clip.file, texts)}
            files |= set(_named_files(folder, name))
        main = next((clip for clip in clips if clip == self.catalog.skipped_clip(name)), clips[0])
        shown = ", ".join(repr(clip.file) for clip in clips)
        removed: list[str] = []
        try:
            for path in sorted(files, key=lambda p: (p.suffix.lower() == ".txt", p.name)):
                with contextlib.suppress(FileNotFoundError):  # gone meanwhile: not removed here
                    path.unlink()
                    removed.append(path.name)
        except OSError as err:
            raise VoiceEditError(500, "write-failed", f"Cannot delete {shown}: {err}") from None
        _LOGGER.info("Voice studio: skipped clips %s deleted (%s); files removed: %s", shown,
                     "; ".join(f"{clip.file}: {clip.reason}" for clip in clips), ", ".join(sorted(removed)) or "none")
        self.catalog.refresh(force=True)
        return DeletedSkipped(main.name, main.file, main.reason, main.transcript, tuple(sorted(removed)), fault=main.fault)

    def _delete(self, name: str) -> Voice:
        """``delete`` under the lock."""
        voice = self.editable(name)
        try:
            if voice.source is VoiceSource.CLONE:
                folder = self.folder
                # Every file of the name: the clip spoken, ignored twins in another case or
                # format and every transcript, or the next one would speak as the voice.
                files = _named_files(folder, voice.name)
                others = sorted(set(files) - set(clone_files(folder, voice.name)))
                if others:
                    _LOGGER.info("Deleting clone voice %s: also its files %s, which give the same voice name",
                                 voice.name, ", ".join(repr(p.name) for p in others))
                for path in sorted(files, key=lambda p: p.suffix.lower() == ".txt"):
                    path.unlink(missing_ok=True)  # audio first: a transcript alone is never a voice
            else:
                document = self._presets_document()
                del document[voice.name]
                self._write_presets(document)
        except OSError as err:
            raise VoiceEditError(500, "write-failed", f"Cannot delete {voice.name!r}: {err}") from None
        self.catalog.refresh(force=True)
        return voice

    # --- helpers ----------------------------------------------------------------------

    def _check_no_twins(self, voice: Voice) -> None:
        """Refuse to rename a clone voice whose name other clips give too: clips the
        catalogue ignores for it (``KIMBERLY.wav`` spoken, ``kimberly.flac`` ignored). Left
        behind, they would speak as the old name again; moved along, another clip than the
        one heard might be spoken. Transcripts alone never speak: those it does not read
        do not refuse a rename (``_rename`` removes them).

        Raises:
            VoiceEditError: 409 ``duplicate-files``.
        """
        folder = self.folder
        moved = set(clone_files(folder, voice.name))
        named = _named_files(folder, voice.name)
        others = [p.name for p in named if p not in moved and p.suffix.lower() in AUDIO_SUFFIXES]
        if others:
            spoken = min((p for p in moved if p.suffix.lower() in AUDIO_SUFFIXES), key=clip_preference).name
            message = (
                f"Other clips of the voices folder name the voice {voice.name!r} too ({', '.join(others)}; "
                f"{spoken} is the one spoken): a rename would leave them to speak as {voice.name!r}. "
                "Remove or rename them in the folder first, or delete the voice, which removes them all"
            )
            raise VoiceEditError(409, "duplicate-files", message, "voice")

    def _preset_tables(self) -> set[str]:
        """The names (``voices.name_key``) of the tables of the user's presets.toml, as
        written: also those the catalogue skips for a mistake in them.

        Raises:
            VoiceEditError: 409 ``presets-unreadable``: the file cannot be read or parsed
                (the catalogue then serves none of its presets, so any name may be one).
        """
        path = self.catalog.presets_path
        if path is None:
            return set()
        try:
            text = path.read_text("utf-8") if path.is_file() else ""
            return {name_key(name) for name in tomllib.loads(text)}
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            message = (
                f"{path} cannot be read ({err}), so its presets are not served and their names are unknown; "
                "fix or remove it first"
            )
            raise VoiceEditError(409, "presets-unreadable", message) from None

    def _presets_document(self) -> tomlkit.TOMLDocument:
        path = self.catalog.presets_path
        if path is None:
            raise VoiceEditError(409, "no-voices-folder", "The server has no voices folder")
        try:
            text = path.read_text("utf-8") if path.is_file() else ""
            return tomlkit.parse(text)
        except (OSError, UnicodeDecodeError, tomlkit.exceptions.ParseError) as err:
            message = f"{path} cannot be read ({err}); fix or remove it first"
            raise VoiceEditError(409, "presets-unreadable", message) from None

    def _write_presets(self, document: tomlkit.TOMLDocument) -> None:
        path = self.catalog.presets_path
        assert path is not None
        text = tomlkit.dumps(document)
        if not text.lstrip().startswith("#"):
            header = (
                "# VoiceDesign presets of this server (see the shipped voices/presets.toml for the keys).\n"
                "# Written by the voice studio; edits by hand are kept.\n\n"
            )
            text = header + text
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode("utf-8"))
        except OSError as err:
            raise VoiceEditError(500, "write-failed", f"Cannot write {path}: {err}") from None

    def _reloaded(self, name: str) -> Voice:
        self.catalog.refresh(force=True)
        voice = self.catalog.find(name)
        if voice is None or voice.name != name:
            raise VoiceEditError(500, "write-failed", f"{name!r} was written but cannot be read back")
        return voice
