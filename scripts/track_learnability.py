"""Do the new tracks need attention? exact attention against the control ``mean`` (uniform
attention, q = 0) and the linear least-squares forecast, per track (issue 14).

Tracks: ``forecast-motif`` and ``forecast-regimes`` (short form) with the encoder
``TransformerTiny`` (flatten head + linear skip), ``recall`` (MQAR) with the causal
``TransformerLM``. The seeds of an arm train as one stacked model (``rpka.model``); the
loop is written here rather than reusing ``rpka.train.train_run`` because that one reaches
tracks through ``rpka.tasks``, which does not know these tracks yet, and because recall's
loss is taken at the query positions only (a mask the bench's lm loss does not have).
AdamW, constant learning rate after a short warm-up then a half-cosine decay, gradients
clipped per member to norm 1, fresh batches of the training split every step.

The issue's bars: motif exact <= 0.3 x linear test MSE and control >= 25 % worse than
exact; recall exact >= 95 % query accuracy at the training length.

    python scripts/track_learnability.py --track forecast-motif --steps 3000 --seeds 0 1
    python scripts/track_learnability.py --track recall --steps 3000 --lr 1e-3

Results are merged into ``--out`` (default data/results/track_learnability.json) under
``tracks.<track>.arms.<arm>`` with per-seed metrics, wall and CPU seconds, and the command.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.io import read_json, write_json
from rpka.model import TransformerLM, TransformerTiny
from rpka.presets import ModelConfig
from rpka.tracks.baselines import fit_linear, linear_forecast
from rpka.tracks.motif import MotifConfig, load_motif
from rpka.tracks.recall import IGNORE, RecallConfig, load_recall, recall_baselines
from rpka.tracks.regimes import RegimesConfig, load_regimes
from rpka.train import clip_per_member, derive_seed, lr_factor

TRACKS = ("forecast-motif", "forecast-regimes", "recall")
ARMS = ("exact", "mean")
DEFAULT_OUT = Path("data/results/track_learnability.json")
# the learnability bars
MOTIF_LINEAR_RATIO = 0.3
CONTROL_WORSE = 0.25
RECALL_ACCURACY = 0.95


def track_data(name: str, args: argparse.Namespace) -> tuple[Any, dict[str, tuple[Tensor, Tensor]]]:
    """(config, {split: (inputs, targets)}) of a track, from the cache under data/cache."""
    if name == "recall":
        config = RecallConfig(
            vocab_size=args.vocab,
            n_pairs=args.pairs,
            n_queries=args.pairs,
            seq_len=args.seq_len,
            n_train=args.n_train,
        )
        track = load_recall(config)
        splits = {s: tuple(torch.from_numpy(a) for a in track.split(s)) for s in config.split_names}
        return config, splits
    cls, load = {
        "forecast-motif": (MotifConfig, load_motif),
        "forecast-regimes": (RegimesConfig, load_regimes),
    }[name]
    config = cls(n_train=args.n_train)
    track = load(config)
    return config, {s: (track.split(s).x, track.split(s).y) for s in ("train", "val", "test")}


def build_model(
    name: str, config: Any, args: argparse.Namespace, seeds: list[int], method: str
) -> nn.Module:
    init = [derive_seed(s, 0) for s in seeds]
    if name == "recall":
        model_config = ModelConfig(
            d_model=args.d_model,
            n_layers=args.layers,
            n_heads=args.heads,
            d_ff=2 * args.d_model,
            embed_kernel=1,
            linear_skip=False,
        )
        return TransformerLM(model_config, config.vocab_size, config.max_len, init, method)
    model_config = ModelConfig(
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        d_ff=2 * args.d_model,
        embed_kernel=args.embed_kernel or (17 if name == "forecast-motif" else 5),
    )
    return TransformerTiny(model_config, config.context, config.horizon, init, method)


def member_loss(name: str, pred: Tensor, y: Tensor) -> Tensor:
    """Per-member training loss (S,): MSE, or recall's cross-entropy at query positions."""
    if name != "recall":
        return (pred - y).pow(2).mean((1, 2))
    nll = F.cross_entropy(pred.flatten(0, 2), y.flatten().clamp(min=0), reduction="none")
    mask = (y != IGNORE).flatten(1).float()
    return (nll.view_as(mask) * mask).sum(1) / mask.sum(1)


