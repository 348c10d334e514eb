"""The 12 Hz codec's streaming step as an ONNX model (state in, state out), and a runner for
ONNX Runtime's CPU provider: the third racer of ``benchmarks.cpu_limits``. Not a serving path.

    python -m benchmarks.onnx_codec --checkpoint CKPT --out codec.onnx [--frames 1]

The exported graph is ``engine.batched.codec.StreamingDecoder.step`` for one stream: ``codes``
(int64 [1, 16, frames], fixed at export) and the decoder's past in, the PCM of those frames
and the new past out. The past is what ``StreamingDecoder.state()`` holds, one input and one
output per buffer (the output named as its input with ``new_`` before it):

* ``conv_<i>``: float32 [1, channels, context], the last input samples of each stateful
  (causal or transposed) convolution;
* ``key_<l>``, ``value_<l>``: float32 [1, kv_heads, 72, head_dim], the transformer's keys and
  values of its last 72 frames (its sliding window), layer ``l``;
* ``key_pos``: int64 [1, 72], the frame each remembered key belongs to (-1: empty);
* ``frames``: int64 [1], frames decoded so far.

A fresh stream starts from zeros, ``key_pos`` from -1 (``OnnxStreamingDecoder`` does this).
The export goes through ``torch.export`` (the dynamo exporter), which turns the decoder's
in-place updates of its past into the new-state outputs; it needs the ``onnx`` and
``onnxscript`` packages, the runner ``onnxruntime``. The export itself is the server's
(``wyoming_qwen3tts.engine.cpu.onnx_export``, which the pipeline engine runs at its first start);
this runner also takes several frames a call (``--frames``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from wyoming_qwen3tts.engine.cpu.onnx_export import OPSET, export_step, streaming_step_module  # noqa: F401 - re-exported


def export(decoder: Any, out: Path, frames: int = 1) -> Path:
    """Write the streaming step of ``frames`` frames a call to ``out`` (ONNX, weights inside):
    ``wyoming_qwen3tts.engine.cpu.onnx_export.export_step``, which the server's pipeline engine
    exports (one frame a call) into its data folder.

    Args:
        decoder: the loaded float32 ``Qwen3TTSTokenizerV2Decoder`` on the CPU.
        out: the ``.onnx`` file to write.
        frames: codec frames a call (fixed in the graph).

    Returns:
        ``out``.
    """
    return export_step(decoder, out, frames)


class OnnxStreamingDecoder:
    """Decode one stream frame by frame with ONNX Runtime's CPU provider, keeping its past.

    Args:
        model: an ``export``-ed ``.onnx`` file.
        threads: ``intra_op_num_threads`` (inter-op: 1).
    """

    def __init__(self, model: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        inputs = self.session.get_inputs()
        #: Frames a call, fixed by the export.
        self.frames = int(inputs[0].shape[-1])
        self._fresh = {
            i.name: np.full(i.shape, -1 if i.name == "key_pos" else 0,
                            dtype=np.int64 if "int64" in i.type else np.float32)
            for i in inputs[1:]
        }
        self._outputs = [o.name for o in self.session.get_outputs()]
        self.state = dict(self._fresh)

    def reset(self) -> None:
        """Start a new stream."""
        self.state = dict(self._fresh)

    def step(self, codes: np.ndarray) -> np.ndarray:
        """Decode the next ``frames`` frames.

        Args:
            codes: int [16, frames], codebook ids in [0, 2048).

        Returns:
            float32 PCM [frames * 1920] in [-1, 1].

        Raises:
            onnxruntime's ``InvalidArgument`` where ``codes`` holds another number of frames.
        """
        result = self.session.run(self._outputs, {"codes": codes[None].astype(np.int64), **self.state})
        self.state = {name[len("new_"):]: value for name, value in zip(self._outputs[1:], result[1:], strict=True)}
        return result[0].reshape(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a Qwen3-TTS checkpoint folder")
    parser.add_argument("--out", type=Path, required=True, help="the .onnx file to write")
    parser.add_argument("--frames", type=int, default=1, help="codec frames a call")
    args = parser.parse_args()
    import torch
    from qwen_tts import Qwen3TTSModel

    qwen = Qwen3TTSModel.from_pretrained(str(args.checkpoint), device_map="cpu", dtype=torch.float32)
    print(export(qwen.model.speech_tokenizer.model.decoder, args.out, args.frames))


if __name__ == "__main__":
    main()
