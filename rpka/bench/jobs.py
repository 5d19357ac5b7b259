"""The bench's job scheduler: the jobs of a study, their run files (the cache), the executor.

A job is ``(arm, learning rate, seed group)``; its full configuration goes to
:func:`run_to_file`, which trains it and writes ``<out>/runs/<run id>.json`` (atomically).
:class:`Scheduler` submits jobs to an executor with the ``concurrent.futures`` interface
and reads results back from their files. A job whose file exists is not run again
(:func:`finished_result`), so an interrupted bench resumes where it stopped. Only the
evaluation runs a later stage reads keep their weights (:func:`keeps_weights`); the run
files are committed, the weights are not, and a stage that finds a run's weights missing
retrains that run alone (:func:`ensure_weights`; training is seeded: same numbers). An arm's
evaluation job is submitted as soon as its sweep is done, and an ``lr_from`` arm's sweep
as soon as its source arm has chosen, so workers never wait for a phase boundary.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm  # plain text bars: no ipywidgets needed in notebooks

from rpka.attention import options_of
from rpka.config.bench import ArmConfig, BenchConfig
from rpka.io import (
    CorruptFileError,
    quarantine,
    read_checked,
    read_run_file,
    verify_state_file,
    write_run_file,
)
from rpka.training.run_config import make_run_config, run_id
from rpka.training.train import train_run
from rpka.training.trained import load_state

# --------------------------------------------------------------------------- one job


def run_to_file(run_config: dict[str, Any], path: str) -> str:
    """Train one job (``rpka.training.train.train_run``) and write its result to ``path``
    atomically,
    with the checksum :func:`rpka.io.read_run_file` verifies (:func:`rpka.io.write_run_file`)."""
    write_run_file(path, train_run(run_config))
    return path


def weight_readers(config: BenchConfig) -> dict[str, tuple[str, ...]]:
    """Per arm, the later stages that read its first evaluation run's weights: the
    mechanism study (the primary arm), the output-error study (exact and every arm with a
    rank), and after the bench ``rpka.kernel.spectrum.bench_spectrum`` and ``rpka.study.dropin``
    (exact). No other run's weights are read, so no other run keeps them."""
    readers: dict[str, list[str]] = {config.decision.baseline_arm: ["spectrum", "drop_in"]}
    if config.studies.mechanism is not None:
        readers.setdefault(config.decision.primary_arm, []).append("mechanism")
    if config.studies.output_error_ranks:
        readers[config.decision.baseline_arm].append("output_error")
        for arm in config.design.arms:
            if arm.method != "exact" and "rank" in options_of(arm.method):
                readers.setdefault(arm.name, []).append("output_error")
    return {arm: tuple(stages) for arm, stages in readers.items()}


def keeps_weights(config: BenchConfig, arm: str, phase: str, group: int) -> bool:
    """Whether the job (``arm``, ``phase``, seed ``group``) saves its trained weights: only
    an evaluation run whose weights a later stage reads (:func:`weight_readers`), the
    first seed group (those stages take member 0, the first evaluation seed)."""
    return phase == "eval" and group == 0 and arm in weight_readers(config)


def finished_result(path: Path, state_path: str | None = None) -> dict[str, Any] | None:
    """The result of a run that finished earlier (its file ``path``), or None: not run yet,
    or its files are corrupt or belong to another run - then they are moved aside, to be
    rerun. Weights at ``state_path`` are checked if there (they load, and they are the
    weights the run saved: :func:`rpka.io.verify_state_file`); missing ones do not unfinish
    the run (they are not committed): a stage that needs them retrains the run then
    (:func:`ensure_weights`)."""
    if not path.exists():
        return None
    try:
        result = read_run_file(path)
        if state_path and Path(state_path).exists():
            verify_state_file(state_path, result, path)
            read_checked(state_path, load_state)
        return result
    except CorruptFileError as err:
        for bad in (path, Path(state_path) if state_path else None):
            if bad is not None and bad.exists():
                quarantine(bad, str(err))
        return None


