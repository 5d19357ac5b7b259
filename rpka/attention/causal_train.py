"""Causal RPKA's training path on long sequences: the streamed forward, the backward written out
(issue 55, docs/speed.md "Fifth pass").

Under autograd the forward of :mod:`rpka.attention.causal` holds a graph of every block's
slices, concatenations and small solves; on (1, 8, 4,096, 64) its bookkeeping (zero fills of
whole-input gradients, their adds, ``cat``) cost more than the arithmetic. Here the forward
is the inference path itself (:func:`causal_stream.stream_forward`, outputs the same bit for
bit), which records on a :class:`Tape` what the backward reads: the local part's
log-sum-exp, each landmark epoch's pivots, landmarks and key moments, and the chunks guard 3
clamped. The backward recomputes the rest chunk by chunk, as FlashAttention recomputes its
probabilities. Notation of :mod:`causal` (eqs. (1)-(2)); per row ``i`` with a past,

    o_i = (o^loc_i D^loc_i + sum_s a_is C_s[:d_v]) / D_i,   D_i = D^loc_i + sum_s a_is C_s[d_v]

(the floored rows take ``den_floor sum_s a_is`` for the past denominator), with
``a_is = exp(q~_i.(z_s + mu) - |z_s|^2/2 + lambda_s - ref_i)``, ``D^loc_i = exp(lse_i - ref_i)``
and the core ``C = G_ZZ^{-1} M`` (row sizes and references detached, as in the autograd
path: they cancel in exact arithmetic). With ``u_i = g_i / D_i`` and
``w_i = -g_i.o_i / D_i``:

* local part: ``dL/do^loc_i = u_i D^loc_i``, ``dL/dlse_i = (u_i.o^loc_i + w_i) D^loc_i``,
  both through the fused kernel's own backward given the combined output (:func:`local_backward`);
* readout: ``dL/da_is = u_i.C_s[:d_v] + w_i C_s[d_v]`` (``w_i den_floor`` where floored),
  ``e_is = a_is dL/da_is``; ``dq~_i = sum_s e_is (z_s + mu)``,
  ``dz_s = sum_i e_is (q~_i - z_s)``; ``dC_s = sum_i a_is [u_i, w_i]``;
* core: ``dR = G^{-1} dC``, ``dG = -dR C^T``, ``dM = dR`` (on the solve's references);
* key moments: each key ``j`` enters ``M_c`` of every later block ``c`` of the epoch, so its
  terms ``T_sj = exp(z_s.k'_j - |z_s|^2/2)`` read the suffix sum ``D_s = sum_c dM_c[s]``:
  ``dv_j = sum_s T_sj D_s[:d_v]``, ``e'_sj = T_sj (D_s[:d_v].v_j + D_s[d_v])``,
  ``dk'_j = sum_s e'_sj z_s``, ``dz_s = sum_j e'_sj (k'_j - z_s)``;
* Gram: ``dz_s = sum_t S_st (z_t - z_s)``, ``S = (dG + dG^T) * G``;
* landmarks are points of the pool ``[q~; k~ - mu]``: ``dz`` is added at the pivots; the
  centre ``mu`` (mean of block 0's keys) collects ``-sum_j dk'_j`` and the readout's share.

Guard 3's clamped entries pass their gradient to the value at the running minimum or maximum
(``torch.cummin`` / ``cummax``'s index, as the autograd path's clamp does). Gradients match
the autograd path to round-off (``tests/test_causal_train.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rpka.attention.causal_landmarks import (
    LandmarkSampler,
    LandmarkSet,
    draw_blocks,
    past_is_exact,
)
from rpka.attention.causal_layout import Epoch, Stream, Tape
from rpka.attention.causal_stream import ChunkTerms, KeySide, Readout, stream_forward
from rpka.attention.nystrom import CORE_DTYPE, finite_or_zero, row_sizes
from rpka.attention.rpcholesky import gaussian_kernel


def has_exact_past(n: int, block: int, sampler: LandmarkSampler) -> bool:
    """Whether some landmark epoch of n positions has a past small enough to be exact
    (:func:`past_is_exact`): the written-out backward covers epochs with landmarks only."""
    ppp = sampler.points_per_position
    draws = draw_blocks(math.ceil(n / block), block, sampler.rank, ppp)
    return any(past_is_exact(c, block, sampler.rank, ppp) for c in draws)


def stream_training(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    block: int,
    sampler: LandmarkSampler,
    den_floor: float,
    key_precision: str,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Causal RPKA, differentiable: q, k (..., n, d), v (..., n, d) *unscaled*
    (``q~ = q scale``) -> out (..., n, d), guard counts (:func:`stream_forward`'s)."""
    guards: dict[str, Tensor] = {}
    out = _StreamTraining.apply(q, k, v, scale, block, sampler, den_floor, key_precision, guards)
    return out, guards


