"""Figures of the study, drawn from plain-JSON results (``mechanism.json``, ``bench_report.json``).

Every function takes result dicts as :mod:`rpka.mechanism` returns them (or as read back
from JSON), returns the matplotlib ``Figure``, and with ``save_dir`` also writes
``<save_dir>/<name>.png`` under a stable default name. Call :func:`set_style` once first so
every figure shares one look.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

RULE_ORDER = ("rpc", "greedy", "uniform")
Z_95 = 1.959963984540054  # two-sided 95 % normal quantile, for error bars
EIGEN_FLOOR = 1e-16  # eigenvalues below this (round-off) are drawn at the floor on log axes
DPI = 150


def set_style() -> None:
    """The one style of every figure: seaborn whitegrid, paper context, colourblind palette."""
    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", font_scale=1.1)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": DPI, "savefig.bbox": "tight"})


def save_figure(fig: Figure, save_dir: str | os.PathLike | None, name: str) -> Path | None:
    """Write ``fig`` to ``save_dir/name.png`` (the folder is created); no-op without a folder."""
    if save_dir is None:
        return None
    path = Path(save_dir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _quality(result: Mapping) -> Mapping:
    """Accept a full mechanism-study result or its ``quality`` part."""
    return result["quality"] if "quality" in result else result


def _rules(frame: pd.DataFrame) -> list[str]:
    return [rule for rule in RULE_ORDER if rule in set(frame["rule"])]


# --------------------------------------------------------------------------- trace identity


def plot_trace_identity(
    result: Mapping,
    layer: int | None = None,
    head: int | None = None,
    save_dir: str | os.PathLike | None = None,
    name: str = "mechanism_trace_identity",
) -> Figure:
    """Predicted against observed one-step trace decrease per step, and the z-scores.

    Left: for one head (default: the signature's worst-case head) the prediction
    ``||R_t||_F^2 / tr R_t`` and the Monte Carlo mean with +/- 1.96 SE bars, as fractions of
    the initial trace. Right: every studied head's z-score per step with the +/- threshold.
    """
    heads = result["trace_identity"]
    sig = result["mechanism_signature"]
    layer = sig["layer"] if layer is None else layer
    head = sig["head"] if head is None else head
    chosen = next((h for h in heads if h["layer"] == layer and h["head"] == head), None)
    if chosen is None:
        raise ValueError(f"no trace-identity result for layer={layer}, head={head}")
    threshold = float(result.get("config", {}).get("z_threshold", 4.0))

    fig, (ax_pred, ax_z) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    unit = chosen["trace0"]
    steps = np.arange(chosen["steps"])
    predicted = np.asarray(chosen["predicted"]) / unit
    observed = np.asarray(chosen["mc_mean"]) / unit
    half_width = Z_95 * np.asarray(chosen["mc_se"]) / unit
    ax_pred.plot(
        steps, predicted, color="k", lw=1.5, label=r"predicted $\|R_t\|_F^2/\mathrm{tr}\,R_t$"
    )
    ax_pred.errorbar(
        steps,
        observed,
        yerr=half_width,
        fmt="o",
        ms=3,
        capsize=2,
        color="C0",
        label=f"observed mean of {sig['n_draws']} draws ($\\pm$1.96 SE)",
    )
    ax_pred.set(
        xlabel="RPCholesky step t",
        ylabel=r"one-step trace decrease / tr $A_\tau$ (fraction)",
        title=f"layer {layer}, head {head}: expected trace decrease",
        yscale="log",
    )
    ax_pred.legend(loc="best")

    for i, h in enumerate(heads):
        z = np.asarray(h["z"], dtype=float)
        ax_z.plot(np.arange(len(z)), z, "o", ms=2.5, alpha=0.6, color=f"C{i % 10}")
    for sign in (-1, 1):
        ax_z.axhline(sign * threshold, color="C3", ls="--", lw=1)
    ax_z.axhline(0, color="k", lw=0.8)
    ax_z.set(
        xlabel="RPCholesky step t",
        ylabel="z = (observed - predicted) / SE (standard errors)",
        title=f"{len(heads)} heads: z-scores, band $\\pm${threshold:g}",
    )
    save_figure(fig, save_dir, name)
    return fig


# --------------------------------------------------------------------------- quality curves


def _curve_axes(
    ax: plt.Axes, summary: pd.DataFrame, value: str, low: str, high: str, label_suffix: str = ""
) -> None:
    for i, rule in enumerate(_rules(summary)):
        part = summary[summary["rule"] == rule].sort_values("rank")
        ax.plot(part["rank"], part[value], "o-", color=f"C{i}", label=f"{rule}{label_suffix}")
        ax.fill_between(part["rank"], part[low], part[high], color=f"C{i}", alpha=0.15)


def plot_residual_trace(
    result: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str = "mechanism_residual_trace",
    ax: plt.Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Residual trace against rank for each pivot rule, with the optimum, on log axes.

    Lines: mean over heads and seeds; bands: min-max over heads and seeds; dashed: the
    optimal rank-r trace error (sum of the eigenvalues beyond r), all as fractions of tr A.
    """
    summary = pd.DataFrame(_quality(result)["summary"])
    summary = summary[summary["rel_residual_mean"] > 0]  # rank = N: exactly zero, off a log axis
    fig, ax = _figure(ax)
    _curve_axes(ax, summary, "rel_residual_mean", "rel_residual_min", "rel_residual_max")
    optimum = summary.groupby("rank")["rel_optimum_mean"].first()
    optimum = optimum[optimum > 0]
    ax.plot(optimum.index, optimum.values, "k--", lw=1.5, label="optimum (eigenvalues > r)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="rank r (landmarks)",
        ylabel=r"residual trace tr$(A - \hat A_r)$ / tr $A$ (fraction)",
        title=title or "Residual trace against rank",
    )
    ax.set_xticks(sorted(summary["rank"].unique()), labels=sorted(summary["rank"].unique()))
    ax.minorticks_off()
    ax.legend(loc="best")
    save_figure(fig, save_dir, name)
    return fig


def plot_output_error(
    result: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str = "mechanism_output_error",
    ax: plt.Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Relative error of RPKA's attention output against exact SDPA, against rank."""
    summary = pd.DataFrame(_quality(result)["summary"])
    fig, ax = _figure(ax)
    _curve_axes(ax, summary, "output_error_mean", "output_error_min", "output_error_max")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="rank r (landmarks)",
        ylabel=r"relative output error $\|\hat O - O\|_F / \|O\|_F$",
        title=title or "RPKA output error against exact attention",
    )
    ax.set_xticks(sorted(summary["rank"].unique()), labels=sorted(summary["rank"].unique()))
    ax.minorticks_off()
    ax.legend(loc="best")
    save_figure(fig, save_dir, name)
    return fig


def _figure(ax: plt.Axes | None) -> tuple[Figure, plt.Axes]:
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    return fig, ax


# --------------------------------------------------------------------------- trained vs init


def plot_spectra(
    results: Mapping[str, Mapping],
    save_dir: str | os.PathLike | None = None,
    name: str = "mechanism_spectra",
    ax: plt.Axes | None = None,
) -> Figure:
    """Eigenvalue spectra of the pivoted matrix, ``lambda_i / tr A``, one colour per model.

    ``results`` maps a label (e.g. ``"trained"``, ``"init"``) to a study result. Faint lines:
    every head; bold: the median over heads.
    """
    fig, ax = _figure(ax)
    for i, (label, result) in enumerate(results.items()):
        spectra = [np.asarray(s["eigenvalues"]) for s in _quality(result)["spectra"]]
        curves = np.clip(np.stack(spectra), EIGEN_FLOOR, None)
        index = np.arange(1, curves.shape[1] + 1)
        for curve in curves:
            ax.plot(index, curve, color=f"C{i}", alpha=0.15, lw=0.8)
        ax.plot(index, np.median(curves, 0), color=f"C{i}", lw=2, label=f"{label} (median head)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="eigenvalue index i",
        ylabel=r"eigenvalue $\lambda_i$ / tr $A$ (fraction)",
        title="Spectrum of the pivoted kernel matrix",
    )
    ax.legend(loc="best")
    save_figure(fig, save_dir, name)
    return fig


def plot_trained_vs_init(
    results: Mapping[str, Mapping],
    rule: str = "rpc",
    save_dir: str | os.PathLike | None = None,
    name: str = "mechanism_trained_vs_init",
) -> Figure:
    """Models side by side in three panels: spectrum, residual trace, output error.

    ``results`` maps labels (e.g. ``{"trained": ..., "init": ...}``) to study results; one
    colour per model. Residual trace: ``rule``'s mean over heads and seeds (solid, band
    min-max) and the optimum (dashed); output error: ``rule``'s mean (band min-max).
    """
    fig, (ax_eig, ax_res, ax_err) = plt.subplots(1, 3, figsize=(16, 4.2), constrained_layout=True)
    plot_spectra(results, ax=ax_eig)
    for i, (label, result) in enumerate(results.items()):
        summary = pd.DataFrame(_quality(result)["summary"])
        part = summary[(summary["rule"] == rule) & (summary["rel_residual_mean"] > 0)]
        part = part.sort_values("rank")
        ax_res.plot(
            part["rank"], part["rel_residual_mean"], "o-", color=f"C{i}", label=f"{label}: {rule}"
        )
        ax_res.fill_between(
            part["rank"],
            part["rel_residual_min"],
            part["rel_residual_max"],
            color=f"C{i}",
            alpha=0.15,
        )
        ax_res.plot(
            part["rank"], part["rel_optimum_mean"], "--", color=f"C{i}", label=f"{label}: optimum"
        )
        part = summary[summary["rule"] == rule].sort_values("rank")
        ax_err.plot(
            part["rank"], part["output_error_mean"], "o-", color=f"C{i}", label=f"{label}: {rule}"
        )
        ax_err.fill_between(
            part["rank"],
            part["output_error_min"],
            part["output_error_max"],
            color=f"C{i}",
            alpha=0.15,
        )
    ax_res.set(
        xscale="log",
        yscale="log",
        xlabel="rank r (landmarks)",
        ylabel=r"residual trace / tr $A$ (fraction)",
        title="Residual trace against rank",
    )
    ax_err.set(
        xscale="log",
        yscale="log",
        xlabel="rank r (landmarks)",
        ylabel=r"relative output error $\|\hat O - O\|_F / \|O\|_F$",
        title="RPKA output error against exact",
    )
    ranks = sorted({row["rank"] for r in results.values() for row in _quality(r)["summary"]})
    for ax in (ax_res, ax_err):
        ax.set_xticks(ranks, labels=ranks)
        ax.minorticks_off()
        ax.legend(loc="best")
    save_figure(fig, save_dir, name)
    return fig


# --------------------------------------------------------------------------- the bench

OUTPUT_ERROR_FLOOR = 1e-6  # relative errors below this are round-off (drawn at the floor)
VERDICT_COLOURS = {"win": "C2", "loss": "C3", "inconclusive": "0.35"}
GROUP_MARKERS = {
    "baseline": "*",
    "RPKA rank": "o",
    "RPKA ablation": "s",
    "peer": "D",
}


def _arm_colour(report: Mapping, arm_name: str) -> object:
    """One colour per arm, the same in every bench figure (its place in the config).

    The style's palette for up to 10 arms, ``tab20`` beyond (a full study has 13).
    """
    names = list(report["arms"])
    index = names.index(arm_name)
    if len(names) <= 10:
        return f"C{index}"
    return matplotlib.colormaps["tab20"](index % 20)


def _group_handles(groups: Sequence[str], **style: object) -> list:
    """Legend entries for the marker of each arm group present."""
    from matplotlib.lines import Line2D

    present = [g for g in GROUP_MARKERS if g in set(groups)]
    return [
        Line2D([], [], marker=GROUP_MARKERS[g], ls="none", color="0.3", label=g, **style)
        for g in present
    ]


def _verdict_kind(verdict: str) -> str:
    if verdict.startswith("significant win"):
        return "win"
    if verdict.startswith("significant loss"):
        return "loss"
    return "inconclusive"


def plot_forest(
    report: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str = "bench_forest",
) -> Figure:
    """Every arm's paired delta against the baseline with its 95 % CI (a forest plot).

    One row per non-baseline arm, in the config's order (rank sweep, ablations, peers):
    the mean per-seed difference (arm - baseline; negative = lower error than the baseline)
    with its paired-t 95 % CI, a zero line, and on the right the Holm-adjusted p, the wins
    k/n and the verdict. Colour: significant win / loss / inconclusive.
    """
    from rpka.tables import arm_group  # tables import plots: keep the cycle local

    names = [n for n, arm in report["arms"].items() if arm.get("comparison")]
    fig, ax = plt.subplots(figsize=(9.5, 1.2 + 0.42 * len(names)), constrained_layout=True)
    for y, arm_name in enumerate(names):
        c = report["arms"][arm_name]["comparison"]
        colour = VERDICT_COLOURS[_verdict_kind(c["verdict"])]
        marker = GROUP_MARKERS.get(arm_group(report, arm_name), "o")
        low, high = c["ci_low"], c["ci_high"]
        if np.isfinite(low) and np.isfinite(high):
            ax.plot([low, high], [y, y], color=colour, lw=2)
        ax.plot(c["delta_mean"], y, marker, color=colour, ms=7)
        p_adj = c["p_adjusted"]
        p_text = f"p_adj={p_adj:.3g}" if p_adj is not None and np.isfinite(p_adj) else "p_adj=n/a"
        ax.annotate(
            f"{p_text}  {c['idea_wins']}/{c['n_pairs']} wins  {_verdict_kind(c['verdict'])}",
            xy=(1.01, y),
            xycoords=("axes fraction", "data"),
            va="center",
            fontsize=8,
        )
    ax.axvline(0.0, color="k", lw=1)
    from matplotlib.lines import Line2D

    verdicts = [
        Line2D([], [], color=VERDICT_COLOURS[k], lw=2, label=k)
        for k in ("win", "loss", "inconclusive")
    ]
    groups = _group_handles([arm_group(report, n) for n in names])
    fig.legend(handles=groups + verdicts, loc="outside lower center", fontsize=8, ncol=6)
    ax.set_yticks(range(len(names)), labels=names)
    ax.set_ylim(len(names) - 0.5, -0.5)  # first arm on top
    metric = report.get("metric", "mse").upper()
    ax.set(
        xlabel=f"test {metric}: arm - {report['baseline_arm']} (mean over paired seeds, 95 % CI)",
        title=f"Paired difference against {report['baseline_arm']} "
        f"({report['n_seeds']} evaluation seeds, Holm over {len(names)} arms)",
    )
    save_figure(fig, save_dir, name)
    return fig


def plot_output_error_by_arm(
    report: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str = "bench_output_error",
) -> Figure:
    """Each arm's relative attention output error against exact, against rank.

    Two panels: on each arm's own trained Q/K, and on the exact arm's (the same inputs
    for every method). Lines: mean over layers, windows, heads and draws; bands: 10-90 %
    quantiles; the marker at each arm's own (training) rank is filled. Errors below
    ``OUTPUT_ERROR_FLOOR`` (a rank that covers every point: exact to round-off) are drawn
    at the floor.
    """
    from rpka.tables import arm_group

    frame = pd.DataFrame(report["output_error"]["rows"])
    for column in ("error_mean", "error_q10", "error_q90"):  # exact to round-off: at the floor
        frame[column] = frame[column].clip(lower=OUTPUT_ERROR_FLOOR)
    panels = [p for p in ("own", "exact") if p in set(frame["inputs"])]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6.5 * len(panels), 4.5), constrained_layout=True, squeeze=False
    )
    for ax, inputs in zip(axes[0], panels, strict=True):
        part = frame[frame["inputs"] == inputs]
        for arm_name in (a for a in report["arms"] if a in set(part["arm"])):
            rows = part[part["arm"] == arm_name].sort_values("rank")
            colour = _arm_colour(report, arm_name)
            marker = GROUP_MARKERS.get(arm_group(report, arm_name), "o")
            ax.plot(
                rows["rank"],
                rows["error_mean"],
                "-",
                marker=marker,
                color=colour,
                mfc="white",
                label=arm_name,
            )
            ax.fill_between(
                rows["rank"], rows["error_q10"], rows["error_q90"], color=colour, alpha=0.08
            )
            own = rows[rows["rank"] == rows["own_rank"]]
            ax.plot(own["rank"], own["error_mean"], marker, color=colour)
        ranks = sorted(part["rank"].unique())
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="rank (landmarks / segments / features)",
            ylabel=r"relative output error $\|\hat O - O\|_F / \|O\|_F$",
            title=f"on the {'arm' if inputs == 'own' else 'exact arm'}'s trained Q/K",
        )
        ax.set_xticks(ranks, labels=ranks)
        ax.minorticks_off()
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
    save_figure(fig, save_dir, name)
    return fig


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


