"""rpka.hf: RPKA as a Hugging Face attention implementation (issue 52, item 5). Models are
built from tiny configs with random weights (no downloads), in float64; the reference is
the same model with transformers' own ``attn_implementation="sdpa"``."""

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra: pip install -e .[hf]")

import rpka.hf  # noqa: E402
from rpka.attention import masks  # noqa: E402
from rpka.swap import SwapRefused, swap  # noqa: E402

FULL = 10_000  # above every point count below: full rank
VOCAB, N = 50, 12
PADS = (1, 3, 5)  # tokens of padding per batch element: at most N - 1 kept


def batch(side="left"):
    """Token ids (3, N) and the attention mask of a left- or right-padded batch."""
    ids = torch.randint(1, VOCAB, (len(PADS), N), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(N)[None]
    pads = torch.tensor(PADS)[:, None]
    real = positions >= pads if side == "left" else positions < N - pads
    return ids, real.long()


def gpt2():
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return config, transformers.AutoModelForCausalLM


def llama():  # grouped-query attention: 4 query heads on 2 key-value heads
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return config, transformers.AutoModelForCausalLM


def bert():
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32,
    )  # fmt: skip
    return config, transformers.AutoModel


MODELS = {"gpt2": (gpt2, "left"), "llama": (llama, "left"), "bert": (bert, "right")}


def build(kind, name):
    config, auto = MODELS[kind][0]()
    torch.manual_seed(0)
    return auto.from_config(config, attn_implementation=name).double().eval()


def output(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("kind", list(MODELS))
def test_full_rank_is_the_sdpa_implementation_on_a_padded_batch(kind):
    """Every position, padded ones included (a fully masked row is 0 in both), to float64
    round-off: a rank that reaches the kept keys is exact attention on them."""
    name = rpka.hf.register(f"rpka-test-full-{kind}", rank=FULL, causal_block=4)
    seen = []  # what the attention function receives as the mask: a plan, never L x S
    served = transformers.AttentionInterface._global_mapping[name]

    def spy(module, q, k, v, mask, **kwargs):
        seen.append(type(mask))
        return served(module, q, k, v, mask, **kwargs)

    transformers.AttentionInterface.register(name, spy)
    model = build(kind, name)
    ids, mask = batch(MODELS[kind][1])
    out = output(model, ids, mask)
    assert rpka.hf.registration(name).served == model.config.num_hidden_layers
    assert seen == [masks.PrefixMask] * model.config.num_hidden_layers
    model.set_attn_implementation("sdpa")
    assert (out - output(model, ids, mask)).abs().max() < 1e-10


@pytest.mark.parametrize("kind", list(MODELS))
def test_below_full_rank_the_method_serves_every_call(kind):
    name = rpka.hf.register(f"rpka-test-low-{kind}", rank=4, causal_block=4)
    model = build(kind, name)
    ids, mask = batch(MODELS[kind][1])
    out = output(model, ids, mask)
    served = rpka.hf.registration(name)
    assert (served.served, served.passed) == (model.config.num_hidden_layers, 0)
    model.set_attn_implementation("sdpa")
    real = mask.bool()
    assert (out - output(model, ids, mask))[real].abs().max() > 1e-6


@pytest.mark.parametrize("kind, cache", [("gpt2", None), ("llama", None), ("llama", "static")])
def test_generate_with_left_padding(kind, cache):
    """Prefill (causal + left padding) and every cached decode step (one query on the
    kept keys) are served: at full rank the greedy tokens are sdpa's. A static cache
    prepares the key mask before the forward (create_masks_for_generate)."""
    ids, mask = batch("left")
    args = {"max_new_tokens": 4, "do_sample": False, "cache_implementation": cache}
    tokens = {}
    for rank in (FULL, 4):
        name = rpka.hf.register(f"rpka-test-gen-{kind}-{cache}-{rank}", rank=rank, causal_block=4)
        model = build(kind, name)
        tokens[rank] = model.generate(input_ids=ids, attention_mask=mask, **args)
        # the prefill and 3 decode steps (the 4th token needs no attention), every layer
        assert rpka.hf.registration(name).served == 4 * model.config.num_hidden_layers
    model.set_attn_implementation("sdpa")
    ref = model.generate(input_ids=ids, attention_mask=mask, **args)
    assert torch.equal(tokens[FULL], ref)
    assert tokens[4].shape == ref.shape


def test_a_four_dim_mask_of_the_user_is_read():
    name = rpka.hf.register("rpka-test-4d", rank=FULL, causal_block=4)
    model = build("llama", name)
    ids, mask = batch("left")
    dense = (torch.ones(N, N, dtype=torch.bool).tril() & mask.bool()[:, None, :])[:, None]
    out = output(model, ids, dense)
    model.set_attn_implementation("sdpa")
    assert rpka.hf.registration(name).served == 2
    assert (out - output(model, ids, dense)).abs().max() < 1e-10


def test_what_cannot_be_served_is_refused_in_one_line_or_run_exactly():
    ids, mask = batch("left")
    name = rpka.hf.register("rpka-test-uniform", method="nystrom-uniform", rank=4)
    model = build("gpt2", name)
    with pytest.raises(SwapRefused, match="a causal mask .*nystrom-uniform"):
        output(model, ids, mask)
    name = rpka.hf.register("rpka-test-pass", rank=4, fallback="exact")
    model = build("gpt2", name).train()  # attention dropout 0.1 in training
    torch.manual_seed(1)
    out = model(input_ids=ids, attention_mask=mask).logits
    counts = rpka.hf.registration(name)
    assert (counts.served, counts.passed) == (0, 2) and counts.reasons == {"dropout=0.1": 2}
    model.set_attn_implementation("sdpa")
    torch.manual_seed(1)
    ref = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(out, ref)  # transformers' own SDPA, the same dropout draws


def test_a_padded_encoder_is_served_by_a_non_causal_peer():
    name = rpka.hf.register("rpka-test-coreset", method="keys-coreset", rank=FULL)
    model = build("bert", name)
    ids, mask = batch("right")
    out = output(model, ids, mask)
    model.set_attn_implementation("sdpa")
    assert (out - output(model, ids, mask)).abs().max() < 1e-10


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"name": "sdpa"}, "name must be a new attention implementation"),
        ({"method": "nope"}, "unknown attention method 'nope'"),
        ({"pivot_rul": "rpc"}, "unknown option"),
        ({"rank": 0}, "rank must be a positive integer"),
        ({"fallback": "maybe"}, "fallback must be one of"),
    ],
)
def test_bad_registrations_are_refused_before_any_model_runs(kwargs, error):
    with pytest.raises(ValueError, match=error):
        rpka.hf.register(**{"name": "rpka-test-bad", **kwargs})


