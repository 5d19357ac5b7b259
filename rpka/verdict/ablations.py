"""RPKA's default configuration, chosen on validation among the ablation arms.

The ablation arms change one choice of RPKA at a time around the reference (its current
default, at one rank): pivot weighting, pivot set, pivot rule, pivot refresh
(``rpka.config.presets.ABLATIONS``). :func:`choose_default` works in two steps, on validation
scores only - test scores are never read, so the test split stays a clean estimate
(docs/design.md section 5, point 1):

1. **Pick** the candidate with the lowest mean validation error over the sweep seeds, at
   each arm's own best learning rate (``arms.<arm>.sweep``), averaged over the sweep seeds
   that every candidate ran, so that all are scored on the same seeds.
2. **Confirm** it against the reference on the evaluation seeds' validation scores
   (``arms.<arm>.val_by_metric``: more seeds, still validation): paired by seed, exact
   sign-flip p, Holm-adjusted across the candidates. The pick replaces the reference only
   if it is better there too with adjusted p < alpha; otherwise the reference stays. A
   default should not change on the noise of two sweep seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rpka.attention import build
from rpka.attention.rpka import RPKAttention
from rpka.verdict import stats
from rpka.verdict.significance import holm

# the choices an RPKA configuration is made of (what an ablation arm may change)
FACTORS = ("rank", "pivot_rule", "pivot_set", "weighting", "pivot_refresh")

RULE = (
    "Pick: among the ablation reference (the current default) and the ablation arms (one "
    "choice changed each, same rank), the lowest mean validation {metric} at its own best "
    "learning rate over the sweep seeds every candidate ran ({seeds}; "
    "arms.<arm>.sweep[].val_per_seed); the reference keeps it on a tie, an arm with a "
    "diverged sweep seed cannot win. Confirm: the pick replaces the reference only if its "
    "evaluation seeds' validation {metric} is lower too, paired by seed, with sign-flip p "
    "< {alpha:g} after Holm across the {n_others} other candidates; otherwise the reference "
    "stays. Test scores are never used."
)


def rpka_configuration(method: str, options: Mapping[str, Any]) -> dict[str, Any] | None:
    """The RPKA choices of an arm's attention, defaults resolved; None if it is not RPKA.

    Builds the module, so a peer that *is* RPKA with fixed choices (``nystrom-uniform``:
    uniform landmarks on the joint set) is recognised as such.
    """
    module = build(method, **dict(options))
    if not isinstance(module, RPKAttention):
        return None
    config = {factor: getattr(module, factor) for factor in FACTORS}
    if module.weighting == "tempered":
        config["weighting"] = f"tempered({module.tempering:g})"
    return config


def _finite(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) else math.inf


def choose_default(report: Mapping[str, Any], alpha: float = stats.ALPHA) -> dict[str, Any] | None:
    """The ablation choice of a bench report (``bench_report.json`` -> ``ablation_choice``).

    Reads only ``config`` (metric, ablation reference and arms) and, per arm, its options
    and validation scores (``best_cfg``, ``sweep``, ``val_by_metric``). Returns None when
    the study has no ablation reference. See ``docs/bench_report.md`` for the keys.
    """
    config = report["config"]
    reference = config.get("ablation_reference")
    if reference is None:
        return None
    metric = config["metric"]
    names = [reference, *config.get("ablation_arms", ())]
    best_rows = {name: _best_row(report["arms"][name]) for name in names}
    common = set.intersection(*(set(row["seeds"]) for row in best_rows.values()))
    seeds = [s for s in best_rows[reference]["seeds"] if s in common]  # sweep order
    candidates = _candidates(report, names, best_rows, common, metric)
    # min keeps the first of equal scores: the reference (listed first) wins a tie
    picked = min(candidates, key=lambda c: _finite(c["val_score"]))
    confirm_on_eval_seeds(report, reference, candidates[1:], metric, alpha)
    candidates[0] |= dict.fromkeys(("eval_seeds_val_delta", "eval_seeds_val_p"))
    candidates[0] |= {"eval_seeds_val_p_adjusted": None, "eval_seeds_val_confirms": False}
    confirmed = picked is not candidates[0] and picked["eval_seeds_val_confirms"]
    chosen = picked if confirmed else candidates[0]
    check = min(candidates, key=lambda c: _finite(c["eval_seeds_val_mean"]))
    ref = candidates[0]
    margin = _finite(ref["val_score"]) - _finite(chosen["val_score"])
    return {
        "rule": RULE.format(
            metric=metric,
            seeds=", ".join(map(str, seeds)) or "none",
            alpha=alpha,
            n_others=len(candidates) - 1,
        ),
        "metric": metric,
        "split": "val",
        "sweep_seeds": seeds,
        "reference": reference,
        "picked_arm": picked["arm"],
        "pick_confirmed": confirmed,
        "chosen_arm": chosen["arm"],
        "chosen_method": chosen["method"],
        "chosen_options": chosen["options"],
        "chosen_val_score": chosen["val_score"],
        "reference_val_score": ref["val_score"],
        "margin": margin if math.isfinite(margin) else None,
        "margin_rel_pct": (
            100 * margin / ref["val_score"] if math.isfinite(margin) and ref["val_score"] else None
        ),
        "changes_default": chosen["arm"] != reference,
        "eval_seeds_val_choice": check["arm"],
        "eval_seeds_val_agrees": check["arm"] == picked["arm"],
        "candidates": candidates,
    }


def _best_row(arm: Mapping[str, Any]) -> dict[str, Any]:
    """An arm's sweep row at its best learning rate (its validation scores per sweep seed)."""
    return next(r for r in arm["sweep"] if r["lr"] == arm["best_cfg"]["lr"])


