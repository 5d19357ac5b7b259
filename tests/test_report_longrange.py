"""The long-range study (issue 27) in the study index, the frontier, the answer figure and
the report (rpka.study.index.longrange_entry, rpka.report.longrange,
rpka.report.figures_frontier), on the ``longrange-smoke`` preset's output: as run (both
gates fail at smoke size) and with its gates made to pass (the control losing on every
seed), and with files missing."""

import json
import shutil

import pytest
from matplotlib.figure import Figure

from rpka.config.presets_longctx import get_longctx_preset
from rpka.io import read_json, write_result_json
from rpka.report import longrange, summary
from rpka.report.figures_frontier import plot_longrange_answer
from rpka.study import index as study_index
from rpka.study import longctx
from rpka.training.executors import InProcessExecutor

SMOKE = get_longctx_preset("longrange-smoke")
CONTROL_LOSS = 1.0  # added to exact's per-seed MSE: a control that loses on every seed


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory):
    """A study folder whose ``longrange/`` is the smoke preset's output."""
    root = tmp_path_factory.mktemp("lr")
    longctx.run_longctx(
        SMOKE, root / "study" / "longrange", InProcessExecutor(), progress=False,
        data_dir=root / "cache",
    )  # fmt: skip
    return root / "study"


def _gate_open(folder):
    """Make every length's two-control gate pass: the controls lose on every seed."""
    result = json.loads((folder / "longctx.json").read_text())
    for entry in result["per_context"].values():
        path = folder / entry["bench_report"]
        report = read_json(path)
        exact = report["arms"][report["baseline_arm"]]["full"]["per_seed"]
        for gate in ("attention_gate", "local_gate"):
            control = report[gate]["control_arm"]
            report["arms"][control]["full"]["per_seed"] = [e + CONTROL_LOSS for e in exact]
            report[gate]["passed"] = True
        write_result_json(path, report)  # as a bench whose controls lost would write it


@pytest.fixture()
def gated_study(smoke_study, tmp_path):
    out = tmp_path / "study"
    shutil.copytree(smoke_study, out)
    _gate_open(out / "longrange")
    return out


def _index(out):
    return study_index.write_study_index("smoke", tracks=(), out_dir=out)


def _read(out, name):
    return read_json(out / name)  # with its timings, kept beside it, merged back


def test_the_index_carries_both_gates_and_every_ranks_verdict(smoke_study, tmp_path):
    out = tmp_path / "study"
    shutil.copytree(smoke_study, out)
    entry = _index(out)["longrange"]
    assert entry["longctx_json"] == "longrange/longctx.json"
    assert sorted(entry["contexts"], key=int) == [str(c) for c in SMOKE.contexts]
    for line in entry["contexts"].values():
        assert line["attention_gate"]["control_arm"] == "mean-attention"
        assert line["local_gate"]["control_arm"] == "local-w8"
        assert {"rpka-r4", "rpka-r8", "nystrom-uniform-r8"} <= set(line["verdicts"])
        assert line["gate_passed"] is False
        assert (out / line["bench_report"]).exists()
        assert set(line["learnability"]) >= {"ratio_to_linear", "linear_ratio_required"}
    assert _read(out, "study.json")["longrange"] == entry
    assert not any(t.startswith("longrange-") for t in _read(out, "frontier.json")["tracks"])


def test_without_the_folder_the_index_reads_null(tmp_path):
    assert _index(tmp_path)["longrange"] is None
    assert study_index.longrange_entry(tmp_path / "nowhere", tmp_path) is None


