"""RPCholesky's loops in numba: the plain pivot loop (issue 28), the rejection sweep (issue 55).

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

The accelerated method's rejection sweep (:func:`rejection_sweep`, issue 55) is the second
compiled loop here: b sequential Cholesky steps on a b x b tile, which in PyTorch cost ~b
launch-bound op groups per round.

Only this module imports ``numba``, and it loads it lazily: importing numba costs ~0.7 s
(measured under load), which every process importing ``rpka`` (the CLI, each notebook
kernel, each worker) would otherwise pay; here only a process that runs a compiled loop on
the CPU does, at its first call (:func:`compiled` builds each kernel once, for this module
and for :mod:`rpka.attention.range_kernel`). Without numba installed :data:`AVAILABLE` is
False and callers use the torch loops.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from types import ModuleType

import numpy as np


def _lazy_module(name: str) -> ModuleType | None:
    """``name`` as a module that executes on its first attribute access (None if absent)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return None
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


numba = _lazy_module("numba")  # a dependency; a missing one falls back to the torch loop
AVAILABLE = numba is not None

# rule codes of the compiled loop (rpcholesky.PIVOT_RULES)
RULE_CODES = {"rpc": 0, "greedy": 1, "uniform": 2}
_RPC, _GREEDY, _UNIFORM = 0, 1, 2


# A score's bounds from its residual's binary exponent alone (no log): r = m 2^e with
# m in [1, 2) puts log r in [e ln 2, (e + 1) ln 2). Only points whose upper bound reaches
# the largest lower bound (less SCORE_SLACK, relative, for the scores' float rounding) can
# be the argmax, and only theirs are computed exactly (a handful of the N, not N logs).
LN2 = math.log(2.0)
SCORE_SLACK = 1e-3


def _argmax_first(scores: np.ndarray) -> int:
    """torch.argmax of a 1-d array: the first maximum; a NaN counts as the maximum."""
    s = 0
    best = scores[0]
    if math.isnan(best):
        return 0
    for i in range(1, scores.shape[0]):
        if math.isnan(scores[i]):
            return i
        if scores[i] > best:
            best = scores[i]
            s = i
    return s


