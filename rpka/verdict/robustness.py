"""How much a long-range verdict rests on one seed, an interval that agrees with its test,
and the study's answer (issue 40; docs/statistics.md).

For each arm of a long-range length, with the per-seed gap recovered g_s (``rpka.verdict.frontier``)
and the per-seed metric differences d_s = arm_s - exact_s:

* **leave one seed out** (one drop per evaluation seed): the non-inferiority verdict of the
  gap (``rpka.verdict.decision.gap_recovered``: the one-sided t-test of mean g above the
  margin) re-decided without each seed, and the range of its one-sided 95 % lower bound
  ``loo_ci_low_min`` / ``loo_ci_low_max`` - the bound that test compares with the margin
  (non-inferior exactly when it exceeds the margin); and
  the range of the primary p (the bench's two-sided sign-flip p of d) ``loo_p_min`` /
  ``loo_p_max``. The verdict is **robust** only if every drop gives the same verdict; the
  seeds whose drop changes it are ``rests_on_seeds`` ("rests on seed s").
* **an interval that agrees with the sign-flip test**: ``signflip_ci``, the shifts delta of
  d that the two-sided sign-flip test does not reject at alpha (the test inverted, its end
  points found by bisection): 0 lies outside it exactly where the test's p < alpha,
  which the bench's t-interval does not promise. The sign-flip p decides the bench's
  verdict; the interval is the same test, read as an interval.

**Cheaper**: ``rpka.verdict.decision.is_cheaper`` on a CPU-time step ratio to exact
(``rpka.study.steptime``, the only source of cost ratios). **The answer**
(:func:`longrange_answer`): per length the
cheapest robustly non-inferior arm (positive control excluded) and its step ratio; **n\\***
per method (RPKA, uniform landmarks), the shortest length at which some rank of it is
robustly non-inferior *and* cheaper, or None ("not reached").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from rpka.config.presets_longctx import ANSWER_METHODS
from rpka.verdict.decision import CHEAPER_RATIO_MAX, CHEAPER_UPPER_MAX, NON_INFERIOR, is_cheaper
from rpka.verdict.significance import ALPHA, sign_flip_pvalue

BISECTION_STEPS = 32  # the sign-flip interval's end points to ~2^-32 of the data's span


def one_sided_lower(values: np.ndarray, alpha: float = ALPHA) -> float | None:
    """The one-sided (1 - alpha) t lower bound of the mean (None: < 2 finite values)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2 or np.isnan(values).any():
        return None
    n = len(values)
    return float(values.mean() - stats.t.ppf(1 - alpha, n - 1) * values.std(ddof=1) / np.sqrt(n))


def signflip_interval(
    diffs: Sequence[float], alpha: float = ALPHA, seed: int = 0
) -> dict[str, Any]:
    """The two-sided sign-flip test of mean(d) = delta, inverted: the shifts it does not
    reject at ``alpha`` ({"low", "high"}; None where it cannot reject on that side with
    this many pairs, or fewer than 2 pairs)."""
    d = np.asarray([x for x in diffs if x is not None and np.isfinite(x)], dtype=float)
    out: dict[str, Any] = {"alpha": alpha, "low": None, "high": None,
                           "method": "two-sided sign-flip test inverted (bisection)"}  # fmt: skip
    if len(d) < 2:
        return out
    center, span = float(d.mean()), float(np.ptp(d)) or float(abs(d).max()) or 1.0

    def accepts(delta: float) -> bool:
        return sign_flip_pvalue(d - delta, seed)[0] >= alpha

    for side, far in (("low", float(d.min()) - span), ("high", float(d.max()) + span)):
        if accepts(far):  # the floor of the test's p is >= alpha: no bound
            continue
        inside, outside = center, far
        for _ in range(BISECTION_STEPS):
            mid = (inside + outside) / 2
            inside, outside = (mid, outside) if accepts(mid) else (inside, mid)
        out[side] = inside
    return out


