"""Residual-pivoted kernel attention (RPKA): Nystrom softmax attention on RPCholesky pivots.

With ``q~ = q d^{-1/4}`` and ``k~ = k d^{-1/4}`` exact attention weights key j for query i
by ``exp(q~_i . k~_j) = e^{|q~_i|^2/2} e^{|k~_j|^2/2} g(q~_i, k~_j)``. The query factor
cancels in the softmax, the key factor becomes a weight ``w_j`` (kept in the log domain),
and the Gaussian ``g`` is replaced by its Nystrom approximation on landmarks ``Z_S``:

    g(Q~, K~) ~ G_QS G_SS^{-1} G_SK,
    out = G_QS G_SS^{-1} G_SK (w * V) / G_QS G_SS^{-1} G_SK w          (docs/design.md section 2)

in O(n r d). Landmarks are RPCholesky pivots of the joint set ``[Q~; K~]`` (or of the keys
only), picked without gradient; the factor is rebuilt differentiably from them.

Fast path (the default, ``pivot_method="auto"``): pivots come from the accelerated
(block + rejection) RPCholesky, which reads the points only at candidate indices, and
without gradients the output is streamed in chunks on the selection's landmarks
(:func:`nystrom_softmax_chunked`) - no (n x r) matrix and no float32 copy of the whole
sequence is ever held. The plain one-pivot-per-step loop stays available
(``pivot_method="plain"``) as the reference; both draw pivots from the same law.

Numerics (issue 13, docs/numerics.md). The key weight ``w_j`` and the kernel ``g`` are
never exponentiated apart: the core carries one log scale per landmark, folded into the
readout logits before their row maximum, and the key side (moments and the r x (d + 1)
solve) runs in float64 - on the inference path only where the logits are sharp enough to
need it (``key_precision``, docs/numerics.md "The key side in float32").

The approximation is not entrywise positive, so three guards keep the output sane, and the
module counts how often each fired in its last call (``guard_counts``, and as shares of
rows ``guard_shares``; a guard firing on more than 1 % of rows warns once per process):

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

from rpka.attention import causal, causal_decode
from rpka.attention.accelerated import RESIDUAL_SOLVES, accelerated_pivots, check_fast_options
from rpka.attention.base import AttentionMethod, empty_problem, refuse_non_finite
from rpka.attention.frame import KEYS_RATIO, Frame, balanced_frame, frame_and_reductions
from rpka.attention.nystrom import (
    estimate_unless_keys_covered,
    exact_with_counts,
    gather_points,
    keys_covered,
    nystrom_softmax,
)
from rpka.attention.nystrom_chunked import KEY_PRECISIONS, nystrom_softmax_chunked
from rpka.attention.options import check_choice, check_generator, check_open_unit
from rpka.attention.pivot_state import PivotState, PointSet
from rpka.attention.rpcholesky import (
    PIVOT_BACKENDS,
    PIVOT_RULES,
    resolve_backend,
    rpcholesky,
    weighting_power,
)
from rpka.attention.streamed import nystrom_softmax_streamed

PIVOT_SETS = ("joint", "keys")
SELECTION_METHODS = ("auto", "plain", "accelerated")
PIVOT_REFRESH = ("call", "batch")
GRAD_PATHS = ("autograd", "streamed")
# options that choose how the estimate is computed, not its law (the same estimator either way)
IMPLEMENTATION_OPTIONS = (
    "pivot_method",
    "block_size",
    "refresh",
    "grad_path",
    "residual_solve",
    "pivot_backend",
    "key_precision",
)


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


# The default causal block (issue 55): at 8,192 tokens, one thread, the forward of rank 64
# read 1.78x / 2.18x / 2.48x exact causal SDPA's speed with blocks of 64 / 128 / 256
# (0.42x / 0.50x / 0.59x at 2,048), rank 16 3.12x / 3.24x / 3.29x: the per-block work
# (an r x (d + 1) solve and a merge per block) outweighs the fused local part's 4 b d.
CAUSAL_BLOCK = 256


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
            a block, Nystrom attention to earlier blocks (``causal.py``); default
            ``CAUSAL_BLOCK`` (256, chosen from the issue 55 profile).
        grad_path: how the differentiable (training) path computes the estimate:
            ``"streamed"`` (default; :func:`nystrom_softmax_streamed`: a custom backward
            that recomputes the (n x r) weights in cache-sized groups, O(n d) memory held
            for backward) or ``"autograd"`` (:func:`nystrom_softmax` under autograd, the
            reference). Bitwise the same output and gradients in float32 (docs/speed.md).
            The causal path (its own blockwise estimate, ``causal.py``) ignores it.
        residual_solve: how the accelerated method's proposal refresh computes the
            residuals: ``"triangular"`` (default, the reference) or ``"inverse"`` (about 3x
            faster on a CPU; the same law, residuals equal up to round-off, so a draw can
            differ from the reference's at a rounding boundary; docs/speed.md).
        qk_balance: pivot the balanced points ``(alpha q~, k~ / alpha)`` (default), which
            leave every logit ``q~.k~`` unchanged and make full rank exact whatever the
            scale of queries relative to keys (:func:`balanced_frame`); ``False`` pivots
            ``(q~, k~)`` as the study did before the fix (docs/numerics.md).
        pivot_backend: where the plain pivot loop (``pivot_method="plain"``, greedy, the
            causal path) runs: ``"auto"`` (default: compiled with numba on CPU tensors, the
            torch loop on CUDA), ``"numba"`` or ``"torch"`` (the reference). The same
            Gumbel noise from ``generator`` feeds both, so the pivots are the same numbers
            (docs/speed.md, "Compiled pivot loop").
        key_precision: the key side (moments ``G_SK [w v, w]``) of the inference and the
            streamed training path: ``"auto"`` (default: in the float32 compute dtype while
            every logit reference stays within ``KEY_LOGIT_LIMIT`` nats, widened to float64
            past it - sharp attention) or ``"float64"`` (always widened: the reference, and
            the numerics every committed study ran; ``rpka.model`` pins it). The autograd
            reference, the causal path below 1,024 positions and float64 inputs always
            widen (docs/numerics.md, "The key side in float32").

    Without gradients (inference) the accelerated path never materialises the joint set
    or any (n x r) matrix: pivots are drawn from the inputs in place and the output is
    streamed in chunks on the selection's landmarks
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
        causal_block: int = CAUSAL_BLOCK,
        causal: bool = False,
        check_inputs: bool = True,
        grad_path: str = "streamed",
        residual_solve: str = "triangular",
        qk_balance: bool = True,
        pivot_backend: str = "auto",
        key_precision: str = "auto",
    ) -> None:
        super().__init__(causal=causal, check_inputs=check_inputs)
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        check_choice("pivot_rule", pivot_rule, PIVOT_RULES)
        check_choice("pivot_set", pivot_set, PIVOT_SETS)
        weighting_power(weighting, tempering)  # validates the weighting
        tempering = check_open_unit("tempering", tempering)
        den_floor = check_open_unit("den_floor", den_floor)
        check_generator(generator)
        check_choice("pivot_method", pivot_method, SELECTION_METHODS)
        method = pivot_method
        if method == "auto":
            method = "plain" if pivot_rule == "greedy" else "accelerated"
        check_fast_options(method, pivot_rule, block_size, refresh)
        check_choice("pivot_refresh", pivot_refresh, PIVOT_REFRESH)
        if pivot_refresh != "call" and causal:
            raise ValueError(
                "pivot_refresh='batch' is not supported with causal=True (the causal path "
                "draws each block's landmarks itself); use pivot_refresh='call'"
            )
        if not isinstance(causal_block, int) or isinstance(causal_block, bool) or causal_block < 1:
            raise ValueError(f"causal_block must be a positive integer, got {causal_block!r}")
        check_choice("grad_path", grad_path, GRAD_PATHS)
        check_choice("residual_solve", residual_solve, RESIDUAL_SOLVES)
        if not isinstance(qk_balance, bool):
            raise ValueError(f"qk_balance must be True or False, got {qk_balance!r}")
        check_choice("pivot_backend", pivot_backend, PIVOT_BACKENDS)
        resolve_backend(pivot_backend, torch.device("cpu"))  # "numba" without numba: refused
        self.key_precision = check_choice("key_precision", key_precision, KEY_PRECISIONS)
        self.pivot_backend = pivot_backend
        self.qk_balance = qk_balance
        self.residual_solve = residual_solve
        self.grad_path = grad_path
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

    def _scaled(self, q: Tensor, k: Tensor) -> Frame:
        """The frame of the pivoted points: scales and key shift (:func:`balanced_frame`)."""
        key_ratio = 1.0 if self.pivot_set == "joint" else KEYS_RATIO
        return balanced_frame(q, k, self.qk_balance, key_ratio)

    def point_set(self, q: Tensor, k: Tensor, frame: Frame | None = None) -> PointSet:
        """The pivoted points ``[q~; k~ - mean]`` (or the keys), read in place."""
        f = frame or self._scaled(q, k)
        if self.pivot_set == "joint":
            return PointSet([q, k], [f.q_scale, f.k_scale], [None, f.key_shift], f.compute)
        return PointSet([k], f.k_scale, [f.key_shift], f.compute)

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
            residual_solve=self.residual_solve,
        )

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.causal:
            out, self._guards = causal.attend(self, q, k, v)
            return out
        n_points = k.shape[-2] + (q.shape[-2] if self.pivot_set == "joint" else 0)
        if self.rank >= n_points:
            # RPCholesky at r >= N takes every point, so no draw is needed; with every key a
            # landmark the estimate is softmax attention by Nystrom's identity
            # (estimate_unless_keys_covered). The frontier's positive control: exact by
            # construction, at exact attention's cost instead of an N-pivot loop.
            out, self._guards = exact_with_counts(q, k, v)
            return out
        if self._chunked_path(q, k, v):
            return self._attend_chunked(q, k, v)
        frame = self._scaled(q, k)
        per_call = self.pivot_refresh == "call"
        compute = frame.compute
        q_s = q.to(compute) * frame.q_scale
        # guard 1 (exact invariance); the shift subtracted in place: one (n x d) copy fewer
        k_s = (k.to(compute) * frame.k_scale).sub_(frame.key_shift)
        points = torch.cat([q_s, k_s], dim=-2) if self.pivot_set == "joint" else k_s
        key = (tuple(points.shape[:-2]), points.shape[-2], self.rank)
        pivots = None if per_call else self.pivot_cache.matching(key)  # this batch's draw
        if pivots is None:
            pivots = self.draw_pivots(points)
            if not per_call:
                self.pivot_cache.store(pivots, key)
        landmarks = gather_points(points, pivots)  # differentiable in q and k

        def estimate() -> tuple[Tensor, dict[str, Tensor]]:
            args = (q_s, k_s, v.to(compute), landmarks, pivots >= 0, self.den_floor)
            if self.grad_path == "streamed":
                return nystrom_softmax_streamed(*args, key_precision=self.key_precision)
            return nystrom_softmax(*args)  # the reference: float64 key side

        out, self._guards = estimate_unless_keys_covered(
            estimate,
            q,
            k,
            v,
            self.keys_covered(pivots, q, k),
        )
        return out

    def checks_finite_itself(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """The chunked inference path checks q and k off its frame's reductions
        (:func:`frame_and_reductions`) and v by its sum: two passes over the inputs fewer
        than the separate check (issue 39); the causal streamed inference path checks the
        contiguous copy it makes anyway (:func:`causal.checks_finite`). Every other path is
        checked by ``forward``."""
        if self.causal:
            return causal.checks_finite(q, k, v)
        return self._chunked_path(q, k, v)

    def _chunked_path(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """Whether :meth:`attend` takes the chunked inference path: not causal, a rank below
        the point count, accelerated pivots drawn per call, and no gradient wanted."""
        if self.causal or empty_problem(q, k, v):  # forward answers empty problems itself
            return False
        if self.method != "accelerated" or self.pivot_refresh != "call":
            return False
        n_points = k.shape[-2] + (q.shape[-2] if self.pivot_set == "joint" else 0)
        needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        return self.rank < n_points and not needs_grad

    def _attend_chunked(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Accelerated pivots drawn from the inputs in place, the estimate streamed in
        chunks (:func:`nystrom_softmax_chunked`); q, k, v checked first if asked."""
        key_ratio = 1.0 if self.pivot_set == "joint" else KEYS_RATIO
        frame, q_max, key_mean = frame_and_reductions(q, k, self.qk_balance, key_ratio)
        if self.check_inputs:  # before the draw: a refused call leaves the generator alone
            refuse_non_finite("q", q, q_max)
            refuse_non_finite("k", k, key_mean)
            refuse_non_finite("v", v)
        state = self.select(self.point_set(q, k, frame))
        out, self._guards = estimate_unless_keys_covered(
            lambda: nystrom_softmax_chunked(
                q,
                k,
                v,
                state,
                frame.q_scale,
                frame.k_scale,
                frame.key_shift,
                self.den_floor,
                self.key_precision,
            ),
            q,
            k,
            v,
            self.keys_covered(state.pivots.reshape(*q.shape[:-2], -1), q, k),
        )
        return out

    def keys_covered(self, pivots: Tensor, q: Tensor, k: Tensor) -> Tensor:
        """(...,) bool: the pivots (..., r) hold every key (then the estimate is exact by
        Nystrom's identity, :func:`estimate_unless_keys_covered`)."""
        n_queries = q.shape[-2] if self.pivot_set == "joint" else 0
        return keys_covered(pivots, n_queries, k.shape[-2])

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
            pivot_backend=self.pivot_backend,
        ).pivots

    def attend_prefix(
        self, q: Tensor, k: Tensor, v: Tensor, capacity: int | None
    ) -> tuple[Tensor, object]:
        out, state = causal_decode.prefill(self, q, k, v, capacity)
        self._guards = state.guards
        return out, state

    def attend_step(self, q: Tensor, k: Tensor, v: Tensor, state: object) -> tuple[Tensor, object]:
        """One decoding step; ``guard_counts`` then totals the decode so far."""
        out, state = causal_decode.step(self, q, k, v, state)
        self._guards = state.guards
        return out, state

    def extra_repr(self) -> str:
        return (
            f"rank={self.rank}, pivot_rule={self.pivot_rule!r}, pivot_set={self.pivot_set!r}, "
            f"weighting={self.weighting!r}, pivot_method={self.method!r}, "
            f"pivot_refresh={self.pivot_refresh!r}"
        )
