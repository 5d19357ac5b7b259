"""Every fast path of RPKA against the one-screen reference (rpka/attention/reference.py).

(a) full rank: each path equals exact softmax and the reference, float64, to 1e-10; each
    pivot selector (the plain loop in torch and compiled, the accelerated selection) takes
    every point, and the plain loop's factorisation is the reference's;
(b) low rank on the same landmarks (or the same random draws): each readout equals the
    reference's to 1e-9 relative, on inputs where no guard fires;
(c) the pivot law: the first two pivots of the plain loop, the accelerated selection and
    the reference follow ``P(s) = r_s / sum r`` (chi-square, 4000 draws).
"""

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from softmax_reference import softmax_attention

from rpka.attention import build, pivot_kernel, reference
from rpka.attention import frame as fast
from rpka.attention.accelerated import accelerated_pivots
from rpka.attention.nystrom import gather_points, nystrom_softmax
from rpka.attention.nystrom_chunked import nystrom_softmax_chunked
from rpka.attention.pivot_state import PointSet
from rpka.attention.reference import (
    draw_uniforms,
    exact_reference,
    gaussian,
    nystrom_reference,
    pivoted_points,
    rpcholesky_reference,
    rpka_reference,
)
from rpka.attention.rpcholesky import rpcholesky
from rpka.attention.rpka import KEYS_RATIO, RPKAttention, balanced_frame
from rpka.attention.streamed import nystrom_softmax_streamed

EXACT_TOL = 1e-10  # full rank: max error over the value range
SAME_TOL = 1e-9  # the same landmarks: max error over the largest output
# (q scale, k scale, key offset): moderate logits, and queries 3x longer than keys
SCALES = {"moderate": (1.0, 1.0, 0.3), "mismatched": (3.0, 0.7, 0.5)}


# the plain loop's two implementations (rpcholesky's pivot_backend): the same pivots
BACKENDS = [
    "torch",
    pytest.param(
        "numba", marks=pytest.mark.skipif(not pivot_kernel.AVAILABLE, reason="needs numba")
    ),
]


def qkv(n=12, m=None, d=8, d_v=4, heads=2, seed=0, scale="moderate", grad=False):
    """float64 q (1, H, n, d), k (1, H, m, d), v (1, H, m, d_v)."""
    q_scale, k_scale, offset = SCALES[scale]
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    q = torch.randn(1, heads, n, d, generator=g, dtype=torch.float64) * q_scale
    k = torch.randn(1, heads, m, d, generator=g, dtype=torch.float64) * k_scale + offset
    v = torch.randn(1, heads, m, d_v, generator=g, dtype=torch.float64)
    return tuple(x.requires_grad_(grad) for x in (q, k, v))


def error(out, ref, over):
    return float((out.detach() - ref).abs().max() / over.detach().abs().max())


def no_guard_fired(attn):
    counts = attn.guard_counts
    assert counts["denominator"] == 0 and counts["clamped"] == 0, counts


def per_head(fn, *tensors):
    """fn on each (batch, head) of (1, H, ...) tensors, stacked back."""
    return torch.stack([fn(*(x[0, h] for x in tensors)) for h in range(tensors[0].shape[1])])[None]


# ----------------------------------------------------------------------------- (a) full rank

FULL_RANK_PATHS = {
    # name: (options, inputs need grad, enter no_grad)
    "chunked-joint": ({}, False, True),
    "chunked-keys": ({"pivot_set": "keys"}, False, True),
    "plain-joint": ({"pivot_method": "plain"}, False, True),
    "autograd": ({"grad_path": "autograd"}, True, False),
    "streamed-joint": ({}, True, False),
    "streamed-keys": ({"pivot_set": "keys"}, True, False),
}


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("path", FULL_RANK_PATHS)
def test_full_rank_paths_equal_exact_and_reference(path, scale):
    options, grad, no_grad = FULL_RANK_PATHS[path]
    q, k, v = qkv(scale=scale, grad=grad)
    attn = RPKAttention(rank=2 * q.shape[-2], **options)
    with torch.no_grad() if no_grad else torch.enable_grad():
        out = attn(q, k, v)
    assert out.requires_grad == grad
    no_guard_fired(attn)
    exact = softmax_attention(q, k, v).detach()
    ref = rpka_reference(
        q.detach(), k.detach(), v.detach(), 99, None, options.get("pivot_set", "joint")
    )
    assert error(out.detach(), exact, v) <= EXACT_TOL
    assert error(ref, exact, v) <= EXACT_TOL


