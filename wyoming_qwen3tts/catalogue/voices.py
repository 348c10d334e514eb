"""The voice catalogue shared by both front doors.

Three sources, one namespace of voice names:

* **Clone library** (Base model): ``<voices-dir>/<id>.wav`` (or ``.flac``, ``.aiff``, ``.mp3``, ``.ogg``,
  ``.m4a``, ``.wma``...: ``AUDIO_SUFFIXES``) with an optional ``<id>.txt`` transcript. With a transcript the model
  clones in ICL mode; without one it uses the speaker embedding only (x-vector). Of two clips of one voice name
  (``kim.wav`` and ``kim.mp3``, ``KIM.wav`` and ``kim.wav``) the better source is used (``clip_preference``:
  lossless formats first) and the other is skipped; every file that gives no voice (unusable, a name another clip
  gives or with control characters in it, an audio format the folder does not read) is in the log and in
  ``VoiceCatalog.skipped`` (the studio's Skipped files).
* **VoiceDesign presets**: ``presets.toml`` shipped in ``voices/`` plus an optional
  ``<voices-dir>/presets.toml`` that adds or overrides entries (see the shipped file). A
  preset may fix its anchor's ``seed`` and ``anchor_text`` (see ``anchors``).
* **CustomVoice speakers**: the built-in speakers of a loaded CustomVoice model.

A voice is only listed when the model that speaks it is loaded. The clone folder and the
user's ``presets.toml`` are re-read when their files change, so voices can be added,
renamed or removed without a restart (by hand, through ``library``, or by another server
sharing the folder): every request checks their files' signatures first.
"""

from __future__ import annotations

import asyncio
import codecs
import enum
import logging
import math
import os
import sys
import threading
import tomllib
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np
import soundfile as sf

from ..common.vocabulary import MAX_REFERENCE_SECONDS, ClipTooShortError, ModelKind, Reference
from ..text.languages import ALL_CODES, AUTO, QWEN_LANGUAGES, SPEAKER_LANGUAGES, UnsupportedLanguageError, codes_first, to_qwen

_LOGGER = logging.getLogger(__name__)

#: The level the silence rule was first set at: a clip whose loudest sample stayed below this
#: (full scale 1.0; -40 dBFS) was silent. A peak alone let 3 s of a constant 0.5 (a DC
#: offset) or of silence with one click through (the new-user trial), so the rule is now
#: ``sound_seconds`` against ``MIN_SOUND_SECONDS``, at ``SILENCE_RMS``, derived from this.
SILENCE_PEAK = 0.01
#: A 20 ms frame of a clip is sound when its RMS (the clip's DC offset removed) reaches this
#: (full scale 1.0): the RMS of a sine wave whose peak is ``SILENCE_PEAK`` (0.0071, -43
#: dBFS), so a steady tone the peak rule took is still taken.
SILENCE_RMS = SILENCE_PEAK / math.sqrt(2)
#: The frames ``sound_seconds`` measures, in seconds: 20 ms, the frame of speech analysis
#: (shorter than a syllable, longer than a pitch period down to 50 Hz).
SOUND_FRAME_SECONDS = 0.02
#: The least sound a clone clip holds, in seconds (``sound_seconds``): under it the clip is
#: silent, refused as an upload (``library.decode_clip``, ``clip-silent``) and skipped in the
#: voices folder. A tenth of a second is less than one syllable (0.15-0.3 s), so a clip with
#: a word in it passes however quiet the rest is, while a click (one frame) or a few do not.
MIN_SOUND_SECONDS = 0.1
#: Shortest clip that is a clone voice, in seconds: the voice studio refuses a shorter upload
#: (``library.decode_clip``, ``clip-too-short``) and the voices folder's scan skips a shorter
#: clip, so a clip is a voice or not whichever way it came in. The value is the studio's
#: rule since it shipped, not a limit of the model (``MIN_REFERENCE_SECONDS`` is lower): under
#: a second a clip holds a word or two, 12 codec frames (12.5 a second) in an in-context
#: clone's prompt, little of a voice to imitate.
MIN_CLIP_SECONDS = 1.0
#: The most characters a transcript holds per second of its clip before the catalogue warns
#: that it is no transcript of that clip (a whole script or chapter pasted in), counted with
#: runs of white space as one: 80. Fast English speech is 15 to 20 characters a second (160
#: to 210 words a minute at about 5.7 characters a word, its space counted), the fastest
#: talkers on record (about 600 words a minute) reach 57, and Chinese or Japanese speech is
#: 4 to 8 characters a second; so no transcript of what a clip says comes near it. The clip's
#: seconds are those the voice uses (at most ``MAX_REFERENCE_SECONDS``). The studio's upload
#: form and the folder scan have a hard limit on the whole text (``MAX_TRANSCRIPT_CHARS``).
MAX_TRANSCRIPT_CHARS_PER_SECOND = 80
#: Longest transcript of a clone clip, in characters (runs of white space counted as one; 20 s
#: of fast speech is about 400): the studio refuses a longer upload (``library.check_transcript``)
#: and the voices folder's scan skips a clip with a longer transcript (``read_transcript``):
#: every request with it would prefill the whole text (25,000 characters cost 3.2 s of first
#: audio; two million held the clone model for minutes).
MAX_TRANSCRIPT_CHARS = 1000
#: The most bytes of a transcript file read (``read_transcript``): ``MAX_TRANSCRIPT_CHARS`` in
#: UTF-32 (4 bytes each) four times over, room for white space; a larger file is skipped
#: unread, never loaded whole.
MAX_TRANSCRIPT_BYTES = 16 * MAX_TRANSCRIPT_CHARS



def too_short_reason(seconds: float) -> str:
    """Why a clip of ``seconds`` (under ``MIN_CLIP_SECONDS``) is no clone voice: one phrase,
    in the same words in the log, the listing's ``skipped`` (the studio page's Skipped
    files), a request's refusal and the start-up check of ``--voice``."""
    return f"the clip is {seconds:.2f} s long, under the {MIN_CLIP_SECONDS:g} s a clone clip needs"


#: How much shorter than its header declares a clip's decoded audio must be to look cut off
#: (``cut_off_reason``), in seconds: more than any codec's priming and padding (an AAC frame
#: at 44.1 kHz is 46 ms), so a whole file never looks cut off.
_CUT_OFF_SLACK_SECONDS = 0.1


def declared_seconds(source: str | BinaryIO) -> float | None:
    """How long the header of the audio file ``source`` (a path, or a binary file object read
    from its start) says its audio is, in seconds, or None where it says nothing usable (a
    streamed WAV's unset size, a file FFmpeg cannot open). A WAV's comes from its ``data``
    chunk's size and byte rate, read here: FFmpeg and libsndfile trim that size to the bytes
    present, so a cut-off WAV would look whole. Other formats' from FFmpeg's (PyAV) container
    duration (FLAC's STREAMINFO, an MP3's Xing header). Never raises."""
    try:
        if isinstance(source, str):
            with open(source, "rb") as file:
                return _declared_seconds(file)
        return _declared_seconds(source)
    except Exception:  # noqa: BLE001 - a header that cannot be read declares nothing
        return None


def _declared_seconds(file: BinaryIO) -> float | None:
    """``declared_seconds`` of an open file (raises on what it cannot read)."""
    head = file.read(12)
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        byte_rate = 0
        while len(chunk := file.read(8)) == 8:
            size = int.from_bytes(chunk[4:], "little")
            if chunk[:4] == b"fmt ":
                byte_rate = int.from_bytes(file.read(size)[8:12], "little")
            elif chunk[:4] == b"data":
                return size / byte_rate if byte_rate and size not in (0, 0xFFFFFFFF) else None
            else:
                file.seek(size, os.SEEK_CUR)
            file.seek(size % 2, os.SEEK_CUR)  # chunks are padded to an even size
        return None
    import av  # FFmpeg's libraries load only where such a clip is read

    file.seek(0)
    with av.open(file, mode="r") as container:
        return container.duration / av.time_base if container.duration else None


