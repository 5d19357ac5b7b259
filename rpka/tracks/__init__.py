"""The tracks, by name: ``TRACKS`` is the one registry (see ``rpka.tracks.base.Task``).

Adding a track is one module beside this file (its config class, data and ``Task``) and
one line in ``TRACKS``. ``get_task(name)`` returns a track's task, ``get_text(name)`` its
words for the report (``rpka.tracks.text``; the defaults when it has none of its own),
``get_track(name, config, data_dir)`` its data.

May import: ``rpka.model``, ``rpka.attention`` and the root modules (io, paths, checks,
numerics); nothing from config or any stage above it. No track imports another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rpka.tracks.base import Task
from rpka.tracks.forecast import ForecastTask
from rpka.tracks.lm import LMTask
from rpka.tracks.lookup import LookupTask
from rpka.tracks.motif import MotifTask
from rpka.tracks.real import RealTask
from rpka.tracks.recall import RecallTask
from rpka.tracks.regimes import RegimesTask
from rpka.tracks.text import TrackText

TRACKS: dict[str, Task] = {
    "forecast": ForecastTask(),
    "lm": LMTask(),
    "forecast-motif": MotifTask(),
    "forecast-regimes": RegimesTask(),
    "forecast-real": RealTask(),
    "recall": RecallTask(),
    "forecast-lookup": LookupTask(),
}


def get_task(name: str) -> Task:
    """The :class:`Task` of the track named ``name``."""
    if name not in TRACKS:
        raise ValueError(f"track must be one of {sorted(TRACKS)}, got {name!r}")
    return TRACKS[name]


def get_text(name: str) -> TrackText:
    """The words of the track named ``name``: its task's :class:`TrackText`."""
    return get_task(name).text


def get_track(name: str, config: Any, data_dir: str | Path | None = None) -> Any:
    """Load (or generate and cache) the data of track ``name`` for ``config``."""
    return get_task(name).load(config, data_dir)


__all__ = ["TRACKS", "Task", "TrackText", "get_task", "get_text", "get_track"]
