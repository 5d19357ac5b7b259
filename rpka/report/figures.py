"""The figures' shared style and the bench's figures, drawn from the plain-JSON results
(``bench_report.json``); the mechanism's are :mod:`rpka.report.figures_mechanism`, the
other sections' the other ``figures_*`` modules.

Every function takes result dicts as the study writes them (or as read back from JSON),
returns the matplotlib ``Figure``, and with ``save_dir`` also writes
``<save_dir>/<name>.png`` under a stable default name. Call :func:`set_style` once first so
every figure shares one look.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from rpka.io import FIGURE_DPI, inline_png, save_figure
from rpka.report import palette
from rpka.report.tables import arm_group, arm_label
from rpka.tracks import get_task


def set_style() -> None:
    """The one style of every figure: seaborn whitegrid, paper context, colourblind palette.

    In a notebook, a figure is then shown inline from the PNG its plotting function saved
    (:func:`rpka.io.inline_png`) instead of being drawn a second time by the inline backend.
    """
    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", font_scale=1.1)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": FIGURE_DPI, "savefig.bbox": "tight"})
    ipython = sys.modules.get("IPython")  # loaded in a notebook kernel; not imported here
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and hasattr(shell, "display_formatter"):
        # the inline backend registers its own PNG formatter when it loads, at a kernel's
        # first figure; loaded now (it acts only if it is the backend), ours comes after it
        if importlib.util.find_spec("matplotlib_inline") is not None:
            importlib.import_module("matplotlib_inline.backend_inline")
        shell.display_formatter.formatters["image/png"].for_type(Figure, inline_png)


def figure(ax: plt.Axes | None) -> tuple[Figure, plt.Axes]:
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    return fig, ax


# --------------------------------------------------------------------------- bench


def _arm_colors(names: list[str]) -> dict[str, object]:
    """One colour per arm, the same in every figure of every track (:mod:`rpka.report.palette`:
    the colour follows from the arm's name, not from its place in a list)."""
    return palette.arm_colours(names)


def panel_grid(
    n: int, width: float, height: float, max_cols: int = 3
) -> tuple[Figure, list[plt.Axes]]:
    """``n`` panels of ``width`` x ``height`` inches in rows of at most ``max_cols`` (a
    figure stays readable on a page); the unused cells of the last row are removed."""
    cols = min(n, max_cols)
    rows = -(-n // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             constrained_layout=True)  # fmt: skip
    axes = list(grid.flat)
    for ax in axes[n:]:
        ax.remove()
    return fig, axes[:n]


def legend_entries(axes: Iterable[plt.Axes]) -> dict[str, object]:
    """Label -> handle of everything drawn with a label on ``axes``, first one kept: one
    legend for several panels."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    return entries


def metric_label(report: Mapping, metric: str | None = None) -> str:
    """e.g. "MSE (standardised units)" (forecast) or "perplexity" (lm): the track's label."""
    return get_task(report["track"]).text.metric_label(metric or report["metric"])


def _reference_lines(report: Mapping, split: str) -> list[tuple[str, float, str]]:
    """(label, value, line style) of the track's references in the report's metric:
    forecast: the mean and linear forecasts; lm: the exact floor and the bigram model."""
    return get_task(report["track"]).text.reference_lines(report, split)


def plot_sweep(
    report: Mapping, save_dir: str | os.PathLike | None = None, name: str = "bench_sweep"
) -> Figure:
    """Validation error against learning rate per arm (each sweep seed a dot, the mean a
    line), the track's references (naive forecasts; lm: floor and bigram) as horizontal
    lines."""
    metric = report["metric"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), constrained_layout=True)
    colors = _arm_colors(list(report["arms"]))
    for arm, entry in report["arms"].items():
        lrs = [cell["lr"] for cell in entry["sweep"]]
        means = [
            cell["score"] if np.isfinite(cell["score"] or np.inf) else np.nan
            for cell in entry["sweep"]
        ]
        ax.plot(lrs, means, "-", color=colors[arm], label=arm, lw=1.5)
        for cell in entry["sweep"]:
            values = [v for v in cell["val_per_seed"] if v is not None]
            ax.plot([cell["lr"]] * len(values), values, "o", ms=3, alpha=0.5, color=colors[arm])
    for label, value, ls in _reference_lines(report, "val"):
        ax.axhline(value, color="0.4", ls=ls, lw=1, label=label)
    ax.set(
        xscale="log",
        xlabel="learning rate (log scale)",
        ylabel=f"validation {metric_label(report, metric)}",
        title="Learning-rate sweep on validation (dots: sweep seeds)",
    )
    ax.legend(fontsize=8, ncol=2, loc="best")
    save_figure(fig, save_dir, name)
    return fig


def plot_learning_curves(
    report: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str = "bench_learning_curves",
) -> Figure:
    """Training loss and validation error per epoch at each arm's best learning rate
    (mean over the evaluation seeds, band: min-max)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True, sharex=True)
    colors = _arm_colors(list(report["arms"]))
    for arm, entry in report["arms"].items():
        for ax, key in zip(axes, ("train_loss", f"val_{report['metric']}"), strict=True):
            curves = np.array(
                [
                    [np.nan if v is None else v for v in seed]
                    for seed in entry["learning_curves"][key]
                ],
                dtype=float,
            )
            if curves.size == 0:
                continue
            epochs = np.arange(1, curves.shape[1] + 1)
            ax.plot(epochs, np.nanmean(curves, 0), color=colors[arm], label=arm)
            ax.fill_between(
                epochs, np.nanmin(curves, 0), np.nanmax(curves, 0), color=colors[arm], alpha=0.15
            )
    loss = get_task(report["track"]).text.loss_label
    axes[0].set(
        xlabel="epoch", ylabel=f"training {loss}", title="Training loss (best lr, evaluation seeds)"
    )
    axes[1].set(
        xlabel="epoch",
        ylabel=f"validation {metric_label(report)}",
        title="Validation error (best lr, evaluation seeds)",
    )
    axes[1].legend(fontsize=8)
    save_figure(fig, save_dir, name)
    return fig


def plot_paired_seeds(
    report: Mapping, save_dir: str | os.PathLike | None = None, name: str = "bench_paired_seeds"
) -> Figure:
    """Test error of every evaluation seed under the baseline and under each other arm,
    one line per seed (the pair shares data order and initialisation)."""
    base = report["baseline_arm"]
    others = [a for a in report["arms"] if a != base]
    metric = report["metric"]
    base_values = report["arms"][base]["full"]["per_seed"]
    fig, ax = plt.subplots(
        figsize=(max(5.0, 1.4 * (len(others) + 1)), 4.2), constrained_layout=True
    )
    for i, arm in enumerate(others):
        values = report["arms"][arm]["full"]["per_seed"]
        for b, v in zip(base_values, values, strict=True):
            if b is None or v is None:
                continue
            color = "C2" if v < b else "C3"
            ax.plot([2 * i, 2 * i + 1], [b, v], "-o", color=color, ms=3, lw=1, alpha=0.7)
    ax.set_xticks([x for i in range(len(others)) for x in (2 * i, 2 * i + 1)])
    ax.set_xticklabels([lab for a in others for lab in (base, a)], rotation=45, ha="right")
    ax.set(
        ylabel=f"test {metric_label(report, metric)}",
        title="Per-seed pairs (green: the arm beats exact on that seed)",
    )
    save_figure(fig, save_dir, name)
    return fig


def plot_deltas(
    report: Mapping, save_dir: str | os.PathLike | None = None, name: str = "bench_deltas"
) -> Figure:
    """Per-seed differences (arm - baseline) as dots, the mean with its 95 % t-interval,
    and the zero line; the verdict (Holm-adjusted) in the label."""
    rows = [(arm, e["comparison"]) for arm, e in report["arms"].items() if e.get("comparison")]
    fig, ax = plt.subplots(figsize=(8, 0.9 * len(rows) + 1.6), constrained_layout=True)
    for i, (_, c) in enumerate(rows):
        diffs = np.asarray(c["per_seed_diffs"], dtype=float)
        jitter = np.linspace(-0.15, 0.15, len(diffs)) if len(diffs) > 1 else np.zeros(1)
        ax.plot(diffs, i + jitter, "o", ms=4, alpha=0.6, color="C0")
        if c["ci_low"] is not None and np.isfinite(c["ci_low"]):
            ax.plot([c["ci_low"], c["ci_high"]], [i, i], color="k", lw=2)
        ax.plot([c["delta_mean"]], [i], "D", color="k", ms=6)
    ax.axvline(0, color="C3", lw=1, ls="--")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(
        [
            f"{arm}\n{c['verdict'].split(' (')[0]}, Holm p={c['p_adjusted']:.2g}, "
            f"{c['idea_wins']}/{c['n_pairs']} wins"
            for arm, c in rows
        ],
        fontsize=8,
    )
    metric_name = get_task(report["track"]).text.metric_short(report["metric"])
    ax.set(
        xlabel=f"test {metric_name} difference, arm - {report['baseline_arm']} "
        "(negative: arm better)",
        title="Paired differences: seeds (dots), mean and 95% CI (black)",
    )
    save_figure(fig, save_dir, name)
    return fig


def plot_train_curves(
    results: Mapping[str, Mapping],
    save_dir: str | os.PathLike | None = None,
    name: str = "train_curves",
) -> Figure:
    """Learning curves of single training runs: ``results`` maps a label to a run result
    (``rpka.training.train.train_run``); its first member's curves are drawn."""
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for i, (label, result) in enumerate(results.items()):
        member = result["members"][0]
        epochs = np.arange(1, len(member["train_loss"]) + 1)
        ax.plot(epochs, member["train_loss"], "--", color=f"C{i}", label=f"{label}: train")
        ax.plot(epochs, member["val_mse"], "-o", ms=3, color=f"C{i}", label=f"{label}: validation")
    ax.set(xlabel="epoch", ylabel="MSE (standardised units)", title="Learning curves")
    ax.legend(fontsize=8)
    save_figure(fig, save_dir, name)
    return fig


def plot_forecasts(
    context: np.ndarray,
    truth: np.ndarray,
    forecasts: Mapping[str, np.ndarray],
    save_dir: str | os.PathLike | None = None,
    name: str = "train_forecasts",
) -> Figure:
    """Forecasts against the truth for a few windows: context (W, L), truth (W, H),
    forecasts {label: (W, H)}; all in the window's standardised units."""
    n_windows, length = context.shape
    horizon = truth.shape[1]
    fig, axes = plt.subplots(
        n_windows, 1, figsize=(9, 2.3 * n_windows), squeeze=False, constrained_layout=True
    )
    t_ctx = np.arange(-length, 0)
    t_hor = np.arange(horizon)
    for w, ax in enumerate(axes[:, 0]):
        ax.plot(t_ctx, context[w], color="0.5", lw=1, label="context")
        ax.plot(t_hor, truth[w], color="k", lw=1.5, label="truth")
        for i, (label, pred) in enumerate(forecasts.items()):
            ax.plot(t_hor, pred[w], lw=1.3, color=f"C{i}", label=label)
        ax.axvline(-0.5, color="0.7", lw=0.8)
        ax.set(ylabel="value (std. units)")
    axes[0, 0].legend(fontsize=8, ncol=len(forecasts) + 2, loc="upper left")
    axes[-1, 0].set(xlabel="time step relative to the forecast origin")
    save_figure(fig, save_dir, name)
    return fig


# --------------------------------------------------------------------------- study of arms
# (ablations and peers: output error against exact per arm, error against cost)

OUTPUT_ERROR_FLOOR = 1e-6  # relative errors below this are round-off (drawn at the floor)
GROUP_MARKERS = {
    "baseline": "*",
    "RPKA rank": "o",
    "RPKA ablation": "s",
    "peer": "D",
    "control": "X",
}


def _group_handles(groups: Sequence[str], **style: object) -> list:
    """Legend entries for the marker of each arm group present."""

    present = [g for g in GROUP_MARKERS if g in set(groups)]
    return [
        Line2D([], [], marker=GROUP_MARKERS[g], ls="none", color="0.3", label=g, **style)
        for g in present
    ]


MAX_SERIES = 6  # arms per panel at most: more are split over panels


def output_error_panels(report: Mapping) -> list[tuple[str, list[str]]]:
    """(title, arms) per column of the output-error figure: the arms with an output error,
    by group (RPKA ranks, ablations, peers, ...), at most ``MAX_SERIES`` per panel."""
    measured = set(pd.DataFrame(report["output_error"]["rows"])["arm"])
    arms = [a for a in report["arms"] if a in measured]
    groups: dict[str, list[str]] = {}
    for arm in arms:
        groups.setdefault(arm_group(report, arm), []).append(arm)
    panels = []
    for group, members in groups.items():
        chunks = [members[i : i + MAX_SERIES] for i in range(0, len(members), MAX_SERIES)]
        for k, chunk in enumerate(chunks):
            panels.append((group + (f" ({k + 1} of {len(chunks)})" if len(chunks) > 1 else ""),
                           chunk))  # fmt: skip
    return panels


def _output_error_panel(
    ax: plt.Axes, report: Mapping, part: pd.DataFrame, arms: list[str], title: str
) -> None:
    colours = _arm_colors(list(report["arms"]))
    for arm_name in arms:
        rows = part[part["arm"] == arm_name].sort_values("rank")
        colour = colours[arm_name]
        marker = GROUP_MARKERS.get(arm_group(report, arm_name), "o")
        primary = arm_name == report.get("primary_arm")
        ax.plot(rows["rank"], rows["error_mean"], "-", marker=marker, color=colour, mfc="white",
                lw=2.2 if primary else 1.5,
                label=arm_label(report, arm_name))  # fmt: skip
        ax.fill_between(rows["rank"], rows["error_q10"], rows["error_q90"], color=colour,
                        alpha=0.08)  # fmt: skip
        own = rows[rows["rank"] == rows["own_rank"]]
        ax.plot(own["rank"], own["error_mean"], marker, color=colour)
    ranks = sorted(part["rank"].unique())
    error = r"$\|\hat O - O\|_F / \|O\|_F$"
    ax.set(xscale="log", yscale="log", title=title,
           xlabel="rank: landmarks / segments / features (log scale)",
           ylabel=f"relative output error {error}\n(log scale)")  # fmt: skip
    ax.set_xticks(ranks, labels=ranks)
    ax.minorticks_off()
    ax.legend(loc="best", fontsize=7)


def plot_output_error_by_arm(
    report: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str = "bench_output_error",
) -> Figure:
    """Each arm's relative attention output error against exact, against rank (log-log).

    Rows: on each arm's own trained Q/K, and on the exact arm's (the same inputs for every
    method); columns: the arm groups, at most ``MAX_SERIES`` arms each
    (:func:`output_error_panels`), the primary arm marked in its legend. Lines: mean over
    layers, windows, heads and draws; bands: 10-90 % quantiles; the marker at each arm's
    own (training) rank is filled. Errors below ``OUTPUT_ERROR_FLOOR`` (a rank that covers
    every point: exact to round-off) are drawn at the floor.
    """
    frame = pd.DataFrame(report["output_error"]["rows"])
    for column in ("error_mean", "error_q10", "error_q90"):  # exact to round-off: at the floor
        frame[column] = frame[column].clip(lower=OUTPUT_ERROR_FLOOR)
    inputs = [p for p in ("own", "exact") if p in set(frame["inputs"])]
    columns = output_error_panels(report)
    fig, axes = plt.subplots(len(inputs), len(columns), figsize=(5.0 * len(columns),
                             4.0 * len(inputs)), constrained_layout=True, squeeze=False,
                             sharey=True)  # fmt: skip
    for row, source in enumerate(inputs):
        part = frame[frame["inputs"] == source]
        on = f"on the {'arm' if source == 'own' else 'exact arm'}'s trained Q/K"
        for col, (group, arms) in enumerate(columns):
            _output_error_panel(axes[row][col], report, part, arms, f"{group}, {on}")
    save_figure(fig, save_dir, name)
    return fig


__all__ = [
    "plot_deltas",
    "plot_forecasts",
    "plot_learning_curves",
    "plot_output_error_by_arm",
    "plot_paired_seeds",
    "plot_sweep",
    "plot_train_curves",
    "save_figure",
    "set_style",
]
