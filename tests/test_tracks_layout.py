"""The tracks' layout (issue 30, docs/design.md section 8): no track module imports another
- each imports only the shared modules and its own parts (``lm_source``, ``lm_text`` are
``lm``'s) - the shared modules import no track (sizes: tests/test_architecture.py)."""

import ast
from pathlib import Path

TRACKS_DIR = Path(__file__).resolve().parent.parent / "rpka" / "tracks"
SHARED = {"__init__", "base", "baselines", "cache", "common", "text", "windows"}


def imported_tracks_modules(path: Path) -> set[str]:
    """The ``rpka.tracks`` modules a file imports (by their last name)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rpka.tracks."):
            names.add(node.module.removeprefix("rpka.tracks.").split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[2] for a in node.names if a.name.startswith("rpka.tracks.")}
    return names


def test_no_track_module_imports_another():
    offenders = []
    for path in sorted(TRACKS_DIR.glob("*.py")):
        if path.stem == "__init__":  # the registry imports every track
            continue
        track = None if path.stem in SHARED else path.stem.split("_")[0]
        for name in imported_tracks_modules(path) - SHARED:
            if name.split("_")[0] != track:
                offenders.append(f"{path.name} imports rpka.tracks.{name}")
    assert not offenders, offenders

