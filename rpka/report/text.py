"""The report's words, read from the study index and the result files (``rpka.report``
lays them out): escaping, numbers in words, each track's answer, speed and decoding, the
Summary's bullets, the mechanism's and the speed figures' captions (each states the
figure's message) with alt text. A track's other words (disclosures, its figures'
captions, the appendix tables) are :mod:`rpka.report.text_track`. Keys that older result
files lack are read with ``.get``."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rpka.config.presets import MECHANISM_TRACK
from rpka.report.figures import metric_label
from rpka.report.figures_headline import relative_interval
from rpka.report.narrative import mde_text, relative_text
from rpka.report.tables import arm_group, relative_is_meaningful, verdict_word
from rpka.speed.analysis import crossover_table
from rpka.tracks import get_task
from rpka.verdict.stats import ALPHA, rule_can_reject

SPEED_RANK = 64  # the rank the speed targets are stated at (rpka.report.readme)


def esc(text: object) -> str:
    """Data text for Markdown or HTML outside code spans: ``<arm>`` stays text."""
    return html.escape(str(text), quote=False)


# --------------------------------------------------------------------------- numbers in words


def num(x: float | None, fmt: str = "+.3g") -> str:
    return "n/a" if x is None or not np.isfinite(x) else format(x, fmt)


def ci_text(c: Mapping[str, Any]) -> str:
    """ "+0.012 [−0.003, +0.027]" (delta and 95 % CI)."""
    return f"{num(c['delta_mean'])} [{num(c.get('ci_low'))}, {num(c.get('ci_high'))}]"


def gate_text(track: Mapping[str, Any]) -> str:
    """The attention gate's outcome in words."""
    gate = track["attention_gate"]
    if gate is None:
        return "no attention gate (the track has no control arm, or its report predates it)"
    outcome = "passed" if gate["passed"] else "failed"
    floor = (
        ""
        if gate.get("rule_can_pass", True)
        else f"; with {gate['n_pairs']} pairs its p cannot go below {num(gate['p_floor'], '.3g')}"
        ", so the rule cannot pass"
    )
    return (
        f"attention gate {outcome}: the control `{gate.get('control_arm', 'control')}` is "
        f"worse than exact by {relative_text(gate['control_rel'])} (delta "
        f"{num(gate['control_delta'])}, one-sided p = {num(gate['p_value'], '.3g')}){floor}. "
        f"Rule: {esc(gate['rule'])}"
    )


def track_answer(track: Mapping[str, Any]) -> str:
    """One track's answer in one sentence: the primary arm against exact with its CI and
    verdict; a failed gate reads "uninformative"."""
    report, c = track["report"], track["comparison"]
    head = f"**{track['title']}** (`{track['primary_arm']}` vs `{report['baseline_arm']}`)"
    if track["gate"] == "failed":
        gate = track["attention_gate"]
        return (
            f"{head}: **uninformative: this track does not need attention** (uniform "
            f"attention differs from exact by only {num(100 * gate['control_rel'], '+.1f')} %, "
            f"one-sided p = {num(gate['p_value'], '.3g')}); without the gate the delta "
            f"would read {ci_text(c)} ({verdict_word(c.get('verdict_before_gate', ''))})."
        )
    _, low, high = relative_interval(c)
    margin = track["decision"].get("margin")
    margin_text = f", margin ±{num(margin, '.3g')}" if margin else ""
    flips = ""
    if c.get("verdict_flipped_by_one_seed"):
        flips = (
            f" Dropping any one of {len(c.get('flipping_seeds', []))} of the "
            f"{c.get('n_pairs', '?')} seeds flips this verdict."
            if loso_can_reject(c)
            else " With any one seed left out the rule could not reject at all (its p "
            "cannot go below 2/2^(n-1)): a limit of the seed count, not of this effect."
        )
    relative = (
        f"{num(low, '+.1f')} to {num(high, '+.1f')} % of exact's"
        if all(relative_is_meaningful(v / 100) for v in (low, high) if math.isfinite(v))
        else "exact's mean is near 0: no relative figure"
    )
    return (
        f"{head}: delta in test {metric_label(report)} {ci_text(c)} "
        f"({relative}), "
        f"**{verdict_word(c['verdict'])}** (MDE of the rule {mde_text(c)}{margin_text}).{flips}"
    )


def loso_can_reject(c: Mapping[str, Any]) -> bool:
    """Can the rule reject at all with one pair fewer? If not, leave-one-seed-out flips a
    significant verdict whatever the data (the sign-flip floor), and a flip says nothing."""
    return rule_can_reject(c.get("n_pairs", 0) - 1, c.get("mde_alpha", c.get("alpha", ALPHA)))


# --------------------------------------------------------------------------- speed