def test_gated_lengths_are_frontier_tracks(gated_study):
    index = _index(gated_study)
    assert all(e["gate_passed"] for e in index["longrange"]["contexts"].values())
    tracks = _read(gated_study, "frontier.json")["tracks"]
    for context in SMOKE.contexts:
        track = tracks[f"longrange-{context}"]
        assert track["control_arm"] == "mean-attention"
        assert track["causal_block"] is None
        # the smoke preset's full rank (>= the 2n joint points at every length) ties
        assert track["positive_control"] == {
            "arm": SMOKE.bench.decision.positive_control_arm,
            "rank": int(SMOKE.bench.decision.positive_control_arm.removeprefix("rpka-r")),
            "verdict": "non-inferior",
        }
        arms = {"rpka-r4", "rpka-r8", "nystrom-uniform-r8", "rpka-r160"}
        assert {r["arm"] for r in track["rows"]} == arms
        assert all(r["step_ratio"] is not None for r in track["rows"])
        assert all(r["gap_recovered"]["mean"] is not None for r in track["rows"])


def test_the_answer_figure_draws_every_point_and_writes_the_png(gated_study, tmp_path):
    _index(gated_study)
    frontier = _read(gated_study, "frontier.json")
    longctx_file, _ = longrange.load_files(gated_study / "longrange")
    points = longrange.answer_points(frontier, longctx_file)
    # per length r4, r8, uniform r8 and the positive control
    assert len(points) == 4 * len(SMOKE.contexts)
    assert [p["arm"] for p in points if p["positive_control"]] == ["rpka-r160"] * 2
    rows = longrange.cost_rows(longctx_file)
    for p in points:
        row = rows[(p["context"], p["arm"])]
        assert p["step_ratio"] == row["step_ratio_vs_exact"]
        assert p["peak_ratio"] == row["peak_ratio_vs_exact"]
    fig = plot_longrange_answer(points, save_dir=tmp_path, name="answer")
    assert isinstance(fig, Figure) and (tmp_path / "answer.png").stat().st_size > 0
    assert len(fig.axes) == 2  # the memory panel beside the speed one
    no_memory = [{**p, "peak_ratio": None} for p in points]
    assert len(plot_longrange_answer(no_memory).axes) == 1
    caption, alt = longrange.answer_caption(points)
    assert all(f"{p['context']:,} tokens {p['arm']}" in caption for p in points)
    assert isinstance(plot_longrange_answer([]), Figure)


class _Figs:
    def show(self, fig, caption, alt, name=None):
        return caption


def _sections(out):
    index = _index(out)
    frontier = _read(out, "frontier.json")
    longctx_file, locality = longrange.load_files(out / "longrange")
    runs = {"longrange": index["longrange"], "longctx": None, "tracks": {}}
    return runs, frontier, longctx_file, locality


def test_failing_gates_read_failed_and_no_answer(smoke_study, tmp_path):
    out = tmp_path / "study"
    shutil.copytree(smoke_study, out)
    runs, frontier, longctx_file, _ = _sections(out)
    index = runs["longrange"]
    gates = longrange.gates_table(index)
    assert len(gates) == len(SMOKE.contexts)
    assert set(gates["two-control gate"]) == {"failed"}
    assert gates["local gate"].str.startswith("failed: `local-w8`").all()
    assert "Not answered" in longrange.answer_text(index, [])
    verdicts = longrange.verdicts_table(index, frontier, longctx_file)
    assert verdicts["verdict vs exact"].str.endswith("(gate failed)").all()
    assert set(verdicts["gap recovered [95 % CI]"]) == {"n/a"}
    table = summary.all_tracks_table(runs, frontier)
    lr = table[table["track"] == "long range (two controls)"]
    assert list(lr["gate"]) == ["failed"] * len(SMOKE.contexts)
    assert set(lr["r* (rank / points)"]) == {"no frontier"}
    line = longrange.summary_line(index, frontier, longctx_file)
    assert "failed" in line and "Not answered" in line