@torch.no_grad()
def evaluate(name: str, model: nn.Module, x: Tensor, y: Tensor, batch: int = 250) -> list[float]:
    """Per-member test metric: MSE (forecasts) or query accuracy (recall)."""
    model.eval()
    s = model.n_members
    total = torch.zeros(s, dtype=torch.float64)
    count = 0
    for start in range(0, len(x), batch):
        xb, yb = x[start : start + batch], y[start : start + batch]
        pred = model(xb.expand(s, *xb.shape))
        if name == "recall":
            mask = yb != IGNORE
            total += ((pred.argmax(-1) == yb) & mask).flatten(1).sum(1).double()
            count += int(mask.sum())
        else:
            total += (pred - yb).double().pow(2).flatten(1).sum(1)
            count += yb.numel()
    model.train()
    return (total / count).tolist()


def train_arm(
    name: str, config: Any, splits: dict, args: argparse.Namespace, method: str
) -> dict[str, Any]:
    """Train the stacked seeds of one arm; per-seed metrics on every evaluation split."""
    seeds = list(args.seeds)
    model = build_model(name, config, args, seeds, method)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup) * lr_factor("cosine", step, args.steps),
    )
    train_x, train_y = splits["train"]
    gens = [torch.Generator().manual_seed(derive_seed(s, 1)) for s in seeds]
    wall, cpu = time.perf_counter(), time.process_time()
    curve = []
    for step in range(args.steps):
        batch = torch.stack([torch.randint(len(train_x), (args.batch,), generator=g) for g in gens])
        loss = member_loss(name, model(train_x[batch]), train_y[batch])
        if not torch.isfinite(loss).all():
            return {"diverged_at_step": step, "seeds": seeds}
        loss.sum().backward()  # sum: each member's gradient is that of its own loss
        clip_per_member(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            curve.append([step, [round(v, 5) for v in loss.tolist()]])
            print(f"  {name} {method} step {step} loss {loss.tolist()}", flush=True)
    out: dict[str, Any] = {
        "seeds": seeds,
        "steps": args.steps,
        "train_wall_s": time.perf_counter() - wall,
        "train_cpu_s": time.process_time() - cpu,
        "loss_curve": curve,
    }
    metric = "accuracy" if name == "recall" else "mse"
    for split in splits:
        if split != "train":
            out[f"{split}_{metric}"] = evaluate(name, model, *splits[split])
    return out


def baselines(name: str, config: Any, splits: dict) -> dict[str, Any]:
    """Linear least squares (fit on train) and the mean forecast (0); recall: chance."""
    if name == "recall":
        return recall_baselines(config)
    x, y = (t.double().numpy() for t in splits["train"])
    weights = fit_linear(x, y)
    test_x, test_y = (t.double().numpy() for t in splits["test"])
    return {
        "linear_test_mse": float(np.mean((linear_forecast(test_x, weights) - test_y) ** 2)),
        "mean_test_mse": float(np.mean(test_y**2)),
    }


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
    parser.add_argument("--log-every", type=int, default=250)
    parser.add_argument("--tag", default="", help="suffix of the arm's key (sweeps)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise ValueError(f"--lr must be a positive finite number, got {args.lr}")
    torch.set_num_threads(1)

    config, splits = track_data(args.track, args)
    results = read_json(args.out) if args.out.exists() else {"tracks": {}}
    entry = results["tracks"].setdefault(args.track, {"arms": {}})
    entry["config"] = {k: v for k, v in vars(config).items()}
    entry["baselines"] = baselines(args.track, config, splits)
    print(args.track, entry["baselines"], flush=True)
    for method in args.arms:
        arm = train_arm(args.track, config, splits, args, method)
        arm.update(
            lr=args.lr,
            batch=args.batch,
            d_model=args.d_model,
            layers=args.layers,
            heads=args.heads,
            embed_kernel=args.embed_kernel,
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
