"""The mechanism study's figures (``mechanism.json``, :mod:`rpka.kernel.mechanism`): the trace
identity, the residual trace and output error against rank, the spectra, trained against
initial weights.

Every function takes result dicts as :mod:`rpka.kernel.mechanism` returns them (or as read back
from JSON), returns the matplotlib ``Figure``, and with ``save_dir`` also writes
``<save_dir>/<name>.png`` under a stable default name (the style:
:func:`rpka.report.figures.set_style`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from rpka.io import save_figure
from rpka.report.figures import figure

RULE_ORDER = ("rpc", "greedy", "uniform")
Z_95 = 1.959963984540054  # two-sided 95 % normal quantile, for error bars
EIGEN_FLOOR = 1e-16  # eigenvalues below this (round-off) are drawn at the floor on log axes


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
        _band(ax, part, (value, low, high), f"C{i}", f"{rule}{label_suffix}")


def _band(
    ax: plt.Axes, part: pd.DataFrame, columns: tuple[str, str, str], colour: str, label: str
) -> None:
    """A line of ``columns[0]`` against rank with a band from ``columns[1]`` to ``[2]``."""
    value, low, high = columns
    ax.plot(part["rank"], part[value], "o-", color=colour, label=label)
    ax.fill_between(part["rank"], part[low], part[high], color=colour, alpha=0.15)


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
    fig, ax = figure(ax)
    _curve_axes(ax, summary, "rel_residual_mean", "rel_residual_min", "rel_residual_max")
    optimum = summary.groupby("rank")["rel_optimum_mean"].first()
    optimum = optimum[optimum > 0]
    ax.plot(optimum.index, optimum.values, "k--", lw=1.5, label="optimum (eigenvalues > r)")
    _log_rank_axes(
        ax,
        summary["rank"],
        r"residual trace tr$(A - \hat A_r)$ / tr $A$ (fraction)",
        title or "Residual trace against rank",
    )
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
    fig, ax = figure(ax)
    _curve_axes(ax, summary, "output_error_mean", "output_error_min", "output_error_max")
    _log_rank_axes(
        ax,
        summary["rank"],
        r"relative output error $\|\hat O - O\|_F / \|O\|_F$",
        title or "RPKA output error against exact attention",
    )
    save_figure(fig, save_dir, name)
    return fig


def _log_rank_axes(ax: plt.Axes, ranks: Iterable[int], ylabel: str, title: str) -> None:
    """Log-log axes with the measured ranks as the x ticks."""
    ticks = sorted(set(ranks))
    ax.set(xscale="log", yscale="log", xlabel="rank r (landmarks)", ylabel=ylabel, title=title)
    ax.set_xticks(ticks, labels=ticks)
    ax.minorticks_off()
    ax.legend(loc="best")


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
    fig, ax = figure(ax)
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
        residual = ("rel_residual_mean", "rel_residual_min", "rel_residual_max")
        _band(ax_res, part, residual, f"C{i}", f"{label}: {rule}")
        ax_res.plot(
            part["rank"], part["rel_optimum_mean"], "--", color=f"C{i}", label=f"{label}: optimum"
        )
        part = summary[summary["rule"] == rule].sort_values("rank")
        error = ("output_error_mean", "output_error_min", "output_error_max")
        _band(ax_err, part, error, f"C{i}", f"{label}: {rule}")
    ranks = [row["rank"] for r in results.values() for row in _quality(r)["summary"]]
    _log_rank_axes(
        ax_res, ranks, r"residual trace / tr $A$ (fraction)", "Residual trace against rank"
    )
    _log_rank_axes(
        ax_err,
        ranks,
        r"relative output error $\|\hat O - O\|_F / \|O\|_F$",
        "RPKA output error against exact",
    )
    save_figure(fig, save_dir, name)
    return fig


__all__ = [
    "plot_output_error",
    "plot_residual_trace",
    "plot_spectra",
    "plot_trace_identity",
    "plot_trained_vs_init",
]
