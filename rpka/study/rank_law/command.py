"""The rank-law study's command line (docs/rank_law.md):

    python -m rpka rank-law price  [--cells NAME ...]   # CPU-s per cell, before running
    python -m rpka rank-law train  [--cells NAME ...]   # exact + control per cell (resumes)
    python -m rpka rank-law dropin [--cells NAME ...]   # the drop-in reading per cell
    python -m rpka rank-law predict --cells NAME [--method M]  # the held-out cell's r*
    python -m rpka rank-law confirm --cells NAME --rank R  # RPKA, uniform trained at R, R/2
    python -m rpka rank-law planted                     # the planted positive control
    python -m rpka rank-law index                       # the fit and rank_law.json
    python -m rpka rank-law heads                       # law v2: heads.json (per head)
    python -m rpka rank-law planted-law                 # law v2: planted_heads.json
    python -m rpka rank-law fit-v2                      # law v2: the fit, held-out reading

``--cells`` defaults to the grid (``rpka.study.rank_law.grid.grid_cells``); a cell outside it
(the held-out one) is named ``p<p>-n<n>-d<d>-<background>``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rpka.study.cost_longctx import price_lines, price_longctx
from rpka.study.longctx import run_longctx
from rpka.study.rank_law.dropin import DROPIN_FILE, METHODS, bench_report_path, cell_dropin
from rpka.study.rank_law.grid import (
    RANK_LAW_RESULTS,
    cell_config,
    cell_dir,
    confirmation_config,
    confirmation_dir,
    grid_cells,
    parse_cell,
)
from rpka.study.rank_law.heads import (
    ALL_MODELS,
    HEADS_FILE,
    measure_heads,
    write_planted_heads,
)
from rpka.study.rank_law.law import predict, write_index
from rpka.study.rank_law.law_v2 import write_law_v2
from rpka.study.rank_law.planted import write_planted

STAGES = (
    "price",
    "train",
    "dropin",
    "predict",
    "confirm",
    "planted",
    "index",
    "heads",
    "planted-law",
    "fit-v2",
)


READS_RESULTS = ("dropin", "predict", "index", "fit-v2")  # stages that read a results folder


def check_results(stage: str, results: str, cells: list) -> None:
    """Before any work: a stage that reads results needs them there (ValueError naming
    ``--results``): the folder, a cell's drop-in for the index, the cells' trained bench
    reports for the drop-in, heads.json for fit-v2."""
    if stage not in READS_RESULTS:
        return
    root = Path(results)
    if not root.is_dir():
        raise ValueError(f"--results {results}: no such folder (the rank-law study's results)")
    if stage == "index" and not any((root / c.name / DROPIN_FILE).exists() for c in grid_cells()):
        raise ValueError(f"--results {results}: no cell's {DROPIN_FILE} (run rank-law dropin)")
    if stage == "fit-v2" and not (root / HEADS_FILE).exists():
        raise ValueError(f"--results {results}: no {HEADS_FILE} (run rank-law heads)")
    if stage == "dropin":
        missing = [c.name for c in cells if not bench_report_path(c, results).exists()]
        if missing:
            raise ValueError(f"--results {results}: no trained bench for cell(s) "
                             f"{', '.join(missing)} (run rank-law train first)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rpka rank-law", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--cells", nargs="+", help="cell names (default: the grid)")
    parser.add_argument("--results", default=RANK_LAW_RESULTS, help="default %(default)s")
    parser.add_argument("--rank", type=int, help="confirm: the drop-in r* to train at")
    parser.add_argument("--method", choices=METHODS, default="rpka",
                        help="predict: whose r* the law predicts (default rpka)")  # fmt: skip
    parser.add_argument("--tracks", nargs="+", choices=[m.name for m in ALL_MODELS],
                        help="heads: the models to measure, track or track@arm (default "
                             "all: the registered ones, then the deviation's)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, help="training processes, 1-2")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 2:
        parser.error(f"--workers must be 1 or 2, got {args.workers}")
    try:
        cells = [parse_cell(name) for name in args.cells] if args.cells else grid_cells()
    except ValueError as err:
        parser.error(str(err))
    progress = not args.no_progress
    try:
        check_results(args.stage, args.results, cells)
    except ValueError as err:
        parser.error(str(err))
    if args.stage == "heads":
        chosen = [m for m in ALL_MODELS if not args.tracks or m.name in args.tracks]
        measure_heads(args.results, tuple(chosen))
        return 0
    if args.stage == "planted-law":
        write_planted_heads(args.results)
        return 0
    if args.stage == "fit-v2":
        write_law_v2(args.results, log=print)
        return 0
    if args.stage == "index":
        write_index(args.results, log=print)
        return 0
    if args.stage == "planted":
        planted = write_planted(args.results)
        print(f"planted positive control: {'passed' if planted['passed'] else 'FAILED'}; "
              f"uniform landmarks missed {planted['negative_misses']} of "
              f"{planted['negative_readings']}")  # fmt: skip
        return 0
    if args.stage == "predict":
        if not args.cells or len(args.cells) != 1:
            parser.error("predict needs exactly one --cells NAME (the held-out cell)")
        try:
            held_out = predict(args.results, args.cells[0], args.method)
        except ValueError as err:
            parser.error(str(err))
        print(f"{held_out['cell']}: predicted r* {held_out['predicted_r_star']:.1f} "
              f"({held_out['file']})")  # fmt: skip
        return 0
    if args.stage == "confirm":
        if not args.cells or len(args.cells) != 1 or args.rank is None:
            parser.error("confirm needs one --cells NAME and --rank R (the cell's drop-in r*)")
        try:
            config = confirmation_config(cells[0], args.rank, args.workers)
        except ValueError as err:
            parser.error(str(err))
        run_longctx(config, confirmation_dir(cells[0], args.rank, args.results), progress=progress)
        return 0
    for cell in cells:
        out = cell_dir(cell, args.results)
        if args.stage == "price":
            result = price_longctx(cell_config(cell), out, progress=progress)
            print(cell.name, *price_lines(result), sep="\n  ")
        elif args.stage == "train":
            run_longctx(cell_config(cell, workers=args.workers), out, progress=progress)
        else:
            cell_dropin(cell, args.results, log=print)
    return 0
