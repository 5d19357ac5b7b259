"""Per-arm summaries and paired comparisons of evaluation seeds (DESIGN.md section 5).

Every test comes from ``scipy.stats``; only Holm's step-down adjustment and the
minimum-detectable-effect search are written here (scipy has neither).

Conventions: ``diff = idea - baseline`` per seed. With ``metric_direction="lower"``
(MSE, perplexity) the idea wins a seed when ``diff < 0``; with ``"higher"`` when
``diff > 0``. Pairs where either metric is not finite (a diverged run) are left out of
the tests and counted in ``n_excluded``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.80
EXACT_FLIP_MAX_N = 20  # all 2^n sign flips up to here, Monte Carlo resamples beyond
N_RESAMPLES = 100_000
DIRECTIONS = ("lower", "higher")


def _as_array(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-d sequence of numbers, got shape {arr.shape}")
    return arr


def _nan_if_degenerate(x: float) -> float:
    return float(x) if np.isfinite(x) else float("nan")


def summarize(values: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """Mean, sd (ddof=1), median, IQM and the t-interval of the mean, over finite values.

    ``n_nonfinite`` counts values left out (diverged runs).
    """
    arr = _as_array(values, "values")
    finite = arr[np.isfinite(arr)]
    n = len(finite)
    out = {
        "n": n,
        "n_nonfinite": int(len(arr) - n),
        "mean": float(np.mean(finite)) if n else float("nan"),
        "sd": float(np.std(finite, ddof=1)) if n > 1 else float("nan"),
        "median": float(np.median(finite)) if n else float("nan"),
        # interquartile mean: the mean of the middle 50 % (Agarwal et al. 2021)
        "iqm": float(stats.trim_mean(finite, 0.25)) if n else float("nan"),
        "ci_low": float("nan"),
        "ci_high": float("nan"),
        "confidence": confidence,
    }
    if n > 1 and out["sd"] > 0:
        low, high = stats.ttest_1samp(finite, 0.0).confidence_interval(confidence)
        out["ci_low"], out["ci_high"] = float(low), float(high)
    elif n > 1:
        out["ci_low"] = out["ci_high"] = out["mean"]
    return out


def sign_flip_pvalue(diffs: np.ndarray, seed: int = 0) -> tuple[float, str]:
    """Two-sided sign-flip permutation p-value of mean(diffs) = 0.

    Exact (all 2^n flips) for n <= 20, else ``N_RESAMPLES`` random flips.
    Returns (p, description of how it was computed).
    """
    n = len(diffs)
    if n == 0 or np.all(diffs == 0):
        return float("nan") if n == 0 else 1.0, "degenerate"
    exact = n <= EXACT_FLIP_MAX_N
    res = stats.permutation_test(
        (diffs,),
        np.mean,
        permutation_type="samples",  # one sample: the null flips each sign independently
        n_resamples=np.inf if exact else N_RESAMPLES,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    how = f"exact, all 2^{n} sign flips" if exact else f"{N_RESAMPLES} random sign flips"
    return float(res.pvalue), how


def paired_t_power(effect_size: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at standardised effect d_z (noncentral t)."""
    df = n - 1
    t_crit = stats.t.ppf(1 - alpha / 2, df)
    nc = effect_size * math.sqrt(n)
    # P(T > t) + P(T < -t); the lower tail as sf at -nc (symmetry), because scipy's
    # nct.cdf returns NaN far in the tail
    return float(stats.nct.sf(t_crit, df, nc) + stats.nct.sf(t_crit, df, -nc))


