"""Each track that needs attention (issue 14) runs through the bench at its smoke size: the
plug-in registry, the task's model, loss, metrics, baselines and learnability bar, and the
report layer's words for it."""

import math

import pytest

from rpka.bench import InProcessExecutor, run_bench
from rpka.config.presets import STUDY_TRACKS, get_preset
from rpka.tracks import get_task
from rpka.verdict.significance import ALPHA, rule_mde, sign_flip_floor

NEW_TRACKS = ("forecast-motif", "forecast-regimes", "forecast-real", "recall")


@pytest.mark.parametrize("track", NEW_TRACKS)
def test_smoke_bench_runs_each_new_track(track, tmp_path):
    config = get_preset("smoke", track)
    report = run_bench(
        config, tmp_path / "out", InProcessExecutor(), progress=False, data_dir=tmp_path / "data"
    )
    task = get_task(track)
    assert report["track"] == track
    assert set(report["arms"]) == {arm.name for arm in config.design.arms}
    for name, arm in report["arms"].items():
        values = arm["full"]["per_seed"]
        assert len(values) == len(config.design.eval_seeds), name
        assert all(v is not None and math.isfinite(v) for v in values), name
    learnability = report["learnability"]
    assert isinstance(learnability["met"], bool)
    text = task.text.learnability_text(report)
    assert "learnability bar is" in text
    assert task.text.setup_text(report, "PROTOCOL").endswith("PROTOCOL")
    assert task.text.naive_rows(report, "test")
    if track == "recall":  # query error = 1 - accuracy, in [0, 1]; chance over 8 values
        for arm in report["arms"].values():
            assert all(0.0 <= v <= 1.0 for v in arm["full"]["per_seed"])
        chance = report["naive_baselines"]["predictors"]["chance"]["test"]["error"]
        assert chance == pytest.approx(1 - 1 / 8)  # vocab 17: 8 keys, 8 values


@pytest.mark.parametrize("track", STUDY_TRACKS)
def test_every_full_study_comparison_can_reach_significance(track):
    """Power by design (issue 15): with the full preset's evaluation seeds the smallest
    sign-flip p must be below the level of the rule that reads it - the primary
    unadjusted, the secondary arms at Holm's first step, alpha / family size, and the gate
    one-sided - or a verdict could only ever be "inconclusive"."""
    config = get_preset("full", track)
    n = len(config.design.eval_seeds)
    assert rule_mde(n, 1.0)["rule_can_reject"], "primary"
    family = len(config.secondary_arms)
    if family:
        assert rule_mde(n, 1.0, alpha_rule=ALPHA / family)["rule_can_reject"], "secondary"
    if config.control is not None:
        assert sign_flip_floor(n, "one-sided") < ALPHA, "gate"
