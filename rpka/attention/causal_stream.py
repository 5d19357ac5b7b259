"""Causal RPKA for inference on long sequences, streamed block by block (issue 55).

The estimate of :mod:`rpka.attention.causal` - eqs. (1)-(2) there, the same landmark
schedule, law of the draws, guards and guard counts - computed without gradients so that
nothing of full length is held beside the output: no scaled, centred or blocked copy of q,
k or v, no running value range, no (n x r) logits. Row by row it is the same sum; only the
order of round-off moves (docs/speed.md, "Causal RPKA at the op's limit").

* **Local part** (:mod:`rpka.attention.causal_local`): SDPA's fused CPU kernel over the
  stacked blocks, in sub-blocks that skip the masked half, on the raw q, k with scale ``s^2``
  (``q~ = q s``); it returns each row's log-sum-exp ``log sum_{j <= i} e^{q~_i.k~_j}``, the
  local denominator of eq. (1) up to the row's common factor ``e^{|q~_i|^2/2}``.
* **Uncentred local keys**: the kernel reads the keys as they are, not shifted by the centre
  ``mu`` of block 0. A shift is one factor ``e^{-q~_i.mu}`` per row (softmax invariance), so
  the past logits are taken on the same scale by reading the landmarks as ``z + mu``:
  ``q~.(z + mu) - |z|^2/2 + lambda`` (an r x d change instead of an n x d one).
* **Draws**: the pool ``[q~; k~ - mu]`` of a prefix is a :class:`PointSet` over views of q and
  k (read in chunks, never copied), drawn by the accelerated method; small pools
  (< ``ACCELERATE_FROM_POINTS``) are copied and drawn by the plain loop, as before.
* **Key moments** stream through chunks of whole blocks: the epoch's prefix in chunks merged
  as in online softmax, its blocks one reference each, then :func:`prefix_merge`.
* **Readout and combine** run per chunk of blocks, in place on the output rows: one
  ``bmm`` for the past logits, the core with a column of ones appended (the floor's
  ``sum_s a_s`` comes out of the same product), the guards.
* **Value range** (guard 3): an output entry inside ``[min_{j <= cb} v_j, max_{j <= cb} v_j]``
  (the range at the block's first row) lies inside its own row's range, which only widens
  along the block; only a block with an entry outside that range gets the exact running range
  (a cummin / cummax over the block, with the extremes of the blocks before carried in).
* **Training** (:mod:`causal_train`) runs this forward with a :class:`Tape` for its backward.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rpka.attention.accelerated import accelerated_pivots
from rpka.attention.causal_blocks import combine, local_scores
from rpka.attention.causal_landmarks import (
    ACCELERATE_FROM_POINTS,
    LandmarkSampler,
    LandmarkSet,
    Moments,
    draw_blocks,
    first_draw_from,
    past_is_exact,
)
from rpka.attention.causal_layout import (
    STREAM_CHUNK_BYTES,
    Epoch,
    Stream,
    Tape,
    block_ranges,
    compiled_range,
    exact_range,
    extremes,
    range_outside,
)
from rpka.attention.causal_local import fused_local
from rpka.attention.guards import hull_tolerance
from rpka.attention.nystrom import (
    CORE_DTYPE,
    Core,
    core_of,
    exp_floored_,
    finite_or_zero,
    landmark_cholesky,
    raw_core,
)
from rpka.attention.nystrom_chunked import narrow_key_dtype, too_sharp
from rpka.attention.pivot_state import PointSet
from rpka.attention.rpcholesky import weighting_power

# ----------------------------------------------------------------------------- landmarks


def draw(s: Stream, sampler: LandmarkSampler, positions: int) -> tuple[LandmarkSet, Tensor]:
    """Landmarks of the pool of the first ``positions`` positions: ``[q~; k~ - mu]`` (joint)
    or ``k~ - mu`` (keys), in the scaled, centred coordinates of :mod:`causal`, and their
    pivots (B, r) into the pool (queries first; -1 where none was drawn)."""
    qs, ks = s.q[:, :positions], s.k[:, :positions]
    parts = [qs, ks] if sampler.pivot_set == "joint" else [ks]
    shifts = [None, s.centre] if sampler.pivot_set == "joint" else [s.centre]
    pool = PointSet(parts, scale=s.scale, shifts=shifts, dtype=s.q.dtype)
    if sampler.pivot_method == "accelerated" and pool.n_points >= ACCELERATE_FROM_POINTS:
        tau = weighting_power(sampler.weighting, sampler.tempering)
        state = accelerated_pivots(
            pool,
            sampler.rank,
            sampler.pivot_rule,
            sampler.generator,
            log_weight=tau * pool.sq_norms() if tau > 0 else None,
            block_size=sampler.candidates,
            refresh=sampler.refresh,
            residual_solve=sampler.residual_solve,
        )
        missing = sampler.rank - state.pivots.shape[-1]  # the rank is capped at the pool
        pivots = F.pad(state.pivots, (0, missing), value=-1) if missing else state.pivots
        valid = pivots >= 0
        if state.rank == sampler.rank:  # the state holds the pivots' points, zeros elsewhere
            points = state.landmarks
        else:
            points = pool.take(pivots.clamp(min=0)) * valid.unsqueeze(-1).to(s.q.dtype)
        return LandmarkSet(points, valid, landmark_cholesky(points, valid)), pivots
    q_s = qs * s.scale if sampler.pivot_set == "joint" else None  # a small pool: copied
    points, valid, pivots = sampler.with_pivots(q_s, s.scaled_keys(slice(0, positions)))
    return LandmarkSet(points, valid, landmark_cholesky(points, valid)), pivots


# ----------------------------------------------------------------------------- moments


@dataclass
class KeySide:
    """The landmarks as the key moments read them, in the key side's dtype: ``(s z)^T``
    (B, d, r) for the raw keys, the bias ``-|z|^2/2`` (-inf for invalid landmarks) (B, 1, r),
    and the centre of the raw keys ``mu / s`` (B, 1, d): ``(k - mu/s).(s z) = k'.z``."""

    points: Tensor
    bias: Tensor
    centre: Tensor

    @classmethod
    def of(cls, s: Stream, landmarks: LandmarkSet, dtype: torch.dtype) -> KeySide:
        z = landmarks.points.to(dtype)
        bias = (-z.pow(2).sum(-1) / 2).masked_fill(~landmarks.valid, -math.inf).unsqueeze(-2)
        return cls((z * s.scale).transpose(-1, -2), bias, (s.centre / s.scale).to(dtype))


