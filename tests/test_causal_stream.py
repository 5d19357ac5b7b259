"""Issue 55: the streamed inference path of causal RPKA (``rpka.attention.causal_stream``)
against the written-out reference (``causal.causal_forward`` with gradients' ops), its value
range against ``torch.cummin`` / ``torch.cummax``, its chunks against the blocks."""

import pytest
import torch

from rpka.attention import build, causal, causal_layout
from rpka.attention.causal_layout import Stream, block_ranges, exact_range
from rpka.attention.causal_local import fused_local


def stream_of(n, block, d=4, bh=3, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(bh, n, d, generator=g) * scale for _ in range(3))
    return Stream(q, k, v, d**-0.25, block, (k[:, :block] * d**-0.25).mean(-2, keepdim=True))


@pytest.mark.parametrize(("n", "block"), [(64, 16), (70, 16), (9, 4), (5, 8)])
def test_block_start_ranges_are_the_running_range_at_each_block_start(n, block):
    s = stream_of(n, block)
    low, high = block_ranges(s)
    starts = torch.arange(0, n, block)
    assert torch.equal(low, torch.cummin(s.v, 1).values[:, starts])
    assert torch.equal(high, torch.cummax(s.v, 1).values[:, starts])


@pytest.mark.parametrize(
    ("n", "block", "start", "stop"), [(64, 16, 1, 3), (70, 16, 2, 5), (9, 4, 0, 3)]
)
def test_exact_range_is_cummin_and_cummax(n, block, start, stop):
    s = stream_of(n, block, seed=1)
    low, high = exact_range(s, start, stop)
    rows = s.rows(start, stop)
    assert torch.equal(low, torch.cummin(s.v, 1).values[:, rows])
    assert torch.equal(high, torch.cummax(s.v, 1).values[:, rows])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("n", "block", "start", "stop"),
    [(64, 16, 1, 3), (70, 16, 2, 5), (70, 16, 4, 5), (9, 4, 0, 3), (40, 8, 0, 5)],
)
def test_running_range_from_block_start_ranges_is_cummin_and_cummax(n, block, start, stop, dtype):
    """Carried in from the range at each block's first row - by torch's cummin / cummax, and
    by the compiled pass, which also counts the outputs outside it - the running range is
    the same bit for bit (partial last blocks and block 0 included), and so is the count."""
    s = stream_of(n, block, seed=2)
    s.v = s.v.to(dtype)
    bounds = block_ranges(s)
    rows = s.rows(start, stop)
    low_ref, high_ref = torch.cummin(s.v, 1).values[:, rows], torch.cummax(s.v, 1).values[:, rows]
    low, high = exact_range(s, start, stop, bounds)
    assert torch.equal(low, low_ref) and torch.equal(high, high_ref)
    out = torch.randn(low.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    out = out.clamp(low, high)  # inside, but for a few entries pushed out of either side
    out[0, -1, 0], out[-1, 0, -1] = high_ref[0, -1, 0] + 1e-3, low_ref[-1, 0, -1] - 1e-3
    expected = int(((out < low_ref) | (out > high_ref)).sum())
    if not causal_layout.compiled_range(s, out):
        pytest.skip("numba is not installed")
    low, high, outside = causal_layout.range_outside(s, start, stop, bounds, out)
    assert torch.equal(low, low_ref) and torch.equal(high, high_ref)
    assert outside == expected == 2


@pytest.mark.parametrize(
    ("n", "block", "dtype"),
    [(1024, 256, torch.float32), (1100, 256, torch.float32), (640, 128, torch.float64),
     (300, 96, torch.float32), (512, 64, torch.float32)],
)  # fmt: skip
def test_local_part_in_sub_blocks_is_causal_softmax_inside_each_block(n, block, dtype):
    """The sub-blocks of :func:`causal_tiles` (keys up to their own end, the diagonal part
    masked) against exact causal softmax per block: out and log-sum-exp; a partial last
    block and a block that is no multiple of the sub-block included."""
    s = stream_of(n, block, d=64, bh=2, seed=4)
    s = Stream(*(x.to(dtype) for x in (s.q, s.k, s.v)), s.scale, block, s.centre.to(dtype))
    out, lse = fused_local(s.q, s.k, s.v, s.block, s.scale, causal_layout.STREAM_CHUNK_BYTES)
    for start in range(0, n, block):
        rows = slice(start, min(start + block, n))
        scores = s.q[:, rows] @ s.k[:, rows].mT * s.scale**2
        size = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(size, size, dtype=torch.bool).triu(1), -torch.inf)
        tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {}
        torch.testing.assert_close(out[:, rows], scores.softmax(-1) @ s.v[:, rows], **tol)
        torch.testing.assert_close(lse[:, rows, 0], scores.logsumexp(-1), **tol)


