"""The ablation and peer study: presets, every arm trains, the validation-only default
choice, output errors of every method, arm latencies, figures and tables."""

import copy
import dataclasses
import json
import math
import os

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from rpka import paths  # noqa: E402
from rpka.attention import REGISTRY, options_of  # noqa: E402
from rpka.cli import commands as cli
from rpka.config import scaling as scaling_config
from rpka.config.bench import BenchConfig  # noqa: E402
from rpka.config.presets import (  # noqa: E402
    ABLATION_RANK,
    PEERS,
    PRESETS_BY_TRACK,
    STUDY_TRACKS,
    get_preset,
)
from rpka.io import CorruptFileError, read_json  # noqa: E402
from rpka.kernel.quality import method_output_errors  # noqa: E402
from rpka.report import figures, figures_cost, tables  # noqa: E402
from rpka.speed import scaling
from rpka.study import index as study_index
from rpka.study import steps as study
from rpka.training.run_config import make_run_config  # noqa: E402
from rpka.training.train import train_run  # noqa: E402
from rpka.verdict.ablations import FACTORS, choose_default, rpka_configuration  # noqa: E402

FULL = get_preset("full")


# --------------------------------------------------------------------------- presets


def test_every_preset_validates_and_round_trips():
    for name in PRESETS_BY_TRACK["forecast"]:
        config = get_preset(name)
        assert BenchConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_full_preset_holds_rank_sweep_ablations_and_peers():
    names = [arm.name for arm in FULL.design.arms]
    assert names[:4] == ["exact", "rpka-r4", "rpka-r16", "rpka-r64"]
    assert FULL.studies.ablation_reference == f"rpka-r{ABLATION_RANK}" == "rpka-r16"
    for method in PEERS:
        arm = FULL.arm(f"{method}-r{ABLATION_RANK}")
        assert arm.method == method and arm.options["rank"] == ABLATION_RANK
    # every registered method but the local-window control, which no study runs yet (it
    # needs the two-control gate of the long-range work before it can be an arm)
    assert set(REGISTRY) - {"local"} == {arm.method for arm in FULL.design.arms}
    reference = rpka_configuration("rpka", FULL.arm(FULL.studies.ablation_reference).options)
    changed = {}
    for name in FULL.studies.ablation_arms:
        arm = FULL.arm(name)
        setup = rpka_configuration(arm.method, arm.options)
        differs = [k for k in FACTORS if setup[k] != reference[k]]
        assert len(differs) == 1, (name, differs)  # one choice changed per ablation
        changed.setdefault(differs[0], set()).add(setup[differs[0]])
    assert changed == {
        "weighting": {"exp", "tempered(0.5)"},
        "pivot_set": {"keys"},
        "pivot_rule": {"greedy", "uniform"},  # uniform = the nystrom-uniform peer
        "pivot_refresh": {"batch"},
    }


def test_ranks_override_keeps_the_ablations_and_their_reference():
    config = get_preset("full", ranks=[4, 64])
    names = {arm.name for arm in config.design.arms}
    assert {
        "rpka-r16",
        *FULL.studies.ablation_arms,
    } <= names and config.decision.primary_arm == "rpka-r64"
    assert config.arm("rpka-r64") == FULL.arm("rpka-r64")  # a kept rank keeps its options
    assert get_preset("full", ranks=[8]).arm("rpka-r8").options == {"rank": 8}


