"""The forecast track: determinism, cache, chronological splits, standardisation, baselines."""

import numpy as np
import pytest
import torch

from rpka.tracks import forecast as fc
from rpka.tracks import get_track
from rpka.tracks.baselines import naive_baselines
from rpka.tracks.cache import cache_path
from rpka.tracks.forecast import TrackConfig, load_forecast

SMALL = TrackConfig(n_series=3, series_length=400, context=32, horizon=8, stride=4)


def arrays_of(track):
    out = {"series": track.series}
    for name in ("train", "val", "test"):
        split = track.split(name)
        for key in ("x", "y", "series", "start", "mean", "std"):
            out[f"{name}_{key}"] = getattr(split, key)
    return out


def test_same_seed_same_track_and_cache_equals_fresh(tmp_path):
    fresh = load_forecast(SMALL, tmp_path, use_cache=False)
    assert not list(tmp_path.iterdir())  # use_cache=False writes nothing
    first = load_forecast(SMALL, tmp_path)  # generates and caches
    assert cache_path(SMALL, tmp_path).exists()
    cached = load_forecast(SMALL, tmp_path)  # reads the cache
    for key, value in arrays_of(fresh).items():
        assert torch.equal(value, arrays_of(first)[key]), key
        assert torch.equal(value, arrays_of(cached)[key]), key


def test_cache_is_read_not_regenerated(tmp_path, monkeypatch):
    load_forecast(SMALL, tmp_path)

    def boom(config):
        raise AssertionError("regenerated instead of reading the cache")

    monkeypatch.setattr(fc, "generate_series", boom)
    load_forecast(SMALL, tmp_path)
    with pytest.raises(AssertionError):
        load_forecast(TrackConfig(**{**SMALL.__dict__, "seed": 5}), tmp_path)


def test_seed_changes_the_series():
    a = fc.generate_series(SMALL)
    b = fc.generate_series(TrackConfig(**{**SMALL.__dict__, "seed": 1}))
    assert a.shape == (SMALL.n_series, SMALL.series_length)
    assert not np.allclose(a, b)
    assert not np.allclose(a[0], a[1])  # the series differ from one another


def test_splits_are_chronological_and_disjoint(tmp_path):
    track = load_forecast(SMALL, tmp_path, use_cache=False)
    window = SMALL.context + SMALL.horizon
    bounds = fc.split_bounds(SMALL)
    assert bounds["train"][1] == bounds["val"][0] and bounds["val"][1] == bounds["test"][0]
    for name in ("train", "val", "test"):
        split = track.split(name)
        begin, end = bounds[name]
        assert len(split) > 0
        assert int(split.start.min()) >= begin and int(split.start.max()) + window <= end
        assert set(split.series.tolist()) == set(range(SMALL.n_series))
    for s in range(SMALL.n_series):  # per series: train < val < test, no overlap
        last_end = -1
        for name in ("train", "val", "test"):
            split = track.split(name)
            starts = split.start[split.series == s]
            assert int(starts.min()) >= last_end
            last_end = int(starts.max()) + window


def test_windows_are_standardised_by_their_context(tmp_path):
    track = load_forecast(SMALL, tmp_path, use_cache=False)
    split = track.test
    for i in (0, len(split) // 2, len(split) - 1):
        raw = track.series[split.series[i], split.start[i] : split.start[i] + 40].numpy()
        ctx = raw[: SMALL.context]
        mean, std = ctx.mean(), ctx.std()
        np.testing.assert_allclose(split.x[i].numpy(), (ctx - mean) / std, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            split.y[i].numpy(), (raw[SMALL.context :] - mean) / std, rtol=1e-5, atol=1e-5
        )
    np.testing.assert_allclose(split.x.mean(1).numpy(), 0, atol=1e-5)
    np.testing.assert_allclose(split.x.std(1, correction=0).numpy(), 1, atol=1e-4)


def test_baselines_against_direct_numpy(tmp_path):
    track = load_forecast(SMALL, tmp_path, use_cache=False)
    got = naive_baselines(track)
    x_tr, y_tr = track.train.x.double().numpy(), track.train.y.double().numpy()
    design = np.hstack([x_tr, np.ones((len(x_tr), 1))])
    weights = np.linalg.pinv(design) @ y_tr  # least squares via the pseudo-inverse
    period = SMALL.season_period
    for split in ("val", "test"):
        x, y = track.split(split).x.double().numpy(), track.split(split).y.double().numpy()
        preds = {
            "mean": np.tile(x.mean(1)[:, None], SMALL.horizon),
            "last_value": np.tile(x[:, -1:], SMALL.horizon),
            "seasonal_naive": np.stack(
                [x[:, SMALL.context - period + h % period] for h in range(SMALL.horizon)], 1
            ),
            "linear": np.hstack([x, np.ones((len(x), 1))]) @ weights,
        }
        for name, pred in preds.items():
            want = {"mse": np.mean((pred - y) ** 2), "mae": np.mean(np.abs(pred - y))}
            for metric in ("mse", "mae"):
                assert got["forecasts"][name][split][metric] == pytest.approx(
                    want[metric], rel=1e-6
                ), (name, split, metric)
    assert got["seasonal_period"] == period


def test_linear_beats_mean_on_this_track(tmp_path):
    # the series is mostly predictable: a linear forecast must beat the context mean
    got = naive_baselines(load_forecast(SMALL, tmp_path, use_cache=False))["forecasts"]
    assert got["linear"]["test"]["mse"] < got["mean"]["test"]["mse"]


def test_get_track_registry_and_bad_config(tmp_path):
    assert isinstance(get_track("forecast", SMALL, tmp_path), fc.Track)
    with pytest.raises(ValueError, match="track must be one of"):
        get_track("nope", SMALL, tmp_path)
    with pytest.raises(ValueError, match="track.context"):
        load_forecast(TrackConfig(context=4), tmp_path)
    with pytest.raises(ValueError, match="track.series_length"):
        load_forecast(TrackConfig(series_length=200), tmp_path)
    with pytest.raises(ValueError, match="split must be one of"):
        load_forecast(SMALL, tmp_path, use_cache=False).split("dev")
