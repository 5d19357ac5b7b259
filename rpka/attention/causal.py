"""Causal RPKA: exact attention inside each block, Nystrom attention to the blocks before it.

docs/design.md section 2 ("Causal use"), issue 7. Landmarks drawn from the whole sequence leak
the future into earlier positions, so a causal mask on plain Nystrom attention is wrong.

**Layout.** The sequence is cut into blocks of ``b`` positions, block ``c = [cb, (c+1)b)``.
With ``q~ = q d^{-1/4}``, keys ``k~ = k d^{-1/4}`` shifted by a centre ``mu`` (below) to
``k'``, and the log-terms

    s_ij = q~_i . k'_j - |q~_i|^2 / 2 = log( w_j g(q~_i, k'_j) ),   w_j = e^{|k'_j|^2 / 2},

row ``i`` of block ``c`` is

    out_i = [ sum_{cb <= j <= i} e^{s_ij} v_j + sum_{j < cb} e^{s_ij} v_j ]
          / [ sum_{cb <= j <= i} e^{s_ij}     + sum_{j < cb} e^{s_ij}     ]            (1)

with the local sums exact and the past sums through the Nystrom approximation
``g(q, k) ~ g(q, Z_c) G_ZZ^{-1} g(Z_c, k)`` on landmarks ``Z_c``:

    past_i = g(q~_i, Z_c) G_ZZ^{-1} M_c,   M_c = sum_{j < cb} g(Z_c, k'_j) w_j [v_j, 1].    (2)

Numerators and denominators add because both parts are sums of the same terms
``w_j g(q~_i, k'_j) [v_j, 1]`` (the query factor ``e^{|q~_i|^2/2}`` of ``e^{q~.k'}`` is common
to the whole row and cancels). Rows of block 0 have no past: exact causal softmax.

**Causality, part by part** (output ``t`` reads positions ``<= t`` only):

* centring: ``mu`` is the mean of the keys of block 0, applied from block 1 on; rows of
  block 0 use uncentred keys. One shift per row is exact (softmax invariance) and ``mu``
  reads positions ``< b <= t``.
* landmarks of block ``c``: RPCholesky pivots of the points (joint ``[q~; k']`` or keys
  ``k'``) at positions ``< cb``. The random draws of the plain loop depend on shapes only;
  the accelerated method's (pools of ``ACCELERATE_FROM_POINTS`` or more) also on the values
  of the prefix it draws from (its rejections), which all lie before every row that reads
  those landmarks or a later draw.
* weights: ``w_j`` is never exponentiated apart from ``g``: row ``s`` of ``M_c`` sums
  ``exp(z_s.k'_j - |z_s|^2/2)`` against its own reference ``rho_s = max_j`` of those
  exponents, merged block by block as in online softmax (rescaled by
  ``e^{rho_old - rho_new}``); ``G_ZZ^{-1} M_c`` is solved in float64 and carries a log scale
  per landmark (``nystrom.solve_core``), issue 13.
* normalisation: the past log-terms ``log(g(q~_i, z_s) e^{lambda_s})`` and the local
  ``s_ij`` share one row maximum (one log-sum-exp per row).
* guards: the past denominator is floored at ``den_floor`` times the size of the terms it
  sums, ``sum_s a_s |c_s|`` (guard 2 of ``rpka.py`` on the approximate part; the local part
  is exact and positive), and ``out_i`` is clamped to ``[min_{j <= i} v_j, max_{j <= i} v_j]``
  (running min/max).
  Guard counts: ``rows``/``entries`` count the rows with a past part (blocks >= 1; the
  rows of block 0 are exact and never guarded), ``denominator``/``clamped`` how many of
  those fired. In decoding the counts accumulate over prefill and steps.

**Landmark schedule.** Redrawing landmarks for every block would cost ``O(cb r d)`` per
block, ``O(n^2 r d / b)`` in all. They are redrawn at *draw blocks* only: block 1; after a
draw at block ``c``, block ``2c`` (the prefix has doubled) - or block ``c + 1`` while the pool
of block ``c`` (its ``c b`` earlier positions' points) holds at most ``r`` points. Between
draws the landmarks stay fixed and each finished block is folded into ``M`` (``O(b r d)``).

**Exact past while the pool fits the rank** (issue 13). With a pool of at most ``r`` points
RPCholesky would pivot on all of them, so every earlier key is a landmark and eq. (2) is
exact in exact arithmetic (``G_ZZ^{-1} g(Z, k_j)`` is the unit vector of ``k_j``). In
floating point it is not: with repeated sharp keys a landmark's core row is 0 in exact
arithmetic but the round-off of its own large key mass, and a later query reads that noise
(0.19 relative error at logit std 36, float64). Such a block's past part is therefore
computed as what it equals, the terms ``e^{s_ij}`` of the ``c b <= r`` earlier keys themselves
(``O(b r d)``, the cost of eq. (2)), and no landmarks are drawn for it. A rank >= the number
of earlier points thus reproduces exact causal attention to round-off.

**Cost** (``n`` positions, block ``b``, rank ``r``, head dim ``d``): local part ``O(n b d)``;
past part ``O(n r d)``; folding ``O(n r d)``; the draws run RPCholesky on prefixes that
double, ``O(n r (d + r))`` in all, plus ``O(n r d)`` to rebuild ``M`` for new landmarks;
an ``O(log(n/b))``-deep prefix merge over blocks. Memory ``O(n (b + r))``.

**Two forms of the same sums** (issue 55, docs/speed.md "Causal RPKA at the op's limit"):
below ``FUSED_FROM_POSITIONS`` and on other devices the local part is written out
(:func:`local_scores`, :func:`combine`: the reference, and the ops every committed result
ran). From ``FUSED_FROM_POSITIONS`` on the CPU (float32 / float64) it is one fused SDPA call
on the stacked blocks with its log-sum-exp: for inference the whole forward is streamed
(:mod:`rpka.attention.causal_stream`: the key side in ``key_precision``, every other part in
cache-sized chunks, nothing of full length held beside the output); training runs that same
streamed forward with its backward written out (:mod:`rpka.attention.causal_train`), except
where an epoch's past is small enough to be exact: there the kernel's own backward carries the
log-sum-exp's gradient too (:func:`flash_local`, :func:`combine_flash`), the rest as written
out. They agree to round-off.

**Decoding** (``prefill`` / ``step``, one token at a time): ``causal_decode``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rpka.attention.base import refuse_non_finite
from rpka.attention.causal_blocks import (
    combine,
    combine_flash,
    flash_local,
    local_scores,
    running_range,
    to_blocks,
)
from rpka.attention.causal_landmarks import (
    LandmarkSampler,
    LandmarkSet,
    Moments,
    WideKeys,
    draw_blocks,
    epoch_moments,
    first_draw_from,
    past_is_exact,
)
from rpka.attention.causal_stream import stream_forward
from rpka.attention.causal_train import has_exact_past, stream_training

# ----------------------------------------------------------------------------- one row set


# Inference on sequences of at least this many positions takes the streamed path
# (:mod:`causal_stream`): SDPA's CPU flash kernel on the stacked blocks for the local part
# (it returns each row's log-sum-exp beside its output; 23 against 69 ms for the written-out
# block softmax at 8,192 tokens, issue 55) and no full-length temporary. It sums in another
# order (round-off moves, ~1e-7 relative in float32), so shorter sequences - the lm track and
# the swap audit, 64 tokens, whose committed results ran the written-out ops - keep those ops.
FUSED_FROM_POSITIONS = 1024


class LocalPart:
    """The exact in-block sums of eq. (1) for every block, split into the parts the forward
    reads (block 0, then one per landmark epoch; :func:`by_part`): written out
    (:func:`local_scores`, the reference), or - with gradients on sequences of at least
    ``FUSED_FROM_POSITIONS`` on the CPU - SDPA's fused kernel with its log-sum-exp, both
    differentiable (:func:`flash_local`; round-off apart from the written-out sums)."""

    def __init__(self, q_b: Tensor, k_b: Tensor, v_b: Tensor, starts: list[int], flash: bool):
        self.q_b, self.k_b, self.flash = q_b, k_b, flash
        if flash:
            out, lse = flash_local(q_b, k_b, v_b)
            lse = lse - q_b.pow(2).sum(-1, keepdim=True) / 2  # on the scale of s_ij
            self.outs, self.lses = by_part(out, starts), by_part(lse, starts)
        else:  # one product for all blocks; a split's backward is one cat, a slice's a fill
            self.parts = by_part(local_scores(q_b, k_b, causal=True), starts)

    @staticmethod
    def takes_flash(q_s: Tensor, k_s: Tensor, v: Tensor) -> bool:
        """Training (some input needs a gradient) on the CPU, at least FUSED_FROM_POSITIONS,
        float32 or float64, d_v = d (the kernel's backward wants one head size)."""
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q_s, k_s, v))
        return (
            grad
            and q_s.device.type == "cpu"
            and q_s.shape[-2] >= FUSED_FROM_POSITIONS
            and q_s.dtype in (torch.float32, torch.float64)
            and q_s.shape[-1] == v.shape[-1]
        )

    def first_rows(self, v_0: Tensor, bounds: tuple[Tensor, Tensor, float]) -> Tensor:
        """Block 0's rows (no past: exact causal softmax) (..., b, d_v)."""
        if self.flash:
            return self.outs[0].squeeze(-3)
        return combine(self.parts[0].squeeze(-3), v_0, *bounds)[0]

    @staticmethod
    def takes_fused(q_s: Tensor, k_s: Tensor, v: Tensor) -> bool:
        """Whether a call takes the streamed path (:mod:`causal_stream`): inference (nothing
        needs a gradient) on the CPU, at least FUSED_FROM_POSITIONS, float32 or float64."""
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q_s, k_s, v))
        return (
            not grad
            and q_s.device.type == "cpu"
            and q_s.shape[-2] >= FUSED_FROM_POSITIONS
            and q_s.dtype in (torch.float32, torch.float64)
        )

    def combine(self, start: int, v_part: Tensor, *bounds: object) -> tuple[Tensor, Tensor, Tensor]:
        """Eq. (1) for the part that starts at block ``start`` (:func:`combine` or
        :func:`combine_flash`): its values and ``bounds`` ``(v_low, v_high, den_floor, past)``."""
        if self.flash:
            return combine_flash(self.outs[start], self.lses[start], *bounds)
        return combine(self.parts[start], v_part, *bounds)

    def assemble(self, outs: list[Tensor], n: int) -> Tensor:
        """The output (..., n, d_v) from block 0's rows and one part per epoch."""
        return torch.cat([outs[0].unsqueeze(-3), *outs[1:]], dim=-3).flatten(-3, -2)[..., :n, :]

    def scores_of(self, block: int) -> Tensor:
        """The log-terms of one block that starts a part (..., b, b)."""
        if self.flash:  # a block whose past is exact: written out (rare at these lengths)
            return local_scores(self.q_b[..., block, :, :], self.k_b[..., block, :, :], True)
        return self.parts[block].squeeze(-3)


