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
2. the denominator is floored at ``den_floor * sum_j w_j`` (the exact one lies in
   ``(0, sum_j w_j]`` because ``0 < g <= 1``);
3. each output coordinate is clamped to ``[min_j v_j, max_j v_j]`` (the exact output is a
   convex combination of the values).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpka.attention.base import AttentionMethod
from rpka.attention.rpcholesky import PIVOT_RULES, gaussian_kernel, rpcholesky, weighting_power

PIVOT_SETS = ("joint", "keys")


def gather_points(points: Tensor, index: Tensor) -> Tensor:
    """points (..., N, d), index (..., r) with -1 for none -> (..., r, d) (zeros for -1)."""
    safe = index.clamp(min=0)
    out = torch.gather(points, -2, safe.unsqueeze(-1).expand(*safe.shape, points.shape[-1]))
    return out * (index >= 0).unsqueeze(-1).to(points.dtype)


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
    mask = valid.to(q_s.dtype)
    g_qs = gaussian_kernel(q_s, landmarks) * mask.unsqueeze(-2)  # (..., n, r)
    g_ks = gaussian_kernel(k_s, landmarks) * mask.unsqueeze(-2)  # (..., m, r)
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    eye = torch.eye(landmarks.shape[-2], dtype=q_s.dtype, device=q_s.device)
    g_ss = torch.where(pair, gaussian_kernel(landmarks, landmarks), eye)
    # jitter: pivots are at least round-off apart, this keeps the factorisation stable
    jitter = 10 * torch.finfo(q_s.dtype).eps
    chol = torch.linalg.cholesky(g_ss + jitter * eye)

    log_w = k_s.pow(2).sum(-1) / 2  # e^{|k~|^2/2}, in the log domain
    w = torch.exp(log_w - log_w.amax(-1, keepdim=True))  # (..., m), max 1
    wv = torch.cat([w.unsqueeze(-1) * v, w.unsqueeze(-1)], dim=-1)  # (..., m, d_v + 1)
    core = torch.cholesky_solve(g_ks.transpose(-1, -2) @ wv, chol)  # (..., r, d_v + 1)
    full = g_qs @ core  # (..., n, d_v + 1)
    num, den = full[..., :-1], full[..., -1:]

    floor = den_floor * w.sum(-1, keepdim=True).unsqueeze(-1)
    low = den < floor
    out = num / torch.where(low, floor, den)
    v_min = v.amin(-2, keepdim=True)
    v_max = v.amax(-2, keepdim=True)
    with torch.no_grad():
        clamped = (out < v_min) | (out > v_max)
    out = torch.minimum(torch.maximum(out, v_min), v_max)
    counts = {
        "denominator": low.sum(),
        "rows": torch.tensor(low.numel()),
        "clamped": clamped.sum(),
        "entries": torch.tensor(clamped.numel()),
    }
    return out, counts


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
        block_size: with ``causal=True``, the block length b >= 1: exact attention inside
            a block, Nystrom attention to earlier blocks (``causal.py``).
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
        block_size: int = 64,
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
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.rank = rank
        self.pivot_rule = pivot_rule
        self.pivot_set = pivot_set
        self.weighting = weighting
        self.tempering = tempering
        self.den_floor = den_floor
        self.generator = generator
        self.block_size = block_size
        self._guards: dict[str, Tensor] = {}

    @property
    def guard_counts(self) -> dict[str, int]:
        """How often each guard fired in the last forward call (host sync on a GPU)."""
        return {key: int(value) for key, value in self._guards.items()}

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.causal:
            from rpka.attention import causal  # imported here: causal.py imports this module

            out, self._guards = causal.attend(self, q, k, v)
            return out
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
            f"weighting={self.weighting!r}"
        )
