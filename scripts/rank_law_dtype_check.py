"""Is a dip of the drop-in's gap recovered with rank float32 round-off? (docs/rank_law.md)

Scores one rank-law cell's drop-in at the given ranks in float32 and float64 (same model,
same seeds' test windows, the accelerated pivot sampler) and prints the gap recovered per
seed. The same dip in both precisions means the estimator, not round-off.

    python scripts/rank_law_dtype_check.py --cell p1-n512-d16-noise --ranks 16 64
"""

from __future__ import annotations

import argparse

import torch

from rpka import paths
from rpka.config.presets_tracks import MEAN_CONTROL
from rpka.io import read_json, read_run_file
from rpka.study.dropin import swapped_model
from rpka.study.rank_law.dropin import EVAL_BATCH, METRIC, per_seed
from rpka.study.rank_law.grid import cell_dir, parse_cell
from rpka.tracks import get_task
from rpka.training.seed_data import run_splits
from rpka.training.train import evaluate, track_config_of
from rpka.training.trained import load_run_state
from rpka.verdict.frontier import per_seed_gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", required=True)
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--results", default=paths.RANK_LAW_RESULTS)
    args = parser.parse_args()
    cell = parse_cell(args.cell)
    bench_dir = cell_dir(cell, args.results) / paths.longctx_context_dir(cell.n)
    report = read_json(bench_dir / paths.BENCH_REPORT_FILE)
    run_file = bench_dir / "runs" / f"{report['arms']['exact']['run_ids'][0]}.json"
    run = read_run_file(run_file)
    run_config = {**run["config"], "device": "cpu"}
    state = load_run_state(run_file, run)
    task = get_task(report["track"])
    x, y = run_splits(run_config, task, track_config_of(run_config))["test"]
    control = per_seed(report, MEAN_CONTROL.name, run["seeds"])
    for dtype in (torch.float32, torch.float64):

        def score(method: str, rank: int, dtype: torch.dtype = dtype) -> list[float]:
            model = swapped_model(run_config, state, method, rank, dtype,
                                  pivot_method="accelerated")  # fmt: skip
            inputs, targets = x.to(dtype), y.to(dtype)
            return evaluate(model, task, inputs, targets, EVAL_BATCH, per_member=True)[
                METRIC
            ].tolist()

        exact = score("exact", 1)
        for rank in args.ranks:
            g = per_seed_gap(control, exact, score("rpka", rank), "lower")
            print(f"{str(dtype):>14} rank {rank:>4}: g per seed {g.round(3).tolist()}")


if __name__ == "__main__":
    main()
