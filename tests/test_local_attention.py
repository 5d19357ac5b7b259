"""The local (sliding-window) control against a dense float64 reference from the definition.

Shapes, malformed tensors and empty inputs are covered for every registered method by
tests/test_attention.py and tests/test_sharp_attention.py; here: the band itself, on both
code paths (the dense mask for short sequences, query blocks for long ones).
"""

import pytest
import torch

from rpka.attention import build
from rpka.attention.local import BLOCK, blocked_band, dense_band, uses_blocks

SHORT = 24  # one SDPA call with a dense band mask
LONG = 6 * BLOCK + 37  # the blocked path for windows up to 20, with a partial last block
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def qkv(n, b=2, h=3, d=8, d_v=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(b, h, n, d if d_v is None else d_v, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v)]


def reference(q, k, v, window, causal):
    """Band softmax attention in float64: causal i - w < j <= i, otherwise |i - j| < w."""
    q, k, v = (x.double() for x in (q, k, v))
    i = torch.arange(q.shape[-2]).unsqueeze(-1)
    j = torch.arange(k.shape[-2]).unsqueeze(0)
    allowed = ((i - window < j) & (j <= i)) if causal else ((i - j).abs() < window)
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v


def rel_err(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("n", "window"),
    [(SHORT, 1), (SHORT, 3), (SHORT, 7), (LONG, 1), (LONG, 3), (LONG, 20), (LONG, 80)],
)
def test_matches_the_band_reference(n, window, causal, dtype):
    q, k, v = qkv(n, dtype=dtype)
    out = build("local", window=window, causal=causal)(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, reference(q, k, v, window, causal)) < TOL[dtype]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 2, BLOCK - 1, BLOCK, BLOCK + 1, LONG - 1, LONG + 3])
@pytest.mark.parametrize("band", [dense_band, blocked_band])
def test_both_paths_match_the_reference_for_any_window(band, window, causal):
    # attend() picks one path by length and window; each must hold for every window
    q, k, v = qkv(LONG, b=1, h=2)
    out = band(q, k, v, window, causal)
    assert rel_err(out, reference(q, k, v, window, causal)) < 1e-12


@pytest.mark.parametrize("causal", [False, True])
def test_long_inputs_here_take_the_blocked_path(causal):
    # so that the tests through build() above cover both paths
    assert uses_blocks(LONG, 20, causal) and uses_blocks(LONG, 1, causal)
    assert not uses_blocks(SHORT, 1, causal) and not uses_blocks(LONG, 80, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [SHORT, SHORT + 5, 1000])
def test_window_covering_every_key_is_exact_attention(window, causal):
    q, k, v = qkv(SHORT)
    out = build("local", window=window, causal=causal)(q, k, v)
    torch.testing.assert_close(out, build("exact", causal=causal)(q, k, v), rtol=0, atol=1e-14)
    assert rel_err(out, reference(q, k, v, 10**9, causal)) < 1e-12


@pytest.mark.parametrize("n", [SHORT, LONG])
@pytest.mark.parametrize("causal", [False, True])
def test_window_one_returns_each_positions_own_value(causal, n):
    # causal i - 1 < j <= i and non-causal |i - j| < 1 both leave j = i alone
    q, k, v = qkv(n)
    torch.testing.assert_close(build("local", window=1, causal=causal)(q, k, v), v)


@pytest.mark.parametrize(("n", "window"), [(SHORT, 3), (SHORT, 10), (LONG, 3), (LONG, 20)])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_the_reference(n, window, causal):
    q, k, v = qkv(n, b=1, h=2, d=4, d_v=3)
    grads = []
    for fn in (build("local", window=window, causal=causal), reference):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = fn(*xs) if fn is not reference else fn(*xs, window, causal)
        out.sin().sum().backward()  # sin: a gradient that differs across entries
        grads.append([x.grad for x in xs])
    for got, expected in zip(*grads, strict=True):
        assert rel_err(got, expected) < 1e-10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n", [SHORT, LONG])
def test_returns_the_input_dtype(n, dtype):
    q, k, v = qkv(n, dtype=dtype)
    for causal in (False, True):
        out = build("local", window=5, causal=causal)(q, k, v)
        assert out.dtype == dtype and out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("window", [0, -1, 2.5, True, "8", None])
def test_bad_window_is_rejected_naming_it_and_the_range(window):
    with pytest.raises(ValueError, match=r"window must be a positive integer \(>= 1\)"):
        build("local", window=window)


def test_default_window_and_repr():
    attn = build("local", causal=True)
    assert attn.window == 64 and "window=64, causal=True" in repr(attn)


@pytest.mark.parametrize("causal", [False, True])
def test_unequal_query_and_key_lengths_are_rejected(causal):
    q, _, _ = qkv(10)
    _, k, v = qkv(14)
    with pytest.raises(ValueError, match=r"as many queries as keys.*q with n=10.*k with m=14"):
        build("local", window=3, causal=causal)(q, k, v)


@pytest.mark.parametrize("causal", [False, True])
def test_featureless_queries_average_the_band(causal):
    # d = 0: every logit is 0, so each row is the plain mean of the values in its band
    q, k, v = qkv(SHORT, d=0, d_v=3)
    out = build("local", window=4, causal=causal)(q, k, v)
    zeros = torch.zeros(1, 1, SHORT, 1, dtype=torch.float64)  # logits 0 (d = 0 would be 0 / 0)
    torch.testing.assert_close(out, reference(zeros, zeros, v, 4, causal))
