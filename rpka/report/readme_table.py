"""The README's results: one short table, generated (issue 56, item 2).

    python -m rpka summary --preset full --readme README.md

One row per short track of the study (its primary arm's verdict against exact attention,
r* - the smallest RPKA rank that recovers the gap, from ``frontier.json`` - and the
training step there against exact's) and one per length of the pre-registered long-range
study (``longrange-power/frontier.json``'s answer). Every number is read from the committed
result files; the full block (every track, targets, training cost) is the report's
(``rpka.report.readme.render``, its appendix), which the table links to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from rpka import paths
from rpka.config.presets_longctx import POWER_PRESET
from rpka.io import read_json_checked
from rpka.paths import resolve
from rpka.report.longrange_answer import cpu_ratio_text
from rpka.report.tables import verdict_word
from rpka.tracks import get_task

NA = "n/a"
REPORT_LINK = "docs/rpka_report_{preset}.html"


def _optional(path: str) -> dict[str, Any] | None:
    found = resolve(path)
    return read_json_checked(found) if found.exists() else None


def _r_star(entry: Mapping[str, Any] | None) -> tuple[str, str]:
    """(r* in words, the training step there against exact's) of a frontier track."""
    if not entry:
        return "no frontier (gate failed)", NA
    row = next((r for r in entry.get("rows", []) if r.get("method") == "rpka"
                and r.get("rank") == entry.get("r_star")), None)  # fmt: skip
    if entry.get("r_star") is None or row is None:
        return "not reached", NA
    ratio = row.get("step_ratio")
    return (
        f"{row['rank']} of {row['n_points']} points",
        NA if ratio is None else f"{ratio:.1f}× exact's training step",
    )


def track_rows(study: Mapping[str, Any], frontier: Mapping[str, Any] | None) -> list[dict]:
    """One row per short track, gate passed first (study order within)."""
    fronts = (frontier or {}).get("tracks") or {}
    rows = []
    for name, entry in study["tracks"].items():
        gate = entry.get("attention_gate") or {}
        verdict = verdict_word((entry.get("primary") or {}).get("verdict", NA))
        if gate and not gate.get("passed"):
            verdict += " (gate failed: attention not needed)"
        r_star, cost = _r_star(fronts.get(name))
        rows.append({
            "track": get_task(name).text.title.replace(" track", ""),
            "verdict (primary arm vs exact)": f"`{entry['primary_arm']}`: {verdict}",
            "r\\*": r_star, "cost at r\\*": cost, "_order": 0 if gate.get("passed") else 1,
        })  # fmt: skip
    rows.sort(key=lambda r: r.pop("_order"))
    return rows


def longrange_rows(preset: str) -> list[dict]:
    """One row per length the pre-registered long-range study has read."""
    frontier = _optional(f"{paths.results_dir(preset)}/{POWER_PRESET}/{paths.FRONTIER_FILE}")
    answer = (frontier or {}).get("longrange_answer") or {}
    rows = []
    for length, entry in (answer.get("per_length") or {}).items():
        robust = entry.get("robust_non_inferior") or []
        ranks = sorted(int(a.rsplit("-r", 1)[1]) for a in robust if a.startswith("rpka-r"))
        rows.append({
            "track": f"Long range, 16-seed pilot ({int(length):,} tokens)",
            "verdict (primary arm vs exact)": entry.get("unread") or (
                ", ".join(f"`{a}`" for a in robust) + " robustly non-inferior on the gap scale"
                " (flattered where exact fails: see the decision study)"
                if robust else "no rank robustly non-inferior"),
            "r\\*": f"{ranks[0]} of {2 * int(length):,} points" if ranks else "not reached",
            "cost at r\\*": (f"{cpu_ratio_text(entry.get('step_ratio_cpu'))} exact's CPU step"
                             if entry.get("cheapest") else NA),
        })  # fmt: skip
    return rows


def decision_rows(study: Mapping[str, Any]) -> list[dict]:
    """The decision study's row (issue 53): its answers once a look is read, else how many
    of its seeds are in."""
    entry = study.get("longrange_v2")
    if not entry:
        return []
    reading = entry.get("reading")
    look = reading and (reading.get("final") or reading.get("interim"))
    name = reading and ("final look" if reading.get("final") else "interim look")
    runs_on = bool(look) and reading["stopped_at"] == "running"
    running = f"; running on to {entry['seeds_planned']} seeds" if runs_on else ""
    verdict = (
        f"`rpka-r64` vs exact: {look['q2']['answer']}; pivoting vs uniform: "
        f"{look['q1']['answer']} ({name}{running})"
        if look
        else f"running: {entry['seeds_complete']} of {entry['seeds_planned']} seeds in"
    )
    return [{"track": "Long range, decision study (4,096 tokens)",
             "verdict (primary arm vs exact)": verdict, "r\\*": NA, "cost at r\\*": NA}]


def readme_block(preset: str = "full") -> str:
    """The README's results block: the table and where everything else is."""
    study = _optional(paths.study_json(preset))
    if study is None:
        raise FileNotFoundError(
            f"no {paths.study_json(preset)}: run `python -m rpka report --preset {preset}` first"
        )
    frontier = _optional(paths.frontier_json(preset))
    rows = track_rows(study, frontier) + longrange_rows(preset) + decision_rows(study)
    table = pd.DataFrame(rows)
    link = REPORT_LINK.format(preset=preset)
    return (
        f"Generated from the `{preset}` study's result files (`python -m rpka summary\n"
        f"--preset {preset} --readme README.md`); every track, arm, target and cost is in the\n"
        f"[report]({link}), its appendix D the full summary.\n\n" + table.to_markdown(index=False)
    )
