"""Full rank is exact whatever the scale of the queries relative to the keys.

Trained heads have no QK-norm, so query and key norms drift apart. Softmax attention sees
them only through ``q.k``, so ``(alpha q, k / alpha)`` is the same attention for any
alpha; a Nystrom estimate at full rank must be exact for every such pair, in float32 and
float64, forward and gradients. Before the q/k balance (``rpka.attention.rpka.
balanced_frame``) the joint estimate was off by 0.2-1.0 at q x10 / k x1 and q x1 / k x10,
in float64 too, without a word (docs/numerics.md). The reference is a float64 softmax
written here, not the package's code; tolerances are those of the sharp-attention tests
(tests/test_sharp_attention.py), gradients one order looser (they pass through the
solve).
"""

import itertools
import warnings

import pytest
import torch
from softmax_reference import softmax_attention

from rpka.attention import build
from rpka.attention.nystrom import estimate_unless_keys_covered, keys_covered

# q scale x k scale: every ratio from 1/20 to 20 and logit standard deviations (about
# q scale * k scale) up to ~400. Past logit std ~30 the solve alone cannot be exact (the
# terms the softmax needs fall below its round-off); there the landmarks hold every key
# and Nystrom's identity gives the exact answer (rpka.attention.nystrom.
# exact_where_keys_covered) - q x10 / k x10 was ~50 % wrong before it.
SCALES = [1.0, 3.0, 10.0]
SCALE_PAIRS = [
    *itertools.product(SCALES, SCALES),
    (20.0, 1.0),
    (1.0, 20.0),
    (0.5, 20.0),
    (20.0, 0.25),
    (20.0, 20.0),
]
SHAPES = [(1, 2, 64, 16), (2, 1, 24, 8)]
TOL = {torch.float32: 1e-4, torch.float64: 1e-10}
GRAD_TOL = {torch.float32: 1e-3, torch.float64: 1e-9}
# every non-causal method that claims exactness at full rank: (name, options, landmarks)
FULL_RANK = {
    "rpka-joint": ("rpka", {}, "joint"),
    "rpka-keys": ("rpka", {"pivot_set": "keys"}, "keys"),
    "nystrom-uniform": ("nystrom-uniform", {}, "joint"),
    "keys-coreset": ("keys-coreset", {}, "keys"),
}


def scaled_qkv(q_scale, k_scale, shape, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3))
    return q * q_scale, k * k_scale, v


def full_rank(key, n):
    name, options, landmarks = FULL_RANK[key]
    rank = 2 * n if landmarks == "joint" else n
    return build(name, rank=rank, generator=torch.Generator().manual_seed(1), **options)