def _select(
    residual: np.ndarray,
    residual_bits: np.ndarray,
    picked: np.ndarray,
    log_weight: np.ndarray,
    add_weight: bool,
    gumbel: np.ndarray,
    rule: int,
    float_format: tuple[int, int, int],
    zero: np.floating,
    scores: np.ndarray,
    upper: np.ndarray,
) -> int:
    """One pivot of one problem: :func:`rpcholesky.select_pivot`'s argmax, same scores.

    residual (N,) and residual_bits (N,) (the same memory viewed as integers),
    picked, log_weight, gumbel (N,); ``float_format`` (mantissa bits, exponent mask,
    exponent bias) of the dtype; scores, upper (N,) scratch. The score of point i is
    ``log(r_i) [+ lw_i] [+ g_i]`` in the compute dtype, as the torch loop forms it; a point
    is scored only if its exponent bound says it can win (the others cannot be the first
    maximum, so the argmax is unchanged).
    """
    n_points = residual.shape[0]
    neg_inf = -np.inf
    use_noise = rule != _GREEDY
    if rule != _UNIFORM:
        mantissa, exponent_mask, bias = float_format
        best_lower = neg_inf
        alive = 0
        has_nan = False
        for i in range(n_points):
            upper[i] = neg_inf
            if picked[i]:
                continue
            bits = residual_bits[i]
            if bits == 0:  # r = 0: log r = -inf, never the maximum
                continue
            exponent = (bits >> mantissa) & exponent_mask
            if exponent == exponent_mask:  # NaN (a residual is never +inf: it is <= 1)
                has_nan = True
                continue
            extra = 0.0
            if add_weight:
                extra += log_weight[i]
            if use_noise:
                extra += gumbel[i]
            if exponent == 0:  # subnormal: below 2^(1 - bias), no useful lower bound
                upper[i] = (1 - bias) * LN2 + extra
            else:
                lower = (exponent - bias) * LN2 + extra
                upper[i] = lower + LN2
                best_lower = max(best_lower, lower)
            alive += 1
        if alive > 0 and not has_nan:
            threshold = best_lower - SCORE_SLACK * (1.0 + abs(best_lower))
            for i in range(n_points):
                scores[i] = neg_inf
                if upper[i] >= threshold:
                    value = math.log(residual[i])
                    if add_weight:
                        value = value + log_weight[i]
                    if use_noise:
                        value = value + gumbel[i]
                    scores[i] = value
            return _argmax_first(scores)
    # uniform, or no usable mass: uniform over the points not yet picked
    for i in range(n_points):
        scores[i] = neg_inf if picked[i] else zero
        if use_noise:
            scores[i] = scores[i] + gumbel[i]
    return _argmax_first(scores)


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
    float_format: tuple[int, int, int],
    round_off: np.floating,
    zero: np.floating,
    factor_t: np.ndarray,
    residual: np.ndarray,
    residual_bits: np.ndarray,
    picked: np.ndarray,
    pivots: np.ndarray,
    trace: np.ndarray,
) -> None:
    """Steps ``t_start .. t_end - 1`` of RPCholesky for every problem, in place.

    Shapes: zt (B, d, N); half_sq, log_weight, weight, residual, picked (B, N);
    residual_bits (B, N) the residual's memory viewed as integers of its width;
    stop_trace (B,); forced (B, t0) long (the forced first pivots); noise (T, B, N) the
    Gumbel noise of steps ``noise_start .. noise_start + T - 1`` (unused for greedy);
    ``float_format`` (mantissa bits, exponent mask, bias) of the dtype;
    ``round_off`` (rpcholesky.pivot_floor) and ``zero`` are scalars of the compute dtype, so
    no step is promoted to float64 (a Python float literal would be);
    factor_t (B, r, N); pivots (B, r) long; trace (B, r + 1). The arithmetic is that of
    the torch loop step for step (Alg. 1: sample, column, correction, update).
    """
    n_batch, n_dim, n_points = zt.shape
    n_forced = forced.shape[1]
    dtype = residual.dtype
    col = np.empty(n_points, dtype)
    scores = np.empty(n_points, dtype)
    upper = np.empty(n_points, np.float64)
    zs = np.empty(n_dim, dtype)
    no_noise = np.zeros(n_points, dtype)
    for b in range(n_batch):
        for t in range(t_start, t_end):
            # --- the pivot (rpcholesky.select_pivot)
            if t < n_forced:
                s = forced[b, t]
            else:
                gumbel = no_noise if rule == _GREEDY else noise[t - noise_start, b]
                s = _select(
                    residual[b],
                    residual_bits[b],
                    picked[b],
                    log_weight[b],
                    add_weight,
                    gumbel,
                    rule,
                    float_format,
                    zero,
                    scores,
                    upper,
                )
            # --- the column G[:, s] - F F^T[:, s], then the factor column and the residual
            _kernel_column(zt[b], half_sq[b], s, zero, zs, col)
            _subtract_factor(factor_t[b], t, s, col)
            running = trace[b, t] > stop_trace[b]  # not stopped by tol
            out = factor_t[b, t]
            active = _update(col, s, running, round_off, zero, out, residual[b], picked[b])
            pivots[b, t] = s if active else -1
            # --- the residual trace of A_tau (scaled), summed in index order
            total = zero
            for i in range(n_points):
                total += weight[b, i] * residual[b, i]
            trace[b, t + 1] = total


def _kernel_column(
    zt: np.ndarray, half_sq: np.ndarray, s: int, zero: np.floating, zs: np.ndarray, col: np.ndarray
) -> None:
    """``col = g(z, z_s) = exp(min(z.z_s - |z|^2/2 - |z_s|^2/2, 0))`` for one problem, eq. (G).

    zt (d, N), half_sq (N,); zs (d,) and col (N,) are written. Each dot product is summed
    over d in index order.
    """
    n_dim, n_points = zt.shape
    for k in range(n_dim):
        zs[k] = zt[k, s]
    for i in range(n_points):
        col[i] = zero
    for k in range(n_dim):
        zk = zs[k]
        row = zt[k]
        for i in range(n_points):
            col[i] += row[i] * zk
    hs = half_sq[s]
    for i in range(n_points):
        col[i] = math.exp(min(col[i] - half_sq[i] - hs, zero))


def _subtract_factor(factor_t: np.ndarray, t: int, s: int, col: np.ndarray) -> None:
    """``col -= F f_s``: the factor's part of the column, earlier steps in order (the
    columns from step t on are 0). factor_t (r, N), col (N,)."""
    for u in range(t):
        f_us = factor_t[u, s]
        frow = factor_t[u]
        for i in range(col.shape[0]):
            col[i] -= frow[i] * f_us


