"""Only the evaluation runs a later stage reads keep their weights, and a bench whose
weights are all gone (a clone of the committed study) resumes: it retrains only the runs
whose weights a stage that has no current output needs, with the same numbers."""

import json
import shutil

import pytest

from rpka.bench import keeps_weights, make_jobs, run_bench, weight_readers
from rpka.config.presets import get_preset
from rpka.io import CorruptFileError, read_json
from rpka.training.executors import InProcessExecutor
from rpka.training.run_config import run_id
from rpka.training.trained import load_trained

# the smoke study (mechanism and output-error studies on), one seed per job: two evaluation
# groups per arm, of which only the first may keep weights
CONFIG = get_preset("smoke", train={"epochs": 1}, seeds_per_job=1)
# timings differ between runs, and so does the checksum that covers them (the weights'
# checksum, state_sha256, does not: same seeds, same weights, same bytes)
VARYING_KEYS = {"wall_s", "cpu_s", "step_ms_median", "sha256"}


def _numbers(path):
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in VARYING_KEYS}


def _without_timings(mechanism):
    for study in ("trained", "init"):
        mechanism[study].pop("timings_s")
        mechanism[study]["quality"].pop("seconds")
    return mechanism


def _first_eval_run(report, arm):
    return report["arms"][arm]["run_ids"][0]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    report = run_bench(CONFIG, root / "out", InProcessExecutor(), progress=False,
                       data_dir=root / "cache")  # fmt: skip
    return root, report


@pytest.fixture
def clone(first_run, tmp_path):
    """A copy of the finished study without any weights, and a rerun of the bench on it."""
    root, report = first_run
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    for state in (tmp_path / "out" / "runs").glob("*.pt"):
        state.unlink()

    def rerun():
        return run_bench(CONFIG, tmp_path / "out", InProcessExecutor(), progress=False,
                         data_dir=tmp_path / "cache")  # fmt: skip

    return tmp_path / "out", report, rerun


def test_only_the_runs_a_later_stage_reads_keep_weights(first_run):
    root, report = first_run
    runs = root / "out" / "runs"
    readers = weight_readers(CONFIG)
    assert readers == {
        "exact": ("spectrum", "drop_in", "output_error"),
        "rpka-r4": ("mechanism", "output_error"),
    }
    kept = {p.stem for p in runs.glob("*.pt")}
    assert kept == {_first_eval_run(report, arm) for arm in readers}
    assert len(list(runs.glob("*.json"))) == report["timings"]["n_runs"] > len(kept) + 2
    for arm in ("exact", "rpka-r4"):  # the second evaluation group wrote no weights
        second = report["arms"][arm]["run_ids"][1]
        assert (runs / f"{second}.json").exists() and not (runs / f"{second}.pt").exists()


def test_keeps_weights_follows_the_stages_asked_for():
    bare = get_preset("smoke", mechanism=None, output_error_ranks=())
    assert weight_readers(bare) == {"exact": ("spectrum", "drop_in")}
    assert keeps_weights(bare, "exact", "eval", 0)
    assert not keeps_weights(bare, "rpka-r4", "eval", 0)
    assert not keeps_weights(CONFIG, "rpka-r4", "eval", 1)
    assert not keeps_weights(CONFIG, "rpka-r4", "sweep", 0)


def test_run_ids_do_not_depend_on_kept_weights(tmp_path):
    arm = CONFIG.arm("rpka-r4")
    jobs = make_jobs(CONFIG, arm, 3e-3, "eval", tmp_path, str(tmp_path), False)
    assert "state_path" in jobs[0].run_config and "state_path" not in jobs[1].run_config
    for job in jobs:
        without = {k: v for k, v in job.run_config.items() if k != "state_path"}
        assert job.path.stem == run_id(job.run_config) == run_id(without)


def test_a_clone_without_weights_resumes_every_run(clone):
    out, before, rerun = clone
    report = rerun()
    assert report["timings"]["n_runs_resumed"] == report["timings"]["n_runs"]
    assert list((out / "runs").glob("*.pt")) == []  # nothing retrained
    assert report["output_error"] == before["output_error"]
    assert report["mechanism_signature"] == before["mechanism_signature"]


