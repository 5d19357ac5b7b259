"""The report's section "What sets the rank" (issue 41): the rank-law grid's cells and their
drop-in r*, the fitted law, the held-out prediction and where residual pivoting pays, read
from ``rank_law.json`` (``python -m rpka rank-law index``; docs/rank_law.md). Without the
file, one line says the study was not run. Every number comes from the file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown

from rpka.attention import method_label
from rpka.report.palette import method_colour
from rpka.study.rank_law.dropin import METHODS as RANK_LAW_METHODS
from rpka.verdict.decision import MARGIN_GAP

# the rank law's methods (its drop-in's) by their labels in the registry
METHODS = {m: method_label(m) for m in RANK_LAW_METHODS}
TERMS = {"p": "pairs p", "n": "length n", "d_head": "head dimension d", "patterns": "patterns"}
CAP_NOTE = "> {cap}"  # a ladder that never reached the margin (censored r*)
PIVOT_CI = ("prob_ci_low", "prob_ci_high")
BACKGROUND_MARKERS = {"noise": "o", "patterns": "s"}
# the gap-by-rank figure's comparison, RPKA against uniform landmarks, by line style: a
# choice of that figure (the rank law's question), not metadata of the methods
GAP_FIGURE_STYLES = {"rpka": "-", "nystrom-uniform": ":"}


def _r_star(value: int | None, learnable: bool, cap: int) -> str:
    if not learnable:
        return "not learnable"
    return CAP_NOTE.format(cap=cap) if value is None else str(value)


def cells_table(index: Mapping[str, Any], cap: int) -> pd.DataFrame:
    """One row per cell: its coordinates, r* per method, the effective ranks."""
    rows = []
    for cell in index["cells"]:
        learnable = bool(cell["learnable"])
        row = {"cell": cell["cell"], "p": cell["p"], "n": cell["n"], "d": cell["d_head"],
               "background": cell["background"]}  # fmt: skip
        for method, label in METHODS.items():
            row[f"r* {label}"] = _r_star(cell["r_star_dropin"][method], learnable, cap)
        for key, label in (("kernel", "kernel"), ("attention", "P")):
            value = cell["effective_rank"][key]
            row[f"effective rank ({label})"] = "-" if value is None else f"{value:.0f}"
        rows.append(row)
    return pd.DataFrame(rows)


def trained_table(index: Mapping[str, Any]) -> pd.DataFrame:
    """The trained confirmations (docs/rank_law.md): per cell and arm, the drop-in's
    every-seed rule and the mean rule, each with the seed that alone decides it (if any)."""
    rows = []
    for row in index.get("trained") or []:
        every, gap = row["every_seed"], row["gap"]
        mean = "-" if gap["mean"] is None else (
            f"{gap['mean']:.3f} [{gap['ci_low']:.3f}, {gap['ci_high']:.3f}]")  # fmt: skip
        rows.append({
            "cell": row["cell"], "trained at": row["trained_at"].removeprefix("trained-r"),
            "arm": f"`{row['arm']}`",
            "seeds read": f"{len(row['seeds'])}/"
                          f"{len(row['seeds']) + len(row.get('seeds_without_gap', []))}",
            f"every seed ≥ {MARGIN_GAP:g}": _decided("reached" if every["reached"] else "missed",
                                          every["rests_on_seeds"]),
            "mean g [95 % CI]": mean,
            "mean rule": _decided(gap["verdict"], row["rests_on_seeds"]),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _decided(verdict: str, rests_on: list[int]) -> str:
    """A verdict with its leave-one-seed-out reading: the seeds that alone decide it."""
    if not rests_on:
        return f"{verdict} (robust)"
    return f"{verdict} (rests on seed {', '.join(map(str, rests_on))})"


def _cells(count: int) -> str:
    return f"{count} cell" + ("" if count == 1 else "s")


def law_text(index: Mapping[str, Any]) -> str:
    """The fitted exponents per method with their 95 % intervals, or why there is no fit."""
    lines = []
    for method, label in METHODS.items():
        fit = index["fit"][method]
        if not fit["exponents"]:
            lines.append(f"- **{label}**: no fit ({_cells(len(fit['cells']))} with an r\\*, "
                         f"{len(fit['censored'])} censored; a fit needs 2).")  # fmt: skip
            continue
        parts = []
        for term, name in TERMS.items():
            value, ci = fit["exponents"][term], (fit["ci"] or {}).get(term)
            if value is not None:
                interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
                parts.append(f"{name} {value:+.2f}{interval}")
        r2 = fit["r_squared"]
        dof = "" if fit.get("dof", 1) > 0 else "; as many terms as cells, no check of the form"
        lines.append(
            f"- **{label}** (log2 r\\* on {', '.join(parts) or 'a constant'}; "
            f"{_cells(len(fit['cells']))}, {len(fit['censored'])} censored, "
            f"R² {'n/a' if r2 is None else format(r2, '.2f')}{dof})."
        )
    return "\n".join(lines)


def trained_text(index: Mapping[str, Any]) -> str:
    """The trained confirmations as a table, or what is missing."""
    table = trained_table(index)
    if table.empty:
        return ("**Trained confirmation**: not run yet (docs/rank_law.md registers the cells "
                "and the rule).")  # fmt: skip
    return ("**Trained confirmation** (RPKA and uniform landmarks trained at the cell's "
            "drop-in r\\* and half of it, 8 seeds with their own data; docs/rank_law.md):\n\n"
            + table.to_markdown(index=False))  # fmt: skip


def planted_text(planted: Mapping[str, Any] | None) -> str:
    """The planted positive control (``rpka rank-law planted``) in one paragraph: does RPKA
    reproduce exact attention below full rank, and did the negative control miss."""
    if not planted:
        return "**Planted positive control**: not run (`python -m rpka rank-law planted`)."
    rpka = [r for r in planted["rows"] if r["method"] == "rpka"]
    worst = {
        d: max(r["relative_error"] for r in rpka if r["dtype"] == d) for d in planted["tolerance"]
    }
    ranks = sorted({r["rank"] for r in rpka})
    return (
        f"**Planted positive control** (queries and keys from p distinct vectors among "
        f"{planted['tokens']} tokens, so the kernel has rank ≤ 2p; RPKA at rank 2p = "
        f"{', '.join(map(str, ranks))}, far below the full rank {planted['full_rank']}): "
        + ("**passed**" if planted["passed"] else "**failed**")
        + " - largest relative error against SDPA "
        + ", ".join(f"{worst[d]:.1e} in {d}" for d in worst)
        + f"; uniform landmarks at the same ranks missed (error > "
        f"{planted['negative_min_error']:g}) in {planted['negative_misses']} of "
        f"{planted['negative_readings']} readings, so the control could have failed."
    )


def held_out_text(held_out: Mapping[str, Any] | None) -> str:
    """The pre-registered prediction and its outcome."""
    if not held_out:
        return "The held-out prediction has not been made yet (docs/rank_law.md)."
    label = method_label(held_out["method"])
    head = (f"Held-out cell `{held_out['cell']}`: the grid's law predicted r\\* = "
            f"{held_out['predicted_r_star']:.0f} for {label} before the cell ran")  # fmt: skip
    if held_out["observed_r_star"] is None and held_out.get("censored_at"):
        word = "held" if held_out["held"] else "did not hold"
        return (f"{head}; observed: not reached up to rank {held_out['censored_at']}, so the "
                f"prediction **{word}** ({held_out['held_if']}).")  # fmt: skip
    if held_out["observed_r_star"] is None:
        return head + "; the cell has not been read yet (or did not learn)."
    word = "held" if held_out["held"] else "did not hold"
    return (f"{head}; observed {held_out['observed_r_star']}: the prediction **{word}** "
            f"({held_out['held_if']}).")  # fmt: skip


def summary_sentence(index: Mapping[str, Any]) -> str:
    """One sentence for the Summary and the README: RPKA's drop-in r* over the learnable
    cells, the fitted exponents, the held-out outcome, where pivoting paid."""
    learnable = [c for c in index["cells"] if c["learnable"]]
    reached = [c["r_star_dropin"]["rpka"] for c in learnable if c["r_star_dropin"]["rpka"]]
    if not learnable:
        return "The rank-law grid has no learnable cell read yet."
    fit = index["fit"]["rpka"]
    exponents = fit.get("exponents") or {}
    law = ", ".join(
        f"{TERMS[t]} {exponents[t]:+.2f}" for t in TERMS if exponents.get(t) is not None
    )
    low, high = (min(reached), max(reached)) if reached else (None, None)
    span = "not reached" if low is None else (str(low) if low == high else f"{low}-{high}")
    return (
        rf"Over {len(learnable)} learnable cells of the rank-law grid, RPKA's drop-in r\* "
        f"(every seed within {MARGIN_GAP:g} of the gap) is {span} "
        f"({len(learnable) - len(reached)} censored above the ladder); "
        rf"log2 r\* against log2 of each term: {law or 'no fit'}. {unread_axes(index)}"
        f"{held_out_text(index.get('held_out'))} {trained_sentence(index)}"
        f"{planted_sentence(index.get('planted'))}"
        f"{pivoting_sentence(pivoting_rows(index))}"
    )


def unread_axes(index: Mapping[str, Any]) -> str:
    """Which terms of the law no learnable cell varies, and the cells that failed the
    learnability bar there ("" where every term is read)."""
    learnable = [c for c in index["cells"] if c["learnable"]]
    unread = [t for t in ("p", "d_head") if len({c[t] for c in learnable}) < 2]
    if not unread:
        return ""
    failed = [c["cell"] for c in index["cells"] if not c["learnable"]]
    values = " and ".join(f"{TERMS[t]} = {learnable[0][t]}" for t in unread)
    return (
        f"The law's {' and '.join(TERMS[t] for t in unread)} term"
        f"{'s are' if len(unread) > 1 else ' is'} not read: every learnable cell has {values}"
        + (f" (the cells that vary {'them' if len(unread) > 1 else 'it'} failed the "
           f"learnability bar: {', '.join(f'`{c}`' for c in failed)})" if failed else "")
        + ". "
    )  # fmt: skip


def planted_sentence(planted: Mapping[str, Any] | None) -> str:
    """The planted positive control for the Summary ("" before it ran)."""
    if not planted:
        return ""
    word = "reproduces" if planted["passed"] else "does not reproduce"
    return (f"On planted inputs whose kernel has rank ≤ 2p, RPKA at rank 2p {word} exact "
            f"attention (uniform landmarks missed in {planted['negative_misses']} of "
            f"{planted['negative_readings']}). ")  # fmt: skip


def trained_sentence(index: Mapping[str, Any]) -> str:
    """The trained confirmations in one sentence: cells read, arms that reached the margin
    on every seed ("" before any)."""
    rows = index.get("trained") or []
    if not rows:
        return ""
    cells = sorted({r["cell"] for r in rows})
    reached = [f"`{r['arm']}` on `{r['cell']}`" for r in rows if r["every_seed"]["reached"]]
    robust = all(r["every_seed"].get("robust") for r in rows)
    outcome = (
        f"{len(reached)} of {len(rows)} trained arms reach the margin on every seed "
        f"({', '.join(reached)})"
        if reached
        else f"none of the {len(rows)} trained arms reaches the margin on every seed"
    )
    return (
        f"Trained at the drop-in rank and half of it ({_cells(len(cells))}, 8 seeds with "
        f"their own data): {outcome}"
        + ("; no reading rests on one seed. " if robust else "; some readings rest on one seed. ")
    )


def pivoting_rows(index: Mapping[str, Any]) -> pd.DataFrame:
    """P(RPKA better than uniform) per learnable cell and rank, with its interval."""
    rows = [
        {"cell": c["cell"], "p": c["p"], "background": c["background"], "rank": r["rank"],
         "P": r["prob_improvement"], "low": r[PIVOT_CI[0]], "high": r[PIVOT_CI[1]]}
        for c in index["cells"] if c["learnable"] for r in c["pivoting"]
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=["cell", "p", "background", "rank", "P", "low", "high"])


def pivoting_sentence(rows: pd.DataFrame) -> str:
    """Where pivoting pays: the (cell, rank) readings whose interval lies above 0.5 (RPKA
    better), below it (uniform better), and how many read no difference."""
    if rows.empty:
        return "No cell has been read for pivoting yet."
    wins = rows[rows["low"] > 0.5]
    losses = rows[rows["high"] < 0.5]

    def where(part: pd.DataFrame) -> str:
        cells = sorted(set(part["cell"]))
        return f" (cells {', '.join(f'`{c}`' for c in cells)})" if cells else ""

    verdict = (
        "pivoting pays nowhere in this grid"
        if wins.empty
        else f"pivoting pays in {len(wins)} of them{where(wins)}"
    )
    return (
        f"Residual pivoting against uniform landmarks, over {len(rows)} (cell, rank) "
        f"readings of the drop-in: {verdict}. RPKA better (the interval of P(RPKA better) "
        f"above 0.5) in {len(wins)}{where(wins)}, uniform better in {len(losses)}"
        f"{where(losses)}, no difference shown in the other "
        f"{len(rows) - len(wins) - len(losses)}."
    )


def plot_pivoting(rows: pd.DataFrame) -> plt.Figure:
    """P(RPKA better than uniform) against rank, one line per cell, one panel per
    background; 0.5 = no difference."""
    backgrounds = sorted(set(rows["background"])) or ["noise"]
    fig, axes = plt.subplots(1, len(backgrounds), figsize=(5 * len(backgrounds), 3.6),
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, background in zip(axes[0], backgrounds, strict=True):
        part = rows[rows["background"] == background]
        for cell, line in part.groupby("cell"):
            line = line.sort_values("rank")
            ax.plot(line["rank"], line["P"], marker="o", label=cell)
            ax.fill_between(line["rank"], line["low"], line["high"], alpha=0.12)
        ax.axhline(0.5, color="0.4", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rank (drop-in)")
        ax.set_title(f"background: {background}")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("P(RPKA better than uniform)")
    axes[0][0].set_ylim(0, 1)
    fig.tight_layout()
    return fig


def plot_gap_by_rank(index: Mapping[str, Any]) -> plt.Figure:
    """Mean gap recovered against rank ÷ pairs, RPKA and uniform, every learnable cell."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for cell in index["cells"]:
        if not cell["learnable"]:
            continue
        for method, style in GAP_FIGURE_STYLES.items():
            curve = sorted((int(r), g) for r, g in cell["gap_by_rank"][method].items())
            ax.plot([r / cell["p"] for r, _ in curve], [g for _, g in curve], ls=style,
                    color=method_colour(method), alpha=0.6,
                    marker=BACKGROUND_MARKERS.get(cell["background"], "."))  # fmt: skip
    ax.axhline(MARGIN_GAP, color="0.4", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.2, 1.05)
    ax.set_xlabel("rank ÷ pairs p")
    ax.set_ylabel("gap recovered (drop-in, mean of seeds)")
    for method, style in GAP_FIGURE_STYLES.items():
        ax.plot([], [], color=method_colour(method), ls=style, label=method_label(method))
    for background, marker in BACKGROUND_MARKERS.items():
        ax.plot([], [], color="0.4", ls="", marker=marker, label=f"background: {background}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def rank_law_section(
    index: Mapping[str, Any] | None, figs: Any, path: str | os.PathLike, cap: int = 256
) -> list[Any]:
    """The section's items (Markdown and figures), or one line when the file is missing."""
    if not index:
        return [Markdown(f"The rank-law study was not run for this study (`{path}` is not "
                         "there).")]  # fmt: skip
    rows = pivoting_rows(index)
    items: list[Any] = [
        *law_v2_items(index, figs),
        Markdown(cells_table(index, cap).to_markdown(index=False)),
        Markdown(
            "**The law**, r\\* ≈ c · p^a · n^b · d^e (OLS on log2, 95 % t intervals):\n\n"
            + law_text(index)
        ),  # fmt: skip
        Markdown(held_out_text(index.get("held_out"))),
        Markdown(trained_text(index)),
        Markdown(planted_text(index.get("planted"))),
        figs.show(
            plot_gap_by_rank(index),
            "Gap recovered by the drop-in against rank ÷ pairs, every learnable cell "
            f"(solid RPKA, dotted uniform landmarks); dashed: the margin {MARGIN_GAP:g}.",
            "Drop-in gap recovered against rank over pairs",
            name="rank_law_gap",
        ),  # fmt: skip
        Markdown(pivoting_sentence(rows)),
    ]
    if not rows.empty:
        caption = ("P(RPKA's test MSE below uniform landmarks') per cell and rank, with its "
                   "95 % bootstrap interval; 0.5: no difference.")  # fmt: skip
        items.append(figs.show(plot_pivoting(rows), caption, "Pivoting advantage against rank",
                               name="rank_law_pivoting"))  # fmt: skip
    return items


