"""Key padding and causal + key padding masks served by the methods (issue 52, item 4):
rpka.attention.masks, directly and through rpka.swap. References: torch SDPA with the same
mask. Full rank means exact: rpka.swap runs a call with rank >= S by SDPA itself, and a
masked call on at most `rank` kept keys by exact attention on them; the methods' own path
on the kept keys is checked through masks.attend at their full rank on the kept points."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rpka.attention import build, masks
from rpka.swap import SwapRefused, swap

SDPA = F.scaled_dot_product_attention
FULL = 10_000  # above every point count below: full rank
EXACT_AT_FULL_RANK = ("rpka", "nystrom-uniform", "keys-coreset")
B, H, N, E = 3, 2, 14, 8
PADS = torch.tensor([1, 3, 6])  # tokens of padding per batch element: at most N - 1 kept
BELOW = N - 1  # below the swap's full rank (S = N), at or above every call's kept keys


def qkv(dtype=torch.float64, lead=(B, H), n=N, s=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*lead, m, E, generator=g, dtype=dtype) for m in (n, s, s))


def real(side="left", n=N):
    """(B, n) bool: the real tokens of a left- or right-padded batch."""
    positions = torch.arange(n)[None]
    if side == "left":
        return positions >= PADS[:, None]
    return positions < n - PADS[:, None]


def kinds(n=N):
    """Every mask kind served, as Hugging Face and torch write them: (B, 1, L or 1, S)."""
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    return {
        "key padding (B,1,1,S)": real()[:, None, None, :],
        "key padding, equal rows (B,1,L,S)": real("right")[:, None, None, :].expand(B, 1, n, n),
        "causal + left padding": (tril & real()[:, None, :])[:, None],
        "causal + right padding": (tril & real("right")[:, None, :])[:, None],
    }


def as_form(mask, form, dtype):
    """bool, or additive with -inf or the dtype's minimum (Hugging Face's fill)."""
    if form == "bool":
        return mask
    hidden = float("-inf") if form == "-inf" else torch.finfo(dtype).min
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, hidden)


CASES = [
    (method, kind, form)
    for method in EXACT_AT_FULL_RANK
    for kind in kinds()
    for form in ("bool", "-inf", "min")
    if method == "rpka" or "causal" not in kind  # the peers have no causal form
]


@pytest.mark.parametrize("method, kind, form", CASES)
def test_full_rank_reproduces_sdpa_with_the_same_mask(method, kind, form):
    """The method on the kept keys (masks.attend), every row - fully masked rows included
    (SDPA's 0, or its uniform mean at the dtype's minimum) - to float64 round-off;
    causal_block 4 < N: the causal estimate runs across blocks."""
    q, k, v = qkv()
    mask = as_form(kinds()[kind], form, q.dtype)
    options = {"causal_block": 4} if method == "rpka" else {}
    forms = {c: build(method, rank=FULL, causal=c, **options) for c in (False, method == "rpka")}
    plan = masks.from_mask(mask, tuple(q.shape), N)
    out = masks.attend(lambda *a: forms[a[3]](*a[:3]), q, k, v, plan)
    assert (out - SDPA(q, k, v, attn_mask=mask)).abs().max() < 1e-12


@pytest.mark.parametrize("method, kind", [(m, kind) for m, kind, form in CASES if form == "bool"])
def test_the_swap_is_exact_where_the_rank_reaches_the_kept_keys(method, kind):
    """Rank N - 1 < S: the swap serves the call, each of its calls on at most N - 1 kept
    keys by exact attention on them (every key a landmark)."""
    q, k, v = qkv()
    mask = kinds()[kind]
    with swap(method, rank=BELOW) as s:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (s.swapped, s.passed) == (1, 0)
    assert (out - SDPA(q, k, v, attn_mask=mask)).abs().max() < 1e-12


@pytest.mark.parametrize("kind", list(kinds()))
def test_below_full_rank_masked_keys_contribute_exactly_zero(kind):
    """Landmarks among the kept keys only: changing the masked keys and values (and the
    queries of fully masked rows) changes nothing, bit for bit, with the same draws; the
    estimate differs from exact attention."""
    q, k, v = qkv()
    mask = kinds()[kind]
    hidden = ~mask.any(-2, keepdim=True).transpose(-1, -2)  # (B, 1, S, 1): masked keys
    k2, v2 = k + 50 * hidden, v - 50 * hidden
    outs = []
    for keys, values in ((k, v), (k2, v2)):
        draws = torch.Generator().manual_seed(3)
        with swap("rpka", rank=6, causal_block=4, generator=draws) as s:
            outs.append(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask))
        assert s.swapped == 1
    assert torch.equal(outs[0], outs[1])
    seeing = mask.any(-1, keepdim=True).expand_as(outs[0])
    ref = SDPA(q, k, v, attn_mask=mask)
    assert (outs[0] - ref)[seeing].abs().max() > 1e-3


def test_fully_masked_rows_get_what_sdpa_returns():
    q, k, v = qkv()
    mask = kinds()["causal + left padding"]
    empty = ~mask.any(-1)  # (B, 1, L)
    assert empty.sum() == PADS.sum()
    with swap("rpka", rank=4, causal_block=4):  # the fill does not depend on the rank
        zero = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        mean = F.scaled_dot_product_attention(q, k, v, attn_mask=as_form(mask, "min", q.dtype))
    rows = empty.expand(B, H, N)
    assert torch.equal(zero[rows], torch.zeros_like(zero[rows]))
    assert torch.allclose(mean[rows], v.mean(-2, keepdim=True).expand_as(mean)[rows])


def test_a_per_head_mask_three_dim_inputs_and_gqa_are_served():
    q, k, v = qkv()
    per_head = torch.stack([real(), real("right")], 1)[:, :, None, :]  # (B, H, 1, S)
    q3, k3, v3 = (x[0] for x in qkv())  # (H, n, E): no batch dim
    g_k, g_v = k[:, :1], v[:, :1]  # one kv head for two query heads
    with swap("keys-coreset", rank=BELOW) as s:
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=per_head)
        b = F.scaled_dot_product_attention(q3, k3, v3, attn_mask=real()[1])
        c = F.scaled_dot_product_attention(q, g_k, g_v, attn_mask=per_head, enable_gqa=True)
    assert s.swapped == 3
    assert torch.allclose(a, SDPA(q, k, v, attn_mask=per_head), atol=1e-12)
    assert torch.allclose(b, SDPA(q3, k3, v3, attn_mask=real()[1]), atol=1e-12)
    ref = SDPA(q, g_k, g_v, attn_mask=per_head, enable_gqa=True)
    assert torch.allclose(c, ref, atol=1e-12)


def test_a_cached_decode_step_with_left_padding_is_key_padding():
    """Hugging Face's decode step: one query, every cached key, the padding masked."""
    q, k, v = qkv(n=1)
    mask = real()[:, None, None, :]
    plan = masks.from_mask(mask, tuple(q.shape), N)
    assert not plan.causal and len(plan.groups) == len(PADS)
    with swap("keys-coreset", rank=BELOW) as s:  # no causal form needed
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert s.swapped == 1 and torch.allclose(out, SDPA(q, k, v, attn_mask=mask), atol=1e-12)


