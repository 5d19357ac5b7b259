"""The report's frontier section: at which rank each track's RPKA stops losing, at what cost.

Text, table and figure from ``frontier.json`` (:func:`rpka.verdict.frontier.write_frontier`); the
rule is docs/statistics.md, section 8. Every number comes from the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import Markdown

from rpka.io import read_json
from rpka.report.figures_frontier import (
    plot_frontier,
    plot_performance_profiles,
    plot_spectrum,
)
from rpka.report.figures_recall import plot_mqar
from rpka.report.text import esc
from rpka.tracks import get_task
from rpka.verdict.aggregate import study_aggregate
from rpka.verdict.decision import MARGIN_GAP, NON_INFERIOR, UNDEFINED
from rpka.verdict.frontier import STEP_SOURCE_WALL, unread_pairs
from rpka.verdict.stats import ALPHA

RULE = (
    "Gap recovered g = (control - arm) / (control - exact) per evaluation seed: 1 is exact "
    "attention, 0 the no-attention control. An arm is *non-inferior* when the one-sided "
    "t-test of mean g > {margin} rejects at {alpha:g}; r\\* is the smallest such RPKA rank. The "
    "*wiring check* (the positive control) is the arm whose rank is exact by construction; "
    "it must read non-inferior, or the pipeline is wrong."
)


def _gap(row: Mapping[str, Any]) -> str:
    g = row["gap_recovered"]
    if g["mean"] is None:
        return UNDEFINED
    return f"{g['mean']:.3f} [{g['ci_low']:.3f}, {g['ci_high']:.3f}]"


def frontier_table(frontier: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (track, arm): rank, rank / n, gap recovered [95 % CI], verdict, step."""
    rows = []
    for track, entry in frontier["tracks"].items():
        positive = (entry.get("positive_control") or {}).get("arm")
        for r in entry["rows"]:
            rows.append({
                "track": track,
                "arm": f"`{r['arm']}`" + (" (wiring check)" if r["arm"] == positive else ""),
                "rank / points": f"{r['rank']} / {r['n_points']} ({r['rank_over_n']:.3f})",
                "gap recovered [95 % CI]": _gap(r),
                "p (g > margin)": "n/a" if r["p_non_inferior"] is None
                else f"{r['p_non_inferior']:.3g}",
                "verdict": r["verdict"],
                "train step (x exact)": "n/a" if r.get("step_ratio") is None
                else f"{r['step_ratio']:.2f}",
            })  # fmt: skip
    return pd.DataFrame(rows)


def pivoting_table(frontier: Mapping[str, Any]) -> pd.DataFrame:
    """Does residual pivoting earn its cost? RPKA against uniform landmarks and the keys
    coreset at each rank both trained: paired delta [95 % t CI], sign-flip p, and the
    probability that an RPKA run beats the other's [95 % bootstrap CI]."""
    rows = [
        {
            "track": track,
            "rank": p["rank"],
            "RPKA vs": f"`{p['versus']}`",
            "delta (RPKA - other) [95 % CI]": f"{p['delta']:+.4g} [{p['ci_low']:+.4g}, "
            f"{p['ci_high']:+.4g}]",
            "sign-flip p": f"{p['p_value']:.3g}",
            "P(RPKA better) [95 % CI]": f"{p['prob_improvement']:.2f} [{p['prob_ci_low']:.2f}, "
            f"{p['prob_ci_high']:.2f}]",
        }
        for track, entry in frontier["tracks"].items()
        for p in entry.get("pivoting", [])
    ]
    return pd.DataFrame(rows)


