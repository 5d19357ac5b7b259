"""The report's long-range study (issue 27): a task whose answer lies far back, exact
attention against two controls (no attention, a local window), RPKA per length and rank.

Reads the study index's ``longrange`` (:func:`rpka.study.steps.longrange_entry`: both gates, the
learnability bar and every arm's verdict per length), ``frontier.json``'s
``longrange-<n>`` tracks (the gap recovered of each gated length), the study's own
``longctx.json`` (step and peak-memory ratios per arm, the set-up) and ``locality.json``
(how far back the evidence lies). Every number comes from those files; a file or key
that is missing reads "n/a" / "not run", never an error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pandas as pd
from IPython.display import Markdown

from rpka import paths
from rpka.io import read_json_checked
from rpka.report.figures_frontier import plot_longrange_answer
from rpka.report.longrange_answer import (
    NA,
    cpu_ratio_text,
    lengths_text,
    ratio_text,
    robust_answer_text,
)
from rpka.report.narrative import untimed_answer
from rpka.report.tables import verdict_word
from rpka.report.text import esc, num
from rpka.study.longctx import FILE_NAME as LONGCTX_FILE
from rpka.study.steps import LONGRANGE_TRACK
from rpka.verdict.decision import MARGIN_GAP, NON_INFERIOR, STEP_TIE, cheaper_step
from rpka.verdict.frontier import STEP_SOURCE_WALL

NOT_RUN = "not run"
STEP_SOURCE_TIMING = "steptime"  # a step ratio from the timing file (rpka.study.steptime)
STEP_SOURCE_RUNS = STEP_SOURCE_WALL  # one from the runs' recorded medians
DELTA_COLUMN = "delta test MSE [95 % CI]"  # the t interval of arm - exact (longctx.json)
LOCALITY_FILE = "locality.json"  # scripts/longrange_locality.py, beside longctx.json


def load_files(
    folder: str | os.PathLike,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(``longctx.json``, ``locality.json``) of the long-range study's folder
    (``rpka.paths.longrange_dir``), each None where it is not there."""
    found = []
    for name in (LONGCTX_FILE, LOCALITY_FILE):
        path = paths.resolve(folder) / name
        found.append(read_json_checked(path) if path.exists() else None)
    return found[0], found[1]


def _contexts(index: Mapping[str, Any] | None) -> list[tuple[int, dict[str, Any]]]:
    contexts = (index or {}).get("contexts") or {}
    return sorted(((int(c), e) for c, e in contexts.items()), key=lambda kv: kv[0])


def frontier_track(frontier: Mapping[str, Any] | None, context: int) -> dict[str, Any] | None:
    """``frontier.json``'s track of one long-range length (None: its gate failed, or no
    frontier)."""
    return ((frontier or {}).get("tracks") or {}).get(LONGRANGE_TRACK.format(context=context))


def cost_rows(longctx_file: Mapping[str, Any] | None) -> dict[tuple[int, str], dict[str, Any]]:
    """``longctx.json``'s rows by (context, arm): step and peak-memory ratios to exact."""
    return {
        (int(r["context"]), str(r.get("arm"))): r
        for r in (longctx_file or {}).get("rows", [])
        if r.get("context") is not None
    }


