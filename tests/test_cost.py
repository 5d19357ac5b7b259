"""The cost model (rpka.study.cost): the jobs it counts, eq. (1), a prediction against a real
bench's recorded CPU time, and the command's errors."""

import pytest

from rpka.bench import InProcessExecutor, run_bench
from rpka.cli import commands as cli
from rpka.config.presets import STANDARD_TRAINING_BUDGET_CPU_S, STUDY_TRACKS, get_preset
from rpka.io import has_checksum, read_json
from rpka.report import readme
from rpka.study import cost

SMOKE_STUDY = get_preset("smoke-study", train={"epochs": 1})  # the conftest fixture's bench


@pytest.mark.parametrize("label", [*STUDY_TRACKS, "longctx-512", "longctx-2048"])
def test_job_groups_count_the_runs_the_committed_bench_recorded(label):
    """The full study's presets against what each committed bench report says it ran."""
    benches = {name: (config, path) for name, config, path in cost.study_benches("full")}
    config, report_path = benches[label]
    report = read_json(report_path)
    assert sum(g.jobs for g in cost.job_groups(config)) == report["timings"]["n_runs"]
    arms = {g.arm for g in cost.job_groups(config)}
    assert arms == set(report["timings"]["run_cpu_s"])


def test_job_groups_follow_the_seed_groups_and_the_swept_rates():
    config = SMOKE_STUDY
    groups = cost.job_groups(config)
    for arm in config.design.arms:
        sweep = [g for g in groups if g.arm == arm.name and g.phase == "sweep"]
        rates = 1 if arm.lr_from else len(config.design.learning_rates)
        seeds = arm.sweep_seeds or config.design.sweep_seeds
        assert sum(g.jobs * g.members for g in sweep) == rates * len(seeds)
        evaluation = [g for g in groups if g.arm == arm.name and g.phase == "eval"]
        assert sum(g.jobs * g.members for g in evaluation) == len(config.design.eval_seeds)


def test_a_job_costs_set_up_epochs_of_steps_and_validation_and_a_test_pass():
    probe = cost.Probe(
        members=3, steps_per_epoch=10, setup_s=2.0, step_s=0.5, val_s=1.0, test_s=4.0
    )
    assert probe.job_s(epochs=3, phase="sweep") == pytest.approx(2.0 + 3 * (10 * 0.5 + 1.0))
    assert probe.job_s(epochs=3, phase="eval") == pytest.approx(2.0 + 3 * 6.0 + 4.0)


def test_price_sums_eq_1_over_the_jobs_of_each_phase():
    config = SMOKE_STUDY
    groups = cost.job_groups(config)
    probes = {
        (g.arm, g.members): cost.Probe(g.members, 5, 0.0, 0.1 * g.members, 1.0, 2.0)
        for g in groups
    }
    result = cost.price(config, probes)
    epochs = config.design.train.epochs
    for arm, entry in result["arms"].items():
        mine = [g for g in groups if g.arm == arm]
        sweep = sum(g.jobs * epochs * (0.5 * g.members + 1.0) for g in mine if g.phase == "sweep")
        evaluation = sum(
            g.jobs * (epochs * (0.5 * g.members + 1.0) + 2.0) for g in mine if g.phase == "eval"
        )
        assert entry["sweep_cpu_s"] == pytest.approx(sweep)
        assert entry["eval_cpu_s"] == pytest.approx(evaluation)
    assert result["predicted_cpu_s"] == pytest.approx(
        sum(a["predicted_cpu_s"] for a in result["arms"].values())
    )


