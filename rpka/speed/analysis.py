"""Scaling analysis: latency frames, log-log slopes, crossovers and decode frames, computed
from the result files of ``rpka.speed.scaling`` and ``rpka.speed.decoding`` (the report's tables and
plots read these; nothing here draws or formats)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

# (issue 6: slopes, speed-ups, crossover lengths, decoding)

EXACT = "exact"
# the measures of a scaling row, with their axis labels
SCALING_MEASURES = {
    "forward_ms": "forward latency (ms)",
    "fwd_bwd_ms": "forward + backward latency (ms)",
    "pivot_ms": "pivot selection (ms)",
    "peak_mib": "forward peak memory (MiB)",
    "fwd_bwd_peak_mib": "forward + backward peak memory (MiB)",
}


def arm_label(method: str, rank: int | None) -> str:
    """``"exact"``, ``"rpka r=64"``, ``"nystrom-uniform r=16"`` (no rank: the method alone)."""
    return method if rank is None or pd.isna(rank) else f"{method} r={int(rank)}"


def device_tag(result: Mapping[str, Any]) -> str:
    """``"cpu"`` or ``"gpu"`` - from ``device_type`` (scaling) or ``config.device`` (decoding)."""
    kind = result.get("device_type") or result.get("config", {}).get("device", "cpu")
    return "gpu" if str(kind).startswith("cuda") else "cpu"


def scaling_frame(scaling: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (method, rank, n) of a scaling result, its measures as float columns.

    Columns: ``method``, ``rank`` (nullable int), ``arm`` (:func:`arm_label`), ``n`` and
    every measure of :data:`SCALING_MEASURES` (NaN where it was not measured: skipped,
    out of memory, failed, or not applicable such as ``pivot_ms`` for exact), plus
    ``device``.
    """
    records = []
    for row in scaling["rows"]:
        record = {"method": row["method"], "rank": row["rank"], "n": int(row["n"])}
        for measure in SCALING_MEASURES:
            value = row.get(measure)
            record[measure] = float(value) if isinstance(value, int | float) else math.nan
        records.append(record)
    frame = pd.DataFrame.from_records(records)
    labels = [arm_label(r["method"], r["rank"]) for r in records]
    frame["rank"] = frame["rank"].astype("Int64")
    frame.insert(2, "arm", labels)
    frame["device"] = scaling.get("device", "")
    return frame.sort_values(["method", "rank", "n"], na_position="first").reset_index(drop=True)


def upper_half(lengths: Sequence[float]) -> list[float]:
    """The larger half of the distinct lengths (the middle one too when their number is
    odd), and never fewer than two: the range where the asymptotic cost dominates."""
    distinct = sorted(set(lengths))
    keep = max(2, math.ceil(len(distinct) / 2))
    return distinct[-keep:]


def fit_loglog_slope(
    n: Sequence[float], y: Sequence[float], upper: bool = True
) -> dict[str, float]:
    """Least-squares line ``log y = intercept + slope log n`` (``scipy.stats.linregress``).

    With ``upper`` only the points at the larger half of the lengths (:func:`upper_half`)
    enter the fit, so constant overheads at small n do not bend it. Non-finite or
    non-positive values are left out first. Returns ``slope``, its standard error
    ``slope_se`` (NaN with two points), ``intercept`` (natural log), ``n_min`` / ``n_max``
    of the points fitted and ``n_points``; every value NaN when fewer than two points
    remain.
    """
    n_arr, y_arr = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    if n_arr.shape != y_arr.shape or n_arr.ndim != 1:
        raise ValueError(
            f"n and y must be 1-d and of equal length, got {n_arr.shape}, {y_arr.shape}"
        )
    ok = np.isfinite(n_arr) & np.isfinite(y_arr) & (n_arr > 0) & (y_arr > 0)
    n_arr, y_arr = n_arr[ok], y_arr[ok]
    empty = {"slope": math.nan, "slope_se": math.nan, "intercept": math.nan}
    empty |= {"n_min": math.nan, "n_max": math.nan, "n_points": len(n_arr)}
    if len(set(n_arr)) < 2:
        return empty
    if upper:
        keep = np.isin(n_arr, upper_half(n_arr))
        n_arr, y_arr = n_arr[keep], y_arr[keep]
    fit = scipy_stats.linregress(np.log(n_arr), np.log(y_arr))
    return {
        "slope": float(fit.slope),
        "slope_se": float(fit.stderr) if len(n_arr) > 2 else math.nan,
        "intercept": float(fit.intercept),
        "n_min": float(n_arr.min()),
        "n_max": float(n_arr.max()),
        "n_points": len(n_arr),
    }


def scaling_slopes(
    scaling: Mapping[str, Any] | pd.DataFrame, measure: str = "forward_ms"
) -> pd.DataFrame:
    """Per arm, the log-log slope of ``measure`` against n (:func:`fit_loglog_slope`).

    A slope of 2 is quadratic growth (exact attention's compute), 1 linear (RPKA's, and
    exact attention's memory with a flash kernel), 0 constant.
    """
    frame = _frame(scaling)
    _check_measure(measure)
    rows = []
    for (method, rank, arm), part in frame.groupby(["method", "rank", "arm"], dropna=False):
        fit = fit_loglog_slope(part["n"], part[measure])
        rows.append({"method": method, "rank": rank, "arm": arm, "measure": measure, **fit})
    out = pd.DataFrame(rows)
    out["rank"] = out["rank"].astype("Int64")
    return out.sort_values(["method", "rank"], na_position="first").reset_index(drop=True)