def test_local_sub_blocks_give_the_single_calls_result():
    """Splitting a block into sub-blocks only skips masked products: against one call of the
    kernel per block, the same values to round-off (~6e-7 absolute here: the kernel sums the
    key splits in another order)."""
    s = stream_of(2048, 256, d=64, bh=4, seed=5)
    out, lse = fused_local(s.q, s.k, s.v, s.block, s.scale, causal_layout.STREAM_CHUNK_BYTES)
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    parts = [x.reshape(-1, 1, 256, 64) for x in (s.q, s.k, s.v)]
    one_out, one_lse = kernel(*parts, 0.0, True, scale=s.scale**2)[:2]
    torch.testing.assert_close(out, one_out.view(4, 2048, 64), rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(lse, one_lse.view(4, 2048, 1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("n", "block", "width"), [(4096, 256, 64), (4100, 256, 64), (300, 16, 8)])
def test_chunks_cover_each_block_once_with_a_partial_last_block_alone(n, block, width):
    s = stream_of(n, block, d=64, bh=8)
    blocks = -(-n // block)
    chunks = s.chunks(1, blocks, width)
    covered = [c for c0, c1 in chunks for c in range(c0, c1)]
    assert covered == list(range(1, blocks))
    if n % block:
        assert chunks[-1] == (blocks - 1, blocks)
    per_block = 8 * block * width * 4
    assert all(
        (c1 - c0) * per_block <= max(causal_layout.STREAM_CHUNK_BYTES, per_block)
        for c0, c1 in chunks
    )


def causal_rpka(rank, block, **kw):
    g = torch.Generator().manual_seed(0)
    return build("rpka", rank=rank, causal=True, causal_block=block, generator=g, **kw)


@pytest.mark.parametrize(("n", "block", "rank", "scale"), [(300, 16, 16, 2.0), (300, 16, 8, 3.0)])
def test_guards_firing_on_the_streamed_path_match_the_reference(monkeypatch, n, block, rank, scale):
    # sharp inputs: the value-range guard fires, so blocks fail the block-start test and take
    # the exact running range; the denominator guard fires too
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) * scale for _ in range(3))
    with torch.no_grad():
        monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
        stream_attn = causal_rpka(rank, block, key_precision="float64")
        streamed = stream_attn(q, k, v)
        monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 10**9)
        ref_attn = causal_rpka(rank, block, key_precision="float64")
        ref = ref_attn(q, k, v)
    counts, ref_counts = stream_attn.guard_counts, ref_attn.guard_counts
    assert ref_counts["clamped"] > 0
    assert counts["rows"] == ref_counts["rows"] and counts["entries"] == ref_counts["entries"]
    assert counts["clamped"] == pytest.approx(ref_counts["clamped"], rel=0.02)
    assert counts["denominator"] == pytest.approx(ref_counts["denominator"], rel=0.05, abs=2)
    assert ((streamed - ref).norm() / ref.norm()).item() < 1e-4
    lo, hi = torch.cummin(v, -2).values, torch.cummax(v, -2).values
    assert ((streamed >= lo) & (streamed <= hi)).all()  # guard 3 holds on every entry


