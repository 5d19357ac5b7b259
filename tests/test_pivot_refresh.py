"""RPKA's pivot_refresh option: pivots drawn at every call, or fixed for a whole batch."""

import pytest
import torch

from rpka.attention import build
from rpka.attention.nystrom import gather_points, nystrom_softmax
from rpka.attention.rpka import balanced_frame, new_batch, share_pivot_cache
from rpka.model import ModelConfig, TransformerTiny


def qkv(seed=0, b=2, h=2, n=40, d=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


def rpka(refresh, seed=1, **options):
    generator = torch.Generator().manual_seed(seed)
    return build("rpka", rank=6, pivot_refresh=refresh, generator=generator, **options)


def test_batch_pivots_are_fixed_until_a_new_batch():
    q, k, v = qkv()
    attn = rpka("batch")
    first = attn(q, k, v)
    drawn = attn.pivot_cache.pivots.clone()
    torch.testing.assert_close(attn(q, k, v), first, rtol=0, atol=0)  # same draw reused
    assert torch.equal(attn.pivot_cache.pivots, drawn)
    attn.new_batch()
    assert attn.pivot_cache.pivots is None
    again = attn(q, k, v)
    assert not torch.equal(attn.pivot_cache.pivots, drawn)  # a fresh draw
    assert (again - first).abs().max() > 1e-3


def test_per_call_resampling_differs_and_matches_the_batch_draw_first():
    q, k, v = qkv()
    per_call, per_batch = rpka("call"), rpka("batch")  # same generator seed
    a, b = per_call(q, k, v), per_call(q, k, v)
    assert (a - b).abs().max() > 1e-3  # new pivots at every call
    # the first call of a batch is an ordinary draw: the same pivots as per-call's first
    # (float64: the chunked and the unchunked evaluation agree to round-off)
    torch.testing.assert_close(per_batch(q, k, v), a, rtol=1e-10, atol=1e-12)
    assert (per_batch(q, k, v) - b).abs().max() > 1e-3  # ...and it is not redrawn


def test_shared_cache_reuses_token_positions_on_the_other_layers_points():
    q1, k1, v1 = qkv(seed=0)
    q2, k2, v2 = qkv(seed=5)  # another layer's inputs
    first, second = rpka("batch", seed=1), rpka("batch", seed=2)
    share_pivot_cache([first, second])
    assert second.pivot_cache is first.pivot_cache
    first(q1, k1, v1)
    pivots = first.pivot_cache.pivots.clone()
    out = second(q2, k2, v2)
    assert torch.equal(second.pivot_cache.pivots, pivots)  # no draw of its own
    # independent recomputation: landmarks at those positions of the second layer's points
    frame = balanced_frame(q2, k2)  # the scaled points (q/k balance, centred keys)
    q_s, k_s = q2 * frame.q_scale, k2 * frame.k_scale
    k_s = k_s - k_s.mean(-2, keepdim=True)
    points = torch.cat([q_s, k_s], dim=-2)
    expected, _ = nystrom_softmax(q_s, k_s, v2, gather_points(points, pivots), pivots >= 0)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_reused_pivots_keep_gradients_in_q_and_k():
    q, k, v = (x.requires_grad_(True) for x in qkv())
    attn = rpka("batch")
    attn(*(x.detach() for x in (q, k, v)))  # the draw
    attn(q, k, v).pow(2).sum().backward()  # a reusing call
    for x in (q, k, v):
        assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_another_shape_starts_a_new_batch():
    attn = rpka("batch")
    attn(*qkv(n=40))
    attn(*qkv(n=24))  # cannot reuse indices of 80 points for 48: draws afresh
    assert attn.pivot_cache.pivots.shape == (2, 2, 6) and int(attn.pivot_cache.pivots.max()) < 48


def test_bad_pivot_refresh_is_rejected():
    with pytest.raises(ValueError, match="pivot_refresh"):
        build("rpka", pivot_refresh="epoch")
    with pytest.raises(ValueError, match="causal"):  # causal RPKA draws per block itself
        build("rpka", pivot_refresh="batch", causal=True)


CFG = ModelConfig(d_model=16, n_layers=3, n_heads=2, d_ff=32, embed_kernel=3)


def tiny_model(refresh, seed=0):
    options = {"rank": 6, "pivot_refresh": refresh, "generator": torch.Generator().manual_seed(7)}
    return TransformerTiny(CFG, 24, 4, [seed, seed + 1], "rpka", options)


def test_model_draws_once_per_forward_with_batch_pivots(monkeypatch):
    draws = []
    real = type(build("rpka")).draw_pivots

    def counting(self, points):
        draws.append(points.shape)
        return real(self, points)

    monkeypatch.setattr(type(build("rpka")), "draw_pivots", counting)
    x = torch.randn(2, 5, 24)
    batched = tiny_model("batch")
    caches = {id(m.pivot_cache) for m in batched.attention_modules()}
    assert len(caches) == 1  # the layers share one cache
    batched(x).sum().backward()
    batched(x).sum().backward()
    assert len(draws) == 2  # one draw per forward (= per training batch), not per layer
    draws.clear()
    tiny_model("call")(x).sum().backward()
    assert len(draws) == CFG.n_layers


def test_model_with_batch_pivots_is_deterministic_and_differs_from_per_call():
    x = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(3))
    a, b = tiny_model("batch"), tiny_model("batch")
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)
    per_call = tiny_model("call")
    assert (per_call(x) - tiny_model("batch")(x)).abs().max() > 1e-6
    # a forward is one batch: a second forward draws again
    model = tiny_model("batch")
    model(x)
    first = model.attention_modules()[0].pivot_cache.pivots.clone()
    model(x)
    assert not torch.equal(model.attention_modules()[0].pivot_cache.pivots, first)
    new_batch(model.attention_modules())
    assert model.attention_modules()[0].pivot_cache.pivots is None