class _StreamTraining(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, block, sampler, den_floor, key_precision, guards):  # noqa: D102
        tape = Tape(joint=sampler.pivot_set == "joint")
        out, counts, _ = stream_forward(
            q, k, v, scale, block, sampler, den_floor, key_precision, tape
        )
        guards.update(counts)
        ctx.tape, ctx.den_floor, ctx.shapes = tape, den_floor, (q.shape, k.shape, v.shape)
        # the inputs saved (the tape reads them, or copies) for autograd's check that nothing
        # changed them in place before the backward
        ctx.save_for_backward(out, q, k, v)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        out = ctx.saved_tensors[0]
        tape = ctx.tape
        grads = stream_backward(tape, out.reshape(tape.stream.v.shape), grad, ctx.den_floor)
        return (*(x.view(shape) for x, shape in zip(grads, ctx.shapes, strict=True)),) + (None,) * 6


# ----------------------------------------------------------------------------- backward


@dataclass
class Grads:
    """The raw gradients of q, k, v (B, n, d) (the local part's kernel's, added to), and what
    the centre ``mu`` collects (B, 1, d): the readout's share, and ``sum_j dk'_j`` (scaled)."""

    q: Tensor
    k: Tensor
    v: Tensor
    mu: Tensor
    keys: Tensor


