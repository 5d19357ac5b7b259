"""A user's run against the committed study (issue 56): did it reproduce it?

``make report`` writes its runs and results under ``out/<preset>/results`` (``rpka.paths``);
the committed study of the same preset (``data/results/<preset>``) is the reference. The
check reads both folders' files only (no training, no statistics): the run files (one per
training run, named by the hash of its configuration: the run id), the study index's
verdicts and each bench report's per-seed test scores, and the CPU each side's run files
record (``numerics.cpu_vendor`` / ``cpu_model``, where recorded: run files written before
issue 53 do not say). Its answer is one of three:

* **reproduced bit for bit**: the same run ids, every verdict equal, every score equal;
* **verdicts identical, scores within X**: the scores moved by at most X (the reason named:
  another CPU vendor, whose MKL branch differs - docs/reproducibility.md - or unknown);
* **differs**: a verdict, or the set of run ids, is not the committed one (named).

A resumed run copies the committed run files it finds (``out/<preset>/results`` is seeded
from them), so its scores equal the committed ones by construction; the check says how many
run files this run wrote anew (those whose bytes differ from the committed file's).
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rpka import paths
from rpka.io import read_json, write_json
from rpka.paths import resolve

REPRODUCED, WITHIN, DIFFERS = "reproduced bit for bit", "verdicts identical", "differs"
NO_REFERENCE = "no committed study"
SAME_STUDY = "the committed study itself"
RUN_FOLDERS = ("runs", "train")  # a bench's run files, and 01_train's demo runs


def run_files(results: Path) -> dict[str, Path]:
    """Every run file under ``results`` by its path below it (its folder names the bench;
    its name is the run id)."""
    return {
        str(path.relative_to(results)): path
        for path in sorted(results.rglob("*.json"))
        if path.parent.name in RUN_FOLDERS
    }


def _scores(path: Path) -> dict[str, list[float]]:
    return read_json(path).get("scores") or {}


def _largest_difference(a: dict[str, list], b: dict[str, list]) -> float:
    """The largest |a - b| over the metrics and seeds both hold (inf where a metric, or
    its number of seeds, is only on one side; NaN equal to NaN)."""
    if set(a) != set(b):
        return math.inf
    worst = 0.0
    for metric, values in a.items():
        other = b[metric]
        if len(values) != len(other):
            return math.inf
        for x, y in zip(values, other, strict=True):
            if x is None or y is None or (isinstance(x, float) and math.isnan(x)):
                if not (x is y or (x is not None and y is not None and math.isnan(y))):
                    return math.inf
                continue
            worst = max(worst, abs(float(x) - float(y)))
    return worst


def cpus(files: Iterable[Path]) -> list[str]:
    """The CPUs the run files record, most frequent first ("not recorded" for files
    written before the run files named their CPU)."""
    found: Counter[str] = Counter()
    for path in files:
        numerics = read_json(path).get("numerics") or {}
        vendor, model = numerics.get("cpu_vendor"), numerics.get("cpu_model")
        found[f"{vendor}, {model}" if vendor else "not recorded"] += 1
    return [f"{cpu} ({n} run file(s))" for cpu, n in found.most_common()]


def _vendors(files: Iterable[Path]) -> set[str]:
    return {v for p in files if (v := (read_json(p).get("numerics") or {}).get("cpu_vendor"))}


def _verdicts(results: Path) -> dict[str, str]:
    """``track/arm`` -> verdict, from the study index (none if there is no index)."""
    index = results / paths.STUDY_FILE
    if not index.exists():
        return {}
    study = read_json(index)
    return {
        f"{track}/{arm}": verdict
        for track, entry in (study.get("tracks") or {}).items()
        for arm, verdict in (entry.get("verdicts") or {}).items()
    }


def _per_seed(results: Path) -> dict[str, list[float]]:
    """``bench/arm`` -> the arm's per-seed test scores, from every bench report."""
    out = {}
    for report_path in sorted(results.rglob(paths.BENCH_REPORT_FILE)):
        bench = str(report_path.parent.relative_to(results)) or "."
        report = read_json(report_path)
        for arm, entry in (report.get("arms") or {}).items():
            per_seed = ((entry or {}).get("full") or {}).get("per_seed")
            if isinstance(per_seed, list):
                out[f"{bench}/{arm}"] = per_seed
    return out


