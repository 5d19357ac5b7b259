"""The top of the report: the answer in one sentence and one table of every track.

The question the study asks is *when does RPKA stop losing to exact attention, and at what
cost*. The answer is read from ``frontier.json`` (:mod:`rpka.verdict.frontier`: r* per track, the
gap recovered there with its 95 % interval, the training-step ratio, the positive control)
and the study index ``study.json`` (each track's gate and primary verdict, the long-context
contexts). Every number comes from those files; a key an older file lacks reads "n/a".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rpka import paths
from rpka.io import read_json_checked
from rpka.report.tables import verdict_word
from rpka.report.text import esc, num
from rpka.study.steps import FRONTIER_EXTENSIONS, LONGRANGE_TRACK
from rpka.tracks import get_task
from rpka.verdict.decision import MARGIN_GAP, NON_INFERIOR, gap_recovered, gate_passed
from rpka.verdict.frontier import per_seed_gap
from rpka.verdict.stats import ALPHA

NA = "n/a"


LONGRANGE_PREFIX = LONGRANGE_TRACK.format(context="")  # frontier tracks of the long-range study


def _title(name: str) -> str:
    if name in FRONTIER_EXTENSIONS:
        return FRONTIER_EXTENSIONS[name]
    if name.startswith(LONGRANGE_PREFIX) and name[len(LONGRANGE_PREFIX) :].isdigit():
        return f"long range at {int(name[len(LONGRANGE_PREFIX) :]):,} tokens"
    try:
        return get_task(name).text.title
    except (KeyError, ValueError):  # a track this checkout does not register
        return name


def _gap(row: Mapping[str, Any] | None) -> str:
    g = (row or {}).get("gap_recovered") or {}
    if g.get("mean") is None:
        return NA
    return f"{g['mean']:.3f} [{num(g.get('ci_low'), '.3f')}, {num(g.get('ci_high'), '.3f')}]"


def r_star_row(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The frontier row of the RPKA arm at r* (None where r* is not reached)."""
    r_star = entry.get("r_star")
    if r_star is None:
        return None
    return next(
        (r for r in entry.get("rows", []) if r.get("method") == "rpka" and r.get("rank") == r_star),
        None,
    )


