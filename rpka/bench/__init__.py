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
(``exact``) seed by seed (``rpka.verdict.stats.paired_comparison``) and decided by the rule of
``rpka.verdict.decision`` (pre-registered primary, Holm over the secondary arms, TOST, the gate).
An arm with ``lr_from`` does not sweep: it takes the learning rate chosen for that arm
(the ablations take their reference's) and trains only it with the sweep seeds, which
still score it on validation.

A bench is three stages, one module each, that :func:`run_bench` calls in turn:

- ``rpka.bench.jobs``: the scheduler - the study's jobs, their run files (a job whose
  file exists is not run again, so an interrupted bench resumes; only the evaluation runs
  a later stage reads keep their weights), the executor
  (docs/design.md section 9: any ``concurrent.futures`` executor);
- ``rpka.bench.report``: the report builder - ``bench_report.json`` from the merged runs;
- ``rpka.bench.studies``: the post-run studies on the trained models (mechanism, output
  error).

The report's keys are documented in ``docs/bench_report.md``.

May import: ``rpka.kernel``, ``rpka.training``, ``rpka.verdict``, ``rpka.speed``,
``rpka.swap`` and every stage below them (config, tracks, model, attention, the root
modules); never the study, the report or the command line.
"""

from __future__ import annotations

from rpka import numerics

numerics.pin()  # a study stage: pinned CPU numerics before torch runs (rpka.numerics)

import concurrent.futures as cf
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rpka import paths
from rpka.bench.jobs import (
    Job,
    JobGroup,
    RunResults,
    Scheduler,
    best_learning_rate,
    ensure_weights,
    finished_result,
    job_groups,
    keeps_weights,
    make_jobs,
    merge_results,
    n_swept_rates,
    run_to_file,
    seed_groups,
    sweep_score,
    weight_readers,
)
from rpka.bench.report import (
    BENCH_VERSION,
    arm_entry,
    build_report,
    device_description,
    load_average,
    summary,
    timings,
    versions,
)
from rpka.bench.studies import (
    OUTPUT_ERROR_DEFINITION,
    OUTPUT_ERROR_SEEDS,
    StudyResults,
    member0_attention_inputs,
    run_studies,
    study_mechanism,
    study_output_errors,
    trained_model,
)
from rpka.config.bench import BenchConfig
from rpka.io import (
    CHECKSUM_KEY,
    TIMING_KEYS,
    quarantine,
    unsealed_among_sealed,
    write_result_and_timings,
)
from rpka.paths import resolve
from rpka.tracks.cache import DEFAULT_DATA_DIR
from rpka.training.executors import InProcessExecutor, owned
from rpka.training.executors import local_executor as default_executor
from rpka.training.seed_data import naive_baselines_of

__all__ = [  # what other modules, scripts and tests import from rpka.bench
    "BENCH_VERSION",
    "DEFAULT_DATA_DIR",
    "OUTPUT_ERROR_DEFINITION",
    "OUTPUT_ERROR_SEEDS",
    "InProcessExecutor",
    "Job",
    "JobGroup",
    "RunResults",
    "Scheduler",
    "StudyResults",
    "arm_entry",
    "best_learning_rate",
    "build_report",
    "default_executor",
    "default_out",
    "device_description",
    "ensure_weights",
    "finished_result",
    "job_groups",
    "keeps_weights",
    "load_average",
    "make_jobs",
    "member0_attention_inputs",
    "merge_results",
    "n_swept_rates",
    "run_bench",
    "run_studies",
    "run_to_file",
    "seed_groups",
    "set_aside_unsealed",
    "study_mechanism",
    "study_output_errors",
    "summary",
    "sweep_score",
    "timings",
    "trained_model",
    "versions",
    "weight_readers",
]


def default_out(config: BenchConfig) -> str:
    """``data/results/<preset>`` plus the track's ``out_dir`` (the study ``full`` keeps its
    lm report in ``data/results/full/lm``)."""
    return paths.bench_dir(config.preset, config.task.out_dir)


def run_bench(
    config: BenchConfig,
    out_dir: str | os.PathLike | None = None,
    executor: cf.Executor | None = None,
    progress: bool = True,
    data_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Run (or resume) the study ``config``; write and return ``bench_report.json``.

    Args:
        config: the study (``rpka.config.presets.get_preset``).
        out_dir: results folder (default ``data/results/<preset>``); run files go to
            ``<out_dir>/runs/``.
        executor: where jobs run (``concurrent.futures`` interface); default
            :func:`default_executor` with ``config.execution.n_workers``. A given executor is not
            shut down (on an exception, this bench's queued jobs in it are cancelled);
            the bench's own is aborted on one (``rpka.training.executors.owned``).
        progress: tqdm bars (the bench's, and one per running job).
        data_dir: the track cache (default ``data/cache``).
    """
    config.validate()
    t_start = time.perf_counter()
    load_start = load_average()
    out = resolve(out_dir or default_out(config))
    runs_dir = out / "runs"
    data_dir = str(resolve(data_dir or DEFAULT_DATA_DIR))

    track = config.task.load(config.design.track, data_dir)  # generates the cache once
    naive = naive_baselines_of(config, track, data_dir)  # per seed's data where each has its own
    t_data = time.perf_counter()

    set_aside_unsealed(runs_dir)
    scheduler = Scheduler(config, runs_dir, data_dir, progress, started=t_data)
    if executor is None:  # the bench's own: aborted on an exception
        executor = default_executor(config.execution.n_workers)
        context: Any = owned(executor)
    else:
        context = nullcontext()
    with context:
        runs = scheduler.run(executor)
    t_runs = time.perf_counter()

    report = build_report(config, naive, runs.sweep_of, runs.eval_of, track)
    t_stats = time.perf_counter()
    studied = run_studies(config, runs.eval_of, runs_dir, out, track, progress, data_dir)
    runs.n_resumed -= len(studied.retrained)  # resumed, then retrained for their weights
    report["mechanism_signature"] = studied.mechanism_signature
    report["output_error"] = studied.output_error
    t_end = time.perf_counter()
    phases = {
        "data_s": t_data - t_start,
        "sweep_s": runs.finished_at["sweep"] - t_data,
        "eval_s": runs.finished_at["eval"] - t_data,
        "runs_s": t_runs - t_data,
        "stats_s": t_stats - t_runs,
        "mechanism_s": studied.mechanism_s,
        "output_error_s": studied.output_error_s,
        "total_s": t_end - t_start,
    }
    report["timings"] = timings(config, runs, phases, (load_start, load_average()))
    # with its checksum, verified on read, its timings beside it; a resumed bench keeps the
    # timings of its runs
    write_result_and_timings(out / "bench_report.json", report, TIMING_KEYS)
    return report


def set_aside_unsealed(runs_dir: Path) -> list[Path]:
    """Move aside the run files in ``runs_dir`` that carry no checksum while others there
    do (``rpka.io.unsealed_among_sealed``: a checksum deleted after an edit), saying so
    for each; the bench runs them again. A folder of legacy files (none sealed) is kept."""
    unsealed = unsealed_among_sealed(sorted(runs_dir.glob("*.json")))
    for path in unsealed:
        quarantine(
            path,
            f"{path}: no {CHECKSUM_KEY} checksum, though the other run files beside it have "
            f"one (edited, and its checksum deleted?)",
        )
    return unsealed
