"""The bench: report keys against their documentation, resume, lr selection, CLI errors."""

import json
import math
import re
from pathlib import Path

import pytest
from doc_keys import key_paths

import rpka.bench as bench
from rpka.bench import InProcessExecutor, best_learning_rate, run_bench
from rpka.cli import commands as cli
from rpka.config.bench import BenchConfig
from rpka.config.presets import get_preset
from rpka.io import read_json
from rpka.report import tables
from rpka.tracks.lm_source import MarkovCopySource
from rpka.tracks.lm_text import LM_NAMES
from rpka.verdict.stats import VERDICTS

DOC = Path(__file__).resolve().parent.parent / "docs" / "bench_report.md"
SMOKE = get_preset("smoke", train={"epochs": 1})
LM_SMOKE = get_preset("smoke", "lm", train={"epochs": 1})
# dicts whose keys are data (arm names, options, configs): documented as a whole
OPAQUE = {
    "config.track",
    "config.model",
    "config.train",
    "config.arms",
    "arms.<arm>.options",
    "arms.<arm>.best_cfg.options",
    "arms.<arm>.full_by_metric",
    "arms.<arm>.val_by_metric",
    "naive_baselines.forecasts",
    "naive_baselines.predictors",
    "data.tokens_per_split",
    "timings.step_ms_median",
    "timings.step_ratio_vs_baseline",
    "timings.run_wall_s",
    "timings.run_cpu_s",
    "ablation_choice.chosen_options",
    "ablation_choice.candidates[].options",
    "ablation_choice.candidates[].configuration",
}


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    report = run_bench(
        SMOKE, root / "out", InProcessExecutor(), progress=False, data_dir=root / "cache"
    )
    return report, root


@pytest.fixture(scope="module")
def lm_smoke_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_lm")
    report = run_bench(
        LM_SMOKE, root / "out", InProcessExecutor(), progress=False, data_dir=root / "cache"
    )
    return report, root


def documented_paths(track):
    """Keys documented for ``track``: every table row outside sections whose heading names
    another track ("(track `lm`)")."""
    keys, section_track = set(), None
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            tagged = re.search(r"\(track `(\w+)`\)", line)
            section_track = tagged.group(1) if tagged else None
        row = re.match(r"^\| `([^`]+)` \|", line)
        if row and section_track in (None, track):
            keys.add(row.group(1))
    assert keys, "no documented keys found"
    return keys


def normalise(path):
    """baseline/idea share the arm entry's keys; arms.<arm>.comparison those of comparison."""
    for head in ("baseline.", "idea."):
        if path.startswith(head) and path not in ("baseline.arm", "idea.arm"):
            return "arms.<arm>." + path[len(head) :]
    if path.startswith("config.mechanism."):  # preset-dependent overrides, documented whole
        return "config.mechanism"
    if path.startswith("arms.<arm>.comparison."):
        return path[len("arms.<arm>.") :]
    return path


@pytest.mark.parametrize("track", ["forecast", "lm"])
def test_every_report_key_is_documented_and_every_documented_key_exists(
    track, smoke_study_report, lm_smoke_report
):
    # forecast: the study's structure in miniature (ablations, peers, output errors)
    report, _ = smoke_study_report if track == "forecast" else lm_smoke_report
    assert report["track"] == track
    present = {normalise(p) for p in key_paths(report, OPAQUE, {"arms": "<arm>"}, normalise)}
    documented = documented_paths(track)
    assert present - documented == set(), "undocumented keys"
    assert documented - present == set(), "documented keys missing from the report"


def test_report_content(smoke_report):
    report, root = smoke_report
    arms = report["arms"]
    assert set(arms) == {"exact", "rpka-r4"}
    assert report["comparison"] == arms["rpka-r4"]["comparison"]
    assert arms["exact"]["comparison"] is None
    signature = report["mechanism_signature"]  # the trained primary arm's trace identity
    assert isinstance(signature["confirmed"], bool) and signature["trained_model"] is True
    assert "rpka-r4" in signature["trained_model_description"]
    assert signature["max_rel_error_exact"] < 1e-10  # the exact expectation is round-off
    mechanism = json.loads((root / "out" / "mechanism.json").read_text())
    assert {"trained", "init"} <= set(mechanism)
    assert report["n_seeds"] == len(SMOKE.design.eval_seeds) == report["comparison"]["n_pairs"]
    full = arms["exact"]["full"]
    assert full["n"] == len(full["per_seed"]) and full["std"] >= 0
    diffs = [
        b - a for a, b in zip(full["per_seed"], arms["rpka-r4"]["full"]["per_seed"], strict=True)
    ]
    assert report["comparison"]["per_seed_diffs"] == pytest.approx(diffs)
    # the pre-registered primary is not adjusted (the smoke study has no other arm)
    assert report["comparison"]["adjustment"] == "none (pre-registered primary)"
    assert report["decision"]["primary_arm"] == "rpka-r4"
    assert report["comparison"]["verdict"] in VERDICTS
    assert BenchConfig.from_dict(report["config"]) == SMOKE
    assert len(list((root / "out" / "runs").glob("*.json"))) == report["timings"]["n_runs"]
    # run files are complete results, named by their hash
    for path in (root / "out" / "runs").glob("*.json"):
        assert read_json(path)["run_id"] == path.stem