def minimum_detectable_effect(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest d_z the two-sided paired t-test detects with the given power (n pairs).

    Multiply by the sd of the differences for the MDE in the metric's units. This is NOT
    the half-width of a confidence interval (that is ``ci_halfwidth``).
    """
    if n < 2:
        return float("nan")
    high = 1.0
    while paired_t_power(high, n, alpha) < power:  # power rises with the effect size
        high *= 2
    return float(optimize.brentq(lambda d: paired_t_power(d, n, alpha) - power, 1e-9, high))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979); NaN stays NaN and is not counted."""
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full_like(p, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, (m - rank) * p[i])  # monotone step-down
        adjusted[i] = min(1.0, running)
    return adjusted.tolist()


def verdict_text(
    p_adjusted: float,
    delta_mean: float,
    ci: tuple[float, float],
    metric_direction: str = "lower",
    alpha: float = ALPHA,
) -> str:
    """ "significant win/loss" only when the adjusted p < alpha; else "inconclusive"."""
    if np.isfinite(p_adjusted) and p_adjusted < alpha:
        better = delta_mean < 0 if metric_direction == "lower" else delta_mean > 0
        return "significant win" if better else "significant loss"
    low, high = ci
    if np.isfinite(low) and np.isfinite(high):
        return f"inconclusive (95% CI of the delta [{low:+.4g}, {high:+.4g}])"
    return "inconclusive"


def paired_comparison(
    baseline: Sequence[float],
    idea: Sequence[float],
    metric_direction: str = "lower",
    alpha: float = ALPHA,
    power: float = POWER,
    seed: int = 0,
) -> dict[str, object]:
    """Paired comparison of an idea arm against the baseline over shared seeds.

    Args:
        baseline, idea: one metric value per seed, same seed order (the pair shares data
            order and initialisation).
        metric_direction: ``"lower"`` (e.g. MSE) or ``"higher"`` is better.

    Returns a JSON-able dict. ``p_value`` is the exact two-sided sign-flip permutation
    p (primary test); ``wilcoxon_p`` and ``ttest_p`` are checks. ``mde`` is the minimum
    detectable |delta| at ``alpha`` and ``power`` (noncentral t, paired two-sided t-test),
    ``ci_halfwidth`` the half-width of the t CI of the mean delta. ``p_adjusted`` and the
    ``verdict`` are unadjusted here; :func:`apply_holm` adjusts them across arms.
    """
    if metric_direction not in DIRECTIONS:
        raise ValueError(f"metric_direction must be one of {DIRECTIONS}, got {metric_direction!r}")
    base = _as_array(baseline, "baseline")
    new = _as_array(idea, "idea")
    if base.shape != new.shape:
        raise ValueError(f"baseline and idea must pair up: got {len(base)} and {len(new)} values")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must lie in (0, 1), got {alpha}, {power}")
    keep = np.isfinite(base) & np.isfinite(new)
    base, new = base[keep], new[keep]
    diffs = new - base
    n = len(diffs)
    sign = -1.0 if metric_direction == "lower" else 1.0
    wins = int(np.sum(sign * diffs > 0))
    ties = int(np.sum(diffs == 0))
    sd = float(np.std(diffs, ddof=1)) if n > 1 else float("nan")
    delta = float(np.mean(diffs)) if n else float("nan")

    ci_low = ci_high = ttest_p = float("nan")
    if n > 1 and sd > 0:
        ttest = stats.ttest_rel(new, base)
        ci_low, ci_high = (float(x) for x in ttest.confidence_interval(1 - alpha))
        ttest_p = float(ttest.pvalue)
    wilcoxon_p = float("nan")
    if n > 0 and np.any(diffs != 0):
        wilcoxon_p = float(stats.wilcoxon(new, base).pvalue)
    p_value, p_method = sign_flip_pvalue(diffs, seed)
    if n:
        wins_ci = stats.binomtest(wins, n).proportion_ci(1 - alpha, method="exact")
        wins_ci_low, wins_ci_high = float(wins_ci.low), float(wins_ci.high)
    else:
        wins_ci_low = wins_ci_high = float("nan")
    mde_dz = minimum_detectable_effect(n, alpha, power)
    mde = mde_dz * sd if n > 1 else float("nan")
    base_mean = float(np.mean(base)) if n else float("nan")
    halfwidth = (ci_high - ci_low) / 2
    return {
        "metric_direction": metric_direction,
        "n_pairs": n,
        "n_excluded": int(np.sum(~keep)),
        "per_seed_diffs": diffs.tolist(),
        "delta_mean": delta,
        "delta_sd": sd,
        "delta_rel_pct": _nan_if_degenerate(100 * delta / abs(base_mean)) if base_mean else None,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "ci_halfwidth": halfwidth,
        "ci_halfwidth_rel_pct": _nan_if_degenerate(100 * halfwidth / abs(base_mean))
        if base_mean
        else None,
        "p_value": p_value,
        "p_value_method": p_method,
        "wilcoxon_p": wilcoxon_p,
        "ttest_p": ttest_p,
        "idea_wins": wins,
        "ties": ties,
        "wins_ci_low": wins_ci_low,
        "wins_ci_high": wins_ci_high,
        "d_z": _nan_if_degenerate(delta / sd) if n > 1 and sd > 0 else float("nan"),
        "mde": mde,
        "mde_dz": mde_dz,
        "mde_rel_pct": _nan_if_degenerate(100 * mde / abs(base_mean)) if base_mean else None,
        "mde_alpha": alpha,
        "mde_power": power,
        "p_adjusted": p_value,
        "adjustment": "none",
        "verdict": verdict_text(p_value, delta, (ci_low, ci_high), metric_direction, alpha),
    }


def apply_holm(comparisons: dict[str, dict], alpha: float = ALPHA) -> dict[str, dict]:
    """Holm-adjust ``p_value`` across arms; fills ``p_adjusted`` and re-words ``verdict``."""
    names = list(comparisons)
    adjusted = holm([comparisons[name]["p_value"] for name in names])
    for name, p_adj in zip(names, adjusted, strict=True):
        c = comparisons[name]
        c["p_adjusted"] = p_adj
        c["adjustment"] = f"Holm over {len(names)} comparison(s)"
        c["verdict"] = verdict_text(
            p_adj, c["delta_mean"], (c["ci_low"], c["ci_high"]), c["metric_direction"], alpha
        )
    return comparisons
