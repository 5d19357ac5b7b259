"""Randomly pivoted Cholesky (RPCholesky) for the exponential kernel, batched.

The kernel is ``kappa(x, y) = exp(x . y)``. It factorises as

    kappa(x, y) = e^{|x|^2/2} e^{|y|^2/2} g(x, y),   g(x, y) = exp(-|x - y|^2 / 2),

so on a point set ``Z`` the kernel matrix is ``A = D G D`` with ``D = diag(e^{|z|^2/2})``.
A Nystrom approximation built on pivots ``S`` commutes with that scaling:
``A - A_S = D (G - G_S) D``. The Cholesky factor is therefore computed for the Gaussian
matrix ``G`` only (entries in (0, 1], unit diagonal, no overflow), and the scaling only
enters the *pivot distribution*, in the log domain (docs/design.md section 2).

``weighting`` chooses which PSD matrix is pivoted, ``A_tau = D^tau G D^tau``:

* ``"exp"``  (tau = 1): the exponential kernel itself, residual diagonal
  ``e^{|z|^2} r^g`` - the literal algorithm;
* ``"gauss"`` (tau = 0): the Gaussian kernel, residual diagonal ``r^g`` (every point
  starts with weight 1);
* ``"tempered"`` (0 < tau < 1): in between.

All three share one factor of ``G``; only the sampling probabilities differ. The residual
trace that is recorded is that of the pivoted matrix ``A_tau``, scaled by
``exp(-log_scale)`` so that it stays finite (the trace identity of docs/design.md section 3
is invariant to a positive scale).

Pivot rules (Chen, Epperly, Tropp, Webber 2023, "Randomly pivoted Cholesky", Alg. 1):

* ``"rpc"``: sample ``s`` with probability ``r_s / sum(r)`` (Gumbel-max in the log domain);
* ``"greedy"``: ``s = argmax r`` (classical pivoted Cholesky);
* ``"uniform"``: ``s`` uniform over points not yet picked (residual ignored).

This module is the reference: :func:`rpcholesky`, one pivot per step. The accelerated
selection (block + rejection sampling, same law) is in :mod:`rpka.attention.accelerated`.
On the CPU the same loop runs compiled (``pivot_backend``, :mod:`rpka.attention.pivot_kernel`)
on the Gumbel noise drawn here with torch, so the pivots are the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from rpka.attention import pivot_kernel
from rpka.attention.options import all_finite

PIVOT_RULES = ("rpc", "greedy", "uniform")
WEIGHTINGS = ("exp", "gauss", "tempered")
# where the plain loop runs: "auto" is the compiled loop on the CPU where numba is installed
# (about 10x faster at the study's shapes, docs/speed.md) and the torch loop elsewhere (CUDA)
PIVOT_BACKENDS = ("auto", "numba", "torch")


def pivot_floor(dtype: torch.dtype) -> float:
    """Smallest Gaussian residual a pivot may have: ``sqrt(eps)`` of the compute dtype.

    Relative to the trace per point (the Gaussian diagonal is 1). A pivot whose residual
    ``delta`` is below it - a near-duplicate point (periodic tokens, repeated keys) - would
    make ``G_SS`` ill-conditioned (condition ~ 1/delta), and the readout's cancellation then
    costs ``eps / delta``; skipping it costs nothing at full rank (the Nystrom estimate is
    exact on every row or column of a pivot) and at most ``delta`` in ``g`` below it.
    ``sqrt(eps)`` balances the two (issue 13).
    """
    return torch.finfo(dtype).eps ** 0.5


@dataclass
class CholeskyResult:
    """Output of :func:`rpcholesky` for points of shape (..., N, d) and rank r.

    Attributes:
        pivots: (..., r) long. Index of the point picked at each step, ``-1`` where the
            step was skipped (residual exhausted or below ``tol``).
        factor: (..., N, r). Cholesky factor of the Gaussian matrix: ``G ~ F F^T``.
            Columns of skipped steps are zero.
        trace: (..., r + 1). Residual trace of the pivoted matrix ``A_tau`` before each
            step and after the last, multiplied by ``exp(-log_scale)``.
        log_scale: (...). The log of the scale removed from ``trace``.
        log_weight: (..., N). ``tau * |z|^2``: ``A_tau = diag(e^{lw/2}) G diag(e^{lw/2})``.
        residual: (..., N). Final residual diagonal of ``G`` (not of ``A_tau``).
    """

    pivots: Tensor
    factor: Tensor
    trace: Tensor
    log_scale: Tensor
    log_weight: Tensor
    residual: Tensor


def weighting_power(weighting: str, tempering: float = 0.5) -> float:
    """The exponent tau of ``A_tau = D^tau G D^tau`` for a weighting name."""
    if weighting == "exp":
        return 1.0
    if weighting == "gauss":
        return 0.0
    if weighting == "tempered":
        if (
            isinstance(tempering, bool)
            or not isinstance(tempering, int | float)
            or not 0.0 < tempering < 1.0
        ):
            raise ValueError(f"tempering must lie in (0, 1), got {tempering!r}")
        return float(tempering)
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def gaussian_kernel(x: Tensor, y: Tensor) -> Tensor:
    """``g(x, y) = exp(-|x - y|^2 / 2)`` for x (..., n, d), y (..., m, d) -> (..., n, m).

    Computed as ``exp(x.y - |x|^2/2 - |y|^2/2)``, clamped to the exact range (0, 1].
    A Gram matrix (``y is x``) takes the norms once: the same sums, the same values.
    """
    sq_x = x.pow(2).sum(-1, keepdim=True) / 2
    sq_y = sq_x.transpose(-1, -2) if y is x else y.pow(2).sum(-1).unsqueeze(-2) / 2
    return torch.exp((x @ y.transpose(-1, -2) - sq_x - sq_y).clamp(max=0.0))


def gaussian_kernel_(
    x: Tensor, y: Tensor, x_half_sq: Tensor | None = None, y_half_sq: Tensor | None = None
) -> Tensor:
    """:func:`gaussian_kernel` without autograd, in place: one (..., n, m) buffer.

    ``x_half_sq`` (..., n, 1) and ``y_half_sq`` (..., 1, m) may pass ``|x|^2/2`` and
    ``|y|^2/2`` when they are known already (same values as computed here); a ``+inf`` in
    ``y_half_sq`` masks that column to exactly 0.
    """
    if x_half_sq is None:
        x_half_sq = x.pow(2).sum(-1, keepdim=True) / 2
    if y_half_sq is None:
        y_half_sq = half_sq_norms(y)
    return (x @ y.transpose(-1, -2)).sub_(x_half_sq).sub_(y_half_sq).clamp_(max=0.0).exp_()


def half_sq_norms(y: Tensor, valid: Tensor | None = None) -> Tensor:
    """``|y_j|^2 / 2`` as (..., 1, m) for :func:`gaussian_kernel_`; ``+inf`` where not valid."""
    out = y.pow(2).sum(-1).unsqueeze(-2) / 2
    return out if valid is None else out.masked_fill(~valid.unsqueeze(-2), float("inf"))


def _gumbel(shape: torch.Size, like: Tensor, generator: torch.Generator | None) -> Tensor:
    u = torch.rand(shape, dtype=like.dtype, device=like.device, generator=generator)
    return _gumbel_from_uniform(u)


def _gumbel_from_uniform(u: Tensor) -> Tensor:
    tiny = torch.finfo(u.dtype).tiny
    exponential = -torch.log(u.clamp(min=tiny))  # Exp(1) draws
    return -torch.log(exponential.clamp(min=tiny))


class GumbelStream:
    """The Gumbel noise of :func:`select_pivot` for ``steps`` consecutive draws, made in
    blocks of steps: one ``torch.rand`` per block instead of one per step.

    The generator yields the same numbers whether they are drawn one step at a time or a
    block of steps at once (``torch.rand`` fills a tensor in order), so the noise - and the
    pivots - are exactly those of drawing at each step.
    """

    BLOCK_BYTES = 2**22  # memory of one block of noise

    def __init__(
        self, shape: torch.Size, like: Tensor, generator: torch.Generator | None, steps: int
    ) -> None:
        self.shape, self.like, self.generator, self.left = shape, like, generator, steps
        step_bytes = max(1, shape.numel() * like.element_size())
        self.block = max(1, self.BLOCK_BYTES // step_bytes)
        self.noise: list[Tensor] = []

    def next(self) -> Tensor:
        """The noise of the next step, shape ``shape``."""
        if not self.noise:
            count = min(self.block, self.left)
            u = torch.rand(
                (count, *self.shape),
                dtype=self.like.dtype,
                device=self.like.device,
                generator=self.generator,
            )
            self.noise = list(_gumbel_from_uniform(u).unbind(0))[::-1]
        self.left -= 1
        return self.noise.pop()


def select_pivot(
    log_residual: Tensor,
    picked: Tensor,
    rule: str,
    generator: torch.Generator | None = None,
    gumbel: Tensor | None = None,
) -> Tensor:
    """One pivot per batch element. log_residual, picked: (..., N) -> (...,) long.

    ``gumbel`` (..., N) may pass this step's Gumbel noise (:class:`GumbelStream`); without
    it the noise is drawn here from ``generator``.

    ``log_residual`` is the log of the residual diagonal of the pivoted matrix (-inf where
    zero). Where it carries no usable mass (all -inf, or not finite) the rule falls back
    to uniform sampling over the points not yet picked (docs/design.md section 2).
    """
    unpicked = torch.where(picked, float("-inf"), 0.0).to(log_residual.dtype)
    if rule == "uniform":
        scores = unpicked
    else:
        scores = log_residual.masked_fill(picked, float("-inf"))
        bad = ~(torch.isfinite(scores).any(-1, keepdim=True)) | torch.isnan(scores).any(
            -1, keepdim=True
        )
        scores = torch.where(bad, unpicked, scores)
        if rule == "greedy":
            return scores.argmax(-1)
    if gumbel is None:
        gumbel = _gumbel(scores.shape, scores, generator)
    return (scores + gumbel).argmax(-1)


def resolve_backend(pivot_backend: str, device: torch.device) -> str:
    """The loop that runs for ``pivot_backend`` on ``device``: ``"numba"`` or ``"torch"``.

    The compiled loop reads CPU memory only, so CUDA tensors always take the torch loop
    (also when ``"numba"`` is asked for: the option names the CPU implementation).
    """
    if pivot_backend not in PIVOT_BACKENDS:
        raise ValueError(f"pivot_backend must be one of {PIVOT_BACKENDS}, got {pivot_backend!r}")
    if pivot_backend == "numba" and not pivot_kernel.AVAILABLE:
        raise ValueError("pivot_backend='numba' needs numba installed (pip install numba)")
    if pivot_backend == "torch" or device.type != "cpu" or not pivot_kernel.AVAILABLE:
        return "torch"
    return "numba"


def check_arguments(
    points: Tensor,
    rank: int,
    rule: str,
    tol: float,
) -> None:
    if not isinstance(points, Tensor) or points.dim() < 2:
        raise ValueError("points must be a tensor of shape (..., N, d)")
    if points.shape[-2] < 1:
        raise ValueError("points must hold at least one point (N >= 1)")
    if not all_finite(points):  # else: pivots -1 and a NaN trace, silently
        raise ValueError("points contains non-finite values (nan or inf)")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise ValueError(f"rank must be a positive integer, got {rank!r}")
    if rule not in PIVOT_RULES:
        raise ValueError(f"rule must be one of {PIVOT_RULES}, got {rule!r}")
    if not 0.0 <= tol < 1.0:
        raise ValueError(f"tol must lie in [0, 1), got {tol!r}")


@torch.no_grad()
def rpcholesky(
    points: Tensor,
    rank: int,
    rule: str = "rpc",
    generator: torch.Generator | None = None,
    *,
    weighting: str = "gauss",
    tempering: float = 0.5,
    tol: float = 0.0,
    first_pivots: Tensor | None = None,
    pivot_backend: str = "auto",
) -> CholeskyResult:
    """Batched RPCholesky of the exponential kernel on ``points`` (..., N, d).

    ``rank`` larger than N is capped at N (N pivots factor the matrix exactly), so the
    result always has ``min(rank, N)`` columns. A step is skipped (pivot -1, zero column)
    once an element's residual trace is ``<= tol * trace(A_tau)`` or the chosen pivot's
    residual is below :func:`pivot_floor` (a near-duplicate); skipped steps keep every
    batch element in lockstep,
    so there is no Python loop over the batch, only over the r steps.

    ``first_pivots`` (..., t0) forces the first t0 pivots (replaying a run, e.g. to draw
    many independent next steps from one residual); the rule picks the rest.

    ``pivot_backend`` (:data:`PIVOT_BACKENDS`, :func:`resolve_backend`) chooses the torch
    loop (:func:`_torch_loop`) or the same loop compiled (:func:`_compiled_loop`); both
    consume the same Gumbel noise from ``generator``, so the pivots and the generator's
    state afterwards are the same (the factor and traces agree to round-off: the sums run
    in another order).

    Computation is in float64 for float64 points and in float32 otherwise.
    """
    check_arguments(points, rank, rule, tol)
    backend = resolve_backend(pivot_backend, points.device)
    start = LoopStart.of(points, rank, weighting, tempering, tol, first_pivots)
    loop = _compiled_loop if backend == "numba" and start.weight.numel() > 0 else _torch_loop
    pivots, factor, trace, residual = loop(start, rule, generator, first_pivots)
    return CholeskyResult(pivots, factor, trace, start.log_scale, start.log_weight, residual)


@dataclass
class LoopStart:
    """What both pivot loops of :func:`rpcholesky` start from, for points (..., N, d).

    ``z`` (..., N, d) the points in the compute dtype, ``z_half_sq`` (..., N, 1) their
    ``|z|^2/2`` (as :func:`gaussian_kernel` computes it); ``log_weight`` (..., N)
    ``= tau |z|^2``, ``log_scale`` (...) its maximum and ``weight`` (..., N)
    ``= e^{log_weight - log_scale}`` in (0, 1]; ``trace`` (..., r + 1) with its first column
    (the scaled trace of ``A_tau``: the diagonal of G is 1) set and ``stop_trace`` (...)
    ``= tol`` times it; ``forced`` the number of forced first pivots.
    """

    z: Tensor
    z_half_sq: Tensor
    rank: int
    log_weight: Tensor
    log_scale: Tensor
    weight: Tensor
    add_weight: bool  # False for "gauss" (tau = 0): log_weight is exactly 0
    trace: Tensor
    stop_trace: Tensor
    forced: int
    round_off: float  # pivot_floor: a pivot with a tiny residual adds only ill-conditioning

    @classmethod
    def of(
        cls,
        points: Tensor,
        rank: int,
        weighting: str,
        tempering: float,
        tol: float,
        first_pivots: Tensor | None,
    ) -> LoopStart:
        dtype = torch.float64 if points.dtype == torch.float64 else torch.float32
        z = points.detach().to(dtype)
        *batch, n_points, _ = z.shape
        rank = min(rank, n_points)
        sq_norm = z.pow(2).sum(-1)  # (..., N)
        log_weight = weighting_power(weighting, tempering) * sq_norm
        log_scale = log_weight.amax(-1)
        weight = torch.exp(log_weight - log_scale.unsqueeze(-1))  # in (0, 1]
        trace = z.new_zeros(*batch, rank + 1)
        trace[..., 0] = (weight * torch.ones_like(sq_norm)).sum(-1)  # diagonal of G is 1
        return cls(
            z=z,
            z_half_sq=z.pow(2).sum(-1, keepdim=True) / 2,
            rank=rank,
            log_weight=log_weight,
            log_scale=log_scale,
            weight=weight,
            add_weight=bool((log_weight != 0).any()),  # adding a weight of 0 changes nothing
            trace=trace,
            stop_trace=tol * trace[..., 0],
            forced=0 if first_pivots is None else min(first_pivots.shape[-1], rank),
            round_off=pivot_floor(dtype),
        )


def _torch_loop(
    start: LoopStart, rule: str, generator: torch.Generator | None, first_pivots: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The steps of :func:`rpcholesky` in torch, batched: Alg. 1 of Chen, Epperly, Tropp &
    Webber (2023) - sample, column, correction, update. Returns pivots (..., r), factor
    (..., N, r), trace (..., r + 1) (``start.trace``, filled in) and residual (..., N)."""
    z, rank, trace, round_off = start.z, start.rank, start.trace, start.round_off
    *batch, n_points, _ = z.shape
    residual = torch.ones_like(start.weight)  # diagonal of G is 1
    factor = z.new_zeros(*batch, n_points, rank)
    pivots = torch.full((*batch, rank), -1, dtype=torch.long, device=z.device)
    picked = torch.zeros_like(residual, dtype=torch.bool)
    # the random rules' noise for every drawn step, in blocks (same numbers, fewer calls)
    steps = rank - start.forced
    noise = None if rule == "greedy" else GumbelStream(residual.shape, z, generator, steps)
    for t in range(rank):
        log_res = torch.log(residual)
        if start.add_weight:
            log_res = log_res + start.log_weight
        if t < start.forced:
            s = torch.broadcast_to(first_pivots[..., t], batch).to(z.device)
        else:
            gumbel = None if noise is None else noise.next()
            s = select_pivot(log_res, picked, rule, generator, gumbel)  # (...,)
        idx = s.unsqueeze(-1)
        col = _residual_column(start, factor, idx)
        pivot_residual = torch.gather(col, -1, idx)  # (..., 1)
        running = trace[..., t : t + 1] > start.stop_trace.unsqueeze(-1)  # not stopped by tol
        active = running & (pivot_residual > round_off)
        f_t = torch.where(active, col / pivot_residual.clamp(min=round_off).sqrt(), 0.0)
        factor[..., t] = f_t
        pivots[..., t] = torch.where(active.squeeze(-1), s, -1)
        picked.scatter_(-1, idx, picked.gather(-1, idx) | running)
        residual = (residual - f_t.pow(2)).clamp(min=0.0)
        residual.scatter_(-1, idx, torch.where(running, 0.0, residual.gather(-1, idx)))
        trace[..., t + 1] = (start.weight * residual).sum(-1)
    return pivots, factor, trace, residual