def cut_off_reason(seconds: float, source: str | BinaryIO) -> str | None:
    """Why a clip whose decoded audio is ``seconds`` long (under ``MIN_CLIP_SECONDS``; an
    upload with a transcript, of any length: ``library.decode_clip``) is no clone voice,
    when its header (``declared_seconds`` of ``source``) says it is long enough and its
    audio ends over ``_CUT_OFF_SLACK_SECONDS`` earlier: the file looks cut off (an
    incomplete download or copy), one phrase in the shape of ``too_short_reason``. None: the
    header says nothing, or no more than the audio holds (a short clip, ``too_short_reason``)."""
    declared = declared_seconds(source)
    if declared is None or declared < MIN_CLIP_SECONDS or seconds > declared - _CUT_OFF_SLACK_SECONDS:
        return None
    # No parentheses: the start-up survey puts the reason in some (``startup.survey_clips``).
    return (f"the clip holds {seconds:.2f} s of audio though its header says {declared:.2f} s: the file "
            "looks cut off, an incomplete download or copy")


def sound_seconds(audio: np.ndarray, sample_rate: int) -> float:
    """How much of a clip is sound, in seconds: its whole ``SOUND_FRAME_SECONDS`` frames whose
    RMS reaches ``SILENCE_RMS`` once the clip's mean (a DC offset) is taken away. 0.0 for
    silence, a constant (DC) signal, or a clip shorter than one frame; a single click counts
    one frame.

    Args:
        audio: float [n_samples] mono, full scale 1.0.
        sample_rate: Hz.
    """
    samples = np.asarray(audio, dtype=np.float64).reshape(-1)
    frame = max(1, round(SOUND_FRAME_SECONDS * sample_rate))
    count = len(samples) // frame
    if count == 0:
        return 0.0
    centred = samples - samples.mean()
    rms = np.sqrt(np.mean(np.square(centred[: count * frame].reshape(count, frame)), axis=1))
    return float(np.count_nonzero(rms >= SILENCE_RMS) * frame / sample_rate)


def silent_reason(sound: float) -> str:
    """Why a clip with ``sound`` seconds of sound (``sound_seconds``, under
    ``MIN_SOUND_SECONDS``) is no clone voice, in the shape of ``too_short_reason``: in the
    log, the listing's ``skipped``, a request's refusal, the start-up checks, and (capitalised)
    the studio's refusal of an upload."""
    # No parentheses: the start-up survey puts the reason in some (``startup.survey_clips``).
    return (f"the clip is silent: only {sound:.2f} s of it is louder than {20 * math.log10(SILENCE_RMS):.0f} "
            f"dBFS, under the {MIN_SOUND_SECONDS:g} s a clone clip needs")


#: Byte-order marks a transcript may start with, and the encoding each declares: Windows
#: Notepad's "UTF-8 with BOM" and "Unicode" (UTF-16 LE), "Unicode big endian", and UTF-32.
#: The UTF-32 marks come first: UTF-32 LE's begins with UTF-16 LE's.
_TRANSCRIPT_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


class TranscriptFault(enum.Enum):
    """Why the catalogue does not use a transcript, as a kind (``TranscriptError.fault``,
    ``SkippedClip.fault``); its value is how the transcript is saved to fix it, for advice
    ("Save its transcript kim.txt <value>": ``SkippedClip.transcript_fix``)."""

    #: No text the catalogue reads (``TranscriptEncodingError``).
    ENCODING = "again as UTF-8"
    #: Over ``MAX_TRANSCRIPT_CHARS`` (``TranscriptTooLongError``).
    TOO_LONG = "with only what the clip says"


class TranscriptError(ValueError):
    """A transcript the catalogue does not use: its message is the reason the clip is skipped,
    naming the transcript's file name (no folders) and saying what to do with it.

    Attributes:
        file: the transcript's file name.
        fault: what is wrong with it, as a kind (each subclass has its own).
    """

    fault: ClassVar[TranscriptFault]

    def __init__(self, file: str, message: str) -> None:
        super().__init__(message)
        self.file = file


class TranscriptEncodingError(TranscriptError):
    """A transcript that is no text the catalogue reads (UTF-8, or UTF-16/32 with a byte-order
    mark): the reason says to save it as UTF-8."""

    fault = TranscriptFault.ENCODING

    def __init__(self, file: str, encoding: str) -> None:
        # No parentheses: the start-up survey puts the reason in some (``startup.survey_clips``).
        if encoding.startswith("utf-8"):
            what = "is not UTF-8 text, it was saved in another encoding"
        else:
            what = f"starts as {encoding.upper()} text but is cut short or broken"
        super().__init__(file, f"its transcript {file} {what}; save it as UTF-8")


class TranscriptTooLongError(TranscriptError):
    """A transcript over ``MAX_TRANSCRIPT_CHARS`` characters (``size``: how long it is, in
    characters, or in bytes for a file too large to read): the reason says to cut it."""

    fault = TranscriptFault.TOO_LONG

    def __init__(self, file: str, size: str) -> None:
        super().__init__(file, f"its transcript {file} is {size} long, over the {MAX_TRANSCRIPT_CHARS:,} characters a "
                         "transcript may hold; cut it to what the clip says, word for word, or remove it to clone "
                         "from the sound of the voice alone")


def transcript_chars(text: str) -> int:
    """A transcript's length as every limit counts it (``MAX_TRANSCRIPT_CHARS``,
    ``MAX_TRANSCRIPT_CHARS_PER_SECOND``, the studio's upload): characters, with each run of
    white space counted as one and none at the ends."""
    return len(" ".join(text.split()))


def overlong_transcript_reason(file: str, transcript: str | None, seconds: float) -> str | None:
    """Why the transcript ``transcript`` (its file name: ``file``) of a clip of ``seconds`` (the
    seconds the voice uses) cannot be what the clip says: it holds more than
    ``MAX_TRANSCRIPT_CHARS_PER_SECOND`` characters a second of clip. None: it can be (or there
    is none). The catalogue warns with this once per file and still uses the transcript."""
    chars = transcript_chars(transcript) if transcript else 0
    limit = int(MAX_TRANSCRIPT_CHARS_PER_SECOND * seconds)
    if chars <= limit:
        return None
    cut = f" (the first {MAX_REFERENCE_SECONDS:g} s of the clip, all a voice uses)" if (
        seconds >= MAX_REFERENCE_SECONDS - 0.01) else ""
    return (f"its transcript {file} is {chars:,} characters long, more than {seconds:.1f} s of speech{cut} "
            f"could hold (at most {limit:,}: {MAX_TRANSCRIPT_CHARS_PER_SECOND} characters a second, where fast speech "
            "is 15 to 20); a transcript should be what the clip says, word for word: cut it to that, or remove it "
            "to clone from the sound of the voice alone")


def read_transcript(path: Path) -> str:
    """The text of the transcript at ``path``: UTF-8 (with or without a byte-order mark), or
    UTF-16 or UTF-32 with a byte-order mark (Windows Notepad's "Unicode"). Other encodings
    (Windows-1252, "ANSI") are refused rather than guessed: the same bytes spell different
    words in each. At most ``MAX_TRANSCRIPT_BYTES`` are read: a larger file is refused unread.

    Raises:
        TranscriptEncodingError: the file does not decode so (its message names the file and
            says to save it as UTF-8).
        TranscriptTooLongError: the text is over ``MAX_TRANSCRIPT_CHARS`` characters (runs of
            white space counted as one, as the studio's upload counts them), or the file over
            ``MAX_TRANSCRIPT_BYTES``.
        OSError: the file cannot be read.
    """
    with path.open("rb") as file:
        data = file.read(MAX_TRANSCRIPT_BYTES + 1)
        if len(data) > MAX_TRANSCRIPT_BYTES:
            raise TranscriptTooLongError(path.name, f"{os.fstat(file.fileno()).st_size:,} bytes")
    return decode_transcript(data, path.name)


