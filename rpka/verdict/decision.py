"""The verdict, decided in one place: the rule's thresholds and words, named once, and the
rule applied to one bench (docs/statistics.md, sections 4b and 8; docs/design.md section 5).

Named here and read by the bench, the frontier, the robustness check and the report:

* :data:`MARGIN_GAP` - the rank frontier's margin on the gap recovered; an arm is
  :data:`NON_INFERIOR` when the one-sided t-test of ``mean g > MARGIN_GAP`` rejects at
  alpha (:func:`gap_recovered`; else :data:`NOT_SHOWN`, or :data:`UNDEFINED` where a seed
  has no gap);
* "cheaper" - the long-range study's registered rule on a CPU-time step ratio with its
  interval (:func:`is_cheaper`: :data:`CHEAPER_RATIO_MAX`, :data:`CHEAPER_UPPER_MAX`), and
  the report's reading of a point ratio without one (:func:`cheaper_step`:
  :data:`STEP_TIE`, the timing noise);
* α is ``rpka.verdict.stats.ALPHA`` (``rpka.verdict.significance``); the paired verdict
  words are ``rpka.verdict.stats.VERDICTS`` (``verdict_of``: the word of one paired test,
  which the Holm step and leave-one-seed-out re-decide); each study's own part of the rule
  (its arms, margin, gate level) is its ``DecisionRule`` (``rpka.config.concerns``).

The bench's rule: the preset's primary arm against the baseline is the one pre-registered
comparison, unadjusted; the control (attention replaced by the context mean) is read only by
the attention gate, the local-window control (issue 27) by the local gate; every other arm
is the Holm family; a track that fails its gate has every verdict "uninformative" - on the
long-context studies (``DecisionRule.gate_needs_local``) the gate is both controls'. The
statistics themselves live in ``rpka.verdict.stats``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import ttest_1samp

from rpka.config.bench import BenchConfig
from rpka.verdict import stats

METRIC_DIRECTION = "lower"  # every metric (MSE, MAE, perplexity, NLL, error): lower is better
MARGIN_GAP = 0.95  # non-inferior: mean gap recovered above 0.95 (one-sided, at stats.ALPHA)
# the frontier's verdicts on the gap scale (gap_recovered)
NON_INFERIOR, NOT_SHOWN, UNDEFINED = "non-inferior", "not shown", "undefined"
CHEAPER_RATIO_MAX = 0.8  # "cheaper": CPU step ratio to exact at most this ...
CHEAPER_UPPER_MAX = 0.9  # ... and its upper 95 % bound below this
# A step-time ratio within this of 1 reads as exact's cost, not a saving: the median step
# times are recorded on a shared 2-core machine, and the positive control - exact
# attention's own arithmetic - measured 0.88x and 0.97x exact's step at 2,048 and 1,024
# tokens in the full study (data/results/full/longrange/longctx.json)
STEP_TIE = 0.15


# --------------------------------------------------------------------------- non-inferiority


def gap_recovered(
    g: np.ndarray, margin_gap: float = MARGIN_GAP, alpha: float = stats.ALPHA
) -> dict[str, Any]:
    """Mean gap recovered with its two-sided t interval and the non-inferiority test.

    ``verdict``: :data:`NON_INFERIOR` when ``ttest_1samp(g, margin_gap,
    alternative="greater")`` rejects at ``alpha``; :data:`NOT_SHOWN` otherwise;
    :data:`UNDEFINED` when a seed has no gap (the control did not lose there) or fewer
    than 2 seeds. ``g``: the per-seed gap, ``rpka.verdict.frontier.per_seed_gap``.
    """
    g = np.asarray(g, dtype=float)
    out: dict[str, Any] = {"per_seed": [None if np.isnan(x) else float(x) for x in g]}
    if len(g) < 2 or np.isnan(g).any():
        return {**out, "mean": None, "ci_low": None, "ci_high": None, "p_value": None,
                "verdict": UNDEFINED}  # fmt: skip
    summary = stats.summarize(g, 1 - alpha)  # the mean's t interval (the point without spread)
    mean = summary["mean"]
    if np.ptp(g) == 0:  # no spread: the test is decided by the point
        p = 0.0 if mean > margin_gap else 1.0
    else:
        p = float(ttest_1samp(g, margin_gap, alternative="greater").pvalue)
    verdict = NON_INFERIOR if p < alpha else NOT_SHOWN
    return {**out, "mean": mean, "ci_low": summary["ci_low"], "ci_high": summary["ci_high"],
            "p_value": p, "verdict": verdict}  # fmt: skip


# --------------------------------------------------------------------------- cheaper


def is_cheaper(ratio: Mapping[str, Any] | None) -> bool:
    """Cheaper than exact by the long-range study's rule: a CPU-time step ratio to exact
    (``rpka.study.steptime``, ``{mean, ci_low, ci_high}``) of at most
    :data:`CHEAPER_RATIO_MAX` with its upper 95 % bound below :data:`CHEAPER_UPPER_MAX`;
    False without a ratio."""
    if not ratio or ratio.get("mean") is None or ratio.get("ci_high") is None:
        return False
    return ratio["mean"] <= CHEAPER_RATIO_MAX and ratio["ci_high"] < CHEAPER_UPPER_MAX


def cheaper_step(step_ratio: float | None) -> bool:
    """Whether a step-time ratio to exact read without its interval (the report's points,
    some from the runs' wall-time medians) is cheaper than exact's beyond timing noise
    (:data:`STEP_TIE`); False without a ratio."""
    return step_ratio is not None and step_ratio < 1 - STEP_TIE


# --------------------------------------------------------------------------- one bench


def control_gate(
    config: BenchConfig, arms: dict[str, dict[str, Any]], control: str | None
) -> dict[str, Any] | None:
    """The gate of one control arm, the one gate function ``rpka.verdict.stats.attention_gate``
    applied to it: does ``control`` lose to the baseline by ``config.decision.gate_min_rel``? The
    attention gate is that of ``config.control``, the local gate (:func:`local_gate`) that of
    ``config.local_control``. None when the study has no such arm."""
    if control is None or control not in arms:
        return None
    gate = stats.attention_gate(
        arms[config.decision.baseline_arm]["full"]["per_seed"],
        arms[control]["full"]["per_seed"],
        METRIC_DIRECTION,
        min_rel=config.decision.gate_min_rel,
    )
    return {"control_arm": control, **gate}


def local_gate(config: BenchConfig, arms: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The local gate (issue 27): :func:`control_gate` of the local-window control, the same
    fields as the attention gate's (``control_gate(config, arms, config.control)``)."""
    return control_gate(config, arms, config.local_control)


def verdict_gate(
    config: BenchConfig, gate: dict[str, Any] | None, local: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The gate the verdicts obey: the attention gate alone, or - with
    ``config.decision.gate_needs_local`` (the long-context gate, issue 27) - passed only
    when both it and the local gate (each :func:`control_gate`) passed (``rule`` says
    which); None without either. The one two-control gate: the bench and the tests use it."""
    if not config.decision.gate_needs_local:
        return gate
    parts = [g for g in (gate, local) if g is not None]
    if not parts:
        return None
    return {
        "passed": all(g["passed"] for g in parts),
        "rule": "two-control gate: " + "; ".join(f"{g['control_arm']}: {g['rule']}" for g in parts),
    }


def gate_passed(attention: Mapping[str, Any] | None, local: Mapping[str, Any] | None) -> bool:
    """The verdicts' gate read back from a report's recorded gates (:func:`control_gate`
    of each control; None where the bench has no such control): the attention gate passed,
    and the local gate too where the bench ran one - :func:`verdict_gate`'s rule. Every
    reader of a report (the study index, its frontier, the summary) asks this, not its own
    test."""
    return attention is not None and all(g["passed"] for g in (attention, local) if g is not None)


def decide(
    config: BenchConfig,
    comparisons: dict[str, dict[str, Any]],
    gate: dict[str, Any] | None,
    local: dict[str, Any] | None = None,
) -> None:
    """The decision rule (docs/statistics.md): the primary unadjusted, Holm over the
    secondary family, the controls outside both (they are the gates'), then the gate
    (:func:`verdict_gate`: with ``config.decision.gate_needs_local`` both controls')."""
    control, positive, window = (
        config.control,
        config.decision.positive_control_arm,
        config.local_control,
    )
    controls = (control, window)
    family = {name: c for name, c in comparisons.items() if name not in (*controls, positive)}
    stats.apply_holm(family, primary=config.decision.primary_arm)
    if control in comparisons:
        comparisons[control]["adjustment"] = "none (the control: read by the attention gate)"
    if window in comparisons:
        comparisons[window]["adjustment"] = (
            "none (the local-window control: read by the local gate)"
        )
    if positive in comparisons:  # unadjusted, as apply_holm leaves an arm outside its family
        comparisons[positive]["adjustment"] = (
            "none (the positive control: read by the rank frontier's rule)"
        )
    applied = verdict_gate(config, gate, local)
    if applied is not None:
        for name, comparison in comparisons.items():
            if name not in controls:
                stats.apply_gate(comparison, applied)


def compare_arms(config: BenchConfig, arms: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Every arm against the baseline on its per-seed test metric (``arms[name]["full"]
    ["per_seed"]``), decided by the rule: sets ``arms[name]["comparison"]`` (None for the
    baseline) and returns the attention gate (None without a control)."""
    base = arms[config.decision.baseline_arm]["full"]["per_seed"]
    comparisons = {
        name: stats.paired_comparison(
            base, entry["full"]["per_seed"], METRIC_DIRECTION, config.decision.margin
        )
        for name, entry in arms.items()
        if name != config.decision.baseline_arm
    }
    gate = control_gate(config, arms, config.control)  # the attention gate
    decide(config, comparisons, gate, local_gate(config, arms))
    for name, entry in arms.items():
        entry["comparison"] = comparisons.get(name)
    return gate


def redecide(report: dict[str, Any], config: BenchConfig) -> dict[str, Any]:
    """``report`` (a ``bench_report.json``, e.g. one written before the rule existed) with
    its comparisons, gate and decision recomputed by today's rule from its per-seed test
    metrics and ``config`` (its own, with ``margin`` and the control as the preset sets
    them); nothing is retrained. ``baseline``/``idea``/``comparison`` follow."""
    gate = compare_arms(config, report["arms"])
    report["attention_gate"] = gate
    report["local_gate"] = local_gate(config, report["arms"])
    report["decision"] = decision_of(config)
    report["comparison"] = report["arms"][config.decision.primary_arm]["comparison"]
    report["redecided"] = (
        "comparisons, gate and decision recomputed by rpka.decision.redecide from the "
        "per-seed test metrics of this file (no run retrained)"
    )
    return report


def holm_against(
    base: Sequence[float], scores: Mapping[str, Sequence[float]], alpha: float = stats.ALPHA
) -> dict[str, dict[str, Any]]:
    """Each arm's per-seed ``scores`` against the baseline's ``base`` (same seed order),
    Holm over all of them at ``alpha``: no primary, no control, no gate - the rule read
    where a file predates its bench's recorded comparisons (an older ``longctx.json``)."""
    comparisons = {
        name: stats.paired_comparison(base, values, METRIC_DIRECTION, alpha=alpha)
        for name, values in scores.items()
    }
    stats.apply_holm(comparisons, alpha=alpha)
    return comparisons


def decision_of(config: BenchConfig) -> dict[str, Any]:
    """The rule the verdicts come from, as data (``bench_report.json["decision"]``)."""
    rule = config.decision
    return {
        "primary_arm": rule.primary_arm,
        "baseline_arm": rule.baseline_arm,
        "control_arm": config.control,
        "local_control_arm": config.local_control,
        "gate_needs_local": rule.gate_needs_local,
        "secondary_family": list(config.secondary_arms),
        "margin": rule.margin,
        "alpha": stats.ALPHA,
        "rule": (
            f"{rule.primary_arm} vs {rule.baseline_arm}: paired sign-flip test, unadjusted "
            f"(pre-registered primary); the {len(config.secondary_arms)} other arm(s): Holm "
            "over that family; equivalent when TOST at +-margin rejects both sides"
            + (" (no margin: no equivalence test)" if rule.margin is None else "")
            + (
                f"; every verdict 'uninformative' unless {config.control} loses to "
                f"{rule.baseline_arm} by >= {rule.gate_min_rel:.0%} (attention gate)"
                if config.control
                else "; no control arm: no attention gate"
            )
            + (
                f"; and unless {config.local_control} loses to {rule.baseline_arm} by the "
                "same rule (local gate: the task needs more than a local window)"
                if rule.gate_needs_local
                else ""
            )
        ),
    }