def test_importing_rpka_does_not_import_transformers():
    code = "import sys, rpka, rpka.attention, rpka.swap; print('transformers' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_bfloat16_is_computed_in_float32_and_returned_in_bfloat16():
    name = rpka.hf.register("rpka-test-bf16", rank=FULL, causal_block=4)
    model = build("llama", name).to(torch.bfloat16)
    ids, mask = batch("left")
    out = output(model, ids, mask)
    model.set_attn_implementation("sdpa")
    ref = output(model, ids, mask)
    assert out.dtype == torch.bfloat16 and rpka.hf.registration(name).served == 2
    assert (out.float() - ref.float()).abs().max() < 2e-2  # bfloat16's own rounding


@pytest.mark.parametrize("scaling", [None, 16**-0.5, 0.3])
def test_the_modules_scaling_is_the_scale_of_the_softmax(scaling):
    """transformers passes the module's softmax scale; the methods use 1 / sqrt(E) and fold
    the rest into q, or leave q as it is where the rest is 1 (GPT-2's, Llama's)."""
    name = rpka.hf.register("rpka-test-scaling", rank=FULL, causal_block=4)
    module = torch.nn.Module()
    module.is_causal = True
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 16, generator=g, dtype=torch.float64) for _ in range(3))
    attention = rpka.hf.registration(name).attention
    out, _ = attention(module, q, k, v, None, scaling=scaling)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
    assert (out - ref.transpose(1, 2)).abs().max() < 1e-10


def test_a_chunk_of_queries_after_a_cache_is_refused_or_run_exactly():
    """L > 1 queries on a cache (chunked prefill): their prefixes jump, not servable."""
    ids, mask = batch("left")
    config = llama()[0]
    outs = {}
    for fallback in ("error", "exact", "sdpa"):
        name = "sdpa"
        if fallback != "sdpa":
            rank = 4 if fallback == "error" else FULL  # exact: the prefill reproduces sdpa's
            name = rpka.hf.register(f"rpka-test-chunk-{fallback}", rank=rank, fallback=fallback)
        model = build("llama", name)
        cache = transformers.DynamicCache(config=config)
        with torch.no_grad():
            model(input_ids=ids[:, :8], attention_mask=mask[:, :8], cache=cache)
            if fallback == "error":
                with pytest.raises(SwapRefused, match="a chunk of queries after a cache"):
                    model(input_ids=ids[:, 8:], attention_mask=mask, cache=cache)
                continue
            outs[fallback] = model(input_ids=ids[:, 8:], attention_mask=mask, cache=cache).logits
    counts = rpka.hf.registration("rpka-test-chunk-exact")
    assert (counts.served, counts.passed) == (2, 2)  # the prefill served, the chunk passed
    # the chunk ran transformers' SDPA on the cache the served (full-rank) prefill left
    assert (outs["exact"] - outs["sdpa"]).abs().max() < 1e-10


@pytest.mark.parametrize("kind", list(MODELS))
def test_the_sdpa_implementation_with_padding_is_served_by_swap(kind):
    """Without registering: transformers' own sdpa masks (bool, L x S) are read by
    rpka.swap and served, prefill and decode; exact at rank N - 1 < S, which reaches the
    at most N - 1 kept keys of every call of the prefill."""
    model = build(kind, "sdpa")
    ids, mask = batch(MODELS[kind][1])
    ref = output(model, ids, mask)
    with swap("rpka", rank=N - 1, causal_block=4) as s:
        out = output(model, ids, mask)
        if kind != "bert":
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    layers = model.config.num_hidden_layers
    assert (s.swapped, s.passed) == ((1 if kind == "bert" else 4) * layers, 0)
    assert (out - ref).abs().max() < 1e-10
