"""Issue 53: the decision study's estimands, group-sequential levels, reading and power
(rpka.verdict.longrange_v2, rpka.study.longrange_v2), against scipy, published boundaries
and constructed truths."""

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from rpka import paths
from rpka.cli import longrange as cli_longrange
from rpka.config.presets_longctx import V2_EVAL_SEEDS, V2_INTERIM_SEEDS, get_longctx_preset
from rpka.io import read_json, write_json
from rpka.study import longrange_v2 as study
from rpka.verdict import longrange_v2 as rule

REPO = Path(__file__).resolve().parents[1]
GOOD, FAILED = 0.02, 0.3  # a learned and a failed seed's test MSE


# ------------------------------------------------------------------------- estimands


def test_the_failure_threshold_is_four_times_the_pilots_exact_median():
    pilot = study.pilot_mse(REPO / paths.COMMITTED_RESULTS)
    assert rule.PILOT_EXACT_MEDIAN == pytest.approx(float(np.median(pilot["exact"])), rel=1e-12)
    assert rule.FAILURE_MSE == pytest.approx(0.0860, abs=5e-5)  # the protocol's number


def test_failures_count_diverged_seeds_and_match_clopper_pearson():
    mse = [GOOD, FAILED, float("inf"), float("nan"), GOOD, rule.FAILURE_MSE]
    count = rule.failure_count(mse)
    assert (count["k"], count["n"]) == (3, 6)  # the threshold itself is not a failure
    ci = stats.binomtest(3, 6).proportion_ci(0.95, method="exact")
    assert (count["ci_low"], count["ci_high"]) == (ci.low, ci.high)
    with pytest.raises(ValueError, match="at least one seed"):
        rule.failure_count([])


def test_the_paired_failure_test_is_exact_mcnemar():
    a = [FAILED] * 2 + [GOOD] * 7 + [FAILED] * 3 + [GOOD] * 4
    b = [GOOD] * 2 + [FAILED] * 7 + [FAILED] * 3 + [GOOD] * 4
    test = rule.paired_failures(a, b)
    assert (test["a_only"], test["b_only"], test["both"], test["neither"]) == (2, 7, 3, 4)
    assert test["p_two_sided"] == stats.binomtest(2, 9, 0.5).pvalue
    assert test["p_a_fails_less"] == stats.binomtest(2, 9, 0.5, alternative="less").pvalue
    assert rule.paired_failures([GOOD] * 4, [GOOD] * 4)["p_two_sided"] == 1.0
    with pytest.raises(ValueError, match="the same seeds"):
        rule.paired_failures([GOOD], [GOOD, GOOD])


def test_relative_mse_leaves_failed_seeds_out_and_bounds_the_median_exactly():
    ref = np.array([GOOD] * 12 + [FAILED] * 4)
    ratios = np.linspace(0.9, 1.2, 16)
    arm = ref * ratios
    arm[0] = FAILED  # failed for the arm: out as well
    rel = rule.relative_mse(arm, ref)
    kept = np.sort(ratios[1:12])
    assert rel["pairs"] == 11 and rel["median"] == pytest.approx(float(np.median(kept)))
    u = int(stats.binom.ppf(0.95, 11, 0.5)) + 1  # the order statistic of the upper bound
    assert rel["bound"] == pytest.approx(kept[u - 1]) and rel["low"] == pytest.approx(kept[11 - u])
    assert stats.binom.cdf(u - 1, 11, 0.5) >= 0.95 > stats.binom.cdf(u - 2, 11, 0.5)


def test_the_relative_mse_bound_declares_a_ratio_at_the_margin_within_alpha():
    """The registered rule's false-positive rate at the margin (skewed ratios, as the
    pilot's): at most alpha, up to Monte Carlo error. A t bound on the mean would not."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(1000):
        noise = rng.exponential(0.1, 20) - 0.1 * math.log(2)  # right-skewed, median 0
        ref = np.full(20, GOOD)
        rel = rule.relative_mse(ref * rule.RELATIVE_MARGIN * np.exp(noise), ref)
        hits += rel["bound"] is not None and rel["bound"] < rule.RELATIVE_MARGIN
    assert hits / 1000 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 1000)


# ------------------------------------------------------------------------- the looks


def test_obrien_fleming_levels_match_the_published_boundaries():
    """Lan-DeMets O'Brien-Fleming, one-sided alpha 0.025, two equally spaced looks: upper
    boundaries z = 2.963 and 1.969 (gsDesign, sfLDOF); one look spends all of alpha."""
    a1, a2 = rule.obf_nominal_alphas(0.025)
    assert stats.norm.isf(a1) == pytest.approx(2.963, abs=2e-3)
    assert stats.norm.isf(a2) == pytest.approx(1.969, abs=2e-3)
    assert rule.obf_nominal_alphas(0.05, (1.0,)) == [pytest.approx(0.05)]


def test_the_two_looks_keep_the_type_one_error_at_alpha():
    """Simulated: a z statistic at half and all of the information under the null crosses
    either look's boundary with probability alpha."""
    rng = np.random.default_rng(1)
    first = rng.standard_normal(400_000)
    second = (first + rng.standard_normal(400_000)) / math.sqrt(2)
    a1, a2 = rule.obf_nominal_alphas(0.05)
    crossed = (first > stats.norm.isf(a1)) | (second > stats.norm.isf(a2))
    assert crossed.mean() == pytest.approx(0.05, abs=2e-3)


