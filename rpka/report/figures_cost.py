"""Error against cost, per track: each arm's paired test-error difference from exact
attention against its training step time, measured on that track at its own length.

Every arm has its colour from :mod:`rpka.report.palette` (the same in every figure) and its entry
in the legend, the primary arm marked "(primary)" and framed; the cost axes are log
scales and say so. A track with more than :data:`MAX_SERIES` arms is drawn as small
multiples, one panel per arm group (RPKA ranks with the control, RPKA ablations, peer
methods), each with exact attention, on shared axes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from rpka.io import save_figure
from rpka.report import palette
from rpka.report.figures import GROUP_MARKERS, legend_entries, metric_label
from rpka.report.tables import arm_group, arm_label

MAX_SERIES = 6  # arms in one panel before the figure splits into one panel per group
PANEL_GROUPS = (  # (title, groups): the small multiples, in order
    ("RPKA ranks and the no-attention control", ("RPKA rank", "control")),
    ("RPKA ablations", ("RPKA ablation",)),
    ("peer methods", ("peer",)),
)


def pareto_front(x: Sequence[float], y: Sequence[float]) -> list[int]:
    """Indices of the points no other point dominates (lower-or-equal x AND y, one strictly).

    Sorted by x. NaN points are never on the front.
    """
    points = [(float(a), float(b), i) for i, (a, b) in enumerate(zip(x, y, strict=True))]
    points = sorted(p for p in points if np.isfinite(p[0]) and np.isfinite(p[1]))
    front, best = [], np.inf
    for _, b, i in points:  # increasing x: on the front iff lower y than everything faster
        if b < best:
            front.append(i)
            best = b
    return front


def excludes_zero(c: Mapping) -> bool:
    """Whether a comparison's 95 % CI lies on one side of zero."""
    low, high = c.get("ci_low"), c.get("ci_high")
    return low is not None and high is not None and (low > 0 or high < 0)


def arm_panels(report: Mapping) -> list[tuple[str, list[str]]]:
    """(title, arms) per panel: every arm in one panel up to :data:`MAX_SERIES` arms; else
    one panel per group of :data:`PANEL_GROUPS` present, each with the baseline."""
    names = list(report["arms"])
    if len(names) <= MAX_SERIES:
        return [("", names)]
    base = report["baseline_arm"]
    panels = []
    for title, groups in PANEL_GROUPS:
        arms = [n for n in names if n != base and arm_group(report, n) in groups]
        if arms:
            panels.append((title, [base, *arms]))
    return panels


def _front(report: Mapping, times: Mapping[str, float]) -> list[str]:
    """The arms on the Pareto front of (time, delta), through exact and the arms whose CI
    excludes 0 only (an arm within noise of exact is not "better" at its cost); empty
    with fewer than two points on it."""
    shown = [n for n in report["arms"] if times.get(n) is not None]
    comparisons = [report["arms"][n].get("comparison") for n in shown]
    resolved = [n for n, c in zip(shown, comparisons, strict=True) if not c or excludes_zero(c)]
    x = [float(times[n]) for n in resolved]
    y = [(report["arms"][n].get("comparison") or {}).get("delta_mean", 0.0) for n in resolved]
    front = [resolved[i] for i in pareto_front(x, y)]
    return front if len(front) >= 2 else []


def _draw_arm(ax: plt.Axes, report: Mapping, arm: str, x: float) -> None:
    c = report["arms"][arm].get("comparison")
    y = c["delta_mean"] if c else 0.0
    err = [[y - c["ci_low"]], [c["ci_high"] - y]] if c and c.get("ci_low") is not None else None
    if err is not None and not np.all(np.isfinite(err)):
        err = None
    colour = palette.arm_colour(arm)
    primary = arm == report["primary_arm"]
    marker = GROUP_MARKERS.get(arm_group(report, arm), "o")
    label = arm_label(report, arm)
    ax.errorbar(x, y, yerr=err, fmt=marker, color=colour, ms=8, capsize=2, label=label)
    if primary:  # framed, and bold in the legend
        ax.plot(x, y, "s", ms=17, mfc="none", mec=colour, mew=2)


