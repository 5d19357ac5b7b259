"""The benchmark: learning-rate sweep, evaluation seeds, paired statistics, ``bench_report.json``.

    python -m rpka bench --preset {smoke,quick,full} [--track forecast|lm] [--out DIR]
        [--ranks 4 16] [--seeds N] [--lrs 1e-3 3e-3] [--epochs E] [--device cpu|cuda]
        [--workers N] [--no-progress]

Every track runs through the same bench: ``--track forecast`` (the default; results in
``data/results/<preset>/``) or ``--track lm`` (the causal language model of issue 7, its
perplexity next to the exact floor; results in ``data/results/<preset>/lm/``). What differs
between tracks - model, loss, metrics, naive baselines, learnability bar - is the track's
``rpka.tracks.base.Task`` (``rpka.tracks.TRACKS``).

Protocol (docs/design.md section 5): for every arm, each learning rate trains the sweep seeds
and is scored on validation; the best learning rate (lowest mean validation metric; a
configuration with a diverged seed loses) trains the evaluation seeds - disjoint from the
sweep seeds - and is scored on test. Each non-baseline arm is compared with the baseline
(``exact``) seed by seed (``rpka.stats.paired_comparison``) and decided by the rule of
``rpka.decision`` (pre-registered primary, Holm over the secondary arms, TOST, the gate).
An arm with ``lr_from`` does not sweep: it takes the learning rate chosen for that arm
(the ablations take their reference's) and trains only it with the sweep seeds, which
still score it on validation.

Scale-out seam (docs/design.md section 9): a job is ``(arm, learning rate, seed group)``; its
full configuration goes to :func:`run_to_file`, which trains it and writes one JSON file
``<out>/runs/<run id>.json`` (atomically). The bench only submits jobs to an executor with
the ``concurrent.futures`` interface - a local process pool by default, in-process for
tests, ``distributed.Client(...).get_executor()`` for a cluster - and reads results back
from their files. A job whose file exists is not run again, so an interrupted bench
resumes where it stopped. An arm's evaluation job is submitted as soon as its sweep is
done, so workers never wait for a phase boundary.

The report's keys are documented in ``docs/bench_report.md``.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import platform
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy
import torch
from torch import Tensor
from tqdm import tqdm  # plain text bars: no ipywidgets needed in notebooks

import rpka
from rpka import paths, stats
from rpka.ablations import choose_default, rpka_configuration
from rpka.attention import options_of
from rpka.attention.guards import guard_shares
from rpka.config import ArmConfig, BenchConfig
from rpka.decision import METRIC_DIRECTION, compare_arms, decision_of, local_gate
from rpka.executors import (
    InProcessExecutor,  # noqa: F401 - re-exported for callers
    owned,
)
from rpka.executors import local_executor as default_executor
from rpka.io import (
    CorruptFileError,
    quarantine,
    read_checked,
    read_json,
    read_json_or_heal,
    read_run_file,
    write_json,
)
from rpka.paths import resolve
from rpka.quality import mechanism_study, method_output_errors
from rpka.tracks.cache import DEFAULT_DATA_DIR
from rpka.train import (
    build_model,
    load_state,
    load_trained,
    make_run_config,
    run_id,
    track_config_of,
    train_run,
)

BENCH_VERSION = "2.0"


def default_out(config: BenchConfig) -> str:
    """``data/results/<preset>`` plus the track's ``out_dir`` (the study ``full`` keeps its
    lm report in ``data/results/full/lm``)."""
    return paths.bench_dir(config.preset, config.task.out_dir)


# --------------------------------------------------------------------------- mechanism


def study_mechanism(
    config: BenchConfig,
    primary: dict[str, Any],
    runs_dir: Path,
    out: Path,
    track: Any,
    progress: bool = True,
    n_windows: int = 4,
) -> dict[str, Any]:
    """The trace identity and approximation quality on the primary arm's trained model.

    Takes the first evaluation seed's trained weights and, for contrast, the same member
    freshly initialised; feeds ``n_windows`` test windows; writes both studies to
    ``out/mechanism.json`` and returns the trained model's ``mechanism_signature``.
    """
    trained, result = load_trained(runs_dir / f"{primary['run_ids'][0]}.json")
    init = build_model(result["config"], track_config_of(result["config"]), torch.device("cpu"))
    arm = config.arm(config.primary_arm)
    options = {
        k: arm.options[k] for k in ("pivot_set", "weighting", "tempering") if k in arm.options
    }
    x = config.task.inputs_targets(track, "test")[0][:n_windows]
    study_options = {**options, **(config.mechanism or {})}
    seed = result["seeds"][0]
    described = (
        f"{arm.name} (method {arm.method}, options {dict(arm.options)}), lr "
        f"{result['lr']:g}, evaluation seed {seed}, run {result['run_id']}, "
        f"{len(x)} test {config.task.sample_unit}"
    )
    path = out / "mechanism.json"
    previous = read_json_or_heal(path, ("model", "options", "trained"))
    if previous is not None:  # resume: this model was studied with these options already
        if previous.get("model") == described and previous.get("options") == study_options:
            return {**previous["trained"]["mechanism_signature"], **trained_model(described)}
    studies = {}
    for name, model in (("trained", trained), ("init", init)):
        member0 = member0_attention_inputs(model, x)
        studies[name] = mechanism_study(member0, progress=progress, **study_options)
    signature = {**studies["trained"]["mechanism_signature"], **trained_model(described)}
    write_json(path, {"model": described, "options": study_options, **studies})
    return signature


def member0_attention_inputs(model: Any, x: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Every layer's attention (q, k, v), each (B, H, n, d), of a stacked model's member 0
    (its first seed) on inputs ``x`` (B, ...)."""
    qkv = model.attention_inputs(x.expand(model.n_members, *x.shape))
    return [tuple(t[: len(x)] for t in layer) for layer in qkv]