def test_lm_report_has_the_floor_and_the_gaps(lm_smoke_report, capsys):
    report, root = lm_smoke_report
    assert report["track"] == "lm" and report["metric"] == "perplexity"
    assert report["metric_direction"] == "lower"
    naive = report["naive_baselines"]
    source = MarkovCopySource(LM_SMOKE.design.track)  # the floor, recomputed from the source
    assert naive["floor"]["nll"] == pytest.approx(source.floor(LM_SMOKE.design.track.seq_len))
    assert naive["floor"]["perplexity"] == pytest.approx(math.exp(naive["floor"]["nll"]))
    assert naive["entropy_rate"]["nll"] < naive["floor"]["nll"]
    ngram = naive["predictors"]["ngram_1"]["test"]["nll"]
    assert ngram > naive["predictors"]["source_optimal"]["test"]["nll"]
    for arm in report["arms"].values():
        by_metric = arm["full_by_metric"]
        assert arm["full"] == by_metric["perplexity"]
        nll, ppl = by_metric["nll"]["per_seed"], by_metric["perplexity"]["per_seed"]
        assert ppl == pytest.approx([math.exp(v) for v in nll], rel=1e-9)
        gap = arm["floor_gap"]
        assert gap["perplexity_gap"] == pytest.approx(
            arm["full"]["mean"] - naive["floor"]["perplexity"]
        )
        assert gap["nll_gap"] == pytest.approx(by_metric["nll"]["mean"] - naive["floor"]["nll"])
        assert gap["nll_gap_per_seed"] == pytest.approx([v - naive["floor"]["nll"] for v in nll])
        assert len(arm["learning_curves"]["val_perplexity"]) == len(LM_SMOKE.design.eval_seeds)
    learn = report["learnability"]
    closed = (ngram - report["arms"]["exact"]["floor_gap"]["nll_mean"]) / (
        ngram - naive["floor"]["nll"]
    )
    assert learn["best_ngram"] == "ngram_1" and learn["gap_closed"] == pytest.approx(closed)
    assert report["comparison"]["n_pairs"] == len(LM_SMOKE.design.eval_seeds)
    assert report["mechanism_signature"]["max_rel_error_exact"] < 1e-10
    assert BenchConfig.from_dict(report["config"]) == LM_SMOKE
    assert len(list((root / "out" / "runs").glob("*.json"))) == report["timings"]["n_runs"]
    # the results table shows the reference predictors beside the arms, with their gaps
    table = tables.results_table(report).set_index("arm")
    floor_row = table.loc[LM_NAMES["floor"]]
    assert floor_row["perplexity mean"] == pytest.approx(naive["floor"]["perplexity"])
    assert floor_row["perplexity - floor"] == 0
    assert table.loc["exact", "NLL - floor (nats)"] == pytest.approx(
        report["arms"]["exact"]["floor_gap"]["nll_gap"]
    )
    assert "n-gram, 1 token of context" in table.index
    cli.print_bench_summary(report, root / "out")
    assert "floor" in capsys.readouterr().out


def test_bench_figures_draw_the_lm_report(lm_smoke_report):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rpka.report import figures

    report, _ = lm_smoke_report
    sweep = figures.plot_sweep(report)
    floor = report["naive_baselines"]["floor"]["perplexity"]
    lines = {line.get_label(): line for line in sweep.axes[0].get_lines()}
    assert lines["exact floor"].get_ydata()[0] == pytest.approx(floor)
    for draw in (figures.plot_learning_curves, figures.plot_paired_seeds, figures.plot_deltas):
        fig = draw(report)
        assert "perplexity" in " ".join(ax.get_ylabel() + ax.get_xlabel() for ax in fig.axes)
    plt.close("all")