def _interval(row: Mapping[str, Any]) -> str:
    return f"{row['estimate']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def load_aggregate(results_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The aggregate statistics of a study's gated tracks
    (:func:`rpka.verdict.aggregate.study_aggregate`),
    or None without a study index or a gated track."""
    return study_aggregate(results_dir)


def aggregate_table(aggregate: Mapping[str, Any]) -> pd.DataFrame:
    """One row per aggregate (:mod:`rpka.verdict.aggregate`): the comparison, the tracks with their
    seeds, the estimate [95 % stratified-bootstrap CI]."""
    rows = [*aggregate["exact_vs_rpka"], *aggregate["rpka_vs_peers"], aggregate["primary_gap_iqm"]]
    return pd.DataFrame([
        {
            "aggregate": esc(r["comparison"]),
            "tracks (seeds)": ", ".join(
                f"{esc(t)} ({n})" for t, n in zip(r["tracks"], r["n_runs"], strict=True)
            ),
            "estimate [95 % CI]": _interval(r),
        }
        for r in rows
    ])  # fmt: skip


def aggregate_caption(aggregate: Mapping[str, Any]) -> str:
    """What the aggregate table is and is not (Markdown)."""
    first = aggregate["primary_gap_iqm"]
    return (
        "**An aggregate view across the gated tracks; the per-track rule above decides.** "
        'Rows "exact vs ...": the probability that an exact-attention run beats a run of '
        "the RPKA arm on the same track (0.5 = no difference), averaged over the tracks it "
        'ran on; "RPKA vs ...": the probability that RPKA beats the peer at the same '
        "rank; both on each track's own metric, ties counted half. Last row: the "
        "interquartile mean of the primary RPKA arm's gap recovered over every seed of "
        "every track (1 = exact, 0 = the no-attention control). Intervals: stratified "
        f"bootstrap (seeds resampled within each track, {first['n_resamples']} resamples, "
        f"seed {first['seed']}), 95 % percentile. The estimators are rliable's (Agarwal et "
        "al. 2021), computed with numpy and scipy: the `rliable` package needs `arch` "
        "below 8, which does not import under this project's pandas."
    )


def cost_clause(cost: Mapping[str, Any] | None) -> str:
    """RPKA at r* against exact at longer lengths (``r_star_cost``) as a clause: one
    non-causal attention call's forward and forward+backward speed-up and peak memory."""
    measured = {n: c for n, c in (cost or {}).get("lengths", {}).items()
                if c and None not in c.values()}  # fmt: skip
    if not measured:
        return ""
    lengths = " / ".join(f"{int(n):,}" for n in measured)

    def each(key: str) -> str:
        return " / ".join(f"{c[key]:.1f}x" for c in measured.values())

    missing = [f"{int(n):,}" for n, c in cost["lengths"].items() if n not in measured]
    return (
        f"; at {lengths} tokens one non-causal attention call at r\\* is {each('forward_speedup')}"
        f" faster forward, {each('fwd_bwd_speedup')} forward+backward, at "
        f"{each('memory_ratio')} exact's peak memory"
        + (f" (not measured at {', '.join(missing)} tokens)" if missing else "")
    )


PROFILE_READ_AT = (0.5, MARGIN_GAP)  # the thresholds the caption reads the first curve at


def _profile_at(profiles: Mapping[str, Any], curve: Mapping[str, Any], tau: float) -> str:
    """A curve's value and band at the grid's threshold nearest ``tau``."""
    i = int(np.argmin(np.abs(np.asarray(profiles["taus"]) - tau)))
    return (f"above τ = {profiles['taus'][i]:g}, {curve['profile'][i]:.2f} "
            f"[{curve['ci_low'][i]:.2f}, {curve['ci_high'][i]:.2f}]")  # fmt: skip


