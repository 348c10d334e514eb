"""A talker GGUF file (our converter's, or the published ones): its hyperparameters and special
ids, and its generation weights copied into ggml CPU backend buffers.

The names and metadata keys are those ``wyoming_qwen3tts.gguf`` writes (see ``gguf.names``).
Every tensor keeps the file's type (F32, F16, BF16, Q8_0, Q4_0): the graphs multiply by them
as they are stored, as qwentts.cpp does (4-bit layer matrices repacked for the tiled
kernels, as there). Left out of the buffers: the speaker encoder (clones
get their x-vector from the wheel, see ``voice_refs``) and the text embedding table (151,936
rows, of which a prompt needs a few dozen: ``prompt`` reads those rows from the file's mapping).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .api import Ggml, InitParams
from .runtime import Backend

_LOGGER = logging.getLogger(__name__)

ARCH = "qwen3-tts"
#: Tensors the buffer leaves out (prefixes / names).
_NOT_LOADED = ("spk_enc.", "talker.text_embd.weight")
#: ``madvise`` advice: transparent huge pages for the weight buffer (Linux ``MADV_HUGEPAGE``);
#: fewer TLB misses when every weight is streamed once a frame (15-25 % faster, issue 50).
MADV_HUGEPAGE = 14


class WeightsError(ValueError):
    """Not a Qwen3-TTS talker GGUF this engine can run (message names the file and why)."""


@dataclass(frozen=True)
class Stack:
    """One transformer stack's shape (the talker's or the code predictor's).

    Attributes:
        hidden: width; ffn: MLP width; layers: block count; heads / kv_heads: attention heads
        (grouped queries: ``heads // kv_heads`` query heads share one key/value head);
        head_dim: per head; vocab: output ids; rope_theta: RoPE base; eps: RMSNorm epsilon.
    """

    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float
    eps: float


@dataclass(frozen=True)
class Specials:
    """The model's special ids (codec ids are talker vocabulary ids; text ids are the text
    tokenizer's)."""

    codec_pad: int
    codec_bos: int
    codec_eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int
    tts_pad: int
    tts_bos: int
    tts_eos: int


class TalkerFile:
    """A talker GGUF's metadata and tensor table (the file stays mapped, read-only).

    Attributes:
        path: the file; model_type: "base", "custom_voice" or "voice_design"; model_size:
        the checkpoint's ``tts_model_size`` ("0b6", "1b7"); talker, predictor: ``Stack``s;
        groups: codebooks a frame (16); specials: ``Specials``; languages: name -> codec id;
        speakers: name -> (codec id, dialect or ""); tokens, merges: the text tokenizer's
        vocabulary by id and BPE merges.

    Raises:
        WeightsError: unreadable, another architecture, or a key or tensor missing.
    """

    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self.path = path
        try:
            self.reader = GGUFReader(str(path))
            if self._text("general.architecture") != ARCH:
                raise WeightsError(f"{path} is not a {ARCH} talker GGUF")
            self.model_type = self._text(f"{ARCH}.model_type")
            self.model_size = self._text(f"{ARCH}.model_size")
            self.talker = self._stack("talker")
            self.predictor = self._stack("code_pred")
            self.groups = self._int(f"{ARCH}.num_code_groups")
            c, t = f"{ARCH}.codec.", f"{ARCH}.text."
            self.specials = Specials(
                self._int(c + "pad_id"), self._int(c + "bos_id"), self._int(c + "eos_id"), self._int(c + "think_id"),
                self._int(c + "nothink_id"), self._int(c + "think_bos_id"), self._int(c + "think_eos_id"),
                self._int(t + "tts_pad_id"), self._int(t + "tts_bos_id"), self._int(t + "tts_eos_id"),
            )
            self.languages = dict(zip(self._texts(c + "language_names"), self._ints(c + "language_ids")))
            self.speakers: dict[str, tuple[int, str]] = {}
            if c + "speaker_names" in self.reader.fields:
                names = self._texts(c + "speaker_names")
                dialects = self._texts(c + "speaker_dialects") if c + "speaker_dialects" in self.reader.fields else []
                for i, (name, sid) in enumerate(zip(names, self._ints(c + "speaker_ids"))):
                    self.speakers[name.lower()] = (sid, dialects[i] if i < len(dialects) else "")
            self.tokens = self._texts("tokenizer.ggml.tokens")
            self.merges = self._texts("tokenizer.ggml.merges")
            self.tensors = {t.name: t for t in self.reader.tensors}
        except WeightsError:
            raise
        except Exception as err:  # noqa: BLE001 - the reader raises many types on a bad file
            raise WeightsError(f"{path} is not a Qwen3-TTS talker GGUF this engine reads: {err!r}") from err

    # --- metadata ------------------------------------------------------------------------

    def _field(self, key: str) -> Any:
        try:
            return self.reader.fields[key]
        except KeyError:
            raise WeightsError(f"{self.path} lacks the metadata key {key!r}") from None

    def _text(self, key: str) -> str:
        f = self._field(key)
        return bytes(f.parts[f.data[0]]).decode()

    def _texts(self, key: str) -> list[str]:
        f = self._field(key)
        return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]

    def _int(self, key: str) -> int:
        f = self._field(key)
        return int(f.parts[f.data[0]][0])

    def _ints(self, key: str) -> list[int]:
        f = self._field(key)
        return [int(f.parts[i][0]) for i in f.data]

    def _float(self, key: str) -> float:
        f = self._field(key)
        return float(f.parts[f.data[0]][0])

    def _stack(self, prefix: str) -> Stack:
        p = f"{ARCH}.{prefix}."
        return Stack(
            hidden=self._int(p + "embedding_length"), ffn=self._int(p + "feed_forward_length"),
            layers=self._int(p + "block_count"), heads=self._int(p + "attention.head_count"),
            kv_heads=self._int(p + "attention.head_count_kv"), head_dim=self._int(p + "attention.key_length"),
            vocab=self._int(p + "vocab_size"), rope_theta=self._float(p + "rope.freq_base"),
            eps=self._float(p + "attention.layer_norm_rms_epsilon"),
        )

    # --- tensors -------------------------------------------------------------------------

    def tensor(self, name: str) -> Any:
        """The reader's tensor ``name`` (``.data``: a read-only view of the mapped file).

        Raises:
            WeightsError: the file has no such tensor.
        """
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightsError(f"{self.path} lacks the tensor {name!r}") from None

    def rows(self, name: str, ids: list[int] | np.ndarray) -> np.ndarray:
        """Rows ``ids`` of a matrix tensor (an embedding table), dequantized: float32
        [len(ids), width]. Reads only those rows' pages of the file."""
        from gguf.quants import dequantize

        t = self.tensor(name)
        picked = np.asarray(t.data[np.asarray(ids, dtype=np.int64)])
        return np.asarray(dequantize(picked, t.tensor_type), dtype=np.float32).reshape(len(picked), -1)


