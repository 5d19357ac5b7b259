"""Two small sections of the report: memory beside speed (RPKA's forward peak against
exact attention's per length, from the CPU scaling file) and the older long-context study
(forecast-regimes, a local task; its set-up, gate and verdict per length, from the study
index's ``longctx``). The long-range study (issue 27) is :mod:`rpka.report.longrange`.

Both read their files defensively: the long-context study's structure is changing (a
local gate beside the attention gate), so a key a file lacks reads "n/a" and a key it adds
(``local_gate``) is shown when present. Every number comes from the files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pandas as pd
from IPython.display import Markdown

from rpka.report.figures_scaling import plot_longctx
from rpka.report.tables import verdict_word
from rpka.report.text import esc, num

NA = "n/a"
OLDER_STUDY = "regimes, local task"  # the older long-context study's label (issue 27)
MEMORY_RANK = 64  # the rank the speed targets are stated at (rpka.report.text.SPEED_RANK)


# --------------------------------------------------------------------------- memory


def memory_rows(scaling: Mapping[str, Any], rank: int = MEMORY_RANK) -> list[dict[str, Any]]:
    """Per length: exact's and RPKA's (at ``rank``) forward peak (MiB), their ratio, and
    the forward-and-backward ratio where measured; lengths with both rows measured."""
    rows = [r for r in scaling.get("rows", []) if r.get("memory_status", "ok") == "ok"]
    exact = {r["n"]: r for r in rows if r.get("method") == "exact" and r.get("peak_mib")}
    rpka = {
        r["n"]: r
        for r in rows
        if r.get("method") == "rpka" and r.get("rank") == rank and r.get("peak_mib")
    }
    out = []
    for n in sorted(set(exact) & set(rpka)):
        e, r = exact[n], rpka[n]
        both = r.get("fwd_bwd_peak_mib") and e.get("fwd_bwd_peak_mib")
        out.append({
            "n": n, "exact_mib": e["peak_mib"], "rpka_mib": r["peak_mib"],
            "ratio": r["peak_mib"] / e["peak_mib"],
            "fwd_bwd_ratio": r["fwd_bwd_peak_mib"] / e["fwd_bwd_peak_mib"] if both else None,
        })  # fmt: skip
    return out


def memory_table(scaling: Mapping[str, Any], rank: int = MEMORY_RANK) -> pd.DataFrame:
    """:func:`memory_rows` as the report's table."""
    return pd.DataFrame(
        [
            {
                "n": f"{r['n']:,}",
                "exact forward peak (MiB)": f"{r['exact_mib']:.3g}",
                f"RPKA r={rank} forward peak (MiB)": f"{r['rpka_mib']:.3g}",
                "RPKA ÷ exact, forward": f"{r['ratio']:.2f}×",
                "RPKA ÷ exact, forward + backward": NA
                if r["fwd_bwd_ratio"] is None
                else f"{r['fwd_bwd_ratio']:.2f}×",
            }
            for r in memory_rows(scaling, rank)
        ]
    )


def memory_text(scaling: Mapping[str, Any] | None, rank: int = MEMORY_RANK) -> str:
    """One sentence: the range of RPKA's forward peak over exact's across the lengths."""
    rows = memory_rows(scaling or {}, rank)
    if not rows:
        return "**Memory.** Not measured in this study's CPU scaling file."
    ratios = [r["ratio"] for r in rows]
    if min(ratios) > 1:
        reading = "it needs more memory than exact attention at every length, not less"
    elif max(ratios) < 1:
        reading = "it needs less memory than exact attention at every length"
    else:
        reading = "more at some lengths, less at others"
    text = (
        f"**Memory.** RPKA r={rank}'s forward peak is {min(ratios):.2f}–{max(ratios):.2f}× "
        f"exact attention's over n = {rows[0]['n']:,} to {rows[-1]['n']:,}: {reading}."
    )
    definition = (scaling or {}).get("memory_definition")
    return text + (f" Measured as the {esc(definition)}." if definition else "")


# --------------------------------------------------------------------------- long context


def _gate_word(gate: Mapping[str, Any] | None) -> str:
    if not gate:
        return NA
    word = "passed" if gate.get("passed") else "failed"
    p = gate.get("p_value")
    return f"{word} (p = {num(p, '.3g')})" if p is not None else word


def _rows_by_context(longctx_file: Mapping[str, Any] | None) -> dict[tuple[int, str], dict]:
    return {
        (int(r["context"]), r.get("arm")): r
        for r in (longctx_file or {}).get("rows", [])
        if r.get("context") is not None
    }