def test_a_stage_without_its_output_retrains_only_its_runs_bit_for_bit(clone):
    out, before, rerun = clone
    primary = _first_eval_run(before, "rpka-r4")
    expected = _numbers(out / "runs" / f"{primary}.json")
    mechanism = _without_timings(read_json(out / "mechanism.json"))  # checksum verified, dropped
    (out / "mechanism.json").unlink()
    report = rerun()
    assert report["timings"]["n_runs_resumed"] == report["timings"]["n_runs"] - 1
    assert {p.stem for p in (out / "runs").glob("*.pt")} == {primary}
    assert _numbers(out / "runs" / f"{primary}.json") == expected  # same seeds, same numbers
    assert _without_timings(read_json(out / "mechanism.json")) == mechanism


def test_the_output_error_study_retrains_the_runs_it_reads(clone):
    out, before, rerun = clone
    (out / "bench_report.json").unlink()
    report = rerun()
    readers = {_first_eval_run(before, arm) for arm in ("exact", "rpka-r4")}
    assert report["timings"]["n_runs_resumed"] == report["timings"]["n_runs"] - 2
    assert {p.stem for p in (out / "runs").glob("*.pt")} == readers
    assert report["output_error"] == before["output_error"]


def test_corrupt_weights_are_still_moved_aside_and_rerun(clone, first_run):
    out, before, rerun = clone
    primary = _first_eval_run(before, "rpka-r4")
    state = out / "runs" / f"{primary}.pt"
    state.write_bytes((first_run[0] / "out" / "runs" / state.name).read_bytes()[:100])
    report = rerun()
    assert any(p.name.startswith(f"{state.name}.corrupt-") for p in state.parent.iterdir())
    assert report["timings"]["n_runs_resumed"] == report["timings"]["n_runs"] - 1
    assert state.exists()


def test_another_runs_weights_swapped_in_are_refused_and_rerun(clone, first_run):
    """exact's weights copied over the primary arm's: they load and fit the model (before
    the weights' checksum they were accepted), but are not the weights that run saved."""
    out, before, rerun = clone
    primary, exact = (_first_eval_run(before, arm) for arm in ("rpka-r4", "exact"))
    runs = out / "runs"
    expected = _numbers(runs / f"{primary}.json")
    state = runs / f"{primary}.pt"
    shutil.copyfile(first_run[0] / "out" / "runs" / f"{exact}.pt", state)
    with pytest.raises(CorruptFileError, match=f"{state.name}: its sha256") as err:
        load_trained(runs / f"{primary}.json")
    assert f"{primary}.json" in str(err.value)  # both files named
    report = rerun()
    assert any(p.name.startswith(f"{state.name}.corrupt-") for p in runs.iterdir())
    assert report["timings"]["n_runs_resumed"] == report["timings"]["n_runs"] - 1
    assert _numbers(runs / f"{primary}.json") == expected  # the same weights, same state_sha256
    assert report["mechanism_signature"] == before["mechanism_signature"]


def test_an_edited_mechanism_value_is_moved_aside_and_recomputed(clone):
    """A value of mechanism.json changed by hand no longer flows into the bench report: the
    bench moves the file aside and studies the model again (retraining its run)."""
    out, before, rerun = clone
    path = out / "mechanism.json"
    expected = _without_timings(read_json(path))
    data = json.loads(path.read_text())
    signature = data["trained"]["mechanism_signature"]
    key = next(k for k, v in signature.items() if isinstance(v, float))
    signature[key] = -123.0  # valid JSON, same keys
    path.write_text(json.dumps(data, indent=2))
    with pytest.raises(CorruptFileError, match="mechanism.json: its content does not match"):
        read_json(path)
    report = rerun()
    assert any(p.name.startswith("mechanism.json.corrupt-") for p in out.iterdir())
    assert report["mechanism_signature"] == before["mechanism_signature"]
    assert report["mechanism_signature"][key] != -123.0
    assert _without_timings(read_json(path)) == expected
