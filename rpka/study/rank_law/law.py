"""The rank law (issue 41, item 3): r*_drop-in ~ c p^a n^b d^e, fitted, and its held-out test.

The fit is ordinary least squares of log2 r* on log2 p, log2 n, log2 d (and a 0/1 term for
the low-diversity background where both backgrounds are in), over the learnable cells
whose ladder reached r* (every-seed rule, ``rpka.study.rank_law.dropin``); a regressor that does
not vary over those cells is left out (its exponent reads None). Intervals: two-sided 95 %
t intervals of the coefficients (``scipy.stats.t``). Cells where r* was not reached are
listed as censored, not fitted.

The held-out test: ``held_out.json`` holds a cell outside the grid and the r* the fit
predicted for it, written (:func:`predict`) and committed before that cell ran; it *held*
when the observed r* is within one ladder step (a factor of 2) of the prediction.

Everything is gathered into ``<results>/rank_law.json`` (:func:`write_index`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from rpka.attention import JOINT_LANDMARK_METHODS
from rpka.config.presets_tracks import MEAN_CONTROL
from rpka.io import read_json, read_json_checked, write_result_json
from rpka.study.rank_law.dropin import (
    DROPIN_FILE,
    METHODS,
    RANK_CAP,
    per_seed,
    r_star,
    reached,
)
from rpka.study.rank_law.grid import Cell, describe, grid_cells, parse_cell
from rpka.study.rank_law.planted import PLANTED_FILE
from rpka.verdict.decision import gap_recovered
from rpka.verdict.frontier import per_seed_gap
from rpka.verdict.robustness import arm_robustness

INDEX_FILE = "rank_law.json"
HELD_OUT_FILE = "held_out.json"
HELD_FACTOR = 2.0  # the prediction held: observed r* within this factor (one ladder step)
CONFIDENCE = 0.95
TERMS = ("p", "n", "d_head", "patterns")  # the regressors, in order (after the intercept)


def cell_rows(results: str | Path, cells: list[Cell]) -> list[dict[str, Any]]:
    """Per cell with a drop-in reading: its coordinates, whether it is learnable, r* per
    method, the mean gap recovered per rank, the effective ranks (max over heads)."""
    rows = []
    for cell in cells:
        path = Path(results) / cell.name / DROPIN_FILE
        if not path.exists():
            continue
        dropin = read_json(path)
        gap_by_rank = {m: {str(r["rank"]): r["gap"]["mean"] for r in dropin["rows"]
                           if r["method"] == m} for m in METHODS}  # fmt: skip
        heads = dropin["effective_rank"] or [{"kernel": None, "attention": None}]
        stars = {m: r_star(dropin["rows"], m) for m in METHODS}
        rows.append({
            **describe(cell),
            "learnable": dropin["learnable"],
            "r_star_dropin": {m: stars[m]["every_seed"] for m in METHODS},
            "r_star_mean_rule": {m: stars[m]["mean_non_inferior"] for m in METHODS},
            "gap_by_rank": gap_by_rank,
            "effective_rank": {key: max((h[key] for h in heads if h[key] is not None),
                                        default=None) for key in ("kernel", "attention")},
            "pivoting": dropin["pivoting"],
        })  # fmt: skip
    return rows


def _design(rows: list[dict[str, Any]]) -> tuple[np.ndarray, list[str]]:
    """The regressors that vary over ``rows``: log2 of p, n, d_head; the patterns flag."""
    columns = {
        "p": [math.log2(r["p"]) for r in rows],
        "n": [math.log2(r["n"]) for r in rows],
        "d_head": [math.log2(r["d_head"]) for r in rows],
        "patterns": [float(r["background"] == "patterns") for r in rows],
    }
    used = [t for t in TERMS if len(set(columns[t])) > 1]
    matrix = np.column_stack([np.ones(len(rows)), *(columns[t] for t in used)])
    return matrix, used


def fit_law(rows: list[dict[str, Any]], method: str) -> dict[str, Any]:
    """OLS of log2 r* on the varying regressors (module docstring) for ``method``."""
    fitted = [r for r in rows if r["learnable"] and r["r_star_dropin"][method] is not None]
    censored = [r["cell"] for r in rows if r["learnable"] and r["r_star_dropin"][method] is None]
    out: dict[str, Any] = {"method": method, "form": "log2 r* = log2 c + a log2 p + b log2 n "
                           "+ e log2 d (+ k [patterns])", "cells": [r["cell"] for r in fitted],
                           "censored": censored}  # fmt: skip
    if len(fitted) < 2:
        return {**out, "exponents": None, "ci": None, "r_squared": None}
    x, used = _design(fitted)
    y = np.log2([r["r_star_dropin"][method] for r in fitted])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ coef
    dof = len(y) - x.shape[1]
    names = ["log2_c", *used]
    exponents = {t: None for t in TERMS} | dict(zip(names, (float(c) for c in coef), strict=True))
    ci: dict[str, Any] = {t: None for t in names}
    if dof > 0:
        sigma2 = float(residual @ residual) / dof
        se = np.sqrt(np.diag(sigma2 * np.linalg.pinv(x.T @ x)))
        half = stats.t.ppf(0.5 + CONFIDENCE / 2, dof) * se
        ci = {t: [float(c - h), float(c + h)] for t, c, h in zip(names, coef, half, strict=True)}
    total = float(((y - y.mean()) ** 2).sum())
    # with no degree of freedom left the fit passes through every cell: R^2 says nothing
    r2 = 1 - float(residual @ residual) / total if total > 0 and dof > 0 else None
    return {**out, "exponents": exponents, "ci": ci, "dof": dof, "r_squared": r2,
            "residuals_log2": residual.tolist()}  # fmt: skip


def predicted_r_star(fit: dict[str, Any], cell: Cell) -> float | None:
    """The fitted law's r* at ``cell`` (None without a fit)."""
    e = fit.get("exponents")
    if not e:
        return None
    log2 = e["log2_c"]
    for term, value in (("p", cell.p), ("n", cell.n), ("d_head", cell.d_head)):
        log2 += (e[term] or 0.0) * math.log2(value)
    log2 += (e["patterns"] or 0.0) * float(cell.background == "patterns")
    return float(2**log2)


