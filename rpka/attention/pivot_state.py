"""The point set and the pivot state: what the pivot selectors and the Nystrom estimator share.

:class:`PointSet` is the pivoted point set ``Z = [q~; k~ - mean]`` (or the keys) read in
place, in chunks (:func:`chunk_bounds`) or at candidate indices; :class:`PivotState` is a
selection's result - pivots, landmarks ``Z_S`` and the Cholesky factor ``L`` of
``G(Z_S, Z_S)`` (docs/design.md section 2). The accelerated selection
(:mod:`rpka.attention.accelerated`) writes them and the chunked estimator
(:func:`rpka.attention.nystrom_chunked.nystrom_softmax_chunked`) reads them, so they live below
both, and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FastPathDefaults:
    """Tuning constants of the accelerated pivot selection and the chunked Nystrom pass."""

    # candidates per round at most; the fused CUDA sweep keeps a block x block tile in registers
    max_block: int = 128
    min_block: int = 8
    # adaptive block: candidates = margin * (pivots still missing) / (last acceptance rate)
    block_margin: float = 1.25
    # refresh="auto": refresh the proposal after a round that accepted less than this fraction
    refresh_below: float = 0.5
    # working-set budget of one chunk of points in the passes over all N points (bytes)
    chunk_bytes: int = 32 * 2**20
    # the same for the proposal refresh (residual_diagonal): its (B, r, rows) buffers are
    # live beside a training step's activations, and its matrix products run faster in cache
    refresh_chunk_bytes: int = 2**21
    # the same for the squared norms (sq_norms): four element-wise passes over a chunk, which
    # run from cache at this size - 0.50 against 1.40 ms for 2 x 1,024 points of (4, 64)
    # in one chunk, 64 KiB slower again (per-chunk overhead); issue 55, one thread
    norm_chunk_bytes: int = 2**18


FAST = FastPathDefaults()

# working-set budget of one group's / chunk's (rows x r) buffer in the passes that stream the
# Nystrom estimate (training: rpka.attention.streamed; inference: the chunked estimate), in
# bytes: on a CPU a few fit in L2 cache (at 4,096 tokens the inference pass went from 78 to
# 46 ms and its peak from 49.5 to 14.7 MiB, issue 39); elsewhere a group must be large
# enough to fill the device (memory is the limit)
STREAM_BYTES = {"cpu": 2**21}
STREAM_BYTES_OTHER = 2**26


def inference_chunk_bytes(device: torch.device) -> int:
    """Chunk budget of the chunked (inference) estimate on ``device``: the training path's
    cache-sized ``STREAM_BYTES`` where one is set (CPU), ``FAST.chunk_bytes`` elsewhere."""
    return STREAM_BYTES.get(device.type, FAST.chunk_bytes)


def chunk_bounds(n: int, row_bytes: int, budget: int | None = None) -> list[tuple[int, int]]:
    """Split n rows into equal chunks of at most ``budget // row_bytes`` rows
    (``budget``: ``FAST.chunk_bytes`` by default)."""
    most = max(1, (budget or FAST.chunk_bytes) // max(row_bytes, 1))
    count = -(-n // most)
    size = -(-n // count)
    return [(start, min(start + size, n)) for start in range(0, n, size)]


class PointSet:
    """The points ``Z = [x_1 * scale - shift_1; x_2 * scale - shift_2; ...]``, never copied.

    Each part ``x_i`` is (..., n_i, d) in any floating dtype; ``shift_i`` is None or
    broadcastable to (..., 1, d). The accelerated pivot selection reads the points only at
    candidate indices (:meth:`take`) and, when it refreshes its proposal or needs norms, in
    chunks (:meth:`chunks`), so the joint set ``[Q~; K~ - mean]`` of a long sequence is
    never materialised (nor converted to float32 as a whole).

    Internally the leading dims are flattened into one batch dim B.
    """

    def __init__(
        self,
        parts: Sequence[Tensor],
        scale: float | Tensor | Sequence[float | Tensor] = 1.0,
        shifts: Sequence[Tensor | None] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not parts:
            raise ValueError("parts must hold at least one tensor")
        shifts = [None] * len(parts) if shifts is None else list(shifts)
        # one scale for every part, or one per part; a tensor scale is per batch element,
        # broadcastable to (..., 1, 1) (the q/k balance of RPKA scales queries and keys apart)
        scales = list(scale) if isinstance(scale, list | tuple) else [scale] * len(parts)
        self.batch_shape = parts[0].shape[:-2]
        self.dim = parts[0].shape[-1]
        self.dtype = dtype
        self.scales = [
            s.detach().to(dtype).reshape(-1, 1, 1) if isinstance(s, Tensor) else s for s in scales
        ]
        self.parts = [p.detach().reshape(-1, p.shape[-2], self.dim) for p in parts]
        self.shifts = [
            None if s is None else s.detach().to(dtype).reshape(-1, 1, self.dim) for s in shifts
        ]
        self.sizes = [p.shape[-2] for p in self.parts]
        self.n_points = sum(self.sizes)
        self.batch = self.parts[0].shape[0]
        self.device = self.parts[0].device

    def _convert(self, x: Tensor, scale: float | Tensor, shift: Tensor | None) -> Tensor:
        x = x.to(self.dtype) * scale
        return x if shift is None else x - shift

    def take(self, index: Tensor) -> Tensor:
        """Points at ``index`` (B, b) (values in [0, N)) -> (B, b, d) in ``dtype``."""
        out = None
        offset = 0
        # advanced indexing copies whole rows (~2x faster on a CPU than gather's (B, b, d)
        # index, issue 55); the same values
        batch = torch.arange(index.shape[0], device=index.device).unsqueeze(-1)
        for part, scale, shift, size in zip(
            self.parts, self.scales, self.shifts, self.sizes, strict=True
        ):
            local = index - offset if offset else index
            rows = part[batch, local.clamp(0, size - 1)]
            rows = self._convert(rows, scale, shift)
            if out is None:
                out = rows
            else:  # later parts own the indices at and after their offset
                out = torch.where((local >= 0).unsqueeze(-1), rows, out)
            offset += size
        return out

    def row_bytes(self, width: int) -> int:
        """Bytes of one row of a (B, rows, width) buffer in ``dtype``."""
        return self.batch * max(width, self.dim) * torch.finfo(self.dtype).bits // 8

    def chunks(self, width: int, budget: int | None = None) -> Iterator[tuple[int, Tensor]]:
        """Yield ``(start, Z[:, start:stop])`` over all N points, part by part, in chunks
        whose (B, rows, width) buffers fit ``budget`` bytes (``FAST.chunk_bytes``)."""
        offset = 0
        for part, scale, shift, size in zip(
            self.parts, self.scales, self.shifts, self.sizes, strict=True
        ):
            for start, stop in chunk_bounds(size, self.row_bytes(width), budget):
                yield offset + start, self._convert(part[:, start:stop], scale, shift)
            offset += size

    def sq_norms(self) -> Tensor:
        """``|z_i|^2`` for all points, (B, N)."""
        out = torch.empty(self.batch, self.n_points, dtype=self.dtype, device=self.device)
        budget = FAST.norm_chunk_bytes if self.device.type == "cpu" else None
        for start, z in self.chunks(self.dim, budget):
            out[:, start : start + z.shape[-2]] = z.pow(2).sum(-1)
        return out


@dataclass
class PivotState:
    """Output of :func:`accelerated_pivots` (batch flattened to B).

    The buffers carry one extra slot (index r) that absorbs the writes of rejected
    candidates, so a round updates them in place with fixed-shape scatters; the
    properties below are the r real slots.

    Attributes:
        pivots_ext: (B, r + 1) long; ``pivots`` (B, r): indices in the order drawn, ``-1``
            in unused slots (at the end).
        landmarks_ext: (B, r + 1, d); ``landmarks`` (B, r, d): the pivot points (zeros in
            unused slots).
        chol_ext: (B, r + 1, r + 1); ``chol`` (B, r, r): lower Cholesky factor of
            ``G(Z_S, Z_S)`` on the used slots, identity on unused ones, so
            ``L^{-1} g(Z_S, x)`` is zero there.
        count: (B,) long, pivots drawn.
        rounds: rounds run (each holds one block of candidates).
        refreshes: how many times the proposal was refreshed.
        candidates: candidates drawn in all (the sequential sweep length).
    """

    pivots_ext: Tensor
    landmarks_ext: Tensor
    chol_ext: Tensor
    count: Tensor
    rounds: int = 0
    refreshes: int = 0
    candidates: int = 0

    @classmethod
    def empty(cls, batch: int, rank: int, dim: int, like: Tensor) -> PivotState:
        chol_ext = like.new_zeros(batch, rank + 1, rank + 1)  # identities, without a repeat
        chol_ext.diagonal(dim1=-2, dim2=-1).fill_(1.0)
        return cls(
            pivots_ext=torch.full((batch, rank + 1), -1, dtype=torch.long, device=like.device),
            landmarks_ext=like.new_zeros(batch, rank + 1, dim),
            chol_ext=chol_ext,
            count=torch.zeros(batch, dtype=torch.long, device=like.device),
        )

    @property
    def rank(self) -> int:
        return self.pivots_ext.shape[-1] - 1

    @property
    def pivots(self) -> Tensor:
        return self.pivots_ext[:, :-1]

    @property
    def landmarks(self) -> Tensor:
        return self.landmarks_ext[:, :-1]

    @property
    def chol(self) -> Tensor:
        return self.chol_ext[:, :-1, :-1]

    @property
    def valid(self) -> Tensor:
        """(B, r) bool: slots that hold a pivot."""
        return self.pivots >= 0
