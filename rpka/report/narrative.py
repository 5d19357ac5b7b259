"""The report's prose, written from the result files: every number here is read from a
result dict, never typed by hand. Each function returns Markdown for ``06_report``."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rpka.report.figures import metric_label
from rpka.report.tables import NEAR_ZERO_FRACTION, relative_is_meaningful, verdict_word
from rpka.tracks import get_task
from rpka.verdict import stats
from rpka.verdict.frontier import forward_speedup
from rpka.verdict.robustness import signflip_interval


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def readable_options(options: Mapping[str, Any] | None) -> str:
    """{'rank': 64, 'pivot_method': 'plain'} -> "rank 64, pivot method plain"."""
    if not options:
        return "defaults"
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in options.items())


def setup(report: Mapping) -> str:
    """Track, model, arms and protocol of a bench report."""
    cfg = report["config"]
    arms = ", ".join(
        f"`{a['name']}`" + (f" ({readable_options(a['options'])})" if a["options"] else "")
        for a in cfg["arms"]
    )
    metric = metric_label(report)
    protocol = (
        f"**Arms.** {arms}. Baseline `{report['baseline_arm']}` (torch SDPA); primary arm "
        f"`{report['primary_arm']}`.\n\n"
        f"**Protocol.** {rates_text(cfg['learning_rates'], cfg['sweep_seeds'])} then "
        f"trained with {report['n_seeds']} fresh "
        f"evaluation seeds {cfg['eval_seeds']} and scored on test ({metric}, "
        f"lower is better). A seed fixes data order and initialisation for both arms of a pair."
    )
    return get_task(report["track"]).text.setup_text(report, protocol)


def rates_text(rates: list[float], seeds: list[int]) -> str:
    """The learning-rate sweep in words, up to "each arm's ... rate": one rate is no sweep."""
    if len(rates) == 1:
        return f"One learning rate, {rates[0]:g}, for every arm (no sweep); each arm's rate"
    listed = ", ".join(f"{r:g}" for r in rates)
    return f"Learning rates {listed} swept on validation with seeds {seeds}; each arm's best rate"


def relative_text(fraction: float, of: str = "exact's mean") -> str:
    """A difference as a share of exact's mean ("+12.5 %"), or a plain statement when exact's
    mean is near 0 and the share would read like 984,500 % (recall: exact's error 1e-4)."""
    if not relative_is_meaningful(fraction):
        return f"over {NEAR_ZERO_FRACTION:.0f} times {of} ({of} is near 0)"
    return f"{100 * fraction:.1f} % of {of}"


def mde_text(c: dict[str, Any]) -> str:
    """The MDE of the rule in words; null in the file means the rule cannot detect any
    effect (its ``mde_note`` says why) or the MDE is undefined."""
    if c.get("mde") is None or not math.isfinite(c["mde"]):
        return f"not finite ({c.get('mde_note') or 'the rule cannot reject with these pairs'})"
    rel = c.get("mde_rel_pct")
    return f"{c['mde']:.4f}" + (f" ({relative_text(rel / 100)})" if rel is not None else "")


def headline(report: Mapping) -> str:
    """The primary comparison in two sentences, with its statistics."""
    c = report["comparison"]
    base, idea = report["baseline"], report["idea"]
    metric = metric_label(report)
    return (
        f"**{report['primary_arm']} vs {report['baseline_arm']}:** test {metric} "
        f"{_fmt(idea['full']['mean'])} ± {_fmt(idea['full']['std'])} against "
        f"{_fmt(base['full']['mean'])} ± {_fmt(base['full']['std'])} (mean ± sd over "
        f"{c['n_pairs']} seeds). Paired delta {c['delta_mean']:+.4f}, "
        f"{interval_text(c)}; the idea wins {c['idea_wins']}/"
        f"{c['n_pairs']} seeds; sign-flip p = {c['p_value']:.3g} ({c['p_value_method']}), "
        f"Holm-adjusted p = {c['p_adjusted']:.3g}. **Verdict: {c['verdict']}.** "
        f"With {c['n_pairs']} pairs the minimum detectable effect at α = {stats.ALPHA:g} and "
        f"80 % power is {mde_text(c)}; the CI half-width is "
        f"{c['ci_halfwidth']:.4f}.{margin_text(c)}"
    )


def interval_text(c: Mapping) -> str:
    """The paired t interval and, beside it, the interval that inverts the sign-flip test
    the verdict comes from (``rpka.robustness.signflip_interval``), so the verdict has an
    interval that agrees with it; where the t interval contains 0 and the test rejects (or
    the reverse), the words say the two disagree and which rule decides (issue 40)."""
    t = f"95 % t interval [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]"
    diffs = c.get("per_seed_diffs")
    if not diffs:
        return t
    flip = signflip_interval(diffs, c.get("alpha", stats.ALPHA))
    low, high = ("-inf" if flip["low"] is None else f"{flip['low']:+.4f}",
                 "+inf" if flip["high"] is None else f"{flip['high']:+.4f}")  # fmt: skip
    text = f"{t}, sign-flip interval [{low}, {high}] (the test inverted; it decides)"
    t_has_zero = c["ci_low"] <= 0 <= c["ci_high"]
    if t_has_zero == (c["p_value"] < c.get("alpha", stats.ALPHA)):
        text += (" - the t interval and the sign-flip test disagree (a seed far from the "
                 "others widens the t interval); the sign-flip test is the rule")  # fmt: skip
    return text


def margin_text(c: Mapping) -> str:
    """The track's equivalence margin and the seeds the rule would need for an MDE within
    it (``seeds_for_margin``; computed here for reports written before the key), or ""."""
    margin = c.get("margin")
    if margin is None:
        return ""
    needed = c.get("seeds_for_margin")
    if needed is None and "mde_alpha" in c:
        needed = stats.seeds_for_margin(c["delta_sd"], margin, c["mde_alpha"], c["mde_power"])
    need = (
        f"an MDE within it would need {needed} seeds at this spread of differences"
        if needed is not None
        else "no number of seeds up to 10,000 brings the MDE within it"
    )
    return f" The equivalence margin is {margin:g}; {need}."


def control_arms(report: Mapping) -> list[str]:
    """The report's control arms (method ``mean``: uniform attention)."""
    return [arm for arm, e in report["arms"].items() if e["method"] == "mean"]


def needs_attention(report: Mapping, control: str) -> bool:
    """Whether exact attention beats the control arm ``control`` significantly (Holm)."""
    return verdict_word(report["arms"][control]["comparison"]["verdict"]) == "significant loss"


def control_reading(report: Mapping) -> str:
    """What the control arm says about the track: does it need attention at all?

    The control (uniform attention, queries and keys ignored) against the baseline: if
    exact attention beats it significantly, the track tells attention methods apart; if
    not, a tie of an approximation with exact attention says nothing about its quality.
    """
    parts = []
    for arm in control_arms(report):
        c = report["arms"][arm]["comparison"]
        word = verdict_word(c["verdict"])
        stats_ = (
            f"`{arm}` (uniform attention: queries and keys ignored) against "
            f"`{report['baseline_arm']}`: delta {c['delta_mean']:+.4f}, 95 % CI "
            f"[{c['ci_low']:+.4f}, {c['ci_high']:+.4f}], p = {c['p_adjusted']:.3g} "
            f"({word})"
        )
        gate = report.get("attention_gate")
        if gate:
            stats_ += (
                f"; attention gate {'passed' if gate['passed'] else 'failed'} (the control is "
                f"worse than exact by {relative_text(gate['control_rel'])}, one-sided p = "
                f"{gate['p_value']:.3g}; {gate['rule']})"
            )
        if not fails_gate(report):
            parts.append(
                f"**Control:** {stats_}. This track needs attention, so it can tell "
                "attention methods apart."
            )
        else:
            parts.append(
                f"**Control:** {stats_}. **This track shows no need for attention**: a model "
                "without it cannot be told apart from exact attention, so the other arms' "
                "ties with exact attention say little about how well they approximate it."
            )
    return "\n\n".join(parts)


def learnability(report: Mapping) -> str:
    """Whether the task was learned: exact attention against the track's references (or
    why it cannot be read: the baseline diverged on every evaluation seed)."""
    baseline = report["arms"][report["baseline_arm"]]
    if baseline.get("n_diverged", 0) >= report["n_seeds"]:
        return (
            f"`{report['baseline_arm']}` diverged on all {report['n_seeds']} evaluation seeds: "
            "the learnability bar cannot be read."
        )
    return get_task(report["track"]).text.learnability_text(report)


def step_times(report: Mapping) -> str:
    """Training step time of each arm against the baseline's, at the bench's shapes."""
    t = report["timings"]
    ratios = t["step_ratio_vs_baseline"]
    parts = [
        f"`{arm}` {t['step_ms_median'][arm]:.1f} ms ({ratios[arm]:.2f}×)"
        for arm in t["step_ms_median"]
    ]
    how = (
        f"one thread, CPU time, arms interleaved ({t['step_source']})"
        if t.get("step_source")
        else "training wall time, one thread per worker"
    )
    return (
        f"Median training step ({t['step_members']} seeds stacked, {how}): "
        + "; ".join(parts)
        + "."
    )


def forward_time_key(scaling: Mapping) -> str:
    """The forward time a scaling JSON's times are shown in: the interleaved CPU time
    (``forward_cpu_ms``) where every row has it, else the wall time (older files, GPUs).
    The ratio beside them is the one reading of the sweep's speed-up,
    ``rpka.verdict.frontier.forward_speedup`` (the same times' ratio)."""
    rows = [r for r in scaling["rows"] if r.get("forward_ms")]
    return "forward_cpu_ms" if rows and all(r.get("forward_cpu_ms") for r in rows) else "forward_ms"


def scaling_summary(scaling: Mapping, rank: int = 64) -> str:
    """Forward latency of rpka at ``rank`` against exact, per length, from a scaling JSON."""
    rows, key = scaling["rows"], forward_time_key(scaling)
    exact = {r["n"]: r for r in rows if r["method"] == "exact" and r.get(key)}
    ours = {
        r["n"]: r for r in rows if r["method"] == "rpka" and r.get("rank") == rank and r.get(key)
    }
    lengths = sorted(set(exact) & set(ours))
    if not lengths:
        return f"No rpka r={rank} forward measurements in this file."
    cells = ", ".join(
        f"n={n}: {ours[n][key]:.1f} vs {exact[n][key]:.1f} ms ({forward_speedup(ours[n]):.1f}×)"
        for n in lengths
    )
    measure = "CPU time, arms interleaved" if key == "forward_cpu_ms" else "wall time"
    return (
        f"On {scaling['device']} ({scaling.get('shapes', '')}, {scaling.get('dtype', '')}; "
        f"{measure}), rpka r={rank} forward against exact: {cells}."
    )


def track_notes(report: Mapping) -> str:
    """What the track adds to its results in words (``TrackText.result_notes``; track lm: every
    arm's perplexity next to the exact floor), or ""."""
    return get_task(report["track"]).text.result_notes(report)


def ablation_choice(report: Mapping) -> str:
    """RPKA's default from the ablations, chosen on validation, in words."""
    choice = report.get("ablation_choice")
    if not choice:
        return "This study has no ablation arms."
    reference, picked = choice["reference"], choice.get("picked_arm", choice["chosen_arm"])
    if choice["chosen_arm"] != reference:
        outcome = (
            f"`{choice['chosen_arm']}` replaces the reference `{reference}` (options "
            f"`{choice['chosen_options']}`): picked on the sweep seeds and confirmed on the "
            "evaluation seeds' validation scores"
        )
    elif picked == reference:
        outcome = f"the reference `{reference}` stays the default: no candidate scored lower"
    else:
        candidate = next(c for c in choice["candidates"] if c["arm"] == picked)
        outcome = (
            f"the reference `{reference}` stays the default. The sweep seeds pick "
            f"`{picked}` (validation {choice['metric'].upper()} {candidate['val_score']:.4f} "
            f"against {choice['reference_val_score']:.4f}), but on the evaluation seeds' "
            f"validation scores it differs from the reference by "
            f"{candidate['eval_seeds_val_delta']:+.4f} (Holm-adjusted p = "
            f"{candidate['eval_seeds_val_p_adjusted']:.3g}), so the pick is not confirmed"
        )
    # the rule names key paths such as arms.<arm>.sweep: escaped, or Markdown's HTML eats <arm>
    rule = html.escape(choice["rule"], quote=False)
    return f"**RPKA's default, chosen on validation:** {outcome}. Rule: {rule}"


def z_variance(mechanism: Mapping, model: str = "trained") -> float:
    """Variance of every trace-identity z-score of ``mechanism.json`` (1 if they are N(0, 1))."""
    z = np.concatenate(
        [np.asarray(h["z"], dtype=float) for h in mechanism[model]["trace_identity"]]
    )
    return float(np.var(z[np.isfinite(z)]))


def fails_gate(report: Mapping) -> bool:
    """Whether the track cannot tell attention methods apart: its attention gate failed
    (``attention_gate``), or, in a report without the gate, a control arm is not
    significantly worse than exact."""
    gate = report.get("attention_gate")
    if "attention_gate" in report:
        return gate is not None and not gate["passed"]
    return any(not needs_attention(report, arm) for arm in control_arms(report))


def limitations(
    *benches: Mapping | None,
    mechanism: Mapping | None = None,
    mechanism_followup: Mapping | None = None,
) -> str:
    """The study's limitations as Markdown bullets: fixed caveats, and those the results
    themselves show (learning rates at the edge of the grid, divergences, a failed
    attention gate, short sequences), for each bench report in ``benches``."""
    benches = tuple(b for b in benches if b is not None)
    bullets = [
        "The tracks are synthetic (or one small real series); their generators are "
        "described in the set-up and their code is `rpka/tracks/`.",
        'A verdict of "inconclusive" is not evidence of no effect: read it with the CI, '
        'the minimum detectable effect of the rule and the margin; only "equivalent" '
        "(TOST at the stated margin) says the arms agree.",
        "Timings on a CPU depend on the load of the machine; every timing file records the "
        "load average.",
    ]
    for bench in benches:
        grid = sorted(bench["config"]["learning_rates"])
        track = f"track `{bench['track']}`"
        at_edge = [
            f"`{arm}` ({e['best_cfg']['lr']:g})"
            for arm, e in bench["arms"].items()
            if e["best_cfg"]["lr"] in (grid[0], grid[-1])
        ]
        if at_edge and len(grid) > 1:
            bullets.append(
                f"On {track} the best learning rate of {', '.join(at_edge)} is at an edge of "
                f"the grid {[float(f'{lr:g}') for lr in grid]}: a wider grid might move them."
            )
        diverged = {arm: e["n_diverged"] for arm, e in bench["arms"].items() if e["n_diverged"]}
        if diverged:
            listed = ", ".join(f"`{arm}` {n}" for arm, n in diverged.items())
            bullets.append(
                f"On {track} evaluation seeds diverged ({listed}); the paired statistics "
                "leave out their pairs."
            )
    for bench in benches:
        if fails_gate(bench):
            bullets.append(
                f"Track `{bench['track']}` does not need attention (its control, uniform "
                "attention, is not clearly worse than exact attention): its comparisons of "
                "attention methods are uninformative."
            )
    if mechanism is not None:
        bullets.extend(mechanism_limitation(mechanism, mechanism_followup))
    for bench in benches:
        primary = bench["primary_arm"]
        ratio = bench["timings"]["step_ratio_vs_baseline"].get(primary)
        if ratio is not None and ratio > 1:
            context = bench["data"].get("context")
            at = f"At the bench's {context} tokens" if context else "At the bench's length"
            bullets.append(
                f"{at} `{primary}` trains {ratio:.1f}× slower per step than exact attention "
                f"on track `{bench['track']}`: RPKA's speed advantage needs long sequences "
                "(see Speed), which the quality comparison does not reach; the long-context "
                "runs are the study's only training beyond it."
            )
    return "\n".join(f"- {b}" for b in bullets)


def mechanism_limitation(mechanism: Mapping, followup: Mapping | None = None) -> list[str]:
    """The trace identity's caveat, if any (a list of at most one bullet).

    Files from the pooled rule (``pooled``: the z-scores of several Monte Carlo seeds,
    ``rpka.verdict.stats.pooled_z``) are read by that decision, and by ``followup``
    (scripts/mechanism_followup.py: more seeds and draws on the same heads) when there is
    one; older single-seed files by the chi-square of their z-scores, which one seed
    cannot tell from a fluctuation.
    """
    sig = mechanism["trained"]["mechanism_signature"]
    pooled = sig.get("pooled")
    if isinstance(pooled, Mapping):
        if pooled["confirmed"]:
            return []
        text = (
            f"The trace identity is not confirmed on the trained model by the pre-registered "
            f"rule: over {pooled['n_seeds']} Monte Carlo seeds and {pooled['count']} z-scores, "
            f"χ² p = {pooled['chi2_p']:.3g} (mean z² {pooled['chi2'] / pooled['count']:.2f}, "
            f"1 expected) and Stouffer's Σz p = {pooled['stouffer_p']:.3g}."
        )
        if followup:
            text += " " + followup_sentence(followup)
        return [text]
    if sig["chi2_p_value"] is None or sig["chi2_p_value"] >= stats.ALPHA:
        return []
    return [
        f"The trace identity passes its rule at every step, but its {sig['n_tests']} "
        f"z-scores are over-dispersed: variance {z_variance(mechanism):.2f} where 1 is "
        f"expected (χ² p = {sig['chi2_p_value']:.3g}), with mean near 0; one Monte Carlo "
        "seed cannot tell this from a fluctuation."
    ]


def followup_sentence(followup: Mapping) -> str:
    """What scripts/mechanism_followup.py found, in words: do the z-scores grow with the
    number of draws (a biased sampler's do, by the square root of the ratio)?"""
    rows = sorted(followup["rows"], key=lambda r: r["draws"])
    few, many = rows[0], rows[-1]
    listed = "; ".join(
        f"{r['draws']} draws: mean z² {r['z']['mean_z2']:.2f} (exact-variance z "
        f"{r['z_null']['mean_z2']:.2f}), χ² p {r['z']['chi2_p']:.2g}"
        for r in rows
    )
    ratio = math.sqrt(many["draws"] / few["draws"])
    grows = many["z"]["mean_z2"] > few["z"]["mean_z2"] * min(2.0, ratio)
    reading = (
        "the z-scores grow with the draws: a sampler bias is not ruled out"
        if grows
        else f"the z-scores do not grow with the draws (a bias would scale them by {ratio:.1f}): "
        "a fluctuation of the bench's seeds, not a sampler bias"
    )
    return (
        f"A follow-up on the same heads with {few['seeds']} seeds (`{followup['command']}`): "
        f"{listed}; {reading}."
    )


def verdicts(*reports: Mapping | None) -> str:
    """Per track, the arms grouped by their verdict against the baseline (the bench's rule:
    the primary unadjusted, Holm over the secondary family, the gate)."""
    lines = []
    for report in reports:
        if report is None:
            continue
        groups: dict[str, list[str]] = {}
        for arm, entry in report["arms"].items():
            if entry.get("comparison"):
                word = verdict_word(entry["comparison"]["verdict"])
                groups.setdefault(word, []).append(f"`{arm}`")
        parts = [f"{word}: {', '.join(arms)}" for word, arms in groups.items()]
        decision = report.get("decision")
        rule = (
            f"primary `{decision['primary_arm']}` unadjusted, Holm across the "
            f"{len(decision['secondary_family'])} secondary arm(s), control "
            f"`{decision['control_arm']}` read by the attention gate"
            if decision
            else f"Holm across {sum(map(len, groups.values()))} arms"
        )
        lines.append(
            f"- Track `{report['track']}`, against `{report['baseline_arm']}` on test "
            f"{metric_label(report)}, {report['n_seeds']} paired seeds, {rule}. "
            + "; ".join(parts)
            + "."
        )
    return "\n".join(lines)


def superseded(report: Mapping[str, Any], previous: Mapping[str, Any]) -> str:
    """What a rerun after a bug fix changed (``superseded.json``, ``study.record_superseded``):
    each arm whose test scores moved, before → now, and the arms reproduced bit for bit."""
    changed, same = [], []
    for name, entry in report["arms"].items():
        before = previous["arms"].get(name)
        if before is None:
            continue
        if before["per_seed"] == entry["full"]["per_seed"]:
            same.append(f"`{name}`")
            continue
        now = entry.get("comparison") or {}
        changed.append(
            f"`{name}` {before['mean']:.4g} → {entry['full']['mean']:.4g}"
            + (
                f" (delta {_delta(before)} → {_delta(now)}; "
                f"{verdict_word(before['verdict'])} → {verdict_word(now['verdict'])})"
                if "verdict" in before and "verdict" in now
                else ""
            )
        )
    text = (
        f"**Rerun after a fix.** {previous['reason']} (fixed in {previous['fix']}). "
        f"Mean test {previous['metric']} before → now: " + "; ".join(changed or ["no arm moved"])
    )
    if same:
        text += f". Reproduced bit for bit: {', '.join(same)}"
    return text + "."


def _delta(c: Mapping[str, Any]) -> str:
    return f"{c['delta_mean']:+.3g} [{c['ci_low']:+.3g}, {c['ci_high']:+.3g}]"


def untimed_answer(good: list[str], controls: list[str], margin: str) -> str:
    """The long-range answer where every step ratio is a training wall time: cost is not
    decided (issue 40: cost ratios come from the timing file only), quality is. ``good``:
    the non-inferior RPKA points in words; ``controls``: the positive control's step
    ratios (exact attention's own arithmetic: how far wall times stray from 1)."""
    noise = f" (the positive control, exact's own arithmetic, reads {', '.join(controls)})"
    return (
        "**Does RPKA pay at long range?** Cost not decided: this study has no timing file "
        "(`python -m rpka steptime`: one thread, CPU time, arms interleaved), and its "
        f"training wall-time step ratios moved with machine load{noise if controls else ''}, "
        f"so they are a record only. Non-inferior (gap recovered above {margin}): "
        f"{', '.join(good) or 'no RPKA rank'}."
    )
