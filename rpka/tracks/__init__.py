"""Tracks (data sets) by name: ``get_track(name, config, data_dir)``.

Each entry of ``TRACKS`` maps a name to a loader ``(config, data_dir) -> track``; adding a
track is one entry here and one module beside this file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpka.tracks.baselines import NAIVE_FORECASTS, naive_baselines
from rpka.tracks.forecast import SPLITS, Split, Track, load_forecast
from rpka.tracks.lm import LMTrack, load_lm

TRACKS: dict[str, Callable[..., Any]] = {
    "forecast": load_forecast,
    "lm": load_lm,
}


def get_track(name: str, config: Any, data_dir: str | Path | None = None) -> Any:
    """Load (or generate and cache) the track ``name`` for ``config``."""
    if name not in TRACKS:
        raise ValueError(f"unknown track {name!r}; valid: {sorted(TRACKS)}")
    return TRACKS[name](config, data_dir)


__all__ = [
    "NAIVE_FORECASTS",
    "SPLITS",
    "TRACKS",
    "LMTrack",
    "Split",
    "Track",
    "get_track",
    "load_forecast",
    "load_lm",
    "naive_baselines",
]
