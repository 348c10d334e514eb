"""The 12 Hz codec's streaming step as an ONNX file, exported once into the data folder.

The exported graph is ``engine.batched.codec.StreamingDecoder.step`` for one stream and one
codec frame a call: ``codes`` (int64 [1, 16, 1]) and the decoder's past in, the frame's PCM
(float32 [1, 1920]) and the new past out. The past is what ``StreamingDecoder.state()``
holds, one input and one output per buffer (the output named as its input with ``new_``
before it):

* ``conv_<i>``: float32 [1, channels, context], the last input samples of each stateful
  (causal or transposed) convolution;
* ``key_<l>``, ``value_<l>``: float32 [1, kv_heads, 72, head_dim], the transformer's keys and
  values of its last 72 frames (its sliding window), layer ``l``;
* ``key_pos``: int64 [1, 72], the frame each remembered key belongs to (-1: empty);
* ``frames``: int64 [1], frames decoded so far.

A fresh stream starts from zeros, ``key_pos`` from -1 (``onnx_codec.OnnxCodec`` does this).
The export goes through ``torch.export`` (``torch.onnx.export(dynamo=True)``: the TorchScript
exporter fails on ``aten::rms_norm``), which turns the decoder's in-place updates of its past
into the new-state outputs; it needs the ``onnx`` and ``onnxscript`` packages. Equal to the
whole-sequence decode within 6.5e-5 on the 0.6B codec (``benchmarks/results/cpu-2core/
limits.md``; ``tests/test_onnx_codec.py`` checks it on the test checkpoints).

``exported_codec`` keeps one file a codec in ``DATA_DIR/models/onnx-codec/``, named by the
decoder weights' content (``codec_identity``): every model of a release shares one file, a
changed checkpoint gets its own. A file is written under a temporary name and renamed when
complete, so a half-written one is never used; one that ONNX Runtime cannot open (corrupt,
cut short) is exported again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_LOGGER = logging.getLogger(__name__)

#: The ONNX opset the step is written in.
OPSET = 18
#: Bumped when the exported graph's inputs, outputs or arithmetic change: files of another
#: version are not reused (the version is part of the file name).
EXPORT_VERSION = 1
#: The folder under the data folder holding the exported files.
FOLDER = Path("models") / "onnx-codec"
#: Prefix of the decoder's tensors in the speech tokenizer's safetensors file.
DECODER_PREFIX = "decoder."
#: Bytes read at a time while hashing the decoder's weights.
_READ = 16 * 2**20
#: Loggers of the exporter's parts, quiet (errors only) while it runs: its passes log each
#: step at INFO, its registry warns of torchvision's ops, which the codec has none of.
EXPORTER_LOGGERS = ("onnx_ir", "onnxscript", "torch.onnx", "torch.export", "torch._export", "torch.fx")


def state_names(stream: Any) -> list[str]:
    """Input names of a ``StreamingDecoder``'s ``state()`` buffers, in its order."""
    layers = len(stream._keys)
    return ([f"conv_{i}" for i in range(len(stream._conv_state))] + [f"key_{i}" for i in range(layers)]
            + [f"value_{i}" for i in range(layers)] + ["key_pos", "frames"])