def prediction_path(results: str | Path, cell: Cell, method: str, when: datetime) -> Path:
    """Where a prediction goes: ``held_out.json`` if none was registered, else beside it,
    dated: ``held_out-<UTC date and time>-<cell>-<method>.json`` (append-only)."""
    first = Path(results) / HELD_OUT_FILE
    if not first.exists():
        return first
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    return Path(results) / f"{first.stem}-{stamp}-{cell.name}-{method}.json"


def predict(
    results: str | Path, cell_name: str, method: str = "rpka", when: datetime | None = None
) -> dict[str, Any]:
    """Register the r* the grid's law predicts for a held-out cell (commit it before that
    cell runs). Append-only: the first prediction is ``<results>/held_out.json``; a later
    one goes beside it, dated (:func:`prediction_path`), never over it. Refused (ValueError)
    for a cell in the grid, a cell that already has a drop-in reading (a prediction after
    the fact registers nothing), or a dated file that already exists."""
    cell = parse_cell(cell_name)
    if cell in grid_cells():
        raise ValueError(f"cell {cell_name!r} is in the grid: a held-out cell must not be")
    if (Path(results) / cell.name / DROPIN_FILE).exists():
        raise ValueError(
            f"cell {cell.name!r} already has results ({Path(results) / cell.name / DROPIN_FILE})"
            ": a prediction must be registered before its cell is read"
        )
    fit = fit_law(cell_rows(results, grid_cells()), method)
    predicted = predicted_r_star(fit, cell)
    if predicted is None:
        raise ValueError(
            f"no fit for {method!r}: {len(fit['cells'])} grid cell(s) with an r*, "
            f"{len(fit['censored'])} censored (a fit needs 2 with an r*; run the drop-in of "
            "more cells, or predict another method with --method)"
        )
    when = when or datetime.now(UTC)
    path = prediction_path(results, cell, method, when)
    if path.exists():
        raise ValueError(f"{path} exists: a registered prediction is never overwritten")
    held_out = {"cell": cell.name, "method": method, "predicted_r_star": predicted,
                "held_if": f"observed r* within a factor {HELD_FACTOR:g} of the prediction",
                "registered_utc": when.isoformat(timespec="seconds"), "file": path.name,
                "fit": fit}  # fmt: skip
    write_result_json(path, held_out)
    return held_out


def held_out_outcome(results: str | Path) -> dict[str, Any] | None:
    """The held-out prediction and, once its cell was read, the observed r* and whether it
    held: within :data:`HELD_FACTOR` of the prediction. A ladder that ended at its cap
    without reaching the margin (censored) did not hold when the cap is beyond the factor;
    a cell that did not learn decides nothing (``held`` None)."""
    path = Path(results) / HELD_OUT_FILE
    if not path.exists():
        return None
    held_out = read_json(path)
    predicted = held_out["predicted_r_star"]
    rows = cell_rows(results, [parse_cell(held_out["cell"])])
    read = bool(rows) and bool(rows[0]["learnable"])
    observed = rows[0]["r_star_dropin"][held_out["method"]] if read else None
    if observed is not None:
        held: bool | None = bool(1 / HELD_FACTOR <= observed / predicted <= HELD_FACTOR)
    else:
        held = False if read and RANK_CAP > HELD_FACTOR * predicted else None
    return {"cell": held_out["cell"], "method": held_out["method"],
            "predicted_r_star": predicted, "observed_r_star": observed,
            "censored_at": RANK_CAP if read and observed is None else None,
            "learnable": rows[0]["learnable"] if rows else None,
            "held": held, "held_if": held_out["held_if"]}  # fmt: skip


