"""Small file helpers shared by every stage: atomic writes, JSON, config hashes."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pickle
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
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
    """``path``'s JSON. A result written with a checksum of its payload
    (:func:`write_result_json`: a JSON object with :data:`CHECKSUM_KEY`) is verified and
    returned without it; a mismatch raises :class:`CorruptFileError` naming ``path``. A file
    without the key (legacy, or not a result) is returned as it is."""
    with open(path) as fh:
        data = json.load(fh)
    if isinstance(data, dict) and CHECKSUM_KEY in data:
        verify_payload(path, data)
        timings = _timings_of(path, data.pop(CHECKSUM_KEY))
        if timings is not None:  # the result's own timings, kept apart (below)
            data = merged(data, timings)
    return data


# A result's timings (wall and CPU seconds, step times, load) change on every run while its
# scores do not; they live in a file of their own beside it (issue 56), which read_json
# merges back: ``bench_report.json``'s are in ``bench_report.timings`` (JSON, not sealed:
# a measurement of the machine, not a result), with the checksum of the payload they time,
# so a result replaced since is never read with another's timings. Globs for results
# (``*.json``) skip it.
TIMINGS_SUFFIX = ".timings"


def timings_path(path: str | os.PathLike) -> Path:
    """The file beside the result ``path`` that holds its timings (:data:`TIMINGS_SUFFIX`)."""
    return Path(path).with_suffix(TIMINGS_SUFFIX)


def _timings_of(path: str | os.PathLike, checksum: str) -> Any | None:
    """The timings beside the result ``path`` whose payload has the checksum ``checksum``;
    None without a timings file, or with one written for another payload (a result
    replaced since: its timings are not this result's)."""
    sidecar = timings_path(path)
    if not sidecar.exists():
        return None
    with open(sidecar) as fh:
        stored = json.load(fh)
    return stored.get("timings") if stored.get("of_" + CHECKSUM_KEY) == checksum else None


def merged(base: Any, extra: Any) -> Any:
    """``base`` with the entries of ``extra`` added at every depth (dicts merged key by key;
    elsewhere ``extra`` wins); lists are merged item by item when their lengths agree, an
    item None in ``extra`` leaving ``base``'s (what :func:`only_keys` writes)."""
    if isinstance(base, dict) and isinstance(extra, dict):
        return {
            **base,
            **{k: merged(base[k], v) if k in base else v for k, v in extra.items()},
        }
    if isinstance(base, list) and isinstance(extra, list) and len(base) == len(extra):
        return [b if e is None else merged(b, e) for b, e in zip(base, extra, strict=True)]
    return extra


def only_keys(obj: Any, keys: frozenset[str]) -> Any:
    """The part of ``obj`` that :func:`without_keys` removes, nested as it was (None where
    nothing is removed; a list keeps its length, with None for items without such keys)."""
    if isinstance(obj, dict):
        taken = {k: v for k, v in obj.items() if k in keys}
        taken.update(
            {
                k: sub
                for k, v in obj.items()
                if k not in keys and (sub := only_keys(v, keys)) is not None
            }
        )
        return taken or None
    if isinstance(obj, list):
        items = [only_keys(v, keys) for v in obj]
        return items if any(item is not None for item in items) else None
    return None


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


FIGURE_DPI = 150  # the resolution of every figure written or embedded
_SAVED_PNG = "_rpka_png"  # where save_figure keeps the bytes it wrote, on the figure
_SAVED_PATH = "_rpka_png_path"  # and the file it wrote them to


def figure_png(fig: Any) -> bytes:
    """The matplotlib figure ``fig`` as PNG bytes (``FIGURE_DPI``, tight bounding box).

    A figure :func:`save_figure` wrote is not drawn again while it is unchanged: the bytes
    it wrote are returned (drawing is most of a report's time). Any change to the figure
    after that marks it stale (matplotlib's own flag), and it is drawn anew.
    """
    saved = getattr(fig, _SAVED_PNG, None)
    if saved is not None and not fig.stale:
        return saved
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
    return buffer.getvalue()


def inline_png(fig: Any) -> tuple[str, dict[str, int]]:
    """A notebook's view of ``fig``: the PNG :func:`figure_png` gives (the bytes
    saved, or drawn now), base64, with the width and height that show it at the figure's
    on-screen size (``figure.dpi``) rather than at its saved resolution."""
    png = figure_png(fig)
    width, height = (int.from_bytes(png[at : at + 4], "big") for at in (16, 20))  # PNG IHDR
    scale = fig.dpi / FIGURE_DPI
    size = {"width": round(width * scale), "height": round(height * scale)}
    return base64.b64encode(png).decode("ascii"), size


def save_figure(fig: Any, save_dir: str | os.PathLike | None, name: str) -> Path | None:
    """Write the matplotlib figure ``fig`` to ``save_dir/name.png`` atomically (the folder
    is created); no-op without a folder. Relative folders are taken from the repository
    root. The bytes stay on the figure for :func:`figure_png`."""
    if save_dir is None:
        return None
    setattr(fig, _SAVED_PNG, None)  # a figure saved again is drawn again
    png = figure_png(fig)
    setattr(fig, _SAVED_PNG, png)
    fig.stale = False  # drawn as saved (the tight bounding box leaves the flag set)
    path = atomic_write(resolve(save_dir) / f"{name}.png", lambda fh: fh.write(png), binary=True)
    setattr(fig, _SAVED_PATH, path)
    return path


def saved_path(fig: Any) -> Path | None:
    """The file :func:`save_figure` last wrote ``fig`` to (None if never saved)."""
    return getattr(fig, _SAVED_PATH, None)


# --------------------------------------------------------------------------- checked reads
# A cached file (run JSON, weights, track arrays, report) can be truncated, emptied or
# overwritten by hand. Reads below check what they read; a caller that can recompute moves
# the bad file aside (:func:`quarantine`) and reruns, so a corrupt cache heals itself.

RUN_KEYS = ("run_id", "config", "arm", "lr", "seeds", "split", "scores", "members")


class CorruptFileError(ValueError):
    """A file that does not parse, lacks keys, or is not what its name says; names the file."""


def read_json_checked(path: str | os.PathLike, required_keys: Sequence[str] = ()) -> Any:
    """``read_json(path)``, or :class:`CorruptFileError` naming ``path`` if it does not parse
    or (when ``required_keys`` are given) is not an object with those keys."""
    try:
        data = read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorruptFileError(f"{path}: not valid JSON ({err})") from err
    if required_keys:
        if not isinstance(data, dict):
            raise CorruptFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
        missing = [key for key in required_keys if key not in data]
        if missing:
            raise CorruptFileError(f"{path}: lacks the keys {missing}")
    return data


def read_checked(path: str | os.PathLike, load: Callable[[Path], Any]) -> Any:
    """``load(path)`` for a binary file (``.pt``, ``.npz``); a file that is missing or does not
    load raises :class:`CorruptFileError` naming it."""
    path = Path(path)
    try:
        return load(path)
    except (
        OSError,
        EOFError,
        ValueError,
        RuntimeError,
        KeyError,
        zipfile.BadZipFile,
        pickle.UnpicklingError,
    ) as err:  # what numpy, zipfile and torch raise on bad bytes
        raise CorruptFileError(f"{path}: unreadable ({type(err).__name__}: {err})") from err


CHECKSUM_KEY = "sha256"  # a result file's checksum of its own payload (not part of run_id)


def payload_sha256(payload: dict[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of ``payload`` without its
    :data:`CHECKSUM_KEY`: the same for a result and for that result read back from disk."""
    body = {key: value for key, value in payload.items() if key != CHECKSUM_KEY}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def verify_payload(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Raise :class:`CorruptFileError` naming ``path`` unless ``data`` (read from it) matches
    its :data:`CHECKSUM_KEY`; a payload without the key (legacy) passes."""
    checksum = data.get(CHECKSUM_KEY)
    if checksum is None:
        return
    try:
        actual = payload_sha256(data)
    except ValueError:  # a NaN or inf written in by hand: never what write_result_json wrote
        actual = None
    if checksum != actual:
        raise CorruptFileError(
            f"{path}: its content does not match its {CHECKSUM_KEY} checksum "
            f"({str(checksum)[:16]}...): edited after it was written?"
        )


def has_checksum(path: str | os.PathLike) -> bool:
    """Whether the file ``path`` holds a JSON object with a :data:`CHECKSUM_KEY` (whether
    it matches is :func:`read_json`'s check); False for one that does not parse."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and CHECKSUM_KEY in data


def unsealed_among_sealed(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The files of ``paths`` without a checksum (:func:`has_checksum`) when at least one
    of them has one; none when none has (files written before checksums existed). Every
    writer seals its results (:func:`write_result_json`), so among sealed files a missing
    key is a deleted one: after an edit, which the checksum would have caught (issue 43)."""
    sealed = {Path(path): has_checksum(path) for path in paths}
    return [path for path, ok in sealed.items() if not ok] if any(sealed.values()) else []


# what a resumed study measures anew although its result is the same: the time and load of
# the resume itself. A report that differs from the file only there keeps the file (and so
# the timings of the runs that made it): a clone's `make report` leaves it as committed.
RESUME_VOLATILE_KEYS = frozenset(
    {"timings", "wall_s", "run_time_s", "load_average_start", "load_average_end"}
)


def without_keys(obj: Any, keys: frozenset[str]) -> Any:
    """``obj`` with the dict entries named in ``keys`` removed at every depth."""
    if isinstance(obj, dict):
        return {k: without_keys(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [without_keys(v, keys) for v in obj]
    return obj


def write_result_json(
    path: str | os.PathLike, result: dict[str, Any], volatile: frozenset[str] = frozenset()
) -> Path:
    """Atomically write the result ``result`` (a JSON object) to ``path`` with the checksum
    of its payload (:func:`payload_sha256`, key :data:`CHECKSUM_KEY`), which every read
    (:func:`read_json`, :func:`read_json_checked`) verifies. NaN/inf are written as null,
    as :func:`write_json` does; ``result`` itself is not changed. A file at ``path`` that
    already holds this payload - apart from the keys in ``volatile``, at any depth (e.g.
    :data:`RESUME_VOLATILE_KEYS`) - is left as it is: writing the study index again over
    committed results changes no committed byte."""
    payload = json.loads(json.dumps(_finite(result)))  # exactly what will be read back
    payload.pop(CHECKSUM_KEY, None)
    try:
        if Path(path).exists() and without_keys(read_json(path), volatile) == without_keys(
            payload, volatile
        ):
            return Path(path)
    except (OSError, ValueError):  # unreadable or corrupt (CorruptFileError): written anew
        pass
    return write_json(path, {**payload, CHECKSUM_KEY: payload_sha256(payload)})


def write_result_and_timings(
    path: str | os.PathLike, result: dict[str, Any], timing_keys: frozenset[str]
) -> Path:
    """Write ``result`` as :func:`write_result_json` does, without the entries named in
    ``timing_keys`` (at any depth), which go to its timings file (:func:`timings_path`);
    :func:`read_json` merges them back. A result unchanged on disk keeps both files as
    they are (the timings of the runs that made it), so rerunning a finished study
    rewrites no committed byte, and no committed result holds a time of the last run."""
    path = Path(path)
    payload = json.loads(json.dumps(_finite(without_keys(result, timing_keys))))  # as read back
    if path.exists() and timings_path(path).exists():
        with open(path) as fh:
            on_disk = json.load(fh)
        on_disk.pop(CHECKSUM_KEY, None)
        if on_disk == payload:
            return path
    timings = only_keys(result, timing_keys)
    if timings is not None:  # tied to the payload it times (its checksum); written first, so
        # an interrupted write leaves timings that match no result rather than a wrong pair
        checksum = payload_sha256(payload)
        write_json(timings_path(path), {"of_" + CHECKSUM_KEY: checksum, "timings": timings})
    else:
        timings_path(path).unlink(missing_ok=True)
    return write_result_json(path, payload)


def seal_result_json(path: str | os.PathLike) -> bool:
    """Give a result file written before checksums existed its checksum (its payload
    unchanged, then verified by every read); True if it was rewritten, False if it already
    had one. A file whose checksum does not match is refused (``CorruptFileError``)."""
    with open(path) as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        return False
    if CHECKSUM_KEY in data:
        verify_payload(path, data)
        return False
    write_json(path, {**data, CHECKSUM_KEY: payload_sha256(data)})
    return True


# a run retrained only for its weights (they are not committed) gives the same scores and
# weights bit for bit under pinned numerics, in another time: its file is kept as it was
RUN_VOLATILE_KEYS = RESUME_VOLATILE_KEYS | {"cpu_s", "step_ms_median", "torch_threads"}

# what a study's summaries (bench reports, long-context results, the study index, drop-in and
# mechanism readings) hold that is a time: written apart from them by
# :func:`write_result_and_timings`. Speed benchmarks' files are timings by purpose and keep them.
TIMING_KEYS = RESUME_VOLATILE_KEYS | {"step_ms_median", "step_ms", "seconds", "cpu_s", "timings_s"}


def write_run_file(path: str | os.PathLike, result: dict[str, Any]) -> Path:
    """Atomically write a run's ``result`` to ``path`` with the checksum of its payload
    (:func:`write_result_json`), which :func:`read_run_file` verifies; a file there that
    differs only in the run's timings (:data:`RUN_VOLATILE_KEYS`) is kept, so a clone that
    retrains a run for its weights leaves the committed file as it was."""
    return write_result_json(path, result, RUN_VOLATILE_KEYS)


def read_run_file(path: str | os.PathLike) -> dict[str, Any]:
    """A run's result (``<runs>/<run id>.json``), checked: it parses, has the result keys, its
    payload matches its checksum (a score edited by hand would otherwise be accepted;
    :func:`read_json`), and its stored configuration hashes to its file name (a run file
    copied over another run's name would otherwise be accepted as that run). Files written
    before run files carried a checksum have none and are accepted as they are. The
    checksum is not returned."""
    path = Path(path)
    result = read_json_checked(path, RUN_KEYS)
    stored = config_hash(result["config"])
    if stored != path.stem or result["run_id"] != path.stem:
        raise CorruptFileError(
            f"{path}: its configuration hashes to {stored} (run_id {result['run_id']!r}), "
            f"not to its name: a run file copied over another run's?"
        )
    return result


STATE_CHECKSUM_KEY = "state_sha256"  # in a run's result: the sha256 of the weights it saved


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of the bytes of the file ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_state_file(
    state_path: str | os.PathLike, result: dict[str, Any], run_file: str | os.PathLike
) -> None:
    """Raise :class:`CorruptFileError` naming both files unless the weights file
    ``state_path`` is the one the run ``result`` (read from ``run_file``) saved: its sha256 is
    the result's :data:`STATE_CHECKSUM_KEY`. A result recording none (null) saved no
    weights, so a weights file beside it is not its own. A run file written before results
    recorded it (no key) accepts any weights file, as before."""
    if STATE_CHECKSUM_KEY not in result:
        return
    recorded = result[STATE_CHECKSUM_KEY]
    if recorded is None:
        raise CorruptFileError(
            f"{state_path}: not the weights of the run {run_file}, which saved none "
            f"(its {STATE_CHECKSUM_KEY} is null): a weights file copied or left there?"
        )
    try:
        actual = file_sha256(state_path)
    except OSError as err:
        raise CorruptFileError(f"{state_path}: unreadable ({type(err).__name__}: {err})") from err
    if actual != recorded:
        raise CorruptFileError(
            f"{state_path}: its sha256 ({actual[:16]}...) is not the {STATE_CHECKSUM_KEY} "
            f"({str(recorded)[:16]}...) that {run_file} recorded for the weights it saved: "
            f"a weights file swapped or edited?"
        )


def quarantine(path: str | os.PathLike, reason: str) -> Path:
    """Move the bad file ``path`` aside to ``<name>.corrupt-<UTC timestamp>`` and say so on
    stderr (one line); its producer will write it again."""
    path = Path(path)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    os.replace(path, target)
    print(f"rpka: {reason}; moved aside to {target.name}, recomputing", file=sys.stderr)
    return target


def read_json_or_heal(path: str | os.PathLike, required_keys: Sequence[str] = ()) -> Any | None:
    """``path``'s JSON (checked as :func:`read_json_checked`), or None when it is missing or
    corrupt - then moved aside (:func:`quarantine`) for its producer to write again."""
    if not Path(path).exists():
        return None
    try:
        return read_json_checked(path, required_keys)
    except CorruptFileError as err:
        quarantine(path, str(err))
        return None