@pytest.mark.parametrize("scale", SCALES)
def test_nystrom_uniform_at_full_rank_is_exact(scale):
    q, k, v = qkv(scale=scale)
    with torch.no_grad():
        out = build("nystrom-uniform", rank=2 * q.shape[-2])(q, k, v)
    assert error(out, softmax_attention(q, k, v), v) <= EXACT_TOL


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_causal_at_full_rank_is_exact(pivot_set):
    q, k, v = qkv(n=20)
    attn = RPKAttention(rank=40, pivot_set=pivot_set, causal=True, causal_block=4)
    out = attn(q, k, v)
    exact = softmax_attention(q, k, v, causal=True)
    ref = rpka_reference(q, k, v, 40, None, pivot_set, causal=True, causal_block=4)
    assert error(out, exact, v) <= EXACT_TOL
    assert error(ref, exact, v) <= EXACT_TOL


SELECTORS = {
    # name: RPKAttention options choosing the selector that RPKAttention.draw_pivots runs
    "plain-torch": {"pivot_method": "plain", "pivot_backend": "torch"},
    "plain-compiled": {"pivot_method": "plain", "pivot_backend": "numba"},
    "accelerated": {"pivot_method": "accelerated"},
}


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
@pytest.mark.parametrize("selector", SELECTORS)
def test_selectors_at_full_rank_take_every_point(selector, pivot_set, scale):
    """At rank N each selector pivots every point, and the readout on those landmarks -
    through the solve, not attend()'s Nystrom-identity shortcut - is the reference's exact
    attention (eq. N with every point a landmark)."""
    if selector == "plain-compiled" and not pivot_kernel.AVAILABLE:
        pytest.skip("needs numba")
    q, k, v = qkv(scale=scale)
    _, q_s, k_s, points = package_points(q, k, pivot_set)
    n_points = points.shape[-2]
    generator = torch.Generator().manual_seed(4)
    attn = RPKAttention(n_points, pivot_set=pivot_set, generator=generator, **SELECTORS[selector])
    pivots = attn.draw_pivots(points)
    assert torch.equal(pivots.sort(-1).values, torch.arange(n_points).expand_as(pivots))
    out, guards = nystrom_softmax(q_s, k_s, v, gather_points(points, pivots), pivots >= 0)
    assert int(guards["denominator"]) == 0 and int(guards["clamped"]) == 0
    assert error(out, per_head(exact_reference, q_s, k_s, v), v) <= EXACT_TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_plain_loop_at_full_rank_is_the_reference_factorisation(pivot_set, backend):
    """The same uniforms: the reference's pivots step by step to the last, and both
    factors reproduce ``G = g(Z, Z)`` of eq. (G)."""
    q, k, _ = qkv(scale="mismatched")
    _, _, _, points = package_points(q, k, pivot_set)
    n_points = points.shape[-2]
    res = rpcholesky(
        points,
        n_points,
        "rpc",
        torch.Generator().manual_seed(5),
        weighting="gauss",
        pivot_backend=backend,
    )
    u = draw_uniforms(torch.Generator().manual_seed(5), n_points, (1, 2), n_points)
    for h in range(2):
        z = points[0, h]
        pivots, factor = rpcholesky_reference(z, n_points, u[:, 0, h])
        assert torch.equal(res.pivots[0, h], pivots)
        g = gaussian(z, z)
        for f in (factor, res.factor[0, h]):
            assert float((f @ f.T - g).abs().max()) <= EXACT_TOL


@pytest.mark.parametrize("grad_path", ["streamed", "autograd"])
def test_full_rank_gradients_equal_softmax_gradients(grad_path):
    q, k, v = qkv(grad=True, scale="mismatched")
    weight = torch.randn(
        1, 2, 12, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64
    )
    attn = RPKAttention(rank=24, grad_path=grad_path)
    grads = torch.autograd.grad((attn(q, k, v) * weight).sum(), (q, k, v))
    exact = torch.autograd.grad((softmax_attention(q, k, v) * weight).sum(), (q, k, v))
    for got, want in zip(grads, exact, strict=True):
        assert error(got, want, want) <= 1e-9


