"""The codec decoder's convolutions as single matrix products (cuBLAS), for its fused path.

cuDNN runs the decoder's convolutions at a batch of streams badly: on the H200 at batch 32 it
picks ``implicit_convolve_sgemm`` (no tensor cores) for three of the dilated kernel-7
convolutions, 1.6 of the decode's 4.5 ms, and converts every other input to NHWC and back
(``nchwToNhwcKernel`` x33, 0.45 ms; ``benchmarks/results/profile/README.md``, stop 38).
Written as one matrix product each, the same arithmetic runs on tensor cores in the
[B, C, T] layout the decoder keeps:

* a causal convolution (kernel ``k``, dilation ``d``, stride 1, no padding of its own: the
  stream's past is the padding) reads its input as columns ``[B, C * k, T]`` (im2col: the
  ``k`` taps of each channel) times its weight ``[out, C * k]``. The columns are built by
  one kernel reading the past and the input where they lie (``kernels.im2col``; mode
  ``im2col``, the default), or with PyTorch (mode ``copy``: concatenation, then a strided
  copy; stop 39's form). Where the columns would be large (long inputs) the convolution can
  run instead as ``kernels.causal_conv``, the same product summed tile by tile from the past
  and the input (mode ``kernel``; ``KERNEL_MIN_SAMPLES``). ``StreamingDecoder`` takes the
  mode from ``QWEN3TTS_CONV``;
* a transposed convolution with kernel ``stride`` or ``2 * stride`` (each output frame of
  ``stride`` samples made of the current input frame and the previous one) is
  ``[out * stride, C * taps]`` times the frames with the previous frame stacked under them
  (with ``folded``, every row's frames side by side: one product).

The bias is returned apart, so the caller can fold it into the SnakeBeta that follows
(``kernels.snake``'s ``bias``). Products accumulate in float32 like cuDNN's, in another
order: equal to the convolutions within rounding (``tests/test_codec_kernels.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


#: Samples per row from which a convolution with a past may run as ``kernels.causal_conv``
#: (implicit GEMM, no columns) rather than im2col + cuBLAS: the decoder's last three blocks
#: (160, 640 and 1920 samples a frame), where the columns are large. Below it (the first
#: block's 32 samples a frame, the convolutions before the blocks) a kernel program's share
#: of the sum is long and the grid small, and the columns are small. The decoder asks for
#: the kernel only with ``QWEN3TTS_CONV=kernel``: on the H200 (stop 40) it saved the copies
#: but its ten launches took 0.98 ms at batch 32, and the decode was no faster (3.64 ms
#: against 3.60 with im2col; 1.33 against 1.27 at batch 1, 1.96 against 2.06 at batch 8).
KERNEL_MIN_SAMPLES = 128

#: How a causal convolution's product is formed (``ConvProduct.__call__``): im2col columns
#: built by ``kernels.im2col``, the same columns built by PyTorch, ``kernels.causal_conv`` for
#: long inputs, or the columns with the batch folded into the samples and one product (the
#: decoder folds the transposed convolutions' frames too wherever it folds these,
#: ``TransConvProduct``'s ``folded``). ``benchmarks.profile_step`` times the decode in every
#: mode.
CONV_MODES = ("im2col", "copy", "kernel", "folded")


@dataclass(frozen=True)
class ConvProduct:
    """A stride-1 ``nn.Conv1d`` continuing a stream's past, as one matrix product: over im2col
    columns (cuBLAS), or, for long inputs, as the implicit-GEMM kernel
    ``kernels.causal_conv`` that reads the past and the input where they lie.

    Attributes:
        weight: [out, in * kernel] (a view of the convolution's weight, tap fastest).
        taps_weight: [kernel, out, in], contiguous (``causal_conv.tap_major``), or None
            where the kernel does not serve (kernel 1).
        bias: [out], or None.
        kernel: taps.
        dilation: samples between taps.
    """

    weight: torch.Tensor
    taps_weight: torch.Tensor | None
    bias: torch.Tensor | None
    kernel: int
    dilation: int

    @classmethod
    def of(cls, conv: nn.Conv1d) -> ConvProduct | None:
        """The product form of ``conv``, or None where it does not apply (groups, stride,
        or padding of its own: e.g. ConvNeXt's depthwise convolution stays cuDNN's)."""
        if conv.groups != 1 or conv.stride != (1,) or conv.padding != (0,) or conv.padding_mode != "zeros":
            return None
        weight = conv.weight.detach()
        bias = None if conv.bias is None else conv.bias.detach()
        taps = conv.kernel_size[0]
        taps_weight = None
        if taps > 1:
            from .kernels.causal_conv import tap_major

            taps_weight = tap_major(weight)
        return cls(weight.reshape(weight.shape[0], -1), taps_weight, bias, taps, conv.dilation[0])

    @property
    def context(self) -> int:
        """Input samples before the first output's: ``(kernel - 1) * dilation``."""
        return (self.kernel - 1) * self.dilation

    def __call__(
        self, past: torch.Tensor | None, x: torch.Tensor, mode: str = "im2col", advance: bool = False,
    ) -> torch.Tensor:
        """The convolution of ``x`` continuing ``past``, without its bias.

        Args:
            past: [B, in, context], the stream's last input samples; None when ``context`` is 0.
            x: [B, in, T], the input.
            mode: one of ``CONV_MODES``: ``im2col`` (columns by ``kernels.im2col``, then
                cuBLAS), ``copy`` (columns by PyTorch, then cuBLAS), ``kernel``
                (``kernels.causal_conv`` from ``KERNEL_MIN_SAMPLES`` on, ``im2col`` below),
                ``folded`` (columns [C * k, B, T] by ``kernels.im2col``, one product
                ``[out, C * k] @ [C * k, B * T]``). The Triton kernels need CUDA, or Triton's
                interpreter on the CPU.
            advance: then set ``past`` (in place) to the last ``context`` samples of ``past``
                followed by ``x``, the stream's past for its next input: in the column kernel
                in modes ``im2col`` and ``folded`` (``kernels.im2col``'s ``advance``), by a
                copy after the product in the others.

        Returns:
            [B, out, T] in ``x``'s dtype: contiguous, except in mode ``folded`` with a past
            (a view of [out, B, T]: the last dimension contiguous).

        Raises:
            ValueError: no past for a convolution with context, or an unknown mode.
        """
        if mode not in CONV_MODES:
            raise ValueError(f"convolution mode {mode!r}: expected one of {CONV_MODES}")
        if past is None:
            if self.context:
                raise ValueError(f"a convolution with {self.context} samples of context needs the past")
            return torch.matmul(self.weight, x)
        from .kernels.im2col import MAX_BLOCK_T, advance_eager, im2col, im2col_eager

        if mode == "kernel" and self.taps_weight is not None and x.shape[-1] >= KERNEL_MIN_SAMPLES:
            from .kernels.causal_conv import causal_conv

            y = causal_conv(past, x, self.taps_weight, self.dilation)
        elif mode == "copy":
            y = torch.matmul(self.weight, im2col_eager(past, x, self.kernel, self.dilation))
        else:
            in_kernel = advance and self.context <= MAX_BLOCK_T
            columns = im2col(past, x, self.kernel, self.dilation, folded=mode == "folded", advance=in_kernel)
            advance = advance and not in_kernel
            if mode == "folded":
                b, t = x.shape[0], x.shape[-1]
                y = torch.mm(self.weight, columns.view(columns.shape[0], b * t)).view(-1, b, t).transpose(0, 1)
            else:
                y = torch.matmul(self.weight, columns)
        if advance:
            advance_eager(past, x)
        return y


@dataclass(frozen=True)
class TransConvProduct:
    """An ``nn.ConvTranspose1d`` with kernel ``stride`` or ``2 * stride`` as one matrix product.

    Output frame ``j`` (``stride`` samples) is ``W[:, :, :stride]`` applied to input frame
    ``j`` plus ``W[:, :, stride:]`` applied to frame ``j - 1`` (the causal decoder trims the
    rest): both taps in one product over ``[x_j; x_{j-1}]``.

    Attributes:
        weight: [out * stride, in * taps], row ``o * stride + r``, column ``tap * in + c``
            (tap 0: the current frame, 1: the previous one).
        bias: [out], or None.
        stride: samples an input frame becomes.
        taps: ``kernel // stride`` (1 or 2).
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    stride: int
    taps: int

    @classmethod
    def of(cls, conv: nn.ConvTranspose1d) -> TransConvProduct | None:
        """The product form of ``conv``, or None where it does not apply."""
        kernel, stride = conv.kernel_size[0], conv.stride[0]
        if (
            conv.groups != 1 or conv.padding != (0,) or conv.output_padding != (0,)
            or conv.dilation != (1,) or kernel not in (stride, 2 * stride)
        ):
            return None
        taps = kernel // stride
        w = conv.weight.detach()  # [in, out, kernel]
        channels_in, channels_out = w.shape[0], w.shape[1]
        weight = w.reshape(channels_in, channels_out, taps, stride).permute(1, 3, 2, 0)
        weight = weight.reshape(channels_out * stride, taps * channels_in).contiguous()
        bias = None if conv.bias is None else conv.bias.detach()
        return cls(weight, bias, stride, taps)

    def __call__(self, x: torch.Tensor, previous: torch.Tensor | None, folded: bool = False) -> torch.Tensor:
        """The convolution's output frames for input frames ``x``, without the bias.

        Args:
            x: [B, in, n] input frames.
            previous: [B, in, n], the frame before each (the first from the stream's past);
                None when ``taps`` is 1.
            folded: the batch folded into the columns, ``[in * taps, B * n]``, for one
                product that reads the weight once (``ConvProduct``'s mode ``folded``). Else
                one product per row with the weight broadcast, a batched product that may
                read the weight for every row: the first decoder block's weight is 37.7 MB
                in bfloat16 ([768 x 8, 2 x 1536]). Two batched ``cutlass_80`` kernels took
                0.43 ms of the batch-32 decode on the H100 (``benchmarks/results/profile``,
                stop 46); which products they were was not recorded, and these are the
                likeliest (the causal convolutions' are folded there).

        Returns:
            [B, out, n * stride], in ``x``'s dtype (contiguous for n = 1, and when folded).
        """
        if folded:
            b, _, n = x.shape
            parts = [x] if previous is None else [x, previous]
            columns = torch.cat([part.transpose(0, 1) for part in parts], dim=0)  # [in * taps, B, n]
            y = torch.mm(self.weight, columns.view(columns.shape[0], b * n))  # [out * stride, B * n]
            y = y.view(-1, self.stride, b, n).permute(2, 0, 3, 1)  # [B, out, n, stride]
            return y.reshape(b, -1, n * self.stride).contiguous()
        columns = x if previous is None else torch.cat([x, previous], dim=1)
        y = torch.matmul(self.weight, columns)  # [B, out * stride, n]
        b, _, n = y.shape
        y = y.view(b, -1, self.stride, n)
        return y[..., 0] if n == 1 else y.transpose(2, 3).reshape(b, -1, n * self.stride)
