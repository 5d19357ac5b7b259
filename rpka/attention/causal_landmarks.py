"""Causal RPKA's landmarks: when they are drawn, how, and the key moments ``M_c`` of eq. (2).

The terms of :mod:`rpka.attention.causal` (its docstring has the equations and the
schedule): the *landmark schedule* (draw blocks 1, then ``2c`` after a draw at block ``c``,
or ``c + 1`` while the pool fits the rank and the past is exact), the landmarks
``Z_c`` (RPCholesky pivots of the points at positions ``< cb``) with the Cholesky factor
of ``G_ZZ``, and the key moments

    M_c = sum_{j < cb} g(Z_c, k'_j) w_j [v_j, 1]                                        (2)

against a log reference per landmark, merged block by block as in online softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rpka.attention.nystrom import (
    Core,
    gather_points,
    key_moments,
    landmark_cholesky,
    landmark_logits,
    solve_core,
)
from rpka.attention.rpcholesky import rpcholesky

# ----------------------------------------------------------------------------- schedule


def past_is_exact(block: int, block_size: int, rank: int, points_per_position: int) -> bool:
    """Whether block ``block``'s pool (``block * block_size * points_per_position`` points)
    fits in ``rank``: its past part is then computed exactly, with no landmarks."""
    return block * block_size * points_per_position <= rank


def next_draw(block: int, block_size: int, rank: int, points_per_position: int) -> int:
    """The block at which landmarks are redrawn after a draw at ``block``.

    ``block + 1`` while ``block``'s past is exact (:func:`past_is_exact`), else ``2 * block``.
    """
    return block + 1 if past_is_exact(block, block_size, rank, points_per_position) else 2 * block


def draw_blocks(n_blocks: int, block_size: int, rank: int, points_per_position: int) -> list[int]:
    """The draw blocks ``< n_blocks`` in order (empty for one block)."""
    blocks, block = [], 1
    while block < n_blocks:
        blocks.append(block)
        block = next_draw(block, block_size, rank, points_per_position)
    return blocks


def first_draw_from(n_blocks: int, block_size: int, rank: int, points_per_position: int) -> int:
    """The first draw block ``>= n_blocks``: where a decoder continuing ``n_blocks`` draws."""
    block = 1
    while block < n_blocks:
        block = next_draw(block, block_size, rank, points_per_position)
    return block


# ----------------------------------------------------------------------------- landmarks


@dataclass(frozen=True)
class LandmarkSampler:
    """RPCholesky options of :class:`RPKAttention`: how landmarks are drawn from a prefix."""

    rank: int
    pivot_rule: str
    pivot_set: str
    weighting: str
    tempering: float
    generator: torch.Generator | None = None
    pivot_backend: str = "auto"  # rpcholesky's loop: compiled on the CPU, torch elsewhere

    @property
    def points_per_position(self) -> int:
        return 2 if self.pivot_set == "joint" else 1

    def __call__(self, q_s: Tensor | None, k_c: Tensor) -> tuple[Tensor, Tensor]:
        """Pivots of the points of a prefix: q_s, k_c (..., m, d) -> (..., rank, d), (..., rank).

        Validity is False for padded or skipped pivots (their landmark rows are zero).
        """
        points = torch.cat([q_s, k_c], dim=-2) if self.pivot_set == "joint" else k_c
        pivots = rpcholesky(
            points,
            self.rank,
            self.pivot_rule,
            self.generator,
            weighting=self.weighting,
            tempering=self.tempering,
            pivot_backend=self.pivot_backend,
        ).pivots
        pivots = F.pad(pivots, (0, self.rank - pivots.shape[-1]), value=-1)  # rank capped at m
        return gather_points(points, pivots), pivots >= 0  # differentiable in q and k


@dataclass
class LandmarkSet:
    """Landmarks ``Z`` (..., r, d), validity (..., r), and the Cholesky factor of ``G_ZZ``."""

    points: Tensor
    valid: Tensor
    chol: Tensor  # float64 (nystrom.landmark_cholesky)

    @classmethod
    def draw(cls, sampler: LandmarkSampler, q_s: Tensor | None, k_c: Tensor) -> LandmarkSet:
        points, valid = sampler(q_s, k_c)
        return cls(points, valid, landmark_cholesky(points, valid))

    def per_block(self) -> LandmarkSet:
        """The same landmarks with a block dimension (size 1) before the point dimension."""
        return LandmarkSet(
            self.points.unsqueeze(-3), self.valid.unsqueeze(-2), self.chol.unsqueeze(-3)
        )

    def moments(self, k_c: Tensor, v: Tensor) -> Moments:
        """The key moments of eq. (2) over keys k_c (..., m, d) and values v (..., m, d_v)."""
        return Moments(*key_moments(k_c, v, self.points, self.valid))

    def solve(self, moments: Moments) -> Core:
        """``G_ZZ^{-1} M`` with a log scale per landmark: (..., r, d_v + 1), (..., r)."""
        return solve_core(moments.rho, moments.num, self.chol, self.points.dtype)

    def past_logits(self, q_s: Tensor, core: Core) -> Tensor:
        """Log-terms of eq. (2), ``log(g(q~_i, z_s) e^{lambda_s})``: (..., L, d) -> (..., L, r).

        ``q~.z - |z|^2/2 - |q~|^2/2 + lambda``: on the scale of the local ``s_ij``, so one row
        maximum serves both parts (one log-sum-exp for the whole row).
        """
        half_sq = q_s.pow(2).sum(-1, keepdim=True) / 2
        logits = landmark_logits(q_s, self.points, self.valid) - half_sq
        return logits + core.log_scale.unsqueeze(-2)


# ----------------------------------------------------------------------------- moments


@dataclass
class Moments:
    """Key moments against a log reference per landmark, for a set of keys ``J``:

    ``num_s = sum_{j in J} e^{z_s.k'_j - |z_s|^2/2 - rho_s} [v_j, 1]``  (..., r, d_v + 1),
    i.e. ``g(z_s, k'_j) w_j`` against ``rho_s``  (..., r).
    """

    rho: Tensor
    num: Tensor

    def merge(self, other: Moments) -> Moments:
        """Moments of the union of two disjoint key sets (the online-softmax rescale)."""
        rho = torch.maximum(self.rho, other.rho)
        a, b = torch.exp(self.rho - rho), torch.exp(other.rho - rho)
        return Moments(rho, a.unsqueeze(-1) * self.num + b.unsqueeze(-1) * other.num)

    def part(self, index: slice | int) -> Moments:
        """Index the last batch dimension (the one before the landmark dimension)."""
        return Moments(self.rho[..., index, :], self.num[..., index, :, :])

    @staticmethod
    def cat(parts: list[Moments]) -> Moments:
        return Moments(torch.cat([p.rho for p in parts], -2), torch.cat([p.num for p in parts], -3))

    def unsqueeze(self) -> Moments:
        return Moments(self.rho.unsqueeze(-2), self.num.unsqueeze(-3))


def prefix_merge(moments: Moments) -> Moments:
    """Inclusive prefix merge along the last batch dimension (Hillis-Steele scan).

    Entry ``s`` of the result merges entries ``0..s``; it reads no later entry, and takes
    ``ceil(log2 S)`` vectorised rounds instead of ``S`` sequential ones.
    """
    size, stride = moments.rho.shape[-2], 1
    while stride < size:
        merged = moments.part(slice(None, -stride)).merge(moments.part(slice(stride, None)))
        moments = Moments.cat([moments.part(slice(None, stride)), merged])
        stride *= 2
    return moments


def epoch_moments(
    landmarks: LandmarkSet, k_c: Tensor, v: Tensor, start: int, stop: int, block_size: int
) -> Moments:
    """Moments ``M_c`` for the blocks ``c = start .. stop-1`` of one landmark epoch.

    ``M_c`` covers the keys before block ``c``: the prefix before ``start`` in one piece,
    then one block at a time, merged by :func:`prefix_merge`. Shapes (..., stop - start, ...).
    """
    b = block_size
    first = landmarks.moments(k_c[..., : start * b, :], v[..., : start * b, :]).unsqueeze()
    if stop - start == 1:
        return first
    later = slice(start * b, (stop - 1) * b)
    k_blocks = k_c[..., later, :].unflatten(-2, (-1, b))
    v_blocks = v[..., later, :].unflatten(-2, (-1, b))
    blocks = landmarks.per_block().moments(k_blocks, v_blocks)
    return prefix_merge(Moments.cat([first, blocks]))