# -------------------------------------------------------------- (b) low rank, same landmarks


def package_points(q, k, pivot_set):
    """The package's own pivoted points (RPKAttention.attend): q~, k~ and the pivoted set."""
    frame = balanced_frame(q, k, True, 1.0 if pivot_set == "joint" else KEYS_RATIO)
    q_s = q * frame.q_scale
    k_s = k * frame.k_scale - frame.key_shift
    return frame, q_s, k_s, torch.cat([q_s, k_s], -2) if pivot_set == "joint" else k_s


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_reference_points_are_the_packages(pivot_set):
    q, k, v = qkv(scale="mismatched")
    _, q_s, k_s, points = package_points(q, k, pivot_set)
    mine = [pivoted_points(q[0, h], k[0, h], pivot_set) for h in range(2)]
    for got, want in zip(zip(*mine, strict=True), (q_s, k_s, points), strict=True):
        assert torch.allclose(torch.stack(got)[None], want, rtol=0, atol=1e-14)
    # the balance and the centring leave exact attention unchanged (eq. P)
    exact = per_head(exact_reference, q_s, k_s, v)
    assert error(exact, softmax_attention(q, k, v), v) <= EXACT_TOL


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("estimate", [nystrom_softmax, nystrom_softmax_streamed])
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_readout_on_drawn_landmarks_equals_reference(pivot_set, estimate, scale):
    q, k, v = qkv(n=24, scale=scale)
    attn = RPKAttention(rank=10, pivot_set=pivot_set, generator=torch.Generator().manual_seed(1))
    _, q_s, k_s, points = package_points(q, k, pivot_set)
    pivots = attn.draw_pivots(points)  # the accelerated selection, as a call draws
    assert bool((pivots >= 0).all())
    landmarks = gather_points(points, pivots)
    out, guards = estimate(q_s, k_s, v, landmarks, pivots >= 0)
    assert int(guards["denominator"]) == 0 and int(guards["clamped"]) == 0
    ref = per_head(nystrom_reference, q_s, k_s, v, landmarks)
    assert error(out, ref, ref) <= SAME_TOL


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_chunked_readout_on_the_selection_equals_reference(pivot_set, scale):
    q, k, v = qkv(n=24, scale=scale)
    attn = RPKAttention(rank=10, pivot_set=pivot_set, generator=torch.Generator().manual_seed(2))
    frame, q_s, k_s, _ = package_points(q, k, pivot_set)
    state = attn.select(attn.point_set(q, k, frame))
    out, guards = nystrom_softmax_chunked(
        q, k, v, state, frame.q_scale, frame.k_scale, frame.key_shift
    )
    assert int(guards["denominator"]) == 0 and int(guards["clamped"]) == 0
    landmarks = state.landmarks.reshape(1, 2, 10, -1)
    ref = per_head(nystrom_reference, q_s, k_s, v, landmarks)
    assert error(out, ref, ref) <= SAME_TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_plain_loop_draws_the_reference_pivots_and_output(pivot_set, scale, backend):
    """The same generator state: the same pivots, step by step, and the same output, from
    the torch loop and the compiled one."""
    q, k, v = qkv(n=24, scale=scale)
    _, _, _, points = package_points(q, k, pivot_set)
    for seed in range(4):
        generator = torch.Generator().manual_seed(seed)
        plain = rpcholesky(points, 10, "rpc", generator, weighting="gauss", pivot_backend=backend)
        u = draw_uniforms(torch.Generator().manual_seed(seed), 10, (1, 2), points.shape[-2])
        mine = [rpcholesky_reference(points[0, h], 10, u[:, 0, h])[0] for h in range(2)]
        assert torch.equal(plain.pivots[0], torch.stack(mine))
        attn = RPKAttention(
            rank=10,
            pivot_set=pivot_set,
            pivot_method="plain",
            generator=torch.Generator().manual_seed(seed),
            pivot_backend=backend,
        )
        out = attn(q, k, v)
        no_guard_fired(attn)
        ref = rpka_reference(q, k, v, 10, torch.Generator().manual_seed(seed), pivot_set)
        assert error(out, ref, ref) <= SAME_TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rank", "block"), [(6, 4), (9, 5), (16, 3)])
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_causal_low_rank_equals_reference(pivot_set, rank, block, backend):
    """The blockwise forward and the decoder (prefill + steps), same draws as the reference,
    with the plain loop in torch and compiled."""
    q, k, v = qkv(n=40)
    ref = rpka_reference(
        q, k, v, rank, torch.Generator().manual_seed(3), pivot_set, causal=True, causal_block=block
    )
    options = {"rank": rank, "pivot_set": pivot_set, "causal": True, "causal_block": block}
    options["pivot_backend"] = backend
    attn = RPKAttention(generator=torch.Generator().manual_seed(3), **options)
    out = attn(q, k, v)
    no_guard_fired(attn)
    assert error(out, ref, ref) <= SAME_TOL
    decoder = RPKAttention(generator=torch.Generator().manual_seed(3), **options)
    first, state = decoder.prefill(q[..., :7, :], k[..., :7, :], v[..., :7, :])
    steps = [first]
    for t in range(7, 40):
        row, state = decoder.step(
            q[..., t : t + 1, :], k[..., t : t + 1, :], v[..., t : t + 1, :], state
        )
        steps.append(row)
    no_guard_fired(decoder)
    assert error(torch.cat(steps, -2), ref, ref) <= SAME_TOL