def plot_error_vs_time(
    report: Mapping,
    latency_ms: Mapping[str, float] | None = None,
    latency_length: int | None = None,
    save_dir: str | os.PathLike | None = None,
    name: str = "bench_error_vs_time",
) -> Figure:
    """Test error against cost, with the Pareto front highlighted.

    Left: each arm's mean test metric (95 % CI bars) against its median training step time
    (``timings.step_ms_median``). Right (when ``latency_ms`` is given, e.g.
    :func:`rpka.scaling.forward_latency` of a ``--bench-preset`` scaling run): the same
    error against the attention's forward latency at ``latency_length`` tokens. The front
    (no arm both faster and better) is joined by a line and its points circled.
    """
    from rpka.tables import arm_group

    names = list(report["arms"])
    panels = [("step", report["timings"]["step_ms_median"], "training step (ms, median)")]
    if latency_ms:
        length = f" at n = {latency_length}" if latency_length else ""
        panels.append(("latency", latency_ms, f"attention forward latency{length} (ms)"))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(7 * len(panels), 5), constrained_layout=True, squeeze=False
    )
    metric = report.get("metric", "mse").upper()
    for ax, (_, times, xlabel) in zip(axes[0], panels, strict=True):
        shown = [n for n in names if times.get(n) is not None]
        x = [float(times[n]) for n in shown]
        full = [report["arms"][n]["full"] for n in shown]
        y = [f["mean"] for f in full]
        front = set(pareto_front(x, y))
        for j, arm_name in enumerate(shown):
            f = full[j]
            err = [[f["mean"] - f["ci_low"]], [f["ci_high"] - f["mean"]]]
            if not np.all(np.isfinite(err)):
                err = None
            colour = _arm_colour(report, arm_name)
            marker = GROUP_MARKERS.get(arm_group(report, arm_name), "o")
            ax.errorbar(
                x[j], y[j], yerr=err, fmt=marker, color=colour, ms=7, capsize=2, label=arm_name
            )
            if j in front:  # circled and named: the arms worth their cost
                ax.plot(x[j], y[j], "o", ms=15, mfc="none", mec="k", mew=1.2)
                ax.annotate(
                    arm_name, (x[j], y[j]), xytext=(8, 6), textcoords="offset points", fontsize=8
                )
        order = sorted(front, key=lambda j: x[j])
        ax.plot([x[j] for j in order], [y[j] for j in order], "k--", lw=1, label="Pareto front")
        ax.set(xscale="log", xlabel=xlabel, ylabel=f"test {metric} (mean, 95 % CI)")
        for axis_format in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
            axis_format(matplotlib.ticker.FormatStrFormatter("%g"))
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
    axes[0][0].set_title("Error against training cost")
    if len(panels) > 1:
        axes[0][1].set_title("Error against inference cost")
    save_figure(fig, save_dir, name)
    return fig


__all__ = [
    "pareto_front",
    "plot_error_vs_time",
    "plot_forest",
    "plot_output_error_by_arm",
    "plot_output_error",
    "plot_residual_trace",
    "plot_spectra",
    "plot_trace_identity",
    "plot_trained_vs_init",
    "save_figure",
    "set_style",
]
