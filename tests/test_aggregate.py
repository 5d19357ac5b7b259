"""Aggregate statistics across tracks (rpka.verdict.aggregate, rliable's definitions) against
references computed here: a brute-force double loop, scipy's trim_mean, scipy's own
bootstrap on one stratum, and hand-made bench reports."""

import numpy as np
import pytest
from scipy import stats

from rpka.io import write_json
from rpka.verdict.aggregate import (
    PRIMARY_LABEL,
    exact_vs_rpka,
    gated_tracks,
    iqm,
    oriented,
    paired_scores,
    performance_profiles,
    primary_gap_iqm,
    probability_of_improvement,
    rpka_vs_peers,
    score_distribution,
    stratified_bootstrap,
    stratified_bootstrap_curve,
    study_aggregate,
    tau_grid,
)

SEEDS = [100, 101, 102, 103, 104]


def _brute_poi(xs, ys):
    """P(X > Y) + P(X = Y) / 2 by a double loop per task, averaged over tasks."""
    per_task = []
    for x, y in zip(xs, ys, strict=True):
        total = 0.0
        for a in x:
            for b in y:
                total += 1.0 if a > b else 0.5 if a == b else 0.0
        per_task.append(total / (len(x) * len(y)))
    return sum(per_task) / len(per_task)


def test_probability_of_improvement_equals_a_brute_force_double_loop():
    xs = [[3.0, 1.0, 2.0, 2.0], [0.5, 0.7, 0.7], [5.0, 5.0]]
    ys = [[2.0, 2.0, 0.0, 4.0], [0.7, 0.1, 0.9], [5.0, 6.0]]  # ties in every task
    strata = [np.array([x, y]) for x, y in zip(xs, ys, strict=True)]
    assert probability_of_improvement(strata) == pytest.approx(_brute_poi(xs, ys))
    # X against itself: one half; reversed: the complement
    assert probability_of_improvement([np.array([x, x]) for x in xs]) == pytest.approx(0.5)
    reverse = [s[::-1] for s in strata]
    assert probability_of_improvement(reverse) == pytest.approx(1 - _brute_poi(xs, ys))


def test_oriented_makes_lower_is_better_larger():
    assert list(oriented([1.0, 2.0], "lower")) == [-1.0, -2.0]
    assert list(oriented([1.0, 2.0], "higher")) == [1.0, 2.0]
    with pytest.raises(ValueError, match="direction"):
        oriented([1.0], "up")


def test_iqm_is_scipys_trim_mean_over_every_run_of_every_task():
    rng = np.random.default_rng(3)
    tasks = [rng.normal(size=7), rng.normal(size=8), rng.normal(size=5)]
    pooled = np.concatenate(tasks)
    assert iqm([t[None, :] for t in tasks]) == pytest.approx(stats.trim_mean(pooled, 0.25))


def test_bootstrap_contains_the_estimate_and_reproduces_with_its_seed():
    rng = np.random.default_rng(0)
    strata = [rng.normal(size=(1, n)) for n in (6, 7, 8)]
    a = stratified_bootstrap(strata, iqm, seed=7)
    assert a["ci_low"] <= a["estimate"] <= a["ci_high"] and a["ci_low"] < a["ci_high"]
    assert a == stratified_bootstrap(strata, iqm, seed=7)
    assert a["ci_low"] != stratified_bootstrap(strata, iqm, seed=8)["ci_low"]
    poi = [rng.normal(size=(2, 6)) + [[0.5], [0.0]] for _ in range(3)]
    b = stratified_bootstrap(poi, probability_of_improvement, seed=1)
    assert b["ci_low"] <= b["estimate"] <= b["ci_high"]


def test_one_stratum_agrees_with_scipys_percentile_bootstrap():
    x = np.random.default_rng(5).normal(size=12)
    ours = stratified_bootstrap([x[None, :]], iqm, n_resamples=4000, seed=0)
    theirs = stats.bootstrap(
        (x,), lambda s, axis: stats.trim_mean(s, 0.25, axis=axis), method="percentile",
        n_resamples=4000, random_state=np.random.default_rng(1),
    ).confidence_interval  # fmt: skip
    assert ours["ci_low"] == pytest.approx(theirs.low, abs=0.1)
    assert ours["ci_high"] == pytest.approx(theirs.high, abs=0.1)


def _arm(method, scores, rank=None, seeds=SEEDS):
    return {"method": method, "rank": rank, "seeds": list(seeds),
            "full": {"per_seed": list(scores)}}  # fmt: skip


