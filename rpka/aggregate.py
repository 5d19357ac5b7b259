"""Aggregate statistics across tracks, after rliable (Agarwal et al. 2021, "Deep RL at the
edge of the statistical precipice"): an aggregate *view*; the per-track decision rule
(:mod:`rpka.decision`, :mod:`rpka.frontier`) is what decides.

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
  here of the gap recovered (:func:`rpka.frontier.per_seed_gap`: 1 = exact's score, 0 =
  the no-attention control's);
* **stratified bootstrap**: seeds drawn with replacement within each task (a stratum),
  the statistic recomputed, ``n_resamples`` times; the 95 % interval is the percentile
  interval of the resampled statistics; a fixed ``seed`` makes it reproduce. The arms of
  a track were trained on the same seeds, so one draw of seeds serves every arm of the
  task (the pairing by seed is kept; rliable draws each algorithm's runs independently,
  having no pairing to keep). A track whose arms do not share their seed list is an error.

Which tracks: those whose attention gate passed (``study.json``; a long-range length
when both its gates passed, named ``longrange-<n>``): the frontier's tracks
(:func:`rpka.study_index.write_study_index`). :func:`study_aggregate` gives every number the
report's aggregate table shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from rpka.frontier import PIVOTING_PEERS, control_arm_of, per_seed_gap
from rpka.io import read_json

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0
IQM_TRIM = 0.25  # trimmed from each end: the interquartile mean
STUDY_FILE = "study.json"
LONGRANGE_TRACK = "longrange-{context}"  # as rpka.study names a long-range length

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
    boot = np.asarray(statistic(resampled), dtype=float)
    tail = (1 - confidence) / 2
    low, high = np.quantile(boot, [tail, 1 - tail])
    return {
        "estimate": float(statistic(data)),
        "ci_low": float(low),
        "ci_high": float(high),
        "confidence": confidence,
        "n_resamples": n_resamples,
        "seed": seed,
    }


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
                f"track {track!r}: arm {name!r} has {len(values)} scores for "
                f"{len(arm_seeds)} seeds"
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


def rpka_vs_peers(reports: Mapping[str, Mapping[str, Any]], **kw: Any) -> list[dict[str, Any]]:
    """P(RPKA better than uniform landmarks / the keys coreset) over every track and rank
    where both trained at the same rank (one stratum per such pair: the peer's arm against
    ``rpka-r<rank>``, not an RPKA variant); a peer trained on no track gives no row. Rows
    as :func:`exact_vs_rpka`'s, with ``pairs`` (RPKA arm, peer)."""
    direction = {}
    rows = []
    for peer in PIVOTING_PEERS:
        tasks, pairs = [], []
        for track, report in reports.items():
            arms = report["arms"]
            for other, arm in arms.items():
                name = f"rpka-r{arm.get('rank')}"  # the plain arm, not a variant (-keys, ...)
                if arm.get("method") != peer or name not in arms:
                    continue
                tasks.append((track, paired_scores(report, track, [name, other])))
                pairs.append((name, other))
                direction[track] = report["metric_direction"]
        if tasks:
            row = _improvement_row(f"RPKA vs {peer}", tasks, direction, **kw)
            rows.append({**row, "pairs": pairs})
    return rows


def primary_gap_iqm(reports: Mapping[str, Mapping[str, Any]], **kw: Any) -> dict[str, Any]:
    """IQM across tracks of the primary RPKA arm's gap recovered per seed (1 = exact,
    0 = the no-attention control: :func:`rpka.frontier.per_seed_gap`), with its
    stratified-bootstrap interval; ``per_track`` gives each track's arm and per-seed g.
    A seed with no gap (the control did not lose there) is an error naming the track."""
    strata, per_track = [], {}
    for track, report in reports.items():
        arms = [control_arm_of(report), report["baseline_arm"], report["primary_arm"]]
        control, exact, arm = paired_scores(report, track, arms)
        g = per_seed_gap(control, exact, arm, report["metric_direction"])
        if np.isnan(g).any():
            raise ValueError(f"track {track!r}: the control does not lose on every seed, "
                             "so the gap recovered is undefined")  # fmt: skip
        strata.append(g[None, :])
        per_track[track] = {"arm": report["primary_arm"], "per_seed": [float(x) for x in g]}
    return {
        "comparison": "IQM of the primary RPKA arm's gap recovered",
        "tracks": list(per_track),
        "n_runs": [len(v["per_seed"]) for v in per_track.values()],
        "per_track": per_track,
        **stratified_bootstrap(strata, iqm, **kw),
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
    }


def aggregate_lines(aggregate: Mapping[str, Any]) -> list[str]:
    """One plain line per aggregate, for a terminal (``python -m rpka.aggregate``)."""
    rows = [*aggregate["exact_vs_rpka"], *aggregate["rpka_vs_peers"], aggregate["primary_gap_iqm"]]
    return [
        f"{r['comparison']}: {r['estimate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] "
        f"over {', '.join(f'{t} ({n})' for t, n in zip(r['tracks'], r['n_runs'], strict=True))}"
        for r in rows
    ]


if __name__ == "__main__":  # pragma: no cover - a reader's check of the committed numbers
    import sys

    result = study_aggregate(sys.argv[1] if len(sys.argv) > 1 else "data/results/full")
    print("\n".join(aggregate_lines(result)) if result else "no gated track")