def speed_numbers(scaling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The CPU crossover of rpka at ``SPEED_RANK`` (else its largest rank) against exact."""
    if not scaling:
        return None
    table = crossover_table(scaling)
    if table.empty:
        return None
    ranks = table["rank"].dropna().astype(int)
    rank = SPEED_RANK if SPEED_RANK in set(ranks) else int(ranks.max())
    row = table[table["rank"] == rank].iloc[0]
    return {"rank": rank, "device": scaling.get("device", "?"), **row.to_dict()}


def decode_numbers(decode: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Per-token decoding at the longest and shortest context, with the amortised landmark
    redraw, and the prefill, against exact (``rpka.speed.decoding`` JSON)."""
    if not decode:
        return None
    rows = {(r["method"], r["context"]): r for r in decode["rows"]}
    contexts = sorted(decode["config"]["contexts"])
    short, long = contexts[0], contexts[-1]
    rp, ex = rows.get(("rpka", long)), rows.get(("exact", long))
    first = rows.get(("rpka", short))
    if rp is None or ex is None or first is None:
        return None

    def with_redraw(r: Mapping[str, Any]) -> float:
        return r["per_token_ms"] + r.get("amortised_redraw_ms_per_token", 0.0)

    return {
        "device": decode.get("device", "?"),
        "short": short,
        "long": long,
        "per_token_ms": rp["per_token_ms"],
        "with_redraw_ms": with_redraw(rp),
        "exact_ms": ex["per_token_ms"],
        "growth": rp["per_token_ms"] / first["per_token_ms"],
        "growth_with_redraw": with_redraw(rp) / with_redraw(first),
        "has_redraw": "amortised_redraw_ms_per_token" in rp,
        "prefill_ratio": _prefill_ratio(rp, ex),
        **_worst_prefill(rows, contexts),
    }


def _prefill_ratio(rpka: Mapping[str, Any] | None, exact: Mapping[str, Any] | None) -> float | None:
    if rpka and exact and rpka.get("prefill_ms") and exact.get("prefill_ms"):
        return rpka["prefill_ms"] / exact["prefill_ms"]
    return None


def _worst_prefill(rows: Mapping[tuple[str, int], Mapping], contexts: list[int]) -> dict:
    """The context where RPKA's prefill is slowest against exact's, and that ratio."""
    ratios = {
        n: r
        for n in contexts
        if (r := _prefill_ratio(rows.get(("rpka", n)), rows.get(("exact", n))))
    }
    if not ratios:
        return {"prefill_worst_ratio": None, "prefill_worst_context": None}
    worst = max(ratios, key=ratios.get)
    return {"prefill_worst_ratio": ratios[worst], "prefill_worst_context": worst}


def decode_cost(decode: Mapping[str, Any] | None) -> str:
    """Decoding in words, the landmark redraw and the prefill included."""
    d = decode_numbers(decode)
    if d is None:
        return "No decoding measurement in this study."
    redraw = (
        f"with the landmark redraw amortised over the tokens it serves "
        f"{d['with_redraw_ms']:.3f} ms ({d['growth_with_redraw']:.2f}× the {d['short']:,}-token "
        "figure)"
        if d["has_redraw"]
        else "the landmark redraw is not in this file"
    )
    prefill = (
        f"; the prefill of the prompt takes {d['prefill_ratio']:.1f}× exact's time there, and "
        f"up to {d['prefill_worst_ratio']:.1f}× (at {d['prefill_worst_context']:,} tokens)"
        if d["prefill_ratio"]
        else ""
    )
    return (
        f"Decoding on {esc(d['device'])} at {d['long']:,} tokens of context: RPKA "
        f"{d['per_token_ms']:.3f} ms per token ({d['growth']:.2f}× its {d['short']:,}-token "
        f"time) against exact's {d['exact_ms']:.3f} ms; {redraw}{prefill}."
    )


def speed_text(
    study: Mapping[str, Any], scaling: Mapping[str, Any] | None, decode: Mapping[str, Any] | None
) -> str:
    """Where RPKA is faster (the CPU crossover), what training costs, and decoding."""
    s = speed_numbers(scaling)
    if s is None:
        fast = "The latency sweep has no RPKA measurement."
    elif s["status"] == "never":
        fast = (
            f"On {esc(s['device'])}, RPKA r={s['rank']}'s forward is not faster than exact up "
            f"to n = {s['n_largest']:,.0f} ({s['speedup_at_largest']:.2f}× there)."
        )
    else:
        at = s["crossover_n_interp"] or s["crossover_n"]
        fast = (
            f"On {esc(s['device'])}, RPKA r={s['rank']}'s forward is faster than exact from "
            f"n ≈ {at:,.0f} tokens on, {s['speedup_at_largest']:.1f}× at n = "
            f"{s['n_largest']:,.0f}."
        )
    costs = []
    for t in study["tracks"].values():
        timings = t["report"]["timings"]
        ratio = timings["step_ratio_vs_baseline"].get(t["primary_arm"])
        context = t["report"]["data"].get("context")
        if ratio is not None:
            at = f" at {context} tokens" if context else ""
            costs.append(f"{ratio:.2f}× exact's step on the {t['title'].lower()}{at}")
    train = f" Training the primary arm costs {'; '.join(costs)}." if costs else ""
    return f"**Speed.** {fast}{train} {decode_cost(decode)}"


# --------------------------------------------------------------------------- summary


def failures(study: Mapping[str, Any]) -> list[str]:
    """What failed in the science: arms that lose significantly (controls aside), diverged
    runs. The engineering targets (speed, budget) have their own section."""
    out = []
    for t in study["tracks"].values():
        report = t["report"]
        losses = [
            f"`{arm}`"
            for arm, e in report["arms"].items()
            if (e.get("comparison") or {}).get("verdict") == "significant loss"
            and arm_group(report, arm) != "control"
        ]
        if losses:
            out.append(f"{t['title']}: {', '.join(losses)} significantly worse than exact")
        diverged = sum(e.get("n_diverged") or 0 for e in report["arms"].values())
        if diverged:
            out.append(f"{t['title']}: {diverged} evaluation run(s) diverged")
    return out


def main_limitation(study: Mapping[str, Any], scaling: Mapping[str, Any] | None) -> str:
    """The limitation that bounds the answer most, read from the results."""
    s = speed_numbers(scaling)
    contexts = [
        t["report"]["data"].get("context")
        for t in study["tracks"].values()
        if t["report"]["data"].get("context")
    ]
    long_range = [
        int(c) for c, e in ((study.get("longrange") or {}).get("contexts") or {}).items()
        if e.get("gate_passed")
    ]  # fmt: skip
    if s is not None and s["status"] != "never" and contexts:
        at = s["crossover_n_interp"] or s["crossover_n"]
        beyond = sorted(c for c in long_range if c >= at)
        if max(contexts) < at and beyond:
            return (
                f"**Main limitation.** Quality and speed meet only on the long-range track "
                f"(Section 3) at {', '.join(f'{c:,}' for c in beyond)} tokens - one "
                "synthetic lookup task under a reduced protocol (a small model, one learning "
                f"rate); the other tracks stay at {max(contexts):,} tokens or fewer, below "
                f"the ≈ {at:,.0f} tokens where RPKA's attention starts to pay off."
            )
        if max(contexts) < at:
            return (
                f"**Main limitation.** Quality is compared at {max(contexts):,} tokens or "
                f"fewer, below the ≈ {at:,.0f} tokens where RPKA starts to pay off: the tracks "
                "do not show quality and speed together (the long-context studies of Section 3 "
                "are its only training beyond that)."
            )
    failed = [t["title"] for t in study["tracks"].values() if t["gate"] == "failed"]
    if failed:
        return (
            f"**Main limitation.** {', '.join(failed)}: the control without attention cannot "
            "be told apart from exact attention, so those tracks say nothing about RPKA."
        )
    return (
        "**Main limitation.** The tracks are synthetic (or one small real series): the "
        "answer is about these tasks, not about attention in large models."
    )


def summary_bullets(
    study: Mapping[str, Any],
    scaling: Mapping[str, Any] | None = None,
    decode: Mapping[str, Any] | None = None,
) -> str:
    """The five bullets of the Summary (Markdown): tracks that need attention and their
    answers; tracks that do not; speed; what lost (science only: the engineering targets
    are their own section); the main limitation."""
    tracks = list(study["tracks"].values())
    informative = [t for t in tracks if t["gate"] != "failed"]
    failed = [t for t in tracks if t["gate"] == "failed"]

    def sub(items: list[dict[str, Any]]) -> str:
        return "".join(f"\n    - {track_answer(t)}" for t in items)

    answer = (
        "**Does RPKA match exact attention?** Primary arm against exact, paired over "
        "evaluation seeds, on the tracks that need attention (or have no gate):"
        + (sub(informative) if informative else " none.")
    )
    gated = (
        "**Tracks that do not need attention** (uniform attention cannot be told apart "
        "from exact, so they cannot tell attention methods apart):"
        + (sub(failed) if failed else " none (no track failed an attention gate).")
    )
    failed_items = failures(study)
    what_failed = "**What lost.** " + (
        "; ".join(failed_items) + "."
        if failed_items
        else "No arm lost significantly and no run diverged."
    )
    bullets = [answer, gated, speed_text(study, scaling, decode), what_failed]
    bullets.append(main_limitation(study, scaling))
    return "\n".join(f"- {b}" for b in bullets)


# --------------------------------------------------------------------------- other captions


def mechanism_scope(mechanism: Mapping[str, Any]) -> str:
    """What the trace-identity check tests and what it does not (Markdown)."""
    sig = mechanism["trained"]["mechanism_signature"]
    pooled = sig.get("pooled")  # the pooled-z decision over Monte Carlo seeds, when present
    decided = (
        f" The decision pools the z-scores over {pooled.get('n_seeds', 'several')} Monte "
        "Carlo seeds (χ² for any miscalibration, Σz for a consistent bias); the per-step "
        "±4 band is shown for display."
        if isinstance(pooled, Mapping)
        else ""
    )
    return (
        f"**What this checks.** On the {esc(get_task(MECHANISM_TRACK).text.title)}'s trained model "
        f"(`{MECHANISM_TRACK}`, the arm above), the identity (one RPCholesky step lowers the "
        "residual trace by "
        "‖R‖²_F / tr R in expectation) is algebraic: it holds for any positive semi-definite "
        "kernel matrix. Checking it on a trained model's queries and keys therefore tests the "
        "implementation (that the package draws pivots by the rule on real inputs), not "
        "whether RPKA approximates trained attention well: that is the tracks' and the "
        f"output-error figures' job.{decided}"
    )


def trace_identity_caption(mechanism: Mapping[str, Any]) -> tuple[str, str]:
    sig = mechanism["trained"]["mechanism_signature"]
    pooled = sig.get("pooled") or {}
    verdict = "confirmed" if sig["confirmed"] else "not confirmed by the pooled rule"
    # the decision is the pooled test over every Monte Carlo seed; the panel shows one seed
    decision = (
        f"decided over {pooled['n_seeds']} Monte Carlo seeds and {pooled['count']} z-scores: "
        f"χ² p = {num(pooled.get('chi2_p'), '.3g')}, Stouffer p = "
        f"{num(pooled.get('stouffer_p'), '.3g')} (each at α = {pooled.get('alpha', ALPHA) / 2:g})"
        if pooled
        else "one Monte Carlo seed"
    )
    caption = (
        f"**The trace identity on the {esc(get_task(MECHANISM_TRACK).text.title)}'s trained model, "
        f"{verdict}** ({decision}). The panel "
        f"shows one Monte Carlo seed: predicted against observed residual-trace decrease per "
        f"RPCholesky step; largest |z| {num(sig['max_abs_z'], '.2f')} over {sig['n_tests']} "
        f"tests, {sig['n_exceeding']} beyond ±4 (this seed's χ² p = "
        f"{num(sig.get('chi2_p_value'), '.3g')})."
    )
    alt = (
        f"Per-step predicted and observed residual-trace decreases with z-scores for "
        f"{sig['n_heads']} heads; largest absolute z {num(sig['max_abs_z'], '.2f')}."
    )
    return caption, alt


def trained_vs_init_caption(mechanism: Mapping[str, Any]) -> tuple[str, str]:
    caption = (
        "**Training changes the attention kernel RPKA approximates**: eigenvalue spectra, "
        "residual trace against rank (dashed: the optimum) and output error against rank, "
        "for the trained model and the same model at initialisation."
    )
    alt = (
        "Three panels comparing the trained and initial model: spectrum, residual trace "
        "and output error against rank."
    )
    return caption, alt


def speedup_caption(scaling: Mapping[str, Any]) -> tuple[str, str]:
    s = speed_numbers(scaling)
    if s is None or s["status"] == "never":
        message = "RPKA is not faster than exact at the measured lengths"
    else:
        at = s["crossover_n_interp"] or s["crossover_n"]
        message = (
            f"RPKA r={s['rank']} overtakes exact at n ≈ {at:,.0f} and is "
            f"{s['speedup_at_largest']:.1f}× faster at n = {s['n_largest']:,.0f}"
        )
    caption = (
        f"**{message}** ({esc(scaling.get('device', '?'))}): exact's forward latency over "
        "RPKA's against sequence length; above 1 RPKA is faster; ticks mark the crossovers."
    )
    return caption, f"Log-log line plot of speed-up against sequence length; {message}."


def decode_caption(decode: Mapping[str, Any]) -> tuple[str, str]:
    d = decode_numbers(decode)
    message = (
        f"RPKA's per-token decoding time stays flat ({d['growth']:.2f}× from {d['short']:,} to "
        f"{d['long']:,} tokens, {d['growth_with_redraw']:.2f}× with the redraw) while exact's "
        "grows with the context"
        if d
        else "per-token decoding time against context"
    )
    caption = (
        f"**{message}.** Median step (solid) and RPKA with the landmark redraw amortised "
        "(dashed), log-log; the prefill is not in this figure (see the text)."
    )
    return caption, f"Log-log plot of per-token decoding latency against context; {message}."