def compare(results: str | Path, reference: str | Path) -> dict[str, Any]:
    """The run in ``results`` against the committed study in ``reference``: run ids,
    verdicts, the largest per-seed difference per arm, both sides' CPUs, and the answer
    (``outcome``: one of :data:`REPRODUCED`, :data:`WITHIN`, :data:`DIFFERS`,
    :data:`NO_REFERENCE`, :data:`SAME_STUDY`) with its sentence."""
    results, reference = resolve(results), resolve(reference)
    if results.resolve() == reference.resolve():
        return {
            "outcome": SAME_STUDY,
            "sentence": "This report renders the committed study "
            "itself (report --from-results or --publish): nothing to compare it with.",
        }
    if not reference.is_dir():
        return {
            "outcome": NO_REFERENCE,
            "sentence": f"No committed study at {reference} to "
            "compare this run with (the committed studies: "
            f"{', '.join(paths.PUBLISHED_PRESETS)}).",
        }
    mine, theirs = run_files(results), run_files(reference)
    common = sorted(set(mine) & set(theirs))
    score_diff = {rid: _largest_difference(_scores(mine[rid]), _scores(theirs[rid]))
                  for rid in common}  # fmt: skip
    rewritten = [rid for rid in common if mine[rid].read_bytes() != theirs[rid].read_bytes()]
    verdicts, committed_verdicts = _verdicts(results), _verdicts(reference)
    changed = sorted(
        key for key in set(verdicts) | set(committed_verdicts)
        if verdicts.get(key) != committed_verdicts.get(key)
    )  # fmt: skip
    seeds, committed_seeds = _per_seed(results), _per_seed(reference)
    per_arm = {
        key: _largest_difference({"s": seeds[key]}, {"s": committed_seeds[key]})
        for key in sorted(set(seeds) & set(committed_seeds))
    }
    largest = max([*score_diff.values(), *per_arm.values()], default=0.0)
    result = {
        "results": str(results),
        "reference": str(reference),
        "run_ids": {
            "both": len(common),
            "only_here": sorted(set(mine) - set(theirs)),
            "only_committed": sorted(set(theirs) - set(mine)),
            "written_anew": len(rewritten),
        },
        "verdicts": {"compared": len(set(verdicts) & set(committed_verdicts)), "differ": {
            key: [verdicts.get(key), committed_verdicts.get(key)] for key in changed}},
        "largest_per_seed_difference": per_arm,
        "largest_difference": largest,
        "cpu": {"here": cpus(mine.values()), "committed": cpus(theirs.values())},
    }  # fmt: skip
    threads = sorted({(_threads(mine[rid]), _threads(theirs[rid])) for rid in rewritten
                      if _threads(mine[rid]) != _threads(theirs[rid])})  # fmt: skip
    result["torch_threads_differ"] = [list(pair) for pair in threads]
    return {**result, **_outcome(result, _vendors(mine.values()), _vendors(theirs.values()))}


def _threads(path: Path) -> int | None:
    """The torch thread count a run trained with: the order of its sums, so its last bits."""
    return read_json(path).get("torch_threads")


def _outcome(result: dict[str, Any], here: set[str], committed: set[str]) -> dict[str, str]:
    ids = result["run_ids"]
    problems = []
    if result["verdicts"]["differ"]:
        problems.append(
            "verdicts " + "; ".join(f"{k}: {a} here, {b} committed"
                                    for k, (a, b) in result["verdicts"]["differ"].items())
        )  # fmt: skip
    if ids["only_here"] or ids["only_committed"]:
        problems.append(
            f"run ids: {len(ids['only_here'])} only here, {len(ids['only_committed'])} "
            "only in the committed study (another configuration, or runs not finished)"
        )
    if problems:
        return {"outcome": DIFFERS, "sentence": "Differs from the committed study: "
                + "; ".join(problems) + "."}  # fmt: skip
    largest = result["largest_difference"]
    if largest == 0.0:
        return {
            "outcome": REPRODUCED,
            "sentence": f"Reproduced bit for bit: {ids['both']} "
            f"run ids, every verdict and score equal ({ids['written_anew']} run file(s) "
            "written anew by this run, the rest resumed from the committed files).",
        }
    if result.get("torch_threads_differ"):
        pairs = ", ".join(f"{a} here, {b} committed" for a, b in result["torch_threads_differ"])
        why = (f"another torch thread count in the run files that moved ({pairs}; "
               "OMP_NUM_THREADS: the sums' order)")  # fmt: skip
    elif here and committed and here != committed:
        why = f"another CPU vendor ({', '.join(sorted(here))} here, "
        why += f"{', '.join(sorted(committed))} committed; docs/reproducibility.md)"
    elif not committed:
        why = "the committed run files do not record their CPU (another vendor is the known cause)"
    else:
        why = "the same CPU vendor: not expected under pinned numerics (docs/reproducibility.md)"
    return {
        "outcome": WITHIN,
        "sentence": f"Verdicts identical, scores within {largest:.1e}: "
        f"{why}; {ids['both']} run ids, {ids['written_anew']} run file(s) written anew.",
    }


def lines(check: dict[str, Any]) -> list[str]:
    """The check as the command's last lines (and the report's last section)."""
    if "run_ids" not in check:
        return [check["sentence"]]
    ids, per_arm = check["run_ids"], check["largest_per_seed_difference"]
    moved = {k: v for k, v in per_arm.items() if v}
    out = [
        f"Compared with the committed study ({check['reference']}): {ids['both']} run ids in "
        f"both, {len(ids['only_here'])} only here, {len(ids['only_committed'])} only committed; "
        f"{check['verdicts']['compared']} verdicts compared, "
        f"{len(check['verdicts']['differ'])} differ.",
        f"Largest per-seed test-score difference per arm: {len(per_arm) - len(moved)} of "
        f"{len(per_arm)} arms 0"
        + ("" if not moved else "; " + ", ".join(f"{k} {v:.1e}" for k, v in moved.items())),
        "CPU here: " + "; ".join(check["cpu"]["here"] or ["no run files"]),
        "CPU of the committed study: " + "; ".join(check["cpu"]["committed"] or ["no run files"]),
        check["sentence"],
    ]
    return out


def write_check(check: dict[str, Any], out_dir: str | Path) -> Path:
    """The check as ``<out_dir>/reproduction.json`` (a user's run folder, never committed)."""
    return write_json(resolve(out_dir) / paths.REPRODUCTION_FILE, check)


def seed_results(preset: str) -> int:
    """Copy the committed study's files that ``out/<preset>/results`` lacks into it, so a
    user's run resumes from the committed runs (each skipped when its file is there) and
    the committed folder is never written; files already there (this user's) are kept.
    The number of files copied (0 without a committed study or an output folder)."""
    here, committed = (
        resolve(paths.results_dir(preset)),
        resolve(paths.committed_results_dir(preset)),
    )
    if here == committed or not committed.is_dir():
        return 0
    copied = 0
    for source in sorted(committed.rglob("*")):
        target = here / source.relative_to(committed)
        if source.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            copied += 1
    return copied
