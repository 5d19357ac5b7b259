"""Every registered attention method: shapes, references, guards, bad input."""

import os

import pytest
import torch

from rpka import numerics
from rpka.attention import REGISTRY, build, options_of


def qkv(b=2, h=3, n=24, d=8, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) * scale for _ in range(3)]


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def reference(q, k, v):
    """Softmax attention written out, independent of SDPA."""
    w = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return w @ v


def test_exact_matches_written_out_softmax():
    q, k, v = qkv()
    assert rel_err(build("exact")(q, k, v), reference(q, k, v)) < 1e-12


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
@pytest.mark.parametrize("pivot_rule", ["rpc", "greedy", "uniform"])
def test_rpka_full_rank_equals_exact(pivot_set, pivot_rule):
    q, k, v = qkv(n=20)
    attn = build(
        "rpka",
        rank=40,
        pivot_set=pivot_set,
        pivot_rule=pivot_rule,
        generator=torch.Generator().manual_seed(0),
    )
    assert rel_err(attn(q, k, v), reference(q, k, v)) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [2.0, 3.0])
def test_full_rank_exact_for_larger_query_norms(scale, dtype):
    # |q~|^2 ~ 16-36 here: the exact denominator carries a factor ~e^{-|q~|^2/2}, which a
    # floor tied to sum_j w_j used to mistake for cancellation (output error ~1)
    q, k, v = qkv(b=1, h=2, n=48, d=16, dtype=dtype, scale=scale, seed=3)
    attn = build("rpka", rank=96, generator=torch.Generator().manual_seed(0))
    out = attn(q, k.to(dtype), v)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert rel_err(out.double(), reference(q.double(), k.double(), v.double())) < tol
    assert attn.guard_counts["denominator"] == 0


def test_rank_above_points_is_capped_to_exact():
    q, k, v = qkv(n=10)
    out = build("rpka", rank=1000)(q, k, v)  # 20 joint points: capped at 20
    assert rel_err(out, reference(q, k, v)) <= 1e-6


def test_rpka_error_shrinks_with_rank():
    q, k, v = qkv(b=1, h=2, n=128, d=16, dtype=torch.float32)
    ref = reference(q, k, v)
    errs = [
        rel_err(build("rpka", rank=r, generator=torch.Generator().manual_seed(1))(q, k, v), ref)
        for r in (8, 64, 256)
    ]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-4


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_shapes_and_dtype(name):
    q, k, v = qkv(dtype=torch.float32)
    out = build(name)(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_finite_and_in_range(name, dtype):
    q, k, v = qkv(dtype=torch.float32, n=64, d=16)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    out = build(name)(q, k, v).float()
    assert torch.isfinite(out).all()
    vf = v.float()
    assert (out >= vf.amin(-2, keepdim=True) - 1e-2).all()
    assert (out <= vf.amax(-2, keepdim=True) + 1e-2).all()


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
@pytest.mark.parametrize("weighting", ["gauss", "exp", "tempered"])
def test_huge_norms_finite_in_range_with_finite_grads(pivot_set, weighting):
    q, k, v = qkv(dtype=torch.float32, n=48, d=16, scale=30.0)
    for x in (q, k, v):
        x.requires_grad_(True)
    attn = build("rpka", rank=16, pivot_set=pivot_set, weighting=weighting)
    out = attn(q, k, v)
    assert torch.isfinite(out).all()
    assert (out >= v.amin(-2, keepdim=True)).all() and (out <= v.amax(-2, keepdim=True)).all()
    out.square().mean().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    counts = attn.guard_counts
    assert counts["rows"] == 2 * 3 * 48 and counts["entries"] == 2 * 3 * 48 * 16


def test_gradients_finite_and_match_exact_at_full_rank():
    q, k, v = qkv(n=12, d=4)
    grads = []
    for attn in (build("exact"), build("rpka", rank=24)):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        attn(*xs).sin().sum().backward()
        grads.append([x.grad for x in xs])
    for g_exact, g_rpka in zip(*grads, strict=True):
        assert rel_err(g_rpka, g_exact) < 1e-5


def test_guards_fire_and_are_counted():
    # 4 landmarks for spread-out points in d = 2: the Nystrom weights turn negative and the
    # guards must act (one landmark cannot: its estimate is a positive weighted average)
    q, k, v = qkv(b=1, h=1, n=200, d=2, dtype=torch.float32, scale=4.0, seed=5)
    attn = build("rpka", rank=4, pivot_set="keys", generator=torch.Generator().manual_seed(0))
    out = attn(q, k, v)
    counts = attn.guard_counts
    assert set(counts) == {"denominator", "rows", "clamped", "entries"}
    assert counts["denominator"] + counts["clamped"] > 0
    assert (out >= v.amin(-2, keepdim=True)).all() and (out <= v.amax(-2, keepdim=True)).all()


def test_same_generator_seed_bit_identical_outputs():
    q, k, v = qkv(dtype=torch.float32, n=64)
    outs = [
        build("rpka", rank=8, generator=torch.Generator().manual_seed(5))(q, k, v) for _ in range(2)
    ]
    assert torch.equal(outs[0], outs[1])
    other = build("rpka", rank=8, generator=torch.Generator().manual_seed(6))(q, k, v)
    assert not torch.equal(outs[0], other)


def test_unknown_method_lists_valid_names():
    with pytest.raises(ValueError, match="unknown attention method 'softmax'.*exact.*rpka"):
        build("softmax")


def test_unknown_option_lists_valid_options():
    with pytest.raises(ValueError, match="unknown option.*'ranks'.*valid.*'rank'"):
        build("rpka", ranks=4)
    assert "rank" in options_of("rpka")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rank": 0}, "rank"),
        ({"rank": -1}, "rank"),
        ({"pivot_rule": "best"}, "pivot_rule"),
        ({"pivot_set": "queries"}, "pivot_set"),
        ({"weighting": "cosine"}, "weighting"),
        ({"den_floor": 0.0}, "den_floor"),
        ({"generator": 3}, "generator"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        build("rpka", **options)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_bad_inputs_name_the_parameter(name):
    attn = build(name)
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match="q must have shape"):
        attn(q[0], k, v)
    with pytest.raises(ValueError, match="q and k must share d"):
        attn(q[..., :4], k, v)
    with pytest.raises(ValueError, match="k and v must share"):
        attn(q, k, v[..., :5, :])
    with pytest.raises(ValueError, match="share \\(B, H\\)"):
        attn(q, k[:1], v[:1])
    bad = q.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="q contains non-finite"):
        attn(bad, k, v)
    bad = k.clone()
    bad[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="k contains non-finite"):
        attn(q, bad, v)


