"""Tables of the study, as pandas DataFrames built from the result files.

Every function takes a plain dict read from a result JSON (``bench_report.json``, ...) and
returns a DataFrame ready to display; numbers are rounded only by the caller's display.
:mod:`rpka.plots` draws from the same functions, so a table and its figure never disagree.

Sections: bench; scaling (captions and latency tables); display; scaling analysis
(``rpka.scaling`` JSON of a CPU or a GPU - same schema, the device named in it - and
``rpka.decoding`` JSON: log-log slopes, speed-ups, crossover lengths, per-token decoding);
long-context training (``rpka.longctx`` JSON); ablations and peers (``bench_report.json``'s
``ablation_choice`` and ``output_error``). :func:`save_table` writes any table as CSV and as a
PNG rendering under a stable name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from rpka import stats
from rpka.plots import save_figure
from rpka.tracks import get_task

# --------------------------------------------------------------------------- bench


def points_label(entry: Mapping) -> str:
    """ "r=16 of 192" for a low-rank arm, "96 tokens" for exact."""
    rank = entry.get("rank")
    points = entry.get("pivot_points") or entry.get("attention_tokens")
    return f"r={rank} of {points}" if rank else f"{entry.get('attention_tokens')} tokens"


def sweep_table(report: Mapping) -> pd.DataFrame:
    """Validation score of every (arm, learning rate): mean over the sweep seeds."""
    rows = []
    for name, entry in report["arms"].items():
        for cell in entry["sweep"]:
            values = [v for v in cell["val_per_seed"] if v is not None]
            rows.append(
                {
                    "arm": name,
                    "lr": cell["lr"],
                    f"val {report['metric']} (mean)": cell["score"],
                    "seeds": len(cell["seeds"]),
                    "finite": len(values),
                    "diverged": cell["n_diverged"],
                    "selected": "best" if cell["selected"] else "",
                }
            )
    return pd.DataFrame(rows)


def naive_rows(report: Mapping, split: str = "test") -> list[tuple[str, dict[str, float]]]:
    """The track's reference predictors as (label, {metric: value}) on ``split``.

    (``Task.naive_rows``: e.g. the four naive forecasts, or track lm's floor and n-gram
    models).
    """
    return get_task(report["track"]).naive_rows(report, split)


def results_table(report: Mapping, split: str = "test") -> pd.DataFrame:
    """Per arm on the evaluation seeds: mean +- sd, median, IQM, 95 % CI, wins, verdict,
    with the track's reference predictors as extra rows (deterministic: no spread).

    A track may add columns (``Task.extra_columns``; track lm: the mean NLL and the gaps
    to the exact floor), for the arms and the reference rows alike.
    """
    metric = report["metric"]
    task = get_task(report["track"])
    rows = []
    for name, entry in report["arms"].items():
        full = entry["full"]
        comparison = entry.get("comparison") or {}
        wins = f"{comparison['idea_wins']}/{comparison['n_pairs']}" if comparison else ""
        row = {
            "arm": name,
            "attention": points_label(entry),
            "best lr": entry["best_cfg"]["lr"],
            f"{metric} mean": full["mean"],
            "sd": full["std"],
            "median": full["median"],
            "IQM": full["iqm"],
            "95% CI": _interval(full["ci_low"], full["ci_high"]),
            "n": full["n"],
            "wins vs exact": wins,
            "verdict": verdict_word(comparison["verdict"]) if comparison else "baseline",
        }
        means = {m: s["mean"] for m, s in entry["full_by_metric"].items()}
        row |= task.extra_columns(report, means)
        rows.append(row)
    for label, values in naive_rows(report, split):
        row = {"arm": label, "attention": "-", f"{metric} mean": values[metric]}
        row |= task.extra_columns(report, values)
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["n"] = frame["n"].astype("Int64")  # a count; the reference rows have none
    return frame


def verdict_word(verdict: str) -> str:
    """ "inconclusive (95% CI of the delta [...])" -> "inconclusive" (tables show the CI)."""
    return verdict.split(" (", 1)[0]


def comparison_table(report: Mapping) -> pd.DataFrame:
    """Every arm's paired comparison with the baseline (DESIGN.md section 5)."""
    rows = []
    for name, entry in report["arms"].items():
        c = entry.get("comparison")
        if not c:
            continue
        rows.append(
            {
                "arm": name,
                "delta mean": c["delta_mean"],
                "95% CI": _interval(c["ci_low"], c["ci_high"]),
                "CI half-width": c["ci_halfwidth"],
                "MDE (80% power)": c["mde"],
                "MDE % of exact": c["mde_rel_pct"],
                "d_z": c["d_z"],
                "wins": f"{c['idea_wins']}/{c['n_pairs']}",
                "wins 95% CI": _interval(c["wins_ci_low"], c["wins_ci_high"]),
                "sign-flip p": c["p_value"],
                "Wilcoxon p": c["wilcoxon_p"],
                "paired t p": c["ttest_p"],
                "Holm p": c["p_adjusted"],
                "verdict": verdict_word(c["verdict"]),
            }
        )
    return pd.DataFrame(rows)