# ------------------------------------------------------------------ law v2 (issue 54)

HEAD_SIZE_COLOURS = {16: "tab:blue", 32: "tab:orange", 64: "tab:green"}
ROLE_MARKERS = {"fit": "o", "held_out": "x", "extra": "+"}
ROLE_LABELS = {"fit": "", "held_out": ", held out", "extra": ", other arms (deviation)"}


def plot_r_eps_against_rho(law: Mapping[str, Any], method: str = "rpka") -> plt.Figure:
    """r_eps (rung reached) against rho_bound per trained head, by head size, held-out tracks
    marked; the theory's sqrt(d) e^rho / eps at d = 16; the longest head's full rank."""
    points = [p for p in law["points"] if p["method"] == method]
    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    for (d, role), colour in ((k, HEAD_SIZE_COLOURS.get(k[0], "0.4")) for k in
                              sorted({(p["d_head"], p["role"]) for p in points})):  # fmt: skip
        own = [p for p in points if p["d_head"] == d and p["role"] == role]
        ax.scatter([p["rho_bound"] for p in own], [p["observed"] for p in own], s=14,
                   color=colour, marker=ROLE_MARKERS.get(role, "."), alpha=0.7,
                   label=f"d = {d}{ROLE_LABELS.get(role, '')}")  # fmt: skip
    if points:
        eps = points[0]["eps"]
        top = max(p["full_rank"] for p in points)
        rhos = [p["rho_bound"] for p in points if p["rho_bound"] > 0]  # a log axis: rho > 0
        rho = np.geomspace(min(rhos), max(rhos), 100)
        ax.plot(rho, 4 * np.exp(rho) / eps, color="0.3", ls="--", lw=0.9,
                label=f"theory: √d e^ρ / ε (d 16, ε {eps:g})")  # fmt: skip
        ax.axhline(top, color="0.6", lw=0.8, ls=":", label=f"full rank {top}")
        ax.set_ylim(1, top * 4)
    ax.set_xscale("log", base=2)  # rho spans 1 to ~400: sharp heads would squeeze the rest
    ax.set_yscale("log", base=2)
    ax.set(xlabel="ρ = max‖q‖ · max‖k − k̄‖ / √d (log)", ylabel=f"r_ε of {method_label(method)}")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # off the points
    fig.tight_layout()
    return fig


