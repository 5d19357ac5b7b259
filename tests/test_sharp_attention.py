"""Sharp attention (issue 13): full rank is exact whatever the logit scale, guards are shares.

At full rank the Nystrom estimate equals softmax attention in exact arithmetic, so every
error here is numerics. The reference is a float64 softmax written below, not the
package's code. Logit std ``s``: q and k ~ N(0, 1) scaled by ``sqrt(s)`` each, so
``q.k / sqrt(d)`` has standard deviation ``s`` (trained retrieval heads: 12-16).

Tolerances. float64: 1e-10. float32: 1e-4 - at logit std 36 the logits are ~100 in size
and float32 rounds each to ~1e-5 absolute, i.e. ~1e-5 relative in every attention
weight (measured maxima: 2e-5 causal, 9e-5 non-causal on repeated keys; exact SDPA in
float32 gets ~4e-7 since it has no key-side cancellation to amplify round-off).
"""

import warnings

import pytest
import torch
from softmax_reference import softmax_attention

from rpka.attention import REGISTRY, build, guards, options_of

N, D = 32, 16
STDS = [1.0, 4.0, 16.0, 36.0]
TOL = {torch.float32: 1e-4, torch.float64: 1e-10}


def sharp_qkv(std, seed=0, n=N, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, D, generator=g, dtype=torch.float64) for _ in range(3))
    return [x.to(dtype) for x in (q * std**0.5, k * std**0.5, v)]


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


def full_rank(name, n=N, **options):
    rank = n if name == "keys-coreset" else 2 * n  # every key (and query) a landmark
    return build(name, rank=rank, generator=torch.Generator().manual_seed(1), **options)