def arm_robustness(
    gap: Sequence[float],
    diffs: Sequence[float],
    seeds: Sequence[int],
    decide: Callable[[np.ndarray], Mapping[str, Any]],
    alpha: float = ALPHA,
) -> dict[str, Any]:
    """Leave-one-seed-out robustness of one arm (module docstring): ``gap`` the per-seed
    gap recovered, ``diffs`` arm - exact per seed, ``seeds`` their ids, ``decide`` the
    frontier's rule on a gap array (``rpka.verdict.frontier.gap_recovered``)."""
    g = np.asarray([np.nan if x is None else x for x in gap], dtype=float)
    d = np.asarray([np.nan if x is None else x for x in diffs], dtype=float)
    if not len(g) == len(d) == len(seeds):
        raise ValueError(f"gap, diffs and seeds must pair up: {len(g)}, {len(d)}, {len(seeds)}")
    verdict = decide(g)["verdict"]
    drops = [np.delete(np.arange(len(g)), i) for i in range(len(g))]
    loo_verdicts = [decide(g[keep])["verdict"] for keep in drops]
    lows = [one_sided_lower(g[keep], alpha) for keep in drops]
    pvalues = [_p(d[keep]) for keep in drops]
    finite_lows = [x for x in lows if x is not None]
    finite_p = [p for p in pvalues if p is not None]
    rests_on = [int(seeds[i]) for i, v in enumerate(loo_verdicts) if v != verdict]
    return {
        "verdict": verdict,
        "robust": bool(len(g) >= 3 and not rests_on),
        "rests_on_seeds": rests_on,
        "ci_low_one_sided": one_sided_lower(g, alpha),
        "loo_ci_low_min": min(finite_lows, default=None),
        "loo_ci_low_max": max(finite_lows, default=None),
        "p_primary": _p(d),
        "loo_p_min": min(finite_p, default=None),
        "loo_p_max": max(finite_p, default=None),
        "signflip_ci": signflip_interval(d[np.isfinite(d)], alpha),
        "decided_by": "non-inferiority: one-sided t-test of the mean gap recovered against "
        "the margin (its one-sided lower bound); the comparison with exact: two-sided "
        "sign-flip p, its interval the same test inverted (signflip_ci)",
    }


def _p(diffs: np.ndarray) -> float | None:
    """The two-sided sign-flip p of the finite differences (None: fewer than 2)."""
    d = diffs[np.isfinite(diffs)]
    return float(sign_flip_pvalue(d)[0]) if len(d) >= 2 else None


def _robust_non_inferior(row: Mapping[str, Any]) -> bool:
    return row.get("verdict") == NON_INFERIOR and bool(row.get("robust"))


UNREAD = "not read: the positive control is not non-inferior (docs/longrange_protocol.md)"


def longrange_answer(
    frontiers: Mapping[int, Mapping[str, Any]], pending: Sequence[int] = ()
) -> dict[str, Any]:
    """The study's answer from its long-range frontiers (length -> frontier entry, rows
    carrying ``robust`` and ``step_ratio_cpu``): per length the cheapest robustly
    non-inferior arm, and n* per method of the study's
    ``rpka.config.presets_longctx.ANSWER_METHODS`` (None: not reached at a read length). A
    length whose positive control (exact by construction) is not non-inferior is not read
    (``unread``): the pipeline, not the estimator, would be wrong there. ``pending``: the
    study's lengths whose runs are not all in (``pending_lengths``): an n* of None is then
    "not reached yet", and an n* longer than a pending length is an upper bound."""
    per_length: dict[str, Any] = {}
    n_star: dict[str, int | None] = {m: None for m in ANSWER_METHODS}
    for length in sorted(frontiers):
        entry = frontiers[length]
        control = entry.get("positive_control") or {}
        if control and control.get("verdict") != NON_INFERIOR:  # the pipeline is wrong here
            per_length[str(length)] = {"robust_non_inferior": [], "cheapest": None,
                                       "step_ratio_cpu": None, "unread": UNREAD}  # fmt: skip
            continue
        good = [
            r for r in entry["rows"] if _robust_non_inferior(r) and r["arm"] != control.get("arm")
        ]
        timed = [r for r in good if r.get("step_ratio_cpu")]
        cheapest = min(timed, key=lambda r: r["step_ratio_cpu"]["mean"], default=None)
        per_length[str(length)] = {
            "robust_non_inferior": [r["arm"] for r in good],
            "cheapest": None if cheapest is None else cheapest["arm"],
            "step_ratio_cpu": None if cheapest is None else cheapest["step_ratio_cpu"],
        }
        for method in ANSWER_METHODS:
            if n_star[method] is None and any(
                r["method"] == method and is_cheaper(r.get("step_ratio_cpu")) for r in good
            ):
                n_star[method] = length
    values = set(n_star.values())
    return {
        "per_length": per_length,
        "n_star": n_star,
        "tie": len(values) == 1 and None not in values,  # both reached at the same length
        "pending_lengths": sorted(int(n) for n in pending),
        "rule": f"cheaper: CPU step ratio to exact ≤ {CHEAPER_RATIO_MAX} with its upper 95 % "
        f"bound below {CHEAPER_UPPER_MAX} (steptime.json); n*: the shortest length where some "
        "rank of the method is robustly non-inferior and cheaper; None: not reached",
    }
