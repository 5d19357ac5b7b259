"""A newcomer's first command leaves the clone as it found it (issue 43, item 1; issue 56,
item 1): a user's run writes under ``out/<preset>/`` (ignored by git), resumes from the
committed study without writing it, and ends comparing itself with that study
(``rpka.study.reproduction``); only ``report --publish`` rewrites the committed study."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from rpka import paths
from rpka.io import read_json, write_result_json
from rpka.paths import REPO_ROOT
from rpka.study import reproduction


def _git(*args: str, cwd: os.PathLike) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


def _report(clone, *args: str) -> subprocess.CompletedProcess:
    # the clone's own package, in this process and in the notebook kernels it starts
    env = {k: v for k, v in os.environ.items() if k not in (paths.OUTPUT_ENV, "RPKA_ROOT")}
    env["PYTHONPATH"] = str(clone)
    return subprocess.run(
        [sys.executable, "-m", "rpka", "report", *args, "--no-progress"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    where = tmp_path_factory.mktemp("first") / "clone"
    _git("clone", "--quiet", str(REPO_ROOT), str(where), cwd=where.parent)
    return where


@pytest.mark.slow
def test_a_report_from_the_committed_results_leaves_a_clone_clean(clone):
    done = _report(clone, "--preset", "standard", "--from-results")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _git("status", "--porcelain", cwd=clone) == ""
    assert (clone / "out" / "standard" / "rpka_report.html").is_file()
    assert (clone / "out" / "standard" / "figures").is_dir()
    assert "the committed study itself" in done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_smoke_run_writes_only_under_out_and_says_how_it_compares(clone):
    done = _report(clone, "--preset", "smoke")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _git("status", "--porcelain", cwd=clone) == ""  # nothing committed was touched
    assert _git("status", "--porcelain", "--ignored", "data/results", "figures", cwd=clone) == ""
    run = clone / "out" / "smoke"
    assert (run / "rpka_report.html").is_file()
    assert list((run / "results").rglob("bench_report.json"))
    assert list((run / "figures").glob("*.png"))
    assert "No committed study" in done.stdout.strip().splitlines()[-1]
    assert read_json(run / paths.REPRODUCTION_FILE)["outcome"] == reproduction.NO_REFERENCE


def test_publish_is_refused_for_a_preset_without_a_committed_study(capsys):
    from rpka.cli.commands import report_main

    with pytest.raises(SystemExit) as stop:
        report_main(["--preset", "smoke", "--publish"])
    assert stop.value.code == 2
    assert "--publish: preset smoke has no committed study" in capsys.readouterr().err


# --------------------------------------------------------------------------- the layout


def test_a_users_run_is_laid_out_under_out_and_publishing_under_the_committed_study(
    monkeypatch,
):
    monkeypatch.delenv(paths.OUTPUT_ENV, raising=False)
    monkeypatch.delenv(paths.READ_COMMITTED_ENV, raising=False)
    assert paths.results_dir("full") == "data/results/full"  # the committed layout
    assert paths.figures_dir("full") == "figures/full"
    monkeypatch.setenv(paths.OUTPUT_ENV, "out")
    assert paths.results_dir("full") == "out/full/results"
    assert paths.figures_dir("full") == "out/full/figures"
    assert paths.report_html("full") == "out/full/rpka_report.html"
    assert paths.committed_results_dir("full") == "data/results/full"
    monkeypatch.setenv(paths.READ_COMMITTED_ENV, "1")  # --from-results: read, never written
    assert paths.results_dir("full") == "data/results/full"
    assert paths.figures_dir("full") == "out/full/figures"


# --------------------------------------------------------------------------- the comparison


@pytest.fixture
def two_studies(tmp_path, monkeypatch):
    """A user's run seeded from a copy of the committed standard study (``committed``)."""
    committed = tmp_path / "data" / "results" / "standard"
    shutil.copytree(REPO_ROOT / "data" / "results" / "standard", committed)
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    monkeypatch.setenv(paths.OUTPUT_ENV, str(tmp_path / "out"))
    monkeypatch.delenv(paths.READ_COMMITTED_ENV, raising=False)
    before = {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()}
    copied = reproduction.seed_results("standard")
    assert copied == len(before)
    assert {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()} == before
    return tmp_path / "out" / "standard" / "results", committed


