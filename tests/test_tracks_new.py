"""The tracks that need attention (issue 14): forecast-motif, forecast-regimes, recall,
forecast-real - shapes, determinism per seed, each generator's structural property, the
cache, and clear errors for bad configurations."""

import dataclasses

import numpy as np
import pytest

from rpka.tracks.baselines import naive_baselines
from rpka.tracks.cache import cache_path
from rpka.tracks.motif import MotifConfig, load_motif
from rpka.tracks.motif import build_arrays as motif_arrays
from rpka.tracks.real import RealConfig, load_real, load_series, split_bounds
from rpka.tracks.real import build_arrays as real_arrays
from rpka.tracks.recall import IGNORE, RecallConfig, length_factor, load_recall
from rpka.tracks.recall import build_arrays as recall_arrays
from rpka.tracks.regimes import RegimesConfig, load_regimes
from rpka.tracks.regimes import build_arrays as regimes_arrays

MOTIF = MotifConfig(n_train=300, n_val=50, n_test=50)
REGIMES = RegimesConfig(n_train=300, n_val=50, n_test=50)
REGIMES_LONG = RegimesConfig(context=512, n_regimes=16, n_train=40, n_val=10, n_test=10)
RECALL = RecallConfig(
    vocab_size=64, n_pairs=8, n_queries=6, seq_len=64, n_train=200, n_val=20, n_test=20
)
SPLITS = ("train", "val", "test")


def raw_windows(arrays, split):
    """Undo the context standardisation: (N, L + H) in the generator's units."""
    window = np.concatenate([arrays[f"{split}_x"], arrays[f"{split}_y"]], axis=1)
    return window * arrays[f"{split}_std"][:, None] + arrays[f"{split}_mean"][:, None]


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize(
    ("config", "build"),
    [(MOTIF, motif_arrays), (REGIMES, regimes_arrays), (REGIMES_LONG, regimes_arrays)],
)
def test_window_tracks_shapes_determinism_and_standardisation(config, build):
    arrays = build(config)
    for split in SPLITS:
        n = getattr(config, f"n_{split}")
        assert arrays[f"{split}_x"].shape == (n, config.context)
        assert arrays[f"{split}_y"].shape == (n, config.horizon)
        # standardised by the context: mean 0, std 1 per window
        np.testing.assert_allclose(arrays[f"{split}_x"].mean(1), 0, atol=1e-9)
        np.testing.assert_allclose(arrays[f"{split}_x"].std(1), 1, atol=1e-9)
    assert_same(arrays, build(config))  # same seed, same data
    other = build(dataclasses.replace(config, seed=1))
    assert not np.array_equal(other["train_x"], arrays["train_x"])
    # splits come from independent streams: no window repeats across them
    assert not np.isclose(arrays["train_x"][:, :5, None], arrays["test_x"].T[None, :5]).all(1).any()


def test_motif_target_continues_an_earlier_whole_occurrence():
    config = MOTIF
    arrays = motif_arrays(config)
    raw = raw_windows(arrays, "test")
    rows = np.arange(config.n_test)[:, None]
    source = arrays["test_source"]
    assert (source >= 0).all()
    assert (source + config.motif_length <= config.layout_length).all()  # whole, in the context
    c, h, L = config.cue_length, config.horizon, config.context
    earlier = raw[rows, source[:, None] + np.arange(c + h)]  # cue + continuation, earlier
    later = raw[:, L - c : L + h]  # the final cue and the target
    diff = later - earlier
    # the same motif twice, each with independent N(0, noise^2): the difference is noise
    assert diff.std() == pytest.approx(config.noise * np.sqrt(2), rel=0.1)
    assert np.abs(diff).max() < 8 * config.noise
    # and the continuation is not predictable from a fixed lag: positions vary
    assert len(np.unique(source)) > 20


def test_motif_without_noise_copies_exactly():
    config = dataclasses.replace(MOTIF, noise=0.0)
    arrays = motif_arrays(config)
    raw = raw_windows(arrays, "val")
    idx = arrays["val_source"][:, None] + config.cue_length + np.arange(config.horizon)
    np.testing.assert_allclose(raw[:, config.context :], np.take_along_axis(raw, idx, 1), atol=1e-9)


def test_regimes_target_repeats_the_earlier_regime_by_whole_periods():
    for config in (
        dataclasses.replace(REGIMES, noise=0.0),
        dataclasses.replace(REGIMES_LONG, noise=0.0),
    ):
        arrays = regimes_arrays(config)
        raw = raw_windows(arrays, "test")
        start, end = arrays["test_source"], arrays["test_source_end"]
        period, resume = arrays["test_period"], arrays["test_resume"]
        assert (end - start >= config.segment_min).all()
        assert (end <= resume).all() and (resume < config.context).all()
        for h in range(config.horizon):
            t = config.context + h
            earlier = end - 1 - ((end - 1 - t) % period)  # last step of the source = t mod P
            assert (earlier >= start).all()
            np.testing.assert_allclose(raw[:, t], raw[np.arange(len(raw)), earlier], atol=1e-9)
        # the step before the return belongs to a different regime than the source's
        before = raw[np.arange(len(raw)), resume - 1]
        lagged = raw[np.arange(len(raw)), resume - 1 - period]
        assert not np.allclose(before, lagged)


