"""Statistics against scipy/statsmodels and hand-enumerated cases."""

import itertools

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from rpka.stats import (
    apply_holm,
    holm,
    minimum_detectable_effect,
    paired_comparison,
    paired_t_power,
    sign_flip_pvalue,
    summarize,
)


def test_sign_flip_p_matches_hand_enumeration():
    diffs = np.array([0.3, -0.1, 0.25, 0.4, 0.05, -0.2, 0.15])
    observed = abs(diffs.mean())
    flips = [abs((diffs * np.array(s)).mean()) for s in itertools.product([1, -1], repeat=7)]
    expected = np.mean([f >= observed - 1e-12 for f in flips])
    p, how = sign_flip_pvalue(diffs)
    assert p == pytest.approx(expected, abs=1e-12)
    assert "exact" in how and "2^7" in how


def test_sign_flip_uses_resamples_beyond_20_pairs():
    rng = np.random.default_rng(0)
    diffs = rng.normal(0.5, 1.0, size=30)
    p, how = sign_flip_pvalue(diffs)
    assert "random sign flips" in how
    # agrees with the t-test to Monte Carlo accuracy for this roughly normal sample
    assert p == pytest.approx(stats.ttest_1samp(diffs, 0).pvalue, abs=0.02)


def test_all_sign_patterns_same_direction_small_n():
    # n = 4, all positive: the smallest attainable two-sided p is 2/16
    p, _ = sign_flip_pvalue(np.array([1.0, 2.0, 3.0, 4.0]))
    assert p == pytest.approx(2 / 16)


def test_mde_against_statsmodels_power():
    for n in (2, 3, 5, 8, 20):
        d = minimum_detectable_effect(n)
        assert paired_t_power(d, n) == pytest.approx(0.8, abs=1e-8)
        ref = TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
        assert d == pytest.approx(ref, rel=1e-4)


def test_holm_against_statsmodels():
    p = [0.01, 0.04, 0.03, 0.20, 0.005]
    ref = multipletests(p, method="holm")[1]
    assert np.allclose(holm(p), ref)
    # NaN is carried through and not counted in m
    out = holm([0.01, float("nan"), 0.04])
    assert np.isnan(out[1]) and np.allclose(
        [out[0], out[2]], multipletests([0.01, 0.04], method="holm")[1]
    )


def test_paired_comparison_fields_against_scipy():
    base = np.array([1.00, 0.95, 1.10, 1.02, 0.98, 1.05, 0.99, 1.01])
    idea = base + np.array([-0.05, -0.02, 0.01, -0.04, -0.03, -0.06, 0.00, -0.01])
    c = paired_comparison(base, idea, "lower")
    diffs = idea - base
    assert c["n_pairs"] == 8 and c["per_seed_diffs"] == pytest.approx(diffs.tolist())
    assert c["delta_mean"] == pytest.approx(diffs.mean())
    t = stats.ttest_rel(idea, base)
    low, high = t.confidence_interval(0.95)
    assert (c["ci_low"], c["ci_high"]) == pytest.approx((low, high))
    assert c["ci_halfwidth"] == pytest.approx((high - low) / 2)
    assert c["ttest_p"] == pytest.approx(t.pvalue)
    assert c["wilcoxon_p"] == pytest.approx(stats.wilcoxon(idea, base).pvalue)
    assert c["idea_wins"] == 6 and c["ties"] == 1  # lower is better: 6 negative diffs
    ci = stats.binomtest(6, 8).proportion_ci(0.95, method="exact")
    assert (c["wins_ci_low"], c["wins_ci_high"]) == pytest.approx((ci.low, ci.high))
    assert c["d_z"] == pytest.approx(diffs.mean() / diffs.std(ddof=1))
    assert c["mde"] == pytest.approx(minimum_detectable_effect(8) * diffs.std(ddof=1))
    assert c["mde"] != pytest.approx(c["ci_halfwidth"])  # two different quantities
    assert c["mde_rel_pct"] == pytest.approx(100 * c["mde"] / base.mean())


def test_direction_higher_counts_wins_the_other_way():
    base = [0.5, 0.6, 0.7]
    idea = [0.6, 0.7, 0.6]
    assert paired_comparison(base, idea, "higher")["idea_wins"] == 2
    assert paired_comparison(base, idea, "lower")["idea_wins"] == 1


def test_verdicts():
    base = np.linspace(1.0, 1.2, 10)
    better = paired_comparison(base, base - 0.1 - 0.01 * np.arange(10) % 3, "lower")
    assert better["verdict"] == "significant win" and better["p_value"] < 0.05
    worse = paired_comparison(base, base + 0.1 + 0.01 * (np.arange(10) % 3), "lower")
    assert worse["verdict"] == "significant loss"
    noisy = paired_comparison(base, base + np.array([0.1, -0.1] * 5), "lower")
    assert noisy["verdict"].startswith("inconclusive (95% CI")
    for c in (better, worse, noisy):
        assert "no effect" not in c["verdict"]


def test_holm_can_turn_a_win_inconclusive():
    base = np.linspace(1.0, 1.2, 6)
    # p = 2/64 exact sign-flip for 6 same-sign diffs: significant alone, not after x3
    comps = {
        f"arm{i}": paired_comparison(base, base - 0.05 - 0.01 * np.arange(6), "lower")
        for i in range(3)
    }
    assert all(c["verdict"] == "significant win" for c in comps.values())
    apply_holm(comps)
    for c in comps.values():
        assert c["p_adjusted"] == pytest.approx(min(1.0, 3 * 2 / 64))
        assert c["verdict"].startswith("inconclusive") and "Holm over 3" in c["adjustment"]


def test_diverged_pairs_are_excluded_and_counted():
    c = paired_comparison([1.0, 1.1, 1.2, 0.9], [0.9, float("nan"), 1.15, float("inf")])
    assert c["n_pairs"] == 2 and c["n_excluded"] == 2


def test_summarize_against_numpy_and_scipy():
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, float("nan")])
    s = summarize(x)
    f = x[np.isfinite(x)]
    assert s["n"] == 8 and s["n_nonfinite"] == 1
    assert s["mean"] == pytest.approx(f.mean()) and s["sd"] == pytest.approx(f.std(ddof=1))
    assert s["median"] == pytest.approx(np.median(f))
    # IQM of 8 values: the mean of the middle four
    assert s["iqm"] == pytest.approx(np.sort(f)[2:6].mean())
    half = stats.t.ppf(0.975, 7) * f.std(ddof=1) / np.sqrt(8)
    assert (s["ci_low"], s["ci_high"]) == pytest.approx((f.mean() - half, f.mean() + half))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"metric_direction": "smaller"}, "metric_direction"),
        ({"idea": [1.0, 2.0]}, "pair up"),
        ({"alpha": 1.5}, "alpha"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"baseline": [1.0, 2.0, 3.0], "idea": [1.0, 2.0, 2.5], **kwargs}
    with pytest.raises(ValueError, match=match):
        paired_comparison(**args)