def test_gradients_at_full_rank_are_sdpa_s():
    """RPKA's own path on the kept keys (causal blocks, right-padded rows), differentiated."""
    mask = kinds()["causal + right padding"]
    forms = {c: build("rpka", rank=FULL, causal=c, causal_block=4) for c in (False, True)}
    plan = masks.from_mask(mask, (B, H, N, E), N)
    grads = []
    for attend in ("sdpa", "rpka"):
        q, k, v = (x.requires_grad_() for x in qkv())
        if attend == "sdpa":
            out = SDPA(q, k, v, attn_mask=mask)
        else:
            out = masks.attend(lambda *a: forms[a[3]](*a[:3]), q, k, v, plan)
        out.square().sum().backward()
        grads.append([x.grad for x in (q, k, v)])
    for ours, ref in zip(*grads, strict=True):
        assert torch.allclose(ours, ref, atol=1e-10)


def test_a_padded_torch_encoder_layer_is_served_exactly_where_the_method_is():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    layer = layer.double().train()  # train: the fused fast path does not call SDPA
    x = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    padding = torch.tensor([[False] * 5 + [True], [False] * 4 + [True] * 2])
    with swap("keys-coreset", rank=5) as s:  # below S = 6, at least the kept keys
        out = layer(x, src_key_padding_mask=padding)
    assert (s.swapped, s.passed) == (1, 0)
    assert torch.allclose(out, layer(x, src_key_padding_mask=padding), atol=1e-12)


REFUSED = {
    "a bias": (torch.randn(N, N), "additive bias"),
    "a sliding window": (
        torch.ones(N, N, dtype=torch.bool).tril() & ~torch.ones(N, N, dtype=torch.bool).tril(-4),
        "prefix of the unmasked keys",
    ),
    "a chunk after a cache, padded": (
        (torch.ones(4, N, dtype=torch.bool).tril(N - 4) & real()[:, None, :])[:, None],
        "one key per query",
    ),
    "a mask of another length": (torch.ones(N, N + 1, dtype=torch.bool), "S=14 keys"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_other_masks_are_refused_in_one_line_or_run_exactly(name):
    mask, reason = REFUSED[name]
    q, k, v = qkv(n=mask.shape[-2])
    with pytest.raises(SwapRefused, match=reason), swap("rpka", rank=4):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if name == "a mask of another length":
        return  # SDPA itself rejects it
    with pytest.warns(UserWarning, match="ran exact"), swap("rpka", rank=4, fallback="exact") as s:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert s.passed == 1 and torch.equal(out, SDPA(q, k, v, attn_mask=mask))


def test_a_peer_without_a_causal_form_refuses_causal_padding_naming_the_mask():
    with pytest.raises(SwapRefused, match="attn_mask with a causal part .*keys-coreset"):
        with swap("keys-coreset", rank=4):
            q, k, v = qkv()
            F.scaled_dot_product_attention(q, k, v, attn_mask=kinds()["causal + left padding"])


def test_a_batch_element_with_every_key_masked_gets_sdpa_s_answer():
    q, k, v = qkv()
    keep = real().clone()
    keep[1] = False  # element 1: nothing to attend to
    for form in ("bool", "min"):
        mask = as_form(keep[:, None, None, :], form, q.dtype)
        with swap("rpka", rank=4) as s:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert s.swapped == 1
        ref = SDPA(q, k, v, attn_mask=mask)
        assert torch.allclose(out[1], ref[1], atol=1e-12)  # 0, or the uniform mean
