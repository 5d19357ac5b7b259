"""The compiled pivot loop (``pivot_backend="numba"``, rpka.attention.pivot_kernel) against
the torch loop of ``rpcholesky`` (issue 28, lever 1): the same pivots from the same Gumbel
noise, the generator left in the same state, the factor and traces equal to round-off, and
RPKA's training output and gradients unchanged."""

import pytest
import torch

from rpka.attention import causal_blocks, pivot_kernel
from rpka.attention.rpcholesky import PIVOT_RULES, resolve_backend, rpcholesky
from rpka.attention.rpka import RPKAttention

pytestmark = pytest.mark.skipif(not pivot_kernel.AVAILABLE, reason="numba is not installed")

# (batch shape, points, dim, rank): batched and unbatched, rank below, at and above N
SHAPES = [((), 12, 3, 5), ((3,), 40, 8, 10), ((2, 3), 30, 4, 30), ((5,), 25, 16, 40)]
# the sums run in another order (and exp/log are libm's, not SLEEF's): a few ulps of the
# Gaussian matrix's scale (entries <= 1) for the approximation F F^T and the residual,
# relative for the traces. (A single column of F is not compared: a late column divides by
# the square root of a residual near the pivot floor, which magnifies round-off.)
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def both(points: torch.Tensor, rank: int, rule: str, **options):
    """rpcholesky on both backends from the same seed: (torch result, numba result, equal
    generator states?)."""
    results, states = [], []
    for backend in ("torch", "numba"):
        generator = torch.Generator().manual_seed(11)
        results.append(rpcholesky(points, rank, rule, generator, pivot_backend=backend, **options))
        states.append(generator.get_state())
    return results[0], results[1], torch.equal(*states)


