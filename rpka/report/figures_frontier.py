"""The rank frontier figure: gap recovered against rank / n, one panel per track.

Reads ``frontier.json`` as :func:`rpka.verdict.frontier.write_frontier` writes it (keys in
docs/statistics.md, section 8). Returns the matplotlib ``Figure`` and with ``save_dir``
also writes ``<save_dir>/<name>.png``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from adjustText import adjust_text
from matplotlib.figure import Figure
from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter, NullFormatter

from rpka.attention import LANDMARK_METHODS, METHOD_INFO, method_label
from rpka.io import save_figure
from rpka.report import palette
from rpka.report.figures import legend_entries, panel_grid
from rpka.verdict.decision import MARGIN_GAP, STEP_TIE
from rpka.verdict.frontier import STEP_SOURCE_WALL

# one colour, marker and place of the rank notes per method (the registry's), in every panel
METHOD_COLOURS = {m: palette.method_colour(m) for m in LANDMARK_METHODS}
METHOD_MARKERS = {m: METHOD_INFO[m].marker for m in LANDMARK_METHODS}
RANK_TICKS = (1 / 128, 1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)


NOTE_BOX = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8}
# adjustText's iterations: a count, not its default 1 s time limit, so a figure is the same
# bytes on every render, however busy the machine
NOTE_ITERATIONS = 300


def _place_notes(ax: plt.Axes, notes: list[plt.Text], points: list[tuple[float, float]]) -> None:
    """Move the point notes ``notes`` off each other and off ``points`` (adjustText), each
    tied to its point by a thin line; call once the axes' limits are final."""
    if notes:
        x, y = zip(*points, strict=True)
        adjust_text(notes, x=x, y=y, ax=ax, expand=(1.2, 1.5), ensure_inside_axes=True,
                    iter_lim=NOTE_ITERATIONS,
                    arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.5})  # fmt: skip


def _panel(ax: plt.Axes, track: str, frontier: Mapping[str, Any]) -> None:
    margin = frontier["margin_gap"]
    zone = f"non-inferior zone (g > {margin})"
    ax.axhspan(margin, 1.05, color="C2", alpha=0.10, lw=0, label=zone)
    ax.axhline(1.0, color="0.2", lw=1, ls="--", label="exact attention (g = 1)")
    ax.axhline(0.0, color="C3", lw=1, ls=":", label="no attention (g = 0)")
    positive = (frontier.get("positive_control") or {}).get("arm")
    notes: list[plt.Text] = []  # each trained point's rank and step cost, placed at the end
    points: list[tuple[float, float]] = []
    for method, colour in METHOD_COLOURS.items():
        rows = [r for r in frontier["rows"] if r["method"] == method]
        rows = [r for r in rows if r["gap_recovered"]["mean"] is not None]
        if not rows:
            continue
        x = np.array([r["rank_over_n"] for r in rows])
        g = np.array([r["gap_recovered"]["mean"] for r in rows])
        low = g - np.array([r["gap_recovered"]["ci_low"] for r in rows])
        high = np.array([r["gap_recovered"]["ci_high"] for r in rows]) - g
        ax.errorbar(x, g, yerr=[low, high], color=colour, marker=METHOD_MARKERS[method],
                    ms=6, lw=1.5, capsize=3, label=method)  # fmt: skip
        for r, xi, gi in zip(rows, x, g, strict=True):
            ratio = r.get("step_ratio")
            wall = " (wall)" if r.get("step_source") == STEP_SOURCE_WALL else ""  # a record
            note = f"r{r['rank']}" + (f", {ratio:.1f}x step{wall}" if ratio else "")
            if r["arm"] == positive:
                note += "\n(wiring check)"
            notes.append(ax.text(xi, gi, note, fontsize=7, color=colour, zorder=5, bbox=NOTE_BOX))
            points.append((xi, gi))
    for method, colour in METHOD_COLOURS.items():  # the curve the trained arms sample
        curve = [r for r in frontier.get("drop_in", []) if r["method"] == method]
        curve = [r for r in curve if r["gap_recovered"] is not None]
        if curve:
            ax.plot([r["rank_over_n"] for r in curve], [r["gap_recovered"] for r in curve],
                    color=colour, ls="--", lw=1, marker=".", alpha=0.8,
                    label=f"{method} dropped into exact's model (no retraining)")  # fmt: skip
    r_star = frontier.get("r_star")
    title = f"{track}: r* = {r_star}" if r_star else f"{track}: r* not reached"
    ax.set(xscale="log", title=title, xlabel="rank / points pivoted (log scale)",
           ylabel="gap recovered g (1 = exact, 0 = no attention)")  # fmt: skip
    # every point in view: a long context's rank is a small share of its points
    shares = [r["rank_over_n"] for r in (*frontier["rows"], *frontier.get("drop_in", []))]
    ax.set_xlim(min([1 / 48, *shares]) / 1.5, 1.5)
    ax.xaxis.set_major_locator(FixedLocator(RANK_TICKS))
    ax.xaxis.set_major_formatter(FixedFormatter([f"1/{round(1 / t)}" if t < 1 else "1"
                                                 for t in RANK_TICKS]))  # fmt: skip
    ax.xaxis.set_minor_formatter(NullFormatter())
    lows = [r["gap_recovered"]["ci_low"] for r in frontier["rows"]]
    lows += [r["gap_recovered"] for r in frontier.get("drop_in", [])]
    ax.set_ylim(min([-0.05, *[v for v in lows if v is not None]]), 1.16)  # room for labels
    _place_notes(ax, notes, points)


