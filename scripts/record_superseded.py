"""Keep what a bench rerun after a bug fix replaced, so the report shows before and after.

    python scripts/record_superseded.py --previous OLD/bench_report.json \
        --bench-dir data/results/full/lm --reason "what was wrong" --fix "commit / issue"

Copy the old ``bench_report.json`` aside before the rerun overwrites it, rerun the bench,
then run this: it writes ``<bench-dir>/superseded.json`` (``rpka.study.index.record_superseded``),
which the report's track section reads.
"""

from __future__ import annotations

import argparse

from rpka.study.index import record_superseded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--previous", required=True, help="the replaced bench_report.json")
    parser.add_argument("--bench-dir", required=True, help="the rerun bench's folder")
    parser.add_argument("--reason", required=True, help="what was wrong")
    parser.add_argument("--fix", required=True, help="where it was fixed (commit, issue)")
    args = parser.parse_args(argv)
    print(record_superseded(args.previous, args.bench_dir, args.reason, args.fix))


if __name__ == "__main__":
    main()
