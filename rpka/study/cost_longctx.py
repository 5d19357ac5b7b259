"""The price of a long-context study (``python -m rpka cost --longctx PRESET``), per length,
before it runs (issue 40: "price every length before running and record predicted and
measured CPU-s").

Each context's bench is priced by the cost model of ``rpka.study.cost`` (eq. (1) over its jobs,
from probes of its own arms and stacked-seed counts). A context above the study's
``warm_start_from`` is a curriculum: every job first trains the same arm, seeds and steps
at the short context, scored on validation only (``rpka.training.curriculum.first_stage_config``),
so each job also costs eq. (1) of a validation-only job of the short context's probes:

    cost(context) = sum over jobs [ eq. (1) at context + eq. (1) at warm_start_from, no test ]

``probe_eval_windows`` probes the evaluation passes on fewer windows and scales them up
(they are linear in the windows; at 4,096 tokens a full pass costs minutes). Where the
study's ``longctx.json`` already exists beside the prediction, each context's recorded
training CPU (``timings.run_cpu_s`` of its bench report, both stages) is set beside it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import torch

from rpka import paths
from rpka.bench import DEFAULT_DATA_DIR, job_groups
from rpka.config.bench import BenchConfig, LongContextConfig
from rpka.io import read_json, write_result_json
from rpka.paths import resolve
from rpka.study.cost import Probe, measured_cpu_s, predict_bench, price, probe, probes_of

LONGCTX_COST_VERSION = 1
COST_FILE = paths.COST_MODEL_FILE  # the length-by-length price, in the study's folder


def scaled_probes(bench: dict[str, Any], factor: float) -> dict[tuple[str, int], Probe]:
    """The probes of a :func:`rpka.study.cost.predict_bench` result, evaluation passes x factor."""
    return {
        key: dataclasses.replace(p, val_s=p.val_s * factor, test_s=p.test_s * factor)
        for key, p in probes_of(bench).items()
    }


def probed(
    config: LongContextConfig,
    context: int,
    probe_eval_windows: int | None,
    steps: int,
    progress: bool = True,
) -> tuple[dict[tuple[str, int], Probe], float]:
    """The probes of ``context``'s bench (evaluation passes scaled to the study's windows)
    and what probing cost (CPU-s)."""
    small = config
    if probe_eval_windows is not None:
        small = dataclasses.replace(config, eval_windows=probe_eval_windows)
    bench = predict_bench(
        small.bench_for(context), steps=steps, progress=progress, label=f"{context}"
    )
    factor = config.eval_windows / (probe_eval_windows or config.eval_windows)
    return scaled_probes(bench, factor), bench["probe_cpu_s"]


def first_stage_s(
    bench: BenchConfig, warm_probes: dict[tuple[str, int], Probe]
) -> dict[str, float]:
    """Per arm, the CPU-s of its jobs' first stages (validation-only jobs at the warm
    context, priced by that context's probes)."""
    out: dict[str, float] = {}
    for group in job_groups(bench):
        job = warm_probes[group.arm, group.members].job_s(bench.design.train.epochs, "sweep")
        out[group.arm] = out.get(group.arm, 0.0) + group.jobs * job
    return out


def price_context(
    config: LongContextConfig,
    context: int,
    probes: dict[tuple[str, int], Probe],
    warm_probes: dict[tuple[str, int], Probe] | None,
) -> dict[str, Any]:
    """One context's predicted CPU-s per arm and in all, first stages included."""
    bench = config.bench_for(context)
    priced = price(bench, probes)
    stages = first_stage_s(bench, warm_probes) if warm_probes else {}
    for name, entry in priced["arms"].items():
        entry["first_stage_cpu_s"] = stages.get(name, 0.0)
        entry["predicted_cpu_s"] += entry["first_stage_cpu_s"]
        entry["probes"] = [dataclasses.asdict(p) for k, p in probes.items() if k[0] == name]
    priced["predicted_cpu_s"] = sum(a["predicted_cpu_s"] for a in priced["arms"].values())
    priced["first_stage_cpu_s"] = sum(stages.values())
    priced["eval_seeds"] = len(bench.design.eval_seeds)
    priced["seeds_per_job"] = bench.execution.seeds_per_job
    return priced