def _arms(n, uniform_fails=(), rpka_ratio=1.0, exact_fails=()):
    exact = [FAILED if i in exact_fails else GOOD * (1 + 0.01 * (i % 5)) for i in range(n)]
    rpka = [FAILED if i in exact_fails else x * rpka_ratio for i, x in enumerate(exact)]
    uniform = [FAILED if i in uniform_fails else x for i, x in enumerate(exact)]
    return {"exact": exact, "rpka-r64": rpka, "nystrom-uniform-r64": uniform}


def test_the_questions_can_come_out_every_way():
    """Could it come out otherwise? Each answer of each question from constructed data."""
    better = rule.read_questions(_arms(32, uniform_fails=range(12)), 0.05)
    assert better["q1"]["answer"] == "pivoting better"
    tie = rule.read_questions(_arms(32), 0.05)
    assert tie["q1"]["answer"] == "no difference shown" and tie["q2"]["answer"] == "non-inferior"
    worse = rule.read_questions(_arms(32, rpka_ratio=1.2), 0.05)
    assert worse["q2"]["answer"] == "inferior"
    assert worse["q1"]["answer"] == "uniform better"  # uniform = exact here: 20 % better
    arms = _arms(8)
    arms["rpka-r64"] = list(np.asarray(arms["exact"]) * np.linspace(0.96, 1.12, 8))
    margin = rule.read_questions(arms, 0.05)  # median 1.04, but 8 pairs this spread
    assert margin["q2"]["answer"] == "inconclusive"


def test_a_failing_reference_cannot_flatter_the_arm():
    """Issue 53's point: where exact fails and RPKA learns, the old gap scale gave g > 1;
    here those seeds leave the relative MSE, and RPKA's 5 % loss where both learned shows."""
    arms = _arms(32, rpka_ratio=1.10, exact_fails=range(8))
    arms["rpka-r64"][:8] = [GOOD] * 8  # RPKA learns where exact failed
    reading = rule.read_questions(arms, 0.05)
    assert reading["q2"]["relative_mse"]["pairs"] == 24
    assert reading["q2"]["relative_mse"]["median"] == pytest.approx(1.10)
    assert reading["q2"]["answer"] == "inferior"


def test_the_interim_stops_the_study_only_when_both_questions_are_answered():
    strong = _arms(32, uniform_fails=range(12), rpka_ratio=1.0)  # 12 of the interim's 16
    assert rule.sequential_reading(strong, 16)["stopped_at"] == "interim"
    weak = _arms(32, uniform_fails=(1, 20), rpka_ratio=1.0)
    reading = rule.sequential_reading(weak, 16)
    assert reading["stopped_at"] == "final" and reading["final"]["alpha"] > 0.04


def test_one_seed_deciding_an_answer_is_named():
    arms = _arms(16, uniform_fails=range(8))  # 8 discordant: p 0.0078 < 0.05, Holm's 0.025
    flips = rule.one_seed_decides(arms, 0.05)
    assert flips == {"q1": {}, "q2": {}}
    arms = _arms(16, uniform_fails=range(7))  # 7 discordant: p 0.0156; without one: 0.031 > 0.025
    assert rule.read_questions(arms, 0.05)["q1"]["answer"] == "pivoting better"
    flips = rule.one_seed_decides(arms, 0.05)
    assert flips["q1"] == dict.fromkeys(range(7), "no difference shown")
    # the reading names the seeds and what the answer becomes without one of them
    flips = dict.fromkeys(("300", "301", "302"), "no difference shown")
    reading = {"decided_by_one_seed": {"q1": flips}}
    assert study.without_seed(reading, "q1") == (
        "without seed 300, 301 or 302 (to no difference shown)"
    )
    assert study.without_seed(reading, "q2") == ""