def test_passing_gates_give_gaps_learnability_and_a_section(gated_study, tmp_path):
    runs, frontier, longctx_file, _ = _sections(gated_study)
    index = runs["longrange"]
    gates = longrange.gates_table(index)
    assert set(gates["two-control gate"]) == {"passed"}
    for (_, row), (_, entry) in zip(gates.iterrows(), sorted(index["contexts"].items(),
                                                             key=lambda kv: int(kv[0])),
                                    strict=True):  # fmt: skip
        ratio = entry["learnability"]["ratio_to_linear"]
        assert row["learnability: exact ÷ linear"].startswith(f"{ratio:.3f}")
    verdicts = longrange.verdicts_table(index, frontier, longctx_file)
    assert (verdicts["gap recovered [95 % CI]"] != "n/a").any()
    table = summary.all_tracks_table(runs, frontier)
    lr = table[table["track"] == "long range (two controls)"]
    assert set(lr["gate"]) == {"passed"}
    assert set(lr["wiring check (positive control)"]) == {"`rpka-r160`: non-inferior"}
    reports = summary.longctx_reports(runs, gated_study, key="longrange")
    assert sorted(reports) == list(SMOKE.contexts)
    headline = summary.headline_rows(runs, None, reports)
    assert [r["gate"] for r in headline] == ["passed"] * len(SMOKE.contexts)
    assert all(r["gap"] is not None and r["label"].startswith("long range") for r in headline)
    locality = {"contexts": {"64": {"median": 31.0, "p10": 25.0, "p90": 40.0,
                                    "share_within_window": 0.0, "window": 8}}}  # fmt: skip
    setup = longrange.setup_text(index, longctx_file, locality)
    assert "forecast-lookup" in setup and "median 31 steps back" in setup
    assert "At 80 tokens every run - each arm, controls included - first trains at 64" in setup
    cold = {**longctx_file, "config": {**longctx_file["config"], "warm_start_from": None}}
    assert "curriculum" not in longrange.setup_text(index, cold, locality)
    assert "not measured" in longrange.setup_text(index, longctx_file, None)
    other = {"contexts": {"512": locality["contexts"]["64"]}}
    assert "at these lengths" in longrange.setup_text(index, longctx_file, other)
    items = longrange.longrange_section(runs, frontier, longctx_file, locality, _Figs(), tmp_path)
    assert any(isinstance(i, str) and "Does RPKA pay" in i for i in items)
    assert (tmp_path / "longrange_answer.png").exists()


def test_a_cheaper_non_inferior_point_is_the_answer():
    index = {"contexts": {"2048": {"gate_passed": True}}}
    point = {"context": 2048, "arm": "rpka-r64", "method": "rpka", "rank": 64,
             "gap_mean": 0.98, "gap_ci_low": 0.96, "gap_ci_high": 1.0,
             "verdict": "non-inferior", "step_ratio": 0.48, "peak_ratio": 0.7,
             "margin_gap": 0.95}  # fmt: skip
    text = longrange.answer_text(index, [point])
    assert "Yes" in text and "0.48×" in text and "0.980 [0.960, 1.000]" in text
    slower = {**point, "step_ratio": 1.3}
    text = longrange.answer_text(index, [slower])
    assert "Not shown" in text and "1.30×" in text
    # paying at one length, not at another; uniform landmarks paying; the positive control
    # (full rank: exact's cost) never the answer nor the best point
    index = {"contexts": {"1024": {"gate_passed": True}, "2048": {"gate_passed": True}}}
    short = {**point, "context": 1024}
    unsure = {**point, "gap_ci_low": 0.92, "verdict": "not shown"}
    uniform = {**point, "arm": "nystrom-uniform-r64", "method": "nystrom-uniform",
               "step_ratio": 0.61}  # fmt: skip
    full = {**point, "arm": "rpka-r4096", "rank": 4096, "gap_mean": 1.0, "step_ratio": 0.9,
            "positive_control": True}  # fmt: skip
    text = longrange.answer_text(index, [short, unsure, uniform, full])
    assert text.startswith("**Does RPKA pay at long range?** Yes: 1,024 tokens, r 64")
    assert "At 2,048 tokens no rank is both" in text and "): cheaper there r 64 at 2,048" in text
    assert "without residual pivoting: `nystrom-uniform-r64` at 2,048 tokens (0.61×" in text
    assert "4096" not in text
    text = longrange.answer_text(index, [unsure, full])
    assert "Best: 2,048 tokens, r 64" in text and "4096" not in text
    at_cost = {**point, "arm": "rpka-r128", "rank": 128, "step_ratio": 0.95}
    text = longrange.answer_text(index, [at_cost])
    assert "Not shown" in text and "about exact's cost" in text and "r 128 at 2,048 (0.95×" in text


