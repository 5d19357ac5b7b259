"""The rejection sweep of accelerated RPCholesky (:mod:`rpka.attention.accelerated`).

One round of the accelerated method (Epperly, Tropp & Webber 2024) accepts or rejects its b
candidates in order, each against its residual given the candidates accepted before it in
the round: b sequential Cholesky steps on a b x b tile. :func:`_sweep_torch` is the
reference in PyTorch ops; :func:`rejection_sweep` runs it as one fused kernel where one
exists - Triton on CUDA (:mod:`rpka.attention.triton_sweep`), numba on the CPU
(:func:`rpka.attention.pivot_kernel.rejection_sweep`, bit for bit the torch sweep).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpka.attention import pivot_kernel, triton_sweep


def _sweep_torch(gram: Tensor, threshold: Tensor) -> tuple[Tensor, Tensor]:
    """Sequential rejection sweep over b candidates - the plain-PyTorch path.

    Candidate j is accepted iff its residual *given the candidates accepted before it in
    this block* exceeds ``threshold[:, j]``; accepting it eliminates it (one Cholesky step),
    rejecting it leaves the residual matrix untouched.

    Args:
        gram: (B, b, b) residual Gram matrix of the candidates given the pivots accepted in
            earlier rounds.
        threshold: (B, b) acceptance thresholds.

    Returns:
        accept (B, b) bool and cols (B, b, b): column j is the Cholesky column of candidate
        j if accepted (``cols[:, j, j] = sqrt(residual) > 0``), zero if rejected.
    """
    h = gram.clone()
    cols = []
    # (B, 1, 1) views throughout: few dispatcher calls per step (the loop is launch-bound)
    limits = threshold.unsqueeze(-1).split(1, dim=-2)
    for j, limit in enumerate(limits):
        col = h.narrow(2, j, 1)  # (B, b, 1): column j (h is symmetric)
        pivot = col.narrow(1, j, 1)
        ok = pivot > limit
        # rsqrt(inf) = 0: a rejected candidate's column is zero and the update a no-op
        col = col * torch.where(ok, pivot, float("inf")).rsqrt()
        h.addcmul_(col, col.transpose(1, 2), value=-1.0)
        cols.append(col)
    cols = torch.cat(cols, dim=-1)
    return cols.diagonal(dim1=-2, dim2=-1) > 0, cols


def _sweep_compiled(gram: Tensor, threshold: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_sweep_torch` as one numba loop (:func:`pivot_kernel.rejection_sweep`), CPU.

    The same accept decisions and columns below the diagonal (entries above it are zero
    here, round-off there; :func:`_absorb_block` keeps ``cols.tril()`` only).
    """
    h = gram.contiguous().clone()
    cols_t = torch.zeros_like(h)
    pivot_kernel.rejection_sweep(h.numpy(), threshold.contiguous().numpy(), cols_t.numpy())
    cols = cols_t.transpose(-1, -2)
    return cols.diagonal(dim1=-2, dim2=-1) > 0, cols


def rejection_sweep(gram: Tensor, threshold: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_sweep_torch`, fused into one kernel: Triton on CUDA when available, numba
    on the CPU (:func:`_sweep_compiled`).

    The sweep is inherently sequential in the b candidates but touches only a b x b tile,
    so its cost in PyTorch is ~b launch-bound steps (~3 ms a round on the CPU for b = 80,
    B = 8): the fused kernel does all b steps in one call.
    """
    if gram.is_cuda and gram.dtype == torch.float32 and triton_sweep.available():
        fused = triton_sweep.sweep(gram, threshold)
        if fused is not None:  # None: the kernel failed (it warned and switched itself off)
            return fused
    if (
        gram.device.type == "cpu"
        and gram.dtype in (torch.float32, torch.float64)
        and threshold.dtype == gram.dtype
        and pivot_kernel.AVAILABLE
        and not gram.requires_grad
    ):
        return _sweep_compiled(gram, threshold)
    return _sweep_torch(gram, threshold)
