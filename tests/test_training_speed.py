"""Issue 16's training fast path: the streamed estimate against the autograd reference, the
opt-in inverse refresh, the plain loop's block noise, and the training-step benchmark."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from rpka.attention import build, guards, streamed
from rpka.attention.accelerated import PointSet, accelerated_pivots, residual_diagonal
from rpka.attention.nystrom import gather_points, nystrom_softmax
from rpka.attention.rpcholesky import GumbelStream, _gumbel
from rpka.attention.streamed import nystrom_softmax_streamed
from rpka.io import read_json

ROOT = Path(__file__).resolve().parents[1]


def qkv(n=40, batch=(3, 2), d=8, std=1.0, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(*batch, n, d, generator=g, dtype=dtype) * std).requires_grad_(True)
        for _ in range(3)
    ]


def output_and_grads(grad_path, inputs, **options):
    q, k, v = (x.detach().clone().requires_grad_(True) for x in inputs)
    attn = build("rpka", generator=torch.Generator().manual_seed(1), grad_path=grad_path, **options)
    out = attn(q, k, v)
    cotangent = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * cotangent).sum().backward()
    return out.detach(), [x.grad for x in (q, k, v)]


@pytest.mark.parametrize(
    "options, std",
    [
        ({"rank": 8}, 1.0),
        ({"rank": 16, "weighting": "exp"}, 1.0),
        ({"rank": 8}, 5.0),
        ({"rank": 8, "pivot_set": "keys"}, 1.0),
        ({"rank": 100}, 1.0),
    ],
)
def test_streamed_is_bitwise_the_autograd_reference_in_float32(options, std):
    """With the reference's float64 key side (``key_precision="auto"`` narrows it on the
    streamed path only: tests/test_attention.py compares the two)."""
    inputs = qkv(std=std)
    options = {**options, "key_precision": "float64"}
    out, grads = output_and_grads("autograd", inputs, **options)
    out_s, grads_s = output_and_grads("streamed", inputs, **options)
    assert torch.equal(out, out_s)
    for a, b in zip(grads, grads_s, strict=True):
        assert torch.equal(a, b)


def test_streamed_in_several_batch_groups_is_the_same_to_round_off(monkeypatch):
    """The group size (a per-device constant, so fixed on a machine) changes only the
    batch size of the readout's products; MKL may round those differently by an ulp
    (seen since the graded core solve; before, these inputs happened to agree bitwise)."""
    inputs = qkv(n=30, batch=(4, 2))
    out, grads = output_and_grads("streamed", inputs, rank=8)
    monkeypatch.setitem(streamed.STREAM_BYTES, "cpu", 1)  # one batch element per group
    out_s, grads_s = output_and_grads("streamed", inputs, rank=8)
    torch.testing.assert_close(out, out_s, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, grads_s, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_streamed_matches_in_float64_and_with_invalid_landmarks():
    """Invalid slots (pivot -1) are masked; float64 agrees to round-off (the gradient sums
    of the landmarks are accumulated in another order)."""
    q, k, v = qkv(n=12, batch=(2,), dtype=torch.float64)
    valid = torch.tensor([[True] * 5 + [False] * 3] * 2)
    results = []
    for estimate in (nystrom_softmax, nystrom_softmax_streamed):
        padding = torch.zeros(2, 3, 8, dtype=torch.float64)
        landmarks = torch.cat([k[:, :5], padding], -2) / 8**0.25
        out, counts = estimate(q / 8**0.25, k / 8**0.25, v, landmarks, valid)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        results.append((out, counts, grads))
    (out, counts, grads), (out_s, counts_s, grads_s) = results
    torch.testing.assert_close(out_s, out, rtol=1e-12, atol=1e-12)
    assert {key: int(c) for key, c in counts.items()} == {
        key: int(c) for key, c in counts_s.items()
    }
    for a, b in zip(grads, grads_s, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_streamed_gradient_against_finite_differences():
    q, k, v = qkv(n=10, batch=(1,), d=4, dtype=torch.float64)
    landmarks_from = torch.tensor([[0, 3, 7, 12, 15]])

    def f(q, k, v):
        points = torch.cat([q, k], -2) / 4**0.25
        landmarks = gather_points(points, landmarks_from)
        return nystrom_softmax_streamed(
            q / 4**0.25, k / 4**0.25, v, landmarks, landmarks_from >= 0
        )[0]

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-6)


def composed_clamp(x, v):
    """The value-hull clamp as composed autograd ops (what ``_ClampToRange`` replaces)."""
    lo, hi = v.amin(-2, keepdim=True), v.amax(-2, keepdim=True)
    return torch.minimum(torch.maximum(x, lo), hi), lo.detach(), hi.detach()


def bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["ties", "outside", "inside"])
def test_clamp_gradients_are_the_composed_ops_bit_for_bit(dtype, case):
    """Forward and both gradients equal autograd on amin/amax/maximum/minimum, bit for bit:
    integer values make ties with the range (half gradients) and tied extremes (spread);
    a second path into v checks that v's gradients add up in the same order."""
    g = torch.Generator().manual_seed({"ties": 0, "outside": 1, "inside": 2}[case])
    if case == "ties":
        x = torch.randint(-5, 6, (4, 12, 5), generator=g).to(dtype)
        v = torch.randint(-3, 4, (4, 10, 5), generator=g).to(dtype)
    else:
        v = torch.randn(4, 10, 5, generator=g, dtype=dtype) * 3
        x = torch.randn(4, 12, 5, generator=g, dtype=dtype) * (4 if case == "outside" else 0.1)
    w = torch.randn(4, 12, 5, generator=g, dtype=dtype)
    w2 = torch.randn(4, 10, 5, generator=g, dtype=dtype)
    results = []
    for clamp in (composed_clamp, guards._ClampToRange.apply):
        xx, vv = x.clone().requires_grad_(True), v.clone().requires_grad_(True)
        out, _, _ = clamp(xx * 1.0, vv)
        ((out * w).sum() + (vv * w2).sum()).backward()
        results.append((out.detach(), xx.grad, vv.grad))
    for ours, composed in zip(results[1], results[0], strict=True):
        assert torch.equal(bits(ours), bits(composed))