def _residual_column(start: LoopStart, factor: Tensor, idx: Tensor) -> Tensor:
    """``G[:, s] - F F^T[:, s]`` (..., N) for the pivots ``idx`` (..., 1): the kernel column
    ``g(z, z_s)`` (as :func:`gaussian_kernel`, ``|z|^2/2`` computed once) less the factor's
    part."""
    z = start.z
    *batch, _, dim = z.shape
    z_s = torch.gather(z, -2, idx.unsqueeze(-1).expand(*batch, 1, dim))
    sq_s = z_s.pow(2).sum(-1).unsqueeze(-2) / 2
    col = torch.exp((z @ z_s.transpose(-1, -2) - start.z_half_sq - sq_s).clamp(max=0.0))
    f_s = torch.gather(factor, -2, idx.unsqueeze(-1).expand(*batch, 1, factor.shape[-1]))
    return col.squeeze(-1) - (factor @ f_s.transpose(-1, -2)).squeeze(-1)


def _compiled_loop(
    start: LoopStart, rule: str, generator: torch.Generator | None, first_pivots: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The loop of :func:`rpcholesky` in :func:`pivot_kernel.pivot_steps` (CPU, no autograd).

    Returns pivots (..., r), factor (..., N, r), trace (..., r + 1), residual (..., N), as
    :func:`_torch_loop`.

    The Gumbel noise is drawn exactly as :class:`GumbelStream` draws it - blocks of the same
    sizes, step-major, from ``generator`` - and each block is handed to the compiled steps
    it belongs to, so the same uniforms feed the same steps and the generator ends in the
    same state as after the torch loop.
    """
    z, rank, forced = start.z, start.rank, start.forced
    *batch, n_points, dim = z.shape
    n_batch = int(np.prod(batch)) if batch else 1
    np_dtype = np.float64 if z.dtype == torch.float64 else np.float32

    zt = z.reshape(n_batch, n_points, dim).transpose(1, 2).contiguous().numpy()
    stop = start.stop_trace.reshape(n_batch).contiguous().numpy()
    factor_t = np.zeros((n_batch, rank, n_points), dtype=np_dtype)
    residual = np.ones((n_batch, n_points), dtype=np_dtype)  # diagonal of G is 1
    picked = np.zeros((n_batch, n_points), dtype=np.bool_)
    pivots = np.full((n_batch, rank), -1, dtype=np.int64)
    traces = start.trace.reshape(n_batch, rank + 1).contiguous().numpy().copy()
    code = pivot_kernel.RULE_CODES[rule]
    scalars = (np_dtype(start.round_off), np_dtype(0.0))  # scalars of the compute dtype
    view, layout = pivot_kernel.float_format(np_dtype)
    state = (factor_t, residual, residual.view(view), picked, pivots, traces)
    forced_pivots = _forced_pivots(first_pivots, forced, batch, n_points)
    per_point = [_rows(x, n_batch) for x in (start.z_half_sq, start.log_weight, start.weight)]
    fixed = (zt, *per_point[:2], start.add_weight, per_point[2], stop, forced_pivots)
    no_noise = np.zeros((0, n_batch, n_points), dtype=np_dtype)
    if forced:
        pivot_kernel.pivot_steps(*fixed, no_noise, 0, forced, 0, code, layout, *scalars, *state)
    if rule == "greedy":
        pivot_kernel.pivot_steps(
            *fixed, no_noise, forced, rank, forced, code, layout, *scalars, *state
        )
    else:
        # GumbelStream's block size (its draws are made here, in the same calls)
        stream = GumbelStream(torch.Size(batch + [n_points]), z, generator, rank - forced)
        t = forced
        while t < rank:
            count = min(stream.block, rank - t)
            u = torch.rand(
                (count, *batch, n_points), dtype=z.dtype, device=z.device, generator=generator
            )
            noise = _gumbel_from_uniform(u).reshape(count, n_batch, n_points).numpy()
            pivot_kernel.pivot_steps(*fixed, noise, t, t + count, t, code, layout, *scalars, *state)
            t += count
    factor = torch.from_numpy(factor_t).transpose(1, 2).reshape(*batch, n_points, rank)
    return (
        torch.from_numpy(pivots).reshape(*batch, rank),
        factor.contiguous(),
        torch.from_numpy(traces).reshape(*batch, rank + 1),
        torch.from_numpy(residual).reshape(*batch, n_points),
    )


def _forced_pivots(
    first_pivots: Tensor | None, forced: int, batch: list[int], n_points: int
) -> np.ndarray:
    """The first ``forced`` pivots (..., t0) as a (B, forced) int64 array, bounds checked
    (the compiled loop reads no bounds); (B, 0) when none are forced."""
    n_batch = int(np.prod(batch)) if batch else 1
    if not forced:
        return np.zeros((n_batch, 0), dtype=np.int64)
    given = torch.broadcast_to(first_pivots[..., :forced], (*batch, forced))
    given = given.reshape(n_batch, forced).to(torch.long).cpu()
    if bool(((given < 0) | (given >= n_points)).any()):
        raise ValueError(
            f"first_pivots must index the {n_points} points (0 .. {n_points - 1}), got "
            f"values in [{int(given.min())}, {int(given.max())}]"
        )
    return given.contiguous().numpy()


def _rows(x: Tensor, n_batch: int) -> np.ndarray:
    """A per-point tensor (..., N) or (..., N, 1) as a (B, N) numpy array."""
    return x.reshape(n_batch, -1).contiguous().numpy()