def test_other_studies_keep_only_a_rank_sweep_and_the_control():
    from rpka.attention.rpka import IMPLEMENTATION_OPTIONS
    from rpka.config.presets_longctx import LONGCTX_PRESETS, LONGCTX_RESIDUAL_SOLVE

    for name, longctx in LONGCTX_PRESETS.items():
        bench = longctx.bench
        assert (
            bench.studies.ablation_reference is None and bench.studies.output_error_ranks == ()
        ), name
        # the long-range presets (two-control gate) add the local-window control, and
        # may add uniform landmarks and (issue 40's study) the keys coreset
        # (issue 53's decision study: uniform landmarks, no local control, by its protocol)
        extra = (
            {"local", "nystrom-uniform", "keys-coreset"}
            if bench.decision.gate_needs_local
            else {"nystrom-uniform"} if name.startswith("longrange-v2") else set()
        )
        methods = {a.method for a in bench.design.arms}
        assert {"exact", "rpka", "mean"} <= methods <= {"exact", "rpka", "mean"} | extra, name
        assert ("local" in methods) == bench.decision.gate_needs_local, name
        for arm in (a for a in bench.design.arms if a.method == "rpka"):  # only the rank varies;
            # implementation options keep the estimator's law (the refresh by L^{-1})
            assert set(arm.options) - set(IMPLEMENTATION_OPTIONS) == {"rank"}, name
            assert arm.options["residual_solve"] == LONGCTX_RESIDUAL_SOLVE, name
    lm = get_preset("full", "lm")
    assert lm.studies.output_error_ranks == () and lm.studies.ablation_reference is None
    with pytest.raises(ValueError, match="output_error_ranks"):
        get_preset("smoke", "lm", output_error_ranks=(4,))


def test_long_length_timing_uses_the_default_pivot_implementation():
    assert FULL.arm("rpka-r64").options["pivot_method"] == "plain"  # training shape's choice
    extra = {a["name"]: a for a in scaling_config.bench_arms_config(FULL.design.arms).extra_arms}
    assert extra["rpka-r64"]["options"] == {"rank": 64}
    assert extra["rpka-r16-exp"]["options"] == {"rank": 16, "weighting": "exp"}
    assert "exact" not in extra


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"ablation_arms": ("rpka-r4",)}, "ablation_arms"),  # without a reference
        ({"ablation_reference": "nope"}, "ablation_reference"),
        ({"ablation_reference": "rpka-r4", "ablation_arms": ("ghost",)}, "ablation_arms"),
        ({"ablation_reference": "rpka-r4", "ablation_arms": ("rpka-r4",)}, "ablation_arms"),
        ({"output_error_ranks": (0,)}, "output_error_ranks"),
    ],
)
def test_bad_ablation_settings_are_rejected(changes, match):
    with pytest.raises(ValueError, match=match):
        get_preset("smoke", **changes)


@pytest.mark.parametrize("arm", FULL.design.arms, ids=lambda arm: arm.name)
def test_every_full_arm_trains_on_the_smoke_track(tmp_path, arm):
    smoke = get_preset("smoke", train={"epochs": 1}, track={"n_series": 4})
    result = train_run(make_run_config(smoke, arm, 3e-3, [0], "val", str(tmp_path / "cache")))
    assert result["n_diverged"] == 0 and result["n_steps"] > 0
    assert math.isfinite(result["scores"]["mse"][0])


# --------------------------------------------------------------------------- default choice


def test_report_holds_holm_over_the_secondary_arms_and_the_choice(smoke_study_report):
    """The decision rule: the primary unadjusted, the control read by the gate, Holm over
    the rest; the gate decides whether any verdict is informative."""
    report, _ = smoke_study_report
    decision, gate = report["decision"], report["attention_gate"]
    secondary = decision["secondary_family"]
    assert gate["control_arm"] == decision["control_arm"] == "mean-attention"
    outside = {"exact", report["primary_arm"], "mean-attention"}
    assert set(secondary) == set(report["arms"]) - outside
    for name in secondary:
        assert report["arms"][name]["comparison"]["adjustment"] == (
            f"Holm over {len(secondary)} comparison(s)"
        )
    primary = report["arms"][report["primary_arm"]]["comparison"]
    assert primary["adjustment"] == "none (pre-registered primary)"
    assert primary["gate_passed"] is gate["passed"]
    if not gate["passed"]:  # the smooth smoke track does not need attention
        assert primary["verdict"] == "uninformative"
    choice = report["ablation_choice"]
    assert choice["reference"] == "rpka-r4" and choice["split"] == "val"
    assert [c["arm"] for c in choice["candidates"]] == [
        "rpka-r4",
        "rpka-r4-greedy",
        "nystrom-uniform-r4",
    ]
    uniform = choice["candidates"][2]
    assert uniform["factor"] == "pivot_rule" and uniform["level"] == "uniform"
    scores = {c["arm"]: c["val_score"] for c in choice["candidates"]}
    assert choice["picked_arm"] == min(scores, key=scores.get)
    expected = choice["picked_arm"] if choice["pick_confirmed"] else "rpka-r4"
    assert choice["chosen_arm"] == expected