def run(method, q, k, v, grad=False):
    if grad:  # the differentiable path (landmark factor rebuilt), not the chunked one
        return method(q.clone().requires_grad_(True), k, v).detach()
    with torch.no_grad():
        return method(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("std", STDS)
@pytest.mark.parametrize("grad", [False, True])
def test_full_rank_rpka_is_exact_at_any_logit_scale(std, dtype, grad):
    q, k, v = sharp_qkv(std, dtype=dtype)
    out = run(full_rank("rpka"), q, k, v, grad)
    assert out.dtype == dtype
    assert rel_err(out, softmax_attention(q, k, v)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("std", STDS)
def test_full_rank_keys_coreset_is_exact_at_any_logit_scale(std, dtype):
    q, k, v = sharp_qkv(std, dtype=dtype)
    out = run(full_rank("keys-coreset"), q, k, v)
    assert rel_err(out, softmax_attention(q, k, v)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("std", STDS)
def test_full_rank_causal_forward_and_decoding_are_exact(std, dtype):
    q, k, v = sharp_qkv(std, dtype=dtype)
    ref = softmax_attention(q, k, v, causal=True)
    method = full_rank("rpka", causal=True, causal_block=4)
    method.check_inputs = True
    assert rel_err(run(method, q, k, v), ref) < TOL[dtype]
    assert method.guard_shares["denominator"] == 0.0  # the floor never fires at full rank
    out, state = method.prefill(q[..., :10, :], k[..., :10, :], v[..., :10, :])
    outs = [out]
    for t in range(10, N):
        out, state = method.step(
            q[..., t : t + 1, :], k[..., t : t + 1, :], v[..., t : t + 1, :], state
        )
        outs.append(out)
    assert rel_err(torch.cat(outs, -2), ref) < TOL[dtype]


def repeated_keys(std, dtype, period=None):
    """Each key (and value) 4 times in a row, or (``period``) the whole sequence periodic."""
    q, k, v = sharp_qkv(std, seed=3, dtype=dtype)
    if period is None:
        k, v = (x[..., : N // 4, :].repeat_interleave(4, -2) for x in (k, v))
    else:
        q, k, v = (x[..., :period, :].repeat(1, 1, N // period, 1) for x in (q, k, v))
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("std", [1.0, 16.0, 36.0])
@pytest.mark.parametrize("period", [None, 6])
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_duplicated_and_periodic_tokens_are_exact_at_full_rank(std, dtype, period, pivot_set):
    q, k, v = repeated_keys(std, dtype, period)
    out = run(full_rank("rpka", pivot_set=pivot_set), q, k, v)
    assert rel_err(out, softmax_attention(q, k, v)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("std", [1.0, 16.0, 36.0])
@pytest.mark.parametrize("period", [None, 6])
def test_causal_duplicated_and_periodic_tokens_are_exact_with_key_pivots(std, dtype, period):
    q, k, v = repeated_keys(std, dtype, period)
    method = full_rank("rpka", pivot_set="keys", causal=True, causal_block=4)
    assert rel_err(run(method, q, k, v), softmax_attention(q, k, v, True)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("std", [1.0, 16.0, 36.0])
def test_causal_joint_pivots_on_repeated_sharp_keys(std, dtype):
    """Causal + joint pivots on repeated keys: through eq. (2) a past query's core row is 0 in
    exact arithmetic but the round-off of its own (large) key mass, and a later query near it
    in the kernel reads that noise (measured before the fix: 0.19 at logit std 36, float64).
    At full rank every block's pool fits the rank, so its past is computed exactly."""
    q, k, v = repeated_keys(std, dtype)
    method = full_rank("rpka", causal=True, causal_block=4)
    assert rel_err(run(method, q, k, v), softmax_attention(q, k, v, True)) < TOL[dtype]
    out, state = method.prefill(q[..., :10, :], k[..., :10, :], v[..., :10, :])
    outs = [out]
    for t in range(10, N):
        out, state = method.step(*(x[..., t : t + 1, :] for x in (q, k, v)), state)
        outs.append(out)
    assert state.landmarks is None  # no landmarks drawn: the pool never outgrew the rank
    assert rel_err(torch.cat(outs, -2), softmax_attention(q, k, v, True)) < TOL[dtype]


def retrieval_qkv(scale, dtype, seed=5):
    """A model-free retrieval head: query t is a noisy copy of one earlier key, so each row
    has one dominant key (the logit std is checked by the test)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 2, N, D, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, N, D, generator=g, dtype=torch.float64)
    target = (torch.arange(N) * torch.rand(N, generator=g, dtype=torch.float64)).long()
    q = k[..., target, :] + 0.1 * torch.randn(1, 2, N, D, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q * scale, k * scale, v)], target


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sharp_retrieval_head_is_exact_at_full_rank(dtype):
    (q, k, v), target = retrieval_qkv(scale=3.6, dtype=dtype)
    logits = q.double() @ k.double().transpose(-1, -2) / D**0.5
    causal_logits = logits.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("nan"))
    assert 12 < float(logits.std()) < 16  # as sharp as a trained retrieval head
    top = causal_logits.nan_to_num(float("-inf")).argmax(-1)
    assert (top == target).float().mean() > 0.9  # one dominant key per row
    for causal in (False, True):
        options = {"causal": True, "causal_block": 4} if causal else {}
        out = run(full_rank("rpka", **options), q, k, v)
        assert rel_err(out, softmax_attention(q, k, v, causal)) < TOL[dtype], causal


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("name", "options"),
    [("rpka", {}), ("keys-coreset", {}), ("rpka", {"causal": True, "causal_block": 4})],
)
def test_half_precision_inputs_compute_wide_and_return_their_dtype(name, options, dtype):
    q, k, v = sharp_qkv(16.0, dtype=dtype)
    out = run(full_rank(name, **options), q, k, v)
    assert out.dtype == dtype and torch.isfinite(out).all()
    # exact up to the output's own rounding (2^-8 for bfloat16), against the rounded inputs
    assert rel_err(out, softmax_attention(q, k, v, "causal" in options)) < 1e-2


# ----------------------------------------------------------------------------- guards


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(guards, "_warned", set())  # warnings are once per process


def test_frequent_guard_is_reported_as_a_share_and_warns(fresh_warnings):
    # rank 2 of 96 points at logit std 900: the estimate's denominator goes negative often
    q, k, v = sharp_qkv(900.0, seed=0, n=48, dtype=torch.float32)
    method = build("rpka", rank=2, generator=torch.Generator().manual_seed(0))
    with pytest.warns(RuntimeWarning, match=r"rpka: the 'denominator' guard fired on .*%"):
        method(q, k, v)
    shares, counts = method.guard_shares, method.guard_counts
    assert shares["denominator"] == counts["denominator"] / counts["rows"] > 0.01
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        method(q, k, v)  # once per process: no second warning


def test_benign_inputs_do_not_warn(fresh_warnings):
    q, k, v = sharp_qkv(1.0, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("rpka", "keys-coreset", "nystrom-uniform"):
            method = build(name, rank=16, generator=torch.Generator().manual_seed(0))
            method(q, k, v)
            assert method.guard_shares["denominator"] <= 0.01
        causal = full_rank("rpka", causal=True, causal_block=4)
        causal(q, k, v)
        assert causal.guard_shares == {"denominator": 0.0, "clamped": 0.0}


def test_methods_without_guards_report_no_shares():
    q, k, v = sharp_qkv(1.0)
    method = build("exact")
    method(q, k, v)
    assert method.guard_shares == {}


# ----------------------------------------------------------------------------- API edges


def causal_variants(name):
    variants = [{}]
    try:
        build(name, causal=True)
        variants.append({"causal": True})
    except ValueError:
        pass
    return variants


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("shape", [(0, 2, 5, 4), (2, 2, 0, 4), (2, 2, 5, 0)])
def test_empty_and_featureless_inputs_match_exact_attention(name, shape):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3))
    v = torch.randn(*shape[:-1], 3, generator=g, dtype=torch.float64)  # d_v = 3
    for options in causal_variants(name):
        expected = build("exact", **options)(q, k, v)
        out = build(name, **options)(q, k, v)
        assert out.shape == expected.shape == (*shape[:-1], 3)
        # d = 0: every logit is 0, each row averages the values it sees
        assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_non_numeric_options_are_rejected_at_build_naming_the_option(name):
    numeric = [key for key in ("den_floor", "tempering") if key in options_of(name)]
    for key in numeric:
        with pytest.raises(ValueError, match=rf"{key} must lie in \(0, 1\)"):
            build(name, **{key: "x"})


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_mismatched_devices_or_dtypes_are_rejected(name):
    q, k, v = sharp_qkv(1.0)
    method = build(name)
    with pytest.raises(ValueError, match="one device"):
        method(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="share a dtype"):
        method(q, k.float(), v)
