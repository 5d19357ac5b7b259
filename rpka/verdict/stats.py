"""Per-arm summaries, paired comparisons and the decision rule (docs/design.md section 5,
``docs/statistics.md``).

The tests come from ``scipy.stats`` (t, Wilcoxon, binomial, chi-square, normal) and from
``rpka.verdict.significance`` (what scipy lacks or cannot run at our sizes: the sign-flip
permutation p, the rule's minimum detectable effect, Holm's step-down adjustment; and
TOST); this module puts them together into a comparison and its verdict.

Conventions: ``diff = idea - baseline`` per seed. With ``metric_direction="lower"``
(MSE, perplexity) the idea wins a seed when ``diff < 0``; with ``"higher"`` when
``diff > 0``. Pairs where either metric is not finite (a diverged run) are left out of
the tests and counted in ``n_diverged`` (alias ``n_excluded``); with fewer than 2
finite pairs left the comparison is ``inconclusive`` with NaN statistics and a note.
Verdicts: ``VERDICTS`` only; never "no effect".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from rpka.config.concerns import GATE_MIN_REL
from rpka.verdict.significance import (
    ALPHA,
    EXACT_FLIP_MAX_N,
    POWER,
    check_unit,
    holm,
    rule_can_reject,  # noqa: F401 - read as stats.rule_can_reject (rpka.report)
    rule_mde,
    seeds_for_margin,
    sign_flip_floor,
    sign_flip_pvalue,
    tost,
)

LOSO_MAX_N = 40  # leave-one-seed-out up to this many pairs
LOSO_RESAMPLES = 10_000  # Monte Carlo flips per leave-one-out refit when n - 1 > 20
DIRECTIONS = ("lower", "higher")
VERDICTS = ("significant win", "significant loss", "equivalent", "inconclusive", "uninformative")
ZERO_VARIANCE_NOTE = (
    "the differences have zero variance: t CI degenerate [d, d], t-test, TOST and MDE "
    "undefined (NaN); the verdict rests on the sign-flip test alone"
)


def _as_array(values: Sequence[float], name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-d sequence of numbers, got {values!r}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-d sequence of numbers, got shape {arr.shape}")
    return arr


def _nan_if_degenerate(x: float) -> float:
    return float(x) if np.isfinite(x) else float("nan")


def _sign(metric_direction: str) -> float:
    """+1 when a positive diff is an improvement, -1 when a negative one is."""
    if metric_direction not in DIRECTIONS:
        raise ValueError(f"metric_direction must be one of {DIRECTIONS}, got {metric_direction!r}")
    return -1.0 if metric_direction == "lower" else 1.0


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


# --- the verdict -----------------------------------------------------------------------


def verdict_of(
    p_adjusted: float, delta_mean: float, tost_p: float, metric_direction: str, alpha: float = ALPHA
) -> str:
    """Significant win/loss when the (adjusted) sign-flip p < alpha; equivalent when TOST
    rejects both sides (tost_p < alpha); otherwise inconclusive. Never "no effect"."""
    if np.isfinite(p_adjusted) and p_adjusted < alpha and delta_mean != 0:
        better = _sign(metric_direction) * delta_mean > 0
        return "significant win" if better else "significant loss"
    if np.isfinite(tost_p) and tost_p < alpha:
        return "equivalent"
    return "inconclusive"


def _detail(c: Mapping[str, Any]) -> str:
    low, high = c["ci_low"], c["ci_high"]
    ci = f"95% CI of the delta [{low:+.4g}, {high:+.4g}]" if np.isfinite(low) else "no CI"
    return f"{c['verdict']} ({ci}, p = {c['p_adjusted']:.3g}, {c['adjustment']})"


def _leave_one_out(
    diffs: np.ndarray,
    sd_floor: float,
    verdict: str,
    alpha_rule: float,
    margin: float | None,
    direction: str,
    seed: int,
) -> dict[str, Any]:
    """Re-decide the verdict without each seed in turn (same level ``alpha_rule``)."""
    n = len(diffs)
    if n > LOSO_MAX_N or n < 3:
        why = f"n = {n} outside 3..{LOSO_MAX_N}"
        return {
            "loso_verdicts": None,
            "verdict_flipped_by_one_seed": None,
            "flipping_seeds": [],
            "loso_method": f"not computed ({why})",
        }
    verdicts = []
    for i in range(n):
        rest = np.delete(diffs, i)
        p, _ = sign_flip_pvalue(rest, seed, n_resamples=LOSO_RESAMPLES)
        verdicts.append(
            verdict_of(
                p, float(rest.mean()), tost(rest, margin, sd_floor)["tost_p"], direction, alpha_rule
            )
        )
    flips = [i for i, v in enumerate(verdicts) if v != verdict]
    return {
        "loso_verdicts": verdicts,
        "verdict_flipped_by_one_seed": bool(flips),
        "flipping_seeds": flips,
        "loso_method": f"each pair dropped in turn, sign-flip p at alpha {alpha_rule:.3g} "
        f"({'exact' if n - 1 <= EXACT_FLIP_MAX_N else f'{LOSO_RESAMPLES} random flips'})",
    }


def _robustness(diffs: np.ndarray) -> dict[str, Any]:
    if not len(diffs):
        return {
            "delta_median": float("nan"),
            "largest_seed": None,
            "largest_seed_delta": None,
            "largest_seed_share": float("nan"),
        }
    i = int(np.argmax(np.abs(diffs)))
    total = float(diffs.sum())
    return {
        "delta_median": float(np.median(diffs)),
        "largest_seed": i,  # position among the used pairs
        "largest_seed_delta": float(diffs[i]),
        "largest_seed_share": float(diffs[i] / total) if total else float("nan"),
    }


def _decide(c: dict[str, Any], alpha_rule: float, seed: int) -> dict[str, Any]:
    """Fill MDE, verdict, its detail and leave-one-seed-out at the rule's level."""
    diffs = np.asarray(c["per_seed_diffs"], dtype=float)
    c.update(rule_mde(c["n_pairs"], c["delta_sd"], alpha_rule, c["mde_power"]))
    base_mean = c["baseline_mean"]
    c["mde_rel_pct"] = _nan_if_degenerate(100 * c["mde"] / abs(base_mean)) if base_mean else None
    c["seeds_for_margin"] = seeds_for_margin(c["delta_sd"], c["margin"], alpha_rule, c["mde_power"])
    tost_p = c.get("tost_p_adjusted", c["tost_p"])
    c["verdict"] = verdict_of(
        c["p_adjusted"], c["delta_mean"], tost_p, c["metric_direction"], c["alpha"]
    )
    c["verdict_detail"] = _detail(c)
    c.update(
        _leave_one_out(
            diffs, c["sd_floor"], c["verdict"], alpha_rule, c["margin"], c["metric_direction"], seed
        )
    )
    return c


