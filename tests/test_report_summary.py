"""The report's top (rpka.report.summary): the answer sentence, the all-tracks table and
the headline figure on the gap-recovered scale, read from the committed full study."""

import copy
import json

import matplotlib.pyplot as plt
import numpy as np
import pytest

from rpka import paths, report
from rpka.io import write_json
from rpka.report import figures_headline, narrative, summary
from rpka.tracks import get_task
from rpka.verdict.decision import MARGIN_GAP

RESULTS = paths.resolve(paths.results_dir("full"))


@pytest.fixture(scope="module")
def full_study():
    return report.load_study(paths.study_json("full"), "full")


@pytest.fixture(scope="module")
def frontier():
    return json.loads((RESULTS / "frontier.json").read_text())


def test_the_answer_sentence_reads_r_star_gap_step_ratio_and_the_control_from_the_file(
    frontier,
):
    text = summary.answer_sentence(frontier, superseded=True)  # the full study
    assert text.startswith("**When does RPKA stop losing, at what cost?**")
    for name, entry in frontier["tracks"].items():
        if name.startswith(summary.LONGRANGE_PREFIX):  # the superseded 8-seed study
            continue
        row = summary.r_star_row(entry)
        if row is None:
            best = summary.best_rpka_row(entry)
            assert f"rank {best['rank']} of {best['n_points']}" in text
            # the positive control (full rank: exact's own numbers) is never the "best"
            assert best["arm"] != (entry["positive_control"] or {}).get("arm")
            continue
        g = row["gap_recovered"]
        assert f"from rank {entry['r_star']} of {row['n_points']} points" in text
        assert f"{g['mean']:.3f} [{g['ci_low']:.3f}, {g['ci_high']:.3f}]" in text
        assert f"{row['step_ratio']:.2f}× exact's training step" in text
    assert "wiring check (the positive control" in text and "ties with exact" in text
    assert "8-seed long-range study is superseded and not read here" in text
    assert "long range at" not in text  # its tracks are not read in the answer (issue 53)


def test_a_positive_control_that_does_not_tie_is_said_and_no_frontier_is_said(frontier):
    broken = copy.deepcopy(frontier)
    entry = next(e for e in broken["tracks"].values() if e["positive_control"])
    entry["positive_control"]["verdict"] = "not shown"
    assert "**does not tie**" in summary.answer_sentence(broken)
    assert "Not answered" in summary.answer_sentence(None)


def test_the_all_tracks_table_has_every_track_and_long_context_length(full_study, frontier):
    table = summary.all_tracks_table(full_study, frontier)
    contexts = full_study["longctx"]["contexts"]
    longrange = (full_study.get("longrange") or {}).get("contexts", {})
    extensions = full_study.get("extensions") or {}
    assert len(table) == len(full_study["tracks"]) + len(extensions) + len(contexts) + len(
        longrange
    )
    for entry in extensions.values():  # a frontier extension: its own row, by its title
        assert (table["track"] == entry["title"]).sum() == 1
    assert full_study.get("longrange_power")  # the full study: its 8-seed study superseded
    label = summary.SUPERSEDED_TRACK
    assert (table["track"] == label).sum() == len(longrange)
    assert list(table["track"][: len(full_study["tracks"])]) == [
        t["title"] for t in full_study["tracks"].values()
    ]
    assert (table["track"] == "long context (regimes, local task)").sum() == len(contexts)
    for name, entry in frontier["tracks"].items():
        if name not in full_study["tracks"]:  # a long-range length: its own rows
            continue
        row = table[table["track"] == full_study["tracks"][name]["title"]].iloc[0]
        star = summary.r_star_row(entry)
        if star:
            assert row["r* (rank / points)"].startswith(f"{entry['r_star']} / ")
            assert row["train step at r* (× exact)"] == f"{star['step_ratio']:.2f}×"
        else:
            assert row["r* (rank / points)"] == "not reached"
    failed = [t["title"] for t in full_study["tracks"].values() if t["gate"] == "failed"]
    if any(not e.get("gate_passed") for e in longrange.values()):
        failed.append("long range (two controls)")
    assert set(table[table["gate"] == "failed"]["track"]) == set(failed)


def test_a_long_context_entry_missing_keys_still_renders(full_study, frontier):
    study = copy.deepcopy(full_study)
    study["longctx"] = {"contexts": {"4096": {"local_gate": {"passed": True}}}}
    study["longrange"] = None  # the long-context rows are the table's last
    table = summary.all_tracks_table(study, frontier)
    row = table.iloc[-1]
    assert row["length"] == "4,096" and row["primary verdict"] == "n/a"
    assert summary.longctx_reports(study, RESULTS) == {}


