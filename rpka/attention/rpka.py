"""Residual-pivoted kernel attention (RPKA): Nystrom softmax attention on RPCholesky pivots.

With ``q~ = q d^{-1/4}`` and ``k~ = k d^{-1/4}`` exact attention weights key j for query i
by ``exp(q~_i . k~_j) = e^{|q~_i|^2/2} e^{|k~_j|^2/2} g(q~_i, k~_j)``. The query factor
cancels in the softmax, the key factor becomes a weight ``w_j`` (kept in the log domain),
and the Gaussian ``g`` is replaced by its Nystrom approximation on landmarks ``Z_S``:

    g(Q~, K~) ~ G_QS G_SS^{-1} G_SK,
    out = G_QS G_SS^{-1} G_SK (w * V) / G_QS G_SS^{-1} G_SK w          (DESIGN.md section 2)

in O(n r d). Landmarks are RPCholesky pivots of the joint set ``[Q~; K~]`` (or of the keys
only), picked without gradient; the factor is rebuilt differentiably from them.

The approximation is not entrywise positive, so three guards keep the output sane, and the
module counts how often each fired in its last call (``guard_counts``):

1. keys are centred by their mean (softmax is exactly invariant to a common key shift, and
   smaller key norms mean less spread in ``w``);
2. the denominator is floored at ``den_floor * sum_s a_s |c_s|``, a fraction of the size
   of the terms it sums (:func:`nystrom_readout`; the query factor ``e^{-|q~|^2/2}`` and
   each row's maximum are dropped first, so the floor is scale-free);
3. each output coordinate is clamped to ``[min_j v_j, max_j v_j]`` (the exact output is a
   convex combination of the values).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpka.attention.base import AttentionMethod
from rpka.attention.guards import guarded_ratio
from rpka.attention.rpcholesky import PIVOT_RULES, gaussian_kernel, rpcholesky, weighting_power

PIVOT_SETS = ("joint", "keys")


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
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    eye = torch.eye(landmarks.shape[-2], dtype=k_s.dtype, device=k_s.device)
    g_ss = torch.where(pair, gaussian_kernel(landmarks, landmarks), eye)
    # jitter: pivots are at least round-off apart, this keeps the factorisation stable
    jitter = 10 * torch.finfo(k_s.dtype).eps
    chol = torch.linalg.cholesky(g_ss + jitter * eye)

    log_w = k_s.pow(2).sum(-1) / 2  # e^{|k~|^2/2}, in the log domain
    w = torch.exp(log_w - log_w.amax(-1, keepdim=True))  # (..., m), max 1
    wv = torch.cat([w.unsqueeze(-1) * v, w.unsqueeze(-1)], dim=-1)  # (..., m, d_v + 1)
    return torch.cholesky_solve(g_ks.transpose(-1, -2) @ wv, chol)  # (..., r, d_v + 1)


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
        if causal:
            raise ValueError("causal=True is not supported by rpka yet")
        self.rank = rank
        self.pivot_rule = pivot_rule
        self.pivot_set = pivot_set
        self.weighting = weighting
        self.tempering = tempering
        self.den_floor = den_floor
        self.generator = generator
        self._guards: dict[str, Tensor] = {}

    @property
    def guard_counts(self) -> dict[str, int]:
        """How often each guard fired in the last forward call (host sync on a GPU)."""
        return {key: int(value) for key, value in self._guards.items()}

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        scale = q.shape[-1] ** -0.25
        q_s = q.to(compute) * scale
        k_s = k.to(compute) * scale
        k_s = k_s - k_s.mean(-2, keepdim=True)  # guard 1: exact invariance of softmax
        points = torch.cat([q_s, k_s], dim=-2) if self.pivot_set == "joint" else k_s
        pivots = rpcholesky(
            points,
            self.rank,
            self.pivot_rule,
            self.generator,
            weighting=self.weighting,
            tempering=self.tempering,
        ).pivots
        landmarks = gather_points(points, pivots)  # differentiable in q and k
        out, self._guards = nystrom_softmax(
            q_s, k_s, v.to(compute), landmarks, pivots >= 0, self.den_floor
        )
        return out.to(q.dtype)

    def extra_repr(self) -> str:
        return (
            f"rank={self.rank}, pivot_rule={self.pivot_rule!r}, pivot_set={self.pivot_set!r}, "
            f"weighting={self.weighting!r}"
        )
