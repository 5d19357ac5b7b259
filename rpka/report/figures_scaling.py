"""Figures of the speed and long-context studies: latency, memory and speed-up against
length (``rpka.speed.scaling``), decoding latency (``rpka.speed.decoding``) and long-context
training (``rpka.study.longctx``), each from its result file; the shared styling is
``rpka.report.figures``'."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from rpka.io import save_figure
from rpka.report import palette
from rpka.report.figures import figure
from rpka.report.tables import longctx_table
from rpka.speed.analysis import (
    SCALING_MEASURES,
    crossover_table,
    decode_frame,
    device_tag,
    fit_loglog_slope,
    scaling_frame,
    speedup_frame,
)

# --------------------------------------------------------------------------- scaling
# Attention latency and memory against sequence length (``rpka.speed.scaling`` JSON, CPU
# or GPU), decoding latency (``rpka.speed.decoding`` JSON). The numbers come from
# ``rpka.report.tables``.

EXACT_COLOUR = palette.EXACT


def _arm_styles(frame: pd.DataFrame) -> dict[str, dict]:
    """Line style per arm: exact black; RPKA at a rank in its colour of every figure
    (:func:`rpka.report.palette.rank_colour`), solid with filled markers; another method at that
    rank in the same colour, dotted with open markers."""
    styles = {}
    for arm, method, rank in (
        frame[["arm", "method", "rank"]].drop_duplicates().itertuples(index=False)
    ):
        if pd.isna(rank):
            styles[arm] = {"color": EXACT_COLOUR, "marker": "s", "ls": "-"}
        elif method == "rpka":
            styles[arm] = {"color": palette.rank_colour(int(rank)), "marker": "o", "ls": "-"}
        else:
            styles[arm] = {"color": palette.rank_colour(int(rank)), "marker": "^", "ls": ":",
                           "mfc": "none"}  # fmt: skip
    return styles


def _scaling_arms(frame: pd.DataFrame, methods: Sequence[str] | None) -> pd.DataFrame:
    if methods is None:
        return frame
    unknown = sorted(set(methods) - set(frame["method"]))
    if unknown:
        raise ValueError(f"methods {unknown} are not in the result: {sorted(set(frame['method']))}")
    return frame[frame["method"].isin(methods)]


def _loglog_panel(
    ax: plt.Axes, frame: pd.DataFrame, measure: str, styles: Mapping[str, dict]
) -> None:
    """Measured points per arm, and the fitted power law (dashed, over the fitted range)
    with its slope in the legend."""
    for arm, part in frame.groupby("arm", sort=False):
        part = part.dropna(subset=[measure]).sort_values("n")
        if part.empty:
            continue
        fit = fit_loglog_slope(part["n"], part[measure])
        style = dict(styles[arm])
        slope = "" if np.isnan(fit["slope"]) else f" (slope {fit['slope']:.2f})"
        ax.plot(part["n"], part[measure], ms=4, lw=1.2, label=f"{arm}{slope}", **style)
        if not np.isnan(fit["slope"]):
            grid = np.geomspace(fit["n_min"], fit["n_max"], 20)
            line = np.exp(fit["intercept"]) * grid ** fit["slope"]
            ax.plot(grid, line, color=style["color"], lw=2.5, alpha=0.35, ls="--")
    ax.set(xscale="log", yscale="log", xlabel="sequence length n (tokens, log scale)")
    ax.set_ylabel(f"{SCALING_MEASURES[measure]}, log scale")
    lengths = sorted(frame["n"].unique())
    ax.set_xticks(lengths, labels=[f"{n:,}" for n in lengths])
    ax.minorticks_off()


def _scaling_figure(
    scaling: Mapping,
    measures: Sequence[str],
    methods: Sequence[str] | None,
    title: str,
) -> Figure:
    frame = _scaling_arms(scaling_frame(scaling), methods)
    styles = _arm_styles(frame)
    fig, axes = plt.subplots(
        1, len(measures), figsize=(6.5 * len(measures), 4.8), constrained_layout=True
    )
    axes = np.atleast_1d(axes)
    for ax, measure in zip(axes, measures, strict=True):
        _loglog_panel(ax, frame, measure, styles)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small", frameon=False)
    fig.suptitle(f"{title} - {scaling.get('device', '')}; {scaling.get('shapes', '')}")
    return fig


def plot_scaling_latency(
    scaling: Mapping,
    measures: Sequence[str] = ("forward_ms", "fwd_bwd_ms"),
    methods: Sequence[str] | None = ("exact", "rpka"),
    save_dir: str | os.PathLike | None = None,
    name: str | None = None,
) -> Figure:
    """Latency against n on log-log axes, one line per method and rank, per measure.

    Dashed: the least-squares power law over the larger half of the lengths
    (``rpka.speed.analysis.fit_loglog_slope``); the legend gives its slope (2: quadratic, 1:
    linear). ``methods=None`` adds every method in the result (the uniform-landmark
    control dotted). Default name ``scaling_latency_<cpu|gpu>``.
    """
    fig = _scaling_figure(scaling, measures, methods, "Attention latency against length")
    save_figure(fig, save_dir, name or f"scaling_latency_{device_tag(scaling)}")
    return fig


def plot_scaling_memory(
    scaling: Mapping,
    measures: Sequence[str] = ("peak_mib", "fwd_bwd_peak_mib"),
    methods: Sequence[str] | None = ("exact", "rpka"),
    save_dir: str | os.PathLike | None = None,
    name: str | None = None,
) -> Figure:
    """Peak memory against n on log-log axes, as :func:`plot_scaling_latency` (the
    result's ``memory_definition`` says what is counted). Default name
    ``scaling_memory_<cpu|gpu>``."""
    fig = _scaling_figure(scaling, measures, methods, "Attention peak memory against length")
    save_figure(fig, save_dir, name or f"scaling_memory_{device_tag(scaling)}")
    return fig


def plot_speedup(
    scaling: Mapping,
    measure: str = "forward_ms",
    methods: Sequence[str] | None = ("rpka",),
    save_dir: str | os.PathLike | None = None,
    name: str | None = None,
    ax: plt.Axes | None = None,
) -> Figure:
    """Speed-up against exact (exact's latency / the arm's, same run) against n.

    Above the line at 1 the arm is faster. Each arm's crossover length
    (``rpka.speed.analysis.crossover_table``: interpolated on log-log between the measured points
    around it) is marked with a vertical tick and given in the legend. Default name
    ``scaling_speedup_<cpu|gpu>`` (``_<measure>`` appended for another measure).
    """
    ratios = speedup_frame(scaling, measure)
    if methods is not None:
        ratios = _scaling_arms(ratios, methods)
    crossings = crossover_table(scaling, measure, methods=tuple(ratios["method"].unique()))
    styles = _arm_styles(ratios)
    fig, ax = figure(ax)
    for arm, part in ratios.groupby("arm", sort=False):
        part = part.dropna(subset=["ratio"]).sort_values("n")
        row = crossings[crossings["arm"] == arm]
        where = row["crossover_n_interp"].iloc[0] if len(row) else None
        status = row["status"].iloc[0] if len(row) else "never"
        if status == "crossed":
            label = f"{arm} (crossover n = {where:,.0f})"
        elif status == "faster everywhere":
            label = f"{arm} (faster from n = {row['crossover_n'].iloc[0]:,.0f})"
        else:
            label = f"{arm} (not faster)"
        ax.plot(part["n"], part["ratio"], ms=4, lw=1.2, label=label, **styles[arm])
        if status == "crossed":
            ax.plot([where], [1.0], marker="|", ms=14, mew=2, color=styles[arm]["color"])
    ax.axhline(1.0, color=EXACT_COLOUR, lw=1, ls="--")
    lengths = sorted(ratios["n"].unique())
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length n (tokens, log scale)",
        ylabel=f"speed-up vs exact ({SCALING_MEASURES[measure].split(' (')[0]}, log scale)",
        title=f"Speed-up against exact - {scaling.get('device', '')}",
    )
    ax.set_xticks(lengths, labels=[f"{n:,}" for n in lengths])
    ax.minorticks_off()
    ax.legend(loc="best", fontsize="small")
    suffix = "" if measure == "forward_ms" else f"_{measure}"
    save_figure(fig, save_dir, name or f"scaling_speedup_{device_tag(scaling)}{suffix}")
    return fig


def plot_decode_latency(
    decode: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str | None = None,
    ax: plt.Axes | None = None,
) -> Figure:
    """Per-token decoding latency against context length, log-log (``rpka.speed.decoding`` JSON).

    Exact attention with a KV cache reads every cached key per token (slope ~1 once the
    context outgrows launch and cache overheads); causal RPKA updates running landmark
    sums (slope ~0). Solid: the median step; dashed (RPKA): plus the landmark redraw
    amortised over the context (``amortised_redraw_ms_per_token``). Slopes (least squares
    over the larger half of the contexts) in the legend. Default name
    ``decode_latency_<cpu|gpu>``.
    """
    frame = decode_frame(decode)
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 5.5), constrained_layout=True)
    fig = ax.figure
    colours = {"exact": EXACT_COLOUR, "rpka": palette.method_colour("rpka")}
    rank = decode.get("config", {}).get("rank")
    for i, (method, part) in enumerate(frame.groupby("method", sort=True)):
        colour = colours.get(method, f"C{i}")
        label = "exact (KV cache)" if method == "exact" else f"{method} causal r={rank}"
        curves = [("per_token_ms", "-", "o", "")]
        if part["amortised_redraw_ms_per_token"].notna().any():
            curves.append(("per_token_with_redraw_ms", "--", "x", " + amortised redraw"))
        for column, ls, marker, extra in curves:
            fit = fit_loglog_slope(part["context"], part[column])
            slope = "" if np.isnan(fit["slope"]) else f" (slope {fit['slope']:.2f})"
            ax.plot(
                part["context"],
                part[column],
                ls=ls,
                marker=marker,
                ms=4,
                color=colour,
                label=f"{label}{extra}{slope}",
            )
    contexts = sorted(frame["context"].unique())
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="context length (tokens, log scale)",
        ylabel="decoding time per token (ms, median, log scale)",
        title=f"Decoding one token - {decode.get('device', '')}",
    )
    ax.set_xticks(contexts, labels=[f"{n:,}" for n in contexts])
    ax.minorticks_off()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize="small", frameon=False)
    if decode.get("shape"):
        ax.set_title(f"{ax.get_title()}\n{decode['shape']}", fontsize="small")
    save_figure(fig, save_dir, name or f"decode_latency_{device_tag(decode)}")
    return fig


# --------------------------------------------------------------------------- long-context training


def plot_longctx(
    longctx: Mapping,
    save_dir: str | os.PathLike | None = None,
    name: str = "longctx_training",
) -> Figure:
    """Training at long context (``rpka.study.longctx`` JSON), per context and arm: the median
    training step time, the peak memory of a step, the test MSE (mean +/- sd over the
    evaluation seeds) and its paired difference from exact (mean, 95 % t interval); the
    primary arm (``config.bench.decision.primary_arm``) marked in the legend. Data from
    ``rpka.report.tables.longctx_table``."""
    table = longctx_table(longctx)
    arms = list(dict.fromkeys(table["arm"]))
    primary = ((longctx.get("config") or {}).get("bench") or {}).get("primary_arm")
    contexts = sorted(table["context"].unique())
    colours = palette.arm_colours(arms)
    width = 0.8 / len(arms)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2), constrained_layout=True)
    panels = (
        ("step_ms", "training step (ms, median)", True),
        ("peak_mib", "peak memory of a step (MiB)", True),
        ("test_mse_mean", "test MSE (mean +/- sd over seeds)", False),
        ("delta", "test MSE - exact's (paired mean, 95 % CI)", False),
    )
    for ax, (column, label, log) in zip(axes, panels, strict=True):
        for i, arm in enumerate(arms):
            part = table[table["arm"] == arm].set_index("context").reindex(contexts)
            x = np.arange(len(contexts)) + (i - (len(arms) - 1) / 2) * width
            if column in ("step_ms", "peak_mib"):
                ax.bar(x, part[column], width=width, color=colours[arm],
                       label=f"{arm} (primary)" if arm == primary else arm)  # fmt: skip
                continue
            if column == "test_mse_mean":
                error = part["test_mse_sd"]
            else:
                error = np.stack(
                    [part["delta"] - part["delta_ci_low"], part["delta_ci_high"] - part["delta"]]
                )
            ax.errorbar(x, part[column], yerr=error, fmt="o", capsize=3, color=colours[arm])
        if column == "delta":
            ax.axhline(0.0, color=EXACT_COLOUR, lw=1, ls="--")
        ax.set_xticks(np.arange(len(contexts)), labels=[f"{c:,} tokens" for c in contexts])
        ax.set(ylabel=f"{label}, log scale" if log else label, yscale="log" if log else "linear")
    axes[0].legend(loc="upper left", fontsize="small")
    fig.suptitle(
        f"Training at long context ({longctx.get('preset', '')} preset) - "
        f"{longctx.get('device', '')}"
    )
    save_figure(fig, save_dir, name)
    return fig