def stream_backward(
    tape: Tape, out: Tensor, grad: Tensor, den_floor: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`stream_forward`'s output ``out`` (B, n, d_v) for ``grad`` (any
    shape of B n d_v entries) in the raw q, k, v (B, n, d).

    The readout runs first (it gives the local part's gradient and writes ``dq~`` row by
    row); the local part's kernel then returns fresh q, k, v gradients, which take ``dq~`` in
    one add and the key moments' and landmarks' shares in place: no full-size buffer is
    zero-filled."""
    s, b = tape.stream, tape.stream.block
    g, routes = route_clamped(s, tape.clamped, grad.reshape(s.v.shape).to(s.v.dtype))
    g_loc, dq_past = torch.empty_like(g), torch.empty_like(s.q)
    g_loc[:, :b], dq_past[:, :b] = g[:, :b], 0  # block 0's rows: the local part is the output
    mu = torch.zeros_like(s.centre)
    epochs = [
        (epoch, *readout_backward(s, tape, epoch, out, g, (g_loc, dq_past, mu), den_floor))
        for epoch in tape.epochs
    ]
    grads = Grads(*local_backward(s, tape, out, g_loc), mu, torch.zeros_like(mu))
    grads.q.add_(dq_past, alpha=s.scale)
    for index, values in routes:
        grads.v.scatter_add_(1, index, values)
    for epoch, dnum, dgram, dz in epochs:
        moments_backward(s, epoch, dnum, grads, dz)
        dz += gram_backward(epoch.landmarks, dgram)
        add_at_pivots(s, epoch, dz, grads, tape.joint)
    grads.k[:, :b] += (grads.mu - grads.keys) * (s.scale / min(b, s.n))
    return grads.q, grads.k, grads.v


def route_clamped(
    s: Stream, clamped: list[tuple[slice, Tensor, Tensor]], g: Tensor
) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """Guard 3: an entry clamped to its running minimum (maximum) passes its gradient to the
    value there (torch's cummin / cummax index), not to the unclamped output. -> the output's
    gradient with those entries zeroed (a copy where any is), and the (index, values) to add
    into v's gradient along its positions."""
    routes = []
    if clamped:
        g = g.clone()
    for rows, below, above in clamped:
        prefix = s.v[:, : rows.stop]
        part = g[:, rows]
        routes.append((torch.cummin(prefix, 1).indices[:, rows], torch.where(below, part, 0)))
        routes.append((torch.cummax(prefix, 1).indices[:, rows], torch.where(above, part, 0)))
        g[:, rows] = torch.where(below | above, 0, part)
    return g, routes


def readout_backward(
    s: Stream,
    tape: Tape,
    epoch: Epoch,
    out: Tensor,
    g: Tensor,
    written: tuple[Tensor, Tensor, Tensor],
    den_floor: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """The rows of one epoch, chunk by chunk as :func:`causal_stream.combine_chunk` (its ops,
    recomputed): writes the rows of ``written`` = (the local part's gradient, ``dq~``) and adds
    the readout's share of ``mu``'s; -> ``dM_c`` (B, E, r, d_v + 1), ``dG`` (B, r, r) and
    ``dZ`` (B, r, d) so far, float64."""
    g_loc, dq_past, mu = written
    lm, (start, stop) = epoch.landmarks, (epoch.start, epoch.stop)
    readout = Readout.of(s, lm)
    shifted = lm.points + s.centre  # z + mu (B, r, d): the readout's landmarks
    dv, dtype = s.v.shape[-1], s.q.dtype
    dnum = torch.empty(*epoch.moments.num.shape, dtype=CORE_DTYPE)
    dgram, dz = torch.zeros_like(lm.chol), torch.zeros_like(lm.points, dtype=CORE_DTYPE)
    width = max(lm.points.shape[-2], dv + 2)
    for c0, c1 in s.chunks(start, stop, width):
        rows, blocks = s.rows(c0, c1), c1 - c0
        moments = epoch.moments.part(slice(c0 - start, c1 - start))
        chunk = ChunkTerms.of(s, tape.lse, (c0, c1), readout, moments, den_floor)
        per_block, low, den, local_den = chunk.terms, chunk.low, chunk.den, chunk.local_den
        weights = chunk.core.scaled.to(dtype)
        # eq. (1) backward (the module docstring's u, w)
        part = g[:, rows]
        u = part / den
        w = -(part * out[:, rows]).sum(-1, keepdim=True) / den
        g_loc[:, rows] = u * local_den  # its log-sum-exp's gradient: local_backward
        uw = torch.cat([u, torch.where(low, 0, w)], -1).unflatten(1, (blocks, -1))
        e = uw @ weights.transpose(-1, -2)  # dL/da (B, G, b, r)
        e.add_(torch.where(low, w * den_floor, 0).unflatten(1, (blocks, -1))).mul_(per_block)
        dcore = per_block.transpose(-1, -2) @ uw  # (B, G, r, d_v + 1)
        e = e.flatten(1, 2)
        torch.bmm(e, shifted, out=dq_past[:, rows])
        dshift = (s.q[:, rows].transpose(-1, -2) @ e).transpose(-1, -2).mul_(s.scale)
        mu += dshift.sum(1, keepdim=True)
        dz += (dshift - e.sum(1).unsqueeze(-1) * lm.points).to(CORE_DTYPE)
        # the core G^{-1} M (float64), as solve_core: scaled = raw / size
        size, _ = row_sizes(chunk.raw)
        dres = torch.cholesky_solve(dcore.to(CORE_DTYPE) / size, readout.landmarks.chol)
        dgram -= (dres @ chunk.raw.transpose(-1, -2)).sum(1)
        rho = moments.rho.to(CORE_DTYPE)
        dnum[:, c0 - start : c1 - start] = dres * torch.exp(rho - chunk.top).unsqueeze(-1)
    return dnum, dgram, dz


def moments_backward(s: Stream, epoch: Epoch, dnum: Tensor, grads: Grads, dz: Tensor) -> None:
    """Key moments: the prefix's keys reach every block of the epoch, block ``c'``'s keys the
    blocks after it (:func:`causal_stream.epoch_moments`' segments, references recomputed).

    ``T_i = sum_{j >= i} dM_j e^{rho_i - rho_j}`` (the merged references ``rho`` only grow
    along the epoch, so every factor is at most 1) by ``T_i = dM_i + e^{rho_i - rho_{i+1}}
    T_{i+1}``; the prefix's chunk with reference ``rho_k <= rho_0`` reads ``e^{rho_k - rho_0}
    T_0``, block ``c' = start + i`` (its own reference) ``e^{rho_c' - rho_{i+1}} T_{i+1}``."""
    start, rho = epoch.start, epoch.moments.rho.to(CORE_DTYPE)
    suffix = dnum.clone()
    for i in range(dnum.shape[1] - 2, -1, -1):
        step = torch.exp(rho[:, i] - rho[:, i + 1]).unsqueeze(-1)
        suffix[:, i].add_(step * suffix[:, i + 1])
    dtype = epoch.moments.num.dtype
    side = KeySide.of(s, epoch.landmarks, dtype)
    width = max(epoch.landmarks.points.shape[-2], s.v.shape[-1] + 1)
    for c0, c1 in s.chunks(0, start, width):  # rows every block of the epoch reads
        terms, own, keys = _terms(s, side, (c0, c1), 1)
        reach = torch.exp(own.to(CORE_DTYPE) - rho[:, :1]).unsqueeze(-1) * suffix[:, :1]
        _segment_backward(s, side, s.rows(c0, c1), (terms, keys), reach.to(dtype), grads, dz)
    for c0, c1 in s.chunks(start, epoch.stop - 1, width):  # read by the blocks after each
        terms, own, keys = _terms(s, side, (c0, c1), c1 - c0)
        later = slice(c0 - start + 1, c1 - start + 1)
        reach = torch.exp(own.to(CORE_DTYPE) - rho[:, later]).unsqueeze(-1) * suffix[:, later]
        _segment_backward(s, side, s.rows(c0, c1), (terms, keys), reach.to(dtype), grads, dz)


def _terms(
    s: Stream, side: KeySide, blocks: tuple[int, int], parts: int
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`causal_stream.chunk_moments`' terms ``T`` (B, parts, m / parts, r) against their
    references (B, parts, r), and the keys ``k~ - mu`` over ``s`` (B, m, d)."""
    keys = torch.sub(s.k[:, s.rows(*blocks)].to(side.bias.dtype), side.centre)
    logits = torch.baddbmm(side.bias, keys, side.points).unflatten(1, (parts, -1))
    rho = finite_or_zero(logits.amax(-2))
    return logits.sub_(rho.unsqueeze(-2)).exp_(), rho, keys


def _segment_backward(
    s: Stream,
    side: KeySide,
    rows: slice,
    terms_keys: tuple[Tensor, Tensor],
    reach: Tensor,
    grads: Grads,
    dz: Tensor,
) -> None:
    """Keys ``rows`` whose terms (B, G, m, r) read ``reach`` (B, G, r, d_v + 1)."""
    terms, keys = terms_keys
    dv = s.v.shape[-1]
    values = s.v[:, rows].to(terms.dtype).unflatten(1, (terms.shape[1], -1))
    grads.v[:, rows] += (terms @ reach[..., :dv]).flatten(1, 2).to(grads.v.dtype)
    e = (values @ reach[..., :dv].transpose(-1, -2)).add_(reach[..., dv:].transpose(-1, -2))
    e = e.mul_(terms).flatten(1, 2)  # (B, m, r)
    grads.k[:, rows] += (e @ side.points.transpose(-1, -2)).to(grads.k.dtype)  # raw keys
    z = side.points.transpose(-1, -2) / s.scale  # (B, r, d)
    column = e.sum(1).unsqueeze(-2)  # (B, 1, r)
    grads.keys += (column @ z).to(grads.keys.dtype)  # sum_j dk'_j
    dz += (e.transpose(-1, -2) @ keys * s.scale - column.transpose(-1, -2) * z).to(CORE_DTYPE)


def gram_backward(landmarks: LandmarkSet, dgram: Tensor) -> Tensor:
    """``dz_s = sum_t S_st (z_t - z_s)``, ``S = (dG + dG^T) * G`` over valid pairs (float64)."""
    z = landmarks.points.to(CORE_DTYPE)
    pair = landmarks.valid.unsqueeze(-1) & landmarks.valid.unsqueeze(-2)
    weight = (dgram + dgram.transpose(-1, -2)) * gaussian_kernel(z, z) * pair
    return weight @ z - weight.sum(-1, keepdim=True) * z


def add_at_pivots(s: Stream, epoch: Epoch, dz: Tensor, grads: Grads, joint: bool) -> None:
    """The landmarks' gradients into the pool's points: a joint pool puts the ``start b``
    queries first (``q~``), then the keys (``k'``); a keys-only pool holds ``k'`` alone."""
    positions = epoch.start * s.block if joint else 0
    pivots, valid = epoch.pivots.clamp(min=0), epoch.pivots >= 0
    rows = torch.arange(pivots.shape[0]).unsqueeze(-1) * s.n + pivots - positions
    dz, d = dz.to(grads.q.dtype), s.q.shape[-1]
    is_key = valid & (pivots >= positions)
    key_part = torch.where(is_key.unsqueeze(-1), dz, 0)
    grads.keys += key_part.sum(1, keepdim=True)
    grads.k.view(-1, d).index_add_(0, rows[is_key], dz[is_key], alpha=s.scale)
    if joint:
        is_query = valid & (pivots < positions)
        grads.q.view(-1, d).index_add_(0, (rows + positions)[is_query], dz[is_query], alpha=s.scale)


def local_backward(
    s: Stream, tape: Tape, out: Tensor, g_loc: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The local part's gradients in the raw q, k, v (B, n, d): the fused kernel's backward on
    the stacked blocks (a partial last block apart), as :func:`causal_local.fused_local`.

    The kernel computes ``dS_ij = p_ij (g_i.v_j - Delta_i)`` with ``Delta_i`` read off the
    ``out`` it is given. The local part's two gradients (its output's ``u_i D^loc_i`` and its
    log-sum-exp's ``(u_i.o^loc_i + w_i) D^loc_i``) need ``Delta_i = (D^loc_i / D_i) g_i.o_i``:
    the combined output ``o_i`` against ``g_loc_i`` gives exactly that, so the kernel runs as
    it is (no extra column for the log-sum-exp's gradient, as :class:`_FlashLocal` needs)."""
    n, b = s.n, s.block
    full = n // b
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    grads = []
    for rows, size in ((slice(0, full * b), b), (slice(full * b, n), n - full * b)):
        if rows.stop > rows.start:
            flat = [
                x[:, rows].reshape(-1, 1, size, x.shape[-1]) for x in (g_loc, s.q, s.k, s.v, out)
            ]
            lse = tape.lse[:, rows].reshape(-1, 1, size)
            parts = kernel(*flat, lse, 0.0, True, scale=s.scale**2)
            grads.append([x.view(s.q.shape[0], -1, x.shape[-1]) for x in parts])
    if len(grads) == 1:  # whole blocks only: the kernel's gradients as they are
        return (*grads[0],)
    return (*(torch.cat(parts, 1) for parts in zip(*grads, strict=True)),)
