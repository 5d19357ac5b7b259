"""A corrupt or swapped cache heals on rerun with the same numbers; errors name the file."""

import json
import shutil

import numpy as np
import pytest
import torch

from rpka.bench import run_bench
from rpka.executors import InProcessExecutor
from rpka.io import (
    CorruptFileError,
    config_hash,
    payload_sha256,
    quarantine,
    read_json_checked,
    read_json_or_heal,
    read_run_file,
    write_json,
    write_run_file,
)
from rpka.paths import resolve
from rpka.presets import get_preset
from rpka.train import load_trained

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