def test_a_resumed_copy_reproduces_bit_for_bit(two_studies):
    mine, committed = two_studies
    check = reproduction.compare(mine, committed)
    assert check["outcome"] == reproduction.REPRODUCED, check["sentence"]
    assert check["run_ids"]["both"] == len(reproduction.run_files(committed)) > 0
    assert check["run_ids"]["written_anew"] == 0
    assert check["verdicts"]["compared"] > 0 and not check["verdicts"]["differ"]
    assert set(check["largest_per_seed_difference"].values()) == {0.0}
    assert check["sentence"].startswith("Reproduced bit for bit")
    assert reproduction.seed_results("standard") == 0  # the user's files are kept


def _move_a_run(results, delta):
    """Change one run's first score by ``delta`` and the lm bench's first per-seed score."""
    run = sorted(reproduction.run_files(results).values())[0]
    data = read_json(run)
    metric = next(iter(data["scores"]))
    data["scores"][metric][0] += delta
    write_result_json(run, data)
    report_path = results / "lm" / "bench_report.json"
    report = read_json(report_path)
    report["arms"]["exact"]["full"]["per_seed"][0] += delta
    write_result_json(report_path, report)


def test_moved_scores_under_another_vendor_are_named_with_their_size(two_studies):
    mine, committed = two_studies
    _move_a_run(mine, 3e-7)
    unrecorded = reproduction.compare(mine, committed)  # the committed files name no CPU
    assert "the committed run files do not record their CPU" in unrecorded["sentence"]
    for folder, vendor, model in ((mine, "AuthenticAMD", "AMD EPYC 7B13"),
                                  (committed, "GenuineIntel", "Intel(R) Xeon(R)")):  # fmt: skip
        for run in reproduction.run_files(folder).values():
            data = read_json(run)
            data["numerics"] = {"cpu_vendor": vendor, "cpu_model": model}
            write_result_json(run, data)
    check = reproduction.compare(mine, committed)
    assert check["outcome"] == reproduction.WITHIN
    assert math.isclose(check["largest_difference"], 3e-7, rel_tol=1e-3)
    assert check["largest_per_seed_difference"]["lm/exact"] == pytest.approx(3e-7, rel=1e-3)
    assert "another CPU vendor (AuthenticAMD here" in check["sentence"]
    assert "scores within 3.0e-07" in check["sentence"]
    lines = reproduction.lines(check)
    assert lines[2].startswith("CPU here: AuthenticAMD, AMD EPYC 7B13")
    assert lines[3].startswith("CPU of the committed study: GenuineIntel, Intel(R) Xeon(R)")
    assert lines[-1] == check["sentence"]


def test_a_changed_verdict_or_missing_run_is_a_difference(two_studies):
    mine, committed = two_studies
    index = read_json(mine / "study.json")
    track = next(iter(index["tracks"]))
    arm = next(iter(index["tracks"][track]["verdicts"]))
    index["tracks"][track]["verdicts"][arm] = "significant win"
    write_result_json(mine / "study.json", index)
    gone = sorted(reproduction.run_files(mine).values())[-1]
    gone.unlink()
    check = reproduction.compare(mine, committed)
    assert check["outcome"] == reproduction.DIFFERS
    assert f"{track}/{arm}: significant win here" in check["sentence"]
    assert "1 only in the committed study" in check["sentence"]
    json.dumps(reproduction.lines(check))


