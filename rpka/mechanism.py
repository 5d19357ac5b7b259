"""The mechanism signature of RPCholesky and the approximation quality around it.

DESIGN.md section 3. Two measurements on the query/key tensors a model feeds its attention.

**1. The trace identity.** One RPCholesky step from a PSD residual ``R``, pivot ``s`` drawn
with probability ``R_ss / tr R``, removes the rank-one Schur complement
``R[:, s] R[s, :] / R_ss``, whose trace is ``|R[:, s]|^2 / R_ss``. So

    E[tr R - tr R'] = sum_s (R_ss / tr R) |R[:, s]|^2 / R_ss = |R|_F^2 / tr R        (*)

(Chen, Epperly, Tropp, Webber 2023, "Randomly pivoted Cholesky"). For one run of
rank r and every step t we compare, on the matrix the package actually pivots:

* ``predicted``: ``|R_t|_F^2 / tr R_t`` from the explicit residual matrix ``R_t`` (float64
  Schur complements of ``A_tau`` on the run's first t pivots, independent of the package's
  factor);
* ``exact``: ``sum_s (R_ss / tr R) * decrease_s`` over every candidate pivot ``s``, where
  ``decrease_s`` is the package's own one-step trace decrease with the pivot forced to ``s``
  (``rpcholesky(first_pivots=prefix + [s])``: equal to ``predicted`` to round-off when the
  package's update is the Schur complement) or, cheaper, the explicit Schur complement's
  ``|R[:, s]|^2 / R_ss`` (``MechanismConfig.candidate_decreases``);
* ``observed``: the Monte Carlo mean of ``draws`` independent one-step draws by the
  package's rule (``rpcholesky(first_pivots=prefix)``, batched copies; or, equivalently
  and cheaper, the package's sampler on the replayed state - ``MechanismConfig.monte_carlo``),
  its standard error and ``z = (observed - predicted) / SE``.

**2. Approximation quality.** For ranks r (capped at the number of points N): the residual
trace ``tr(A - A_S)`` after r pivots for the ``rpc``, ``greedy`` and ``uniform`` rules over
several pivot seeds; the optimum over *all* rank-r approximations, the sum of the
eigenvalues beyond r (Eckart-Young-Mirsky in the trace norm); their ratio (>= 1: a Nystrom
approximation satisfies ``0 <= A_S <= A`` with rank r, so by Weyl's monotonicity
``tr A_S <= lambda_1 + ... + lambda_r``); the relative error of RPKA's attention output
against exact SDPA and how often its guards fired.

The pivoted matrix is built exactly as :class:`rpka.attention.rpka.RPKAttention` builds it:
``q~ = q d^{-1/4}``, keys centred then scaled, pivot set joint ``[q~; k~]`` or keys only,
``A_tau = D^tau G D^tau`` with the Gaussian ``G`` and ``D = diag(e^{|z|^2/2})``. Traces are in
the package's units: ``A_tau`` divided by ``max_i e^{tau |z_i|^2}`` (1 for ``gauss``), to
which (*) is invariant; plots and tables use fractions of ``tr A_tau``.

Everything returned is plain JSON-able data (lists, floats, ints, strings);
:func:`quality_frames` turns the quality part into pandas DataFrames.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, replace

import numpy as np
import pandas as pd
import torch
from scipy import stats
from torch import Tensor
from tqdm import tqdm  # plain text bars: no ipywidgets needed in notebooks

from rpka.attention import build, options_of
from rpka.attention.rpcholesky import (
    gaussian_kernel,
    rpcholesky,
    select_pivot,
    weighting_power,
)
from rpka.attention.rpka import PIVOT_SETS
from rpka.config import MechanismConfig

QKV = tuple[Tensor, Tensor, Tensor]

PREDICTION = (
    "One RPCholesky step from residual R, with pivot s drawn with probability R_ss / tr R, "
    "decreases the residual trace by ||R||_F^2 / tr R in expectation (DESIGN.md section 3)."
)
OBSERVED_DEFINITION = (
    "predicted and observed are sums over the run's steps t = 0..rank-1 of ||R_t||_F^2 / tr R_t "
    "and of the Monte Carlo mean one-step decrease, for the studied head with the largest "
    "max |z|; relative_error = |observed - predicted| / predicted. Units: fraction of the "
    "initial trace tr A_tau."
)


# --------------------------------------------------------------------------- the matrix


def pivot_points(q: Tensor, k: Tensor, pivot_set: str = "joint") -> Tensor:
    """The points RPKA pivots, in float64: (..., n, d), (..., m, d) -> (..., N, d).

    Mirrors :meth:`RPKAttention.attend`: ``q~ = q d^{-1/4}``, keys scaled and centred by
    their mean (guard 1), joint set ``[q~; k~]`` (N = n + m) or keys only (N = m).
    """
    if pivot_set not in PIVOT_SETS:
        raise ValueError(f"pivot_set must be one of {PIVOT_SETS}, got {pivot_set!r}")
    scale = q.shape[-1] ** -0.25
    q_s = q.detach().to(torch.float64) * scale
    k_s = k.detach().to(torch.float64) * scale
    k_s = k_s - k_s.mean(-2, keepdim=True)
    return torch.cat([q_s, k_s], dim=-2) if pivot_set == "joint" else k_s


def pivoted_matrix(points: Tensor, weighting: str = "gauss", tempering: float = 0.5) -> Tensor:
    """``A_tau = D^tau G D^tau`` in the package's units: points (..., N, d) -> (..., N, N).

    ``D^tau`` enters as ``sqrt(w)`` with ``w = exp(tau |z|^2 - max tau |z|^2)``, the weight
    :func:`rpcholesky` uses, so ``trace(A_tau)`` equals its ``trace[..., 0]``.
    """
    tau = weighting_power(weighting, tempering)
    z = points.to(torch.float64)
    log_weight = tau * z.pow(2).sum(-1)
    root = torch.exp((log_weight - log_weight.amax(-1, keepdim=True)) / 2)
    return root.unsqueeze(-1) * gaussian_kernel(z, z) * root.unsqueeze(-2)


def schur_step(residual: Tensor, pivot: Tensor) -> Tensor:
    """``R - R[:, s] R[s, :] / R_ss`` for residual (..., N, N) and pivot (...,) long."""
    col = torch.gather(
        residual, -1, pivot[..., None, None].expand(*pivot.shape, residual.shape[-1], 1)
    )
    piv = torch.gather(col, -2, pivot[..., None, None])  # (..., 1, 1)
    return residual - col @ col.transpose(-1, -2) / piv


def optimal_trace_error(matrix: Tensor, ranks: Sequence[int]) -> Tensor:
    """Best rank-r trace error of a PSD matrix (..., N, N): ``sum_{i > r} lambda_i``.

    Eigenvalues by ``torch.linalg.eigvalsh`` in float64; round-off negatives count as 0.
    Returns (..., len(ranks)).
    """
    return _tail_sums(_eigenvalues(matrix), ranks)


def _eigenvalues(matrix: Tensor) -> Tensor:
    """Eigenvalues of a PSD matrix (..., N, N) in descending order, float64, negatives -> 0."""
    return torch.linalg.eigvalsh(matrix.to(torch.float64)).flip(-1).clamp(min=0.0)


def _tail_sums(eig: Tensor, ranks: Sequence[int]) -> Tensor:
    """``sum_{i > r} lambda_i`` for descending eigenvalues (..., N) -> (..., len(ranks))."""
    tails = eig.flip(-1).cumsum(-1).flip(-1)  # tails[..., i] = sum_{j >= i} lambda_j
    tails = torch.cat([tails, tails.new_zeros(*tails.shape[:-1], 1)], dim=-1)
    index = torch.tensor([min(r, eig.shape[-1]) for r in ranks], device=eig.device)
    return tails[..., index]


# --------------------------------------------------------------------------- 1. trace identity


def _chunk(budget_mb: float, copies_per_draw: int, n_points: int, width: int) -> int:
    """Draws per batched call so that the factor and point copies stay within the budget."""
    bytes_per_draw = 8 * copies_per_draw * n_points * (width + 4)  # factor + expanded points
    return max(1, int(budget_mb * 2**20 // bytes_per_draw))


def _one_step_decrease(
    points: Tensor,
    prefix: Tensor,
    copies: int,
    config: MechanismConfig,
    generator: torch.Generator | None,
    forced: Tensor | None = None,
) -> Tensor:
    """Trace decrease of step t = len(prefix) in ``copies`` batched package runs.

    points (P, N, d), prefix (P, t). Each copy replays the prefix with ``first_pivots``; the
    next pivot is drawn by the package's rule, or forced to ``forced`` (P, copies) if given.
    Returns (P, copies), in the package's trace units.
    """
    n_pts, t = points.shape[-2], prefix.shape[-1]
    first = prefix.unsqueeze(1).expand(-1, copies, -1)
    if forced is not None:
        first = torch.cat([first, forced.unsqueeze(-1)], dim=-1)
    run = rpcholesky(
        points.unsqueeze(1).expand(-1, copies, n_pts, -1),
        t + 1,
        "rpc",
        generator,
        weighting=config.weighting,
        tempering=config.tempering,
        first_pivots=first,
    )
    return run.trace[..., t] - run.trace[..., t + 1]


def resolve_monte_carlo(config: MechanismConfig, device: torch.device) -> MechanismConfig:
    """Resolve ``monte_carlo="auto"``: ``"replay"`` on a GPU, ``"resample"`` on the CPU."""
    if config.monte_carlo != "auto":
        return config
    gpu = torch.device(device).type == "cuda"
    return replace(config, monte_carlo="replay" if gpu else "resample")


def _package_draws(
    points: Tensor,
    prefix: Tensor,
    decrease: Tensor,
    draws: int,
    config: MechanismConfig,
    generator: torch.Generator,
) -> Tensor:
    """``draws`` one-step decreases at step t = len(prefix) by the package's rule.

    ``"replay"``: batched copies of :func:`rpcholesky` with ``first_pivots=prefix``, each
    drawing step t itself - the literal algorithm, cost O(draws N t^2) per step.
    ``"resample"``: the package's :func:`select_pivot` applied ``draws`` times to the
    package's state after the prefix (residual diagonal ``residual * e^{log_weight}``, as
    :class:`CholeskyResult` documents it), each draw's decrease looked up in ``decrease``
    (P, N), the decrease per candidate pivot - with the package's decreases the same
    distribution (the same draws for the same generator state), cost O(draws N) per step.
    Returns (P, draws).
    """
    n_sets, n_pts, dim = points.shape
    t = prefix.shape[-1]
    if config.monte_carlo == "replay":
        chunk = _chunk(config.batch_budget_mb, n_sets, n_pts, t + 1 + dim)
        sizes = [chunk] * (draws // chunk) + [draws % chunk]
        parts = [
            _one_step_decrease(points, prefix, size, config, generator) for size in sizes if size
        ]
        return torch.cat(parts, dim=-1)
    state = rpcholesky(
        points,
        max(t, 1),
        "rpc",
        weighting=config.weighting,
        tempering=config.tempering,
        first_pivots=prefix if t else torch.zeros_like(prefix[:, :1]),
    )
    residual = state.residual if t else torch.ones_like(state.residual)
    picked = torch.zeros_like(residual, dtype=torch.bool).scatter_(-1, prefix, True)
    log_res = torch.log(residual) + state.log_weight
    expand = (n_sets, draws, n_pts)
    pivots = select_pivot(
        log_res.unsqueeze(1).expand(expand), picked.unsqueeze(1).expand(expand), "rpc", generator
    )
    return torch.gather(decrease, -1, pivots)


@torch.no_grad()
def trace_identity(
    points: Tensor, config: MechanismConfig, progress: bool = False
) -> dict[str, np.ndarray]:
    """Per-step check of (*) for one RPCholesky run on each of P point sets.

    Args:
        points: (P, N, d) pivot points (float64), e.g. every studied head stacked.
        config: rank, draws, Monte Carlo mode, weighting, seed, batch budget.

    Returns:
        numpy arrays (P, steps) - ``trace`` (explicit tr R_t), ``trace_package`` (the run's
        recorded trace), ``predicted``, ``exact``, ``rel_error_exact``, ``mc_mean``,
        ``mc_sd``, ``mc_se`` (sample standard error of the mean), ``z`` (with ``mc_se``),
        ``null_se`` and ``z_null`` (with the standard error implied by the exact one-step
        distribution ``p_s = R_ss / tr R``; the sample one underestimates it when a few
        rarely drawn pivots carry the variance, e.g. ``exp`` weighting) - plus ``pivots``
        (P, steps) and ``trace0`` (P,). The run stops early (fewer steps) if the package
        skipped a step (residual exhausted).
    """
    points = points.to(torch.float64)
    n_sets, n_pts, dim = points.shape
    config = resolve_monte_carlo(config, points.device)
    rank = min(config.rank, n_pts)
    device = points.device
    generator = torch.Generator(device=device).manual_seed(config.seed)
    run = rpcholesky(
        points, rank, "rpc", generator, weighting=config.weighting, tempering=config.tempering
    )
    valid = (run.pivots >= 0).all(0)
    steps = int(valid.long().cumprod(0).sum())  # up to the first skipped step
    residual = pivoted_matrix(points, config.weighting, config.tempering)
    candidates = torch.arange(n_pts, device=device).expand(n_sets, n_pts)
    keys = ("trace", "predicted", "exact", "null_var", "mc_mean", "mc_sd")
    out = {key: np.zeros((n_sets, steps)) for key in keys}

    for t in tqdm(range(steps), desc="trace identity", disable=not progress):
        prefix = run.pivots[:, :t]
        diag = residual.diagonal(dim1=-2, dim2=-1)
        trace = diag.sum(-1)
        out["trace"][:, t] = trace.cpu().numpy()
        out["predicted"][:, t] = (residual.pow(2).sum((-2, -1)) / trace).cpu().numpy()
        # exact expectation: every candidate's one-step decrease, weighted R_ss / tr R
        if config.candidate_decreases == "package":
            chunk = _chunk(config.batch_budget_mb, n_sets, n_pts, t + 1 + dim)
            decrease = torch.cat(
                [
                    _one_step_decrease(points, prefix, idx.shape[-1], config, None, forced=idx)
                    for idx in candidates.split(chunk, -1)
                ],
                dim=-1,
            )
        else:  # trace of the rank-one Schur complement R[:, s] R[s, :] / R_ss
            decrease = torch.where(diag > 0, residual.pow(2).sum(-2) / diag, 0.0)
        prob = diag / trace.unsqueeze(-1)
        exact = (prob * decrease).sum(-1)
        out["exact"][:, t] = exact.cpu().numpy()
        # variance of one draw if the identity holds: the null standard error of the mean
        out["null_var"][:, t] = ((prob * decrease.pow(2)).sum(-1) - exact.pow(2)).cpu().numpy()
        draws = _package_draws(points, prefix, decrease, config.draws, config, generator)
        out["mc_mean"][:, t] = draws.mean(-1).cpu().numpy()
        out["mc_sd"][:, t] = draws.std(-1, correction=1).cpu().numpy()
        residual = schur_step(residual, run.pivots[:, t])

    out["trace_package"] = run.trace[:, :steps].cpu().numpy()
    out["trace0"] = run.trace[:, 0].cpu().numpy()
    out["pivots"] = run.pivots[:, :steps].cpu().numpy()
    out["rel_error_exact"] = np.abs(out["exact"] - out["predicted"]) / out["predicted"]
    out["mc_se"] = out["mc_sd"] / math.sqrt(config.draws)
    out["null_se"] = np.sqrt(np.clip(out.pop("null_var"), 0.0, None) / config.draws)
    out["z"] = _z_scores(out["mc_mean"], out["predicted"], out["mc_se"])
    out["z_null"] = _z_scores(out["mc_mean"], out["predicted"], out["null_se"])
    return out


def _z_scores(observed: np.ndarray, predicted: np.ndarray, se: np.ndarray) -> np.ndarray:
    """``(observed - predicted) / se``; 0 where both differences and se vanish."""
    diff = observed - predicted
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, diff / np.where(se > 0, se, 1.0), np.where(diff == 0, 0.0, np.inf))
    return z


def _select(count: int, chosen: Sequence[int] | None, name: str) -> list[int]:
    if chosen is None:
        return list(range(count))
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise ValueError(f"{name} must lie in [0, {count - 1}], got {list(chosen)}")
    return list(chosen)


def _check_layers(qkv_per_layer: Sequence[QKV]) -> None:
    if not isinstance(qkv_per_layer, Sequence) or not qkv_per_layer:
        raise ValueError("qkv_per_layer must be a non-empty list of (q, k, v) tuples")
    for i, qkv in enumerate(qkv_per_layer):
        if len(qkv) != 3 or any(not isinstance(x, Tensor) or x.dim() != 4 for x in qkv):
            raise ValueError(f"qkv_per_layer[{i}] must be (q, k, v), each of shape (B, H, n, d)")
        q, k, v = qkv
        if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2] or q.shape[-1] != k.shape[-1]:
            raise ValueError(f"qkv_per_layer[{i}]: q, k, v must share (B, H) and q, k share d")
        if k.shape[-2] != v.shape[-2]:
            raise ValueError(f"qkv_per_layer[{i}]: k and v must share the length m")


def trace_identity_study(
    qkv_per_layer: Sequence[QKV], config: MechanismConfig | None = None, progress: bool = True
) -> dict[str, object]:
    """Check (*) on every studied (layer, head) of batch item ``config.identity_item``.

    All studied heads are stacked into one batch (one run each, independent draws), so the
    Python loop is over steps only. Returns a JSON-able dict: ``heads`` (per-head per-step
    arrays and summaries) and the ``signature`` fields of bench_report.json.
    """
    config = config or MechanismConfig()
    config.validate()
    _check_layers(qkv_per_layer)
    config = resolve_monte_carlo(config, qkv_per_layer[0][0].device)
    layers = _select(len(qkv_per_layer), config.layers, "layers")
    batch, n_heads = qkv_per_layer[0][0].shape[:2]
    heads = _select(n_heads, config.heads, "heads")
    if config.identity_item >= batch:
        raise ValueError(f"identity_item must lie in [0, {batch - 1}], got {config.identity_item}")
    item = config.identity_item
    pairs = [(layer, head) for layer in layers for head in heads]
    points = torch.stack(
        [
            pivot_points(
                qkv_per_layer[layer][0][item, head],
                qkv_per_layer[layer][1][item, head],
                config.pivot_set,
            )
            for layer, head in pairs
        ]
    )
    start = time.perf_counter()
    result = trace_identity(points, config, progress=progress)
    seconds = time.perf_counter() - start
    per_head = []
    for i, (layer, head) in enumerate(pairs):
        unit = float(result["trace0"][i])
        arrays = {key: result[key][i] for key in result if key not in ("trace0",)}
        pred_sum = float(arrays["predicted"].sum())
        obs_sum = float(arrays["mc_mean"].sum())
        per_head.append(
            {
                "layer": layer,
                "head": head,
                "item": item,
                "n_points": points.shape[-2],
                "trace0": unit,
                "steps": int(arrays["predicted"].size),
                "max_abs_z": float(np.max(np.abs(arrays["z"]), initial=0.0)),
                "max_abs_z_null": float(np.max(np.abs(arrays["z_null"]), initial=0.0)),
                "max_rel_error_exact": float(np.max(arrays["rel_error_exact"], initial=0.0)),
                "max_rel_error_trace": float(
                    np.max(
                        np.abs(arrays["trace"] - arrays["trace_package"]) / arrays["trace"],
                        initial=0.0,
                    )
                ),
                "predicted_sum": pred_sum / unit,
                "observed_sum": obs_sum / unit,
                "observed_sum_se": float(np.sqrt((arrays["mc_se"] ** 2).sum())) / unit,
                "relative_error": abs(obs_sum - pred_sum) / pred_sum,
                **{key: value.tolist() for key, value in arrays.items()},
            }
        )
    return {
        "seconds": seconds,
        "heads": per_head,
        "signature": signature(per_head, config),
    }


def signature(per_head: Sequence[dict], config: MechanismConfig) -> dict[str, object]:
    """The ``mechanism_signature`` block of bench_report.json (DESIGN.md section 5).

    ``predicted``/``observed`` come from the head with the largest max |z| (the worst case);
    ``confirmed`` requires ``|z| <= z_threshold`` at every step of every studied head. With
    many heads and steps a few |z| > 4 can occur by chance, so the expected number under the
    identity and a chi-square test of all z-scores (sum z^2 ~ chi2(n)) are reported beside it.
    ``trained_model`` is left for the caller to fill.
    """
    z = np.concatenate([np.asarray(h["z"], dtype=float) for h in per_head])
    worst = max(per_head, key=lambda h: h["max_abs_z"])
    n_tests = int(z.size)
    finite = np.isfinite(z)
    chi2_p = (
        float(stats.chi2.sf(float((z[finite] ** 2).sum()), int(finite.sum()))) if n_tests else None
    )
    threshold = config.z_threshold
    return {
        "prediction": PREDICTION,
        "predicted": worst["predicted_sum"],
        "observed": worst["observed_sum"],
        "observed_se": worst["observed_sum_se"],
        "relative_error": worst["relative_error"],
        "confirmed": bool(n_tests > 0 and np.all(np.abs(z) <= threshold)),
        "confirmation_rule": (
            f"confirmed = |z| <= {threshold:g} at every step t = 0..rank-1 of every studied "
            f"head, z = (Monte Carlo mean - predicted) / sample standard error of the mean of "
            f"{config.draws} independent one-step draws by the package's rule "
            f"(monte_carlo={config.monte_carlo!r}, candidate_decreases="
            f"{config.candidate_decreases!r})"
        ),
        "observed_definition": OBSERVED_DEFINITION,
        "trained_model": None,
        "rank": int(worst["steps"]),
        "max_abs_z": float(np.max(np.abs(z), initial=0.0)),
        "max_abs_z_null": max(h["max_abs_z_null"] for h in per_head),
        "max_rel_error_exact": max(h["max_rel_error_exact"] for h in per_head),
        "n_draws": config.draws,
        "monte_carlo": config.monte_carlo,
        "candidate_decreases": config.candidate_decreases,
        "max_rel_error_trace": max(h["max_rel_error_trace"] for h in per_head),
        "layer": worst["layer"],
        "head": worst["head"],
        "n_heads": len(per_head),
        "n_tests": n_tests,
        "n_exceeding": int((np.abs(z) > threshold).sum()),
        "expected_exceeding_if_true": n_tests * float(2 * stats.norm.sf(threshold)),
        "chi2_p_value": chi2_p,
        "pivot_set": config.pivot_set,
        "weighting": config.weighting,
    }


# --------------------------------------------------------------------------- 2. quality


def _spread(values: np.ndarray, prefix: str) -> dict[str, float]:
    """mean, sd (ddof=1), min, 10/50/90 % quantiles and max of the last axis."""
    qs = np.quantile(values, [0.1, 0.5, 0.9], axis=-1)
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_sd": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        f"{prefix}_min": float(values.min()),
        f"{prefix}_q10": float(qs[0]),
        f"{prefix}_median": float(qs[1]),
        f"{prefix}_q90": float(qs[2]),
        f"{prefix}_max": float(values.max()),
    }


@torch.no_grad()
def layer_quality(q: Tensor, k: Tensor, v: Tensor, config: MechanismConfig, layer: int = 0) -> dict:
    """Approximation quality of one layer: q, k (I, H, n, d), v (I, H, m, d_v).

    Returns JSON-able ``rows`` (one per item, head, rule, rank: residual-trace spread over
    seeds as fractions of ``tr A``, optimum, ratio, output error), ``guards`` (one per rule
    and rank, summed over items, heads and seeds) and ``spectra`` (eigenvalues / tr A).
    Residual traces come from one run of ``max(ranks)`` pivots per seed (nested prefixes);
    output errors from RPKA's own independent draws at each rank, in float64 so that they
    measure the approximation, not round-off.
    """
    seeds = config.quality_seeds
    points = pivot_points(q, k, config.pivot_set)  # (I, H, N, d)
    n_items, n_heads, n_pts, _ = points.shape
    ranks = sorted({min(r, n_pts) for r in config.quality_ranks})
    matrix = pivoted_matrix(points, config.weighting, config.tempering)
    trace0 = matrix.diagonal(dim1=-2, dim2=-1).sum(-1)  # (I, H)
    eig = _eigenvalues(matrix)  # (I, H, N)
    optimum = _tail_sums(eig, ranks)  # (I, H, R)
    spectrum = eig / trace0.unsqueeze(-1)

    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    exact = build("exact")(q64, k64, v64)  # (I, H, n, d_v), torch SDPA
    norm = exact.pow(2).sum((-2, -1)).sqrt()

    def copies(x: Tensor) -> Tensor:  # (I, H, ...) -> (seeds * I, H, ...), seed-major
        return x.unsqueeze(0).expand(seeds, *x.shape).reshape(seeds * x.shape[0], *x.shape[1:])

    rows, guards = [], []
    for rule_index, rule in enumerate(config.rules):
        generator = torch.Generator(device=points.device).manual_seed(
            config.seed + 1000 * layer + rule_index
        )
        run = rpcholesky(
            points.unsqueeze(0).expand(seeds, *points.shape),
            max(ranks),
            rule,
            generator,
            weighting=config.weighting,
            tempering=config.tempering,
        )
        residual = run.trace[..., ranks].permute(1, 2, 3, 0).cpu().numpy()  # (I, H, R, seeds)
        errors = {}
        for rank in ranks:
            attn = build(
                "rpka",
                rank=rank,
                pivot_rule=rule,
                pivot_set=config.pivot_set,
                weighting=config.weighting,
                tempering=config.tempering,
                den_floor=config.den_floor,
                generator=generator,
            )
            out = attn(copies(q64), copies(k64), copies(v64)).reshape(seeds, *exact.shape)
            err = (out - exact).pow(2).sum((-2, -1)).sqrt() / norm  # (seeds, I, H)
            errors[rank] = err.permute(1, 2, 0).cpu().numpy()
            counts = attn.guard_counts
            guards.append(
                {
                    "layer": layer,
                    "rule": rule,
                    "rank": rank,
                    **counts,
                    "denominator_fraction": counts["denominator"] / max(counts["rows"], 1),
                    "clamped_fraction": counts["clamped"] / max(counts["entries"], 1),
                }
            )
        for item in range(n_items):
            for head in range(n_heads):
                tr = float(trace0[item, head])
                for j, rank in enumerate(ranks):
                    res = residual[item, head, j]
                    opt = float(optimum[item, head, j])
                    ratio_ok = opt > config.optimum_floor * tr
                    ratio = res / opt if ratio_ok else np.full_like(res, np.nan)
                    rows.append(
                        {
                            "layer": layer,
                            "head": head,
                            "item": item,
                            "n_points": n_pts,
                            "rule": rule,
                            "rank": rank,
                            "seeds": seeds,
                            "trace0": tr,
                            **_spread(res / tr, "rel_residual"),
                            "rel_optimum": opt / tr,
                            "ratio_mean": float(ratio.mean()) if ratio_ok else None,
                            "ratio_min": float(ratio.min()) if ratio_ok else None,
                            "ratio_max": float(ratio.max()) if ratio_ok else None,
                            **_spread(errors[rank][item, head], "output_error"),
                        }
                    )
    spectra = [
        {
            "layer": layer,
            "head": head,
            "item": item,
            **spectrum_summary(spectrum[item, head]),
            "eigenvalues": spectrum[item, head].tolist(),
        }
        for item in range(n_items)
        for head in range(n_heads)
    ]
    return {"rows": rows, "guards": guards, "spectra": spectra}


def summarise(
    rows: pd.DataFrame | Sequence[dict], by: Sequence[str] = ("rule", "rank")
) -> pd.DataFrame:
    """Aggregate per-head quality rows over heads (and items): one row per ``by`` group.

    Means of the per-head seed means, the envelope (min of minima, max of maxima), the
    median and maximum ratio to the optimum across heads.
    """
    frame = pd.DataFrame(rows)
    grouped = frame.groupby(list(by), sort=True)
    summary = grouped.agg(
        n_heads=("head", "size"),
        rel_residual_mean=("rel_residual_mean", "mean"),
        rel_residual_sd_mean=("rel_residual_sd", "mean"),
        rel_residual_min=("rel_residual_min", "min"),
        rel_residual_max=("rel_residual_max", "max"),
        rel_optimum_mean=("rel_optimum", "mean"),
        ratio_median=("ratio_mean", "median"),
        ratio_max=("ratio_max", "max"),
        ratio_min=("ratio_min", "min"),
        output_error_mean=("output_error_mean", "mean"),
        output_error_min=("output_error_min", "min"),
        output_error_max=("output_error_max", "max"),
    )
    return summary.reset_index()


def approximation_quality(
    qkv_per_layer: Sequence[QKV], config: MechanismConfig | None = None, progress: bool = True
) -> dict[str, object]:
    """Approximation quality of every studied layer and head (part 2), JSON-able.

    Returns ``rows`` (per layer, head, item, rule, rank), ``summary`` (over heads, per rule
    and rank), ``by_layer`` (per layer, rule and rank), ``guards`` and ``spectra``.
    """
    config = config or MechanismConfig()
    config.validate()
    _check_layers(qkv_per_layer)
    layers = _select(len(qkv_per_layer), config.layers, "layers")
    heads = _select(qkv_per_layer[0][0].shape[1], config.heads, "heads")
    start = time.perf_counter()
    rows, guards, spectra = [], [], []
    for layer in tqdm(layers, desc="approximation quality", disable=not progress):
        q, k, v = (x[: config.quality_items, heads] for x in qkv_per_layer[layer])
        part = layer_quality(q, k, v, config, layer)
        for row in part["rows"] + part["spectra"]:
            row["head"] = heads[row["head"]]
        rows += part["rows"]
        guards += part["guards"]
        spectra += part["spectra"]
    guard_frame = pd.DataFrame(guards).groupby(["rule", "rank"], sort=True)
    guard_totals = guard_frame[["denominator", "rows", "clamped", "entries"]].sum().reset_index()
    summary = summarise(rows).merge(guard_totals, on=["rule", "rank"])
    summary["denominator_fraction"] = summary["denominator"] / summary["rows"]
    summary["clamped_fraction"] = summary["clamped"] / summary["entries"]
    return {
        "seconds": time.perf_counter() - start,
        "rows": rows,
        "summary": _records(summary),
        "by_layer": _records(summarise(rows, ("layer", "rule", "rank"))),
        "guards": guards,
        "spectra": spectra,
    }


def spectrum_summary(fractions: Tensor, mass: float = 0.9) -> dict[str, float]:
    """Two numbers for a spectrum ``lambda_i / tr A`` (descending, summing to 1).

    ``effective_rank``: ``1 / sum_i p_i^2`` (the participation ratio, ``(tr A)^2 / |A|_F^2``);
    ``rank_90``: the fewest eigenvalues holding ``mass`` (90 %) of the trace - the rank an
    optimal approximation needs for a 10 % residual trace.
    """
    p = fractions.to(torch.float64)
    held = torch.cumsum(p, -1)
    return {
        "effective_rank": float(1.0 / p.pow(2).sum()),
        f"rank_{round(100 * mass)}": int((held < mass - 1e-12).sum()) + 1,
    }


def compare_models(results: dict[str, dict], rule: str = "rpc") -> pd.DataFrame:
    """What training does, one row per model and rank (e.g. ``{"trained": .., "init": ..}``).

    Columns: mean effective rank and ``rank_90`` over heads, and at each rank the optimal
    and the ``rule``'s residual trace (fractions of tr A), the median ratio to the optimum
    and the mean output error.
    """
    frames = []
    for label, result in results.items():
        quality = result["quality"] if "quality" in result else result
        spectra = pd.DataFrame(quality["spectra"])
        summary = pd.DataFrame(quality["summary"])
        part = summary[summary["rule"] == rule][
            ["rank", "rel_optimum_mean", "rel_residual_mean", "ratio_median", "output_error_mean"]
        ].copy()
        part.insert(0, "model", label)
        part.insert(1, "effective_rank_mean", spectra["effective_rank"].mean())
        part.insert(2, "rank_90_mean", spectra["rank_90"].mean())
        frames.append(part)
    return pd.concat(frames, ignore_index=True)


def quality_frames(quality: dict[str, object]) -> dict[str, pd.DataFrame]:
    """The quality result's tables as DataFrames: rows, summary, by_layer, guards."""
    return {key: pd.DataFrame(quality[key]) for key in ("rows", "summary", "by_layer", "guards")}


