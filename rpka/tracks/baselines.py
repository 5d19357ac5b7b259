"""Naive forecasts every model must beat (DESIGN.md section 4), on standardised windows.

All four work on the context-standardised windows of a :class:`~rpka.tracks.forecast.Track`
(x: (N, L), y: (N, H)), the same numbers the models see, so their errors are directly
comparable with the models' errors.

* ``mean``: the context mean (0 after standardisation);
* ``last_value``: the context's last value, repeated;
* ``seasonal_naive``: the last full season repeated, ``y_hat[h] = x[L - P + (h mod P)]``,
  with P the generator's dominant period;
* ``linear``: ordinary least squares (no ridge) from the context (plus an intercept) to the
  horizon, fitted on the training windows only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NAIVE_FORECASTS = ("mean", "last_value", "seasonal_naive", "linear")


def mean_forecast(x: np.ndarray, horizon: int) -> np.ndarray:
    """(N, L) -> (N, H): the context mean, repeated."""
    return np.repeat(x.mean(1, keepdims=True), horizon, axis=1)


def last_value_forecast(x: np.ndarray, horizon: int) -> np.ndarray:
    """(N, L) -> (N, H): the last context value, repeated."""
    return np.repeat(x[:, -1:], horizon, axis=1)


def seasonal_naive_forecast(x: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """(N, L) -> (N, H): ``y_hat[h] = x[L - P + (h mod P)]`` (the last season, repeated)."""
    context = x.shape[1]
    if not 1 <= period <= context:
        raise ValueError(f"period must lie in [1, context={context}], got {period}")
    index = context - period + np.arange(horizon) % period
    return x[:, index]


def fit_linear(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares weights (L + 1, H) of ``y ~ [x, 1] W`` (``numpy.linalg.lstsq``)."""
    design = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
    weights, *_ = np.linalg.lstsq(design, y, rcond=None)
    return weights


def linear_forecast(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(N, L) -> (N, H) with weights from :func:`fit_linear`."""
    return x @ weights[:-1] + weights[-1]


def errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Mean squared and mean absolute error over every window and horizon step."""
    diff = pred - y
    return {"mse": float(np.mean(diff**2)), "mae": float(np.mean(np.abs(diff)))}


def naive_baselines(track: Any, splits: tuple[str, ...] = ("val", "test")) -> dict:
    """Errors of the four naive forecasts on ``splits``.

    Returns ``{"seasonal_period": P, "forecasts": {name: {split: {"mse", "mae"}}}}``.
    Computed in float64 from the float32 windows the models see.
    """
    horizon = track.config.horizon
    period = track.seasonal_period
    train = track.train
    weights = fit_linear(train.x.double().numpy(), train.y.double().numpy())
    forecasts: dict[str, dict[str, dict[str, float]]] = {name: {} for name in NAIVE_FORECASTS}
    for split in splits:
        data = track.split(split)
        x, y = data.x.double().numpy(), data.y.double().numpy()
        preds = {
            "mean": mean_forecast(x, horizon),
            "last_value": last_value_forecast(x, horizon),
            "seasonal_naive": seasonal_naive_forecast(x, horizon, period),
            "linear": linear_forecast(x, weights),
        }
        for name, pred in preds.items():
            forecasts[name][split] = errors(pred, y)
    return {"seasonal_period": period, "forecasts": forecasts}
