"""The causal decoder (transformer_tiny in causal mode), its loss and metrics, the lm presets.

References are independent of the code under test: a log-softmax written out in numpy, a
model of one member against a member of a stacked model, the same tokens with the future
replaced.
"""

import dataclasses
import json

import numpy as np
import pytest
import torch

from rpka import paths
from rpka.bench import default_out
from rpka.cli.commands import parse_bench
from rpka.config.bench import BenchConfig
from rpka.config.presets import get_preset
from rpka.kernel.leakage import LeakageConfig, leakage_check
from rpka.model import ModelConfig, TransformerLM
from rpka.study import steps as study
from rpka.tracks import get_task
from rpka.tracks.lm import LMConfig
from rpka.training.train import evaluate

CFG = ModelConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, embed_kernel=1, linear_skip=False)
V, N = 11, 24  # vocabulary, tokens read


def make(method="exact", seeds=(0, 1), config=CFG, **options):
    if method == "rpka":
        options = {"rank": 6, "causal_block": 8, **options}
        options["generator"] = torch.Generator().manual_seed(0)
    return TransformerLM(config, V, N, list(seeds), method, options)


def tokens(batch=3, n=N, seed=0):
    return torch.randint(0, V, (batch, n), generator=torch.Generator().manual_seed(seed))


def reseed(model):
    for module in model.attention_modules():
        if getattr(module, "generator", None) is not None:
            module.generator.manual_seed(0)


def numpy_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target], written out: (S, B, n, V), (B, n) -> (S, B, n)."""
    top = logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    picked = np.take_along_axis(logits, np.broadcast_to(targets, logits.shape[:-1])[..., None], -1)
    return log_z - picked[..., 0]


# ----------------------------------------------------------------------------- the model


@pytest.mark.parametrize("previous_tokens", [0, 2])
@pytest.mark.parametrize("method", ["exact", "rpka"])
def test_logits_up_to_t_ignore_tokens_after_t(method, previous_tokens):
    config = dataclasses.replace(CFG, previous_tokens=previous_tokens)
    model = make(method, config=config).eval()
    x = tokens()
    with torch.no_grad():
        reseed(model)
        base = model(x.expand(2, *x.shape))
        for t in (0, 7, 8, 15, 22):
            changed = x.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + t) % V  # every later token differs
            reseed(model)
            out = model(changed.expand(2, *x.shape))
            assert torch.equal(out[:, :, : t + 1], base[:, :, : t + 1]), t
            # the future did change
            assert not torch.allclose(out[:, :, t + 1 :], base[:, :, t + 1 :])


def test_previous_tokens_embed_the_earlier_tokens():
    """Token t's input is embed(x_t) + position_t + sum_o previous[o](x_{t-o}) (token 0
    before the start): written out with the model's own tables, one offset at a time."""
    model = make(config=dataclasses.replace(CFG, previous_tokens=2))
    x = tokens(batch=2, n=5).expand(2, 2, 5)
    with torch.no_grad():
        got = model.tokens(x)
        for t in range(5):
            want = model.embed.weight[:, x[0, :, t]] + model.position[:, t, None]
            for offset, table in enumerate(model.previous, 1):
                earlier = x[0, :, t - offset] if t >= offset else torch.zeros_like(x[0, :, t])
                want = want + table.weight[:, earlier]
            torch.testing.assert_close(got[:, :, t], want)
    with pytest.raises(ValueError, match="model.previous_tokens"):
        dataclasses.replace(CFG, previous_tokens=-1).validate()


