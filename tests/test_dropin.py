"""rpka.study.dropin: exact's trained model with another method swapped in (scripts/drop_in.py is
its command line); on a clone without weights it retrains exact's run first, same numbers."""

import shutil

import pytest

from rpka.bench import run_bench
from rpka.config.presets import get_preset
from rpka.study.dropin import drop_in, full_rank
from rpka.training.executors import InProcessExecutor

CONFIG = get_preset("smoke", train={"epochs": 1}, seeds_per_job=1)


def _without_seconds(result):
    for row in result["rows"]:
        row.pop("seconds")
    return result


def test_full_rank_is_every_joint_point_or_every_key():
    assert full_rank("rpka", 32) == 64
    assert full_rank("nystrom-uniform", 32) == 64
    assert full_rank("keys-coreset", 32) == 32


def test_windows_below_one_are_refused_before_anything_is_read(tmp_path):
    with pytest.raises(ValueError, match="windows must be an integer >= 1"):
        drop_in(tmp_path / "no-bench", windows=0)


def test_drop_in_on_a_clone_without_weights_retrains_and_matches(tmp_path):
    out, cache = tmp_path / "out", str(tmp_path / "cache")
    run_bench(CONFIG, out, InProcessExecutor(), progress=False, data_dir=cache)
    options = {"ranks": ["4", "full"], "methods": ["rpka"], "windows": 8, "data_dir": cache}
    first = drop_in(out, out=tmp_path / "first.json", log=None, **options)
    assert list((out / "runs").glob("*.pt"))
    assert first["rows"][-1]["full_rank"] and first["rows"][-1]["rank"] == 64
    assert [row["dtype"] for row in first["rows"]] == ["float32", "float64"] * 2
    clone = tmp_path / "clone"
    shutil.copytree(out, clone)
    for state in (clone / "runs").glob("*.pt"):
        state.unlink()
    again = drop_in(clone, out=tmp_path / "again.json", log=None, **options)
    assert list((clone / "runs").glob("*.pt"))  # exact's run retrained for its weights
    for result in (first, again):
        for key in ("bench_report", "run_file"):
            result.pop(key)
    assert _without_seconds(again) == _without_seconds(first)