def test_the_control_gate():
    assert rule.control_gate([0.9] * 16)["passed"]
    assert not rule.control_gate([0.9] * 15 + [GOOD])["passed"]


# ------------------------------------------------------------------------- the study


def _study_clone(tmp_path):
    """A results folder with the committed pilot's bench report (what reading needs)."""
    pilot = paths.longctx_context_dir(4096)
    src = REPO / paths.COMMITTED_RESULTS / "longrange-power" / pilot / paths.BENCH_REPORT_FILE
    dst = tmp_path / "longrange-power" / pilot / paths.BENCH_REPORT_FILE
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    return tmp_path


def _run_file(folder, arm, seeds, mse):
    members = [{"seed": s, "status": "ok", "final": {"test": {"mse": m}}}
               for s, m in zip(seeds, mse, strict=True)]  # fmt: skip
    runs = folder / "longrange-v2" / paths.longctx_context_dir(4096) / "runs"
    write_json(runs / f"{arm}-{seeds[0]}.json",
               {"arm": arm, "split": "test", "seeds": list(seeds), "members": members})  # fmt: skip


def test_the_reading_waits_for_the_interim_then_reads_it(tmp_path):
    results = _study_clone(tmp_path)
    arms = get_longctx_preset("longrange-v2").bench.design.arm_names
    half = V2_INTERIM_SEEDS[:8]
    for arm in arms:
        _run_file(results, arm, half, [0.9 if arm == "mean-attention" else GOOD] * 8)
    waiting = study.read_study(results)
    assert waiting["reading"] is None and len(waiting["seeds_complete"]) == 8
    rest = V2_INTERIM_SEEDS[8:]
    for arm in arms:
        fails = arm == "nystrom-uniform-r64"  # uniform fails on all 8 new seeds
        _run_file(results, arm, rest, [0.9 if arm == "mean-attention" or fails else GOOD] * 8)
    # and on 4 of the first 8: 12 discordant seeds, p 2^-11 below the interim's 0.0056 / 2
    _run_file(results, "nystrom-uniform-r64", half, [0.9] * 4 + [GOOD] * 4)
    result = study.read_study(results)
    assert result["control_gate"]["passed"]
    interim = result["reading"]["interim"]
    assert interim["alpha"] == pytest.approx(rule.obf_nominal_alphas()[0])
    assert interim["q1"]["failures"]["b_only"] == 12
    assert interim["q1"]["answer"] == "pivoting better"
    assert result["reading"]["stopped_at"] in ("interim", "running")
    assert read_json(results / "longrange-v2" / study.READING_FILE)["seeds_complete"] == list(
        V2_INTERIM_SEEDS
    )
    assert result["pooled_with_pilot"]["seeds"] == 16 + 16
    # final-phase seeds landed for every arm, but not all of them: nothing of them is read
    final_part = [s for s in V2_EVAL_SEEDS if s not in V2_INTERIM_SEEDS][:4]
    for arm in arms:
        _run_file(results, arm, final_part, [0.9] * 4)  # every arm failing would show
    partial = study.read_study(results)
    assert len(partial["seeds_complete"]) == 20
    assert all(row["seeds"] == 16 for row in partial["arms"].values())
    assert partial["arms"]["exact"]["failures"] == result["arms"]["exact"]["failures"]
    assert partial["reading"] == result["reading"]
    assert partial["pooled_with_pilot"] == result["pooled_with_pilot"]


def test_the_final_look_reads_every_seed_once_all_have_landed(tmp_path):
    results = _study_clone(tmp_path)
    arms = get_longctx_preset("longrange-v2").bench.design.arm_names
    rng = np.random.default_rng(0)
    for arm in arms:  # no arm differs: the interim cannot stop the study
        for seeds in (V2_INTERIM_SEEDS, [s for s in V2_EVAL_SEEDS if s not in V2_INTERIM_SEEDS]):
            mse = (
                [0.9] * len(seeds)
                if arm == "mean-attention"
                else list(GOOD * np.exp(rng.normal(0, 0.05, len(seeds))))
            )
            _run_file(results, arm, seeds, mse)
    result = study.read_study(results)
    reading = result["reading"]
    assert reading["stopped_at"] == "final" and reading["interim"]["q1"]["answer"] == (
        "no difference shown"
    )
    final = reading["final"]
    assert final["alpha"] == pytest.approx(rule.obf_nominal_alphas()[1])
    assert all(row["seeds"] == len(V2_EVAL_SEEDS) for row in result["arms"].values())
    assert result["arms"]["rpka-r64"]["relative_mse"]["pairs"] == len(V2_EVAL_SEEDS)
    assert result["pooled_with_pilot"]["seeds"] == 16 + len(V2_EVAL_SEEDS)
    assert "final look" in "\n".join(study.reading_lines(result))