def rel_err(out, ref):
    return float((out.detach().double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("q_scale", "k_scale"), SCALE_PAIRS)
@pytest.mark.parametrize("key", list(FULL_RANK))
def test_full_rank_forward_is_exact_at_any_q_k_scale(key, q_scale, k_scale, dtype, shape):
    for seed in range(3):
        q, k, v = scaled_qkv(q_scale, k_scale, shape, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an exact call must not warn either
            with torch.no_grad():  # the inference (chunked) path
                out = full_rank(key, shape[-2])(*(x.to(dtype) for x in (q, k, v)))
        assert out.dtype == dtype
        assert rel_err(out, softmax_attention(q, k, v)) < TOL[dtype], seed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("q_scale", "k_scale"), SCALE_PAIRS)
@pytest.mark.parametrize("key", list(FULL_RANK))
def test_full_rank_gradients_are_exact_at_any_q_k_scale(key, q_scale, k_scale, dtype):
    shape = SHAPES[0]
    for seed in range(2):
        q, k, v = scaled_qkv(q_scale, k_scale, shape, seed)
        upstream = torch.randn(*shape, generator=torch.Generator().manual_seed(7 + seed))
        ref_inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        (softmax_attention(*ref_inputs) * upstream.double()).sum().backward()
        inputs = [x.to(dtype).requires_grad_(True) for x in (q, k, v)]
        out = full_rank(key, shape[-2])(*inputs)  # the differentiable (training) path
        (out * upstream.to(dtype)).sum().backward()
        assert rel_err(out.detach(), softmax_attention(q, k, v)) < TOL[dtype], seed
        for name, got, ref in zip("qkv", inputs, ref_inputs, strict=True):
            assert rel_err(got.grad, ref.grad) < GRAD_TOL[dtype], (name, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("q_scale", "k_scale"), SCALE_PAIRS)
def test_causal_rpka_is_exact_at_any_q_k_scale(q_scale, k_scale, dtype):
    shape = SHAPES[0]
    q, k, v = scaled_qkv(q_scale, k_scale, shape, 0)
    method = build("rpka", rank=2 * shape[-2], causal=True, causal_block=16)
    with torch.no_grad():
        out = method(*(x.to(dtype) for x in (q, k, v)))
    assert rel_err(out, softmax_attention(q, k, v, causal=True)) < TOL[dtype]


def test_balance_leaves_low_rank_pivots_on_balanced_inputs_in_the_same_law():
    """The balance moves only the scale of the pivoted points: inputs whose largest query
    and centred key are already equally long get alpha = 1 and the same estimate."""
    from rpka.attention.rpka import balanced_frame

    q, k, _ = scaled_qkv(1.0, 1.0, SHAPES[0], 0)
    k = k - k.mean(-2, keepdim=True)
    k = k * (q.norm(dim=-1).amax(-1) / k.norm(dim=-1).amax(-1))[..., None, None]
    frame = balanced_frame(q, k)
    assert torch.allclose(frame.q_scale, frame.k_scale, rtol=1e-12)
    q, k, _ = scaled_qkv(10.0, 1.0, SHAPES[0], 0)
    frame = balanced_frame(q, k)
    assert bool((frame.q_scale < frame.k_scale).all())  # long queries are shrunk
    unbalanced = balanced_frame(q, k, balance=False)
    assert torch.equal(unbalanced.q_scale, unbalanced.k_scale)


@pytest.mark.parametrize(
    ("q_scale", "k_scale", "qk_balance"), [(1.0, 20.0, False), (10.0, 10.0, True)]
)
def test_full_rank_is_exact_by_the_identity_whatever_the_frame(q_scale, k_scale, qk_balance):
    """Every key a landmark: exact even without the q/k balance (wrong by ~100 % before the
    fix at q x1 / k x20) and at logit std ~100 (q x10 / k x10, ~50 % wrong before)."""
    q, k, v = scaled_qkv(q_scale, k_scale, SHAPES[0], 0)
    method = build(
        "rpka", rank=128, qk_balance=qk_balance, generator=torch.Generator().manual_seed(1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = method(q, k, v)
    assert rel_err(out, softmax_attention(q, k, v)) < TOL[torch.float64]


def test_keys_covered_reads_joint_and_keys_indices():
    pivots = torch.tensor([[3, 0, 4, 2, -1], [4, 2, 3, -1, -1]])  # 2 queries, 3 keys (2, 3, 4)
    assert keys_covered(pivots, 2, 3).tolist() == [True, True]
    assert keys_covered(pivots[:, :2], 2, 3).tolist() == [False, False]
    assert keys_covered(torch.tensor([[0, 1, -1]]), 0, 3).tolist() == [False]


def test_identity_is_applied_only_where_every_key_is_a_landmark():
    q, k, v = scaled_qkv(3.0, 3.0, (2, 1, 8, 4), 0)
    estimate = torch.zeros(2, 1, 8, 4, dtype=torch.float64)
    counts = {"denominator": torch.tensor(3)}
    mixed = torch.tensor([[True], [False]])
    out, got = estimate_unless_keys_covered(lambda: (estimate, counts), q, k, v, mixed)
    assert rel_err(out[0], softmax_attention(q, k, v)[0]) < 1e-12
    assert torch.equal(out[1], estimate[1]) and got is counts

    def never() -> None:
        raise AssertionError("every key is a landmark: the estimate is not computed")

    out, got = estimate_unless_keys_covered(never, q, k, v, torch.ones(2, 1, dtype=torch.bool))
    assert rel_err(out, softmax_attention(q, k, v)) < 1e-12
    assert int(got["denominator"]) == 0 and int(got["rows"]) == 16


@pytest.mark.parametrize(("pivot_set", "rank"), [("joint", 128), ("keys", 64)])
def test_full_rank_draws_nothing(pivot_set, rank):
    """At rank >= every point RPCholesky would take them all: no draw (the generator does
    not move), exact attention. (Below it, a draw whose pivots hold every key gets the
    identity per batch element: test_identity_is_applied_only_where_every_key_is_a_landmark.)"""
    q, k, v = scaled_qkv(10.0, 10.0, SHAPES[0], 0)
    generator = torch.Generator().manual_seed(1)
    before = generator.get_state()
    out = build("rpka", rank=rank, pivot_set=pivot_set, generator=generator)(q, k, v)
    assert torch.equal(generator.get_state(), before)
    assert rel_err(out, softmax_attention(q, k, v)) < TOL[torch.float64]


def test_qk_balance_option_is_checked():
    with pytest.raises(ValueError, match="qk_balance must be True or False"):
        build("rpka", rank=4, qk_balance="yes")