def by_part(x: Tensor, starts: list[int]) -> dict[int, Tensor]:
    """Blocked x (..., C, b, e) split along C at the blocks ``starts`` (the first is 0): the
    parts by their first block. One ``split`` (its backward one ``cat``) instead of a slice
    per part (each slice's backward a zero tensor of x's size, filled and added)."""
    sizes = [stop - start for start, stop in itertools.pairwise([*starts, x.shape[-3]])]
    return dict(zip(starts, x.split(sizes, dim=-3), strict=True))


def empty_guards(device: torch.device) -> dict[str, Tensor]:
    return {key: torch.zeros((), dtype=torch.long, device=device) for key in GUARD_KEYS}


GUARD_KEYS = ("denominator", "rows", "clamped", "entries")


def count_guards(
    guards: dict[str, Tensor], floored: Tensor, clamped: Tensor, rows: Tensor | None = None
) -> None:
    """Add the guards that fired on real rows (``rows`` (..., L, 1) bool; None = all)."""
    if rows is None:
        rows = torch.ones_like(floored)
    rows = rows.expand_as(floored)
    guards["denominator"] += (floored & rows).sum()
    guards["rows"] += rows.sum()
    guards["clamped"] += (clamped & rows).sum()
    guards["entries"] += rows.sum() * clamped.shape[-1]


