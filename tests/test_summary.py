"""The README's results block: rendered from result files, kept in sync with them."""

import copy
import subprocess

import numpy as np
import pandas as pd
import pytest

from rpka import paths
from rpka.cli import commands as cli
from rpka.paths import resolve
from rpka.report import causal_targets, readme, readme_table


def test_arm_table_has_one_row_per_arm_with_the_reports_numbers(smoke_study_report):
    report, _ = smoke_study_report
    table = readme.arm_table(report)
    assert [name.strip("`").split("`")[0] for name in table["arm"]] == list(report["arms"])
    primary = table[table["arm"].str.contains("(primary)", regex=False)]
    assert len(primary) == 1
    arm = report["arms"][report["primary_arm"]]
    cell = primary.iloc[0]
    assert cell[f"test {report['metric']} (mean ± sd)"] == (
        f"{arm['full']['mean']:.4f} ± {arm['full']['std']:.4f}"
    )
    assert cell["wins"] == f"{arm['comparison']['idea_wins']}/{arm['comparison']['n_pairs']}"
    baseline = table.iloc[list(report["arms"]).index(report["baseline_arm"])]
    assert baseline["delta vs exact [95 % CI]"] == "baseline"


def test_targets_say_not_measured_when_a_file_is_missing(smoke_study_report):
    report, _ = smoke_study_report
    results = dict.fromkeys(readme.load_results("smoke"), None)
    results["forecast"] = report
    table = readme.targets_table(results)
    gpu = table[table["target"].str.startswith("GPU")]
    assert len(gpu) == 3 and set(gpu["status"]) == {"n/a"}
    assert not table["target"].str.contains("long context|budget").any()  # no such files


def test_speed_targets_of_issue_16_are_read_from_the_study(smoke_study_report):
    """96-token steps (r16 <= 1.5x, r64 <= 3x exact), the long-context primary at its longest
    context (step <= 0.5x, peak <= 1.5x) and the budget from the recorded training cost."""
    import copy

    report = copy.deepcopy(smoke_study_report[0])
    report["timings"]["step_ratio_vs_baseline"] |= {"rpka-r16": 1.4, "rpka-r64": 3.5}
    longctx = {
        "contexts": [512, 2048],
        "config": {"bench": {"primary_arm": "rpka-r64"}},
        "rows": [
            {"context": 512, "arm": "rpka-r64", "step_ratio_vs_exact": 0.1},
            {"context": 2048, "arm": "exact", "step_ratio_vs_exact": 1.0},
            {
                "context": 2048,
                "arm": "rpka-r64",
                "step_ratio_vs_exact": 0.79,
                "peak_ratio_vs_exact": 1.38,
            },
        ],
    }
    results = {**dict.fromkeys(readme.load_results("smoke")), "forecast": report}
    cost = readme.cost_table("no-such-preset", results)
    table = readme.targets_table({**results, "longctx": longctx}, cost)
    status = dict(zip(table["target"], table["status"], strict=True))
    # the step targets name the track they are measured on (not another forecast track's)
    assert status["forecast track: rpka-r16 training step at 32 tokens ≤ 1.5 × exact"] == "met"
    assert status["forecast track: rpka-r64 training step at 32 tokens ≤ 3.0 × exact"] == "not met"
    assert status["long context, 2,048 tokens: rpka-r64 training step ≤ 0.5 × exact"] == "not met"
    assert status["long context, 2,048 tokens: rpka-r64 peak memory ≤ 1.5 × exact"] == "met"
    cpu_s = sum(t["sweep"] + t["eval"] for t in report["timings"]["run_cpu_s"].values())
    budget = table[table["target"].str.startswith("study budget")].iloc[0]
    assert budget["status"] == ("met" if cpu_s / 120 <= readme.BUDGET_MIN else "not met")
    assert f"{round(cpu_s):,} CPU-s" in budget["measured"]


def test_replace_block_rewrites_only_between_the_markers():
    text = f"intro\n{readme.BEGIN}\nold\n{readme.END}\noutro\n"
    new = readme.replace_block(text, "new | table")
    assert new == f"intro\n{readme.BEGIN}\nnew | table\n{readme.END}\noutro\n"
    assert readme.replace_block(new, "new | table") == new  # idempotent
    with pytest.raises(ValueError, match="no summary block"):
        readme.replace_block("no markers here", "x")