def ensure_weights(run_file: Path, data_dir: str, progress: bool = False) -> bool:
    """Make sure the weights of the finished run ``run_file`` are beside it (``.pt``):
    if they are missing (a clone of the committed study), retrain the run from its
    recorded configuration, which gives the same weights and numbers (training is seeded).
    Weights there that are not the ones the run saved (their sha256 is not the run's
    ``state_sha256``: swapped or edited) are moved aside and remade the same way. Returns
    whether it retrained."""
    state_file = run_file.with_suffix(".pt")
    result = read_run_file(run_file)
    if state_file.exists():
        try:
            verify_state_file(state_file, result, run_file)
            return False
        except CorruptFileError as err:
            quarantine(state_file, str(err))
    run_config = {
        **result["config"],
        "data_dir": data_dir,
        "progress": {"enable": progress, "leave": False},
        "state_path": str(state_file),
    }
    run_to_file(run_config, str(run_file))
    return True


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


# --------------------------------------------------------------------------- a study's jobs


def seed_groups(
    config: BenchConfig, phase: str, arm: ArmConfig | None = None
) -> list[tuple[int, ...]]:
    """The phase's seeds in consecutive groups of at most ``config.execution.seeds_per_job``.

    An arm with its own ``sweep_seeds`` sweeps with those (a subset of the study's).
    """
    seeds = config.design.sweep_seeds if phase == "sweep" else config.design.eval_seeds
    if phase == "sweep" and arm is not None and arm.sweep_seeds is not None:
        seeds = arm.sweep_seeds
    size = config.execution.seeds_per_job
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
        if keeps_weights(config, arm.name, phase, group):  # a later stage reads them
            run_config["state_path"] = str(path.with_suffix(".pt"))
        jobs.append(Job(arm.name, lr, phase, group, run_config, path))
    return jobs


def n_swept_rates(config: BenchConfig, arm: ArmConfig) -> int:
    """Learning rates the arm's sweep trains: all, or one with ``lr_from``."""
    return 1 if arm.lr_from is not None else len(config.design.learning_rates)


@dataclass(frozen=True)
class JobGroup:
    """``jobs`` training jobs of one arm and phase with ``members`` stacked seeds each."""

    arm: str
    phase: str  # "sweep" (scored on validation) or "eval" (scored on test)
    members: int
    jobs: int


def job_groups(config: BenchConfig) -> list[JobGroup]:
    """Every training job of the bench ``config``, grouped by (arm, phase, members).

    The jobs :class:`Scheduler` submits: per arm, its swept learning rates (one with
    ``lr_from``) times its sweep seed groups, and its evaluation seed groups.
    """
    counts: Counter[tuple[str, str, int]] = Counter()
    for arm in config.design.arms:
        for phase in ("sweep", "eval"):
            rates = n_swept_rates(config, arm) if phase == "sweep" else 1
            for seeds in seed_groups(config, phase, arm):
                counts[arm.name, phase, len(seeds)] += rates
    return [JobGroup(arm, phase, members, n) for (arm, phase, members), n in counts.items()]


# --------------------------------------------------------------------------- results


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


@dataclass
class RunResults:
    """What a study's runs gave: per arm its merged sweep results (by learning rate) and
    its merged evaluation result, with counts and the times the phases ended."""

    sweep_of: dict[str, dict[float, dict[str, Any]]]
    eval_of: dict[str, dict[str, Any]] = field(default_factory=dict)
    n_jobs: int = 0
    n_resumed: int = 0
    finished_at: dict[str, float] = field(default_factory=dict)  # phase: perf_counter


# --------------------------------------------------------------------------- the scheduler


