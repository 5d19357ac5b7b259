"""The report's frontier section: at which rank each track's RPKA stops losing, at what cost.

Text, table and figure from ``frontier.json`` (:func:`rpka.frontier.write_frontier`); the
rule is docs/statistics.md, section 8. Every number comes from the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pandas as pd
from IPython.display import Markdown

from rpka.plots_frontier import plot_frontier
from rpka.report_text import esc

RULE = (
    "Gap recovered g = (control - arm) / (control - exact) per evaluation seed: 1 is exact "
    "attention, 0 the no-attention control. An arm is *non-inferior* when the one-sided "
    "t-test of mean g > {margin} rejects at 0.05; r\\* is the smallest such RPKA rank. The "
    "positive control is the arm whose rank is exact by construction; it must read "
    "non-inferior, or the pipeline is wrong."
)


def _gap(row: Mapping[str, Any]) -> str:
    g = row["gap_recovered"]
    if g["mean"] is None:
        return "undefined"
    return f"{g['mean']:.3f} [{g['ci_low']:.3f}, {g['ci_high']:.3f}]"


def frontier_table(frontier: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (track, arm): rank, rank / n, gap recovered [95 % CI], verdict, step."""
    rows = []
    for track, entry in frontier["tracks"].items():
        positive = (entry.get("positive_control") or {}).get("arm")
        for r in entry["rows"]:
            rows.append({
                "track": track,
                "arm": f"`{r['arm']}`" + (" (positive control)" if r["arm"] == positive else ""),
                "rank / points": f"{r['rank']} / {r['n_points']} ({r['rank_over_n']:.3f})",
                "gap recovered [95 % CI]": _gap(r),
                "p (g > margin)": "n/a" if r["p_non_inferior"] is None
                else f"{r['p_non_inferior']:.3g}",
                "verdict": r["verdict"],
                "train step (x exact)": "n/a" if r.get("step_ratio") is None
                else f"{r['step_ratio']:.2f}",
            })  # fmt: skip
    return pd.DataFrame(rows)


def track_sentence(track: str, entry: Mapping[str, Any]) -> str:
    """r*, its cost, and the positive control's reading, in one sentence."""
    rows = {r["arm"]: r for r in entry["rows"]}
    r_star = entry.get("r_star")
    if r_star is None:
        text = f"**{esc(track)}**: r\\* not reached below the exact-by-construction rank"
    else:
        row = next(r for r in entry["rows"] if r["method"] == "rpka" and r["rank"] == r_star)
        ratio = row.get("step_ratio")
        text = (
            f"**{esc(track)}**: r\\* = {r_star} of {row['n_points']} points "
            f"({row['rank_over_n']:.2f}), gap recovered {_gap(row)}"
            + (f", training step {ratio:.2f}x exact's" if ratio else "")
        )
    positive = entry.get("positive_control")
    if positive is None:
        text += "; no positive control was trained on this track."
    else:
        row = rows[positive["arm"]]
        text += (
            f"; positive control `{positive['arm']}` (exact by construction): "
            f"{positive['verdict']}, g {_gap(row)}."
        )
        if positive["verdict"] != "non-inferior":
            text += " **The positive control does not tie: this track's frontier is not read.**"
    return text


def frontier_caption(frontier: Mapping[str, Any]) -> tuple[str, str]:
    tracks = ", ".join(frontier["tracks"])
    caption = (
        "Rank frontier per track: mean gap recovered with its 95 % t interval against rank "
        "over the points pivoted (log axis); shaded: the non-inferior zone; each point "
        "labelled with its rank and its training step's ratio to exact attention's (same "
        "track, same length). " + RULE.format(margin=next(iter(frontier["tracks"].values()))
                                              ["margin_gap"])
    )  # fmt: skip
    alt = f"Gap recovered against relative rank for the tracks {tracks}, with r* marked."
    return caption, alt


def frontier_section(
    frontier: Mapping[str, Any] | None, figs: Any, figures_dir: str | os.PathLike | None
) -> list[Any]:
    """The section's items for ``display``: sentences, the figure (through ``figs.show``,
    :class:`rpka.report.Figures`), the table. Without a frontier file, one sentence."""
    if not frontier or not frontier.get("tracks"):
        return [Markdown("This study has no rank frontier (`frontier.json`).")]
    sentences = [track_sentence(t, e) for t, e in frontier["tracks"].items()]
    items: list[Any] = [Markdown("\n".join(f"- {s}" for s in sentences))]
    items.append(figs.show(plot_frontier(frontier, figures_dir), *frontier_caption(frontier)))
    items.append(Markdown(frontier_table(frontier).to_markdown(index=False)))
    return items
