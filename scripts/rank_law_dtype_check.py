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
from rpka.study.dropin import swapped_model
from rpka.study.rank_law.dropin import EVAL_BATCH, METRIC, per_seed, trained_cell
from rpka.study.rank_law.grid import parse_cell
from rpka.training.train import evaluate
from rpka.verdict.frontier import per_seed_gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", required=True)
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--results", default=paths.RANK_LAW_RESULTS)
    args = parser.parse_args()
    trained = trained_cell(parse_cell(args.cell), args.results)
    control = per_seed(trained.report, MEAN_CONTROL.name, trained.seeds)
    for dtype in (torch.float32, torch.float64):

        def score(method: str, rank: int, dtype: torch.dtype = dtype) -> list[float]:
            model = swapped_model(trained.run_config, trained.state, method, rank, dtype,
                                  pivot_method="accelerated")  # fmt: skip
            inputs, targets = trained.x.to(dtype), trained.y.to(dtype)
            return evaluate(model, trained.task, inputs, targets, EVAL_BATCH, per_member=True)[
                METRIC
            ].tolist()

        exact = score("exact", 1)
        for rank in args.ranks:
            g = per_seed_gap(control, exact, score("rpka", rank), "lower")
            print(f"{str(dtype):>14} rank {rank:>4}: g per seed {g.round(3).tolist()}")


if __name__ == "__main__":
    main()
