"""The rejection sweep of accelerated RPCholesky (:mod:`rpka.attention.accelerated`), and
a round's update of the pivot state.

One round of the accelerated method (Epperly, Tropp & Webber 2024) accepts or rejects its b
candidates in order, each against its residual given the candidates accepted before it in
the round: b sequential Cholesky steps on a b x b tile. :func:`_sweep_torch` is the
reference in PyTorch ops; :func:`rejection_sweep` runs it as one fused kernel where one
exists - Triton on CUDA (:mod:`rpka.attention.triton_sweep`), numba on the CPU
(:func:`rpka.attention.pivot_kernel.rejection_sweep`, bit for bit the torch sweep).
:func:`absorb_torch` writes a round's accepted candidates into the
:class:`~rpka.attention.pivot_state.PivotState`; on the CPU :func:`absorb_compiled` runs the
sweep and that update as one numba call, bit for bit the same.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpka.attention import pivot_kernel, triton_sweep
from rpka.attention.pivot_state import PivotState


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


def compiled_on_cpu(gram: Tensor, threshold: Tensor) -> bool:
    """Whether the sweep runs as numba's loop: a CPU float32/float64 tile without gradient."""
    return (
        gram.device.type == "cpu"
        and gram.dtype in (torch.float32, torch.float64)
        and threshold.dtype == gram.dtype
        and pivot_kernel.AVAILABLE
        and not gram.requires_grad
    )


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
    if compiled_on_cpu(gram, threshold):
        return _sweep_compiled(gram, threshold)
    return _sweep_torch(gram, threshold)


def absorb_torch(
    state: PivotState, w: Tensor, cols: Tensor, accept: Tensor, cand: Tensor, z_c: Tensor
) -> Tensor:
    """Write a round's accepted candidates into ``state`` (the reference, PyTorch ops).

    w (B, r, b) = ``L^{-1} g(Z_S, Z_C)``, cols (B, b, b) the sweep's columns, accept (B, b),
    cand (B, b) and z_c (B, b, d) the candidates. Returns ``keep`` (B, b): the accepted
    candidates that fit in the rank.
    """
    rank, b = state.rank, cand.shape[-1]
    # accepted candidates fill slots count, count+1, ... in the order drawn; a sequence cut
    # at rank is still the sequential rule's sequence, so extra acceptances are dropped
    pos = state.count.unsqueeze(-1) + accept.cumsum(-1) - 1
    keep = accept & (pos < rank)
    slot = torch.where(keep, pos, rank)  # rank = the trash slot
    # new rows of L: old slots from W^T, new slots from the sweep's (lower) Cholesky block
    rows = torch.cat([w.transpose(-1, -2), w.new_zeros(*w.shape[:-2], b, 1)], dim=-1)
    rows.scatter_add_(-1, slot.unsqueeze(-2).expand(-1, b, b), cols.tril() * keep.unsqueeze(-2))
    state.chol_ext.scatter_(-2, slot.unsqueeze(-1).expand(-1, -1, rank + 1), rows)
    state.landmarks_ext.scatter_(-2, slot.unsqueeze(-1).expand(-1, -1, z_c.shape[-1]), z_c)
    state.pivots_ext.scatter_(-1, slot, cand)
    state.count = state.count + keep.sum(-1)
    return keep


def absorb_compiled(
    state: PivotState, gram: Tensor, w: Tensor, threshold: Tensor, cand: Tensor, z_c: Tensor
) -> tuple[Tensor, Tensor]:
    """The sweep and :func:`absorb_torch` as one numba call (:func:`pivot_kernel.absorb`),
    CPU: the same accept decisions and state, bit for bit, without the ~20 small tensor ops
    (~0.4 ms a round at (4 heads, 80 candidates, r = 64), issue 55). ``gram`` is
    overwritten. Returns accept and keep (B, b)."""
    accept = torch.empty(cand.shape, dtype=torch.bool)
    keep = torch.empty(cand.shape, dtype=torch.bool)
    count = state.count.clone()
    buffers = (state.pivots_ext.numpy(), state.landmarks_ext.numpy(), state.chol_ext.numpy())
    pivot_kernel.absorb(
        gram.contiguous().numpy(),
        threshold.contiguous().numpy(),
        w.contiguous().numpy(),
        cand.contiguous().numpy(),
        z_c.contiguous().numpy(),
        count.numpy(),
        buffers,
        accept.numpy(),
        keep.numpy(),
    )
    state.count = count
    return accept, keep
