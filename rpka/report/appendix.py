"""The report's appendix: every compared arm's verdict in one table, and each track's
selection rules, arms and options, full statistics, guard shares and sweep."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from IPython.display import Markdown

from rpka.report import tables, text_track
from rpka.report.tables import arm_group, arm_label, verdict_word
from rpka.report.text import ci_text


def verdicts_table(study: Mapping[str, Any]) -> pd.DataFrame:
    """Every compared arm of every track: group, verdict, delta and CI."""
    rows = []
    for t in study["tracks"].values():
        report = t["report"]
        for arm, e in report["arms"].items():
            c = e.get("comparison")
            if c:
                rows.append(
                    {
                        "track": t["title"],
                        "arm": arm_label(report, arm),
                        "group": arm_group(report, arm),
                        "delta [95 % CI]": ci_text(c),
                        "verdict": verdict_word(c["verdict"]),
                    }
                )
    return pd.DataFrame(rows)


def appendix_section(track: Mapping[str, Any]) -> list[Any]:
    """One track's appendix: selection rules, arms and options, full statistics, guard
    shares, the learning-rate sweep."""
    report = track["report"]
    out: list[Any] = [
        Markdown(f"#### {track['title']}"),
        Markdown(text_track.selection_rules(track)),
        tables.styled(text_track.arms_table(report)),
        tables.styled(text_track.statistics_table(report)),
    ]
    shares = text_track.guard_shares(report)
    if len(shares):
        out += [Markdown("Numerical guards in training (docs/numerics.md):"), tables.styled(shares)]
    out += [
        Markdown("Validation score per learning rate:"),
        tables.styled(tables.sweep_table(report)),
    ]
    return out