def answer_points(
    frontier: Mapping[str, Any] | None, longctx_file: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """One point per (gated length, arm of the frontier): the gap recovered (mean, 95 % CI,
    frontier verdict) and, from ``longctx.json``'s rows, the training step's and peak
    memory's ratios to exact (the step ratio: the CPU-time ratio of ``steptime.json`` where
    the frontier row has one, else the runs' wall-time medians, else the frontier row's;
    ``step_source`` says which);
    ``positive_control`` marks the arm exact by construction (full rank)."""
    costs = cost_rows(longctx_file)
    points = []
    for name, track in ((frontier or {}).get("tracks") or {}).items():
        prefix = LONGRANGE_TRACK.format(context="")
        if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
            continue
        context = int(name[len(prefix) :])
        positive = (track.get("positive_control") or {}).get("arm")
        for row in track.get("rows", []):
            cost = costs.get((context, row["arm"]), {})
            gap = row.get("gap_recovered") or {}
            cpu = row.get("step_ratio_cpu")  # steptime.json's, where the study was timed
            step = cpu["mean"] if cpu else cost.get("step_ratio_vs_exact", row.get("step_ratio"))
            points.append({
                "context": context, "arm": row["arm"], "method": row.get("method"),
                "rank": row.get("rank"), "gap_mean": gap.get("mean"),
                "gap_ci_low": gap.get("ci_low"), "gap_ci_high": gap.get("ci_high"),
                "verdict": row.get("verdict", NA), "step_ratio": step,
                "peak_ratio": cost.get("peak_ratio_vs_exact"),
                "margin_gap": track.get("margin_gap"),
                "positive_control": row["arm"] == positive,
                "step_source": STEP_SOURCE_TIMING if cpu else STEP_SOURCE_RUNS,
            })  # fmt: skip
    return sorted(points, key=lambda p: (p["context"], p["method"] != "rpka", p["rank"] or 0))


def paying_points(points: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The points where low-rank RPKA's step is cheaper than exact's
    (``rpka.verdict.decision.cheaper_step``) and its gap non-inferior (not the positive
    control: full rank is exact attention's cost)."""
    return [
        p
        for p in points
        if p.get("method") == "rpka"
        and not p.get("positive_control")
        and cheaper_step(p.get("step_ratio"))
        and p.get("verdict") == NON_INFERIOR
    ]


def _gap(p: Mapping[str, Any]) -> str:
    if p.get("gap_mean") is None:
        return NA
    low, high = num(p.get("gap_ci_low"), ".3f"), num(p.get("gap_ci_high"), ".3f")
    return f"{p['gap_mean']:.3f} [{low}, {high}]"


# --------------------------------------------------------------------------- text


def setup_text(
    index: Mapping[str, Any] | None,
    longctx_file: Mapping[str, Any] | None,
    locality: Mapping[str, Any] | None,
) -> str:
    """The study's set-up (Markdown): task, how far back its evidence lies per length
    (``locality.json``), lengths, arms, seeds, the gate rule."""
    contexts = [c for c, _ in _contexts(index)]
    if not contexts:
        return "The long-range study was not run in this study (no `longrange/longctx.json`)."
    bench = ((longctx_file or {}).get("config") or {}).get("bench") or {}
    task = (bench.get("track") or {}).get("name", NA)
    arms = [a.get("name", NA) for a in bench.get("arms", [])]
    seeds = len(bench.get("eval_seeds") or [])
    far = []
    for context in contexts:
        loc = ((locality or {}).get("contexts") or {}).get(str(context))
        if loc:
            share = loc.get("share_within_window")
            within = num(None if share is None else 100 * share, ".0f")
            far.append(
                f"{context:,} tokens: median {num(loc.get('median'), '.0f')} steps back "
                f"(10th–90th percentile {num(loc.get('p10'), '.0f')}–"
                f"{num(loc.get('p90'), '.0f')}; {within}"
                f" % within the local window of {loc.get('window', NA)})"
            )
    if far:
        where = "; ".join(far)
    elif locality:
        where = "not measured at these lengths (`locality.json` has other lengths)"
    else:
        where = "not measured (no `locality.json`)"
    rules = {(e.get("attention_gate") or {}).get("rule") for _, e in _contexts(index)} - {None}
    warm = ((longctx_file or {}).get("config") or {}).get("warm_start_from")
    longer = [c for c in contexts if warm and c > warm]
    curriculum = (
        f"At {lengths_text(longer)} tokens every run - each arm, controls included - first "
        f"trains at {warm:,} tokens with its own rate, seeds and steps, then as many steps "
        "at its own length from those weights, learned positions stretched (a curriculum, "
        "`rpka.curriculum`: from scratch exact attention did not learn at 2,048 tokens). "
        if longer
        else ""
    )
    return (
        f"**Set-up.** Task `{esc(task)}` trained at {lengths_text(contexts)} tokens; arms "
        f"{', '.join(f'`{esc(a)}`' for a in arms) or NA}; {seeds or NA} evaluation seeds. "
        f"{curriculum}"
        f"How far back the evidence the forecast needs lies: {where}. A length is informative "
        "only when exact attention beats **both** controls, the no-attention control and the "
        "local window (the two-control gate; each gate "
        f"{esc('; '.join(sorted(rules))) if rules else NA}); its verdicts count only then."
    )


def _point(p: Mapping[str, Any], step: bool = True) -> str:
    """An RPKA point in words, "r 16 at 512 (0.75×, gap)"; without ``step`` (a wall-time
    ratio, no cost claim) the gap alone."""
    cost = f"{ratio_text(p.get('step_ratio'))}, " if step else ""
    return f"r {p['rank']} at {p['context']:,} ({cost}{_gap(p)})"


def answer_text(index: Mapping[str, Any] | None, points: list[Mapping[str, Any]]) -> str:
    """Issue 27's question answered from the points (Markdown): is there a (length, rank)
    where RPKA's step is cheaper than exact's and its quality non-inferior? Then, at the
    gated lengths where none is, RPKA's cheaper points, and the cheaper non-inferior
    points of the other low-rank methods (uniform landmarks)."""
    contexts = _contexts(index)
    if not contexts:
        return "**Does RPKA pay at long range?** Not answered: the long-range study was not run."
    gated = [c for c, e in contexts if e.get("gate_passed")]
    if not gated:
        return (
            "**Does RPKA pay at long range?** Not answered: at no length did exact attention "
            "beat both controls (the two-control gate), so there is no gap to recover."
        )
    low_rank = [
        p for p in points if not p.get("positive_control") and p.get("gap_mean") is not None
    ]
    rpka = [p for p in low_rank if p.get("method") == "rpka"]
    margin = num(points[0].get("margin_gap") if points else None, ".2f")
    if low_rank and all(p.get("step_source") == STEP_SOURCE_RUNS for p in low_rank):
        controls = [f"{ratio_text(p['step_ratio'])} at {p['context']:,}" for p in points
                    if p.get("positive_control") and p.get("step_ratio")]  # fmt: skip
        good = [_point(p, step=False) for p in rpka if p.get("verdict") == NON_INFERIOR]
        return untimed_answer(good, controls, margin)
    cheaper_rpka = [p for p in rpka if cheaper_step(p.get("step_ratio"))]
    paying = paying_points(points)
    if paying:
        named = "; ".join(
            f"{p['context']:,} tokens, r {p['rank']}: gap recovered {_gap(p)}, step "
            f"{ratio_text(p['step_ratio'])} exact's"
            + (f", peak memory {ratio_text(p.get('peak_ratio'))}"
               if p.get("peak_ratio") is not None else "")
            for p in paying
        )  # fmt: skip
        text = f"**Does RPKA pay at long range?** Yes: {named}."
        unpaid = [c for c in gated if c not in {p["context"] for p in paying}]
        if unpaid:
            text += (
                f" At {lengths_text(unpaid)} tokens no rank is both (non-inferior: gap recovered "
                f"above {margin}; cheaper: a step below {1 - STEP_TIE:.2f}× exact's)"
            )
            there = [p for p in cheaper_rpka if p["context"] in unpaid]
            text += (": cheaper there " + ", ".join(map(_point, there)) if there else "") + "."
    else:
        text = (
            "**Does RPKA pay at long range?** Not shown: at the gated lengths "
            f"({lengths_text(gated)} tokens) no RPKA rank is both cheaper per training step "
            "than exact and non-inferior "
            f"(gap recovered above {margin})."
        )
        if rpka:
            best = max(rpka, key=lambda p: p["gap_mean"])
            text += (
                f" Best: {best['context']:,} tokens, r {best['rank']}, gap recovered "
                f"{_gap(best)} at {ratio_text(best.get('step_ratio'))} exact's step."
            )
        if cheaper_rpka:
            text += " Cheaper than exact: " + ", ".join(map(_point, cheaper_rpka)) + "."
    at_cost = [p for p in rpka if p.get("verdict") == NON_INFERIOR
               and not cheaper_step(p.get("step_ratio"))
               and p.get("step_ratio") is not None and p["step_ratio"] < 1 + STEP_TIE]  # fmt: skip
    if at_cost:
        text += (
            f" Non-inferior at about exact's cost (step within {STEP_TIE:.0%} of exact's, the "
            "timing noise): " + ", ".join(map(_point, at_cost)) + "."
        )
    peers = [p for p in low_rank if p.get("method") != "rpka" and p.get("verdict") == NON_INFERIOR
             and cheaper_step(p.get("step_ratio"))]  # fmt: skip
    if peers:
        text += (
            " Cheaper and non-inferior without residual pivoting: "
            + ", ".join(
                f"`{esc(p['arm'])}` at {p['context']:,} tokens ({ratio_text(p['step_ratio'])}, "
                f"{_gap(p)})"
                for p in peers
            )  # fmt: skip
            + "."
        )
    return text


def summary_line(index: Mapping[str, Any] | None, frontier: Mapping[str, Any] | None,
                 longctx_file: Mapping[str, Any] | None) -> str:  # fmt: skip
    """The Summary's line on the long-range study (Markdown)."""
    if not _contexts(index):
        return "**Long range.** Not run in this study."
    gates = ", ".join(
        f"{c:,}: {'passed' if e.get('gate_passed') else 'failed'}" for c, e in _contexts(index)
    )
    answer = answer_text(index, answer_points(frontier, longctx_file))
    answer = answer.replace("**Does RPKA pay at long range?** ", "")
    return f"**Long range (Section 3).** Two-control gate per length ({gates}). {answer}"


# --------------------------------------------------------------------------- tables


def _gate(gate: Mapping[str, Any] | None) -> str:
    if not gate:
        return NOT_RUN
    word = "passed" if gate.get("passed") else "failed"
    rel, p = gate.get("control_rel"), gate.get("p_value")
    worse = num(None if rel is None else 100 * rel, "+.0f")
    return f"{word}: `{esc(gate.get('control_arm', NA))}` {worse} % worse, p = {num(p, '.3g')}"


def _learnability(entry: Mapping[str, Any]) -> str:
    bar = entry.get("learnability") or {}
    ratio, required = bar.get("ratio_to_linear"), bar.get("linear_ratio_required")
    if ratio is None:
        return NA
    met = "met" if required is not None and ratio <= required else "missed"
    return f"{ratio:.3f} (≤ {num(required, '.2g')}: {met})"


def gates_table(index: Mapping[str, Any] | None) -> pd.DataFrame:
    """Per length: both gates, the two-control gate, the learnability bar (exact's test
    MSE over the linear naive forecast's) and the primary verdict."""
    return pd.DataFrame([
        {
            "length (tokens)": f"{c:,}",
            "no-attention gate": _gate(e.get("attention_gate")),
            "local gate": _gate(e.get("local_gate")),
            "two-control gate": "passed" if e.get("gate_passed") else "failed",
            "learnability: exact ÷ linear": _learnability(e),
            "primary": f"`{esc(e.get('primary_arm', NA))}`: "
            + verdict_word((e.get("primary") or {}).get("verdict", NA)),
        }
        for c, e in _contexts(index)
    ])  # fmt: skip


def loo_word(robustness: Mapping[str, Any] | None) -> str:
    """A verdict's leave-one-seed-out reading: "robust", "rests on seed s" (the seeds whose
    drop changes it), or n/a (no robustness computed)."""
    if not robustness or robustness.get("robust") is None:
        return NA
    seeds = robustness.get("rests_on_seeds") or []
    if robustness["robust"] or not seeds:
        return "robust" if robustness["robust"] else NA
    return f"rests on seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def _signflip(robustness: Mapping[str, Any] | None) -> str:
    ci = (robustness or {}).get("signflip_ci") or {}
    if ci.get("low") is None and ci.get("high") is None:
        return NA
    return f"[{num(ci.get('low'))}, {num(ci.get('high'))}]"


def verdicts_table(
    index: Mapping[str, Any] | None,
    frontier: Mapping[str, Any] | None,
    longctx_file: Mapping[str, Any] | None,
) -> pd.DataFrame:
    """Per (length, arm with a verdict): the verdict against exact with its t interval and
    the interval of the sign-flip test that decides it (the test inverted), the gap
    recovered [95 % CI], its reading and its leave-one-seed-out robustness ("robust" /
    "rests on seed s"), the training step (the CPU-time ratio of ``steptime.json`` [95 %
    CI] where the study was timed, else the runs' wall-time medians) and peak memory
    against exact's - quality beside speed and memory. Without ``longctx.json`` the t
    interval's column (:data:`DELTA_COLUMN`) is left out: nothing would fill it."""
    costs = cost_rows(longctx_file)
    rows = []
    for context, entry in _contexts(index):
        track = frontier_track(frontier, context) or {}
        gaps = {r["arm"]: r for r in track.get("rows", [])}
        positive = (track.get("positive_control") or {}).get("arm")
        robust = entry.get("robustness") or {}
        timed = entry.get("timing_file") is not None
        for arm, verdict in (entry.get("verdicts") or {}).items():
            cost, g, r = costs.get((context, arm), {}), gaps.get(arm), robust.get(arm)
            c = cost.get("comparison") or {}
            interval = (g or {}).get("gap_recovered") or {}
            gap = {f"gap_{k}": interval.get(k) for k in ("mean", "ci_low", "ci_high")}
            cpu = (r or {}).get("step_ratio_cpu") or (entry.get("step_ratio_cpu") or {}).get(arm)
            step = (
                {"CPU step (× exact) [95 % CI]": cpu_ratio_text(cpu)}
                if timed
                else {"train step (× exact)": ratio_text(cost.get("step_ratio_vs_exact"))}
            )
            rows.append({
                "length": f"{context:,}",
                "arm": f"`{esc(arm)}`" + (" (wiring check)" if arm == positive else ""),
                "verdict vs exact": verdict_word(verdict) if entry.get("gate_passed")
                else f"{verdict_word(verdict)} (gate failed)",
                DELTA_COLUMN: NA if c.get("delta_mean") is None else
                f"{num(c['delta_mean'])} [{num(c.get('ci_low'))}, {num(c.get('ci_high'))}]",
                "sign-flip interval (decides)": _signflip(r),
                "gap recovered [95 % CI]": _gap(gap) if g else NA,
                "gap reading": g.get("verdict", NA) if g else NA,
                "leave one seed out": loo_word(r),
                **step,
                "peak memory (× exact)": ratio_text(
                    (r or {}).get("peak_ratio_step") if timed else cost.get("peak_ratio_vs_exact")
                ),
            })  # fmt: skip
    frame = pd.DataFrame(rows)
    if longctx_file is None and rows:  # the t interval comes from longctx.json alone
        frame = frame.drop(columns=DELTA_COLUMN)
    return frame


def _step_source_words(points: list[Mapping[str, Any]]) -> str:
    """How the caption's step ratios were measured: the timing file, or training runs."""
    if points and all(p.get("step_source") == STEP_SOURCE_TIMING for p in points):
        return (
            "CPU time of one training step, every arm in one process on one thread, arms "
            "interleaved each repeat (steptime.json); the mean of the per-repeat ratios. "
        )
    return (
        "medians recorded on a shared machine; a run resumed from an earlier session keeps "
        "the time it was recorded with, so ratios across sessions carry the machine's load. "
    )


def answer_caption(points: list[Mapping[str, Any]]) -> tuple[str, str]:
    """(caption, alt text) of the answer figure, every point's numbers in it."""
    margin = points[0].get("margin_gap") if points else None
    parts = [
        f"{p['context']:,} tokens {esc(p['arm'])}: {_gap(p)}, "
        f"step {ratio_text(p.get('step_ratio'))}, "
        f"peak memory {ratio_text(p.get('peak_ratio'))}, {p.get('verdict', NA)}"
        for p in points
    ]
    caption = (
        "**Does RPKA pay at long range?** Gap recovered, (mean control - arm) / (mean "
        "control - exact) per evaluation seed (1 = exact, 0 = no attention; mean and 95 % t "
        "interval), against the training step's time ratio to exact's (log scale; left of "
        "x = 1: cheaper than exact), one point per gated length and rank, coloured by length; "
        f"above the line g = {num(margin, '.2f')}: non-inferior; hollow stars: the wiring "
        "check (the positive control: full rank, exact attention by construction); grey "
        f"band: a step within {STEP_TIE:.0%} of exact's, read as exact's cost (timing "
        "noise), not a saving. The second panel, where "
        "measured, puts the peak memory of a training step on the x axis. Step times are "
        + _step_source_words(points)
        + ("; ".join(parts) if parts else "No length passed its two-control gate.")
        + "."
    )
    return caption, "Gap recovered against step-time ratio per length and rank. " + (
        "; ".join(parts) or "No points."
    )


# --------------------------------------------------------------------------- section


SUPERSEDED_NOTE = (
    "**Superseded.** This section is the older 8-seed long-range study, kept as a record: its "
    "verdicts, figure and table are not the study's answer. The answer is the pre-registered "
    "16-seed study that follows (`docs/longrange_protocol.md`); a decision study "
    "(`docs/longrange_protocol_v2.md`) is running."
)


def longrange_section(
    study: Mapping[str, Any],
    frontier: Mapping[str, Any] | None,
    longctx_file: Mapping[str, Any] | None,
    locality: Mapping[str, Any] | None,
    figs: Any,
    figures_dir: str | os.PathLike | None,
) -> list[Any]:
    """The long-range part of the long-context section, for ``display``: set-up, gates and
    learnability per length, the answer and its figure (through ``figs.show``), verdicts
    with speed and memory per rank (the older, local study follows it:
    ``rpka.report.sections.longctx_text``)."""
    index = study.get("longrange")
    items: list[Any] = [Markdown(setup_text(index, longctx_file, locality))]
    if _contexts(index) and study.get("longrange_power"):  # read by the 16-seed study
        items.insert(0, Markdown(SUPERSEDED_NOTE))
    if not _contexts(index):
        return items
    items.append(Markdown(gates_table(index).to_markdown(index=False)))
    points = answer_points(frontier, longctx_file)
    items.append(Markdown(answer_text(index, points)))
    if robust := robust_answer_text(frontier):
        items.append(Markdown(robust))
    if points:
        margin = points[0].get("margin_gap") or MARGIN_GAP
        fig = plot_longrange_answer(points, margin, figures_dir)
        items.append(figs.show(fig, *answer_caption(points), name="longrange_answer"))
    items.append(Markdown(verdicts_table(index, frontier, longctx_file).to_markdown(index=False)))
    return items