def speedup_frame(
    scaling: Mapping[str, Any] | pd.DataFrame, measure: str = "forward_ms"
) -> pd.DataFrame:
    """Exact's ``measure`` divided by each arm's, at each n, within the one run.

    For a latency this is the speed-up (> 1: faster than exact); for a memory measure it
    is exact's memory over the arm's (> 1: the arm needs less). Columns: ``method``,
    ``rank``, ``arm``, ``n``, ``measure``, ``exact``, ``value`` and ``ratio``.
    """
    frame = _frame(scaling)
    _check_measure(measure)
    exact = frame[frame["method"] == EXACT].set_index("n")[measure]
    rows = frame[frame["method"] != EXACT][["method", "rank", "arm", "n", measure]].copy()
    rows = rows.rename(columns={measure: "value"})
    rows.insert(4, "measure", measure)
    rows["exact"] = rows["n"].map(exact).astype(float)
    rows["ratio"] = rows["exact"] / rows["value"]
    return rows.reset_index(drop=True)


def find_crossover(n: Sequence[float], speedup: Sequence[float]) -> dict[str, Any]:
    """Where an arm becomes faster than exact for good, from speed-ups at measured n.

    ``crossover_n`` is the smallest measured n from which the speed-up exceeds 1 at every
    larger measured n. ``crossover_n_interp`` places the crossing between that point and
    the measured point before it (speed-up <= 1) by linear interpolation of
    ``log speedup`` against ``log n`` - latency curves are close to power laws, hence
    straight on log-log axes - i.e. the n where the interpolated speed-up is exactly 1.
    ``status``: ``"crossed"`` (both set), ``"faster everywhere"`` (already faster at the
    smallest n: ``crossover_n`` is that n, no interpolation), ``"never"`` (not faster at
    the largest n; both None). Points with a missing speed-up are left out.
    """
    n_arr, s_arr = np.asarray(n, dtype=float), np.asarray(speedup, dtype=float)
    if n_arr.shape != s_arr.shape or n_arr.ndim != 1:
        raise ValueError("n and speedup must be 1-d and of equal length")
    ok = np.isfinite(n_arr) & np.isfinite(s_arr) & (s_arr > 0)
    order = np.argsort(n_arr[ok])
    n_arr, s_arr = n_arr[ok][order], s_arr[ok][order]
    none = {"crossover_n": None, "crossover_n_interp": None, "status": "never"}
    if len(n_arr) == 0 or s_arr[-1] <= 1:
        return none
    first = len(s_arr) - 1
    while first > 0 and s_arr[first - 1] > 1:
        first -= 1
    if first == 0:
        return {
            "crossover_n": float(n_arr[0]),
            "crossover_n_interp": None,
            "status": "faster everywhere",
        }
    (n0, n1), (s0, s1) = np.log(n_arr[first - 1 : first + 1]), np.log(s_arr[first - 1 : first + 1])
    # log s is <= 0 at n0 and > 0 at n1: the zero of the chord lies in (n0, n1]
    log_n = n0 + (0.0 - s0) * (n1 - n0) / (s1 - s0)
    return {
        "crossover_n": float(n_arr[first]),
        "crossover_n_interp": float(np.exp(log_n)),
        "status": "crossed",
    }


def crossover_table(
    scaling: Mapping[str, Any] | pd.DataFrame,
    measure: str = "forward_ms",
    methods: Sequence[str] = ("rpka",),
) -> pd.DataFrame:
    """Per arm of ``methods``: the crossover length against exact (:func:`find_crossover`)
    and the speed-up at the largest measured n."""
    ratios = speedup_frame(scaling, measure)
    rows = []
    for (method, rank, arm), part in ratios.groupby(["method", "rank", "arm"]):
        if method not in methods:
            continue
        part = part.dropna(subset=["ratio"]).sort_values("n")
        found = find_crossover(part["n"], part["ratio"])
        last = part.iloc[-1] if len(part) else None
        rows.append(
            {
                "method": method,
                "rank": rank,
                "arm": arm,
                "measure": measure,
                **found,
                "n_largest": float(last["n"]) if last is not None else None,
                "speedup_at_largest": float(last["ratio"]) if last is not None else None,
            }
        )
    out = pd.DataFrame(rows)
    if len(out):
        out["rank"] = out["rank"].astype("Int64")
    return out


def decode_frame(decode: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (method, context) of a decoding result (``rpka.speed.decoding``).

    Columns: ``method``, ``context``, ``per_token_ms`` (median), ``per_token_mean_ms``,
    ``prefill_ms``, ``amortised_redraw_ms_per_token`` (RPKA only; NaN for exact) and
    ``per_token_with_redraw_ms`` (median step plus the amortised redraw).
    """
    records = []
    for row in decode["rows"]:
        redraw = row.get("amortised_redraw_ms_per_token")
        redraw = float(redraw) if isinstance(redraw, int | float) else math.nan
        records.append(
            {
                "method": row["method"],
                "context": int(row["context"]),
                "per_token_ms": float(row["per_token_ms"]),
                "per_token_mean_ms": float(row.get("per_token_mean_ms", math.nan)),
                "prefill_ms": float(row.get("prefill_ms", math.nan)),
                "amortised_redraw_ms_per_token": redraw,
                "per_token_with_redraw_ms": float(row["per_token_ms"])
                + (0.0 if math.isnan(redraw) else redraw),
            }
        )
    return pd.DataFrame(records).sort_values(["method", "context"]).reset_index(drop=True)


def _frame(scaling: Mapping[str, Any] | pd.DataFrame) -> pd.DataFrame:
    return scaling if isinstance(scaling, pd.DataFrame) else scaling_frame(scaling)


def _check_measure(measure: str) -> None:
    if measure not in SCALING_MEASURES:
        raise ValueError(f"measure must be one of {sorted(SCALING_MEASURES)}, got {measure!r}")
