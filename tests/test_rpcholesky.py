"""RPCholesky against independent references (numpy Schur complements, scipy chi-square)."""

import inspect

import numpy as np
import pytest
import torch
from scipy import stats

from rpka.attention.accelerated import rpcholesky_accelerated
from rpka.attention.rpcholesky import gaussian_kernel, rpcholesky, weighting_power
from rpka.attention.rpka import RPKAttention
from rpka.config.bench import MechanismConfig


def qk_points(n: int = 12, d: int = 4, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """A joint Q/K point set (2n, d) scaled by d^{-1/4}, keys mean-centred, as RPKA does."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(n, d, generator=g, dtype=torch.float64) * scale + 0.5
    k = k - k.mean(0)
    return torch.cat([q, k]) * d**-0.25


def pivoted_matrix(z: torch.Tensor, weighting: str) -> np.ndarray:
    """A_tau = D^tau G D^tau built directly in numpy from the definition exp(tau..)."""
    zn = z.numpy()
    tau = weighting_power(weighting)
    sq = (zn**2).sum(1)
    gauss = np.exp(-((zn[:, None, :] - zn[None, :, :]) ** 2).sum(-1) / 2)
    d = np.exp(tau * (sq - sq.max()) / 2)
    return d[:, None] * gauss * d[None, :]


def residual_after(z: torch.Tensor, steps: int, weighting: str, seed: int) -> tuple:
    """Run `steps` RPCholesky steps; return (numpy residual of A_tau, the package's result)."""
    res = rpcholesky(z, steps, "rpc", torch.Generator().manual_seed(seed), weighting=weighting)
    a = pivoted_matrix(z, weighting)
    # residual via an independent Schur-complement computation on the same pivots
    r = a.copy()
    for s in res.pivots.tolist():
        r = r - np.outer(r[:, s], r[s, :]) / r[s, s]
    return r, res


@pytest.mark.parametrize("weighting", ["exp", "gauss", "tempered"])
@pytest.mark.parametrize("steps", [0, 1, 3, 7])
def test_exact_expected_trace_decrease(weighting, steps):
    z = qk_points(seed=steps)
    if steps == 0:
        r = pivoted_matrix(z, weighting)
    else:
        r, res = residual_after(z, steps, weighting, seed=1)
        # the package's trace history (scaled by the largest weight, as pivoted_matrix is)
        # agrees with the independent Schur-complement residual
        assert res.trace[-1].item() == pytest.approx(np.trace(r), rel=1e-9, abs=1e-12)
    tr = np.trace(r)
    predicted = (r**2).sum() / tr  # ||R||_F^2 / tr R
    expected = 0.0
    for s in range(len(r)):
        if r[s, s] <= 0:
            continue
        after = r - np.outer(r[:, s], r[s, :]) / r[s, s]
        expected += (r[s, s] / tr) * (tr - np.trace(after))
    assert expected == pytest.approx(predicted, rel=1e-10)


@pytest.mark.parametrize("weighting", ["exp", "gauss"])
@pytest.mark.parametrize("steps", [0, 2, 5])
def test_monte_carlo_trace_decrease_within_4_se(weighting, steps):
    """Independent one-step draws by the package's own rule from one fixed residual."""
    z = qk_points(n=10, seed=3)
    r, base = (
        residual_after(z, steps, weighting, seed=5)
        if steps
        else (pivoted_matrix(z, weighting), None)
    )
    predicted = (r**2).sum() / np.trace(r)
    draws = 4000
    prefix = base.pivots if steps else None
    res = rpcholesky(
        z.expand(draws, *z.shape),
        steps + 1,
        "rpc",
        torch.Generator().manual_seed(11),
        weighting=weighting,
        first_pivots=prefix,
    )
    # traces are scaled by exp(-log_scale); undo that to compare with the numpy residual
    unit = np.trace(r) / res.trace[0, steps].item()
    decrease = (res.trace[:, steps] - res.trace[:, steps + 1]).numpy() * unit
    se = decrease.std(ddof=1) / np.sqrt(draws)
    assert abs(decrease.mean() - predicted) <= 4 * se, (decrease.mean(), predicted, se)


def test_first_pivot_frequencies_match_residual_diagonal():
    """Chi-square: the first pivot is drawn with probability A_ii / tr A (rule rpc, exp)."""
    z = qk_points(n=6, seed=7)
    a = pivoted_matrix(z, "exp")
    probs = np.diag(a) / np.trace(a)
    draws = 20000
    g = torch.Generator().manual_seed(0)
    res = rpcholesky(z.expand(draws, *z.shape), 1, "rpc", g, weighting="exp")
    counts = np.bincount(res.pivots[:, 0].numpy(), minlength=len(probs))
    p = stats.chisquare(counts, probs * draws).pvalue
    assert p > 1e-4, p


def test_greedy_picks_argmax_and_traces_decrease():
    z = qk_points(n=16, seed=2)
    for weighting in ("exp", "gauss"):
        res = rpcholesky(z, 12, "greedy", weighting=weighting)
        a = pivoted_matrix(z, weighting)
        r = a.copy()
        for s in res.pivots.tolist():
            assert s == int(np.argmax(np.diag(r)))
            r = r - np.outer(r[:, s], r[s, :]) / r[s, s]
        assert np.all(np.diff(res.trace.numpy()) <= 1e-12)


@pytest.mark.parametrize("rule", ["rpc", "greedy", "uniform"])
def test_pivots_distinct_and_trace_non_increasing_batched(rule):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 2, 40, 8, generator=g)
    res = rpcholesky(z, 24, rule, g)
    assert res.pivots.shape == (3, 2, 24) and res.factor.shape == (3, 2, 40, 24)
    flat = res.pivots.reshape(-1, 24)
    for row in flat:
        picked = row[row >= 0]
        assert len(set(picked.tolist())) == len(picked)
    assert torch.all(res.trace[..., 1:] <= res.trace[..., :-1] + 1e-6)
    # the factor reproduces the Gaussian kernel on the pivots' rows and columns
    gram = gaussian_kernel(z, z)
    err = (gram - res.factor @ res.factor.transpose(-1, -2)).diagonal(dim1=-2, dim2=-1)
    assert torch.allclose(err, res.residual, atol=1e-5)


def test_rank_above_points_is_capped_and_exact():
    z = qk_points(n=5, seed=1)  # 10 points
    res = rpcholesky(z, 50, "rpc", torch.Generator().manual_seed(0))
    assert res.factor.shape == (10, 10)
    gram = gaussian_kernel(z, z)
    assert torch.allclose(res.factor @ res.factor.T, gram, atol=1e-12)
    assert res.trace[-1].item() <= 1e-12 * res.trace[0].item()


def test_tolerance_stops_early():
    z = qk_points(n=30, seed=4)
    res = rpcholesky(z, 40, "greedy", tol=0.5, weighting="gauss")
    used = (res.pivots >= 0).sum().item()
    assert 0 < used < 40
    # stopped as soon as the trace fell to tol * initial trace, and stayed there
    stop = res.trace[used].item()
    assert stop <= 0.5 * res.trace[0].item() < res.trace[used - 1].item()
    assert torch.all(res.trace[used:] == stop)


def test_same_generator_seed_is_bit_identical():
    z = torch.randn(4, 64, 8)
    a = rpcholesky(z, 16, "rpc", torch.Generator().manual_seed(3))
    b = rpcholesky(z, 16, "rpc", torch.Generator().manual_seed(3))
    assert torch.equal(a.pivots, b.pivots) and torch.equal(a.factor, b.factor)


def test_huge_norms_do_not_overflow():
    z = torch.randn(2, 50, 16) * 30
    res = rpcholesky(z, 20, "rpc", torch.Generator().manual_seed(0))
    assert torch.isfinite(res.factor).all() and torch.isfinite(res.trace).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": 0}, "rank"),
        ({"rank": -3}, "rank"),
        ({"rank": 2.5}, "rank"),
        ({"rule": "random"}, "rule"),
        ({"weighting": "cosine"}, "weighting"),
        ({"weighting": "tempered", "tempering": 1.5}, "tempering"),
        ({"tol": 1.0}, "tol"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"rank": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        rpcholesky(torch.randn(10, 3), **args)


def test_bad_points():
    with pytest.raises(ValueError, match="points"):
        rpcholesky(torch.randn(10), 2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_points_are_refused(bad):
    points = torch.randn(2, 6, 3)
    points[1, 2, 0] = bad
    with pytest.raises(ValueError, match="points contains non-finite values"):
        rpcholesky(points, 3)


def test_one_weighting_default():
    """The selectors, RPKAttention and the mechanism study default to the same weighting
    (``gauss``, docs/design.md section 2): a caller that leaves it out gets RPKA's."""
    defaults = {
        fn.__qualname__: inspect.signature(fn).parameters["weighting"].default
        for fn in (rpcholesky, rpcholesky_accelerated, RPKAttention.__init__)
    }
    defaults["MechanismConfig"] = MechanismConfig().weighting
    assert set(defaults.values()) == {"gauss"}, defaults