# float32 only: float64 keeps the old single chunk (rpka.attention.nystrom_chunked: pinned
# numerics, MKL's float64 GEMM rounds differently with the chunk's row count)
@pytest.mark.parametrize("dtype", [torch.float32])
def test_inference_chunks_are_bitwise_the_old_single_chunk(monkeypatch, dtype):
    """Issue 39: the chunked (inference) estimate streams in the training path's cache-sized
    chunks on a CPU; at 2,048 tokens, B*H = 8, d = 64 the old 32 MiB budget held the whole
    sequence in one chunk and the new one splits it, with the same output bits."""
    from rpka.attention import pivot_state
    from rpka.attention.pivot_state import FAST, chunk_bounds

    n, rank = 2048, 64
    row_bytes = 8 * (rank + 1) * torch.finfo(dtype).bits // 8
    assert len(chunk_bounds(n, row_bytes, FAST.chunk_bytes)) == 1
    small = pivot_state.inference_chunk_bytes(torch.device("cpu"))
    assert len(chunk_bounds(n, row_bytes, small)) > 1
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, n, 64, generator=g, dtype=dtype) for _ in range(3))

    def forward() -> torch.Tensor:
        attn = build(
            "rpka", rank=rank, generator=torch.Generator().manual_seed(11), key_precision="float64"
        )
        with torch.no_grad():
            return attn(q, k, v)

    new = forward()
    monkeypatch.setitem(pivot_state.STREAM_BYTES, "cpu", FAST.chunk_bytes)
    if os.environ.get("MKL_CBWR") == numerics.MKL_BRANCH_ELSEWHERE:
        # MKL's COMPATIBLE branch (pinned numerics on a non-Intel CPU) rounds a float32 GEMM
        # by its row count too: measured on an AMD EPYC, 0.3 % of outputs move by <= 1.4e-7
        torch.testing.assert_close(forward(), new, rtol=0, atol=1e-6)
    else:
        assert torch.equal(forward(), new)


def _duplicated_keys(std: float, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v (1, 2, 48, 16) float32 with logit std ``std``, each key (and value) repeated
    4 times: 12 distinct keys, so rank 60 of the 96 joint points spans every point and the
    estimator (not the full-rank exact path) is exact in exact arithmetic."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 48, 16, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = (x[..., :12, :].repeat_interleave(4, -2) for x in (k, v))
    return tuple(x.float() for x in (q * std**0.5, k * std**0.5, v))


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("std", [1.0, 4.0, 25.0, 36.0])
@pytest.mark.parametrize("key_precision", ["auto", "float64"])
def test_the_key_side_in_float32_keeps_exactness_where_the_logits_allow(
    std, key_precision, grad
):
    """Issue 39: ``key_precision="auto"`` keeps the key side in float32 while the logit
    references stay within KEY_LOGIT_LIMIT and widens past it, on the inference path and
    the (streamed) training path. Forced to float32 these inputs read 4e-4 (std 25) and
    1e-1 (std 36) relative error against the float64 softmax; both precisions must stay at
    float32 round-off here."""
    q, k, v = (x.requires_grad_(grad) for x in _duplicated_keys(std, seed=1))
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 4, -1) @ v.double()
    attn = build("rpka", rank=60, generator=torch.Generator().manual_seed(1),
                 key_precision=key_precision)  # fmt: skip
    with torch.set_grad_enabled(grad):
        out = attn(q, k, v)
    assert float((out.detach().double() - ref.detach()).norm() / ref.detach().norm()) < 5e-6


