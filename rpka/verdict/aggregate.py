"""Aggregate statistics across tracks, after rliable (Agarwal et al. 2021, "Deep RL at the
edge of the statistical precipice"): an aggregate *view*; the per-track decision rule
(:mod:`rpka.verdict.decision`, :mod:`rpka.verdict.frontier`) is what decides.

The estimators are rliable's published definitions, written here with numpy and scipy
because ``rliable`` itself cannot be installed beside this project: ``rliable==1.2.0``
needs ``arch<8``; ``arch`` 7.2 fails to import under pandas 3 (``deprecate_kwarg() missing
1 required positional argument``) and ``arch`` 8 drops the ``random_state`` argument
rliable passes to its bootstrap. So:

* **probability of improvement** P(X > Y): per task (track), the mean over every pair of
  runs (x, y) of ``1(x better than y) + 0.5 * 1(x = y)`` (the normalised Mann-Whitney U),
  averaged over the tasks. It compares runs on each track's own metric, oriented so that
  better is larger (a rank statistic: no normalisation across tracks is needed);
* **IQM**: ``scipy.stats.trim_mean(scores, 0.25)`` over all runs of all tasks together,
  here of the gap recovered (:func:`rpka.verdict.frontier.per_seed_gap`: 1 = exact's score, 0 =
  the no-attention control's);
* **stratified bootstrap**: seeds drawn with replacement within each task (a stratum),
  the statistic recomputed, ``n_resamples`` times; the 95 % interval is the percentile
  interval of the resampled statistics; a fixed ``seed`` makes it reproduce. The arms of
  a track were trained on the same seeds, so one draw of seeds serves every arm of the
  task (the pairing by seed is kept; rliable draws each algorithm's runs independently,
  having no pairing to keep). A track whose arms do not share their seed list is an error.

Which tracks: those whose attention gate passed (``study.json``; a long-range length
when both its gates passed, named ``longrange-<n>``): the frontier's tracks
(:func:`rpka.study.index.write_study_index`). :func:`study_aggregate` gives every number the
report's aggregate table shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from rpka.io import read_json
from rpka.verdict.decision import MARGIN_GAP
from rpka.verdict.frontier import PIVOTING_PEERS, control_arm_of, per_seed_gap

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0
IQM_TRIM = 0.25  # trimmed from each end: the interquartile mean
STUDY_FILE = "study.json"
LONGRANGE_TRACK = "longrange-{context}"  # as rpka.study.steps names a long-range length
PROFILE_STEP = 0.01  # the spacing of the thresholds tau a performance profile is read at
PRIMARY_LABEL = "RPKA, each track's primary arm"

Statistic = Callable[[list[np.ndarray]], np.ndarray]


def oriented(scores: Sequence[float] | np.ndarray, direction: str) -> np.ndarray:
    """Scores with better larger: ``-scores`` for a lower-is-better metric, (...) -> (...)."""
    if direction not in ("lower", "higher"):
        raise ValueError(f"direction must be 'lower' or 'higher', got {direction!r}")
    x = np.asarray(scores, dtype=float)
    return -x if direction == "lower" else x


def task_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + P(X = Y) / 2 over all pairs of runs of one task: x (..., m), y (..., n)
    (better larger) -> (...). The leading axes (bootstrap resamples) broadcast."""
    diff = np.asarray(x, dtype=float)[..., :, None] - np.asarray(y, dtype=float)[..., None, :]
    return ((diff > 0) + 0.5 * (diff == 0)).mean(axis=(-2, -1))


def probability_of_improvement(strata: Sequence[np.ndarray]) -> np.ndarray:
    """rliable's probability of improvement: :func:`task_improvement` of row 0 (X) over
    row 1 (Y) per task, averaged over the tasks. Each stratum (2, ..., n_t) -> (...)."""
    return np.mean([task_improvement(s[0], s[1]) for s in strata], axis=0)


def iqm(strata: Sequence[np.ndarray]) -> np.ndarray:
    """Interquartile mean of every run of every task together (rliable's IQM):
    ``trim_mean(..., 0.25)`` of row 0 of the strata (1, ..., n_t), concatenated -> (...)."""
    pooled = np.concatenate([np.asarray(s, dtype=float)[0] for s in strata], axis=-1)
    return np.asarray(stats.trim_mean(pooled, IQM_TRIM, axis=-1))