def longctx_table(
    index: Mapping[str, Any] | None, longctx_file: Mapping[str, Any] | None = None
) -> pd.DataFrame:
    """One row per context of the study index's ``longctx``: attention gate, local gate
    (where the file has one), primary arm, its delta against exact [95 % CI] and verdict,
    and from ``longctx.json`` its training step and peak memory against exact's."""
    contexts = (index or {}).get("contexts") or {}
    measured = _rows_by_context(longctx_file)
    local = any(e.get("local_gate") for e in contexts.values())  # null: no local control
    rows = []
    for context, entry in sorted(contexts.items(), key=lambda kv: int(kv[0])):
        primary, c = entry.get("primary_arm", NA), entry.get("primary") or {}
        cost = measured.get((int(context), primary), {})
        row = {"study": OLDER_STUDY, "context (tokens)": f"{int(context):,}",
               "attention gate": _gate_word(entry.get("attention_gate"))}  # fmt: skip
        if local:
            row["local gate"] = _gate_word(entry.get("local_gate"))
        delta = (
            f"{num(c.get('delta_mean'))} [{num(c.get('ci_low'))}, {num(c.get('ci_high'))}]"
            if c.get("delta_mean") is not None
            else NA
        )
        step, peak = cost.get("step_ratio_vs_exact"), cost.get("peak_ratio_vs_exact")
        row |= {
            "primary arm": f"`{primary}`",
            f"delta vs exact, test {entry.get('metric', 'metric')} [95 % CI]": delta,
            "verdict": verdict_word(c.get("verdict", NA)),
            "train step (× exact)": NA if step is None else f"{step:.2f}×",
            "peak memory (× exact)": NA if peak is None else f"{peak:.2f}×",
        }
        rows.append(row)
    return pd.DataFrame(rows)


def longctx_text(
    index: Mapping[str, Any] | None, longctx_file: Mapping[str, Any] | None = None
) -> str:
    """The section's set-up in words (Markdown): what was trained, at which lengths."""
    contexts = sorted(int(c) for c in ((index or {}).get("contexts") or {}))
    if not contexts:
        return "This study has no long-context results (no `longctx` in `study.json`)."
    entries = index["contexts"]
    presets = sorted({str(e.get("preset", NA)) for e in entries.values()})
    primaries = sorted({str(e.get("primary_arm", NA)) for e in entries.values()})
    named = [f"{c:,}" for c in contexts]
    lengths = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return (
        f"**The older long-context study ({OLDER_STUDY}).** It trains a forecasting model at "
        f"contexts of {lengths} tokens (preset {', '.join(f'`{p}`' for p in presets)}), the "
        f"primary arm {', '.join(f'`{p}`' for p in primaries)} against exact attention with "
        "the same rule as the tracks (Section 2): the attention gate first, then the primary "
        f"comparison; {_step_words(longctx_file)}. Its task "
        "(`forecast-regimes`) repeats each regime within a window's last segments, so the "
        "evidence can lie near the end (the long-range task's locality is measured, this "
        "one's is not), and its "
        "gate compared exact only with the no-attention control, never with a local window "
        "- so it does not show that the whole context is needed (the long-range study above "
        "adds that control). Its rows, from `study.json`'s `longctx` (costs from "
        "`longctx.json`), are "
        "kept as measured."
    )


def _step_source(longctx_file: Mapping[str, Any] | None) -> str | None:
    """The timing file every row's training step comes from (None: the runs' wall times,
    ``rpka.report.readme.timed_longctx``)."""
    rows = (longctx_file or {}).get("rows", [])
    return rows[0]["step_source"] if rows and all(r.get("step_source") for r in rows) else None


def _step_words(longctx_file: Mapping[str, Any] | None) -> str:
    """Where the study's training-step ratios come from, in words."""
    if source := _step_source(longctx_file):
        return (f"its training steps are timed on one thread, CPU time, arms interleaved "
                f"({source}), the peak memory in the same runs")  # fmt: skip
    return "training step and peak memory are measured in the same runs"


def longctx_caption(longctx_file: Mapping[str, Any]) -> tuple[str, str]:
    """(caption, alt) of the long-context training figure."""
    primary = ((longctx_file.get("config") or {}).get("bench") or {}).get("primary_arm", NA)
    contexts = ", ".join(f"{int(c):,}" for c in longctx_file.get("contexts", []))
    source = _step_source(longctx_file)
    step = f"one-thread CPU time, {source}" if source else "the runs' wall times"
    caption = (
        f"**Training at long context ({OLDER_STUDY}), at {contexts} tokens.** Per context "
        f"and arm: the median training step ({step}) and the peak memory of a step (both "
        "log scale), "
        "the test MSE (mean ± sd over the evaluation seeds) and its paired difference from "
        f"exact's (mean, 95 % t interval); the primary arm `{primary}` marked in the "
        "legend. The verdicts are the table's (the tracks' rule)."
    )
    alt = (
        f"Four panels of bars and points per arm at {contexts} tokens: training step, peak "
        f"memory, test MSE and its difference from exact; primary arm {primary}."
    )
    return caption, alt


def longctx_section(
    index: Mapping[str, Any] | None,
    longctx_file: Mapping[str, Any] | None,
    figs: Any,
    figures_dir: str | os.PathLike | None,
) -> list[Any]:
    """The older long-context study's items for ``display``: its set-up in words, the
    table per length and, with ``longctx.json``, its training figure (through
    ``figs.show``, :class:`rpka.report.Figures`)."""
    items: list[Any] = [Markdown(longctx_text(index, longctx_file))]
    if index:
        items.append(Markdown(longctx_table(index, longctx_file).to_markdown(index=False)))
    if index and longctx_file and longctx_file.get("rows"):
        fig = plot_longctx(longctx_file, figures_dir, "report_longctx_training")  # 05 draws its own
        items.append(figs.show(fig, *longctx_caption(longctx_file)))
    return items
