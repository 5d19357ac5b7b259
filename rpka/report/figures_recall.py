"""The recall track's figure: query accuracy against rank / pairs, per method (issue 14).

MQAR stores ``n_pairs`` associations in the context; a rank-r approximation of attention
has r landmarks (or features) to route them through, so accuracy against ``r / n_pairs``
is the direct test of the low-rank idea (Zoology, Arora et al. 2023, plot accuracy
against state size the same way). Drawn from a recall ``bench_report.json``: one line per
method over its arms' ranks, the arms without a rank (exact attention, the ``mean``
control) as horizontal lines with their 95 % CI bands, and one panel per evaluation length
(training length and each ``length_factors`` multiple).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from rpka.io import save_figure
from rpka.report.figures import _arm_colors
from rpka.tracks.recall import RecallTask
from rpka.verdict.frontier import unread_pairs


def accuracy_points(report: Mapping, metric: str) -> dict[str, list[dict[str, float]]]:
    """Per method, its ranked arms' test accuracy on ``metric`` (an error metric), sorted by
    rank: ``{method: [{arm, rank, ratio, accuracy, low, high}, ...]}`` with ``ratio`` =
    rank / n_pairs and the accuracy's 95 % CI ``[low, high]`` (bootstrap, from the report).
    Arms without a rank are left out (see :func:`reference_arms`)."""
    n_pairs = report["data"]["n_pairs"]
    methods: dict[str, list[dict[str, float]]] = {}
    for name, entry in report["arms"].items():
        if entry.get("rank") is None:
            continue
        s = entry["full_by_metric"][metric]
        methods.setdefault(entry["method"], []).append(
            {
                "arm": name,
                "rank": entry["rank"],
                "ratio": entry["rank"] / n_pairs,
                "accuracy": 1 - s["mean"],
                "low": 1 - s["ci_high"],
                "high": 1 - s["ci_low"],
            }
        )
    return {m: sorted(rows, key=lambda r: r["rank"]) for m, rows in methods.items()}


def reference_arms(report: Mapping, metric: str) -> dict[str, tuple[float, float, float]]:
    """The arms without a rank (exact, the control): {arm: (accuracy, CI low, CI high)}."""
    return {
        name: (1 - s["mean"], 1 - s["ci_high"], 1 - s["ci_low"])
        for name, entry in report["arms"].items()
        if entry.get("rank") is None
        for s in [entry["full_by_metric"][metric]]
    }


def _length_metrics(report: Mapping) -> list[tuple[str, str]]:
    """(metric, panel title) per evaluation length present in the report."""
    seq_len = report["data"]["seq_len"]
    panels = [("error", f"training length ({seq_len} tokens)")]
    for factor in report["data"].get("length_factors", ()):
        metric = f"error_x{factor}"
        if metric in next(iter(report["arms"].values()))["full_by_metric"]:
            panels.append((metric, f"{factor}x the training length ({factor * seq_len} tokens)"))
    return panels


def applies(report: Mapping) -> bool:
    """Whether ``report`` is one this figure reads: a recall bench with ranked arms."""
    return report.get("track") == RecallTask.name and any(
        arm.get("rank") for arm in report["arms"].values()
    )


def plot_recall_accuracy_vs_rank(
    report: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str = "recall_accuracy_vs_rank",
) -> Figure:
    """Test query accuracy against rank / n_pairs per method, one panel per length.

    Lines: each method with ranked arms (rpka; any non-causal peer the track ever admits),
    the mean over evaluation seeds with 95 % CI bars; horizontal lines: exact attention
    and the control with CI bands; dotted: guessing a value of the sequence (1 / n_pairs).
    The vertical line marks rank = pairs; a star marks the primary arm.
    """
    if report.get("track") != RecallTask.name:
        raise ValueError(f"report must be a recall bench report, got track {report.get('track')!r}")
    panels = _length_metrics(report)
    arms = list(report["arms"])
    colors = _arm_colors(arms)
    guess = 1 - report["naive_baselines"]["predictors"]["in_context"]["test"]["error"]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels), 4), constrained_layout=True, sharey=True
    )
    axes = np.atleast_1d(axes)
    for ax, (metric, title) in zip(axes, panels, strict=True):
        ratios: set[float] = set()
        for method, rows in accuracy_points(report, metric).items():
            x = [r["ratio"] for r in rows]
            y = np.array([r["accuracy"] for r in rows])
            err = np.array([[a - r["low"], r["high"] - a] for r, a in zip(rows, y, strict=True)])
            ax.errorbar(
                x, y, yerr=err.T, marker="o", capsize=3, label=method, color=colors[rows[0]["arm"]]
            )
            ratios.update(x)
            for r in rows:  # the primary arm, in every panel's legend
                if r["arm"] == report.get("primary_arm"):
                    ax.plot([r["ratio"]], [r["accuracy"]], marker="*", ms=14, ls="none",
                            color=colors[r["arm"]], mec="black", mew=0.8,
                            label=f"{r['arm']} (primary)", zorder=5)  # fmt: skip
        for arm, (accuracy, low, high) in reference_arms(report, metric).items():
            ax.axhline(accuracy, color=colors[arm], ls="--", lw=1.2, label=arm)
            ax.axhspan(low, high, color=colors[arm], alpha=0.12, lw=0)
        ax.axhline(guess, color="0.4", ls=":", lw=1, label="a value of the sequence")
        ax.axvline(1.0, color="0.7", lw=0.8)
        ticks = sorted(ratios | {1.0})
        ax.set(xscale="log", xlabel="rank / pairs (log scale)", title=title, ylim=(0, 1.02))
        ax.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
        ax.minorticks_off()
    axes[0].set_ylabel("test query accuracy")
    axes[-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
    fig.suptitle(f"MQAR recall, {report['data']['n_pairs']} pairs: accuracy against rank")
    save_figure(fig, save_dir, name)
    return fig


def _mqar_panel(ax: plt.Axes, rows: list[Mapping], ranked: list[str], colors: Mapping) -> None:
    """One length's panel of :func:`plot_mqar`: a line per ranked arm, exact and control."""
    for arm, marker in zip(ranked, "osD^v<>", strict=False):
        line = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["rank_over_pairs"])
        x = [r["rank_over_pairs"] for r in line]
        y = np.array([r["accuracy"] for r in line])
        err = np.array([[a - r["ci_low"], r["ci_high"] - a] for r, a in zip(line, y, strict=True)])
        ax.errorbar(x, y, yerr=err.T.clip(0), marker=marker, capsize=3, color=colors[arm],
                    label=arm)  # fmt: skip
        for r, xi, yi in zip(line, x, y, strict=True):  # which pair count each point is
            ax.annotate(f"{r['pairs']}p", (xi, yi), textcoords="offset points", xytext=(4, -9),
                        fontsize=6, color=colors[arm])  # fmt: skip
    for arm, pick, word in (("exact", min, "lowest"), ("mean-attention", max, "highest")):
        values = [r["accuracy"] for r in rows if r["arm"] == arm]
        if values:
            ax.axhline(pick(values), color=colors[arm], ls="--", lw=1.2,
                       label=f"{arm} ({word} over pair counts)")  # fmt: skip
    ax.axvline(1.0, color="0.7", lw=0.8)
    ticks = sorted({r["rank_over_pairs"] for r in rows if r["rank"] is not None} | {1.0})
    ax.set(xscale="log", xlabel="rank / pairs (log scale)", ylim=(0, 1.02))
    ax.set_xticks(ticks, labels=[f"{t:.2g}" for t in ticks], fontsize=7)
    ax.minorticks_off()