def chunk_moments(s: Stream, side: KeySide, rows: slice, blocks: int) -> Moments:
    """Key moments of ``rows`` split into ``blocks`` equal parts, one reference each:
    rho (B, blocks, r), num (B, blocks, r, d_v + 1) (the last column: ``sum_j`` of the terms).

    The values are read where they are, one ``bmm`` per part, and the last column is the
    terms' sum: building ``[v, 1]`` was a strided copy of the chunk's values (~2.5 % of a
    forward at 4,096 tokens, in-process A/B; issue 55)."""
    keys = torch.sub(s.k[:, rows].to(side.bias.dtype), side.centre)
    logits = torch.baddbmm(side.bias, keys, side.points)  # (B, m, r)
    del keys  # before the next chunk-sized buffer (the peak of a forward, issue 55)
    logits = logits.unflatten(1, (blocks, -1))  # (B, blocks, m / blocks, r)
    rho = finite_or_zero(logits.amax(-2))
    terms = logits.sub_(rho.unsqueeze(-2)).exp_()
    values = s.v[:, rows].to(terms.dtype).unflatten(1, (blocks, -1))
    dv = values.shape[-1]
    # each product written into its place: no stack and cat of the parts (the same values)
    num = terms.new_empty(*rho.shape, dv + 1)  # (B, blocks, r, d_v + 1)
    for i in range(blocks):
        torch.bmm(terms[:, i].transpose(-1, -2), values[:, i], out=num[:, i, :, :dv])
    torch.sum(terms, -2, out=num[..., dv])
    return Moments(rho, num)


