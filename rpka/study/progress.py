"""What has landed of a long study that resumes across sessions (issue 40): counts, never scores.

A pre-registered study is read only when a length's every seed is in (docs/longrange_protocol.md),
so while it runs the report says how far it got - per length, the training jobs committed
against those the configuration plans (:func:`rpka.bench.jobs.job_groups`) and the CPU
seconds they recorded - from the run files' configuration fields alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpka import paths
from rpka.bench.jobs import job_groups
from rpka.config.bench import LongContextConfig
from rpka.config.presets_longctx import POWER_PRESET, power_as_run
from rpka.io import read_json

SPLIT_PHASE = {"val": "sweep", "test": "eval"}  # a run file's split -> the bench's phase


def landed(
    configs: LongContextConfig | Sequence[LongContextConfig], out: str | Path
) -> list[dict[str, Any]]:
    """Per context of ``configs`` (one study, or one configuration per length where its
    arms differ by length, ``power_as_run``): ``{"context", "planned": {phase: jobs},
    "landed": {phase: jobs}, "cpu_s", "complete"}`` from the run files under
    ``<out>/longctx/context-<n>/runs`` (a context with no folder has landed nothing), and
    ``predicted_cpu_s``: the price of those jobs from ``<out>/cost_model.json`` (``python -m
    rpka cost --longctx``, summed over the arms as run; None without the file)."""
    configs = [configs] if isinstance(configs, LongContextConfig) else configs
    price_file = Path(out) / paths.COST_MODEL_FILE
    price = read_json(price_file) if price_file.exists() else None
    rows = []
    for config, context in ((c, n) for c in configs for n in c.contexts):
        planned = {"sweep": 0, "eval": 0}
        for group in job_groups(config.bench_for(context)):
            planned[group.phase] += group.jobs
        runs = sorted((Path(out) / "longctx" / f"context-{context}" / "runs").glob("*.json"))
        files = [read_json(path) for path in runs]
        done = {phase: sum(SPLIT_PHASE[f["split"]] == phase for f in files) for phase in planned}
        rows.append({"context": context, "planned": planned, "landed": done,
                     "cpu_s": sum(f.get("cpu_s") or 0.0 for f in files),
                     "predicted_cpu_s": predicted_cpu_s(price, config, context),
                     "complete": done == planned})  # fmt: skip
    return rows


def predicted_cpu_s(
    price: dict[str, Any] | None, config: LongContextConfig, context: int
) -> float | None:
    """The price of ``config``'s arms at ``context`` in a ``cost_model.json`` (None where
    the file or that length or an arm is not priced)."""
    arms = (((price or {}).get("contexts") or {}).get(str(context)) or {}).get("arms") or {}
    names = [arm.name for arm in config.bench_for(context).design.arms]
    if not names or any(name not in arms for name in names):
        return None
    return sum(arms[name]["predicted_cpu_s"] for name in names)


def progress_line(rows: list[dict[str, Any]]) -> str:
    """One sentence per context: jobs landed of those planned and their CPU seconds."""
    parts = []
    for row in rows:
        landed_jobs, planned = row["landed"], row["planned"]
        if not any(landed_jobs.values()):
            parts.append(f"{row['context']:,} tokens: not started")
            continue
        parts.append(
            f"{row['context']:,} tokens: {landed_jobs['eval']} of {planned['eval']} evaluation "
            f"jobs and {landed_jobs['sweep']} of {planned['sweep']} sweep runs, "
            f"{row['cpu_s']:,.0f} CPU-s"
            + (
                f", the length priced at {row['predicted_cpu_s']:,.0f}"
                if row.get("predicted_cpu_s")
                else ""
            )
            + (" (complete)" if row["complete"] else "")
        )
    return "; ".join(parts)


def power_status(results_dir: str | Path) -> str | None:
    """The Summary's sentence on the pre-registered long-range study while it runs
    (``<results_dir>/longrange-power``), or None where it was never started."""
    out = Path(results_dir) / POWER_PRESET
    if not out.exists():
        return None
    rows = landed(power_as_run(), out)
    return (
        "**The pre-registered 16-seed long-range study** (each seed with its own data, "
        "docs/longrange_protocol.md; the decision study's pilot) reads no score of a length "
        f"before all its jobs are in. Landed: {progress_line(rows)}."
    )