@pytest.mark.parametrize("offset", [0.0, 10.0])
def test_streamed_key_moments_on_raw_keys_hold_with_a_large_common_key_offset(offset):
    # keys far from the origin (a common offset ~5x their spread, as decoders' keys often
    # have) must not cost the float32 key side its accuracy against the float64 one: the key
    # moments read the keys centred on block 0's mean (folding the centre into the
    # landmarks' bias instead measured 1.3e-6 / 2.4e-6 / 7.3e-6 at offsets 0 / 10 / 30,
    # against 1.8e-6 / 2.0e-6 / 2.6e-6 centred, and no faster; docs/speed.md)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 1100, 32, generator=g) * 2 for _ in range(3))
    k = k + offset * torch.randn(32, generator=g)
    with torch.no_grad():
        narrow = causal_rpka(16, 64, key_precision="auto")(q, k, v)
        wide = causal_rpka(16, 64, key_precision="float64")(q, k, v)
    assert ((narrow - wide).abs().max() / wide.abs().max()).item() < 2e-5


def test_streamed_path_takes_raw_inputs_and_needs_no_scaled_copy():
    # attend passes q, k, v as they are (scale d^-1/4 folded in); causal_forward passes the
    # scaled ones with scale 1: the same estimate to round-off, the same draws
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 1100, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        out = causal_rpka(16, 64)(q, k, v)
        sampler = causal.sampler_of(causal_rpka(16, 64))
        via_forward = causal.causal_forward(*causal.scaled(q, k, v), 64, sampler, 1e-6, "auto")[0]
    assert ((out - via_forward).norm() / out.norm()).item() < 1e-5


def test_streamed_path_on_heads_split_off_a_projection_is_the_contiguous_result():
    # a decoder passes q, k, v as strided views of one (B, n, 3 H d) projection; the stream
    # copies them once: the same draws and output, bit for bit, as on contiguous inputs
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 1100, 3 * 2 * 16, generator=g)
    q, k, v = (t.view(2, 1100, 2, 16).transpose(1, 2) for t in x.split(32, dim=-1))
    assert not q.is_contiguous()
    with torch.no_grad():
        strided = causal_rpka(16, 64)(q, k, v)
        contiguous = causal_rpka(16, 64)(*(t.contiguous() for t in (q, k, v)))
    assert torch.equal(strided, contiguous)


# ----------------------------------------------------------------------------- training path


def test_flash_local_gradients_pass_gradcheck_in_float64():
    from rpka.attention.causal_blocks import flash_local

    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    xs = [x.requires_grad_(True) for x in xs]
    assert torch.autograd.gradcheck(flash_local, xs)
    out, lse = flash_local(*xs)  # only the log-sum-exp used: its gradient path alone
    assert torch.autograd.gradcheck(lambda *x: flash_local(*x)[1], xs)
    assert out.shape == xs[2].shape and lse.shape == (*xs[0].shape[:-1], 1)