def test_recall_targets_are_the_paired_values():
    arrays = recall_arrays(RECALL)
    p, q = RECALL.n_pairs, RECALL.n_queries
    for split in RECALL.split_names:
        tokens, targets = arrays[f"{split}_tokens"], arrays[f"{split}_targets"]
        factor = length_factor(split)
        assert tokens.shape == targets.shape == (RECALL.split_size(split), RECALL.seq_len * factor)
        assert ((targets != IGNORE).sum(1) == q).all()
        for seq, tgt in zip(tokens, targets, strict=True):
            keys, values = seq[0 : 2 * p : 2], seq[1 : 2 * p : 2]
            assert len(set(keys)) == p and (keys <= RECALL.n_keys).all()
            assert (values > RECALL.n_keys).all() and (values < RECALL.vocab_size).all()
            pair = dict(zip(keys.tolist(), values.tolist(), strict=True))
            at = np.flatnonzero(tgt != IGNORE)
            assert (at >= 2 * p).all()  # queries come after the pairs
            assert [pair[k] for k in seq[at]] == tgt[at].tolist()
    assert_same(arrays, recall_arrays(RECALL))
    other = recall_arrays(dataclasses.replace(RECALL, seed=3))
    assert not np.array_equal(other["train_tokens"], arrays["train_tokens"])


def test_real_split_is_chronological_and_scaler_uses_train_only():
    config = RealConfig(context=52, horizon=8, stride=4)
    arrays = real_arrays(config)
    series = load_series("co2")
    assert np.isfinite(series).all() and len(series) == 2284  # 59 gaps interpolated
    bounds = split_bounds(len(series), config)
    assert bounds["train"][1] == bounds["val"][0] and bounds["val"][1] == bounds["test"][0]
    for split in SPLITS:
        starts = arrays[f"{split}_start"]
        begin, end = bounds[split]
        assert starts.min() >= begin and starts.max() + config.context + config.horizon <= end
        # raw = x * std + mean reproduces the bundled series window by window
        idx = starts[:, None] + np.arange(config.context + config.horizon)
        np.testing.assert_allclose(raw_windows(arrays, split), series[idx], rtol=1e-9)
    train = series[slice(*bounds["train"])]
    np.testing.assert_allclose(arrays["scaler"], [train.mean(), train.std()])
    # CO2 rises: a scaler fitted on the whole series would have a larger mean
    assert arrays["scaler"][0] < series.mean() - 5


def test_real_global_scaling_and_baselines(tmp_path):
    config = RealConfig(per_window=False)
    track = load_real(config, tmp_path)
    scaler = real_arrays(config)["scaler"]
    assert float(track.train.mean[0]) == pytest.approx(scaler[0])
    naive = naive_baselines(track)
    assert naive["seasonal_period"] == 52
    test = {name: f["test"]["mse"] for name, f in naive["forecasts"].items()}
    assert test["linear"] < test["seasonal_naive"] < test["mean"]


def test_loaders_cache_round_trip(tmp_path):
    for config, load in ((MOTIF, load_motif), (REGIMES, load_regimes)):
        first = load(config, tmp_path)
        assert cache_path(config, tmp_path).exists()
        again = load(config, tmp_path)
        assert np.array_equal(first.test.y.numpy(), again.test.y.numpy())
        assert len(first.train) == config.n_train
    track = load_recall(RECALL, tmp_path)
    assert track.split("test_x4")[0].shape == (RECALL.n_test, 4 * RECALL.seq_len)
    with pytest.raises(ValueError, match="split must be one of"):
        track.split("test_x3")


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (MotifConfig(cue_length=16), r"cue_length must be an integer in \[1, 15\]"),
        (MotifConfig(horizon=9), r"horizon must be an integer in \[1, 8\]"),
        (MotifConfig(context=40), r"context must be an integer >= 54"),
        (MotifConfig(noise=-1.0), "noise must be >= 0"),
        (MotifConfig(n_train=0), "n_train must be an integer >= 1"),
        (RegimesConfig(n_regimes=2), "n_regimes must be an integer >= 3"),
        (RegimesConfig(segment_min=10), "segment_min must be an integer >= 16"),
        (RegimesConfig(context=64), r"context must be an integer >= 79"),
        (RecallConfig(n_pairs=40), r"n_pairs must be an integer in \[1, 31\]"),
        (RecallConfig(n_queries=0), "n_queries must be an integer >= 1"),
        (RecallConfig(seq_len=16), "seq_len must be an integer >= 32"),
        (RecallConfig(length_factors=(2,)), r"length_factors must be the tuple \(2, 4\)"),
        (RealConfig(dataset="airline"), "dataset must be one of"),
        (RealConfig(test_fraction=0.6), r"test_fraction must be in \(0, 0.5\)"),
        (RealConfig(context=500), "context \\+ horizon must be at most"),
    ],
)
def test_bad_config_is_refused_naming_the_parameter(config, match):
    with pytest.raises(ValueError, match=match):
        config.validate()
