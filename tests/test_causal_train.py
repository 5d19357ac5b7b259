"""Issue 55: causal RPKA's training path with its backward written out
(``rpka.attention.causal_train``) against the autograd reference (``causal.causal_forward``'s
written-out ops), torch's gradcheck, and the inference path's outputs."""

import pytest
import torch

from rpka.attention import build, causal, causal_train
from rpka.attention.causal_landmarks import LandmarkSampler
from rpka.swap import swap


def causal_rpka(rank, block, **kw):
    g = torch.Generator().manual_seed(0)
    return build("rpka", rank=rank, causal=True, causal_block=block, generator=g, **kw)


def inputs(shape, dtype, scale, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=dtype) * scale for _ in range(3)]


def run(xs, attn, weight_seed=5):
    xs = [x.clone().requires_grad_(True) for x in xs]
    out = attn(*xs)
    g = torch.Generator().manual_seed(weight_seed)
    (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum().backward()
    return out.detach(), [x.grad for x in xs], dict(attn.guard_counts)


def relative(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("n", "block", "rank", "pivot_set", "d", "scale"),
    [
        (300, 16, 16, "joint", 16, 1.5),  # five epochs, a partial last block
        (256, 16, 8, "keys", 16, 1.5),
        (300, 16, 8, "joint", 8, 3.0),  # sharp: both guards fire
        (70, 128, 8, "joint", 16, 1.5),  # one block: exact causal softmax, no epoch
    ],
)
def test_written_out_backward_matches_autograd_on_the_reference_path(
    monkeypatch, n, block, rank, pivot_set, d, scale, dtype
):
    xs = inputs((2, 2, n, d), dtype, scale, seed=3)
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    calls = []
    monkeypatch.setattr(
        causal, "stream_training", lambda *a: calls.append(1) or causal_train.stream_training(*a)
    )
    new = run(xs, causal_rpka(rank, block, pivot_set=pivot_set, key_precision="float64"))
    assert calls  # the written-out backward ran
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 10**9)
    ref = run(xs, causal_rpka(rank, block, pivot_set=pivot_set, key_precision="float64"))
    tol = {torch.float32: 3e-5, torch.float64: 1e-11}[dtype]
    for a, b in zip([new[0], *new[1]], [ref[0], *ref[1]], strict=True):
        assert relative(a, b) < tol
    assert new[2]["rows"] == ref[2]["rows"]
    if scale > 2:
        assert ref[2]["clamped"] > 0 and ref[2]["denominator"] > 0


def test_clamped_entries_pass_their_gradient_to_the_running_extreme(monkeypatch):
    xs = inputs((2, 2, 300, 8), torch.float64, 3.0, seed=3)
    tapes = []
    original = causal_train.Tape

    def recording(*a, **kw):
        tapes.append(original(*a, **kw))
        return tapes[-1]

    monkeypatch.setattr(causal_train, "Tape", recording)
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    new = run(xs, causal_rpka(8, 16, key_precision="float64"))
    assert tapes and tapes[0].clamped  # the guard fired, and its rows took the routing
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 10**9)
    ref = run(xs, causal_rpka(8, 16, key_precision="float64"))
    assert relative(new[1][2], ref[1][2]) < 1e-11


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_written_out_backward_passes_gradcheck(pivot_set):
    sampler = LandmarkSampler(4, "rpc", pivot_set, "gauss", 1.0, torch.Generator())

    def attention(q, k, v):  # the same pivots for every evaluation: a reseeded generator
        sampler.generator.manual_seed(0)
        return causal_train.stream_training(q, k, v, 0.7, 8, sampler, 1e-6, "float64")[0]

    xs = [x.requires_grad_(True) for x in inputs((2, 37, 3), torch.float64, 1.0, seed=11)]
    assert torch.autograd.gradcheck(attention, xs, atol=1e-6)


def test_training_forward_is_the_inference_output_bit_for_bit(monkeypatch):
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    xs = inputs((2, 2, 300, 16), torch.float32, 1.5)
    trained = run(xs, causal_rpka(16, 16))[0]
    with torch.no_grad():
        inferred = causal_rpka(16, 16)(*xs)
    assert torch.equal(trained, inferred)


def test_training_takes_the_written_out_backward_only_where_it_applies(monkeypatch):
    sampler = LandmarkSampler(64, "rpc", "joint", "gauss", 1.0)
    q, k, v = (x.requires_grad_(True) for x in inputs((1, 1, 1024, 8), torch.float32, 1.0))
    takes = causal.takes_stream_training
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1024)
    assert takes(q, k, v, 256, sampler)
    assert not takes(q, k, v, 16, sampler)  # block 1's past (32 points) is exact
    assert not takes(q, k, v[..., :4], 256, sampler)  # d_v != d
    with torch.no_grad():
        assert not takes(q, k, v, 256, sampler)  # inference: the streamed path
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 2048)
    assert not takes(q, k, v, 256, sampler)  # too short


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_written_out_backward_does_not_leak_the_future(monkeypatch, pivot_set):
    # row t's output must not depend on any position after t: its gradient there is exactly 0
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    calls = []
    monkeypatch.setattr(
        causal, "stream_training", lambda *a: calls.append(1) or causal_train.stream_training(*a)
    )
    xs = [x.requires_grad_(True) for x in inputs((1, 2, 80, 8), torch.float32, 1.0, seed=9)]
    for t in (0, 7, 8, 33, 64, 79):
        for x in xs:
            x.grad = None
        causal_rpka(4, 8, pivot_set=pivot_set)(*xs)[..., t, :].sum().backward()
        for x in xs:
            assert torch.count_nonzero(x.grad[..., t + 1 :, :]) == 0, t
        assert torch.count_nonzero(xs[2].grad[..., : t + 1, :]) > 0
    assert len(calls) == 6


def test_a_compiled_decoder_block_trains_through_the_written_out_backward(monkeypatch):
    """torch.compile (aot_eager) around a block that calls SDPA, inside ``rpka.swap``: the
    dispatcher runs eagerly (a graph break), the long causal call takes the written-out
    backward, and the weights' gradients are the eager model's bit for bit."""
    calls = []
    monkeypatch.setattr(
        causal, "stream_training", lambda *a: calls.append(1) or causal_train.stream_training(*a)
    )

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, -1, 3, 2, 8).permute(2, 0, 3, 1, 4)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = Block(), torch.randn(1, causal.FUSED_FROM_POSITIONS + 76, 16)
    grads = []
    for run_model in (model, torch.compile(model, backend="aot_eager")):
        model.zero_grad()
        with swap("rpka", rank=16, generator=torch.Generator().manual_seed(3)) as s:
            run_model(x).square().sum().backward()
        assert s.swapped == 1
        grads.append(model.qkv.weight.grad.clone())
    assert len(calls) == 2 and torch.equal(grads[0], grads[1])


def test_inputs_changed_in_place_after_the_forward_are_refused_at_backward(monkeypatch):
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
    q, k, v = (x.requires_grad_(True) for x in inputs((1, 2, 80, 8), torch.float32, 1.0))
    keys = k * 1.0  # a non-leaf the forward reads, then changed in place
    out = causal_rpka(4, 8)(q, keys, v)
    keys.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
