"""The codec decoder's kernels (``kernels.snake``, the 1x1 convolutions as matrix products)
against their eager forms, the library's ``SnakeBeta``, and the eager decoder.

On the CPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set by
``conftest.py`` before anything imports triton; float32, small shapes). Under ``pytest -m gpu``
it runs compiled on CUDA, in float32 and bfloat16.

The tiny checkpoint's SnakeBeta parameters are zeros and its biases zeros (as the library
initialises them), which would hide a wrong channel or a dropped bias, so the decoder tests
draw them at random first.

Tolerances:

* The kernel against its eager form and the library's ``SnakeBeta`` (run in float32 on the
  same input): float32 agrees to a few float32 ulps of the terms (sine implementations
  differ in the last bit), so 1e-5. bfloat16 stores 8 significant bits: the kernel computes in
  float32 and rounds once, so it is within one bf16 step of the float32 value (relative
  2**-7), plus 1e-4 absolute where the two terms nearly cancel. The residual stream ``h``
  is one float32 sum rounded once in both forms: compared exactly.
* The decoder with the kernels against the eager decoder, float32 (TF32 off): the same
  arithmetic in another order (matrix product instead of cuDNN's 1x1 convolution, float32
  snake), 2e-5 at most under the interpreter: 5e-5 there (as tests/test_codec.py allows
  between the incremental and whole decodes), 1e-4 on CUDA, absolute on PCM of RMS ~0.1.
* bfloat16 decoder: each path rounds every activation to 8 bits through some 30 stages, so
  each is ~10 % RMS off the float32 decode of the same weights, and the two differ from each
  other by about as much (0.10 relative RMS, measured with the kernel's arithmetic in
  PyTorch on the CPU): compared at 0.25 relative RMS. The sharper check is that the
  kernels' decode is no further from the float32 decode than the eager one (it rounds less
  often): within 1.25 times the eager error. A dropped bias, for one, doubles it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # conftest.py sets it; this covers running the file alone
    os.environ.setdefault("TRITON_INTERPRET", "1")

from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import SnakeBeta  # noqa: E402

from wyoming_qwen3tts.engine.batched.codec import FOLDED_MIN_ROWS, StreamingDecoder, product_mode  # noqa: E402
from wyoming_qwen3tts.engine.batched.kernels import snake  # noqa: E402
from wyoming_qwen3tts.engine.batched.conv_products import CONV_MODES, ConvProduct, TransConvProduct  # noqa: E402

CASES = [
    pytest.param("cpu", torch.float32, id="interpreter-f32"),
    pytest.param("cuda", torch.float32, marks=pytest.mark.gpu, id="cuda-f32"),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu, id="cuda-bf16"),
]


@pytest.fixture(autouse=True)
def _device_ready(request: pytest.FixtureRequest) -> None:
    params = getattr(request.node, "callspec", None)
    device = params.params.get("device") if params is not None else None
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the interpreter runs where no CUDA device is")


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-4, 2**-7)
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


def _snake_module(channels: int, dtype: torch.dtype, gen: torch.Generator) -> SnakeBeta:
    """A float32 ``SnakeBeta`` whose parameters are exact in ``dtype`` (log scale ~N(0, 0.5))."""
    module = SnakeBeta(channels)
    with torch.no_grad():
        module.alpha.copy_((torch.randn(channels, generator=gen) * 0.5).to(dtype))
        module.beta.copy_((torch.randn(channels, generator=gen) * 0.5).to(dtype))
    return module


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_snake_kernel_is_the_eager_form_and_the_librarys_snake(device: str, dtype: torch.dtype) -> None:
    """``snake`` against ``snake_eager`` and the library's module, for the activation alone
    (on a contiguous tensor, a slice along T read in place, and a transposed one copied) and
    with a residual unit's branch added first (with and without its bias)."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(2, 3, 37), (3, 5, 4)] if device == "cpu" else [(4, 96, 1920), (3, 1536, 4), (2, 192, 645)]
    for b, c, t in shapes:
        ref = _snake_module(c, dtype, gen)
        alpha, inv_beta = snake.snake_factors(copy.deepcopy(ref).to(device=device, dtype=dtype))
        assert alpha.dtype == inv_beta.dtype == torch.float32 and alpha.shape == (c,)
        wide = (torch.randn(b, c, t + 9, generator=gen) * 3).to(device=device, dtype=dtype)
        inputs = [
            wide[..., :t].contiguous(),
            wide[..., 4 : 4 + t],  # a trimmed transposed convolution's output
            wide[..., :t].transpose(1, 2).contiguous().transpose(1, 2),  # T not contiguous
        ]
        for x in inputs:
            h, y = snake.snake(x, alpha, inv_beta)
            assert h is x or torch.equal(h, x)
            assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
            close(y, snake.snake_eager(x, alpha, inv_beta)[1], dtype)
            with torch.no_grad():
                close(y, ref.to(device)(x.float()), dtype)
        branch = (torch.randn(b, c, t, generator=gen)).to(device=device, dtype=dtype)
        bias = (torch.randn(c, generator=gen)).to(device=device, dtype=dtype)
        for x in inputs[:2]:
            for branch_, bias_ in ((branch, None), (branch, bias), (None, bias)):
                h, y = snake.snake(x, alpha, inv_beta, branch_, bias_)
                h_ref, y_ref = snake.snake_eager(x, alpha, inv_beta, branch_, bias_)
                assert torch.equal(h, h_ref)  # one rounding of the same float32 sum
                assert h is not x and h.is_contiguous()
                close(y, y_ref, dtype)
                with torch.no_grad():
                    close(y, ref.to(device)(h.float()), dtype)
                plain = x.float() + (0 if branch_ is None else branch_.float())
                plain = plain + (0 if bias_ is None else bias_.float()[:, None])
                close(h, plain, dtype)