def assert_same_run(ref, new, dtype: torch.dtype) -> None:
    assert torch.equal(ref.pivots, new.pivots)
    assert ref.factor.shape == new.factor.shape and ref.factor.dtype == new.factor.dtype
    approx = [r.factor @ r.factor.transpose(-1, -2) for r in (ref, new)]
    assert torch.allclose(*approx, rtol=0, atol=TOL[dtype])
    scale = ref.trace[..., :1]
    assert torch.allclose(ref.trace / scale, new.trace / scale, rtol=0, atol=TOL[dtype])
    assert torch.allclose(ref.residual, new.residual, rtol=0, atol=TOL[dtype])
    assert torch.equal(ref.log_scale, new.log_scale) and torch.equal(ref.log_weight, new.log_weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rule", PIVOT_RULES)
@pytest.mark.parametrize("weighting", ["gauss", "exp", "tempered"])
def test_same_pivots_as_the_torch_loop(dtype, rule, weighting):
    gen = torch.Generator().manual_seed(0)
    for batch, n, d, rank in SHAPES:
        for spread in (0.3, 1.0, 2.0):  # flat to sharp residuals
            points = (torch.randn(*batch, n, d, generator=gen, dtype=dtype) * spread).to(dtype)
            ref, new, same_state = both(points, rank, rule, weighting=weighting)
            assert same_state, "the generator must end where the torch loop leaves it"
            assert_same_run(ref, new, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_study_shape_many_seeds(dtype):
    """The forecast call's pivot problem ((512 problems of 192 points, d = 16), ranks 16 and
    64, several draws: every one of the 512 x draws pivot sequences is identical."""
    gen = torch.Generator().manual_seed(1)
    points = torch.randn(512, 192, 16, generator=gen, dtype=dtype) * 0.5
    for rank in (16, 64):
        ref, new, same_state = both(points, rank, "rpc")
        assert same_state
        assert_same_run(ref, new, dtype)


def landmarks(points: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    """The pivoted points (zero rows for skipped steps): (..., N, d), (..., r) -> (..., r, d)."""
    index = pivots.clamp(min=0).unsqueeze(-1).expand(*pivots.shape, points.shape[-1])
    return torch.gather(points, -2, index) * (pivots >= 0).unsqueeze(-1)


def test_duplicates_tol_and_forced_pivots():
    """Near-duplicate points (skipped steps, pivot -1), a trace tolerance and forced first
    pivots take the same branches in both loops."""
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(4, 10, 3, generator=gen)
    points = torch.cat([base, base, base[:, :5]], dim=-2)  # exact duplicates
    for rule in PIVOT_RULES:
        ref, new, same_state = both(points, 25, rule)
        assert same_state and (ref.pivots == -1).any()
        if rule == "greedy":
            # an exact tie (two copies of one point, equal residuals in exact arithmetic):
            # the torch loop's matrix-vector product rounds the copies' rows differently
            # and picks either copy; the compiled loop rounds them alike and picks the first.
            # The landmarks - the points themselves - are the same.
            assert torch.equal(landmarks(points, ref.pivots), landmarks(points, new.pivots))
        else:
            assert_same_run(ref, new, torch.float32)
        ref, new, same_state = both(points, 20, rule, tol=0.3)
        assert same_state
        assert_same_run(ref, new, torch.float32)
        forced = torch.tensor([3, 7, 3])  # broadcast over the batch; a repeat is skipped
        ref, new, same_state = both(points, 12, rule, first_pivots=forced)
        assert same_state and torch.equal(new.pivots[:, :2], forced[:2].expand(4, 2))
        assert_same_run(ref, new, torch.float32)


def test_global_generator_state_is_unchanged():
    points = torch.randn(3, 50, 8)
    results, states = [], []
    for backend in ("torch", "numba"):
        torch.manual_seed(5)
        results.append(rpcholesky(points, 20, "rpc", None, pivot_backend=backend))
        states.append(torch.get_rng_state())
    assert torch.equal(*states)
    assert torch.equal(results[0].pivots, results[1].pivots)


def test_backend_choice_and_bad_parameters():
    assert resolve_backend("auto", torch.device("cpu")) == "numba"
    assert resolve_backend("torch", torch.device("cpu")) == "torch"
    # CUDA tensors always take the torch loop: the compiled loop reads CPU memory only
    assert resolve_backend("auto", torch.device("cuda")) == "torch"
    assert resolve_backend("numba", torch.device("cuda")) == "torch"
    with pytest.raises(ValueError, match="pivot_backend"):
        rpcholesky(torch.randn(10, 3), 4, pivot_backend="c++")
    with pytest.raises(ValueError, match="pivot_backend"):
        RPKAttention(rank=4, pivot_backend="fast")
    with pytest.raises(ValueError, match="first_pivots"):
        rpcholesky(torch.randn(10, 3), 4, first_pivots=torch.tensor([10]), pivot_backend="numba")


@pytest.mark.parametrize("causal", [False, True])
def test_rpka_training_path_is_unchanged(causal):
    """RPKA with the plain loop (the study's r = 64 arm; every causal draw): output and
    gradients bitwise those of the torch loop, since the pivots are the same."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, 2, 48, 8, generator=gen) for _ in range(3))
    results = []
    for backend in ("torch", "numba"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        options = {"causal": True, "causal_block": 8} if causal else {"pivot_method": "plain"}
        attn = RPKAttention(
            rank=16,
            generator=torch.Generator().manual_seed(7),
            pivot_backend=backend,
            **options,
        )
        out = attn(*leaves)
        out.pow(2).sum().backward()
        results.append([out.detach(), *(x.grad for x in leaves)])
    for ref, new in zip(*results, strict=True):
        assert torch.equal(ref, new)


def composed_clamp(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    return torch.minimum(torch.maximum(x, lo), hi)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("constant_column", [False, True])
def test_causal_clamp_fast_path_matches_the_composed_ops(monkeypatch, dtype, constant_column):
    """Causal RPKA's hull clamp (guards.clamp_between, issue 28 lever 2) against the
    composed ops it replaces: output and q/k gradients bitwise, v's equal (the fast path
    leaves out only added zeros). A constant value column makes its bounds equal, so no
    entry is strictly inside them there: the slow path (the composed ops' formulas) runs."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(3, 2, 64, 8, generator=gen, dtype=dtype) for _ in range(3))
    if constant_column:
        v[..., 0] = 1.0
    results, fired = [], []
    for clamp in (causal_blocks.clamp_between, composed_clamp):
        monkeypatch.setattr(causal_blocks, "clamp_between", clamp)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        attn = RPKAttention(
            rank=8, causal=True, causal_block=16, generator=torch.Generator().manual_seed(1)
        )
        out = attn(*leaves)
        (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum().backward()
        results.append([out.detach(), *(x.grad for x in leaves)])
        fired.append(int(attn.guard_counts["clamped"]))
    assert fired[0] == fired[1]
    for ref, new in zip(results[1], results[0], strict=True):
        assert torch.equal(ref, new)
