"""The bench report builder: ``bench_report.json`` from the merged run results.

:func:`build_report` is everything but ``timings`` (per arm its sweep, selection, test
scores and comparison with the baseline; the decision; the naive baselines; the data,
configuration, versions and device); :func:`timings` is the phases' and runs' times. The
keys are documented in ``docs/bench_report.md``.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy
import torch

import rpka
from rpka.attention.guards import guard_shares
from rpka.bench.jobs import RunResults, sweep_score
from rpka.config.bench import ArmConfig, BenchConfig
from rpka.verdict import stats
from rpka.verdict.ablations import choose_default, rpka_configuration
from rpka.verdict.decision import METRIC_DIRECTION, compare_arms, decision_of, local_gate

BENCH_VERSION = "2.0"


def summary(values: Sequence[float | None]) -> dict[str, Any]:
    """``rpka.verdict.stats.summarize`` plus the earlier check's keys: mean, std (ddof=1),
    per_seed, n."""
    per_seed = [math.nan if v is None else float(v) for v in values]
    s = stats.summarize(per_seed)
    rest = {k: v for k, v in s.items() if k not in ("mean", "sd", "n")}
    return {"mean": s["mean"], "std": s["sd"], "per_seed": per_seed, "n": s["n"], **rest}


def sweep_rows(
    config: BenchConfig, sweep: dict[float, dict], best_lr: float
) -> list[dict[str, Any]]:
    """One row per swept learning rate (``lr_from``: the one inherited), in sweep order."""
    metric = config.design.metric
    others = [m for m in config.task.metrics if m != metric]
    rows = []
    for lr in (lr for lr in config.design.learning_rates if lr in sweep):
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
    return rows


def arm_entry(
    config: BenchConfig, arm: ArmConfig, sweep: dict[float, dict], result: dict[str, Any]
) -> dict[str, Any]:
    """best_cfg, sweep, full (test, the primary metric) and more for one arm."""
    metric = config.design.metric
    metrics = config.task.metrics
    best_lr = result["lr"]
    tokens = config.design.track.attention_tokens
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
        "sweep": sweep_rows(config, sweep, best_lr),
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
        for arm in config.design.arms
    }
    for entry in arms.values():  # e.g. track lm: the gap to the perplexity floor
        entry.update(task.arm_extras(entry, naive))
    base = arms[config.decision.baseline_arm]
    gate = compare_arms(config, arms)
    primary = arms[config.decision.primary_arm]
    report = {
        "bench_version": BENCH_VERSION,
        "track": config.track_name,
        "model": config.design.model.name,
        "metric": config.design.metric,
        "metric_direction": METRIC_DIRECTION,
        "n_seeds": len(config.design.eval_seeds),
        "baseline_arm": config.decision.baseline_arm,
        "primary_arm": config.decision.primary_arm,
        "baseline": _earlier_keys(base, config.decision.baseline_arm),
        "idea": _earlier_keys(primary, config.decision.primary_arm),
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
        "device": device_description(config.execution.device),
    }
    report["ablation_choice"] = choose_default(report)  # validation scores only
    return report


def _earlier_keys(entry: dict[str, Any], name: str) -> dict[str, Any]:
    """An arm's entry as the earlier check's ``baseline``/``idea`` keys: named, no comparison."""
    return {"arm": name, **{k: v for k, v in entry.items() if k != "comparison"}}


def timings(
    config: BenchConfig,
    runs: RunResults,
    phases: dict[str, float],
    load: tuple[list[float] | None, list[float] | None],
) -> dict[str, Any]:
    """The report's ``timings``: phases, step times per arm and their ratio to the
    baseline's, each arm's summed run wall and CPU seconds, job counts, load averages."""
    sweep_of, eval_of = runs.sweep_of, runs.eval_of
    step = {name: eval_of[name]["step_ms_median"] for name in eval_of}
    exact_ms = step.get(config.decision.baseline_arm)
    return {
        "phases": phases,
        "step_ms_median": step,
        "step_members": min(config.execution.seeds_per_job, len(config.design.eval_seeds)),
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
        "n_runs": runs.n_jobs,
        "n_runs_resumed": runs.n_resumed,
        "n_workers": config.execution.n_workers,
        "load_average_start": load[0],
        "load_average_end": load[1],
    }


def versions() -> dict[str, str]:
    """The versions of Python and the libraries a result depends on."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "rpka": rpka.__version__,
    }


def device_description(device: str) -> str:
    """The device in words: the GPU's name, or the CPU, its cores and the system."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    cpu = platform.processor() or platform.machine()
    return f"{cpu} CPU, {os.cpu_count()} cores ({platform.system()})"


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None