def streaming_step_module(decoder: Any) -> Any:
    """A ``torch.nn.Module`` whose ``forward(codes, *state)`` is one ``StreamingDecoder.step``
    of one stream with its past passed in (see the module docstring for the order) and
    returns ``(pcm [1, frames * 1920], *new_state)``. Builds a ``StreamingDecoder`` on
    ``decoder`` (which re-lays out its transformer's weights in place, same values)."""
    import torch

    from ..batched.codec import StreamingDecoder

    class StreamingStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = decoder
            self.stream = StreamingDecoder(decoder, 1, fused=False)
            self.names = state_names(self.stream)

        def initial_state(self) -> list[torch.Tensor]:
            """A fresh stream's past (copies)."""
            return [buffer.clone() for buffer in self.stream.state()]

        def forward(self, codes: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # The stream's buffers become (copies of) the inputs; its step updates them in
            # place, which torch.export turns into the new-state outputs.
            s = self.stream
            past = [t.clone() for t in state]
            conv = len(s._conv_state)
            layers = len(s._keys)
            s._conv_state = dict(zip(s._conv_state, past[:conv], strict=True))
            s._keys = past[conv : conv + layers]
            s._values = past[conv + layers : conv + 2 * layers]
            s._key_pos, s._frames = past[-2], past[-1]
            pcm = s.step(codes)
            return (pcm, *s.state())

    return StreamingStep()


def export_step(decoder: Any, out: Path, frames: int = 1) -> Path:
    """Write the streaming step of ``frames`` codec frames a call to ``out`` (ONNX, weights
    inside the file). Writes ``out`` directly: ``exported_codec`` gives it a temporary name.

    Args:
        decoder: the loaded float32 ``Qwen3TTSTokenizerV2Decoder`` on the CPU
            (``model.speech_tokenizer.model.decoder``).
        out: the ``.onnx`` file to write.
        frames: codec frames a call (fixed in the graph; the engine uses 1).

    Returns:
        ``out``.

    Raises:
        ImportError: ``onnx`` or ``onnxscript`` is not installed.
        torch.onnx.OnnxExporterError: the exporter failed.
    """
    import torch

    step = streaming_step_module(decoder).eval()
    codes = torch.zeros(1, 16, frames, dtype=torch.int64)
    state = step.initial_state()
    names = step.names
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(False), torch.no_grad():
        program = torch.onnx.export(
            step, (codes, *state), dynamo=True, opset_version=OPSET, external_data=False, verbose=False,
            input_names=["codes", *names], output_names=["pcm", *[f"new_{n}" for n in names]],
        )
    program.save(str(out))
    return out


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's own log lines and Python warnings held back (``EXPORTER_LOGGERS`` at
    ERROR) for the block; what native code prints goes to our log at DEBUG (``native_output``)."""
    from ...common.quiet import native_output

    loggers = [logging.getLogger(name) for name in EXPORTER_LOGGERS]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings(), native_output(_LOGGER):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def tokenizer_file(checkpoint: Path) -> Path:
    """The speech tokenizer's weights in a Qwen3-TTS checkpoint folder.

    Raises:
        FileNotFoundError: the folder has no ``speech_tokenizer/model.safetensors``.
    """
    path = checkpoint / "speech_tokenizer" / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} holds no speech tokenizer weights ({path.relative_to(checkpoint)})")
    return path


def checkpoint_decoder(checkpoint: Path) -> Any:
    """The codec decoder of ``checkpoint`` alone, float32 on the CPU: its speech tokenizer
    loaded by qwen_tts (``Qwen3TTSTokenizer``), no talker. ``exported_codec``'s
    ``load_decoder`` where no PyTorch model is loaded otherwise (a frame source on ggml).

    Raises:
        OSError: no readable speech tokenizer in ``checkpoint``.
    """
    import torch

    from ...common.quiet import import_models

    import_models()
    from qwen_tts import Qwen3TTSTokenizer

    tokenizer = Qwen3TTSTokenizer.from_pretrained(str(checkpoint / "speech_tokenizer"), device_map="cpu",
                                                  dtype=torch.float32)
    return tokenizer.model.decoder


def codec_identity(weights: Path) -> str:
    """A hex digest (16 characters) of the codec decoder's weights in the speech tokenizer's
    safetensors file ``weights``: the names, dtypes, shapes and bytes of its ``decoder.*``
    tensors, and ``EXPORT_VERSION``. Equal files give equal digests wherever they lie; the
    encoder's tensors (not exported) do not count.

    Reads the decoder's bytes (about 0.5 GB for the released codec) once per file version: the
    digest is remembered beside the exported files by the file's path, size and modification
    time (``_remembered``).

    Raises:
        OSError: unreadable file. ValueError: not a safetensors file.
    """
    with weights.open("rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise ValueError(f"{weights} is not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", head)
        if size > 100 * 2**20:
            raise ValueError(f"{weights} is not a safetensors file (header of {size} bytes)")
        header = json.loads(handle.read(size))
        base = 8 + size
        digest = hashlib.blake2b(digest_size=8)
        digest.update(f"export {EXPORT_VERSION}\n".encode())
        for name in sorted(k for k in header if k.startswith(DECODER_PREFIX)):
            entry = header[name]
            digest.update(json.dumps([name, entry["dtype"], entry["shape"]]).encode())
            begin, end = entry["data_offsets"]
            handle.seek(base + begin)
            left = end - begin
            while left > 0:
                block = handle.read(min(_READ, left))
                if not block:
                    raise ValueError(f"{weights} is cut short in {name}")
                digest.update(block)
                left -= len(block)
    return digest.hexdigest()


def _remembered(weights: Path, folder: Path) -> str:
    """``codec_identity(weights)``, from ``folder/identities.json`` when the file's path, size
    and modification time are those recorded there (a replaced file is hashed again)."""
    index = folder / "identities.json"
    stat = weights.stat()
    key = f"{weights.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{EXPORT_VERSION}"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if isinstance(known.get(key), str):
        return str(known[key])
    identity = codec_identity(weights)
    known[key] = identity
    try:
        _write_atomically(index, json.dumps(known, indent=1).encode())
    except OSError as err:  # a read-only data folder: hash again next time
        _LOGGER.debug("Could not remember the codec's identity in %s: %s", index, err)
    return identity


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in its folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def usable(model: Path) -> str | None:
    """Why ONNX Runtime cannot use ``model`` as the streaming step (one line), or None when it
    opens and has the step's ``codes`` input of one frame."""
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ORT raises its own types for every kind of bad file
        return f"ONNX Runtime cannot open it ({str(err).splitlines()[0][:200] if str(err) else type(err).__name__})"
    inputs = session.get_inputs()
    if not inputs or inputs[0].name != "codes" or list(inputs[0].shape) != [1, 16, 1]:
        return "its first input is not the step's codes [1, 16, 1]"
    return None