def test_shapes_gradients_and_attention_inputs():
    model = make("rpka")
    x = tokens()
    logits = model(x.expand(2, *x.shape))
    assert logits.shape == (2, 3, N, V) and torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert all(m.causal for m in model.attention_modules())
    inputs = model.attention_inputs(x.expand(2, *x.shape))
    assert len(inputs) == CFG.n_layers
    for q, k, v in inputs:
        assert q.shape == k.shape == v.shape == (2 * 3, CFG.n_heads, N, CFG.d_model // CFG.n_heads)


def test_head_is_tied_to_the_embedding():
    model = make()
    names = {name for name, _ in model.named_parameters()}
    assert "embed.weight" in names and not any(n.startswith("head.") for n in names)


def test_stacked_members_equal_separate_models():
    """Member s of a stacked model is the model of seed s alone (exact attention)."""
    x = tokens()
    pair = make(seeds=(3, 4))(x.expand(2, *x.shape))
    for s, seed in enumerate((3, 4)):
        alone = make(seeds=(seed,))(x.unsqueeze(0))
        torch.testing.assert_close(pair[s], alone[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(pair[0], pair[1])


def test_shorter_inputs_and_bad_inputs():
    model = make()
    assert model(tokens(n=5).unsqueeze(0).expand(2, 3, 5)).shape == (2, 3, 5, V)
    with pytest.raises(ValueError, match="x must be integer tokens"):
        model(torch.zeros(2, 3, N))  # floats
    with pytest.raises(ValueError, match="x must be integer tokens"):
        model(tokens(n=N + 1).unsqueeze(0).expand(2, 3, N + 1))  # longer than max_len
    with pytest.raises(ValueError, match="n_tokens"):
        TransformerLM(CFG, 0, N, [0])
    with pytest.raises(ValueError, match="causal"):
        TransformerLM(CFG, V, N, [0], "performer", {"rank": 4})


# ----------------------------------------------------------------------------- metrics


def test_cross_entropy_and_perplexity_match_numpy():
    task = get_task("lm")
    model = make().eval()
    seqs = tokens(batch=7, n=N + 1, seed=1)
    x, y = seqs[:, :-1], seqs[:, 1:]
    with torch.no_grad():
        logits = model(x.expand(2, *x.shape)).double().numpy()
        loss = task.loss(model(x.expand(2, *x.shape)), y.expand(2, *y.shape))
    nll = numpy_nll(logits, y.numpy())  # (S, B, n)
    expected = nll.mean((1, 2))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)
    # batched evaluation (7 sequences in batches of 3) pools every token of the split
    metrics = evaluate(model, task, x, y, batch_size=3)
    np.testing.assert_allclose(metrics["nll"].numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(metrics["perplexity"].numpy(), np.exp(expected), rtol=1e-6)
    assert task.metrics == ("perplexity", "nll")


def test_forecast_metrics_unchanged_by_the_task_split():
    task = get_task("forecast")
    pred, y = torch.randn(2, 5, 3), torch.randn(5, 3)
    sums = task.error_sums(pred, y)
    metrics = task.finish(sums, y.numel())
    diff = (pred - y).double().numpy()
    np.testing.assert_allclose(metrics["mse"].numpy(), (diff**2).mean((1, 2)))
    np.testing.assert_allclose(metrics["mae"].numpy(), np.abs(diff).mean((1, 2)))
    with pytest.raises(ValueError, match="track must be one of"):
        get_task("no-such-track")


# ----------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name", ["smoke", "quick", "full"])
def test_lm_presets_validate_round_trip_and_copy_through_landmarks(name):
    config = get_preset(name, "lm")
    assert config.track_name == "lm" and config.design.metric == "perplexity"
    assert BenchConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    methods = {a.method for a in config.design.arms}
    assert {"exact", "rpka"} <= methods <= {"exact", "rpka", "mean"}  # "mean": the control
    for arm in config.design.arms:
        if arm.method == "rpka":  # a copied token always lies in an earlier block
            assert min(config.design.track.lags) >= arm.options["causal_block"]
            assert config.design.track.attention_tokens > arm.options["causal_block"]


def test_full_study_has_the_lm_track_with_two_ranks():
    full = get_preset("full", "lm")
    ranks = sorted(a.options["rank"] for a in full.design.arms if a.method == "rpka")
    assert len(ranks) >= 2 and len(full.design.eval_seeds) == 8
    assert default_out(full) == "data/results/full/lm"
    assert default_out(get_preset("full")) == "data/results/full"
    assert paths.bench_dir("full", get_task("lm").out_dir) == "data/results/full/lm"
    labels = [label for label, _, _ in study.compute_steps("full")]
    first = labels.index("bench")  # after 01_train's demo runs and the swap audit
    assert labels[first : first + 2] == ["bench", "bench (lm)"]


def test_lm_preset_overrides_and_errors():
    config = get_preset("smoke", "lm", ranks=[2, 6], track={"seq_len": 17})
    assert [a.name for a in config.design.arms] == ["exact", "mean-attention", "rpka-r2", "rpka-r6"]
    assert all(a.options["causal_block"] == 8 for a in config.design.arms if a.method == "rpka")
    assert isinstance(config.design.track, LMConfig) and config.design.track.seq_len == 17
    with pytest.raises(ValueError, match="track_name"):
        get_preset("smoke", "no-such-track")
    with pytest.raises(ValueError, match="metric"):
        get_preset("smoke", "lm", metric="mse")
    with pytest.raises(ValueError, match="embed_kernel"):
        get_preset("smoke", "lm", model={"embed_kernel": 3})
    peer = dataclasses.replace(
        config.design.arms[2], name="performer-r4", method="performer", options={"rank": 4}
    )
    with pytest.raises(ValueError, match="performer-r4.*track lm"):
        get_preset("smoke", "lm", arms=(config.design.arms[0], peer))
    with pytest.raises(ValueError, match="track.seq_len"):
        get_preset("smoke", "lm", track={"seq_len": 1})


def test_cli_track_lm():
    config, args = parse_bench(["--preset", "smoke", "--track", "lm", "--seeds", "3"])
    assert config.track_name == "lm" and len(config.design.eval_seeds) == 3
    assert not set(config.design.eval_seeds) & set(config.design.sweep_seeds)


# ----------------------------------------------------------------------------- leakage


def test_leakage_table_tells_causal_from_non_causal():
    table = leakage_check(LeakageConfig(n=32, times=(0, 7, 8, 20), batch=1))
    verdicts = table["verdict"].to_dict()
    assert verdicts["exact (is_causal)"] == "causal (bit-identical)"
    assert verdicts["rpka causal (r=8, block=8)"] == "causal (bit-identical)"
    assert verdicts["rpka non-causal (r=8)"] == "leaks"
    assert (table["min |change| of outputs > t"] > 0).all()  # the new future reached outputs
    with pytest.raises(ValueError, match="times"):
        leakage_check(LeakageConfig(n=8, times=(7,)))