def trained_model(described: str) -> dict[str, Any]:
    """The signature's model keys: ``trained_model`` a boolean (the earlier check's type),
    the words beside it."""
    return {"trained_model": True, "trained_model_description": described}


OUTPUT_ERROR_SEEDS = 5  # pivot / feature draws per method and rank in the output-error study
OUTPUT_ERROR_DEFINITION = (
    "relative error |O_hat - O|_F / |O|_F of each arm's attention (its method and options, "
    "rank replaced) against exact SDPA in float64, per layer, test window, head and draw, on "
    "the attention inputs (q, k, v) of a trained model: the arm's own ('own') and the exact "
    "arm's ('exact'), first evaluation seed (rpka.quality.method_output_errors)"
)


def study_output_errors(
    config: BenchConfig,
    eval_of: dict[str, dict[str, Any]],
    runs_dir: Path,
    track: Any,
    n_windows: int = 4,
) -> dict[str, Any]:
    """Every arm's attention output error against exact on trained Q/K, at several ranks.

    Ranks: ``config.output_error_ranks`` plus the arm's own. Inputs: the arm's own trained
    model and the exact arm's (the Q/K softmax attention learned: one set for every
    method), member 0 (the first evaluation seed), ``n_windows`` test windows.
    """
    x = config.task.inputs_targets(track, "test")[0][:n_windows]

    def inputs_of(arm_name: str) -> list:
        model, _ = load_trained(runs_dir / f"{eval_of[arm_name]['run_ids'][0]}.json")
        return member0_attention_inputs(model, x)

    exact_inputs = inputs_of(config.baseline_arm)
    rows = []
    for arm in config.arms:
        if arm.method == "exact" or arm.name not in eval_of:
            continue
        if "rank" not in options_of(arm.method):
            continue  # a control without a rank (``mean``): nothing to approximate
        own = dict(arm.options).get("rank")
        ranks = sorted(set(config.output_error_ranks) | ({own} if own else set()))
        for label, qkv in (("own", inputs_of(arm.name)), ("exact", exact_inputs)):
            for row in method_output_errors(
                qkv, arm.method, dict(arm.options), ranks, OUTPUT_ERROR_SEEDS
            ):
                rows.append(
                    {"arm": arm.name, "method": arm.method, "inputs": label, "own_rank": own, **row}
                )
    return {
        "definition": OUTPUT_ERROR_DEFINITION,
        "ranks": list(config.output_error_ranks),
        "n_windows": len(x),
        "seeds": OUTPUT_ERROR_SEEDS,
        "rows": rows,
    }


# --------------------------------------------------------------------------- jobs


def run_to_file(run_config: dict[str, Any], path: str) -> str:
    """Train one job (``rpka.train.train_run``) and write its result to ``path`` atomically."""
    write_json(path, train_run(run_config))
    return path


