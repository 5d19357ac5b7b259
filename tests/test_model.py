"""transformer_tiny: shapes for every attention method, causal flag, stacked members."""

import pytest
import torch
import torch.nn.functional as F

from rpka.attention import REGISTRY, options_of
from rpka.model import Block, EnsembleLinear, ModelConfig, TransformerTiny

CFG = ModelConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, embed_kernel=3)
L, H = 24, 6


def options_for(name):
    """A small rank and a seeded generator for the methods that take them."""
    valid = options_of(name)
    options = {"rank": 8} if "rank" in valid else {}
    if "generator" in valid:
        options["generator"] = torch.Generator().manual_seed(0)
    return options


def make(name="exact", seeds=(0, 1), causal=False, config=CFG):
    return TransformerTiny(config, L, H, list(seeds), name, options_for(name), causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_shapes_for_every_method_and_causal_flag(name, causal):
    try:
        model = make(name, causal=causal)
    except ValueError as err:  # a method may not support causal use yet: it must say so
        assert causal and "causal" in str(err)
        pytest.skip(f"{name} does not support causal=True: {err}")
    assert all(block.attention.causal == causal for block in model.blocks)
    x = torch.randn(2, 5, L)
    out = model(x)
    assert out.shape == (2, 5, H) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_causal_block_does_not_leak_the_future():
    block = Block(1, 16, 2, 32, "exact", causal=True)
    x = torch.randn(1, 3, L, 16)
    changed = x.clone()
    changed[:, :, 10:] = torch.randn(1, 3, L - 10, 16)
    torch.testing.assert_close(block(x)[:, :, :10], block(changed)[:, :, :10])
    assert not torch.allclose(block(x)[:, :, 10:], block(changed)[:, :, 10:])


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_attention_inputs_are_what_the_attention_sees(name):
    model = make(name)
    x = torch.randn(2, 3, L)

    def reseed():  # rpka draws pivots: both passes must draw the same ones
        for block in model.blocks:
            if getattr(block.attention, "generator", None) is not None:
                block.attention.generator.manual_seed(0)

    seen = []
    reseed()
    hooks = [
        block.attention.register_forward_hook(lambda m, args, out: seen.append(args))
        for block in model.blocks
    ]
    with torch.no_grad():  # as attention_inputs: the same (inference) attention path
        model(x)
    for hook in hooks:
        hook.remove()
    reseed()
    inputs = model.attention_inputs(x)
    assert len(inputs) == CFG.n_layers
    for (q, k, v), (q2, k2, v2) in zip(inputs, seen, strict=True):
        for t in (q, k, v):
            assert t.shape == (2 * 3, CFG.n_heads, L, CFG.d_model // CFG.n_heads)
        torch.testing.assert_close(q, q2)
        torch.testing.assert_close(k, k2)
        torch.testing.assert_close(v, v2)


def test_members_are_independent_and_initialised_by_their_own_seed():
    pair = make(seeds=(3, 7))
    solo = make(seeds=(7,))
    for p_pair, p_solo in zip(pair.parameters(), solo.parameters(), strict=True):
        torch.testing.assert_close(p_pair[1], p_solo[0])  # member 1 of (3, 7) == member 0 of (7,)
    assert not torch.allclose(pair.embed.weight[0], pair.embed.weight[1])
    x = torch.randn(1, 4, L)
    torch.testing.assert_close(pair(x.expand(2, -1, -1))[1], solo(x)[0], rtol=1e-5, atol=1e-6)
    # a loss on member 0 alone gives member 1 no gradient: members never mix
    pair(x.expand(2, -1, -1))[0].sum().backward()
    for p in pair.parameters():
        assert torch.count_nonzero(p.grad[1]) == 0


def test_ensemble_linear_matches_per_member_linear():
    layer = EnsembleLinear(3, 5, 4)
    g = torch.Generator().manual_seed(0)
    for s in range(3):
        layer.init_member(s, g)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(3, 2, 7, 5)
    out = layer(x)
    for s in range(3):
        want = F.linear(x[s], layer.weight[s].T, layer.bias[s, 0])
        torch.testing.assert_close(out[s], want)


def test_linear_skip_is_optional_and_bad_input_is_rejected():
    no_skip = make(config=ModelConfig(**{**CFG.__dict__, "linear_skip": False}))
    assert no_skip.skip is None and no_skip(torch.randn(2, 1, L)).shape == (2, 1, H)
    with pytest.raises(ValueError, match="x must have shape"):
        make()(torch.randn(3, 1, L))  # 3 members given, 2 in the model
    with pytest.raises(ValueError, match="model.d_model"):
        ModelConfig(d_model=10, n_heads=4).validate()
    with pytest.raises(ValueError, match="model.previous_tokens"):
        make(config=ModelConfig(**{**CFG.__dict__, "previous_tokens": 1}))  # lm/recall only
