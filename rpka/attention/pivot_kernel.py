"""The plain RPCholesky pivot loop compiled with numba (issue 28, lever 1).

:func:`rpka.attention.rpcholesky.rpcholesky` runs Chen, Epperly, Tropp & Webber (2023),
"Randomly pivoted Cholesky", Alg. 1 in lockstep over a batch of problems: ~20 small
PyTorch ops per pivot step, each dispatched for the whole batch. The selection needs no
gradient, so the same steps can run as one compiled loop per problem - no dispatch, no
temporaries. This module is that loop; the caller draws the Gumbel noise with torch from
the run's generator (same numbers, same order, same generator state afterwards) and passes
it in, so the pivots are those of the torch loop wherever the two loops' round-off does
not decide a near-tie (docs/speed.md, "Compiled pivot loop").

Layout (chosen so the inner loops run over points, contiguous, and LLVM vectorises them
without reordering any sum - no fast-math): points transposed ``zt`` (B, d, N), factor
transposed ``factor_t`` (B, r, N). Every per-point sum (the kernel column's dot product
over d, the factor correction over earlier steps) is accumulated in index order.

Only ``numba`` is imported here; without it :data:`AVAILABLE` is False and callers use the
torch loop.
"""

from __future__ import annotations

import math

import numpy as np

try:  # numba is a dependency; a missing one falls back to the torch loop, not an error
    import numba

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only where numba is absent
    numba = None
    AVAILABLE = False

# rule codes of the compiled loop (rpcholesky.PIVOT_RULES)
RULE_CODES = {"rpc": 0, "greedy": 1, "uniform": 2}
_RPC, _GREEDY, _UNIFORM = 0, 1, 2


def _pivot_steps(
    zt: np.ndarray,
    half_sq: np.ndarray,
    log_weight: np.ndarray,
    add_weight: bool,
    weight: np.ndarray,
    stop_trace: np.ndarray,
    forced: np.ndarray,
    noise: np.ndarray,
    t_start: int,
    t_end: int,
    noise_start: int,
    rule: int,
    round_off: np.floating,
    zero: np.floating,
    factor_t: np.ndarray,
    residual: np.ndarray,
    picked: np.ndarray,
    pivots: np.ndarray,
    trace: np.ndarray,
) -> None:
    """Steps ``t_start .. t_end - 1`` of RPCholesky for every problem, in place.

    Shapes: zt (B, d, N); half_sq, log_weight, weight, residual, picked (B, N);
    stop_trace (B,); forced (B, t0) long (the forced first pivots); noise (T, B, N) the
    Gumbel noise of steps ``noise_start .. noise_start + T - 1`` (unused for greedy);
    ``round_off`` (rpcholesky.pivot_floor) and ``zero`` are scalars of the compute dtype, so
    no step is promoted to float64 (a Python float literal would be);
    factor_t (B, r, N); pivots (B, r) long; trace (B, r + 1). The arithmetic is that of
    the torch loop step for step (Alg. 1: sample, column, correction, update).
    """
    n_batch, n_dim, n_points = zt.shape
    n_forced = forced.shape[1]
    dtype = residual.dtype
    neg_inf = -np.inf
    col = np.empty(n_points, dtype)
    scores = np.empty(n_points, dtype)
    zs = np.empty(n_dim, dtype)
    for b in range(n_batch):
        for t in range(t_start, t_end):
            # --- the pivot (rpcholesky.select_pivot)
            if t < n_forced:
                s = forced[b, t]
            else:
                bad = True
                has_nan = False
                for i in range(n_points):
                    if rule == _UNIFORM:
                        scores[i] = neg_inf if picked[b, i] else zero
                    else:
                        value = math.log(residual[b, i])
                        if add_weight:
                            value = value + log_weight[b, i]
                        scores[i] = neg_inf if picked[b, i] else value
                        if math.isnan(scores[i]):
                            has_nan = True
                        elif math.isfinite(scores[i]):
                            bad = False
                if rule != _UNIFORM and (bad or has_nan):
                    # no usable mass: uniform over the points not yet picked
                    for i in range(n_points):
                        scores[i] = neg_inf if picked[b, i] else zero
                if rule != _GREEDY:
                    g = noise[t - noise_start, b]
                    for i in range(n_points):
                        scores[i] = scores[i] + g[i]
                s = 0  # argmax, first maximum (NaN counts as the maximum, as torch's)
                best = scores[0]
                if not math.isnan(best):
                    for i in range(1, n_points):
                        if math.isnan(scores[i]):
                            s = i
                            break
                        if scores[i] > best:
                            best = scores[i]
                            s = i
            # --- the kernel column g(z, z_s) = exp(min(z.z_s - |z|^2/2 - |z_s|^2/2, 0))
            for k in range(n_dim):
                zs[k] = zt[b, k, s]
            for i in range(n_points):
                col[i] = zero
            for k in range(n_dim):
                zk = zs[k]
                row = zt[b, k]
                for i in range(n_points):
                    col[i] += row[i] * zk
            hs = half_sq[b, s]
            for i in range(n_points):
                col[i] = math.exp(min(col[i] - half_sq[b, i] - hs, zero))
            # --- minus the factor's part F f_s, earlier steps in order (later columns are 0)
            for u in range(t):
                f_us = factor_t[b, u, s]
                frow = factor_t[b, u]
                for i in range(n_points):
                    col[i] -= frow[i] * f_us
            pivot_residual = col[s]
            running = trace[b, t] > stop_trace[b]  # not stopped by tol
            active = running and pivot_residual > round_off  # pivot_floor: no near-duplicate
            out = factor_t[b, t]
            if active:
                root = math.sqrt(max(pivot_residual, round_off))
                for i in range(n_points):
                    out[i] = col[i] / root
                pivots[b, t] = s
            else:
                for i in range(n_points):
                    out[i] = zero
                pivots[b, t] = -1
            if running:
                picked[b, s] = True
            for i in range(n_points):
                residual[b, i] = max(residual[b, i] - out[i] * out[i], zero)
            if running:
                residual[b, s] = zero
            total = zero
            for i in range(n_points):
                total += weight[b, i] * residual[b, i]
            trace[b, t + 1] = total


pivot_steps = (
    numba.njit(parallel=False, cache=True, nogil=True)(_pivot_steps) if AVAILABLE else None
)
