"""The rank frontier of a track: at which rank RPKA stops losing to exact attention.

Every quality number goes on one scale, the **gap recovered** (docs/statistics.md,
section 7): per evaluation seed s,

    g_s = (control_s - arm_s) / (control_s - exact_s)      (lower is better; sign-flipped
                                                              for higher-is-better metrics)

1 = exact attention, 0 = the no-attention control (uniform attention). The rule, fixed
before the frontier runs:

* an arm is **non-inferior** when the one-sided t-test of ``mean g > margin_gap`` over the
  seeds rejects at alpha (``rpka.verdict.decision.gap_recovered``, at its ``MARGIN_GAP``:
  an approximation that gives up less than 1 - ``MARGIN_GAP`` of what attention buys over
  no attention; the raw margins of the tracks are not comparable - 0.02 MSE is 3 % of exact
  on one track and 37 % on another);
* ``r*`` is the smallest trained RPKA rank that is non-inferior; ``None`` ("not reached")
  is an allowed answer;
* the **positive control** is the arm at a rank that is exact by construction (non-causal:
  rank >= every pivoted point; causal: every block's past fits the landmark pool). It must
  read non-inferior: if it does not, the pipeline is wrong before anything else is read.

A gap needs a control that loses on every seed (``control_s - exact_s > 0``); the track's
attention gate says so, and a seed where it does not makes its g undefined (the frontier
then has no verdict for that track).

:func:`track_frontier` turns a bench report into the frontier's rows; :func:`write_frontier`
writes ``frontier.json`` for a study's gated tracks (shape in docs/bench_report.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from rpka.attention import LANDMARK_METHODS, METHOD_INFO
from rpka.config.presets_tracks import MEAN_CONTROL
from rpka.io import read_json, write_result_json
from rpka.paths import DROP_IN_FILE
from rpka.verdict.decision import MARGIN_GAP, NON_INFERIOR, gap_recovered
from rpka.verdict.robustness import arm_robustness, longrange_answer
from rpka.verdict.stats import paired_comparison
from rpka.verdict.step_cost import peak_ratio_of, step_ratio_of, with_step_timing

STEP_SOURCE_WALL = "training wall time"  # a step ratio from the runs' medians: a record only
# the methods on the frontier: those that draw landmarks (rpka.attention.METHOD_INFO)
LOW_RANK_METHODS = LANDMARK_METHODS
PIVOTING_PEERS = tuple(m for m in LANDMARK_METHODS if METHOD_INFO[m].family == "peer")
# the lengths the cost at r* is read at besides the track's own (issue 26, item 3)
COST_LENGTHS = (2048, 8192)


def per_seed_gap(
    control: Sequence[float], exact: Sequence[float], arm: Sequence[float], direction: str
) -> np.ndarray:
    """g_s = (control_s - arm_s) / (control_s - exact_s) per seed, (n_seeds,).

    ``direction`` ``"lower"`` or ``"higher"`` (is better). NaN where the control does not
    lose to exact on that seed (no gap to recover) or a value is not finite.
    """
    if direction not in ("lower", "higher"):
        raise ValueError(f"direction must be 'lower' or 'higher', got {direction!r}")
    c, e, a = (np.asarray(x, dtype=float) for x in (control, exact, arm))
    if not c.shape == e.shape == a.shape:
        raise ValueError(f"control, exact and arm must pair up: got {len(c)}, {len(e)}, {len(a)}")
    sign = 1.0 if direction == "lower" else -1.0
    gap = sign * (c - e)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = sign * (c - a) / gap
    return np.where((gap > 0) & np.isfinite(g), g, np.nan)


def probability_of_improvement(
    x: Sequence[float], y: Sequence[float], direction: str, seed: int = 0
) -> dict[str, float]:
    """P(X better than Y) + P(tie) / 2 over all pairs of runs (the normalised Mann-Whitney
    U statistic, rliable's estimator for one task), with a 95 % percentile bootstrap CI."""
    sign = 1.0 if direction == "lower" else -1.0
    a, b = -sign * np.asarray(x, dtype=float), -sign * np.asarray(y, dtype=float)

    def estimate(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        diff = a[..., :, None] - b[..., None, :]
        return ((diff > 0) + 0.5 * (diff == 0)).mean(axis=(-2, -1))

    boot = stats.bootstrap(
        (a, b), estimate, vectorized=True, paired=False, method="percentile",
        n_resamples=2000, random_state=np.random.default_rng(seed),
    )  # fmt: skip
    return {
        "prob_improvement": float(estimate(a, b)),
        "prob_ci_low": float(boot.confidence_interval.low),
        "prob_ci_high": float(boot.confidence_interval.high),
    }


def exact_by_construction(arm: Mapping[str, Any], n_points: int, causal_block: int | None) -> bool:
    """Whether an arm's rank makes its estimate exact by construction: every pivoted point
    a landmark (non-causal), or every block's past inside the pool (causal: the last block's
    past, ``n_points`` less one block of joint points)."""
    rank = arm.get("rank")
    if rank is None:
        return False
    if causal_block is None:
        return rank >= n_points
    return rank >= n_points - 2 * causal_block


def _rows(report: Mapping[str, Any], control: str, margin_gap: float) -> list[dict[str, Any]]:
    arms, direction = report["arms"], report["metric_direction"]
    exact = arms[report["baseline_arm"]]["full"]["per_seed"]
    timings = report.get("timings", {})
    ratios = timings.get("step_ratio_vs_baseline", {})
    # where the ratio was measured: a timing file (rpka.verdict.step_cost.with_step_timing)
    # or, without one, the training runs' wall times (a record, not a cost claim)
    source = timings.get("step_source") or STEP_SOURCE_WALL
    rows = []
    for name, arm in arms.items():
        if arm.get("method") not in LOW_RANK_METHODS or arm.get("rank") is None:
            continue
        g = per_seed_gap(arms[control]["full"]["per_seed"], exact, arm["full"]["per_seed"],
                         direction)  # fmt: skip
        gap = gap_recovered(g, margin_gap)
        # the points its landmarks are drawn from: [Q~; K~] (2n), or the keys (n)
        n_points = int(arm.get("pivot_points") or arm["attention_tokens"])
        rows.append({
            "arm": name, "method": arm["method"], "rank": int(arm["rank"]),
            "rank_over_n": arm["rank"] / n_points, "n_points": n_points,
            "gap_recovered": {k: gap[k] for k in ("mean", "ci_low", "ci_high", "per_seed")},
            "p_non_inferior": gap["p_value"], "verdict": gap["verdict"],
            "step_ratio": ratios.get(name), "step_source": source,
        })  # fmt: skip
    return sorted(rows, key=_row_order)


def _row_order(row: Mapping[str, Any]) -> tuple[bool, str, int]:
    """RPKA's rows first, then the peers', each by rank."""
    return row["method"] != "rpka", row["method"], row["rank"]


def _pivoting(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """RPKA against uniform landmarks and the keys coreset at each rank both ran."""
    arms, direction = report["arms"], report["metric_direction"]
    by_rank = {(a["method"], a.get("rank")): n for n, a in arms.items() if a.get("method")}
    out = []
    for (method, rank), name in sorted(by_rank.items(), key=lambda kv: str(kv[0])):
        if method != "rpka":
            continue
        for peer in PIVOTING_PEERS:
            other = by_rank.get((peer, rank))
            if other is None:
                continue
            x, y = arms[name]["full"]["per_seed"], arms[other]["full"]["per_seed"]
            c = paired_comparison(y, x, direction)  # the bench's paired t CI and sign-flip p
            out.append({
                "rank": int(rank), "arm": name, "versus": other,
                "delta": c["delta_mean"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                "p_value": c["p_value"], **probability_of_improvement(x, y, direction),
            })  # fmt: skip
    return out


def causal_block_of(report: Mapping[str, Any]) -> int | None:
    """The causal block length of a report's RPKA arms (their ``causal_block`` option, set
    on the causal tracks only), or None for a non-causal track."""
    blocks = {
        arm["options"]["causal_block"]
        for arm in report["arms"].values()
        if arm.get("method") == "rpka" and "causal_block" in (arm.get("options") or {})
    }
    if len(blocks) > 1:
        raise ValueError(f"the RPKA arms of one track use several causal blocks: {sorted(blocks)}")
    return blocks.pop() if blocks else None


def control_arm_of(report: Mapping[str, Any]) -> str:
    """The no-attention control a bench report's gap is measured from: its attention gate's
    control arm (the presets' ``MEAN_CONTROL`` for a report without one)."""
    return report.get("attention_gate", {}).get("control_arm") or MEAN_CONTROL.name


def track_frontier(report: Mapping[str, Any], margin_gap: float = MARGIN_GAP) -> dict[str, Any]:
    """The frontier of one bench report: rows per low-rank arm, r*, the positive control
    (its exact-by-construction rank from the arms' causal block, :func:`causal_block_of`),
    the pivoting comparisons."""
    causal_block = causal_block_of(report)
    control = control_arm_of(report)
    if control not in report["arms"]:
        raise ValueError(f"the bench report has no control arm {control!r}: no gap to recover")
    rows = _rows(report, control, margin_gap)
    rpka = [r for r in rows if r["method"] == "rpka"]
    controls = [r for r in rpka if exact_by_construction(r, r["n_points"], causal_block)]
    below = [r for r in rpka if r not in controls and r["verdict"] == NON_INFERIOR]
    positive = min(controls, key=lambda r: r["rank"]) if controls else None
    return {
        "metric": report["metric"],
        "causal_block": causal_block,
        "n_points": rpka[0]["n_points"] if rpka else None,
        "margin_gap": margin_gap,
        "control_arm": control,
        "r_star": min((r["rank"] for r in below), default=None),
        "positive_control": None
        if positive is None
        else {
            "arm": positive["arm"],
            "rank": positive["rank"],
            "verdict": positive["verdict"],
        },  # fmt: skip
        "rows": rows,
        "pivoting": _pivoting(report),
    }


def add_positive_control(entry: dict[str, Any], report: Mapping[str, Any]) -> None:
    """Add to a track's frontier ``entry`` the positive control trained in a bench of its
    own (``report``: the same seeds, with its own exact and control arms, so its gap is
    paired within that bench): its row joins ``entry["rows"]`` and it becomes the track's
    ``positive_control``. r* is left as it is (a positive control is never r*)."""
    own = track_frontier(report)
    control = own["positive_control"]
    if control is None:
        raise ValueError("the positive-control bench has no RPKA arm exact by construction")
    rows = [r for r in entry["rows"] if r["arm"] != control["arm"]]
    entry["rows"] = sorted(rows + [r for r in own["rows"] if r["arm"] == control["arm"]],
                           key=_row_order)  # fmt: skip
    entry["positive_control"] = control


def drop_in_curve(
    report: Mapping[str, Any], drop_in: Mapping[str, Any], n_points: int
) -> list[dict[str, Any]]:
    """The drop-in curve: exact's trained model with another method swapped in at each
    rank, no retraining (``rpka.study.dropin``, float32), as the gap recovered per member
    against the bench's control on the same seed - the curve the trained arms sample.

    One row per (method, rank): ``rank_over_n`` (of the track's ``n_points``), the mean g
    and its per-member values. A rank at which the method is exact is left out (the
    positive control's place is the trained arm's).
    """
    control = report["arms"][control_arm_of(report)]
    by_seed = dict(zip(control["seeds"], control["full"]["per_seed"], strict=True))
    members = drop_in["members"]
    if any(seed not in by_seed for seed in members):
        raise ValueError(f"drop-in members {members} are not all seeds of the control arm")
    control_scores = [by_seed[seed] for seed in members]
    exact = drop_in["exact"]["float32"]
    rows = []
    for row in drop_in["rows"]:
        if row["dtype"] != "float32" or row.get("full_rank"):
            continue
        g = per_seed_gap(control_scores, exact, row[drop_in["metric"]],
                         report["metric_direction"])  # fmt: skip
        rows.append({
            "method": row["method"], "rank": int(row["rank"]),
            "rank_over_n": row["rank"] / n_points,
            "gap_recovered": float(np.nanmean(g)) if np.isfinite(g).any() else None,
            "per_member": [None if not np.isfinite(x) else float(x) for x in g],
        })  # fmt: skip
    return sorted(rows, key=lambda r: (r["method"], r["rank"]))


def forward_speedup(row: Mapping[str, Any]) -> float | None:
    """Exact's forward time over the row's, from a latency sweep's row: the interleaved CPU
    time where the sweep has it (one-thread CPU time is the project's cost measure), the
    wall time of older sweeps (and GPUs) otherwise."""
    return row.get("speedup_cpu_vs_exact") or row.get("speedup_vs_exact")


def cost_at_lengths(
    scaling: Mapping[str, Any], rank: int, lengths: Sequence[int] = COST_LENGTHS
) -> dict[str, Any]:
    """What RPKA at ``rank`` costs against exact attention at ``lengths`` tokens, read
    from a latency sweep (``rpka.speed.scaling``'s JSON: one attention call, non-causal,
    B*H heads of ``head_dim``): per length the forward and forward+backward speed-up
    (exact's time / RPKA's: > 1 is faster) and the peak-memory ratio (RPKA's / exact's).
    A length or rank the sweep did not measure reads ``None`` - never extrapolated."""
    rows = {(r["method"], r["rank"], r["n"]): r for r in scaling["rows"]}
    by_length = {}
    for n in lengths:
        row = rows.get(("rpka", rank, n))
        by_length[str(n)] = None if row is None else {
            "forward_speedup": forward_speedup(row),
            "fwd_bwd_speedup": row.get("fwd_bwd_speedup_vs_exact"),
            "memory_ratio": row.get("memory_vs_exact"),
        }  # fmt: skip
    return {"rank": rank, "device": scaling.get("device"), "shapes": scaling.get("shapes"),
            "lengths": by_length}  # fmt: skip


def cost_at_r_star(
    scaling: Mapping[str, Any], report: Mapping[str, Any], entry: Mapping[str, Any]
) -> dict[str, Any]:
    """:func:`cost_at_lengths` at a track's r* (``entry``, :func:`track_frontier`), at the
    r* arm's own length (``own_length``: its attention tokens) and at ``COST_LENGTHS``."""
    row = next(r for r in entry["rows"] if r["method"] == "rpka" and r["rank"] == entry["r_star"])
    tokens = report["arms"][row["arm"]]["attention_tokens"]
    lengths = tuple(dict.fromkeys((tokens, *COST_LENGTHS)))
    return {**cost_at_lengths(scaling, entry["r_star"], lengths), "own_length": tokens}


def mqar_curve(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """MQAR as Zoology reports it (Arora et al. 2023, Fig. 2): recall accuracy against
    rank ÷ pairs, from recall bench reports that differ in ``n_pairs``.

    One row per (bench, arm, length factor): ``pairs``, ``epochs``, ``arm``, ``method``,
    ``rank`` (None for exact and the control), ``rank_over_pairs``, ``length_factor``
    (1 and the track's ``length_factors``: the metrics ``error``, ``error_x<f>``),
    ``accuracy`` (1 - the
    mean error over the evaluation seeds) with its 95 % t interval (``ci_low``,
    ``ci_high``: the bench's interval of the error, flipped), ``n_seeds`` and
    ``learnability_met`` (the bench's bar for exact attention: a pair count where exact did
    not learn is kept but not read).
    """
    rows = []
    for report in reports:
        pairs, epochs = report["config"]["track"]["n_pairs"], report["config"]["train"]["epochs"]
        learned = (report.get("learnability") or {}).get("met")
        for name, arm in report["arms"].items():
            rank = arm.get("rank")
            for factor in (1, *report["data"]["length_factors"]):
                error = arm["full_by_metric"]["error" if factor == 1 else f"error_x{factor}"]
                rows.append({
                    "pairs": pairs, "epochs": epochs, "arm": name, "method": arm["method"],
                    "rank": rank, "rank_over_pairs": None if rank is None else rank / pairs,
                    "length_factor": factor, "accuracy": 1.0 - error["mean"],
                    "ci_low": 1.0 - error["ci_high"], "ci_high": 1.0 - error["ci_low"],
                    "n_seeds": error["n"], "learnability_met": learned,
                })  # fmt: skip
    return sorted(rows, key=lambda r: (r["length_factor"], r["method"], r["rank"] or 0,
                                       r["pairs"]))  # fmt: skip


def unread_pairs(mqar: Mapping[str, Any]) -> set[int]:
    """The pair counts of ``frontier.json``'s ``mqar`` whose exact arm missed its
    learnability bar: kept in the file, never drawn or read."""
    return {r["pairs"] for r in mqar["rows"] if r.get("learnability_met") is False}


# what a long-range row gains from rpka.verdict.robustness (issue 40)
ROBUSTNESS_KEYS = ("robust", "rests_on_seeds", "ci_low_one_sided", "loo_ci_low_min",
                   "loo_ci_low_max", "p_primary", "loo_p_min", "loo_p_max", "signflip_ci",
                   "decided_by")  # fmt: skip


@dataclass(frozen=True)
class LongRangeTiming:
    """A long-range length's timing: its context, its study's ``steptime.json`` (None: not
    timed) and that file's name as the index shows it."""

    context: int
    timing: Mapping[str, Any] | None
    timing_file: str | None


def add_robustness(
    entry: dict[str, Any], report: Mapping[str, Any], timing: LongRangeTiming
) -> None:
    """Each row of a long-range length's frontier ``entry`` gains its leave-one-seed-out
    robustness (:data:`ROBUSTNESS_KEYS`, ``rpka.verdict.robustness.arm_robustness`` on the gap
    and on arm - exact per seed), ``step_ratio_cpu`` and ``peak_ratio_step`` (a step's peak
    memory over exact's) from the timing file and its name (where the length was timed,
    ``step_ratio`` is that file's mean too: no row keeps a ratio of training wall times beside
    it). A row from another bench (a positive control trained on its own) gets ``robust`` None."""
    arms = report["arms"]
    base = arms[report["baseline_arm"]]
    exact, seeds = base["full"]["per_seed"], base["seeds"]

    def decide(g: np.ndarray) -> dict[str, Any]:
        return gap_recovered(g, entry["margin_gap"])

    for row in entry["rows"]:
        arm = arms.get(row["arm"])
        if arm is None or arm["seeds"] != seeds:
            row.update({key: None for key in ROBUSTNESS_KEYS})
        else:
            diffs = [None if a is None or e is None else a - e
                     for a, e in zip(arm["full"]["per_seed"], exact, strict=True)]  # fmt: skip
            found = arm_robustness(row["gap_recovered"]["per_seed"], diffs, seeds, decide)
            row.update({key: found[key] for key in ROBUSTNESS_KEYS})
        row["step_ratio_cpu"] = step_ratio_of(timing.timing, str(timing.context), row["arm"])
        row["peak_ratio_step"] = peak_ratio_of(
            timing.timing, str(timing.context), row["arm"], report["baseline_arm"]
        )
        row["timing_file"] = timing.timing_file
        if row["step_ratio_cpu"] is not None:  # the timing file is the one source of a cost
            row["step_ratio"] = row["step_ratio_cpu"]["mean"]  # ratio; wall times: run files
            row["step_source"] = timing.timing_file


def write_frontier(
    reports: Mapping[str, Path],
    out: Path,
    scaling: Mapping[str, Any] | None = None,
    mqar: Sequence[Path] = (),
    positive_controls: Mapping[str, Path] | None = None,
    longrange: Mapping[str, LongRangeTiming] | None = None,
    longrange_pending: Sequence[int] = (),
    step_timing: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``frontier.json`` at ``out`` from the bench reports of the gated tracks
    (track -> path); with a ``drop_in.json`` beside a report, its drop-in curve
    (:func:`drop_in_curve`); with a latency sweep ``scaling``, each track's
    ``r_star_cost`` (:func:`cost_at_lengths` at r*, at the track's own length and at
    ``COST_LENGTHS``; null where r* is not reached); with
    recall bench reports of several pair counts ``mqar``, the key ``mqar``
    (:func:`mqar_curve`); with ``positive_controls`` (track -> the report of a bench that
    trained only its positive control), that control (:func:`add_positive_control`); with
    ``longrange`` (track -> :class:`LongRangeTiming`), those tracks' rows gain their
    robustness and CPU step ratios (:func:`add_robustness`) and the result the study's
    answer, ``longrange_answer`` (``rpka.verdict.robustness.longrange_answer``; its lengths
    not all in yet: ``longrange_pending``). With ``step_timing`` (the study's
    ``steptime_tracks.json``) each timed track's step ratios come from it
    (``rpka.verdict.step_cost.with_step_timing``), not from its training wall times."""
    tracks = {}
    for track, path in reports.items():
        report = with_step_timing(read_json(path), step_timing)
        tracks[track] = track_frontier(report)
        if track in (positive_controls or {}):
            add_positive_control(tracks[track], read_json(positive_controls[track]))
        r_star = tracks[track]["r_star"]
        if scaling is not None:
            tracks[track]["r_star_cost"] = (
                None if r_star is None else cost_at_r_star(scaling, report, tracks[track])
            )
        drop_in = Path(path).parent / DROP_IN_FILE
        if drop_in.exists() and tracks[track]["n_points"]:
            tracks[track]["drop_in"] = drop_in_curve(
                report, read_json(drop_in), tracks[track]["n_points"]
            )
        if track in (longrange or {}):
            add_robustness(tracks[track], report, longrange[track])
    result = {"what": __doc__.split("\n\n")[0], "tracks": tracks}
    if longrange:
        lengths = {t.context: tracks[name] for name, t in longrange.items() if name in tracks}
        result["longrange_answer"] = longrange_answer(lengths, longrange_pending)
        result["longrange_answer"]["untimed_lengths"] = sorted(
            t.context for name, t in longrange.items() if name in tracks and t.timing is None
        )
    if mqar:
        result["mqar"] = {"benches": [os.path.relpath(p, Path(out).parent) for p in mqar],
                          "rows": mqar_curve([read_json(p) for p in mqar])}  # fmt: skip
    write_result_json(out, result)
    return result
