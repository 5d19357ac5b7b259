"""Long-context training: exact attention against RPKA at contexts 512 and 2,048 (issues 6, 14).

    python -m rpka longctx --preset {smoke,quick,full} [--out DIR] [--contexts 512 2048]
        [--ranks 16 64 128] [--seeds N] [--workers N] [--no-progress]

The study is the bench (:func:`rpka.bench.run_bench`) run once per context length on the
preset's template (``rpka.config.presets_longctx.LONGCTX_PRESETS``), its track resized to
each context by the track's own ``Task.at_context`` (same window counts, hence the same
training steps, at every context): the same protocol - learning rates chosen on validation
with the sweep seeds, fresh evaluation seeds scored on test, each RPKA arm compared seed by
seed with ``exact`` under the bench's decision rule - at the shapes this study can afford.
The presets train on ``forecast-regimes``, where the forecast needs the earlier occurrences
of the regime the window returns to, and carry the control ``mean-attention``: each context
reports its attention gate (``rpka.verdict.stats.attention_gate``, the control against
exact), without which its verdicts read "uninformative". Per context and arm it reports:

* ``step_ms``: median wall time of a training step (forward, backward, Adam update) of the
  evaluation runs after their warm-up steps, as the bench measures it (``step_members``
  seeds stacked in one model, each of ``batch_size`` windows; one thread per worker);
* ``peak_mib``: peak memory of one such training step above what was allocated before it
  (weights, Adam state, the batch), from :func:`training_step_peak_mib`: on a GPU
  ``torch.cuda.max_memory_allocated``, on the CPU the running sum of the tensor
  allocations ``torch.profiler`` records - ``rpka.speed.scaling.peak_memory_mib``, whose caveats
  (PyTorch tensors only, operator granularity) apply;
* ``test_mse``: per evaluation seed, and the paired comparison with ``exact``.

Everything is written to ``<out>/longctx.json`` (keys documented in ``docs/longctx.md``)
after each context, atomically; each context's bench keeps its own folder
``<out>/longctx/context-<n>/`` (``bench_report.json`` and the run files), so an
interrupted study resumes run by run.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from rpka import paths
from rpka.bench import (
    default_executor,
    device_description,
    run_bench,
    seed_groups,
    versions,
)
from rpka.checks import require_memory
from rpka.config.bench import BenchConfig, LongContextConfig
from rpka.io import TIMING_KEYS, read_json, write_result_and_timings
from rpka.paths import resolve
from rpka.speed.scaling import peak_memory_mib
from rpka.tracks import get_task
from rpka.tracks.cache import DEFAULT_DATA_DIR, track_fields
from rpka.training.executors import owned
from rpka.training.run_config import make_run_config
from rpka.training.seed_data import (
    data_per_seed,
    member_batch,
    n_windows,
    run_splits,
    tracks_to_cache,
)
from rpka.training.train import build_model, track_config_of
from rpka.verdict.stats import ALPHA

LONGCTX_VERSION = "1.0"
FILE_NAME = "longctx.json"
MiB = 2**20


# --------------------------------------------------------------------------- peak memory


def training_step_peak_mib(run_config: dict[str, Any]) -> dict[str, Any]:
    """Peak memory of one training step of a run's model, above what it held before.

    Builds the run's stacked model (``rpka.training.train.build_model``: S = ``len(seeds)``
    members), takes one untimed step so that Adam's state exists, then measures a second
    step - forward on S x ``batch_size`` training windows, the summed per-member MSE,
    backward, Adam update, gradients freed - with ``rpka.speed.scaling.peak_memory_mib``. The
    memory held before it (weights, Adam state, batch) is not counted; activations kept for
    backward, gradients and the attention's temporaries are. A pure function of
    ``run_config`` (the executor seam of ``rpka.bench``).
    """
    device = torch.device(run_config["device"])
    track_config = track_config_of(run_config)
    train_x, train_y = run_splits(run_config, get_task(track_config.name), track_config)["train"]
    model = build_model(run_config, track_config, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=run_config["lr"])
    n_members, batch = len(run_config["seeds"]), run_config["train"]["batch_size"]
    per_member = data_per_seed(run_config)
    # which windows does not change the memory: the first S x B, wrapping around
    n_train = n_windows(train_x, per_member)
    index = torch.arange(n_members * batch).remainder(n_train).view(n_members, batch)
    x, y = (member_batch(t, index, per_member).to(device) for t in (train_x, train_y))

    def step() -> None:
        loss = (model(x) - y).pow(2).mean((1, 2)).sum()  # each member's gradient is its own
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    return {
        "peak_mib": peak_memory_mib(step, device.type),
        "members": n_members,
        "batch_size": batch,
        "torch_threads": torch.get_num_threads(),
    }


def probe_run_config(bench: BenchConfig, arm_name: str, data_dir: str) -> dict[str, Any]:
    """The memory probe's run: the arm's first evaluation seed group (as many members as a
    timed evaluation step), at the first learning rate (the rate does not change memory)."""
    seeds = seed_groups(bench, "eval")[0]
    return make_run_config(
        bench, bench.arm(arm_name), bench.design.learning_rates[0], seeds, "test", data_dir
    )


# --------------------------------------------------------------------------- the study


def memory_bytes(config: LongContextConfig, context: int) -> float:
    """A lower estimate of one context's peak memory: its windows (training, validation
    and test; at least one float32 per token; with data per seed, one set per stacked
    seed) and one training batch's activations (batch x context x d_model float32, a few
    per layer)."""
    data_sets = config.bench.execution.seeds_per_job if config.bench.design.data_per_seed else 1
    windows = data_sets * (config.train_windows + 2 * config.eval_windows)
    model, train = config.bench.design.model, config.bench.design.train
    activations = train.batch_size * context * model.d_model * (2 + 4 * model.n_layers)
    return 4.0 * (windows * context + activations)


def check_memory(config: LongContextConfig) -> None:
    """Refuse, before any data is built, a context this machine cannot hold (``ValueError``
    naming it with the estimate, :func:`memory_bytes`)."""
    for context in config.contexts:
        require_memory(
            "contexts", context, memory_bytes(config, context),
            "the windows and one training batch's activations",
        )  # fmt: skip


def run_longctx(
    config: LongContextConfig,
    out_dir: str | os.PathLike | None = None,
    executor: cf.Executor | None = None,
    progress: bool = True,
    data_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Run (or resume) the long-context study; write and return ``longctx.json``.

    Args:
        config: the study (``rpka.config.presets_longctx.get_longctx_preset``).
        out_dir: results folder (default ``data/results/<preset>``); ``longctx.json`` goes
            there, each context's bench to ``longctx/context-<n>/``.
        executor: where runs and memory probes go (``concurrent.futures`` interface);
            default ``rpka.bench.default_executor(config.bench.execution.n_workers)``, shared by
            every context. A given executor is not shut down; its own is aborted on an
            exception (``rpka.training.executors.owned``).
        progress: tqdm bars.
        data_dir: the track cache (default ``data/cache``).
    """
    config.validate()
    check_memory(config)
    started = time.perf_counter()
    out = resolve(out_dir or paths.results_dir(config.preset))
    data_dir = str(resolve(data_dir or DEFAULT_DATA_DIR))
    result = header(config)
    own_executor = executor is None
    executor = executor or default_executor(config.bench.execution.n_workers)
    with owned(executor) if own_executor else nullcontext():
        for context in config.contexts:
            bench = config.bench_for(context)
            for track in tracks_to_cache(bench):  # cached once, before the workers
                bench.task.load(track, data_dir)
            probes = {}
            if config.memory_probe:  # queued first: they run beside the bench's runs
                for arm in bench.design.arms:
                    run_config = probe_run_config(bench, arm.name, data_dir)
                    probes[arm.name] = executor.submit(training_step_peak_mib, run_config)
            bench_dir = out / paths.longctx_context_dir(context)
            report = run_bench(bench, bench_dir, executor, progress, data_dir)
            memory = {name: future.result() for name, future in probes.items()}
            result["rows"] += context_rows(bench, report, memory)
            result["per_context"][str(context)] = context_entry(report, bench_dir, out)
            result["wall_s"] = time.perf_counter() - started
            write_result_and_timings(out / FILE_NAME, result, TIMING_KEYS)
    result["load_average_end"] = _load_average()
    result["wall_s"] = time.perf_counter() - started
    # as saved (NaN/inf null); a resumed study keeps the file its runs wrote
    return read_json(write_result_and_timings(out / FILE_NAME, result, TIMING_KEYS))