def test_cli_rewrites_a_readme_block(tmp_path, monkeypatch, smoke_study_report):
    _, out = smoke_study_report
    # the smoke study's files where the command looks (a user's run writes out/smoke/, not
    # data/results/smoke: the test must not depend on one having run)
    monkeypatch.setattr(paths, "bench_report", lambda preset, track_dir="": str(
        out / paths.BENCH_REPORT_FILE))  # fmt: skip
    monkeypatch.setattr(cli.results_check, "check_study", lambda preset: [])
    monkeypatch.setattr(cli.study, "write_study_index", lambda preset: {"tracks": {}})
    monkeypatch.setattr(readme_table, "readme_block", lambda preset: f"rendered {preset}")
    readme_md = tmp_path / "README.md"
    readme_md.write_text(f"# x\n{readme.BEGIN}\n{readme.END}\n")
    cli.summary_main(["--preset", "smoke", "--readme", str(readme_md)])
    assert readme_md.read_text() == f"# x\n{readme.BEGIN}\nrendered smoke\n{readme.END}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temporary left behind


def test_render_without_results_names_the_command(monkeypatch):
    monkeypatch.setattr(readme, "_load", lambda path, required=(): None)
    with pytest.raises(FileNotFoundError, match="python -m rpka report --preset full"):
        readme.render("full")


def _full_results_as_committed() -> bool:
    """True when the full study's files are exactly the committed ones (a local rerun of
    ``make report`` rewrites them - timings at least - and the README then describes the
    committed study, not the local one)."""
    root = resolve(".")
    try:
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "data/results", "README.md"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return False  # not a git checkout: nothing to compare with
    return resolve("data/results/full/bench_report.json").exists() and not changed.strip()


@pytest.mark.skipif(
    not _full_results_as_committed(),
    reason="the full study's result files differ from the committed ones (or no git)",
)
def test_readme_block_matches_the_committed_full_study():
    readme_md = resolve("README.md").read_text()
    expected = readme.replace_block(readme_md, readme_table.readme_block("full"))
    assert readme_md == expected, (
        "README's results block is stale: run "
        "`python -m rpka summary --preset full --readme README.md`"
    )


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_readme_python_example_runs(doc):
    """The README's usage example (and docs/cli.md's, moved there from the README) is code a
    reader will paste: it must run as written."""
    text = resolve(doc).read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert blocks, f"{doc} has no python example"
    for block in blocks:
        exec(compile(block, doc, "exec"), {})


# ------------------------------------------------------------------ the report's prose and tables


def test_verdicts_group_every_compared_arm_once(smoke_study_report):
    from rpka.report import narrative

    report, _ = smoke_study_report
    text = narrative.verdicts(report, None)
    rule, groups = text.split(". ", 1)
    compared = [arm for arm, e in report["arms"].items() if e.get("comparison")]
    for arm in compared:
        assert groups.count(f"`{arm}`") == 1
    secondary = report["decision"]["secondary_family"]
    assert f"primary `{report['primary_arm']}` unadjusted" in rule
    assert f"Holm across the {len(secondary)} secondary arm(s)" in rule


def test_limitations_flag_learning_rates_at_the_grid_edge(smoke_study_report):
    from rpka.report import narrative

    report, _ = smoke_study_report
    grid = sorted(report["config"]["learning_rates"])
    text = narrative.limitations(report)
    at_edge = [a for a, e in report["arms"].items() if e["best_cfg"]["lr"] in (grid[0], grid[-1])]
    at_edge = at_edge if len(grid) > 1 else []  # a one-rate grid: nothing to widen from
    assert ("edge of the grid" in text) == bool(at_edge)
    for arm in at_edge:
        assert f"`{arm}`" in text
    wider = {**report, "config": {**report["config"], "learning_rates": [grid[0] / 10, *grid]}}
    text = narrative.limitations(wider)  # every arm's rate is now the grid's top
    assert "edge of the grid" in text and all(f"`{arm}`" in text for arm in report["arms"])


