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

from rpka.attention.accelerated import accelerated_pivots
from rpka.attention.nystrom import (
    CORE_DTYPE,
    Core,
    finite_or_zero,
    gather_points,
    key_moments,
    landmark_cholesky,
    landmark_logits,
    solve_core,
)
from rpka.attention.pivot_state import PointSet
from rpka.attention.rpcholesky import rpcholesky, weighting_power

# Pools of at least this many points are drawn by the attention's pivot method (the
# accelerated block + rejection RPCholesky by default, the same law as the plain loop);
# smaller ones by the plain loop. Measured (issue 55, one thread, (8, N, 64) float32, rank
# 64): plain 3.4 / 5.1 / 38 / 450 ms at N = 128 / 256 / 2,048 / 16,384 points, accelerated
# 5.3 / 3.3 / 3.5 / 3.5 ms. Short contexts (the lm track: 64 tokens, pools <= 96 points)
# keep the plain loop and their draws.
ACCELERATE_FROM_POINTS = 256

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
    pivot_method: str = "plain"  # "accelerated": large pools by accelerated_pivots
    candidates: int | None = None  # the accelerated method's options (RPKAttention's)
    refresh: str = "auto"
    residual_solve: str = "triangular"

    @property
    def points_per_position(self) -> int:
        return 2 if self.pivot_set == "joint" else 1

    def __call__(self, q_s: Tensor | None, k_c: Tensor) -> tuple[Tensor, Tensor]:
        """Pivots of the points of a prefix: q_s, k_c (..., m, d) -> (..., rank, d), (..., rank).

        Validity is False for padded or skipped pivots (their landmark rows are zero).
        """
        return self.with_pivots(q_s, k_c)[:2]

    def with_pivots(self, q_s: Tensor | None, k_c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`__call__`'s landmarks and validity, and the pivots (..., rank) into the pool
        ``[q_s; k_c]`` (joint) or ``k_c`` (-1 where none was drawn)."""
        points = torch.cat([q_s, k_c], dim=-2) if self.pivot_set == "joint" else k_c
        pivots = self.pivots(points)
        pivots = F.pad(pivots, (0, self.rank - pivots.shape[-1]), value=-1)  # rank capped at m
        return gather_points(points, pivots), pivots >= 0, pivots  # differentiable in q and k

    @torch.no_grad()
    def pivots(self, points: Tensor) -> Tensor:
        """Pivot indices (..., r') into points (..., N, d), -1 in unused slots."""
        n_points = points.shape[-2]
        if self.pivot_method == "accelerated" and n_points >= ACCELERATE_FROM_POINTS:
            flat = points.reshape(-1, n_points, points.shape[-1])
            tau = weighting_power(self.weighting, self.tempering)
            state = accelerated_pivots(
                PointSet([flat], dtype=flat.dtype),
                self.rank,
                self.pivot_rule,
                self.generator,
                log_weight=tau * flat.pow(2).sum(-1) if tau > 0 else None,  # rpcholesky's
                block_size=self.candidates,
                refresh=self.refresh,
                residual_solve=self.residual_solve,
            )
            return state.pivots.reshape(*points.shape[:-2], -1)  # -1 where none was drawn
        return rpcholesky(
            points,
            self.rank,
            self.pivot_rule,
            self.generator,
            weighting=self.weighting,
            tempering=self.tempering,
            pivot_backend=self.pivot_backend,
        ).pivots


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
    """Inclusive prefix merge along the last batch dimension, one entry at a time.

    Entry ``s`` of the result merges entries ``0..s`` in order (``((m_0 + m_1) + m_2) ...``,
    the order in which decoding folds blocks in); it reads no later entry. Each step is a few
    ops on one (..., r, d_v + 1) slice: S steps of that size cost ~log2(S) times less than
    the Hillis-Steele scan's log2(S) passes over all S entries (136 of 688 ms at 8,192
    tokens, issue 55). For S <= 2 the two scans are the same ops.
    """
    parts = [moments.part(0)]
    for s in range(1, moments.rho.shape[-2]):
        parts.append(parts[-1].merge(moments.part(s)))
    return Moments(torch.stack([p.rho for p in parts], -2), torch.stack([p.num for p in parts], -3))


@dataclass
class WideKeys:
    """Centred keys (..., n, d) and values (..., n, d_v) for the key side, in its dtype.

    Without gradients they are converted once per call and dtype, ``[v, 1]`` included
    (``key_moments`` widened each epoch's prefix again: 6 copies of (8, 8,192, 64) at 8,192
    tokens). With gradients each use widens its own slice to float64, as before: the
    gradients of k and v are then summed over the uses in their own dtype, bit for bit the
    old path's.
    """

    keys: Tensor
    values: Tensor
    converted: dict[torch.dtype, tuple[Tensor, Tensor]]
    # with gradients and ``block_pieces``: keys and values split into blocks once, and a
    # use's rows concatenated from them - the backward of a slice fills and adds a zero
    # gradient of the whole (..., n, d) input per use (issue 55; ~15 % of a forward +
    # backward at 4,096 tokens), a concatenation's backward only views. The gradients' sums
    # then run in another order: round-off, so only the long training path takes it
    pieces: tuple[tuple[Tensor, ...], tuple[Tensor, ...], int] | None = None

    @classmethod
    def of(cls, k_c: Tensor, v: Tensor, rows: int, block_pieces: int | None = None) -> WideKeys:
        """The first ``rows`` positions of k_c, v (with gradients: all of them, and split
        into blocks of ``block_pieces`` positions if given)."""
        if torch.is_grad_enabled() and (k_c.requires_grad or v.requires_grad):
            if block_pieces is None:
                return cls(k_c, v, {})  # whole: a slice more would reorder the grad's sums
            b = block_pieces
            return cls(k_c, v, {}, (k_c.split(b, dim=-2), v.split(b, dim=-2), b))
        return cls(k_c[..., :rows, :], v[..., :rows, :], {})

    def inputs(self, rows: slice, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Keys and ``[v, 1]`` of ``rows`` in ``dtype``."""
        if self.pieces is not None and torch.is_grad_enabled():
            keys, values, b = self.pieces  # rows start and stop on block boundaries
            first, last = rows.start // b, rows.stop // b
            keys, values = torch.cat(keys[first:last], -2), torch.cat(values[first:last], -2)
            return keys.to(dtype), with_ones(values.to(dtype))
        if torch.is_grad_enabled() and (self.keys.requires_grad or self.values.requires_grad):
            keys, values = self.keys[..., rows, :], self.values[..., rows, :]
            return keys.to(dtype), with_ones(values.to(dtype))
        if dtype not in self.converted:
            values = self.values.to(dtype)
            self.converted[dtype] = (self.keys.to(dtype), with_ones(values))
        keys, values = self.converted[dtype]
        return keys[..., rows, :], values[..., rows, :]

    def moments(
        self, landmarks: LandmarkSet, rows: slice, block_size: int | None = None
    ) -> Moments:
        """:func:`key_moments` of the keys ``rows`` (in blocks of ``block_size`` if given),
        in float64: ``key_moments`` bit for bit."""
        keys, values = self.inputs(rows, CORE_DTYPE)
        points, valid = landmarks.points, landmarks.valid
        if block_size is not None:
            keys = keys.unflatten(-2, (-1, block_size))
            values = values.unflatten(-2, (-1, block_size))
            points, valid = points.unsqueeze(-3), valid.unsqueeze(-2)
        # key_moments' ops, on the converted inputs
        logits = landmark_logits(keys, points.to(CORE_DTYPE), valid)  # (..., m, r)
        rho = finite_or_zero(logits.amax(-2).detach())
        terms = torch.exp(logits - rho.unsqueeze(-2))
        return Moments(rho, terms.transpose(-1, -2) @ values)


def with_ones(v: Tensor) -> Tensor:
    """``[v, 1]``: (..., m, d_v) -> (..., m, d_v + 1)."""
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def epoch_moments(
    landmarks: LandmarkSet, wide: WideKeys, start: int, stop: int, block_size: int
) -> Moments:
    """Moments ``M_c`` for the blocks ``c = start .. stop-1`` of one landmark epoch.

    ``M_c`` covers the keys before block ``c``: the prefix before ``start`` in one piece,
    then one block at a time, merged by :func:`prefix_merge`. Shapes (..., stop - start, ...).
    (The streamed inference path has its own, chunked: ``causal_stream.epoch_moments``.)
    """
    b = block_size
    first = wide.moments(landmarks, slice(0, start * b)).unsqueeze()
    if stop - start > 1:
        blocks = wide.moments(landmarks, slice(start * b, (stop - 1) * b), b)
        first = prefix_merge(Moments.cat([first, blocks]))
    return first