def _fit_line(method: str, fit: Mapping[str, Any], held: Mapping[str, Any]) -> str:
    """One method's fit (coefficients, clustered bootstrap intervals) and held-out reading."""
    names = ["intercept", *fit["terms"]]
    terms = ", ".join(
        f"{name} {coef:+.2f} [{fit['ci'][name][0]:+.2f}, {fit['ci'][name][1]:+.2f}]"
        for name, coef in zip(names, fit["coef"], strict=True)
    )
    errors = held.get("median_abs_log2_error") or {}
    verdict = {True: "**held**", False: "**did not hold**", None: "not read"}[held.get("held")]
    per_track = held.get("per_track") or {}
    tracks = "; ".join(f"{t}: law {e['law']:.2f}, constant {e['constant']:.2f}, r ∝ n "
                       f"{e['proportional_to_n']:.2f}" for t, e in per_track.items())  # fmt: skip
    return (
        f"- {method_label(method)}: log2 r_ε = {terms}; σ {fit['sigma']:.2f} "
        f"({fit['rows']} rows, {fit['models']} models, {fit['censored_rows']} censored). "
        f"Held-out: {verdict} - median |log2 predicted/observed| "
        + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in errors.items())
        + (f" (law's 95 % interval {held['law_median_ci'][0]:.2f}-"
           f"{held['law_median_ci'][1]:.2f})" if held.get("law_median_ci") else "")
        + (f"; per track: {tracks}" if len(per_track) > 1 else "")
    )  # fmt: skip