def test_z_variance_and_the_overdispersion_caveat():
    from rpka.report import narrative

    rng = np.random.default_rng(0)
    z = rng.normal(scale=1.5, size=(2, 64))
    mechanism = {
        "trained": {
            "trace_identity": [{"z": list(row)} for row in z],
            "mechanism_signature": {"chi2_p_value": 1e-6, "n_tests": z.size},
        }
    }
    assert narrative.z_variance(mechanism) == pytest.approx(np.var(z))
    report = {
        "arms": {},
        "config": {"learning_rates": [1e-3]},
        "track": "forecast",
        "primary_arm": "x",
        "timings": {"step_ratio_vs_baseline": {}},
        "data": {},
    }
    assert "one Monte Carlo seed cannot" in narrative.limitations(report, mechanism=mechanism)
    mechanism["trained"]["mechanism_signature"]["chi2_p_value"] = 0.5
    assert "over-dispersed" not in narrative.limitations(report, mechanism=mechanism)


def test_the_pooled_mechanism_decision_drives_its_caveat():
    from rpka.report import narrative
    from rpka.verdict.stats import pooled_z

    rng = np.random.default_rng(1)
    for scale, shown in ((1.0, False), (1.5, True)):  # calibrated z vs over-dispersed z
        pooled = pooled_z([rng.normal(scale=scale, size=200) for _ in range(4)])
        sig = {"pooled": pooled, "chi2_p_value": pooled["chi2_p"], "n_tests": 200}
        bullets = narrative.mechanism_limitation({"trained": {"mechanism_signature": sig}})
        assert bool(bullets) == shown == (not pooled["confirmed"])
        if shown:
            assert "over 4 Monte Carlo seeds" in bullets[0] and "not confirmed" in bullets[0]


def test_the_mechanism_followup_says_whether_z_grows_with_the_draws():
    from rpka.report import narrative

    def row(draws, mean_z2):
        z = {"mean_z2": mean_z2, "chi2_p": 0.5}
        return {"draws": draws, "seeds": 8, "z": z, "z_null": z}

    def followup(few, many):
        return {
            "command": "python scripts/mechanism_followup.py",
            "rows": [row(4000, many), row(500, few)],
        }

    assert "do not grow" in narrative.followup_sentence(followup(1.07, 0.92))
    # a bias of 0.5 SE at 500 draws is 1.41 SE at 4,000: mean z^2 1.25 -> 3.0
    assert "not ruled out" in narrative.followup_sentence(followup(1.25, 3.0))
    pooled = {"confirmed": False, "n_seeds": 4, "count": 256, "chi2": 320.0, "chi2_p": 0.004}
    sig = {"pooled": {**pooled, "stouffer_p": 0.4}}
    (bullet,) = narrative.mechanism_limitation(
        {"trained": {"mechanism_signature": sig}}, followup(1.07, 0.92)
    )
    assert "mean z² 1.25" in bullet and "pre-registered" in bullet and "do not grow" in bullet


def test_tables_show_counts_as_integers_and_short_verdicts(smoke_study_report):
    from rpka.report import tables

    report, _ = smoke_study_report
    frame = tables.results_table(report)
    assert str(frame["n"].dtype) == "Int64"
    assert not frame["verdict"].dropna().str.contains(r"\(", regex=True).any()
    assert tables.verdict_word("inconclusive (95% CI of the delta [-1, 1])") == "inconclusive"
    named = pd.DataFrame({"x": [1]}, index=pd.Index(["exact"], name="method"))
    assert "method" in tables.styled(named).to_html()


def test_targets_without_the_long_lengths_say_so():
    scaling = {"rows": [{"method": "rpka", "rank": 64, "n": 256, "speedup_vs_exact": 0.5}]}
    results = dict.fromkeys(["forecast", "lm", "mechanism", "decode", "scaling_gpu"])
    table = readme.targets_table({**results, "scaling_cpu": scaling})
    cpu = table[table["target"].str.startswith("CPU")]
    assert list(cpu["measured"]) == ["not in this sweep"] * 2
    assert set(cpu["status"]) == {"n/a"}


def timed(arm: str, n: int, cpu_ms: list[float], **fields) -> dict:
    """A bench row with its repeats (interleaved with exact's: repeat i beside repeat i)."""
    return {"n": n, "arm": arm, "cpu_ms": float(np.median(cpu_ms)), "cpu_ms_all": cpu_ms,
            **fields}  # fmt: skip