def _records(frame: pd.DataFrame) -> list[dict]:
    """DataFrame -> JSON-able records (numpy scalars to Python, NaN to None)."""
    clean = frame.astype(object).where(frame.notna(), None)
    return [
        {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
        for r in clean.to_dict("records")
    ]


# --------------------------------------------------------------------------- every method


@torch.no_grad()
def method_output_errors(
    qkv_per_layer: Sequence[QKV],
    method: str,
    options: dict[str, object] | None = None,
    ranks: Sequence[int] = (16, 64, 128),
    seeds: int = 5,
    seed: int = 0,
) -> list[dict[str, object]]:
    """Relative output error of any registered method against exact SDPA, per rank.

    For each rank r the method is built from ``options`` with ``rank=r`` (for RPKA-like
    methods: landmarks; Nystromformer: segments; Performer: random features), ``seeds``
    times with a fresh seeded generator where it takes one (new pivots / features each time;
    a deterministic method gives the same error every time), and applied to every layer's
    inputs in float64, so that the error measures the approximation, not round-off. The
    error of one (seed, item, head) is ``|O_hat - O|_F / |O|_F`` over its (n, d_v) output.

    Args:
        qkv_per_layer: one ``(q, k, v)`` per layer, each (B, H, n, d), as fed to the
            attention (e.g. ``TransformerTiny.attention_inputs`` of a trained model).
        method, options: the method as a bench arm has it (``rank`` is replaced).
        ranks: ranks compared (a method caps a rank above its number of points itself).

    Returns JSON-able rows, one per rank: ``rank``, ``n`` (layers x items x heads x seeds)
    and the spread of the error (``error_mean``, ``_sd``, ``_min``, ``_q10``, ``_median``,
    ``_q90``, ``_max``).
    """
    _check_layers(qkv_per_layer)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    if not ranks or any(not isinstance(r, int) or isinstance(r, bool) or r < 1 for r in ranks):
        raise ValueError(f"ranks must be positive integers, got {list(ranks)}")
    takes = options_of(method)  # raises ValueError for an unknown method
    base = {k: v for k, v in (options or {}).items() if k not in ("rank", "generator")}
    inputs = [tuple(x.to(torch.float64) for x in qkv) for qkv in qkv_per_layer]
    exact = [build("exact")(*qkv) for qkv in inputs]
    rows = []
    for rank in ranks:
        errors = []
        for s in range(seeds):
            extra = {"rank": rank} if "rank" in takes else {}
            if "generator" in takes:
                extra["generator"] = torch.Generator().manual_seed(seed + 1000 * rank + s)
            attn = build(method, **base, **extra)  # fresh: new draws, empty caches
            for (q, k, v), ref in zip(inputs, exact, strict=True):
                out = attn(q, k, v)
                err = (out - ref).pow(2).sum((-2, -1)).sqrt() / ref.pow(2).sum((-2, -1)).sqrt()
                errors.append(err.flatten())
        values = torch.cat(errors).cpu().numpy()
        rows.append({"rank": int(rank), "n": int(values.size), **_spread(values, "error")})
    return rows


# --------------------------------------------------------------------------- the study


def mechanism_study(
    qkv_per_layer: Sequence[QKV],
    config: MechanismConfig | None = None,
    progress: bool = True,
    **options: object,
) -> dict[str, object]:
    """Trace identity and approximation quality for one model's attention inputs.

    Args:
        qkv_per_layer: one ``(q, k, v)`` per layer, each (B, H, n, d) exactly as fed to the
            attention (unscaled; RPKA and SDPA scale internally).
        config: a :class:`MechanismConfig`; ``options`` override its fields.

    Returns a JSON-able dict: ``config``, ``mechanism_signature`` (bench_report.json's keys,
    ``trained_model`` for the caller to fill), ``trace_identity`` (per-head per-step arrays),
    ``quality`` (see :func:`approximation_quality`), ``timings_s`` and the environment.
    Call it once for a trained and once for a freshly initialised model.
    """
    config = config or MechanismConfig()
    if options:
        unknown = sorted(set(options) - set(asdict(config)))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; valid: {sorted(asdict(config))}")
        config = MechanismConfig(**{**asdict(config), **options})
    config.validate()
    _check_layers(qkv_per_layer)
    config = resolve_monte_carlo(config, qkv_per_layer[0][0].device)
    identity = trace_identity_study(qkv_per_layer, config, progress)
    quality = approximation_quality(qkv_per_layer, config, progress)
    q = qkv_per_layer[0][0]
    return {
        "config": config.to_dict(),
        "mechanism_signature": identity["signature"],
        "trace_identity": identity["heads"],
        "quality": quality,
        "timings_s": {"trace_identity": identity["seconds"], "quality": quality["seconds"]},
        "shape": {"layers": len(qkv_per_layer), "batch_heads_n_d": list(q.shape)},
        "device": str(q.device),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


__all__ = [
    "MechanismConfig",
    "PREDICTION",
    "approximation_quality",
    "compare_models",
    "layer_quality",
    "mechanism_study",
    "method_output_errors",
    "optimal_trace_error",
    "pivot_points",
    "pivoted_matrix",
    "quality_frames",
    "schur_step",
    "signature",
    "spectrum_summary",
    "summarise",
    "trace_identity",
    "trace_identity_study",
]
