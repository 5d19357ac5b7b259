"""Short step-counted training for the learnability question "does exact attention learn
this track in N optimiser steps?" (``scripts/track_learnability.py``, issue 14).

Unlike ``rpka.training.train.train_run`` (epochs over the training split), :func:`train_arm` counts
optimiser *steps* on fresh random batches: AdamW, linear warm-up over 5 % of the steps then
a half-cosine decay (``rpka.training.train.lr_factor``), gradients clipped per member to norm 1
(``rpka.training.train.clip_per_member``). The seeds of an arm train as one stacked model; model,
loss and metrics are the registered task's (``rpka.tracks``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import Tensor

from rpka.tracks import get_task
from rpka.tracks.recall import LENGTH_METRICS
from rpka.training.run_config import derive_seed
from rpka.training.train import clip_per_member, evaluate, lr_factor

EVAL_BATCH = 250


def train_arm(
    name: str,
    config: Any,
    model_config: Any,
    splits: dict[str, tuple[Tensor, Tensor]],
    args: argparse.Namespace,
    method: str,
) -> dict[str, Any]:
    """Train the stacked seeds of one arm (``model_config`` a ``rpka.model.ModelConfig``,
    ``args`` the script's options); per-seed metrics on every evaluation split."""
    task = get_task(name)
    seeds = list(args.seeds)
    init = [derive_seed(s, 0) for s in seeds]
    model = task.build_model(model_config, config, init, method, {})
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
        loss = task.loss(model(train_x[batch]), train_y[batch])  # (S,)
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
    for split, (x, y) in splits.items():
        if split == "train":
            continue
        metrics = evaluate(model, task, x, y, EVAL_BATCH)
        if "error" in metrics:  # recall: val / test hold every length (rpka.tracks.recall)
            out[f"{split}_accuracy"] = (1 - metrics["error"]).tolist()
            for metric in LENGTH_METRICS:
                out[f"{split}{metric.removeprefix('error')}_accuracy"] = (
                    1 - metrics[metric]
                ).tolist()
        else:
            out[f"{split}_mse"] = metrics["mse"].tolist()
    return out
