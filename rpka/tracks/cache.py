"""The track cache: one ``.npz`` per track configuration, written atomically.

Generating a track is deterministic in its configuration, so the file is named by a hash
of it and a later call with the same configuration reads it back instead of regenerating.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

import numpy as np

from rpka.io import CorruptFileError, atomic_save_npz, config_hash, quarantine, read_checked
from rpka.paths import DATA_CACHE

DEFAULT_DATA_DIR = Path(DATA_CACHE)


def track_fields(config: Any) -> dict[str, Any]:
    """A track configuration's fields as a dict (``asdict``), without the fields its class
    added later (``later_fields``) where they hold their default: what the track cache,
    run ids and bench reports hash and store, so adding a knob keeps every existing run id,
    cached file and committed report as it was."""
    later = {
        f.name: f.default
        for f in fields(config)
        if f.name in getattr(config, "later_fields", ()) and f.default is not MISSING
    }
    return {k: v for k, v in asdict(config).items() if not (k in later and v == later[k])}


def cache_path(config: Any, data_dir: str | Path | None = None) -> Path:
    """``<data_dir>/<config.name>-<hash of the config>.npz``."""
    folder = Path(DEFAULT_DATA_DIR if data_dir is None else data_dir)
    return folder / f"{config.name}-{config_hash(track_fields(config))}.npz"


def cached_arrays(
    config: Any,
    build: Callable[[Any], dict[str, np.ndarray]],
    data_dir: str | Path | None = None,
    use_cache: bool = True,
    extra: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """``build(config)``'s arrays, read from the cache when there (else built and saved,
    with ``extra`` arrays stored beside them)."""
    path = cache_path(config, data_dir)
    if use_cache and path.exists():
        try:
            return read_checked(path, _load_npz)
        except CorruptFileError as err:  # truncated or garbage: move aside and rebuild
            quarantine(path, str(err))
    arrays = build(config)
    if use_cache:
        atomic_save_npz(path, **(extra or {}), **arrays)
    return arrays


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:  # reads every array: a truncated member fails here
        return {key: data[key] for key in data.files}
