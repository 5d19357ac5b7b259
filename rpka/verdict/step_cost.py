"""Every cost ratio the study states, read from its timing files (issue 40): never from
the training runs' wall times, which stay in the run files as a record.

A timing file (``rpka.study.steptime``: one process, one thread, arms interleaved, CPU
time) is ``steptime.json`` beside a long-context study (per context and arm) or
``steptime_tracks.json`` in a study's results folder (per short track and arm). These
functions read a ratio from one, or put its ratios in place of the wall-time medians of a
result loaded in memory (a bench report, ``longctx.json``) - the file on disk is never
changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rpka.paths import STEPTIME_FILE, TRACK_STEPTIME_FILE


def step_ratio_of(timing: Mapping[str, Any] | None, context: str, arm: str) -> dict | None:
    """``{mean, ci_low, ci_high}`` of an arm's CPU-time step ratio to exact at ``context``
    from a ``steptime.json`` (None: no timing file, or the arm or length not timed)."""
    entry = ((timing or {}).get("contexts") or {}).get(str(context), {}).get(arm)
    ratio = (entry or {}).get("step_ratio_cpu")
    return None if ratio is None else {k: ratio[k] for k in ("mean", "ci_low", "ci_high")}


def peak_ratio_of(
    timing: Mapping[str, Any] | None, context: str, arm: str, baseline: str
) -> float | None:
    """An arm's peak memory of a training step over ``baseline``'s at ``context``, from a
    ``steptime.json`` (None: no timing file, or the arms or length not timed)."""
    arms = ((timing or {}).get("contexts") or {}).get(str(context), {})
    exact = arms.get(baseline, {}).get("peak_mib")
    peak = arms.get(arm, {}).get("peak_mib")
    return None if peak is None or not exact else peak / exact


def step_shape(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a training step's cost depends on, from a bench configuration's on-disk form
    (``BenchConfig.to_dict()`` or a bench report's ``config``), as JSON has it: the model,
    the track (context, data), the stacked seeds and the batch."""
    shape = {key: config[key] for key in ("model", "track", "seeds_per_job")}
    return json.loads(json.dumps({**shape, "batch_size": config["train"]["batch_size"]}))


def with_step_timing(report: dict[str, Any], timing: Mapping[str, Any] | None) -> dict[str, Any]:
    """``report`` (a bench report, in memory) with its ``timings``' step medians and ratios
    taken from ``timing`` (a ``steptime_tracks.json``) where that file timed a bench of the
    same :func:`step_shape` (a track's, or an extension's; another shape keeps its own): CPU
    milliseconds and the mean per-repeat ratio to the baseline; ``step_ratio_ci`` holds
    the intervals and ``step_source`` names the file. The training runs' wall-time medians
    stay in the files as a record; the file on disk is never changed."""
    shapes = (timing or {}).get("shapes") or {}
    if not shapes or not report.get("config"):
        return report
    shape = step_shape(report["config"])
    bench = next((name for name, timed in shapes.items() if timed == shape), None)
    timed = (timing.get("tracks") or {}).get(bench)
    if not timed:  # no bench of this shape was timed: the report keeps its own record
        return report
    timings = dict(report.get("timings") or {})
    ratios = {a: e["step_ratio_cpu"] for a, e in timed.items() if e["step_ratio_cpu"]}
    timings["step_ms_median"] = {a: e["cpu_s_median"] * 1e3 for a, e in timed.items()}
    timings["step_ratio_vs_baseline"] = {a: r["mean"] for a, r in ratios.items()}
    timings["step_ratio_ci"] = {a: [r["ci_low"], r["ci_high"]] for a, r in ratios.items()}
    timings["step_members"] = next(iter(timed.values()))["members"]
    timings["step_source"] = TRACK_STEPTIME_FILE
    return {**report, "timings": timings}


def with_longctx_timing(
    longctx: dict[str, Any] | None, timing: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """``longctx.json``'s content (in memory) with each row's ``step_ms`` and
    ``step_ratio_vs_exact`` from ``timing`` (that study's ``steptime.json``, same preset)
    where it timed the row's (context, arm): CPU milliseconds and the mean per-repeat ratio,
    ``step_ratio_ci`` its interval, ``step_source`` the file. Without one, the rows keep the
    runs' wall-time medians. The file on disk is never changed."""
    if not longctx or not timing or timing.get("preset") != longctx.get("preset"):
        return longctx
    rows = []
    for row in longctx.get("rows", []):
        ratio = step_ratio_of(timing, str(row["context"]), row["arm"])
        if ratio is None:
            rows.append(row)
            continue
        timed = timing["contexts"][str(row["context"])][row["arm"]]
        rows.append({**row, "step_ms": timed["cpu_s_median"] * 1e3,
                     "step_ratio_vs_exact": ratio["mean"],
                     "step_ratio_ci": [ratio["ci_low"], ratio["ci_high"]],
                     "step_source": STEPTIME_FILE})  # fmt: skip
    return {**longctx, "rows": rows}