def decode_transcript(data: bytes, file: str) -> str:
    """The text of a transcript's bytes ``data`` (the file ``file``, for messages), decoded as
    ``read_transcript`` decodes a file: UTF-8 (a byte-order mark dropped), or UTF-16 or UTF-32
    with a byte-order mark. Also the studio's upload of a transcript file.

    Raises:
        TranscriptEncodingError: the bytes do not decode so.
        TranscriptTooLongError: over ``MAX_TRANSCRIPT_BYTES`` bytes, or over
            ``MAX_TRANSCRIPT_CHARS`` characters (runs of white space counted as one).
    """
    if len(data) > MAX_TRANSCRIPT_BYTES:
        raise TranscriptTooLongError(file, f"{len(data):,} bytes")
    encoding = next((name for bom, name in _TRANSCRIPT_BOMS if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        raise TranscriptEncodingError(file, encoding) from None
    chars = transcript_chars(text)
    if chars > MAX_TRANSCRIPT_CHARS:
        raise TranscriptTooLongError(file, f"{chars:,} characters")
    return text


#: Clip formats the voices folder reads that are (usually) lossless, by file suffix (in any
#: case), best first: WAV, FLAC, AIFF (and AIFF-C), Core Audio, Sony Wave64, WavPack, TTA, Sun
#: AU. See ``AUDIO_SUFFIXES``.
LOSSLESS_SUFFIXES = (".wav", ".flac", ".aiff", ".aif", ".aifc", ".caf", ".w64", ".wv", ".tta", ".au")
#: Lossy clip formats the voices folder reads: MP3, Ogg (Vorbis, Opus), AAC in MP4 (``.m4a``, an
#: audiobook's ``.m4b``, a video's ``.mp4``, a phone's ``.3gp``) or raw, WMA, WebM, Matroska
#: audio, AMR (a phone's voice memo), MPEG-1 Layer II, AC-3. See ``AUDIO_SUFFIXES``.
LOSSY_SUFFIXES = (
    ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".m4b", ".mp4", ".aac", ".wma", ".webm", ".mka", ".3gp", ".amr", ".mp2",
    ".ac3",
)
#: Clip formats the voices folder reads, by file suffix (in any case): every format of the
#: voice studio's upload form (``web/index.html``), so a clip that can be uploaded can be
#: copied in too, and the other audio formats FFmpeg reads that phones, recorders and audio
#: editors save (each checked by a test with a file PyAV wrote). WAV and FLAC are read by
#: libsndfile (soundfile), the others by FFmpeg (PyAV, as the studio decodes uploads:
#: ``decode_audio``). The order is the order of preference between two clips of one voice
#: name (``clip_preference``): lossless formats first (the better source), then lossy ones.
AUDIO_SUFFIXES = LOSSLESS_SUFFIXES + LOSSY_SUFFIXES
#: Suffixes of files that look like audio but that the voices folder does not read: MIDI
#: (notes, no recording), Audacity projects (the audio is in a folder beside them), iTunes'
#: copy-protected AAC, and rare formats no test checks (Monkey's Audio, Musepack, Speex,
#: RealAudio, DSD, GSM: most have no encoder in PyAV to make one). Such a file is no voice: the
#: catalogue skips it with that reason (``unread_format_reason``) instead of ignoring it
#: without a word, as it does every other file that is no clip or transcript.
UNREAD_AUDIO_SUFFIXES = (
    ".mid", ".midi", ".kar", ".aup", ".aup3", ".m4p", ".ape", ".mpc", ".spx", ".ra", ".ram", ".rm", ".dsf", ".dff",
    ".gsm",
)
#: The suffixes of the files the clone library's scan looks at: clips, files that look like
#: clips, transcripts.
_SCANNED_SUFFIXES = AUDIO_SUFFIXES + UNREAD_AUDIO_SUFFIXES + (".txt",)
#: The suffixes of ``AUDIO_SUFFIXES`` read by soundfile (the rest by ``decode_audio``).
_SOUNDFILE_SUFFIXES = (".wav", ".flac")


#: The formats a message that says what to add names, besides ``.wav``: the ones people have
#: (``AUDIO_SUFFIXES`` holds 25; listing every one made a refusal four lines long).
_ADVISED_SUFFIXES = (".flac", ".mp3", ".m4a", ".ogg")


def clip_file_names(stem: str) -> str:
    """The clip file names the voices folder reads for ``stem``, for messages that say what
    to add: ``"kim.wav (or .flac, .mp3, .m4a, .ogg, ...)"``."""
    return f"{stem}{AUDIO_SUFFIXES[0]} (or {', '.join(_ADVISED_SUFFIXES)}, ...)"


def unread_format_reason(name: str) -> str:
    """Why the file ``name`` (a suffix of ``UNREAD_AUDIO_SUFFIXES``) is no clone voice, in the
    shape of ``too_short_reason``: in the log, the listing's ``skipped``, a request's refusal."""
    path = Path(name)
    return (f"the voices folder does not read {path.suffix.lower()} files; save the clip as "
            f"{clip_file_names(path.stem)}")


def orphan_reason(name: str) -> str:
    """Why the transcript ``name`` (a ``.txt`` file name) with no clip of its voice name beside
    it is no voice, for the log and the listing's ``skipped``."""
    return f"no clip beside it: not a voice yet; add an audio clip {clip_file_names(Path(name).stem)}"


def clip_preference(path: Path) -> tuple[int, bool, str]:
    """The sort key that orders clips of one voice name (``name_key``) best first: the first
    of them is the one the catalogue reads, the others are skipped. By format, in the order
    of ``AUDIO_SUFFIXES`` (lossless before lossy: ``kim.wav`` before ``kim.mp3``), then
    a file of ``UNREAD_AUDIO_SUFFIXES`` (or any other suffix); among one format, a file whose
    stem is the voice name as it is spoken (``clone_name``: no spaces around it, accents
    composed) before one that is not (``kim.wav`` before a stray copy ``"kim .wav"``, whose
    space sorts first), then by file name in code point order (``KIM.wav`` before ``kim.wav``)."""
    suffix = path.suffix.lower()
    rank = AUDIO_SUFFIXES.index(suffix) if suffix in AUDIO_SUFFIXES else len(AUDIO_SUFFIXES)
    return rank, path.stem != clone_name(path.stem), path.name


def voice_clips(clips: Iterable[Path]) -> dict[str, Path]:
    """The clip that gives each voice name (by ``name_key``) among the audio files ``clips``:
    the first by ``clip_preference`` of those whose name gives a voice (no control
    characters, not blank: ``clone_name``). The others give no voice. The catalogue's scan
    and the start-up checks made before any model loads (``startup``) both choose by this."""
    chosen: dict[str, Path] = {}
    for path in sorted(clips, key=clip_preference):
        if not has_control_characters(path.stem) and clone_name(path.stem):
            chosen.setdefault(name_key(path.stem), path)
    return chosen


def preference_reason(used: Path, ignored: Path) -> str:
    """Why the clip ``used`` is read rather than ``ignored``, another clip of its voice name
    (``clip_preference`` orders ``used`` first), in a few words for the log and the listing's
    ``skipped``."""
    first, second = used.suffix.lower(), ignored.suffix.lower()
    if second in UNREAD_AUDIO_SUFFIXES:
        return unread_format_reason(ignored.name).split(";")[0]
    if first == second:
        if used.stem == clone_name(used.stem) and ignored.stem != clone_name(ignored.stem):
            return "its file name is the voice name exactly, without spaces around it"
        return "the first by file name is used"
    if first in LOSSLESS_SUFFIXES and second in LOSSY_SUFFIXES:
        return f"lossless {first} is preferred to lossy {second}"
    return f"{first} comes before {second} in the order of formats: {', '.join(AUDIO_SUFFIXES)}"


#: libsndfile's error code for a file the system could not open or read (gone, no permission).
_SF_ERR_SYSTEM = 2


def is_decoder_error(err: BaseException) -> bool:
    """Whether ``err`` is a decoder's refusal of a file's bytes, FFmpeg's (``decode_audio``) or
    libsndfile's (WAV and FLAC, ``load_reference``): the file is no audio it reads (a text
    file renamed ``fake.mp3`` or ``fake.wav``), not a file that cannot be opened."""
    if isinstance(err, sf.LibsndfileError):  # not its system errors (gone, no permission): those stay ERRORs
        return err.code != _SF_ERR_SYSTEM
    av = sys.modules.get("av")  # loaded by ``decode_audio``: no FFmpeg error without it
    # Not FFmpeg's OSErrors (a file that cannot be opened: permissions, gone): those stay ERRORs.
    return av is not None and isinstance(err, av.error.FFmpegError) and not isinstance(err, OSError)


def unreadable_reason(err: Exception) -> str:
    """Why a clip whose decoder (``is_decoder_error``) failed with ``err`` is no clone voice,
    in plain words and the decoder's short message, without its error number or the file's
    path: ``the file is not audio FFmpeg can read: Invalid data found when processing input``
    (FFmpeg), ``the file could not be decoded as audio: Format not recognised`` (libsndfile,
    a ``.wav`` or ``.flac``)."""
    if isinstance(err, sf.LibsndfileError):  # its message names the path: only its reason
        said = err.error_string.strip().removeprefix("Error :").strip().rstrip(".")
        return f"the file could not be decoded as audio: {said}"
    said = getattr(err, "strerror", None) or str(err)
    # No parentheses: the start-up survey puts the reason in some (``startup.survey_clips``).
    return f"the file is not audio FFmpeg can read: {str(said).strip().rstrip('.')}"


class NoAudioTrackError(ValueError):
    """A file FFmpeg opens that holds no audio track (a picture, a silent video)."""


class CutOffAudioError(ValueError):
    """A file whose audio FFmpeg decoded for a while, then could not go on: its end is
    missing (an incomplete download or copy; a FLAC file cut short does this, while a cut
    Ogg or MP3 file decodes to its end without an error).

    Attributes:
        seconds: how much audio decoded before the error, in seconds.
        reason: FFmpeg's short message ("Invalid data found when processing input").
    """

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(cut_off_after_reason(seconds, reason))
        self.seconds = seconds
        self.reason = reason


def cut_off_after_reason(seconds: float, reason: str) -> str:
    """Why a clip whose decoding failed after ``seconds`` of audio (``CutOffAudioError``) is
    no clone voice, one phrase in the shape of ``cut_off_reason``."""
    # No parentheses: the start-up survey puts the reason in some (``startup.survey_clips``).
    return (f"the file is cut off after {seconds:.2f} s of audio, FFmpeg: {reason.strip().rstrip('.')}; "
            "an incomplete download or copy")


def decode_audio(source: str | BinaryIO, max_seconds: float, rate: int | None = None) -> tuple[np.ndarray, int]:
    """The first audio track of ``source`` (a path, or a binary file object) decoded by FFmpeg
    (PyAV): float32 [n_samples] mono in [-1, 1], at most the first ``max_seconds``, and its
    sample rate in Hz (``rate`` if given, resampled to it; else the track's own). Any format
    FFmpeg reads (MP3, Ogg Vorbis or Opus, AAC/M4A, WebM, WAV, FLAC).

    Raises:
        NoAudioTrackError: the file holds no audio track.
        CutOffAudioError: audio decoded, then the rest could not be (a file cut short).
        av.error.FFmpegError, ValueError, EOFError: FFmpeg cannot read it as audio.
    """
    import av  # FFmpeg's libraries load only where such a clip is read

    pieces: list[np.ndarray] = []
    with av.open(source, mode="r") as container:
        if not container.streams.audio:
            raise NoAudioTrackError("The file has no audio track")
        stream = container.streams.audio[0]
        rate = rate or stream.rate or stream.codec_context.sample_rate
        if not rate:
            raise ValueError("the audio track has no sample rate")
        limit = int(max_seconds * rate)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        got = 0
        frames = container.decode(stream)
        while got < limit:
            try:
                frame = next(frames, None)
            except (av.error.InvalidDataError, EOFError) as err:  # not OSErrors: a file gone or forbidden
                if not got:
                    raise
                raise CutOffAudioError(got / rate, getattr(err, "strerror", None) or str(err)) from None
            if frame is None:
                pieces.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
                break
            for out in resampler.resample(frame):
                pieces.append(out.to_ndarray().reshape(-1))
                got += len(pieces[-1])
    audio = np.concatenate(pieces)[:limit] if pieces else np.zeros(0, np.float32)
    return np.ascontiguousarray(audio, dtype=np.float32), int(rate)
#: Name of the user's presets file in the voices folder.
PRESETS_FILE = "presets.toml"
#: Largest preset seed (the anchor's seed; torch seeds are 64-bit, this keeps them portable).
MAX_PRESET_SEED = 2**32 - 1

#: The shipped presets: inside the installed package (the wheel puts the repository's voices/
#: folder at ``wyoming_qwen3tts/voices``), or the repository's voices/ folder.
_PACKAGE_DIR = Path(__file__).parent.parent
_SHIPPED_PRESETS = (
    _PACKAGE_DIR / "voices" / "presets.toml",
    _PACKAGE_DIR.parent / "voices" / "presets.toml",
)


class VoiceSource(str, enum.Enum):
    """Where a voice comes from (decides whether the studio may rename or delete it)."""

    SHIPPED = "shipped"  # a preset of the package's voices/presets.toml
    USER = "user"  # a preset of the voices folder's presets.toml (new, or overriding a shipped one)
    CLONE = "clone"  # a clip (and transcript) in the voices folder
    BUILTIN = "builtin"  # a CustomVoice model's speaker


def has_control_characters(name: str) -> bool:
    """Whether a file name holds a control character (a newline, a tab): such a clip is no
    voice (a newline would split every log line that names it)."""
    return any(unicodedata.category(ch) == "Cc" for ch in name)


def clone_name(stem: str) -> str:
    """The voice name of a clip whose file name (without its suffix) is ``stem``: in Unicode
    NFC (macOS writes accents decomposed, NFD, over Samba; the studio writes NFC), without
    surrounding whitespace (``"trail .wav"`` is the voice ``trail``: a request's name is
    stripped too, so a listed ``"trail "`` could never be asked for). Empty: no name."""
    return unicodedata.normalize("NFC", stem).strip()


def name_key(name: str) -> str:
    """What voice names are compared by: ``name`` in NFC, stripped, case-folded (so
    ``Renée`` typed composed or decomposed, ``KIM`` and ``kim``, ``"trail "`` and ``trail``
    are one name each)."""
    return unicodedata.normalize("NFC", clone_name(name).casefold())


def name_order(name: str) -> tuple[str, str]:
    """The key voice names are listed by: by name regardless of case ("alina, Aria, bob,
    Zoe"; exact case breaks a tie), in every listing, message and default pick, as the
    studio lists them (names are compared regardless of case, ``name_key``)."""
    return name.casefold(), name


def transcript_names(clip: Path, names: Collection[str]) -> list[str]:
    """Every transcript of clip ``clip`` among the file ``names`` of its folder, the one it
    reads first: ``<id>.txt`` (its own file stem, ``.txt`` in lower case), then the others
    whose name is the same voice name (``name_key``: in any case, composed or decomposed,
    surrounding spaces aside: ``Kim.wav`` reads ``kim.txt``) in name order (code point order:
    ``kim.TXT`` before ``kim.txt``). Empty: no transcript. More than one: the catalogue reads
    the first and warns of the others."""
    exact = clip.with_suffix(".txt").name
    key = name_key(clip.stem)
    found = [n for n in sorted(names) if n.lower().endswith(".txt") and name_key(n[:-4]) == key]
    return [exact] + [n for n in found if n != exact] if exact in found else found


def transcript_name(clip: Path, names: Collection[str]) -> str | None:
    """The transcript that clip ``clip`` reads among the file ``names`` of its folder, the
    first of ``transcript_names``; None: no transcript."""
    return next(iter(transcript_names(clip, names)), None)


def clone_files(folder: Path, name: str) -> list[Path]:
    """The files of the clone voice ``name`` in ``folder``, sorted, as the catalogue reads
    them: the clip that gives the voice (the first by ``clip_preference`` whose voice name
    is ``name``, see ``clone_name`` and ``name_key``: an NFD ``Renée.wav``, ``"trail .wav"``),
    its twins of the same file stem (``kim.wav`` and ``kim.flac``), and the transcript the
    catalogue reads for it (``transcript_name``). Files the catalogue skips (hidden ones,
    names with control characters) are never among them. The studio renames and deletes
    these."""
    files = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    key = name_key(name)
    if not key:
        return []
    clips = [
        p for p in files
        if p.suffix.lower() in AUDIO_SUFFIXES and not has_control_characters(p.stem) and name_key(p.stem) == key
    ]
    if not clips:
        return []
    clip = min(clips, key=clip_preference)
    twins = [p for p in clips if p.stem == clip.stem]
    text = transcript_name(clip, [p.name for p in files if p.suffix.lower() == ".txt"])
    return sorted(twins + ([folder / text] if text is not None else []))


#: How a log line names a voice of each source.
_WHAT = {
    VoiceSource.SHIPPED: "shipped preset",
    VoiceSource.USER: "preset",
    VoiceSource.CLONE: "clone voice",
    VoiceSource.BUILTIN: "CustomVoice speaker",
}


class UnknownVoiceError(KeyError):
    """No voice of that name is available (unknown, or its model is not loaded)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown voice"


def load_reference(audio_path: Path, transcript_path: Path | None = None) -> Reference:
    """A clone clip as a ``Reference`` (float32 mono, at most ``MAX_REFERENCE_SECONDS``): read
    ``<id>.wav`` (any format of ``AUDIO_SUFFIXES``: WAV and FLAC by soundfile,
    the others by FFmpeg, ``decode_audio``) and its optional transcript
    (``transcript_path``; by default ``<id>.txt`` beside it, if it exists).

    Raises:
        ClipTooShortError: shorter than ``MIN_REFERENCE_SECONDS``.
        CutOffAudioError: audio that stops decoding part way (a file cut short; a FLAC
            libsndfile loses sync in is decoded again by FFmpeg to tell).
        TranscriptError: the transcript is no text ``read_transcript`` reads, or too long.
        ValueError / soundfile.LibsndfileError / av.error.FFmpegError / EOFError / OSError:
            unreadable audio.
    """
    if audio_path.suffix.lower() in _SOUNDFILE_SUFFIXES:
        try:
            with sf.SoundFile(str(audio_path)) as clip:  # read only what is used, never a whole long file
                sample_rate = clip.samplerate
                audio = clip.read(frames=int(MAX_REFERENCE_SECONDS * sample_rate), dtype="float32")
        except sf.LibsndfileError as err:
            _raise_if_cut_off(audio_path, err)
            raise
    else:  # MP3, Ogg, M4A...: FFmpeg, as the studio reads uploads
        audio, sample_rate = decode_audio(str(audio_path), MAX_REFERENCE_SECONDS)
    if transcript_path is None and audio_path.with_suffix(".txt").exists():
        transcript_path = audio_path.with_suffix(".txt")
    transcript = read_transcript(transcript_path) if transcript_path is not None else None
    return Reference.from_audio(audio, int(sample_rate), transcript)


@dataclass(frozen=True)
class Voice:
    """One entry of the catalogue.

    Attributes:
        name: the id clients select (Wyoming voice name, OpenAI ``voice``).
        kind: the model that speaks it.
        summary: one line for voice pickers.
        languages: BCP-47 codes advertised (Home Assistant matches its pipeline language).
        language: Qwen3-TTS language used when the client names none ("auto" = detect).
        instruct: VoiceDesign description (presets) or None.
        speaker: CustomVoice speaker id or None.
        reference: clone reference or None.
        aliases: other names that select this voice.
        source: where it comes from.
        seed: presets: the seed their anchor is rendered with (None: derived from the
            description, see ``anchors.preset_seed``).
        anchor_text: presets: what their anchor says (None: the language's neutral
            sentence, ``anchors.ANCHOR_TEXTS``).
    """

    name: str
    kind: ModelKind
    summary: str
    languages: tuple[str, ...]
    language: str = AUTO
    instruct: str | None = None
    speaker: str | None = None
    reference: Reference | None = None
    aliases: tuple[str, ...] = field(default=())
    source: VoiceSource = VoiceSource.SHIPPED
    seed: int | None = None
    anchor_text: str | None = None


def load_presets(
    paths: list[Path],
    source: VoiceSource = VoiceSource.SHIPPED,
    base: Mapping[str, Voice] | None = None,
    errors: list[str] | None = None,
    log: bool = True,
) -> dict[str, Voice]:
    """Read VoiceDesign presets from TOML files; later files override earlier ones.

    Args:
        paths: the files, in order (missing ones are skipped).
        source: recorded on every voice read.
        base: presets these files override: an override without ``aliases`` keeps the
            names clients already use.
        errors: if given, each problem's message is appended to it too.
        log: log each problem at ERROR; False leaves that to the caller (``errors``).

    A malformed entry is skipped with a log line naming it; a malformed file likewise.
    """
    presets: dict[str, Voice] = {}
    folded = {key.casefold(): voice for key, voice in (base or {}).items()}  # names are case-insensitive
    for path in paths:
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            _report(errors, f"Skipping presets file {path}: {err}", log)
            continue
        for name, entry in data.items():
            try:
                earlier = presets.get(name) or folded.get(name.casefold())
                presets[name] = _preset(name, entry, source, earlier)
            except KeyError as err:
                _report(errors, f"Skipping preset {name!r} in {path}: missing key {err}", log)
            except (TypeError, ValueError, AttributeError, UnsupportedLanguageError) as err:
                _report(errors, f"Skipping preset {name!r} in {path}: {err}", log)
    return presets


def _report(errors: list[str] | None, message: str, log: bool = True) -> None:
    if log:
        _LOGGER.error("%s", message)
    if errors is not None:
        errors.append(message)


#: An example value of each text key of a preset, for the message about a wrong type.
_EXAMPLES = {"language": "en", "instruct": "A warm, calm voice.", "summary": "Warm and calm"}


def _preset(name: str, entry: Any, source: VoiceSource, earlier: Voice | None) -> Voice:
    """One presets.toml table as a voice.

    Raises:
        KeyError, TypeError, ValueError, AttributeError, UnsupportedLanguageError: a bad entry.
    """
    if not isinstance(entry, dict):
        raise TypeError("not a table: write [name] followed by its keys")
    for key in ("language", "instruct", "summary"):
        if key in entry and not isinstance(entry[key], str):
            raise TypeError(f"{key} must be a string in quotes, e.g. {key} = \"{_EXAMPLES[key]}\"")
    language = to_qwen(entry["language"])
    if language == AUTO:
        raise ValueError("a preset needs a language, not 'auto'")
    instruct = str(entry["instruct"]).strip()
    if not instruct:
        raise ValueError("empty instruct")
    code = entry["language"].strip().lower().replace("_", "-").split("-")[0]
    code = next((c for c, q in QWEN_LANGUAGES.items() if q == code), code)  # "german" -> "de"
    aliases = entry.get("aliases")
    if aliases is None:  # an override keeps the names clients already use
        aliases = earlier.aliases if earlier else ()
    if isinstance(aliases, str) or not all(isinstance(a, str) for a in aliases):
        raise ValueError("aliases must be a list of strings, e.g. [\"alloy\"]")
    seed = entry.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_PRESET_SEED
    ):
        raise ValueError(f"seed must be an integer from 0 to {MAX_PRESET_SEED}")
    anchor_text = entry.get("anchor_text")
    if anchor_text is not None and (not isinstance(anchor_text, str) or not anchor_text.strip()):
        raise ValueError("anchor_text must be a non-empty string")
    return Voice(
        name=name,
        kind=ModelKind.VOICE_DESIGN,
        summary=str(entry.get("summary", instruct)),
        languages=(code,),
        language=language,
        instruct=instruct,
        aliases=tuple(aliases),
        source=source,
        seed=seed,
        anchor_text=anchor_text.strip() if anchor_text else None,
    )


#: A clip's identity for re-reading: its file's (name, mtime ns, size, inode), and its
#: transcript's, if it has one.
_ClipKey = tuple[tuple[str, int, int, int], tuple[str, int, int, int] | None]


@dataclass(frozen=True)
class ClipSkip:
    """Why a clip of the clone library is no voice (``why``, one phrase), the level it is
    logged at (``level``: WARNING for a user's choice of clip, ERROR for a broken file), and
    the transcript's file name when the fault is the transcript's, not the clip's
    (``transcript``; None: the clip's), and then what the fault is (``fault``)."""

    why: str
    level: int
    transcript: str | None = None
    fault: TranscriptFault | None = None


@dataclass(frozen=True)
class SkippedClip:
    """A clip of the clone library that gives no voice.

    Attributes:
        name: the voice name it would give (``clone_name`` of its file's stem).
        file: its file name in the voices folder (no folders).
        reason: why it is skipped, in words: too short, silent, unreadable, a transcript not
            saved as UTF-8 or too long, an audio format the folder does not read, its name
            (another clip gives that voice name, control characters in it, blank), or (a
            transcript's) no clip beside it.
        transcript: the transcript's file name when the fault is the transcript's (the clip
            is fine: save the transcript again), else None.
        fault: what is wrong with the transcript, where ``transcript`` is set (keyword only);
            else None.
    """

    name: str
    file: str
    reason: str
    transcript: str | None = None
    fault: TranscriptFault | None = field(default=None, kw_only=True)

    @property
    def transcript_fix(self) -> str:
        """How its transcript is saved to make it a voice, for advice ("Save its transcript
        kim.txt <this>"), from ``fault``: "again as UTF-8" (not saved as UTF-8) or "with only
        what the clip says" (over ``MAX_TRANSCRIPT_CHARS``); "" where ``fault`` is None."""
        return self.fault.value if self.fault is not None else ""


def _raise_if_cut_off(path: Path, err: sf.LibsndfileError) -> None:
    """Raise ``CutOffAudioError`` where the FLAC at ``path``, which libsndfile failed on with
    ``err``, is a file cut short (libsndfile says only "flac decoder lost sync"): FFmpeg
    decodes its first part, then stops. Returns for anything else (the caller re-raises)."""
    if path.suffix.lower() != ".flac" or err.code == _SF_ERR_SYSTEM:
        return
    try:
        decode_audio(str(path), MAX_REFERENCE_SECONDS)
    except CutOffAudioError:
        raise
    except Exception:  # noqa: BLE001 - not audio to FFmpeg either: libsndfile's error stands
        return


def read_clone_clip(path: Path, transcript: Path | None) -> Reference | ClipSkip:
    """The clip at ``path`` (its transcript: ``transcript``, or none) as a Reference, or why it
    cannot clone (never raises): shorter than ``MIN_CLIP_SECONDS`` or silent (a WARNING, as
    the studio refuses such an upload: a user's choice of clip, not a broken file;
    ``too_short_reason``, ``silent_reason``; shorter than its header says, ``cut_off_reason``), a transcript not saved as UTF-8 (a WARNING
    naming the transcript, ``TranscriptEncodingError``), a format the folder does not read
    (a suffix not in ``AUDIO_SUFFIXES``: a WARNING, ``unread_format_reason``, the file is not
    opened), a transcript over ``MAX_TRANSCRIPT_CHARS`` (a WARNING, ``TranscriptTooLongError``),
    a file that is no audio its decoder (FFmpeg, or libsndfile for WAV and FLAC) reads (a
    WARNING, ``unreadable_reason``), or unreadable otherwise (an ERROR: a file that cannot be opened). The folder
    scan (``VoiceCatalog``) and the start-up checks made before any model loads
    (``startup.check_default_voice``, ``startup.survey_clips``) both judge clips by this, so
    a clip is refused for the same reason before and after loading. Reads at most
    ``MAX_REFERENCE_SECONDS`` of audio; a reason may name ``path`` in full (soundfile's)."""
    if path.suffix.lower() not in AUDIO_SUFFIXES:
        return ClipSkip(unread_format_reason(path.name), logging.WARNING)
    try:
        reference = load_reference(path, transcript)
    except ClipTooShortError as err:  # under MIN_REFERENCE_SECONDS: too short all the same
        return ClipSkip(cut_off_reason(err.seconds, str(path)) or too_short_reason(err.seconds), logging.WARNING)
    except TranscriptError as err:  # saved in another encoding, or a whole script: a user's file, a WARNING too
        return ClipSkip(str(err), logging.WARNING, err.file, err.fault)
    except NoAudioTrackError:  # a picture or a silent video renamed: a user's file
        return ClipSkip("the file holds no audio track", logging.WARNING)
    except CutOffAudioError as err:  # an incomplete download or copy: a user's file
        return ClipSkip(str(err), logging.WARNING)
    except Exception as err:  # noqa: BLE001 - any unreadable file is skipped, never fatal
        if is_decoder_error(err):  # a user's file that is no audio (a text file renamed fake.mp3 or fake.wav)
            return ClipSkip(unreadable_reason(err), logging.WARNING)
        return ClipSkip(str(err), logging.ERROR)
    seconds = len(reference.audio) / reference.sample_rate
    if seconds < MIN_CLIP_SECONDS:  # as uploads are refused (clip-too-short)
        return ClipSkip(cut_off_reason(seconds, str(path)) or too_short_reason(seconds), logging.WARNING)
    sound = sound_seconds(reference.audio, reference.sample_rate)
    if sound < MIN_SOUND_SECONDS:  # as uploads are refused (clip-silent): it would clone silence
        return ClipSkip(silent_reason(sound), logging.WARNING)
    return reference


class VoiceCatalog:
    """All voices the loaded models can speak, looked up by name or alias.

    Args:
        voices_dir: the clone library and optional ``presets.toml`` (may not exist).
        kinds: the model kinds that are loaded.
        custom_speakers: the loaded CustomVoice model's speaker ids.
    """

    def __init__(
        self, voices_dir: Path | None, kinds: set[ModelKind], custom_speakers: Sequence[str] = ()
    ) -> None:
        self.voices_dir = voices_dir
        self.kinds = kinds
        #: The shipped presets (whether or not the VoiceDesign model is loaded).
        self.shipped: dict[str, Voice] = {}
        shipped = next((p for p in _SHIPPED_PRESETS if p.is_file()), None)
        if shipped:
            self.shipped = load_presets([shipped])
        self._speakers: dict[str, Voice] = {}
        if ModelKind.CUSTOM_VOICE in kinds:
            for speaker in custom_speakers:
                self._speakers[speaker] = Voice(
                    name=speaker,
                    kind=ModelKind.CUSTOM_VOICE,
                    summary=f"Qwen3-TTS CustomVoice speaker {speaker}",
                    languages=codes_first(SPEAKER_LANGUAGES.get(speaker.lower())),
                    speaker=speaker,
                    source=VoiceSource.BUILTIN,
                )
        self._user_presets: dict[str, Voice] = {}
        self._presets_signature: tuple[int, int, int] | None = None
        self._presets_problems: list[str] = []  # why parts of the user presets file were skipped
        #: The presets file's state and problems as last logged at ERROR: a re-read (each
        #: studio edit forces one) of the same broken file logs them again at DEBUG only.
        self._presets_said: tuple[tuple[int, int, int] | None, tuple[str, ...]] | None = None
        self._clones: dict[str, Voice] = {}
        self._clone_problems: dict[str, str] = {}  # name key (``name_key``): why its clip was skipped
        self._skipped: dict[str, SkippedClip] = {}  # name key: the same, as the studio lists it
        self._ignored: list[SkippedClip] = []  # the clips skipped for their name (``skipped``)
        self._orphans: dict[str, str] = {}  # name key: a transcript's file name, no clip beside it
        self._signature: tuple[tuple[str, int, int, int], ...] | None = None
        #: The broken clips already logged at ERROR, as (name, mtime ns, size, inode): a rescan
        #: (any file of the folder changed) logs them again at DEBUG only, until they change.
        self._reported: set[tuple[str, int, int, int]] = set()
        #: Each clip as last read, by its file's and its transcript's (name, mtime ns, size,
        #: inode): a Reference, or why it was skipped. A rescan reads only the clips whose
        #: file or transcript changed (re-reading 20 clips of 30 s held every client for
        #: 0.8 s in a new-user trial, when rescans ran on the event loop).
        self._read: dict[_ClipKey, Reference | ClipSkip] = {}
        #: The clips with several transcripts already warned of, as the (name, mtime ns,
        #: size, inode) of the clip and of each transcript: said again at DEBUG only.
        self._transcripts_said: set[tuple[tuple[str, int, int, int], ...]] = set()
        #: The clips whose transcript is too long for them (``overlong_transcript_reason``)
        #: already warned of, by their ``_ClipKey``: said again at DEBUG only.
        self._long_said: set[_ClipKey] = set()
        #: The presets and speakers that clone ids shadow, and the aliases names take, as last
        #: logged (``voices``).
        self._shadows_said: frozenset[tuple[str, str]] = frozenset()
        #: One refresh at a time (``refresh_async`` runs it on a worker thread).
        self._lock = threading.Lock()
        self.refresh()

    @property
    def presets_path(self) -> Path | None:
        """The user's presets file (it may not exist)."""
        return self.voices_dir / PRESETS_FILE if self.voices_dir else None

    def refresh(self, force: bool = False, wait: bool = True) -> None:
        """Re-read the user's presets and the clone library if any of their files changed
        (added, removed, edited); ``force`` rescans them regardless. Only the clips whose file
        or transcript changed (name, mtime, size or inode) are read again.

        This decodes new clips where it is called (about 40 ms for 30 s of FLAC): on the
        event loop, await ``refresh_async`` first, so that this finds nothing to read, and
        pass ``wait=False``: while another thread is refreshing, return at once with the
        catalogue as it is rather than wait for that thread's reads."""
        if not self._lock.acquire(blocking=wait):
            return
        try:
            self._refresh_presets(force)
            self._refresh_clones(force)
        finally:
            self._lock.release()

    def stale(self) -> bool:
        """Whether ``refresh`` would read anything: the presets file or a file of the clone
        library was added, removed or changed since the last refresh (file metadata only)."""
        if ModelKind.VOICE_DESIGN in self.kinds and self._presets_signature_now() != self._presets_signature:
            return True
        scan = self._clone_scan()
        return scan is not None and tuple(scan[1]) != self._signature

    async def refresh_async(self, force: bool = False) -> None:
        """``refresh`` on a worker thread when anything changed (or ``force``), so that reading
        new clips never holds the event loop (copying 20 clips of 30 s into the folder while
        another client streamed left a 1.9 s gap in its audio when this ran on the loop). The
        doors await it before looking a voice up; the lookup's own ``refresh`` then finds
        nothing to read. Unchanged folders cost one directory listing, on the loop."""
        if force or self.stale():
            await asyncio.to_thread(self.refresh, force)

    def _presets_signature_now(self) -> tuple[int, int, int] | None:
        path = self.presets_path
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        # The inode too: every write replaces the file (another server's included), so two
        # writes within one mtime tick of a coarse file system still differ.
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _clone_scan(self) -> tuple[list[Path], list[tuple[str, int, int, int]]] | None:
        """The clone library's audio files (``AUDIO_SUFFIXES``, and those it does not read:
        ``UNREAD_AUDIO_SUFFIXES``) and transcripts, and their (name, mtime ns, size, inode),
        sorted by name; None when clones are not served or there is no folder."""
        if ModelKind.BASE not in self.kinds or self.voices_dir is None or not self.voices_dir.is_dir():
            return None
        signature_items: list[tuple[str, int, int, int]] = []
        files: list[Path] = []
        for path in sorted(self.voices_dir.iterdir()):
            if path.name.startswith(".") or path.suffix.lower() not in _SCANNED_SUFFIXES:
                continue  # hidden: e.g. a file being written
            try:  # a dangling link or a file removed meanwhile is skipped, never fatal
                st = path.stat()
            except OSError as err:
                _LOGGER.debug("Ignoring %s: %s", path, err)
                continue
            files.append(path)
            signature_items.append((path.name, st.st_mtime_ns, st.st_size, st.st_ino))
        return files, signature_items

    def _refresh_presets(self, force: bool) -> None:
        path = self.presets_path
        if ModelKind.VOICE_DESIGN not in self.kinds or path is None:
            return
        signature = self._presets_signature_now()
        if signature == self._presets_signature and not force:
            return
        problems: list[str] = []
        self._user_presets = load_presets([path], VoiceSource.USER, self.shipped, problems, log=False) if signature else {}
        self._presets_problems = problems
        said = (signature, tuple(problems))  # once per file state (mtime, size, inode) and error
        for problem in problems:
            _LOGGER.log(logging.DEBUG if said == self._presets_said else logging.ERROR, "%s", problem)
        self._presets_said = said
        self._presets_signature = signature  # last, as the clones' (``_refresh_clones``)
        if signature:
            _LOGGER.info("User presets %s: %d voice(s)", path, len(self._user_presets))

    def _refresh_clones(self, force: bool) -> None:
        scan = self._clone_scan()
        if scan is None:
            return
        files, signature_items = scan
        signature = tuple(signature_items)
        if signature == self._signature and not force:
            return
        clones: dict[str, Voice] = {}
        problems: dict[str, str] = {}
        skipped: dict[str, SkippedClip] = {}
        ignored: list[SkippedClip] = []  # skipped for their name: ``skipped``
        reported: set[tuple[str, int, int, int]] = set()
        transcripts_said: set[tuple[tuple[str, int, int, int], ...]] = set()
        long_said: set[_ClipKey] = set()
        by_name = dict(zip((p.name for p in files), signature_items, strict=True))
        read: dict[_ClipKey, Reference | ClipSkip] = {}
        clips = [p for p in files if p.suffix.lower() != ".txt"]
        clip_keys = {name_key(p.stem) for p in clips}
        texts = {p.name for p in files if p.suffix.lower() == ".txt"}
        orphans: dict[str, str] = {}
        chosen = voice_clips(clips)  # voice name key (``name_key``): the clip file that gives it
        for path, item in zip(files, signature_items, strict=True):
            key = name_key(path.stem)
            level = logging.DEBUG if item in self._reported else logging.WARNING
            if path.suffix.lower() == ".txt":
                if key not in clip_keys:  # a transcript alone: say so once, as a broken clip
                    _LOGGER.log(level, "Transcript %s has %s", path, orphan_reason(path.name))
                    reported.add(item)
                    if key:
                        orphans[key] = path.name
                continue
            name = clone_name(path.stem)
            first = chosen.get(key)
            if first != path:  # skipped for its name: said once, and listed
                if has_control_characters(path.stem):
                    why = "its name holds control characters; rename the file"
                    _LOGGER.log(level, "Skipping clone voice %r: %s", path.name, why)
                elif not name:
                    why = "its name is blank; rename the file"
                    _LOGGER.log(level, "Skipping clone voice %r: %s", path.name, why)
                else:  # one voice per name
                    assert first is not None
                    spelled = "" if first.stem == path.stem else (
                        " (names are case-insensitive; spaces around a name and how its accents are encoded do not "
                        "count)")
                    because = preference_reason(first, path)
                    _LOGGER.log(level, "Clone voice files %r and %r have the same voice name%s: using %r, ignoring "
                                "%r (%s); rename or remove one", first.name, path.name, spelled, first.name,
                                path.name, because)
                    why = (f"{first.name} gives the same voice name and is used instead ({because}); rename or remove "
                           "this file")
                reported.add(item)
                ignored.append(SkippedClip(name, path.name, why))
                continue
            text_names = transcript_names(path, texts)
            text_name = text_names[0] if text_names else None
            if len(text_names) > 1:  # kim.txt and kim.TXT: one is read, the log says which
                said = (item, *(by_name[n] for n in text_names))
                _LOGGER.log(
                    logging.DEBUG if said in self._transcripts_said else logging.WARNING,
                    "Clone voice %r has %d transcripts, %s (names are case-insensitive; spaces around a name "
                    "and how its accents are encoded do not count): using %r, ignoring %s; remove or rename "
                    "the others", path.name, len(text_names), " and ".join(repr(n) for n in text_names),
                    text_names[0], " and ".join(repr(n) for n in text_names[1:]),
                )
                transcripts_said.add(said)
            clip_key = (item, by_name[text_name] if text_name else None)
            clip = self._read.get(clip_key)  # (``force`` too: every write replaces the file)
            if clip is None:
                clip = read_clone_clip(path, path.with_name(text_name) if text_name else None)
            read[clip_key] = clip
            if isinstance(clip, ClipSkip):  # skipped: why
                level = logging.DEBUG if item in self._reported else clip.level
                _LOGGER.log(level, "Skipping clone voice %s: %s", path, clip.why)
                reported.add(item)
                # for clients: the file's name, not the server's folders (soundfile names the path)
                reason = clip.why.replace(str(path), path.name)
                problems[key] = f"{path.name}: {reason}"
                skipped[key] = SkippedClip(name, path.name, reason, clip.transcript, fault=clip.fault)
                continue
            reference = clip
            long = overlong_transcript_reason(text_name or "", reference.transcript,
                                              len(reference.audio) / reference.sample_rate)
            if long is not None:  # still used: it may be right, the user decides
                _LOGGER.log(logging.DEBUG if clip_key in self._long_said else logging.WARNING,
                            "Clone voice %s: %s (it is used all the same)", path, long)
                long_said.add(clip_key)
            mode = "reference transcript" if reference.transcript else "x-vector only, no transcript"
            clones[name] = Voice(
                name=name,
                kind=ModelKind.BASE,
                summary=f"Cloned voice {name} ({mode})",
                languages=ALL_CODES,
                reference=reference,
                source=VoiceSource.CLONE,
            )
        self._clones = clones
        self._reported = reported
        self._transcripts_said = transcripts_said
        self._long_said = long_said
        self._read = read
        served = {name_key(c) for c in clones}
        self._clone_problems = {key: why for key, why in problems.items() if key not in served}
        self._skipped = {key: clip for key, clip in skipped.items() if key not in served}
        self._ignored = ignored
        self._orphans = {key: name for key, name in orphans.items() if key not in served}
        # Last: while the clips are read, ``stale`` still says so, and a door's
        # ``refresh_async`` waits for these reads instead of looking up the old catalogue.
        self._signature = signature
        assert self.voices_dir is not None  # _clone_scan found the folder
        _LOGGER.info("Clone library %s: %d voice(s)", self.voices_dir.resolve(), len(clones))

    def skipped_clips(self) -> list[str]:
        """The clips of the clone library skipped at the last refresh because they could not
        be used (unreadable, too short, silent), each as ``<file>: why``, by file name; not
        those skipped for their name (control characters, a name another clip has)."""
        return sorted(self._clone_problems.values())

    def skipped(self) -> list[SkippedClip]:
        """Every clip of the clone library that gives no voice, as records (name, file,
        reason), by file name: those of ``skipped_clips`` (they cannot be used: too short,
        silent, unreadable, a transcript not saved as UTF-8 or too long, a format the folder
        does not read), those skipped for their name (``kim.mp3`` beside ``kim.wav``, which
        gives the voice ``kim``: ``clip_preference``; control characters in it; blank), and
        transcripts with no clip beside them (``orphan_reason``; ``file`` is the ``.txt``). The studio
        lists them, deletes them (``DELETE`` on the name with ``?skipped=true``,
        ``skipped_files``) and replaces them (an upload of the name)."""
        orphans = [SkippedClip(clone_name(file[:-4]), file, orphan_reason(file)) for file in self._orphans.values()]
        return sorted([*self._skipped.values(), *self._ignored, *orphans], key=lambda clip: clip.file)

    def skipped_files(self, name: str) -> list[SkippedClip]:
        """The records of ``skipped`` whose voice name is ``name`` (compared by ``name_key``),
        by file name: the clip that would give that voice but cannot be used
        (``skipped_clip``), and the clips skipped for that name. Empty: none."""
        key = name_key(name)
        return [clip for clip in self.skipped() if name_key(clip.name) == key]

    def skipped_clip(self, name: str) -> SkippedClip | None:
        """The skipped clip that would give the voice ``name`` (compared by ``name_key``), or None."""
        return self._skipped.get(name_key(name))

    def voices(self) -> list[Voice]:
        """Every available voice. Names are case-insensitive (``name_key``): a user preset overrides the
        shipped one of the same name in any case, and clone ids shadow presets and
        speakers of the same name. A shadowing clone or speaker takes over the aliases of
        what it shadows (a clone ``aria`` is also ``nova``, the shipped ``aria``'s OpenAI
        alias, so clients asking for ``nova`` are not refused), and a voice's name beats
        another's alias (a clone ``nova`` is ``nova``, and ``aria`` loses that alias); the
        server logs each such shadow once, at WARNING."""
        merged: dict[str, Voice] = {}
        shadows: list[tuple[Voice, Voice]] = []
        for _, source in self._layers():
            for voice in source.values():
                key = name_key(voice.name)
                earlier = merged.get(key)
                if earlier is not None and earlier.source is not voice.source and voice.source is not VoiceSource.USER:
                    own = {name_key(a) for a in voice.aliases}
                    voice = replace(voice, aliases=voice.aliases + tuple(a for a in earlier.aliases if name_key(a) not in own))
                    shadows.append((earlier, voice))
                merged[key] = voice  # a later source wins, in the earlier's place
        # A name beats an alias: a clip nova.wav is "nova", no longer an alias of aria.
        taken_aliases: list[tuple[str, Voice, Voice]] = []
        for key, voice in list(merged.items()):
            lost = [a for a in voice.aliases if name_key(a) in merged and name_key(a) != key]
            if lost:
                merged[key] = replace(voice, aliases=tuple(a for a in voice.aliases if a not in lost))
                taken_aliases += [(alias, voice, merged[name_key(alias)]) for alias in lost]
        said = frozenset([(old.source.value, old.name) for old, _ in shadows]
                         + [("alias", alias) for alias, _, _ in taken_aliases])
        if said != self._shadows_said:
            for old, new in shadows:
                if (old.source.value, old.name) in self._shadows_said:
                    continue
                aliases = f", and its aliases {', '.join(old.aliases)}," if old.aliases else ""
                _LOGGER.warning("The %s %s takes the name of the %s %s: clients asking for %s%s get the %s; "
                                "rename it to keep both", _WHAT[new.source], new.name, _WHAT[old.source],
                                old.name, old.name, aliases, _WHAT[new.source])
            for alias, owner, new in taken_aliases:
                if ("alias", alias) not in self._shadows_said:
                    _LOGGER.warning("The %s %s takes the name %s, an alias of the %s %s: clients asking for "
                                    "%s get the %s", _WHAT[new.source], new.name, alias, _WHAT[owner.source],
                                    owner.name, alias, _WHAT[new.source])
            self._shadows_said = said
        return list(merged.values())

    def _layers(self) -> list[tuple[VoiceSource, Mapping[str, Voice]]]:
        """The voices by source, lowest first: a later layer's voice takes the name of an
        earlier one's (shipped presets, the user's presets, speakers, clones)."""
        layers: list[tuple[VoiceSource, Mapping[str, Voice]]] = []
        if ModelKind.VOICE_DESIGN in self.kinds:
            layers += [(VoiceSource.SHIPPED, self.shipped), (VoiceSource.USER, self._user_presets)]
        return layers + [(VoiceSource.BUILTIN, self._speakers), (VoiceSource.CLONE, self._clones)]

    def beneath(self, voice: Voice) -> Voice | None:
        """The voice that ``voice`` takes the name of (``name_key``), which serves that name
        again once ``voice`` is deleted or renamed: a user preset's shipped preset; a clone's
        speaker, user preset or shipped preset (the topmost of them, as ``voices`` layers
        them). None when there is none (the name goes with ``voice``), and for a voice of
        no layer (a shipped preset while the VoiceDesign model is off)."""
        key = name_key(voice.name)
        found: Voice | None = None
        for source, layer in self._layers():
            if source is voice.source:
                return found
            found = next((v for v in layer.values() if name_key(v.name) == key), found)
        return None

    def find(self, name: str) -> Voice | None:
        """The voice of this name or alias (compared by ``name_key``: in any case, composed or
        decomposed accents, spaces around it aside), or None."""
        try:
            return self.get(name)
        except UnknownVoiceError:
            return None

    def get(self, name: str) -> Voice:
        """Look a voice up by name, then by alias, compared by ``name_key`` (in any case, with
        accents composed or decomposed, spaces around it aside).

        Raises:
            UnknownVoiceError: with a message listing a few available names (and, for a clone
                whose clip was skipped, why).
        """
        voices = self.voices()
        wanted = name_key(name)
        for voice in voices:
            if name_key(voice.name) == wanted:
                return voice
        for voice in voices:
            if wanted in (name_key(a) for a in voice.aliases):
                return voice
        names = sorted((v.name for v in voices), key=name_order)
        shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "") or "none"
        if ModelKind.VOICE_DESIGN not in self.kinds:  # a preset, but no model to speak it
            for preset in (*self.shipped.values(), *self._user_presets.values()):
                if wanted == name_key(preset.name) or wanted in (name_key(a) for a in preset.aliases):
                    what = f"the preset {preset.name!r}" + (f" ({name!r} is its alias)" if wanted != name_key(preset.name) else "")
                    raise UnknownVoiceError(
                        f"Voice {name!r} is {what}, and presets need the VoiceDesign model, which this server "
                        f"has not loaded (--design-model); available: {shown}"
                    )
        if wanted in self._clone_problems:  # its file is there, but could not be used
            transcript = self._skipped[wanted].transcript if wanted in self._skipped else None
            what, fix = ("transcript", "") if transcript else ("clip", "; replace the file in the voices folder")
            raise UnknownVoiceError(
                f"Voice {name!r} is a clone whose {what} could not be used ({self._clone_problems[wanted]}){fix}; "
                f"available: {shown}"
            )
        if wanted in self._orphans:  # a transcript waiting for its clip
            txt = self._orphans[wanted]
            raise UnknownVoiceError(
                f"Voice {name!r} has a transcript ({txt}) but no clip beside it: add an audio clip "
                f"{clip_file_names(txt[:-4])} to the voices folder; available: {shown}"
            )
        problems = self._presets_problems
        hint = f". Note: {problems[0]}" + (f" (and {len(problems) - 1} more, see the log)" if len(problems) > 1 else "") if problems else ""
        raise UnknownVoiceError(f"Unknown voice {name!r}; available: {shown}{hint}")
