"""The report's own figures: the headline (every track's primary comparison on one
scale, the gap recovered) and the forest plot of one track (controls in their own panel, the
primary arm highlighted, the equivalence margin shaded).

Each function takes the study index or a bench report as read from JSON (keys in
``docs/bench_report.md``; keys of older reports may be missing), returns the matplotlib
``Figure``, and with ``save_dir`` also writes ``<save_dir>/<name>.png``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from rpka.io import save_figure
from rpka.report import palette
from rpka.report.figures import metric_label
from rpka.report.tables import arm_group, arm_label, verdict_word
from rpka.tracks import get_task

PRIMARY_COLOUR = "C1"  # the pre-registered primary arm, in every report figure
OTHER_COLOUR = "0.35"
CONTROL_COLOUR = "C2"
FAILED_GATE_COLOUR = "0.65"


def primary_comparison(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The primary arm's comparison with the baseline (``arms[primary].comparison``, or
    the top-level ``comparison`` of an older report)."""
    entry = report["arms"].get(report["primary_arm"], {})
    return entry.get("comparison") or report.get("comparison")


def relative_interval(c: Mapping[str, Any]) -> tuple[float, float, float]:
    """The delta and its 95 % CI in percent of exact's mean (NaN where undefined)."""
    base = c.get("baseline_mean")
    if base is None:  # an older report: the relative delta gives exact's mean back
        rel, delta = c.get("delta_rel_pct"), c.get("delta_mean")
        base = 100 * delta / rel if rel and delta else None
    if not base:
        return (np.nan, np.nan, np.nan)
    scale = 100 / abs(base)
    return tuple(
        np.nan if c.get(k) is None else float(c[k]) * scale
        for k in ("delta_mean", "ci_low", "ci_high")
    )


def _finite(*values: float | None) -> bool:
    return all(v is not None and np.isfinite(v) for v in values)