EVAL_SEEDS = list(range(100, 108))  # enough pairs for the confirmation step to pass


def rigged(report, val, test, eval_val=None):
    """A copy of a report whose candidates score ``val`` on validation (sweep seeds),
    ``eval_val`` (default: ``val``) on the validation split with 8 evaluation seeds (each
    seed's score shifted by the same per-seed noise, so pairs keep the candidates' order),
    and ``test`` on test."""
    report = copy.deepcopy(report)
    eval_val = val if eval_val is None else eval_val
    noise = [0.01 * ((7 * i) % 5) for i in range(len(EVAL_SEEDS))]
    for name, arm in report["arms"].items():
        if name in val:
            arm["best_cfg"]["val_score"] = val[name]
            row = next(r for r in arm["sweep"] if r["lr"] == arm["best_cfg"]["lr"])
            row["val_per_seed"] = [val[name]]
            arm["seeds"] = EVAL_SEEDS
            jitter = [0.002 * ((i + len(name)) % 3) for i in range(len(noise))]  # sd > 0
            per_seed = [eval_val[name] + e + j for e, j in zip(noise, jitter, strict=True)]
            arm["val_by_metric"][report["metric"]]["per_seed"] = per_seed
            arm["val_by_metric"][report["metric"]]["mean"] = sum(per_seed) / len(per_seed)
            if name in test:
                arm["full"]["mean"] = test[name]
                arm["full"]["per_seed"] = [test[name]] * len(arm["full"]["per_seed"])
    return report


def test_default_choice_reads_validation_never_test(smoke_study_report):
    report, _ = smoke_study_report
    val = {"rpka-r4": 0.50, "rpka-r4-greedy": 0.40, "nystrom-uniform-r4": 0.45}
    test = {"rpka-r4": 0.30, "rpka-r4-greedy": 0.90, "nystrom-uniform-r4": 0.10}  # disagrees
    choice = choose_default(rigged(report, val, test))
    assert choice["chosen_arm"] == "rpka-r4-greedy" and choice["changes_default"]
    assert choice["margin"] == pytest.approx(0.10)
    assert choice["chosen_options"] == {"rank": 4, "pivot_rule": "greedy"}
    # whatever the test scores are (even missing), the choice stays the same
    blind = rigged(report, val, test)
    for arm in blind["arms"].values():
        del arm["full"], arm["full_by_metric"]
    assert choose_default(blind)["chosen_arm"] == "rpka-r4-greedy"


def test_a_pick_the_evaluation_seeds_do_not_confirm_keeps_the_reference(smoke_study_report):
    report, _ = smoke_study_report
    val = {"rpka-r4": 0.50, "rpka-r4-greedy": 0.40, "nystrom-uniform-r4": 0.45}
    eval_val = {"rpka-r4": 0.50, "rpka-r4-greedy": 0.52, "nystrom-uniform-r4": 0.55}
    choice = choose_default(rigged(report, val, {}, eval_val))
    assert choice["picked_arm"] == "rpka-r4-greedy" and not choice["pick_confirmed"]
    assert choice["chosen_arm"] == "rpka-r4" and not choice["changes_default"]
    greedy = choice["candidates"][1]
    assert greedy["eval_seeds_val_delta"] == pytest.approx(0.02, abs=0.002)
    assert not greedy["eval_seeds_val_confirms"]
    # better on the evaluation seeds, but by a sign-flip p that 8 pairs cannot push below
    # 0.05 after Holm over 2 candidates when one pair disagrees
    mixed = rigged(report, val, {}, {**eval_val, "rpka-r4-greedy": 0.49})
    scores = mixed["arms"]["rpka-r4-greedy"]["val_by_metric"]["mse"]["per_seed"]
    scores[0] += 0.05  # one seed against
    choice = choose_default(mixed)
    assert choice["candidates"][1]["eval_seeds_val_p_adjusted"] > 0.05
    assert choice["chosen_arm"] == "rpka-r4"
    # all 8 pairs better: p = 2/256, Holm x2 < 0.05: confirmed
    confirmed = choose_default(rigged(report, val, {}, {**eval_val, "rpka-r4-greedy": 0.45}))
    assert confirmed["pick_confirmed"] and confirmed["chosen_arm"] == "rpka-r4-greedy"
    assert confirmed["candidates"][1]["eval_seeds_val_p_adjusted"] == pytest.approx(2 * 2 / 256)
    assert confirmed["candidates"][1]["eval_seeds_val_delta"] < 0


