"""What the tracks share; every track module imports from here, none from another track.

* splits and checks - ``SPLITS``, ``STD_FLOOR``, :func:`require_int`;
* series windows - :func:`standardise` (a window scaled by its context), :class:`Split`
  and :class:`Track` (the standardised windows of a forecast-like track);
* the cached loader - :func:`load_arrays` (validate, then read the cache or build and
  save) and :func:`track_loader` (a track module's ``load_<track>``);
* the forecast machinery - :class:`SeriesTask` (``TransformerTiny``, MSE loss, MSE and MAE,
  the naive forecasts of ``rpka.tracks.baselines``) and :func:`forecast_learnability`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch import Tensor, nn

from rpka.checks import is_int, require
from rpka.io import atomic_save_npz
from rpka.model import TransformerTiny
from rpka.tracks.base import Task
from rpka.tracks.baselines import naive_baselines
from rpka.tracks.cache import cache_path, cached_arrays
from rpka.tracks.text import SeriesText, TrackText

SPLITS = ("train", "val", "test")
# a context whose standard deviation is below this is flat: divide by this instead
STD_FLOOR = 1e-6
# learnability bar (issue 3): exact attention's mean test MSE must be at most this times
# the better of the mean and last-value forecasts, and no worse than the linear forecast
LEARNABILITY_RATIO = 0.6

Arrays = dict[str, np.ndarray]
Build = Callable[[Any], Arrays]


def require_int(config: Any, name: str, low: int, high: int | None = None) -> None:
    """``config.<name>`` is an integer in [low, high] (no upper bound when ``high`` is None)."""
    value = getattr(config, name)
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    ok = is_int(value) and value >= low and (high is None or value <= high)
    require(ok, f"{config.name}.{name}", allowed, value)


def standardise(raw: np.ndarray, context: int) -> Arrays:
    """Windows (N, L + H) -> x (N, L), y (N, H), mean, std (N,), scaled by the context only."""
    ctx = raw[:, :context]
    mean = ctx.mean(1)
    std = np.maximum(ctx.std(1), STD_FLOOR)
    scaled = (raw - mean[:, None]) / std[:, None]
    return {"x": scaled[:, :context], "y": scaled[:, context:], "mean": mean, "std": std}


@dataclass
class Split:
    """Standardised windows of one split.

    x: (N, L) contexts; y: (N, H) targets; series, start: (N,) which series and the index
    of the window's first step in it; mean, std: (N,) the context statistics used to
    standardise.
    """

    x: Tensor
    y: Tensor
    series: Tensor
    start: Tensor
    mean: Tensor
    std: Tensor

    def __len__(self) -> int:
        return self.x.shape[0]


@dataclass
class Track:
    """The three splits of a forecast-like track, plus what built them."""

    config: Any
    series: Tensor  # (n_series, T) the raw series (empty for window-per-example tracks)
    train: Split
    val: Split
    test: Split

    @property
    def seasonal_period(self) -> int:
        """The generator's dominant period (used by the seasonal-naive forecast)."""
        return self.config.season_period

    def split(self, name: str) -> Split:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        return getattr(self, name)


# ----------------------------------------------------------------------------- the loader


def load_arrays(
    config: Any,
    build: Build,
    data_dir: str | Path | None = None,
    use_cache: bool = True,
    stored: Callable[[Any], Arrays] | None = None,
    complete: Callable[[Any, Arrays], bool] | None = None,
) -> Arrays:
    """``config`` validated, then ``build(config)``'s arrays read from the cache
    (``rpka.tracks.cache``) or built and cached, with ``stored(config)``'s arrays saved
    beside them. A cache that ``complete(config, arrays)`` refuses - written before a
    generator gained arrays - is built again and overwritten (the same config)."""
    config.validate()
    extra = None if stored is None else stored(config)
    arrays = cached_arrays(config, build, data_dir, use_cache, extra)
    if complete is not None and not complete(config, arrays):
        arrays = build(config)
        if use_cache:
            atomic_save_npz(cache_path(config, data_dir), **(extra or {}), **arrays)
    return arrays


def track_loader(
    config_class: type,
    build: Build,
    wrap: Callable[[Any, Arrays], Any],
    stored: Callable[[Any], Arrays] | None = None,
    complete: Callable[[Any, Arrays], bool] | None = None,
) -> Callable[..., Any]:
    """``load(config=None, data_dir=None, use_cache=True)``: ``wrap(config, arrays)`` of
    :func:`load_arrays`, with ``config_class()`` when no config is given (a track module's
    ``load_<track>``)."""

    def load(config: Any = None, data_dir: str | Path | None = None, use_cache: bool = True):
        config = config_class() if config is None else config
        return wrap(config, load_arrays(config, build, data_dir, use_cache, stored, complete))

    load.__doc__ = (
        f"The ``{config_class.name}`` track: read from the cache, or generated (and cached)."
    )
    return load


# ----------------------------------------------------------------------------- the task


class SeriesTask(Task):
    """A forecast over context-standardised windows (a :class:`Track`): ``TransformerTiny``
    maps a context (S, B, L) to a horizon (S, B, H); loss = mean squared error; metrics MSE
    and MAE; the naive forecasts of ``rpka.tracks.baselines``; learnability =
    :func:`forecast_learnability` (a subclass may narrow it)."""

    metrics = ("mse", "mae")
    text: ClassVar[TrackText] = SeriesText()

    def build_model(self, model, track, seeds, method, options) -> nn.Module:
        return TransformerTiny(model, track.context, track.horizon, seeds, method, options)

    def inputs_targets(self, track: Track, split: str) -> tuple[Tensor, Tensor]:
        data = track.split(split)
        return data.x, data.y

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        return (pred - y).pow(2).mean((1, 2))

    def error_sums(self, pred: Tensor, y: Tensor) -> dict[str, Tensor]:
        diff = (pred - y).double()
        return {"mse": diff.pow(2).sum((1, 2)), "mae": diff.abs().sum((1, 2))}

    def finish(self, sums: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        return {"mse": sums["mse"] / count, "mae": sums["mae"] / count}

    def naive_baselines(self, track: Track) -> dict[str, Any]:
        return naive_baselines(track)

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        return forecast_learnability(baseline["full_by_metric"]["mse"]["mean"], naive)

    def data_summary(self, track: Track) -> dict[str, Any]:
        return {
            "n_train_windows": len(track.train),
            "n_val_windows": len(track.val),
            "n_test_windows": len(track.test),
            "context": track.config.context,
            "horizon": track.config.horizon,
        }


def forecast_learnability(baseline_mean: float, naive: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's bar: exact <= 0.6 x min(mean, last value) and <= linear (test MSE)."""
    test = {name: f["test"]["mse"] for name, f in naive["forecasts"].items()}
    better_naive = min(test["mean"], test["last_value"])
    threshold = LEARNABILITY_RATIO * better_naive
    meets_ratio = bool(baseline_mean <= threshold)
    meets_linear = bool(baseline_mean <= test["linear"])
    return {
        "baseline_test_mse": baseline_mean,
        "mean_forecast_mse": test["mean"],
        "last_value_mse": test["last_value"],
        "seasonal_naive_mse": test["seasonal_naive"],
        "linear_mse": test["linear"],
        "ratio_required": LEARNABILITY_RATIO,
        "threshold": threshold,
        "ratio_to_better_naive": baseline_mean / better_naive,
        "ratio_to_linear": baseline_mean / test["linear"],
        "meets_ratio": meets_ratio,
        "meets_linear": meets_linear,
        "met": meets_ratio and meets_linear,
    }
