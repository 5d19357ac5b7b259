"""The "when" map (issue 41, item 8): where RPKA pays, every study's readings on one picture.

Each point is one low-rank reading of RPKA or a landmark peer: a trained arm of the
frontier (``frontier.json``: the tracks and the long-range study) or a drop-in rung of the
rank-law grid (``rank_law.json``: the smallest rank that reached the margin on every seed,
and the rung below it). It sits at (tokens n, rank ÷ points pivoted) and is coloured by

* **non-inferior, op cheaper**: the quality verdict holds (:data:`NON_INFERIOR`: trained
  arms by the frontier's rule; drop-in rungs by the every-seed rule) and the attention op
  at that length and rank takes at most :data:`CHEAPER_RATIO_MAX` of exact's CPU time;
* **non-inferior, op not cheaper** (exact's cost or more, by the same timing);
* **non-inferior, op not timed** at that (length, rank);
* **not shown non-inferior**.

Cost is the attention op's forward, one thread, CPU time, default options, arms
interleaved (the study's latency sweep, :func:`rpka.study.index.latency_sweep`), never a
training wall time. Rank is over the points the method pivots (queries and keys for the
joint set, keys for the key coreset), the frontier's own axis: a "rank ÷ items" axis needs
an item count the tracks do not define (only the long-range and rank-law tasks have one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from rpka.attention import METHOD_INFO
from rpka.verdict.decision import CHEAPER_RATIO_MAX, NON_INFERIOR
from rpka.verdict.frontier import forward_speedup

CATEGORIES = {  # category -> (legend, colour): Okabe-Ito hues
    "cheaper": ("non-inferior, op cheaper", "#009e73"),
    "costly": ("non-inferior, op at exact's cost or more", "#e69f00"),
    "untimed": ("non-inferior, op not timed there", "#999999"),
    "loses": ("not shown non-inferior", "#d55e00"),
}
KEYS_ONLY = ("keys-coreset",)
# frontier tracks of the 8-seed long-range study (frontier.json's longrange-<n>), superseded
# by the pre-registered 16-seed study (docs/longrange_protocol.md): not a reading of the map
SUPERSEDED_PREFIX = "longrange-"  # pivots the keys only: its points are the n keys


def _tokens(method: str, points: int) -> int:
    return points if method in KEYS_ONLY else points // 2


def _category(non_inferior: bool, speedup: float | None) -> str:
    if not non_inferior:
        return "loses"
    if speedup is None:
        return "untimed"
    return "cheaper" if 1 / speedup <= CHEAPER_RATIO_MAX else "costly"


def _speedups(sweep: Mapping[str, Any] | None) -> dict[tuple[str, int, int], float]:
    """(method, tokens, rank) -> the op's forward speed-up over exact (CPU time where
    measured): the sweep times RPKA and uniform landmarks; the key coreset is not timed."""
    if not sweep:
        return {}
    ratios = {(r["method"], r["n"], r["rank"]): forward_speedup(r) for r in sweep["rows"]
              if r["method"] != "exact"}  # fmt: skip
    return {key: ratio for key, ratio in ratios.items() if ratio}


def map_points(
    frontier: Mapping[str, Any] | None,
    rank_law: Mapping[str, Any] | None,
    sweep: Mapping[str, Any] | None,
    superseded: bool = False,
) -> pd.DataFrame:
    """One row per reading: study, method, tokens, rank, rank_over_points, source
    ("trained" / "drop-in"), non_inferior, op_speedup, category. ``superseded`` (the study
    also ran the pre-registered 16-seed long-range study): the older 8-seed study's
    frontier tracks are not readings (``attrs["superseded"]`` says so to the caption)."""
    speedup = _speedups(sweep)
    rows = []
    for track, entry in ((frontier or {}).get("tracks") or {}).items():
        if superseded and track.startswith(SUPERSEDED_PREFIX):  # the 8-seed study
            continue
        for row in entry["rows"]:
            if row["rank"] >= row["n_points"]:  # the positive control: exact by identity
                continue
            rows.append({"study": track, "method": row["method"], "source": "trained",
                         "tokens": _tokens(row["method"], row["n_points"]),
                         "rank": row["rank"], "points": row["n_points"],
                         "non_inferior": row["verdict"] == NON_INFERIOR})  # fmt: skip
    for cell in (rank_law or {}).get("cells") or []:
        if not cell["learnable"]:
            continue
        for method, r_star in cell["r_star_dropin"].items():
            points = cell["n"] if method in KEYS_ONLY else 2 * cell["n"]
            rungs = [(r_star, True), (r_star // 2, False)] if r_star else []
            rows += [{"study": cell["cell"], "method": method, "source": "drop-in",
                      "tokens": cell["n"], "rank": rank, "points": points, "non_inferior": ok}
                     for rank, ok in rungs if rank >= 1]  # fmt: skip
    for row in rows:
        row["rank_over_points"] = row["rank"] / row["points"]
        row["op_speedup"] = speedup.get((row["method"], row["tokens"], row["rank"]))
        row["category"] = _category(row["non_inferior"], row["op_speedup"])
    frame = pd.DataFrame(rows)
    frame.attrs["superseded"] = superseded
    return frame


def plot_when_map(points: pd.DataFrame) -> Figure:
    """Tokens (log2) against rank ÷ points (log2): filled markers trained arms, hollow
    markers drop-in rungs; colour the category, marker the method (the registry's)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    points = points.assign(x=_spread(points))
    for (method, source, category), part in points.groupby(["method", "source", "category"]):
        _, colour = CATEGORIES[category]
        filled = source == "trained"
        ax.scatter(part["x"], part["rank_over_points"], marker=METHOD_INFO[method].marker,
                   s=70 if filled else 55, facecolors=colour if filled else "none",
                   edgecolors=colour, linewidths=1.4, alpha=0.9)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    lengths = sorted(points["tokens"].unique())
    ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"1/{1 / y:.0f}" if y < 1 else "1"))
    ax.set_xlabel("sequence length n (tokens, log scale)")
    ax.set_ylabel("rank ÷ points pivoted (log scale)")
    handles = [plt.Line2D([], [], ls="", marker="o", color=c, label=label)
               for label, c in CATEGORIES.values()]  # fmt: skip
    handles += [plt.Line2D([], [], ls="", marker=METHOD_INFO[m].marker, color="0.3", label=m,
                           markerfacecolor="none")
                for m in sorted(points["method"].unique())]  # fmt: skip
    # the fill says the source, on a marker no method uses (a circle would repeat rpka's)
    handles += [plt.Line2D([], [], ls="", marker="D", ms=5, color="0.3",
                           label="filled: trained arm"),
                plt.Line2D([], [], ls="", marker="D", ms=5, color="0.3", markerfacecolor="none",
                           label="hollow: drop-in rung (rank-law grid)")]  # fmt: skip
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="major", alpha=0.4)
    fig.tight_layout()
    return fig


