"""A track's section of the report: its set-up, gate, primary comparison with its
statistics, forest plot, learnability, notes, disclosures, ablations and error against
cost, from the track's bench report (``study.json``'s entry, ``rpka.report.page``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from IPython.display import Markdown

from rpka.report import figures_recall, narrative, tables
from rpka.report.figures import metric_label, plot_output_error_by_arm
from rpka.report.figures_cost import plot_error_vs_time
from rpka.report.figures_headline import plot_forest
from rpka.report.narrative import mde_text
from rpka.report.page import Figures
from rpka.report.tables import verdict_word
from rpka.report.text import ci_text, esc, gate_text, num
from rpka.report.text_track import cost_caption, disclosures, forest_caption


def track_headline(track: Mapping[str, Any]) -> str:
    """The primary comparison with its statistics (Markdown)."""
    report, c = track["report"], track["comparison"]
    base, idea = report["arms"][report["baseline_arm"]], report["arms"][track["primary_arm"]]
    tost = c.get("tost_p")
    tost_text = (
        f"; TOST at ±{num(c.get('margin'), '.3g')}: p = {num(tost, '.3g')}"
        if c.get("margin")
        else "; no equivalence margin"
    )
    robust = (
        f" Median delta {num(c['delta_median'])}; largest single-seed delta "
        f"{num(c.get('largest_seed_delta'))}."
        if "delta_median" in c
        else ""
    )
    verdict = f"**Verdict: {verdict_word(c['verdict'])}.**"
    if verdict_word(c["verdict"]) == "equivalent" and c.get("mde") is None:
        verdict = (  # e.g. 2 pairs: TOST's t interval fits the margin, the rule cannot reject
            "**Verdict: equivalent** by TOST's interval alone; the sign-flip rule has no "
            f"power with {c['n_pairs']} pairs, so this is not a finding."
        )
    return (
        f"**`{track['primary_arm']}` against `{report['baseline_arm']}`:** test "
        f"{metric_label(report)} {num(idea['full']['mean'], '.4g')} ± "
        f"{num(idea['full']['std'], '.2g')} against {num(base['full']['mean'], '.4g')} ± "
        f"{num(base['full']['std'], '.2g')} (mean ± sd over {c['n_pairs']} seeds). Paired "
        f"delta {ci_text(c)} (95 % CI); the primary arm wins {c.get('idea_wins', '?')}/"
        f"{c['n_pairs']} seeds; sign-flip p = {num(c['p_value'], '.3g')}, adjustment "
        f"{esc(c.get('adjustment', 'Holm'))}{tost_text}; MDE of the rule {mde_text(c)}."
        f"{robust} {verdict}"
    )


def track_section(
    track: Mapping[str, Any],
    figs: Figures,
    figures_dir: str | None = None,
    latency_ms: Mapping[str, float] | None = None,
    latency_length: int | None = None,
) -> list[Any]:
    """Everything the report shows for one track, in order (Markdown, tables, figures):
    set-up, gate, primary comparison, forest plot, learnability and the track's notes,
    disclosures, ablations and error against cost where the bench ran them."""
    report, name = track["report"], track["name"]
    out: list[Any] = [
        Markdown(f"### {track['title']}"),
        Markdown(narrative.setup(report)),
        Markdown(f"**Attention gate.** {gate_text(track)}"),
        Markdown(track_headline(track)),
        figs.show(plot_forest(report, figures_dir, f"{name}_forest"), *forest_caption(track)),
        Markdown(narrative.learnability(report)),
    ]
    if figures_recall.applies(report):  # accuracy against rank / pairs: the low-rank test
        fig = figures_recall.plot_recall_accuracy_vs_rank(report, figures_dir, f"{name}_vs_rank")
        out.append(
            figs.show(
                fig,
                f"**{track['title']}: query accuracy against rank / pairs**, at the training "
                "length and at 2x and 4x it; exact attention and the control as horizontal "
                "references (mean over evaluation seeds, 95 % CI).",
                f"Line plot of query accuracy against RPKA rank divided by the number of "
                f"key-value pairs, one panel per sequence length, {track['title']}.",
            )
        )
    notes = narrative.track_notes(report)
    if notes:
        out.append(Markdown(notes))
    out.append(tables.styled(tables.results_table(report)))
    if track.get("superseded"):
        out.append(Markdown(narrative.superseded(report, track["superseded"])))
    told = disclosures(report)
    if told:
        out.append(Markdown("**What to know about these numbers.**\n\n" + told))
    if report.get("ablation_choice"):
        out.append(Markdown(narrative.ablation_choice(report)))
    if report.get("output_error"):
        fig = plot_output_error_by_arm(report, save_dir=figures_dir, name=f"{name}_output_error")
        out.append(
            figs.show(
                fig,
                f"**{track['title']}: how far each arm's attention output is from exact's**, "
                "relative error on trained queries and keys against rank, log-log (lower is "
                "closer): top row on each arm's own trained Q/K, bottom row on exact's; one "
                "column per arm group (at most six arms a panel); lines the mean over layers, "
                "windows, heads and draws, bands the 10-90 % quantiles, the filled marker at "
                f"the arm's own rank; the primary arm `{track['primary_arm']}` marked in its "
                "legend.",
                f"Line plots of relative output error against rank (log-log) per arm, in "
                f"panels by arm group, {track['title']}; primary arm {track['primary_arm']}.",
            )
        )
    fig = plot_error_vs_time(
        report, latency_ms, latency_length, save_dir=figures_dir, name=f"{name}_error_vs_time"
    )
    out.append(figs.show(fig, *cost_caption(track)))
    return out
