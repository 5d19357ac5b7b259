"""The study as the notebooks see it: their parameters per preset, and the steps they call.

``notebook_parameters(preset)`` is the one place where a preset becomes notebook
parameters (paths of the result files that pass between notebooks, figure folders); the
notebooks' own ``parameters`` cells hold the smoke values of the same (a test checks it).
Every path comes from ``rpka.paths``, the one owner of the layout (a track's bench
folder: ``paths.bench_dir(preset, get_task(name).out_dir)``). The functions below keep
the notebooks thin: each loads a result file, or computes it if it is missing (every
computation resumes from its run files). The study index (``study.json``), the study's
last step, is ``rpka.study.index``'s.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rpka import bench, paths
from rpka.config import scaling as scaling_config
from rpka.config.bench import BenchConfig
from rpka.config.presets import MECHANISM_TRACK, STUDY_TRACKS, get_preset
from rpka.config.presets_longctx import get_longctx_preset
from rpka.io import read_json, read_json_checked, read_json_or_heal, read_run_file
from rpka.paths import resolve
from rpka.speed import scaling
from rpka.study.index import (
    FRONTIER_EXTENSIONS,  # noqa: F401 - read from rpka.study.steps (rpka.report.summary)
    LONGRANGE_TRACK,  # noqa: F401 - read from rpka.study.steps (rpka.report)
    write_study_index,
)
from rpka.study.longctx import run_longctx
from rpka.swap.stage import resume_or_run_audit
from rpka.tracks import get_task
from rpka.training import executors
from rpka.training.run_config import make_run_config, run_id
from rpka.training.trained import load_trained

# what a rerun replaced, beside a bench's report (read as study.SUPERSEDED_FILE: rpka.report)
SUPERSEDED_FILE = paths.SUPERSEDED_FILE

NOTEBOOKS = (
    "01_train.ipynb",
    "02_sweep.ipynb",
    "03_deltas.ipynb",
    "04_mechanism.ipynb",
    "05_scaling.ipynb",
    "07_your_model.ipynb",  # before the report: the pipeline renders the last notebook
    "06_report.ipynb",
)


def notebook_parameters(preset: str) -> dict[str, dict[str, Any]]:
    """Each notebook's parameters for ``preset`` (all literals, relative to the repo root)."""
    results, figures = paths.results_dir(preset), paths.figures_dir(preset)
    report = paths.bench_report(preset)
    mechanism = paths.mechanism_json(preset, get_task(MECHANISM_TRACK).out_dir)
    return {
        "01_train.ipynb": {
            "preset": preset,
            "run_dir": paths.demo_run_dir(preset),
            "figures_dir": figures,
        },
        "02_sweep.ipynb": {"preset": preset, "results_dir": results, "figures_dir": figures},
        "03_deltas.ipynb": {"preset": preset, "bench_report": report, "figures_dir": figures},
        "04_mechanism.ipynb": {
            "preset": preset,
            "mechanism_json": mechanism,
            "figures_dir": figures,
        },
        "05_scaling.ipynb": {
            "preset": preset,
            "scaling_cpu_json": paths.scaling_cpu_json(preset),
            "scaling_gpu_json": paths.GPU_SCALING_JSON,
            "decode_json": paths.decode_json("cpu"),
            "longctx_json": paths.long_context_json(preset, long_range(preset)),
            "figures_dir": figures,
        },
        "07_your_model.ipynb": {
            "preset": preset,
            "swap_audit_json": paths.swap_audit_json(preset),
            "figures_dir": figures,
        },
        "06_report.ipynb": {
            "preset": preset,
            "results_dir": results,
            "study_json": paths.study_json(preset),
            "frontier_json": paths.frontier_json(preset),
            "longrange_dir": paths.longrange_dir(preset),
            "mechanism_json": mechanism,
            "mechanism_followup_json": paths.mechanism_followup_json(
                preset, get_task(MECHANISM_TRACK).out_dir
            ),
            "scaling_cpu_json": paths.scaling_cpu_json(preset),
            "decode_json": paths.decode_json("cpu"),
            "causal_cpu_json": paths.CAUSAL_CPU_JSON,
            "scaling_gpu_json": paths.GPU_SCALING_JSON,
            "arms_latency_json": paths.ARMS_LATENCY_JSON,
            "rank_law_json": paths.RANK_LAW_JSON,
            "swap_audit_json": paths.swap_audit_json(preset),
            "figures_dir": figures,
        },
    }