def _spread(points: pd.DataFrame, step: float = 0.09) -> pd.Series:
    """x positions: readings at one (length, rank ÷ points) spread side by side (by a factor
    2^step apart on the log axis) so that none hides another."""
    same = points.groupby(["tokens", "rank_over_points"])
    offset = same.cumcount() - (same["tokens"].transform("size") - 1) / 2
    return points["tokens"] * 2.0 ** (offset * step)


def caption(points: pd.DataFrame) -> tuple[str, str]:
    """(caption, alt text), with the count of each category."""
    counts = points["category"].value_counts()
    parts = [f"{counts.get(key, 0)} {label}" for key, (label, _) in CATEGORIES.items()]
    text = ("Where RPKA and the landmark peers pay: every trained low-rank arm (filled) and "
            "every drop-in rung of the rank-law grid (hollow: the smallest rank reaching the "
            "margin on every seed and the rank below it) at its length and rank ÷ points. "
            f"Cost: the attention op's forward, one thread, CPU time (cheaper: at most "
            f"{CHEAPER_RATIO_MAX:g} × exact's). "
            + ("The long-range study's readings are in its own section (the older 8-seed "
               "study is superseded and not shown). " if points.attrs.get("superseded") else "")
            + "Counts: " + "; ".join(parts) + ".")  # fmt: skip
    return text, "Map of readings by sequence length and rank over points, coloured by verdict"
