"""A frame's Gumbel noise in one kernel: ``sampling.gumbel`` for every draw of the frame.

A frame's draws are the first codebook of the next frame (stream 0, counter ``frame + 1``)
and codebooks 2..16 of this frame (streams 1..15, counter ``frame``). The hash is the same
integer arithmetic as ``sampling.uniform`` (exact), and ``tl.log`` of float32 compiles to
CUDA's precise ``logf`` (no ``lg2.approx`` in its PTX on sm_90), the function ``torch.log``
runs on CUDA, so the noise, and hence every draw, is the eager sampler's. (Under Triton's interpreter the logarithm is NumPy's, which may differ from
PyTorch's in the last bit.) Eager PyTorch needs about forty elementwise kernels for it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..sampling import CANDIDATES, gumbel
from . import launcher
from .pdl_gate import gate


def frame_noise_eager(seed: torch.Tensor, frame: torch.Tensor, draws: int) -> torch.Tensor:
    """Eager form of ``frame_noise``."""
    streams = torch.arange(draws, device=seed.device)
    counters = (frame[:, None] + (streams == 0)).expand(seed.shape[0], draws)
    return gumbel(seed, counters, streams)


@triton.jit
def _mul32(x, k: tl.constexpr):
    return (x * (k & 0xFFFF) + (((x * (k >> 16)) & 0xFFFF) << 16)) & 0xFFFFFFFF


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


@triton.jit
def _frame_noise_kernel(seed_ptr, frame_ptr, out_ptr, DRAWS: tl.constexpr, K: tl.constexpr, PDL: tl.constexpr):
    gate(PDL)
    row = tl.program_id(0)
    stream = tl.program_id(1).to(tl.int64)
    seed = tl.load(seed_ptr + row).to(tl.int64)
    counter = tl.load(frame_ptr + row).to(tl.int64) + (stream == 0).to(tl.int64)
    s_lo = seed & 0xFFFFFFFF
    s_hi = (seed >> 32) & 0x3FFFFFFF
    key = _mix32(s_lo ^ _mix32(s_hi ^ _mix32((counter & 0xFFFFFFFF) ^ _mix32(stream + 0x632BE5AB))))
    rank = tl.arange(0, K).to(tl.int64)
    bits = _mix32(_mix32(key ^ rank) ^ 0x9E3779B9)
    u = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / (1 << 24))
    g = -tl.log(-tl.log(u))
    tl.store(out_ptr + (row * DRAWS + stream) * K + tl.arange(0, K), g)


def frame_noise(seed: torch.Tensor, frame: torch.Tensor, draws: int) -> torch.Tensor:
    """The Gumbel noise of one frame's draws, float32 [B, draws, CANDIDATES].

    Args:
        seed: int64 [B], the rows' seeds; frame: int64 [B], each row's frame index.
        draws: draws per frame (``num_code_groups``: the talker token, then 15 codebooks).
    """
    b = seed.shape[0]
    out = torch.empty((b, draws, CANDIDATES), dtype=torch.float32, device=seed.device)
    launcher(_frame_noise_kernel, seed)[(b, draws)](seed, frame, out, DRAWS=draws, K=CANDIDATES)
    return out
