"""Speech tempo change without pitch change, for the OpenAI ``speed`` parameter.

Uses FFmpeg's ``atempo`` filter (WSOLA time-stretching) through PyAV's filter graphs, fed
chunk by chunk so speed-changed audio still streams. One ``atempo`` stage is used for
factors in [0.5, 2.0]; factors outside that range run through a chain of equal stages,
each inside it (e.g. 4.0 = 2.0 x 2.0, 0.25 = 0.5 x 0.5), which keeps quality even.
"""

from __future__ import annotations

import math
from fractions import Fraction

import av
import av.filter
import numpy as np

from .encoders import audio_frame
from ...common.audio import SAMPLE_RATE

#: Accepted tempo factors (OpenAI's range for ``speed``).
MIN_SPEED = 0.25
MAX_SPEED = 4.0

_EMPTY = np.zeros(0, dtype=np.float32)


def stage_factors(speed: float) -> list[float]:
    """The ``atempo`` factors whose product is ``speed``, each within [0.5, 2.0].

    Returns [] for 1.0 (no filter needed).
    """
    if speed == 1.0:
        return []
    stages = max(1, math.ceil(abs(math.log2(speed)) - 1e-9))
    return [speed ** (1.0 / stages)] * stages


class Tempo:
    """Streams float32 [n] mono 24 kHz audio through a tempo change of ``speed``.

    Output duration is input duration / ``speed`` (to within a few milliseconds over the
    stream); pitch is unchanged. The filter holds back up to about one chunk while it
    fills its analysis window; ``finish`` returns what is left.

    Raises:
        ValueError: ``speed`` outside [``MIN_SPEED``, ``MAX_SPEED``].
    """

    def __init__(self, speed: float) -> None:
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, not {speed}")
        self.speed = speed
        self._graph: av.filter.Graph | None = None
        self._pts = 0
        factors = stage_factors(speed)
        if not factors:
            return
        graph = av.filter.Graph()
        node = graph.add_abuffer(
            format="flt", sample_rate=SAMPLE_RATE, layout="mono", time_base=Fraction(1, SAMPLE_RATE)
        )
        for factor in factors:
            stage = graph.add("atempo", f"{factor:.6f}")
            node.link_to(stage)
            node = stage
        sink = graph.add("abuffersink")
        node.link_to(sink)
        graph.configure()
        self._graph = graph

    def process(self, audio: np.ndarray) -> np.ndarray:
        """Feed a chunk; returns the float32 [m] samples ready now (m may be 0)."""
        if self._graph is None:
            return audio
        if not len(audio):
            return _EMPTY
        frame = audio_frame(audio, self._pts)
        self._pts += len(audio)
        self._graph.push(frame)
        return self._pull()

    def finish(self) -> np.ndarray:
        """End of input: returns the held-back float32 [m] samples."""
        if self._graph is None:
            return _EMPTY
        self._graph.push(None)
        return self._pull()

    def _pull(self) -> np.ndarray:
        assert self._graph is not None
        out: list[np.ndarray] = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            out.append(frame.to_ndarray().reshape(-1).astype(np.float32, copy=False))
        return np.concatenate(out) if out else _EMPTY
