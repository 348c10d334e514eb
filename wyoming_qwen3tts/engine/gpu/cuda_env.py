"""What the CUDA set-up allows: a driver new enough for this torch build, and a weight dtype.

PyPI's default torch wheels are built for CUDA 13, which needs an NVIDIA driver of the 580
series or newer; with an older driver ``torch.cuda.is_available()`` is just False and the
server would fall back to the slow CPU path without saying why. GPUs before Ampere
(GTX 10xx, RTX 20xx, T4; compute capability below 8.0) have no bfloat16 arithmetic.
"""

from __future__ import annotations

import ctypes
import logging

_LOGGER = logging.getLogger(__name__)

#: The command that installs torch built for CUDA 12.8 (drivers 570 and newer), as the README shows.
CUDA12_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cu128"
#: The image's build argument that picks the same build.
CUDA12_IMAGE_ARG = "--build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128"


def parse_cuda_version(text: str | None) -> tuple[int, int] | None:
    """``"13.0"`` -> (13, 0); None or unparsable -> None."""
    if not text:
        return None
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def driver_cuda_version() -> tuple[int, int] | None:
    """The newest CUDA version the installed NVIDIA driver supports (``cuDriverGetVersion``
    of libcuda, read without initialising CUDA), or None without a driver."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
        return None
    return version.value // 1000, (version.value % 1000) // 10


def driver_problem(driver: tuple[int, int] | None, torch_cuda: tuple[int, int] | None) -> str | None:
    """One line explaining that the driver is too old for this torch build, or None.

    CUDA's minor-version compatibility lets a driver of CUDA ``X.y`` run any build for
    ``X.z``; a build for a newer major version needs a newer driver.

    Args:
        driver: ``driver_cuda_version()``.
        torch_cuda: ``parse_cuda_version(torch.version.cuda)`` (None: a CPU-only build).
    """
    if driver is None or torch_cuda is None or driver[0] >= torch_cuda[0]:
        return None
    return (
        f"The NVIDIA driver supports CUDA up to {driver[0]}.{driver[1]}, but this torch is built "
        f"for CUDA {torch_cuda[0]}.{torch_cuda[1]}, so the GPU is not used. Update the driver "
        f"(580 or newer for CUDA 13), or install torch built for CUDA 12: `{CUDA12_INSTALL}` "
        f"(image: `{CUDA12_IMAGE_ARG}`)"
    )


def check_driver() -> str | None:
    """``driver_problem`` for this machine (logs nothing; the caller decides)."""
    import torch

    return driver_problem(driver_cuda_version(), parse_cuda_version(torch.version.cuda))


def pick_dtype(requested: str, device: str, bf16_supported: bool) -> tuple[str, str | None]:
    """The weight dtype, and a line for the log when ``auto`` had to choose float16.

    Args:
        requested: ``--dtype`` ("auto", "bfloat16", "float16", "float32").
        device: "cuda" or "cpu".
        bf16_supported: ``torch.cuda.is_bf16_supported(including_emulation=False)``.

    Returns:
        (dtype name, log line or None).

    Raises:
        ValueError: bfloat16 asked for on a GPU without it.
    """
    if device != "cuda":
        return ("float32" if requested == "auto" else requested), None
    if requested == "bfloat16" and not bf16_supported:
        raise ValueError("--dtype bfloat16: this GPU has no bfloat16 arithmetic; use --dtype float16 (or auto)")
    if requested != "auto":
        return requested, None
    if bf16_supported:
        return "bfloat16", None
    return "float16", "This GPU has no bfloat16 arithmetic: weights in float16 (--dtype auto)"


def cuda_bf16_supported() -> bool:
    """Whether the current CUDA device does bfloat16 natively (compute capability 8.0+)."""
    import torch

    return bool(torch.cuda.is_bf16_supported(including_emulation=False))
