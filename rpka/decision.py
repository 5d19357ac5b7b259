"""The decision rule applied to one bench (docs/statistics.md, section 4b).

The preset's primary arm against the baseline is the one pre-registered comparison,
unadjusted; the control (attention replaced by the context mean) is read only by the
attention gate; every other arm is the Holm family; a track that fails its gate has every
verdict "uninformative". The statistics themselves live in ``rpka.stats``.
"""

from __future__ import annotations

from typing import Any

from rpka import stats
from rpka.config import BenchConfig

METRIC_DIRECTION = "lower"  # every metric (MSE, MAE, perplexity, NLL, error): lower is better


def attention_gate(config: BenchConfig, arms: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The track's attention gate (``rpka.stats.attention_gate``): does the control lose to
    the baseline by ``config.gate_min_rel``? None when the study has no control arm."""
    control = config.control
    if control is None or control not in arms:
        return None
    gate = stats.attention_gate(
        arms[config.baseline_arm]["full"]["per_seed"],
        arms[control]["full"]["per_seed"],
        METRIC_DIRECTION,
        min_rel=config.gate_min_rel,
    )
    return {"control_arm": control, **gate}


def decide(
    config: BenchConfig, comparisons: dict[str, dict[str, Any]], gate: dict[str, Any] | None
) -> None:
    """The decision rule (docs/statistics.md): the primary unadjusted, Holm over the
    secondary family, the control outside both (it is the gate's), then the gate."""
    control, positive = config.control, config.positive_control_arm
    family = {name: c for name, c in comparisons.items() if name not in (control, positive)}
    stats.apply_holm(family, primary=config.primary_arm)
    if control in comparisons:
        comparisons[control]["adjustment"] = "none (the control: read by the attention gate)"
    if positive in comparisons:  # unadjusted, as apply_holm leaves an arm outside its family
        comparisons[positive]["adjustment"] = (
            "none (the positive control: read by the rank frontier's rule)"
        )
    if gate is not None:
        for name, comparison in comparisons.items():
            if name != control:
                stats.apply_gate(comparison, gate)


def compare_arms(config: BenchConfig, arms: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Every arm against the baseline on its per-seed test metric (``arms[name]["full"]
    ["per_seed"]``), decided by the rule: sets ``arms[name]["comparison"]`` (None for the
    baseline) and returns the attention gate (None without a control)."""
    base = arms[config.baseline_arm]["full"]["per_seed"]
    comparisons = {
        name: stats.paired_comparison(
            base, entry["full"]["per_seed"], METRIC_DIRECTION, config.margin
        )
        for name, entry in arms.items()
        if name != config.baseline_arm
    }
    gate = attention_gate(config, arms)
    decide(config, comparisons, gate)
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
    report["decision"] = decision_of(config)
    report["comparison"] = report["arms"][config.primary_arm]["comparison"]
    report["redecided"] = (
        "comparisons, gate and decision recomputed by rpka.decision.redecide from the "
        "per-seed test metrics of this file (no run retrained)"
    )
    return report


def decision_of(config: BenchConfig) -> dict[str, Any]:
    """The rule the verdicts come from, as data (``bench_report.json["decision"]``)."""
    return {
        "primary_arm": config.primary_arm,
        "baseline_arm": config.baseline_arm,
        "control_arm": config.control,
        "secondary_family": list(config.secondary_arms),
        "margin": config.margin,
        "alpha": stats.ALPHA,
        "rule": (
            f"{config.primary_arm} vs {config.baseline_arm}: paired sign-flip test, unadjusted "
            f"(pre-registered primary); the {len(config.secondary_arms)} other arm(s): Holm "
            "over that family; equivalent when TOST at +-margin rejects both sides"
            + (" (no margin: no equivalence test)" if config.margin is None else "")
            + (
                f"; every verdict 'uninformative' unless {config.control} loses to "
                f"{config.baseline_arm} by >= {config.gate_min_rel:.0%} (attention gate)"
                if config.control
                else "; no control arm: no attention gate"
            )
        ),
    }
