"""The peer attention methods against independent references (numpy, scipy, the math).

Shapes, dtypes and malformed tensors are covered for every registered method by
tests/test_attention.py; here: options, determinism, robustness and correctness.
"""

import math

import numpy as np
import pytest
import torch
from scipy import special, stats

from rpka.attention import build
from rpka.attention.keys_coreset import WILDCAT_RHO
from rpka.attention.nystromformer import iterative_pinv
from rpka.attention.performer import orthogonal_gaussian, positive_features
from rpka.attention.rpcholesky import rpcholesky

PEERS = ["nystrom-uniform", "keys-coreset", "nystromformer", "performer"]
RANDOMISED = ["nystrom-uniform", "keys-coreset", "performer"]


def qkv(b=2, h=3, n=24, d=8, m=None, d_v=None, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    q = torch.randn(b, h, n, d, generator=g, dtype=dtype) * scale
    k = torch.randn(b, h, m, d, generator=g, dtype=dtype) * scale
    v = torch.randn(b, h, m, d if d_v is None else d_v, generator=g, dtype=dtype)
    return q, k, v


def reference(q, k, v):
    """Softmax attention written out, independent of SDPA."""
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def peer(name, rank=16, seed=0, **options):
    if name in RANDOMISED:
        options["generator"] = torch.Generator().manual_seed(seed)
    return build(name, rank=rank, **options)


# ---------------------------------------------------------------- interface and robustness


@pytest.mark.parametrize("name", PEERS)
def test_cross_lengths_and_value_width(name):
    q, k, v = qkv(n=10, m=14, d=8, d_v=5, dtype=torch.float32)
    out = peer(name, rank=4)(q, k, v)
    assert out.shape == (2, 3, 10, 5) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", PEERS)
@pytest.mark.parametrize(
    ("dtype", "scale"),
    [(torch.float16, 1.0), (torch.bfloat16, 1.0), (torch.float16, 30.0), (torch.float32, 30.0)],
)
def test_finite_in_range_with_finite_gradients(name, dtype, scale):
    q, k, v = qkv(b=1, h=2, n=40, d=16, dtype=torch.float32, scale=scale, seed=1)
    q, k, v = (x.to(dtype).requires_grad_(True) for x in (q, k, v))
    out = peer(name, rank=8)(q, k, v)
    assert out.dtype == dtype and torch.isfinite(out).all()
    # every peer returns a convex combination of the values (performer by construction,
    # the Nystrom ones through the value-hull guard); allow the final rounding to dtype
    vf, of = v.detach().float(), out.detach().float()
    slack = 1e-2 * vf.abs().amax()
    assert (of >= vf.amin(-2, keepdim=True) - slack).all()
    assert (of <= vf.amax(-2, keepdim=True) + slack).all()
    out.float().square().mean().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", PEERS)
@pytest.mark.parametrize("rank", [0, -3, 2.5, True, "8"])
def test_bad_rank(name, rank):
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        build(name, rank=rank)


@pytest.mark.parametrize("name", PEERS)
def test_causal_is_rejected_with_a_reason(name):
    with pytest.raises(ValueError, match=f"causal=True is not supported by '{name}'"):
        build(name, causal=True)


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("nystrom-uniform", {"den_floor": 0.0}, "den_floor"),
        ("nystrom-uniform", {"generator": 1}, "generator"),
        ("keys-coreset", {"den_floor": 1.0}, "den_floor"),
        ("keys-coreset", {"temperature": 0.0}, "temperature"),
        ("keys-coreset", {"temperature": -1.0}, "temperature"),
        ("keys-coreset", {"temperature": float("inf")}, "temperature"),
        ("keys-coreset", {"generator": "seed"}, "generator"),
        ("nystromformer", {"pinv_iterations": 0}, "pinv_iterations"),
        ("nystromformer", {"clamp": "yes"}, "clamp"),
        ("performer", {"redraw": 1}, "redraw"),
        ("performer", {"generator": 0}, "generator"),
    ],
)
def test_bad_options_name_the_option(name, options, match):
    with pytest.raises(ValueError, match=match):
        build(name, **options)


