"""Drop-in reading (issue 14 item 6) and trained-model exactness (issue 13 item 4): the
command line of ``rpka.study.dropin.drop_in`` (see that module for what it measures).

Exact's trained model of a finished bench with its attention swapped for another method
at inference, scored per seed on the test split; written to ``<bench-dir>/drop_in.json``.
Missing weights (a clone of the committed study) are retrained from the run file first.

    PYTHONPATH=. python scripts/drop_in.py --bench-dir data/results/full/forecast-motif \
        [--ranks 16 32 64 full] [--methods rpka nystrom-uniform keys-coreset] \
        [--windows 500] [--out data/results/full/forecast-motif/drop_in.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from rpka.study.dropin import DEFAULT_METHODS, DEFAULT_RANKS, drop_in


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, required=True)
    parser.add_argument("--ranks", nargs="+", default=list(DEFAULT_RANKS))
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    parser.add_argument("--items", type=int, default=4, help="test items of the output error")
    parser.add_argument(
        "--windows", type=int, help="score the first N test items only (default: all)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.windows is not None and args.windows < 1:
        parser.error(f"--windows must be an integer >= 1, got {args.windows}")
    torch.set_num_threads(1)
    out = args.out or args.bench_dir / "drop_in.json"
    drop_in(
        args.bench_dir,
        args.ranks,
        args.methods,
        args.items,
        args.windows,
        out,
        log=lambda line: print(line, flush=True),
    )
    print(f"written to {out}")


if __name__ == "__main__":
    main()
