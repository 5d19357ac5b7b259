"""A result file's summaries recomputed from its own per-seed scores (issue 56, "a re-sealed
edit renders"): a checksum proves only that the file is as its writer - or whoever sealed it
last - left it. Before a bench report is read (``report --from-results``, the study index)
or sealed (``scripts/seal_results.py``), every arm's ``full`` summary (``n``, ``mean``,
``std``) and every comparison's ``delta_mean`` and ``verdict`` are recomputed from the
per-seed test scores by the decision rule of the report's own configuration
(``rpka.verdict.decision.compare_arms``); a disagreement is named, and the file refused.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from rpka.config.bench import BenchConfig
from rpka.verdict.decision import compare_arms

# float noise of a summary written from the same numbers (the sums' order may differ)
REL_TOL, ABS_TOL = 1e-9, 1e-12


def _differs(stored: Any, recomputed: float) -> bool:
    if stored is None:
        return not math.isnan(recomputed)
    if math.isnan(recomputed):
        return not (isinstance(stored, float) and math.isnan(stored))
    return not math.isclose(float(stored), recomputed, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def summary_problems(name: str, full: dict[str, Any]) -> list[str]:
    """Where ``arms.<name>.full``'s ``n``, ``mean`` and ``std`` (sample sd, ddof 1) are not
    those of its own ``per_seed`` scores (the finite ones)."""
    values = np.array([math.nan if v is None else v for v in full["per_seed"]], dtype=float)
    finite = values[np.isfinite(values)]
    recomputed = {
        "n": float(finite.size),
        "mean": float(finite.mean()) if finite.size else math.nan,
        "std": float(finite.std(ddof=1)) if finite.size > 1 else math.nan,
    }
    return [
        f"arms.{name}.full.{key} is {full.get(key)!r} but its per-seed scores give {value:.6g}"
        for key, value in recomputed.items()
        if key in full and _differs(full.get(key), value)
    ]


def bench_report_problems(report: dict[str, Any]) -> list[str]:
    """Every summary of ``report`` (a ``bench_report.json``) that its per-seed scores do
    not give: the arms' ``n``/``mean``/``std``, and each comparison's ``delta_mean`` and
    ``verdict`` recomputed by the rule of the report's own configuration."""
    problems = [p for name, arm in report["arms"].items()
                for p in summary_problems(name, arm["full"])]  # fmt: skip
    problems += _copies_problems(report)
    try:
        config = BenchConfig.from_dict(report["config"])
    except (KeyError, TypeError, ValueError):  # an older schema: the summaries only
        return problems
    arms = copy.deepcopy(report["arms"])
    try:
        compare_arms(config, arms)
    except (KeyError, ValueError):  # arms the configuration does not name: summaries only
        return problems
    for name, arm in arms.items():
        mine, stored = arm.get("comparison"), report["arms"][name].get("comparison")
        if not mine or not stored:
            continue
        if mine["verdict"] != stored.get("verdict"):
            problems.append(
                f"arms.{name}.comparison.verdict is {stored.get('verdict')!r} but its "
                f"per-seed scores give {mine['verdict']!r}"
            )
        if _differs(stored.get("delta_mean"), mine["delta_mean"]):
            problems.append(
                f"arms.{name}.comparison.delta_mean is {stored.get('delta_mean')!r} but its "
                f"per-seed scores give {mine['delta_mean']:.6g}"
            )
    return problems


def _copies_problems(report: dict[str, Any]) -> list[str]:
    """The report's top-level copies of its primary and baseline arms (``idea``,
    ``baseline``, ``comparison``), which the report's text reads, against the arms."""
    problems = []
    for role, arm_key in (("idea", "primary_arm"), ("baseline", "baseline_arm")):
        copy_ = report.get(role)
        arm = report["arms"].get(report.get(arm_key))
        if not isinstance(copy_, dict) or arm is None or "full" not in copy_:
            continue
        problems += [p.replace(f"arms.{role}.", f"{role}.", 1)
                     for p in summary_problems(role, copy_["full"])]  # fmt: skip
        if copy_["full"].get("per_seed") != arm["full"].get("per_seed"):
            problems.append(f"{role}.full.per_seed is not arms.{arm_key and report[arm_key]}"
                            ".full.per_seed")  # fmt: skip
    stored, primary = report.get("comparison"), report["arms"].get(report.get("primary_arm"))
    if isinstance(stored, dict) and primary and isinstance(primary.get("comparison"), dict):
        for key in ("verdict", "delta_mean"):
            if stored.get(key) != primary["comparison"].get(key):
                problems.append(f"comparison.{key} is {stored.get(key)!r} but the primary "
                                f"arm's is {primary['comparison'].get(key)!r}")  # fmt: skip
    return problems