def test_missing_files_read_not_run(tmp_path):
    assert longrange.load_files(tmp_path) == (None, None)
    items = longrange.longrange_section({}, None, None, None, _Figs(), None)
    assert len(items) == 1 and "not run" in items[0].data
    assert longrange.gates_table(None).empty
    assert longrange.verdicts_table(None, None, None).empty
    assert longrange.answer_points(None, None) == []
    assert "Not run" in longrange.summary_line(None, None, None)
    assert summary.longrange_rows(None, None) == []
    entry = {"contexts": {"512": {"attention_gate": None}}}
    row = longrange.gates_table(entry).iloc[0]
    assert row["no-attention gate"] == "not run" and row["learnability: exact ÷ linear"] == "n/a"


def test_paying_points_are_cheaper_non_inferior_low_rank_rpka_only():
    point = {"method": "rpka", "step_ratio": 0.6, "verdict": "non-inferior"}
    points = [
        {**point, "arm": "rpka-r64"},
        {**point, "arm": "rpka-r16", "step_ratio": 1.2},  # slower than exact
        {**point, "arm": "rpka-r128", "step_ratio": 0.95},  # exact's cost, within timing noise
        {**point, "arm": "rpka-r8", "verdict": "inconclusive"},
        {**point, "arm": "nystrom-uniform-r64", "method": "nystrom-uniform"},
        # full rank is exact attention's cost: a step ratio below 1 is noise, not a saving
        {**point, "arm": "rpka-r4096", "step_ratio": 0.98, "positive_control": True},
    ]
    assert [p["arm"] for p in longrange.paying_points(points)] == ["rpka-r64"]


def test_a_separate_positive_control_is_read_only_where_the_study_has_none(gated_study):
    """The positive control as a study of its own (``longrange/positive_control/``, how the
    512-token one first ran) joins the frontier only where the rank sweep trained none."""
    folder = gated_study / "longrange"
    shutil.copytree(
        folder, folder / "positive_control", ignore=shutil.ignore_patterns("positive_control")
    )
    longrange_index = _index(gated_study)["longrange"]
    assert study_index.longrange_positive_controls(longrange_index, gated_study) == {}
    for entry in longrange_index["contexts"].values():  # the sweep without its own
        path = gated_study / entry["bench_report"]
        report = read_json(path)
        report["config"]["positive_control_arm"] = None
        write_result_json(path, report)
    separate = study_index.longrange_positive_controls(longrange_index, gated_study)
    assert sorted(separate) == [f"longrange-{c}" for c in SMOKE.contexts]
    assert all("positive_control" in str(path) for path in separate.values())


def test_wall_time_ratios_never_decide_the_cost():
    """Issue 40: a study without a timing file answers quality, not cost - its training
    wall-time ratios moved with load (the positive control, exact's arithmetic, read 0.6x)."""
    index = {"contexts": {"512": {"gate_passed": True}}}
    point = {
        "context": 512,
        "arm": "rpka-r16",
        "method": "rpka",
        "rank": 16,
        "gap_mean": 0.98,
        "gap_ci_low": 0.96,
        "gap_ci_high": 1.0,
        "verdict": "non-inferior",
        "step_ratio": 0.75,
        "margin_gap": 0.95,
        "step_source": longrange.STEP_SOURCE_RUNS,
    }
    full = {**point, "arm": "rpka-r4096", "rank": 4096, "step_ratio": 0.6,
            "positive_control": True}  # fmt: skip
    text = longrange.answer_text(index, [point, full])
    assert "Yes" not in text and "Cost not decided" in text
    assert "reads 0.60× at 512" in text and "r 16 at 512" in text
    assert "0.75×" not in text  # an arm's wall-time ratio is not quoted beside its verdict
    timed = {**point, "step_source": longrange.STEP_SOURCE_TIMING}
    assert "Yes" in longrange.answer_text(index, [timed, full])
