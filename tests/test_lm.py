"""Track ``lm``: the exact entropy against long-sample estimates, caching, bad arguments."""

from dataclasses import replace

import numpy as np
import pytest

from rpka.tracks.cache import cache_path
from rpka.tracks.lm import build_arrays, load_lm, ngram_baseline_nats
from rpka.tracks.lm_source import MODES, LMConfig, MarkovCopySource, entropy

SMALL = LMConfig(n_train=64, n_val=16, n_test=16, seq_len=192)


def long_sample(config, n_seq=2000, length=512, seed=1):
    source = MarkovCopySource(config)
    tokens, modes = source.sample(n_seq, length, np.random.default_rng(seed))
    return source, tokens, modes


def plug_in_conditional_entropy(keys: np.ndarray, nxt: np.ndarray) -> float:
    """Plug-in estimate of H(next | key) from counts: sum_{s,x} n_sx/N log(n_s / n_sx)."""
    pairs, n_sx = np.unique(np.stack([keys, nxt]), axis=1, return_counts=True)
    _, state_of_pair = np.unique(pairs[0], return_inverse=True)
    n_s = np.bincount(state_of_pair, weights=n_sx)[state_of_pair]
    return float((n_sx / n_sx.sum() * np.log(n_s / n_sx)).sum())


def test_rows_of_the_transition_matrix_share_one_entropy():
    source = MarkovCopySource(LMConfig(order=2))
    assert np.allclose(source.transition.sum(1), 1.0)
    assert np.allclose(entropy(source.transition), source.content_entropy, atol=1e-12)
    assert source.transition.shape == (52**2, 48)


@pytest.mark.parametrize("config", [LMConfig(), LMConfig(order=2, marker_prob=0.1, copy_length=5)])
def test_entropy_rate_from_the_stationary_distribution_matches_closed_form(config):
    source = MarkovCopySource(config)
    p, s = config.marker_prob, config.copy_length
    pi = source.stationary_modes()
    assert np.allclose(pi, [1 / (1 + p * s)] + [p / (1 + p * s)] * s, atol=1e-12)
    h_fresh = (
        -p * np.log(p)
        - (1 - p) * np.log(1 - p)
        + p * np.log(len(config.lags))
        + (1 - p) * source.content_entropy
    )
    assert source.entropy_rate() == pytest.approx(h_fresh / (1 + p * s), rel=1e-12)
    # the per-position expectation (mode chain propagated from t = 0) tends to the rate
    assert source.expected_entropies(3000)[-1] == pytest.approx(source.entropy_rate(), rel=1e-9)
    assert source.floor(config.seq_len) > source.entropy_rate()  # early positions copy less


def test_parsing_the_tokens_recovers_the_modes_of_the_sampler():
    source, tokens, modes = long_sample(LMConfig(), n_seq=200, length=400)
    parsed, _ = source.parse(tokens)
    assert np.array_equal(parsed, modes)
    assert (modes == MODES["copy"]).mean() > 0.15  # copies are frequent enough to matter


def test_plug_in_conditional_entropy_converges_to_the_exact_value():
    # positions after the longest lag: every marker available. The observable state of a
    # position is its context (fresh) or its copy source (copy); counting next tokens per
    # state estimates H(x_t | past) without using the transition matrix.
    config = LMConfig()
    source, tokens, modes = long_sample(config)
    start = max(config.lags)
    _, lags = source.parse(tokens)
    n_ctx = config.n_tokens**config.order
    keys, nxt = [], []
    rows = np.arange(tokens.shape[0])
    for t in range(start, tokens.shape[1]):
        ctx = source.context_index(tokens[:, t - config.order : t])
        copy_source = tokens[rows, t - lags[:, t]]
        keys.append(np.where(modes[:, t] == MODES["copy"], n_ctx + copy_source, ctx))
        nxt.append(tokens[:, t])
    estimate = plug_in_conditional_entropy(np.concatenate(keys), np.concatenate(nxt))
    exact = source.expected_entropies(tokens.shape[1])[start:].mean()
    assert estimate == pytest.approx(exact, abs=0.02)
    assert exact == pytest.approx(source.entropy_rate(), abs=1e-3)  # stationary by then