def test_the_headline_is_on_the_gap_scale_and_every_track_is_readable(full_study):
    longctx = summary.longctx_reports(full_study, RESULTS)
    rows = summary.headline_rows(full_study, longctx)
    assert len(rows) == len(full_study["tracks"]) + len(longctx)
    fig = figures_headline.plot_headline(rows)
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    assert low <= 0 and high >= 1 and high - low < 3  # 0 = no attention, 1 = exact
    means = [r["gap"]["mean"] for r in rows if r["gap"]]
    assert means and all(low < m < high for m in means)
    hollow = [line for line in ax.lines if line.get_marker() == "o" and
              line.get_markerfacecolor() == "white"]  # fmt: skip
    assert len(hollow) == sum(t["gate"] == "failed" for t in full_study["tracks"].values())
    caption, alt = summary.headline_caption(rows)
    assert "1 is exact attention" in caption and "%" not in caption.split("Hollow")[1]
    for r in rows:
        if r["gap"]:
            assert f"{r['gap']['mean']:.3f}" in caption
    plt.close(fig)


def test_the_primary_gap_is_the_frontiers_rule_on_the_primary_arm(full_study, frontier):
    for name, entry in frontier["tracks"].items():
        if name not in full_study["tracks"]:  # a long-range length (its own index entry)
            continue
        report_ = full_study["tracks"][name]["report"]
        row = next((r for r in entry["rows"] if r["arm"] == report_["primary_arm"]), None)
        if row is None:
            continue
        gap = summary.primary_gap(report_)
        assert gap["mean"] == pytest.approx(row["gap_recovered"]["mean"])
        assert gap["ci_low"] == pytest.approx(row["gap_recovered"]["ci_low"])
    assert np.isclose(MARGIN_GAP, next(iter(frontier["tracks"].values()))["margin_gap"])


def test_one_learning_rate_is_not_called_a_sweep():
    assert narrative.rates_text([0.001], [0]).startswith("One learning rate, 0.001")
    assert "swept" not in narrative.rates_text([0.001], [0])
    assert "0.001, 0.003 swept" in narrative.rates_text([0.001, 0.003], [0, 1])


def test_the_two_perplexities_are_labelled(full_study):
    lm = full_study["tracks"]["lm"]["report"]
    text = get_task("lm").text.learnability_text(lm)
    le, base = lm["learnability"], lm["arms"][lm["baseline_arm"]]["full"]
    assert f"exp(mean NLL over seeds) {le['baseline_test_perplexity']:.3f}" in text
    mean = f"the mean of the seeds' perplexities, the metric compared above, is {base['mean']:.3f}"
    assert mean in text
    assert "not exp of the mean NLL" in get_task("lm").text.result_notes(lm)


def test_targets_split_into_science_bars_and_engineering_targets(full_study):
    import pandas as pd

    targets = pd.DataFrame(
        [
            ("lm learnable: exact closes ≥ 50 %", "74%", "met"),
            ("trace identity: pooled z-scores calibrated", "p 0.004", "not met"),
            (
                "forecast track: rpka-r16 training step at 96 tokens ≤ 1.5 × exact",
                "3.6 ×",
                "not met",
            ),
            ("study budget: `make report` ≤ 25 min on 2 cores", "239 min", "not met"),
        ],
        columns=["target", "measured", "status"],
    )
    science, engineering = summary.split_targets(targets)
    assert list(science["target"].str[:5]) == ["lm le", "trace"]
    assert list(engineering["target"].str[:5]) == ["forec", "study"]


def _index(gate: bool, verdict: str, primary: str = "rpka-r16") -> dict:
    return {
        "tracks": {
            "motif": {
                "attention_gate": {"passed": gate},
                "local_gate": None,
                "primary_arm": primary,
                "primary": {"verdict": verdict},
            }
        },
        "longrange": {
            "contexts": {
                "512": {"gate_passed": True, "primary_arm": "rpka-r64",
                        "primary": {"verdict": "inconclusive"}}
            }
        },
    }  # fmt: skip


def test_the_companion_table_says_where_two_studies_agree_and_where_not():
    standard = _index(True, "significant loss")
    full = _index(True, "significant loss")
    table = summary.companion_table(standard, full, ("standard", "full"))
    assert list(table["track"]) == ["motif", "longrange-512"]
    assert list(table["agree"]) == ["yes", "yes"]
    flipped = summary.companion_table(standard, _index(True, "equivalent"), ("s", "f"))
    assert list(flipped["agree"]) == ["**no**", "yes"]
    gate = summary.companion_table(standard, _index(False, "significant loss"), ("s", "f"))
    assert gate["agree"][0] == "**no**" and gate["gate (f)"][0] == "failed"
    # a failing local gate fails the track's gate
    local = _index(True, "significant loss")
    local["tracks"]["motif"]["local_gate"] = {"passed": False}
    assert summary.study_decisions(local)["motif"]["gate"] == "failed"
    # a track only one study ran is not counted as agreeing
    only = _index(True, "significant loss")
    only["tracks"]["lm"] = dict(only["tracks"]["motif"])
    assert summary.companion_table(only, full, ("s", "f"))["agree"].tolist()[1] == "-"


def test_the_companion_section_reads_both_committed_indexes(tmp_path):
    for preset, verdict in (("standard", "significant loss"), ("full", "equivalent")):
        (tmp_path / preset).mkdir()
        write_json(tmp_path / preset / "study.json", _index(True, verdict))
    text = summary.companion_section("standard", tmp_path)
    assert "Of the 2 tracks both ran, 1 has the same gate" in text
    assert summary.companion_section("quick", tmp_path) == ""
    assert summary.companion_section("full", tmp_path / "nowhere") == ""