def _report(**arms):
    return {
        "metric": "mse", "metric_direction": "lower", "baseline_arm": "exact",
        "primary_arm": "rpka-r16", "attention_gate": {"control_arm": "mean-attention"},
        "arms": {
            "exact": _arm("exact", [0.0, 0.1, 0.0, 0.1, 0.0]),
            "mean-attention": _arm("mean", [1.0, 1.1, 1.0, 1.1, 1.0]),
            "rpka-r16": _arm("rpka", [0.5, 0.6, 0.5, 0.6, 0.5], 16),
            **arms,
        },
    }  # fmt: skip


def test_a_track_with_mismatched_seeds_is_an_error_naming_it():
    report = _report(**{"nystrom-uniform-r16": _arm("nystrom-uniform", [0.4] * 5, 16,
                                                    seeds=[100, 101, 102, 103, 999])})
    with pytest.raises(ValueError, match="track 'motif'.*do not share their seeds"):
        rpka_vs_peers({"motif": report})
    short = _report()
    short["arms"]["rpka-r16"]["seeds"] = SEEDS[:4]
    with pytest.raises(ValueError, match="track 'lm'"):
        exact_vs_rpka({"lm": short})
    with pytest.raises(ValueError, match="track 'lm'"):
        paired_scores(short, "lm", ["exact", "rpka-r16"])


def test_rows_on_hand_made_reports():
    peer = {"nystrom-uniform-r16": _arm("nystrom-uniform", [0.4, 0.7, 0.5, 0.7, 0.4], 16)}
    reports = {"a": _report(**peer), "b": _report()}
    rows = exact_vs_rpka(reports, n_resamples=500)
    assert rows[0]["tracks"] == ["a", "b"] and rows[0]["estimate"] == 1.0  # exact always wins
    assert [r["comparison"] for r in rows][1:] == ["exact vs rpka-r16"]
    (vs_uniform,) = rpka_vs_peers(reports, n_resamples=500)
    assert vs_uniform["tracks"] == ["a"] and vs_uniform["pairs"] == [("rpka-r16",
                                                                       "nystrom-uniform-r16")]
    x, y = reports["a"]["arms"]["rpka-r16"], peer["nystrom-uniform-r16"]
    expected = _brute_poi([[-v for v in x["full"]["per_seed"]]],
                          [[-v for v in y["full"]["per_seed"]]])  # fmt: skip
    assert vs_uniform["estimate"] == pytest.approx(expected)
    gap = primary_gap_iqm(reports, n_resamples=500)
    g = [(1.0 - 0.5) / 1.0, (1.1 - 0.6) / 1.0] * 2 + [0.5]
    assert gap["per_track"]["a"]["per_seed"] == pytest.approx(g)
    assert gap["estimate"] == pytest.approx(stats.trim_mean(g * 2, 0.25))


def test_study_aggregate_reads_the_gated_tracks_only(tmp_path):
    write_json(tmp_path / "lm" / "bench_report.json", _report())
    study = {
        "tracks": {
            "lm": {"bench_report": "lm/bench_report.json", "attention_gate": {"passed": True}},
            "forecast": {"bench_report": "nope.json", "attention_gate": {"passed": False}},
        },
        "longrange": {"contexts": {"512": {"bench_report": "lm/bench_report.json",
                                           "gate_passed": True}}},
    }  # fmt: skip
    assert list(gated_tracks(study, tmp_path)) == ["lm", "longrange-512"]
    write_json(tmp_path / "study.json", study)
    out = study_aggregate(tmp_path, n_resamples=200)
    assert out["tracks"] == ["lm", "longrange-512"] and out["rpka_vs_peers"] == []
    assert study_aggregate(tmp_path / "missing") is None


def test_the_committed_full_study_and_its_report_table():
    """The committed full study's gated tracks (data/results/full): every interval holds
    its estimate, and the frontier section shows the aggregate table under its caption."""
    from pathlib import Path

    from rpka import report

    results = Path(__file__).resolve().parents[1] / "data" / "results" / "full"
    out = report.frontier.load_aggregate(results)
    if out is None:
        pytest.skip("no committed full study here")
    rows = [*out["exact_vs_rpka"], *out["rpka_vs_peers"], out["primary_gap_iqm"]]
    assert all(r["ci_low"] <= r["estimate"] <= r["ci_high"] for r in rows)
    assert out["exact_vs_rpka"][0]["tracks"] == out["tracks"]
    table = report.frontier.aggregate_table(out)
    assert len(table) == len(rows) and not table.isna().any().any()
    caption = report.frontier.aggregate_caption(out)
    assert "the per-track rule above decides" in caption and "rliable" in caption
    text = report.frontier.aggregate_caption(out) + table.to_markdown(index=False)
    assert "<" not in text and ">" not in text  # arm names stay text


