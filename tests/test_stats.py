"""Statistics against scipy/statsmodels and hand-enumerated cases."""

import itertools
import tracemalloc

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from rpka.verdict.significance import (
    FLIP_CHUNK_ENTRIES,
    holm,
    minimum_detectable_effect,
    n_pairs_for_mde,
    paired_t_power,
    rule_mde,
    sign_flip_pvalue,
)
from rpka.verdict.stats import (
    VERDICTS,
    apply_gate,
    apply_holm,
    attention_gate,
    paired_comparison,
    pooled_z,
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
    assert c["rule_can_reject"] is True and c["p_floor"] == pytest.approx(2 / 256)
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
    assert noisy["verdict"] == "inconclusive"
    assert noisy["verdict_detail"].startswith("inconclusive (95% CI")
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
        assert c["verdict"] == "inconclusive" and "Holm over 3" in c["adjustment"]
        # and the MDE of that rule says so: 2/64 is not below 0.05 / 3
        assert c["rule_can_reject"] is False and c["mde"] == float("inf")


def test_diverged_pairs_are_excluded_and_counted():
    c = paired_comparison([1.0, 1.1, 1.2, 0.9], [0.9, float("nan"), 1.15, float("inf")])
    assert c["n_pairs"] == 2 and c["n_excluded"] == 2 == c["n_diverged"]
    assert c["diverged_positions"] == [1, 3] and "diverged" in c["notes"][0]


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


# --- sign-flip test -------------------------------------------------------------------


def _brute_force_sign_flip(diffs, alternative):
    sums = np.array([np.dot(s, diffs) for s in itertools.product([1, -1], repeat=len(diffs))])
    obs, tol = diffs.sum(), 1e-12 * np.abs(diffs).sum()
    if alternative == "two-sided":
        return np.mean(np.abs(sums) >= abs(obs) - tol)
    if alternative == "greater":
        return np.mean(sums >= obs - tol)
    return np.mean(sums <= obs + tol)


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_sign_flip_n8_equals_brute_force_and_scipy(alternative):
    diffs = np.random.default_rng(3).normal(0.2, 1.0, size=8)
    p, how = sign_flip_pvalue(diffs, alternative=alternative)
    assert p == pytest.approx(_brute_force_sign_flip(diffs, alternative), abs=1e-12)
    ref = stats.permutation_test(
        (diffs,),
        np.mean,
        permutation_type="samples",
        n_resamples=np.inf,
        alternative=alternative,
    ).pvalue
    assert p == pytest.approx(ref, abs=1e-12) and "2^8" in how


def test_sign_flip_5000_pairs_is_quick_bounded_and_seeded():
    diffs = np.random.default_rng(1).normal(0.0, 1.0, size=5000)
    p, how = sign_flip_pvalue(diffs, seed=7)
    # bounded: a fixed number of random flips (scipy's exhaustive-or-random permutation_test
    # took ~110 s on these 5,000 pairs here)
    assert "100000 random sign flips" in how
    assert p == sign_flip_pvalue(diffs, seed=7)[0]  # seeded
    assert p == pytest.approx(stats.ttest_1samp(diffs, 0).pvalue, abs=0.01)


def test_paired_comparison_5000_pairs_has_bounded_peak_memory():
    """All of paired_comparison at 5,000 pairs (the sign flips in chunks of at most
    FLIP_CHUNK_ENTRIES signs) peaks at tens of MB; scipy's permutation_test took 23 GB."""
    diffs = np.random.default_rng(1).normal(0.0, 1.0, size=5000)
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        c = paired_comparison(np.zeros(5000), diffs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    assert c["n_pairs"] == 5000 and c["loso_verdicts"] is None
    assert "100000 random sign flips" in c["p_value_method"]
    # numpy's arrays are traced: one chunk of int8 signs is in the peak, so the bound bites
    assert FLIP_CHUNK_ENTRIES <= peak < 200 * 2**20, f"peak {peak / 2**20:.0f} MiB"


# --- edge cases (issue 17 item 4) -----------------------------------------------------


def test_one_pair_is_refused_before_scipy():
    with pytest.raises(ValueError, match="paired_comparison needs at least 2 pairs, got 1"):
        paired_comparison([1.0], [0.9])


@pytest.mark.parametrize("value", [0.0, 0.01, -0.02])
def test_zero_variance_differences(value):
    base = np.linspace(1.0, 2.0, 8)
    c = paired_comparison(base, base + value, "lower")
    assert (c["ci_low"], c["ci_high"]) == pytest.approx((value, value))  # degenerate [d, d]
    assert np.isnan(c["ttest_p"]) and np.isnan(c["mde"]) and np.isnan(c["tost_p"])
    assert any("zero variance" in note for note in c["notes"])
    if value == 0:
        assert c["p_value"] == 1.0 and c["verdict"] == "inconclusive"
    else:  # all 8 the same sign: the sign-flip p is its floor 2/256, well defined
        assert c["p_value"] == pytest.approx(2 / 256)
        assert c["verdict"] == ("significant win" if value < 0 else "significant loss")


def test_all_pairs_diverged_gives_no_test_not_a_crash():
    nan = float("nan")
    c = paired_comparison([1.0, 1.1, 1.2], [nan, nan, 1.0])
    assert c["n_pairs"] == 1 and c["n_diverged"] == 2 and c["verdict"] == "inconclusive"
    assert np.isnan(c["p_value"]) and "only 1 finite pair" in " ".join(c["notes"])


@pytest.mark.parametrize("bad", [[0.1, 1.2], [-0.01], [float("inf")], [0.2, float("-inf")]])
def test_holm_rejects_p_outside_unit_interval(bad):
    with pytest.raises(ValueError, match=r"p-value #\d+ is"):
        holm([0.01, *bad])


def test_holm_is_monotone_and_capped():
    adjusted = holm([0.04, 0.01, 0.03, 0.5])
    order = np.argsort([0.04, 0.01, 0.03, 0.5])
    assert np.all(np.diff(np.array(adjusted)[order]) >= 0) and max(adjusted) <= 1.0


def test_bad_margin_refused():
    with pytest.raises(ValueError, match="margin"):
        paired_comparison([1.0, 2.0], [1.0, 2.1], margin=-0.1)


# --- TOST and the verdict vocabulary --------------------------------------------------

NOISE = np.random.default_rng(11).normal(0.0, 0.001, size=10)
BASE = np.linspace(1.0, 1.5, 10)


def test_tost_equivalent_with_wide_margin_against_scipy():
    c = paired_comparison(BASE, BASE + NOISE, "lower", margin=0.01)
    d = NOISE  # idea - base, up to round-off
    lower = stats.ttest_1samp(d, -0.01, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, 0.01, alternative="less").pvalue
    assert c["tost_p"] == pytest.approx(max(lower, upper), rel=1e-6)
    assert c["verdict"] == "equivalent" and "ttest_1samp" in c["tost_method"]


def test_tost_cannot_say_equivalent_with_tiny_margin_or_few_seeds():
    tiny = paired_comparison(BASE, BASE + NOISE, "lower", margin=1e-5)
    assert tiny["tost_p"] > 0.05 and tiny["verdict"] == "inconclusive"
    few = paired_comparison(BASE[:2], BASE[:2] + NOISE[:2] * 30, "lower", margin=0.01)
    assert few["tost_p"] > 0.05 and few["verdict"] == "inconclusive"
    none = paired_comparison(BASE, BASE + NOISE, "lower")  # no margin: no equivalence
    assert np.isnan(none["tost_p"]) and none["verdict"] == "inconclusive"


def test_verdict_vocabulary_win_loss_and_uninformative_via_gate():
    win = paired_comparison(BASE, BASE - 0.05 + NOISE, "lower", margin=0.01)
    loss = paired_comparison(BASE, BASE + 0.05 + NOISE, "lower", margin=0.01)
    higher = paired_comparison(BASE, BASE + 0.05 + NOISE, "higher", margin=0.01)
    assert (win["verdict"], loss["verdict"], higher["verdict"]) == (
        "significant win",
        "significant loss",
        "significant win",
    )
    control = BASE * 1.1  # worse by 10 % only: the gate at 25 % fails
    gate = attention_gate(BASE, control, "lower", min_rel=0.25)
    assert not gate["passed"] and gate["control_rel"] == pytest.approx(0.1, rel=1e-6)
    apply_gate(win, gate)
    assert win["verdict"] == "uninformative" and win["verdict_before_gate"] == "significant win"
    for c in (win, loss, higher):
        assert c["verdict"] in VERDICTS and "no effect" not in c["verdict_detail"]


def test_attention_gate_passes_and_states_its_floor():
    gate = attention_gate(BASE, BASE * 1.5 + NOISE, "lower")
    assert gate["passed"] and gate["p_value"] == pytest.approx(1 / 1024)
    assert gate["p_value"] == pytest.approx(
        stats.permutation_test(
            (BASE * 0.5 + NOISE,),
            np.mean,
            permutation_type="samples",
            n_resamples=np.inf,
            alternative="greater",
        ).pvalue
    )
    four = attention_gate(BASE[:4], BASE[:4] * 2, "lower")  # 1/16 > 0.05: can never pass
    assert not four["passed"] and four["rule_can_pass"] is False


def test_primary_stays_unadjusted_and_secondaries_use_holm():
    comps = {f"arm{i}": paired_comparison(BASE, BASE - 0.05 + NOISE) for i in range(3)}
    apply_holm(comps, primary="arm0")
    assert comps["arm0"]["p_adjusted"] == comps["arm0"]["p_value"]
    assert comps["arm0"]["adjustment"].startswith("none")
    assert comps["arm1"]["adjustment"] == "Holm over 2 comparison(s)"
    assert comps["arm1"]["mde_alpha"] == pytest.approx(0.025)
    assert comps["arm0"]["mde_alpha"] == pytest.approx(0.05)


# --- MDE of the rule ------------------------------------------------------------------


def test_power_at_the_mde_is_80_percent_by_simulation():
    n, sd = 10, 0.3
    mde = rule_mde(n, sd)["mde"]
    rng = np.random.default_rng(0)
    diffs = rng.normal(mde, sd, size=(4000, n))
    rejected = stats.ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.05
    assert rejected.mean() == pytest.approx(0.8, abs=0.05)


def test_zero_power_for_four_seeds_with_holm_over_three():
    out = rule_mde(4, 0.1, alpha_rule=0.05 / 3)
    assert out["rule_can_reject"] is False and out["mde"] == float("inf")
    assert out["p_floor"] == pytest.approx(2 / 16) and "zero power" in out["mde_note"]
    assert rule_mde(4, 0.1)["rule_can_reject"] is False  # 2/16 > 0.05 even unadjusted


def test_n_pairs_for_mde_is_the_smallest_sufficient():
    sd, margin = 0.02, 0.01
    for n_tests in (1, 13):
        n = n_pairs_for_mde(sd, margin, n_tests=n_tests)
        at = rule_mde(n, sd, 0.05 / n_tests)
        before = rule_mde(n - 1, sd, 0.05 / n_tests)
        assert at["rule_can_reject"] and at["mde"] <= margin
        assert not (before["rule_can_reject"] and before["mde"] <= margin)
    assert n_pairs_for_mde(0.0, 0.01, n_tests=13) == 10  # floor only: 2/2^10 < 0.05/13
    with pytest.raises(ValueError, match="margin"):
        n_pairs_for_mde(0.1, 0.0)


# --- robustness -----------------------------------------------------------------------


def test_one_seed_driving_the_result_is_flagged():
    diffs = np.array([-0.01, 0.005, -0.002, 0.003, -0.004, 0.001, -0.003, -2.0])
    c = paired_comparison(np.ones(8), 1 + diffs, "lower")
    assert c["largest_seed"] == 7 and c["largest_seed_delta"] == pytest.approx(-2.0)
    assert c["largest_seed_share"] == pytest.approx(-2.0 / diffs.sum())
    assert c["delta_median"] == pytest.approx(np.median(diffs))
    steady = paired_comparison(np.ones(8), 1 - 0.05 - np.abs(NOISE[:8]), "lower")
    assert steady["verdict"] == "significant win"
    # all 8 same sign: p = 2/256; dropping any seed leaves 2/128 < 0.05: no flip
    assert steady["verdict_flipped_by_one_seed"] is False
    six = paired_comparison(np.ones(6), 1 - 0.05 - np.abs(NOISE[:6]), "lower")
    # 6 same sign: 2/64 < 0.05 is a win; any 5 give 2/32 = 0.0625: every seed flips it
    assert six["verdict"] == "significant win" and six["verdict_flipped_by_one_seed"] is True
    assert six["flipping_seeds"] == list(range(6))


# --- mechanism pooling ----------------------------------------------------------------


def test_pooled_z_against_scipy_and_decides():
    rng = np.random.default_rng(5)
    calibrated = [rng.normal(size=40) for _ in range(5)]
    out = pooled_z(calibrated)
    z = np.concatenate(calibrated)
    assert out["chi2_p"] == pytest.approx(stats.chi2.sf((z**2).sum(), 200))
    assert out["stouffer_z"] == pytest.approx(z.sum() / np.sqrt(200))
    assert out["stouffer_p"] == pytest.approx(2 * stats.norm.sf(abs(z.sum() / np.sqrt(200))))
    assert out["confirmed"] and out["count"] == 200 and out["n_seeds"] == 5
    # a bias of 0.5 SE at every step passes a per-step |z| <= 4 rule, not the pooled one
    biased = [rng.normal(0.5, 1.0, size=40) for _ in range(5)]
    assert np.all(np.abs(np.concatenate(biased)) <= 4) and not pooled_z(biased)["confirmed"]
    with pytest.raises(ValueError, match="finite z"):
        pooled_z([[float("nan")]])


def test_pooled_z_catches_a_bias_the_per_step_rule_passes():
    """A bias of 0.5 SE at every one of 1,000 steps never crosses |z| = 4 at one step, yet
    Stouffer's pooled sum rejects it (issue 15: the per-step rule does not decide)."""
    z = np.random.default_rng(0).standard_normal((4, 250)) * 0.5 + 0.5
    assert np.abs(z).max() < 4
    pooled = pooled_z(list(z))
    assert not pooled["confirmed"] and pooled["stouffer_p"] < 1e-10
    assert pooled_z(list(np.random.default_rng(1).standard_normal((4, 250))))["confirmed"]


def test_seeds_for_margin_is_the_rules_own_sample_size():
    from rpka.verdict.significance import seeds_for_margin

    needed = seeds_for_margin(0.05, 0.02, 0.05)
    assert needed == n_pairs_for_mde(0.05, 0.02)
    assert rule_mde(needed, 0.05)["mde"] <= 0.02 < rule_mde(needed - 1, 0.05)["mde"]
    assert seeds_for_margin(0.05, None, 0.05) is None
    assert seeds_for_margin(float("nan"), 0.02, 0.05) is None
    assert seeds_for_margin(1e3, 1e-6, 0.05) is None  # beyond 10,000 seeds
    rng = np.random.default_rng(0)
    base = rng.normal(size=8)
    c = paired_comparison(base, base + 0.1 + 0.05 * rng.normal(size=8), margin=0.02)
    assert c["seeds_for_margin"] == seeds_for_margin(c["delta_sd"], 0.02, c["mde_alpha"])


def test_overflowing_pairs_count_as_diverged_and_bad_values_are_named():
    """Hostile inputs: differences that overflow (+-1e308) are diverged pairs, never a p of
    0 or a verdict; non-numbers name the argument."""
    from rpka.verdict.stats import paired_comparison

    base = [1e308, -1e308, 1.0, 1.1, 0.9, 1.0]
    idea = [-1e308, 1e308, 1.2, 1.3, 1.1, 1.2]
    c = paired_comparison(base, idea)
    assert c["n_diverged"] == 2 and c["n_pairs"] == 4
    assert np.isfinite(c["delta_mean"]) and c["p_value"] >= 2 / 2**4
    with pytest.raises(ValueError, match="baseline must be a 1-d sequence of numbers"):
        paired_comparison(["a", "b"], [1.0, 2.0])


def test_identical_scores_are_equivalent_within_a_margin():
    """A positive control that reproduces exact on every seed (differences all 0.0) is
    equivalent: TOST takes the t-tests' limit as the spread goes to 0 (scipy gives NaN)."""
    base = np.linspace(1.0, 2.0, 6)
    same = paired_comparison(base, base.copy(), "lower", margin=0.02)
    assert same["tost_p"] == 0.0 and same["verdict"] == "equivalent"
    assert "zero-variance" in same["tost_method"]
    outside = paired_comparison(base, base + 0.05, "lower", margin=0.02)  # every pair +0.05
    assert outside["tost_p"] == 1.0 and outside["verdict"] == "significant loss"
    # the limit follows the margin: a constant difference at the margin is not inside it
    at_margin = paired_comparison(base, base + 0.02, "lower", margin=0.02)
    assert at_margin["tost_p"] == 1.0