def finished_result(path: Path, state_path: str | None = None) -> dict[str, Any] | None:
    """The result of a run that finished earlier (its file ``path`` and, if the run keeps
    them, its weights ``state_path``), or None: not run yet, or its files are corrupt or
    belong to another run - then they are moved aside, to be rerun."""
    if not path.exists():
        return None
    try:
        result = read_run_file(path)
        if state_path:
            read_checked(state_path, load_state)
        return result
    except CorruptFileError as err:
        for bad in (path, Path(state_path) if state_path else None):
            if bad is not None and bad.exists():
                quarantine(bad, str(err))
        return None


@dataclass
class Job:
    """One (arm, learning rate, seed group) run, and where its result lives."""

    arm: str
    lr: float
    phase: str  # "sweep" (validation) or "eval" (test)
    group: int  # index of the seed group
    run_config: dict[str, Any]
    path: Path

    @property
    def cost(self) -> float:
        """Rough relative cost, to start the longest jobs first."""
        rank = self.run_config["arm"]["options"].get("rank", 0)
        return len(self.run_config["seeds"]) * (1 + rank / 8)


def seed_groups(
    config: BenchConfig, phase: str, arm: ArmConfig | None = None
) -> list[tuple[int, ...]]:
    """The phase's seeds in consecutive groups of at most ``config.seeds_per_job``.

    An arm with its own ``sweep_seeds`` sweeps with those (a subset of the study's).
    """
    seeds = config.sweep_seeds if phase == "sweep" else config.eval_seeds
    if phase == "sweep" and arm is not None and arm.sweep_seeds is not None:
        seeds = arm.sweep_seeds
    size = config.seeds_per_job
    return [tuple(seeds[i : i + size]) for i in range(0, len(seeds), size)]


def make_jobs(
    config: BenchConfig,
    arm: ArmConfig,
    lr: float,
    phase: str,
    runs_dir: Path,
    data_dir: str,
    progress: bool,
) -> list[Job]:
    """One job per seed group of (arm, lr) in ``phase``."""
    split = "val" if phase == "sweep" else "test"
    jobs = []
    for group, seeds in enumerate(seed_groups(config, phase, arm)):
        bar = {"enable": progress, "position": 1, "leave": False}
        run_config = make_run_config(config, arm, lr, seeds, split, data_dir, bar)
        path = runs_dir / f"{run_id(run_config)}.json"
        if phase == "eval":  # evaluation runs keep their weights (mechanism study, notebooks)
            run_config["state_path"] = str(path.with_suffix(".pt"))
        jobs.append(Job(arm.name, lr, phase, group, run_config, path))
    return jobs


def n_swept_rates(config: BenchConfig, arm: ArmConfig) -> int:
    """Learning rates the arm's sweep trains: all, or one with ``lr_from``."""
    return 1 if arm.lr_from is not None else len(config.learning_rates)


@dataclass(frozen=True)
class JobGroup:
    """``jobs`` training jobs of one arm and phase with ``members`` stacked seeds each."""

    arm: str
    phase: str  # "sweep" (scored on validation) or "eval" (scored on test)
    members: int
    jobs: int


def job_groups(config: BenchConfig) -> list[JobGroup]:
    """Every training job of the bench ``config``, grouped by (arm, phase, members).

    The jobs :func:`run_bench` submits: per arm, its swept learning rates (one with
    ``lr_from``) times its sweep seed groups, and its evaluation seed groups.
    """
    counts: Counter[tuple[str, str, int]] = Counter()
    for arm in config.arms:
        for phase in ("sweep", "eval"):
            rates = n_swept_rates(config, arm) if phase == "sweep" else 1
            for seeds in seed_groups(config, phase, arm):
                counts[arm.name, phase, len(seeds)] += rates
    return [JobGroup(arm, phase, members, n) for (arm, phase, members), n in counts.items()]


