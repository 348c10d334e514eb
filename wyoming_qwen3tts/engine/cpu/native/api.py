"""The ggml C API that the qwentts.cpp wheel bundles, declared through ``ctypes`` and checked.

realtimetts-qwen-native-cpu 0.4.2 ships ``libggml-base.so.0`` and ``libggml-cpu.so.0`` (ggml
0.17.0, build ``c044c6f``: what their ``ggml_version()`` and ``ggml_commit()`` return), which
export ggml's whole public C API. This module declares exactly the functions the generation
graphs use, every one with its argument and result types as ggml 0.17.0's headers give them
(``include/ggml.h``, ``ggml-alloc.h``, ``ggml-backend.h``, ``ggml-cpu.h``): an undeclared pointer
would pass as a 32-bit int and crash, and every op takes the context first.

``load()`` checks, before anything is used, that every declared symbol is there and that the
library is the ggml version and build declared here (``GGML_VERSION``, ``GGML_COMMIT``): a
struct or signature of another version could corrupt memory silently. Anything else raises
``GgmlApiError``, whose message is one log line saying why; the engine is then not offered.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
from ctypes import POINTER, c_bool, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint8, c_uint32, c_void_p
from pathlib import Path
from typing import Any

#: The ggml the declarations are written for: ``ggml_version()`` and ``ggml_commit()`` of the
#: libraries in realtimetts-qwen-native-cpu 0.4.2 (the version pinned in pyproject.toml).
GGML_VERSION = "0.17.0"
GGML_COMMIT = "c044c6f"
#: The wheel's Python package, whose ``lib/`` folder holds the libraries.
WHEEL_PACKAGE = "qwentts_cpp_cpu"

# ggml_type values (ggml.h ``enum ggml_type``)
F32, F16, Q4_0, Q8_0, I32, BF16 = 0, 1, 2, 8, 26, 30
TYPE_NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q8_0: "Q8_0", I32: "I32", BF16: "BF16"}
#: ``ggml_rope_ext`` mode: GPT-NeoX rotation (halves, as transformers' ``rotate_half``).
ROPE_NEOX = 2
#: ``enum ggml_status`` success.
STATUS_SUCCESS = 0
#: ggml.h ``GGML_MAX_N_THREADS`` (the size of ``ggml_threadpool_params.cpumask``).
MAX_N_THREADS = 512


class GgmlApiError(RuntimeError):
    """The bundled ggml cannot be used: missing library or symbol, or another version.
    The message is one line for the log."""


class InitParams(ctypes.Structure):
    """``struct ggml_init_params`` (passed by value to ``ggml_init``)."""

    _fields_ = [("mem_size", c_size_t), ("mem_buffer", c_void_p), ("no_alloc", c_bool)]


class ThreadpoolParams(ctypes.Structure):
    """``struct ggml_threadpool_params`` (filled by ``ggml_threadpool_params_init``)."""

    _fields_ = [
        ("cpumask", c_bool * MAX_N_THREADS),
        ("n_threads", c_int),
        ("prio", c_int),
        ("poll", c_uint32),
        ("strict_cpu", c_bool),
        ("paused", c_bool),
    ]


class GgufInitParams(ctypes.Structure):
    """``struct gguf_init_params`` (passed by value to ``gguf_init_from_file``)."""

    _fields_ = [("no_alloc", c_bool), ("ctx", c_void_p)]


# gguf_type values (gguf.h ``enum gguf_type``)
GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9


class TensorHead(ctypes.Structure):
    """The first fields of ``struct ggml_tensor`` (type, buffer, ne, nb), read for shapes only."""

    _fields_ = [("type", c_int), ("buffer", c_void_p), ("ne", c_int64 * 4), ("nb", c_size_t * 4)]


#: ``ggml_abort_callback`` (ggml.h): asked between a graph's nodes; true stops the graph.
ABORT_CALLBACK = ctypes.CFUNCTYPE(c_bool, c_void_p)
#: ``enum ggml_status`` of a graph stopped by its abort callback.
STATUS_ABORTED = 1

_P = c_void_p  # every ggml object (context, tensor, graph, backend, buffer, allocator) by pointer
_I64 = c_int64

#: Functions of libggml-base: name -> (result type, argument types).
BASE: dict[str, tuple[Any, list[Any]]] = {
    "ggml_version": (c_char_p, []),
    "ggml_commit": (c_char_p, []),
    "ggml_init": (_P, [InitParams]),
    "ggml_free": (None, [_P]),
    "ggml_tensor_overhead": (c_size_t, []),
    "ggml_graph_overhead_custom": (c_size_t, [c_size_t, c_bool]),
    "ggml_nbytes": (c_size_t, [_P]),
    "ggml_new_tensor_1d": (_P, [_P, c_int, _I64]),
    "ggml_new_tensor_2d": (_P, [_P, c_int, _I64, _I64]),
    "ggml_new_tensor_3d": (_P, [_P, c_int, _I64, _I64, _I64]),
    "ggml_set_name": (_P, [_P, c_char_p]),
    "ggml_set_input": (None, [_P]),
    "ggml_set_output": (None, [_P]),
    # ops: the context first
    "ggml_add": (_P, [_P, _P, _P]),
    "ggml_mul": (_P, [_P, _P, _P]),
    "ggml_rms_norm": (_P, [_P, _P, c_float]),
    "ggml_mul_mat": (_P, [_P, _P, _P]),
    "ggml_silu": (_P, [_P, _P]),
    "ggml_swiglu_split": (_P, [_P, _P, _P]),
    "ggml_diag_mask_inf": (_P, [_P, _P, c_int]),
    "ggml_soft_max_ext": (_P, [_P, _P, _P, c_float, c_float]),
    "ggml_rope_ext": (_P, [_P, _P, _P, _P, c_int, c_int, c_int, c_float, c_float, c_float, c_float, c_float, c_float]),
    "ggml_get_rows": (_P, [_P, _P, _P]),
    "ggml_concat": (_P, [_P, _P, _P, c_int]),
    "ggml_cpy": (_P, [_P, _P, _P]),
    "ggml_cont": (_P, [_P, _P]),
    "ggml_reshape_2d": (_P, [_P, _P, _I64, _I64]),
    "ggml_reshape_3d": (_P, [_P, _P, _I64, _I64, _I64]),
    "ggml_view_1d": (_P, [_P, _P, _I64, c_size_t]),
    "ggml_view_2d": (_P, [_P, _P, _I64, _I64, c_size_t, c_size_t]),
    "ggml_view_3d": (_P, [_P, _P, _I64, _I64, _I64, c_size_t, c_size_t, c_size_t]),
    "ggml_permute": (_P, [_P, _P, c_int, c_int, c_int, c_int]),
    "ggml_transpose": (_P, [_P, _P]),
    "ggml_new_graph_custom": (_P, [_P, c_size_t, c_bool]),
    "ggml_build_forward_expand": (None, [_P, _P]),
    "ggml_threadpool_params_init": (None, [POINTER(ThreadpoolParams), c_int]),
    # GGUF files (gguf.h): metadata and tensor table; the getters abort on a wrong type, so
    # callers check ``gguf_get_kv_type`` / ``gguf_get_arr_type`` first
    "gguf_init_from_file": (_P, [c_char_p, GgufInitParams]),
    "gguf_free": (None, [_P]),
    "gguf_find_key": (_I64, [_P, c_char_p]),
    "gguf_get_kv_type": (c_int, [_P, _I64]),
    "gguf_get_arr_type": (c_int, [_P, _I64]),
    "gguf_get_val_u32": (c_uint32, [_P, _I64]),
    "gguf_get_val_i32": (c_int32, [_P, _I64]),
    "gguf_get_val_f32": (c_float, [_P, _I64]),
    "gguf_get_val_bool": (c_bool, [_P, _I64]),
    "gguf_get_val_str": (c_char_p, [_P, _I64]),
    "gguf_get_arr_n": (c_size_t, [_P, _I64]),
    "gguf_get_arr_data": (_P, [_P, _I64]),
    "gguf_get_arr_str": (c_char_p, [_P, _I64, c_size_t]),
    "gguf_get_data_offset": (c_size_t, [_P]),
    "gguf_get_n_tensors": (_I64, [_P]),
    "gguf_get_tensor_name": (c_char_p, [_P, _I64]),
    "gguf_get_tensor_type": (c_int, [_P, _I64]),
    "gguf_get_tensor_ne": (POINTER(c_int64), [_P, _I64]),
    "gguf_get_tensor_offset": (c_size_t, [_P, _I64]),
    "gguf_get_tensor_size": (c_size_t, [_P, _I64]),
    # backend: buffers, tensor data, graph allocation and compute
    "ggml_backend_cpu_buffer_type": (_P, []),
    "ggml_backend_buft_name": (c_char_p, [_P]),
    "ggml_backend_reg_dev_get": (_P, [_P, c_size_t]),
    "ggml_backend_reg_get_proc_address": (_P, [_P, c_char_p]),
    "ggml_backend_alloc_ctx_tensors": (_P, [_P, _P]),
    "ggml_backend_alloc_ctx_tensors_from_buft": (_P, [_P, _P]),
    "ggml_backend_buffer_get_base": (_P, [_P]),
    "ggml_backend_buffer_get_size": (c_size_t, [_P]),
    "ggml_backend_buffer_clear": (None, [_P, c_uint8]),
    "ggml_backend_buffer_free": (None, [_P]),
    "ggml_backend_tensor_set": (None, [_P, c_void_p, c_size_t, c_size_t]),
    "ggml_backend_tensor_get": (None, [_P, c_void_p, c_size_t, c_size_t]),
    "ggml_backend_graph_compute": (c_int, [_P, _P]),
    "ggml_backend_free": (None, [_P]),
    "ggml_gallocr_new": (_P, [_P]),
    "ggml_gallocr_alloc_graph": (c_bool, [_P, _P]),
    "ggml_gallocr_free": (None, [_P]),
}

#: Functions of libggml-cpu (the CPU backend and its thread pool).
CPU: dict[str, tuple[Any, list[Any]]] = {
    "ggml_cpu_has_avx2": (c_int, []),
    "ggml_backend_cpu_reg": (_P, []),
    "ggml_backend_cpu_init": (_P, []),
    "ggml_backend_cpu_set_n_threads": (None, [_P, c_int]),
    "ggml_backend_cpu_set_threadpool": (None, [_P, _P]),
    "ggml_backend_cpu_set_abort_callback": (None, [_P, ABORT_CALLBACK, c_void_p]),
    "ggml_threadpool_new": (_P, [POINTER(ThreadpoolParams)]),
    "ggml_threadpool_free": (None, [_P]),
}


#: ``ggml_backend_dev_get_extra_bufts_t`` (ggml-backend.h), a function the CPU backend's
#: registry hands out by name: the device's extra buffer types, a NULL-terminated array.
DEV_GET_EXTRA_BUFTS = ctypes.CFUNCTYPE(POINTER(c_void_p), c_void_p)
#: The CPU backend's buffer type that repacks weights for its tiled kernels (ggml-cpu
#: ``repack.cpp``: on AVX2, Q4_0 matrices whose row count is a multiple of 8).
REPACK_BUFFER_TYPE = "CPU_REPACK"


class Ggml:
    """The declared functions of both libraries, as attributes (``ggml.ggml_add(ctx, a, b)``).

    Made by ``load()`` only, after its checks.

    Attributes:
        version: ``ggml_version()``; commit: ``ggml_commit()``; folder: the libraries' folder.
    """

    def __init__(self, base: ctypes.CDLL, cpu: ctypes.CDLL, folder: Path) -> None:
        for table, lib in ((BASE, base), (CPU, cpu)):
            for name in table:
                setattr(self, name, getattr(lib, name))
        self.version: str = base.ggml_version().decode()
        self.commit: str = base.ggml_commit().decode()
        self.folder = folder
        # keep the libraries loaded as long as this object lives
        self._libs = (base, cpu)

    def __getattr__(self, name: str) -> Any:  # the declared functions, for the type checker
        raise AttributeError(f"ggml function {name!r} is not declared in {__name__}")

    @staticmethod
    def head(tensor: int) -> TensorHead:
        """Type, ne and nb of a tensor (ggml ``ne[0]`` is the innermost dimension)."""
        return TensorHead.from_address(tensor)


def wheel_folder() -> Path:
    """The folder of the wheel's bundled libraries (``qwentts_cpp_cpu/lib``), found without
    importing the package.

    Raises:
        GgmlApiError: the wheel is not installed.
    """
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GgmlApiError(f"the qwentts.cpp wheel ({WHEEL_PACKAGE}, realtimetts-qwen-native-cpu) is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def library_paths(folder: Path) -> tuple[Path, Path]:
    """(libggml-base, libggml-cpu) in ``folder`` by this platform's names."""
    if sys.platform == "darwin":
        return folder / "libggml-base.dylib", folder / "libggml-cpu.dylib"
    if sys.platform == "win32":
        return folder / "ggml-base.dll", folder / "ggml-cpu.dll"
    return folder / "libggml-base.so.0", folder / "libggml-cpu.so.0"