def _candidates(
    report: Mapping[str, Any],
    names: list[str],
    best_rows: Mapping[str, Mapping[str, Any]],
    common: set[int],
    metric: str,
) -> list[dict[str, Any]]:
    """One candidate per arm of ``names`` (the reference first): its configuration, the
    factor it changes against the first RPKA configuration, and its mean validation score
    over the sweep seeds ``common`` to every candidate (None if one diverged)."""
    reference = names[0]
    base = None
    candidates = []
    for name in names:
        arm = report["arms"][name]
        row = best_rows[name]
        setup = rpka_configuration(arm["method"], arm["options"])
        if base is None:
            base = setup
        changed = sorted(k for k in FACTORS if setup is None or base is None or setup[k] != base[k])
        values = [
            v for seed, v in zip(row["seeds"], row["val_per_seed"], strict=True) if seed in common
        ]
        finite = all(v is not None and math.isfinite(v) for v in values)
        val_eval = arm["val_by_metric"][metric]
        candidates.append(
            {
                "arm": name,
                "method": arm["method"],
                "options": dict(arm["options"]),
                "configuration": setup,
                "factor": ", ".join(changed) if name != reference else None,
                "level": (
                    ", ".join(str(setup[k]) for k in changed)
                    if setup is not None and name != reference
                    else None
                ),
                "lr": row["lr"],
                "val_score": sum(values) / len(values) if values and finite else None,
                "val_per_seed": values,
                "eval_seeds_val_mean": val_eval["mean"],
            }
        )
    return candidates


def confirm_on_eval_seeds(
    report: Mapping[str, Any],
    reference: str,
    others: list[dict[str, Any]],
    metric: str,
    alpha: float,
) -> None:
    """Fill each candidate's paired comparison with the reference on the evaluation seeds'
    validation scores (``eval_seeds_val_delta``, ``eval_seeds_val_p``, Holm-adjusted
    ``eval_seeds_val_p_adjusted``, ``eval_seeds_val_confirms``)."""

    def by_seed(arm: Mapping[str, Any]) -> dict[int, float | None]:
        return dict(zip(arm["seeds"], arm["val_by_metric"][metric]["per_seed"], strict=True))

    ref_scores = by_seed(report["arms"][reference])
    for candidate in others:
        scores = by_seed(report["arms"][candidate["arm"]])
        shared = [seed for seed in ref_scores if seed in scores]
        paired = stats.paired_comparison(
            [_finite(ref_scores[seed]) for seed in shared],
            [_finite(scores[seed]) for seed in shared],
            report.get("metric_direction", "lower"),
        )
        candidate["eval_seeds_val_delta"] = paired["delta_mean"]
        candidate["eval_seeds_val_p"] = paired["p_value"]
    adjusted = holm([c["eval_seeds_val_p"] for c in others]) if others else []
    sign = 1.0 if report.get("metric_direction", "lower") == "lower" else -1.0
    for candidate, p_adjusted in zip(others, adjusted, strict=True):
        better = sign * candidate["eval_seeds_val_delta"] < 0  # False for NaN
        candidate["eval_seeds_val_p_adjusted"] = p_adjusted
        candidate["eval_seeds_val_confirms"] = bool(better and p_adjusted < alpha)


__all__ = ["FACTORS", "RULE", "choose_default", "rpka_configuration"]