def best_rpka_row(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The RPKA row with the largest mean gap recovered (where r* is not reached), the
    positive control (full rank: exact by construction) left out."""
    positive = (entry.get("positive_control") or {}).get("arm")
    rows = [
        r
        for r in entry.get("rows", [])
        if r.get("method") == "rpka"
        and r.get("arm") != positive
        and (r.get("gap_recovered") or {}).get("mean") is not None
    ]
    return max(rows, key=lambda r: r["gap_recovered"]["mean"]) if rows else None


def _ratio(x: float | None) -> str:
    return NA if x is None else f"{x:.2f}×"


def _track_clause(name: str, entry: Mapping[str, Any]) -> str:
    row = r_star_row(entry)
    if row is not None:
        return (
            f"from rank {entry['r_star']} of {row['n_points']} points "
            f"({row['rank_over_n']:.2f} of them) on {esc(_title(name))}, recovering "
            f"{_gap(row)} of the gap at {_ratio(row.get('step_ratio'))} exact's training step"
        )
    best = best_rpka_row(entry)
    if best is None:
        return f"at no trained rank on {esc(_title(name))}"
    return (
        f"at no trained rank on {esc(_title(name))} (best: rank {best['rank']} of "
        f"{best['n_points']}, {_gap(best)} of the gap, at {_ratio(best.get('step_ratio'))} "
        "exact's training step)"
    )


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else "; ".join(items[:-1]) + "; and " + items[-1]


def answer_sentence(frontier: Mapping[str, Any] | None, superseded: bool = False) -> str:
    """When RPKA stops losing, at what cost, and whether the positive control ties: one
    sentence per the frontier file (Markdown); without a frontier, says so. ``superseded``
    (the study also ran the pre-registered 16-seed long-range study): the older 8-seed
    study's frontier tracks (``longrange-<n>``) are left out, and the sentence says so."""
    tracks = (frontier or {}).get("tracks") or {}
    if not tracks:
        return (
            "**When does RPKA stop losing, at what cost?** Not answered: this study has no "
            "rank frontier (`frontier.json`)."
        )
    left_out = [name for name in tracks if superseded and name.startswith(LONGRANGE_PREFIX)]
    tracks = {name: entry for name, entry in tracks.items() if name not in left_out}
    if not tracks:
        return "**When does RPKA stop losing, at what cost?** Not answered on the short tracks."
    margin = next(iter(tracks.values())).get("margin_gap")
    clauses = [_track_clause(name, entry) for name, entry in tracks.items()]
    positives = {
        name: (entry.get("positive_control") or {}).get("verdict") for name, entry in tracks.items()
    }
    tie = [_title(n) for n, v in positives.items() if v == NON_INFERIOR]
    no_tie = [_title(n) for n, v in positives.items() if v is not None and v != NON_INFERIOR]
    untested = [_title(n) for n, v in positives.items() if v is None]
    control = []
    if tie:
        control.append(f"ties with exact on {', '.join(tie)}")
    if no_tie:
        control.append(f"**does not tie** on {', '.join(no_tie)} (that frontier is not read)")
    if untested:
        control.append(f"was not trained on {', '.join(untested)}")
    return (
        "**When does RPKA stop losing, at what cost?** It ties with exact attention (mean gap "
        f"recovered non-inferior to {num(margin, '.2f')}, one-sided t-test at {ALPHA:g}; 1 is "
        f"exact attention, 0 no attention) {_join(clauses)}. The wiring check (the positive "
        f"control: a rank exact by construction) {'; it '.join(control)}."
        + (" The long-range answer is the decision study's (below and Section 3), whose pilot "
           "is the pre-registered 16-seed study; the older 8-seed long-range study is "
           "superseded and not read here." if left_out else "")
    )  # fmt: skip


def _positive(entry: Mapping[str, Any] | None) -> str:
    positive = (entry or {}).get("positive_control")
    if not entry:
        return "no frontier"
    if positive is None:
        return "not trained"
    return f"`{positive['arm']}`: {positive.get('verdict', NA)}"


def _gate(gate: Mapping[str, Any] | None) -> str:
    if gate is None:
        return "none"
    return "passed" if gate.get("passed") else "failed"


def _length(report: Mapping[str, Any]) -> str:
    tokens = report["arms"].get(report["primary_arm"], {}).get("attention_tokens")
    return NA if tokens is None else f"{int(tokens):,}"


def _frontier_cells(entry: Mapping[str, Any] | None) -> dict[str, str]:
    """The all-tracks table's frontier columns of one ``frontier.json`` track (None: no
    frontier): r* (rank / points), the gap recovered and the training step at r*, the
    positive control's reading."""
    row = r_star_row(entry) if entry else None
    if entry is None:
        r_star = "no frontier"
    elif row is None:
        r_star = "not reached"
    else:
        r_star = f"{row['rank']} / {row['n_points']} ({row['rank_over_n']:.2f})"
    cost = (entry or {}).get("r_star_cost") or {}
    own = (cost.get("lengths") or {}).get(str(cost.get("own_length"))) or {}
    speedup, memory = own.get("forward_speedup"), own.get("memory_ratio")
    return {
        "r* (rank / points)": r_star,
        "gap recovered at r* [95 % CI]": _gap(row) if row else NA,
        "train step at r* (× exact)": _ratio(row.get("step_ratio")) if row else NA,
        "forward at r* (× exact)": _ratio(1 / speedup) if speedup else NA,
        "peak memory at r* (× exact)": _ratio(memory) if memory else NA,
        "wiring check (positive control)": _positive(entry),
    }


def all_tracks_table(study: Mapping[str, Any], frontier: Mapping[str, Any] | None) -> pd.DataFrame:
    """One row per track (study order: gate passed first), per length of the older
    long-context study and per length of the long-range one (:func:`longrange_rows`):
    length, gate, primary arm and verdict, r* (rank / points), gap recovered at r* with its
    95 % CI, training step at r* against exact's, the positive control's reading."""
    fronts = (frontier or {}).get("tracks") or {}
    rows = []
    for name, track in study["tracks"].items():
        rows.append({
            "track": track["title"],
            "length": _length(track["report"]),
            "gate": _gate(track.get("attention_gate")),
            "primary arm": f"`{track['primary_arm']}`",
            "primary verdict": verdict_word((track.get("comparison") or {}).get("verdict", NA)),
            **_frontier_cells(fronts.get(name)),
        })  # fmt: skip
    for name, entry in (study.get("extensions") or {}).items():  # frontier extensions: short tracks
        tokens = entry.get("attention_tokens")
        rows.append({
            "track": entry.get("title", name),
            "length": NA if tokens is None else f"{int(tokens):,}",
            "gate": _gate(entry.get("attention_gate")),
            "primary arm": f"`{entry.get('primary_arm', NA)}`",
            "primary verdict": verdict_word((entry.get("primary") or {}).get("verdict", NA)),
            **_frontier_cells(fronts.get(name)),
        })  # fmt: skip
    for context, entry in sorted(
        ((study.get("longctx") or {}).get("contexts") or {}).items(), key=lambda kv: int(kv[0])
    ):
        rows.append({
            "track": "long context (regimes, local task)",
            "length": f"{int(context):,}",
            "gate": _gate(entry.get("attention_gate")),
            "primary arm": f"`{entry.get('primary_arm', NA)}`",
            "primary verdict": verdict_word((entry.get("primary") or {}).get("verdict", NA)),
            "r* (rank / points)": "no frontier",
            "gap recovered at r* [95 % CI]": NA,
            "train step at r* (× exact)": NA,
            "forward at r* (× exact)": NA,
            "peak memory at r* (× exact)": NA,
            "wiring check (positive control)": "no frontier",
        })  # fmt: skip
    rows += longrange_rows(study.get("longrange"), frontier, bool(study.get("longrange_power")))
    return pd.DataFrame(rows)


# the long-range rows of a study that also ran the pre-registered 16-seed study (the full
# one): the older 8-seed study, kept as a record (issue 53, item 3)
SUPERSEDED_TRACK = "long range, 8 seeds (superseded)"


def longrange_rows(
    longrange: Mapping[str, Any] | None,
    frontier: Mapping[str, Any] | None,
    superseded: bool = False,
) -> list[dict[str, Any]]:
    """The all-tracks table's rows of the long-range study (issue 27), one per length: the
    two-control gate, the primary verdict, r* and its cost from ``frontier.json``'s
    ``longrange-<n>`` (a length whose gate failed has no frontier); ``superseded``: labelled
    so (:data:`SUPERSEDED_TRACK`)."""
    fronts = (frontier or {}).get("tracks") or {}
    rows = []
    contexts = (longrange or {}).get("contexts") or {}
    for context, entry in sorted(contexts.items(), key=lambda kv: int(kv[0])):
        rows.append({
            "track": SUPERSEDED_TRACK if superseded else "long range (two controls)",
            "length": f"{int(context):,}",
            "gate": "passed" if entry.get("gate_passed") else "failed",
            "primary arm": f"`{entry.get('primary_arm', NA)}`",
            "primary verdict": ("superseded: " if superseded else "")
            + verdict_word((entry.get("primary") or {}).get("verdict", NA)),
            **_frontier_cells(fronts.get(LONGRANGE_TRACK.format(context=int(context)))),
        })  # fmt: skip
    return rows


def all_tracks_note(superseded: bool = False) -> str:
    """What the table's columns mean (Markdown); ``superseded``: the long-range rows are
    the older 8-seed study's (:func:`longrange_rows`)."""
    return (
        "*Gate*: the track's attention gate (uniform attention clearly worse than exact); a "
        "failed gate makes every verdict of the track uninformative. On the long-range rows "
        "it is the two-control gate (exact clearly better than both uniform attention and a "
        "local window)"
        + (
            "; those rows are the older 8-seed long-range study, *superseded* by the "
            "pre-registered 16-seed study (docs/longrange_protocol.md; a decision study, "
            "docs/longrange_protocol_v2.md, is running)"
            if superseded
            else ""
        )
        + ". *Wiring check*: the positive control, "
        "a rank exact by construction, which must tie with exact. *Primary verdict*: the "
        "pre-registered primary arm against exact on the track's own metric (Section 2). "
        "*r\\**: the smallest RPKA rank whose gap recovered is non-inferior (Section 1), "
        "with the points it pivots among. *Train step*: the median training step against "
        "exact attention's on the same track and length (a speed measurement, not a quality "
        "one). *Forward* and *peak memory at r\\**: one non-causal attention call of RPKA "
        "at r\\* against exact attention's at the track's length (latency sweep, B·H = 8, "
        "head dim 64: a kernel measurement, not the trained model's; `frontier.json` "
        "`r_star_cost` also holds 2,048 and 8,192 tokens)."
    )


# --------------------------------------------------------------------------- the headline figure


def primary_gap(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The primary arm's gap recovered against exact and the track's control
    (:func:`rpka.verdict.frontier.per_seed_gap`, :func:`rpka.verdict.decision.gap_recovered`):
    mean, 95 % t interval, verdict; None without a control arm, or where a seed has no gap."""
    arms = report["arms"]
    control = (report.get("attention_gate") or {}).get("control_arm")
    if control not in arms or report["primary_arm"] not in arms:
        return None
    g = per_seed_gap(
        arms[control]["full"]["per_seed"],
        arms[report["baseline_arm"]]["full"]["per_seed"],
        arms[report["primary_arm"]]["full"]["per_seed"],
        report["metric_direction"],
    )
    gap = gap_recovered(g)
    return None if gap["mean"] is None else gap


def longctx_reports(
    study: Mapping[str, Any], results_dir: str | os.PathLike, key: str = "longctx"
) -> dict[int, dict[str, Any]]:
    """The long-context bench report of each context the study index names under ``key``
    (``longctx``, or ``longrange`` for issue 27's study), by context (those whose file is
    absent are left out)."""
    out = {}
    for context, entry in ((study.get(key) or {}).get("contexts") or {}).items():
        path = Path(results_dir) / str(entry.get("bench_report", ""))
        if entry.get("bench_report") and path.exists():
            out[int(context)] = read_json_checked(path, ("arms", "baseline_arm", "primary_arm"))
    return dict(sorted(out.items()))


def headline_rows(
    study: Mapping[str, Any],
    longctx: Mapping[int, Mapping[str, Any]] | None = None,
    longrange: Mapping[int, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The headline figure's rows (``rpka.report.figures_headline.plot_headline``): every
    track, then each long-context length (``longctx``: :func:`longctx_reports`), then each
    long-range length (``longrange``: :func:`longctx_reports` with ``key="longrange"``; its
    gate the two-control gate, from the study index)."""
    rows = []
    for t in study["tracks"].values():
        report = t["report"]
        rows.append({
            "label": f"{t['title']} ({_length(report)} tokens): {t['primary_arm']}",
            "gap": primary_gap(report) if t["gate"] != "failed" else None,
            "gate": t["gate"], "margin_gap": MARGIN_GAP,
            "verdict": verdict_word((t.get("comparison") or {}).get("verdict", NA)),
        })  # fmt: skip
    for context, report in (longctx or {}).items():
        gate = report.get("attention_gate")
        c = report["arms"][report["primary_arm"]].get("comparison") or {}
        rows.append({
            "label": f"long context, local task ({context:,} tokens): {report['primary_arm']}",
            "gap": primary_gap(report) if _gate(gate) != "failed" else None,
            "gate": _gate(gate), "margin_gap": MARGIN_GAP,
            "verdict": verdict_word(c.get("verdict", NA)),
        })  # fmt: skip
    gates = ((study.get("longrange") or {}).get("contexts")) or {}
    name = "long range, 8 seeds, superseded" if study.get("longrange_power") else "long range"
    for context, report in (longrange or {}).items():
        passed = (gates.get(str(context)) or {}).get("gate_passed")
        gate = "passed" if passed else "failed"
        c = report["arms"][report["primary_arm"]].get("comparison") or {}
        rows.append({
            "label": f"{name} ({context:,} tokens): {report['primary_arm']}",
            "gap": primary_gap(report) if passed else None,
            "gate": gate, "margin_gap": MARGIN_GAP,
            "verdict": verdict_word(c.get("verdict", NA)),
        })  # fmt: skip
    return rows


def headline_caption(rows: list[Mapping[str, Any]]) -> tuple[str, str]:
    """(caption, alt text) of the headline figure, every row's numbers in it."""
    parts = []
    for row in rows:
        gap = row.get("gap")
        value = "no gap to recover" if gap is None else _gap({"gap_recovered": gap})
        parts.append(f"{esc(row['label'])}: {value}, {row['verdict']}")
    caption = (
        "**The answer per track, on one scale.** The primary arm's gap recovered, "
        "(control - arm) / (control - exact) per evaluation seed, where 1 is exact attention "
        "and 0 the no-attention control (uniform attention); mean and 95 % t interval; "
        f"shaded: non-inferior to exact (the frontier's margin, {MARGIN_GAP:g}). Hollow grey: "
        "the control ties exact (the attention gate failed), so there is no gap to recover. "
        "The verdict beside each row is the primary comparison's, on the track's own metric "
        "(Section 2). " + "; ".join(parts) + "."
    )
    return caption, "Headline dot plot of gap recovered, one row per track. " + "; ".join(
        parts
    ) + "."


# --------------------------------------------------------------------------- targets

# a target about the science (does a track teach exact attention anything; does the
# mechanism hold), not about speed, memory or the study's budget
SCIENCE_MARKERS = ("learnable", "trace identity")


def split_targets(targets: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(science bars, engineering targets) of the targets table
    (:func:`rpka.report.readme.targets_table`): a row is science when its target names a
    track's learnability or the trace identity (``SCIENCE_MARKERS``)."""
    science = targets["target"].str.contains("|".join(SCIENCE_MARKERS), regex=True)
    return targets[science].reset_index(drop=True), targets[~science].reset_index(drop=True)


# --------------------------------------------------------------------------- standard beside full

# each committed study's companion: the other one (the previews have none)
COMPANION_STUDY = {"standard": "full", "full": "standard"}


def study_decisions(index: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Per track of a study index (``study.json``; long-range lengths as
    ``longrange-<n>``): its gate (the attention gate, and the local one where the track
    has it), its primary arm and the primary verdict."""
    decisions = {}
    for name, entry in index.get("tracks", {}).items():
        passed = gate_passed(entry.get("attention_gate"), entry.get("local_gate"))
        decisions[name] = {"gate": "passed" if passed else "failed", **_primary(entry)}
    contexts = (index.get(paths.LONGRANGE) or {}).get("contexts") or {}
    for context, entry in contexts.items():
        decisions[LONGRANGE_TRACK.format(context=int(context))] = {
            "gate": "passed" if entry.get("gate_passed") else "failed",
            **_primary(entry),
        }
    return decisions


def _primary(entry: Mapping[str, Any]) -> dict[str, str]:
    return {
        "primary": str(entry.get("primary_arm", NA)),
        "verdict": str((entry.get("primary") or {}).get("verdict", NA)),
    }


def companion_table(
    this: Mapping[str, Any], other: Mapping[str, Any], names: tuple[str, str]
) -> pd.DataFrame:
    """This study's gates and primary verdicts beside the other study's (``names``: the
    two presets), one row per track either ran; *agree*: same gate and same verdict (the
    primary arm may differ where a track's gate fails: its verdict is uninformative
    whichever arm is compared)."""
    mine, theirs = study_decisions(this), study_decisions(other)
    rows = []
    for track in [*mine, *(t for t in theirs if t not in mine)]:
        row: dict[str, str] = {"track": track}
        for name, decisions in zip(names, (mine, theirs), strict=True):
            d = decisions.get(track)
            row[f"gate ({name})"] = d["gate"] if d else "not run"
            row[f"primary ({name})"] = (
                f"`{d['primary']}`: {verdict_word(d['verdict'])}" if d else "not run"
            )
        a, b = mine.get(track), theirs.get(track)
        if a is None or b is None:
            row["agree"] = "-"
        else:
            same = (a["gate"], a["verdict"]) == (b["gate"], b["verdict"])
            row["agree"] = "yes" if same else "**no**"
        rows.append(row)
    return pd.DataFrame(rows)


def companion_section(preset: str, results_root: str | os.PathLike | None = None) -> str:
    """Markdown: the other committed study's gates and primary verdicts beside this one's
    (standard beside full, or full beside standard), with how many tracks agree; "" for a
    preset without a companion or where either study index is missing."""
    other = COMPANION_STUDY.get(preset)
    if other is None:
        return ""
    files = [paths.resolve(paths.study_json(p)) for p in (preset, other)]
    if results_root is not None:  # tests: another results folder
        files = [Path(results_root) / p / Path(paths.study_json(p)).name for p in (preset, other)]
    if not all(f.exists() for f in files):
        return ""
    this, that = (read_json_checked(f) for f in files)
    table = companion_table(this, that, (preset, other))
    shared = table[table["agree"] != "-"]
    agree = int((shared["agree"] == "yes").sum())
    have = "has" if agree == 1 else "have"
    return (
        f"**The {preset} study beside the {other} one.** Of the {len(shared)} tracks both "
        f"ran, {agree} {have} the same gate and the same primary verdict "
        f"(`{paths.study_json(other)}`).\n\n" + table.to_markdown(index=False)
    )
