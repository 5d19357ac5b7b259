"""What the window-per-example forecast tracks share (``forecast-motif``, ``forecast-regimes``,
``forecast-real``): config checks, per-split seeds, context standardisation, the
:class:`~rpka.tracks.forecast.Track` the forecast machinery (model, loss, naive baselines)
consumes, and :class:`WindowForecastTask`, their ``Task`` (``rpka.tracks.base``).

Every example is one window of ``context`` inputs and ``horizon`` targets, standardised by
its *context* mean and standard deviation (targets too, as in ``rpka.tracks.forecast``), so
the arrays a generator's ``build_arrays`` returns are ``<split>_x`` (N, L), ``<split>_y``
(N, H), ``<split>_mean`` and ``<split>_std`` (N,), plus generator-specific metadata.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from rpka.checks import is_int, require
from rpka.tracks.cache import cached_arrays
from rpka.tracks.forecast import (
    SPLITS,
    ForecastTask,
    Split,
    Track,
    forecast_learnability,
    standardise,
)

WINDOW_FIELDS = ("x", "y", "mean", "std")


def require_int(config: Any, name: str, low: int, high: int | None = None) -> None:
    """``config.<name>`` is an integer in [low, high] (no upper bound when ``high`` is None)."""
    value = getattr(config, name)
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    ok = is_int(value) and value >= low and (high is None or value <= high)
    require(ok, f"{config.name}.{name}", allowed, value)


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


Build = Callable[[Any], dict[str, np.ndarray]]


def load_windows(
    config: Any, build: Build, data_dir: str | Path | None = None, use_cache: bool = True
) -> Track:
    """The window track of ``config`` (validated): ``build(config)``'s arrays read from the
    cache (``rpka.tracks.cache``), or built and cached, as a :func:`windows_track`."""
    config.validate()
    return windows_track(config, cached_arrays(config, build, data_dir, use_cache))


def window_loader(config_class: type, build: Build) -> Callable[..., Track]:
    """``load(config=None, data_dir=None, use_cache=True)``: :func:`load_windows` with
    ``config_class()`` when no config is given (a track module's ``load_<track>``)."""

    def load(
        config: Any = None, data_dir: str | Path | None = None, use_cache: bool = True
    ) -> Track:
        config = config_class() if config is None else config
        return load_windows(config, build, data_dir, use_cache)

    load.__doc__ = (
        f"The ``{config_class.name}`` track: read from the cache, or generated (and cached)."
    )
    return load


# ----------------------------------------------------------------------------- the task


class WindowForecastTask(ForecastTask):
    """A forecast task over window-per-example tracks: the forecast model, loss, metrics and
    naive forecasts, with its own learnability bar - exact attention's test MSE at most
    ``linear_ratio`` x the least-squares linear forecast's - and its own setup words.

    A subclass sets ``name``, ``config_class``, ``out_dir``, ``title``, ``linear_ratio``,
    ``description`` (one sentence on the data) and ``build_arrays`` (its generator's
    arrays for a config, as a ``staticmethod``); :meth:`load` is :func:`load_windows`."""

    build_arrays: ClassVar[Build]

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

    linear_ratio: ClassVar[float] = 1.0
    description: ClassVar[str] = ""

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        out = forecast_learnability(baseline["full_by_metric"]["mse"]["mean"], naive)
        out["linear_ratio_required"] = self.linear_ratio
        out["meets_linear"] = bool(out["ratio_to_linear"] <= self.linear_ratio)
        out["met"] = out["meets_linear"]
        return out

    def learnability_text(self, report: Mapping) -> str:
        le = report["learnability"]
        met = self.bar_word(le)
        return (
            f"Exact attention's test MSE {le['baseline_test_mse']:.4f} is "
            f"{le['ratio_to_linear']:.3f} × the least-squares linear forecast "
            f"({le['linear_mse']:.4f}; required ≤ {le['linear_ratio_required']}): the "
            f"learnability bar is {met}."
        )

    def summary_targets(self, report: Mapping) -> list[tuple[str, str, bool | None]]:
        le = report["learnability"]
        return [
            (
                f"{self.name} learnable: exact ≤ {self.linear_ratio} × linear",
                f"{le['ratio_to_linear']:.3f} × linear",
                le["met"],
            )
        ]

    def setup_text(self, report: Mapping, protocol: str) -> str:
        data, model, train = report["data"], report["config"]["model"], report["config"]["train"]
        return (
            f"**Track `{report['track']}`.** {self.description} Windows of context "
            f"{data['context']} and horizon {data['horizon']}, each standardised by its own "
            f"context: {data['n_train_windows']} training, {data['n_val_windows']} validation "
            f"and {data['n_test_windows']} test windows.\n\n"
            f"**Model `{report['model']}`.** {model['n_layers']} pre-norm encoder layers, "
            f"d_model {model['d_model']}, {model['n_heads']} heads, one token per time step "
            f"embedding its {model['embed_kernel']} neighbouring values (attention sees "
            f"{data['context']} tokens), a linear context-to-horizon skip. Adam, "
            f"{train['epochs']} epochs, batch {train['batch_size']}, {train['lr_schedule']} "
            f"schedule.\n\n" + protocol
        )