@contextmanager
def _no_tf32() -> Iterator[None]:
    """Float32 matrix products and cuDNN convolutions in float32, not TF32 (cuDNN's default
    allows TF32, whose 10-bit mantissa is ~1e-3 relative: it would hide nothing and fail
    float32's tolerances)."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _product_close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """float32: the same sums in another order (1e-5 of the output's scale); bfloat16: both
    round a float32 sum once, so within two bf16 steps (2**-7 relative) of the output's scale."""
    scale = float(ref.abs().max())
    tol = 1e-5 if dtype == torch.float32 else 2**-6
    torch.testing.assert_close(y.float(), ref.float(), atol=tol * scale, rtol=0)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_convolution_products_are_the_convolutions(device: str, dtype: torch.dtype) -> None:
    """``ConvProduct`` (kernel 7 at dilations 1, 3 and 9, kernel 1) and ``TransConvProduct``
    (kernel 2 x stride, and kernel = stride) give what ``nn.Conv1d`` and ``nn.ConvTranspose1d``
    give (the causal decoder's trim of it), bias added apart, for one frame and several
    (TF32 off)."""
    with _no_tf32():
        _check_products(device, dtype)


def _check_products(device: str, dtype: torch.dtype) -> None:
    """The body of ``test_convolution_products_are_the_convolutions``."""
    gen = torch.Generator().manual_seed(4)
    small = device == "cpu"
    b, c_in, c_out = (2, 6, 5) if small else (4, 96, 96)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    # Lengths from KERNEL_MIN_SAMPLES on run as kernels.causal_conv in mode "kernel".
    for kernel, dilation, t in [(7, 1, 11), (7, 3, 4), (7, 9, 130 if small else 1920), (7, 1, 160), (1, 1, 9)]:
        conv = torch.nn.Conv1d(c_in, c_out, kernel, dilation=dilation).to(device=device, dtype=dtype)
        product = ConvProduct.of(conv)
        assert product is not None and product.context == (kernel - 1) * dilation
        full = rand(b, c_in, product.context + t)
        with torch.no_grad():
            ref = conv(full)
        past = full[..., : product.context] if product.context else None
        for mode in CONV_MODES:
            y = product(past, full[..., product.context :], mode)
            assert y.shape == (b, c_out, t) and y.dtype == dtype and y.stride(2) == 1
            assert y.is_contiguous() or (mode == "folded" and past is not None)
            assert product.bias is not None
            _product_close(y.float() + product.bias.float()[:, None], ref, dtype)
    with pytest.raises(ValueError, match="convolution mode 'cudnn'"):
        product(None, full, "cudnn")
    with pytest.raises(ValueError, match="needs the past"):
        product7 = ConvProduct.of(torch.nn.Conv1d(4, 4, 7))
        assert product7 is not None
        product7(None, torch.zeros(1, 4, 3))
    assert ConvProduct.of(torch.nn.Conv1d(4, 4, 7, groups=4)) is None  # depthwise: cuDNN's
    assert ConvProduct.of(torch.nn.Conv1d(4, 4, 3, padding=1)) is None

    stride = 3 if small else 8
    c_in, c_out = (6, 4) if small else (768, 384)
    for kernel in (2 * stride, stride):
        conv = torch.nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride).to(device=device, dtype=dtype)
        trans = TransConvProduct.of(conv)
        assert trans is not None and trans.taps == kernel // stride
        for n in (1, 3):
            past, x = rand(b, c_in, 1), rand(b, c_in, n)
            previous = torch.cat([past, x[..., :-1]], dim=-1) if trans.taps == 2 else None
            with torch.no_grad():
                if trans.taps == 2:
                    ref = conv(torch.cat([past, x], dim=-1))[..., stride : stride + n * stride]
                else:
                    ref = conv(x)
            assert trans.bias is not None
            for folded in (False, True):  # one product per row, or the rows side by side
                y = trans(x, previous, folded)
                assert y.shape == (b, c_out, n * stride) and y.dtype == dtype
                assert y.is_contiguous() or not (folded or n == 1)
                _product_close(y.float() + trans.bias.float()[:, None], ref, dtype)
    assert TransConvProduct.of(torch.nn.ConvTranspose1d(4, 4, 5, stride=2)) is None


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_causal_conv_kernel_is_the_convolution(device: str, dtype: torch.dtype) -> None:
    """``kernels.causal_conv`` against its eager form and ``nn.Conv1d`` over the past and
    the input: one output channel (the decoder's last convolution) and several, inputs shorter
    and longer than the context and than a tile, the past as the first rows of a larger state
    buffer and the input a strided view (TF32 off)."""
    from wyoming_qwen3tts.engine.batched.kernels.causal_conv import causal_conv, causal_conv_eager, tap_major

    gen = torch.Generator().manual_seed(8)
    small = device == "cpu"
    b, c_in = (3, 6) if small else (5, 96)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    with _no_tf32():
        for c_out, dilation, t in [(1, 1, 20), (5 if small else 96, 9, 30), (5 if small else 192, 3, 200)]:
            conv = torch.nn.Conv1d(c_in, c_out, 7, dilation=dilation, bias=False).to(device=device, dtype=dtype)
            context = 6 * dilation
            state = rand(b + 2, c_in, context)
            past = state[:b]
            x = rand(b, 2 * c_in, t)[:, 1 : 1 + c_in]  # channel stride t, batch stride 2 * c_in * t
            weight = tap_major(conv.weight)
            y = causal_conv(past, x, weight, dilation)
            with torch.no_grad():
                ref = conv(torch.cat([past, x], dim=-1))
            assert y.shape == (b, c_out, t) and y.dtype == dtype and y.is_contiguous()
            _product_close(y, ref, dtype)
            _product_close(causal_conv_eager(past, x, weight, dilation), ref, dtype)
        with pytest.raises(ValueError, match="past"):
            causal_conv(past[..., 1:], x, weight, dilation)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_im2col_kernel_builds_pytorchs_columns(device: str, dtype: torch.dtype) -> None:
    """``kernels.im2col`` writes exactly ``im2col_eager``'s columns (a copy: bit for bit):
    inputs shorter and longer than the context and than a tile, one channel and several, the
    past as the first rows of a larger state buffer and the input a strided view; a past of
    the wrong shape is refused. With ``advance`` the same columns, and the past moved on as
    ``advance_eager`` moves it (in both layouts; the state's other rows untouched; inputs
    spanning several tiles of samples, whose later tiles must not see the new past)."""
    from wyoming_qwen3tts.engine.batched.kernels.im2col import MAX_BLOCK_T, advance_eager, im2col, im2col_eager

    gen = torch.Generator().manual_seed(9)
    small = device == "cpu"

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    b = 3
    cases = [(1, 7, 1, 20), (5, 7, 9, 32), (4, 3, 1, 1), (2, 7, 9, 300), (6 if small else 96, 7, 3, 200 if small else 1920)]
    for channels, taps, dilation, t in cases:
        context = (taps - 1) * dilation
        past = rand(b + 2, channels, context)[:b]
        x = rand(b, 2 * channels, t)[:, 1 : 1 + channels]  # channel stride t, batch stride 2 * channels * t
        columns = im2col(past, x, taps, dilation)
        expected = im2col_eager(past, x, taps, dilation)
        assert columns.shape == (b, channels * taps, t) and columns.is_contiguous() and columns.dtype == dtype
        assert torch.equal(columns, expected)
        folded = im2col(past, x, taps, dilation, folded=True)
        assert folded.shape == (channels * taps, b, t) and folded.is_contiguous()
        assert torch.equal(folded, expected.transpose(0, 1)) and torch.equal(folded, im2col_eager(past, x, taps, dilation, True))
        # row c * taps + j is tap j of channel c: sample 0 of tap 0 is the past's first sample
        assert torch.equal(columns[:, 0, 0], past[:, 0, 0] if context else x[:, 0, 0])
        moved = past.clone()
        advance_eager(moved, x)
        assert not torch.equal(moved, past)
        for fold in (False, True):
            state = rand(b + 2, channels, context)
            state[:b] = past
            other = state[b:].clone()
            got = im2col(state[:b], x, taps, dilation, folded=fold, advance=True)
            assert torch.equal(got, folded if fold else columns)
            assert torch.equal(state[:b], moved) and torch.equal(state[b:], other)
    with pytest.raises(ValueError, match="past"):
        im2col(past[..., 1:], x, taps, dilation)
    long_past = rand(1, 1, MAX_BLOCK_T + 4)  # 7 taps, dilation 22
    with pytest.raises(ValueError, match="advanced by copy"):
        im2col(long_past, rand(1, 1, 4), 7, (MAX_BLOCK_T + 4) // 6, advance=True)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_the_codebook_table_decodes_as_the_quantizer(checkpoints: Path, device: str, dtype: torch.dtype) -> None:
    """``kernels.codebooks``: the sum of 16 rows of the projected table is the library's
    quantizer decode (16 codebooks, usage clamped at epsilon, the two 1x1 projections) within
    rounding, for a frame and for several, codes in any strides; the kernel is its eager form."""
    from wyoming_qwen3tts.engine.batched.kernels.codebooks import codebook_sum, codebook_sum_eager, projected_table

    quantizer = _load(checkpoints, "cpu", torch.float32).quantizer
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for group in (quantizer.rvq_first, quantizer.rvq_rest):
            for layer in group.vq.layers:
                book = layer._codebook
                book.embedding_sum.copy_(torch.randn(book.embedding_sum.shape, generator=gen))
                book.cluster_usage.copy_(torch.rand(book.cluster_usage.shape, generator=gen) * 2)
                book.cluster_usage[:4] = 0.0  # clamped at epsilon
    quantizer = quantizer.to(device=device, dtype=dtype)
    with _no_tf32():  # as the loader sets for float32 on CUDA (TF32 missed by 46 in 4e4 on the H200)
        table = projected_table(quantizer)
    assert table.dtype == dtype and table.is_contiguous() and table.shape[0] == 16 * 2048
    for n in (1, 3):
        codes = torch.randint(0, 2048, (3, n, 16), generator=gen).transpose(1, 2).to(device)  # strided
        codes[0, :, 0] = torch.arange(16)  # usage clamped
        with torch.no_grad(), _no_tf32():
            exact = copy.deepcopy(quantizer).float().decode(codes)  # float32 throughout
        got = codebook_sum(table, codes)
        assert got.shape == exact.shape == (3, table.shape[1], n) and got.is_contiguous() and got.dtype == dtype
        torch.testing.assert_close(got, codebook_sum_eager(table, codes), rtol=0 if dtype == torch.float32 else 8e-3, atol=0)
        scale = exact.abs().max().item()
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2
        assert (got.float() - exact).abs().max().item() <= tolerance * scale


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_the_rope_table_kernel_is_the_librarys_rotary_embedding(checkpoints: Path, device: str, dtype: torch.dtype) -> None:
    """``kernels.rope_tables``: the codec transformer's (cos, signed sin) for any positions
    (a stream's first frames and ones far past the window and the model's 8,000), for one new
    position a row and several, are the library's rotary embedding then ``layers.rope_tables``,
    and the kernel is its eager form."""
    from wyoming_qwen3tts.engine.batched.kernels.rope_tables import rope_cos_sin, rope_cos_sin_eager
    from wyoming_qwen3tts.engine.batched.layers import rope_tables

    rotary = _load(checkpoints, "cpu", torch.float32).pre_transformer.rotary_emb.to(device)
    inv_freq = rotary.inv_freq.float().contiguous()
    tolerance = 2e-6 if dtype == torch.float32 else 4e-3  # cosines of up to 1: an ulp or so
    for starts in ([0, 1, 71], [5000, 9001, 123456]):
        for n in (1, 3):
            positions = torch.tensor(starts, device=device)[:, None] + torch.arange(n, device=device)[None, :]
            probe = torch.zeros(3, n, 1, dtype=dtype, device=device)
            expected = rope_tables(*rotary(probe, positions))
            got = rope_cos_sin(positions, inv_freq, rotary.attention_scaling, dtype)
            eager = rope_cos_sin_eager(positions, inv_freq, rotary.attention_scaling, dtype)
            for g, e, r in zip(got, eager, expected, strict=True):
                assert g.shape == r.shape == (3, n, 2 * inv_freq.shape[0]) and g.dtype == dtype and g.is_contiguous()
                torch.testing.assert_close(g, r, rtol=0, atol=tolerance)
                torch.testing.assert_close(g, e, rtol=0, atol=tolerance)
            assert torch.equal(got[1][..., : inv_freq.shape[0]] < 0, expected[1][..., : inv_freq.shape[0]] < 0)


def _load(checkpoints: Path, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """The tiny base checkpoint's decoder with random SnakeBeta parameters and convolution
    biases (the 1x1 ones, the dilated ones, the transposed ones, the first and the last)."""
    from qwen_tts import Qwen3TTSModel

    qwen = Qwen3TTSModel.from_pretrained(str(checkpoints / "base"), device_map="cpu", dtype=torch.float32)
    decoder = qwen.model.speech_tokenizer.model.decoder
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for module in decoder.modules():
            if isinstance(module, SnakeBeta):
                module.alpha.copy_(torch.randn(module.alpha.shape, generator=gen) * 0.3)
                module.beta.copy_(torch.randn(module.beta.shape, generator=gen) * 0.3)
            elif isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)) and module.bias is not None:
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * 0.1)
    return decoder.to(device=device, dtype=dtype)


