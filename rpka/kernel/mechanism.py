"""The mechanism signature of RPCholesky and the approximation quality around it.

docs/design.md section 3. Two measurements on the query/key tensors a model feeds its attention.

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

The pivoted matrix (``rpka.kernel.matrix``) is built exactly as
:class:`rpka.attention.rpka.RPKAttention` builds it:
``q~ = q d^{-1/4}``, keys centred then scaled, pivot set joint ``[q~; k~]`` or keys only,
``A_tau = D^tau G D^tau`` with the Gaussian ``G`` and ``D = diag(e^{|z|^2/2})``. Traces are in
the package's units: ``A_tau`` divided by ``max_i e^{tau |z_i|^2}`` (1 for ``gauss``), to
which (*) is invariant; plots and tables use fractions of ``tr A_tau``.

Everything returned is plain JSON-able data (lists, floats, ints, strings);
:func:`quality_frames` turns the quality part into pandas DataFrames.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import Tensor
from tqdm import tqdm  # plain text bars: no ipywidgets needed in notebooks

from rpka.attention.rpcholesky import rpcholesky, select_pivot
from rpka.config.bench import MechanismConfig
from rpka.kernel.matrix import pivot_points, pivoted_matrix, schur_step
from rpka.verdict.stats import pooled_z

QKV = tuple[Tensor, Tensor, Tensor]

PREDICTION = (
    "One RPCholesky step from residual R, with pivot s drawn with probability R_ss / tr R, "
    "decreases the residual trace by ||R||_F^2 / tr R in expectation (docs/design.md section 3)."
)
OBSERVED_DEFINITION = (
    "predicted and observed are sums over the run's steps t = 0..rank-1 of ||R_t||_F^2 / tr R_t "
    "and of the Monte Carlo mean one-step decrease, for the studied head with the largest "
    "max |z|; relative_error = |observed - predicted| / predicted. Units: fraction of the "
    "initial trace tr A_tau."
)


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


LOG_BAR_INTERVAL_S = 60.0  # a bar's redraw interval where stderr is not a terminal


def progress_bar(total: int, desc: str, progress: bool) -> tqdm:
    """A tqdm bar; where stderr is not a terminal (a log file, a notebook's captured
    stream) it redraws once a minute, not ten times a second: every redraw there is a new
    line of the log."""
    interval = 0.1 if sys.stderr.isatty() else LOG_BAR_INTERVAL_S
    return tqdm(total=total, desc=desc, disable=not progress, mininterval=interval)


@torch.no_grad()
def trace_identity(
    points: Tensor, config: MechanismConfig, progress: bool = False, bar: tqdm | None = None
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
        skipped a step (residual exhausted). ``bar``: a bar to advance by one per step
        (the study's one bar over its Monte Carlo seeds) instead of a bar of its own.
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

    own = bar is None
    if bar is None:
        bar = progress_bar(steps, "trace identity", progress)
    for t in range(steps):
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
        bar.update(1)
    if own:
        bar.close()

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


def select_indices(count: int, chosen: Sequence[int] | None, name: str) -> list[int]:
    if chosen is None:
        return list(range(count))
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise ValueError(f"{name} must lie in [0, {count - 1}], got {list(chosen)}")
    return list(chosen)


def check_layers(qkv_per_layer: Sequence[QKV]) -> None:
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
    check_layers(qkv_per_layer)
    config = resolve_monte_carlo(config, qkv_per_layer[0][0].device)
    layers = select_indices(len(qkv_per_layer), config.layers, "layers")
    batch, n_heads = qkv_per_layer[0][0].shape[:2]
    heads = select_indices(n_heads, config.heads, "heads")
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
    # one run per Monte Carlo seed; the first is shown per step, all are pooled to decide
    # one bar for every seed's steps (a bar per seed was that many bars in a log)
    steps = min(config.rank, points.shape[-2])
    desc = f"trace identity ({config.mc_seeds} Monte Carlo seeds)"
    with progress_bar(config.mc_seeds * steps, desc, progress) as bar:
        runs = [
            trace_identity(points, replace(config, seed=config.seed + i), bar=bar)
            for i in range(config.mc_seeds)
        ]
    result = runs[0]
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
    pooled = pooled_z([run["z"].ravel() for run in runs])
    return {
        "seconds": seconds,
        "heads": per_head,
        "signature": signature(per_head, config, pooled),
    }


def signature(
    per_head: Sequence[dict], config: MechanismConfig, pooled: dict[str, Any] | None = None
) -> dict[str, object]:
    """The ``mechanism_signature`` block of bench_report.json (docs/design.md section 5).

    ``predicted``/``observed`` come from the head with the largest max |z| (the worst case)
    of the first Monte Carlo seed. ``confirmed`` is the pooled decision over every seed's
    z-scores (``pooled``, ``rpka.verdict.stats.pooled_z``: neither the chi-square of sum z^2 nor
    Stouffer's sum z rejects) - a per-step ``|z| <= z_threshold`` rule would pass a bias of
    several standard errors at every step; it stays as a display (``per_step_rule_met``).
    Without ``pooled`` the first seed's z-scores are pooled. ``trained_model`` is left for
    the caller to fill.
    """
    z = np.concatenate([np.asarray(h["z"], dtype=float) for h in per_head])
    worst = max(per_head, key=lambda h: h["max_abs_z"])
    n_tests = int(z.size)
    finite = np.isfinite(z)
    chi2_p = (
        float(stats.chi2.sf(float((z[finite] ** 2).sum()), int(finite.sum()))) if n_tests else None
    )
    threshold = config.z_threshold
    pooled = pooled or pooled_z([z])
    return {
        "prediction": PREDICTION,
        "predicted": worst["predicted_sum"],
        "observed": worst["observed_sum"],
        "observed_se": worst["observed_sum_se"],
        "relative_error": worst["relative_error"],
        "confirmed": pooled["confirmed"],
        "confirmation_rule": (
            f"{pooled['rule']}, over the z-scores of every step of every studied head and "
            f"{pooled['n_seeds']} Monte Carlo seed(s); z = (Monte Carlo mean - predicted) / "
            f"sample standard error of the mean of {config.draws} independent one-step draws "
            f"by the package's rule (monte_carlo={config.monte_carlo!r}, "
            f"candidate_decreases={config.candidate_decreases!r})"
        ),
        "per_step_rule_met": bool(n_tests > 0 and np.all(np.abs(z) <= threshold)),
        "pooled": pooled,
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


__all__ = [
    "MechanismConfig",
    "PREDICTION",
    "check_layers",
    "select_indices",
    "signature",
    "trace_identity",
    "trace_identity_study",
]
