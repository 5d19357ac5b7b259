"""Accelerated (block + rejection) RPCholesky against the plain rule and numpy references."""

import numpy as np
import pytest
import torch
from scipy import stats

import rpka.attention.accelerated as accelerated
from rpka.attention import build, pivot_kernel
from rpka.attention.accelerated import (
    accelerated_pivots,
    check_fast_options,
    rpcholesky_accelerated,
)
from rpka.attention.pivot_state import PivotState, PointSet
from rpka.attention.rpcholesky import gaussian_kernel, rpcholesky, weighting_power
from rpka.attention.sweep import _sweep_compiled, _sweep_torch


def cholesky(*args, method: str = "plain", **kwargs):
    """The plain loop or the accelerated selection, by name (the loop has no rounds to tune)."""
    if method == "plain":
        kwargs.pop("block_size", None)
        kwargs.pop("refresh", None)
    return (rpcholesky_accelerated if method == "accelerated" else rpcholesky)(*args, **kwargs)


def points(n: int, d: int = 3, seed: int = 0, spread: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * spread


def pivoted_matrix(z: torch.Tensor, weighting: str) -> np.ndarray:
    """A_tau = D^tau G D^tau in numpy, from the definition."""
    zn = z.numpy()
    sq = (zn**2).sum(1)
    gauss = np.exp(-((zn[:, None, :] - zn[None, :, :]) ** 2).sum(-1) / 2)
    dd = np.exp(weighting_power(weighting) * (sq - sq.max()) / 2)
    return dd[:, None] * gauss * dd[None, :]


def schur(r: np.ndarray, s: int) -> np.ndarray:
    return r - np.outer(r[:, s], r[s, :]) / r[s, s]


def pair_probabilities(a: np.ndarray) -> np.ndarray:
    """P(first = i, second = j) of the sequential rule, exactly (numpy)."""
    n = len(a)
    p = np.zeros((n, n))
    for i in range(n):
        r = schur(a, i)
        p[i] = a[i, i] / np.trace(a) * np.clip(np.diag(r), 0, None) / np.trace(r)
    return p


# (weighting, block_size, refresh): small blocks force many rounds and in-block rejections
CONFIGS = [
    ("exp", 2, "auto"),
    ("exp", 3, "round"),
    ("gauss", None, "auto"),
    ("tempered", 4, "auto"),
]


@pytest.mark.parametrize(("weighting", "block_size", "refresh"), CONFIGS)
def test_first_two_pivots_follow_the_sequential_law(weighting, block_size, refresh):
    """Chi-square goodness of fit against the exact pair law, and contingency vs plain."""
    z = points(6, seed=1, spread=0.8)
    draws = 20000
    exact = pair_probabilities(pivoted_matrix(z, weighting)).ravel()
    counts = {}
    for method in ("plain", "accelerated"):
        res = cholesky(
            z.expand(draws, *z.shape),
            2,
            "rpc",
            torch.Generator().manual_seed(3),
            weighting=weighting,
            method=method,
            block_size=block_size,
            refresh=refresh,
        )
        pairs = (res.pivots[:, 0] * len(z) + res.pivots[:, 1]).numpy()
        counts[method] = np.bincount(pairs, minlength=len(exact))
    cells = exact > 0
    for method, c in counts.items():
        assert c[~cells].sum() == 0, method  # never a repeated pivot
        p = stats.chisquare(c[cells], exact[cells] * draws).pvalue
        assert p > 1e-4, (method, p)
    table = np.stack([counts["plain"][cells], counts["accelerated"][cells]])
    table = table[:, table.sum(0) > 0]
    assert stats.chi2_contingency(table).pvalue > 1e-4


@pytest.mark.parametrize(("weighting", "block_size", "refresh"), CONFIGS[:3])
@pytest.mark.parametrize("steps", [0, 2, 4])
def test_expected_trace_decrease_unchanged(weighting, block_size, refresh, steps):
    """Monte Carlo next-step decrease within 4 SE of ||R||_F^2 / tr R (numpy)."""
    z = points(10, seed=2, spread=0.9)
    prefix = cholesky(z, 5, "rpc", torch.Generator().manual_seed(5), weighting=weighting).pivots
    r = pivoted_matrix(z, weighting)
    for s in prefix.tolist()[:steps]:
        r = schur(r, s)
    predicted = (r**2).sum() / np.trace(r)
    draws = 4000
    res = cholesky(
        z.expand(draws, *z.shape),
        steps + 1,
        "rpc",
        torch.Generator().manual_seed(11),
        weighting=weighting,
        first_pivots=prefix[:steps] if steps else None,
        method="accelerated",
        block_size=block_size,
        refresh=refresh,
    )
    assert torch.equal(res.pivots[:, :steps], prefix[:steps].expand(draws, steps))
    unit = np.trace(r) / res.trace[0, steps].item()  # undo the exp(-log_scale) scaling
    decrease = (res.trace[:, steps] - res.trace[:, steps + 1]).numpy() * unit
    se = decrease.std(ddof=1) / np.sqrt(draws)
    assert abs(decrease.mean() - predicted) <= 4 * se, (decrease.mean(), predicted, se)


@pytest.mark.parametrize("rule", ["rpc", "uniform"])
@pytest.mark.parametrize("refresh", ["auto", "round"])
def test_distinct_pivots_and_full_rank_factor(rule, refresh):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 2, 30, 4, generator=g, dtype=torch.float64)
    res = cholesky(z, 30, rule, g, method="accelerated", refresh=refresh, block_size=8)
    assert res.pivots.shape == (3, 2, 30) and res.factor.shape == (3, 2, 30, 30)
    for row in res.pivots.reshape(-1, 30):
        assert sorted(row.tolist()) == list(range(30))  # every point once: full rank
    gram = gaussian_kernel(z, z)
    assert torch.allclose(res.factor @ res.factor.transpose(-1, -2), gram, atol=1e-10)
    assert torch.all(res.trace[..., 1:] <= res.trace[..., :-1] + 1e-12)
    assert res.trace[..., -1].abs().max() < 1e-10


