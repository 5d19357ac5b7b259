"""The rank frontier (rpka.verdict.frontier): gap recovered, non-inferiority, r*, the positive
control, pivoting - against values computed here from the definitions and scipy."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from scipy import stats

from rpka.io import read_json, write_json
from rpka.paths import resolve
from rpka.report import frontier as report_frontier
from rpka.report.figures_frontier import plot_frontier
from rpka.verdict.decision import gap_recovered
from rpka.verdict.frontier import (
    add_positive_control,
    cost_at_lengths,
    drop_in_curve,
    exact_by_construction,
    mqar_curve,
    per_seed_gap,
    probability_of_improvement,
    track_frontier,
    write_frontier,
)

CONTROL = [0.80, 0.82, 0.79, 0.81, 0.80, 0.83, 0.78]
EXACT = [0.00, 0.01, 0.00, 0.00, 0.02, 0.00, 0.01]


def test_gap_is_one_at_exact_zero_at_the_control_and_flips_for_higher_is_better():
    assert np.allclose(per_seed_gap(CONTROL, EXACT, EXACT, "lower"), 1.0)
    assert np.allclose(per_seed_gap(CONTROL, EXACT, CONTROL, "lower"), 0.0)
    halfway = [(c + e) / 2 for c, e in zip(CONTROL, EXACT, strict=True)]
    assert np.allclose(per_seed_gap(CONTROL, EXACT, halfway, "lower"), 0.5)
    # accuracy (higher is better): the same arm, the same gap
    acc = [1 - x for x in halfway]
    g = per_seed_gap([1 - c for c in CONTROL], [1 - e for e in EXACT], acc, "higher")
    assert np.allclose(g, 0.5)


def test_a_seed_without_a_gap_makes_the_verdict_undefined():
    control = [*CONTROL[:-1], EXACT[-1]]  # the control ties exact on the last seed
    g = per_seed_gap(control, EXACT, EXACT, "lower")
    assert np.isnan(g[-1]) and gap_recovered(g)["verdict"] == "undefined"
    with pytest.raises(ValueError, match="direction"):
        per_seed_gap(CONTROL, EXACT, EXACT, "up")
    with pytest.raises(ValueError, match="pair up"):
        per_seed_gap(CONTROL, EXACT[:3], EXACT, "lower")


def test_non_inferiority_is_scipys_one_sided_t_test_at_the_margin():
    g = np.array([0.97, 0.99, 0.96, 0.98, 1.0, 0.97, 0.99])
    out = gap_recovered(g, 0.95)
    expected = stats.ttest_1samp(g, 0.95, alternative="greater").pvalue
    assert out["p_value"] == pytest.approx(expected) and out["verdict"] == "non-inferior"
    low, high = stats.ttest_1samp(g, 0).confidence_interval(0.95)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((low, high))
    # just above the margin on average but too noisy: not shown (the rule can fail)
    noisy = np.array([0.7, 1.2, 0.9, 1.1, 0.8, 1.05, 0.95])
    assert noisy.mean() > 0.95 and gap_recovered(noisy, 0.95)["verdict"] == "not shown"
    # identical seeds: the point decides
    assert gap_recovered(np.ones(4))["verdict"] == "non-inferior"
    assert gap_recovered(np.full(4, 0.9))["verdict"] == "not shown"


def test_probability_of_improvement_is_the_normalised_mann_whitney_u():
    x, y = [0.1, 0.2, 0.3, 0.3], [0.3, 0.4, 0.5]  # lower is better: x mostly better
    out = probability_of_improvement(x, y, "lower")
    u = stats.mannwhitneyu(-np.array(x), -np.array(y)).statistic  # counts ties as 1/2
    assert out["prob_improvement"] == pytest.approx(u / (len(x) * len(y)))
    assert out["prob_ci_low"] <= out["prob_improvement"] <= out["prob_ci_high"]
    assert probability_of_improvement(y, x, "higher")["prob_improvement"] == pytest.approx(
        out["prob_improvement"]
    )


def test_exact_by_construction_rank():
    assert exact_by_construction({"rank": 192}, 192, None)
    assert not exact_by_construction({"rank": 191}, 192, None)
    # causal, 64 tokens (128 joint points), blocks of 16: the last block's past is 96 points
    assert exact_by_construction({"rank": 96}, 128, 16)
    assert not exact_by_construction({"rank": 64}, 128, 16)
    assert not exact_by_construction({}, 128, 16)


def bench_report(arms):
    """A bench report with the keys the frontier reads; arms: name -> (method, rank, values)."""
    return {
        "metric": "error",
        "metric_direction": "lower",
        "baseline_arm": "exact",
        "attention_gate": {"control_arm": "mean-attention"},
        "timings": {
            "step_ratio_vs_baseline": {n: 1.0 + (r or 0) / 32 for n, (_, r, _) in arms.items()}
        },  # fmt: skip
        "arms": {
            name: {
                "method": method,
                "rank": rank,
                "pivot_points": 128 if method in ("rpka", "nystrom-uniform") else None,
                "options": {"rank": rank, "causal_block": 16} if method == "rpka" else {},
                "attention_tokens": 64,
                "full": {"per_seed": values},
            }
            for name, (method, rank, values) in arms.items()
        },
    }


def arm_at(gap_per_seed):
    return [c - g * (c - e) for c, e, g in zip(CONTROL, EXACT, gap_per_seed, strict=True)]


def test_track_frontier_finds_r_star_and_reads_the_positive_control(tmp_path):
    report = bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r8": ("rpka", 8, arm_at([0.5, 0.6, 0.55, 0.5, 0.52, 0.58, 0.6])),
        "rpka-r32": ("rpka", 32, arm_at([0.97, 0.99, 0.98, 0.99, 0.97, 0.98, 0.99])),
        "rpka-r96": ("rpka", 96, arm_at([1.0, 0.99, 1.0, 1.01, 1.0, 0.99, 1.0])),
        "nystrom-uniform-r32": ("nystrom-uniform", 32, arm_at([0.9] * 7)),
    })  # fmt: skip
    frontier = track_frontier(report)
    assert frontier["causal_block"] == 16
    assert frontier["r_star"] == 32 and frontier["n_points"] == 128
    assert frontier["positive_control"] == {
        "arm": "rpka-r96", "rank": 96, "verdict": "non-inferior"
    }  # fmt: skip
    rows = {r["arm"]: r for r in frontier["rows"]}
    assert rows["rpka-r8"]["verdict"] == "not shown"
    assert rows["rpka-r32"]["rank_over_n"] == 32 / 128 and rows["rpka-r32"]["step_ratio"] == 2.0
    assert rows["rpka-r32"]["step_source"] == "training wall time"  # no timing file: a record
    (pivot,) = frontier["pivoting"]
    assert pivot["versus"] == "nystrom-uniform-r32" and pivot["delta"] < 0  # RPKA better
    assert pivot["prob_improvement"] == 1.0
    path = tmp_path / "report.json"
    write_json(path, report)
    written = write_frontier({"recall": path}, tmp_path / "frontier.json")
    assert read_json(tmp_path / "frontier.json") == written
    assert written["tracks"]["recall"]["r_star"] == 32
    assert "r_star_cost" not in written["tracks"]["recall"]  # no latency sweep given
    sweep = {"device": "cpu", "shapes": "q, k, v", "rows": [
        {"method": "rpka", "rank": 32, "n": 2048, "speedup_vs_exact": 3.0,
         "fwd_bwd_speedup_vs_exact": 4.0, "memory_vs_exact": 5.0},
        {"method": "rpka", "rank": 8, "n": 8192, "speedup_vs_exact": 9.0},
    ]}  # fmt: skip
    written = write_frontier({"recall": path}, tmp_path / "frontier.json", sweep)
    cost = written["tracks"]["recall"]["r_star_cost"]
    assert cost["rank"] == 32 and cost["device"] == "cpu"
    assert cost["lengths"]["2048"] == {
        "forward_speedup": 3.0, "fwd_bwd_speedup": 4.0, "memory_ratio": 5.0
    }  # fmt: skip
    assert cost["lengths"]["8192"] is None  # rank 32 not measured there: never extrapolated
    assert cost["own_length"] == 64 and cost["lengths"]["64"] is None  # the track's own


def test_cost_at_lengths_reads_the_sweep_row_of_that_rank_only():
    sweep = {"rows": [{"method": "nystrom-uniform", "rank": 16, "n": 2048,
                       "speedup_vs_exact": 2.0},
                      {"method": "rpka", "rank": 16, "n": 2048, "speedup_vs_exact": 1.5}]}
    cost = cost_at_lengths(sweep, 16, lengths=(2048,))
    assert cost["lengths"]["2048"]["forward_speedup"] == 1.5
    assert cost["lengths"]["2048"]["memory_ratio"] is None


def test_the_drop_in_curve_is_the_gap_recovered_per_member_on_the_controls_seeds(tmp_path):
    """scripts/drop_in.py's rows (exact's model, another method swapped in) as g per member,
    paired with the control's score on the member's seed; full-rank rows left out."""
    report = bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r32": ("rpka", 32, arm_at([0.97] * 7)),
    })  # fmt: skip
    for arm in report["arms"].values():
        arm["seeds"] = list(range(100, 107))
    members = [102, 100]  # the drop-in's members: not the control's first seeds, in order
    exact = [0.0, 0.01]
    half = [(CONTROL[2] + exact[0]) / 2, (CONTROL[0] + exact[1]) / 2]
    drop_in = {
        "metric": "error", "members": members, "exact": {"float32": exact},
        "rows": [
            {"method": "rpka", "rank": 16, "dtype": "float32", "full_rank": False, "error": half},
            {"method": "rpka", "rank": 16, "dtype": "float64", "full_rank": False, "error": exact},
            {"method": "rpka", "rank": 256, "dtype": "float32", "full_rank": True, "error": exact},
        ],
    }  # fmt: skip
    write_json(tmp_path / "bench_report.json", report)
    write_json(tmp_path / "drop_in.json", drop_in)
    written = write_frontier({"recall": tmp_path / "bench_report.json"}, tmp_path / "f.json")
    (row,) = written["tracks"]["recall"]["drop_in"]
    assert (row["method"], row["rank"], row["rank_over_n"]) == ("rpka", 16, 16 / 128)
    assert row["per_member"] == pytest.approx([0.5, 0.5]) and row["gap_recovered"] == 0.5
    drop_in["members"] = [99]
    with pytest.raises(ValueError, match="not all seeds of the control"):
        drop_in_curve(report, drop_in, 128)


def test_a_positive_control_that_loses_is_reported_as_such():
    """The rule can fail: a pipeline whose exact-by-construction arm loses says so."""
    report = bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r96": ("rpka", 96, arm_at([0.6] * 7)),
    })  # fmt: skip
    frontier = track_frontier(report)
    assert frontier["positive_control"]["verdict"] == "not shown"
    assert frontier["r_star"] is None  # the positive control is not r*
    with pytest.raises(ValueError, match="no control arm"):
        track_frontier({**report, "arms": {"exact": report["arms"]["exact"]}})


def test_the_report_section_states_r_star_its_cost_and_a_failing_positive_control():
    from rpka import report

    good = track_frontier(bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r32": ("rpka", 32, arm_at([0.97, 0.99, 0.98, 0.99, 0.97, 0.98, 0.99])),
        "rpka-r96": ("rpka", 96, arm_at([1.0, 0.99, 1.0, 1.01, 1.0, 0.99, 1.0])),
    }))  # fmt: skip
    bad = track_frontier(bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r96": ("rpka", 96, arm_at([0.6] * 7)),
    }))  # fmt: skip
    frontier = {"tracks": {"recall": good, "lm": bad}}
    text = report.frontier.track_sentence("recall", good)
    assert "r\\* = 32 of 128 points (0.25)" in text and "2.00x exact's" in text
    assert "The wiring check does not tie" in report.frontier.track_sentence("lm", bad)
    items = report.frontier.frontier_section(frontier, report.Figures(), None)
    assert len(items) == 4  # sentences, figure, table, "no spectrum"
    table = report.frontier.frontier_table(frontier)
    assert list(table["verdict"]) == ["non-inferior", "non-inferior", "not shown"]
    assert "no rank frontier" in report.frontier.frontier_section(None, None, None)[0].data


def test_the_spectrum_text_states_the_heads_sharpness_and_q_k_ratio():
    from rpka import report

    head = {"ranks": [16, 64], "n_points": 128, "logit_std": 2.5, "qk_norm_ratio": 1.7,
            "residual_rpc": [0.9, 0.5], "residual_optimal": [0.8, 0.4],
            "no_structure": [0.875, 0.5], "attention_error": [0.3, 0.01]}  # fmt: skip
    text = report.frontier.spectrum_text({"lm": {"heads": [head, {**head, "qk_norm_ratio": 0.8}]}})
    assert "r = 64 of 128 points" in text and "q/k norm ratio 0.80-1.70" in text
    assert "logit std 2.5-2.5" in text


def test_the_positive_control_is_outside_the_holm_family_and_checked():
    from rpka.config.presets import get_preset

    config = get_preset("full", "recall")
    assert config.decision.positive_control_arm == "rpka-r96"
    assert "rpka-r96" not in config.secondary_arms and "rpka-r32" in config.secondary_arms
    with pytest.raises(ValueError, match="positive_control_arm"):
        config.replace(positive_control_arm="rpka-r8").validate()  # the primary
    with pytest.raises(ValueError, match="positive_control_arm"):
        config.replace(positive_control_arm="no-such-arm").validate()


def _recall_report(pairs: int, errors: dict[str, list[float]]) -> dict:
    """A recall bench report with the same error at every length factor."""
    def scored(per_seed):
        m = float(np.mean(per_seed))
        return {"mean": m, "ci_low": m - 0.01, "ci_high": m + 0.01, "n": len(per_seed)}
    arms = {name: {"method": name.split("-r")[0] if "-r" in name else name,
                   "rank": int(name.split("-r")[1]) if "-r" in name else None,
                   "full_by_metric": {k: scored(v) for k in ("error", "error_x2", "error_x4")}}
            for name, v in errors.items()}  # fmt: skip
    return {"config": {"track": {"n_pairs": pairs}, "train": {"epochs": 2}}, "arms": arms,
            "data": {"length_factors": [2, 4]}}


def test_the_mqar_curve_is_accuracy_against_rank_over_pairs_per_length(tmp_path):
    reports = [_recall_report(4, {"exact": [0.0, 0.0], "rpka-r8": [0.1, 0.3]}),
               _recall_report(16, {"exact": [0.0, 0.02], "rpka-r8": [0.5, 0.7]})]
    rows = mqar_curve(reports)
    assert len(rows) == 2 * 2 * 3  # benches x arms x length factors
    r8 = [r for r in rows if r["arm"] == "rpka-r8" and r["length_factor"] == 1]
    assert [(r["pairs"], r["rank_over_pairs"]) for r in r8] == [(4, 2.0), (16, 0.5)]
    assert r8[0]["accuracy"] == pytest.approx(0.8) and r8[1]["accuracy"] == pytest.approx(0.4)
    assert r8[0]["ci_low"] == pytest.approx(0.79) and r8[0]["ci_high"] == pytest.approx(0.81)
    exact = [r for r in rows if r["method"] == "exact"]
    assert all(r["rank"] is None and r["rank_over_pairs"] is None for r in exact)
    paths = []
    for i, report in enumerate(reports):
        paths.append(tmp_path / f"b{i}" / "bench_report.json")
        paths[-1].parent.mkdir()
        write_json(paths[-1], report)
    written = write_frontier({}, tmp_path / "frontier.json", mqar=paths)
    assert written["mqar"]["benches"] == ["b0/bench_report.json", "b1/bench_report.json"]
    assert written["mqar"]["rows"] == rows


def test_the_report_section_draws_and_tables_the_mqar_curve(tmp_path):
    from rpka import report

    rows = mqar_curve([
        _recall_report(4, {"exact": [0.0, 0.0], "mean-attention": [0.8, 0.8],
                           "rpka-r8": [0.1, 0.3], "rpka-r16": [0.0, 0.1]}),
        _recall_report(16, {"exact": [0.0, 0.02], "mean-attention": [0.9, 0.9],
                            "rpka-r8": [0.5, 0.7], "rpka-r16": [0.2, 0.4]}),
    ])  # fmt: skip
    for row in rows:
        row["epochs"] = 2 if row["pairs"] == 4 else 6
    good = track_frontier(bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r96": ("rpka", 96, arm_at([1.0] * 7)),
    }))  # fmt: skip
    frontier = {"tracks": {"recall": good}, "mqar": {"rows": rows}}
    items = report.frontier.frontier_section(frontier, report.Figures(), tmp_path)
    assert len(items) == 6  # sentences, frontier figure, table, mqar figure + table, no spectrum
    assert (tmp_path / "mqar_rank_over_pairs.png").exists()
    table = report.frontier.mqar_table(frontier["mqar"])
    assert list(table.columns) == ["arm", "4 pairs", "16 pairs"]
    cells = table.set_index("arm").loc["`rpka-r8`"]
    assert cells["4 pairs"] == "0.800 [0.790, 0.810] (r/p 2)"
    assert cells["16 pairs"] == "0.400 [0.390, 0.410] (r/p 0.5)"
    caption, _ = report.frontier.mqar_caption(frontier["mqar"])
    assert "4 pairs 2, 16 pairs 6" in caption


def test_the_track_sentence_states_the_cost_at_r_star_at_longer_lengths():
    from rpka import report

    entry = track_frontier(bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r32": ("rpka", 32, arm_at([0.97, 0.99, 0.98, 0.99, 0.97, 0.98, 0.99])),
    }))  # fmt: skip
    entry["r_star_cost"] = {"rank": 32, "lengths": {
        "2048": {"forward_speedup": 3.84, "fwd_bwd_speedup": 4.8, "memory_ratio": 5.19},
        "8192": None}}  # fmt: skip
    text = report.frontier.track_sentence("recall", entry)
    assert "at 2,048 tokens one non-causal attention call at r\\* is 3.8x faster forward" in text
    assert "4.8x forward+backward, at 5.2x exact's peak memory" in text
    assert "(not measured at 8,192 tokens)" in text
    entry["r_star_cost"] = None
    assert "faster" not in report.frontier.track_sentence("recall", entry)


def test_a_positive_control_from_a_bench_of_its_own_joins_the_track():
    sweep = track_frontier(bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r32": ("rpka", 32, arm_at([0.97, 0.99, 0.98, 0.99, 0.97, 0.98, 0.99])),
    }))  # fmt: skip
    assert sweep["positive_control"] is None
    own = bench_report({
        "exact": ("exact", None, EXACT),
        "mean-attention": ("mean", None, CONTROL),
        "rpka-r96": ("rpka", 96, arm_at([1.0] * 7)),
    })  # fmt: skip
    add_positive_control(sweep, own)
    assert sweep["positive_control"] == {"arm": "rpka-r96", "rank": 96, "verdict": "non-inferior"}
    assert [r["arm"] for r in sweep["rows"]] == ["rpka-r32", "rpka-r96"]
    assert sweep["r_star"] == 32  # unchanged: a positive control is never r*
    without = bench_report({"exact": ("exact", None, EXACT),
                            "mean-attention": ("mean", None, CONTROL)})  # fmt: skip
    with pytest.raises(ValueError, match="no RPKA arm exact by construction"):
        add_positive_control(sweep, without)


def test_a_pair_count_where_exact_did_not_learn_is_kept_but_not_read(tmp_path):
    from rpka import report

    unlearned = _recall_report(24, {"exact": [0.0, 0.9], "rpka-r8": [0.9, 0.9]})
    unlearned["learnability"] = {"met": False}
    learned = _recall_report(4, {"exact": [0.0, 0.0], "rpka-r8": [0.1, 0.3]})
    learned["learnability"] = {"met": True}
    also = _recall_report(8, {"exact": [0.0, 0.0], "rpka-r8": [0.3, 0.4]})  # no learnability
    rows = mqar_curve([learned, also, unlearned])
    assert {r["pairs"]: r["learnability_met"] for r in rows} == {4: True, 8: None, 24: False}
    mqar = {"rows": rows}
    table = report.frontier.mqar_table(mqar)
    assert "24 pairs (exact did not learn: not read)" in table.columns
    caption, _ = report.frontier.mqar_caption(mqar)
    assert "not drawn: 24 pairs, where exact attention missed its learnability bar" in caption
    fig = report.figures_recall.plot_mqar(mqar, tmp_path)
    labels = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert labels and not any("24p" in label for label in labels)  # 24 pairs not drawn


def test_the_caption_says_where_each_step_ratio_was_measured():
    timed = {"margin_gap": 0.95, "rows": [{"step_source": "steptime_tracks.json"}]}
    wall = {"margin_gap": 0.95, "rows": [{"step_source": None}]}  # an older frontier row
    both = report_frontier.step_sources({"tracks": {"lm": timed, "longrange-512": wall}})
    assert both.startswith("one-thread CPU time from steptime_tracks.json; training wall times")
    assert "training wall" not in report_frontier.step_sources({"tracks": {"lm": timed}})
    caption, _ = report_frontier.frontier_caption({"tracks": {"lm": timed}})
    assert "one-thread CPU time from steptime_tracks.json" in caption


def test_the_frontier_figure_is_the_same_bytes_on_every_render(tmp_path):
    """Its notes are placed by adjustText for a fixed number of iterations, not for its
    default one second: a busy machine gave the committed figure other bytes on each
    publish (issue 56)."""
    frontier = read_json(resolve("data/results/full/frontier.json"))
    for folder in ("a", "b"):
        plt.close(plot_frontier(frontier, tmp_path / folder))
    assert (tmp_path / "a/rank_frontier.png").read_bytes() == (
        tmp_path / "b/rank_frontier.png"
    ).read_bytes()