def test_default_choice_ties_keep_the_reference_and_divergence_loses(smoke_study_report):
    report, _ = smoke_study_report
    same = {"rpka-r4": 0.4, "rpka-r4-greedy": 0.4, "nystrom-uniform-r4": 0.4}
    choice = choose_default(rigged(report, same, same))
    assert choice["chosen_arm"] == "rpka-r4" and not choice["changes_default"]
    diverged = rigged(report, {**same, "rpka-r4-greedy": 0.1}, same)
    greedy = diverged["arms"]["rpka-r4-greedy"]
    row = next(r for r in greedy["sweep"] if r["lr"] == greedy["best_cfg"]["lr"])
    row["val_per_seed"] = [None]  # its sweep seed diverged
    assert choose_default(diverged)["chosen_arm"] == "rpka-r4"


def test_default_choice_scores_every_candidate_on_the_same_sweep_seeds(smoke_study_report):
    report, _ = smoke_study_report
    report = rigged(report, {"rpka-r4": 0.1, "rpka-r4-greedy": 0.3, "nystrom-uniform-r4": 0.4}, {})
    ref = report["arms"]["rpka-r4"]
    row = next(r for r in ref["sweep"] if r["lr"] == ref["best_cfg"]["lr"])
    row["seeds"], row["val_per_seed"] = [0, 5], [0.1, 0.9]  # one more seed: mean 0.5
    choice = choose_default(report)
    assert choice["sweep_seeds"] == [0]  # the seed every candidate ran
    assert choice["chosen_arm"] == "rpka-r4" and choice["candidates"][0]["val_score"] == 0.1


def test_no_ablation_reference_no_choice(smoke_study_report):
    report, _ = smoke_study_report
    plain = copy.deepcopy(report)
    plain["config"]["ablation_reference"] = None
    assert choose_default(plain) is None


# --------------------------------------------------------------------------- output errors


def layers(seed=0, b=2, h=2, n=24, d=8, n_layers=2):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(b, h, n, d, generator=g) for _ in range(3)) for _ in range(n_layers)]


@pytest.mark.parametrize("method", sorted(m for m in REGISTRY if "rank" in options_of(m)))
def test_output_error_of_every_method_falls_with_rank(method):
    rows = method_output_errors(layers(), method, {}, ranks=(2, 48), seeds=2)
    low, high = rows
    assert low["rank"] == 2 and low["n"] == 2 * 2 * 2 * 2  # layers x items x heads x seeds
    assert 0 <= high["error_mean"] < low["error_mean"]
    if method in ("rpka", "nystrom-uniform", "keys-coreset"):  # 48 >= every point: exact
        assert high["error_max"] < 1e-10
    else:
        assert high["error_mean"] > 0


def test_output_error_of_exact_is_zero_and_bad_input_is_rejected():
    assert method_output_errors(layers(), "exact", ranks=(4,), seeds=1)[0]["error_max"] < 1e-12
    with pytest.raises(ValueError, match="unknown attention method"):
        method_output_errors(layers(), "flash", ranks=(4,))
    with pytest.raises(ValueError, match="seeds"):
        method_output_errors(layers(), "rpka", ranks=(4,), seeds=0)
    with pytest.raises(ValueError, match="ranks"):
        method_output_errors(layers(), "rpka", ranks=(0,))