def _cost_axis(ax: plt.Axes, xlabel: str) -> None:
    ax.set_xscale("log")
    ax.set_xlabel(f"{xlabel} (log scale)")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def plot_error_vs_time(
    report: Mapping,
    latency_ms: Mapping[str, float] | None = None,
    latency_length: int | None = None,
    save_dir: str | os.PathLike | None = None,
    name: str = "bench_error_vs_time",
) -> Figure:
    """Test error against cost, with the Pareto front drawn.

    The error is each arm's paired test-metric difference from the baseline (mean over
    seeds, unadjusted 95 % CI bars; the baseline sits at 0). Columns: the arm's median
    training step on this track at its length (``timings.step_ms_median``: one-thread CPU
    time from the study's timing file where it has one, the label says so); with
    ``latency_ms`` (:func:`rpka.speed.scaling.forward_latency`), also the attention's forward
    latency at ``latency_length`` tokens, its title naming that length and the track's
    (it is another benchmark's length, not the track's). Rows: :func:`arm_panels`. The
    front (no arm both faster and better, through exact and the arms whose CI excludes 0,
    over every arm) is dashed through those of its arms a panel shows, circled.
    """
    tokens = report["arms"][report["baseline_arm"]].get("attention_tokens")
    timed = report["timings"].get("step_source")  # a timing file (with_step_timing), else walls
    step_label = f"training step, median CPU ms ({timed})" if timed else "training step, median ms"
    costs = [(report["timings"]["step_ms_median"], step_label)]
    if latency_ms:
        costs.append((latency_ms, f"attention forward latency at n = {latency_length} ms"))
    panels = arm_panels(report)
    fig, axes = plt.subplots(
        len(panels), len(costs), figsize=(7.5 * len(costs), 4.2 * len(panels) + 0.6),
        sharey=True, sharex="col", constrained_layout=True, squeeze=False,
    )  # fmt: skip
    metric = metric_label(report)
    for col, (times, xlabel) in enumerate(costs):
        front = _front(report, times)
        for row, (title, arms) in enumerate(panels):
            ax = axes[row, col]
            for arm in arms:
                if times.get(arm) is not None:
                    _draw_arm(ax, report, arm, float(times[arm]))
            here = [n for n in front if n in arms]  # the front's arms in this panel
            if len(here) >= 2:
                fx = [float(times[n]) for n in here]
                fy = [(report["arms"][n].get("comparison") or {}).get("delta_mean", 0.0)
                      for n in here]  # fmt: skip
                ax.plot(fx, fy, "k--", lw=1, label="Pareto front (CIs excluding 0)")
                ax.plot(fx, fy, "o", ms=16, mfc="none", mec="k", mew=1.0)
                for i, (n, xi, yi) in enumerate(zip(here, fx, fy, strict=True)):
                    ax.annotate(n, (xi, yi), xytext=(8, 8 if i % 2 == 0 else -14),
                                textcoords="offset points", fontsize=8)  # fmt: skip
            ax.axhline(0, color="0.4", lw=1, ls=":")
            _cost_axis(ax, xlabel)
            where = (
                f"measured on this track, {tokens} tokens"
                if col == 0 and tokens
                else f"non-causal benchmark at n = {latency_length}, not this track's "
                f"{tokens} tokens"
                if col
                else ""
            )
            ax.set_title(f"{title}: {where}" if title and where else (title or where), fontsize=10)
            if col == 0:
                ax.set_ylabel(f"test {metric}: arm - {report['baseline_arm']}\n(paired mean, "
                              "95 % CI)")  # fmt: skip
    for row in range(len(panels)):  # one legend per row: every arm drawn in any column
        entries = legend_entries(axes[row])
        legend = axes[row, -1].legend(entries.values(), entries.keys(), loc="center left",
                                      bbox_to_anchor=(1.02, 0.5), fontsize=8)  # fmt: skip
        for text in legend.get_texts():
            if text.get_text().endswith("(primary)"):
                text.set_fontweight("bold")
    save_figure(fig, save_dir, name)
    return fig


__all__ = ["arm_panels", "excludes_zero", "pareto_front", "plot_error_vs_time"]