def plot_frontier(
    frontier: Mapping[str, Any],
    save_dir: str | os.PathLike | None = None,
    name: str = "rank_frontier",
) -> Figure:
    """One panel per track of ``frontier["tracks"]``: mean gap recovered with its 95 % t
    interval against rank / points (log), per method; r* in the title; each point labelled
    with its rank and its training step's ratio to exact's."""
    tracks = frontier["tracks"]
    fig, axes = panel_grid(len(tracks), 4.6, 4.2)
    for ax, (track, entry) in zip(axes, tracks.items(), strict=True):
        _panel(ax, track, entry)
    handles = legend_entries(axes)  # one legend: the methods of any track, the guides
    fig.legend(handles.values(), handles.keys(), loc="outside lower center",
               ncol=min(len(handles), 6), fontsize=8)  # fmt: skip
    save_figure(fig, save_dir, name)
    return fig


def _profile_panel(ax: plt.Axes, panel: Mapping[str, Any], taus: np.ndarray) -> None:
    for curve in panel["curves"]:
        colour = palette.method_colour(curve["family"])
        ax.fill_between(taus, curve["ci_low"], curve["ci_high"], step="post", color=colour,
                        alpha=0.2, lw=0)  # fmt: skip
        ax.plot(taus, curve["profile"], drawstyle="steps-post", color=colour, lw=1.8,
                label=curve["label"])  # fmt: skip
    exact = np.where(taus < 1.0, 1.0, 0.0)  # g = 1 on every run, by definition
    control = np.where(taus < 0.0, 1.0, 0.0)  # g = 0 on every run
    ax.plot(taus, exact, drawstyle="steps-post", color=palette.EXACT, lw=1, ls="--",
            label="exact attention (g = 1 on every run)")  # fmt: skip
    ax.plot(taus, control, drawstyle="steps-post", color=palette.CONTROL, lw=1, ls=":",
            label="no-attention control (g = 0 on every run)")  # fmt: skip
    runs = sum(panel["curves"][0]["n_runs"])
    ax.set(title=f"{panel['title']} ({runs} runs)", xlim=(taus[0], taus[-1]), ylim=(-0.02, 1.02),
           xlabel="threshold τ on the gap recovered g\n(1 = exact, 0 = no attention)")  # fmt: skip
    ax.title.set_fontsize(9)