def profile_caption(profiles: Mapping[str, Any]) -> tuple[str, str]:
    """(caption, alt) of the performance-profile figure: the rule, what is pooled, the
    bootstrap, and the first curve read at ``PROFILE_READ_AT``."""
    first = profiles["panels"][0]["curves"][0]
    pooled = ", ".join(f"{esc(t)} `{a}` ({n} seeds)"
                       for t, a, n in zip(first["tracks"], first["arms"], first["n_runs"],
                                          strict=True))  # fmt: skip
    read = "; ".join(_profile_at(profiles, first, tau) for tau in PROFILE_READ_AT)
    panels = profiles["panels"][1:]  # RPKA against each peer
    peers = [p["title"] for p in panels]
    caption = (
        "**Performance profiles of the gap recovered (an aggregate view; the per-track rule "
        "decides).** For each threshold τ (every "
        f"{profiles['step']:g}), the fraction of runs whose gap recovered g = (control - arm) "
        "/ (control - exact) exceeds τ, each track weighted equally (the fraction within a "
        "track, averaged over the tracks: rliable's score distribution, Agarwal et al. "
        f"2021). First panel: each track's primary RPKA arm, pooled over the gated tracks "
        f"{pooled}"
        + (f"; then RPKA and each peer at the same rank on the tracks both trained "
           f"({'; '.join(esc(p) for p in peers)}), the same seeds drawn for both" if peers
           else "")
        + ". Shaded: the 95 % stratified-bootstrap percentile band at each τ (seeds "
        f"resampled within each track, {profiles['n_resamples']} resamples, seed "
        f"{profiles['seed']}). Exact attention is g = 1 on every run by definition (dashed "
        "step at τ = 1), the no-attention control g = 0 (dotted); a curve further right "
        f"recovers more of the gap. Share of the primary arm's runs {read}."
    )  # fmt: skip
    alt = (
        "Step curves of the fraction of runs with gap recovered above a threshold against "
        f"the threshold: RPKA's primary arm over {len(first['tracks'])} tracks"
        + (f", and RPKA against {', '.join(p['curves'][1]['family'] for p in panels)}"
           if panels else "")
        + f"; share of the primary arm's runs {read}."
    )  # fmt: skip
    return caption, alt


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
            + cost_clause(entry.get("r_star_cost"))
        )
    positive = entry.get("positive_control")
    if positive is None:
        text += "; no wiring check (positive control) was trained on this track."
    else:
        row = rows[positive["arm"]]
        text += (
            f"; wiring check `{positive['arm']}` (positive control, exact by construction): "
            f"{positive['verdict']}, g {_gap(row)}."
        )
        if positive["verdict"] != NON_INFERIOR:
            text += " **The wiring check does not tie: this track's frontier is not read.**"
    return text


def step_sources(frontier: Mapping[str, Any]) -> str:
    """Where the frontier's step ratios were measured, in words: the timing files (one
    thread, CPU time, arms interleaved) and, for a panel without one, training wall times."""
    rows = [row for track in frontier["tracks"].values() for row in track.get("rows", [])]
    sources = {row.get("step_source") or STEP_SOURCE_WALL for row in rows}
    timed = sorted(s for s in sources if s.endswith(".json"))
    words = f"one-thread CPU time from {', '.join(timed)}" if timed else ""
    if STEP_SOURCE_WALL in sources:
        wall = f"{STEP_SOURCE_WALL}s (a record, not a cost) where a panel has no timing file"
        words = f"{words}; {wall}" if words else wall
    return words


def frontier_caption(frontier: Mapping[str, Any]) -> tuple[str, str]:
    tracks = ", ".join(frontier["tracks"])
    caption = (
        "Rank frontier per track: mean gap recovered with its 95 % t interval against rank "
        "over the points pivoted (log axis); shaded: the non-inferior zone; each point "
        "labelled with its rank and its training step's ratio to exact attention's (same "
        f"track, same length; {step_sources(frontier)}). "
        + RULE.format(alpha=ALPHA, margin=next(iter(frontier["tracks"].values()))["margin_gap"])
    )  # fmt: skip
    alt = f"Gap recovered against relative rank for the tracks {tracks}, with r* marked."
    return caption, alt


def load_spectra(
    frontier: Mapping[str, Any] | None, results_dir: str | os.PathLike
) -> dict[str, dict[str, Any]]:
    """The ``spectrum.json`` of each frontier track that has one (:mod:`rpka.kernel.spectrum`);
    a track that is not a registered one (``longrange-<n>``) has none."""
    spectra = {}
    for track in (frontier or {}).get("tracks", {}):
        try:
            out_dir = get_task(track).out_dir
        except (KeyError, ValueError):  # a long-range length, not a registered track
            continue
        path = Path(results_dir) / out_dir / "spectrum.json"
        if path.exists():
            spectra[track] = read_json(path)
    return spectra


