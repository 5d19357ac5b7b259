"""The ``forecast`` track: seeded synthetic series, windowed and split (DESIGN.md section 4).

Each of ``n_series`` independent series is a sum of four parts (time t in steps, regime
r(t) piecewise constant with geometric lengths):

    y_t = level_t                                  trend: integrated AR(1) slope, plus a
                                                   level jump at each regime change
        + a_r (1 + depth sin(2 pi t / W + phi)) s(t)   daily waveform s (period P = 24, a few
                                                   harmonics); its amplitude is multiplied
                                                   by the regime's a_r (0 in "seasonless"
                                                   regimes) and by a weekly cycle
        + b_r sin(2 pi (t - t_r) / P_r + phi_r)    the regime's own oscillation, its period
                                                   P_r drawn from a continuum
        + e_t,   e_t = rho e_{t-1} + sigma eta_t   AR(1) noise

Why a linear forecast is not already optimal: a fixed linear filter from the context to
the horizon can extrapolate any *fixed* finite set of sinusoids, but not an oscillation
whose period is drawn anew in every regime from a continuum, nor a spectrum that switches
with the regime (daily season on or off) or amplitudes that multiply one another. The
best forecast depends on features of the context - which kind of regime, which period -
that a linear map cannot compute.

Windows: ``context`` inputs followed by ``horizon`` targets, one every ``stride`` steps.
Each series is cut chronologically into train / validation / test segments; a window lies
entirely inside one segment. Each window is standardised by its *context* mean and
standard deviation (targets too), so a model never sees the future's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from rpka.presets import TrackConfig
from rpka.tracks.cache import cached_arrays

SPLITS = ("train", "val", "test")
# a context whose standard deviation is below this is flat: divide by this instead
STD_FLOOR = 1e-6


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
    """The three splits of a forecasting track, plus what built them."""

    config: TrackConfig
    series: Tensor  # (n_series, T) the raw series
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


def _regimes(config: TrackConfig, rng: np.random.Generator) -> np.ndarray:
    """Regime index of each step: geometric lengths with mean ``regime_mean_length``."""
    lengths = rng.geometric(1.0 / config.regime_mean_length, size=config.series_length)
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, config.series_length)) + 1
    return np.repeat(np.arange(count), lengths[:count])[: config.series_length]


def _ar1(innovations: np.ndarray, coefficient: np.ndarray) -> np.ndarray:
    """``e_t = c_t e_{t-1} + u_t``, started from the stationary law of the first step."""
    out = np.empty_like(innovations)
    out[0] = innovations[0] / np.sqrt(1 - coefficient[0] ** 2)
    for i in range(1, len(out)):
        out[i] = coefficient[i] * out[i - 1] + innovations[i]
    return out


def generate_one(config: TrackConfig, rng: np.random.Generator) -> np.ndarray:
    """One raw series (T,) float64 (the module docstring lists its parts)."""
    n = config.series_length
    t = np.arange(n, dtype=np.float64)

    # daily waveform: fixed harmonics of the dominant period, normalised to unit std
    k = np.arange(1, config.season_harmonics + 1)[:, None]
    coef = rng.normal(size=(config.season_harmonics, 2)) / k  # 1/k: smoother shapes
    angle = 2 * np.pi * k * t / config.season_period
    daily = (coef[:, :1] * np.cos(angle) + coef[:, 1:] * np.sin(angle)).sum(0)
    daily /= daily.std()
    weekly = 1 + config.weekly_depth * np.sin(
        2 * np.pi * t / config.weekly_period + rng.uniform(0, 2 * np.pi)
    )

    # per-regime parameters; a seasonless regime has no daily season
    regime = _regimes(config, rng)
    n_regimes = int(regime[-1]) + 1
    seasonless = rng.random(n_regimes) < config.seasonless_fraction
    daily_amp = np.where(seasonless, 0.0, rng.uniform(0.5, 1.5, n_regimes))
    osc_amp = config.regime_amplitude * rng.uniform(0.3, 1.0, n_regimes)
    osc_period = rng.uniform(config.regime_period_min, config.regime_period_max, n_regimes)
    osc_phase = rng.uniform(0, 2 * np.pi, n_regimes)
    jump = rng.normal(0, config.jump_scale, n_regimes)
    regime_start = np.searchsorted(regime, np.arange(n_regimes))
    local_t = t - regime_start[regime]
    oscillation = osc_amp[regime] * np.sin(
        2 * np.pi * local_t / osc_period[regime] + osc_phase[regime]
    )

    # trend: an AR(1) (mean-reverting) slope, integrated, plus a level jump at each regime
    # change; a random-walk slope would let the trend swamp everything else
    slope = _ar1(rng.normal(0, config.trend_scale, n), np.full(n, config.trend_ar))
    level = np.cumsum(slope) + jump[regime]

    # AR(1) noise
    noise = _ar1(rng.normal(0, config.noise_scale, n), np.full(n, config.noise_ar))

    return level + daily_amp[regime] * weekly * daily + oscillation + noise


def generate_series(config: TrackConfig) -> np.ndarray:
    """The raw series (n_series, T) float64; series i draws from ``default_rng([seed, i])``."""
    return np.stack(
        [
            generate_one(config, np.random.default_rng([config.seed, i]))
            for i in range(config.n_series)
        ]
    )


def split_bounds(config: TrackConfig) -> dict[str, tuple[int, int]]:
    """Chronological [start, end) of each split, the same in every series."""
    n = config.series_length
    n_test = int(round(n * config.test_fraction))
    n_val = int(round(n * config.val_fraction))
    n_train = n - n_val - n_test
    return {
        "train": (0, n_train),
        "val": (n_train, n_train + n_val),
        "test": (n_train + n_val, n),
    }


def window_starts(begin: int, end: int, config: TrackConfig) -> np.ndarray:
    """Starts of the windows that lie entirely in [begin, end), every ``stride`` steps."""
    last = end - (config.context + config.horizon)
    return np.arange(begin, last + 1, config.stride, dtype=np.int64)


def make_windows(
    series: np.ndarray, starts: np.ndarray, context: int, horizon: int
) -> dict[str, np.ndarray]:
    """Context-standardised windows of one series (T,): x (N, L), y (N, H), mean, std (N,)."""
    offsets = np.arange(context + horizon)
    raw = series[starts[:, None] + offsets]  # (N, L + H)
    ctx = raw[:, :context]
    mean = ctx.mean(1)
    std = np.maximum(ctx.std(1), STD_FLOOR)
    scaled = (raw - mean[:, None]) / std[:, None]
    return {"x": scaled[:, :context], "y": scaled[:, context:], "mean": mean, "std": std}


def build_arrays(config: TrackConfig) -> dict[str, np.ndarray]:
    """Everything the cache holds: ``series`` and ``<split>_<field>`` for each split.

    Fields: x, y, mean, std (see :func:`make_windows`), start (first step of the window in
    its series) and series (which series), windows ordered by series then time.
    """
    series = generate_series(config)
    arrays = {"series": series}
    for name, (begin, end) in split_bounds(config).items():
        starts = window_starts(begin, end, config)
        parts = [make_windows(row, starts, config.context, config.horizon) for row in series]
        for key in parts[0]:
            arrays[f"{name}_{key}"] = np.concatenate([part[key] for part in parts])
        arrays[f"{name}_start"] = np.tile(starts, len(series))
        arrays[f"{name}_series"] = np.repeat(np.arange(len(series)), len(starts))
    return arrays


def load_forecast(
    config: TrackConfig, data_dir: str | Path | None = None, use_cache: bool = True
) -> Track:
    """The track for ``config``: read from the cache, or generated (and cached atomically)."""
    config.validate()
    arrays = cached_arrays(config, build_arrays, data_dir, use_cache)

    def split(name: str) -> Split:
        as_float = {
            key: torch.from_numpy(arrays[f"{name}_{key}"]).float()
            for key in ("x", "y", "mean", "std")
        }
        index = {key: torch.from_numpy(arrays[f"{name}_{key}"]) for key in ("series", "start")}
        return Split(**index, **as_float)

    return Track(
        config=config,
        series=torch.from_numpy(arrays["series"]),
        train=split("train"),
        val=split("val"),
        test=split("test"),
    )