@pytest.mark.parametrize("name", RANDOMISED)
def test_same_seed_same_output_other_seed_differs(name):
    q, k, v = qkv(dtype=torch.float32, n=48)
    first, again = (peer(name, rank=8, seed=5)(q, k, v) for _ in range(2))
    assert torch.equal(first, again)
    assert not torch.equal(first, peer(name, rank=8, seed=6)(q, k, v))


def test_nystromformer_is_deterministic():
    q, k, v = qkv(dtype=torch.float32, n=48)
    attn = build("nystromformer", rank=8)
    assert torch.equal(attn(q, k, v), attn(q, k, v))


def test_performer_features_fixed_unless_redrawn():
    q, k, v = qkv(dtype=torch.float32, n=32)
    fixed = peer("performer", rank=16)
    assert torch.equal(fixed(q, k, v), fixed(q, k, v))
    redraw = peer("performer", rank=16, redraw=True)
    assert not torch.equal(redraw(q, k, v), redraw(q, k, v))


# ---------------------------------------------------------------- nystrom-uniform


def test_nystrom_uniform_full_rank_equals_exact():
    q, k, v = qkv(n=20)
    out = peer("nystrom-uniform", rank=40)(q, k, v)  # 40 = all joint points
    assert rel_err(out, reference(q, k, v)) < 1e-10


def test_nystrom_uniform_is_rpka_with_uniform_landmarks():
    q, k, v = qkv(n=32, dtype=torch.float32)
    ours = peer("nystrom-uniform", rank=8, seed=3)(q, k, v)
    rpka = build("rpka", rank=8, pivot_rule="uniform", generator=torch.Generator().manual_seed(3))(
        q, k, v
    )
    assert torch.equal(ours, rpka)


# ---------------------------------------------------------------- keys-coreset (WildCat)


@pytest.mark.parametrize("temperature", [None, 1.0, 2.5])
def test_keys_coreset_full_rank_equals_exact(temperature):
    q, k, v = qkv(n=20, m=16, scale=1.5)
    out = peer("keys-coreset", rank=16, temperature=temperature)(q, k, v)
    assert rel_err(out, reference(q, k, v)) < 1e-10
    capped = peer("keys-coreset", rank=1000, temperature=temperature)(q, k, v)
    assert rel_err(capped, reference(q, k, v)) < 1e-10


def wildcat_reference(q, k, v, pivots):
    """WildCat's estimate from its published formulas, in numpy, for one (batch, head).

    tau = sqrt(rho max|k| / max|q|) on centred keys; W = E(K_S,K_S)^{-1} E(K_S,K) for the
    tempered kernel E(x, y) = exp(beta x.y / tau^2); out = exp(beta Q K_S^T)(W V) / (... W 1).
    """
    beta = 1 / math.sqrt(q.shape[-1])
    k = k - k.mean(0)
    tau = math.sqrt(WILDCAT_RHO * np.linalg.norm(k, axis=1).max() / np.linalg.norm(q, axis=1).max())
    k_s = k[pivots]
    e_ss = np.exp(beta * k_s @ k_s.T / tau**2)
    e_sk = np.exp(beta * k_s @ k.T / tau**2)
    w = np.linalg.solve(e_ss, e_sk)  # (r, m)
    a = np.exp(beta * q @ k_s.T)  # (n, r)
    return (a @ (w @ v)) / (a @ w.sum(1, keepdims=True))


def test_keys_coreset_matches_wildcat_formulas_at_low_rank():
    q, k, v = qkv(b=1, h=2, n=30, m=40, d=6, scale=0.8, seed=2)
    attn = peer("keys-coreset", rank=6, seed=7)
    out = attn(q, k, v)
    assert attn.guard_counts["denominator"] == 0 and attn.guard_counts["clamped"] == 0
    # the same pivots: same generator seed, same tempered keys (the method's documented recipe)
    k_c = k - k.mean(-2, keepdim=True)
    tau = torch.sqrt(WILDCAT_RHO * k_c.norm(dim=-1).amax(-1) / q.norm(dim=-1).amax(-1)).reshape(
        1, 2, 1, 1
    )
    k_t = k_c * q.shape[-1] ** -0.25 / tau
    pivots = rpcholesky(k_t, 6, "rpc", torch.Generator().manual_seed(7), weighting="exp").pivots
    assert (pivots >= 0).all()
    for h in range(2):
        expected = wildcat_reference(
            q[0, h].numpy(), k[0, h].numpy(), v[0, h].numpy(), pivots[0, h].numpy()
        )
        np.testing.assert_allclose(out[0, h].numpy(), expected, rtol=1e-9, atol=1e-11)


