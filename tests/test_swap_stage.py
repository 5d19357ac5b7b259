"""The study's rpka.swap audit (issue 42): the stage, its sealed file, the report's section,
and notebook 07 in a report from the results."""

import json

import nbformat
import papermill
import pytest

from rpka import paths
from rpka.io import CHECKSUM_KEY, read_json_checked
from rpka.paths import REPO_ROOT
from rpka.report import Figures
from rpka.report.swap_audit import swap_section
from rpka.study.steps import NOTEBOOKS, SWAP_STEP, compute_steps, render_steps
from rpka.swap import stage

SMALL = {**stage.AUDIT_CONFIG, "train_steps": 5, "ranks": [4, 64], "eval_sequences": 4}


@pytest.fixture(scope="module")
def small_audit(tmp_path_factory):
    path = tmp_path_factory.mktemp("swap") / "swap_audit.json"
    return path, stage.resume_or_run_audit(path, SMALL)


def test_the_audit_is_sealed_without_cpu_times_and_resumed_when_its_config_matches(
    small_audit, monkeypatch
):
    path, result = small_audit
    assert read_json_checked(path) == result
    assert CHECKSUM_KEY in json.loads(path.read_text())
    assert result["training"]["steps"] == 5
    rows = result["rows"]
    assert {row["rank"] for row in rows} == {4, 64} and len(rows) == 4  # two sites
    assert not set(stage.TIMING_COLUMNS) & set(rows[0])
    # the rank law per site (issue 54 item 6), from the committed law v2 fit
    assert result["law"] == {"eps": 0.03, "source": paths.RANK_LAW_JSON}
    for row in rows:
        assert row["rho"] > 0 and row["predicted_rank"] >= 1
        assert 0 <= row["error_at_predicted"] < 1
    before = path.read_bytes()

    def refuse(config):
        raise AssertionError("the audit ran again")

    monkeypatch.setattr(stage, "run_audit", refuse)
    assert stage.resume_or_run_audit(path, SMALL) == result  # resumed: nothing trained
    assert path.read_bytes() == before
    with pytest.raises(AssertionError, match="ran again"):  # another config: run again
        stage.resume_or_run_audit(path, {**SMALL, "ranks": [4]})


def test_the_audit_is_a_stage_and_07_runs_before_the_report():
    assert NOTEBOOKS[-1] == "06_report.ipynb" and "07_your_model.ipynb" in NOTEBOOKS
    for preset in ("smoke", "standard"):
        steps = {label: outputs for label, _, outputs in compute_steps(preset, progress=False)}
        assert steps[SWAP_STEP] == (paths.swap_audit_json(preset),)
        assert paths.swap_audit_json(preset) == f"data/results/{preset}/swap_audit.json"
        assert SWAP_STEP not in {label for label, _, _ in render_steps(preset)}


def test_the_report_section_draws_the_audit_or_says_it_was_not_run(small_audit, tmp_path):
    path, result = small_audit
    figs = Figures(figures_dir=tmp_path)
    items = swap_section(result, figs, path)
    assert len(items) == 3 and figs.count == 1
    assert "docs/swap.md" in items[0].data and "07_your_model.ipynb" in items[0].data
    assert "<figure" in items[2].data and (tmp_path / "report_swap_errors.png").exists()
    assert "predicts for an output error 0.03" in items[0].data
    assert "predicted_rank" in items[1].data and "error_at_predicted" in items[1].data
    missing = swap_section(None, Figures(), "data/results/x/swap_audit.json")
    assert len(missing) == 1
    assert "was not run for this study (`data/results/x/swap_audit.json`" in missing[0].data


def test_07_from_the_results_trains_nothing_and_says_what_is_missing(tmp_path):
    papermill.execute_notebook(
        str(REPO_ROOT / "notebooks" / "07_your_model.ipynb"), str(tmp_path / "out.ipynb"),
        kernel_name="python3", progress_bar=False, cwd=str(REPO_ROOT),
        parameters={"swap_audit_json": str(tmp_path / "none.json"),
                    "figures_dir": str(tmp_path / "figures"), "compute_missing": False},
    )  # fmt: skip
    assert not (tmp_path / "none.json").exists()
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    shown = "".join(str(o.get("data", {})) for c in out.cells for o in c.get("outputs", []))
    assert "a report from the results trains nothing" in shown
    assert "not run in a report from the results" in shown


def test_the_committed_audits_are_the_stage_config():
    """The committed audits were made with the stage's configuration (full rank exact, the
    rank law's columns), so a clone's report resumes them instead of rewriting them."""
    for preset in ("standard", "full"):
        committed = REPO_ROOT / paths.swap_audit_json(preset)
        if committed.exists():
            audit = read_json_checked(committed)
            assert audit["config"] == stage.AUDIT_CONFIG
            assert {"rho", "predicted_rank", "error_at_predicted"} <= set(audit["rows"][0])
