"""The one timing protocol of the long-range study (issue 40, ``rpka.study.steptime``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from rpka.cli.longrange import steptime_main
from rpka.config.presets import get_preset
from rpka.config.presets_longctx import get_longctx_preset
from rpka.io import CorruptFileError, read_json
from rpka.paths import BENCH_REPORT_FILE, TRACK_STEPTIME_FILE
from rpka.study.steptime import (
    MIN_REPEATS,
    STEPTIME_FILE,
    ratio_summary,
    run_steptime,
    run_track_steptime,
)
from rpka.verdict.step_cost import with_step_timing


def test_the_ratio_interval_is_the_t_interval_of_the_per_repeat_ratios():
    arm, base = [2.0, 3.0, 2.5, 2.2], [4.0, 5.0, 5.0, 4.0]
    ratios = np.array(arm) / np.array(base)
    half = stats.t.ppf(0.975, 3) * ratios.std(ddof=1) / 2
    out = ratio_summary(arm, base)
    assert out["mean"] == pytest.approx(ratios.mean())
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(
        (ratios.mean() - half, ratios.mean() + half)
    )
    assert ratio_summary([1.0], [2.0])["ci_low"] is None


def test_a_smoke_timing_file_is_sealed_and_complete(tmp_path):
    config = get_longctx_preset("longrange-power-smoke", contexts=(72,))
    result = run_steptime(config, tmp_path, repeats=MIN_REPEATS, warmup=1, arms=["rpka-r4"])
    path = tmp_path / STEPTIME_FILE
    stored = read_json(path)  # verifies the checksum
    assert "sha256" in json.loads(path.read_text()) and stored["contexts"] == result["contexts"]
    arms = stored["contexts"]["72"]
    assert list(arms) == ["exact", "rpka-r4"]  # exact is always timed: every ratio is to it
    for entry in arms.values():
        assert len(entry["cpu_s"]) == len(entry["wall_s"]) == MIN_REPEATS
        assert entry["peak_mib"] > 0 and entry["members"] == config.bench.execution.seeds_per_job
    assert arms["exact"]["step_ratio_cpu"]["mean"] == pytest.approx(1.0)
    assert len(stored["load_average_start"]) == len(stored["load_average_end"]) == 3
    path.write_text(path.read_text().replace('"repeats": 7', '"repeats": 8'))  # edited by hand
    with pytest.raises(CorruptFileError):
        read_json(path)


def test_too_few_repeats_or_an_unknown_arm_are_refused(tmp_path):
    config = get_longctx_preset("longrange-power-smoke", contexts=(72,))
    with pytest.raises(ValueError, match="repeats"):
        run_steptime(config, tmp_path, repeats=MIN_REPEATS - 1)
    with pytest.raises(ValueError, match="arms"):
        run_steptime(config, tmp_path, arms=["rpka-r999"])
    with pytest.raises(SystemExit):
        steptime_main(
            ["--preset", "longrange-power-smoke", "--repeats", "3", "--out", str(tmp_path)]
        )


def test_the_short_tracks_timing_file_overlays_only_a_bench_of_its_shape(tmp_path):
    result = run_track_steptime("smoke", tmp_path, repeats=MIN_REPEATS, warmup=1, tracks=["recall"])
    stored = read_json(tmp_path / TRACK_STEPTIME_FILE)  # sealed
    assert list(stored["tracks"]) == ["recall"] and stored["tracks"] == result["tracks"]
    timed = stored["tracks"]["recall"]
    assert list(timed)[0] == "exact" and len(timed["exact"]["cpu_s"]) == MIN_REPEATS
    config = json.loads(json.dumps(get_preset("smoke", "recall").to_dict()))
    wall = {"step_ms_median": {"exact": 99.0}, "step_ratio_vs_baseline": {"exact": 1.0}}
    report = {"track": "recall", "config": config, "timings": wall}
    overlaid = with_step_timing(report, stored)
    arm = next(a for a in timed if a != "exact")
    ratio = timed[arm]["step_ratio_cpu"]
    assert overlaid["timings"]["step_ratio_vs_baseline"][arm] == ratio["mean"]
    assert overlaid["timings"]["step_ratio_ci"][arm] == [ratio["ci_low"], ratio["ci_high"]]
    assert overlaid["timings"]["step_ms_median"]["exact"] == timed["exact"]["cpu_s_median"] * 1e3
    assert overlaid["timings"]["step_source"] == TRACK_STEPTIME_FILE
    assert report["timings"] is wall and wall["step_ms_median"] == {"exact": 99.0}  # untouched
    other = {**report, "config": {**config, "track": {**config["track"], "seed": 12345}}}
    assert with_step_timing(other, stored) is other  # another bench's shape: its own times
    assert with_step_timing(report, None) is report


def test_the_tracks_mode_refuses_a_long_range_preset_or_its_options(tmp_path):
    for argv in (["--preset", "longrange", "--tracks"],
                 ["--preset", "smoke", "--tracks", "--contexts", "72"],
                 ["--preset", "smoke", "--tracks", "no-such-track"]):  # fmt: skip
        with pytest.raises(SystemExit):
            steptime_main([*argv, "--out", str(tmp_path)])
    assert not (tmp_path / TRACK_STEPTIME_FILE).exists()


def test_an_extension_bench_is_timed_as_its_report_ran_it(tmp_path, smoke_study_report):
    report, out = smoke_study_report
    extensions = {"smoke-extension": out / BENCH_REPORT_FILE}
    run_track_steptime("smoke", tmp_path, MIN_REPEATS, 1, tracks=[], extensions=extensions)
    stored = read_json(tmp_path / TRACK_STEPTIME_FILE)
    assert list(stored["tracks"]) == ["smoke-extension"]  # keyed by the bench, not its track
    assert with_step_timing(report, stored)["timings"]["step_source"] == TRACK_STEPTIME_FILE
    with pytest.raises(ValueError, match="tracks"):  # nothing to time
        run_track_steptime("smoke", tmp_path, MIN_REPEATS, 1, tracks=[])
