"""A study resuming across sessions reports what has landed: counts, never scores (issue 40)."""

from __future__ import annotations

from rpka.config.presets_longctx import LONGRANGE_PRESETS
from rpka.io import write_json
from rpka.study import progress


def test_counts_follow_the_run_files_and_the_plan(tmp_path):
    config = LONGRANGE_PRESETS["longrange-power-smoke"]
    first, *rest = config.contexts
    runs = tmp_path / "longctx" / f"context-{first}" / "runs"
    runs.mkdir(parents=True)
    for i, split in enumerate(["val", "test", "test"]):
        write_json(runs / f"{i}.json", {"split": split, "cpu_s": 10.0, "scores": {"mse": [9.9]}})
    rows = progress.landed(config, tmp_path)
    assert rows[0]["landed"] == {"sweep": 1, "eval": 2} and rows[0]["cpu_s"] == 30.0
    assert rows[0]["planned"]["eval"] >= 2 and not rows[0]["complete"]
    assert all(r["landed"] == {"sweep": 0, "eval": 0} for r in rows[1:])
    line = progress.progress_line(rows)
    assert f"{first:,} tokens: 2 of {rows[0]['planned']['eval']} evaluation jobs" in line
    assert "9.9" not in line  # counts, never scores
    if rest:
        assert f"{rest[0]:,} tokens: not started" in line


def test_no_folder_no_sentence(tmp_path):
    assert progress.power_status(tmp_path) is None


def test_each_length_names_its_price_when_the_study_was_priced(tmp_path):
    config = LONGRANGE_PRESETS["longrange-power-smoke"]
    first = config.contexts[0]
    arms = {a.name: {"predicted_cpu_s": 100.0} for a in config.bench_for(first).design.arms}
    write_json(tmp_path / "cost_model.json", {"contexts": {str(first): {"arms": arms}}})
    runs = tmp_path / "longctx" / f"context-{first}" / "runs"
    runs.mkdir(parents=True)
    write_json(runs / "0.json", {"split": "val", "cpu_s": 10.0})
    rows = progress.landed(config, tmp_path)
    assert rows[0]["predicted_cpu_s"] == 100.0 * len(arms)
    assert all(r["predicted_cpu_s"] is None for r in rows[1:])  # a length not priced
    assert f"10 CPU-s, the length priced at {100 * len(arms):,.0f}" in progress.progress_line(rows)
