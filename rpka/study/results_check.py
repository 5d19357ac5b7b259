"""A study's result files, checked before anything reads them (issue 43, findings 1 and 4).

``report --from-results`` and ``summary`` read a preset's results as they are. Before the
first notebook starts (or the study index is written), :func:`check_study`:

* reads every result file of the study (every ``*.json`` under ``data/results/<preset>``,
  and the shared files the notebooks are given, e.g. the scaling results): each parses and
  matches its checksum (``rpka.io.read_json_checked``);
* refuses a file without a checksum among files that have one:
  every writer seals what it writes (``rpka.io.write_result_json``) and the committed
  studies are sealed, so a missing key is a key deleted - after an edit, which the checksum
  would have caught;
* checks the fields of ``study.json`` and of every ``bench_report.json`` the notebooks read,
  with their types (:data:`STUDY_FIELDS`, :data:`BENCH_FIELDS`), naming the file and the
  field: a mistyped file failed deep inside a notebook, naming neither;
* recomputes every bench report's summaries (each arm's n, mean and sd, each comparison's
  delta and verdict) from its own per-seed scores and refuses a file where they disagree
  (``rpka.verdict.consistency``): an edited and re-sealed file (issue 56);
* returns the files read without a checksum (a study written before checksums existed,
  all of its files unsealed), which the command names.

A problem raises ``rpka.io.CorruptFileError`` naming the file (the CLI: one line, exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rpka import paths
from rpka.io import CHECKSUM_KEY, CorruptFileError, has_checksum, read_json_checked, timings_path
from rpka.paths import resolve
from rpka.study.steps import notebook_parameters
from rpka.verdict.consistency import bench_report_problems

Check = tuple[Callable[[Any], bool], str]  # (does the value fit?, what it must be)

DICT: Check = (lambda v: isinstance(v, dict), "an object")
STR: Check = (lambda v: isinstance(v, str), "a string")
LIST: Check = (lambda v: isinstance(v, list), "a list")
OPTIONAL_DICT: Check = (lambda v: v is None or isinstance(v, dict), "an object or null")
NUMBER_OR_NULL: Check = (
    lambda v: v is None or (isinstance(v, int | float) and not isinstance(v, bool)),
    "a number or null",
)

# the fields of study.json the report reads (rpka.study.index.write_study_index writes them)
STUDY_FIELDS: dict[str, Check] = {
    "preset": STR,
    "tracks": DICT,
    "longctx": OPTIONAL_DICT,
    paths.LONGRANGE: OPTIONAL_DICT,
}
TRACK_ENTRY_FIELDS: dict[str, Check] = {
    "bench_report": STR,
    "metric": STR,
    "primary_arm": STR,
    "primary": DICT,
    "verdicts": DICT,
}
# the fields of a bench_report.json the notebooks read (rpka.bench.report builds them)
BENCH_FIELDS: dict[str, Check] = {
    "config": DICT,
    "metric": STR,
    "arms": DICT,
    "baseline_arm": STR,
    "primary_arm": STR,
    "learnability": DICT,
}
# ... and its times, kept beside it (rpka.io.timings_path) and read back with it when they
# belong to its payload: checked after its summaries, so an edit is named as an edit
TIMING_FIELDS: dict[str, Check] = {"timings": DICT}
ARM_FIELDS: dict[str, Check] = {"full": DICT, "best_cfg": DICT}
SCORE_FIELDS: dict[str, Check] = {"mean": NUMBER_OR_NULL, "std": NUMBER_OR_NULL, "per_seed": LIST}


def result_files(preset: str) -> list[Path]:
    """Every result file ``preset``'s notebooks may read: the ``*.json`` under its results
    folder (run files included) and the shared ones its notebooks are given, if there."""
    root = resolve(paths.results_dir(preset))
    files = sorted(root.rglob("*.json")) if root.is_dir() else []
    shared = {
        resolve(value)
        for parameters in notebook_parameters(preset).values()
        for value in parameters.values()
        if isinstance(value, str) and value.endswith(".json")
    }
    return files + sorted(p for p in shared if p.is_file() and root not in p.parents)


def check_study(preset: str) -> list[Path]:
    """Check ``preset``'s result files (see the module's docstring); the files read that
    carry no checksum (a legacy study: none of its files does), which the caller names."""
    files = result_files(preset)
    data = {path: read_json_checked(path) for path in files}  # parses, checksum matches
    # a file unsealed among sealed ones first: an edit, whose timings (kept beside it, tied
    # to its checksum) are not read with it either
    unsealed = [path for path in files if not has_checksum(path)]
    root = resolve(paths.results_dir(preset))
    for group in (  # the study's own files; the shared ones (another folder) apart
        [path for path in files if root in path.parents],
        [path for path in files if root not in path.parents],
    ):
        bad = [path for path in group if path in unsealed]
        if bad and len(bad) < len(group):
            raise CorruptFileError(
                f"{bad[0]}: has no {CHECKSUM_KEY} checksum though {len(group) - len(bad)} "
                f"other result file(s) beside it have one: edited, and its checksum "
                f"deleted? ({len(bad)} such file(s)); restore it (git checkout, for a "
                f"committed file) or recompute it (`python -m rpka report --preset {preset}`)"
            )
    for path, content in data.items():  # then the fields: a mistyped file names its field
        if path.name == paths.STUDY_FILE and path.parent == resolve(paths.results_dir(preset)):
            check_study_index(path, content)
        elif path.name == paths.BENCH_REPORT_FILE:
            check_bench_report(path, content)
    for path, content in data.items():  # sealed or not: its summaries are its scores'
        if path.name == paths.BENCH_REPORT_FILE:
            check_summaries(path, content)
            check_timings(path, content)
    return unsealed


def check_study_index(path: Path, content: Any) -> None:
    """``study.json``'s fields and types (:data:`STUDY_FIELDS`, each track's entry)."""
    check_fields(path, content, STUDY_FIELDS)
    for name, entry in content["tracks"].items():
        check_fields(path, entry, TRACK_ENTRY_FIELDS, f"tracks.{name}")


def check_bench_report(path: Path, content: Any) -> None:
    """A bench report's fields and types (:data:`BENCH_FIELDS`, each arm's test scores),
    and that its primary and baseline arms are among its arms."""
    check_fields(path, content, BENCH_FIELDS)
    for role in ("primary_arm", "baseline_arm"):
        if content[role] not in content["arms"]:
            raise CorruptFileError(
                f"{path}: field {role} names {content[role]!r}, which is not one of its arms "
                f"{sorted(content['arms'])}"
            )
    for name, arm in content["arms"].items():
        check_fields(path, arm, ARM_FIELDS, f"arms.{name}")
        check_fields(path, arm["full"], SCORE_FIELDS, f"arms.{name}.full")


def check_timings(path: Path, content: dict[str, Any]) -> None:
    """A bench report's timings (:data:`TIMING_FIELDS`): a report without them lost its
    timings file, or the file was written for another payload (the report changed since)."""
    if "timings" not in content:
        raise CorruptFileError(
            f"{path}: lacks its timings: {timings_path(path).name} beside it is missing or "
            f"belongs to another version of the report (changed since it was written?)"
        )
    check_fields(path, content, TIMING_FIELDS)


def check_summaries(path: Path, content: dict[str, Any]) -> None:
    """``CorruptFileError`` if the bench report's summaries (means, sd, n, verdicts) are not
    what its own per-seed scores give (``rpka.verdict.consistency``): a checksum proves only
    that nobody changed the file since it was last sealed (issue 56)."""
    problems = bench_report_problems(content)
    if problems:
        raise CorruptFileError(
            f"{path}: its summaries disagree with its own per-seed scores: {problems[0]}"
            f"{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}; restore it "
            "(git checkout, for a committed file) or recompute it"
        )


def check_fields(path: Path, content: Any, fields: Mapping[str, Check], where: str = "") -> None:
    """``CorruptFileError`` naming ``path`` and the field (dotted from ``where``) unless
    ``content`` is an object with every one of ``fields``, each of its type."""
    prefix = f"{where}." if where else ""
    if not isinstance(content, dict):
        field = f"field {where}" if where else "its content"
        raise CorruptFileError(f"{path}: {field} must be an object, got {_kind(content)}")
    for name, (fits, allowed) in fields.items():
        if name not in content:
            raise CorruptFileError(f"{path}: lacks the field {prefix}{name} ({allowed})")
        if not fits(content[name]):
            raise CorruptFileError(
                f"{path}: field {prefix}{name} must be {allowed}, got {_kind(content[name])} "
                f"{_short(content[name])}"
            )


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _short(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def unsealed_note(files: Sequence[Path], preset: str) -> str:
    """The line ``report --from-results`` prints when it reads files without a checksum."""
    shown = ", ".join(str(p.relative_to(paths.REPO_ROOT)) if p.is_relative_to(paths.REPO_ROOT)
                      else str(p) for p in files[:3])  # fmt: skip
    more = f" and {len(files) - 3} more" if len(files) > 3 else ""
    return (
        f"note: {len(files)} result file(s) of preset {preset} carry no {CHECKSUM_KEY} "
        f"checksum (written before checksums existed), read as they are: {shown}{more}"
    )
