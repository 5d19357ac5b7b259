"""What the window-per-example forecast tracks share (``forecast-motif``, ``forecast-regimes``,
``forecast-real``, ``forecast-lookup``): per-split seeds, the standardised arrays of a
generator, the :class:`~rpka.tracks.common.Track` the forecast machinery (model, loss,
naive baselines) consumes, and :class:`WindowForecastTask`, their ``Task``. A shared
library: it imports no track module.

Every example is one window of ``context`` inputs and ``horizon`` targets, standardised by
its *context* mean and standard deviation (targets too, as in ``rpka.tracks.forecast``), so
the arrays a generator's ``build_arrays`` returns are ``<split>_x`` (N, L), ``<split>_y``
(N, H), ``<split>_mean`` and ``<split>_std`` (N,), plus generator-specific metadata.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from rpka.checks import is_int, require
from rpka.tracks.common import (
    SPLITS,
    Build,
    SeriesTask,
    Split,
    Track,
    forecast_learnability,
    load_arrays,
    standardise,
    track_loader,
)
from rpka.tracks.text import TrackText, WindowText

WINDOW_FIELDS = ("x", "y", "mean", "std")


def split_rng(seed: int, split: str) -> np.random.Generator:
    """An independent stream per split: ``SeedSequence([seed, 1 + index of split])``."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1 + SPLITS.index(split)]))


def generated_arrays(
    config: Any, generate: Callable[[Any, int, np.random.Generator], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """``<split>_{x, y, mean, std}`` (standardised windows) and every other field that
    ``generate(config, n_windows, rng)`` draws beside ``raw``, per split, each split from its
    own stream (:func:`split_rng`)."""
    config.validate()
    arrays: dict[str, np.ndarray] = {}
    for split in SPLITS:
        drawn = generate(config, getattr(config, f"n_{split}"), split_rng(config.seed, split))
        for key, value in standardise(drawn.pop("raw"), config.context).items():
            arrays[f"{split}_{key}"] = value
        for key, value in drawn.items():
            arrays[f"{split}_{key}"] = value
    return arrays


def windows_track(config: Any, arrays: dict[str, np.ndarray]) -> Track:
    """A forecast :class:`Track` over window-per-example arrays (each window its own series:
    ``series`` = its index, ``start`` = 0; ``Track.series`` is empty)."""

    def split(name: str) -> Split:
        fields = {k: torch.from_numpy(arrays[f"{name}_{k}"]).float() for k in WINDOW_FIELDS}
        n = fields["x"].shape[0]
        index = {"series": torch.arange(n), "start": torch.zeros(n, dtype=torch.int64)}
        return Split(**index, **fields)

    return Track(
        config=config,
        series=torch.empty(0, dtype=torch.float64),
        train=split("train"),
        val=split("val"),
        test=split("test"),
    )


def load_windows(
    config: Any, build: Build, data_dir: str | Path | None = None, use_cache: bool = True
) -> Track:
    """The window track of ``config`` (validated): ``build(config)``'s arrays read from the
    cache (``rpka.tracks.cache``), or built and cached, as a :func:`windows_track`."""
    return windows_track(config, load_arrays(config, build, data_dir, use_cache))


def window_loader(config_class: type, build: Build) -> Callable[..., Track]:
    """``load(config=None, data_dir=None, use_cache=True)``: :func:`load_windows` with
    ``config_class()`` when no config is given (a track module's ``load_<track>``)."""
    return track_loader(config_class, build, windows_track)


# ----------------------------------------------------------------------------- the task


class WindowForecastTask(SeriesTask):
    """A forecast task over window-per-example tracks: the forecast model, loss, metrics and
    naive forecasts, with its own learnability bar - exact attention's test MSE at most
    ``linear_ratio`` x the least-squares linear forecast's.

    A subclass sets ``name``, ``config_class``, ``out_dir``, ``linear_ratio``,
    ``build_arrays`` (its generator's arrays for a config, as a ``staticmethod``) and its
    words, a :class:`~rpka.tracks.text.WindowText` (title, one sentence on the data, the
    bar); :meth:`load` is :func:`load_windows`."""

    build_arrays: ClassVar[Build]
    linear_ratio: ClassVar[float] = 1.0
    text: ClassVar[TrackText] = WindowText()

    def load(self, config: Any, data_dir: str | Path | None = None) -> Track:
        return load_windows(config, self.build_arrays, data_dir)

    def at_context(self, config: Any, context: int, train_windows: int, eval_windows: int) -> Any:
        """A generated track (``context``, ``n_train``, ``n_val``, ``n_test`` fields) with
        ``train_windows`` training and ``eval_windows`` validation and test windows."""
        for name, value in (("train_windows", train_windows), ("eval_windows", eval_windows)):
            require(is_int(value) and value >= 1, name, ">= 1", value)
        resized = dataclasses.replace(
            config, context=context, n_train=train_windows, n_val=eval_windows, n_test=eval_windows
        )
        resized.validate()
        return resized

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        out = forecast_learnability(baseline["full_by_metric"]["mse"]["mean"], naive)
        out["linear_ratio_required"] = self.linear_ratio
        out["meets_linear"] = bool(out["ratio_to_linear"] <= self.linear_ratio)
        out["met"] = out["meets_linear"]
        return out