def test_the_committed_study_against_itself_is_said_so():
    folder = paths.committed_results_dir("standard")
    assert reproduction.compare(folder, folder)["outcome"] == reproduction.SAME_STUDY


# --------------------------------------------------------------------------- a re-sealed edit


def _hostile_edit(folder):
    """The campaign's sequence (issue 56): the primary mean of a committed bench report set
    to -123 and its checksum deleted, then the folder sealed again."""
    path = folder / "bench_report.json"
    data = json.loads(path.read_text())
    data["arms"][data["primary_arm"]]["full"]["mean"] = -123.0
    data.pop("sha256")
    path.write_text(json.dumps(data))
    return path


def _seal_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("seal", REPO_ROOT / "scripts/seal_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_seal_script_refuses_an_edited_summary(tmp_path, capsys):
    folder = tmp_path / "full"
    shutil.copytree(REPO_ROOT / "data/results/standard", folder)
    path = _hostile_edit(folder)
    edited = path.read_bytes()
    assert _seal_script().main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert "not sealed: its summaries disagree with its own per-seed scores" in err
    assert ".full.mean is -123.0" in err
    assert path.read_bytes() == edited  # nothing written


def test_the_report_refuses_an_edited_summary_even_when_resealed(tmp_path, monkeypatch):
    from rpka.io import CorruptFileError, seal_result_json
    from rpka.study import results_check

    results = tmp_path / "data" / "results" / "standard"
    shutil.copytree(REPO_ROOT / "data/results/standard", results)
    seal_result_json(_hostile_edit(results))  # sealed past the script's check
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    monkeypatch.delenv(paths.OUTPUT_ENV, raising=False)
    with pytest.raises(CorruptFileError, match=r"full\.mean is -123\.0 but its per-seed"):
        results_check.check_study("standard")


@pytest.mark.parametrize(
    "edit, found",
    [
        (lambda r: r["arms"]["exact"]["full"].__setitem__("n", 99), "exact.full.n is 99"),
        (lambda r: r["arms"]["exact"]["full"].__setitem__("std", 0.5), "exact.full.std is 0.5"),
        (lambda r: r["arms"][r["primary_arm"]]["comparison"].update(verdict="significant win"),
         "comparison.verdict is 'significant win' but its per-seed scores give"),
        (lambda r: r["idea"]["full"].__setitem__("mean", 1.0), "idea.full.mean is 1.0"),
    ],
)  # fmt: skip
def test_every_summary_is_recomputed_from_the_per_seed_scores(edit, found):
    from rpka.verdict.consistency import bench_report_problems

    report = read_json(REPO_ROOT / "data/results/standard/bench_report.json")
    assert bench_report_problems(report) == []
    edit(report)
    assert any(found in problem for problem in bench_report_problems(report))


def test_every_notebooks_parameter_cell_lists_the_valid_presets():
    """A reader opening a notebook sees which presets it takes (issue 56)."""
    from rpka.config.presets import STUDY_PRESETS

    for notebook in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        (cell,) = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
        line = next(x for x in cell["source"] if x.startswith("preset = "))
        assert all(f"'{name}'" in line for name in STUDY_PRESETS), (notebook.name, line)


def test_another_thread_count_is_named_as_the_reason(two_studies):
    """A run file retrained with another torch thread count (OMP_NUM_THREADS=1 against the
    committed 2) moves in its last bits: measured on the standard study's demo runs, 1.2e-4."""
    mine, _ = two_studies
    committed = mine.parent.parent.parent / "data" / "results" / "standard"
    run = sorted(reproduction.run_files(mine).values())[0]
    data = read_json(run)
    data["torch_threads"] = (data.get("torch_threads") or 2) + 7
    data["scores"][next(iter(data["scores"]))][0] += 1e-4
    write_result_json(run, data)
    check = reproduction.compare(mine, committed)
    assert check["outcome"] == reproduction.WITHIN
    assert "another torch thread count in the run files that moved" in check["sentence"]