def _interval(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "n/a"
    return f"[{low:+.4f}, {high:+.4f}]" if low < 0 or high < 0 else f"[{low:.4f}, {high:.4f}]"


# --------------------------------------------------------------------------- scaling


def scaling_caption(scaling: Mapping) -> str:
    """Device, dtype and shapes of a scaling JSON, in one Markdown line."""
    load = scaling.get("load_average_start")
    load_text = f"; load average at start {load[0]:.2f}" if load else ""
    return (
        f"**{scaling['device']}**, torch {scaling.get('torch', '?')}; "
        f"{scaling.get('shapes', '')}; inputs {scaling.get('dtype', '?')}{load_text}."
    )


def latency_table(
    scaling: Mapping, column: str = "forward_ms", methods: tuple[str, ...] = ("exact", "rpka")
) -> pd.DataFrame:
    """Median latency (ms) per length (rows) and method/rank (columns) for ``methods``,
    then the speed-up of each against exact in the same run."""
    frame = pd.DataFrame(scaling["rows"])
    frame = frame[frame[column].notna() & frame["method"].isin(methods)]
    frame["arm"] = [
        m if r is None or r != r else f"{m} r={int(r)}"
        for m, r in zip(frame["method"], frame["rank"], strict=True)
    ]
    wide = frame.pivot_table(index="n", columns="arm", values=column, aggfunc="first")
    order = ["exact"] + [c for c in wide.columns if c != "exact"]
    wide = wide[order]
    speedup = wide.rdiv(wide["exact"], axis=0).drop(columns="exact")
    speedup.columns = [f"{c} speed-up" for c in speedup.columns]
    return pd.concat([wide.add_suffix(" ms"), speedup], axis=1)


# --------------------------------------------------------------------------- display


def styled(frame: pd.DataFrame, precision: int = 4):
    """A DataFrame for the report: blanks for missing values, fixed precision, and no index
    column unless the index is named (then it becomes the first column) - a pandas
    ``Styler``; notebooks render it as an HTML table."""
    if frame.index.name is not None:
        frame = frame.reset_index()
    return frame.style.format(precision=precision, na_rep="").hide(axis="index")


# --------------------------------------------------------------------------- scaling analysis
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
    """One row per (method, context) of a decoding result (``rpka.decoding``).

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


# --------------------------------------------------------------------------- long-context training
# (issue 6: rpka.longctx)


def longctx_table(longctx: Mapping[str, Any], confidence_level: float = 0.95) -> pd.DataFrame:
    """The long-context training table: one row per (context, arm) of ``longctx.json``.

    Columns: ``method``, ``rank``, ``context``, ``arm``, ``step_ms`` (median training
    step), ``step_ratio`` (over exact's), ``peak_mib`` (one training step), ``peak_ratio``,
    ``test_mse_mean`` and ``test_mse_sd`` (ddof=1) over the evaluation seeds, ``n_seeds``,
    and against exact at the same context, seed by seed
    (``rpka.stats.paired_comparison``, Holm-adjusted across the RPKA arms of a context as
    the bench does): ``delta`` (arm - exact, mean), ``delta_ci_low`` / ``delta_ci_high``
    (t interval at ``confidence_level``), ``p_holm`` and ``verdict``. Exact's own row has
    NaN there.
    """
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must lie in (0, 1), got {confidence_level}")
    alpha = 1 - confidence_level
    rows = []
    by_context: dict[int, list[dict[str, Any]]] = {}
    for row in longctx["rows"]:
        by_context.setdefault(int(row["context"]), []).append(row)
    for context, arms in sorted(by_context.items()):
        exact = next((r for r in arms if r["method"] == EXACT), None)
        comparisons = {}
        if exact is not None:
            base = _floats(exact["test_mse_per_seed"])
            for r in arms:
                if r is not exact:
                    comparisons[r["arm"]] = stats.paired_comparison(
                        base, _floats(r["test_mse_per_seed"]), "lower", alpha=alpha
                    )
            stats.apply_holm(comparisons, alpha=alpha)
        for r in arms:
            per_seed = _floats(r["test_mse_per_seed"])
            finite = per_seed[np.isfinite(per_seed)]
            cmp_ = comparisons.get(r["arm"])
            rows.append(
                {
                    "method": r["method"],
                    "rank": r["rank"],
                    "context": context,
                    "arm": r["arm"],
                    "step_ms": _num(r["step_ms"]),
                    "step_ratio": _num(r["step_ratio_vs_exact"]),
                    "peak_mib": _num(r["peak_mib"]),
                    "peak_ratio": _num(r["peak_ratio_vs_exact"]),
                    "test_mse_mean": float(finite.mean()) if len(finite) else math.nan,
                    "test_mse_sd": float(finite.std(ddof=1)) if len(finite) > 1 else math.nan,
                    "n_seeds": len(finite),
                    "delta": _num(cmp_["delta_mean"]) if cmp_ else math.nan,
                    "delta_ci_low": _num(cmp_["ci_low"]) if cmp_ else math.nan,
                    "delta_ci_high": _num(cmp_["ci_high"]) if cmp_ else math.nan,
                    "p_holm": _num(cmp_["p_adjusted"]) if cmp_ else math.nan,
                    "verdict": cmp_["verdict"] if cmp_ else "",
                }
            )
    out = pd.DataFrame(rows)
    out["rank"] = out["rank"].astype("Int64")
    return out


def _floats(values: Sequence[float | None]) -> np.ndarray:
    return np.array([math.nan if v is None else float(v) for v in values], dtype=float)


def _num(value: float | None) -> float:
    return math.nan if value is None else float(value)


# --------------------------------------------------------------------------- ablations, peers
# (the study of RPKA's choices and of the peers: arm groups, the default choice, the output
# error against exact per arm; save_table writes any table as CSV and PNG)

GROUPS = ("baseline", "RPKA rank", "RPKA ablation", "peer", "naive")


def arm_group(report: Mapping[str, Any], name: str) -> str:
    """``baseline``, ``RPKA rank`` (the rank sweep), ``RPKA ablation``, ``peer`` or
    ``control`` (``mean``: uniform attention).

    The ablation reference counts as an ablation (it is the ablations' default). A peer
    that is listed among the ablation arms (``nystrom-uniform``: RPKA with uniform
    landmarks) stays a peer: the method differs, the group says so.
    """
    config = report["config"]
    arm = report["arms"][name]
    if name == config["baseline_arm"]:
        return "baseline"
    if arm["method"] == "mean":
        return "control"
    if arm["method"] != "rpka":
        return "peer"
    ablations = {config.get("ablation_reference"), *config.get("ablation_arms", ())}
    return "RPKA ablation" if name in ablations else "RPKA rank"


def ablation_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """RPKA's default choice: one row per candidate, validation scores only.

    Columns: ``arm``, ``factor`` and ``level`` (what it changes from the reference),
    ``lr``, ``val_score`` (mean over the sweep seeds: the choice), ``val_per_seed``,
    ``eval_seeds_val_mean``, and against the reference on the evaluation seeds'
    validation scores ``eval_seeds_val_delta`` and its Holm-adjusted sign-flip p (the
    confirmation), ``picked`` (step 1), ``chosen``. Empty without an ablation study.
    """
    choice = report.get("ablation_choice")
    if not choice:
        return pd.DataFrame()
    rows = []
    for c in choice["candidates"]:
        rows.append(
            {
                "arm": c["arm"],
                "factor": c["factor"] or "(reference)",
                "level": c["level"] or "",
                "lr": c["lr"],
                "val_score": c["val_score"],
                "val_per_seed": ", ".join(
                    "diverged" if v is None else f"{v:.4f}" for v in c["val_per_seed"]
                ),
                "eval_seeds_val_mean": c["eval_seeds_val_mean"],
                "eval_seeds_val_delta": c.get("eval_seeds_val_delta"),
                "eval_seeds_val_p_adjusted": c.get("eval_seeds_val_p_adjusted"),
                "picked": c["arm"] == choice.get("picked_arm", choice["chosen_arm"]),
                "chosen": c["arm"] == choice["chosen_arm"],
            }
        )
    return pd.DataFrame(rows)


def output_error_table(report: Mapping[str, Any], inputs: str = "own") -> pd.DataFrame:
    """Mean relative output error against exact: one row per arm, one column per rank.

    ``inputs``: ``"own"`` (each arm's trained Q/K) or ``"exact"`` (the exact arm's).
    """
    study = report.get("output_error")
    if not study:
        return pd.DataFrame()
    frame = pd.DataFrame(study["rows"])
    frame = frame[frame["inputs"] == inputs]
    order = {name: i for i, name in enumerate(report["arms"])}
    table = frame.pivot_table(index="arm", columns="rank", values="error_mean", aggfunc="first")
    table = table.loc[sorted(table.index, key=order.get)]
    table.columns = [f"r={r}" for r in table.columns]
    return table.reset_index()


def save_table(
    frame: pd.DataFrame,
    save_dir: str | os.PathLike | None,
    name: str,
    title: str | None = None,
    float_format: str = "{:.4g}",
) -> Path | None:
    """Write ``frame`` to ``save_dir/name.csv`` and a rendering to ``save_dir/name.png``.

    Returns the PNG path (None without a folder). The CSV keeps full precision; the PNG
    shows numbers with ``float_format``.
    """
    if save_dir is None:
        return None
    folder = Path(save_dir)
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / f"{name}.csv", index=False)
    fig = render_table(frame, title, float_format)
    path = save_figure(fig, folder, name)
    plt.close(fig)
    return path


def render_table(
    frame: pd.DataFrame, title: str | None = None, float_format: str = "{:.4g}"
) -> plt.Figure:
    """A matplotlib figure showing ``frame`` as a table (NaN and None as blanks)."""

    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        if isinstance(value, float):
            return float_format.format(value)
        return str(value)

    text = [[cell(v) for v in row] for row in frame.itertuples(index=False)]
    columns = [str(c) for c in frame.columns]
    width = sum(max(len(columns[j]), *(len(r[j]) for r in text), 4) for j in range(len(columns)))
    fig, ax = plt.subplots(figsize=(min(2 + 0.09 * width, 40), 0.6 + 0.3 * (len(text) + 1)))
    ax.axis("off")
    if text:
        table = ax.table(cellText=text, colLabels=columns, loc="center", cellLoc="left")
        table.auto_set_font_size(False)
        table.set_fontsize(8)
        table.auto_set_column_width(list(range(len(columns))))
    if title:
        ax.set_title(title)
    return fig