def test_partial_factor_matches_numpy_schur_complement():
    z = points(25, d=4, seed=4)
    res = cholesky(z, 9, "rpc", torch.Generator().manual_seed(1), method="accelerated")
    g = pivoted_matrix(z, "gauss")
    r = g.copy()
    for s in res.pivots.tolist():
        r = schur(r, s)
    approx = (res.factor @ res.factor.T).numpy()
    np.testing.assert_allclose(g - approx, r, atol=1e-12)
    np.testing.assert_allclose(res.residual.numpy(), np.diag(r), atol=1e-12)


def test_huge_norms_stay_finite():
    z = torch.randn(2, 50, 16) * 30
    for weighting in ("exp", "gauss", "tempered"):
        runs = [
            cholesky(z, 20, "rpc", torch.Generator().manual_seed(0), weighting=weighting, method=m)
            for m in ("accelerated", "plain")
        ]
        res = runs[0]
        assert torch.isfinite(res.factor).all() and torch.isfinite(res.trace).all()
        # with exp/tempered weights the trace underflows after the heaviest point (float32),
        # and both methods stop there; with gauss every step is taken
        used = (res.pivots >= 0).sum(-1)
        assert torch.equal(used, (runs[1].pivots >= 0).sum(-1))
        assert weighting != "gauss" or (used == 20).all()


def test_exhausted_residual_leaves_slots_empty():
    z = torch.zeros(2, 12, 3)  # all points equal: the Gaussian matrix has rank 1
    res = cholesky(z, 5, "rpc", torch.Generator().manual_seed(0), method="accelerated")
    assert ((res.pivots >= 0).sum(-1) == 1).all()
    assert torch.allclose(res.factor @ res.factor.transpose(-1, -2), torch.ones(2, 12, 12))


def test_tolerance_truncates_like_the_loop():
    z = points(30, d=2, seed=4)
    res = cholesky(z, 40, "rpc", torch.Generator().manual_seed(2), tol=0.5, method="accelerated")
    used = int((res.pivots >= 0).sum())
    assert 0 < used < 30
    assert res.trace[used].item() <= 0.5 * res.trace[0].item() < res.trace[used - 1].item()
    assert torch.all(res.trace[used:] == res.trace[used])