def count_exact_rows(guards: dict[str, Tensor], out: Tensor, rows: Tensor | None = None) -> None:
    """Count rows whose past part was computed exactly (:func:`past_is_exact`): rows with a
    past, on which no guard can fire (out (..., L, d_v); ``rows`` as :func:`count_guards`)."""
    never = torch.zeros_like(out[..., :1], dtype=torch.bool)
    count_guards(guards, never, never.expand_as(out), rows)


# ----------------------------------------------------------------------------- forward


@dataclass
class ForwardTail:
    """What a decoder needs from the forward: centre, last landmarks, their moments."""

    centre: Tensor | None
    landmarks: LandmarkSet | None  # None while the last block's past is exact
    moments: Moments | None  # over the positions before the last block
    next_draw: int


def causal_forward(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    block_size: int,
    sampler: LandmarkSampler,
    den_floor: float,
    key_precision: str = "float64",
) -> tuple[Tensor, dict[str, Tensor], ForwardTail]:
    """Causal RPKA, eqs. (1)-(2), for scaled q_s, k_s (..., n, d) and v (..., n, d_v).

    ``key_precision``: RPKAttention's; ``"auto"`` lets the streamed (long inference) path
    compute the key moments in float32 while the logits stay moderate
    (:func:`narrow_key_dtype`); every other path widens them to float64.
    Returns out (..., n, d_v), guard counts and the :class:`ForwardTail`.
    """
    if LocalPart.takes_fused(q_s, k_s, v):  # long inference: streamed, scale 1 (q_s, k_s)
        out, guards, tail = stream_forward(
            q_s, k_s, v, 1.0, block_size, sampler, den_floor, key_precision
        )
        return out, guards, ForwardTail(tail.centre, tail.landmarks, tail.moments, tail.next_draw)
    n, b = q_s.shape[-2], block_size
    n_blocks = math.ceil(n / b)
    centre = k_s[..., :b, :].mean(-2, keepdim=True)  # keys of block 0 only
    k_c = k_s - centre
    k_local = torch.cat([k_s[..., :b, :], k_c[..., b:, :]], dim=-2)
    q_b, k_b, v_b = (to_blocks(x, b) for x in (q_s, k_local, v))
    ppp = sampler.points_per_position
    draws = draw_blocks(n_blocks, b, sampler.rank, ppp)
    starts = [0, *draws]
    local = LocalPart(q_b, k_b, v_b, starts, LocalPart.takes_flash(q_s, k_s, v))
    q_p, v_p = by_part(q_b, starts), by_part(v_b, starts)
    low_p, high_p = (by_part(x, starts) for x in running_range(v, b))
    is_real = to_blocks(torch.ones_like(v[..., :1], dtype=torch.bool), b)  # not padding

    guards = empty_guards(q_s.device)
    bounds_0 = (low_p[0].squeeze(-3), high_p[0].squeeze(-3), den_floor)  # exact rows: unused
    outs = [local.first_rows(v_p[0].squeeze(-3), bounds_0)]
    landmarks = moments = None
    pieces = b if local.flash else None  # the long training path (round-off only)
    wide = WideKeys.of(k_c, v, (n_blocks - 1) * b, pieces)  # the keys any past part reads
    for start, stop in itertools.pairwise([*draws, n_blocks]):  # one landmark epoch each
        rows = slice(start, stop)
        if past_is_exact(start, b, sampler.rank, ppp):  # one block, its past keys as they are
            landmarks = moments = None
            past_scores = local_scores(q_p[start].squeeze(-3), k_c[..., : start * b, :], False)
            out = combine(
                torch.cat([past_scores, local.scores_of(start)], dim=-1),
                torch.cat([v[..., : start * b, :], v_p[start].squeeze(-3)], dim=-2),
                low_p[start].squeeze(-3),
                high_p[start].squeeze(-3),
                den_floor,
            )[0].unsqueeze(-3)
            count_exact_rows(guards, out, is_real[..., rows, :, :])
            outs.append(out)
            continue
        landmarks = LandmarkSet.draw(sampler, q_s[..., : start * b, :], k_c[..., : start * b, :])
        moments = epoch_moments(landmarks, wide, start, stop, b)  # block s: keys < sb
        blocks = landmarks.per_block()
        core = blocks.solve(moments)
        past = (blocks.past_logits(q_p[start], core), core.scaled)
        bounds = (low_p[start], high_p[start], den_floor, past)
        out, floored, clamped = local.combine(start, v_p[start], *bounds)
        count_guards(guards, floored, clamped, is_real[..., rows, :, :])
        outs.append(out)
    out = local.assemble(outs, n)
    tail = ForwardTail(
        centre if n >= b else None,
        landmarks,
        moments.part(-1) if moments is not None else None,
        first_draw_from(n_blocks, b, sampler.rank, ppp),
    )
    return out, guards, tail