def causal_bench(forward_64: float, train_ms: float, decoder: float) -> dict:
    """A causal bench file (scripts/bench_causal.py's keys): exact at 100 ms a repeat, RPKA's
    forward at 4,096 ``forward_64`` times faster, forward + backward ``train_ms``; the
    decoder's repeats (exact's, then RPKA's) are the committed run of 17:30 UTC on 6
    December, exact's scaled by ``decoder``'s factor."""
    exact = [100.0] * 7
    forward = []
    for n, arm, x in [(4096, "rpka-r64", forward_64), (8192, "rpka-r64", 4.2),
                      (4096, "rpka-r16", 3.0)]:  # fmt: skip
        forward += [timed("exact-causal-sdpa", n, exact), timed(arm, n, [100 / x] * 7,
                    speedup_cpu=x, measured_over_ideal=1.9)]  # fmt: skip
    exact_decoder = [90.6, 86.6, 92.4, 99.3, 104.0, 103.5, 100.4]
    rpka_decoder = [95.3, 97.1, 93.9, 97.6, 118.0, 106.9, 102.7]
    drifting = [x * decoder for x in exact_decoder]
    ratio = float(np.median(drifting) / np.median(rpka_decoder))
    return {
        "forward": forward,
        "forward_backward": [timed("exact", 4096, exact), timed("rpka-r64", 4096, [train_ms] * 7)],
        "peak_memory": [{"n": 4096, "arm": "exact", "peak_over_exact": 1.0},
                        {"n": 4096, "arm": "rpka-r64", "peak_over_exact": 1.6}],
        "decoder": [timed("exact", 2048, drifting, speedup_cpu=1.0),
                    timed("rpka-r64", 2048, rpka_decoder, speedup_cpu=ratio)],
    }  # fmt: skip


def test_causal_targets_state_issue_55s_figures_and_can_fail_each_way():
    rows = causal_targets.causal_targets(causal_bench(2.1, 50.0, 1.2))
    status = {target.split(" at ")[0]: met for target, _, met in rows}
    assert status["causal: rpka r=64 forward ≥ 2 × faster than exact causal SDPA"] is True
    assert status["causal: rpka r=16 forward ≥ 4 × faster than exact causal SDPA"] is False
    assert status["causal: r=64 forward within 2 × its FLOP-ideal time"] is True
    assert status["causal: r=64 forward + backward ≤ 0.5 × exact's time"] is True
    assert status["causal: peak memory of a forward ≤ 1.5 × exact's"] is False
    assert rows[-1][1] == "1.22 × (1.16 × paired)" and rows[-1][2] is True
    slow = causal_targets.causal_targets(causal_bench(1.9, 50.1, 1.2))
    assert [met for *_, met in slow][0] is False and slow[4][1].startswith("0.501 ×")
    assert slow[4][2] is False
    # the committed run's decoder: its medians say faster (exact's time drifted up during the
    # run), its paired repeats slower - RPKA slower in 6 of 7: not met
    measured, met = causal_targets.causal_targets(causal_bench(2.1, 50.0, 1.0))[-1][1:]
    assert measured == "1.02 × (0.97 × paired)" and met is False
    assert causal_targets.causal_targets(None) == []


def test_a_speed_up_just_below_its_target_shows_the_digits_that_say_so():
    """1.996 against >= 2 reads "1.996 ×", not "2.00 ×" beside "not met" (issue 56's rule,
    for a bound from below); a reading that the two digits already tell keeps two."""
    rows = causal_targets.causal_targets(causal_bench(1.996, 50.0, 1.2))
    assert rows[0][1] == "1.996 × (1.996 × paired)" and rows[0][2] is False
    assert causal_targets.causal_targets(causal_bench(2.004, 50.0, 1.2))[0][1].startswith("2.00 ×")
    assert causal_targets.against(1.996, 2.0, at_least=True) == "1.996 ×"
    assert causal_targets.against(1.996, 2.0) == "2.00 ×"  # at most 2: both meet it


