"""Does a long-context configuration learn, and what does a training step cost? (issue 14)

The measurements behind ``rpka.config.presets_longctx.LONGCTX_PRESETS``: one bench run per
arm (the study's own ``rpka.training.train.train_run``: its data, model, loss and schedule)
on the long-context preset's track and model at one context, with fields replaced from the
command line, and its test MSE beside the naive forecasts; or (``--step-time``) the CPU time
of one training step of every arm of the preset at each of its contexts.

    python scripts/longctx_probe.py --context 512 --arms exact mean-attention
    python scripts/longctx_probe.py --context 128 --track '{"period_max": 16}' \\
        --model '{"readout": "flatten"}' --lr 3e-3
    python scripts/longctx_probe.py --step-time
    python scripts/longctx_probe.py --preset longrange --context 512 \
        --arms exact local-w128 mean-attention
    python scripts/longctx_probe.py --preset longrange --context 2048 --arms exact \
        --warm-start-from 512

``--warm-start-from C`` (a curriculum probe, issue 27): each arm is first trained at context
C, then at ``--context`` starting from those weights, its learned positions stretched to the
longer context by linear interpolation - the long-range study's own warm start
(``rpka.training.curriculum``).

Fields: ``--track`` / ``--model`` / ``--train`` are JSON objects replacing fields of the
``--preset``'s template (default ``full``; track resized to ``--context`` with
``--train-windows`` and ``--eval-windows``). One thread per process (as in the bench's
workers); on a machine shared with other jobs the wall times are slow, the CPU times less so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from rpka.config.presets_longctx import LONGCTX_PRESETS
from rpka.training.run_config import make_run_config
from rpka.training.train import build_model, track_config_of, train_run

DATA_DIR = "data/cache"


def probe_bench(args: argparse.Namespace):
    """The preset's bench at ``args.context`` with the command line's fields replaced (and
    ``--warm-start-from``'s first stage: ``Design.warm_start_track``,
    ``rpka.training.curriculum``)."""
    bench = LONGCTX_PRESETS[args.preset].bench
    task = bench.task
    track = dataclasses.replace(bench.design.track, **json.loads(args.track))
    windows = (args.train_windows, args.eval_windows)
    sized = task.at_context(track, args.context, *windows)
    warm = task.at_context(track, args.warm_start_from, *windows) if args.warm_start_from else None
    model = dataclasses.replace(bench.design.model, **json.loads(args.model))
    train = dataclasses.replace(bench.design.train, **json.loads(args.train))
    return bench.replace(track=sized, model=model, train=train, warm_start_track=warm)


def learn(args: argparse.Namespace) -> None:
    bench = probe_bench(args)
    bench.validate()
    task = bench.task
    naive = task.naive_baselines(task.load(bench.design.track, DATA_DIR))["forecasts"]
    print(f"track {bench.design.track}\nmodel {bench.design.model}\ntrain {bench.design.train}")
    print("naive test MSE:", {k: round(v["test"]["mse"], 3) for k, v in naive.items()})
    for name in args.arms:
        run_config = make_run_config(bench, bench.arm(name), args.lr, args.seeds, "test", DATA_DIR)
        out = train_run(run_config)
        first = out.get("warm_start")
        print(
            f"{name}: test MSE {[round(x, 3) for x in out['scores']['mse']]}, "
            f"{out['n_steps']} steps, {out['cpu_s']:.0f} CPU-s, {out['wall_s']:.0f} s wall"
            + (
                f" (first stage at {first['context']}: val MSE "
                f"{[round(x, 3) for x in first['val']['mse']]}, {first['cpu_s']:.0f} CPU-s)"
                if first
                else ""
            ),
            flush=True,
        )


def step_time(preset: str) -> None:
    """CPU seconds of one training step (1 seed, one batch, Adam), best of 3 after a warm-up."""
    config = LONGCTX_PRESETS[preset]
    batch = config.bench.design.train.batch_size
    for context in config.contexts:
        bench = config.bench_for(context)
        for arm in bench.design.arms:
            run_config = make_run_config(bench, arm, bench.design.learning_rates[0], [100], "test")
            model = build_model(run_config, track_config_of(run_config), torch.device("cpu"))
            optimizer = torch.optim.Adam(model.parameters(), bench.design.learning_rates[0])
            x = torch.randn(1, batch, context)
            y = torch.randn(1, batch, bench.design.track.horizon)
            times = []
            for _ in range(4):
                start = time.process_time()
                (model(x) - y).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                times.append(time.process_time() - start)
            print(f"{context:>5} {arm.name:<15} {min(times[1:]):.3f} CPU-s / step", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="full", choices=sorted(LONGCTX_PRESETS))
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--arms", nargs="+", default=["exact", "mean-attention"])
    parser.add_argument("--track", default="{}", help="JSON: track fields to replace")
    parser.add_argument("--model", default="{}", help="JSON: model fields to replace")
    parser.add_argument("--train", default="{}", help="JSON: training fields to replace")
    parser.add_argument("--train-windows", type=int, default=None, help="default: the preset's")
    parser.add_argument("--eval-windows", type=int, default=None, help="default: the preset's")
    parser.add_argument("--lr", type=float, default=None, help="default: the preset's first")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--step-time", action="store_true", help="only time one step per arm")
    parser.add_argument("--warm-start-from", type=int, default=None,
                        help="train each arm at this context first, then continue at --context")
    args = parser.parse_args()
    preset = LONGCTX_PRESETS[args.preset]
    if args.train_windows is None:
        args.train_windows = preset.train_windows
    if args.eval_windows is None:
        args.eval_windows = preset.eval_windows
    if args.lr is None:
        args.lr = preset.bench.design.learning_rates[0]
    torch.set_num_threads(1)
    if args.step_time:
        step_time(args.preset)
    else:
        learn(args)


if __name__ == "__main__":
    main()
