"""Accelerated RPCholesky: block + rejection sampling, the same pivot law as the loop.

Epperly, Tropp, Webber 2024, "Embrace rejection: kernel matrix approximation by
accelerated randomly pivoted Cholesky", arXiv:2410.03969. :func:`accelerated_pivots`
draws the pivot sequence of :func:`rpka.attention.rpcholesky.rpcholesky` (rules ``rpc``
and ``uniform``) a block of candidates at a time, reading the points only at candidate
indices (:class:`rpka.attention.pivot_state.PointSet`), so the joint set of a long
sequence is never materialised. :func:`rpcholesky_accelerated` returns the same
:class:`CholeskyResult` as the loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rpka.attention.pivot_state import FAST, PivotState, PointSet
from rpka.attention.rpcholesky import (
    CholeskyResult,
    check_arguments,
    gaussian_kernel,
    gaussian_kernel_,
    half_sq_norms,
    pivot_floor,
    weighting_power,
)
from rpka.attention.sweep import (  # noqa: F401 (_sweep_torch: tests, scripts)
    _sweep_torch,
    absorb_compiled,
    absorb_torch,
    compiled_on_cpu,
    rejection_sweep,
)

PIVOT_METHODS = ("plain", "accelerated")
REFRESH_RULES = ("auto", "round")
# how a refresh computes L^{-1} g(Z_S, z) for all points (residual_diagonal)
RESIDUAL_SOLVES = ("triangular", "inverse")
# rules the accelerated method implements: greedy (argmax) is sequential by definition
ACCELERATED_RULES = ("rpc", "uniform")


def check_fast_options(method: str, rule: str, block_size: int | None, refresh: str) -> None:
    """Validate the pivot-selection method and its options (``ValueError`` naming them)."""
    if method not in PIVOT_METHODS:
        raise ValueError(f"method must be one of {PIVOT_METHODS}, got {method!r}")
    if method == "accelerated" and rule not in ACCELERATED_RULES:
        raise ValueError(
            f"method='accelerated' supports rule in {ACCELERATED_RULES}, got {rule!r} "
            "(greedy pivoting is sequential by definition: use method='plain')"
        )
    if block_size is not None and (
        not isinstance(block_size, int)
        or isinstance(block_size, bool)
        or not 1 <= block_size <= FAST.max_block
    ):
        raise ValueError(
            f"block_size must be None (adaptive) or an integer in [1, {FAST.max_block}], "
            f"got {block_size!r}"
        )
    if refresh not in REFRESH_RULES:
        raise ValueError(f"refresh must be one of {REFRESH_RULES}, got {refresh!r}")


def _draw_candidates(
    state: PivotState,
    n_points: int,
    b: int,
    cdf: Tensor | None,
    envelope: Tensor | None,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor]:
    """b i.i.d. candidates per batch element from the proposal, and their envelope values.

    The proposal is ``cdf`` (B, N) (a cumulative sum of nonnegative weights), uniform when
    None. The envelope (B, N) bounds each point's Gaussian residual; None means 1.
    """
    batch, device = state.count.shape[0], state.count.device
    if cdf is None:
        u = torch.rand(batch, b, generator=generator, device=device, dtype=torch.float64)
        cand = (u * n_points).long().clamp(max=n_points - 1)
    else:
        u = torch.rand(batch, b, generator=generator, device=device, dtype=cdf.dtype)
        # P(first i with cdf_i > u * total) = w_i / total
        cand = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=n_points - 1)
    env = None if envelope is None else envelope.gather(-1, cand)
    return cand, env


def _absorb_block(
    points: PointSet, state: PivotState, cand: Tensor, threshold: Tensor
) -> tuple[Tensor, Tensor]:
    """One round: sweep the candidates, then ONE block update of the factor.

    With ``L`` the Cholesky factor of the accepted pivots' Gram matrix and ``K = g(Z_S, Z_C)``,
    the candidates' residual Gram matrix is ``H = g(Z_C, Z_C) - W^T W`` with ``W = L^{-1} K``
    (a Schur complement). The accepted candidates extend L by the rows ``[W^T, C]`` where
    C is the Cholesky factor of H on the accepted candidates (the sweep's columns).

    Returns accept (B, b) bool and the rank-truncated ``keep`` mask.
    """
    rank = state.rank
    z_c = points.take(cand)  # (B, b, d)
    if state.candidates == 0:  # nothing absorbed yet (known on the host): W = 0
        gram = gaussian_kernel(z_c, z_c)
        w = gram.new_zeros(gram.shape[0], rank, gram.shape[-1])
    else:
        used = torch.arange(rank, device=cand.device) < state.count.unsqueeze(-1)  # (B, r)
        # one kernel call for g(Z_C, [Z_S; Z_C]): (B, b, r + b)
        kern = gaussian_kernel(z_c, torch.cat([state.landmarks, z_c], dim=-2))
        k_sc = kern[..., :rank].transpose(-1, -2) * used.unsqueeze(-1)  # (B, r, b)
        w = torch.linalg.solve_triangular(state.chol, k_sc, upper=False)  # 0 on unused slots
        gram = kern[..., rank:] - w.transpose(-1, -2) @ w  # (B, b, b)
    if compiled_on_cpu(gram, threshold):
        accept, keep = absorb_compiled(state, gram, w, threshold, cand, z_c)
    else:
        accept, cols = rejection_sweep(gram, threshold)
        keep = absorb_torch(state, w, cols, accept, cand, z_c)
    b = cand.shape[-1]
    state.rounds += 1
    state.candidates += b
    return accept, keep


def residual_diagonal(
    points: PointSet, state: PivotState, residual_solve: str = "triangular"
) -> Tensor:
    """Gaussian residual diagonal ``1 - |L^{-1} g(Z_S, z_i)|^2`` of all points, (B, N).

    One pass over the points in chunks; picked points are set to exactly 0.
    ``residual_solve="triangular"`` solves with L chunk by chunk (the reference);
    ``"inverse"`` forms ``L^{-1}`` once (an r x r solve) and multiplies: the same values up
    to round-off (~1 ulp of the residual), about 3x faster on a CPU, where a batched
    triangular solve with many right-hand sides runs far below matrix-multiply speed
    (docs/speed.md).
    """
    rank = state.rank
    out = torch.empty(points.batch, points.n_points, dtype=points.dtype, device=points.device)
    # g(Z, Z_S)^T with masked (exactly zero) rows for unused slots
    lm_half_sq = half_sq_norms(state.landmarks, state.valid).transpose(-1, -2)  # (B, r, 1)
    inverse = None
    if residual_solve == "inverse":
        eye = torch.eye(rank, dtype=points.dtype, device=points.device)
        inverse = torch.linalg.solve_triangular(state.chol, eye, upper=False)
    # cache-sized chunks of at least 64 points (the products slow down below that); each
    # point's residual is computed alone, so the chunking does not change the values
    budget = max(FAST.refresh_chunk_bytes, 64 * points.row_bytes(rank))
    for start, z in points.chunks(rank, budget):
        k = gaussian_kernel_(state.landmarks, z, x_half_sq=lm_half_sq)  # (B, r, c)
        if inverse is None:
            y = torch.linalg.solve_triangular(state.chol, k, upper=False)
        else:
            y = inverse @ k
        out[:, start : start + z.shape[-2]] = (1 - y.square_().sum(-2)).clamp(min=0.0)
        del z, k, y  # free this chunk before the next one is allocated
    picked = torch.zeros(points.batch, points.n_points + 1, dtype=torch.bool, device=out.device)
    picked.scatter_(-1, torch.where(state.valid, state.pivots, points.n_points), True)
    return out.masked_fill(picked[:, :-1], 0.0)


@torch.no_grad()
def accelerated_pivots(
    points: PointSet,
    rank: int,
    rule: str = "rpc",
    generator: torch.Generator | None = None,
    *,
    log_weight: Tensor | None = None,
    block_size: int | None = None,
    refresh: str = "auto",
    first_pivots: Tensor | None = None,
    residual_solve: str = "triangular",
) -> PivotState:
    """Accelerated RPCholesky (block + rejection sampling): the pivot sequence only.

    Target: the sequential rule draws pivot t with probability ``p_i ∝ w_i r_i`` where
    ``w_i = exp(log_weight_i)`` (the weighting, ``tau |z_i|^2``; uniform when None) and
    ``r_i`` is the Gaussian residual after t-1 pivots. Rejection sampling (ETW 2024):
    draw a candidate from a proposal ``q_i ∝ w_i e_i`` with an *envelope* ``e_i >= r_i``
    and accept it with probability ``r_i / e_i``; an accepted candidate is an exact draw
    from ``p``, and proposals are i.i.d., so a whole block of b candidates can be drawn at
    once and then accepted or rejected *in order*, each against its residual given the
    pivots accepted so far (earlier rounds and earlier candidates of this block). The
    accepted sequence has exactly the law of the sequential rule. The envelope and its
    refresh: :func:`_rejection_rounds`; rule ``uniform``: :func:`_uniform_pivots`.

    Candidates whose residual is below the pivot floor are rejected (the plain loop would
    spend a step on them and record -1; this happens only once the residual is exhausted).

    Args:
        points: the point set (B, N, d) (see :class:`PointSet`).
        rank: pivots to draw, capped at N.
        log_weight: (B, N) log of the weighting, or None (uniform, i.e. ``gauss``).
        block_size: candidates per round, or None for adaptive (the missing count over the
            last acceptance rate, times a margin; the rate counts as 1 after a refresh).
        refresh: ``"auto"`` or ``"round"`` (:func:`_rejection_rounds`).
        first_pivots: (B, t0) forced first pivots, absorbed as one block.
        residual_solve: how a refresh computes the residuals (:func:`residual_diagonal`).
    """
    check_fast_options("accelerated", rule, block_size, refresh)
    if residual_solve not in RESIDUAL_SOLVES:
        raise ValueError(f"residual_solve must be one of {RESIDUAL_SOLVES}, got {residual_solve!r}")
    rank = min(rank, points.n_points)
    round_off = pivot_floor(points.dtype)
    like = torch.empty(0, dtype=points.dtype, device=points.device)
    state = PivotState.empty(points.batch, rank, points.dim, like)
    forced = None
    if first_pivots is not None:
        forced = torch.broadcast_to(
            first_pivots.to(points.device).long(), (points.batch, first_pivots.shape[-1])
        )
        _absorb_block(
            points, state, forced, torch.full(forced.shape, round_off, device=like.device)
        )
    if rule == "uniform":
        _uniform_pivots(points, state, generator, forced, round_off)
    else:
        rounds = RoundOptions(log_weight, block_size, refresh, residual_solve, round_off)
        _rejection_rounds(points, state, generator, forced, rounds)
    return state


def _uniform_pivots(
    points: PointSet,
    state: PivotState,
    generator: torch.Generator | None,
    forced: Tensor | None,
    round_off: float,
) -> None:
    """Rule ``uniform``: the first r points of a random permutation, in one block.

    The threshold is the pivot floor only, so a candidate is accepted unless degenerate:
    the uniform rule without replacement. ``forced`` (B, t0) pivots come first.
    """
    keys = torch.rand(points.batch, points.n_points, generator=generator, device=points.device)
    if forced is not None:
        keys.scatter_(-1, forced, -1.0)
    missing = state.rank - (0 if forced is None else forced.shape[-1])
    if missing > 0:
        cand = keys.topk(missing, dim=-1).indices
        _absorb_block(points, state, cand, torch.full(cand.shape, round_off, device=points.device))


@dataclass(frozen=True)
class RoundOptions:
    """What the rejection rounds of :func:`accelerated_pivots` are run with."""

    log_weight: Tensor | None  # (B, N) log of the weighting, None for uniform
    block_size: int | None  # None: adaptive (:func:`_block_size`)
    refresh: str  # "auto" or "round" (:func:`_rejection_rounds`)
    residual_solve: str  # :func:`residual_diagonal`
    round_off: float  # the pivot floor


def _rejection_rounds(
    points: PointSet,
    state: PivotState,
    generator: torch.Generator | None,
    forced: Tensor | None,
    options: RoundOptions,
) -> None:
    """Rule ``rpc``: rounds of candidates until every element has r pivots (or none left).

    Envelope: residuals only decrease, so the residual at any earlier time bounds the
    current one. ``e = 1`` at the start (the Gaussian diagonal); a *refresh* recomputes
    ``e`` as the current residual diagonal (:func:`_refreshed_proposal`, one pass over the
    points). ``refresh="round"`` refreshes before every round - the paper's algorithm,
    where candidate j is accepted with probability (its residual given the accepted ones)
    / (its residual at the round start). ``refresh="auto"`` (default) refreshes only after
    a round that accepted fewer than ``FAST.refresh_below`` of its candidates: the proposal
    stays valid between refreshes, so when most candidates are accepted (typical for the
    Gaussian weighting) the selection costs O(candidates x (r + b) x d), independent of N.
    Both are exact.
    """
    rank, log_weight = state.rank, options.log_weight
    weight = None if log_weight is None else torch.exp(log_weight - log_weight.amax(-1, True))
    cdf = None if weight is None else weight.to(torch.float64).cumsum(-1)
    envelope = None
    missing, acceptance = rank - (0 if forced is None else forced.shape[-1]), 1.0
    alive = torch.ones(points.batch, dtype=torch.bool, device=points.device)  # not exhausted
    refresh_now = options.refresh == "round" and forced is not None
    # each round draws >= 1 pivot right after a refresh unless the residual is exhausted,
    # so this bound is never reached; it only guards against an endless loop
    for _ in range(4 * rank + 8):
        if missing <= 0:
            break
        if refresh_now:
            envelope, cdf = _refreshed_proposal(points, state, options)
            alive = cdf[:, -1] > 0
        b = _block_size(options.block_size, missing, acceptance)
        missing, acceptance = _rejection_round(
            points, state, b, (cdf, envelope, alive), generator, options.round_off
        )
        refresh_now = options.refresh == "round" or acceptance < FAST.refresh_below
        if refresh_now:  # a fresh proposal is the target itself for its first candidate
            acceptance = 1.0


def _refreshed_proposal(
    points: PointSet, state: PivotState, options: RoundOptions
) -> tuple[Tensor, Tensor]:
    """The envelope ``e = r`` (the current residual diagonal, 0 below the pivot floor) and
    the proposal's cdf of ``w_i e_i``, (B, N) each."""
    envelope = residual_diagonal(points, state, options.residual_solve)
    envelope = torch.where(envelope > options.round_off, envelope, 0.0)
    if options.log_weight is None:
        mass = envelope
    else:  # in the log domain, renormalised: the weights alone may underflow
        log_mass = options.log_weight + torch.log(envelope)
        mass = torch.exp(log_mass - log_mass.amax(-1, keepdim=True).clamp(min=-1e30))
    state.refreshes += 1
    return envelope, mass.to(torch.float64).cumsum(-1)


def _block_size(block_size: int | None, missing: int, acceptance: float) -> int:
    """Candidates of the next round: ``block_size``, or adaptive - the missing pivots over
    the last acceptance rate, times a margin, within ``[FAST.min_block, FAST.max_block]``."""
    if block_size is not None:
        return block_size
    b = math.ceil(FAST.block_margin * missing / max(acceptance, 1 / FAST.max_block))
    return min(max(b, FAST.min_block), FAST.max_block)


def _rejection_round(
    points: PointSet,
    state: PivotState,
    b: int,
    proposal: tuple[Tensor | None, Tensor | None, Tensor],
    generator: torch.Generator | None,
    round_off: float,
) -> tuple[int, float]:
    """One round of b candidates from ``proposal`` = (cdf, envelope, alive): draw, accept
    ``u e_i < r_i`` in order, absorb. Returns the pivots still missing (most over the
    elements) and the acceptance rate of the elements that were short.

    Host synchronisation: one small device-to-host copy per round (is any element short
    of r pivots, the acceptance rate, the block size) - none per pivot. A round's work is
    a fixed number of tensor ops plus a b-step sweep over a b x b tile
    (:func:`rejection_sweep`, one fused kernel on CUDA).
    """
    cdf, envelope, alive = proposal
    rank = state.rank
    cand, env = _draw_candidates(state, points.n_points, b, cdf, envelope, generator)
    u = torch.rand(points.batch, b, generator=generator, device=points.device, dtype=points.dtype)
    threshold = (u if env is None else u * env).clamp(min=round_off)
    short = (state.count < rank) & alive
    accept, _ = _absorb_block(points, state, cand, threshold)
    missing, accepted, shorts = round_counts(state.count, accept, short, alive, rank)
    return missing, accepted / max(shorts * b, 1)


def round_counts(
    count: Tensor, accept: Tensor, short: Tensor, alive: Tensor, rank: int, host: bool | None = None
) -> tuple[int, int, int]:
    """After a round: the pivots still missing (the most over the elements), the candidates
    accepted by the elements that were short before it, and how many were - the round's one
    host synchronisation. count (B,) after the round, accept (B, b), short and alive (B,).
    ``host`` (default: on the CPU) reads them in numpy, ~10 tensor ops fewer a round."""
    on_host = count.device.type == "cpu" if host is None else host
    if on_host:
        c, live, was_short = count.numpy(), alive.numpy(), short.numpy()
        missing = int(((rank - c) * ((c < rank) & live)).max())
        return missing, int((accept.numpy().sum(-1) * was_short).sum()), int(was_short.sum())
    still = (count < rank) & alive
    missing, accepted, shorts = torch.stack(
        [((rank - count) * still).amax(), (accept.sum(-1) * short).sum(), short.sum()]
    ).tolist()
    return int(missing), int(accepted), int(shorts)


def factor_from_pivots(points: PointSet, state: PivotState) -> Tensor:
    """Cholesky factor ``F = g(Z, Z_S) L^{-T}`` of the Gaussian matrix, (B, N, r).

    Columns of unused slots are zero. One pass over the points.
    """
    rank = state.rank
    out = torch.empty(points.batch, points.n_points, rank, dtype=points.dtype, device=points.device)
    # g(Z, Z_S)^T with masked (exactly zero) rows for unused slots
    lm_half_sq = half_sq_norms(state.landmarks, state.valid).transpose(-1, -2)  # (B, r, 1)
    for start, z in points.chunks(rank):
        k = gaussian_kernel_(state.landmarks, z, x_half_sq=lm_half_sq)  # (B, r, c)
        y = torch.linalg.solve_triangular(state.chol, k, upper=False)
        out[:, start : start + z.shape[-2]] = y.transpose(-1, -2)
        del z, k, y
    return out


@torch.no_grad()
def rpcholesky_accelerated(
    points: Tensor,
    rank: int,
    rule: str = "rpc",
    generator: torch.Generator | None = None,
    *,
    weighting: str = "gauss",
    tempering: float = 0.5,
    tol: float = 0.0,
    first_pivots: Tensor | None = None,
    block_size: int | None = None,
    refresh: str = "auto",
) -> CholeskyResult:
    """:func:`rpka.attention.rpcholesky.rpcholesky` by block + rejection sampling.

    Same arguments (rules ``rpc`` and ``uniform`` only) and result, same pivot law; the
    factor is formed in one pass once the pivots are drawn, and ``tol`` truncates the
    sequence at the first step whose residual trace is ``<= tol * trace(A_tau)``, as the
    loop would. ``block_size`` and ``refresh`` tune the rounds (:func:`accelerated_pivots`).
    """
    check_arguments(points, rank, rule, tol)
    check_fast_options("accelerated", rule, block_size, refresh)
    dtype = torch.float64 if points.dtype == torch.float64 else torch.float32
    *batch, n_points, _ = points.shape
    rank = min(rank, n_points)
    tau = weighting_power(weighting, tempering)
    point_set = PointSet([points], dtype=dtype)
    sq_norm = point_set.sq_norms()  # (B, N)
    log_weight = tau * sq_norm
    if first_pivots is not None:
        first_pivots = torch.broadcast_to(first_pivots, (*batch, first_pivots.shape[-1]))
        first_pivots = first_pivots.reshape(point_set.batch, -1)
    state = accelerated_pivots(
        point_set,
        rank,
        rule,
        generator,
        log_weight=log_weight if tau > 0 else None,
        block_size=block_size,
        refresh=refresh,
        first_pivots=first_pivots,
    )
    factor = factor_from_pivots(point_set, state)  # (B, N, r)
    log_scale = log_weight.amax(-1)
    weight = torch.exp(log_weight - log_scale.unsqueeze(-1))
    # residual after each step: 1 - running sum of squared factor columns, clamped, and
    # exactly 0 at the pivots from the step that picked them on (as the loop does)
    residual = (1 - factor.pow(2).cumsum(-1)).clamp(min=0.0)  # (B, N, r)
    step = torch.arange(rank, device=factor.device)
    picked_at = torch.full((point_set.batch, n_points + 1), rank, device=factor.device)
    picked_at.scatter_(
        -1, torch.where(state.valid, state.pivots, n_points), step.expand_as(state.pivots)
    )
    residual = residual.masked_fill(step >= picked_at[:, :n_points, None], 0.0)
    trace = torch.cat(
        [weight.sum(-1, keepdim=True), (weight.unsqueeze(-1) * residual).sum(-2)], dim=-1
    )  # (B, r + 1)
    # tol: the loop runs step t only while trace[t] > tol * trace[0]; steps are a prefix
    running = (trace[:, :rank] > tol * trace[:, :1]).cumprod(-1).bool() & state.valid
    pivots = state.pivots.masked_fill(~running, -1)
    factor = factor * running.unsqueeze(-2)
    used = running.sum(-1)  # (B,)
    last = torch.cat([residual.new_ones(point_set.batch, n_points, 1), residual], dim=-1)
    residual = last.gather(-1, used.view(-1, 1, 1).expand(-1, n_points, 1)).squeeze(-1)
    trace = trace.gather(
        -1, torch.minimum(torch.arange(rank + 1, device=trace.device), used.unsqueeze(-1))
    )
    return CholeskyResult(
        pivots.reshape(*batch, rank),
        factor.reshape(*batch, n_points, rank),
        trace.reshape(*batch, rank + 1),
        log_scale.reshape(batch),
        log_weight.reshape(*batch, n_points),
        residual.reshape(*batch, n_points),
    )