# --------------------------------------------------------------------------- compute


def long_range(preset: str) -> bool:
    """Whether ``preset``'s long-context study is a long-range one (its gate needs the local
    control: the standard study), which ``paths.long_context_dir`` places in its own folder."""
    return get_longctx_preset(preset).bench.decision.gate_needs_local


# the CPU latency sweep each preset re-measures (rpka.speed.scaling presets)
SCALING_PRESET = {"smoke": "tiny", "quick": "tiny", "standard": "standard", "full": "cpu"}


DEMO_STEP = "demo training (01_train)"
SWAP_STEP = "swap audit (07_your_model)"
INDEX_STEP = "study index"


def render_steps(preset: str) -> list[tuple[str, Callable[[], object], tuple[str, ...]]]:
    """What ``report --from-results`` computes: the study index where there is none (a
    study run before the index existed), nothing else - never a training run, never a
    result file that is there (it may be a committed one)."""
    if resolve(paths.study_json(preset)).exists():
        return []
    return [
        (INDEX_STEP, lambda: write_study_index(preset), (paths.study_json(preset),)),
    ]


class WorkerPool:
    """One pool of worker processes for the study's benches, one bench after another.

    Starting a pool - spawning processes that import torch and the package - took ~3 s
    (2 workers, measured 2026-12-01), paid once per bench when each made its own: ~15 s of
    a quick report. A bench whose ``n_workers`` differs from the pool's (or is 1: it runs
    in-process) makes its own executor as before. Jobs are submitted from the thread that
    runs the study's steps, which outlives the pool (the workers' parent-death signal is
    tied to that thread, ``rpka.training.executors.local_executor``).
    """

    def __init__(self) -> None:
        self.executor: cf.Executor | None = None
        self.n_workers = 0

    def get(self, n_workers: int) -> cf.Executor | None:
        """The shared executor for a bench of ``n_workers`` (None: the bench's own)."""
        if n_workers <= 1 or (self.executor is not None and n_workers != self.n_workers):
            return None
        if self.executor is None:
            self.executor, self.n_workers = bench.default_executor(n_workers), n_workers
        return self.executor

    def close(self, cancel: bool = False) -> None:
        """Shut the pool down; ``cancel``: abort it - queued jobs dropped, running ones
        killed (after a failure or Ctrl-C, as a bench does with its own pool)."""
        if self.executor is not None:
            if cancel:
                executors.abort(self.executor)
            else:
                self.executor.shutdown()
            self.executor = None

    def guard(self, compute: Callable[[], object]) -> Callable[[], object]:
        """``compute``, closing the pool (queued jobs dropped) if it raises: the study
        stops there, and its process must not wait at exit for jobs nobody will read."""

        def guarded() -> object:
            try:
                return compute()
            except BaseException:
                self.close(cancel=True)
                raise

        return guarded


def compute_steps(
    preset: str, progress: bool = True
) -> list[tuple[str, Callable[[], object], tuple[str, ...]]]:
    """The study's computations for ``preset``, in order, each resumable or cheap, with
    the result files (or folders) each writes.

    ``python -m rpka report`` runs these (progress in the terminal) and starts each
    notebook once the steps that write what it reads are done; a notebook computes a
    missing file itself. The benches and the long-context study share one
    :class:`WorkerPool`, closed by the long-context step.
    """
    pool = WorkerPool()
    steps = _study_steps(preset, progress, pool)
    return [(label, pool.guard(compute), outputs) for label, compute, outputs in steps]


