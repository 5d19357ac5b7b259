"""Residual-pivoted kernel attention (RPKA): Nystrom softmax attention on RPCholesky pivots.

With ``q~ = q d^{-1/4}`` and ``k~ = k d^{-1/4}`` exact attention weights key j for query i
by ``exp(q~_i . k~_j) = e^{|q~_i|^2/2} e^{|k~_j|^2/2} g(q~_i, k~_j)``. The query factor
cancels in the softmax, the key factor becomes a weight ``w_j`` (kept in the log domain),
and the Gaussian ``g`` is replaced by its Nystrom approximation on landmarks ``Z_S``:

    g(Q~, K~) ~ G_QS G_SS^{-1} G_SK,
    out = G_QS G_SS^{-1} G_SK (w * V) / G_QS G_SS^{-1} G_SK w          (DESIGN.md section 2)

in O(n r d). Landmarks are RPCholesky pivots of the joint set ``[Q~; K~]`` (or of the keys
only), picked without gradient; the factor is rebuilt differentiably from them.

Fast path (the default, ``pivot_method="auto"``): pivots come from the accelerated
(block + rejection) RPCholesky, which reads the points only at candidate indices, and
without gradients the output is streamed in chunks on the selection's own Cholesky factor
(:func:`nystrom_softmax_chunked`) - no (n x r) matrix and no float32 copy of the whole
sequence is ever held. The plain one-pivot-per-step loop stays available
(``pivot_method="plain"``) as the reference; both draw pivots from the same law.

The approximation is not entrywise positive, so three guards keep the output sane, and the
module counts how often each fired in its last call (``guard_counts``):

1. keys are centred by their mean (softmax is exactly invariant to a common key shift, and
   smaller key norms mean less spread in ``w``);
2. the denominator is floored at ``den_floor * sum_s a_s |c_s|``, a fraction of the size
   of the terms it sums (:func:`nystrom_readout`; the query factor ``e^{-|q~|^2/2}`` and
   each row's maximum are dropped first, so the floor is scale-free);
3. each output coordinate is clamped to ``[min_j v_j, max_j v_j]`` (the exact output is a
   convex combination of the values).

Pivot refresh (``pivot_refresh``). By default (``"call"``) every call draws new pivots for
every (sequence, head) - in a model, every layer of every training step. With ``"batch"``
the pivots are fixed for a whole batch: the *indices* drawn at the first call after
:meth:`RPKAttention.new_batch` (in a model: the first layer of a forward pass, on that
layer's own points) are kept in a :class:`PivotCache` and reused by every later call until
the next ``new_batch`` - by the same module and by every module sharing the cache
(:func:`share_pivot_cache`; ``TransformerTiny`` ties its layers and starts a batch at each
forward). A reusing call gathers its landmarks at those token positions from its *own*
scaled points, so the Nystrom factor and its gradient are that call's; only the random
choice of positions is shared. One draw per batch instead of one per layer: the ablation
asks whether re-adapting the landmarks to each layer's geometry (and drawing fresh
randomness at each call) matters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rpka.attention.base import AttentionMethod
from rpka.attention.guards import guarded_ratio
from rpka.attention.rpcholesky import (
    PIVOT_RULES,
    PivotState,
    PointSet,
    accelerated_pivots,
    check_fast_options,
    chunk_bounds,
    gaussian_kernel,
    gaussian_kernel_,
    half_sq_norms,
    rpcholesky,
    weighting_power,
)

PIVOT_SETS = ("joint", "keys")
SELECTION_METHODS = ("auto", "plain", "accelerated")
PIVOT_REFRESH = ("call", "batch")
# options that choose how pivots are computed, not their law (the same estimator either way)
IMPLEMENTATION_OPTIONS = ("pivot_method", "block_size", "refresh")


class PivotCache:
    """Pivot indices shared by the calls of one batch (``pivot_refresh="batch"``).

    ``pivots`` is None (no draw yet in this batch) or the (..., r') long tensor of indices
    into the pivoted points (-1 for an unused slot) drawn by the batch's first call, and
    ``key`` what they were drawn for: (batch shape, number of points, rank).
    """

    def __init__(self) -> None:
        self.pivots: Tensor | None = None
        self.key: tuple | None = None

    def clear(self) -> None:
        """Start a new batch: the next call draws."""
        self.pivots = self.key = None

    def store(self, pivots: Tensor, key: tuple) -> None:
        self.pivots, self.key = pivots, key

    def matching(self, key: tuple) -> Tensor | None:
        """The stored indices if they were drawn for ``key``, else None.

        A call with another batch shape, point count or rank cannot reuse them: it is the
        first call of a new batch (the caller then draws and stores afresh).
        """
        return self.pivots if self.key == key else None


def share_pivot_cache(modules: Sequence[nn.Module]) -> None:
    """Make every RPKA module with ``pivot_refresh="batch"`` reuse one draw per batch.

    The modules (e.g. the layers of a model, in call order) get the first such module's
    :class:`PivotCache`; modules with ``pivot_refresh="call"`` are left alone.
    """
    batched = [m for m in modules if getattr(m, "pivot_refresh", None) == "batch"]
    for module in batched[1:]:
        module.pivot_cache = batched[0].pivot_cache


def new_batch(modules: Sequence[nn.Module]) -> None:
    """Start a new batch in every RPKA module of ``modules`` (clears their pivot caches)."""
    for module in modules:
        if isinstance(module, RPKAttention):
            module.new_batch()


def gather_points(points: Tensor, index: Tensor) -> Tensor:
    """points (..., N, d), index (..., r) with -1 for none -> (..., r, d) (zeros for -1)."""
    safe = index.clamp(min=0)
    out = torch.gather(points, -2, safe.unsqueeze(-1).expand(*safe.shape, points.shape[-1]))
    return out * (index >= 0).unsqueeze(-1).to(points.dtype)


def nystrom_core(k_s: Tensor, v: Tensor, landmarks: Tensor, valid: Tensor) -> Tensor:
    """Key side of the Nystrom estimate: ``G_SS^{-1} G_SK [w * V, w]``, (..., r, d_v + 1).

    Args:
        k_s: (..., m, d) scaled (and centred) keys.
        v: (..., m, d_v) values, same dtype as k_s.
        landmarks: (..., r, d) landmark points.
        valid: (..., r) bool; invalid landmarks are ignored (their rows of the core are 0).

    The last column carries the key weights ``w_j = exp(|k_j|^2/2 - max)`` (log domain,
    max 1): the key factor ``e^{|k|^2/2}`` of ``exp(q.k)``.
    """
    g_ks = gaussian_kernel(k_s, landmarks) * valid.to(k_s.dtype).unsqueeze(-2)  # (..., m, r)
    chol = landmark_cholesky(landmarks, valid)

    log_w = k_s.pow(2).sum(-1) / 2  # e^{|k~|^2/2}, in the log domain
    w = torch.exp(log_w - log_w.amax(-1, keepdim=True))  # (..., m), max 1
    wv = torch.cat([w.unsqueeze(-1) * v, w.unsqueeze(-1)], dim=-1)  # (..., m, d_v + 1)
    rhs = (g_ks.transpose(-1, -2) @ wv).to(chol.dtype)
    return torch.cholesky_solve(rhs, chol).to(k_s.dtype)  # (..., r, d_v + 1)


def landmark_cholesky(landmarks: Tensor, valid: Tensor) -> Tensor:
    """Cholesky factor of ``G_SS + jitter I`` (..., r, r), always in float64.

    The block is tiny (r x r), and in float32 a Gram of pivots whose residuals were near
    round-off can lose definiteness to rounding (seen in training at r = 64 of 192 points).
    The jitter is that of the input precision (10 eps), so float32 and float64 inputs keep
    their own accuracy; invalid landmarks get identity rows.
    """
    lm = landmarks.to(torch.float64)
    eye = torch.eye(lm.shape[-2], dtype=torch.float64, device=lm.device)
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    g_ss = torch.where(pair, gaussian_kernel(lm, lm), eye)
    jitter = 10 * torch.finfo(landmarks.dtype).eps
    return torch.linalg.cholesky(g_ss + jitter * eye)


def nystrom_readout(
    x: Tensor,
    landmarks: Tensor,
    valid: Tensor,
    core: Tensor,
    v: Tensor,
    den_floor: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Query side: ``g(x, Z_S) core`` as a guarded ratio, computed in the log domain.

    ``g(x, s) = e^{-|x|^2/2} exp(x.s - |s|^2/2)``: the query factor is common to the
    numerator and the denominator, so it is dropped, and so is each row's maximum of
    ``x.s - |s|^2/2`` (as in a softmax). Nothing underflows however large |x| is, and the
    denominator floor is relative to the size of the terms it sums,
    ``den_floor * sum_s a_s |c_s|`` - scale-free, unlike a floor tied to ``sum_j w_j``,
    which the exact denominator undercuts by ``e^{-|x|^2/2}``-like factors.

    Args:
        x: (..., n, d) query points.
        landmarks: (..., r, d), valid: (..., r) bool.
        core: (..., r, d_v + 1) from :func:`nystrom_core` (last column: weights).
        v: (..., m, d_v) values (for the value-hull guard).
        den_floor: relative denominator floor.

    Returns:
        out (..., n, d_v) and the guard counts of :func:`rpka.attention.guards.guarded_ratio`.
    """
    logits = x @ landmarks.transpose(-1, -2) - landmarks.pow(2).sum(-1).unsqueeze(-2) / 2
    logits = logits.masked_fill(~valid.unsqueeze(-2), float("-inf"))  # (..., n, r)
    a = torch.exp(logits - logits.amax(-1, keepdim=True).detach())  # max 1 per row
    full = a @ core  # (..., n, d_v + 1)
    tiny = torch.finfo(core.dtype).tiny  # keeps 0/0 out if every term vanished
    floor = (den_floor * (a @ core[..., -1:].abs())).clamp(min=tiny)
    return guarded_ratio(full[..., :-1], full[..., -1:], floor, v)


def nystrom_softmax(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    landmarks: Tensor,
    valid: Tensor,
    den_floor: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Guarded Nystrom estimate of ``softmax(q_s k_s^T) v`` on given landmarks.

    Args:
        q_s: (..., n, d) scaled queries ``q d^{-1/4}``.
        k_s: (..., m, d) scaled (and centred) keys.
        v: (..., m, d_v) values, same dtype as q_s.
        landmarks: (..., r, d) landmark points.
        valid: (..., r) bool; invalid landmarks are ignored.
        den_floor: relative floor of the denominator (guard 2).

    Returns:
        out (..., n, d_v) and guard counts (tensors): ``denominator`` rows floored,
        ``clamped`` output entries clamped, with totals ``rows`` and ``entries``.
    """
    core = nystrom_core(k_s, v, landmarks, valid)
    return nystrom_readout(q_s, landmarks, valid, core, v, den_floor)


@torch.no_grad()
def nystrom_softmax_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: PivotState,
    scale: float,
    key_shift: Tensor,
    den_floor: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`nystrom_softmax` for inference: chunked, on the selection's own factor.

    Same estimate and guards, but (i) it reuses the pivot selection's Cholesky factor
    ``L`` of ``G(Z_S, Z_S)`` instead of rebuilding it, (ii) it never holds an (n x r) or an
    (n x d) float32 copy of the whole sequence: keys stream through
    ``F_K^T [w v, w]`` (r x (d_v + 1)) with a running max of the log weights (rescaled as
    in online softmax), then queries stream through ``F_Q`` into the output. Peak memory is
    the output plus a few chunk-sized buffers (``FAST.chunk_bytes`` each).

    Args:
        q: (B, H, n, d), k: (B, H, m, d), v: (B, H, m, d_v), any float dtype.
        state: pivots of the scaled points (batch flattened to B*H), from
            :func:`accelerated_pivots` on ``[q * scale; k * scale - key_shift]`` or keys.
        scale: ``d^{-1/4}``; key_shift: (B, H, 1, d) the mean of the scaled keys.

    Returns:
        out (B, H, n, d_v) in q's dtype and the guard counts (as :func:`nystrom_softmax`).
    """
    compute = state.landmarks.dtype
    batch_shape, n, m, d_v = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
    q, k, v = (x.reshape(-1, x.shape[-2], x.shape[-1]) for x in (q, k, v))
    shift = key_shift.to(compute).reshape(-1, 1, k.shape[-1])
    landmarks, rank = state.landmarks, state.rank
    lm_half_sq = half_sq_norms(landmarks, state.valid)  # (B, 1, r), +inf masks unused slots
    row_bytes = q.shape[0] * max(rank, d_v + 1, q.shape[-1]) * torch.finfo(compute).bits // 8

    def scaled(x: Tensor) -> Tensor:  # a fresh float copy (never the input itself)
        return x.to(compute, copy=True).mul_(scale)

    # keys: acc = g(K~, Z_S)^T [w v, w] with w = e^{|k~|^2/2 - max}, max kept running
    acc = q.new_zeros(q.shape[0], rank, d_v + 1, dtype=compute)
    run_max = q.new_full((q.shape[0], 1, 1), float("-inf"), dtype=compute)
    for start, stop in chunk_bounds(m, row_bytes):
        k_c = scaled(k[:, start:stop]).sub_(shift)
        half_sq = k_c.pow(2).sum(-1, keepdim=True) / 2  # (B, c, 1): log w before the max
        g_ks = gaussian_kernel_(k_c, landmarks, half_sq, lm_half_sq)  # (B, c, r)
        new_max = torch.maximum(run_max, half_sq.amax(-2, keepdim=True))
        w = half_sq.sub_(new_max).exp_()
        wv = torch.empty(*w.shape[:-1], d_v + 1, dtype=compute, device=w.device)
        torch.mul(v[:, start:stop], w, out=wv[..., :-1])  # [w v, w]: (B, c, d_v + 1)
        wv[..., -1:] = w
        rescale = torch.exp(run_max - new_max)
        acc = torch.baddbmm(acc * rescale, g_ks.transpose(-1, -2), wv)
        run_max = new_max
        del k_c, g_ks, wv, w  # free this chunk before the next one is allocated
    core = torch.cholesky_solve(acc, state.chol)  # G_SS^{-1} g_SK [w v, w]: (B, r, d_v + 1)

    # queries: out = a core[:, :d_v] / a core[:, d_v] with a = g(Q~, Z_S) up to each row's
    # common factor, in the log domain as in nystrom_readout; guard 2 relative to the terms
    v_min = v.amin(-2, keepdim=True).to(compute)
    v_max = v.amax(-2, keepdim=True).to(compute)
    core_abs_w = core[..., -1:].abs()
    tiny = torch.finfo(compute).tiny
    out = torch.empty(q.shape[0], n, d_v, dtype=q.dtype, device=q.device)
    low_count, clamped_count = [], []
    for start, stop in chunk_bounds(n, row_bytes):
        logits = torch.baddbmm(-lm_half_sq, scaled(q[:, start:stop]), landmarks.transpose(-1, -2))
        a = logits.sub_(logits.amax(-1, keepdim=True)).exp_()  # (B, c, r), row max 1
        full = a @ core
        floor = (a @ core_abs_w).mul_(den_floor).clamp_(min=tiny)
        num, den = full[..., :-1], full[..., -1:]
        low = den < floor
        o = num.div_(torch.where(low, floor, den))  # in place: one (B, c, d_v + 1) buffer
        low_count.append(low.sum())
        clamped_count.append(((o < v_min) | (o > v_max)).sum())
        out[:, start:stop] = o.clamp_(v_min, v_max)
        del logits, a, full, floor, num, den, o, low
    low_total, clamped_total = torch.stack(low_count).sum(), torch.stack(clamped_count).sum()
    counts = {
        "denominator": low_total,
        "rows": torch.tensor(q.shape[0] * n),
        "clamped": clamped_total,
        "entries": torch.tensor(q.shape[0] * n * d_v),
    }
    return out.reshape(*batch_shape, n, d_v), counts


class RPKAttention(AttentionMethod):
    """Residual-pivoted kernel attention.

    Options:
        rank: number of landmarks r >= 1; capped at the number of points (then exact).
        pivot_rule: ``"rpc"`` (random, proportional to the residual), ``"greedy"``,
            ``"uniform"``.
        pivot_set: ``"joint"`` (pivots from ``[Q~; K~]``, 2n points) or ``"keys"``.
        weighting: which residual the pivots are drawn from - ``"gauss"`` (every point
            starts equal), ``"exp"`` (the exponential kernel itself) or ``"tempered"``.
        tempering: the exponent tau in (0, 1) of the tempered weighting.
        den_floor: relative denominator floor (guard 2), in (0, 1).
        generator: optional ``torch.Generator`` for the pivot draws.
        pivot_method: ``"accelerated"`` (block + rejection RPCholesky, rules rpc and
            uniform), ``"plain"`` (one pivot per step, the reference) or ``"auto"``
            (accelerated where it applies, plain for greedy). Same pivot law either way.
        block_size: candidates per round of the accelerated method (None: adaptive).
        refresh: proposal refresh of the accelerated method, ``"auto"`` or ``"round"``.
        pivot_refresh: ``"call"`` (new pivots at every call) or ``"batch"`` (the indices
            drawn at the first call after :meth:`new_batch` are reused until the next one,
            also by modules sharing the :class:`PivotCache`; see the module docstring).
            Reusing calls take the differentiable (unchunked) path.
        causal_block: with ``causal=True``, the block length b >= 1: exact attention inside
            a block, Nystrom attention to earlier blocks (``causal.py``).

    Without gradients (inference) the accelerated path never materialises the joint set
    or any (n x r) matrix: pivots are drawn from the inputs in place and the output is
    streamed in chunks on the selection's own Cholesky factor
    (:func:`nystrom_softmax_chunked`). With gradients the factor is rebuilt differentiably
    from the landmarks (:func:`nystrom_softmax`).
    """

    name = "rpka"

    def __init__(
        self,
        rank: int = 64,
        pivot_rule: str = "rpc",
        pivot_set: str = "joint",
        weighting: str = "gauss",
        tempering: float = 0.5,
        den_floor: float = 1e-6,
        generator: torch.Generator | None = None,
        pivot_method: str = "auto",
        block_size: int | None = None,
        refresh: str = "auto",
        pivot_refresh: str = "call",
        causal_block: int = 64,
        causal: bool = False,
        check_inputs: bool = True,
    ) -> None:
        super().__init__(causal=causal, check_inputs=check_inputs)
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        if pivot_rule not in PIVOT_RULES:
            raise ValueError(f"pivot_rule must be one of {PIVOT_RULES}, got {pivot_rule!r}")
        if pivot_set not in PIVOT_SETS:
            raise ValueError(f"pivot_set must be one of {PIVOT_SETS}, got {pivot_set!r}")
        weighting_power(weighting, tempering)  # validates both
        if not 0.0 < den_floor < 1.0:
            raise ValueError(f"den_floor must lie in (0, 1), got {den_floor!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError("generator must be a torch.Generator or None")
        if pivot_method not in SELECTION_METHODS:
            raise ValueError(
                f"pivot_method must be one of {SELECTION_METHODS}, got {pivot_method!r}"
            )
        method = pivot_method
        if method == "auto":
            method = "plain" if pivot_rule == "greedy" else "accelerated"
        check_fast_options(method, pivot_rule, block_size, refresh)
        if pivot_refresh not in PIVOT_REFRESH:
            raise ValueError(f"pivot_refresh must be one of {PIVOT_REFRESH}, got {pivot_refresh!r}")
        if pivot_refresh != "call" and causal:
            raise ValueError(
                "pivot_refresh='batch' is not supported with causal=True (the causal path "
                "draws each block's landmarks itself); use pivot_refresh='call'"
            )
        if not isinstance(causal_block, int) or isinstance(causal_block, bool) or causal_block < 1:
            raise ValueError(f"causal_block must be a positive integer, got {causal_block!r}")
        self.causal_block = causal_block
        self.pivot_method = pivot_method
        self.method = method  # the one in use ("auto" resolved)
        self.block_size = block_size
        self.refresh = refresh
        self.rank = rank
        self.pivot_rule = pivot_rule
        self.pivot_set = pivot_set
        self.weighting = weighting
        self.tempering = tempering
        self.den_floor = den_floor
        self.generator = generator
        self.pivot_refresh = pivot_refresh
        self.pivot_cache = PivotCache()

    def new_batch(self) -> None:
        """Start a new batch: with ``pivot_refresh="batch"`` the next call draws pivots."""
        self.pivot_cache.clear()

    def _scaled(self, q: Tensor, k: Tensor) -> tuple[torch.dtype, float, Tensor]:
        """Compute dtype, the scale d^{-1/4} and the mean of the scaled keys (guard 1)."""
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        scale = q.shape[-1] ** -0.25
        key_shift = k.mean(-2, keepdim=True, dtype=compute) * scale
        return compute, scale, key_shift

    def point_set(self, q: Tensor, k: Tensor, scaled: tuple | None = None) -> PointSet:
        """The pivoted points ``[q~; k~ - mean]`` (or the keys), read in place."""
        compute, scale, key_shift = scaled or self._scaled(q, k)
        if self.pivot_set == "joint":
            return PointSet([q, k], scale, [None, key_shift], compute)
        return PointSet([k], scale, [key_shift], compute)

    def select(self, points: PointSet) -> PivotState:
        """Accelerated pivot selection on ``points`` (batch flattened) - no gradient."""
        tau = weighting_power(self.weighting, self.tempering)
        return accelerated_pivots(
            points,
            self.rank,
            self.pivot_rule,
            self.generator,
            log_weight=tau * points.sq_norms() if tau > 0 else None,
            block_size=self.block_size,
            refresh=self.refresh,
        )

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.causal:
            from rpka.attention import causal  # imported here: causal.py imports this module

            out, self._guards = causal.attend(self, q, k, v)
            return out
        needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        compute, scale, key_shift = scaled = self._scaled(q, k)
        per_call = self.pivot_refresh == "call"
        if self.method == "accelerated" and not needs_grad and per_call:
            state = self.select(self.point_set(q, k, scaled))
            out, self._guards = nystrom_softmax_chunked(
                q, k, v, state, scale, key_shift, self.den_floor
            )
            return out
        q_s = q.to(compute) * scale
        k_s = k.to(compute) * scale - key_shift  # guard 1: exact invariance of softmax
        points = torch.cat([q_s, k_s], dim=-2) if self.pivot_set == "joint" else k_s
        key = (tuple(points.shape[:-2]), points.shape[-2], self.rank)
        pivots = None if per_call else self.pivot_cache.matching(key)  # this batch's draw
        if pivots is None:
            pivots = self.draw_pivots(points)
            if not per_call:
                self.pivot_cache.store(pivots, key)
        landmarks = gather_points(points, pivots)  # differentiable in q and k
        out, self._guards = nystrom_softmax(
            q_s, k_s, v.to(compute), landmarks, pivots >= 0, self.den_floor
        )
        return out.to(q.dtype)

    @torch.no_grad()
    def draw_pivots(self, points: Tensor) -> Tensor:
        """Pivot indices (..., r') into the points (..., N, d), -1 in unused slots (no gradient)."""
        if self.method == "accelerated":
            flat = PointSet([points], dtype=points.dtype)
            return self.select(flat).pivots.reshape(*points.shape[:-2], -1)
        return rpcholesky(
            points,
            self.rank,
            self.pivot_rule,
            self.generator,
            weighting=self.weighting,
            tempering=self.tempering,
        ).pivots

    def attend_prefix(
        self, q: Tensor, k: Tensor, v: Tensor, capacity: int | None
    ) -> tuple[Tensor, object]:
        from rpka.attention import causal

        out, state = causal.prefill(self, q, k, v, capacity)
        self._guards = state.guards
        return out, state

    def attend_step(self, q: Tensor, k: Tensor, v: Tensor, state: object) -> tuple[Tensor, object]:
        """One decoding step; ``guard_counts`` then totals the decode so far."""
        from rpka.attention import causal

        out, state = causal.step(self, q, k, v, state)
        self._guards = state.guards
        return out, state

    def extra_repr(self) -> str:
        return (
            f"rank={self.rank}, pivot_rule={self.pivot_rule!r}, pivot_set={self.pivot_set!r}, "
            f"weighting={self.weighting!r}, pivot_method={self.method!r}, "
            f"pivot_refresh={self.pivot_refresh!r}"
        )