def exported_codec(checkpoint: Path, data_dir: Path, load_decoder: Callable[[], Any]) -> Path:
    """The streaming step of ``checkpoint``'s codec as an ONNX file in ``data_dir``: the one
    exported before for the same decoder weights, or a new export (logged, with its time).

    Args:
        checkpoint: the Qwen3-TTS checkpoint folder (``tokenizer_file`` names its weights).
        data_dir: the server's data folder (``--data-dir``); the file goes into ``FOLDER``.
        load_decoder: returns the loaded float32 decoder on the CPU; called only to export.

    Returns:
        The ``.onnx`` file, complete and openable by ONNX Runtime.

    Raises:
        FileNotFoundError: no speech tokenizer weights in ``checkpoint``.
        ImportError: an export is needed and ``onnx``/``onnxscript`` are missing.
        RuntimeError: the export was written but ONNX Runtime cannot open it.
    """
    from filelock import FileLock

    folder = data_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    identity = _remembered(tokenizer_file(checkpoint), folder)
    target = folder / f"codec-step-v{EXPORT_VERSION}-{identity}.onnx"
    with FileLock(str(folder / f".{target.name}.lock")):  # another server on this folder exports once
        if target.exists():
            why = usable(target)
            if why is None:
                _LOGGER.debug("Codec streaming step: reusing %s", target)
                return target
            _LOGGER.warning("The exported codec %s cannot be used (%s): exporting it again", target, why)
            target.unlink(missing_ok=True)
        for stale in folder.glob(f".{target.stem}.*.onnx.tmp"):  # an export killed midway (we hold the lock)
            stale.unlink(missing_ok=True)
        _LOGGER.info("Exporting the codec's streaming step to ONNX (once per codec; later starts reuse it): %s", target)
        started = time.monotonic()
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".onnx.tmp", dir=folder)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            decoder = load_decoder()
            with _quiet_exporter():
                export_step(decoder, tmp)
            why = usable(tmp)
            if why is not None:
                raise RuntimeError(f"the exported codec step is unusable: {why}")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        _LOGGER.info("Exported the codec's streaming step in %.1f s (%.0f MB)", time.monotonic() - started,
                     target.stat().st_size / 2**20)
        return target


def exported_codec_in_child(checkpoint: Path, data_dir: Path) -> Path:
    """``exported_codec`` for a server that loads no PyTorch model: the file exported before
    for the same decoder weights, else a new export made in a child process
    (``python -m wyoming_qwen3tts.engine.cpu.onnx_export``), so that torch, qwen_tts and the
    decoder's weights (0.5 GB and more resident) never enter the serving process.

    Raises:
        FileNotFoundError: no speech tokenizer weights in ``checkpoint``.
        RuntimeError: the child's export failed (its last error line).
    """
    import subprocess
    import sys

    folder = data_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"codec-step-v{EXPORT_VERSION}-{_remembered(tokenizer_file(checkpoint), folder)}.onnx"
    if target.exists() and usable(target) is None:
        _LOGGER.debug("Codec streaming step: reusing %s", target)
        return target
    _LOGGER.info("Exporting the codec's streaming step to ONNX in a child process (once per codec): %s", target)
    result = subprocess.run([sys.executable, "-m", __name__, str(checkpoint), str(data_dir)],
                            capture_output=True, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        errors = (result.stderr or result.stdout).strip().splitlines()
        raise RuntimeError(f"exporting the codec of {checkpoint} failed: "
                           f"{errors[-1] if errors else f'exit {result.returncode}'}")
    return Path(lines[-1])


def main(argv: list[str] | None = None) -> int:
    """``python -m wyoming_qwen3tts.engine.cpu.onnx_export CHECKPOINT DATA_DIR``: export (or
    find) the codec's streaming step and print its path on the last line of stdout."""
    import argparse

    parser = argparse.ArgumentParser(description="Export a Qwen3-TTS codec's streaming step to ONNX")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("data_dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    print(exported_codec(args.checkpoint, args.data_dir, lambda: checkpoint_decoder(args.checkpoint)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