def header(config: LongContextConfig) -> dict[str, Any]:
    """Everything but the measurements: what was run, where, how it is measured."""
    bench = config.bench
    return {
        "longctx_version": LONGCTX_VERSION,
        "preset": config.preset,
        "contexts": list(config.contexts),
        "protocol": protocol(config),
        "step_time_definition": (
            "median wall time of the evaluation runs' training steps after "
            f"{bench.design.train.warmup_steps} warm-up step(s) (forward, backward, Adam update), "
            "seeds stacked in one model, one thread per worker process"
        ),
        "memory_definition": (
            "peak of one training step above the memory held before it (weights, Adam "
            "state, batch): "
            + (
                "torch.cuda.max_memory_allocated"
                if bench.execution.device == "cuda"
                else "running sum of torch.profiler tensor allocations, operator granularity "
                "(PyTorch tensors only; transient buffers inside one operator are missed)"
            )
        ),
        "config": config.to_dict(),
        "device": device_description(bench.execution.device),
        "device_type": bench.execution.device,
        "n_workers": bench.execution.n_workers,
        "versions": versions(),
        "load_average_start": _load_average(),
        "load_average_end": None,
        "wall_s": None,
        "rows": [],
        "per_context": {},
    }


def protocol(config: LongContextConfig) -> str:
    """The reduced protocol in words: track, model, data, training, seeds, the gate."""
    bench = config.bench
    model, train = bench.design.model, bench.design.train
    tracks = [track_fields(config.bench_for(c).design.track) for c in config.contexts]
    shared = {  # the track's settings every context shares (its context, sizes vary)
        k: v for k, v in tracks[0].items() if k != "name" and all(t[k] == v for t in tracks)
    }
    settings = ", ".join(f"{k}={v}" for k, v in shared.items())
    gate = (
        f"attention gate: the control {bench.control} must be at least "
        f"{bench.decision.gate_min_rel:.0%} worse than {bench.decision.baseline_arm} "
        f"(one-sided paired sign-flip p < {ALPHA:g})"
        if bench.control
        else "no control arm, so no attention gate"
    )
    warm = config.warm_start_from
    curriculum = (
        f"every context above {warm} trained first at {warm} tokens (the same arm, rate, "
        "seeds and steps), then at its own from those weights, learned positions stretched "
        "by linear interpolation (rpka.curriculum); "
        if warm
        else ""
    )
    data = (
        "each seed its own draw of the data (the track's seed replaced by one derived from "
        "the seed, rpka.seed_data; the same draw for every arm)"
        if bench.design.data_per_seed
        else "one draw of the data for every seed"
    )
    return (
        f"reduced: track {bench.track_name} ({settings}) resized to each context with "
        f"{config.train_windows} training and {config.eval_windows} validation / test windows "
        f"(Task.at_context), {data}; {model.n_layers} encoder layer(s) of width "
        f"{model.d_model} with {model.n_heads} head(s), input window {model.embed_kernel}, "
        f"linear skip {'on' if model.linear_skip else 'off'}, head initialised with std "
        f"{model.head_init_std:g}; {train.epochs} epoch(s) of batch {train.batch_size}; "
        f"{curriculum}"
        f"learning rate(s) {', '.join(f'{lr:g}' for lr in bench.design.learning_rates)} on "
        f"{len(bench.design.sweep_seeds)} sweep seed(s); "
        f"{len(bench.design.eval_seeds)} evaluation seeds; "
        f"{gate}."
    )