def plot_performance_profiles(
    profiles: Mapping[str, Any],
    save_dir: str | os.PathLike | None = None,
    name: str = "performance_profiles",
) -> Figure:
    """rliable's performance profiles (:func:`rpka.verdict.aggregate.performance_profiles`): per
    panel, the fraction of runs with gap recovered above tau against tau, per arm family,
    with its 95 % stratified-bootstrap band; exact (g = 1) and the control (g = 0) drawn
    as reference steps. One legend under the panels."""
    taus = np.asarray(profiles["taus"])
    panels = profiles["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.2), squeeze=False,
                             sharey=True, constrained_layout=True)  # fmt: skip
    for ax, panel in zip(axes[0], panels, strict=True):
        _profile_panel(ax, panel, taus)
    axes[0][0].set_ylabel("fraction of runs with g > τ")
    handles = legend_entries(axes[0])
    fig.legend(handles.values(), handles.keys(), loc="outside lower center",
               ncol=min(len(handles), 3), fontsize=8)  # fmt: skip
    save_figure(fig, save_dir, name)
    return fig


SPECTRUM_CURVES = (  # key, label, style
    ("residual_rpc", "kernel residual, RPCholesky", {"color": "C1", "marker": "o"}),
    ("residual_uniform", "kernel residual, uniform landmarks", {"color": "C0", "marker": "s"}),
    ("residual_optimal", "kernel residual, best rank r (eigen)", {"color": "0.2", "ls": "--"}),
    ("no_structure", "1 - r/N (no low-rank structure)", {"color": "C3", "ls": ":"}),
    ("attention_error", "attention matrix, best rank-r error", {"color": "C2", "marker": "^"}),
)


def plot_spectrum(
    spectra: Mapping[str, Mapping[str, Any]],
    save_dir: str | os.PathLike | None = None,
    name: str = "kernel_spectrum",
) -> Figure:
    """One panel per track (``spectra``: track -> spectrum.json of :mod:`rpka.kernel.spectrum`):
    the curves averaged over the trained heads against r / N, the heads' logit spread in
    the title."""
    fig, axes = panel_grid(len(spectra), 4.6, 4.0)
    for ax, (track, spectrum) in zip(axes, spectra.items(), strict=True):
        heads = spectrum["heads"]
        n_points = heads[0]["n_points"]
        x = np.array(heads[0]["ranks"]) / n_points
        for key, label, style in SPECTRUM_CURVES:
            ax.plot(x, np.mean([h[key] for h in heads], axis=0), label=label, ms=4, **style)
        spread = [h["logit_std"] for h in heads]
        ax.set(title=f"{track}: {len(heads)} heads, logit std {min(spread):.1f}-{max(spread):.1f}",
               xlabel=f"rank / points (N = {n_points})", ylabel="normalised residual / error",
               ylim=(-0.02, 1.02), xlim=(0, 1))  # fmt: skip
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8)
    save_figure(fig, save_dir, name)
    return fig


# --------------------------------------------------------------------------- long range

LENGTH_CMAP = "viridis"  # one colour per length, short to long
LENGTH_SHADE = (0.1, 0.85)  # the colour map's range used (its ends are too light / dark)
GAP_PAD = 0.05  # room below the lowest interval and above g = 1


def _length_colours(contexts: list[int]) -> dict[int, Any]:
    cmap = plt.get_cmap(LENGTH_CMAP)
    shades = np.linspace(*LENGTH_SHADE, max(len(contexts), 2))
    return {c: cmap(shades[i]) for i, c in enumerate(contexts)}


NAMED_MINOR = (2, 3, 5)  # the minor ticks of a ratio axis that carry their value


def _leading_digit(value: float) -> int:
    return round(value / 10 ** np.floor(np.log10(value)))


