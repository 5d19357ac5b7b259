"""A corrupt or swapped cache heals on rerun with the same numbers; errors name the file."""

import json
import shutil

import numpy as np
import pytest
import torch

from rpka import report
from rpka.bench import ensure_weights, run_bench
from rpka.config.presets import get_preset
from rpka.io import (
    RESUME_VOLATILE_KEYS,
    TIMING_KEYS,
    CorruptFileError,
    config_hash,
    file_sha256,
    payload_sha256,
    quarantine,
    read_json,
    read_json_checked,
    read_json_or_heal,
    read_run_file,
    timings_path,
    verify_state_file,
    without_keys,
    write_json,
    write_result_and_timings,
    write_result_json,
    write_run_file,
)
from rpka.paths import resolve
from rpka.training.executors import InProcessExecutor
from rpka.training.trained import load_run_state, load_trained

# the smoke study without its mechanism and output-error studies: four one-epoch runs
CONFIG = get_preset("smoke", train={"epochs": 1}, mechanism=None, output_error_ranks=())
# timings differ between runs, and so does the checksum that covers them
VARYING_KEYS = {"wall_s", "cpu_s", "step_ms_median", "sha256"}


def _numbers(path):
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in VARYING_KEYS}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("healing")
    run_bench(CONFIG, root / "out", InProcessExecutor(), progress=False, data_dir=root / "cache")
    return root


@pytest.fixture
def study(first_run, tmp_path):
    """A copy of the finished study, and a rerun of the bench on it."""
    shutil.copytree(first_run, tmp_path, dirs_exist_ok=True)

    def rerun():
        return run_bench(
            CONFIG,
            tmp_path / "out",
            InProcessExecutor(),
            progress=False,
            data_dir=tmp_path / "cache",
        )

    return tmp_path, rerun


def _run_files(root):
    return sorted((root / "out" / "runs").glob("*.json"))


def _eval_run(root):
    return next(p for p in _run_files(root) if p.with_suffix(".pt").exists())


def _corrupted(folder):
    return sorted(p.name for p in folder.iterdir() if ".corrupt-" in p.name)