class Weights:
    """The generation tensors of a ``TalkerFile`` in ggml CPU backend buffers.

    ``tensor(name)`` gives the ggml tensor (a pointer) by its GGUF name. The layer matrices
    the CPU backend repacks for its tiled kernels (on AVX2: Q4_0 with a row count that is a
    multiple of 8, ggml-cpu ``repack.cpp``) go into its ``CPU_REPACK`` buffer, the rest into a
    plain one: how qwentts.cpp places them. Both buffers are advised to use transparent huge
    pages before the weights are copied in (Linux).

    Args:
        repack: False keeps every tensor in the plain buffer.

    Raises:
        WeightsError: a tensor of a rank or size the graphs do not take.
        MemoryError: a buffer could not be allocated.
    """

    def __init__(self, ggml: Ggml, backend: Backend, file: TalkerFile, repack: bool = True) -> None:
        self._ggml = ggml
        names = [n for n in file.tensors if not n.startswith(_NOT_LOADED)]
        repacked = set()
        if repack and backend.repack_type is not None and ggml.ggml_cpu_has_avx2():
            repacked = {n for n in names if _repackable(file.tensors[n])}
        self._tensors: dict[str, int] = {}
        self._parts: list[tuple[int, int]] = []  # (context, buffer)
        self.nbytes = 0
        self.repacked = len(repacked)
        try:
            for part, buffer_type in (([n for n in names if n not in repacked], backend.buffer_type),
                                      (sorted(repacked), backend.repack_type)):
                if part:
                    self._load(file, part, buffer_type)
        except BaseException:
            self.close()
            raise

    def _load(self, file: TalkerFile, names: list[str], buffer_type: int | None) -> None:
        """Make ``names`` in a context of their own, allocate them in one buffer of
        ``buffer_type``, and copy the file's data in."""
        ggml = self._ggml
        ctx = ggml.ggml_init(InitParams(ggml.ggml_tensor_overhead() * (len(names) + 8), None, True))
        tensors = {}
        for name in names:
            t = file.tensors[name]
            ne = [int(x) for x in t.shape]
            new = {1: ggml.ggml_new_tensor_1d, 2: ggml.ggml_new_tensor_2d, 3: ggml.ggml_new_tensor_3d}.get(len(ne))
            if new is None:
                ggml.ggml_free(ctx)
                raise WeightsError(f"{file.path}: tensor {name} has {len(ne)} dimensions")
            tensor = new(ctx, int(t.tensor_type), *ne)
            ggml.ggml_set_name(tensor, name.encode()[:63])
            if ggml.ggml_nbytes(tensor) != int(t.n_bytes):
                ggml.ggml_free(ctx)
                raise WeightsError(f"{file.path}: tensor {name} holds {t.n_bytes} bytes, ggml expects {ggml.ggml_nbytes(tensor)}")
            tensors[name] = tensor
        buffer = ggml.ggml_backend_alloc_ctx_tensors_from_buft(ctx, buffer_type)
        if not buffer:
            ggml.ggml_free(ctx)
            raise MemoryError(f"no memory for the weights of {file.path.name}")
        self._parts.append((ctx, buffer))
        size = int(ggml.ggml_backend_buffer_get_size(buffer))
        self.nbytes += size
        advise_huge_pages(int(ggml.ggml_backend_buffer_get_base(buffer)), size)
        for name, tensor in tensors.items():
            data = np.ascontiguousarray(file.tensors[name].data)
            ggml.ggml_backend_tensor_set(tensor, data.ctypes.data, 0, data.nbytes)
        self._tensors.update(tensors)

    def tensor(self, name: str) -> int:
        """The ggml tensor ``name``.

        Raises:
            KeyError: no such generation tensor.
        """
        return self._tensors[name]

    def has(self, name: str) -> bool:
        return name in self._tensors

    def close(self) -> None:
        """Free the buffers and the tensors' contexts (the tensors are invalid afterwards)."""
        for ctx, buffer in self._parts:
            self._ggml.ggml_backend_buffer_free(buffer)
            self._ggml.ggml_free(ctx)
        self._parts = []
        self._tensors = {}


def _repackable(tensor: Any) -> bool:
    """A layer matrix that ggml-cpu repacks on AVX2 (``ggml_repack_get_optimal_repack_type``:
    Q4_0 with ``ne[1] % 8 == 0``); only the layers' matrices, which feed products only."""
    from gguf import GGMLQuantizationType

    return (
        tensor.tensor_type == GGMLQuantizationType.Q4_0
        and len(tensor.shape) == 2
        and int(tensor.shape[1]) % 8 == 0
        and ".blk." in tensor.name
    )


def advise_huge_pages(address: int, size: int) -> bool:
    """``madvise(MADV_HUGEPAGE)`` on the whole pages inside [address, address + size); False
    where it is refused or not Linux (nothing else happens then)."""
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    end = (address + size) // page * page
    if end <= start:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    ok = madvise(start, end - start, MADV_HUGEPAGE) == 0
    if not ok:
        _LOGGER.debug("madvise(MADV_HUGEPAGE) refused (errno %d)", ctypes.get_errno())
    return ok
