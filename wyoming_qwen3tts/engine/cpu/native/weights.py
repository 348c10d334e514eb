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

from .api import GGUF_ARRAY, GGUF_FLOAT32, GGUF_INT32, GGUF_STRING, GGUF_UINT32, Q4_0, Ggml, GgufInitParams, InitParams
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


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file.

    Attributes:
        name: its GGUF name; type: its ggml type (``api.F32``, ``api.Q8_0``...); ne: its ggml
        shape, innermost first, without trailing ones (a Linear ``[out, in]`` is ``(in, out)``);
        data: its bytes, uint8 [nbytes], a read-only view of the file's mapping.
    """

    name: str
    type: int
    ne: tuple[int, ...]
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class TalkerFile:
    """A talker GGUF's metadata and tensor table, read with ggml's own GGUF reader (its
    151,936-token vocabulary stays in the C library's strings until ``tokens()`` is asked for;
    the gguf Python package's reader makes a numpy object per token, about 200 MB). The
    file stays mapped read-only for the tensors' data.

    Attributes:
        path: the file; model_type: "base", "custom_voice" or "voice_design"; model_size:
        the checkpoint's ``tts_model_size`` ("0b6", "1b7"); talker, predictor: ``Stack``s;
        groups: codebooks a frame (16); specials: ``Specials``; languages: name -> codec id;
        speakers: name -> (codec id, dialect or ""); tensors: name -> ``TensorInfo``.

    Raises:
        WeightsError: unreadable, another architecture, or a key or tensor missing or of
            another type.
    """

    def __init__(self, ggml: Ggml, path: Path) -> None:
        self.path = path
        self._ggml = ggml
        self._ctx = ggml.gguf_init_from_file(str(path).encode(), GgufInitParams(True, None))
        if not self._ctx:
            raise WeightsError(f"{path} is not a GGUF file ggml reads")
        try:
            self._read()
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        arch = self._text("general.architecture")
        if arch != ARCH:
            raise WeightsError(f"{self.path} is a {arch!r} GGUF, not a {ARCH} talker")
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
        if self._has(c + "speaker_names"):
            names = self._texts(c + "speaker_names")
            dialects = self._texts(c + "speaker_dialects") if self._has(c + "speaker_dialects") else []
            for i, (name, sid) in enumerate(zip(names, self._ints(c + "speaker_ids"))):
                self.speakers[name.lower()] = (sid, dialects[i] if i < len(dialects) else "")
        self._check_key("tokenizer.ggml.tokens", GGUF_ARRAY, GGUF_STRING)
        self._check_key("tokenizer.ggml.merges", GGUF_ARRAY, GGUF_STRING)
        g, ctx = self._ggml, self._ctx
        mapping = np.memmap(self.path, dtype=np.uint8, mode="r")
        base = int(g.gguf_get_data_offset(ctx))
        self.tensors: dict[str, TensorInfo] = {}
        for i in range(int(g.gguf_get_n_tensors(ctx))):
            name = g.gguf_get_tensor_name(ctx, i).decode()
            ne = list(g.gguf_get_tensor_ne(ctx, i)[:4])
            while len(ne) > 1 and ne[-1] == 1:
                ne.pop()
            start = base + int(g.gguf_get_tensor_offset(ctx, i))
            size = int(g.gguf_get_tensor_size(ctx, i))
            if start + size > len(mapping):
                raise WeightsError(f"{self.path}: tensor {name} lies past the end of the file (cut off?)")
            self.tensors[name] = TensorInfo(name, int(g.gguf_get_tensor_type(ctx, i)), tuple(int(x) for x in ne),
                                            mapping[start : start + size])

    # --- metadata ------------------------------------------------------------------------

    def _has(self, key: str) -> bool:
        return int(self._ggml.gguf_find_key(self._ctx, key.encode())) >= 0

    def _check_key(self, key: str, kind: int, item: int | None = None) -> int:
        """The key's id, after checking its type (ggml's getters abort on another type).

        Raises:
            WeightsError: missing, or of another type.
        """
        g = self._ggml
        kid = int(g.gguf_find_key(self._ctx, key.encode()))
        if kid < 0:
            raise WeightsError(f"{self.path} lacks the metadata key {key!r}")
        if int(g.gguf_get_kv_type(self._ctx, kid)) != kind or (item is not None and int(g.gguf_get_arr_type(self._ctx, kid)) != item):
            raise WeightsError(f"{self.path}: metadata key {key!r} is not of the type this engine reads")
        return kid

    def _text(self, key: str) -> str:
        return bytes(self._ggml.gguf_get_val_str(self._ctx, self._check_key(key, GGUF_STRING))).decode()

    def _texts(self, key: str) -> list[str]:
        g, ctx = self._ggml, self._ctx
        kid = self._check_key(key, GGUF_ARRAY, GGUF_STRING)
        return [bytes(g.gguf_get_arr_str(ctx, kid, i)).decode("utf-8", errors="replace") for i in range(int(g.gguf_get_arr_n(ctx, kid)))]

    def _int(self, key: str) -> int:
        g = self._ggml
        kid = int(g.gguf_find_key(self._ctx, key.encode()))
        kind = int(g.gguf_get_kv_type(self._ctx, kid)) if kid >= 0 else None
        if kind == GGUF_UINT32:
            return int(g.gguf_get_val_u32(self._ctx, kid))
        if kind == GGUF_INT32:
            return int(g.gguf_get_val_i32(self._ctx, kid))
        return self._check_key(key, GGUF_UINT32)  # raises: missing, or not a 32-bit integer

    def _ints(self, key: str) -> list[int]:
        g, ctx = self._ggml, self._ctx
        kid = self._check_key(key, GGUF_ARRAY)
        item = {GGUF_INT32: ctypes.c_int32, GGUF_UINT32: ctypes.c_uint32}.get(int(g.gguf_get_arr_type(ctx, kid)))
        if item is None:
            raise WeightsError(f"{self.path}: metadata key {key!r} is not an array of 32-bit integers")
        n = int(g.gguf_get_arr_n(ctx, kid))
        return [int(x) for x in (item * n).from_address(g.gguf_get_arr_data(ctx, kid))] if n else []

    def _float(self, key: str) -> float:
        return float(self._ggml.gguf_get_val_f32(self._ctx, self._check_key(key, GGUF_FLOAT32)))

    def _stack(self, prefix: str) -> Stack:
        p = f"{ARCH}.{prefix}."
        return Stack(
            hidden=self._int(p + "embedding_length"), ffn=self._int(p + "feed_forward_length"),
            layers=self._int(p + "block_count"), heads=self._int(p + "attention.head_count"),
            kv_heads=self._int(p + "attention.head_count_kv"), head_dim=self._int(p + "attention.key_length"),
            vocab=self._int(p + "vocab_size"), rope_theta=self._float(p + "rope.freq_base"),
            eps=self._float(p + "attention.layer_norm_rms_epsilon"),
        )

    def tokens(self) -> list[str]:
        """The text vocabulary by id (``tokenizer.ggml.tokens``)."""
        return self._texts("tokenizer.ggml.tokens")

    def merges(self) -> list[str]:
        """The text tokenizer's BPE merges, "left right" each (``tokenizer.ggml.merges``)."""
        return self._texts("tokenizer.ggml.merges")

    # --- tensors -------------------------------------------------------------------------

    def tensor(self, name: str) -> TensorInfo:
        """The tensor ``name``.

        Raises:
            WeightsError: the file has no such tensor.
        """
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightsError(f"{self.path} lacks the tensor {name!r}") from None

    def rows(self, name: str, ids: list[int] | np.ndarray) -> np.ndarray:
        """Rows ``ids`` of a matrix tensor (an embedding table), dequantized: float32
        [len(ids), ne[0]]. Reads only those rows' pages of the file."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        t = self.tensor(name)
        table = t.data.reshape(t.ne[1], -1)
        picked = np.asarray(table[np.asarray(ids, dtype=np.int64)])
        return np.asarray(dequantize(picked, GGMLQuantizationType(t.type)), dtype=np.float32).reshape(len(picked), t.ne[0])

    def close(self) -> None:
        """Free ggml's copy of the metadata (the tensors' views of the mapping stay valid)."""
        if self._ctx:
            self._ggml.gguf_free(self._ctx)
            self._ctx = None


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
            ne = list(t.ne)
            new = {1: ggml.ggml_new_tensor_1d, 2: ggml.ggml_new_tensor_2d, 3: ggml.ggml_new_tensor_3d}.get(len(ne))
            if new is None:
                ggml.ggml_free(ctx)
                raise WeightsError(f"{file.path}: tensor {name} has {len(ne)} dimensions")
            tensor = new(ctx, t.type, *ne)
            ggml.ggml_set_name(tensor, name.encode()[:63])
            if ggml.ggml_nbytes(tensor) != t.nbytes:
                ggml.ggml_free(ctx)
                raise WeightsError(f"{file.path}: tensor {name} holds {t.nbytes} bytes, ggml expects {ggml.ggml_nbytes(tensor)}")
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
            data = file.tensors[name].data
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


def _repackable(tensor: TensorInfo) -> bool:
    """A layer matrix that ggml-cpu repacks on AVX2 (``ggml_repack_get_optimal_repack_type``:
    Q4_0 with ``ne[1] % 8 == 0``); only the layers' matrices, which feed products only."""
    return tensor.type == Q4_0 and len(tensor.ne) == 2 and tensor.ne[1] % 8 == 0 and ".blk." in tensor.name


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