def measured(out_dir: Path, context: int) -> dict[str, float] | None:
    """The recorded training CPU-s per arm of ``context``'s bench report, if it ran."""
    report = out_dir / paths.longctx_context_dir(context) / "bench_report.json"
    return measured_cpu_s(read_json(report)) if report.exists() else None


def price_longctx(
    config: LongContextConfig,
    out_dir: str | os.PathLike,
    steps: int = 3,
    probe_eval_windows: int | None = 32,
    out_file: str | os.PathLike | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Price every context of ``config`` (module docstring); write and return
    ``<out_dir>/cost_model.json`` (or ``out_file``), one thread as each job runs."""
    if probe_eval_windows is not None and not 1 <= probe_eval_windows <= config.eval_windows:
        raise ValueError(
            f"probe_eval_windows must be in [1, {config.eval_windows}] (the study's "
            f"evaluation windows), got {probe_eval_windows}"
        )
    config.validate()
    out = resolve(out_dir)
    started, load_start = time.process_time(), list(os.getloadavg())
    warm = config.warm_start_from
    needs_warm = warm is not None and any(c > warm for c in config.contexts)
    first = config.bench_for(config.contexts[0])  # first-call costs out of the probes
    probe(first, first.design.arms[0], 1, str(resolve(DEFAULT_DATA_DIR)), steps=1)
    warm_probes = None
    if needs_warm:  # the warm context's bench: the template at that length (first stages)
        warm_config = dataclasses.replace(config, contexts=(warm,), warm_start_from=None)
        warm_probes = probed(warm_config, warm, probe_eval_windows, steps, progress)[0]
    contexts: dict[str, Any] = {}
    for context in config.contexts:
        probes, _ = probed(config, context, probe_eval_windows, steps, progress)
        stage = warm_probes if warm is not None and context > warm else None
        entry = price_context(config, context, probes, stage)
        recorded = measured(out, context)
        entry["measured_cpu_s"] = sum(recorded.values()) if recorded else None
        contexts[str(context)] = entry
    result = {
        "cost_version": LONGCTX_COST_VERSION,
        "preset": config.preset,
        "model": "per job: eq. (1) at its context + eq. (1) of a validation-only job at "
        "warm_start_from (the curriculum's first stage), summed (rpka.cost_longctx)",
        "probe_steps": steps,
        "probe_eval_windows": probe_eval_windows,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": load_start,
        "contexts": contexts,
        "predicted_cpu_s": sum(c["predicted_cpu_s"] for c in contexts.values()),
        "probe_cpu_s": time.process_time() - started,
    }
    result["load_average_end"] = list(os.getloadavg())
    write_result_json(Path(out_file) if out_file else out / COST_FILE, result)
    return result


def price_lines(result: dict[str, Any]) -> list[str]:
    """One line per context: predicted CPU-s in all, its first stages, per arm."""
    lines = []
    for context, entry in result["contexts"].items():
        arms = ", ".join(f"{a} {e['predicted_cpu_s']:,.0f}" for a, e in entry["arms"].items())
        recorded = entry["measured_cpu_s"]
        lines.append(
            f"{context:>5} tokens: {entry['predicted_cpu_s']:,.0f} CPU-s predicted (first "
            f"stages {entry['first_stage_cpu_s']:,.0f}; {entry['eval_seeds']} seeds; measured "
            f"{'-' if recorded is None else format(recorded, ',.0f')}): {arms}"
        )
    lines.append(f"total {result['predicted_cpu_s']:,.0f} CPU-s")
    return lines
