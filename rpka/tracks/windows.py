"""What the window-per-example forecast tracks share (``forecast-motif``, ``forecast-regimes``,
``forecast-real``): config checks, per-split seeds, context standardisation, and the
:class:`~rpka.tracks.forecast.Track` the forecast machinery (model, loss, naive baselines)
consumes.

Every example is one window of ``context`` inputs and ``horizon`` targets, standardised by
its *context* mean and standard deviation (targets too, as in ``rpka.tracks.forecast``), so
the arrays a generator's ``build_arrays`` returns are ``<split>_x`` (N, L), ``<split>_y``
(N, H), ``<split>_mean`` and ``<split>_std`` (N,), plus generator-specific metadata.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rpka.tracks.forecast import SPLITS, STD_FLOOR, Split, Track

WINDOW_FIELDS = ("x", "y", "mean", "std")


def require(ok: bool, name: str, allowed: str, value: object) -> None:
    """Raise ``ValueError("<name> must be <allowed>, got <value>")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def require_int(config: Any, name: str, low: int, high: int | None = None) -> None:
    """``config.<name>`` is an integer in [low, high] (no upper bound when ``high`` is None)."""
    value = getattr(config, name)
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    ok = is_int(value) and value >= low and (high is None or value <= high)
    require(ok, f"{config.name}.{name}", allowed, value)


def split_rng(seed: int, split: str) -> np.random.Generator:
    """An independent stream per split: ``SeedSequence([seed, 1 + index of split])``."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1 + SPLITS.index(split)]))


def standardise(raw: np.ndarray, context: int) -> dict[str, np.ndarray]:
    """Windows (N, L + H) -> x (N, L), y (N, H), mean, std (N,), scaled by the context only."""
    ctx = raw[:, :context]
    mean = ctx.mean(1)
    std = np.maximum(ctx.std(1), STD_FLOOR)
    scaled = (raw - mean[:, None]) / std[:, None]
    return {"x": scaled[:, :context], "y": scaled[:, context:], "mean": mean, "std": std}


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