def _answer_panel(
    ax: plt.Axes, points: list[Mapping[str, Any]], key: str, margin: float, xlabel: str
) -> None:
    ax.axhspan(margin, 1.05, color="C2", alpha=0.10, lw=0,
               label=f"non-inferior zone (g > {margin:g})")  # fmt: skip
    ax.axhline(margin, color="C2", lw=1, label=f"non-inferiority line (g = {margin:g})")
    ax.axhline(1.0, color="0.2", lw=1, ls="--", label="exact attention (g = 1)")
    ax.axvline(1.0, color="0.4", lw=1, ls=":", label="x = 1 (as costly as exact)")
    colours = _length_colours(sorted({int(p["context"]) for p in points}))
    notes: list[plt.Text] = []  # each point's rank (and peer), placed at the end
    placed: list[tuple[float, float]] = []
    for p in points:
        x, g = p.get(key), p.get("gap_mean")
        if x is None or g is None:
            continue
        low, high = p.get("gap_ci_low"), p.get("gap_ci_high")
        yerr = None if low is None or high is None else [[g - low], [high - g]]
        colour = colours[int(p["context"])]
        if p.get("positive_control"):  # exact by construction: a hollow star, no label
            ax.errorbar([x], [g], yerr=yerr, color=colour, marker="*", ms=10, mfc="none",
                        capsize=3, label="full rank (wiring check)")  # fmt: skip
            continue
        ax.errorbar([x], [g], yerr=yerr, color=colour,
                    marker=METHOD_MARKERS.get(p.get("method"), "o"), ms=6, capsize=3,
                    label=f"{int(p['context']):,} tokens")  # fmt: skip
        peer = METHOD_INFO[p["method"]].family != "rpka"  # RPKA's points carry the rank alone
        note = f"r{p['rank']}" + (f" {method_label(p['method'])}" if peer else "")
        notes.append(ax.text(x, g, note, fontsize=7, color=colour, zorder=5, bbox=NOTE_BOX))
        placed.append((x, g))
    ax.set(xscale="log", xlabel=xlabel, ylabel="gap recovered g (1 = exact, 0 = mean control)")
    times = FuncFormatter(lambda v, _: f"{v:.2g}×")  # ratios, not powers of ten
    ax.xaxis.set_major_formatter(times)
    ax.xaxis.set_minor_formatter(  # a few minor ticks named: 0.5x, 2x, 3x, 5x (no pile at 1x)
        FuncFormatter(lambda v, _: f"{v:.2g}×" if _leading_digit(v) in NAMED_MINOR else "")
    )
    ax.tick_params(axis="x", which="minor", labelsize=7)
    lows = [p["gap_ci_low"] for p in points if p.get("gap_ci_low") is not None]
    highs = [p["gap_ci_high"] for p in points if p.get("gap_ci_high") is not None]
    # every interval whole and the non-inferiority line in view; zoomed to them (0 = no
    # attention is the axis label's, not always in view: near g = 1 the margin decides)
    ax.set_ylim(min([margin, *lows]) - GAP_PAD, max([1.0, *highs]) + 2 * GAP_PAD)
    _place_notes(ax, notes, placed)