def test_the_training_path_key_side_in_float32_gives_float64s_gradients():
    """On moderate logits the streamed training path's float32 key side (``auto``) gives
    the float64 key side's output and gradients up to float32 round-off."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 2, 256, 16, generator=g) for _ in range(3))
    results = {}
    for precision in ("auto", "float64"):
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        attn = build("rpka", rank=16, generator=torch.Generator().manual_seed(2),
                     key_precision=precision)  # fmt: skip
        out = attn(*inputs)
        out.backward(torch.ones_like(out))
        results[precision] = [out.detach(), *(x.grad for x in inputs)]
    for auto, wide in zip(results["auto"], results["float64"], strict=True):
        torch.testing.assert_close(auto, wide, rtol=1e-4, atol=1e-5)


def test_auto_key_precision_computes_moderate_logits_in_float32(monkeypatch):
    """The fast path is taken where it is safe (and only there), and it reads as float64's
    estimate up to float32 round-off."""
    from rpka.attention import nystrom_chunked

    taken = []
    original = nystrom_chunked._streamed_key_moments
    def spy(*args):  # noqa: E306
        taken.append(args[-1])
        return original(*args)
    monkeypatch.setattr(nystrom_chunked, "_streamed_key_moments", spy)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 512, 32, generator=g) for _ in range(3))
    outs = {}
    for precision in ("auto", "float64"):
        attn = build("rpka", rank=32, generator=torch.Generator().manual_seed(4),
                     key_precision=precision)  # fmt: skip
        with torch.no_grad():
            outs[precision] = attn(q, k, v)
    assert taken == [torch.float32, torch.float64]
    torch.testing.assert_close(outs["auto"], outs["float64"], rtol=1e-5, atol=1e-5)
    taken.clear()
    q36, k36, v36 = _duplicated_keys(36.0, seed=1)
    with torch.no_grad():
        build("rpka", rank=60, generator=torch.Generator().manual_seed(1))(q36, k36, v36)
    assert taken[-1] == torch.float64  # sharp: widened


def test_bad_key_precision_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="key_precision must be one of"):
        build("rpka", key_precision="float16")


def test_models_run_the_numerics_the_committed_studies_ran():
    """rpka.model pins the float64 key side (STUDY_NUMERICS) for every method that has it."""
    from rpka.model import ModelConfig, TransformerTiny

    config = ModelConfig(d_model=8, n_layers=1, n_heads=1, d_ff=16)
    for method in ("rpka", "nystrom-uniform"):
        model = TransformerTiny(config, 40, 6, [3], method=method, options={"rank": 4})
        assert {m.key_precision for m in model.modules() if hasattr(m, "key_precision")} == {
            "float64"
        }


def test_finite_inputs_whose_sum_overflows_are_accepted():
    """Issue 39: the finiteness check sums first; a sum that overflows on finite entries
    falls back to the element-wise test, which accepts them, and a nan is still refused."""
    from rpka.attention.options import all_finite

    big = torch.full((1, 1, 8, 4), 3e38)
    assert not torch.isfinite(big.sum()) and all_finite(big)
    big[0, 0, 3, 1] = float("nan")
    assert not all_finite(big)
    assert all_finite(torch.empty(0))


@pytest.mark.parametrize("qk_balance", [True, False])
def test_the_inference_path_checks_its_inputs_off_its_frame(qk_balance):
    """Issue 39: RPKA's chunked inference path reads the check of q and k off its frame's
    reductions (largest query norm, key mean) - the same refusals, in q, k, v order, before
    the pivot draw (the generator untouched), and finite inputs whose norms overflow pass."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 64, 8, generator=g) for _ in range(3))
    attn = build("rpka", rank=8, qk_balance=qk_balance, generator=torch.Generator().manual_seed(0))
    state = attn.generator.get_state()
    with torch.no_grad():
        assert attn.checks_finite_itself(q, k, v)
        for name, value in [("q", float("nan")), ("k", float("-inf")), ("v", float("nan"))]:
            bad = {"q": q, "k": k, "v": v}
            bad[name] = bad[name].clone()
            bad[name][0, 1, 5, 2] = value
            bad["v"] = bad["v"] if name == "v" else bad["v"].clone().fill_(float("inf"))
            with pytest.raises(ValueError, match=f"{name} contains non-finite"):
                attn(bad["q"], bad["k"], bad["v"])
        assert torch.equal(attn.generator.get_state(), state)
        huge = q.clone()
        huge[0, 0, 0, 0] = 3e38  # its row norm overflows to inf; the entry is finite
        assert torch.isfinite(attn(huge, k, v)).all()
    assert not attn.checks_finite_itself(q.requires_grad_(), k, v)  # forward checks then