def trained_rows(results: str | Path) -> list[dict[str, Any]]:
    """The trained confirmations (``<cell>/trained-r<rank>/``): per low-rank arm, the gap
    recovered per seed against the control, read on the seeds with a gap to recover (the
    control loses to exact there; the others are listed in ``seeds_without_gap``): the
    drop-in's every-seed rule and the frontier's mean rule, each with its leave-one-seed-out
    reading (``rpka.verdict.robustness.arm_robustness``). An arm's non-finite score on a
    read seed counts as a miss (g = -inf), never as a seed left out."""
    rows = []
    for path in sorted(Path(results).glob("*/trained-r*/longctx/context-*/bench_report.json")):
        report = read_json(path)
        all_seeds = report["arms"]["exact"]["seeds"]
        exact = np.asarray(per_seed(report, "exact", all_seeds), dtype=float)
        control = np.asarray(per_seed(report, MEAN_CONTROL.name, all_seeds), dtype=float)
        read = (control - exact) > 0  # lower is better: a gap to recover
        seeds = [s for s, keep in zip(all_seeds, read, strict=True) if keep]
        for name, arm in report["arms"].items():
            method = arm["method"]
            if method not in JOINT_LANDMARK_METHODS:
                continue
            scores = np.asarray(per_seed(report, name, all_seeds), dtype=float)[read]
            g = per_seed_gap(control[read], exact[read], scores, "lower")
            g = np.where(np.isfinite(g), g, -np.inf)  # a diverged arm misses
            diffs = (scores - exact[read]).tolist()
            robust = arm_robustness(g.tolist(), diffs, seeds, gap_recovered)
            rows.append({"cell": path.parts[-5], "trained_at": path.parts[-4], "arm": name,
                         "method": method, "rank": arm.get("rank"), "seeds": seeds,
                         "seeds_without_gap": [s for s in all_seeds if s not in seeds],
                         "every_seed": every_seed_reading(g, seeds),
                         "gap": gap_recovered(g), "robust": robust["robust"],
                         "rests_on_seeds": robust["rests_on_seeds"]})  # fmt: skip
    return rows


def every_seed_reading(g: np.ndarray, seeds: list[int]) -> dict[str, Any]:
    """The drop-in's rule on trained seeds (:func:`rpka.study.rank_law.dropin.reached`: NaN,
    no gap, not read; -inf, a diverged arm, a miss) and its leave-one-seed-out reading: the
    seeds whose removal alone flips it (empty: robust). g (S,) per seed."""
    verdict = reached(g.tolist())
    flips = [s for i, s in enumerate(seeds) if reached(np.delete(g, i).tolist()) != verdict]
    return {"reached": verdict, "seeds_read": int((~np.isnan(g)).sum()),
            "rests_on_seeds": flips, "robust": not flips}  # fmt: skip


def read_planted(results: str | Path) -> dict[str, Any] | None:
    """The planted positive control (``rpka.study.rank_law.planted``), or None before it ran."""
    path = Path(results) / PLANTED_FILE
    return read_json_checked(path) if path.exists() else None


def write_index(results: str | Path, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """``<results>/rank_law.json``: cells, the fit per method, the held-out outcome, the
    trained confirmations and the planted positive control."""
    rows = cell_rows(results, grid_cells())
    index = {
        "what": "What sets the rank RPKA needs: the drop-in grid, the fitted law, the held-out "
        "prediction (issue 41; docs/rank_law.md)",
        "cells": rows,
        "fit": {m: fit_law(rows, m) for m in METHODS},
        "held_out": held_out_outcome(results),
        "trained": trained_rows(results),
        "planted": read_planted(results),
    }
    previous = Path(results) / INDEX_FILE
    if previous.exists() and "law_v2" in (old := read_json(previous)):
        index["law_v2"] = old["law_v2"]  # the v2 fit (rank-law fit-v2) is kept, not redone
    write_result_json(Path(results) / INDEX_FILE, index)
    if log is not None:
        for row in rows:
            log(f"{row['cell']}: learnable {row['learnable']}, r* {row['r_star_dropin']}, "
                f"effective rank {row['effective_rank']}")  # fmt: skip
        for method, fit in index["fit"].items():
            log(f"fit {method}: {fit['exponents']} (R^2 {fit['r_squared']})")
    return index