# ------------------------------------------------------------------------- (c) pivot law

DRAWS = 4000


def pair_law(points):
    """P(first = i, second = j) of eq. (R) on ``points`` (N, d), from the reference's g.

    The first pivot: r = 1, uniform; after pivot i the residual is ``1 - g(z_j, z_i)^2``.
    """
    g = gaussian(points, points).numpy()
    n = len(g)
    law = np.zeros((n, n))
    for i in range(n):
        residual = 1 - g[:, i] ** 2
        residual[i] = 0
        law[i] = residual / residual.sum() / n
    return law


def law_points():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(6, 2, generator=g, dtype=torch.float64) * 0.8
    return z, pair_law(z)


def pair_counts(first, second, n):
    return np.bincount((first * n + second).numpy(), minlength=n * n)


def assert_follows(counts, law):
    cells = law.ravel() > 0
    assert counts[~cells].sum() == 0  # never a repeated pivot
    p = stats.chisquare(counts[cells], law.ravel()[cells] * DRAWS).pvalue
    assert p > 1e-3, p
    # the first pivot alone (uniform under the gauss weighting), from its own chi-square
    first = counts.reshape(law.shape).sum(1)
    assert stats.chisquare(first, law.sum(1) * DRAWS).pvalue > 1e-3


def test_plain_loop_follows_the_residual_law():
    z, law = law_points()
    res = rpcholesky(
        z.expand(DRAWS, *z.shape), 2, "rpc", torch.Generator().manual_seed(5), weighting="gauss"
    )
    assert_follows(pair_counts(res.pivots[:, 0], res.pivots[:, 1], len(z)), law)


@pytest.mark.parametrize(("block_size", "refresh"), [(None, "auto"), (2, "round"), (3, "auto")])
def test_accelerated_selection_follows_the_residual_law(block_size, refresh):
    z, law = law_points()
    points = PointSet([z.expand(DRAWS, *z.shape)], dtype=torch.float64)
    state = accelerated_pivots(
        points, 2, "rpc", torch.Generator().manual_seed(6), block_size=block_size, refresh=refresh
    )
    assert_follows(pair_counts(state.pivots[:, 0], state.pivots[:, 1], len(z)), law)


def test_reference_follows_the_residual_law():
    z, law = law_points()
    u = draw_uniforms(torch.Generator().manual_seed(7), 2, (DRAWS,), len(z))
    pivots = torch.stack([rpcholesky_reference(z, 2, u[:, b])[0] for b in range(DRAWS)])
    assert_follows(pair_counts(pivots[:, 0], pivots[:, 1], len(z)), law)


def test_the_reference_is_standalone():
    """reference.py imports nothing of the package (issue 44, item 4): its one constant is
    typed again there, equal to the fast code's."""
    tree = ast.parse(Path(reference.__file__).read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] == "rpka"], imported
    assert reference.KEYS_RATIO == fast.KEYS_RATIO