def test_keys_coreset_error_shrinks_with_rank():
    q, k, v = qkv(b=1, h=2, n=128, d=16, dtype=torch.float32, seed=3)
    ref = reference(q, k, v)
    errs = [
        np.mean([rel_err(peer("keys-coreset", rank=r, seed=s)(q, k, v), ref) for s in range(3)])
        for r in (8, 32, 128)
    ]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-4


# ---------------------------------------------------------------- nystromformer


def nystromformer_reference(q, k, v, m, iterations=6):
    """The paper's algorithm in numpy for one (batch, head); segment s holds tokens
    ceil(s n / m) .. ceil((s + 1) n / m) - 1 (the module's documented uneven split)."""
    d = q.shape[-1]
    q, k = q / d**0.25, k / d**0.25

    def means(x):
        n = len(x)
        bounds = [math.ceil(s * n / m) for s in range(m + 1)]
        return np.stack([x[bounds[s] : bounds[s + 1]].mean(0) for s in range(m)])

    q_l, k_l = means(q), means(k)
    f = special.softmax(q @ k_l.T, axis=-1)
    a = special.softmax(q_l @ k_l.T, axis=-1)
    b = special.softmax(q_l @ k.T, axis=-1)
    z = a.T / (np.abs(a).sum(0).max() * np.abs(a).sum(1).max())
    eye = np.eye(m)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return f @ (z @ (b @ v))


@pytest.mark.parametrize(("n", "m_keys", "rank"), [(12, 12, 4), (10, 14, 4), (9, 9, 9)])
def test_nystromformer_matches_numpy_reference(n, m_keys, rank):
    q, k, v = qkv(b=1, h=2, n=n, m=m_keys, d=8, seed=4)
    out = build("nystromformer", rank=rank, clamp=False)(q, k, v)
    for h in range(2):
        expected = nystromformer_reference(q[0, h].numpy(), k[0, h].numpy(), v[0, h].numpy(), rank)
        np.testing.assert_allclose(out[0, h].numpy(), expected, rtol=1e-9, atol=1e-12)


def test_nystromformer_rank_n_converges_to_exact():
    """rank == n: one token per segment, so the formula is exact with the true inverse.

    With the paper's 6 pseudo-inverse iterations it is not, on these inputs: the error is
    ~2e-2 because A = softmax(Q~K~^T) has sigma_min^2 / (|A|_1 |A|_inf) ~ 1e-3 and the
    error contracts like (1 - that)^(3^j). It must shrink with the iterations and reach
    round-off once they suffice.
    """
    q, k, v = qkv(n=20)
    ref = reference(q, k, v)
    errs = [
        rel_err(build("nystromformer", rank=20, pinv_iterations=it, clamp=False)(q, k, v), ref)
        for it in (6, 10, 20, 40)
    ]
    assert errs[0] > errs[1] > errs[2] > errs[3] and errs[3] < 1e-9