def plot_headline(
    rows: Sequence[Mapping[str, Any]],
    save_dir: str | os.PathLike | None = None,
    name: str = "report_headline",
) -> Figure:
    """One row per track (and long-context length): the primary arm's **gap recovered**
    (1 = exact attention, 0 = the no-attention control; ``rpka.verdict.frontier``), mean and 95 %
    t interval over the evaluation seeds, one scale for every metric; shaded: the
    non-inferior zone above the frontier's margin. A track without a gap to recover (its
    control ties exact: the attention gate failed) is drawn hollow and grey at 0 and says so.

    ``rows``: dicts with ``label``, ``gap`` (``{"mean", "ci_low", "ci_high"}`` or None),
    ``gate`` ("passed", "failed" or "none"), ``verdict`` (the primary verdict, words) and
    ``margin_gap`` (None: no zone), in display order (top first).
    """
    fig, ax = plt.subplots(figsize=(8.5, 0.6 * len(rows) + 1.6), constrained_layout=True)
    values = [
        v
        for row in rows
        for v in ((row.get("gap") or {}).get(k) for k in ("mean", "ci_low", "ci_high"))
        if _finite(v)
    ]
    left, right = min([0.0, *values]) - 0.08, max([1.0, *values]) + 0.08
    margin = next((row["margin_gap"] for row in rows if row.get("margin_gap")), None)
    if margin is not None:
        ax.axvspan(margin, right, color="C0", alpha=0.12, lw=0,
                   label=f"non-inferior zone (gap > {margin:g})")  # fmt: skip
    ax.axvline(0, color="0.3", lw=1, ls=":", label="no attention (control) = 0")
    ax.axvline(1, color=palette.EXACT, lw=1, ls="--", label="exact attention = 1")
    labels = []
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        gap = row.get("gap") or {}
        if _finite(gap.get("mean"), gap.get("ci_low"), gap.get("ci_high")):
            ax.plot([gap["ci_low"], gap["ci_high"]], [y, y], color=PRIMARY_COLOUR, lw=2.5)
            ax.plot([gap["mean"]], [y], "o", ms=9, color=PRIMARY_COLOUR)
            ax.annotate(f"{gap['mean']:.2f}", (gap["mean"], y), xytext=(0, 7),
                        textcoords="offset points", ha="center", fontsize=8)  # fmt: skip
        else:
            ax.plot([0], [y], "o", ms=9, color=FAILED_GATE_COLOUR, mfc="white", mew=2)
            why = "control ties exact: no gap" if row["gate"] == "failed" else "gap undefined"
            ax.annotate(why, (0, y), xytext=(10, -3), textcoords="offset points",
                        fontsize=8, color="0.35")  # fmt: skip
        gate = {"passed": "gate passed", "failed": "gate FAILED", "none": "no gate"}[row["gate"]]
        labels.append(f"{row['label']}\n{row.get('verdict', '')} ({gate})")
    ax.set_xlim(left, right)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_yticks(range(len(rows))[::-1], labels, fontsize=9)
    ax.set(
        xlabel="gap recovered by the primary arm, (control - arm) / (control - exact)",
        title="Primary arm per track: gap recovered, mean and 95 % CI",
    )
    fig.legend(loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    save_figure(fig, save_dir, name)
    return fig


def _forest_panel(
    ax: plt.Axes, report: Mapping[str, Any], arms: list[str], margin: float | None
) -> None:
    primary = report["primary_arm"]
    if margin:
        ax.axvspan(-margin, margin, color="C0", alpha=0.12, lw=0, label="equivalence margin")
    for i, arm in enumerate(arms):
        y = len(arms) - 1 - i
        c = report["arms"][arm]["comparison"]
        colour = PRIMARY_COLOUR if arm == primary else OTHER_COLOUR
        if arm_group(report, arm) == "control":
            colour = CONTROL_COLOUR
        diffs = np.asarray(c["per_seed_diffs"], dtype=float)
        jitter = np.linspace(-0.18, 0.18, len(diffs)) if len(diffs) > 1 else np.zeros(1)
        ax.plot(diffs, y + jitter, "o", ms=3, alpha=0.45, color=colour)
        if _finite(c.get("ci_low"), c.get("ci_high")):
            ax.plot(
                [c["ci_low"], c["ci_high"]], [y, y], color=colour, lw=3 if arm == primary else 2
            )
        ax.plot([c["delta_mean"]], [y], "D", color=colour, ms=8 if arm == primary else 6)
    ax.axvline(0, color="C3", lw=1, ls="--")
    ticks = []
    for arm in arms:
        c = report["arms"][arm]["comparison"]
        flag = " †" if c.get("verdict_flipped_by_one_seed") else ""
        p = c.get("p_adjusted", c.get("p_value"))
        p_text = f"p={p:.2g}" if p is not None and np.isfinite(p) else "no test"
        ticks.append(f"{arm_label(report, arm)}\n{verdict_word(c['verdict'])}{flag}, {p_text}")
    ax.set_yticks(range(len(arms))[::-1], ticks, fontsize=8)
    for label, arm in zip(ax.get_yticklabels(), arms, strict=True):  # as set: top first
        if arm == primary:
            label.set_fontweight("bold")
            label.set_color(PRIMARY_COLOUR)


def plot_forest(
    report: Mapping[str, Any],
    save_dir: str | os.PathLike | None = None,
    name: str = "report_forest",
) -> Figure:
    """Every arm's paired difference from the baseline: seeds (dots), mean (diamond) and
    95 % CI; the primary arm in colour and bold; controls in their own panel with their
    own scale (their differences would squash the others'); "†": one seed flips the
    verdict (leave-one-seed-out)."""
    compared = [a for a, e in report["arms"].items() if e.get("comparison")]
    controls = [a for a in compared if arm_group(report, a) == "control"]
    main = [a for a in compared if a not in controls]
    main.sort(key=lambda a: a != report["primary_arm"])  # the primary arm on top
    margin = (report.get("decision") or {}).get("margin")
    panels = [(main, margin, "arms")] + ([(controls, None, "controls")] if controls else [])
    heights = [max(len(arms), 1) + 1.2 for arms, _, _ in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(8.5, 0.55 * sum(heights) + 1.0),
        height_ratios=heights,
        constrained_layout=True,
        squeeze=False,
    )
    metric = get_task(report["track"]).text.metric_short(report["metric"])
    for ax, (arms, band, what) in zip(axes[:, 0], panels, strict=True):
        _forest_panel(ax, report, arms, band)
        ax.set_title(
            f"{what}: test {metric}, arm - {report['baseline_arm']} (negative: arm better)",
            fontsize=10,
        )
    axes[-1, 0].set_xlabel(f"paired difference in test {metric_label(report)}")
    if margin:
        axes[0, 0].legend(loc="best", fontsize=8)
    save_figure(fig, save_dir, name)
    return fig


__all__ = ["plot_forest", "plot_headline", "primary_comparison", "relative_interval"]