def test_the_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    for argv, says in [
        (["read", "--results", str(tmp_path / "missing")], "no pilot bench report"),
        (["power", "--sims", "5"], "--sims must be in 100..100000, got 5"),
        (["guess"], "invalid choice"),
    ]:
        with pytest.raises(SystemExit) as stop:
            cli_longrange.decision_main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and says in err[-1]


def test_the_committed_power_table_is_what_the_rule_gives():
    """power.json (quoted by the protocol) recomputed on a fraction of its simulations:
    each probability within Monte Carlo error of the committed one."""
    committed = read_json(REPO / paths.COMMITTED_RESULTS / "longrange-v2" / study.POWER_FILE)
    pilot = study.pilot_mse(REPO / paths.COMMITTED_RESULTS)
    row = committed["scenarios"][0]
    assert (row["truth"], row["n_seeds"]) == ("as the pilot", 32)
    again = rule.power({a: pilot[a] for a in study.QUESTION_ARMS}, 32, 16, n_sims=400, seed=7)
    for key in ("q1: pivoting better", "q2: non-inferior"):
        assert again.get(key, 0.0) == pytest.approx(row[key], abs=4 * math.sqrt(0.25 / 400))


def test_the_protocol_predates_every_run_of_the_study():
    """Issue 53, done when: the protocol is in git history before the first v2 run file."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")

    def first_commit(path: str) -> int:
        out = subprocess.run(
            ["git", "log", "--diff-filter=A", "--format=%ct", "--", path], cwd=REPO,
            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        return int(out[-1]) if out else 0

    protocol = first_commit("docs/longrange_protocol_v2.md")
    assert protocol > 0
    runs = REPO / paths.COMMITTED_RESULTS / "longrange-v2" / paths.longctx_context_dir(4096)
    for path in sorted((runs / "runs").glob("*.json")):
        added = first_commit(str(path.relative_to(REPO)))
        assert added == 0 or added >= protocol, f"{path.name} predates the protocol"
    assert json.loads((REPO / "data/results/full/longrange-v2/power.json").read_text())
    assert len(V2_EVAL_SEEDS) == 32


def test_the_report_shows_the_study_as_far_as_it_got(tmp_path):
    """The report's part: status and power before any look; per-arm failures, relative
    MSE and the answers once the interim's seeds are in."""
    from rpka.report.longrange_v2 import decision_section, summary_text
    from rpka.study.index import decision_entry

    results = _study_clone(tmp_path)
    (results / "longrange-v2").mkdir()
    shutil.copy(REPO / paths.COMMITTED_RESULTS / "longrange-v2" / study.POWER_FILE,
                results / "longrange-v2" / study.POWER_FILE)  # fmt: skip
    empty = decision_entry(results)
    text = "\n".join(item.data for item in decision_section({"longrange_v2": empty}))
    assert "0 of 32 seeds are in" in text and "Registered power at 32 seeds" in text
    assert "Not answered yet: 0 of 32 new seeds" in summary_text({"longrange_v2": empty})
    assert summary_text({}) == ""
    arms = get_longctx_preset("longrange-v2").bench.design.arm_names
    for arm in arms:
        failing = arm in ("mean-attention", "nystrom-uniform-r64")
        _run_file(results, arm, V2_INTERIM_SEEDS, [0.9 if failing else GOOD] * 16)
    entry = decision_entry(results)
    text = "\n".join(item.data for item in decision_section({"longrange_v2": entry}))
    row = next(line for line in text.splitlines() if "`nystrom-uniform-r64`" in line)
    assert "16/16 [0.79, 1.00]" in row
    assert "interim look** (level 0.0056): Q1 *pivoting better*" in text
    summary = summary_text({"longrange_v2": entry})  # the Summary's words, from the same look
    assert "At its interim look (16 seeds, level 0.0056" in summary
    assert "Does residual pivoting beat uniform landmarks? Pivoting better" in summary
    assert "Uniform `r64` failed where RPKA learned on 16 seeds, the reverse on 0 seeds" in summary
    assert "`rpka-r64` failed to learn on 0 seeds and exact on 0 seeds" in summary