def enlarged_text(law: Mapping[str, Any]) -> str:
    """The deviation's enlarged fit (other arms' heads added to the fit set) beside the
    registered one, and how the registered law reads those heads; empty without it."""
    enlarged = law.get("enlarged")
    if not enlarged:
        return ""
    lines = [f"**Enlarged fit** (a documented deviation, not the registered reading: "
             f"{law['heads'].get('extra', 0)} heads of other arms of "
             f"{', '.join(law['tracks'].get('extra', []))}, trained under RPKA, added to the "
             "fit set):", ""]  # fmt: skip
    for method, fit in enlarged["fit"].items():
        lines.append(_fit_line(method, fit, enlarged["held_out"].get(method, {})))
    by_seed = (enlarged.get("ci_by_seed") or {}).get("rpka")
    if by_seed:
        ci = ", ".join(f"{k} [{a:+.2f}, {b:+.2f}]" for k, (a, b) in by_seed.items())
        lines += ["", "RPKA's intervals resampled by (track, seed) instead, every arm's model "
                  f"of one seed together (they share initialisation and data): {ci}."]  # fmt: skip
    on_extra = enlarged["registered_on_extra"].get("rpka")
    if on_extra:
        lines += ["", f"The registered RPKA law on those heads: median signed log2 "
                  f"predicted/observed {on_extra['median_signed_log2']:+.2f} (absolute "
                  f"{on_extra['median_abs_log2']:.2f}, {on_extra['rows']} rows; > 0: it "
                  "over-predicts the rank they need)."]  # fmt: skip
    return "\n".join(lines)