def _update(
    col: np.ndarray,
    s: int,
    running: bool,
    round_off: np.floating,
    zero: np.floating,
    out: np.ndarray,
    residual: np.ndarray,
    picked: np.ndarray,
) -> bool:
    """The factor column ``out = col / sqrt(col_s)`` and ``r -= out^2`` (0 on the pivot)
    for one problem; col, out, residual, picked (N,). Whether the step is active: not
    stopped by tol (``running``) and a pivot residual above the pivot floor (else out = 0).
    """
    pivot_residual = col[s]
    active = running and pivot_residual > round_off  # pivot_floor: no near-duplicate
    if active:
        root = math.sqrt(max(pivot_residual, round_off))
        for i in range(col.shape[0]):
            out[i] = col[i] / root
    else:
        for i in range(col.shape[0]):
            out[i] = zero
    if running:
        picked[s] = True
    for i in range(col.shape[0]):
        residual[i] = max(residual[i] - out[i] * out[i], zero)
    if running:
        residual[s] = zero
    return active


def _sweep(h: np.ndarray, threshold: np.ndarray, one: np.floating, cols_t: np.ndarray) -> None:
    """The accelerated method's rejection sweep (``sweep._sweep_torch``), one loop.

    h (B, b, b) the candidates' residual Gram matrix, overwritten; threshold (B, b);
    cols_t (B, b, b) zeros on entry, written transposed: row j is candidate j's Cholesky
    column from the diagonal down (``cols_t[j, j] = sqrt(residual) > 0``) if accepted, zero
    if not. Only the trailing lower triangle is read or updated (the torch sweep's other
    entries are round-off its caller drops with ``tril``). Each entry's update is the torch
    sweep's ``addcmul_``, one fused multiply-add ``h - c_k c_m`` (numba's ``contract``
    flag; torch's CPU kernel contracts it too), so the columns are its columns bit for bit.
    """
    for e in range(threshold.shape[0]):
        _sweep_element(h[e], threshold[e], one, cols_t[e])


def _sweep_element(h: np.ndarray, threshold: np.ndarray, one: np.floating, cols_t: np.ndarray):
    """:func:`_sweep` for one batch element: h (b, b), threshold (b,), cols_t (b, b)."""
    b = threshold.shape[0]
    for j in range(b):
        pivot = h[j, j]
        if not pivot > threshold[j]:  # rejected (NaN too): column 0, no update
            continue
        inv = one / math.sqrt(pivot)
        col = cols_t[j]
        for i in range(j, b):
            col[i] = h[i, j] * inv
        for k in range(j + 1, b):
            c_k = col[k]
            # slices indexed from 0: LLVM vectorises the loop (2.7x against indices
            # j + 1..k, whose wrap-around checks it keeps)
            row, below = h[k, j + 1 : k + 1], col[j + 1 : k + 1]
            for m in range(row.shape[0]):
                row[m] = row[m] - c_k * below[m]


def _absorb(
    h: np.ndarray,
    threshold: np.ndarray,
    one: np.floating,
    w: np.ndarray,
    cand: np.ndarray,
    z_c: np.ndarray,
    count: np.ndarray,
    state: tuple[np.ndarray, np.ndarray, np.ndarray],
    accept: np.ndarray,
    keep: np.ndarray,
) -> None:
    """One round of the accelerated method after its Gram matrix, per batch element: the
    sweep (:func:`_sweep_element`), then the factor's update of
    :func:`rpka.attention.sweep.absorb_torch` with the same operations in the same order, so
    its buffers are that update's bit for bit.

    h (B, b, b) the candidates' residual Gram matrix (overwritten); threshold (B, b);
    w (B, r, b) = ``L^{-1} g(Z_S, Z_C)``; cand (B, b) the candidates' indices, z_c (B, b, d)
    their points; count (B,) pivots before the round, advanced in place; state = (pivots_ext
    (B, r + 1), landmarks_ext (B, r + 1, d), chol_ext (B, r + 1, r + 1)), written at the
    slots of the kept candidates (slot r, the trash slot, takes the others, in order);
    accept, keep (B, b) bool, written.
    """
    pivots_ext, landmarks_ext, chol_ext = state
    batch, b = threshold.shape
    rank = pivots_ext.shape[1] - 1
    cols_t = np.empty((b, b), dtype=h.dtype)
    rows = np.empty((b, rank + 1), dtype=h.dtype)
    slot = np.empty(b, dtype=np.int64)
    kept = np.empty(b, dtype=h.dtype)
    zero = one - one
    for e in range(batch):
        cols_t[:] = zero
        _sweep_element(h[e], threshold[e], one, cols_t)
        pos = count[e] - 1
        for i in range(b):
            accept[e, i] = cols_t[i, i] > zero
            pos += accept[e, i]
            keep[e, i] = accept[e, i] and pos < rank
            slot[i] = pos if keep[e, i] else rank
            kept[i] = one if keep[e, i] else zero
        # rows of L: [W^T, 0], plus each kept candidate's column (cols.tril() * keep) added
        # at its slot - scatter_add_'s order, the trash slot accumulating the others
        for j in range(b):
            for s in range(rank):
                rows[j, s] = w[e, s, j]
            rows[j, rank] = zero
            for i in range(b):
                column = cols_t[i, j] if i <= j else zero
                rows[j, slot[i]] = rows[j, slot[i]] + column * kept[i]
        for j in range(b):
            chol_ext[e, slot[j]] = rows[j]
            landmarks_ext[e, slot[j]] = z_c[e, j]
            pivots_ext[e, slot[j]] = cand[e, j]
            count[e] += keep[e, j]