def merge_results(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The results of one (arm, lr)'s seed groups as one result, seeds in group order."""
    first = parts[0]
    step_ms = [p["step_ms_median"] for p in parts if p["step_ms_median"] is not None]
    guards = [p["guard_counts"] for p in parts if p["guard_counts"]]
    return {
        "arm": first["arm"],
        "lr": first["lr"],
        "split": first["split"],
        "run_ids": [p["run_id"] for p in parts],
        "seeds": [s for p in parts for s in p["seeds"]],
        "scores": {m: [v for p in parts for v in p["scores"][m]] for m in first["scores"]},
        "members": [m for p in parts for m in p["members"]],
        "n_diverged": sum(p["n_diverged"] for p in parts),
        "step_ms_median": float(np.median(step_ms)) if step_ms else None,
        "step_members": [len(p["seeds"]) for p in parts],
        "guard_counts": {k: sum(g[k] for g in guards) for k in guards[0]} if guards else None,
        "wall_s": sum(p["wall_s"] for p in parts),
        "cpu_s": sum(p.get("cpu_s", math.nan) for p in parts),
    }


def sweep_score(result: dict[str, Any], metric: str) -> float:
    """Mean validation metric over the sweep seeds; +inf if any seed diverged."""
    values = result["scores"][metric]
    if any(v is None or not math.isfinite(v) for v in values):
        return math.inf
    return float(np.mean(values))


def best_learning_rate(results: dict[float, dict[str, Any]], metric: str) -> float:
    """The learning rate with the lowest sweep score (ties: the first in sweep order)."""
    scores = {lr: sweep_score(result, metric) for lr, result in results.items()}
    return min(scores, key=lambda lr: scores[lr])


# --------------------------------------------------------------------------- the bench


def run_bench(
    config: BenchConfig,
    out_dir: str | os.PathLike | None = None,
    executor: cf.Executor | None = None,
    progress: bool = True,
    data_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Run (or resume) the study ``config``; write and return ``bench_report.json``.

    Args:
        config: the study (``rpka.presets.get_preset``).
        out_dir: results folder (default ``data/results/<preset>``); run files go to
            ``<out_dir>/runs/``.
        executor: where jobs run (``concurrent.futures`` interface); default
            :func:`default_executor` with ``config.n_workers``. A given executor is not
            shut down (on an exception, this bench's queued jobs in it are cancelled);
            the bench's own is aborted on one (``rpka.executors.owned``).
        progress: tqdm bars (the bench's, and one per running job).
        data_dir: the track cache (default ``data/cache``).
    """
    config.validate()
    t_start = time.perf_counter()
    load_start = _load_average()
    out = resolve(out_dir or default_out(config))
    runs_dir = out / "runs"
    data_dir = str(resolve(data_dir or DEFAULT_DATA_DIR))

    task = config.task
    track = task.load(config.track, data_dir)  # generates the cache once
    naive = task.naive_baselines(track)
    t_data = time.perf_counter()

    own_executor = executor is None
    executor = executor or default_executor(config.n_workers)
    n_slots = max(1, config.n_workers)
    n_groups = {
        (phase, arm.name): len(seed_groups(config, phase, arm))
        for arm in config.arms
        for phase in ("sweep", "eval")
    }
    n_jobs = sum(group.jobs for group in job_groups(config))
    # learning rates each arm sweeps: all of them, or (lr_from) the one its source arm chose,
    # known once that arm's sweep is done
    swept_lrs = {arm.name: config.learning_rates for arm in config.arms if arm.lr_from is None}
    bar = tqdm(total=n_jobs, desc=f"bench {config.preset}", position=0, disable=not progress)
    parts: dict[tuple[str, str, float], dict[int, dict[str, Any]]] = {}
    sweep_of: dict[str, dict[float, dict[str, Any]]] = {arm.name: {} for arm in config.arms}
    eval_of: dict[str, dict[str, Any]] = {}
    n_resumed = 0
    pending: dict[cf.Future, Job] = {}
    finished_at = {"sweep": t_data, "eval": t_data}

    def submit(jobs: list[Job]) -> None:
        nonlocal n_resumed
        for job in sorted(jobs, key=lambda j: -j.cost):  # longest first: better packing
            result = finished_result(job.path, job.run_config.get("state_path"))
            if result is not None:  # resume: finished earlier
                n_resumed += 1
                collect(job, result)
                continue
            job.run_config["progress"]["position"] = (len(pending) % n_slots) + 1
            pending[executor.submit(run_to_file, job.run_config, str(job.path))] = job

    def collect(job: Job, result: dict[str, Any]) -> None:
        bar.update(1)
        finished_at[job.phase] = time.perf_counter()
        key = (job.phase, job.arm, job.lr)
        parts.setdefault(key, {})[job.group] = result
        groups = n_groups[job.phase, job.arm]
        if len(parts[key]) < groups:
            return
        merged = merge_results([parts[key][g] for g in range(groups)])
        if job.phase == "eval":
            eval_of[job.arm] = merged
            return
        sweep_of[job.arm][job.lr] = merged
        if len(sweep_of[job.arm]) == len(swept_lrs[job.arm]):
            ordered = {lr: sweep_of[job.arm][lr] for lr in swept_lrs[job.arm]}
            best = best_learning_rate(ordered, config.metric)
            arm = config.arm(job.arm)
            submit(make_jobs(config, arm, best, "eval", runs_dir, data_dir, progress))
            for dependant in (a for a in config.arms if a.lr_from == job.arm):
                swept_lrs[dependant.name] = (best,)
                submit(make_jobs(config, dependant, best, "sweep", runs_dir, data_dir, progress))

    sweep_jobs = [
        job
        for arm in config.arms
        if arm.lr_from is None
        for lr in config.learning_rates
        for job in make_jobs(config, arm, lr, "sweep", runs_dir, data_dir, progress)
    ]
    try:
        with owned(executor) if own_executor else nullcontext():
            try:
                submit(sweep_jobs)
                while pending:
                    done, _ = cf.wait(list(pending), return_when=cf.FIRST_COMPLETED)
                    for future in done:
                        job = pending.pop(future)
                        collect(job, read_json(future.result()))
            except BaseException:  # in a shared executor, this bench's queued jobs are dropped
                for future in pending:
                    future.cancel()
                raise
    finally:
        bar.close()
    t_runs = time.perf_counter()

    report = build_report(config, naive, sweep_of, eval_of, track)
    t_stats = time.perf_counter()
    if config.mechanism is not None and config.primary_arm in eval_of:
        report["mechanism_signature"] = study_mechanism(
            config, eval_of[config.primary_arm], runs_dir, out, track, progress
        )
    t_mechanism = time.perf_counter()
    if config.output_error_ranks and config.baseline_arm in eval_of:
        report["output_error"] = study_output_errors(config, eval_of, runs_dir, track)
    t_end = time.perf_counter()
    report["timings"] = timings(
        config,
        sweep_of,
        eval_of,
        phases={
            "data_s": t_data - t_start,
            "sweep_s": finished_at["sweep"] - t_data,
            "eval_s": finished_at["eval"] - t_data,
            "runs_s": t_runs - t_data,
            "stats_s": t_stats - t_runs,
            "mechanism_s": t_mechanism - t_stats,
            "output_error_s": t_end - t_mechanism,
            "total_s": t_end - t_start,
        },
        n_jobs=n_jobs,
        n_resumed=n_resumed,
        load=(load_start, _load_average()),
    )
    write_json(out / "bench_report.json", report)
    return report


# --------------------------------------------------------------------------- the report


def summary(values: Sequence[float | None]) -> dict[str, Any]:
    """``rpka.stats.summarize`` plus the earlier check's keys: mean, std (ddof=1), per_seed, n."""
    per_seed = [math.nan if v is None else float(v) for v in values]
    s = stats.summarize(per_seed)
    rest = {k: v for k, v in s.items() if k not in ("mean", "sd", "n")}
    return {"mean": s["mean"], "std": s["sd"], "per_seed": per_seed, "n": s["n"], **rest}


def arm_entry(
    config: BenchConfig, arm: ArmConfig, sweep: dict[float, dict], result: dict[str, Any]
) -> dict[str, Any]:
    """best_cfg, sweep, full (test, the primary metric) and more for one arm."""
    metric = config.metric
    metrics = config.task.metrics
    others = [m for m in metrics if m != metric]
    lrs = [lr for lr in config.learning_rates if lr in sweep]  # lr_from: the one inherited
    best_lr = result["lr"]
    rows = []
    for lr in lrs:
        r = sweep[lr]
        rows.append(
            {
                "lr": lr,
                "seeds": r["seeds"],
                "val_per_seed": r["scores"][metric],
                **{f"val_{m}_per_seed": r["scores"][m] for m in others},
                "score": _finite_or_none(sweep_score(r, metric)),
                "n_diverged": r["n_diverged"],
                "diverged_at": [m["diverged_at"] for m in r["members"]],
                "selected": lr == best_lr,
                "run_ids": r["run_ids"],
                "wall_s": r["wall_s"],
            }
        )
    tokens = config.track.attention_tokens
    options = dict(arm.options)
    points = None
    rpka_choices = rpka_configuration(arm.method, options)  # rpka and nystrom-uniform
    if rpka_choices is not None:
        points = tokens if rpka_choices["pivot_set"] == "keys" else 2 * tokens
    return {
        "method": arm.method,
        "options": options,
        "rank": options.get("rank"),
        "attention_tokens": tokens,
        "pivot_points": points,
        "best_cfg": {
            "lr": best_lr,
            "method": arm.method,
            "options": options,
            "val_score": _finite_or_none(sweep_score(sweep[best_lr], metric)),
            "selection": (
                f"lowest mean validation {metric} over the sweep seeds"
                if arm.lr_from is None
                else f"the learning rate chosen for {arm.lr_from} (lr_from: no sweep of its "
                f"own; its sweep seeds score it on validation)"
            ),
        },
        "sweep": rows,
        "full": summary(result["scores"][metric]),
        "full_by_metric": {m: summary(result["scores"][m]) for m in metrics},
        "val_by_metric": {
            m: summary([x["final"]["val"][m] for x in result["members"]]) for m in metrics
        },
        "seeds": result["seeds"],
        "n_diverged": result["n_diverged"],
        "diverged_at": [m["diverged_at"] for m in result["members"]],
        "learning_curves": {
            "train_loss": [m["train_loss"] for m in result["members"]],
            f"val_{metric}": [m[f"val_{metric}"] for m in result["members"]],
        },
        "guard_counts": result["guard_counts"],
        "guard_shares": guard_shares(result["guard_counts"]) if result["guard_counts"] else None,
        "step_ms_median": result["step_ms_median"],
        "run_ids": result["run_ids"],
        "comparison": None,
    }


def build_report(
    config: BenchConfig,
    naive: dict[str, Any],
    sweep_of: dict[str, dict[float, dict]],
    eval_of: dict[str, dict[str, Any]],
    track: Any,
) -> dict[str, Any]:
    """Everything but ``timings`` (see ``docs/bench_report.md``)."""
    task = config.task
    arms = {
        arm.name: arm_entry(config, arm, sweep_of[arm.name], eval_of[arm.name])
        for arm in config.arms
    }
    for entry in arms.values():  # e.g. track lm: the gap to the perplexity floor
        entry.update(task.arm_extras(entry, naive))
    base = arms[config.baseline_arm]
    gate = compare_arms(config, arms)
    primary = arms[config.primary_arm]

    def earlier_keys(entry: dict[str, Any], name: str) -> dict[str, Any]:
        return {"arm": name, **{k: v for k, v in entry.items() if k != "comparison"}}

    report = {
        "bench_version": BENCH_VERSION,
        "track": config.track_name,
        "model": config.model.name,
        "metric": config.metric,
        "metric_direction": METRIC_DIRECTION,
        "n_seeds": len(config.eval_seeds),
        "baseline_arm": config.baseline_arm,
        "primary_arm": config.primary_arm,
        "baseline": earlier_keys(base, config.baseline_arm),
        "idea": earlier_keys(primary, config.primary_arm),
        "comparison": primary["comparison"],
        "attention_gate": gate,
        "local_gate": local_gate(config, arms),
        "decision": decision_of(config),
        "mechanism_signature": None,
        "output_error": None,
        "ablation_choice": None,
        "arms": arms,
        "naive_baselines": naive,
        "learnability": task.learnability(base, naive),
        "data": task.data_summary(track),
        "config": config.to_dict(),
        "versions": versions(),
        "device": device_description(config.device),
    }
    report["ablation_choice"] = choose_default(report)  # validation scores only
    return report


def timings(
    config: BenchConfig,
    sweep_of: dict[str, dict[float, dict]],
    eval_of: dict[str, dict[str, Any]],
    phases: dict[str, float],
    n_jobs: int,
    n_resumed: int,
    load: tuple[list[float] | None, list[float] | None],
) -> dict[str, Any]:
    step = {name: eval_of[name]["step_ms_median"] for name in eval_of}
    exact_ms = step.get(config.baseline_arm)
    return {
        "phases": phases,
        "step_ms_median": step,
        "step_members": min(config.seeds_per_job, len(config.eval_seeds)),
        "step_ratio_vs_baseline": {
            name: (ms / exact_ms if ms and exact_ms else None) for name, ms in step.items()
        },
        "run_wall_s": {
            name: {
                "sweep": sum(r["wall_s"] for r in sweep_of[name].values()),
                "eval": eval_of[name]["wall_s"],
            }
            for name in eval_of
        },
        "run_cpu_s": {
            name: {
                "sweep": sum(r["cpu_s"] for r in sweep_of[name].values()),
                "eval": eval_of[name]["cpu_s"],
            }
            for name in eval_of
        },
        "n_runs": n_jobs,
        "n_runs_resumed": n_resumed,
        "n_workers": config.n_workers,
        "load_average_start": load[0],
        "load_average_end": load[1],
    }


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "rpka": rpka.__version__,
    }


def device_description(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    cpu = platform.processor() or platform.machine()
    return f"{cpu} CPU, {os.cpu_count()} cores ({platform.system()})"


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None
