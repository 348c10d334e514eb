"""Few-row matrix products with the layer's neighbours folded in.

A frame step multiplies 1-64 rows by each weight: the product reads the whole weight for a
handful of outputs, so it is bound by the weight's bytes and by the number of kernels, not by
arithmetic. cuBLAS spreads a 1,024-output product over only 16 blocks of a 132-SM H200
(11.3 us for the code predictor's 2,048 -> 1,024 ``o_proj``, 0.37 TB/s;
``benchmarks/results/profile/README.md``), and every RMSNorm, SiLU-multiply and residual add
around it is a kernel of its own. ``fused_linear`` is one kernel that:

* spreads the outputs over narrow column tiles (4-32 outputs a program), so even a
  1,024-output product runs on 128+ programs;
* optionally normalises its input first (``norm``: RMSNorm of each row, rounded to the model
  dtype as ``F.rms_norm`` would, then multiplied): the pre-norm layer's norm costs no kernel;
* optionally finishes with ``silu(gate) * up`` over a gate/up weight laid side by side
  (``silu``), or adds the residual stream (``residual``), or a bias;
* reads int8 weights with per-output-channel scales (``quant.Int8Linear``) as they are.

Rows are multiplied with ``tl.dot`` from 5 rows up (tensor cores; rows padded to 16), and as
broadcast products below (a lone stream's product pads nothing). Everything accumulates in
float32 and is rounded once; float32 inputs are multiplied in exact float32 (no TF32).

The eager form ``fused_linear_eager`` is the composition of the library operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import launcher, next_pow2
from .pdl_gate import gate
from .weight import Weight

__all__ = ["Tiles", "Weight", "fused_linear", "fused_linear_eager", "tiles_for"]


@dataclass(frozen=True)
class Tiles:
    """One launch configuration: rows, outputs and K per tile, warps, pipeline stages, and
    whether the tile is multiplied with ``tl.dot`` (``block_m`` >= 16) or by broadcast."""

    block_m: int
    block_n: int
    block_k: int
    warps: int = 4
    stages: int = 3
    dot: bool = False


def tiles_for(m: int, n: int, k: int, element: int) -> Tiles:
    """The tiles for ``m`` rows, ``n`` outputs (per half of a gate/up pair) and ``k`` inputs
    of ``element``-byte activations.

    One row (what ``use_fused`` serves), from ``benchmarks/results/linear`` (GPU time of
    each tile on an H200, 1.7B shapes): a ``tl.dot`` tile of 16 rows x 32 outputs x 256
    inputs for products of 3,072+ outputs (6.0 us for the predictor's q/k/v, 7.0 for its
    gate/up, 16.1 for the talker's gate/up), and a broadcast tile of 4 outputs x 512 inputs
    for narrower ones (128+ programs: 5.7 us for the predictor's 2,048 -> 1,024 ``o_proj``,
    against cuBLAS's 11.8). More rows: broadcast tiles up to 4 rows, ``tl.dot`` tiles of 16
    or 32 rows and 16 outputs from 5 (correct, but slower than cuBLAS there). float32 halves
    K (shared memory and registers).
    """
    shrink = 2 if element >= 4 else 1
    if m == 1:
        if n >= 3072:
            return Tiles(16, 32, 256 // shrink, warps=4, dot=True)
        return Tiles(1, 4, 512 // shrink, warps=4)
    if m <= 4:
        bm = next_pow2(m)
        return Tiles(bm, 8, max(64, 512 // bm // shrink), warps=4)
    bm = 16 if m <= 16 else 32
    return Tiles(bm, 16, 128 // shrink, warps=4, dot=True)


@triton.jit
def _fused_linear_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, y_ptr, ids_ptr, s_ids, id_offset, M, N, eps,
    K: tl.constexpr, GATHER: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
    HAS_RES: tl.constexpr, SILU: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    gate(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    act_ty = x_ptr.dtype.element_ty
    if GATHER:  # row i of x is table row ids[i] + id_offset
        xr = tl.load(ids_ptr + rm * s_ids, mask=m_ok, other=0) + id_offset
    else:
        xr = rm
    # RMSNorm of each row: its inverse root mean square, over all K inputs.
    inv = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if HAS_NORM:
        sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + rk
            x = tl.load(x_ptr + xr[:, None] * K + ks[None, :], mask=m_ok[:, None] & (ks < K)[None, :], other=0.0)
            x = x.to(tl.float32)
            sq += tl.sum(x * x, axis=1)
        inv = 1.0 / tl.sqrt(sq / K + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        k_ok = ks < K
        x = tl.load(x_ptr + xr[:, None] * K + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if HAS_NORM:
            nw = tl.load(nw_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) * inv[:, None] * nw[None, :]).to(act_ty)
        w_mask = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + rn[:, None] * K + ks[None, :], mask=w_mask, other=0)  # [BLOCK_N, BLOCK_K]
        if SILU:
            w_up = tl.load(w_ptr + (rn + N)[:, None] * K + ks[None, :], mask=w_mask, other=0)
        if DOT:
            if IEEE:
                acc = tl.dot(x, tl.trans(w.to(act_ty)), acc, input_precision="ieee")
                if SILU:
                    acc_up = tl.dot(x, tl.trans(w_up.to(act_ty)), acc_up, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w.to(act_ty)), acc)
                if SILU:
                    acc_up = tl.dot(x, tl.trans(w_up.to(act_ty)), acc_up)
        else:
            xf = x.to(tl.float32)
            acc += tl.sum(xf[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
            if SILU:
                acc_up += tl.sum(xf[:, None, :] * w_up.to(tl.float32)[None, :, :], axis=2)
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
        if SILU:
            acc_up = acc_up * tl.load(s_ptr + N + rn, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if SILU:
            acc_up = acc_up + tl.load(b_ptr + N + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    out_mask = m_ok[:, None] & n_ok[None, :]
    if HAS_RES:
        acc = acc + tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=out_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)


def fused_linear(
    x: torch.Tensor, weight: Weight, *, norm: tuple[torch.Tensor, float] | None = None,
    silu: bool = False, residual: torch.Tensor | None = None, tiles: Tiles | None = None,
    gather: tuple[torch.Tensor, int] | None = None,
) -> torch.Tensor:
    """``y = epilogue(norm(x) @ W.T)`` in one kernel.

    Args:
        x: activations [..., K] (float32, bfloat16 or float16); with ``gather``, a table
            [rows, K] (contiguous) whose selected rows are the activations.
        weight: the projection; with ``silu`` its N rows are the gate's N/2 then the up's N/2
            (``layers._fuse`` of gate and up).
        norm: (weight [K], epsilon): RMSNorm each row of ``x`` first (rounded to ``x``'s dtype).
        silu: return ``silu(gate) * up``, [..., N/2].
        residual: [..., N] in ``x``'s dtype, added to the product (the residual stream).
        tiles: a launch configuration (benchmarks); default ``tiles_for``.
        gather: (ids int64 [M], offset): multiply table rows ``ids + offset`` (e.g. a
            codebook embedding, looked up in the same kernel); ``ids`` may be strided.

    Returns:
        [..., N] (or [..., N/2] with ``silu``) in ``x``'s dtype, accumulated in float32 and
        rounded once; [M, N] with ``gather``.

    Raises:
        ValueError: ``silu`` together with ``residual``.
    """
    if silu and residual is not None:
        raise ValueError("silu and residual do not combine")
    k = x.shape[-1]
    n = weight.out_features // (2 if silu else 1)
    x2 = x.reshape(-1, k).contiguous()
    ids, offset = gather if gather is not None else (None, 0)
    m = x2.shape[0] if ids is None else ids.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    t = tiles or tiles_for(m, n, k, x.element_size())
    res = residual.reshape(m, n).contiguous() if residual is not None else y
    grid = (triton.cdiv(n, t.block_n), triton.cdiv(m, t.block_m))
    w = weight.weight
    launcher(_fused_linear_kernel, x2)[grid](
        x2, w, weight.scale if weight.scale is not None else x2, weight.bias if weight.bias is not None else x2,
        norm[0] if norm is not None else x2, res, y, ids if ids is not None else x2,
        ids.stride(0) if ids is not None else 0, offset, m, n, norm[1] if norm is not None else 0.0,
        K=k, GATHER=ids is not None, HAS_SCALE=weight.scale is not None,
        HAS_BIAS=weight.bias is not None, HAS_NORM=norm is not None,
        HAS_RES=residual is not None, SILU=silu, DOT=t.dot, IEEE=x.dtype == torch.float32,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.warps, num_stages=t.stages,
    )
    return y if ids is not None else y.view(*x.shape[:-1], n)


def fused_linear_eager(
    x: torch.Tensor, weight: Weight, *, norm: tuple[torch.Tensor, float] | None = None,
    silu: bool = False, residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eager form of ``fused_linear`` (library operations, rounding after each)."""
    if norm is not None:
        x = F.rms_norm(x, (x.shape[-1],), norm[0], norm[1])
    y = F.linear(x, weight.dense(x.dtype), weight.bias)
    if silu:
        half = y.shape[-1] // 2
        y = F.silu(y[..., :half]) * y[..., half:]
    if residual is not None:
        y = residual + y
    return y