def plot_mqar(
    mqar: Mapping, save_dir: str | os.PathLike | None = None, name: str = "mqar_rank_over_pairs"
) -> Figure:
    """MQAR as Zoology reports it: test query accuracy against rank / pairs, one line per
    RPKA rank across the pair counts, one panel per evaluation length.

    Reads ``frontier.json``'s ``mqar`` (:func:`rpka.verdict.frontier.mqar_curve`): each point is
    the mean over the evaluation seeds with its 95 % t interval. Exact attention and the
    control have no rank: drawn as the lowest (exact) and highest (control) accuracy over
    the pair counts, dashed. A pair count whose exact arm missed its learnability bar is
    left out (nothing there is read); so is a rank trained at one pair count only (no
    line: it is in :func:`rpka.report.frontier.mqar_table`). Each point is labelled with its
    pair count ("16p"); the vertical line marks rank = pairs.
    """
    unread = unread_pairs(mqar)
    rows = [r for r in mqar["rows"] if r["pairs"] not in unread]  # read only
    factors = sorted({r["length_factor"] for r in rows})
    rank_of = {r["arm"]: r["rank"] for r in rows if r["rank"] is not None}
    # a line needs two pair counts: a rank trained at one only (the 8-pair bench's r4 and
    # positive control) stays in the table, keeping a panel at <= 6 series
    counts = Counter(r["arm"] for r in rows if r["rank"] is not None and r["length_factor"] == 1)
    ranked = sorted((a for a in rank_of if counts[a] > 1), key=rank_of.get)
    colors = _arm_colors([*ranked, "exact", "mean-attention"])
    fig, axes = plt.subplots(
        1, len(factors), figsize=(4.6 * len(factors), 4), constrained_layout=True, sharey=True
    )
    axes = np.atleast_1d(axes)
    for ax, factor in zip(axes, factors, strict=True):
        _mqar_panel(ax, [r for r in rows if r["length_factor"] == factor], ranked, colors)
        ax.set_title("training length" if factor == 1 else f"{factor}x the training length")
    axes[0].set_ylabel("test query accuracy")
    axes[-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
    pairs = ", ".join(str(p) for p in sorted({r["pairs"] for r in rows}))
    fig.suptitle(f"MQAR recall at {pairs} pairs: accuracy against rank / pairs")
    save_figure(fig, save_dir, name)
    return fig
