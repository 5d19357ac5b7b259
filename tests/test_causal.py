"""Causal attention: no leakage from the future, exactness at full rank, decoding = forward.

The references are independent of the code under test: a written-out masked softmax, a
direct (one-piece) computation of the key moments, and the same inputs with the future
replaced.
"""

import pytest
import torch

from rpka.attention import build
from rpka.attention.cache import GrowingBuffer
from rpka.attention.causal_landmarks import LandmarkSet, Moments, draw_blocks, prefix_merge


def qkv(b=2, h=3, n=40, d=8, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) * scale for _ in range(3)]


def causal_reference(q, k, v):
    """Masked softmax attention written out, independent of SDPA and of RPKA."""
    n = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def causal_rpka(seed=0, **options):
    return build("rpka", causal=True, generator=torch.Generator().manual_seed(seed), **options)


def with_new_future(xs, t, seed):
    """Copies of q, k, v with every position > t redrawn (and scaled up, to move maxima)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for x in xs:
        y = x.clone()
        y[..., t + 1 :, :] = 3 * torch.randn(y[..., t + 1 :, :].shape, generator=g, dtype=y.dtype)
        out.append(y)
    return out


TIMES = (0, 5, 7, 8, 16, 23, 38)  # inside block 0, at block ends and starts, late


# ----------------------------------------------------------------------------- leakage


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_exact_causal_does_not_leak(dtype):
    q, k, v = qkv(n=40, dtype=dtype)
    attn = build("exact", causal=True)
    out = attn(q, k, v)
    for t in TIMES:
        changed = attn(*with_new_future((q, k, v), t, seed=t))
        assert torch.equal(changed[..., : t + 1, :], out[..., : t + 1, :]), t


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
@pytest.mark.parametrize(("rank", "block_size"), [(3, 4), (8, 8), (16, 5), (200, 8)])
def test_causal_rpka_does_not_leak(dtype, pivot_set, rank, block_size):
    q, k, v = qkv(n=40, dtype=dtype)
    options = {"rank": rank, "causal_block": block_size, "pivot_set": pivot_set}
    out = causal_rpka(**options)(q, k, v)
    for t in TIMES:
        changed = causal_rpka(**options)(*with_new_future((q, k, v), t, seed=t))
        assert torch.equal(changed[..., : t + 1, :], out[..., : t + 1, :]), t
        assert not torch.equal(changed[..., t + 1 :, :], out[..., t + 1 :, :])  # inputs did change


def test_non_causal_rpka_leaks():
    # the same check on the non-causal method must fail: the check can detect a leak
    q, k, v = qkv(n=40)
    out = build("rpka", rank=8, generator=torch.Generator().manual_seed(0))(q, k, v)
    changed = build("rpka", rank=8, generator=torch.Generator().manual_seed(0))(
        *with_new_future((q, k, v), 20, seed=1)
    )
    assert not torch.allclose(changed[..., :21, :], out[..., :21, :], atol=1e-6)


# ----------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
@pytest.mark.parametrize(("n", "block_size"), [(40, 8), (29, 5), (6, 8), (17, 1)])
def test_full_rank_equals_exact_causal(pivot_set, n, block_size):
    q, k, v = qkv(n=n)
    rank = 2 * n  # >= the number of earlier points for every block
    out = causal_rpka(rank=rank, causal_block=block_size, pivot_set=pivot_set)(q, k, v)
    assert rel_err(out, causal_reference(q, k, v)) <= 1e-6


def test_error_shrinks_with_rank():
    q, k, v = qkv(b=1, h=2, n=96, d=8)
    ref = causal_reference(q, k, v)
    errs = [rel_err(causal_rpka(rank=r, causal_block=8)(q, k, v), ref) for r in (2, 16, 200)]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-6


def test_output_stays_in_causal_value_range():
    # guard 3 clamps to the range of v over positions <= t, not over the whole sequence
    q, k, v = qkv(b=1, h=2, n=64, d=8, dtype=torch.float32, scale=3.0, seed=2)
    out = causal_rpka(rank=2, causal_block=4, pivot_set="keys")(q, k, v)
    assert (out >= torch.cummin(v, dim=-2).values - 1e-6).all()
    assert (out <= torch.cummax(v, dim=-2).values + 1e-6).all()


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_and_huge_norms_finite(pivot_set, dtype):
    for scale in (1.0, 30.0):
        q, k, v = qkv(n=48, d=16, dtype=torch.float32, scale=scale)
        out = causal_rpka(rank=8, causal_block=8, pivot_set=pivot_set)(
            *(x.to(dtype) for x in (q, k, v))
        )
        assert out.dtype == dtype and torch.isfinite(out).all()


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_huge_norms_finite_gradients_and_guard_totals(pivot_set):
    q, k, v = qkv(n=45, d=16, dtype=torch.float32, scale=30.0)  # last block partial
    for x in (q, k, v):
        x.requires_grad_(True)
    attn = causal_rpka(rank=8, causal_block=16, pivot_set=pivot_set)
    out = attn(q, k, v)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    counts = attn.guard_counts
    # only rows with a past part (blocks >= 1) can be guarded, and only they are counted
    assert counts["rows"] == 2 * 3 * (45 - 16) and counts["entries"] == counts["rows"] * 16


def test_gradients_match_exact_at_full_rank():
    q, k, v = qkv(n=20, d=4)
    grads = []
    for attn in (build("exact", causal=True), causal_rpka(rank=40, causal_block=6)):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        attn(*xs).sin().sum().backward()
        grads.append([x.grad for x in xs])
    for g_exact, g_rpka in zip(*grads, strict=True):
        assert rel_err(g_rpka, g_exact) < 1e-6


# ----------------------------------------------------------------------------- pieces


def test_prefix_merge_equals_moments_of_each_prefix():
    # reference: the moments of every prefix computed in one piece, without merging
    g = torch.Generator().manual_seed(0)
    k = 2 * torch.randn(2, 40, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 40, 3, generator=g, dtype=torch.float64)
    z = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    landmarks = LandmarkSet(z, torch.ones(2, 5, dtype=torch.bool), torch.eye(5).expand(2, 5, 5))
    blocks = landmarks.per_block().moments(k.unflatten(-2, (8, 5)), v.unflatten(-2, (8, 5)))
    merged = prefix_merge(blocks)
    for s in range(8):
        direct = landmarks.moments(k[..., : 5 * (s + 1), :], v[..., : 5 * (s + 1), :])
        part = merged.part(s)
        # rho is a reference per landmark only: compare the moments it stands for
        implied = part.num * part.rho.exp().unsqueeze(-1)
        expected = direct.num * direct.rho.exp().unsqueeze(-1)
        assert torch.allclose(implied, expected, rtol=1e-12, atol=0)
    assert isinstance(merged, Moments)


def test_draw_schedule_doubles_once_the_pool_exceeds_the_rank():
    assert draw_blocks(1, 64, 64, 2) == []
    assert draw_blocks(100, 64, 64, 2) == [1, 2, 4, 8, 16, 32, 64]
    # pools of 2 * 4 * c points: every block while the pool fits in rank 20, then doubling
    assert draw_blocks(40, 4, 20, 2) == [1, 2, 3, 6, 12, 24]
    assert len(draw_blocks(2**20, 64, 64, 2)) == 20  # O(log n) draws


def test_growing_buffer_appends_without_losing_rows():
    x = torch.arange(6.0).reshape(1, 3, 2)
    buf = GrowingBuffer(x, capacity=3)
    for i in range(40):
        buf.append(torch.full((1, 1, 2), float(100 + i)))
    assert buf.length == 43 and buf.data.shape[-2] >= 43
    assert torch.equal(buf.view(0, 3), x)
    assert torch.equal(buf.view(3)[0, :, 0], torch.arange(100.0, 140.0))


# ----------------------------------------------------------------------------- decoding


def decode(attn, q, k, v, n_prompt):
    out, state = attn.prefill(q[..., :n_prompt, :], k[..., :n_prompt, :], v[..., :n_prompt, :])
    outs = [out]
    for t in range(n_prompt, q.shape[-2]):
        out_t, state = attn.step(
            q[..., t : t + 1, :], k[..., t : t + 1, :], v[..., t : t + 1, :], state
        )
        outs.append(out_t)
    return torch.cat(outs, dim=-2), state


@pytest.mark.parametrize("n_prompt", [1, 7, 8, 21, 40])
def test_exact_step_path_matches_forward(n_prompt):
    q, k, v = qkv(n=45)
    attn = build("exact", causal=True)
    decoded, state = decode(attn, q, k, v, n_prompt)
    assert state.length == 45
    assert (decoded - attn(q, k, v)).abs().max() < 1e-12


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
@pytest.mark.parametrize(
    ("n_prompt", "rank", "block_size"), [(1, 6, 4), (8, 6, 4), (13, 16, 8), (33, 4, 8)]
)
def test_rpka_step_path_matches_forward(pivot_set, n_prompt, rank, block_size):
    q, k, v = qkv(n=70)
    options = {"rank": rank, "causal_block": block_size, "pivot_set": pivot_set}
    full_attn = causal_rpka(**options)
    full = full_attn(q, k, v)
    attn = causal_rpka(**options)
    decoded, state = decode(attn, q, k, v, n_prompt)
    assert state.length == 70
    assert (decoded - full).abs().max() < 1e-10
    assert attn.guard_counts["rows"] == full_attn.guard_counts["rows"]


def test_rpka_step_path_float32_and_half():
    q, k, v = qkv(n=50, dtype=torch.float32)
    full = causal_rpka(rank=8, causal_block=8)(q, k, v)
    decoded, _ = decode(causal_rpka(rank=8, causal_block=8), q, k, v, 10)
    assert (decoded - full).abs().max() < 1e-4
    decoded, _ = decode(causal_rpka(rank=8, causal_block=8), *(x.half() for x in (q, k, v)), 10)
    assert decoded.dtype == torch.float16 and torch.isfinite(decoded).all()


def test_decoding_bad_arguments():
    q, k, v = qkv(n=10)
    with pytest.raises(ValueError, match="causal=True"):
        build("rpka").prefill(q, k, v)
    with pytest.raises(ValueError, match="causal=True"):
        build("exact").prefill(q, k, v)
    attn = causal_rpka(rank=4, causal_block=4)
    _, state = attn.prefill(q, k, v)
    with pytest.raises(ValueError, match="one token"):
        attn.step(q[..., :2, :], k[..., :2, :], v[..., :2, :], state)
    with pytest.raises(ValueError, match="state must be the CausalState"):
        attn.step(q[..., :1, :], k[..., :1, :], v[..., :1, :], object())
    with pytest.raises(ValueError, match="state must be the KVCache"):
        build("exact", causal=True).step(q[..., :1, :], k[..., :1, :], v[..., :1, :], state)
    with pytest.raises(ValueError, match="capacity"):
        attn.prefill(q, k, v, capacity=0)
    with pytest.raises(ValueError, match="as many queries as keys"):
        attn.prefill(q[..., :5, :], k, v)


@pytest.mark.parametrize("block_size", [0, -2, 2.5, True])
def test_bad_block_size(block_size):
    with pytest.raises(ValueError, match="causal_block"):
        build("rpka", causal=True, causal_block=block_size)
