"""One-off migration (issue 43, finding 1): give every committed result file its checksum.

    python scripts/seal_results.py [FOLDER ...]   (default: the committed studies' folders)

``rpka.io.seal_result_json`` adds the ``sha256`` key of each JSON object's payload as it
stands and changes nothing else (each file is read back and compared with what it held).
Once every result file of a study carries the key, a file without it among them is
refused (``rpka.study.results_check``, ``rpka.bench.set_aside_unsealed``): a deleted key is no
longer read as a legacy file. Files already sealed are checked, not rewritten; a file whose
checksum does not match is refused, and so is a bench report whose summaries disagree with
its own per-seed scores (``rpka.verdict.consistency``: an edit a new checksum would hide;
issue 56). Run on 2026-12-03 over data/results/{full,standard,
scaling}; a second run changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rpka.io import CHECKSUM_KEY, seal_result_json
from rpka.paths import BENCH_REPORT_FILE, resolve
from rpka.verdict.consistency import bench_report_problems

FOLDERS = ("data/results/full", "data/results/standard", "data/results/scaling")


class RefusedToSeal(ValueError):
    """A file whose content contradicts itself: sealing it would certify an edit."""


def seal_folder(folder: Path) -> list[Path]:
    """Seal every ``*.json`` object under ``folder``; the files rewritten. A bench report
    whose summaries its per-seed scores do not give is refused (:class:`RefusedToSeal`)
    before any file is written."""
    for path in sorted(folder.rglob(BENCH_REPORT_FILE)):
        data = json.loads(path.read_text())
        problems = bench_report_problems(data) if isinstance(data, dict) else []
        if problems:
            raise RefusedToSeal(
                f"{path}: not sealed: its summaries disagree with its own per-seed scores: "
                f"{problems[0]}"
            )
    sealed = []
    for path in sorted(folder.rglob("*.json")):
        before = json.loads(path.read_text())
        if seal_result_json(path):
            after = json.loads(path.read_text())
            after.pop(CHECKSUM_KEY)
            assert after == before, f"{path}: sealing changed a value"
            sealed.append(path)
    return sealed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", default=FOLDERS)
    args = parser.parse_args(argv)
    for folder in args.folders:
        try:
            sealed = seal_folder(resolve(folder))
        except RefusedToSeal as err:
            print(f"seal_results: {err}", file=sys.stderr)
            return 2
        print(f"{folder}: sealed {len(sealed)} file(s)", file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
