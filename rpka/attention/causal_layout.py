"""The layout of causal RPKA's streamed path (issue 55): the inputs of one call as
(B, n, e) views cut into blocks and chunks (:class:`Stream`), what a forward records for the
training path's backward (:class:`Tape`, one :class:`Epoch` per landmark epoch), and guard
3's value range at each block's first row and, where needed, row by row
(:mod:`rpka.attention.causal_stream` has the method; :mod:`rpka.attention.causal_train` its
backward)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rpka.attention import range_kernel
from rpka.attention.causal_landmarks import LandmarkSet, Moments

# Bytes of one chunk's (rows x width) buffers: in the core's cache, yet large enough that a
# chunk's dozen ops cost more than their dispatch. At 4,096 and 8,192 tokens, (1, 8, n, 64),
# r = 64, one thread (issue 55): 1 and 2 MiB the same within noise, 8 MiB slower (out of the
# 2 MiB L2 cache). A chunk is at least one block.
STREAM_CHUNK_BYTES = 1 << 20


@dataclass
class Epoch:
    """One landmark epoch: blocks ``start .. stop - 1``, its landmarks, their pivots (B, r)
    into the pool of the first ``start b`` positions (queries first), ``M_c`` per block."""

    start: int
    stop: int
    landmarks: LandmarkSet
    pivots: Tensor
    moments: Moments


@dataclass
class Tape:  # what the training path's backward reads (causal_train), recorded by a forward
    joint: bool  # the pool: [q~; k'] (joint) or k' (keys)
    stream: Stream | None = None
    lse: Tensor | None = None  # the local part's log-sum-exp (B, n, 1)
    epochs: list[Epoch] = field(default_factory=list)
    clamped: list[tuple[slice, Tensor, Tensor]] = field(default_factory=list)  # rows, <, >


@dataclass
class Stream:
    """The inputs of one call as (B, n, e) views (leading dims flattened) and its layout."""

    q: Tensor
    k: Tensor
    v: Tensor
    scale: float  # q~ = q scale, k~ = k scale
    block: int
    centre: Tensor  # mu: mean of the scaled keys of block 0, (B, 1, d)
    tape: Tape | None = None  # what the training path's backward reads (causal_train)

    @property
    def n(self) -> int:
        return self.q.shape[-2]

    def rows(self, start: int, stop: int) -> slice:
        """Rows of blocks ``start .. stop - 1`` (the last block may be partial)."""
        return slice(start * self.block, min(stop * self.block, self.n))

    def chunks(self, start: int, stop: int, width: int) -> list[tuple[int, int]]:
        """Blocks ``start .. stop - 1`` in runs whose (B, rows, width) float buffers fit
        :data:`STREAM_CHUNK_BYTES`; a partial last block is a chunk of its own."""
        per_block = self.q.shape[0] * self.block * width * self.q.element_size()
        step = max(1, STREAM_CHUNK_BYTES // per_block)
        full = min(stop, self.n // self.block)
        out = [(c, min(c + step, full)) for c in range(start, full, step)]
        return out + [(full, stop)] if stop > full else out

    def scaled_keys(self, rows: slice) -> Tensor:
        """``k~ - mu`` of ``rows`` (a fresh chunk)."""
        return torch.mul(self.k[:, rows], self.scale).sub_(self.centre)


# ----------------------------------------------------------------------------- value range


def extremes(x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """``x.amin(dim), x.amax(dim)``: two reductions, 4.7x faster than ``torch.aminmax`` along
    a middle dimension on the CPU (0.9 against 4.3 ms for (8, 16, 256, 64), one thread)."""
    return x.amin(dim, keepdim=keepdim), x.amax(dim, keepdim=keepdim)


def block_ranges(s: Stream) -> tuple[Tensor, Tensor]:
    """The value range at each block's first row, ``[min, max]_{j <= cb} v_j``: (B, C, d_v)
    each (block 0's row is its own)."""
    b, full = s.block, s.n // s.block
    firsts = s.v[:, ::b]  # (B, C, d_v): each block's first row
    lows, highs = [], []
    if full:
        low, high = extremes(s.v[:, : full * b].unflatten(1, (full, b)), -2)
        lows.append(low)
        highs.append(high)
    if full * b < s.n:
        low, high = extremes(s.v[:, full * b :], 1, keepdim=True)
        lows.append(low)
        highs.append(high)
    low, high = torch.cat(lows, 1), torch.cat(highs, 1)  # each block's own extremes
    before_low = torch.cummin(low, 1).values[:, :-1]  # blocks < c
    before_high = torch.cummax(high, 1).values[:, :-1]
    low, high = firsts.clone(), firsts.clone()
    torch.minimum(low[:, 1:], before_low, out=low[:, 1:])
    torch.maximum(high[:, 1:], before_high, out=high[:, 1:])
    return low, high


def exact_range(
    s: Stream, start: int, stop: int, bounds: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """The running range ``[min, max]_{j <= t} v_j`` of the rows of blocks ``start .. stop-1``
    (B, rows, d_v) each: a running minimum / maximum down the block's own rows, the rows
    before carried in - as the range at each block's first row, which holds every earlier
    row (:func:`block_ranges`), where ``bounds`` gives it (the same values, without reading
    the earlier rows again)."""
    rows = s.rows(start, stop)
    v = s.v[:, : rows.stop]
    lows, highs = [], []
    for c in range(start, stop):
        block = s.rows(c, c + 1)
        low = torch.cummin(v[:, block], 1).values
        high = torch.cummax(v[:, block], 1).values
        if bounds is not None:
            low = torch.minimum(low, bounds[0][:, c : c + 1])
            high = torch.maximum(high, bounds[1][:, c : c + 1])
        elif c:
            low = torch.minimum(low, v[:, : block.start].amin(1, keepdim=True))
            high = torch.maximum(high, v[:, : block.start].amax(1, keepdim=True))
        lows.append(low)
        highs.append(high)
    return torch.cat(lows, 1), torch.cat(highs, 1)


COMPILED_DTYPES = (torch.float32, torch.float64)


def compiled_range(s: Stream, out: Tensor) -> bool:
    """Whether :func:`range_outside` runs compiled for outputs ``out`` of this stream."""
    return range_kernel.AVAILABLE and s.v.dtype in COMPILED_DTYPES and out.dtype == s.v.dtype


def range_outside(
    s: Stream, start: int, stop: int, bounds: tuple[Tensor, Tensor], out: Tensor
) -> tuple[Tensor, Tensor, int]:
    """:func:`exact_range` from ``bounds`` by one compiled pass per run of equal blocks (the
    full blocks, then a partial last one; :mod:`rpka.attention.range_kernel`), and how many
    entries of the rows' outputs ``out`` (B, rows, d_v) lie outside it, counted in the same
    pass (:func:`compiled_range` says where it runs)."""
    rows = s.rows(start, stop)
    low = s.v.new_empty(s.v.shape[0], rows.stop - rows.start, s.v.shape[-1])
    high = torch.empty_like(low)
    full, outside = min(max(s.n // s.block, start), stop), 0
    for c0, c1 in ((start, full), (full, stop)):
        if c1 > c0:
            run = s.rows(c0, c1)
            size = (run.stop - run.start) // (c1 - c0)  # a partial last block is alone
            local = slice(run.start - rows.start, run.stop - rows.start)
            blocks = [
                x.unflatten(1, (c1 - c0, size)).numpy()
                for x in (s.v[:, run], low[:, local], high[:, local], out[:, local])
            ]
            starts = (bounds[0][:, c0:c1].numpy(), bounds[1][:, c0:c1].numpy())
            outside += range_kernel.running_range(blocks[0], *starts, *blocks[1:])
    return low, high, outside
