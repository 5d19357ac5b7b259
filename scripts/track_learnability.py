"""Do the new tracks need attention? exact attention against the control ``mean`` (uniform
attention, q = 0) and the linear least-squares forecast, per track (issue 14).

Tracks: ``forecast-motif`` and ``forecast-regimes`` (short form) with the encoder
``TransformerTiny`` (flatten head + linear skip), ``recall`` (MQAR) with the causal
``TransformerLM``; model, loss and metrics are the registered tasks' (``rpka.tracks``;
recall's loss and error are taken at the query positions only). The seeds of an arm
train as one stacked model. The loop is ``rpka.study.learnability.train_arm``, not
``rpka.training.train.train_run``, because it counts optimiser *steps* on fresh random batches
(the learnability question is "does it learn in N steps"), where the bench counts epochs:
AdamW, linear warm-up over 5 % of the steps then a half-cosine decay, gradients clipped
per member to norm 1.

The issue's bars: motif exact <= 0.3 x linear test MSE and control >= 25 % worse than
exact; recall exact >= 95 % query accuracy at the training length.

    python scripts/track_learnability.py --track forecast-motif --steps 3000 --seeds 0 1
    python scripts/track_learnability.py --track recall --d-model 64 --steps 3000

Results are merged into ``--out`` (default data/results/track_learnability.json) under
``tracks.<track>.arms.<arm>`` with per-seed metrics, wall and CPU seconds, and the command.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rpka.io import read_json, write_json
from rpka.model import ModelConfig
from rpka.study.learnability import train_arm
from rpka.tracks import get_task
from rpka.tracks.motif import MotifConfig
from rpka.tracks.recall import RecallConfig
from rpka.tracks.regimes import RegimesConfig

TRACKS = ("forecast-motif", "forecast-regimes", "recall")
ARMS = ("exact", "mean")
DEFAULT_OUT = Path("data/results/track_learnability.json")
# the learnability bars
MOTIF_LINEAR_RATIO = 0.3
CONTROL_WORSE = 0.25
RECALL_ACCURACY = 0.95


def track_config(name: str, args: argparse.Namespace) -> Any:
    if name == "recall":
        return RecallConfig(
            vocab_size=args.vocab,
            n_pairs=args.pairs,
            n_queries=args.pairs,
            seq_len=args.seq_len,
            n_train=args.n_train,
        )
    return {"forecast-motif": MotifConfig, "forecast-regimes": RegimesConfig}[name](
        n_train=args.n_train
    )


def model_config(name: str, args: argparse.Namespace) -> ModelConfig:
    recall = name == "recall"
    default_kernel = 1 if recall else 17 if name == "forecast-motif" else 5
    return ModelConfig(
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        d_ff=2 * args.d_model,
        embed_kernel=args.embed_kernel or default_kernel,
        linear_skip=not recall,
        previous_tokens=int(recall and args.previous_token),
    )


def baselines(name: str, track: Any) -> dict[str, Any]:
    """Linear least squares (fit on train) and the mean forecast; recall: chance accuracies."""
    naive = get_task(name).naive_baselines(track)
    if name == "recall":
        return {k: 1 - row["test"]["error"] for k, row in naive["predictors"].items()}
    return {f"{k}_test_mse": f["test"]["mse"] for k, f in naive["forecasts"].items()}


def verdict(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The issue's bars, on the seeds' mean test metric (where both arms have run)."""
    arms = entry["arms"]
    if (
        "exact" not in arms
        or "test_accuracy" not in arms["exact"]
        and "test_mse" not in arms["exact"]
    ):
        return {}
    if name == "recall":
        exact = float(np.mean(arms["exact"]["test_accuracy"]))
        out = {"exact_accuracy": exact, "bar": RECALL_ACCURACY, "met": exact >= RECALL_ACCURACY}
        if "mean" in arms and "test_accuracy" in arms["mean"]:
            out["control_accuracy"] = float(np.mean(arms["mean"]["test_accuracy"]))
        return out
    exact = float(np.mean(arms["exact"]["test_mse"]))
    linear = entry["baselines"]["linear_test_mse"]
    out = {"exact_mse": exact, "exact_over_linear": exact / linear}
    if name == "forecast-motif":
        out["linear_bar"] = MOTIF_LINEAR_RATIO
        out["meets_linear_bar"] = exact <= MOTIF_LINEAR_RATIO * linear
    if "mean" in arms and "test_mse" in arms["mean"]:
        control = float(np.mean(arms["mean"]["test_mse"]))
        out["control_mse"] = control
        out["control_rel"] = control / exact - 1
        out["control_bar"] = CONTROL_WORSE
        out["meets_control_bar"] = control / exact - 1 >= CONTROL_WORSE
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--track", choices=TRACKS, required=True)
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--embed-kernel", type=int, default=0, help="0: 17 motif, 5 regimes")
    parser.add_argument("--n-train", type=int, default=20_000)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument(
        "--previous-token", action="store_true", help="recall: model.previous_tokens=1"
    )
    parser.add_argument("--log-every", type=int, default=250)
    parser.add_argument("--tag", default="", help="suffix of the arm's key (sweeps)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise ValueError(f"--lr must be a positive finite number, got {args.lr}")
    torch.set_num_threads(1)

    task = get_task(args.track)
    config = track_config(args.track, args)
    track = task.load(config)
    splits = {split: task.inputs_targets(track, split) for split in ("train", "val", "test")}
    results = read_json(args.out) if args.out.exists() else {"tracks": {}}
    entry = results["tracks"].setdefault(args.track, {"arms": {}})
    entry["config"] = dict(vars(config))
    entry["baselines"] = baselines(args.track, track)
    print(args.track, entry["baselines"], flush=True)
    for method in args.arms:
        arm = train_arm(
            args.track, config, model_config(args.track, args), splits, args, method
        )
        arm.update(
            lr=args.lr,
            batch=args.batch,
            d_model=args.d_model,
            layers=args.layers,
            heads=args.heads,
            embed_kernel=args.embed_kernel,
            previous_token=args.previous_token,
            torch_threads=1,
            command=" ".join(["python", *sys.argv]),
        )
        print(args.track, method, {k: v for k, v in arm.items() if k != "loss_curve"}, flush=True)
        results = read_json(args.out) if args.out.exists() else {"tracks": {}}  # others' runs
        entry = results["tracks"].setdefault(args.track, entry)
        entry["arms"][method + args.tag] = arm
        entry["learnability"] = verdict(args.track, entry)
        write_json(args.out, results)
    print(args.track, entry.get("learnability"), flush=True)


if __name__ == "__main__":
    main()
