"""The pre-registered long-range study's part of the report (issue 40, docs/longrange_protocol.md).

The study resumes over several sessions, and its protocol reads no length before every
job of it is in. So this part always says how far it got (``study.json``'s
``longrange_power.landed``, ``rpka.study.progress``) and, per complete length only, shows
what the protocol decides: both gates, every arm's verdict with its leave-one-seed-out
robustness and the sign-flip interval that agrees with its test, each seed's gap recovered
(a figure), and the answer by the pre-registered rule from the study's own frontier
(``<results>/longrange-power/frontier.json``, written by ``rpka.study.index``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from IPython.display import Markdown

from rpka.report.figures_frontier import plot_gap_per_seed
from rpka.report.longrange import gates_table, verdicts_table
from rpka.report.longrange_answer import robust_answer_text
from rpka.report.longrange_v2 import decision_section
from rpka.report.page import optional_json
from rpka.study.progress import progress_line

HEADING = "### The pilot: the 16-seed study of protocol v1"


def power_section(
    study: Mapping[str, Any],
    results_dir: str | os.PathLike,
    figs: Any,
    figures_dir: str | os.PathLike | None,
) -> list[Any]:
    """The study's part for ``display`` (empty where it never started): its status, then
    per complete length the gates, the answer, the per-seed figure (through ``figs.show``)
    and the verdicts table."""
    items: list[Any] = decision_section(study)  # the decided study first, then its pilot
    entry = study.get("longrange_power")
    if not entry:
        return items
    items.append(Markdown(status_text(entry)))
    if not entry.get("contexts"):
        return items
    frontier = optional_json(Path(results_dir) / entry["frontier_json"]) or {}
    items.append(Markdown(gates_table(entry).to_markdown(index=False)))
    if answer := robust_answer_text(frontier):
        items.append(Markdown(answer))
    tracks = frontier.get("tracks") or {}
    if tracks:
        fig = plot_gap_per_seed(tracks, figures_dir)
        items.append(figs.show(fig, *seeds_caption(tracks), name="longrange_power_seeds"))
    items.append(Markdown(verdicts_table(entry, frontier, None).to_markdown(index=False)))
    return items


def status_text(entry: Mapping[str, Any]) -> str:
    """What the study is and how far it got, per length."""
    read = sorted(int(c) for c in entry.get("contexts") or {})
    reading = (
        f"Read (every job in): {', '.join(f'{c:,}' for c in read)} tokens."
        if read
        else "No length is complete yet, so nothing of it is read."
    )
    return (
        f"{HEADING} (`{entry['protocol']}`, written before its runs)\n\n"
        "Read on the gap-recovered scale, which a failing exact reference flatters (the "
        "decision study above replaces that reading); it is the decision study's pilot. "
        "16 evaluation seeds (200-215), each with its own data; the margin, the robustness "
        "rule and the rule for *cheaper* as the protocol fixes them; no length is read before "
        f"all its jobs are in. Landed: {progress_line(entry['landed'])}. {reading}"
    )


def seeds_caption(tracks: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """(caption, alt text) of the per-seed figure."""
    lengths = ", ".join(tracks)
    caption = (
        f"Each seed's gap recovered per arm ({lengths}): dots are seeds, the bar their "
        "mean, the triangle the one-sided 95 % lower bound the non-inferiority rule compares "
        "with the margin (shaded zone). A verdict that rests on one seed shows here as one "
        "dot far from the rest."
    )
    alt = "; ".join(
        f"{track} {row['arm']}: mean g {row['gap_recovered']['mean']:.3f}"
        for track, frontier in tracks.items()
        for row in frontier["rows"]
        if row["gap_recovered"].get("mean") is not None
    )
    return caption, alt