def test_iterative_pinv_contracts_as_the_theory_says_and_reaches_numpy_pinv():
    """With E_j = I - A Z_j: E_0 = I - A A^T / (|A|_1 |A|_inf) has spectral norm
    1 - delta, delta = sigma_min^2 / (|A|_1 |A|_inf), and E_{j+1} = E_j^3 (3 + E_j) / 4,
    so |E_6| <= (1 - delta)^(3^6)."""
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.eye(12, dtype=torch.float64)
    a = torch.softmax(logits + torch.randn(12, 12, generator=g, dtype=torch.float64), dim=-1)
    a_np = a.numpy()
    delta = np.linalg.svd(a_np, compute_uv=False).min() ** 2 / (
        np.abs(a_np).sum(0).max() * np.abs(a_np).sum(1).max()
    )
    residual = np.linalg.norm(np.eye(12) - a_np @ iterative_pinv(a, 6).numpy(), ord=2)
    assert residual <= (1 - delta) ** (3**6) + 1e-12
    pinv = np.linalg.pinv(a_np)
    assert np.linalg.norm(iterative_pinv(a, 10).numpy() - pinv) / np.linalg.norm(pinv) < 1e-12


# ---------------------------------------------------------------- performer


def test_orthogonal_features_rows_orthogonal_in_blocks_with_chi_norms():
    d = 8
    omega = orthogonal_gaussian(4096, d, torch.Generator().manual_seed(0), dtype=torch.float64)
    unit = omega / omega.norm(dim=-1, keepdim=True)
    block = unit[:d] @ unit[:d].T
    np.testing.assert_allclose(block.numpy(), np.eye(d), atol=1e-12)
    # each row's norm is chi(d): the rows are marginally N(0, I_d)
    assert stats.kstest(omega.norm(dim=-1).numpy(), stats.chi(d).cdf).pvalue > 1e-3


@pytest.mark.parametrize("pair_seed", [0, 1])
def test_performer_kernel_estimate_is_unbiased(pair_seed):
    """Mean of phi(q).phi(k) over independent feature draws is within 4 SE of exp(q.k)."""
    d, m, draws = 8, 8, 1500
    g = torch.Generator().manual_seed(pair_seed)
    x, y = (0.4 * torch.randn(d, generator=g, dtype=torch.float64) for _ in range(2))
    draw = torch.Generator().manual_seed(100 + pair_seed)
    estimates = np.array(
        [
            (positive_features(x[None], omega) @ positive_features(y[None], omega).T).item()
            for omega in (
                orthogonal_gaussian(m, d, draw, dtype=torch.float64) for _ in range(draws)
            )
        ]
    )
    target = math.exp(float(x @ y))
    se = estimates.std(ddof=1) / math.sqrt(draws)
    assert abs(estimates.mean() - target) < 4 * se
    assert se < 0.05 * target  # the check has power: the SE is small against the target


def test_performer_stabilised_path_equals_the_plain_formula():
    q, k, v = qkv(b=1, h=2, n=30, d=16, scale=0.7)
    attn = peer("performer", rank=64, seed=2)
    out = attn(q, k, v)
    omega = attn.omega
    phi_q = positive_features(q / 16**0.25, omega)
    phi_k = positive_features(k / 16**0.25, omega)
    plain = (phi_q @ (phi_k.transpose(-1, -2) @ v)) / (phi_q @ phi_k.sum(-2).unsqueeze(-1))
    assert rel_err(out, plain) < 1e-12


def test_performer_error_shrinks_with_rank():
    q, k, v = qkv(b=1, h=2, n=128, d=16, scale=0.5, seed=3)
    ref = reference(q, k, v)
    errs = [
        np.mean([rel_err(peer("performer", rank=r, seed=s)(q, k, v), ref) for s in range(3)])
        for r in (16, 256, 4096)
    ]
    # Monte Carlo error ~ 1/sqrt(m): 16x more features should cut it by about 4
    assert errs[0] > 2 * errs[1] > 4 * errs[2]


def test_mean_control_averages_the_values_whatever_the_queries():
    from rpka.attention import build

    q, k, v = (torch.randn(2, 3, 10, 4, dtype=torch.float64) for _ in range(3))
    out = build("mean")(q, k, v)
    torch.testing.assert_close(out, v.mean(-2, keepdim=True).expand_as(out))
    # it is softmax attention with q = 0, causal too
    zero = torch.zeros_like(q)
    torch.testing.assert_close(out, build("exact")(zero, k, v))
    causal = build("mean", causal=True)(q, k, v)
    torch.testing.assert_close(causal, build("exact", causal=True)(zero, k, v))
