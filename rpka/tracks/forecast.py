"""The ``forecast`` track: its config, seeded synthetic series windowed and split, and its
:class:`ForecastTask` (docs/design.md, "Tracks"); its words are ``rpka.tracks.forecast_text``.

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

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rpka.checks import is_int, is_number, require
from rpka.tracks.common import SeriesTask, Split, Track, standardise, track_loader
from rpka.tracks.forecast_text import ForecastText


@dataclass(frozen=True)
class TrackConfig:
    """A forecasting track: the synthetic series, its windows and its splits.

    The generator (``rpka.tracks.forecast``) draws ``n_series`` independent univariate
    series of ``series_length`` steps; windows of ``context`` inputs and ``horizon``
    targets start every ``stride`` steps; each series is cut chronologically into train /
    validation / test segments and no window straddles two of them. (Several short series
    rather than one long one: every split then holds many regimes.)

    Generator parameters (all in units of the series' own scale, time in steps):
        season_period: the dominant (daily-like) period, used by the seasonal-naive
            forecast.
        season_harmonics: harmonics of ``season_period`` in its (fixed) waveform.
        weekly_period: a slow period that multiplies the daily amplitude (multiplicative
            seasonality).
        weekly_depth: depth of that modulation in [0, 1).
        regime_mean_length: mean length of a regime (geometric), in steps.
        regime_period_min, regime_period_max: each regime draws the period of its own
            oscillation uniformly from this range (a continuum, so no fixed linear filter
            extrapolates every regime - the nonlinear part of the task).
        regime_amplitude: scale of that oscillation's amplitude.
        noise_scale, noise_ar: innovation scale and lag-one coefficient of the AR(1) noise.
        seasonless_fraction: share of regimes without the daily season (only the regime's
            own oscillation, trend and noise). Which kind of regime a context shows is a
            nonlinear feature of it: the best forecast switches between two spectra, while
            a linear forecast has one filter for both.
        jump_scale: standard deviation of the level jump at a regime change.
        trend_scale, trend_ar: innovation scale and lag-one coefficient of the trend's slope
            (an AR(1) process, integrated into the level).
    """

    name: str = "forecast"
    n_series: int = 34
    series_length: int = 1_000
    stride: int = 8
    context: int = 96
    horizon: int = 24
    val_fraction: float = 0.2
    test_fraction: float = 0.2
    seed: int = 0
    season_period: int = 24
    season_harmonics: int = 3
    weekly_period: int = 168
    weekly_depth: float = 0.5
    regime_mean_length: int = 400
    regime_period_min: float = 12.0
    regime_period_max: float = 40.0
    regime_amplitude: float = 1.5
    noise_scale: float = 0.15
    noise_ar: float = 0.5
    seasonless_fraction: float = 0.4
    jump_scale: float = 0.1
    trend_scale: float = 0.0001
    trend_ar: float = 0.998

    @property
    def attention_tokens(self) -> int:
        """Tokens one attention call sees: one per context step."""
        return self.context

    def validate(self) -> None:
        require(self.name == "forecast", "track.name", "'forecast'", self.name)
        require(
            is_int(self.n_series) and self.n_series >= 1, "track.n_series", ">= 1", self.n_series
        )
        require(is_int(self.context) and self.context >= 8, "track.context", ">= 8", self.context)
        require(is_int(self.horizon) and self.horizon >= 1, "track.horizon", ">= 1", self.horizon)
        require(is_int(self.stride) and self.stride >= 1, "track.stride", ">= 1", self.stride)
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            require(is_number(value) and 0 < value < 0.5, f"track.{name}", "in (0, 0.5)", value)
        require(is_int(self.seed) and self.seed >= 0, "track.seed", "an integer >= 0", self.seed)
        window = self.context + self.horizon
        shortest = self.series_length * min(self.val_fraction, self.test_fraction)
        require(
            is_int(self.series_length) and shortest >= window,
            "track.series_length",
            f"long enough that the smallest split holds one window ({window} steps)",
            self.series_length,
        )
        require(
            is_int(self.season_period) and 2 <= self.season_period <= self.context,
            "track.season_period",
            f"an integer in [2, context={self.context}]",
            self.season_period,
        )
        require(
            is_int(self.season_harmonics) and self.season_harmonics >= 1,
            "track.season_harmonics",
            ">= 1",
            self.season_harmonics,
        )
        require(
            is_int(self.weekly_period) and self.weekly_period >= 2,
            "track.weekly_period",
            ">= 2",
            self.weekly_period,
        )
        require(
            is_number(self.weekly_depth) and 0 <= self.weekly_depth < 1,
            "track.weekly_depth",
            "in [0, 1)",
            self.weekly_depth,
        )
        require(
            is_int(self.regime_mean_length) and self.regime_mean_length >= 1,
            "track.regime_mean_length",
            ">= 1",
            self.regime_mean_length,
        )
        require(
            is_number(self.regime_period_min)
            and is_number(self.regime_period_max)
            and 2 <= self.regime_period_min <= self.regime_period_max,
            "track.regime_period_min/max",
            "2 <= min <= max",
            (self.regime_period_min, self.regime_period_max),
        )
        for name in (
            "regime_amplitude",
            "noise_scale",
            "jump_scale",
            "trend_scale",
        ):
            value = getattr(self, name)
            require(is_number(value) and value >= 0, f"track.{name}", ">= 0", value)
        for name in ("noise_ar", "trend_ar"):
            value = getattr(self, name)
            require(is_number(value) and -1 < value < 1, f"track.{name}", "in (-1, 1)", value)
        require(
            is_number(self.seasonless_fraction) and 0 <= self.seasonless_fraction <= 1,
            "track.seasonless_fraction",
            "in [0, 1]",
            self.seasonless_fraction,
        )


def sized_track(
    track: TrackConfig, context: int, train_windows: int, eval_windows: int
) -> TrackConfig:
    """``track`` at ``context``, its series just long enough for the windows asked for.

    Every series holds exactly ``train_windows`` training windows and ``eval_windows``
    windows in each of validation and test (one every ``track.stride`` steps), whatever
    the context: a split of ``w + (k - 1) * stride`` steps holds k windows of
    ``w = context + horizon`` steps, and the series is the three splits end to end.
    """
    for name, value in (("train_windows", train_windows), ("eval_windows", eval_windows)):
        require(is_int(value) and value >= 1, name, ">= 1", value)
    require(is_int(context) and context >= 8, "context", ">= 8", context)
    window = context + track.horizon
    train_steps = window + (train_windows - 1) * track.stride
    eval_steps = window + (eval_windows - 1) * track.stride
    length = train_steps + 2 * eval_steps
    # split_bounds rounds length * fraction back to eval_steps exactly (the error is ~1e-12)
    fraction = eval_steps / length
    return dataclasses.replace(
        track,
        context=context,
        series_length=length,
        val_fraction=fraction,
        test_fraction=fraction,
    )


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
    return standardise(series[starts[:, None] + offsets], context)  # windows (N, L + H)


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


def forecast_track(config: TrackConfig, arrays: dict[str, np.ndarray]) -> Track:
    """The :class:`Track` over a config's cached arrays (windows as float32 tensors)."""

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


load_forecast = track_loader(TrackConfig, build_arrays, forecast_track)


# ----------------------------------------------------------------------------- the task


class ForecastTask(SeriesTask):
    """The forecast track: the forecast machinery of :class:`~rpka.tracks.common.SeriesTask`
    (``TransformerTiny``, MSE loss, MSE and MAE, the naive forecasts) on this generator's
    windows; learnability = beating the naive forecasts by a margin
    (:func:`~rpka.tracks.common.forecast_learnability`).

    A forecast-like track with another generator subclasses this (or ``SeriesTask``) and
    overrides ``name``, ``config_class`` and :meth:`load` (a wider input window per token
    is the model's ``embed_kernel``; another embedding overrides :meth:`build_model`)."""

    name = "forecast"
    config_class = TrackConfig
    text = ForecastText(title="Forecast track")

    def load(self, config: TrackConfig, data_dir: str | Path | None = None) -> Track:
        return load_forecast(config, data_dir)

    def at_context(
        self, config: TrackConfig, context: int, train_windows: int, eval_windows: int
    ) -> TrackConfig:
        """Every series sized to hold the windows asked for (:func:`sized_track`)."""
        track = sized_track(config, context, train_windows, eval_windows)
        track.validate()
        return track