def score_distribution(strata: Sequence[np.ndarray], taus: np.ndarray) -> np.ndarray:
    """rliable's performance profile (its ``run_score_deviation``): the fraction of runs
    whose score exceeds tau (strictly), for each tau, with each task weighted equally (the
    fraction within each task, averaged over the tasks; with as many runs in every task,
    rliable's fraction of the pooled runs). Row 0 of each stratum (1, ..., n_t) -> (..., m)
    for the m thresholds ``taus``."""
    taus = np.asarray(taus, dtype=float)
    per_task = [(np.asarray(s, dtype=float)[0][..., :, None] > taus).mean(axis=-2)
                for s in strata]  # fmt: skip
    return np.mean(per_task, axis=0)


def stratified_bootstrap(
    strata: Sequence[np.ndarray],
    statistic: Statistic,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> dict[str, Any]:
    """The point estimate and its stratified-bootstrap percentile interval.

    ``strata``: one array (k, n_t) per task, k score rows (arms) over the task's n_t seeds.
    Each resample draws n_t seed columns with replacement within each task, the same
    columns for the k rows. ``statistic`` maps a list of (k, ..., n_t) arrays to (...);
    it is called once on the data and once on all (k, n_resamples, n_t) resamples.
    Returns ``estimate``, ``ci_low``, ``ci_high`` and the settings that reproduce them.
    """
    estimate, low, high = _percentile_band(strata, statistic, n_resamples, confidence, seed)
    return {"estimate": float(estimate), "ci_low": float(low), "ci_high": float(high),
            "confidence": confidence, "n_resamples": n_resamples, "seed": seed}  # fmt: skip


def _percentile_band(
    strata: Sequence[np.ndarray],
    statistic: Statistic,
    n_resamples: int,
    confidence: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``statistic`` on the strata and its stratified-bootstrap percentile band, taken
    over the resamples (the statistic's first axis on the resampled strata)."""
    data, resampled = _resample(strata, n_resamples, confidence, seed)
    boot = np.asarray(statistic(resampled), dtype=float)
    tail = (1 - confidence) / 2
    low, high = np.quantile(boot, [tail, 1 - tail], axis=0)
    return np.asarray(statistic(data), dtype=float), low, high


def _resample(
    strata: Sequence[np.ndarray], n_resamples: int, confidence: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The strata as (k, n_t) arrays and their resamples, (k, n_resamples, n_t) each: n_t
    seed columns drawn with replacement within each task, the same for the k rows."""
    if not strata:
        raise ValueError("no task to aggregate")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    data = [np.atleast_2d(np.asarray(s, dtype=float)) for s in strata]
    rng = np.random.default_rng(seed)
    resampled = []
    for s in data:
        idx = rng.integers(0, s.shape[-1], size=(n_resamples, s.shape[-1]))
        resampled.append(s[:, idx])  # (k, n_resamples, n_t)
    return data, resampled


def stratified_bootstrap_curve(
    strata: Sequence[np.ndarray],
    statistic: Statistic,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> dict[str, Any]:
    """:func:`stratified_bootstrap` of a statistic with a last axis (a curve, e.g. a
    performance profile over its thresholds): ``statistic`` maps the strata to (..., m);
    the percentile band is taken at each of the m points. Returns lists ``estimate``,
    ``ci_low``, ``ci_high`` (m each) and the settings. The same ``seed`` and strata shapes
    draw the same seeds, so curves of arms trained on the same seeds stay paired."""
    estimate, low, high = _percentile_band(strata, statistic, n_resamples, confidence, seed)
    return {"estimate": estimate.tolist(), "ci_low": low.tolist(), "ci_high": high.tolist(),
            "confidence": confidence, "n_resamples": n_resamples, "seed": seed}  # fmt: skip


def paired_scores(report: Mapping[str, Any], track: str, arms: Sequence[str]) -> np.ndarray:
    """The ``full`` per-seed scores of ``arms`` of one bench report, (len(arms), n_seeds),
    as the report stores them (not oriented). Raises ValueError naming ``track`` when the
    arms' seed lists differ, or a score is missing or not finite."""
    seeds = None
    rows = []
    for name in arms:
        arm = report["arms"][name]
        arm_seeds = list(arm.get("seeds") or [])
        values = arm["full"]["per_seed"]
        if len(values) != len(arm_seeds):
            raise ValueError(
                f"track {track!r}: arm {name!r} has {len(values)} scores for {len(arm_seeds)} seeds"
            )
        if seeds is None:
            seeds, first = arm_seeds, name
        elif arm_seeds != seeds:
            raise ValueError(
                f"track {track!r}: arms {first!r} and {name!r} do not share their seeds "
                f"({seeds} against {arm_seeds}); the stratified bootstrap resamples seeds"
            )
        row = np.array([np.nan if v is None else v for v in values], dtype=float)
        if not np.isfinite(row).all():
            raise ValueError(f"track {track!r}: arm {name!r} has a missing or non-finite score")
        rows.append(row)
    return np.stack(rows)


def gated_tracks(study: Mapping[str, Any], index_dir: str | Path) -> dict[str, Path]:
    """The bench report of each track whose attention gate passed (track -> path), then
    each long-range length whose two gates passed (``longrange-<n>``): the tracks of
    ``frontier.json``. Paths in ``study.json`` are relative to ``index_dir``."""
    index_dir = Path(index_dir)
    out = {
        name: index_dir / entry["bench_report"]
        for name, entry in study.get("tracks", {}).items()
        if (entry.get("attention_gate") or {}).get("passed")
    }
    contexts = (study.get("longrange") or {}).get("contexts") or {}
    for context, entry in sorted(contexts.items(), key=lambda kv: int(kv[0])):
        if entry.get("gate_passed"):
            out[LONGRANGE_TRACK.format(context=context)] = index_dir / entry["bench_report"]
    return out


def _rpka_arms(report: Mapping[str, Any]) -> list[str]:
    return [n for n, a in report["arms"].items() if a.get("method") == "rpka"]


def _improvement_row(
    label: str, tasks: list[tuple[str, np.ndarray]], direction_of: Mapping[str, str], **kw: Any
) -> dict[str, Any]:
    strata = [oriented(s, direction_of[t]) for t, s in tasks]
    return {
        "comparison": label,
        "tracks": [t for t, _ in tasks],
        "n_runs": [int(s.shape[-1]) for _, s in tasks],
        **stratified_bootstrap(strata, probability_of_improvement, **kw),
    }


def exact_vs_rpka(reports: Mapping[str, Mapping[str, Any]], **kw: Any) -> list[dict[str, Any]]:
    """P(exact better than an RPKA arm) on the tracks it ran on: first the primary arm of
    each track (``"primary"``), then each RPKA arm by name, in rank order. ``kw`` goes to
    :func:`stratified_bootstrap`. One dict per row: ``comparison``, ``tracks``,
    ``n_runs`` (seeds per track), ``estimate``, ``ci_low``, ``ci_high``, settings."""
    direction = {t: r["metric_direction"] for t, r in reports.items()}
    rows = [_improvement_row(
        "exact vs RPKA (each track's primary arm)",
        [(t, paired_scores(r, t, [r["baseline_arm"], r["primary_arm"]]))
         for t, r in reports.items()],
        direction, **kw,
    )]  # fmt: skip
    names = {n: r["arms"][n].get("rank") or 0 for r in reports.values() for n in _rpka_arms(r)}
    for name in sorted(names, key=lambda n: (names[n], n)):
        tasks = [(t, paired_scores(r, t, [r["baseline_arm"], name]))
                 for t, r in reports.items() if name in r["arms"]]  # fmt: skip
        rows.append(_improvement_row(f"exact vs {name}", tasks, direction, **kw))
    return rows


def peer_pairs(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, list[tuple[str, str, str]]]:
    """Per peer method that trained on some track: (track, ``rpka-r<rank>``, the peer's arm)
    for every track and rank where both trained (the plain RPKA arm, not a variant)."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for peer in PIVOTING_PEERS:
        for track, report in reports.items():
            arms = report["arms"]
            for other, arm in arms.items():
                name = f"rpka-r{arm.get('rank')}"  # the plain arm, not a variant (-keys, ...)
                if arm.get("method") == peer and name in arms:
                    out.setdefault(peer, []).append((track, name, other))
    return out


def rpka_vs_peers(reports: Mapping[str, Mapping[str, Any]], **kw: Any) -> list[dict[str, Any]]:
    """P(RPKA better than uniform landmarks / the keys coreset) over every track and rank
    where both trained at the same rank (one stratum per such pair: the peer's arm against
    ``rpka-r<rank>``, not an RPKA variant, :func:`peer_pairs`); a peer trained on no track
    gives no row. Rows as :func:`exact_vs_rpka`'s, with ``pairs`` (RPKA arm, peer)."""
    rows = []
    for peer, pairs in peer_pairs(reports).items():
        tasks = [(t, paired_scores(reports[t], t, [name, other])) for t, name, other in pairs]
        direction = {t: reports[t]["metric_direction"] for t, _, _ in pairs}
        row = _improvement_row(f"RPKA vs {peer}", tasks, direction, **kw)
        rows.append({**row, "pairs": [(name, other) for _, name, other in pairs]})
    return rows


def track_gap(report: Mapping[str, Any], track: str, arm: str) -> np.ndarray:
    """``arm``'s gap recovered per seed on one track, (n_seeds,): 1 = exact, 0 = the
    no-attention control (:func:`rpka.verdict.frontier.per_seed_gap`). A seed with no gap (the
    control did not lose there) is an error naming the track."""
    arms = [control_arm_of(report), report["baseline_arm"], arm]
    control, exact, scores = paired_scores(report, track, arms)
    g = per_seed_gap(control, exact, scores, report["metric_direction"])
    if np.isnan(g).any():
        raise ValueError(f"track {track!r}: the control does not lose on every seed, "
                         "so the gap recovered is undefined")  # fmt: skip
    return g


def primary_gap_iqm(reports: Mapping[str, Mapping[str, Any]], **kw: Any) -> dict[str, Any]:
    """IQM across tracks of the primary RPKA arm's gap recovered per seed (1 = exact,
    0 = the no-attention control: :func:`rpka.verdict.frontier.per_seed_gap`), with its
    stratified-bootstrap interval; ``per_track`` gives each track's arm and per-seed g.
    A seed with no gap (the control did not lose there) is an error naming the track."""
    strata, per_track = [], {}
    for track, report in reports.items():
        g = track_gap(report, track, report["primary_arm"])
        strata.append(g[None, :])
        per_track[track] = {"arm": report["primary_arm"], "per_seed": [float(x) for x in g]}
    return {
        "comparison": "IQM of the primary RPKA arm's gap recovered",
        "tracks": list(per_track),
        "n_runs": [len(v["per_seed"]) for v in per_track.values()],
        "per_track": per_track,
        **stratified_bootstrap(strata, iqm, **kw),
    }


def tau_grid(gaps: Sequence[np.ndarray], step: float = PROFILE_STEP) -> np.ndarray:
    """The thresholds a profile is read at, (m,): every ``step`` from one step below the
    smallest gap (and below 0) to one step above the largest (and above 1), so each curve
    starts at 1 and ends at 0 and exact's g = 1 falls inside."""
    values = np.concatenate([np.ravel(g) for g in gaps])
    low = min(0.0, np.floor(values.min() / step) * step) - step
    high = max(1.0, np.ceil(values.max() / step) * step) + step
    return np.round(np.arange(low, high + step / 2, step), 10)


def _profile_curve(
    family: str,
    label: str,
    runs: Sequence[tuple[str, str, np.ndarray]],
    taus: np.ndarray,
    **kw: Any,
) -> dict[str, Any]:
    """One arm family's profile with its stratified-bootstrap band; ``runs``: (track, arm,
    per-seed gap) per stratum."""
    strata = [g[None, :] for _, _, g in runs]
    band = stratified_bootstrap_curve(strata, lambda s: score_distribution(s, taus), **kw)
    return {
        "family": family,
        "label": label,
        "tracks": [t for t, _, _ in runs],
        "arms": [a for _, a, _ in runs],
        "n_runs": [len(g) for _, _, g in runs],
        "profile": band["estimate"],
        "ci_low": band["ci_low"],
        "ci_high": band["ci_high"],
        **{key: band[key] for key in ("confidence", "n_resamples", "seed")},
    }


def performance_profiles(
    reports: Mapping[str, Mapping[str, Any]], step: float = PROFILE_STEP, **kw: Any
) -> dict[str, Any]:
    """rliable's performance profiles on the gap recovered: for each tau of
    :func:`tau_grid`, the fraction of runs with g > tau (:func:`score_distribution`: each
    track weighted equally), with its 95 % stratified-bootstrap band at every tau.

    Panel one: each track's primary RPKA arm, over every gated track. Then one panel per
    peer method that trained (:func:`peer_pairs`): RPKA and the peer at the same rank, on
    the tracks (and ranks) where both trained, one stratum each; the two curves draw the
    same seeds. Exact attention is g = 1 on every run by definition (its profile is 1
    below tau = 1, 0 from there on), the control g = 0. ``kw`` goes to
    :func:`stratified_bootstrap_curve`. Returns ``taus``, ``step``, ``panels`` (``title``,
    ``curves``: ``family``, ``label``, ``tracks``, ``arms``, ``n_runs``, ``profile``,
    ``ci_low``, ``ci_high``) and the bootstrap's settings."""
    primary = [(t, r["primary_arm"], track_gap(r, t, r["primary_arm"]))
               for t, r in reports.items()]  # fmt: skip
    peers = {}  # peer -> (RPKA's runs, the peer's runs), stratum by stratum
    for peer, pairs in peer_pairs(reports).items():
        rpka = [(t, name, track_gap(reports[t], t, name)) for t, name, _ in pairs]
        other = [(t, arm, track_gap(reports[t], t, arm)) for t, _, arm in pairs]
        peers[peer] = (rpka, other)
    every = [g for _, _, g in primary]
    every += [g for runs in peers.values() for side in runs for _, _, g in side]
    taus = tau_grid(every)
    panels = [{
        "title": "every gated track",
        "curves": [_profile_curve("rpka", PRIMARY_LABEL, primary, taus, **kw)],
    }]  # fmt: skip
    for peer, (rpka, other) in peers.items():
        ranked = [f"{t} r{reports[t]['arms'][a]['rank']}" for t, a, _ in other]
        primaries = all(a == reports[t]["primary_arm"] for t, a, _ in rpka)
        label = PRIMARY_LABEL if primaries else "RPKA at the peer's rank"
        panels.append({
            "title": f"against {peer}: {', '.join(ranked)}",
            "curves": [_profile_curve("rpka", label, rpka, taus, **kw),
                       _profile_curve(peer, f"{peer} at RPKA's rank", other, taus, **kw)],
        })  # fmt: skip
    first = panels[0]["curves"][0]
    return {
        "taus": [float(x) for x in taus],
        "step": step,
        "panels": panels,
        **{key: first[key] for key in ("confidence", "n_resamples", "seed")},
    }


def study_aggregate(results_dir: str | Path, **kw: Any) -> dict[str, Any] | None:
    """Every aggregate of a study's gated tracks from ``<results_dir>/study.json`` and
    the bench reports it names: ``tracks``, ``exact_vs_rpka``, ``rpka_vs_peers``,
    ``primary_gap_iqm``. None without a study index or a gated track."""
    path = Path(results_dir) / STUDY_FILE
    if not path.exists():
        return None
    reports = {t: read_json(p) for t, p in gated_tracks(read_json(path), results_dir).items()}
    if not reports:
        return None
    return {
        "tracks": list(reports),
        "exact_vs_rpka": exact_vs_rpka(reports, **kw),
        "rpka_vs_peers": rpka_vs_peers(reports, **kw),
        "primary_gap_iqm": primary_gap_iqm(reports, **kw),
        "performance_profiles": performance_profiles(reports, **kw),
    }


def aggregate_lines(aggregate: Mapping[str, Any]) -> list[str]:
    """One plain line per aggregate, then per profile curve its value at a few
    thresholds, for a terminal (``python -m rpka.verdict.aggregate``)."""
    rows = [*aggregate["exact_vs_rpka"], *aggregate["rpka_vs_peers"], aggregate["primary_gap_iqm"]]
    lines = [
        f"{r['comparison']}: {r['estimate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] "
        f"over {', '.join(f'{t} ({n})' for t, n in zip(r['tracks'], r['n_runs'], strict=True))}"
        for r in rows
    ]
    profiles = aggregate.get("performance_profiles")
    if profiles:
        taus = np.asarray(profiles["taus"])
        at = [int(np.argmin(np.abs(taus - tau))) for tau in (0.0, 0.5, 0.9, MARGIN_GAP, 1.0)]
        for panel in profiles["panels"]:
            for c in panel["curves"]:
                values = ", ".join(
                    f"g > {taus[i]:g}: {c['profile'][i]:.3f} "
                    f"[{c['ci_low'][i]:.3f}, {c['ci_high'][i]:.3f}]"
                    for i in at
                )
                lines.append(f"profile, {panel['title']}, {c['label']}: {values}")
    return lines


if __name__ == "__main__":  # pragma: no cover - a reader's check of the committed numbers
    import sys

    result = study_aggregate(sys.argv[1] if len(sys.argv) > 1 else "data/results/full")
    print("\n".join(aggregate_lines(result)) if result else "no gated track")
