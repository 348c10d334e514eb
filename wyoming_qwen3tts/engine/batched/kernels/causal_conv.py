"""A causal convolution continuing a stream's past, as one implicit-GEMM kernel: no
concatenation of the past and the input, no im2col columns.

``conv_products.ConvProduct`` runs the codec decoder's kernel-7 convolutions as one cuBLAS
product over im2col columns ``[B, C * 7, T]``: the past and the input concatenated (one
copy), then the seven taps of every sample copied out (a strided copy seven times the
input). At batch 32 the last decoder block's columns are 83 MB a convolution, written by
PyTorch's generic strided-copy kernel, and the decode's copies cost 1.4 of its 3.7 ms on the
H200 (stop 39's profile: ``elementwise_kernel`` x142 1.06 ms, ``CatArrayBatchedCopy`` x21
0.32 ms).

Here each program computes a tile of ``BLOCK_O`` output channels by ``BLOCK_T`` samples of one
row, summing over the taps and over the input channels in tiles of ``BLOCK_C``
(``tl.dot``, float32 accumulation): input sample ``t + tap * dilation - context`` comes from
the input where it is >= 0 and from the stream's past otherwise, read where they lie. The
weight is laid out tap-major ``[taps, out, in]`` once, so each tile's weights are contiguous.

Not the default: on the H200 (stop 40) its ten launches took 0.98 ms of the batch-32 decode,
about what the copies cost, so the decode was no faster (``conv_products.KERNEL_MIN_SAMPLES``).
Each program's loads are shifted by ``tap * dilation - context`` samples, not 16-byte aligned,
and its channel tiles of 32 make short ``tl.dot`` steps: the places to look next.
``StreamingDecoder`` uses it with ``QWEN3TTS_CONV=kernel``.

Same arithmetic as the convolution, summed in another order: equal within rounding
(``tests/test_codec_kernels.py``: float32 with ``input_precision="ieee"``, no TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate


def tap_major(weight: torch.Tensor) -> torch.Tensor:
    """A ``nn.Conv1d`` weight [out, in, taps] as the kernel reads it: [taps, out, in], contiguous."""
    return weight.detach().permute(2, 0, 1).contiguous()


def causal_conv_eager(past: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, dilation: int) -> torch.Tensor:
    """Eager form of ``causal_conv``: ``torch.nn.functional.conv1d`` over the past and the
    input concatenated (``weight`` tap-major, as the kernel takes it)."""
    full = torch.cat([past, x], dim=-1)
    return torch.nn.functional.conv1d(full, weight.permute(1, 2, 0), dilation=dilation)


@triton.jit
def _causal_conv_kernel(
    past_ptr, x_ptr, w_ptr, y_ptr,
    outputs, length,
    past_batch_stride, past_channel_stride, x_batch_stride, x_channel_stride,
    CHANNELS: tl.constexpr, TAPS: tl.constexpr, DILATION: tl.constexpr,
    BLOCK_O: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    IEEE: tl.constexpr, PDL: tl.constexpr,
):
    gate(PDL)
    CONTEXT: tl.constexpr = (TAPS - 1) * DILATION
    pid_t = tl.program_id(0)
    pid_o = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rc = tl.arange(0, BLOCK_C)
    o_ok = o < outputs
    t_ok = t < length
    x_row = x_ptr + b * x_batch_stride
    past_row = past_ptr + b * past_batch_stride
    acc = tl.zeros((BLOCK_O, BLOCK_T), dtype=tl.float32)
    for tap in tl.static_range(TAPS):
        p = t + (tap * DILATION - CONTEXT)  # input sample; < 0: in the past
        in_x = t_ok & (p >= 0)
        # Only the tiles that reach back before the input read the past.
        reaches_past = pid_t * BLOCK_T + tap * DILATION < CONTEXT
        for c0 in range(0, CHANNELS, BLOCK_C):
            c = c0 + rc
            c_ok = c < CHANNELS
            w = tl.load(
                w_ptr + (tap * outputs + o)[:, None] * CHANNELS + c[None, :],
                mask=o_ok[:, None] & c_ok[None, :], other=0.0,
            )
            v = tl.load(x_row + c[:, None] * x_channel_stride + p[None, :], mask=c_ok[:, None] & in_x[None, :], other=0.0)
            if reaches_past:
                in_past = t_ok & (p < 0)
                v += tl.load(
                    past_row + c[:, None] * past_channel_stride + (p + CONTEXT)[None, :],
                    mask=c_ok[:, None] & in_past[None, :], other=0.0,
                )
            if IEEE:
                acc = tl.dot(w, v, acc, input_precision="ieee")
            else:
                acc = tl.dot(w, v, acc)
    y = y_ptr + b * outputs * length + o[:, None] * length + t[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=o_ok[:, None] & t_ok[None, :])


def _block_t(length: int) -> int:
    """Samples per tile: the largest of 128, 64, 32 dividing ``length`` (the decoder's
    lengths at a frame, 160, 640 and 1920 samples, leave no idle lanes), else 16 up to 128."""
    for block in (128, 64, 32):
        if length % block == 0:
            return block
    return min(128, max(16, next_pow2(length)))


def causal_conv(past: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, dilation: int) -> torch.Tensor:
    """A stride-1 causal convolution of ``x`` continuing ``past``, without its bias.

    Args:
        past: [B, in, (taps - 1) * dilation], the stream's last input samples (last dimension
            contiguous: e.g. the first B rows of a state buffer).
        x: [B, in, T], the new input (last dimension contiguous).
        weight: ``tap_major`` of the convolution's weight, [taps, out, in], contiguous.
        dilation: samples between taps.

    Returns:
        [B, out, T], contiguous, in ``x``'s dtype; float32 accumulation.

    Raises:
        ValueError: shapes that do not fit together.
    """
    b, channels, length = x.shape
    taps, outputs, w_channels = weight.shape
    if w_channels != channels or past.shape != (b, channels, (taps - 1) * dilation):
        raise ValueError(f"past {tuple(past.shape)}, input {tuple(x.shape)}, weight {tuple(weight.shape)}")
    if x.stride(2) != 1:
        x = x.contiguous()
    if past.stride(2) != 1:
        past = past.contiguous()
    y = torch.empty((b, outputs, length), dtype=x.dtype, device=x.device)
    block_o = 64 if outputs >= 64 else max(16, next_pow2(outputs))
    block_c = 64 if channels >= 256 else max(16, min(32, next_pow2(channels)))
    block_t = _block_t(length)
    grid = (triton.cdiv(length, block_t), triton.cdiv(outputs, block_o), b)
    launcher(_causal_conv_kernel, x)[grid](
        past, x, weight, y,
        outputs, length,
        past.stride(0), past.stride(1), x.stride(0), x.stride(1),
        CHANNELS=channels, TAPS=taps, DILATION=dilation, BLOCK_O=block_o, BLOCK_T=block_t, BLOCK_C=block_c,
        IEEE=x.dtype == torch.float32, num_warps=4, num_stages=3,
    )
    return y