def _study_steps(
    preset: str, progress: bool, pool: WorkerPool | None = None
) -> list[tuple[str, Callable[[], object], tuple[str, ...]]]:
    """(label, computation, the result files it writes) of every step of the study;
    with a ``pool``, the benches' runs go to it (else each bench makes its own)."""
    primary = STUDY_TRACKS[0]

    def shared(n_workers: int) -> cf.Executor | None:
        return pool.get(n_workers) if pool is not None else None

    def run_one_bench(name: str) -> dict:
        config = get_preset(preset, name)
        out = paths.bench_dir(preset, get_task(name).out_dir)
        return bench.run_bench(config, out, shared(config.execution.n_workers), progress=progress)

    def run_long_context() -> dict:
        config = get_longctx_preset(preset)
        try:
            executor = shared(config.bench.execution.n_workers)
            out = paths.long_context_dir(preset, long_range(preset))
            return run_longctx(config, out, executor, progress=progress)
        finally:  # the study's last step with workers
            if pool is not None:
                pool.close()

    def bench_step(name: str) -> tuple[str, Callable[[], object], tuple[str, ...]]:
        label = "bench" if name == primary else f"bench ({name})"
        folder = get_task(name).out_dir
        return (
            label,
            lambda: run_one_bench(name),
            (paths.bench_report(preset, folder), paths.mechanism_json(preset, folder)),
        )

    return [
        (  # first: in a preview, 01_train then starts beside the benches
            DEMO_STEP,  # 01_train's models: here a bar in the terminal, in the cell a silent wait
            lambda: train_demo(preset, paths.demo_run_dir(preset), progress=progress),
            (paths.demo_run_dir(preset),),  # run files named by their configuration's hash
        ),
        (  # early and short (~20 s): 07_your_model then starts beside the benches
            SWAP_STEP,
            lambda: resume_or_run_audit(resolve(paths.swap_audit_json(preset))),
            (paths.swap_audit_json(preset),),
        ),
        *(bench_step(name) for name in STUDY_TRACKS),
        (
            "scaling (CPU)",
            lambda: resume_or_run_scaling(
                scaling_config.SCALING_PRESETS[SCALING_PRESET[preset]],
                resolve(paths.scaling_cpu_json(preset)),
                progress=progress,
                preset=SCALING_PRESET[preset],
            ),
            (paths.scaling_cpu_json(preset),),
        ),
        (
            "long-context training",
            run_long_context,
            (paths.long_context_json(preset, long_range(preset)),),
        ),
        (
            INDEX_STEP,
            lambda: write_study_index(preset),
            (paths.study_json(preset), paths.frontier_json(preset)),
        ),
    ]


def resume_or_run_scaling(
    config: scaling_config.ScalingConfig,
    out: str | os.PathLike,
    progress: bool = True,
    preset: str | None = None,
) -> dict:
    """The scaling result at ``out`` if it was measured with ``config``, else
    :func:`rpka.speed.scaling.run_scaling`. A timing is a measurement of a machine, not a
    computation: a study that resumes keeps its committed one, so a clone's first `make
    report` leaves it as committed (``python -m rpka scaling`` measures anew)."""
    if Path(out).exists():
        committed = read_json(out)
        if committed.get("config") == scaling.config_record(config):
            return committed
    return scaling.run_scaling(config, progress=progress, out=out, preset=preset)


def missing_results(preset: str) -> list[str]:
    """The result files the notebooks read (what the compute stages write, and the demo
    run files) that are not there: ``report --from-results`` computes none of them."""
    needed = [paths.bench_report(preset, get_task(name).out_dir) for name in STUDY_TRACKS]
    needed += [
        paths.mechanism_json(preset, get_task(MECHANISM_TRACK).out_dir),
        paths.scaling_cpu_json(preset),
        paths.long_context_json(preset, long_range(preset)),
        paths.swap_audit_json(preset),  # committed for standard and full
    ]
    needed += [os.path.relpath(f, paths.REPO_ROOT) for f in demo_run_files(preset)]
    return [path for path in needed if not resolve(path).exists()]


def results_present(preset: str) -> bool:
    """Whether every result file the notebooks read is there (:func:`missing_results`)."""
    return not missing_results(preset)


class NotComputed(FileNotFoundError):
    """A result file that is missing where nothing may be computed (``report
    --from-results``); the message names it and the command that computes it."""


