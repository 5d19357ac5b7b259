"""Estimate a bench preset's CPU cost per arm from one-epoch runs at the preset's own shapes.

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/estimate_bench_cost.py --preset full \
        [--arms exact rpka-r16 ...] [--out data/results/cost_full.json]

For every arm it trains one sweep-sized job (its sweep seeds stacked, scored on
validation) and one evaluation-sized job (``seeds_per_job`` seeds, scored on test) for ONE
epoch, single-threaded, and reads their ``cpu_s`` (process CPU time) and training-step
times from the run results. A job of E epochs then costs about

    E x (steps x step time + validation pass) + test pass (evaluation jobs)

where the validation pass is what the one-epoch run spent outside its training steps (for
the evaluation job half of it: the validation and test splits are the same size); the
steps' share of the CPU time is their share of the run's wall time. The
preset's total is the sum over its jobs (learning rates x sweep groups + evaluation groups
per arm); divided by ``n_workers`` it is the wall time of the runs with perfect packing.
The mechanism study of the primary arm is timed separately (one study of a freshly
initialised model of the preset's shape, times two: the bench studies the trained and the
initialised model). Measure on a quiet machine: the load averages are recorded.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from rpka.bench import n_swept_rates, seed_groups
from rpka.io import write_json
from rpka.mechanism import mechanism_study
from rpka.presets import PRESETS, get_preset
from rpka.tracks import get_track
from rpka.tracks.forecast import TrackConfig
from rpka.train import build_model, make_run_config, train_run


def job_cost(result: dict, epochs: int, test: bool) -> dict:
    """Extrapolate a one-epoch run's CPU time to ``epochs`` epochs (see the docstring)."""
    # the training steps' share of the run, from wall times, applied to its CPU time (on a
    # busy machine wall times stretch but the share stays about the same)
    share = min(1.0, result["n_steps"] * result["step_ms_median"] / 1e3 / result["wall_s"])
    train_s = share * result["cpu_s"]
    rest_s = result["cpu_s"] - train_s  # evaluation passes (+ set-up)
    val_s = rest_s / 2 if test else rest_s
    return {
        "cpu_s_1_epoch": result["cpu_s"],
        "train_s_per_epoch": train_s,
        "val_pass_s": val_s,
        "step_ms_median": result["step_ms_median"],
        "seeds": len(result["seeds"]),
        "estimate_s": epochs * (train_s + val_s) + (rest_s - val_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--arms", nargs="*", help="arm names (default: all)")
    parser.add_argument("--no-mechanism", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = get_preset(args.preset)
    one_epoch = get_preset(args.preset, train={"epochs": 1})
    epochs = config.train.epochs
    eval_seeds = seed_groups(config, "eval")[0]
    n_eval_jobs = len(seed_groups(config, "eval"))
    get_track(config.track.name, config.track)  # generate the cache before timing anything
    warm = make_run_config(
        get_preset(args.preset, train={"epochs": 1}), config.arms[0], 1e-3, [0], "val"
    )
    train_run(warm)  # first-call costs (imports, allocator) out of the measurements
    load_start = os.getloadavg()
    arms = {}
    for arm in config.arms:
        if args.arms and arm.name not in args.arms:
            continue
        lr = config.learning_rates[0]
        sweep_seeds = seed_groups(config, "sweep", arm)[0]
        n_sweep_jobs = n_swept_rates(config, arm) * len(seed_groups(config, "sweep", arm))
        sweep = train_run(make_run_config(one_epoch, arm, lr, sweep_seeds, "val"))
        evaluation = train_run(make_run_config(one_epoch, arm, lr, eval_seeds, "test"))
        s, e = job_cost(sweep, epochs, False), job_cost(evaluation, epochs, True)
        total = n_sweep_jobs * s["estimate_s"] + n_eval_jobs * e["estimate_s"]
        arms[arm.name] = {
            "sweep_job": s,
            "eval_job": e,
            "sweep_jobs": n_sweep_jobs,
            "arm_cpu_s": total,
        }
        print(f"{arm.name:<24} step {e['step_ms_median']:7.1f} ms  arm {total:7.1f} cpu-s")
    mechanism_s = None
    if not args.no_mechanism and config.mechanism is not None:
        track = get_track(config.track.name, config.track)
        run_config = make_run_config(config, config.arm(config.primary_arm), 1e-3, [0], "test")
        model = build_model(run_config, TrackConfig(**run_config["track"]), torch.device("cpu"))
        x = track.test.x[:4]
        qkv = model.attention_inputs(x.expand(1, *x.shape))
        arm = config.arm(config.primary_arm)
        options = {
            k: arm.options[k] for k in ("pivot_set", "weighting", "tempering") if k in arm.options
        }
        t0 = time.process_time()
        mechanism_study(qkv, progress=False, **{**options, **config.mechanism})
        mechanism_s = 2 * (time.process_time() - t0)
        print(f"mechanism study (trained + init): {mechanism_s:.1f} cpu-s")
    runs_s = sum(a["arm_cpu_s"] for a in arms.values())
    result = {
        "preset": args.preset,
        "epochs": epochs,
        "eval_jobs_per_arm": n_eval_jobs,
        "arms": arms,
        "runs_cpu_s": runs_s,
        "mechanism_cpu_s": mechanism_s,
        "n_workers": config.n_workers,
        "wall_estimate_s": runs_s / config.n_workers + (mechanism_s or 0.0),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
    }
    print(
        f"runs {runs_s:.0f} cpu-s / {config.n_workers} workers + mechanism "
        f"{mechanism_s or 0:.0f} s = {result['wall_estimate_s'] / 60:.1f} min"
    )
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