def spectrum_text(spectra: Mapping[str, Mapping[str, Any]]) -> str:
    """Per track: the kernel's residual at the largest rank below N / 2 against the line
    1 - r/N and the attention matrix's own best rank-r error there (Markdown)."""
    parts = []
    for track, spectrum in spectra.items():
        heads = spectrum["heads"]
        ranks = heads[0]["ranks"]
        i = max((j for j, r in enumerate(ranks) if r <= heads[0]["n_points"] / 2), default=0)
        mean = {key: float(np.mean([h[key][i] for h in heads]))
                for key in ("residual_rpc", "residual_optimal", "no_structure",
                            "attention_error")}  # fmt: skip
        spread = [h["logit_std"] for h in heads]
        ratios = [h["qk_norm_ratio"] for h in heads if "qk_norm_ratio" in h]
        numerics = (
            f" Its {len(heads)} heads: logit std {min(spread):.1f}-{max(spread):.1f}, q/k norm "
            f"ratio {min(ratios):.2f}-{max(ratios):.2f} (full rank is exact at any ratio and "
            "sharpness, tested to logit std ~400: docs/numerics.md)."
            if ratios
            else ""
        )
        parts.append(
            f"**{esc(track)}** (exact's trained heads, r = {ranks[i]} of "
            f"{heads[0]['n_points']} points): kernel residual {mean['residual_rpc']:.3f} "
            f"with RPCholesky, {mean['residual_optimal']:.3f} at the optimum, "
            f"{mean['no_structure']:.3f} with no structure at all; the attention matrix's "
            f"best rank-{ranks[i]} error {mean['attention_error']:.3f}.{numerics}"
        )
    return " ".join(parts)


