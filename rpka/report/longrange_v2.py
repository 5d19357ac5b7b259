"""The long-range decision study's part of the report (issue 53,
docs/longrange_protocol_v2.md): how far it got, the power it was registered with, and -
once a look's seeds are in - each arm's failures and relative MSE and the two questions'
answers, from ``study.json``'s ``longrange_v2`` (``rpka.study.index.decision_entry``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from IPython.display import Markdown

from rpka.study.longrange_v2 import without_seed

HEADING = "### The decision study (protocol v2)"


def decision_section(study: Mapping[str, Any]) -> list[Any]:
    """The study's part for ``display`` (empty where it never started)."""
    entry = study.get("longrange_v2")
    if not entry:
        return []
    items: list[Any] = [Markdown(status_text(entry))]
    if entry["seeds_complete"]:
        items.append(Markdown(arms_table(entry).to_markdown(index=False)))
    if entry.get("reading"):
        items.append(Markdown(answers_text(entry["reading"])))
    return items


def status_text(entry: Mapping[str, Any]) -> str:
    """What the study asks, its power, and how many seeds are in."""
    power = {row["truth"]: row for row in entry.get("power", [])}
    pilot, equal = power.get("as the pilot", {}), power.get("RPKA r64 = exact", {})
    q1, q2 = pilot.get("q1: pivoting better", 0.0), equal.get("q2: non-inferior", 0.0)
    power_line = (
        f"Registered power at 32 seeds: Q1 finds pivoting better {q1:.0%} of the time if "
        f"the truth is what the pilot showed; Q2 reads non-inferior {q2:.0%} of the time "
        "if RPKA r64 truly equals exact."
        if pilot
        else ""
    )
    complete = entry["seeds_complete"]
    landed = f"{complete} of {entry['seeds_planned']} seeds are in for every arm" + (
        "; the interim look needs 16." if complete < 16 else "."
    )
    return (
        f"{HEADING} (`{entry['protocol']}`, registered before its runs)\n\n"
        "Two questions at 4,096 tokens, on 32 new seeds with their own data: **Q1**, does "
        "residual pivoting beat uniform landmarks at rank 64 (fewer failed seeds, or lower "
        "MSE where both learn)? **Q2**, is `rpka-r64` non-inferior to exact (no more "
        "failures, at most 5 % more MSE where both learn)? A seed *fails* above 4x the "
        "pilot exact arm's median test MSE; neither estimand rewards an arm where exact "
        f"fails. {power_line} {landed}"
    )


def arms_table(entry: Mapping[str, Any]) -> pd.DataFrame:
    """Per arm: failed seeds with their exact interval, and the median MSE relative to
    exact on the seeds where both learned, with its one-sided bound."""
    rows = []
    for arm, row in entry["arms"].items():
        f, rel = row["failures"], row.get("relative_mse") or {}
        median = rel.get("median")
        failed = f"{f['k']}/{f['n']} [{f['ci_low']:.2f}, {f['ci_high']:.2f}]"
        bound = "-" if rel.get("bound") is None else f"{rel['bound']:.3f}"
        rows.append(
            {
                "arm": f"`{arm}`",
                "failed seeds [95 % CI]": failed,
                "MSE / exact, median (bound)": "-" if median is None else f"{median:.3f} ({bound})",
                "pairs both learned": rel.get("pairs", "-"),
            }
        )
    return pd.DataFrame(rows)


def answers_text(reading: Mapping[str, Any]) -> str:
    """Each look's answers, and any answer one seed decides."""
    lines = []
    for look in ("interim", "final"):
        q = reading.get(look)
        if q:
            lines.append(
                f"- **{look} look** (level {q['alpha']:.4f}): Q1 *{q['q1']['answer']}*; "
                f"Q2 *{q['q2']['answer']}*."
            )
    for question in ("q1", "q2"):
        if without := without_seed(reading, question):
            lines.append(f"- {question.upper()}'s answer changes {without}.")
    status = {"interim": "stopped at the interim look", "final": "complete",
              "running": "running: the final look needs all 32 seeds"}  # fmt: skip
    lines.append(f"- The study is {status[reading['stopped_at']]}.")
    return "\n".join(lines)


def summary_text(study: Mapping[str, Any]) -> str:
    """The Summary's paragraph on the decision study (Markdown): each question's answer at
    the latest look read, with the seeds, the failures and the relative MSE behind it;
    before a look, how far the study got ("" where it never started)."""
    entry = study.get("longrange_v2")
    if not entry:
        return ""
    head = "**The long-range answer: the decision study at 4,096 tokens (Section 3).** "
    reading = entry.get("reading")
    if not reading:
        return head + (
            f"Not answered yet: {entry['seeds_complete']} of {entry['seeds_planned']} new seeds "
            "are in for every arm, and the first look needs 16. The pilot (protocol v1's 16 "
            "seeds, read with v2's estimands) is in the study's section."
        )
    look = "final" if reading.get("final") else "interim"
    q = reading[look]
    seeds = entry["seeds_planned"] if look == "final" else entry["seeds_planned"] // 2
    q1, q2 = q["q1"], q["q2"]
    f1, f2 = q1["failures"], q2["failures"]
    status = {"interim": "it stopped there", "final": "the study is complete",
              "running": f"it runs on to {entry['seeds_planned']} seeds, whose final look "
                         "decides"}  # fmt: skip
    level = f"level {q['alpha']:.4f}; {status[reading['stopped_at']]}"
    return head + (
        f"At its {look} look ({seeds} seeds, {level}): "
        f"**does RPKA at rank 64 match exact attention? {q2['answer'].capitalize()}.** "
        f"`rpka-r64` failed to learn on {_seeds(f2['a_only'] + f2['both'])} and exact on "
        f"{_seeds(f2['b_only'] + f2['both'])}; where both learned "
        f"({_seeds(q2['relative_mse']['pairs'])}) RPKA's test MSE was "
        f"{_median(q2)} exact's. **Does residual pivoting beat uniform landmarks? "
        f"{q1['answer'].capitalize()}.** Uniform `r64` failed where RPKA learned on "
        f"{_seeds(f1['b_only'])}, the reverse on {_seeds(f1['a_only'])} (exact paired test p "
        f"{f1['p_two_sided']:.2g}); where both learned RPKA's MSE was {_median(q1)} uniform's."
        f"{_fragile(reading)}"
    )


def _fragile(reading: Mapping[str, Any]) -> str:
    """The answers one seed decides, and what each becomes without it."""
    parts = [
        f"{name} changes {without}"
        for name, question in (("the answer on exact", "q2"), ("the answer on uniform", "q1"))
        if (without := without_seed(reading, question))
    ]
    return f" One seed decides: {'; '.join(parts)}." if parts else " No answer rests on one seed."


def _seeds(k: int) -> str:
    return f"{k} seed" if k == 1 else f"{k} seeds"


def _median(question: Mapping[str, Any]) -> str:
    rel = question["relative_mse"]
    if rel["median"] is None:
        return "not measured (no seed where both learned)"
    bound = "" if rel["bound"] is None else f", upper bound {rel['bound']:.3f}x"
    return f"a median {rel['median']:.3f}x (sign test p {rel['p_two_sided']:.2g}{bound})"
