"""The tests behind a verdict (docs/design.md section 5, ``docs/statistics.md``): the
sign-flip permutation p of paired differences and the smallest p it can return, the
rule's power (its minimum detectable effect, the seeds it needs), Holm's step-down
adjustment over a family, and the TOST equivalence test.

``scipy.stats.permutation_test`` computes the same sign-flip p (the tests check it), but
measured on this machine it took 25 s for one exact n = 20 test and 109 s for n = 5,000
with 10^5 resamples; the version here enumerates the 2^n signed sums as an outer sum of
two halves (2^n floats, no 2^n x n matrix) and draws Monte Carlo flips in bounded chunks.
The power comes from the noncentral t (``scipy.stats.nct``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.80
EXACT_FLIP_MAX_N = 20  # all 2^n sign flips up to here, Monte Carlo resamples beyond
N_RESAMPLES = 100_000
FLIP_CHUNK_ENTRIES = 1 << 22  # Monte Carlo flips: at most this many signs in memory at once
ALTERNATIVES = ("two-sided", "greater", "less")


def check_unit(name: str, value: float) -> None:
    """A level or a power: a number strictly between 0 and 1."""
    if not (isinstance(value, int | float) and 0 < value < 1):
        raise ValueError(f"{name} must lie in (0, 1), got {value!r}")


# --- sign-flip permutation test -------------------------------------------------------


def _all_signed_sums(diffs: np.ndarray) -> np.ndarray:
    """sum_i s_i d_i for all 2^n sign vectors s, shape (2^n,): outer sum of two halves."""

    def half(d: np.ndarray) -> np.ndarray:
        sums = np.zeros(1)
        for x in d:
            sums = np.concatenate([sums + x, sums - x])
        return sums

    k = len(diffs) // 2
    return (half(diffs[:k])[:, None] + half(diffs[k:])[None, :]).ravel()


def _random_signed_sums(diffs: np.ndarray, n_resamples: int, seed: int):
    """Yield chunks of sum_i s_i d_i for random sign vectors, bounded memory, seeded."""
    rng = np.random.default_rng(seed)
    n = len(diffs)
    total = diffs.sum()
    chunk = max(1, FLIP_CHUNK_ENTRIES // n)
    done = 0
    while done < n_resamples:
        rows = min(chunk, n_resamples - done)
        bits = rng.integers(0, 2, size=(rows, n), dtype=np.int8)
        yield total - 2.0 * (bits @ diffs)  # a bit of 1 flips that sign
        done += rows


def _count_extreme(sums: np.ndarray, observed: float, alternative: str, tol: float) -> int:
    if alternative == "two-sided":
        return int(np.count_nonzero(np.abs(sums) >= abs(observed) - tol))
    if alternative == "greater":
        return int(np.count_nonzero(sums >= observed - tol))
    return int(np.count_nonzero(sums <= observed + tol))


def sign_flip_pvalue(
    diffs: np.ndarray,
    seed: int = 0,
    alternative: str = "two-sided",
    n_resamples: int = N_RESAMPLES,
) -> tuple[float, str]:
    """Sign-flip permutation p of mean(diffs) = 0 against ``alternative``.

    Exact (all 2^n flips) for n <= 20; else ``n_resamples`` seeded random flips with
    p = (count + 1) / (n_resamples + 1) (the observed sample counts once, as in
    ``scipy.stats.permutation_test``). Returns (p, description).
    """
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    diffs = np.asarray(diffs, dtype=float)
    n = len(diffs)
    if n == 0:
        return float("nan"), "degenerate (no pairs)"
    observed = float(diffs.sum())
    tol = 1e-12 * float(np.abs(diffs).sum())  # ties up to round-off in the summation order
    if n <= EXACT_FLIP_MAX_N:
        count = _count_extreme(_all_signed_sums(diffs), observed, alternative, tol)
        return count / 2.0**n, f"exact, all 2^{n} sign flips"
    count = sum(
        _count_extreme(s, observed, alternative, tol)
        for s in _random_signed_sums(diffs, n_resamples, seed)
    )
    return (count + 1) / (n_resamples + 1), f"{n_resamples} random sign flips (seed {seed})"


def sign_flip_floor(
    n: int, alternative: str = "two-sided", n_resamples: int = N_RESAMPLES
) -> float:
    """Smallest p the sign-flip test can return with n nonzero pairs: 2/2^n (two-sided) or
    1/2^n (one-sided) when exact; never below 1/(n_resamples + 1) by Monte Carlo."""
    exact = math.ldexp(2.0 if alternative == "two-sided" else 1.0, -n)  # no overflow
    return exact if n <= EXACT_FLIP_MAX_N else max(exact, 1.0 / (n_resamples + 1))


# --- power and the MDE of the rule ----------------------------------------------------


def paired_t_power(effect_size: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at standardised effect d_z (noncentral t)."""
    df = n - 1
    t_crit = stats.t.ppf(1 - alpha / 2, df)
    nc = effect_size * math.sqrt(n)
    # P(T > t) + P(T < -t); the lower tail as sf at -nc (symmetry), because scipy's
    # nct.cdf returns NaN far in the tail
    return float(stats.nct.sf(t_crit, df, nc) + stats.nct.sf(t_crit, df, -nc))


