"""Each Triton kernel of the frame step against its eager PyTorch form, and the whole fused
step against the eager step on the tiny checkpoints.

On the CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set by
``conftest.py`` before anything imports triton; float32, small shapes). Under ``pytest -m gpu`` they run
compiled on CUDA, in float32 and bfloat16.

Tolerances: float32 kernels agree with the eager forms to a few float32 ulps (the sums run
in another order), so 1e-5. bfloat16 stores 8 significant bits (a relative step of 2**-8 =
0.4 %); the kernels compute in float32 and round once where eager PyTorch rounds after each
operation (two to four roundings), so outputs may differ by a few bf16 steps of their
magnitude: 3e-2 absolute on values of order 1. Sampled ids are compared exactly.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # conftest.py sets it; this covers running the file alone
    os.environ.setdefault("TRITON_INTERPRET", "1")

from wyoming_qwen3tts.engine import Segment  # noqa: E402
from wyoming_qwen3tts.engine.batched.kernels import (  # noqa: E402
    attention,
    embed,
    int8_matmul,
    linear,
    noise,
    rmsnorm,
    rope,
    rope_attention,
    sampler,
    silu_mul,
)
from wyoming_qwen3tts.engine.batched.layers import FusedLayer, attention_mask, write_rows  # noqa: E402
from wyoming_qwen3tts.engine.batched.quant import dequant_linear, quantize_rows  # noqa: E402
from wyoming_qwen3tts.engine.batched.sampling import RowParams, effective, gumbel  # noqa: E402
from wyoming_qwen3tts.common.vocabulary import ModelKind  # noqa: E402

from .engine_driver import Collect, load_tiny, run  # noqa: E402

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
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def rand(*shape: int, device: str, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_add_rms_norm_and_silu_mul(device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    d = 48 if device == "cpu" else 1024  # not a power of two: masked lanes
    x, branch = rand(3, 2, d, device=device, dtype=dtype, gen=gen), rand(3, 2, d, device=device, dtype=dtype, gen=gen)
    weight = rand(d, device=device, dtype=dtype, gen=gen)
    for b in (None, branch):
        h, y = rmsnorm.add_rms_norm(x, b, weight, 1e-6)
        h_ref, y_ref = rmsnorm.add_rms_norm_eager(x, b, weight, 1e-6)
        assert torch.equal(h, h_ref)  # one rounding of the same sum
        close(y, y_ref, dtype)
    gate_up = rand(3, 1, 2 * d, device=device, dtype=dtype, gen=gen)
    close(silu_mul.silu_mul(gate_up), silu_mul.silu_mul_eager(gate_up), dtype)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_qk_norm_rope_and_cache_write(device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    b, heads, kv, hd, length = 3, 4, 2, (8 if device == "cpu" else 128), 17
    for n, positions in ((2, torch.tensor([[0, 1]])), (1, torch.tensor([[5], [9], [16]]))):
        qkv = rand(b, n, heads + 2 * kv, hd, device=device, dtype=dtype, gen=gen)
        cos = rand(positions.shape[0], n, hd, device=device, dtype=dtype, gen=gen)
        sin = rand(positions.shape[0], n, hd, device=device, dtype=dtype, gen=gen)
        pos = positions.to(device)
        for norm in ((rand(heads + kv, hd, device=device, dtype=dtype, gen=gen), 1e-6), None):
            keys = rand(b, kv, length, hd, device=device, dtype=dtype, gen=gen)
            values = rand(b, kv, length, hd, device=device, dtype=dtype, gen=gen)
            k_ref, v_ref = keys.clone(), values.clone()
            q = rope.qk_rope_kv(qkv, norm, cos, sin, pos, keys, values, heads)
            q_ref = rope.qk_rope_kv_eager(qkv, norm, cos, sin, pos, k_ref, v_ref, heads)
            close(q, q_ref, dtype)
            close(keys, k_ref, dtype)
            assert torch.equal(values, v_ref)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_decode_attention_reads_each_rows_own_positions(device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    b, heads, kv, hd = 3, 4, 2, (16 if device == "cpu" else 128)
    # The predictor's 17-position cache (2 query tokens), and a long cache split over programs.
    for n, length, positions, splits in (
        (2, 17, torch.tensor([[0, 1]]), 1),
        (1, 17, torch.tensor([[16]]), 1),
        (1, 600, torch.tensor([[0], [255], [599]]), 1),
        (1, 600, torch.tensor([[3], [256], [599]]), 3),
    ):
        q = rand(b, n, heads, hd, device=device, dtype=dtype, gen=gen)
        keys = rand(b, kv, length, hd, device=device, dtype=dtype, gen=gen)
        values = rand(b, kv, length, hd, device=device, dtype=dtype, gen=gen)
        pos = positions.to(device)
        out = attention.decode_attention(q, keys, values, pos, 0.25, splits)
        close(out, attention.decode_attention_eager(q, keys, values, pos, 0.25), dtype)
        # Positions past a row's own are never read: garbage there changes nothing.
        after = torch.arange(length, device=device)[None, None, :, None] > pos.expand(b, n)[:, -1].view(b, 1, 1, 1)
        poisoned = attention.decode_attention(
            q, keys.masked_fill(after, 1e4), values.masked_fill(after, float("nan")), pos, 0.25, splits
        )
        assert torch.equal(out, poisoned)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_rope_attention_is_the_two_kernels(device: str, dtype: torch.dtype) -> None:
    """One token a row: the one-kernel q/k rotation + cache write + attention gives the two
    kernels' output and cache, bit for bit, with and without the q/k norm, for rows at
    different positions (the first, a middle one, the last of the cache) and broadcast
    positions and rotary rows."""
    gen = torch.Generator().manual_seed(12)
    b, heads, kv, hd = 3, 4, 2, (8 if device == "cpu" else 128)
    for length, positions, shared in ((17, [[0], [7], [16]], False), (17, [[5]], True), (300, [[0], [150], [299]], False)):
        qkv = rand(b, 1, heads + 2 * kv, hd, device=device, dtype=dtype, gen=gen)
        rows = 1 if shared else b
        angle = torch.rand(rows, 1, hd, generator=gen) * 6.28
        cos, sin = angle.cos().to(device=device, dtype=dtype), angle.sin().to(device=device, dtype=dtype)
        pos = torch.tensor(positions, device=device)
        past_k = rand(b, kv, length, hd, device=device, dtype=dtype, gen=gen)
        past_v = rand(b, kv, length, hd, device=device, dtype=dtype, gen=gen)
        for norm in (None, (1.0 + 0.1 * rand(heads + kv, hd, device=device, dtype=dtype, gen=gen), 1e-6)):
            keys, values, k_ref, v_ref = past_k.clone(), past_v.clone(), past_k.clone(), past_v.clone()
            out = rope_attention.rope_attention(qkv, norm, cos, sin, pos, keys, values, heads, 0.3)
            q = rope.qk_rope_kv(qkv, norm, cos, sin, pos, k_ref, v_ref, heads)
            ref = attention.decode_attention(q, k_ref, v_ref, pos, 0.3)
            assert torch.equal(keys, k_ref) and torch.equal(values, v_ref)
            assert torch.equal(out, ref)
            assert not torch.equal(keys, past_k)  # the new keys were written
            # The slot being written is overwritten before it is read: NaN there before the
            # kernel changes nothing.
            slot = (torch.arange(length, device=device)[None, None, :, None] == pos.expand(b, 1).view(b, 1, 1, 1))
            poisoned = rope_attention.rope_attention(
                qkv, norm, cos, sin, pos, past_k.masked_fill(slot, float("nan")),
                past_v.masked_fill(slot, float("nan")), heads, 0.3,
            )
            assert torch.equal(poisoned, out)


def _noise(b: int, seed: int, device: str) -> torch.Tensor:
    seeds = torch.arange(b, device=device) + 1000 * seed
    return gumbel(seeds, torch.zeros(b, 1, dtype=torch.int64, device=device), torch.zeros(1, dtype=torch.int64, device=device))[:, 0]


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_fused_sampler_draws_what_the_eager_sampler_draws(device: str, dtype: torch.dtype) -> None:
    """Same logits, same seeds' noise: the same ids, row by row (greedy, top-k, top-p)."""
    gen = torch.Generator().manual_seed(3)
    b = 4
    vocab = 100 if device == "cpu" else 2048  # the interpreter's top-k is slow
    logits = (rand(b, vocab, device=device, dtype=torch.float32, gen=gen) * 3).to(dtype)
    settings = [(0.9, 50, 1.0), (0.0, 50, 1.0), (1.0, 0, 0.8), (0.7, 3, 1.0)]
    seeds = range(2) if device == "cpu" else range(20)
    for temperature, top_k, top_p in settings:
        k, p = effective(top_k, top_p)
        params = RowParams(
            torch.full((b,), temperature, device=device), torch.full((b,), k, device=device),
            torch.full((b,), p, device=device),
        )
        for seed in seeds:
            noise = _noise(b, seed, device)
            fused = sampler.sample_fused(logits, params, noise, torch.empty(b, dtype=torch.int64, device=device))
            eager = sampler.sample_eager(logits, params, noise, torch.empty(b, dtype=torch.int64, device=device))
            assert torch.equal(fused, eager), (temperature, top_k, top_p, seed)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_fused_talker_sampler_penalty_bans_and_held_eos(device: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    b, vocab, eos_id = 5, (160 if device == "cpu" else 3072), 130
    logits = (rand(b, vocab, device=device, dtype=torch.float32, gen=gen) * 3).to(dtype)
    logits[:, eos_id] = 30.0  # EOS is the favourite wherever it is not held back
    seen = torch.rand(b, vocab, generator=gen).to(device) < 0.2
    penalty = torch.full((b,), 1.3, device=device)
    banned = torch.zeros(vocab, dtype=torch.bool, device=device)
    banned[128:] = True
    banned[eos_id] = False
    frame = torch.arange(b, device=device)
    min_new = torch.full((b,), 3, device=device)
    params = RowParams(torch.full((b,), 0.9, device=device), torch.full((b,), 50, device=device),
                       torch.full((b,), 2.0, device=device))
    noise = _noise(b, 0, device)
    outs = []
    for fn in (sampler.sample_fused, sampler.sample_eager):
        out = torch.empty(b, dtype=torch.int64, device=device)
        eos = torch.zeros(b, dtype=torch.bool, device=device)
        fn(logits, params, noise, out, seen, penalty, banned, (frame, min_new, eos_id), eos)
        outs.append((out, eos))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert outs[0][1].tolist() == [False, False, True, True, True]  # held while frame + 1 < 3
    assert bool((outs[0][0][:2] < 128).all())  # banned ids never drawn


@pytest.mark.parametrize(("device", "dtype"), CASES[:2])
def test_frame_noise_is_the_eager_noise(device: str, dtype: torch.dtype) -> None:
    """The same hash (exact) and logarithms: bit for bit on CUDA; under the interpreter,
    NumPy's log may differ from PyTorch's in the last bit."""
    seed = torch.tensor([0, 5, 2**62 + 12345, -7], device=device)
    frame = torch.tensor([0, 3, 100, 9], device=device)
    fused, eager = noise.frame_noise(seed, frame, 16), noise.frame_noise_eager(seed, frame, 16)
    if device == "cuda":
        assert torch.equal(fused, eager)
    else:
        torch.testing.assert_close(fused, eager, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_int8_linear_is_the_dequantized_weight_matmul(device: str, dtype: torch.dtype) -> None:
    """The int8 kernel computes x @ (q * scale).T + bias: against that product in float32, for
    a frame step's few rows (one row tile) and a prefill's many (several), with and without a
    bias, with column and K counts that leave partial tiles. bfloat16: the kernel rounds once,
    so it is within a bf16 step of the float32 product (the eager form rounds twice)."""
    gen = torch.Generator().manual_seed(5)
    shapes = [(1, 40, 48), (5, 70, 33), (70, 50, 40)] if device == "cpu" else [(1, 2048, 4096), (16, 6144, 2048), (33, 1024, 3072), (700, 2048, 1200)]
    for i, (m, k, n) in enumerate(shapes):
        x = rand(2, m, k, device=device, dtype=dtype, gen=gen)
        w = torch.randn(n, k, generator=gen) / k**0.5  # outputs of order 1
        q, scale = quantize_rows(w.to(device))
        bias = rand(n, device=device, dtype=dtype, gen=gen) if i % 2 else None
        exact = torch.nn.functional.linear(x.float(), q.float() * scale[:, None], None if bias is None else bias.float())
        y = int8_matmul.int8_linear(x, q, scale, bias)
        assert y.shape == (2, m, n) and y.dtype == dtype
        close(y, exact, dtype)
        close(dequant_linear(x, q, scale, bias), exact, dtype)  # the eager form


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_fused_linear_is_the_eager_composition(device: str, dtype: torch.dtype) -> None:
    """Every prologue/epilogue combination, plain and int8 weights, on both tile kinds
    (broadcast up to 4 rows, ``tl.dot`` from 5), with masked rows, outputs and inputs."""
    gen = torch.Generator().manual_seed(11)
    k, n = (48, 40) if device == "cpu" else (1000, 1030)
    rows = (1, 3, 6, 20) if device == "cpu" else (1, 2, 4, 8, 32, 64)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    checked = 0
    for m in rows:
        for norm, act, res, bias, int8 in [(1, 0, 0, 0, 0), (1, 1, 0, 0, 0), (0, 0, 1, 0, 0), (0, 0, 0, 1, 0),
                                           (0, 0, 1, 1, 1), (1, 1, 0, 1, 1), (0, 0, 0, 0, 1)]:
            x = rand(m, k, device=device, dtype=dtype, gen=gen)
            w = torch.randn(n, k, generator=gen) / k**0.5
            b = rand(n, device=device, dtype=dtype, gen=gen) if bias else None
            if int8:
                q, scale = quantize_rows(w)
                weight = linear.Weight(q.to(device), scale.to(device), b)
            else:
                weight = linear.Weight(w.to(device=device, dtype=dtype), None, b)
            norm_w = (rand(k, device=device, dtype=dtype, gen=gen), 1e-6) if norm else None
            out = n // 2 if act else n
            r = rand(m, out, device=device, dtype=dtype, gen=gen) if res else None
            y = linear.fused_linear(x, weight, norm=norm_w, silu=bool(act), residual=r)
            ref = linear.fused_linear_eager(x.float(), linear.Weight(weight.dense(torch.float32), None,
                                            b.float() if b is not None else None),
                                            norm=(norm_w[0].float(), 1e-6) if norm_w else None, silu=bool(act),
                                            residual=r.float() if r is not None else None)
            assert y.shape == (m, out) and y.dtype == dtype
            torch.testing.assert_close(y.float(), ref, atol=tol * 4, rtol=tol)
            checked += 1
    assert checked == len(rows) * 7
    with pytest.raises(ValueError, match="silu and residual"):
        linear.fused_linear(x, weight, silu=True, residual=x)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_fused_linear_gathers_its_rows_from_a_table(device: str, dtype: torch.dtype) -> None:
    """``gather=(ids, offset)``: the same bits as the product of the looked-up rows, with
    strided ids (a column of the frame's codes) and an offset into a stacked table."""
    gen = torch.Generator().manual_seed(3)
    k, n, vocab = (32, 24, 10) if device == "cpu" else (2048, 1024, 2048)
    table = rand(3 * vocab, k, device=device, dtype=dtype, gen=gen)
    weight = linear.Weight(rand(n, k, device=device, dtype=dtype, gen=gen) / k**0.5, None,
                           rand(n, device=device, dtype=dtype, gen=gen))
    for m in (1, 3):
        codes = torch.randint(0, vocab, (m, 5), generator=gen).to(device)
        y = linear.fused_linear(table, weight, gather=(codes[:, 2], 2 * vocab))
        ref = linear.fused_linear(table[codes[:, 2] + 2 * vocab], weight)
        assert y.shape == (m, n) and y.dtype == dtype
        torch.testing.assert_close(y, ref, atol=0, rtol=0)


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_frame_embeds_are_the_eager_lookups_and_sums(device: str, dtype: torch.dtype) -> None:
    """The talker's next input (token embedding + 15 codebook embeddings + pad) and the
    frame's stored codes, against the eager composition; strided code rows."""
    gen = torch.Generator().manual_seed(9)
    hidden, vocab, groups = (48, 12, 15) if device == "cpu" else (2048, 2048, 15)
    token_table = rand(vocab + 7, hidden, device=device, dtype=dtype, gen=gen)
    code_table = rand(groups * vocab, hidden, device=device, dtype=dtype, gen=gen)
    pad = rand(hidden, device=device, dtype=dtype, gen=gen)
    b = 3
    token = torch.randint(0, vocab + 7, (b,), generator=gen).to(device)
    codes = torch.randint(0, vocab, (b, groups + 4), generator=gen).to(device)[:, 2 : 2 + groups]
    frame = torch.full((b, groups + 1), -1, dtype=torch.int64, device=device)
    frame_ref = frame.clone()
    out = embed.frame_embeds(token, codes, token_table, code_table, pad, frame)
    ref = embed.frame_embeds_eager(token, codes, token_table, code_table, pad, frame_ref)
    assert out.shape == (b, hidden) and out.dtype == dtype
    assert torch.equal(frame, frame_ref) and torch.equal(frame[:, 0], token)
    close(out, ref, dtype)


@pytest.mark.parametrize("int8", [False, True], ids=["weights", "int8"])
@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_lean_layer_is_the_eager_layer(device: str, dtype: torch.dtype, int8: bool) -> None:
    """A code predictor layer (q/k norm, SiLU MLP) in five kernels (``FusedLayer._lean``)
    computes what the eager layer computes, each row at its own cache position, and writes
    the same keys and values into the cache; the deferred-add path agrees too. With
    ``--weight-quant int8`` projections (``quant.Int8Linear``) as well."""
    from wyoming_qwen3tts.engine.batched.quant import Int8Linear

    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSTalkerCodePredictorConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSDecoderLayer

    torch.manual_seed(5)
    if device == "cpu":
        dims = {"hidden_size": 48, "intermediate_size": 40, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8}
    else:
        dims = {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
                "num_key_value_heads": 8, "head_dim": 128}
    config = Qwen3TTSTalkerCodePredictorConfig(**dims, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    module = Qwen3TTSDecoderLayer(config, 0)
    with torch.no_grad():  # activations of order 1 in every layer part (as a trained layer keeps them)
        for p in module.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    module = module.to(device=device, dtype=dtype).eval()
    if int8:
        for parent, names in ((module.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                              (module.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for name in names:
                setattr(parent, name, Int8Linear.from_linear(getattr(parent, name), device))
    layer = FusedLayer(module)
    assert (layer.qkv_weight.scale is not None) == int8
    assert layer.lean is not None
    b, length, hd = 3, 17, dims["head_dim"]
    gen = torch.Generator().manual_seed(6)
    hidden = rand(b, 1, dims["hidden_size"], device=device, dtype=dtype, gen=gen)
    angle = torch.rand(b, 1, hd, generator=gen) * 6.28
    cos, sin = angle.cos().to(device=device, dtype=dtype), angle.sin().to(device=device, dtype=dtype)
    position = torch.tensor([0, 7, 16], device=device)
    past_k = rand(b, dims["num_key_value_heads"], length, hd, device=device, dtype=dtype, gen=gen)
    past_v = rand(b, dims["num_key_value_heads"], length, hd, device=device, dtype=dtype, gen=gen)
    keys, values = past_k.clone(), past_v.clone()
    with torch.no_grad():
        lean, rest = layer._lean(hidden, cos, sin, position[:, None], keys, values, 1)
        assert rest is None
        k_ref, v_ref = past_k.clone(), past_v.clone()

        def kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            write_rows(k_ref, k, position)
            write_rows(v_ref, v, position)
            return k_ref, v_ref

        allowed = (torch.arange(length, device=device)[None, :] <= position[:, None])[:, None, :]
        ref = layer(hidden, cos, sin, kv, attention_mask(allowed, layer.group, dtype))
        assert ref.abs().max() < 20  # the tolerances below are for activations of order 1
        close(lean, ref, dtype)
        close(keys, k_ref, dtype)
        close(values, v_ref, dtype)
        one, one_rest = layer.fast(hidden[:1], None, cos[:1], sin[:1], position[:1, None], keys[:1].clone(),
                                   values[:1].clone())
        assert (one_rest is None) == (device == "cuda")  # on CUDA a lone token takes the lean path
        close(one if one_rest is None else one + one_rest, ref[:1], dtype)
        layer.lean = None  # the nine-kernel path with the add deferred
        keys, values = past_k.clone(), past_v.clone()
        h, branch = layer.fast(hidden, None, cos, sin, position[:, None], keys, values)
        assert branch is not None
        close(h + branch, ref, dtype)


def test_int8_rows_are_within_half_a_step() -> None:
    """Per-row symmetric int8: every weight within scale / 2 of its quantized value; an all-zero
    row stays zero (scale 1, no division by zero)."""
    w = torch.randn(6, 50, generator=torch.Generator().manual_seed(2)) * torch.tensor([1e-3, 1, 3, 10, 0.1, 0.0])[:, None]
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and q.abs().max() <= 127
    assert torch.all((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7)
    assert scale[5] == 1 and not q[5].any()
    assert torch.all(q[:5].abs().amax(dim=1) == 127)  # each row uses the whole range


@pytest.mark.gpu
def test_fused_step_samples_the_eager_steps_codes(checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, float32, sampled with the default settings: the engine with the Triton kernels
    (matrix products fused with their neighbours, with and without programmatic dependent
    launch, or cuBLAS products) gives every row the codes the eager step gives it, for the
    same seeds."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    results = []
    for fused, matmul, pdl in ((True, "fused", "1"), (True, "fused", "0"), (True, "fused", "auto"), (True, "cublas", "1"),
                               (False, "fused", "1")):
        monkeypatch.setenv("QWEN3TTS_KERNELS", "triton" if fused else "eager")
        monkeypatch.setenv("QWEN3TTS_MATMUL", matmul)
        monkeypatch.setenv("QWEN3TTS_PDL", pdl)
        engine = load_tiny(checkpoints / "voice_design", ModelKind.VOICE_DESIGN, slots=3, device="cuda")
        assert engine.step.fused is fused
        sinks = [Collect() for _ in range(3)]
        schedule = {0: [(Segment(f"Row {i} says hello.", "english", 14, 14, seed=7 + i, instruct="Calm."), sinks[i])
                        for i in range(2)],
                    3: [(Segment("A late joiner.", "english", 10, 10, seed=42, instruct="Bright."), sinks[2])]}
        codes = run(engine, schedule, record_codes=True)
        results.append({row: np.stack(c) for row, c in codes.items()})
        assert all(s.frames is not None for s in sinks)
    for other in results[1:]:
        assert results[0].keys() == other.keys()
        for row in results[0]:
            np.testing.assert_array_equal(results[0][row], other[row])


def test_launches_ask_for_pdl_only_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel gets its ``PDL`` constexpr; the launch attribute only with PDL on (CUDA,
    Hopper or newer, and ``QWEN3TTS_PDL=1`` or a ``pdl_scope``): a CPU tensor never asks for it."""
    import wyoming_qwen3tts.engine.batched.kernels as kernels

    seen: list[tuple[object, dict[str, object]]] = []

    class Kernel:  # what ``kernel[grid](...)`` receives
        def __getitem__(self, grid: object) -> object:
            return lambda *args, **kwargs: seen.append((grid, kwargs))

    Kernel.__name__ = "InterpretedFunction"  # runnable on CPU tensors
    t = torch.zeros(2)
    kernels.launcher(Kernel(), t)[(3,)](t, BLOCK=4)
    assert seen[-1] == ((3,), {"BLOCK": 4, "PDL": False})
    monkeypatch.setattr(kernels, "pdl", lambda _t: True)
    kernels.launcher(Kernel(), t)[(5, 2)](t)
    assert seen[-1] == ((5, 2), {"PDL": True, "launch_pdl": True})
    monkeypatch.undo()
    monkeypatch.delenv("QWEN3TTS_PDL", raising=False)
    assert kernels.pdl(t) is False
    monkeypatch.setenv("QWEN3TTS_PDL", "1")
    assert kernels.pdl(t) is False  # never on the CPU
    if torch.cuda.is_available():
        on = torch.cuda.get_device_capability() >= kernels.PDL_CAPABILITY
        assert kernels.pdl(t.cuda()) is on
        monkeypatch.delenv("QWEN3TTS_PDL")
        assert kernels.pdl(t.cuda()) is False  # off by default, outside a scope
        with kernels.pdl_scope(True):
            assert kernels.pdl(t.cuda()) is on


def test_pdl_is_wanted_in_a_lone_rows_scope_unless_switched(monkeypatch: pytest.MonkeyPatch) -> None:
    """``QWEN3TTS_PDL``: unset or ``auto``, only within ``pdl_scope(True)`` (nested scopes
    restore the outer one, and a scope is the opening thread's alone); ``1`` everywhere;
    ``0`` never, a scope included."""
    import threading

    import wyoming_qwen3tts.engine.batched.kernels as kernels

    monkeypatch.delenv("QWEN3TTS_PDL", raising=False)
    assert kernels.pdl_wanted() is False
    with kernels.pdl_scope(True):
        assert kernels.pdl_wanted() is True
        other: list[bool] = []
        thread = threading.Thread(target=lambda: other.append(kernels.pdl_wanted()))
        thread.start()
        thread.join()
        assert other == [False]
        with kernels.pdl_scope(False):
            assert kernels.pdl_wanted() is False
        assert kernels.pdl_wanted() is True
    assert kernels.pdl_wanted() is False
    for mode, outside, inside in (("auto", False, True), ("1", True, True), ("on", True, True),
                                  ("0", False, False), ("off", False, False)):
        monkeypatch.setenv("QWEN3TTS_PDL", mode)
        assert kernels.pdl_wanted() is outside, mode
        with kernels.pdl_scope(True):
            assert kernels.pdl_wanted() is inside, mode


@pytest.mark.gpu
def test_only_the_batch_1_graphs_are_captured_with_pdl(monkeypatch: pytest.MonkeyPatch) -> None:
    """``StepGraphs(lone_pdl=True)`` captures (and warms) its batch-1 graphs within
    ``pdl_scope(True)`` and the others outside; ``lone_pdl=False`` none (the prefill's)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import wyoming_qwen3tts.engine.batched.kernels as kernels
    from wyoming_qwen3tts.engine.batched.graphs import StepGraphs

    monkeypatch.delenv("QWEN3TTS_PDL", raising=False)
    x = torch.zeros(4, device="cuda")
    for lone_pdl in (True, False):
        seen: set[tuple[int, bool]] = set()

        def body(b: int, length: int) -> None:
            seen.add((b, kernels.pdl_wanted()))
            x[:b].add_(1)

        graphs = StepGraphs(body, lambda: [x], [1, 2, 4], [8], lone_pdl=lone_pdl)
        graphs.capture()
        assert seen == {(1, lone_pdl), (2, False), (4, False)}
        graphs.run(2, 8)
        torch.cuda.synchronize()
        assert x.tolist() == [1, 1, 0, 0]  # the state was restored after the capture
        x.zero_()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_graph_of_dependent_kernels_under_pdl_reads_each_result_whole(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured chain of 120 kernels, each reading all of the one before's output (a norm +
    product over every input, a residual add, an add + RMSNorm), gives the same bits with
    programmatic dependent launch as without: no kernel starts reading before the one before
    it has finished writing."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gen = torch.Generator().manual_seed(5)
    k = 2048
    weights = [linear.Weight((torch.randn(k, k, generator=gen) / k**0.5).to("cuda", dtype)) for _ in range(4)]
    norm_w = torch.rand(k, generator=gen).to("cuda", dtype) + 0.5
    x0 = torch.randn(1, k, generator=gen).to("cuda", dtype)

    def chain(x: torch.Tensor) -> torch.Tensor:
        h = x
        for i in range(40):
            y = linear.fused_linear(h, weights[i % 4], norm=(norm_w, 1e-6))
            h = linear.fused_linear(y, weights[(i + 1) % 4], residual=h)
            h = rmsnorm.add_rms_norm(h, y, norm_w, 1e-6)[1]
        return h

    outputs = []
    for flag in ("0", "1"):
        monkeypatch.setenv("QWEN3TTS_PDL", flag)
        x = x0.clone()
        chain(x)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(x)
        runs = []
        for _ in range(3):
            graph.replay()
            runs.append(out.clone())
        torch.cuda.synchronize()
        assert all(torch.equal(runs[0], r) for r in runs[1:])
        outputs.append(runs[0])
    assert torch.isfinite(outputs[0].float()).all()
    torch.testing.assert_close(outputs[1], outputs[0], atol=0, rtol=0)


def test_the_talker_rotary_table_is_what_rotary_emb_gives(checkpoints: Path) -> None:
    """The fused step's (cos, sin) lookup equals the library's rotary embedding of each row's
    position (every generated frame has one position in all three mrope sections)."""
    from wyoming_qwen3tts.engine.batched.layers import rope_tables

    engine = load_tiny(checkpoints / "custom_voice", ModelKind.CUSTOM_VOICE, slots=2)
    step = engine.step
    position = torch.tensor([0, 7, engine.state.max_len - 1])
    cos, sin = step._talker_rope(position)
    h = torch.zeros(3, 1, step.talker.config.hidden_size)
    ref_cos, ref_sin = step.talker.model.rotary_emb(h, position.view(1, 3, 1).expand(3, 3, 1))
    ref_cos, ref_sin = rope_tables(ref_cos[0], ref_sin[0])
    assert cos.shape == sin.shape == ref_cos.shape == (3, 1, step.talker_layers[0].head_dim)
    torch.testing.assert_close(cos, ref_cos, atol=0, rtol=0)
    torch.testing.assert_close(sin, ref_sin, atol=0, rtol=0)