@pytest.mark.parametrize("chunk", [1, 2**16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_divide_gradients_are_the_composed_division_bit_for_bit(dtype, chunk, monkeypatch):
    """``guards.divide`` (saves the quotient, not num) gives autograd's own division
    gradients, bit for bit: num a strided view of a wider product, den broadcast along
    the last dim, with signed zeros, tiny and huge denominators, and second paths into both;
    the divisor's gradient in chunks of one row (``chunk=1``) and whole."""
    monkeypatch.setattr(guards, "DIVISOR_CHUNK", chunk)
    g = torch.Generator().manual_seed(3)
    full = torch.randn(3, 40, 9, generator=g, dtype=dtype)
    full[0, :5] = -0.0
    full[1, :5, -1] = torch.tensor([1e-30, -1e-30, 1e30, -3.0, 0.5], dtype=dtype)
    w = torch.randn(3, 40, 8, generator=g, dtype=dtype)
    w[2, :4] = -0.0
    results = []
    for divide in (torch.div, guards.divide):
        leaf = full.clone().requires_grad_(True)
        num, den = leaf[..., :-1], leaf[..., -1:]
        ((divide(num, den) * w).sum() + (num * den).sum()).backward()
        results.append((divide(num, den).detach(), leaf.grad))
    for ours, composed in zip(results[1], results[0], strict=True):
        assert torch.equal(bits(ours), bits(composed))


def test_rpka_gradients_with_firing_guards_are_the_composed_clamps(monkeypatch):
    """Where the hull guard fires (the slow path), RPKA's gradients are those of the
    composed clamp, bit for bit (issue 16: a faster clamp must not move a training run)."""
    q, k, v = qkv(n=200, batch=(1, 1), d=2, std=4.0, seed=5)  # fires on 13 of 400 entries
    runs = []
    for patched in (False, True):
        if patched:
            monkeypatch.setattr(guards._ClampToRange, "apply", composed_clamp)
        out, grads = output_and_grads("streamed", (q, k, v), rank=4, pivot_set="keys")
        runs.append((out, *grads))
    attn = build("rpka", rank=4, pivot_set="keys", generator=torch.Generator().manual_seed(1))
    attn(q.detach(), k.detach(), v.detach())
    assert attn.guard_counts["clamped"] > 0  # the guard fired: the slow path ran
    for ours, composed in zip(*runs, strict=True):
        assert torch.equal(bits(ours), bits(composed))


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="grad_path"):
        build("rpka", grad_path="fast")
    with pytest.raises(ValueError, match="residual_solve"):
        build("rpka", residual_solve="lu")


def test_inverse_refresh_gives_the_same_residuals_to_round_off():
    z = torch.randn(4, 300, 6, generator=torch.Generator().manual_seed(0)) * 0.6
    points = PointSet([z[:, :150], z[:, 150:]])
    state = accelerated_pivots(points, 24, generator=torch.Generator().manual_seed(2))
    reference = residual_diagonal(points, state, "triangular")
    torch.testing.assert_close(
        residual_diagonal(points, state, "inverse"), reference, atol=1e-5, rtol=0
    )
    assert reference.min() >= 0 and reference.max() <= 1


def test_gumbel_stream_draws_the_per_step_numbers():
    like = torch.empty(0)
    stream = GumbelStream(torch.Size([3, 5]), like, torch.Generator().manual_seed(4), steps=7)
    stream.block = 3  # several blocks, the last one partial
    per_step = torch.Generator().manual_seed(4)
    for _ in range(7):
        assert torch.equal(stream.next(), _gumbel(torch.Size([3, 5]), like, per_step))


def test_bench_training_step_tiny_run(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_training_step", ROOT / "scripts" / "bench_training_step.py"
    )
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclass looks its module up
    spec.loader.exec_module(bench)
    out = tmp_path / "training_step.json"
    bench.main(["--tiny", "--arms", "exact", "rpka-r16", "--output", str(out)])
    saved = read_json(out)
    assert saved["tiny"] is True and len(saved["load_average_before"]) == 3
    assert {(r["shape"], r["arm"]) for r in saved["rows"]} == {
        (s, a) for s in ("forecast", "longctx", "lm") for a in ("exact", "rpka-r16")
    }
    for row in saved["rows"]:
        assert row["step_ms"] > 0 and row["step_cpu_ms"] > 0 and row["peak_mib"] > 0
        if row["arm"] == "exact":
            assert row["step_cpu_vs_exact"] == 1.0 and row["peak_vs_exact"] == 1.0
    assert saved["device_type"] == "cpu"
    for repeats in (1, 3):  # each repeat times one step of every arm, interleaved
        bench.main(["--tiny", "--arms", "exact", "rpka-r16", "--repeats", str(repeats),
                    "--contexts", "24", "--output", str(out)])  # fmt: skip
        assert all(len(r["step_cpu_ms_all"]) == repeats for r in read_json(out)["rows"])
    with pytest.raises(SystemExit):
        bench.main(["--tiny", "--repeats", "0", "--output", str(out)])
    if not torch.cuda.is_available():  # the GPU path is refused here, before any work
        with pytest.raises(SystemExit):
            bench.main(["--tiny", "--device", "cuda", "--output", str(tmp_path / "gpu.json")])
        assert not (tmp_path / "gpu.json").exists()