def test_resume_skips_finished_runs(tmp_path, monkeypatch):
    calls = []
    real = bench.jobs.train_run

    def counting(run_config):
        calls.append(run_config["arm"]["name"])
        return real(run_config)

    monkeypatch.setattr(bench.jobs, "train_run", counting)  # the scheduler's job
    kwargs = dict(executor=InProcessExecutor(), progress=False, data_dir=tmp_path / "cache")
    first = run_bench(SMOKE, tmp_path / "out", **kwargs)
    assert len(calls) == first["timings"]["n_runs"] == 4
    calls.clear()
    second = run_bench(SMOKE, tmp_path / "out", **kwargs)
    assert calls == [] and second["timings"]["n_runs_resumed"] == 4
    assert second["arms"]["exact"]["full"] == first["arms"]["exact"]["full"]
    # delete one run: exactly that one runs again
    victim = tmp_path / "out" / "runs" / f"{first['arms']['rpka-r4']['run_ids'][0]}.json"
    victim.unlink()
    run_bench(SMOKE, tmp_path / "out", **kwargs)
    assert calls == ["rpka-r4"]


def test_a_diverging_learning_rate_loses_the_sweep(tmp_path):
    config = get_preset("smoke", learning_rates=(1e8, 3e-3), train={"epochs": 1, "grad_clip": 0.0})
    report = run_bench(
        config, tmp_path / "out", InProcessExecutor(), progress=False, data_dir=tmp_path
    )
    for arm in report["arms"].values():
        rows = {row["lr"]: row for row in arm["sweep"]}
        assert (
            rows[1e8]["n_diverged"] == len(config.design.sweep_seeds) and rows[1e8]["score"] is None
        )
        assert arm["best_cfg"]["lr"] == 3e-3 and rows[3e-3]["selected"]


def fake(scores):
    return {"scores": {"mse": scores}}


def test_best_learning_rate_rule():
    results = {1e-3: fake([0.5, 0.7]), 3e-3: fake([0.4, 0.6]), 1e-2: fake([0.1, None])}
    assert best_learning_rate(results, "mse") == 3e-3  # 1e-2 diverged on one seed: loses
    assert best_learning_rate({1.0: fake([math.nan]), 2.0: fake([None])}, "mse") == 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "huge"], "--preset"),
        (["--ranks", "0"], "ranks"),
        (["--ranks", "four"], "--ranks"),
        (["--lrs", "0"], "learning_rates"),
        (["--seeds", "0"], "--seeds"),
        (["--workers", "0"], "n_workers"),
        (["--device", "tpu"], "--device"),
        (["--epochs", "0"], "--epochs: must be in [1, 1000]"),
    ],
)
def test_bad_cli_values_fail_before_writing_anything(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        cli.bench_main(["--preset", "smoke", "--out", str(out), "--no-progress", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cli_overrides_reach_the_config():
    config, _ = cli.parse_bench(
        ["--preset", "smoke", "--ranks", "2", "8", "--seeds", "3", "--lrs", "1e-3", "2e-3"]
    )
    assert [a.name for a in config.design.arms] == ["exact", "rpka-r2", "rpka-r8"]
    assert config.decision.primary_arm == "rpka-r8" and len(config.design.eval_seeds) == 3
    assert not set(config.design.eval_seeds) & set(config.design.sweep_seeds)
    assert config.design.learning_rates == (1e-3, 2e-3)


def test_presets_validate_and_round_trip():
    import json

    for name in ("smoke", "quick", "full"):
        config = get_preset(name)
        assert BenchConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    full = get_preset("full")
    assert full.design.track.context >= 96 and len(full.design.eval_seeds) == 9
    assert {4, 16, 64} <= {a.options.get("rank") for a in full.design.arms}
    with pytest.raises(ValueError, match="eval_seeds"):
        get_preset("smoke", eval_seeds=(0, 1))  # overlaps the sweep seeds
    with pytest.raises(ValueError, match="preset must be one of"):
        get_preset("nope")
    with pytest.raises(ValueError, match="override"):
        get_preset("smoke", colour="red")
    with pytest.raises(ValueError, match="train override"):
        get_preset("smoke", train={"epoch": 3})


def test_seed_groups_do_not_change_exact_results(tmp_path):
    """Members never mix: exact attention gives the same per-seed results in any grouping."""
    kwargs = dict(executor=InProcessExecutor(), progress=False, data_dir=tmp_path / "cache")
    together = run_bench(SMOKE, tmp_path / "a", **kwargs)
    split_up = run_bench(
        get_preset("smoke", train={"epochs": 1}, seeds_per_job=1), tmp_path / "b", **kwargs
    )
    assert len(split_up["arms"]["exact"]["run_ids"]) == len(SMOKE.design.eval_seeds)
    assert split_up["arms"]["exact"]["seeds"] == list(SMOKE.design.eval_seeds)
    assert split_up["arms"]["exact"]["full"]["per_seed"] == pytest.approx(
        together["arms"]["exact"]["full"]["per_seed"], rel=1e-5
    )