def test_causal_targets_show_the_sharp_and_transformers_readings_beside_without_deciding():
    bench = causal_bench(2.1, 50.0, 1.2)
    plain = causal_targets.causal_targets(bench)
    bench["forward_sharp"] = [
        timed("exact-causal-sdpa", 4096, [100.0] * 7, logit_std=3.0),
        timed("rpka-r64", 4096, [125.0] * 7, logit_std=3.0, speedup_cpu=0.8),
    ]
    bench["hf_gpt2"] = [
        timed("exact", 2048, [100.0] * 7, speedup_cpu=1.0),
        timed("rpka-r64", 2048, [130.0] * 7, speedup_cpu=0.77),
    ]
    rows = causal_targets.causal_targets(bench)
    assert rows[0][1] == plain[0][1] + "; at logit std 3: 0.80 ×"
    assert rows[-1][1] == plain[-1][1] + "; transformers GPT-2: 0.77 ×"
    assert [met for *_, met in rows] == [met for *_, met in plain]  # shown, not deciding


def test_control_reading_says_whether_the_track_needs_attention(smoke_study_report):
    import copy

    from rpka.report import narrative

    report, _ = smoke_study_report
    assert narrative.control_arms(report) == ["mean-attention"]
    rigged = copy.deepcopy(report)
    rigged["attention_gate"]["passed"] = True
    assert "needs attention" in narrative.control_reading(rigged)
    assert "attention gate passed" in narrative.control_reading(rigged)
    rigged["attention_gate"]["passed"] = False
    reading = narrative.control_reading(rigged)
    assert "shows no need for attention" in reading
    assert "uninformative" in narrative.limitations(rigged)
    del rigged["arms"]["mean-attention"]
    assert narrative.control_reading(rigged) == ""


def test_relative_figures_give_up_when_exacts_mean_is_near_zero():
    from rpka.report import narrative

    assert narrative.relative_text(0.125) == "12.5 % of exact's mean"
    assert "near 0" in narrative.relative_text(9845.0)  # recall: exact's error is 1e-4
    assert "near 0" in narrative.relative_text(float("inf"))


def test_learnability_of_a_baseline_that_diverged_everywhere_says_so(smoke_study_report):
    from rpka.report import narrative

    report, _ = smoke_study_report
    baseline = report["baseline_arm"]
    diverged = copy.deepcopy(report)
    diverged["arms"][baseline]["n_diverged"] = report["n_seeds"]
    for key in diverged["learnability"]:
        if isinstance(diverged["learnability"][key], float):
            diverged["learnability"][key] = None  # what a report of NaN metrics stores
    assert "diverged on all" in narrative.learnability(diverged)
    assert "diverged" not in narrative.learnability(report)


def test_the_cost_table_sums_each_benchs_run_cpu_seconds(smoke_study_report):
    report, _ = smoke_study_report
    expected = sum(t["sweep"] + t["eval"] for t in report["timings"]["run_cpu_s"].values())
    table = readme.cost_table("no-such-preset", {"forecast": report})
    assert list(table["bench"]) == ["`forecast`", "total"]
    # the smoke bench can take under half a CPU second: its sum rounds to 0, never below
    assert table["CPU s"].iloc[0] == table["CPU s"].iloc[-1] == round(expected)
    assert expected > 0
    assert table["runs"].iloc[0] == report["timings"]["n_runs"]


def test_the_main_limitation_knows_the_long_range_lengths(monkeypatch):
    from rpka.report import text

    scaling = {"status": "crossed", "crossover_n_interp": 826.0, "crossover_n": 1024}
    study = {"tracks": {"t": {"report": {"data": {"context": 96}}, "gate": "passed"}}}
    with_long = {**study, "longrange": {"contexts": {"512": {"gate_passed": True},
                                                     "2048": {"gate_passed": True},
                                                     "1024": {"gate_passed": False}}}}  # fmt: skip
    monkeypatch.setattr(text, "speed_numbers", lambda s: s)  # the sweep's crossover, as read
    alone = text.main_limitation(study, scaling)
    long = text.main_limitation(with_long, scaling)
    assert "do not show quality and speed together" in alone
    assert "meet only on the long-range track (Section 3) at 2,048 tokens" in long
    assert "96 tokens or fewer" in long and "826" in long
