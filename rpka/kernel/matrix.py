"""The matrix RPKA pivots, built as :class:`rpka.attention.rpka.RPKAttention` builds it,
for the studies that look at it from outside (``rpka.kernel.mechanism``, ``rpka.kernel.quality``,
``rpka.kernel.spectrum``): the pivot points ``[q~; k~]`` (or keys only), ``A_tau = D^tau G D^tau``
in the package's units, one Schur step of a residual, and the eigenvalue tails that give
the best rank-r trace error (Eckart-Young-Mirsky). Float64 throughout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rpka.attention.frame import KEYS_RATIO, balanced_frame
from rpka.attention.rpcholesky import gaussian_kernel, weighting_power
from rpka.attention.rpka import PIVOT_SETS


def pivot_points(q: Tensor, k: Tensor, pivot_set: str = "joint") -> Tensor:
    """The points RPKA pivots, in float64: (..., n, d), (..., m, d) -> (..., N, d).

    Mirrors :meth:`RPKAttention.attend`: ``q~ = q d^{-1/4} alpha``, keys scaled by
    ``d^{-1/4} / alpha`` and centred by their mean (guard 1), with the q/k balance alpha of
    :func:`rpka.attention.frame.balanced_frame`; joint set ``[q~; k~]`` (N = n + m) or keys
    only (N = m).
    """
    if pivot_set not in PIVOT_SETS:
        raise ValueError(f"pivot_set must be one of {PIVOT_SETS}, got {pivot_set!r}")
    q, k = q.detach().to(torch.float64), k.detach().to(torch.float64)
    frame = balanced_frame(q, k, key_ratio=1.0 if pivot_set == "joint" else KEYS_RATIO)
    q_s = q * frame.q_scale
    k_s = k * frame.k_scale - frame.key_shift
    return torch.cat([q_s, k_s], dim=-2) if pivot_set == "joint" else k_s


def pivoted_matrix(points: Tensor, weighting: str = "gauss", tempering: float = 0.5) -> Tensor:
    """``A_tau = D^tau G D^tau`` in the package's units: points (..., N, d) -> (..., N, N).

    ``D^tau`` enters as ``sqrt(w)`` with ``w = exp(tau |z|^2 - max tau |z|^2)``, the weight
    :func:`rpcholesky` uses, so ``trace(A_tau)`` equals its ``trace[..., 0]``.
    """
    tau = weighting_power(weighting, tempering)
    z = points.to(torch.float64)
    log_weight = tau * z.pow(2).sum(-1)
    root = torch.exp((log_weight - log_weight.amax(-1, keepdim=True)) / 2)
    return root.unsqueeze(-1) * gaussian_kernel(z, z) * root.unsqueeze(-2)


def schur_step(residual: Tensor, pivot: Tensor) -> Tensor:
    """``R - R[:, s] R[s, :] / R_ss`` for residual (..., N, N) and pivot (...,) long."""
    col = torch.gather(
        residual, -1, pivot[..., None, None].expand(*pivot.shape, residual.shape[-1], 1)
    )
    piv = torch.gather(col, -2, pivot[..., None, None])  # (..., 1, 1)
    return residual - col @ col.transpose(-1, -2) / piv


def optimal_trace_error(matrix: Tensor, ranks: Sequence[int]) -> Tensor:
    """Best rank-r trace error of a PSD matrix (..., N, N): ``sum_{i > r} lambda_i``.

    Eigenvalues by ``torch.linalg.eigvalsh`` in float64; round-off negatives count as 0.
    Returns (..., len(ranks)).
    """
    return tail_sums(kernel_eigenvalues(matrix), ranks)


def kernel_eigenvalues(matrix: Tensor) -> Tensor:
    """Eigenvalues of a PSD matrix (..., N, N) in descending order, float64, negatives -> 0."""
    return torch.linalg.eigvalsh(matrix.to(torch.float64)).flip(-1).clamp(min=0.0)


def tail_sums(eig: Tensor, ranks: Sequence[int]) -> Tensor:
    """``sum_{i > r} lambda_i`` for descending eigenvalues (..., N) -> (..., len(ranks))."""
    tails = eig.flip(-1).cumsum(-1).flip(-1)  # tails[..., i] = sum_{j >= i} lambda_j
    tails = torch.cat([tails, tails.new_zeros(*tails.shape[:-1], 1)], dim=-1)
    index = torch.tensor([min(r, eig.shape[-1]) for r in ranks], device=eig.device)
    return tails[..., index]
