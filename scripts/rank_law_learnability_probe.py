"""Does a rank-law cell learn with more training? (docs/rank_law.md, "Multi-pair cells")

Trains one cell's exact attention and control (``rpka.study.rank_law.grid.cell_config``) on two
seeds with ``--epochs`` epochs and learning rate ``--lr`` into ``--out`` (not the committed
results) and prints both arms' test MSE per seed: exact learns the cell when its MSE is
well below the control's.

    python scripts/rank_law_learnability_probe.py --cell p4-n512-d16-noise --epochs 4 --lr 0.01
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from rpka import paths
from rpka.config.bench import TrainConfig
from rpka.config.presets_longctx import LONGRANGE_TRAIN
from rpka.config.presets_tracks import MEAN_CONTROL
from rpka.io import read_json
from rpka.study.longctx import run_longctx
from rpka.study.rank_law.grid import cell_config, parse_cell

PROBE_SEEDS = (300, 301)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out", default="/tmp/rank_law_probe")
    args = parser.parse_args()
    cell = parse_cell(args.cell)
    train = TrainConfig(epochs=args.epochs, batch_size=LONGRANGE_TRAIN.batch_size,
                        warmup_steps=LONGRANGE_TRAIN.warmup_steps)  # fmt: skip
    config = cell_config(cell, seeds=PROBE_SEEDS, train=train)
    config = dataclasses.replace(config, bench=config.bench.replace(learning_rates=(args.lr,)))
    out = Path(args.out) / f"{cell.name}-e{args.epochs}-lr{args.lr:g}"
    started = time.process_time()
    run_longctx(config, out, progress=False)
    report = read_json(out / paths.longctx_context_dir(cell.n) / paths.BENCH_REPORT_FILE)
    for arm in ("exact", MEAN_CONTROL.name):
        scores = [round(s, 4) for s in report["arms"][arm]["full"]["per_seed"]]
        print(f"{cell.name} epochs {args.epochs} lr {args.lr:g}: {arm} test MSE {scores}")
    print(f"learnability bar met: {report['learnability']['met']}; "
          f"{time.process_time() - started:.0f} CPU-s")  # fmt: skip


if __name__ == "__main__":
    main()