def epoch_moments(
    s: Stream, landmarks: LandmarkSet, start: int, stop: int, dtype: torch.dtype
) -> Moments:
    """``M_c`` (keys before block c) for c = start .. stop - 1: (B, stop - start, r, ...).

    Entry 0 is the prefix before ``start`` (chunks merged as in online softmax), entry ``i``
    first the moments of block ``start + i - 1`` alone, then the inclusive merge in place
    (:meth:`Moments.merge`'s ops, entry by entry: :func:`prefix_merge`'s order)."""
    width = max(landmarks.points.shape[-2], s.v.shape[-1] + 1)
    side = KeySide.of(s, landmarks, dtype)
    first = None
    for c0, c1 in s.chunks(0, start, width):  # the prefix, merged as in online softmax
        part = chunk_moments(s, side, s.rows(c0, c1), 1)
        first = part if first is None else first.merge(part)
    if stop - start == 1:
        return _checked(s, landmarks, start, stop, first, dtype)
    batch, r = first.rho.shape[0], first.rho.shape[-1]
    rho = first.rho.new_empty(batch, stop - start, r)
    num = first.num.new_empty(batch, stop - start, r, first.num.shape[-1])
    rho[:, :1], num[:, :1] = first.rho, first.num
    for c0, c1 in s.chunks(start, stop - 1, width):  # the epoch's blocks, one reference each
        part = chunk_moments(s, side, s.rows(c0, c1), c1 - c0)
        rho[:, c0 - start + 1 : c1 - start + 1] = part.rho
        num[:, c0 - start + 1 : c1 - start + 1] = part.num
    for i in range(1, stop - start):
        top = torch.maximum(rho[:, i - 1], rho[:, i])
        earlier, own = torch.exp(rho[:, i - 1] - top), torch.exp(rho[:, i] - top)
        num[:, i].mul_(own.unsqueeze(-1)).add_(earlier.unsqueeze(-1) * num[:, i - 1])
        rho[:, i] = top
    return _checked(s, landmarks, start, stop, Moments(rho, num), dtype)


def _checked(
    s: Stream, landmarks: LandmarkSet, start: int, stop: int, moments: Moments, dtype: torch.dtype
) -> Moments:
    """Moments of a narrow key side whose references pass the limit, redone in float64."""
    if dtype != CORE_DTYPE and too_sharp(moments.rho):
        return epoch_moments(s, landmarks, start, stop, CORE_DTYPE)
    return moments


# ----------------------------------------------------------------------------- combine


@dataclass
class Readout:
    """What every chunk of one landmark epoch reads: the landmarks on the local part's scale
    (``z + mu``, times s for the raw queries) as (B, d, r), ``|z|^2/2`` (B, 1, r), and the
    landmarks with a block dimension for the per-block solves."""

    points: Tensor
    half_sq: Tensor
    landmarks: LandmarkSet

    @classmethod
    def of(cls, s: Stream, landmarks: LandmarkSet) -> Readout:
        points = ((landmarks.points + s.centre) * s.scale).transpose(-1, -2).to(s.q.dtype)
        half_sq = landmarks.points.pow(2).sum(-1).unsqueeze(-2) / 2
        return cls(points, half_sq, landmarks.per_block())


def combine_rows(
    s: Stream,
    out: Tensor,
    lse: Tensor,
    epoch: tuple[int, int],
    landmarks: LandmarkSet,
    moments: Moments,
    bounds: tuple[Tensor, Tensor],
    den_floor: float,
) -> tuple[Tensor, Tensor]:
    """Eq. (1) for the rows of one landmark epoch, in place on ``out`` (the local part), with
    guards 2 and 3, chunk by chunk; -> the counts of floored rows and clamped entries."""
    start, stop = epoch
    readout = Readout.of(s, landmarks)
    floored = clamped = torch.zeros((), dtype=torch.long)
    width = max(landmarks.points.shape[-2], s.v.shape[-1] + 2)
    for c0, c1 in s.chunks(start, stop, width):
        part = moments.part(slice(c0 - start, c1 - start))
        low, outside = combine_chunk(s, out, lse, (c0, c1), readout, part, bounds, den_floor)
        floored, clamped = floored + low, clamped + outside
    return floored, clamped


def combine_chunk(
    s: Stream,
    out: Tensor,
    lse: Tensor,
    blocks: tuple[int, int],
    readout: Readout,
    moments: Moments,
    bounds: tuple[Tensor, Tensor],
    den_floor: float,
) -> tuple[Tensor, Tensor]:
    """:func:`combine_rows` for the blocks ``c0 .. c1 - 1`` (its temporaries die with it)."""
    terms = ChunkTerms.of(s, lse, blocks, readout, moments, den_floor)
    rows_out = out[:, s.rows(*blocks)]
    rows_out.mul_(terms.local_den).add_(terms.past[..., : s.v.shape[-1]]).div_(terms.den)
    return terms.low.sum(), clamp_rows(s, rows_out, blocks, bounds)