def not_computed(path: str | Path, preset: str) -> NotComputed:
    return NotComputed(
        f"{path} is not there, and a report from the results computes nothing: "
        f"`python -m rpka report --preset {preset}` computes it"
    )


def load_result(path: str | Path, preset: str, progress: bool = True, compute: bool = True) -> dict:
    """The result file ``path`` of ``preset``'s study; if it is missing (a fresh clone:
    nothing run yet) or corrupt, the study step that writes it runs now - seconds for
    ``smoke``, resumed from its run files otherwise - saying so in one line. Without
    ``compute`` the file is only read: missing, :class:`NotComputed`; corrupt,
    ``CorruptFileError`` (never moved aside: it may be a committed result)."""
    file = resolve(path)
    if not compute:
        if not file.exists():
            raise not_computed(path, preset)
        return read_json_checked(file)
    result = read_json_or_heal(file)  # a corrupt file is moved aside, then rebuilt
    if result is not None:
        return result
    writers = [
        (label, compute)
        for label, compute, outputs in _study_steps(preset, progress)
        if file in {resolve(output) for output in outputs}
    ]
    if not writers:
        raise FileNotFoundError(
            f"{path} does not exist and no step of the {preset!r} study writes it "
            f"(`make report PRESET={preset}` computes the study's results)"
        )
    label, compute = writers[0]
    say_computing(path, label, preset)
    compute()
    return read_json(file)


def say_computing(path: str | Path, label: str, preset: str) -> None:
    """The one line a notebook prints before it computes a result file that is missing."""
    print(
        f"{path} is not there yet: computing it now ({label}, preset {preset}); "
        f"`make report PRESET={preset}` computes every result of the study at once",
        flush=True,
    )


# --------------------------------------------------------------------------- 01_train