def _decode(decoder: StreamingDecoder, codes: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """Decode ``codes`` [B, 16, sum(chunks)] ``chunks`` frames at a time: PCM float32 [B, samples]."""
    parts, t = [], 0
    with torch.inference_mode():
        for n in chunks:
            parts.append(decoder.step(codes[:, :, t : t + n]).float())
            t += n
    return torch.cat(parts, dim=-1)


#: How far the fused decoder's float32 PCM may be from the eager decoder's (peak about 0.54 on
#: the tiny checkpoint): the two sum each convolution in other orders, and the differences grow
#: through its ~40 layers. 6.2e-5 at one sample of 15,360 on an AMD EPYC without AVX-512 (stop
#: 46; the test's 5e-5 had held on the machines before): 2e-4 of the peak.
PCM_ATOL = 1e-4


@pytest.mark.full
def test_fused_decoder_under_the_interpreter_is_the_eager_decoder(checkpoints: Path) -> None:
    """On the CPU, ``fused=True`` (kernels in the interpreter, convolutions as matrix
    products, residual adds folded) gives the eager decoder's PCM across step boundaries,
    with every convolution mode: columns by ``kernels.im2col`` (the default) or by PyTorch,
    and the long convolutions as ``causal_conv``."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs where no CUDA device is")
    torch.set_num_threads(1)
    decoder = _load(checkpoints, "cpu", torch.float32)
    codes = torch.randint(0, 2048, (2, 16, 4), generator=torch.Generator().manual_seed(3))
    eager = StreamingDecoder(decoder, 2)
    expected = _decode(eager, codes, [1, 3])
    for mode in CONV_MODES:
        fused = StreamingDecoder(decoder, 2, fused=True)
        assert fused.fused and not eager.fused  # the CPU default is the library's modules
        assert fused.conv_mode == "auto"  # QWEN3TTS_CONV's default
        fused.conv_mode = mode
        torch.testing.assert_close(_decode(fused, codes, [1, 3]), expected, atol=PCM_ATOL, rtol=0)


def test_an_unknown_convolution_mode_is_refused_by_name(checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``QWEN3TTS_CONV`` takes ``auto``, ``im2col``, ``copy``, ``kernel`` or ``folded`` (any case);
    anything else stops the decoder's construction with an error naming the value and the
    choices."""
    decoder = _load(checkpoints, "cpu", torch.float32)
    monkeypatch.setenv("QWEN3TTS_CONV", " Copy")
    assert StreamingDecoder(decoder, 1, fused=True).conv_mode == "copy"
    monkeypatch.setenv("QWEN3TTS_CONV", "cudnn")
    with pytest.raises(ValueError, match="QWEN3TTS_CONV='cudnn': expected one of auto, im2col, copy, kernel, folded"):
        StreamingDecoder(decoder, 1, fused=True)


def test_auto_folds_the_batch_into_the_columns_from_eight_rows() -> None:
    """``QWEN3TTS_CONV=auto`` (the default) runs ``im2col`` for a lone stream and a few, and
    ``folded`` from ``FOLDED_MIN_ROWS`` (8) rows, where the H200 timed it faster; a named
    mode is used at every batch size."""
    assert [product_mode("auto", rows) for rows in (1, 2, 4, 7, 8, 16, 32, 64)] == ["im2col"] * 4 + ["folded"] * 4
    assert FOLDED_MIN_ROWS == 8
    for mode in CONV_MODES:
        assert {product_mode(mode, rows) for rows in (1, 8, 32)} == {mode}


def test_auto_folds_the_transposed_convolutions_where_it_folds_the_causal_ones(
    checkpoints: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In ``auto`` the decoder's transposed convolutions run one product a row for a lone
    stream and with every row's frames side by side from ``FOLDED_MIN_ROWS`` rows, as its
    causal convolutions do (the H100 timed the folded decode faster at 8 and 32 rows): each
    product-form convolution of the tiny decoder given one frame a row."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs where no CUDA device is")
    torch.set_num_threads(1)
    decoder = _load(checkpoints, "cpu", torch.float32)
    seen: list[tuple[str, bool]] = []
    trans_call, conv_call = TransConvProduct.__call__, ConvProduct.__call__

    def trans_spy(self: TransConvProduct, x: torch.Tensor, previous: torch.Tensor | None, folded: bool = False) -> torch.Tensor:
        seen.append(("transposed", folded))
        return trans_call(self, x, previous, folded)

    def conv_spy(self: ConvProduct, past: torch.Tensor | None, x: torch.Tensor, mode: str, **kw: bool) -> torch.Tensor:
        seen.append(("causal", mode == "folded"))
        return conv_call(self, past, x, mode, **kw)

    monkeypatch.setattr(TransConvProduct, "__call__", trans_spy)
    monkeypatch.setattr(ConvProduct, "__call__", conv_spy)
    for rows in (1, FOLDED_MIN_ROWS):
        seen.clear()
        fused = StreamingDecoder(decoder, rows, fused=True)
        assert fused.conv_mode == "auto"
        with torch.inference_mode():
            for module in decoder.modules():  # one frame a row through each product-form convolution
                trans, conv = id(module) in fused._trans_products, id(module) in fused._products
                if trans or conv:
                    x = torch.randn(rows, module.conv.in_channels, 1)
                    parts = (fused._trans_conv_parts if trans else fused._conv_parts)(module, x)
                    assert parts[0].shape[:2] == (rows, module.conv.out_channels)
        kinds = {kind for kind, _ in seen}
        assert kinds == {"transposed", "causal"}
        assert {folded for _, folded in seen} == {rows >= FOLDED_MIN_ROWS}, (rows, seen)


@pytest.mark.full
@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_the_transformers_ring_on_the_kernels_is_the_eager_window_past_its_end(
    checkpoints: Path, device: str, dtype: torch.dtype
) -> None:
    """The codec transformer one frame a row on the kernels (each layer's keys and values a
    ring of ``window`` slots written and attended by ``kernels.rope_attention``) against the
    library's arithmetic (a mask over the ring), frame by frame for rows that started apart,
    past the 72-frame window and round the ring again; then a chunk of several frames (the
    eager form, as a reference clip's codes are decoded) continues the same ring (TF32 off)."""
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the interpreter runs where no CUDA device is")
    decoder = _load(checkpoints, device, dtype)
    gen = torch.Generator().manual_seed(21)
    with _no_tf32(), torch.inference_mode():
        fused = StreamingDecoder(decoder, 2, fused=True)
        eager = StreamingDecoder(decoder, 2, fused=False)
        window = fused.window
        latent = decoder.pre_transformer.input_proj.in_features
        frames = torch.randn(2, 2 * window + 12, latent, generator=gen).to(device=device, dtype=dtype)
        for t in range(frames.shape[1]):
            if t == 5:  # row 1 starts afresh: its ring is 5 positions behind row 0's
                fused.reset(1)
                eager.reset(1)
            x = frames[:, t : t + 1]
            out, ref = fused._transformer(x), eager._transformer(x)
            tol = 1e-4 if dtype == torch.float32 else 0.08 * float(ref.abs().max())
            torch.testing.assert_close(out, ref, atol=tol, rtol=0, msg=f"frame {t}")
        assert torch.equal(fused._key_pos, eager._key_pos)
        assert sorted(fused._key_pos[0].tolist()) == list(range(frames.shape[1] - window, frames.shape[1]))
        chunk = torch.randn(2, 3, latent, generator=gen).to(device=device, dtype=dtype)
        torch.testing.assert_close(fused._transformer(chunk), eager._transformer(chunk), atol=tol, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_decoder_kernels_on_cuda_decode_the_eager_pcm(
    checkpoints: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """On CUDA, the decoder with the kernels (the default) and with ``QWEN3TTS_KERNELS=eager``
    decode the same codes of three rows, over several steps, to the same PCM (tolerances in
    the module docstring)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with _no_tf32():
        decoder = _load(checkpoints, "cuda", dtype)
        codes = torch.randint(0, 2048, (3, 16, 8), generator=torch.Generator().manual_seed(5)).cuda()
        chunks = [1, 2, 1, 3, 1]
        monkeypatch.delenv("QWEN3TTS_KERNELS", raising=False)
        fused = StreamingDecoder(decoder, 3)
        folded = StreamingDecoder(decoder, 3)
        folded.conv_mode = "folded"  # what auto runs from FOLDED_MIN_ROWS rows, at 3
        monkeypatch.setenv("QWEN3TTS_KERNELS", "eager")
        eager = StreamingDecoder(decoder, 3)
        assert fused.fused and not eager.fused
        pcms = [_decode(fused, codes, chunks), _decode(folded, codes, chunks)]
        pcm_eager = _decode(eager, codes, chunks)
        if dtype == torch.float32:
            for pcm in pcms:
                torch.testing.assert_close(pcm, pcm_eager, atol=1e-4, rtol=0)
            return
        exact = _decode(StreamingDecoder(copy.deepcopy(decoder).float(), 3), codes, chunks)

    def error(p: torch.Tensor, ref: torch.Tensor) -> float:
        return float((p - ref).norm() / ref.norm())

    for pcm in pcms:
        assert error(pcm, pcm_eager) < 0.25
        assert error(pcm, exact) <= 1.25 * error(pcm_eager, exact) + 1e-3, (error(pcm, exact), error(pcm_eager, exact))