# --- the paired comparison ------------------------------------------------------------


def _paired_inputs(
    baseline: Sequence[float],
    idea: Sequence[float],
    margin: float | None,
    alpha: float,
    power: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scores as arrays, shape (n_seeds,), checked, and which pairs the tests use
    (``keep``: both scores and their difference finite)."""
    base, new = _as_array(baseline, "baseline"), _as_array(idea, "idea")
    if base.shape != new.shape:
        raise ValueError(f"baseline and idea must pair up: got {len(base)} and {len(new)} values")
    if len(base) < 2:
        raise ValueError(f"paired_comparison needs at least 2 pairs, got {len(base)}")
    check_unit("alpha", alpha)
    check_unit("power", power)
    if margin is not None and not (np.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a finite number > 0 or None, got {margin!r}")
    # a pair whose difference overflows (e.g. +-1e308) is as diverged as a non-finite score:
    # left out, never a p of 0
    with np.errstate(over="ignore", invalid="ignore"):
        keep = np.isfinite(base) & np.isfinite(new) & np.isfinite(new - base)
    return base, new, keep


def _spread(base: np.ndarray, new: np.ndarray, diffs: np.ndarray) -> tuple[float, float]:
    """The sd of the differences (ddof=1; 0 at the round-off of the inputs) and that
    round-off floor."""
    n = len(diffs)
    sd = float(np.std(diffs, ddof=1)) if n > 1 else float("nan")
    # an sd at the round-off of the inputs (e.g. base + 0.01 - base) counts as zero
    sd_floor = 1e-12 * float(max(np.abs(base).max(), np.abs(new).max())) if n else 0.0
    return (0.0 if sd <= sd_floor else sd), sd_floor


def _notes(keep: np.ndarray, n: int, sd: float) -> list[str]:
    """What the comparison left out or could not compute, in words."""
    notes = []
    if not keep.all():
        notes.append(f"{int((~keep).sum())} diverged pair(s) left out")
    if n < 2:
        notes.append(f"only {n} finite pair(s): no test")
    if n > 1 and not sd > 0:
        notes.append(ZERO_VARIANCE_NOTE)
    return notes


def _t_interval(
    new: np.ndarray, base: np.ndarray, delta: float, sd: float, alpha: float
) -> tuple[float, float, float]:
    """The paired t-interval of the mean difference at 1 - alpha and the t-test's p;
    zero variance: the degenerate interval [d, d] and no p."""
    nan = float("nan")
    if len(new) > 1 and sd > 0:
        ttest = stats.ttest_rel(new, base)
        low, high = (float(x) for x in ttest.confidence_interval(1 - alpha))
        return low, high, float(ttest.pvalue)
    if len(new) > 1:
        return delta, delta, nan
    return nan, nan, nan


def paired_comparison(
    baseline: Sequence[float],
    idea: Sequence[float],
    metric_direction: str = "lower",
    margin: float | None = None,
    alpha: float = ALPHA,
    power: float = POWER,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired comparison of an idea arm against the baseline over shared seeds.

    Args:
        baseline, idea: one metric value per seed, same seed order, shape (n_seeds,).
        metric_direction: ``"lower"`` (e.g. MSE) or ``"higher"`` is better.
        margin: equivalence margin (metric units, > 0) for TOST; None: no equivalence.

    Returns a JSON-able dict (keys in ``docs/bench_report.md``). ``p_value``: two-sided
    sign-flip p (unadjusted; the primary's test); ``p_adjusted``/``verdict`` are
    unadjusted here, :func:`apply_holm` adjusts the secondary family and
    :func:`apply_gate` may turn the verdict ``uninformative``.
    """
    sign = _sign(metric_direction)
    base, new, keep = _paired_inputs(baseline, idea, margin, alpha, power)
    base, new = base[keep], new[keep]
    diffs = new - base
    n = len(diffs)
    sd, sd_floor = _spread(base, new, diffs)
    delta = float(np.mean(diffs)) if n else float("nan")
    ci_low, ci_high, ttest_p = _t_interval(new, base, delta, sd, alpha)
    wilcoxon_p = float("nan")
    if n > 1 and np.any(diffs != 0):
        wilcoxon_p = float(stats.wilcoxon(new, base).pvalue)
    p_value, p_method = sign_flip_pvalue(diffs, seed) if n > 1 else (float("nan"), "no test")
    wins = int(np.sum(sign * diffs > 0))
    wins_ci = stats.binomtest(wins, n).proportion_ci(1 - alpha, "exact") if n else None
    base_mean = float(np.mean(base)) if n else float("nan")
    halfwidth = (ci_high - ci_low) / 2
    comparison = {
        "metric_direction": metric_direction,
        "n_pairs": n,
        "n_excluded": int(np.sum(~keep)),
        "n_diverged": int(np.sum(~keep)),
        "diverged_positions": np.flatnonzero(~keep).tolist(),
        "per_seed_diffs": diffs.tolist(),
        "baseline_mean": base_mean,
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
        "ties": int(np.sum(diffs == 0)),
        "wins_ci_low": float(wins_ci.low) if wins_ci else float("nan"),
        "wins_ci_high": float(wins_ci.high) if wins_ci else float("nan"),
        "d_z": _nan_if_degenerate(delta / sd) if n > 1 and sd > 0 else float("nan"),
        "alpha": alpha,
        "mde_power": power,
        "sd_floor": sd_floor,
        **tost(diffs, margin, sd_floor),
        **_robustness(diffs),
        "p_adjusted": p_value,
        "adjustment": "none",
        "notes": _notes(keep, n, sd),
    }
    return _decide(comparison, alpha, seed)


def apply_holm(
    comparisons: dict[str, dict], alpha: float = ALPHA, primary: str | None = None, seed: int = 0
) -> dict[str, dict]:
    """Holm-adjust ``p_value`` (and ``tost_p``) over the secondary family; re-decide.

    ``primary``: the pre-registered primary arm, left unadjusted and out of the family;
    None puts every arm in the family. The MDE of a secondary arm uses alpha / m (Holm's
    worst case: the first step of m), and so does its leave-one-seed-out check.
    """
    family = [name for name in comparisons if name != primary]
    adjusted = holm([comparisons[name]["p_value"] for name in family])
    tost_adjusted = holm([comparisons[name]["tost_p"] for name in family])
    for name, p_adj, tost_adj in zip(family, adjusted, tost_adjusted, strict=True):
        c = comparisons[name]
        c.update(
            p_adjusted=p_adj,
            tost_p_adjusted=tost_adj,
            alpha=alpha,
            adjustment=f"Holm over {len(family)} comparison(s)",
        )
        _decide(c, alpha / len(family), seed)
    if primary is not None and primary in comparisons:
        comparisons[primary]["adjustment"] = "none (pre-registered primary)"
        comparisons[primary]["verdict_detail"] = _detail(comparisons[primary])
    return comparisons


# --- attention gate -------------------------------------------------------------------


def attention_gate(
    exact: Sequence[float],
    control: Sequence[float],
    metric_direction: str = "lower",
    min_rel: float = GATE_MIN_REL,
    alpha: float = ALPHA,
    seed: int = 0,
) -> dict[str, Any]:
    """Does the track need attention? The control (e.g. ``mean-attention``) must be worse
    than exact by at least ``min_rel`` of exact's mean AND the one-sided paired sign-flip
    p (control worse) must be < alpha. Non-finite pairs are left out (a diverged control
    counts as no evidence)."""
    sign = _sign(metric_direction)
    ex, ctl = _as_array(exact, "exact"), _as_array(control, "control")
    if ex.shape != ctl.shape:
        raise ValueError(f"exact and control must pair up: got {len(ex)} and {len(ctl)} values")
    if len(ex) < 2:
        raise ValueError(f"attention_gate needs at least 2 pairs, got {len(ex)}")
    if not (np.isfinite(min_rel) and min_rel >= 0):
        raise ValueError(f"min_rel must be a finite number >= 0, got {min_rel!r}")
    check_unit("alpha", alpha)
    keep = np.isfinite(ex) & np.isfinite(ctl)
    ex, ctl = ex[keep], ctl[keep]
    worse = -sign * (ctl - ex)  # > 0 where the control is worse than exact
    delta = float(np.mean(ctl - ex)) if len(ex) else float("nan")
    rel = float(-sign * delta / abs(np.mean(ex))) if len(ex) and np.mean(ex) else float("nan")
    p, how = sign_flip_pvalue(worse, seed, alternative="greater")
    floor = sign_flip_floor(len(worse), "greater")
    return {
        "passed": bool(np.isfinite(rel) and rel >= min_rel and p < alpha),
        "control_delta": delta,
        "control_rel": rel,
        "p_value": float(p),
        "p_value_method": f"one-sided (control worse) sign-flip, {how}",
        "p_floor": floor,
        "rule_can_pass": bool(floor < alpha),
        "n_pairs": int(len(worse)),
        "n_diverged": int(np.sum(~keep)),
        "rule": f"passed when the control is worse than exact by >= {min_rel:.0%} of exact's "
        f"mean and the one-sided paired sign-flip p < {alpha:g}",
    }


def apply_gate(comparison: dict[str, Any], gate: Mapping[str, Any]) -> dict[str, Any]:
    """Turn the verdict ``uninformative`` when the track failed its attention gate."""
    comparison["gate_passed"] = bool(gate["passed"])
    comparison["verdict_before_gate"] = comparison["verdict"]
    if not gate["passed"]:
        comparison["verdict"] = "uninformative"
        comparison["verdict_detail"] = (
            f"uninformative (attention gate failed: {gate['rule']}); without the gate: "
            f"{comparison['verdict_before_gate']}"
        )
    return comparison


# --- mechanism pooling ----------------------------------------------------------------


def pooled_z(z_scores_by_seed: Sequence[Sequence[float]], alpha: float = ALPHA) -> dict[str, Any]:
    """Pool the mechanism's z-scores over Monte Carlo seeds (docs/design.md section 5.6).

    chi2 = sum z^2 ~ chi2(count) (``scipy.stats.chi2.sf``) detects any miscalibration;
    Stouffer Z = sum z / sqrt(count) ~ N(0, 1) detects a consistent bias. ``confirmed``
    when neither rejects at alpha / 2 (Bonferroni over the two). Non-finite z are left out
    and counted. ``detectable_bias_se`` is the mean bias per step (in SE) that Stouffer
    detects with 80 % power.
    """
    check_unit("alpha", alpha)
    z = np.concatenate([np.ravel(np.asarray(s, dtype=float)) for s in z_scores_by_seed] or [[]])
    finite = z[np.isfinite(z)]
    count = len(finite)
    if count == 0:
        raise ValueError("pooled_z needs at least one finite z-score")
    chi2 = float(np.sum(finite**2))
    stouffer = float(np.sum(finite) / math.sqrt(count))
    chi2_p = float(stats.chi2.sf(chi2, count))
    stouffer_p = float(2 * stats.norm.sf(abs(stouffer)))
    level = alpha / 2
    return {
        "n_seeds": len(z_scores_by_seed),
        "count": count,
        "n_nonfinite": int(len(z) - count),
        "chi2": chi2,
        "chi2_df": count,
        "chi2_p": chi2_p,
        "stouffer_z": stouffer,
        "stouffer_p": stouffer_p,
        "alpha": alpha,
        "confirmed": bool(chi2_p >= level and stouffer_p >= level),
        "detectable_bias_se": float(
            (stats.norm.isf(level / 2) + stats.norm.ppf(POWER)) / math.sqrt(count)
        ),
        "rule": f"confirmed when neither the chi-square of sum z^2 nor Stouffer's sum z / "
        f"sqrt(n) rejects at {level:g} (alpha {alpha:g} / 2 tests)",
    }