def train_demo(
    preset: str, run_dir: str | Path, progress: bool = False, compute: bool = True
) -> dict[str, dict]:
    """One model per arm (the baseline and the primary arm), the preset's middle learning
    rate and first evaluation seed, scored on test; cached in ``run_dir`` by config hash.
    Without ``compute`` the run files are only read (their weights need not be there:
    git keeps the full study's run files, not its weights); one missing raises
    :class:`NotComputed`.

    Returns {arm name: {"result": run result, "run_file": path}}.
    """
    config = get_preset(preset)
    lr = sorted(config.design.learning_rates)[len(config.design.learning_rates) // 2]
    out = {}
    for name in (config.decision.baseline_arm, config.decision.primary_arm):
        run_config = make_run_config(
            config,
            config.arm(name),
            lr,
            [config.design.eval_seeds[0]],
            "test",
            str(resolve(paths.DATA_CACHE)),
            {"enable": progress},
        )
        path = resolve(run_dir) / f"{run_id(run_config)}.json"
        run_config["state_path"] = str(path.with_suffix(".pt"))
        if not compute:
            if not path.exists():
                raise not_computed(path, preset)
            out[name] = {"result": read_run_file(path), "run_file": path}
            continue
        result = None
        if Path(run_config["state_path"]).exists():  # else a committed run file without
            result = bench.finished_result(path, run_config["state_path"])  # its weights:
        if result is None:  # retrained for them, not moved aside; a bad cache heals above
            result = read_run_file(bench.run_to_file(run_config, str(path)))
        out[name] = {"result": result, "run_file": path}
    return out


def demo_weights_present(runs: dict[str, dict]) -> bool:
    """Whether every demo run's weights are beside its run file (:func:`demo_forecasts`
    needs them)."""
    return all(Path(run["run_file"]).with_suffix(".pt").exists() for run in runs.values())


def demo_run_files(preset: str, run_dir: str | Path | None = None) -> list[Path]:
    """The run files :func:`train_demo` reads for ``preset`` (nothing is trained here)."""
    config = get_preset(preset)
    lr = sorted(config.design.learning_rates)[len(config.design.learning_rates) // 2]
    files = []
    for name in (config.decision.baseline_arm, config.decision.primary_arm):
        run_config = make_run_config(
            config, config.arm(name), lr, [config.design.eval_seeds[0]], "test",
            str(resolve(paths.DATA_CACHE)), {"enable": False},
        )  # fmt: skip
        files.append(resolve(run_dir or paths.demo_run_dir(preset)) / f"{run_id(run_config)}.json")
    return files


@torch.no_grad()
def demo_forecasts(
    preset: str, runs: dict[str, dict], n_windows: int = 3
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Context, truth and each run's forecast for ``n_windows`` evenly spaced test windows."""
    config = get_preset(preset)
    track = config.task.load(config.design.track, resolve(paths.DATA_CACHE))
    idx = np.linspace(0, len(track.test) - 1, n_windows).round().astype(int)
    x, y = track.test.x[idx], track.test.y[idx]
    forecasts = {}
    for name, run in runs.items():
        model, _ = load_trained(run["run_file"])
        forecasts[name] = model(x.unsqueeze(0))[0].numpy()
    return x.numpy(), y.numpy(), forecasts


# --------------------------------------------------------------------------- 02/03 bench


def bench_config(preset: str) -> BenchConfig:
    return get_preset(preset)


def load_or_run_bench(
    preset: str,
    out_dir: str | Path,
    progress: bool = False,
    track_name: str = STUDY_TRACKS[0],
    compute: bool = True,
) -> dict:
    """``out_dir/bench_report.json`` if it exists (``python -m rpka report`` runs the bench
    first), else the bench of ``preset`` on ``track_name`` (one of ``STUDY_TRACKS``, whose
    folder is ``rpka.paths.bench_dir``) run (or resumed from its run files) now; without
    ``compute``, only read (:func:`load_result`)."""
    path = resolve(out_dir) / paths.BENCH_REPORT_FILE
    if not compute:
        return load_result(Path(out_dir) / paths.BENCH_REPORT_FILE, preset, compute=False)
    report = read_json_or_heal(path, ("config", "arms"))  # a corrupt one is rebuilt below
    if report is not None:
        return report
    label = "bench" if track_name == STUDY_TRACKS[0] else f"bench ({track_name})"
    say_computing(Path(out_dir) / paths.BENCH_REPORT_FILE, label, preset)
    return bench.run_bench(get_preset(preset, track_name), out_dir, progress=progress)


# --------------------------------------------------------------------------- 04 mechanism


def mechanism_model(signature: dict, fallback: str = "the trained model") -> str:
    """The trained model the mechanism was checked on, in words: the key
    ``trained_model_description``; older files carry the words in ``trained_model``, which
    the bench report's schema keeps a boolean."""
    described = signature.get("trained_model_description")
    if described:
        return str(described)
    old = signature.get("trained_model")
    return old if isinstance(old, str) and old else fallback


def mechanism_summary(mechanism: dict) -> str:
    """The trace-identity result in words (Markdown), every number from ``mechanism.json``."""
    sig = mechanism["trained"]["mechanism_signature"]
    verdict = "**confirmed**" if sig["confirmed"] else "**not confirmed**"
    return (
        f"On {mechanism_model(sig, mechanism.get('model', 'the trained model'))}: the "
        f"identity is {verdict} by the rule "
        f"*{sig['confirmation_rule']}*. "
        f"Over {sig['n_heads']} heads × {sig['rank']} steps = {sig['n_tests']} z-scores, the "
        f"largest |z| is {sig['max_abs_z']:.2f}; {sig['n_exceeding']} exceed 4 "
        f"({sig['expected_exceeding_if_true']:.3f} expected by chance if the identity holds; "
        f"χ² test of all z-scores p = {sig['chi2_p_value']:.3g}). "
        f"The exact expectation (a sum over every candidate pivot) matches the prediction to a "
        f"relative error of at most {sig['max_rel_error_exact']:.1e} (round-off). "
        f"Summed over the steps of the worst head (layer {sig['layer']}, head {sig['head']}): "
        f"predicted {sig['predicted']:.4f}, observed {sig['observed']:.4f} ± "
        f"{sig['observed_se']:.4f} (SE) of tr A, relative error {sig['relative_error']:.2%}."
    )