def context_rows(
    bench: BenchConfig, report: dict[str, Any], memory: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per arm of one context's bench report (and memory probe)."""
    context = bench.design.track.context
    timings = report["timings"]
    base_name = bench.decision.baseline_arm
    rows = []
    for name, arm in report["arms"].items():
        full = arm["full"]
        probe = memory.get(name)
        base_probe = memory.get(base_name)
        peak = probe["peak_mib"] if probe else None
        base_peak = base_probe["peak_mib"] if base_probe else None
        rows.append(
            {
                "context": context,
                "arm": name,
                "method": arm["method"],
                "rank": arm["rank"],
                "pivot_points": arm["pivot_points"],
                "lr": arm["best_cfg"]["lr"],
                "seeds": arm["seeds"],
                "test_mse_per_seed": full["per_seed"],
                "test_mse_mean": full["mean"],
                "test_mse_sd": full["std"],
                "n_diverged": arm["n_diverged"],
                "step_ms": timings["step_ms_median"].get(name),
                "step_ratio_vs_exact": timings["step_ratio_vs_baseline"].get(name),
                "step_members": timings["step_members"],
                "batch_size": bench.design.train.batch_size,
                "peak_mib": peak,
                "peak_ratio_vs_exact": peak / base_peak if peak and base_peak else None,
                "peak_members": probe["members"] if probe else None,
                "guard_counts": arm["guard_counts"],
                "comparison": arm["comparison"],
            }
        )
    return rows


def context_entry(report: dict[str, Any], bench_dir: Path, out: Path) -> dict[str, Any]:
    """What one context's bench says beyond the rows: data, naive forecasts, the attention
    gate, timings."""
    naive = report["naive_baselines"]["forecasts"]
    return {
        "bench_report": str((bench_dir / "bench_report.json").relative_to(out)),
        "data": report["data"],
        "naive_test_mse": {name: f["test"]["mse"] for name, f in naive.items()},
        "learnability_met": report["learnability"]["met"],
        "attention_gate": report["attention_gate"],
        "local_gate": report.get("local_gate"),
        "wall_s": report["timings"]["phases"]["total_s"],
        "n_runs": report["timings"]["n_runs"],
        "n_runs_resumed": report["timings"]["n_runs_resumed"],
        "load_average_start": report["timings"]["load_average_start"],
        "load_average_end": report["timings"]["load_average_end"],
    }


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


# --------------------------------------------------------------------------- CLI


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A plain-text table: step time, peak memory and test MSE per context and arm."""
    lines = [
        f"{'context':>7} {'arm':<14} {'step ms':>9} {'peak MiB':>9} {'test MSE':>18} "
        f"{'vs exact [95% CI]':>30}"
    ]

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for row in result["rows"]:
        cmp_ = row["comparison"]
        versus = "-"
        if cmp_ is not None and cmp_["delta_mean"] is not None:
            versus = (
                f"{cmp_['delta_mean']:+.4f} [{fmt(cmp_['ci_low'], '+.4f')}, "
                f"{fmt(cmp_['ci_high'], '+.4f')}]"
            )
        lines.append(
            f"{row['context']:>7} {row['arm']:<14} {fmt(row['step_ms'], '9.1f'):>9} "
            f"{fmt(row['peak_mib'], '9.1f'):>9} {fmt(row['test_mse_mean'], '9.4f'):>9} +- "
            f"{fmt(row['test_mse_sd'], '6.4f'):<6} {versus:>30}"
        )
    lines.append(f"protocol: {result['protocol']}")
    lines.append(
        f"device: {result['device']}; wall {result['wall_s']:.0f} s; load average "
        f"{result['load_average_start']} -> {result['load_average_end']}"
    )
    return lines
