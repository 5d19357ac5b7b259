"""Cost model of a bench: the CPU seconds of its training runs, predicted from its
configuration (issue 16's study budget).

A bench (:func:`rpka.bench.run_bench`) trains jobs: per arm, one per (swept learning rate,
sweep seed group), scored on validation, and one per evaluation seed group, scored on
test. A job stacks its S seeds in one model, trains E epochs of N steps and evaluates the
validation split after each epoch (:func:`rpka.training.train.train_run`), so its CPU time is about

    cost = t_setup + E (N t_step + t_val) [+ t_test for an evaluation job]        (1)

where ``t_step``, ``t_val``, ``t_test`` and ``t_setup`` depend on the arm, S and the
track's shapes, and the learning rate does not enter. :func:`probe` measures them on the
bench's own configuration - the run set-up, a few training steps after a warm-up step
(their median), one validation and one test pass - with the training code itself
(``setup_run``, ``train_step``, ``evaluate``), and :func:`predict_bench` sums (1) over the
bench's jobs (:func:`rpka.bench.job_groups`). Probing costs a few steps and two evaluation passes
per (arm, S): seconds to a few minutes per bench, against the bench's hours.

Times are process CPU seconds of one thread, as the benches record each run's ``cpu_s``
(one thread per worker): a prediction is comparable with ``timings.run_cpu_s`` of a
bench report (:func:`measured_cpu_s`), and the wall time of the runs on W workers is about
the sum / W when the jobs pack well. On a busy machine both inflate; measure quietly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from rpka import paths
from rpka.bench import DEFAULT_DATA_DIR, job_groups
from rpka.config.bench import ArmConfig, BenchConfig
from rpka.config.presets import STUDY_TRACKS, get_preset
from rpka.config.presets_longctx import get_longctx_preset
from rpka.io import read_json, write_result_json
from rpka.paths import resolve
from rpka.tracks import get_task
from rpka.tracks.cache import track_fields
from rpka.training.run_config import make_run_config
from rpka.training.seed_data import run_splits
from rpka.training.train import Members, member_batches, setup_run, train_step

COST_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Probe:
    """The terms of eq. (1) for one arm and S, measured (CPU seconds, one thread)."""

    members: int
    steps_per_epoch: int
    setup_s: float
    step_s: float  # median of the timed steps
    val_s: float  # one pass over the validation split
    test_s: float  # one pass over the test split

    def job_s(self, epochs: int, phase: str) -> float:
        """Eq. (1): one job of ``epochs`` epochs in ``phase``."""
        per_epoch = self.steps_per_epoch * self.step_s + self.val_s
        return self.setup_s + epochs * per_epoch + (self.test_s if phase == "eval" else 0.0)


def probe(
    config: BenchConfig, arm: ArmConfig, members: int, data_dir: str, steps: int = 3
) -> Probe:
    """Measure eq. (1)'s terms for ``arm`` with ``members`` stacked seeds on ``config``.

    One run is set up as the bench would (first learning rate; the rate does not change
    the cost), trains one warm-up step and ``steps`` timed steps on the first epoch's
    batches (cycled if the epoch is shorter), then evaluates the validation and the test
    split once. The track's data must be cached in ``data_dir`` (:func:`predict_bench`
    does it first), as the bench caches it before its runs.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    seeds = list(range(members))  # the seeds do not change any shape
    run_config = make_run_config(
        config, arm, config.design.learning_rates[0], seeds, "test", data_dir
    )
    run_splits(run_config, config.task, config.design.track)  # each seed's data cached, untimed
    start = time.process_time()
    run = setup_run(run_config)
    setup_s = time.process_time() - start
    alive = Members(members, run.device)
    batches = member_batches(run.n_train, run.train.batch_size, run.data_generators)
    times = []
    for i in range(steps + 1):  # step 0 warms up (first-call costs, allocator)
        start = time.process_time()
        train_step(run, alive, batches[i % len(batches)].to(run.device), 0, i)
        times.append(time.process_time() - start)
    passes = {}
    for split in ("val", "test"):
        start = time.process_time()
        run.evaluate(split)
        passes[split] = time.process_time() - start
    return Probe(
        members=members,
        steps_per_epoch=run.steps_per_epoch,
        setup_s=setup_s,
        step_s=statistics.median(times[1:]),
        val_s=passes["val"],
        test_s=passes["test"],
    )