@dataclass
class ChunkTerms:
    """Eq. (1)'s parts for the rows of blocks ``c0 .. c1 - 1`` (also what the training path's
    backward recomputes): the raw core solve and its reference (:func:`raw_core`), the core,
    the past terms ``a`` (B, G, b, r), the past sums (B, L, d_v + 2: num, den, sum_s a_s), the
    local denominator, the floored rows and the denominator (B, L, 1)."""

    raw: Tensor
    top: Tensor
    core: Core
    terms: Tensor
    past: Tensor
    local_den: Tensor
    low: Tensor
    den: Tensor

    @classmethod
    def of(cls, s, lse, blocks, readout, moments, den_floor) -> ChunkTerms:  # noqa: D102
        rows, dv, dtype = s.rows(*blocks), s.v.shape[-1], s.q.dtype
        # the chunk's cores G_ZZ^{-1} M_c (float64 temporaries of the chunk's size only)
        raw, top = raw_core(moments.rho, moments.num, readout.landmarks.chol)
        # [core, 1] (B, G, r, d_v + 2): the core (LandmarkSet.solve's) written into its place
        weights = raw.new_empty(*raw.shape[:-1], raw.shape[-1] + 1, dtype=dtype)
        weights[..., -1] = 1.0
        core = core_of(raw, top, readout.landmarks.points.dtype, out=weights[..., :-1])
        valid = readout.landmarks.valid  # (B, 1, r)
        bias = (core.log_scale - readout.half_sq).masked_fill(~valid, -math.inf)  # (B, G, r)
        logits = torch.bmm(s.q[:, rows], readout.points)  # (B, L, r)
        terms = logits.unflatten(1, (blocks[1] - blocks[0], -1))  # (B, G, b, r)
        terms.add_(bias.unsqueeze(-2).to(dtype))
        row_lse = lse[:, rows]
        ref = finite_or_zero(torch.maximum(row_lse, logits.amax(-1, keepdim=True)))
        exp_floored_(logits.sub_(ref))  # the past terms a_s
        past = (terms @ weights).flatten(1, 2)  # (B, L, d_v + 2): num, den, sum_s a_s
        local_den = torch.exp(row_lse - ref)
        past_den, floor = past[..., dv : dv + 1], den_floor * past[..., dv + 1 :]
        low = past_den < floor
        den = (local_den + torch.where(low, floor, past_den)).clamp_(min=torch.finfo(dtype).tiny)
        return cls(raw, top, core, terms, past, local_den, low, den)


def clamp_rows(
    s: Stream, out: Tensor, blocks: tuple[int, int], bounds: tuple[Tensor, Tensor]
) -> Tensor:
    """Guard 3 on the rows ``out`` (B, L, d_v) of ``blocks``, in place; -> clamped entries.

    The range at a block's first row lies inside every later row's, so if every entry is in
    it no entry is outside its own row's range and nothing is read again."""
    c0, c1 = blocks
    low, high = bounds[0][:, c0:c1], bounds[1][:, c0:c1]  # (B, G, d_v)
    if c1 * s.block <= s.n:
        least, most = extremes(out.unflatten(1, (c1 - c0, -1)), -2)
    else:  # the partial last block, alone in its chunk
        least, most = extremes(out, 1, keepdim=True)
    if bool(((least >= low) & (most <= high)).all()):
        return torch.zeros((), dtype=torch.long)
    if compiled_range(s, out):  # the range and the count of entries outside it in one pass
        v_low, v_high, outside = range_outside(s, c0, c1, bounds, out)
        if not outside:
            return torch.zeros((), dtype=torch.long)
    else:
        v_low, v_high = exact_range(s, c0, c1, bounds)
    below, above = out < v_low, out > v_high
    if not bool((below | above).any()):
        return torch.zeros((), dtype=torch.long)
    if s.tape is not None:
        s.tape.clamped.append((s.rows(c0, c1), below, above))
    tol = hull_tolerance(v_low, v_high)
    clamped = ((out < v_low - tol) | (out > v_high + tol)).sum()
    torch.minimum(torch.maximum(out, v_low, out=out), v_high, out=out)
    return clamped


