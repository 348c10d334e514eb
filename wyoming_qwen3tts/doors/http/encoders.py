"""Audio encoders for the HTTP door: float32 PCM chunks in, file bytes out.

Every format but FLAC is produced incrementally: each ``encode`` call returns the bytes
that are ready now, so a response can leave while the model is still generating. The
containers are written by FFmpeg through PyAV (``av``) into a write-only sink; because the
sink cannot seek, the muxers leave their "length unknown" markers in place, which is
exactly what a streamed file needs:

======  ==============================  =========================================
format  container / codec               header
======  ==============================  =========================================
pcm     none, s16le mono 24 kHz         none (streamed)
wav     RIFF / pcm_s16le                RIFF and data sizes 0xFFFFFFFF (streamed)
mp3     raw MPEG audio / libmp3lame     ID3v2 tag, no Xing/LAME length tag (streamed)
opus    Ogg / libopus                   OpusHead + OpusTags; one packet per page (streamed)
aac     ADTS / FFmpeg aac               every frame carries its own ADTS header (streamed)
flac    native FLAC / flac              STREAMINFO with the total samples and MD5
                                        (whole file, returned by ``finish``)
======  ==============================  =========================================

FLAC is the archiving format, and libsndfile (``soundfile``) refuses a FLAC whose
STREAMINFO says "length unknown" ("array is too big"). So FLAC is written into a seekable
buffer, the muxer rewrites STREAMINFO at the end, and the whole file comes from
``finish`` (``AudioFormat.whole_file``).

Lossy codecs add their usual padding: mp3 and aac decode to up to about 2,300 samples
more than went in; Ogg Opus decodes at 48 kHz (the Opus decoder rate; the stream's
input rate, 24 kHz, is in its header).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction
from typing import cast

import av
import numpy as np

from ...common.audio import SAMPLE_RATE, to_pcm16


def audio_frame(audio: np.ndarray, pts: int) -> av.AudioFrame:
    """float32 [n_samples] mono at 24 kHz -> a PyAV frame starting at ``pts`` (in samples)."""
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(audio, dtype=np.float32).reshape(1, -1), format="flt", layout="mono"
    )
    frame.sample_rate = SAMPLE_RATE
    frame.time_base = Fraction(1, SAMPLE_RATE)
    frame.pts = pts
    return frame


@dataclass(frozen=True)
class AudioFormat:
    """One ``response_format``.

    Attributes:
        name: the OpenAI name (``mp3``, ``opus``, ``aac``, ``flac``, ``wav``, ``pcm``).
        content_type: the HTTP ``Content-Type`` of the response body.
        container: FFmpeg muxer name, or None for headerless PCM.
        codec: FFmpeg encoder name, or None for headerless PCM.
        bit_rate: target bit rate in bits per second for lossy codecs, else None.
        options: extra muxer options (FFmpeg AVOptions, as strings).
        whole_file: the file is complete only at the end: ``encode`` returns b"" and
            ``finish`` the whole file (its header needs the total length).
    """

    name: str
    content_type: str
    container: str | None = None
    codec: str | None = None
    bit_rate: int | None = None
    options: tuple[tuple[str, str], ...] = ()
    whole_file: bool = False


#: Every supported ``response_format``, by name.
FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat("mp3", "audio/mpeg", "mp3", "libmp3lame", 64_000),
        # page_duration 1 us: each Opus packet (20 ms) closes its Ogg page, so nothing waits
        # in the muxer for the next chunk (costs ~27 bytes of page header per packet).
        AudioFormat("opus", "audio/ogg", "ogg", "libopus", 32_000, (("page_duration", "1"),)),
        AudioFormat("aac", "audio/aac", "adts", "aac", 64_000),
        AudioFormat("flac", "audio/flac", "flac", "flac", whole_file=True),
        AudioFormat("wav", "audio/wav", "wav", "pcm_s16le"),
        AudioFormat("pcm", "audio/pcm"),
    )
}


class StreamEncoder:
    """Encodes one response. Headerless PCM (s16le, mono, 24 kHz) unless overridden.

    Call ``encode`` for each chunk and ``finish`` once at the end; ``close`` releases
    resources if the response is abandoned (``finish`` already does).
    """

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt

    def encode(self, audio: np.ndarray) -> bytes:
        """Encode float32 [n] samples in [-1, 1] at 24 kHz; returns the bytes ready now
        (possibly b"": codecs work in frames and hold back a partial one)."""
        return to_pcm16(audio) if len(audio) else b""

    def finish(self) -> bytes:
        """Flush the codec and write the container trailer; returns the last bytes."""
        return b""

    def close(self) -> None:
        """Drop the encoder without finishing the file."""


class _Sink:
    """A write-only file object: PyAV treats it as an unseekable stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def take(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


class AvEncoder(StreamEncoder):
    """A container and codec of FFmpeg's, written packet by packet through PyAV.

    Raises:
        av.FFmpegError: FFmpeg cannot open the muxer or encoder (e.g. a build without it).
    """

    def __init__(self, fmt: AudioFormat) -> None:
        super().__init__(fmt)
        assert fmt.container and fmt.codec
        self._sink: _Sink | io.BytesIO = io.BytesIO() if fmt.whole_file else _Sink()
        # flush_packets: hand each muxed packet to the sink at once (no 32 KiB IO buffer);
        # bitexact: no encoder-version tags (a 44-byte WAV header, reproducible files).
        options = {"fflags": "+bitexact", **dict(fmt.options)}
        if not fmt.whole_file:
            options["flush_packets"] = "1"
        self._container = av.open(self._sink, mode="w", format=fmt.container, options=options)
        self._stream = cast(
            av.AudioStream, self._container.add_stream(fmt.codec, rate=SAMPLE_RATE, layout="mono")
        )
        if fmt.bit_rate:
            self._stream.codec_context.bit_rate = fmt.bit_rate
        self._pts = 0
        self._closed = False

    def encode(self, audio: np.ndarray) -> bytes:
        if len(audio):
            frame = audio_frame(audio, self._pts)
            self._pts += len(audio)
            self._container.mux(self._stream.encode(frame))
        return b"" if isinstance(self._sink, io.BytesIO) else self._sink.take()

    def finish(self) -> bytes:
        self._container.mux(self._stream.encode(None))
        self.close()
        if isinstance(self._sink, io.BytesIO):
            return self._sink.getvalue()
        return self._sink.take()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._container.close()


def open_encoder(name: str) -> StreamEncoder:
    """A fresh encoder for ``response_format`` ``name``.

    Raises:
        KeyError: unknown format name (see ``FORMATS``).
    """
    fmt = FORMATS[name]
    return StreamEncoder(fmt) if fmt.container is None else AvEncoder(fmt)
