"""Where things live. Relative paths in configs and notebook parameters are relative to
the repository root, so a notebook opened in JupyterLab (cwd ``notebooks/``) and one run by
papermill (cwd the root) read and write the same files."""

from __future__ import annotations

import os
from pathlib import Path


def _find_root() -> Path:
    env = os.environ.get("RPKA_ROOT")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").exists():
        return here
    return Path.cwd().resolve()


REPO_ROOT = _find_root()


def resolve(path: str | os.PathLike) -> Path:
    """An absolute path: relative paths are taken from the repository root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p