def _declare(lib: ctypes.CDLL, table: dict[str, tuple[Any, list[Any]]], path: Path) -> None:
    missing = [name for name in table if not hasattr(lib, name)]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise GgmlApiError(f"{path} lacks the ggml function(s) {', '.join(missing[:3])}{more}: not the ggml {GGML_VERSION} this engine declares")
    for name, (restype, argtypes) in table.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def load_from(base_path: Path, cpu_path: Path) -> Ggml:
    """Load and check two libraries (``load`` uses the wheel's; tests pass others).

    Raises:
        GgmlApiError: a library does not load, lacks a declared symbol, or is another ggml
            version or build than ``GGML_VERSION`` / ``GGML_COMMIT``.
    """
    libs = []
    for path in (base_path, cpu_path):
        try:
            libs.append(ctypes.CDLL(str(path)))
        except OSError as err:
            raise GgmlApiError(f"ggml library {path} does not load: {err}") from err
    base, cpu = libs
    _declare(base, BASE, base_path)
    _declare(cpu, CPU, cpu_path)
    version, commit = base.ggml_version().decode(), base.ggml_commit().decode()
    if (version, commit) != (GGML_VERSION, GGML_COMMIT):
        raise GgmlApiError(
            f"{base_path} is ggml {version} (build {commit}); this engine's declarations are for ggml "
            f"{GGML_VERSION} (build {GGML_COMMIT}, realtimetts-qwen-native-cpu 0.4.2)"
        )
    return Ggml(base, cpu, base_path.parent)


_LOADED: Ggml | None = None
_LOCK = threading.Lock()


def load() -> Ggml:
    """The wheel's ggml, loaded and checked once per process, on a CPU that can run it.

    Raises:
        GgmlApiError: see ``load_from``; or the wheel is not installed, or the CPU lacks the
            instructions it is built for (``engine.cpu.ggml.native_support``: its AVX2 code
            would crash the process, so this is checked before the library is loaded).
    """
    global _LOADED
    with _LOCK:
        if _LOADED is None:
            from ..ggml import native_support

            supported, why = native_support()
            if not supported:
                raise GgmlApiError(why)
            _LOADED = load_from(*library_paths(wheel_folder()))
        return _LOADED
