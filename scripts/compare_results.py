"""Compare two result trees number by number: is a refactor bit-identical?

    python scripts/compare_results.py BEFORE_DIR AFTER_DIR [--tolerance 0]

Every ``*.json`` under BEFORE_DIR is paired with the file at the same relative path under
AFTER_DIR; every numeric leaf (and every string or bool leaf) is compared, except under
keys that hold measurements of time, machine or place (``IGNORED_KEYS``: timings, wall
and CPU seconds, versions, paths, dates, checksums). Prints the largest absolute
difference of the numbers, every mismatch (up to ``--show``), files missing on either
side, and exits 1 if a difference exceeds ``--tolerance`` (0: bit for bit) or a file or
key is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# keys whose values are measurements of time, the machine or the place, or checksums
# (sha256, state_sha256: they cover timings and file bytes): never compared
IGNORED_KEYS = re.compile(
    r"(^|_)(timings?|step_ratio|speedup|ratio_vs_baseline|wall(_s)?|cpu(_s)?|seconds|elapsed|ms|step_ms_median|step_ms|"
    r"versions?|device|platform|hostname|path|paths|dir|file|run_file|state_path|date|"
    r"time|created|load_average|load|data_dir|out|out_dir|peak_mib|memory|mib|sha256)($|_)"
)


def leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf, skipping ignored keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            if IGNORED_KEYS.search(str(key)):
                continue
            yield from leaves(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def compare(before: Path, after: Path, tolerance: float = 0.0) -> tuple[float, list[str]]:
    """The largest absolute numeric difference and the list of problems."""
    problems: list[str] = []
    worst = 0.0
    for old_file in sorted(before.rglob("*.json")):
        rel = old_file.relative_to(before)
        new_file = after / rel
        if not new_file.exists():
            problems.append(f"{rel}: missing in {after}")
            continue
        old = dict(leaves(json.loads(old_file.read_text())))
        new = dict(leaves(json.loads(new_file.read_text())))
        for key in sorted(set(old) | set(new)):
            if key not in new or key not in old:
                problems.append(f"{rel}:{key}: only in {'before' if key in old else 'after'}")
                continue
            a, b = old[key], new[key]
            numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
            if numbers:
                if math.isnan(a) and math.isnan(b):
                    continue
                diff = abs(a - b) if math.isfinite(a) and math.isfinite(b) else float(a != b)
                worst = max(worst, diff)
                if diff > tolerance:
                    problems.append(f"{rel}:{key}: {a!r} != {b!r} (|diff| {diff:.3g})")
            elif a != b:
                problems.append(f"{rel}:{key}: {a!r} != {b!r}")
    for new_file in sorted(after.rglob("*.json")):
        if not (before / new_file.relative_to(after)).exists():
            problems.append(f"{new_file.relative_to(after)}: only in {after}")
    return worst, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--show", type=int, default=40, help="mismatches to print")
    args = parser.parse_args(argv)
    n_files = len(list(args.before.rglob("*.json")))
    worst, problems = compare(args.before, args.after, args.tolerance)
    print(f"{n_files} files; max |diff| of numbers {worst:.3g}; {len(problems)} problem(s)")
    for line in problems[: args.show]:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
