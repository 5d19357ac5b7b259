"""One timing protocol for the study's cost ratios (issue 40): ``python -m rpka steptime``.

    python -m rpka steptime --preset longrange-power --out DIR [--contexts 4096]
        [--arms ...] [--repeats 7] [--warmup 2]
    python -m rpka steptime --preset full --tracks [TRACK ...]    # the short tracks' benches

The first times a long-context study's arms per length (``steptime.json`` beside it), the
second each short track's bench of a study (``steptime_tracks.json``); both the same way:

Every arm's training step (``rpka.training.train.train_step``: forward, loss, backward,
gradient clipping, Adam update - the code the study trains with) at each context, measured in
**one process on one thread**, the arms **interleaved** within each repeat in a fresh seeded
random order (``rpka.speed.timing.interleaved``: a drift of the machine's load falls on every
arm alike, and no arm always runs right after exact's cache-filling step), ``warmup`` untimed
repeats first and ``repeats`` >= 7 timed ones. Each step is timed twice: process CPU time
(``time.process_time``, what the study's cost is) and wall time. The model is the study's (S =
``seeds_per_job`` stacked members, batch ``batch_size`` each, the evaluation jobs' shape) on a
few windows of the study's own track (the step does not depend on how many windows there are).
The load average before and after is recorded; so is the peak memory of one step per arm
(``rpka.speed.scaling.peak_memory_mib``, as ``rpka.study.longctx.training_step_peak_mib``).

Per context and arm: the per-repeat CPU and wall seconds, their medians, and the **step
ratio against exact**: per repeat the arm's step over exact's step in the same repeat, the
mean of those ratios and a 95 % t-interval from their spread (``scipy.stats.t``; the
repeats are the replicates). Written atomically, sealed with its checksum
(``rpka.io.write_result_json``), to ``<out>/steptime.json`` beside the study; every cost
ratio in a verdict, table or sentence of the study reads from it (``rpka.verdict.step_cost``).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import resource
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats as scipy_stats

from rpka import numerics
from rpka.bench import DEFAULT_DATA_DIR
from rpka.bench.report import load_average
from rpka.checks import require
from rpka.config.bench import BenchConfig, LongContextConfig
from rpka.config.presets import STUDY_TRACKS, get_preset
from rpka.io import read_json, write_result_json
from rpka.paths import STEPTIME_FILE, TRACK_STEPTIME_FILE, resolve
from rpka.speed.scaling import peak_memory_mib
from rpka.speed.timing import interleaved
from rpka.training.curriculum import WARM_START_KEY
from rpka.training.run_config import make_run_config
from rpka.training.train import Members, Run, member_batches, setup_run, train_step
from rpka.verdict.step_cost import step_shape

STEPTIME_VERSION = 1
MIN_REPEATS = 7  # the protocol's floor of timed repeats per arm
CONFIDENCE = 0.95  # the step ratio's interval
CLOCKS = ("cpu", "wall")


def ratio_summary(arm_s: list[float], baseline_s: list[float]) -> dict[str, float | None]:
    """The step ratio arm / baseline over paired repeats: the mean of the per-repeat ratios
    and its 95 % t-interval (None where fewer than 2 repeats)."""
    ratios = np.asarray(arm_s, float) / np.asarray(baseline_s, float)
    mean = float(ratios.mean())
    if len(ratios) < 2:
        return {"mean": mean, "ci_low": None, "ci_high": None, "n": len(ratios)}
    half = float(
        scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, len(ratios) - 1)
        * ratios.std(ddof=1)
        / np.sqrt(len(ratios))
    )
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": len(ratios)}


def timing_config(config: LongContextConfig) -> LongContextConfig:
    """The study with just enough training windows for one step per member (the step's
    cost does not depend on the windows it draws from) and one evaluation window."""
    batch = config.bench.design.train.batch_size
    return dataclasses.replace(config, train_windows=batch, eval_windows=1)


def arm_run(bench: BenchConfig, arm: str, data_dir: str) -> Run:
    """A run of ``arm`` as an evaluation job trains it (its first seed group's size)."""
    seeds = list(bench.design.eval_seeds[: bench.execution.seeds_per_job])
    run_config = make_run_config(
        bench, bench.arm(arm), bench.design.learning_rates[0], seeds, "test", data_dir
    )
    run_config.pop(WARM_START_KEY, None)  # the step is the run's own context's
    return setup_run(run_config)


def first_batch(run: Run) -> torch.Tensor:
    """The run's first training batch, on its device: drawn once, up front (a step's cost
    does not depend on the windows it trains on; drawing them is not the step)."""
    batches = member_batches(run.n_train, run.train.batch_size, run.data_generators)
    return batches[0].to(run.device)


def step_call(run: Run, members: Members, batch: torch.Tensor) -> Callable[[], object]:
    """One training step of ``run`` on ``batch`` per call, the step counter advanced each
    call as in training."""
    steps = itertools.count()
    return lambda: train_step(run, members, batch, 0, next(steps))


def step_peak_mib(run: Run, members: Members, batch: torch.Tensor) -> float:
    """Peak memory of one training step on ``batch`` above what the run held before it (MiB)."""
    return peak_memory_mib(lambda: train_step(run, members, batch, 0, 0), run.device.type)


def time_context(
    bench: BenchConfig, arms: list[str], repeats: int, warmup: int, data_dir: str
) -> dict[str, Any]:
    """Every arm's step of one bench (a long-range context, or a study track), interleaved
    (module docstring)."""
    runs = {arm: arm_run(bench, arm, data_dir) for arm in arms}
    members = {arm: Members(len(run.seeds), run.device) for arm, run in runs.items()}
    batches = {arm: first_batch(run) for arm, run in runs.items()}
    times_ms = interleaved(
        {arm: step_call(run, members[arm], batches[arm]) for arm, run in runs.items()},
        warmup,
        repeats,
    )
    seconds = {
        arm: {clock: [ms / 1e3 for ms in times_ms[arm][f"{clock}_ms"]] for clock in CLOCKS}
        for arm in arms
    }
    baseline = bench.decision.baseline_arm if bench.decision.baseline_arm in arms else None
    out = {}
    for arm, run in runs.items():
        entry: dict[str, Any] = {"peak_mib": step_peak_mib(run, members[arm], batches[arm])}
        entry["members"] = len(run.seeds)
        for clock in CLOCKS:
            entry[f"{clock}_s"] = seconds[arm][clock]
            entry[f"{clock}_s_median"] = statistics.median(seconds[arm][clock])
            entry[f"step_ratio_{clock}"] = (
                ratio_summary(seconds[arm][clock], seconds[baseline][clock]) if baseline else None
            )
        out[arm] = entry
    return out


def _check_repeats(repeats: int, warmup: int) -> None:
    require(isinstance(repeats, int) and repeats >= MIN_REPEATS, "repeats",
            f"an integer >= {MIN_REPEATS}", repeats)  # fmt: skip
    require(isinstance(warmup, int) and warmup >= 1, "warmup", "an integer >= 1", warmup)


def _with_baseline(bench: BenchConfig, arms: list[str] | None) -> list[str]:
    """``arms`` (default: every arm of ``bench``), checked, the baseline first if absent:
    every ratio is against it."""
    names = [a.name for a in bench.design.arms]
    chosen = list(arms) if arms else names
    unknown = sorted(set(chosen) - set(names))
    require(not unknown, "arms", f"names among {names}", unknown)
    baseline = bench.decision.baseline_arm
    return chosen if baseline in chosen else [baseline, *chosen]


def _timing_file(
    preset: str,
    key: str,
    benches: dict[str, tuple[BenchConfig, list[str]]],
    path: Path,
    repeats: int,
    warmup: int,
    step_words: str,
    shapes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Time each bench's arms (:func:`time_context`, one thread) and write ``path`` (sealed):
    ``result[key][name]`` per bench ``name``; ``step_words`` says what one step trains, and
    ``shapes`` (per bench, ``rpka.verdict.step_cost.step_shape``) what a report must match."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    data_dir = str(resolve(DEFAULT_DATA_DIR))
    baselines = sorted({bench.decision.baseline_arm for bench, _ in benches.values()})
    result: dict[str, Any] = {
        "steptime_version": STEPTIME_VERSION,
        "preset": preset,
        "protocol": (
            f"one process, one thread; arms interleaved each repeat (seeded random order); "
            f"{warmup} untimed warm-up repeat(s), {repeats} timed; training step of {step_words}"
            "; CPU time (time.process_time) and wall time (time.perf_counter); step ratio: "
            f"mean of per-repeat ratios to {', '.join(baselines)}, {CONFIDENCE:.0%} "
            "t-interval"
        ),
        "repeats": repeats,
        "warmup": warmup,
        "torch_threads": 1,
        "numerics": numerics.record(),  # the protocol times native kernels: rpka.numerics
        "load_average_start": load_average(),
        key: {},
    }
    if shapes is not None:
        result["shapes"] = shapes
    try:
        for name, (bench, arms) in benches.items():
            result[key][name] = time_context(bench, arms, repeats, warmup, data_dir)
    finally:
        torch.set_num_threads(threads)
    result["load_average_end"] = load_average()
    result["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    write_result_json(path, result)
    return result


def run_steptime(
    config: LongContextConfig,
    out_dir: str | os.PathLike,
    repeats: int = MIN_REPEATS,
    warmup: int = 2,
    arms: list[str] | None = None,
) -> dict[str, Any]:
    """Time every arm's step at every context of ``config`` on one thread; write and return
    ``<out_dir>/steptime.json`` (sealed)."""
    _check_repeats(repeats, warmup)
    chosen = _with_baseline(config.bench, arms)
    small = timing_config(config)
    benches = {str(c): (small.bench_for(c), chosen) for c in config.contexts}
    step_words = (
        f"{config.bench.execution.seeds_per_job} stacked seed(s) x batch "
        f"{config.bench.design.train.batch_size}"
    )
    path = Path(out_dir) / STEPTIME_FILE
    return _timing_file(config.preset, "contexts", benches, path, repeats, warmup, step_words)


def run_track_steptime(
    preset: str,
    out_dir: str | os.PathLike,
    repeats: int = MIN_REPEATS,
    warmup: int = 2,
    tracks: list[str] | None = None,
    extensions: dict[str, str | os.PathLike] | None = None,
) -> dict[str, Any]:
    """Time every arm's step of each study track's bench of ``preset`` (``STUDY_TRACKS``;
    ``tracks``: these only) and of each ``extensions`` bench (name -> its bench report,
    whose configuration it rebuilds), the arms of a bench interleaved, one thread; write and
    return ``<out_dir>/steptime_tracks.json`` (sealed, key ``tracks``). The short tracks'
    cost ratios are read from it (``rpka.verdict.step_cost.with_step_timing``), never from
    training wall times."""
    _check_repeats(repeats, warmup)
    names = list(STUDY_TRACKS) if tracks is None else list(tracks)
    unknown = sorted(set(names) - set(STUDY_TRACKS))
    require(not unknown, "tracks", f"names among {list(STUDY_TRACKS)}", unknown)
    configs = {name: get_preset(preset, name) for name in names}
    for name, report in (extensions or {}).items():
        configs[name] = BenchConfig.from_dict(read_json(report)["config"])
    require(bool(configs), "tracks", "at least one track or extension", names)
    benches = {name: (bench, _with_baseline(bench, None)) for name, bench in configs.items()}
    step_words = "each track's evaluation job (its stacked seeds x its batch)"
    path = Path(out_dir) / TRACK_STEPTIME_FILE
    shapes = {name: step_shape(bench.to_dict()) for name, (bench, _) in benches.items()}
    return _timing_file(preset, "tracks", benches, path, repeats, warmup, step_words, shapes)


def steptime_lines(result: dict[str, Any]) -> list[str]:
    """A plain-text table: median CPU ms, CPU step ratio [95 % CI], peak MiB per arm."""
    key = "contexts" if "contexts" in result else "tracks"
    lines = [f"{key[:-1]:>17} {'arm':<22} {'cpu ms':>9} {'ratio vs exact [95% CI]':>28} "
             f"{'peak MiB':>9}"]  # fmt: skip
    for context, arms in result[key].items():
        for arm, entry in arms.items():
            ratio = entry["step_ratio_cpu"]
            text = "-"
            if ratio and ratio["ci_low"] is not None:
                text = f"{ratio['mean']:.3f} [{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}]"
            lines.append(
                f"{context:>17} {arm:<22} {entry['cpu_s_median'] * 1e3:>9.1f} {text:>28} "
                f"{entry['peak_mib']:>9.1f}"
            )
    lines.append(f"load average {result['load_average_start']} -> {result['load_average_end']}")
    return lines