def test_mean_log_loss_of_the_source_matches_the_exact_floor():
    config = LMConfig()
    source, tokens, _ = long_sample(config, n_seq=1000, length=config.seq_len, seed=2)
    log_probs = source.log_probs(tokens)
    assert np.isfinite(log_probs).all()  # every sampled token is possible
    per_sequence = -log_probs[:, 1:].mean(1)  # sequences are independent
    standard_error = per_sequence.std(ddof=1) / np.sqrt(len(per_sequence))
    assert abs(per_sequence.mean() - source.floor(config.seq_len)) < 4 * standard_error


def test_log_probs_reject_impossible_tokens():
    source, tokens, modes = long_sample(LMConfig(), n_seq=20, length=300)
    row, col = np.argwhere(modes == MODES["copy"])[0]
    broken = tokens.copy()
    broken[row, col] = (broken[row, col] + 1) % 48  # a copy that does not copy
    assert source.log_probs(broken)[row, col] == -np.inf
    early = tokens.copy()
    early[0, 5] = 48  # a marker before its lag allows it
    assert source.log_probs(early)[0, 5] == -np.inf


def test_splits_are_reproducible_and_cached(tmp_path):
    first = load_lm(SMALL, tmp_path)
    path = cache_path(SMALL, tmp_path)
    assert path.exists() and not list(tmp_path.glob(".*.tmp"))
    stamp = path.stat().st_mtime_ns
    again = load_lm(SMALL, tmp_path)
    assert path.stat().st_mtime_ns == stamp  # read from the cache, not rewritten
    fresh = load_lm(SMALL, tmp_path, use_cache=False)
    for name in ("train", "val", "test"):
        assert np.array_equal(first.split(name), again.split(name))
        assert np.array_equal(first.split(name), fresh.split(name))
        assert first.split(name).shape == (getattr(SMALL, f"n_{name}"), SMALL.seq_len)
    assert first.floor_nats == again.floor_nats == fresh.floor_nats
    assert not np.array_equal(first.train, first.val[: len(first.train)])
    other = load_lm(replace(SMALL, seed=1), tmp_path)
    assert not np.array_equal(first.train, other.train)
    assert cache_path(replace(SMALL, seed=1), tmp_path) != path


def test_floor_sits_below_a_model_without_long_context():
    track = load_lm(LMConfig(n_train=512, n_val=16, n_test=256), use_cache=False)
    assert track.floor_perplexity == pytest.approx(np.exp(track.floor_nats))
    assert abs(track.test_optimal_nats - track.floor_nats) < 0.05
    bigram = ngram_baseline_nats(track.train, track.test, track.config.n_tokens, order=1)
    assert bigram > track.floor_nats + 0.3  # copies need context a bigram lacks
    assert (track.train < track.config.n_tokens).all() and (track.train >= 0).all()


def test_lags_given_as_a_list_are_the_same_config():
    assert LMConfig(lags=[16, 32, 64, 128]) == LMConfig()


def test_arrays_are_deterministic_per_seed():
    a, b = build_arrays(SMALL), build_arrays(SMALL)
    assert all(np.array_equal(a[key], b[key]) for key in a)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"vocab_size": 1}, "vocab_size"),
        ({"lags": ()}, "lags"),
        ({"lags": "16"}, "lags"),
        ({"lags": (16, 2.0)}, "lag"),
        ({"lags": (16, 0)}, "lag"),
        ({"copy_length": 0}, "copy_length"),
        ({"marker_prob": 1.0}, "marker_prob"),
        ({"marker_prob": -0.1}, "marker_prob"),
        ({"order": 0}, "order"),
        ({"order": 4}, "order"),
        ({"concentration": 0.0}, "concentration"),
        ({"seq_len": 1}, "seq_len"),
        ({"n_test": 0}, "n_test"),
        ({"seed": -1}, "seed"),
        ({"seq_len": 2.5}, "seq_len"),
    ],
)
def test_bad_arguments_name_the_parameter(changes, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        load_lm(replace(LMConfig(), **changes), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written


def test_bad_split_and_ngram_order():
    track = load_lm(SMALL, use_cache=False)
    with pytest.raises(ValueError, match="split"):
        track.split("dev")
    with pytest.raises(ValueError, match="order"):
        ngram_baseline_nats(track.train, track.test, SMALL.n_tokens, order=5)
