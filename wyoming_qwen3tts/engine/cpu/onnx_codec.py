"""The codec decoder on ONNX Runtime's CPU provider: codec frames in, PCM out, one stream's
past kept per ``CodecStream``.

The exported streaming step (``onnx_export``) takes one frame's 16 codes and the decoder's
past (its convolutions' last input samples, the transformer's keys and values of its last 72
frames, their positions, the frame count: 5.3 MB a stream for the released codec) and gives
the frame's 1920 samples and the new past. ``OnnxCodec`` holds one ONNX Runtime session (the
weights, once) on its own intra-op threads; each stream decodes through its own
``CodecStream``, which holds its past between calls. One session serves every stream of an
engine, from one thread at a time (the engine's codec thread).

On 2 vCPUs of this project's VM the step took 90 ms a frame on one thread and 68 ms on two,
against 156 / 107 ms for PyTorch's ``StreamingDecoder`` and 308 / 160 ms for qwentts.cpp's
codec (``benchmarks/results/cpu-2core/limits.md``, quiet machine; ONNX Runtime's MLAS used
AVX-512 there).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from ...common.audio import SAMPLES_PER_FRAME

_LOGGER = logging.getLogger(__name__)

#: Codebooks of a codec frame (the 12 Hz codec's residual quantizers).
CODEBOOKS = 16


def onnxruntime_support() -> tuple[bool, str]:
    """Whether ONNX Runtime's CPU provider loads here and the exporter's packages (``onnx``,
    ``onnxscript``, for the first start) are installed (found, not imported: 1 s and their
    memory spared where the export exists), and why not (one line for the log)."""
    from importlib.util import find_spec

    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
    except Exception as err:  # noqa: BLE001 - not installed, a broken wheel, a missing libc: all "no"
        return False, f"ONNX Runtime does not load: {err}"
    if "CPUExecutionProvider" not in providers:
        return False, f"ONNX Runtime {onnxruntime.__version__} has no CPU provider ({', '.join(providers)})"
    for name in ("onnx", "onnxscript"):
        if find_spec(name) is None:
            return False, f"the ONNX exporter's {name} package is not installed"
    return True, f"ONNX Runtime {onnxruntime.__version__} loads"


class OnnxCodec:
    """One ONNX Runtime session of the exported streaming step, on its own threads.

    Args:
        model: an ``onnx_export``-ed ``.onnx`` file (one frame a call).
        threads: ONNX Runtime's intra-op threads (the calling thread is one of them); inter-op: 1.

    Attributes:
        threads: the intra-op threads.
        samples_per_frame: PCM samples a frame gives (1920 at 24 kHz).

    Raises:
        onnxruntime's errors: the file cannot be opened (``onnx_export.usable`` says why first).
        ValueError: the file is not a one-frame streaming step.
    """

    def __init__(self, model: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # The pool's threads spin within a run but stop at its end, so that between frames
        # they leave the generation thread's core alone (two sessions' spinning pools slowed
        # each other's runs by up to 2x in ``benchmarks.cpu_generation_probe``).
        options.add_session_config_entry("session.force_spinning_stop", "1")
        self.session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self.threads = threads
        inputs = self.session.get_inputs()
        if inputs[0].name != "codes" or list(inputs[0].shape) != [1, CODEBOOKS, 1]:
            raise ValueError(f"{model} is not a one-frame codec step (first input {inputs[0].name} {inputs[0].shape})")
        #: A fresh stream's past: zeros, ``key_pos`` -1 (no key remembered yet).
        self._fresh = {
            i.name: np.full(i.shape, -1 if i.name == "key_pos" else 0,
                            dtype=np.int64 if "int64" in i.type else np.float32)
            for i in inputs[1:]
        }
        self._outputs = [o.name for o in self.session.get_outputs()]
        self.samples_per_frame = SAMPLES_PER_FRAME

    def stream(self) -> CodecStream:
        """A new stream, starting from silence (no past)."""
        return CodecStream(self)

    def fresh_state(self) -> dict[str, np.ndarray]:
        """A fresh stream's past (the arrays are shared and never written: the step returns new ones)."""
        return dict(self._fresh)

    def run(self, codes: np.ndarray, state: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One frame: its PCM, float32 [1920] in [-1, 1], and the new past.

        Args:
            codes: int [16], the frame's codebook ids in [0, 2048).
            state: the stream's past (``fresh_state`` or a previous call's).

        Raises:
            ValueError: ``codes`` is not 16 ids.
            onnxruntime's ``InvalidArgument``: an id out of range may be reported so (or not).
        """
        codes = np.asarray(codes, dtype=np.int64).reshape(-1)
        if codes.shape != (CODEBOOKS,):
            raise ValueError(f"a codec frame is {CODEBOOKS} codes, got {codes.shape[0]}")
        result = self.session.run(self._outputs, {"codes": codes.reshape(1, CODEBOOKS, 1), **state})
        new = {name[len("new_"):]: value for name, value in zip(self._outputs[1:], result[1:], strict=True)}
        return np.asarray(result[0], dtype=np.float32).reshape(-1), new


class CodecStream:
    """One stream's decoder: its past between frames, on an ``OnnxCodec``'s session.

    Attributes:
        frames: codec frames decoded so far (an ICL clone's reference frames included).
    """

    def __init__(self, codec: OnnxCodec) -> None:
        self._codec = codec
        self._state = codec.fresh_state()
        self.frames = 0

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """The next frame's PCM: float32 [1920] at 24 kHz in [-1, 1].

        Args:
            codes: int [16], the frame's codebook ids.

        Raises:
            ValueError: ``codes`` is not 16 ids.
        """
        pcm, self._state = self._codec.run(codes, self._state)
        self.frames += 1
        return pcm

    def save(self) -> tuple[dict[str, np.ndarray], int]:
        """The stream's past as it is now (e.g. after an ICL clone's reference codes), to
        ``restore`` into another stream: the arrays are never written in place, so the
        snapshot stays valid."""
        return dict(self._state), self.frames

    def restore(self, saved: tuple[dict[str, np.ndarray], int]) -> None:
        """Continue from a ``save``d past."""
        self._state, self.frames = dict(saved[0]), saved[1]


#: Sessions by (file, threads): the models of one server share one (the codec's weights once,
#: 0.46 GB in float32 for the released codec); ``OnnxCodec.run`` may be called from several
#: threads at once.
_SHARED: dict[tuple[str, int], OnnxCodec] = {}
_SHARED_LOCK = threading.Lock()


def shared_codec(model: Path, threads: int) -> OnnxCodec:
    """The process's ``OnnxCodec`` of ``model`` on ``threads`` intra-op threads (made at the
    first call). Raises as ``OnnxCodec``."""
    key = (str(model.resolve()), threads)
    with _SHARED_LOCK:
        codec = _SHARED.get(key)
        if codec is None:
            codec = _SHARED[key] = OnnxCodec(model, threads)
        return codec