_compiled: dict[str, Callable] = {}


def compiled(key: str, missing: str, build: Callable[[], Callable]) -> Callable:
    """The kernel ``key``, built by ``build`` (numba's jit of it) at the first call in a
    process and kept; ``ValueError(missing)`` where numba is not installed.

    ``cache=True`` in the builds: compiled once per dtype into ``__pycache__`` (or numba's
    user cache directory where the package is read-only) and loaded from there afterwards.
    """
    kernel = _compiled.get(key)
    if kernel is None:
        if not AVAILABLE:
            raise ValueError(missing)
        kernel = _compiled[key] = build()
    return kernel


def pivot_steps(*args: object) -> None:
    """:func:`_pivot_steps`, compiled at the first call in a process (same arguments)."""
    missing = "the compiled pivot loop needs numba (pivot_backend='torch')"
    compiled("steps", missing, _build_steps)(*args)


def _build_steps() -> Callable:
    """:func:`_pivot_steps` compiled, its helpers rebound to their compiled versions first:
    numba resolves the globals a compiled function calls when it compiles it."""
    global _argmax_first, _select, _kernel_column, _subtract_factor, _update
    jit = numba.njit(parallel=False, cache=True, nogil=True)
    _argmax_first = jit(_argmax_first)
    _select = jit(_select)
    _kernel_column = jit(_kernel_column)
    _subtract_factor = jit(_subtract_factor)
    _update = jit(_update)
    return jit(_pivot_steps)


def _sweep_jit() -> Callable:
    """numba's jit as the sweep needs it, with :func:`_sweep_element` rebound to its compiled
    version (numba resolves a compiled function's globals when it compiles it). The fused
    multiply-add (``contract``) is the torch sweep's ``addcmul_``; the factor's update in
    :func:`_absorb` only copies and adds exact products, which contraction cannot change."""
    global _sweep_element
    jit = numba.njit(parallel=False, cache=True, nogil=True, fastmath={"contract"})
    if "sweep_element" not in _compiled:
        _sweep_element = _compiled["sweep_element"] = jit(_sweep_element)
    return jit


def rejection_sweep(h: np.ndarray, threshold: np.ndarray, cols_t: np.ndarray) -> None:
    """:func:`_sweep`, compiled at the first call in a process (same arguments)."""
    missing = "the compiled rejection sweep needs numba"
    sweep = compiled("sweep", missing, lambda: _sweep_jit()(_sweep))
    sweep(h, threshold, h.dtype.type(1), cols_t)


def absorb(
    h: np.ndarray,
    threshold: np.ndarray,
    w: np.ndarray,
    cand: np.ndarray,
    z_c: np.ndarray,
    count: np.ndarray,
    state: tuple[np.ndarray, np.ndarray, np.ndarray],
    accept: np.ndarray,
    keep: np.ndarray,
) -> None:
    """:func:`_absorb`, compiled at the first call in a process (its arguments less ``one``)."""
    missing = "the compiled rejection round needs numba"
    kernel = compiled("absorb", missing, lambda: _sweep_jit()(_absorb))
    kernel(h, threshold, h.dtype.type(1), w, cand, z_c, count, state, accept, keep)


def float_format(dtype: np.dtype) -> tuple[np.dtype, tuple[int, int, int]]:
    """The integer view and (mantissa bits, exponent mask, exponent bias) of float32/64."""
    info = np.finfo(dtype)
    view = np.int32 if info.bits == np.finfo(np.float32).bits else np.int64
    return np.dtype(view), (info.nmant, 2**info.nexp - 1, info.maxexp - 1)
