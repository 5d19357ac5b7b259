"""A track's words beyond its answer (:func:`rpka.report.text.track_answer`): the
disclosures its data calls for, the captions of its forest and error-against-cost figures
with alt text, and the appendix's tables and rules, from the track's bench report. Keys
that older result files lack are read with ``.get``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from rpka.report.narrative import control_arms, readable_options
from rpka.report.tables import arm_group, verdict_word
from rpka.report.text import ci_text, esc, gate_text, loso_can_reject, num
from rpka.verdict.stats import ALPHA

GUARD_SHARE_NOTE = 0.01  # docs/numerics.md: a guard firing on > 1 % of rows is reported


# --------------------------------------------------------------------------- disclosures


def seed_numbers(report: Mapping[str, Any], arm: str, positions: Sequence[int]) -> list[int]:
    """The evaluation seeds at ``positions`` among an arm's finite pairs."""
    c = report["arms"][arm]["comparison"]
    dropped = set(c.get("diverged_positions", []))
    used = [s for i, s in enumerate(report["arms"][arm]["seeds"]) if i not in dropped]
    return [used[i] for i in positions if i < len(used)]


def borrowed_rates(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(arm, source arm) for arms that took another arm's learning rate (``lr_from``)."""
    sources = {a["name"]: a.get("lr_from") for a in report["config"]["arms"]}
    return [(arm, src) for arm, src in sources.items() if src]


def guard_shares(report: Mapping[str, Any]) -> pd.DataFrame:
    """Per arm: share of rows whose denominator was floored, share of output entries
    clamped (``guard_counts``; docs/numerics.md). Arms without guards are left out."""
    rows = []
    for arm, e in report["arms"].items():
        g = e.get("guard_counts")
        if not g:
            continue
        row = {"arm": arm}
        if g.get("rows"):
            row["rows floored (%)"] = 100 * g.get("denominator", 0) / g["rows"]
        if g.get("entries"):
            row["entries clamped (%)"] = 100 * g.get("clamped", 0) / g["entries"]
        rows.append(row)
    return pd.DataFrame(rows)


def single_seed_results(report: Mapping[str, Any]) -> list[str]:
    """Arms whose verdict one seed flips (leave-one-seed-out), with that seed's delta; not
    where one pair fewer leaves the rule unable to reject (:func:`loso_can_reject`)."""
    out = []
    for arm, e in report["arms"].items():
        c = e.get("comparison") or {}
        if c.get("verdict_flipped_by_one_seed") and loso_can_reject(c):
            seeds = seed_numbers(report, arm, c.get("flipping_seeds", []))
            largest = c.get("largest_seed_delta")
            out.append(
                f"`{arm}` ({verdict_word(c['verdict'])}; dropping seed "
                f"{', '.join(map(str, seeds)) or '?'} changes it; median delta "
                f"{num(c.get('delta_median'))}, largest single-seed delta {num(largest)})"
            )
    return out


def disclosures(report: Mapping[str, Any]) -> str:
    """What a reader must know to weigh one track's numbers (Markdown bullets)."""
    bullets = []
    borrowed = borrowed_rates(report)
    if borrowed:
        listed = ", ".join(f"`{arm}` from `{src}`" for arm, src in borrowed)
        bullets.append(
            f"**Borrowed learning rates.** {len(borrowed)} arm(s) did not sweep their own "
            f"rate but took another arm's ({listed}); they may be under-tuned."
        )
    flipped = single_seed_results(report)
    if flipped:
        bullets.append("**Single-seed-driven verdicts.** " + "; ".join(flipped) + ".")
    shares = guard_shares(report)
    if len(shares):
        worst = shares.set_index("arm").max(axis=1)
        high = worst[worst > 100 * GUARD_SHARE_NOTE]
        text = (
            "; ".join(f"`{arm}` {share:.1f} %" for arm, share in high.items())
            if len(high)
            else f"none above {GUARD_SHARE_NOTE:.0%} (largest {worst.max():.3f} %, "
            f"`{worst.idxmax()}`)"
        )
        bullets.append(
            "**Numerical guards** (share of rows floored or output entries clamped in "
            f"training, docs/numerics.md): {text}."
        )
    lacking = [k for k in ("decision", "attention_gate") if k not in report]
    if lacking:
        bullets.append(
            f"This bench report predates the keys {', '.join(f'`{k}`' for k in lacking)}: "
            "its verdicts come from the older rule (Holm over every arm)."
        )
    return "\n".join(f"- {b}" for b in bullets)


# --------------------------------------------------------------------------- captions


def forest_caption(track: Mapping[str, Any]) -> tuple[str, str]:
    """(caption, alt text) of a track's forest plot."""
    report, c = track["report"], track["comparison"]
    controls = control_arms(report)
    control_text = (
        f" Controls ({', '.join(f'`{a}`' for a in controls)}) have their own panel and scale."
        if controls
        else ""
    )
    verdict = verdict_word(c["verdict"])
    caption = (
        f"**{track['title']}: `{track['primary_arm']}` {verdict} against exact** "
        f"(delta {ci_text(c)}). Each arm's paired difference from `{report['baseline_arm']}`: "
        "seeds (dots), mean (diamond), 95 % CI (bar); primary arm in orange and bold; †: "
        f"dropping one seed (some of them) flips the verdict.{control_text}"
    )
    n = sum(1 for e in report["arms"].values() if e.get("comparison"))
    alt = (
        f"Forest plot of {n} arms against exact on the {track['title']}; the primary arm "
        f"{track['primary_arm']} has delta {ci_text(c)}, verdict {verdict}."
    )
    return caption, alt


def cost_caption(track: Mapping[str, Any]) -> tuple[str, str]:
    """(caption, alt) of the error-against-cost figure: which arms are told apart from
    exact (only those can be on a Pareto front)."""
    report = track["report"]
    resolved = [
        f"`{arm}`"
        for arm, e in report["arms"].items()
        if (c := e.get("comparison"))
        and c.get("ci_low") is not None
        and (c["ci_low"] > 0 or c["ci_high"] < 0)
    ]
    front = (
        f"arms whose CI excludes 0: {', '.join(resolved)}; the dashed front joins those no "
        "other such arm beats on both axes"
        if resolved
        else "no arm's CI excludes 0, so no Pareto front is drawn: every arm's error is "
        "within noise of exact's and only the cost tells them apart"
    )
    tokens = report["arms"][report["baseline_arm"]].get("attention_tokens")
    at = f" on this track at its {tokens} tokens" if tokens else " on this track"
    caption = (
        f"**{track['title']}: error against cost.** Each arm's paired test-error difference "
        f"from exact (mean, unadjusted 95 % CI) against its median training step measured{at} "
        f"(log scale); the primary arm `{track['primary_arm']}` framed and in bold in the "
        f"legend; each arm keeps its colour in every figure. {front[0].upper()}{front[1:]}. "
        "Forward latency at long sequences is in the speed section."
    )
    alt = (
        f"Scatter plot of each arm's error difference from exact against its training step "
        f"time (log scale), {track['title']}, primary arm {track['primary_arm']}."
    )
    return caption, alt


# --------------------------------------------------------------------------- appendix


def arms_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """Every arm's method, options in words, learning rate and how it was chosen."""
    rows = []
    for arm, e in report["arms"].items():
        cfg = e["best_cfg"]
        rows.append(
            {
                "arm": arm,
                "group": arm_group(report, arm),
                "method": e["method"],
                "options": readable_options(e.get("options")),
                "learning rate": cfg["lr"],
                "how the rate was chosen": cfg.get("selection", ""),
            }
        )
    return pd.DataFrame(rows)


STAT_COLUMNS = {
    "delta_mean": "delta mean",
    "delta_median": "delta median",
    "ci_low": "CI low",
    "ci_high": "CI high",
    "p_value": "p (sign-flip)",
    "p_adjusted": "p used",
    "adjustment": "adjustment",
    "tost_p": "TOST p",
    "margin": "margin",
    "mde": "MDE of the rule",
    "verdict_flipped_by_one_seed": "one seed flips it",
    "verdict": "verdict",
}


def statistics_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """The full statistics of every comparison (the keys present in this report)."""
    rows = []
    for arm, e in report["arms"].items():
        c = e.get("comparison")
        if not c:
            continue
        row = {"arm": arm, "pairs": c["n_pairs"], "wins": c.get("idea_wins")}
        for key, label in STAT_COLUMNS.items():
            if key in c:
                value = c[key]
                row[label] = verdict_word(value) if key == "verdict" else value
        rows.append(row)
    frame = pd.DataFrame(rows)
    if "one seed flips it" in frame:
        frame["one seed flips it"] = frame["one seed flips it"].map(
            {True: "yes", False: "no", None: "not computed"}
        )
    return frame


def selection_rules(track: Mapping[str, Any]) -> str:
    """The rules the track's results were selected and decided by (Markdown)."""
    report = track["report"]
    decision = track["decision"]
    lines = []
    if decision:
        family = ", ".join(f"`{a}`" for a in decision.get("secondary_family", []))
        lines.append(
            f"**Decision.** Primary arm `{decision.get('primary_arm', track['primary_arm'])}`, "
            f"unadjusted; secondary family (Holm): {family or 'none'}; equivalence margin "
            f"{num(decision.get('margin'), '.4g')} (TOST); α = {decision.get('alpha', ALPHA)}. "
            f"{esc(decision.get('rule', ''))}"
        )
    else:
        lines.append("**Decision.** Holm-adjusted sign-flip p over every arm (older rule).")
    lines.append(f"**Attention gate.** {gate_text(track)}")
    rules = sorted({e["best_cfg"].get("selection", "") for e in report["arms"].values()} - {""})
    if rules:
        lines.append("**Learning rates.** " + "; ".join(esc(r) for r in rules) + ".")
    choice = report.get("ablation_choice")
    if choice:
        lines.append(f"**Ablation default.** {esc(choice['rule'])}")
    return "\n\n".join(lines)