def grads(xs, attn):
    xs = [x.clone().requires_grad_(True) for x in xs]
    out = attn(*xs)
    out.sin().sum().backward()
    return out.detach(), [x.grad for x in xs], dict(attn.guard_counts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("n", "block", "rank", "pivot_set"),
    [(300, 16, 16, "joint"), (257, 8, 64, "keys"), (130, 64, 8, "joint"), (96, 8, 24, "joint")],
)
def test_flash_training_path_moves_outputs_and_gradients_by_round_off(
    monkeypatch, n, block, rank, pivot_set, dtype
):
    # (96, 8, 24): block 1 has an exact past (written out beside the flash parts)
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(2, 2, n, 16, generator=g, dtype=dtype) * 1.5 for _ in range(3)]
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    flash = grads(xs, causal_rpka(rank, block, pivot_set=pivot_set))
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 10**9)
    ref = grads(xs, causal_rpka(rank, block, pivot_set=pivot_set))
    tol = {torch.float32: 2e-5, torch.float64: 1e-12}[dtype]
    for a, b in zip([flash[0], *flash[1]], [ref[0], *ref[1]], strict=True):
        assert ((a - b).norm() / b.norm()).item() < tol
    assert flash[2]["rows"] == ref[2]["rows"]


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_flash_training_path_at_full_rank_has_exact_sdpas_gradients(monkeypatch, pivot_set):
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    g = torch.Generator().manual_seed(8)
    xs = [torch.randn(1, 2, 64, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    out, grad, _ = grads(xs, causal_rpka(2 * 64, 16, pivot_set=pivot_set))
    exact = [x.clone().requires_grad_(True) for x in xs]
    ref = torch.nn.functional.scaled_dot_product_attention(*exact, is_causal=True)
    ref.sin().sum().backward()
    assert ((out - ref.detach()).norm() / ref.norm()).item() < 1e-12
    for a, x in zip(grad, exact, strict=True):
        assert ((a - x.grad).norm() / x.grad.norm()).item() < 1e-11


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_flash_training_path_does_not_leak_through_gradients(monkeypatch, pivot_set):
    # row t's output must not depend on any position after t: its gradient there is exactly 0
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(1, 2, 80, 8, generator=g).requires_grad_(True) for _ in range(3)]
    for t in (0, 7, 8, 33, 64, 79):
        for x in xs:
            x.grad = None
        out = causal_rpka(8, 8, pivot_set=pivot_set)(*xs)
        out[..., t, :].sum().backward()
        for x in xs:
            assert torch.count_nonzero(x.grad[..., t + 1 :, :]) == 0, t
        assert torch.count_nonzero(xs[2].grad[..., : t + 1, :]) > 0


@pytest.mark.parametrize("bad", ["q", "k", "v"])
def test_streamed_path_refuses_non_finite_inputs_by_name_on_its_copy(monkeypatch, bad):
    # the check runs on the stream's contiguous copy, so strided heads are checked too
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(1, 70, 3 * 2 * 8, generator=g)
    qkv[0, 33, "qkv".index(bad) * 16 + 9] = float("nan")  # head 1, feature 1 of the bad one
    q, k, v = (t.unflatten(-1, (2, 8)).transpose(1, 2) for t in qkv.split(16, -1))
    with torch.no_grad(), pytest.raises(ValueError, match=f"^{bad} contains non-finite"):
        causal_rpka(8, 16)(q, k, v)


@pytest.mark.parametrize("logit_std", [3.0, 8.0])
def test_the_exponent_floor_changes_no_output_bit_at_sharp_attention(monkeypatch, logit_std):
    """The past terms' exponents are floored at e^-60 (``nystrom.EXP_FLOOR``: torch's exp and
    the products after it leave their fast paths below exp's normal range); the floored terms
    are below the resolution of every sum they join, so the output is the unfloored one bit
    for bit - on inputs sharp enough that many terms fall below the floor."""
    from rpka.attention import causal_stream, nystrom

    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 1100, 64, generator=g) for _ in range(3))
    below, floors = [], dict(nystrom.EXP_FLOOR)
    real = causal_stream.exp_floored_

    def counted(x):
        below.append(int((x < floors[x.dtype]).sum()))
        return real(x)

    monkeypatch.setattr(causal_stream, "exp_floored_", counted)
    with torch.no_grad():
        floored = causal_rpka(64, 256)(q * logit_std, k, v)
        monkeypatch.setattr(nystrom, "EXP_FLOOR", {})  # no floor: exp as it is
        plain = causal_rpka(64, 256)(q * logit_std, k, v)
    assert sum(below) > 1000  # the floor was reached
    assert torch.equal(floored, plain)