class Scheduler:
    """Runs (or resumes) every job of one study on ``executor`` and merges the results.

    Sweep jobs go first, longest first; an arm's evaluation job (its chosen learning
    rate), and the sweeps of the arms that take their rate from it (``lr_from``), go as
    soon as its sweep is complete. Finished runs are read from their files instead.
    """

    def __init__(
        self,
        config: BenchConfig,
        runs_dir: Path,
        data_dir: str,
        progress: bool = True,
        started: float | None = None,
    ) -> None:
        self.config = config
        self.runs_dir = runs_dir
        self.data_dir = data_dir
        self.progress = progress
        self.n_groups = {
            (phase, arm.name): len(seed_groups(config, phase, arm))
            for arm in config.design.arms
            for phase in ("sweep", "eval")
        }
        # learning rates each arm sweeps: all of them, or (lr_from) the one its source arm
        # chose, known once that arm's sweep is done
        self.swept_lrs = {
            a.name: config.design.learning_rates for a in config.design.arms if a.lr_from is None
        }
        start = time.perf_counter() if started is None else started
        self.results = RunResults(
            sweep_of={arm.name: {} for arm in config.design.arms},
            n_jobs=sum(group.jobs for group in job_groups(config)),
            finished_at={"sweep": start, "eval": start},
        )
        self.parts: dict[tuple[str, str, float], dict[int, dict[str, Any]]] = {}
        self.pending: dict[cf.Future, Job] = {}
        self.executor: cf.Executor | None = None
        self.bar: Any = None

    def run(self, executor: cf.Executor) -> RunResults:
        """Submit the sweep, then follow each finished job with what it unlocks, until no
        job is pending. On an exception this study's queued jobs in ``executor`` are
        cancelled (the executor itself is the caller's to close)."""
        config = self.config
        self.executor = executor
        self.bar = tqdm(
            total=self.results.n_jobs,
            desc=f"bench {config.preset}",
            position=0,
            disable=not self.progress,
        )
        sweep_jobs = [
            job
            for arm in config.design.arms
            if arm.lr_from is None
            for lr in config.design.learning_rates
            for job in self._jobs(arm, lr, "sweep")
        ]
        try:
            try:
                self._submit(sweep_jobs)
                while self.pending:
                    done, _ = cf.wait(list(self.pending), return_when=cf.FIRST_COMPLETED)
                    for future in done:
                        job = self.pending.pop(future)
                        self._collect(job, read_run_file(future.result()))
            except BaseException:  # in a shared executor, this bench's queued jobs are dropped
                for future in self.pending:
                    future.cancel()
                raise
        finally:
            self.bar.close()
        return self.results

    def _jobs(self, arm: ArmConfig, lr: float, phase: str) -> list[Job]:
        return make_jobs(self.config, arm, lr, phase, self.runs_dir, self.data_dir, self.progress)

    def _submit(self, jobs: list[Job]) -> None:
        """Queue ``jobs`` (longest first: better packing); a finished one is collected."""
        assert self.executor is not None
        n_slots = max(1, self.config.execution.n_workers)
        for job in sorted(jobs, key=lambda j: -j.cost):
            result = finished_result(job.path, job.run_config.get("state_path"))
            if result is not None:  # resume: finished earlier
                self.results.n_resumed += 1
                self._collect(job, result)
                continue
            job.run_config["progress"]["position"] = (len(self.pending) % n_slots) + 1
            future = self.executor.submit(run_to_file, job.run_config, str(job.path))
            self.pending[future] = job

    def _collect(self, job: Job, result: dict[str, Any]) -> None:
        """Keep one job's result; merge an (arm, phase, lr)'s groups once all are in."""
        results = self.results
        self.bar.update(1)
        results.finished_at[job.phase] = time.perf_counter()
        key = (job.phase, job.arm, job.lr)
        self.parts.setdefault(key, {})[job.group] = result
        groups = self.n_groups[job.phase, job.arm]
        if len(self.parts[key]) < groups:
            return
        merged = merge_results([self.parts[key][g] for g in range(groups)])
        if job.phase == "eval":
            results.eval_of[job.arm] = merged
            return
        results.sweep_of[job.arm][job.lr] = merged
        if len(results.sweep_of[job.arm]) == len(self.swept_lrs[job.arm]):
            self._sweep_done(job.arm)

    def _sweep_done(self, name: str) -> None:
        """Arm ``name``'s sweep is complete: its evaluation, and its dependants' sweeps."""
        sweep = self.results.sweep_of[name]
        ordered = {lr: sweep[lr] for lr in self.swept_lrs[name]}
        best = best_learning_rate(ordered, self.config.design.metric)
        self._submit(self._jobs(self.config.arm(name), best, "eval"))
        for dependant in (a for a in self.config.design.arms if a.lr_from == name):
            self.swept_lrs[dependant.name] = (best,)
            self._submit(self._jobs(dependant, best, "sweep"))