def plot_longrange_answer(
    points: list[Mapping[str, Any]],
    margin_gap: float = MARGIN_GAP,
    save_dir: str | os.PathLike | None = None,
    name: str = "longrange_answer",
) -> Figure:
    """Issue 27's answer: gap recovered (mean, 95 % t interval) against the training
    step's time ratio to exact (log), one point per (length, rank), coloured by length
    (marker by method); the non-inferiority line and x = 1 drawn. With a peak-memory ratio
    on any point, a second panel against it. ``points``: dicts with ``context``,
    ``method``, ``rank``, ``gap_mean``, ``gap_ci_low``, ``gap_ci_high``, ``step_ratio``,
    ``peak_ratio`` (``rpka.report.longrange.answer_points``)."""
    memory = any(p.get("peak_ratio") is not None for p in points)
    fig, axes = plt.subplots(1, 2 if memory else 1, figsize=(5.2 * (2 if memory else 1), 4.2),
                             squeeze=False, constrained_layout=True)  # fmt: skip
    axes[0][0].axvspan(1 - STEP_TIE, 1 + STEP_TIE, color="0.5", alpha=0.10, lw=0,
                       label=f"exact's cost within timing noise (±{STEP_TIE:.0%})")  # fmt: skip
    _answer_panel(axes[0][0], points, "step_ratio", margin_gap,
                  "training step time / exact's (log scale)")  # fmt: skip
    axes[0][0].set_title("quality against training-step time")
    if memory:
        _answer_panel(axes[0][1], points, "peak_ratio", margin_gap,
                      "training-step peak memory / exact's (log scale)")  # fmt: skip
        axes[0][1].set_title("quality against peak memory")
    if not points:
        axes[0][0].text(0.5, 0.5, "no gated length", transform=axes[0][0].transAxes,
                        ha="center")  # fmt: skip
    handles = legend_entries(axes[0])
    fig.legend(handles.values(), handles.keys(), loc="outside lower center",
               ncol=min(len(handles), 4), fontsize=8)  # fmt: skip
    save_figure(fig, save_dir, name)
    return fig


def plot_gap_per_seed(
    tracks: Mapping[str, Mapping[str, Any]],
    save_dir: str | os.PathLike | None = None,
    name: str = "longrange_power_seeds",
) -> Figure:
    """Every seed's gap recovered per arm, one panel per length (``tracks``: a frontier's
    tracks, e.g. ``longrange-2048``): dots per seed, the mean and its one-sided 95 % lower
    bound (the bound the non-inferiority rule compares with the margin), the margin line.
    What a reader checks first in a pre-registered verdict: does one seed carry it?"""
    fig, axes = panel_grid(len(tracks), width=5.6, height=0.5 + 0.42 * max(
        (len(t["rows"]) for t in tracks.values()), default=1))  # fmt: skip
    rng = np.random.default_rng(0)  # jitter only: where dots sit vertically
    for ax, (track, frontier) in zip(axes, tracks.items(), strict=False):
        rows = frontier["rows"]
        finite = [x for r in rows for x in r["gap_recovered"]["per_seed"] if x is not None]
        x_low = min(-0.1, min(finite, default=0) - 0.05)
        x_high = max(1.1, max(finite, default=1) + 0.05)
        ax.axvspan(frontier["margin_gap"], x_high, color="C2", alpha=0.10, lw=0,
                   label=f"non-inferior zone (g > {frontier['margin_gap']})")  # fmt: skip
        ax.axvline(1.0, color="0.2", lw=1, ls="--", label="exact attention (g = 1)")
        ax.axvline(0.0, color="C3", lw=1, ls=":", label="no attention (g = 0)")
        for y, row in enumerate(rows):
            g = np.asarray([np.nan if x is None else x for x in row["gap_recovered"]["per_seed"]])
            colour = palette.arm_colour(row["arm"])
            ax.scatter(g, y + rng.uniform(-0.18, 0.18, len(g)), s=12, color=colour, alpha=0.7,
                       lw=0)  # fmt: skip
            ax.plot([row["gap_recovered"]["mean"]], [y], "|", ms=14, mew=2, color="0.1",
                    label="mean over seeds")  # fmt: skip
            low = row.get("ci_low_one_sided")
            if low is not None:
                ax.plot([low], [y], ">", ms=6, color="0.1", label="one-sided 95 % lower bound")
        ax.set_yticks(range(len(rows)), [r["arm"] for r in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the first arm on top, every row's jitter inside
        ax.set_xlim(x_low, x_high)
        ax.set_xlabel("gap recovered per seed, g (1 = exact, 0 = no attention)")
        ax.set_title(track)
    handles = legend_entries(axes)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=3, fontsize=8)
    save_figure(fig, save_dir, name)
    return fig
