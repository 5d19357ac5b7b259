"""Leave-one-seed-out robustness, the sign-flip interval and the long-range answer
(issue 40, ``rpka.verdict.robustness``; wired into ``frontier.json`` and ``study.json``)."""

from __future__ import annotations

import numpy as np
import pytest

from rpka.io import read_json
from rpka.paths import resolve
from rpka.study.index import longrange_robustness
from rpka.verdict.decision import CHEAPER_RATIO_MAX, CHEAPER_UPPER_MAX, gap_recovered, is_cheaper
from rpka.verdict.frontier import LongRangeTiming
from rpka.verdict.robustness import (
    arm_robustness,
    longrange_answer,
    one_sided_lower,
    signflip_interval,
)
from rpka.verdict.significance import sign_flip_pvalue
from rpka.verdict.step_cost import peak_ratio_of, with_longctx_timing

COMMITTED = "data/results/full/longrange/longctx/context-{}/bench_report.json"


@pytest.mark.parametrize("seed", range(4))
def test_the_interval_is_the_sign_flip_test_inverted(seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(0.3 * seed, 1.0, 10)
    ci = signflip_interval(d)
    p = sign_flip_pvalue(d)[0]
    assert (ci["low"] > 0 or ci["high"] < 0) == (p < 0.05)  # agrees with the test at 0
    eps = 1e-6 * np.ptp(d)
    for end, outward in ((ci["low"], -eps), (ci["high"], eps)):
        assert sign_flip_pvalue(d - end)[0] >= 0.05
        assert sign_flip_pvalue(d - (end + outward))[0] < 0.05


def test_too_few_pairs_cannot_bound_the_interval():
    ci = signflip_interval([0.1, 0.2, 0.3, 0.4])  # 4 pairs: the two-sided p is >= 1/8
    assert ci["low"] is None and ci["high"] is None


def test_one_seed_that_carries_the_verdict_is_named():
    g = np.array([0.99, 0.995, 0.985, 0.99, 0.993, 0.60, 0.991, 0.992])  # seed 105 fails
    seeds = list(range(100, 108))
    found = arm_robustness(g, g - 1, seeds, gap_recovered)
    assert found["verdict"] == "not shown"
    assert not found["robust"] and found["rests_on_seeds"] == [105]
    assert found["loo_ci_low_max"] > 0.95 > found["loo_ci_low_min"]
    steady = arm_robustness(np.delete(g, 5), np.delete(g, 5) - 1, seeds[:5] + seeds[6:],
                            gap_recovered)  # fmt: skip
    assert steady["verdict"] == "non-inferior" and steady["robust"]
    assert steady["rests_on_seeds"] == []


def test_the_lower_bound_decides_as_the_t_test():
    rng = np.random.default_rng(7)
    for _ in range(20):
        g = rng.normal(0.97, 0.03, 8)
        low = one_sided_lower(g)
        assert (low > 0.95) == (gap_recovered(g)["verdict"] == "non-inferior")


def test_the_committed_study_rests_on_seed_105_at_1024_tokens():
    """The issue's reading, recomputed: without seed 105, rpka-r16 would be non-inferior."""
    report = read_json(resolve(COMMITTED.format(1024)))
    rows = longrange_robustness(report, LongRangeTiming(1024, None, None))
    assert rows["rpka-r16"]["verdict"] == "not shown"
    assert rows["rpka-r16"]["rests_on_seeds"] == [105] and not rows["rpka-r16"]["robust"]
    assert rows["rpka-r128"]["robust"]
    r64 = rows["rpka-r64"]  # "significant loss" at p 0.031; without any one seed p 0.0625
    assert r64["p_primary"] == pytest.approx(0.03125) and r64["loo_p_max"] == pytest.approx(0.0625)
    assert r64["signflip_ci"]["low"] > 0  # the sign-flip interval agrees with its p
    assert all(
        row["step_ratio_cpu"] is None and row["timing_file"] is None for row in rows.values()
    )


def test_cheaper_needs_the_ratio_and_its_upper_bound():
    assert is_cheaper(
        {"mean": CHEAPER_RATIO_MAX, "ci_low": 0.7, "ci_high": CHEAPER_UPPER_MAX - 0.01}
    )
    assert not is_cheaper({"mean": CHEAPER_RATIO_MAX + 0.01, "ci_low": 0.7, "ci_high": 0.85})
    assert not is_cheaper({"mean": 0.7, "ci_low": 0.5, "ci_high": CHEAPER_UPPER_MAX})
    assert not is_cheaper(None)


def _row(arm, method, verdict, robust, mean, high):
    ratio = {"mean": mean, "ci_low": mean - 0.05, "ci_high": high}
    return {"arm": arm, "method": method, "verdict": verdict, "robust": robust,
            "step_ratio_cpu": ratio}  # fmt: skip


def test_the_answer_is_the_shortest_length_robust_and_cheaper():
    frontiers = {
        1024: {"positive_control": {"arm": "rpka-r8192", "verdict": "non-inferior"}, "rows": [
            _row("rpka-r16", "rpka", "non-inferior", False, 0.5, 0.6),  # rests on a seed
            _row("rpka-r128", "rpka", "non-inferior", True, 0.95, 1.0),  # not cheaper
            _row("rpka-r8192", "rpka", "non-inferior", True, 0.3, 0.35),  # positive control
        ]},
        2048: {"positive_control": None, "rows": [
            _row("rpka-r64", "rpka", "non-inferior", True, 0.6, 0.7),
            _row("nystrom-uniform-r64", "nystrom-uniform", "non-inferior", True, 0.55, 0.65),
        ]},
    }  # fmt: skip
    answer = longrange_answer(frontiers)
    assert answer["per_length"]["1024"]["cheapest"] == "rpka-r128"
    assert answer["per_length"]["2048"]["cheapest"] == "nystrom-uniform-r64"
    assert answer["n_star"] == {"rpka": 2048, "nystrom-uniform": 2048} and answer["tie"]
    frontiers[2048]["rows"][1]["robust"] = False
    again = longrange_answer(frontiers, pending=[4096])
    assert again["n_star"]["nystrom-uniform"] is None and not again["tie"]
    assert again["pending_lengths"] == [4096] and answer["pending_lengths"] == []


def test_a_steps_peak_memory_ratio_comes_from_the_timing_file():
    timing = {"contexts": {"2048": {"exact": {"peak_mib": 150.0}, "rpka-r16": {"peak_mib": 183.0}}}}
    assert peak_ratio_of(timing, "2048", "rpka-r16", "exact") == pytest.approx(1.22)
    assert peak_ratio_of(timing, "4096", "rpka-r16", "exact") is None  # length not timed
    assert peak_ratio_of(None, "2048", "rpka-r16", "exact") is None


def test_a_long_context_studys_step_ratios_come_from_its_timing_file():
    longctx = {"preset": "full", "rows": [
        {"context": 2048, "arm": "rpka-r64", "step_ms": 700.0, "step_ratio_vs_exact": 0.48},
        {"context": 512, "arm": "rpka-r64", "step_ms": 300.0, "step_ratio_vs_exact": 1.9},
    ]}  # fmt: skip
    ratio = {"mean": 0.501, "ci_low": 0.486, "ci_high": 0.517}
    timing = {"preset": "full", "contexts": {"2048": {
        "rpka-r64": {"cpu_s_median": 0.7377, "step_ratio_cpu": ratio}}}}  # fmt: skip
    timed = with_longctx_timing(longctx, timing)
    row, untimed = timed["rows"]
    assert row["step_ratio_vs_exact"] == 0.501 and row["step_ratio_ci"] == [0.486, 0.517]
    assert row["step_ms"] == pytest.approx(737.7) and row["step_source"] == "steptime.json"
    assert untimed == longctx["rows"][1]  # a length the file did not time keeps its record
    assert longctx["rows"][0]["step_ratio_vs_exact"] == 0.48  # the file's content untouched
    assert with_longctx_timing(longctx, {**timing, "preset": "quick"}) is longctx
    assert with_longctx_timing(None, timing) is None