def test_report_output_errors_cover_every_arm(smoke_study_report):
    report, _ = smoke_study_report
    rows = report["output_error"]["rows"]
    for name, arm in report["arms"].items():
        mine = [r for r in rows if r["arm"] == name]
        if arm["method"] in ("exact", "mean"):  # the baseline, and the control: no rank
            assert not mine
            continue
        assert {r["inputs"] for r in mine} == {"own", "exact"}
        assert {r["rank"] for r in mine} == set(report["output_error"]["ranks"]) | {
            arm["options"]["rank"]
        }


# --------------------------------------------------------------------------- latency


def tiny_arm_latency(report):
    base = dataclasses.replace(scaling_config.SCALING_PRESETS["tiny"], warmup=0, repeats=1)
    bench_arms = BenchConfig.from_dict(report["config"]).design.arms
    config = scaling_config.bench_arms_config(bench_arms, 64, base)
    return scaling.forward_latency(scaling.run_scaling(config, progress=False), 64)


def test_scaling_times_any_registered_method_by_name(smoke_study_report):
    report, _ = smoke_study_report
    latency = tiny_arm_latency(report)
    assert set(latency) == set(report["arms"])  # every arm, exact as the sweep's own row
    assert all(ms > 0 for ms in latency.values())
    bad = dataclasses.replace(
        scaling_config.SCALING_PRESETS["tiny"],
        extra_arms=({"name": "p", "method": "performer", "options": {"x": 1}},),
    )
    with pytest.raises(ValueError, match="unknown option"):
        bad.validate()
    clash = dataclasses.replace(
        scaling_config.SCALING_PRESETS["tiny"], extra_arms=({"name": "rpka", "method": "rpka"},)
    )
    with pytest.raises(ValueError, match="extra_arms"):
        clash.validate()


# --------------------------------------------------------------------------- figures, tables


def test_pareto_front():
    x = [1.0, 2.0, 3.0, 4.0, 2.5, math.nan]
    y = [5.0, 3.0, 3.5, 1.0, 2.0, 0.0]
    # (3, 3.5) is dominated by (2, 3); (2.5, 2) joins the front; NaN never does
    assert figures_cost.pareto_front(x, y) == [0, 1, 4, 3]


def test_tables(smoke_study_report, tmp_path):
    report, _ = smoke_study_report
    table = tables.results_table(report)  # per arm, the naive forecasts as extra rows
    labels = [tables.arm_label(report, name) for name in report["arms"]]  # "(primary)" marked
    assert list(table["arm"][: len(report["arms"])]) == labels
    assert len(table) == len(report["arms"]) + len(report["naive_baselines"]["forecasts"])
    row = table.set_index("arm").loc["performer-r4"]  # not primary: its plain name
    cmp_ = report["arms"]["performer-r4"]["comparison"]
    assert row["wins vs exact"] == f"{cmp_['idea_wins']}/{cmp_['n_pairs']}"
    groups = {name: tables.arm_group(report, name) for name in report["arms"]}
    assert groups == {
        "exact": "baseline",
        "rpka-r4": "RPKA ablation",  # the ablation reference
        "rpka-r4-greedy": "RPKA ablation",
        "nystrom-uniform-r4": "peer",
        "performer-r4": "peer",
        "mean-attention": "control",
    }
    ablation = tables.ablation_table(report)
    assert ablation["chosen"].sum() == 1 and len(ablation) == 3
    assert ablation.set_index("arm").loc["rpka-r4-greedy", "level"] == "greedy"
    errors = tables.output_error_table(report)
    approximations = {n for n, a in report["arms"].items() if a["method"] not in ("exact", "mean")}
    assert set(errors["arm"]) == approximations
    for frame, name in ((table, "arms"), (ablation, "ablation"), (errors, "errors")):
        path = tables.save_table(frame, tmp_path, f"bench_{name}")
        assert path.exists() and (tmp_path / f"bench_{name}.csv").exists()