def minimum_detectable_effect(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest d_z the two-sided paired t-test at level alpha detects with this power.

    Multiply by the sd of the differences for metric units. Not the CI half-width.
    """
    if n < 2:
        return float("nan")
    high = 1.0
    while paired_t_power(high, n, alpha) < power:  # power rises with the effect size
        high *= 2
    return float(optimize.brentq(lambda d: paired_t_power(d, n, alpha) - power, 1e-9, high))


def rule_can_reject(n: int, alpha_rule: float = ALPHA) -> bool:
    """Can "two-sided sign-flip p < alpha_rule" reject at all with n pairs? Only when its
    floor 2/2^n lies below the level (n >= 2)."""
    return bool(n >= 2 and sign_flip_floor(n) < alpha_rule)


def rule_mde(
    n: int, sd_diff: float, alpha_rule: float = ALPHA, power: float = POWER
) -> dict[str, Any]:
    """MDE of the rule "two-sided sign-flip p < alpha_rule" with n pairs.

    The power is approximated by the two-sided paired t-test at ``alpha_rule`` (noncentral
    t) — close to the sign-flip test's for roughly normal differences — and is exactly
    zero when the sign-flip floor 2/2^n is not below ``alpha_rule``: then ``mde`` is inf
    and ``rule_can_reject`` False. With zero sd the MDE is undefined (NaN), not 0.
    """
    floor = sign_flip_floor(n)
    can_reject = rule_can_reject(n, alpha_rule)
    out: dict[str, Any] = {
        "mde_alpha": alpha_rule,
        "mde_power": power,
        "p_floor": floor,
        "rule_can_reject": can_reject,
        "mde_dz": float("nan"),
        "mde": float("nan"),
        "mde_note": "",
    }
    if not can_reject:
        out["mde"] = out["mde_dz"] = float("inf")
        out["mde_note"] = (
            f"zero power: with {n} pairs the smallest two-sided sign-flip p is {floor:.3g}, "
            f"not below the rule's alpha {alpha_rule:.3g}"
        )
        return out
    out["mde_dz"] = minimum_detectable_effect(n, alpha_rule, power)
    if np.isfinite(sd_diff) and sd_diff > 0:
        out["mde"] = out["mde_dz"] * float(sd_diff)
    else:
        out["mde_note"] = "sd of the differences is zero or undefined: MDE undefined"
    return out


def n_pairs_for_mde(
    sd_diff: float,
    margin: float,
    alpha: float = ALPHA,
    power: float = POWER,
    n_tests: int = 1,
    max_pairs: int = 100_000,
) -> int:
    """Smallest number of evaluation seeds n with MDE of the rule <= margin.

    The rule is the two-sided sign-flip test at alpha / n_tests (Holm's worst case over
    ``n_tests`` arms; 1 for the pre-registered primary), so n must also lift the floor
    2/2^n below that level. ``sd_diff``: sd of the paired differences (e.g. from the
    sweep seeds). Raises ValueError if more than ``max_pairs`` would be needed.
    """
    if not (np.isfinite(sd_diff) and sd_diff >= 0):
        raise ValueError(f"sd_diff must be a finite number >= 0, got {sd_diff!r}")
    if not (np.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a finite number > 0, got {margin!r}")
    check_unit("alpha", alpha)
    check_unit("power", power)
    if not (isinstance(n_tests, int) and n_tests >= 1):
        raise ValueError(f"n_tests must be an integer >= 1, got {n_tests!r}")
    alpha_rule = alpha / n_tests

    def enough(n: int) -> bool:
        mde = rule_mde(n, sd_diff, alpha_rule, power)
        return mde["rule_can_reject"] and (sd_diff == 0 or mde["mde"] <= margin)

    low, high = 1, 2  # enough(low) is False; find a high that is enough, then bisect
    while not enough(high):
        low, high = high, 2 * high
        if high > 2 * max_pairs:
            raise ValueError(f"more than max_pairs={max_pairs} pairs needed for margin {margin}")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    if high > max_pairs:
        raise ValueError(f"more than max_pairs={max_pairs} pairs needed for margin {margin}")
    return high


def seeds_for_margin(
    sd_diff: float, margin: float | None, alpha_rule: float, power: float = POWER
) -> int | None:
    """Power by design, read back: the evaluation seeds this comparison's rule would need
    for an MDE within ``margin``, at the sd of differences it measured
    (:func:`n_pairs_for_mde` at ``alpha_rule``). None without a margin or a finite sd, or
    beyond 10,000 seeds."""
    if margin is None or not (np.isfinite(sd_diff) and sd_diff >= 0):
        return None
    try:
        return n_pairs_for_mde(sd_diff, margin, alpha=alpha_rule, power=power, max_pairs=10_000)
    except ValueError:
        return None


# --- multiplicity ---------------------------------------------------------------------


def holm(pvalues: Sequence[float | None]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), monotone and capped at 1.

    NaN (or None: a comparison that could not be run) stays NaN and is not counted in m;
    any other value outside [0, 1] (negative, > 1, infinite) raises ValueError naming it.
    """
    p = np.array([np.nan if v is None else v for v in pvalues], dtype=float)
    for i, v in enumerate(p):
        if not np.isnan(v) and not 0.0 <= v <= 1.0:
            raise ValueError(f"holm: p-value #{i} is {v!r}, outside [0, 1]")
    adjusted = np.full_like(p, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, (m - rank) * p[i])  # monotone step-down
        adjusted[i] = min(1.0, running)
    return adjusted.tolist()


# --- equivalence ----------------------------------------------------------------------


def tost(diffs: np.ndarray, margin: float | None, sd_floor: float = 0.0) -> dict[str, Any]:
    """Two one-sided t-tests (Schuirmann 1987) of the mean diff at the margin +-margin.

    ``scipy.stats.ttest_1samp(diffs, -margin, alternative="greater")`` and
    ``(diffs, +margin, alternative="less")``; ``tost_p`` is the larger p. NaN without a
    margin or with fewer than 2 pairs. Zero-variance diffs (sd <= ``sd_floor``: every pair
    differs by the same amount - a positive control that reproduces exact on every seed)
    take the t-tests' limit as the spread goes to 0: p = 0 when that amount lies strictly
    inside the margin, 1 when it does not (scipy returns NaN there).
    """
    out = {
        "margin": margin,
        "tost_p": float("nan"),
        "tost_p_lower": float("nan"),
        "tost_p_upper": float("nan"),
        "tost_method": "paired TOST: two one-sided scipy.stats.ttest_1samp at +-margin",
    }
    if margin is None or len(diffs) < 2:
        return out
    if not np.std(diffs, ddof=1) > sd_floor:
        inside = abs(float(np.mean(diffs))) < margin
        bound = 0.0 if inside else 1.0
        out.update(
            tost_p_lower=bound, tost_p_upper=bound, tost_p=bound,
            tost_method=out["tost_method"] + "; zero-variance differences: the t-tests' "
            "limit (p = 0 inside the margin, 1 outside)",
        )  # fmt: skip
        return out
    lower = stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(diffs, margin, alternative="less").pvalue
    out.update(
        tost_p_lower=float(lower), tost_p_upper=float(upper), tost_p=float(max(lower, upper))
    )
    return out