def test_same_seed_identical_and_seed_matters():
    z = torch.randn(4, 200, 8)
    runs = [
        cholesky(z, 16, "rpc", torch.Generator().manual_seed(s), method="accelerated")
        for s in (3, 3, 4)
    ]
    assert torch.equal(runs[0].pivots, runs[1].pivots)
    assert torch.equal(runs[0].factor, runs[1].factor)
    assert not torch.equal(runs[0].pivots, runs[2].pivots)


def test_sweep_is_sequential_cholesky_on_accepted():
    """The sweep's accept rule and columns against a direct numpy loop."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 3, generator=g, dtype=torch.float64)
    x[:, 4] = x[:, 1]  # a duplicate candidate must be rejected
    gram = gaussian_kernel(x, x)
    thr = torch.rand(2, 7, generator=g, dtype=torch.float64) * 0.9
    accept, cols = _sweep_torch(gram, thr)
    for b in range(2):
        h = gram[b].numpy().copy()
        for j in range(7):
            ok = h[j, j] > thr[b, j].item()
            assert bool(accept[b, j]) == ok
            if ok:
                c = h[:, j] / np.sqrt(h[j, j])
                np.testing.assert_allclose(cols[b, :, j].numpy(), c, atol=1e-12)
                h = h - np.outer(c, c)
            else:
                assert (cols[b, :, j] == 0).all()
        assert not accept[b, 4] or not accept[b, 1]


@pytest.mark.skipif(not pivot_kernel.AVAILABLE, reason="numba is not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("b", [1, 7, 80])
def test_compiled_sweep_is_the_torch_sweep_bit_for_bit(dtype, b):
    """The numba sweep (the CPU's default) accepts the same candidates and writes the same
    columns below the diagonal as the torch sweep, bit for bit (duplicates, NaN, rejections)."""
    g = torch.Generator().manual_seed(b)
    x = torch.randn(6, b, 64, generator=g, dtype=dtype) * 0.15
    if b > 3:
        x[:, 3] = x[:, 1]  # a duplicate: rejected by the floor, whatever its threshold
    gram = gaussian_kernel(x, x)
    thr = (torch.rand(6, b, generator=g, dtype=dtype) * 0.6).clamp(min=1e-6)
    thr[0] = float("nan")  # NaN thresholds reject every candidate of element 0
    accept, cols = _sweep_torch(gram, thr)
    accept_c, cols_c = _sweep_compiled(gram, thr)
    assert torch.equal(accept, accept_c)
    assert not accept[0].any() and accept[1:].any()
    assert torch.equal(cols.tril(), cols_c.tril())
    assert (cols_c.triu(1) == 0).all()


def _rounds(points: PointSet, rank: int, dtype: torch.dtype, compiled: bool, monkeypatch):
    """Four rounds of random candidates absorbed into one state, by one path."""
    monkeypatch.setattr(accelerated, "compiled_on_cpu", lambda *a: compiled)
    g = torch.Generator().manual_seed(rank)
    state = PivotState.empty(points.batch, rank, points.dim, torch.empty(0, dtype=dtype))
    rounds = []
    for _ in range(4):
        b = int(torch.randint(1, 40, (1,), generator=g))
        cand = torch.randint(0, points.n_points, (points.batch, b), generator=g)
        thr = (torch.rand(points.batch, b, generator=g, dtype=dtype) * 0.9).clamp(min=1e-6)
        thr[0, 0] = float("nan")  # rejects element 0's first candidate
        rounds.append(accelerated._absorb_block(points, state, cand, thr))
    return state, rounds


@pytest.mark.skipif(not pivot_kernel.AVAILABLE, reason="numba is not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rank", [5, 16, 40])
def test_compiled_round_leaves_the_torch_rounds_state_bit_for_bit(dtype, rank, monkeypatch):
    """The sweep and the state's update in one numba call (the CPU's default) accept, keep
    and write what the torch sweep and update do, bit for bit - the factor's signed zeros
    and its trash slot too - over rounds after the first (W != 0), rejections, duplicates,
    NaN thresholds and more acceptances than the rank holds."""
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(3, 50, 8, generator=g, dtype=dtype)
    x[:, 10:20] = x[:, :10]  # duplicates: rejected by the floor once their twin is in
    pool = PointSet([x[:, :25], x[:, 25:]], 0.7, [None, x[:, :5].mean(-2, keepdim=True)], dtype)
    ref, ref_rounds = _rounds(pool, rank, dtype, False, monkeypatch)
    out, out_rounds = _rounds(pool, rank, dtype, True, monkeypatch)
    for name in ("pivots_ext", "landmarks_ext", "chol_ext", "count"):
        a, b = getattr(ref, name), getattr(out, name)
        assert torch.equal(a, b), name
    assert torch.equal(ref.chol_ext.signbit(), out.chol_ext.signbit())
    for (accept, keep), (accept_c, keep_c) in zip(ref_rounds, out_rounds, strict=True):
        assert torch.equal(accept, accept_c) and torch.equal(keep, keep_c)
    # the cases happened: a NaN rejection, pivots drawn, acceptances cut at the rank
    assert not bool(ref_rounds[0][0][0, 0]) and bool((ref.count > 0).all())
    if rank == 5:
        assert any(bool((accept & ~keep).any()) for accept, keep in ref_rounds)


@pytest.mark.parametrize("seed", range(5))
def test_round_counts_read_on_the_host_are_the_tensor_ops_counts(seed):
    """A round's counts in numpy (the CPU's path) are those of the tensor ops (any device's)."""
    g = torch.Generator().manual_seed(seed)
    count = torch.randint(0, 9, (6,), generator=g)
    accept = torch.rand(6, 11, generator=g) < 0.6
    short, alive = torch.rand(6, generator=g) < 0.7, torch.rand(6, generator=g) < 0.8
    host = accelerated.round_counts(count, accept, short, alive, 8, host=True)
    ops = accelerated.round_counts(count, accept, short, alive, 8, host=False)
    assert host == ops and all(isinstance(x, int) for x in host)


def test_point_set_reads_the_joint_set_in_place():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 5, 3, generator=g), torch.randn(2, 7, 3, generator=g)
    shift = k.mean(-2, keepdim=True)
    ps = PointSet([q, k], 0.5, [None, shift])
    joint = torch.cat([q * 0.5, k * 0.5 - shift], dim=-2)
    idx = torch.randint(0, 12, (2, 9), generator=g)
    expected = torch.gather(joint, 1, idx.unsqueeze(-1).expand(2, 9, 3))
    assert torch.allclose(ps.take(idx), expected)
    assert torch.allclose(ps.sq_norms(), joint.pow(2).sum(-1))
    state = accelerated_pivots(ps, 4, generator=torch.Generator().manual_seed(1))
    assert state.pivots.shape == (2, 4) and (state.pivots >= 0).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "accelerated", "rule": "greedy"}, "greedy"),
        ({"method": "accelerated", "block_size": 0}, "block_size"),
        ({"method": "accelerated", "block_size": 10**6}, "block_size"),
        ({"method": "accelerated", "refresh": "never"}, "refresh"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cholesky(torch.randn(10, 3), 4, **kwargs)


def test_unknown_pivot_method():
    with pytest.raises(ValueError, match="method"):
        check_fast_options("fast", "rpc", None, "auto")


def test_attention_fast_path_matches_differentiable_path():
    """No-grad chunked inference and the differentiable rebuild agree on the same pivots."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    outs = []
    for grad in (False, True):
        attn = build("rpka", rank=12, generator=torch.Generator().manual_seed(7))
        xs = [x.clone().requires_grad_(grad) for x in (q, k, v)]
        outs.append(attn(*xs).detach())
    assert torch.allclose(outs[0], outs[1], atol=1e-8, rtol=1e-8)


def test_attention_plain_and_accelerated_options():
    q, k, v = (torch.randn(1, 2, 16, 4, dtype=torch.float64) for _ in range(3))
    exact = build("exact")(q, k, v)
    for method in ("plain", "accelerated"):
        out = build("rpka", rank=32, pivot_method=method)(q, k, v)
        assert torch.allclose(out, exact, atol=1e-9)
    assert build("rpka", pivot_rule="greedy").method == "plain"
    with pytest.raises(ValueError, match="pivot_method"):
        build("rpka", pivot_method="fastest")
    with pytest.raises(ValueError, match="greedy"):
        build("rpka", pivot_rule="greedy", pivot_method="accelerated")