def shape_signature(config: BenchConfig) -> str:
    """A hash of what a probe's times depend on: the track, the model, the batch sizes and
    each arm's method and options - not the seeds, epochs or learning rates, which
    :func:`price` counts. Stored probes price a configuration only with the same
    signature: a resized track or model is re-probed, never priced with stale times."""
    shape = {
        "track": track_fields(config.design.track),
        "model": dataclasses.asdict(config.design.model),
        "batch_size": config.design.train.batch_size,
        "eval_batch_size": config.design.train.eval_batch_size,
        "arms": sorted([a.name, a.method, a.options] for a in config.design.arms),
    }
    text = json.dumps(shape, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def price(config: BenchConfig, probes: dict[tuple[str, int], Probe]) -> dict[str, Any]:
    """Eq. (1) summed over the jobs of ``config`` with measured ``probes`` ((arm, members)
    -> :class:`Probe`, one for every job group): per arm the predicted CPU seconds of its
    sweep and its evaluation jobs, and the bench's total. No measuring: the same probes
    price another configuration of the same shapes (more seeds, epochs or rates)."""
    arms: dict[str, dict[str, Any]] = {}
    groups = job_groups(config)
    for group in groups:
        seconds = group.jobs * probes[group.arm, group.members].job_s(
            config.design.train.epochs, group.phase
        )
        entry = arms.setdefault(group.arm, {"sweep_cpu_s": 0.0, "eval_cpu_s": 0.0, "jobs": 0})
        entry[f"{group.phase}_cpu_s"] += seconds
        entry["jobs"] += group.jobs
    for entry in arms.values():
        entry["predicted_cpu_s"] = entry["sweep_cpu_s"] + entry["eval_cpu_s"]
    return {
        "arms": arms,
        "predicted_cpu_s": sum(a["predicted_cpu_s"] for a in arms.values()),
        "n_jobs": sum(g.jobs for g in groups),
        "epochs": config.design.train.epochs,
    }


def predict_bench(
    config: BenchConfig,
    data_dir: str | os.PathLike | None = None,
    steps: int = 3,
    progress: bool = True,
    label: str = "",
) -> dict[str, Any]:
    """The predicted CPU seconds of every training run of the bench ``config``: one
    :func:`probe` per (arm, members) of its jobs, then :func:`price` (``label``: the
    progress bar's name for the bench).

    Returns :func:`price`'s dict with each arm's probes (``arms.<arm>.probes``, as dicts)
    and ``probe_cpu_s``, what the probing itself cost.
    """
    config.validate()
    data_dir = str(resolve(data_dir or DEFAULT_DATA_DIR))
    config.task.load(config.design.track, data_dir)  # generate the cache before timing anything
    keys = sorted({(g.arm, g.members) for g in job_groups(config)}, key=str)
    start = time.process_time()
    probes = {
        (arm, members): probe(config, config.arm(arm), members, data_dir, steps)
        for arm, members in tqdm(keys, desc=f"cost {label or config.preset}", disable=not progress)
    }
    result = price(config, probes)
    for (arm, _), measured in probes.items():
        result["arms"][arm].setdefault("probes", []).append(dataclasses.asdict(measured))
    result["probe_cpu_s"] = time.process_time() - start
    result["shape_signature"] = shape_signature(config)
    return result


def probes_of(bench: dict[str, Any]) -> dict[tuple[str, int], Probe]:
    """The probes a :func:`predict_bench` result (e.g. from ``cost_model.json``) holds."""
    return {
        (arm, p["members"]): Probe(**p)
        for arm, entry in bench["arms"].items()
        for p in entry["probes"]
    }


def measured_cpu_s(report: dict[str, Any]) -> dict[str, float]:
    """Each arm's recorded CPU seconds (sweep + evaluation runs) in a bench report."""
    return {name: t["sweep"] + t["eval"] for name, t in report["timings"]["run_cpu_s"].items()}


def study_benches(preset: str) -> list[tuple[str, BenchConfig, Path]]:
    """The study's benches as (label, configuration, its bench report's path): the
    tracks of ``STUDY_TRACKS``, then the long-context study's one bench per context."""
    benches = [
        (
            name,
            get_preset(preset, name),
            resolve(paths.bench_report(preset, get_task(name).out_dir)),
        )
        for name in STUDY_TRACKS
    ]
    longctx = get_longctx_preset(preset)
    for context in longctx.contexts:
        folder = resolve(paths.results_dir(preset)) / paths.longctx_context_dir(context)
        benches.append(
            (f"longctx-{context}", longctx.bench_for(context), folder / "bench_report.json")
        )
    return benches


def cost_model_json(preset: str) -> Path:
    """``data/results/<preset>/cost_model.json``."""
    return resolve(paths.results_dir(preset)) / paths.COST_MODEL_FILE


def run_cost_model(
    preset: str,
    only: list[str] | None = None,
    steps: int = 3,
    out: str | os.PathLike | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Predict every bench of the study ``preset`` (or those labelled in ``only``), set
    each prediction beside the CPU seconds its committed bench report recorded (where one
    exists), and write ``cost_model.json``. Run it single-threaded (the CLI sets one
    thread), as the benches run each job."""
    benches = study_benches(preset)
    labels = [label for label, _, _ in benches]
    unknown = sorted(set(only or []) - set(labels))
    if unknown:
        raise ValueError(f"unknown bench(es) {unknown}; the study's benches are {labels}")
    result: dict[str, Any] = {
        "cost_version": COST_VERSION,
        "preset": preset,
        "model": "t_setup + E (N t_step + t_val) [+ t_test] per job, summed (rpka.cost)",
        "probe_steps": steps,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": list(os.getloadavg()),
        "benches": {},
    }
    # first-call costs (imports, kernels, the allocator) out of the first bench's probes
    _, first, _ = benches[0]
    probe(first, first.design.arms[0], 1, str(resolve(DEFAULT_DATA_DIR)), steps=1)
    target = Path(out) if out else cost_model_json(preset)
    if only and target.exists():  # a partial rerun keeps the other benches' entries
        result["benches"] = read_json(target).get("benches", {})
    for label, config, report_path in benches:
        if only and label not in only:
            continue
        predicted = predict_bench(config, steps=steps, progress=progress, label=label)
        measured = measured_cpu_s(read_json(report_path)) if report_path.exists() else None
        for name, arm in predicted["arms"].items():
            arm["measured_cpu_s"] = measured.get(name) if measured else None
        predicted["measured_cpu_s"] = sum(measured.values()) if measured else None
        result["benches"][label] = predicted
    result["load_average_end"] = list(os.getloadavg())
    write_result_json(target, result)
    return result


def stored_prediction(preset: str, cores: int | None = None) -> dict[str, Any] | None:
    """The study's CPU seconds priced from the probes stored in ``cost_model.json`` (no
    timing): eq. (1) over each bench's jobs as configured now (:func:`price`). Jobs whose
    (arm, seed count) has no stored probe, and benches whose shapes changed since they were
    probed (:func:`shape_signature`; files written before the signature existed are not
    checked), are listed in ``unpriced`` and left out of the total. None when the preset
    has no stored cost model. ``wall_s`` is the total over ``cores`` workers (default: this
    machine's), assuming the jobs pack well."""
    path = cost_model_json(preset)
    if not path.exists():
        return None
    stored = read_json(path).get("benches", {})
    total, unpriced, benches = 0.0, [], {}
    for label, config, _ in study_benches(preset):
        signature = shape_signature(config)
        if stored.get(label, {}).get("shape_signature", signature) != signature:
            unpriced.append(f"{label} (resized since it was probed)")
            continue
        probes = probes_of(stored[label]) if label in stored else {}
        missing = sorted({f"{label}:{g.arm}" for g in job_groups(config)
                          if (g.arm, g.members) not in probes})  # fmt: skip
        unpriced += missing
        if missing:  # price the jobs that have probes
            config = config.replace(arms=tuple(
                a for a in config.design.arms if f"{label}:{a.name}" not in missing))  # fmt: skip
        try:
            benches[label] = price(config, probes)["predicted_cpu_s"] if config.design.arms else 0.0
        except (KeyError, ValueError):  # a configuration the probes cannot price
            unpriced.append(label)
            continue
        total += benches[label]
    cores = cores or os.cpu_count() or 1
    return {"predicted_cpu_s": total, "wall_s": total / cores, "cores": cores,
            "benches": benches, "unpriced": unpriced, "cost_model": str(path)}  # fmt: skip


def prediction_line(prediction: dict[str, Any]) -> str:
    """One line for the terminal before a study starts."""
    line = (
        f"predicted training cost: {prediction['predicted_cpu_s']:,.0f} CPU-s, about "
        f"{prediction['wall_s'] / 60:,.0f} min on {prediction['cores']} cores "
        f"(stored probes, {prediction['cost_model']})"
    )
    if prediction["unpriced"]:
        line += f"; not priced (no stored probe): {', '.join(prediction['unpriced'])}"
    return line