def test_figures_write_pngs(smoke_study_report, tmp_path):
    report, _ = smoke_study_report
    figures.set_style()
    latency = tiny_arm_latency(report)
    drawn = [
        figures.plot_deltas(report, tmp_path),  # the forest plot: every arm against exact
        figures.plot_output_error_by_arm(report, tmp_path),
        figures_cost.plot_error_vs_time(report, latency, 64, tmp_path),
    ]
    for name in ("bench_deltas", "bench_output_error", "bench_error_vs_time"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    forest = drawn[0].axes[0]
    labels = [t.get_text() for t in forest.get_yticklabels()]
    assert len(labels) == len(report["arms"]) - 1 and all("wins" in t for t in labels)
    for fig in drawn:
        matplotlib.pyplot.close(fig)


def test_ablations_take_their_references_learning_rate(tmp_path):
    from rpka.bench import InProcessExecutor, run_bench

    config = get_preset(
        "smoke-study",
        train={"epochs": 1},
        learning_rates=(1e-3, 3e-3),
        mechanism=None,
        output_error_ranks=(),
    )
    report = run_bench(config, tmp_path / "out", InProcessExecutor(), False, tmp_path / "cache")
    chosen = report["arms"]["rpka-r4"]["best_cfg"]["lr"]
    for name in ("rpka-r4-greedy", "nystrom-uniform-r4"):
        arm = report["arms"][name]
        assert [row["lr"] for row in arm["sweep"]] == [chosen] == [arm["best_cfg"]["lr"]]
        assert "rpka-r4" in arm["best_cfg"]["selection"]
    assert len(report["arms"]["performer-r4"]["sweep"]) == 2  # a peer sweeps itself
    assert (
        len(config.design.eval_seeds) <= config.execution.seeds_per_job
    )  # one evaluation run per arm
    # sweeps: 3 arms x 2 lrs, 3 arms at a borrowed rate x 1 (2 ablations, the control);
    # evaluation: one run per arm
    assert report["timings"]["n_runs"] == 3 * 2 + 3 * 1 + 6
    control = report["arms"]["mean-attention"]
    assert control["best_cfg"]["lr"] == report["arms"]["exact"]["best_cfg"]["lr"]
    assert set(report["ablation_choice"]["sweep_seeds"]) == set(config.design.sweep_seeds)
    # every full-preset ablation takes rpka-r16's rate; lr_from must name a sweeping arm
    assert {FULL.arm(n).lr_from for n in FULL.studies.ablation_arms} == {"rpka-r16"}
    bad = dataclasses.replace(config.arm("performer-r4"), lr_from="rpka-r4-greedy")
    with pytest.raises(ValueError, match="lr_from"):
        config.replace(arms=(*config.design.arms[:-2], bad)).validate()


def test_an_arm_may_sweep_with_fewer_seeds(tmp_path):
    from rpka.bench import InProcessExecutor, run_bench

    smoke = get_preset("smoke")
    cheap = dataclasses.replace(smoke.arm("rpka-r4"), sweep_seeds=(1,))
    config = get_preset(
        "smoke",
        train={"epochs": 1},
        sweep_seeds=(0, 1),
        seeds_per_job=1,
        arms=(smoke.arm("exact"), cheap),
        mechanism=None,
        output_error_ranks=(),
    )
    report = run_bench(config, tmp_path / "out", InProcessExecutor(), False, tmp_path / "cache")
    assert report["arms"]["exact"]["sweep"][0]["seeds"] == [0, 1]
    assert report["arms"]["rpka-r4"]["sweep"][0]["seeds"] == [1]
    assert report["timings"]["n_runs"] == (2 + 2) + (1 + 2)  # sweep + eval groups per arm
    assert BenchConfig.from_dict(json.loads(json.dumps(report["config"]))) == config
    stray = dataclasses.replace(cheap, sweep_seeds=(7,))
    with pytest.raises(ValueError, match="subset of sweep_seeds"):
        config.replace(arms=(smoke.arm("exact"), stray)).validate()


def test_scaling_cli_times_a_bench_presets_arms(tmp_path, capsys):
    out = tmp_path / "arms.json"
    argv = ["--preset", "tiny", "--bench-preset", "smoke-study", "--lengths", "48"]
    options = ["--warmup", "0", "--repeats", "1", "--quiet", "--out", str(out)]
    result = cli.scaling_main([*argv, *options])
    assert set(scaling.forward_latency(result)) == {
        a.name for a in get_preset("smoke-study").design.arms
    }
    assert json.loads(out.read_text())["config"]["lengths"] == [48]
    with pytest.raises(SystemExit):
        cli.scaling_main([*argv, "--bench-preset", "nope", "--out", str(out)])
    assert "preset must be one of" in capsys.readouterr().err


def test_study_index_reads_every_track_report_it_finds(smoke_study_report):
    """study.json names each track's report (relative path), gate, primary and verdicts;
    a track without a report is listed as missing, and a later call picks it up."""
    report, out = smoke_study_report
    index = study_index.write_study_index("smoke-study", ("forecast", "lm"), out_dir=out)
    assert index["missing"] == ["lm"] and index["longctx"] is None
    entry = index["tracks"]["forecast"]
    assert (out / entry["bench_report"]).resolve() == (out / "bench_report.json").resolve()
    assert entry["attention_gate"] == report["attention_gate"]
    assert entry["primary_arm"] == report["primary_arm"]
    assert entry["primary"]["verdict"] == report["comparison"]["verdict"]
    assert entry["verdicts"] == {
        name: arm["comparison"]["verdict"]
        for name, arm in report["arms"].items()
        if name != report["baseline_arm"]
    }
    assert read_json(out / "study.json") == json.loads(json.dumps(index))


def test_01_trains_demo_runs_train_in_a_terminal_step_and_the_notebook_reuses_them(
    tmp_path, monkeypatch, capsys
):
    """`report` trains 01_train's two models as a step of its own, with a bar in the
    terminal (the cell itself would wait in silence, ~10 min at full); the notebook's call
    then finds them cached (issue 17 item 8). --from-results trains nothing: the notebook
    reads the run files, without their weights too (issue 31 item 5)."""
    labels = [label for label, _, _ in study.compute_steps("smoke", progress=False)]
    assert labels[0] == study.DEMO_STEP and labels[-1] == study.INDEX_STEP
    assert study.notebook_parameters("smoke")["01_train.ipynb"]["run_dir"] == (
        paths.demo_run_dir("smoke")
    )

    trained = []
    run_to_file = study.bench.run_to_file
    monkeypatch.setattr(
        study.bench, "run_to_file", lambda rc, path: trained.append(path) or run_to_file(rc, path)
    )
    first = study.train_demo("smoke", tmp_path, progress=True)
    assert len(trained) == 2 and "lr=" in capsys.readouterr().err  # the step's bars
    again = study.train_demo("smoke", tmp_path, progress=False)  # the notebook's call
    assert len(trained) == 2  # nothing retrained
    assert {k: v["run_file"] for k, v in again.items()} == {
        k: v["run_file"] for k, v in first.items()
    }

    assert sorted(study.demo_run_files("smoke", tmp_path)) == sorted(
        v["run_file"] for v in first.values()
    )
    for run in first.values():  # as in a clone: git keeps run files, not weights
        run["run_file"].with_suffix(".pt").unlink()
    read = study.train_demo("smoke", tmp_path, compute=False)
    assert len(trained) == 2 and not study.demo_weights_present(read)
    assert {k: v["result"] for k, v in read.items()} == {k: v["result"] for k, v in first.items()}
    assert all(v["run_file"].exists() for v in read.values())  # nothing moved aside
    with pytest.raises(study.NotComputed, match="computes nothing: `python -m rpka report"):
        study.train_demo("smoke", tmp_path / "empty", compute=False)
    assert len(trained) == 2
    study.train_demo("smoke", tmp_path)  # a run: retrained for the weights, nothing moved
    assert len(trained) == 4 and not list(tmp_path.glob("*.corrupt-*"))
    assert study.demo_weights_present(study.train_demo("smoke", tmp_path, compute=False))


def test_from_results_computes_only_a_missing_study_index(tmp_path, monkeypatch):
    monkeypatch.setattr(study.paths, "REPO_ROOT", tmp_path)  # resolve() reads it
    assert [label for label, _, _ in study.render_steps("smoke")] == [study.INDEX_STEP]
    index = tmp_path / study.paths.study_json("smoke")
    index.parent.mkdir(parents=True)
    index.write_text("{}")
    assert study.render_steps("smoke") == []


def test_a_reader_that_may_not_compute_neither_computes_nor_moves(tmp_path):
    with pytest.raises(study.NotComputed, match=r"missing\.json is not there"):
        study.load_result(tmp_path / "missing.json", "smoke", compute=False)
    bad = tmp_path / "bench_report.json"
    bad.write_text("{not json")
    with pytest.raises(CorruptFileError):
        study.load_result(bad, "smoke", compute=False)
    with pytest.raises(CorruptFileError):
        study.load_or_run_bench("smoke", tmp_path, compute=False)
    assert bad.read_text() == "{not json"  # a committed result is never moved aside


class _FakeExecutor:
    def __init__(self, n_workers):
        self.n_workers, self.closed, self.cancelled = n_workers, False, False

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.closed, self.cancelled = True, cancel_futures


def test_the_worker_pool_is_started_once_and_only_for_its_worker_count(monkeypatch):
    monkeypatch.setattr(study.bench, "default_executor", _FakeExecutor)
    pool = study.WorkerPool()
    assert pool.get(1) is None  # one worker: the bench runs in-process, as before
    first = pool.get(2)
    assert isinstance(first, _FakeExecutor) and pool.get(2) is first
    assert pool.get(3) is None  # another size: that bench makes its own
    pool.close()
    assert first.closed and pool.executor is None


def test_the_studys_benches_share_one_pool_that_the_long_context_step_closes(monkeypatch):
    monkeypatch.setattr(study.bench, "default_executor", _FakeExecutor)
    seen = []
    monkeypatch.setattr(study.bench, "run_bench", lambda config, out, ex, **kw: seen.append(ex))
    monkeypatch.setattr(study, "run_longctx", lambda config, out, ex, **kw: seen.append(ex))
    steps = {label: compute for label, compute, _ in study.compute_steps("quick", progress=False)}
    for label, compute in steps.items():
        if label.startswith("bench") or label == "long-context training":
            compute()
    assert len(seen) == len(STUDY_TRACKS) + 1
    assert all(ex is seen[0] for ex in seen) and isinstance(seen[0], _FakeExecutor)
    assert seen[0].closed  # closed after the long-context step


def test_a_failing_step_closes_the_pool_dropping_its_queued_jobs(monkeypatch):
    monkeypatch.setattr(study.bench, "default_executor", _FakeExecutor)
    pools = []

    def failing_bench(config, out, ex, **kw):
        pools.append(ex)
        raise RuntimeError("a bench failed")

    monkeypatch.setattr(study.bench, "run_bench", failing_bench)
    steps = {label: compute for label, compute, _ in study.compute_steps("quick", progress=False)}
    with pytest.raises(RuntimeError, match="a bench failed"):
        steps["bench"]()
    assert pools[0].closed and pools[0].cancelled


def test_previews_overlap_notebooks_and_stages_on_one_thread_the_full_study_does_not(
    monkeypatch, tmp_path
):
    seen = {}
    monkeypatch.setattr(cli.pipeline, "run_pipeline", lambda *a, **kw: seen.update(kw))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads, html = torch.get_num_threads(), str(tmp_path / "r.html")
    try:
        cli.report_main(["--preset", "full", "--html", html])
        assert seen["overlap"] is False and "OMP_NUM_THREADS" not in os.environ
        assert torch.get_num_threads() == threads  # the full study's timings: as before
        cli.report_main(["--preset", "smoke", "--parallel", "1", "--html", html])
        assert seen["overlap"] is False
        cli.report_main(["--preset", "smoke", "--html", html])
        assert seen["overlap"] is True and seen["parallel"] == 2
        assert os.environ["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