def test_the_frontier_section_shows_the_aggregate_view_after_its_table():
    from pathlib import Path

    from rpka import report
    from rpka.io import read_json

    results = Path(__file__).resolve().parents[1] / "data" / "results" / "full"
    if not (results / "frontier.json").exists():
        pytest.skip("no committed full study here")
    frontier = read_json(results / "frontier.json")
    out = report.frontier.load_aggregate(results)
    items = report.frontier.frontier_section(frontier, report.Figures(), None, aggregate=out)
    texts = [getattr(i, "data", "") or "" for i in items]
    (at,) = [i for i, t in enumerate(texts) if "An aggregate view across the gated" in t]
    table = next(i for i, t in enumerate(texts) if "gap recovered [95 % CI]" in t)
    assert table < at and "Does residual pivoting" in texts[at - 1]  # after the per-track
    assert len(items) == len(report.frontier.frontier_section(frontier, report.Figures(),
                                                              None)) + 2  # fmt: skip
    profile = items[at + 1].data  # the performance profiles right after the aggregate table
    assert "<figure" in profile and "Performance profiles of the gap recovered" in profile


# --------------------------------------------------------------------------- performance profiles


def _brute_profile(tasks, taus):
    """Per tau: the fraction of each task's runs with score > tau, averaged over tasks."""
    out = []
    for tau in taus:
        fractions = [sum(1 for g in runs if g > tau) / len(runs) for runs in tasks]
        out.append(sum(fractions) / len(fractions))
    return out


def test_score_distribution_by_hand():
    """Two tracks, 3 and 2 runs: each track weighs one half, whatever its run count; the
    inequality is strict (a run at tau does not count)."""
    tasks = [np.array([[0.2, 0.6, 1.0]]), np.array([[0.5, 0.9]])]
    taus = np.array([-0.1, 0.2, 0.5, 0.6, 0.95, 1.0])
    expected = [1.0, (2 / 3 + 1) / 2, (2 / 3 + 1 / 2) / 2, (1 / 3 + 1 / 2) / 2, (1 / 3) / 2, 0.0]
    assert score_distribution(tasks, taus) == pytest.approx(expected)


def test_score_distribution_equals_a_brute_force_loop_and_rliables_pooled_mean():
    rng = np.random.default_rng(11)
    tasks = [rng.normal(0.6, 0.4, size=n).round(2) for n in (7, 8, 5)]  # ties with the grid
    taus = np.round(np.arange(-0.5, 1.6, 0.05), 10)
    ours = score_distribution([g[None, :] for g in tasks], taus)
    assert ours == pytest.approx(_brute_profile(tasks, taus))
    # as many runs per task: rliable's run_score_deviation, the mean of (scores > tau)
    # over the (runs x tasks) matrix
    square = rng.normal(0.6, 0.4, size=(6, 3))
    rliable = [np.mean(square > tau) for tau in taus]
    assert score_distribution([c[None, :] for c in square.T], taus) == pytest.approx(rliable)


def test_the_profile_band_equals_a_brute_force_bootstrap():
    """Seeds drawn as the bootstrap draws them (one rng, task by task), each resample's
    profile by loops, the 2.5 / 97.5 % quantiles per tau."""
    rng = np.random.default_rng(4)
    tasks = [rng.normal(0.7, 0.3, size=n) for n in (6, 4)]
    taus = tau_grid(tasks, step=0.1)
    out = stratified_bootstrap_curve([g[None, :] for g in tasks],
                                     lambda s: score_distribution(s, taus),
                                     n_resamples=300, seed=5)  # fmt: skip
    draw = np.random.default_rng(5)
    idx = [draw.integers(0, len(g), size=(300, len(g))) for g in tasks]
    boot = np.array([_brute_profile([g[i[b]] for g, i in zip(tasks, idx, strict=True)], taus)
                     for b in range(300)])  # fmt: skip
    assert out["estimate"] == pytest.approx(_brute_profile(tasks, taus))
    assert out["ci_low"] == pytest.approx(list(np.quantile(boot, 0.025, axis=0)))
    assert out["ci_high"] == pytest.approx(list(np.quantile(boot, 0.975, axis=0)))
    assert all(lo <= e <= hi for lo, e, hi in zip(out["ci_low"], out["estimate"],
                                                   out["ci_high"], strict=True))  # fmt: skip
    # a one-point curve is the scalar bootstrap
    strata = [g[None, :] for g in tasks]
    one = stratified_bootstrap_curve(strata, lambda s: iqm(s)[..., None], seed=2)
    scalar = stratified_bootstrap(strata, iqm, seed=2)
    assert (one["estimate"][0], one["ci_low"][0], one["ci_high"][0]) == pytest.approx(
        (scalar["estimate"], scalar["ci_low"], scalar["ci_high"]))