def trained_link_text(law: Mapping[str, Any]) -> str:
    """Item 4: the drop-in r_eps of exact's heads against the trained r* per track."""
    link = law.get("trained_link")
    if not link or not link.get("tracks"):
        return ""
    best = link["best"]
    eps = str(best["eps"])
    tracks = "; ".join(
        f"{t} r\\* {e['r_star']} (tried below: {e['r_star_above'] or 'none'}), median head "
        f"r_ε {e[eps]['median_head']:.0f}"
        for t, e in link["tracks"].items()
    )
    spearman = best["spearman"]
    return (
        f"**Drop-in to trained** (RPKA, exact's heads, {len(link['tracks'])} tracks with a "
        f"trained r\\*): closest at ε {best['eps']:g} ({best['statistic'].replace('_', ' ')}), "
        f"median |log2 r_ε / r\\*| {best['median_abs_log2']:.2f} - {tracks}. Rank "
        "correlation across tracks "
        + ("not defined" if spearman is None else f"{spearman:+.2f}")
        + f"; {len(link['tracks'])} tracks make this weak evidence either way."
    )


def law_v2_text(law: Mapping[str, Any]) -> str:
    """The fit per method (coefficients with their clustered bootstrap intervals) and the
    held-out reading against the naive predictors, every number from ``law_v2``; then the
    enlarged fit and the link to the trained r* where the file has them."""
    lines = [f"Heads measured: {law['heads']['fit']} in the fit set "
             f"({', '.join(law['tracks']['fit'])}), {law['heads']['held_out']} held out "
             f"({', '.join(law['tracks']['held_out'])}). The theory's slope in ρ is "
             f"{law['theory_slope_rho']:.2f} per unit (log2 r).", ""]  # fmt: skip
    for method, fit in law["fit"].items():
        lines.append(_fit_line(method, fit, law["held_out"].get(method, {})))
    for extra in (enlarged_text(law), trained_link_text(law)):
        if extra:
            lines += ["", extra]
    return "\n".join(lines)


def law_v2_items(index: Mapping[str, Any], figs: Any) -> list[Any]:
    """The opening of "What sets the rank": r_eps against rho, the fit and the held-out
    reading (docs/rank_law.md, "Law v2"); nothing before ``rank-law fit-v2`` ran."""
    law = index.get("law_v2")
    if not law:
        return []
    return [
        figs.show(
            plot_r_eps_against_rho(law),
            "r_ε (ε 0.03) of RPKA per trained head against the logit scale ρ, by head size "
            "(crosses: held-out tracks; pluses: other arms' heads, the deviation's fit-only "
            "set); dashed: the coreset bound √d e^ρ / ε with constant 1.",
            "Rank needed against logit scale",
            name="rank_law_rho",
        ),
        Markdown(
            "**The law v2** (interval-censored fit, 95 % bootstrap intervals clustered "
            "by model):\n\n" + law_v2_text(law)
        ),  # fmt: skip
    ]
