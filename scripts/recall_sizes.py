"""Size the recall (MQAR) presets: train one arm of the ``gate`` preset with overrides through
the bench's own loop (``rpka.training.train.train_run``: epochs, Adam, cosine, per-member clipping,
validation every epoch) and record its test query accuracy at the training length and at
2x / 4x, its validation error per epoch, and its CPU seconds.

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/recall_sizes.py --arm exact --lr 3e-3 \\
        --epochs 2 --n-train 10000 --batch 64 --n-eval 250 --seeds 100 101

Each run is appended to ``--out`` (default data/results/recall_sizes.json) under ``runs``
with the command; the presets' comment in ``rpka/config/presets.py`` quotes these runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from rpka.config.presets import get_preset
from rpka.io import read_json, write_json
from rpka.training.run_config import make_run_config
from rpka.training.train import train_run

DEFAULT_OUT = Path("data/results/recall_sizes.json")


def accuracies(scores: dict[str, list]) -> dict[str, list]:
    """{error metric: per-seed error} -> {"accuracy<suffix>": per-seed accuracy}."""
    return {
        f"accuracy{metric.removeprefix('error')}": [None if v is None else 1 - v for v in values]
        for metric, values in scores.items()
        if metric.startswith("error")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", default="exact", help="an arm of the gate or full preset")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--n-train", type=int, default=10_000)
    parser.add_argument("--n-eval", type=int, default=250, help="validation and test sequences")
    parser.add_argument("--seeds", type=int, nargs="+", default=[100])
    parser.add_argument("--data-dir", default=None, help="track cache (default: the project's)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise ValueError(f"--lr must be a positive finite number, got {args.lr}")
    torch.set_num_threads(1)
    config = get_preset(
        "full",
        "recall",
        model={"d_model": args.d_model, "d_ff": 2 * args.d_model},
        train={"epochs": args.epochs, "batch_size": args.batch},
        track={"n_train": args.n_train, "n_val": args.n_eval, "n_test": args.n_eval},
    )
    run_config = make_run_config(
        config, config.arm(args.arm), args.lr, args.seeds, "test", args.data_dir
    )
    result = train_run(run_config)
    row = {
        "arm": args.arm,
        "lr": args.lr,
        "epochs": args.epochs,
        "batch": args.batch,
        "d_model": args.d_model,
        "n_train": args.n_train,
        "n_eval": args.n_eval,
        "seeds": args.seeds,
        "steps": result["n_steps"],
        "test": accuracies(result["scores"]),
        "val_error_per_epoch": [m["val_error"] for m in result["members"]],
        "cpu_s": result["cpu_s"],
        "wall_s": result["wall_s"],
        "torch_threads": 1,
        "command": " ".join(["python", *sys.argv]),
    }
    print(row, flush=True)
    results = read_json(args.out) if args.out.exists() else {"runs": []}
    results["runs"].append(row)
    write_json(args.out, results)


if __name__ == "__main__":
    main()