def test_tau_grid_brackets_the_gaps_exact_and_the_control():
    taus = tau_grid([np.array([0.33, 0.7]), np.array([1.234])], step=0.05)
    assert taus[0] == pytest.approx(-0.05) and taus[-1] == pytest.approx(1.3)
    assert np.allclose(np.diff(taus), 0.05) and 1.0 in taus and 0.0 in taus
    assert list(tau_grid([np.array([-0.41, 0.5])], step=0.1)[:2]) == pytest.approx([-0.6, -0.5])


def test_performance_profiles_on_hand_made_reports():
    """Panel one: each track's primary arm over every track; one panel per peer with RPKA
    and the peer at the same rank, paired by seed (same draws)."""
    peer = {"nystrom-uniform-r16": _arm("nystrom-uniform", [0.4, 0.7, 0.5, 0.7, 0.4], 16)}
    reports = {"a": _report(**peer), "b": _report()}
    out = performance_profiles(reports, n_resamples=300)
    assert out["n_resamples"] == 300 and out["seed"] == 0 and out["step"] == 0.01
    first, versus = out["panels"]
    (rpka,) = first["curves"]
    assert rpka["label"] == PRIMARY_LABEL and rpka["tracks"] == ["a", "b"]
    g = {"a": primary_gap_iqm(reports)["per_track"]["a"]["per_seed"]}
    g["b"] = g["a"]
    assert rpka["profile"] == pytest.approx(_brute_profile([g["a"], g["b"]], out["taus"]))
    assert versus["title"] == "against nystrom-uniform: a r16"
    mine, theirs = versus["curves"]
    assert mine["arms"] == ["rpka-r16"] and theirs["arms"] == ["nystrom-uniform-r16"]
    control, exact = 1.0 + np.array([0, 0.1, 0, 0.1, 0]), np.array([0, 0.1, 0, 0.1, 0])
    g_peer = (control - np.array([0.4, 0.7, 0.5, 0.7, 0.4])) / (control - exact)
    assert theirs["profile"] == pytest.approx(_brute_profile([g_peer], out["taus"]))
    # the same seeds drawn for both: a peer identical to RPKA has RPKA's band
    twin = {"nystrom-uniform-r16": _arm("nystrom-uniform", [0.5, 0.6, 0.5, 0.6, 0.5], 16)}
    same = performance_profiles({"a": _report(**twin)}, n_resamples=300)["panels"][1]["curves"]
    assert same[0]["ci_low"] == same[1]["ci_low"] and same[0]["ci_high"] == same[1]["ci_high"]
    assert performance_profiles({"b": _report()}, n_resamples=50)["panels"][1:] == []


def test_the_committed_full_studys_profiles():
    """Every curve starts at 1 and ends at 0 on its grid, sits inside its band, and the
    first curve is the primary arms' per-seed gaps of the IQM row, counted."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "data" / "results" / "full"
    out = study_aggregate(results) if (results / "study.json").exists() else None
    if out is None:
        pytest.skip("no committed full study here")
    profiles = out["performance_profiles"]
    taus = profiles["taus"]
    for panel in profiles["panels"]:
        for c in panel["curves"]:
            assert c["profile"][0] == 1.0 and c["profile"][-1] == 0.0
            assert all(lo <= e <= hi for lo, e, hi in zip(c["ci_low"], c["profile"],
                                                           c["ci_high"], strict=True))  # fmt: skip
    per_track = out["primary_gap_iqm"]["per_track"]
    first = profiles["panels"][0]["curves"][0]
    assert first["tracks"] == list(per_track)
    expected = _brute_profile([v["per_seed"] for v in per_track.values()], taus)
    assert first["profile"] == pytest.approx(expected)


def test_the_profile_figure_labels_its_axes_and_names_every_curve(tmp_path):
    from rpka.report.figures_frontier import plot_performance_profiles

    peer = {"nystrom-uniform-r16": _arm("nystrom-uniform", [0.4, 0.7, 0.5, 0.7, 0.4], 16)}
    profiles = performance_profiles({"a": _report(**peer), "b": _report()}, n_resamples=100)
    fig = plot_performance_profiles(profiles, tmp_path)
    assert (tmp_path / "performance_profiles.png").stat().st_size > 1000
    first, second = fig.axes
    assert first.get_ylabel() == "fraction of runs with g > τ"
    assert all("threshold τ on the gap recovered g" in ax.get_xlabel() for ax in fig.axes)
    assert first.get_title() == "every gated track (10 runs)"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert PRIMARY_LABEL in labels and "nystrom-uniform at RPKA's rank" in labels
    assert "exact attention (g = 1 on every run)" in labels
    assert all(len(ax.get_lines()) <= 6 for ax in fig.axes)