def exact_past_rows(s: Stream, out: Tensor, block: int, den_floor: float) -> None:
    """A block whose pool fits the rank (:func:`past_is_exact`): every earlier key as it is,
    eq. (1) written out (:func:`combine`) on the few (<= r) earlier positions."""
    rows = s.rows(block, block + 1)
    q_s = s.q[:, rows] * s.scale
    keys = s.scaled_keys(slice(0, rows.stop))
    scores = torch.cat(
        [
            local_scores(q_s, keys[:, : rows.start], False),
            local_scores(q_s, keys[:, rows.start :], True),
        ],
        dim=-1,
    )
    v_low, v_high = exact_range(s, block, block + 1)
    out[:, rows] = combine(scores, s.v[:, : rows.stop], v_low, v_high, den_floor)[0]


# ----------------------------------------------------------------------------- forward


@dataclass
class StreamTail:
    """:class:`causal.ForwardTail`'s fields, in the call's batch shape."""

    centre: Tensor | None
    landmarks: LandmarkSet | None
    moments: Moments | None
    next_draw: int


@torch.no_grad()
def stream_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    block_size: int,
    sampler: LandmarkSampler,
    den_floor: float,
    key_precision: str = "auto",
    tape: Tape | None = None,
) -> tuple[Tensor, dict[str, Tensor], StreamTail]:
    """Causal RPKA without gradients: q, k (..., n, d) and v (..., n, d_v) in the compute
    dtype, *unscaled* (``q~ = q scale``). -> out (..., n, d_v), guard counts, the tail.
    ``tape``: filled with what :mod:`causal_train`'s backward reads."""
    batch, n, dv = q.shape[:-2], q.shape[-2], v.shape[-1]
    # one copy of a strided input (heads split off a (B, n, H d) projection, as every
    # decoder does): the fused local kernel, the chunks and the draws' gathers then read rows
    # of d contiguous values; ~1 ms for q, k, v of (1, 4, 2,048, 64) against ~2 ms saved
    q3, k3, v3 = (x.reshape(-1, *x.shape[-2:]).contiguous() for x in (q, k, v))
    b = block_size
    centre = (k3[:, :b] * scale).mean(-2, keepdim=True)  # as causal_forward's, scaled
    s = Stream(q3, k3, v3, scale, b, centre, tape)
    n_blocks = math.ceil(n / b)
    out, lse = fused_local(s.q, s.k, s.v, b, scale, STREAM_CHUNK_BYTES)
    if tape is not None:
        tape.stream, tape.lse = s, lse
    guards = {key: torch.zeros((), dtype=torch.long) for key in GUARD_KEYS}
    past_rows = max(n - b, 0) * q3.shape[0]
    guards["rows"] += past_rows
    guards["entries"] += past_rows * dv
    ppp = sampler.points_per_position
    draws = draw_blocks(n_blocks, b, sampler.rank, ppp)
    bounds = block_ranges(s) if draws else None
    landmarks = moments = None
    for start, stop in itertools.pairwise([*draws, n_blocks]):
        if past_is_exact(start, b, sampler.rank, ppp):
            landmarks = moments = None
            exact_past_rows(s, out, start, den_floor)
            continue
        landmarks, pivots = draw(s, sampler, start * b)
        dtype = narrow_key_dtype(key_precision, landmarks.points, landmarks.valid)
        moments = epoch_moments(s, landmarks, start, stop, dtype)
        if tape is not None:
            tape.epochs.append(Epoch(start, stop, landmarks, pivots, moments))
        floored, clamped = combine_rows(
            s, out, lse, (start, stop), landmarks, moments, bounds, den_floor
        )
        guards["denominator"] += floored
        guards["clamped"] += clamped
    tail = StreamTail(
        centre.view(*batch, 1, -1) if n >= b else None,
        None if landmarks is None else _in_shape(landmarks, batch),
        None
        if moments is None
        else Moments(
            moments.rho[:, -1].view(*batch, -1),
            moments.num[:, -1].view(*batch, *moments.num.shape[-2:]),
        ),
        first_draw_from(n_blocks, b, sampler.rank, ppp),
    )
    return out.view(*batch, n, dv), guards, tail


GUARD_KEYS = ("denominator", "rows", "clamped", "entries")


def _in_shape(landmarks: LandmarkSet, batch: torch.Size) -> LandmarkSet:
    r = landmarks.points.shape[-2]
    return LandmarkSet(
        landmarks.points.view(*batch, r, -1),
        landmarks.valid.view(*batch, r),
        landmarks.chol.view(*batch, r, r),
    )