# ----------------------------------------------------------------------------- module glue


class CausalOptions:  # the attributes of RPKAttention read here (typing aid only)
    check_inputs: bool
    rank: int
    pivot_rule: str
    pivot_set: str
    weighting: str
    tempering: float
    den_floor: float
    block_size: int
    generator: torch.Generator | None
    pivot_backend: str
    key_precision: str
    method: str
    block_size: int | None
    refresh: str
    residual_solve: str


def sampler_of(attn: CausalOptions) -> LandmarkSampler:
    return LandmarkSampler(
        attn.rank,
        attn.pivot_rule,
        attn.pivot_set,
        attn.weighting,
        attn.tempering,
        attn.generator,
        attn.pivot_backend,
        attn.method,
        attn.block_size,
        attn.refresh,
        attn.residual_solve,
    )


def scaled(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``q d^{-1/4}``, ``k d^{-1/4}``, v in the compute dtype (float64 stays, else float32)."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.25
    return q.to(compute) * scale, k.to(compute) * scale, v.to(compute)


def checks_finite(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether :func:`attend` checks q, k, v for nan and inf itself (the streamed inference
    path, after its copy; ``AttentionMethod.checks_finite_itself``)."""
    return LocalPart.takes_fused(q, k, v)


def takes_stream_training(
    q: Tensor, k: Tensor, v: Tensor, block: int, sampler: LandmarkSampler
) -> bool:
    """Whether a call takes the written-out backward (:mod:`causal_train`): the long training
    calls of :meth:`LocalPart.takes_flash` whose every landmark epoch has landmarks."""
    return LocalPart.takes_flash(q, k, v) and not has_exact_past(q.shape[-2], block, sampler)


def attend(attn: CausalOptions, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, dict]:
    """Causal RPKA forward for ``RPKAttention(causal=True)``: out (B, H, n, d_v), guards."""
    sampler = sampler_of(attn)
    if LocalPart.takes_fused(q, k, v):  # long inference: streamed on the unscaled inputs
        # the stream's one copy of strided inputs (heads split off a projection), made here
        # so that the finiteness check reads contiguous rows (checks_finite)
        q, k, v = (x.contiguous() for x in (q, k, v))
        if attn.check_inputs:
            for name, x in (("q", q), ("k", k), ("v", v)):
                refuse_non_finite(name, x)
        out, guards, _ = stream_forward(
            q, k, v, q.shape[-1] ** -0.25, attn.causal_block, sampler, attn.den_floor,
            attn.key_precision,
        )  # fmt: skip
        return out, guards
    if takes_stream_training(q, k, v, attn.causal_block, sampler):
        return stream_training(
            q, k, v, q.shape[-1] ** -0.25, attn.causal_block, sampler, attn.den_floor,
            attn.key_precision,
        )  # fmt: skip
    out, guards, _ = causal_forward(
        *scaled(q, k, v), attn.causal_block, sampler, attn.den_floor, attn.key_precision
    )
    return out.to(q.dtype), guards