def spectrum_caption(spectra: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    caption = (
        "Why a high rank: on exact attention's trained heads, the normalised residual trace "
        "of the kernel RPKA approximates (the Gaussian kernel of the balanced joint points) "
        "after r pivots - RPCholesky, uniform landmarks and the best rank r (eigenvalues) - "
        "against the line 1 - r/N of a kernel with no low-rank structure, and the relative "
        "Frobenius error of the best rank-r approximation of the attention matrix itself "
        "(causally masked on causal tracks). Mean over the heads and the first test inputs."
    )
    alt = "Kernel residual and attention low-rank error against relative rank, per track: " + (
        ", ".join(spectra)
    )
    return caption, alt


def mqar_table(mqar: Mapping[str, Any]) -> pd.DataFrame:
    """MQAR at the training length: one row per arm, one column per pair count, each cell
    the test query accuracy [95 % t CI] and, for a ranked arm, its rank / pairs."""
    rows = [r for r in mqar["rows"] if r["length_factor"] == 1]
    pairs = sorted({r["pairs"] for r in rows})
    unread = unread_pairs(mqar)
    table = {}
    for r in sorted(rows, key=lambda r: (r["rank"] is None, r["rank"] or 0, r["arm"])):
        ratio = "" if r["rank"] is None else f" (r/p {r['rank_over_pairs']:.2g})"
        cell = f"{r['accuracy']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]{ratio}"
        column = _pairs_column(r["pairs"], unread)
        table.setdefault(r["arm"], {"arm": f"`{r['arm']}`"})[column] = cell
    return pd.DataFrame(list(table.values()),
                        columns=["arm", *(_pairs_column(p, unread) for p in pairs)])  # fmt: skip


def _pairs_column(pairs: int, unread: set[int]) -> str:
    return f"{pairs} pairs" + (" (exact did not learn: not read)" if pairs in unread else "")


def unread_clause(mqar: Mapping[str, Any]) -> str:
    """The pair counts left out of the MQAR figure: exact missed its learnability bar."""
    unread = sorted(unread_pairs(mqar))
    if not unread:
        return ""
    return (
        "; not drawn: "
        + ", ".join(f"{p} pairs" for p in unread)
        + ", where exact attention missed its learnability bar (nothing there is read)"
    )


def mqar_caption(mqar: Mapping[str, Any]) -> tuple[str, str]:
    epochs = sorted({(r["pairs"], r["epochs"]) for r in mqar["rows"]})
    seeds = sorted({r["n_seeds"] for r in mqar["rows"]})
    caption = (
        "MQAR as Zoology reports it: test query accuracy against rank / pairs at 64 tokens "
        "and at 2x and 4x that length, one line per RPKA rank across the pair counts; each "
        "point the mean over " + "/".join(map(str, seeds)) + " evaluation seeds with its "
        "95 % t interval. Training epochs per pair count (exact must learn each): "
        + ", ".join(f"{p} pairs {e}" for p, e in epochs)
        + unread_clause(mqar)
        + ". Dashed: exact attention's "
        "lowest and the no-attention control's highest accuracy over the pair counts. A rank "
        "trained at one pair count only has no line; the table below has every arm."
    )
    alt = "Recall accuracy against rank divided by pairs, one line per RPKA rank, per length."
    return caption, alt


def frontier_section(
    frontier: Mapping[str, Any] | None,
    figs: Any,
    figures_dir: str | os.PathLike | None,
    spectra: Mapping[str, Mapping[str, Any]] | None = None,
    aggregate: Mapping[str, Any] | None = None,
) -> list[Any]:
    """The section's items for ``display``: sentences, the figure (through ``figs.show``,
    :class:`rpka.report.Figures`), the table, with ``frontier["mqar"]`` the MQAR figure
    and table, the pivoting comparisons, with ``aggregate`` (:func:`load_aggregate`) the
    aggregate view across tracks, and with ``spectra`` (:func:`load_spectra`) why.
    Without a frontier file, one sentence."""
    if not frontier or not frontier.get("tracks"):
        return [Markdown("This study has no rank frontier (`frontier.json`).")]
    sentences = [track_sentence(t, e) for t, e in frontier["tracks"].items()]
    items: list[Any] = [Markdown("\n".join(f"- {s}" for s in sentences))]
    items.append(figs.show(plot_frontier(frontier, figures_dir), *frontier_caption(frontier)))
    items.append(Markdown(frontier_table(frontier).to_markdown(index=False)))
    if frontier.get("mqar"):
        items.append(figs.show(plot_mqar(frontier["mqar"], figures_dir),
                               *mqar_caption(frontier["mqar"])))  # fmt: skip
        items.append(Markdown("MQAR at the training length, test query accuracy [95 % CI] "
                              "per pair count:\n\n"
                              + mqar_table(frontier["mqar"]).to_markdown(index=False)))  # fmt: skip
    pivoting = pivoting_table(frontier)
    if len(pivoting):
        items.append(Markdown(
            "**Does residual pivoting earn its cost?** RPKA against uniform landmarks "
            "(`nystrom-uniform`) and the keys coreset at the ranks both trained, paired by "
            "seed (lower is better):\n\n" + pivoting.to_markdown(index=False)
        ))  # fmt: skip
    if aggregate:
        table = aggregate_table(aggregate).to_markdown(index=False)
        items.append(Markdown(aggregate_caption(aggregate) + "\n\n" + table))
        profiles = aggregate.get("performance_profiles")
        if profiles:
            fig = plot_performance_profiles(profiles, figures_dir)
            items.append(figs.show(fig, *profile_caption(profiles)))
    if spectra:
        items.append(Markdown(spectrum_text(spectra)))
        items.append(figs.show(plot_spectrum(spectra, figures_dir), *spectrum_caption(spectra)))
    else:
        items.append(Markdown("No kernel spectrum: the trained weights it reads are absent."))
    return items
