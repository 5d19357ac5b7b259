"""Small file helpers shared by every stage: atomic writes, JSON, config hashes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename.

    A reader never sees a half-written file, and an interrupted write leaves nothing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (NaN/inf are written as null)."""
    return atomic_write_text(path, json.dumps(_finite(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as fh:
        return json.load(fh)


def config_hash(config: dict[str, Any], length: int = 16) -> str:
    """Stable hash of a JSON-able configuration (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def _finite(obj: Any) -> Any:
    """Replace non-finite floats by None so the JSON is standard (no NaN tokens)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def atomic_save_npz(path: str | os.PathLike, **arrays: Any) -> Path:
    """Write numpy arrays to ``path`` (.npz) through a temporary file and a rename."""
    import numpy as np  # local: the rest of this module needs only the standard library

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
