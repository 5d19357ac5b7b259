"""Track ``forecast-real``: a real series that ships inside a PyPI package (no download).

Issue 14 (docs/design.md): external validity. ``dataset`` names one of the series in
``DATASETS``, each bundled as a csv file with ``statsmodels`` and read through
``statsmodels.datasets`` (which reads that file; nothing is fetched):

* ``co2``: weekly atmospheric CO2 at Mauna Loa, March 1958 - December 2001 (2,284 weeks,
  59 missing, filled by linear interpolation in time); seasonal period 52 weeks;
* ``sunspots``: yearly sunspot numbers, 1700 - 2008 (309 years); period ~11 years.

The series is cut chronologically into train / validation / test segments
(``val_fraction``, ``test_fraction`` of its length, test last); a window of ``context``
inputs and ``horizon`` targets lies entirely inside one segment (one every ``stride``
steps). A scaler (mean and standard deviation) is fitted on the **train segment only**
and applied to the whole series; with ``per_window`` (the default, as on the synthetic
forecast tracks) each window is then also standardised by its own context, which takes
out the trend's level. Either way ``raw = x * std + mean`` window by window, with the
composed ``mean`` / ``std`` stored per window. The naive forecasts of
``rpka.tracks.baselines`` (seasonal naive with the dataset's period, linear least squares
fitted on the train windows) apply unchanged.

This track may well fail the attention gate (a smooth seasonal series is what a linear
forecast does well): then the report says so.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rpka.checks import is_number, require
from rpka.tracks.common import SPLITS, STD_FLOOR, require_int, standardise
from rpka.tracks.text import WindowText
from rpka.tracks.windows import WindowForecastTask, window_loader


def _bundled(name: str) -> Any:
    """statsmodels' bundled dataset ``name`` (its csv file; nothing is fetched). Imported
    here, not at module level: ``statsmodels.api`` costs ~0.5 s in every process that
    imports the tracks (each notebook kernel), and only building this track reads it."""
    return importlib.import_module(f"statsmodels.datasets.{name}").load_pandas()


# name -> (loader returning a pandas Series, seasonal period in steps)
DATASETS = {
    "co2": (lambda: _bundled("co2").data["co2"], 52),
    "sunspots": (lambda: _bundled("sunspots").data["SUNACTIVITY"], 11),
}


# learnability bar: exact attention no worse than the linear forecast (a smooth seasonal
# series is what a linear forecast does well; this track may fail the gate)
REAL_LINEAR_RATIO = 1.0


@dataclass(frozen=True)
class RealConfig:
    """``forecast-real`` (see the module docstring); lengths in steps of the series."""

    name: str = "forecast-real"
    dataset: str = "co2"
    context: int = 104
    horizon: int = 8
    stride: int = 1
    val_fraction: float = 0.2
    test_fraction: float = 0.2
    per_window: bool = True

    @property
    def season_period(self) -> int:
        return DATASETS[self.dataset][1]

    @property
    def attention_tokens(self) -> int:
        """Tokens one attention call sees: one per context step."""
        return self.context

    def validate(self) -> None:
        require(self.name == "forecast-real", "name", "'forecast-real'", self.name)
        require(
            self.dataset in DATASETS,
            "forecast-real.dataset",
            f"one of {sorted(DATASETS)}",
            self.dataset,
        )
        require_int(self, "context", 1)
        require_int(self, "horizon", 1)
        require_int(self, "stride", 1)
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            require(
                is_number(value) and 0 < value < 0.5, f"forecast-real.{name}", "in (0, 0.5)", value
            )
        require(
            isinstance(self.per_window, bool), "forecast-real.per_window", "a bool", self.per_window
        )
        n = len(load_series(self.dataset))
        shortest = min(split_bounds(n, self).values(), key=lambda b: b[1] - b[0])
        require(
            shortest[1] - shortest[0] >= self.context + self.horizon,
            "forecast-real.context + horizon",
            f"at most the shortest split's {shortest[1] - shortest[0]} steps of {self.dataset}",
            self.context + self.horizon,
        )


def load_series(dataset: str) -> np.ndarray:
    """The bundled series (T,) float64, missing values filled by linear interpolation."""
    series: pd.Series = DATASETS[dataset][0]()
    return series.interpolate(method="linear", limit_direction="both").to_numpy(np.float64)


def split_bounds(n: int, config: RealConfig) -> dict[str, tuple[int, int]]:
    """Chronological [start, end) of each split: train, then validation, then test."""
    n_test = int(round(n * config.test_fraction))
    n_val = int(round(n * config.val_fraction))
    n_train = n - n_val - n_test
    return {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, n)}


def build_arrays(config: RealConfig) -> dict[str, np.ndarray]:
    """``series`` (raw), ``scaler`` (train mean, std), and per split ``x, y, mean, std``
    (raw = x * std + mean) and ``start`` (each window's first step in the series)."""
    config.validate()
    series = load_series(config.dataset)
    bounds = split_bounds(len(series), config)
    train = series[slice(*bounds["train"])]
    scale_mean, scale_std = train.mean(), max(train.std(), STD_FLOOR)  # train only
    scaled = (series - scale_mean) / scale_std
    arrays = {"series": series, "scaler": np.array([scale_mean, scale_std])}
    offsets = np.arange(config.context + config.horizon)
    for split in SPLITS:
        begin, end = bounds[split]
        starts = np.arange(begin, end - len(offsets) + 1, config.stride)
        raw = scaled[starts[:, None] + offsets]
        if config.per_window:
            win = standardise(raw, config.context)
            win["mean"] = scale_mean + scale_std * win["mean"]  # compose the two affine maps
            win["std"] = scale_std * win["std"]
        else:
            ones = np.ones(len(starts))
            win = {
                "x": raw[:, : config.context],
                "y": raw[:, config.context :],
                "mean": scale_mean * ones,
                "std": scale_std * ones,
            }
        for key, value in win.items():
            arrays[f"{split}_{key}"] = value
        arrays[f"{split}_start"] = starts
    return arrays


load_real = window_loader(RealConfig, build_arrays)


class RealTask(WindowForecastTask):
    """``forecast-real``: the forecast model, loss and naive forecasts on this generator's windows;
    learnable when exact attention's test MSE is at most 1.0 x the linear forecast's."""

    name = "forecast-real"
    config_class = RealConfig
    build_arrays = staticmethod(build_arrays)
    out_dir = "forecast-real"
    linear_ratio = REAL_LINEAR_RATIO
    text = WindowText(
        title="Real-series forecast track",
        description=(
            "A real series bundled with statsmodels (loaded offline), split chronologically, "
            "scaled by a scaler fitted on the training segment only."
        ),
        linear_ratio=REAL_LINEAR_RATIO,
    )

    def at_context(self, config: RealConfig, context: int, train_windows: int, eval_windows: int):
        raise ValueError(
            f"track {self.name!r} has no long-context form: its windows come from one real "
            "series, whose length does not grow with the context"
        )
