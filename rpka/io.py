"""Small file helpers shared by every stage: atomic writes, JSON, config hashes."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from rpka.paths import resolve

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(
    path: str | os.PathLike, write: Callable[[IO[Any]], None], binary: bool = False
) -> Path:
    """Write ``path`` through ``write(fh)`` on a temporary file, then rename it into place.

    A reader never sees a half-written file, and an interrupted write leaves nothing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            write(fh)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomically write ``text`` to ``path``."""
    return atomic_write(path, lambda fh: fh.write(text))


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
    """Atomically write numpy arrays to ``path`` (.npz)."""
    return atomic_write(path, lambda fh: np.savez(fh, **arrays), binary=True)


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically ``torch.save`` ``obj`` to ``path``."""
    return atomic_write(path, lambda fh: torch.save(obj, fh), binary=True)


def save_figure(fig: Any, save_dir: str | os.PathLike | None, name: str) -> Path | None:
    """Write the matplotlib figure ``fig`` to ``save_dir/name.png`` atomically (the folder
    is created); no-op without a folder. Relative folders are taken from the repository
    root."""
    if save_dir is None:
        return None
    path = resolve(save_dir) / f"{name}.png"
    return atomic_write(path, lambda fh: fig.savefig(fh, format="png"), binary=True)