CORRUPTIONS = {
    "truncated": lambda b: b[: len(b) // 2],
    "empty": lambda b: b"",
    "garbage": lambda b: b"\x00\xffnot json at all",
    "not an object": lambda b: b"[1, 2, 3]",
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_corrupt_run_json_is_moved_aside_and_rerun(study, corruption, capsys):
    root, rerun = study
    run_file = _run_files(root)[0]
    expected = _numbers(run_file)
    run_file.write_bytes(CORRUPTIONS[corruption](run_file.read_bytes()))
    report = rerun()
    assert any(p.startswith(run_file.name) for p in _corrupted(run_file.parent))
    assert run_file.name in capsys.readouterr().err  # one line saying which file moved
    assert _numbers(run_file) == expected
    assert report["timings"]["n_runs_resumed"] == report["timings"]["n_runs"] - 1


def test_truncated_weights_are_moved_aside_and_rerun(study):
    root, rerun = study
    run_file = _eval_run(root)
    state_file = run_file.with_suffix(".pt")
    expected_state = torch.load(state_file, weights_only=True)
    expected = _numbers(run_file)
    state_file.write_bytes(state_file.read_bytes()[:100])
    with pytest.raises(CorruptFileError, match=state_file.name):
        load_trained(run_file)
    rerun()
    assert any(p.startswith(state_file.name) for p in _corrupted(run_file.parent))
    assert _numbers(run_file) == expected
    state = torch.load(state_file, weights_only=True)
    assert all(torch.equal(state[k], expected_state[k]) for k in expected_state)


def test_run_file_copied_over_another_run_is_rejected_and_rerun(study):
    root, rerun = study
    victim, other = _run_files(root)[:2]
    expected = _numbers(victim)
    shutil.copyfile(other, victim)
    with pytest.raises(CorruptFileError, match="hashes to"):
        read_run_file(victim)
    rerun()
    assert any(p.startswith(victim.name) for p in _corrupted(victim.parent))
    assert _numbers(victim) == expected


def test_run_file_with_an_edited_score_is_rejected_and_rerun(study, capsys):
    root, rerun = study
    run_file = _run_files(root)[0]
    expected = _numbers(run_file)
    data = json.loads(run_file.read_text())
    metric = next(iter(data["scores"]))
    data["scores"][metric] = [-123.0 for _ in data["scores"][metric]]  # valid JSON, same config
    run_file.write_text(json.dumps(data, indent=2))
    with pytest.raises(CorruptFileError, match=f"{run_file.name}: its content does not match"):
        read_run_file(run_file)
    report = rerun()
    assert any(p.startswith(run_file.name) for p in _corrupted(run_file.parent))
    assert run_file.name in capsys.readouterr().err
    assert _numbers(run_file) == expected
    assert report["timings"]["n_runs_resumed"] == report["timings"]["n_runs"] - 1


def _result(run_id="0" * 16):
    config = {"arm": {"name": "exact"}, "lr": 0.01}
    return {
        "run_id": run_id,
        "config": config,
        "arm": "exact",
        "lr": 0.01,
        "seeds": [1, 2],
        "split": "test",
        "scores": {"loss": [0.5, float("nan")]},
        "members": [{"seed": 1}, {"seed": 2}],
        "wall_s": 1.25,
    }


def _named_run_file(folder, result):
    result = {**result, "run_id": config_hash(result["config"])}
    return folder / f"{result['run_id']}.json", result


def test_run_file_round_trip_keeps_the_payload_and_the_run_id(tmp_path):
    path, result = _named_run_file(tmp_path, _result())
    write_run_file(path, result)
    stored = json.loads(path.read_text())
    assert stored["sha256"] == payload_sha256(stored) and len(stored["sha256"]) == 64
    assert stored["run_id"] == result["run_id"] == path.stem  # the checksum is not in run_id
    read = read_run_file(path)
    assert "sha256" not in read
    assert read == {**result, "scores": {"loss": [0.5, None]}}  # NaN is written as null
    write_run_file(path, read)  # rewriting what was read gives the same file
    assert json.loads(path.read_text()) == stored


@pytest.mark.parametrize("edit", ["score", "timing", "checksum", "added key"])
def test_any_edit_of_a_checksummed_run_file_is_corrupt(tmp_path, edit):
    path, result = _named_run_file(tmp_path, _result())
    write_run_file(path, result)
    data = json.loads(path.read_text())
    if edit == "score":
        data["scores"]["loss"][0] = 0.25
    elif edit == "timing":
        data["wall_s"] = 2.5
    elif edit == "checksum":
        data["sha256"] = "0" * 64
    else:
        data["note"] = "hand-edited"
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptFileError, match=rf"{path.name}: .*sha256 checksum"):
        read_run_file(path)


def test_legacy_run_file_without_a_checksum_is_accepted(tmp_path):
    path, result = _named_run_file(tmp_path, _result())
    write_json(path, result)  # as run files were written before the checksum
    assert read_run_file(path)["scores"] == {"loss": [0.5, None]}


def test_committed_run_files_are_accepted_as_they_are():
    committed = sorted(resolve("data/results/full").glob("*/runs/*.json"))[:5]
    assert committed
    for path in committed:
        before = path.read_bytes()
        assert read_run_file(path)["run_id"] == path.stem
        assert path.read_bytes() == before  # read, never rewritten


def test_truncated_track_cache_is_rebuilt(study):
    root, rerun = study
    (cache_file,) = (root / "cache").glob("*.npz")
    expected = dict(np.load(cache_file))
    data = cache_file.read_bytes()
    cache_file.write_bytes(data[: len(data) // 3])
    rerun()
    assert any(p.startswith(cache_file.name) for p in _corrupted(cache_file.parent))
    rebuilt = dict(np.load(cache_file))
    assert rebuilt.keys() == expected.keys()
    assert all(np.array_equal(rebuilt[k], expected[k]) for k in expected)


def test_read_json_checked_names_the_file_and_the_missing_keys(tmp_path):
    path = tmp_path / "bench_report.json"
    path.write_text("{")
    with pytest.raises(CorruptFileError, match="bench_report.json: not valid JSON"):
        read_json_checked(path)
    write_json(path, {"config": {}})
    with pytest.raises(CorruptFileError, match=r"lacks the keys \['arms'\]"):
        read_json_checked(path, ("config", "arms"))
    assert read_json_checked(path, ("config",)) == {"config": {}}


def test_quarantine_moves_the_file_aside_and_says_so(tmp_path, capsys):
    path = tmp_path / "mechanism.json"
    path.write_text("garbage")
    moved = quarantine(path, f"{path}: not valid JSON")
    assert not path.exists() and moved.read_text() == "garbage"
    assert moved.name.startswith("mechanism.json.corrupt-")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and moved.name in err


def test_read_json_or_heal_moves_a_garbage_report_aside(tmp_path, capsys):
    path = tmp_path / "mechanism.json"
    assert read_json_or_heal(path) is None  # missing: nothing to heal
    path.write_text('{"model": "m"')
    assert read_json_or_heal(path, ("model",)) is None
    assert not path.exists() and _corrupted(tmp_path)
    assert "mechanism.json: not valid JSON" in capsys.readouterr().err
    write_json(path, {"model": "m"})
    assert read_json_or_heal(path, ("model",)) == {"model": "m"}


# --------------------------------------------------------------------------- weights checksums


def _edited_weights(state_file):
    """Weights that load and fit the model, but are not the ones the run saved."""
    state = torch.load(state_file, weights_only=True)
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = state[name] + 1e-3
    torch.save(state, state_file)


def test_a_run_records_the_checksum_of_the_weights_it_saved(first_run):
    runs = _run_files(first_run)
    kept = [p for p in runs if p.with_suffix(".pt").exists()]
    assert kept and len(kept) < len(runs)
    for path in runs:
        stored = json.loads(path.read_text())
        state = path.with_suffix(".pt")
        expected = file_sha256(state) if state.exists() else None  # null: saved none
        assert stored["state_sha256"] == expected
        assert stored["sha256"] == payload_sha256(stored)  # covered by the run's own checksum
        assert "state_sha256" not in stored["config"]  # a result key: run ids unchanged
        assert stored["run_id"] == config_hash(stored["config"]) == path.stem


def test_swapped_weights_are_refused_naming_both_files_and_rerun(study, capsys):
    root, rerun = study
    run_file = _eval_run(root)
    state_file = run_file.with_suffix(".pt")
    expected_state = torch.load(state_file, weights_only=True)
    expected = _numbers(run_file)
    _edited_weights(state_file)  # loads fine: before the checksum, accepted silently
    with pytest.raises(CorruptFileError, match="not the state_sha256") as err:
        load_trained(run_file)
    assert state_file.name in str(err.value) and run_file.name in str(err.value)
    with pytest.raises(CorruptFileError, match=state_file.name):
        load_run_state(run_file)
    report = rerun()
    assert any(p.startswith(state_file.name) for p in _corrupted(run_file.parent))
    assert state_file.name in capsys.readouterr().err
    assert report["timings"]["n_runs_resumed"] == report["timings"]["n_runs"] - 1
    assert _numbers(run_file) == expected  # same seeds: same weights, same state_sha256
    state = torch.load(state_file, weights_only=True)
    assert all(torch.equal(state[k], expected_state[k]) for k in expected_state)
    load_trained(run_file)  # healed


def test_ensure_weights_remakes_swapped_weights(study):
    root, _ = study
    run_file = _eval_run(root)
    state_file = run_file.with_suffix(".pt")
    expected_state = torch.load(state_file, weights_only=True)
    assert not ensure_weights(run_file, str(root / "cache"))  # its own weights: kept
    _edited_weights(state_file)
    assert ensure_weights(run_file, str(root / "cache"))  # moved aside and retrained
    assert any(p.startswith(state_file.name) for p in _corrupted(run_file.parent))
    state = torch.load(state_file, weights_only=True)
    assert all(torch.equal(state[k], expected_state[k]) for k in expected_state)


def test_weights_beside_a_run_that_saved_none_are_refused(study):
    root, _ = study
    source = _eval_run(root)
    other = next(p for p in _run_files(root) if not p.with_suffix(".pt").exists())
    shutil.copyfile(source.with_suffix(".pt"), other.with_suffix(".pt"))
    with pytest.raises(CorruptFileError, match="which saved none"):
        load_trained(other)


def test_verify_state_file_accepts_legacy_runs_and_its_own_weights(tmp_path):
    state, run_file = tmp_path / "r.pt", tmp_path / "r.json"
    torch.save({"w": torch.ones(3)}, state)
    verify_state_file(state, {}, run_file)  # a run file written before: any weights accepted
    verify_state_file(state, {"state_sha256": file_sha256(state)}, run_file)
    with pytest.raises(CorruptFileError, match=r"/r\.pt: its sha256 .*/r\.json recorded"):
        verify_state_file(state, {"state_sha256": "0" * 64}, run_file)
    with pytest.raises(CorruptFileError, match="saved none"):
        verify_state_file(state, {"state_sha256": None}, run_file)


def test_a_legacy_run_file_loads_its_weights_as_before(study):
    root, _ = study
    run_file = _eval_run(root)
    data = json.loads(run_file.read_text())
    legacy = {k: v for k, v in data.items() if k not in ("sha256", "state_sha256")}
    write_json(run_file, legacy)  # as run files were written before both checksums
    model, result = load_trained(run_file)
    assert result["run_id"] == run_file.stem and "state_sha256" not in result


# --------------------------------------------------------------------------- result checksums


def test_result_json_round_trip(tmp_path):
    path = tmp_path / "bench_report.json"
    result = {"arms": {"exact": {"full": {"mean": 0.5, "std": float("nan")}}}, "n": (1, 2)}
    write_result_json(path, result)
    stored = json.loads(path.read_text())
    assert stored["sha256"] == payload_sha256(stored) and "sha256" not in result  # not changed
    expected = {"arms": {"exact": {"full": {"mean": 0.5, "std": None}}}, "n": [1, 2]}
    assert read_json(path) == read_json_checked(path, ("arms",)) == expected  # checksum dropped
    write_result_json(path, read_json(path))  # rewriting what was read gives the same file
    assert json.loads(path.read_text()) == stored
    write_json(path, expected)  # a legacy result: no checksum, read as it is
    assert read_json_checked(path) == expected
    legacy = path.read_bytes()
    write_result_json(path, expected)  # the same payload again (the study index rewritten
    assert path.read_bytes() == legacy  # over committed results): the file is left as it is
    write_result_json(path, {**expected, "n": [3]})  # a new result: written, with a checksum
    assert read_json(path)["n"] == [3] and "sha256" in json.loads(path.read_text())


def test_a_resumed_report_keeps_the_file_its_runs_wrote(tmp_path):
    """Only the resume's own timings differ (RESUME_VOLATILE_KEYS, at any depth): the file
    and its original timings stay, so a clone's `make report` leaves it as committed; a
    changed score is written."""
    path = tmp_path / "bench_report.json"
    first = {"arms": {"exact": {"mean": 0.5, "wall_s": 90.0}}, "timings": {"total_s": 600.0}}
    write_result_json(path, first, RESUME_VOLATILE_KEYS)
    before = path.read_bytes()
    resumed = {"arms": {"exact": {"mean": 0.5, "wall_s": 0.1}}, "timings": {"total_s": 0.2}}
    write_result_json(path, resumed, RESUME_VOLATILE_KEYS)
    assert path.read_bytes() == before
    write_result_json(path, resumed)  # without volatile keys every difference counts
    assert read_json(path)["timings"] == {"total_s": 0.2}
    moved = {**resumed, "arms": {"exact": {"mean": 0.6, "wall_s": 0.1}}}
    write_result_json(path, moved, RESUME_VOLATILE_KEYS)
    assert read_json(path)["arms"]["exact"]["mean"] == 0.6


def test_a_summary_holds_no_time_its_timings_live_beside_it(tmp_path):
    """Issue 56: no committed result holds a time that changes on every run. The times go to
    ``<name>.timings`` (nested as they were, list items included), ``read_json`` merges them
    back, a rerun with the same scores rewrites neither file, and a changed score rewrites
    both."""
    path = tmp_path / "bench_report.json"
    result = {
        "arms": {"exact": {"mean": 0.5, "step_ms_median": 12.0}},
        "rows": [{"arm": "exact", "seconds": 3.0}, {"arm": "rpka"}],
        "timings": {"total_s": 600.0},
    }
    write_result_and_timings(path, result, TIMING_KEYS)
    stored = json.loads(path.read_text())
    assert "timings" not in stored and "step_ms_median" not in stored["arms"]["exact"]
    assert "seconds" not in stored["rows"][0] and "sha256" in stored
    assert json.loads(timings_path(path).read_text())["timings"]["timings"] == {"total_s": 600.0}
    assert read_json(path) == result
    before = (path.read_bytes(), timings_path(path).read_bytes())
    rerun = {**result, "timings": {"total_s": 0.2}}
    write_result_and_timings(path, rerun, TIMING_KEYS)
    assert (path.read_bytes(), timings_path(path).read_bytes()) == before
    moved = {**rerun, "arms": {"exact": {"mean": 0.6, "step_ms_median": 11.0}}}
    write_result_and_timings(path, moved, TIMING_KEYS)
    assert read_json(path) == moved
    write_result_json(path, {"arms": {"exact": {"mean": 0.7}}})  # replaced by another writer:
    assert read_json(path) == {"arms": {"exact": {"mean": 0.7}}}  # the timings are not its


@pytest.mark.parametrize("name", ["mechanism.json", "study.json", "frontier.json"])
def test_an_edited_result_value_is_refused_naming_the_file(tmp_path, name, capsys):
    path = tmp_path / name
    write_result_json(path, {"model": "m", "trained": {"mechanism_signature": {"chi2": 1.5}}})
    data = json.loads(path.read_text())
    data["trained"]["mechanism_signature"]["chi2"] = 0.5  # valid JSON, same keys
    path.write_text(json.dumps(data, indent=2))
    for read in (read_json, read_json_checked):  # every reader (summary, report, study)
        with pytest.raises(CorruptFileError, match=rf"{name}: its content does not match"):
            read(path)
    assert path.exists()  # a reader never moves it
    assert read_json_or_heal(path, ("model",)) is None  # its producer moves it aside, redoes it
    assert _corrupted(tmp_path) and name in capsys.readouterr().err


def _bench_study(root, tmp_path):
    """A study index over a copy of the first run's bench report (written with its checksum)."""
    shutil.copyfile(root / "out" / "bench_report.json", tmp_path / "bench_report.json")
    shutil.copyfile(root / "out" / "bench_report.timings", tmp_path / "bench_report.timings")
    index = tmp_path / "study.json"
    write_result_json(index, {"tracks": {"forecast": {"bench_report": "bench_report.json"}}})
    return index


def test_an_edited_arm_mean_in_a_bench_report_is_refused_by_the_report(first_run, tmp_path):
    index = _bench_study(first_run, tmp_path)
    bench = tmp_path / "bench_report.json"
    assert "sha256" in json.loads(bench.read_text())
    loaded = report.load_study(index, "smoke", compute=False)  # the round trip reads
    (track,) = loaded["tracks"].values()
    primary = track["report"]["primary_arm"]
    assert "sha256" not in track["report"]
    data = json.loads(bench.read_text())
    data["arms"][primary]["full"]["mean"] = -123.0  # the campaign's edit
    bench.write_text(json.dumps(data, indent=2))
    with pytest.raises(CorruptFileError, match="bench_report.json: its content does not match"):
        report.load_study(index, "smoke", compute=False)
    assert json.loads(bench.read_text()) == data  # never moved or rewritten by the reader


def test_committed_result_files_are_sealed_and_read_as_they_are():
    root = resolve("data/results/full")
    files = [root / "study.json", root / "frontier.json", root / "bench_report.json"]
    files += sorted(root.glob("*/mechanism.json")) + sorted(root.glob("*/bench_report.json"))
    before = {path: path.read_bytes() for path in files}
    for path in files:  # sealed (io.seal_result_json, docs/executors.md): checked on read
        stored = json.loads(before[path])
        assert "sha256" in stored, path
        read = read_json_checked(path)  # with its timings (from beside it) merged back
        assert without_keys(read, TIMING_KEYS) == {k: v for k, v in stored.items() if k != "sha256"}
    loaded = report.load_study(root / "study.json", "full", compute=False)
    assert loaded["tracks"]
    assert {path: path.read_bytes() for path in files} == before  # read, never rewritten


def test_sealing_a_legacy_result_adds_its_checksum_and_nothing_else(tmp_path):
    from rpka.io import CHECKSUM_KEY, read_json, seal_result_json, write_json

    path = tmp_path / "bench_report.json"
    write_json(path, {"arms": {"exact": {"mean": 0.5}}})  # written before checksums
    assert seal_result_json(path) is True
    assert CHECKSUM_KEY in json.loads(path.read_text())
    assert read_json(path) == {"arms": {"exact": {"mean": 0.5}}}
    assert seal_result_json(path) is False  # sealed once
    sealed = json.loads(path.read_text())
    sealed["arms"]["exact"]["mean"] = -123.0  # an edit after sealing is refused
    path.write_text(json.dumps(sealed))
    with pytest.raises(CorruptFileError, match="bench_report.json"):
        read_json(path)


def test_a_run_retrained_for_its_weights_keeps_its_committed_file(tmp_path):
    """Same scores and weights, other timings (a clone retrains the runs whose weights a
    later stage reads): the committed run file stays byte for byte; another score is
    written."""
    path = tmp_path / "run.json"
    run = {"scores": {"mse": [0.25]}, "wall_s": 85.1, "cpu_s": 56.7, "step_ms_median": 137.9,
           "warm_start": {"wall_s": 3.0, "cpu_s": 2.0}}  # fmt: skip
    write_run_file(path, run)
    before = path.read_bytes()
    slower = {**run, "wall_s": 145.2, "cpu_s": 103.8, "step_ms_median": 439.8,
              "warm_start": {"wall_s": 9.0, "cpu_s": 7.0}}  # fmt: skip
    write_run_file(path, slower)
    assert path.read_bytes() == before
    write_run_file(path, {**slower, "scores": {"mse": [0.26]}})
    assert read_json(path)["scores"] == {"mse": [0.26]}