def test_the_prediction_of_a_bench_is_near_its_measured_cpu_time(tmp_path):
    config = get_preset("smoke", train={"epochs": 4})  # training steps dominate its cost
    cache = tmp_path / "cache"
    # first-call costs (kernels, allocator, lazy imports) land here, in neither figure below
    cost.predict_bench(config, data_dir=cache, steps=1, progress=False)
    report = run_bench(
        config, tmp_path / "out", InProcessExecutor(), progress=False, data_dir=cache
    )
    predicted = cost.predict_bench(config, data_dir=cache, steps=2, progress=False)
    measured = cost.measured_cpu_s(report)
    assert set(predicted["arms"]) == set(measured)
    assert predicted["n_jobs"] == report["timings"]["n_runs"]
    # tiny runs on a shared machine: a loose band, but a model that dropped a term of
    # eq. (1) (the epochs: a factor 4) or miscounted jobs lands outside it
    assert 0.45 < predicted["predicted_cpu_s"] / sum(measured.values()) < 2.2
    for arm in predicted["arms"].values():
        assert arm["predicted_cpu_s"] > 0 and arm["probes"]
    # the stored probes price the bench again without measuring
    again = cost.price(config, cost.probes_of(predicted))
    assert again["predicted_cpu_s"] == pytest.approx(predicted["predicted_cpu_s"])


def test_the_table_sets_each_prediction_beside_its_measurement():
    result = {
        "benches": {
            "a": {"n_jobs": 4, "predicted_cpu_s": 120.0, "measured_cpu_s": 100.0},
            "b": {"n_jobs": 2, "predicted_cpu_s": 50.0, "measured_cpu_s": None},
            "c": {"n_jobs": 3, "predicted_cpu_s": 30.0, "measured_cpu_s": 60.0},
        }
    }
    table = readme.cost_model_table(result)
    assert list(table["predicted / measured"]) == ["1.20", "-", "0.50", "0.94"]
    assert table.iloc[-1]["measured CPU s"] == "160"
    assert table.iloc[1]["measured CPU s"] == "-"


def test_probe_refuses_no_steps():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        cost.probe(SMOKE_STUDY, SMOKE_STUDY.design.arms[0], 1, "unused", steps=0)


def test_the_command_writes_the_predictions_of_the_benches_asked_for(tmp_path, capsys):
    out = tmp_path / "cost.json"
    result = cli.cost_main(
        ["--preset", "smoke", "--benches", "lm", "--steps", "1", "--out", str(out), "--no-progress"]
    )
    assert read_json(out) == result
    assert has_checksum(out)  # sealed: an edit is refused on read (issue 43)
    assert list(result["benches"]) == ["lm"]
    assert result["benches"]["lm"]["predicted_cpu_s"] > 0
    assert "`lm`" in capsys.readouterr().out  # the table is printed


def test_the_stored_prediction_prices_the_study_from_committed_probes_without_timing():
    """`make report PRESET=full` prints this before it starts: the committed probes priced
    against the configuration as it is now; arms without a stored probe are named."""
    from rpka.io import read_json
    from rpka.study.cost import cost_model_json, prediction_line, stored_prediction

    prediction = stored_prediction("full", cores=2)
    stored = read_json(cost_model_json("full"))["benches"]
    priced = {label for label in prediction["benches"] if not any(
        u.startswith(f"{label}:") for u in prediction["unpriced"])}  # fmt: skip
    for label in priced:  # unchanged benches: the stored prediction itself
        assert prediction["benches"][label] == pytest.approx(stored[label]["predicted_cpu_s"])
    assert prediction["wall_s"] == pytest.approx(prediction["predicted_cpu_s"] / 2)
    assert "predicted training cost" in prediction_line(prediction)
    assert stored_prediction("smoke") is None  # no stored cost model for the smoke preset


def test_the_standard_study_is_priced_within_its_budget():
    """The default study (``make report``) must fit its half hour: its training runs,
    priced by eq. (1) from the probes stored in data/results/standard/cost_model.json (no
    timing here), stay within the training budget; a preset change that adds seeds, arms,
    epochs or data is priced by the same probes and fails here."""
    prediction = cost.stored_prediction("standard", cores=2)
    assert prediction is not None, "run `python -m rpka cost --preset standard`"
    assert prediction["unpriced"] == [], "jobs without a stored probe: re-run the cost model"
    assert prediction["predicted_cpu_s"] <= STANDARD_TRAINING_BUDGET_CPU_S, prediction["benches"]
