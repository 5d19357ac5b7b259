"""Tables of the study, as pandas DataFrames built from the result files.

Every function takes a plain dict read from a result JSON (``bench_report.json``, ...) and
returns a DataFrame ready to display; numbers are rounded only by the caller's display.
:mod:`rpka.report.figures` draws from the same functions, so a table and its figure never disagree.

Sections: bench; scaling (captions and latency tables); display; scaling analysis
(``rpka.speed.scaling`` JSON of a CPU or a GPU - same schema, the device named in it - and
``rpka.speed.decoding`` JSON: log-log slopes, speed-ups, crossover lengths, per-token decoding);
long-context training (``rpka.study.longctx`` JSON); ablations and peers (``bench_report.json``'s
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

from rpka.io import save_figure
from rpka.speed.analysis import EXACT
from rpka.tracks import get_task
from rpka.verdict import decision

# --------------------------------------------------------------------------- bench


# Beyond this many times exact's mean a relative figure says only that exact's mean is ~0
# (recall: exact's error 1e-4, deltas of 984,500 %); the one cut-off every text uses.
NEAR_ZERO_FRACTION = 100.0


def relative_is_meaningful(fraction: float) -> bool:
    """Whether a difference of ``fraction`` × exact's mean is worth writing as a share."""
    return math.isfinite(fraction) and abs(fraction) <= NEAR_ZERO_FRACTION


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

    (``TrackText.naive_rows``: e.g. the four naive forecasts, or track lm's floor and n-gram
    models).
    """
    return get_task(report["track"]).text.naive_rows(report, split)


def results_table(report: Mapping, split: str = "test") -> pd.DataFrame:
    """Per arm on the evaluation seeds: mean +- sd, median, IQM, 95 % CI, wins, verdict,
    with the track's reference predictors as extra rows (deterministic: no spread).

    A track may add columns (``TrackText.extra_columns``; track lm: the mean NLL and the gaps
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
            "arm": arm_label(report, name),
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
        row |= task.text.extra_columns(report, means)
        rows.append(row)
    for label, values in naive_rows(report, split):
        row = {"arm": label, "attention": "-", f"{metric} mean": values[metric]}
        row |= task.text.extra_columns(report, values)
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["n"] = frame["n"].astype("Int64")  # a count; the reference rows have none
    return frame


def verdict_word(verdict: str) -> str:
    """ "inconclusive (95% CI of the delta [...])" -> "inconclusive" (tables show the CI)."""
    return verdict.split(" (", 1)[0]


def comparison_table(report: Mapping) -> pd.DataFrame:
    """Every arm's paired comparison with the baseline (docs/design.md section 5)."""
    rows = []
    for name, entry in report["arms"].items():
        c = entry.get("comparison")
        if not c:
            continue
        rows.append(
            {
                "arm": arm_label(report, name),
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
    column unless the index is named (then it becomes the first column), text escaped
    (``<arm>`` stays text) - a pandas ``Styler``; notebooks render it as an HTML table."""
    if frame.index.name is not None:
        frame = frame.reset_index()
    text = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
    style = frame.style.format(precision=precision, na_rep="", escape="html").hide(axis="index")
    return style.set_properties(subset=text, **{"text-align": "left"})


# --------------------------------------------------------------------------- long-context training
# (issue 6: rpka.study.longctx)


def longctx_table(longctx: Mapping[str, Any], confidence_level: float = 0.95) -> pd.DataFrame:
    """The long-context training table: one row per (context, arm) of ``longctx.json``.

    Columns: ``method``, ``rank``, ``context``, ``arm``, ``step_ms`` (median training
    step), ``step_ratio`` (over exact's), ``peak_mib`` (one training step), ``peak_ratio``,
    ``test_mse_mean`` and ``test_mse_sd`` (ddof=1) over the evaluation seeds, ``n_seeds``,
    and against exact at the same context, seed by seed: the comparison of that context's
    bench (its decision rule: primary unadjusted, Holm over the secondary family, the
    control read by the attention gate; ``rpka.verdict.decision``), recomputed Holm across
    the arms only for an older file whose rows lack it (``rpka.verdict.decision.holm_against``)
    - ``delta`` (arm - exact, mean), ``delta_ci_low`` / ``delta_ci_high`` (t interval),
    ``p_holm`` (the p the verdict used, adjusted as its rule says) and ``verdict``. Exact's
    own row has NaN there.
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
            comparisons = decision.holm_against(
                _floats(exact["test_mse_per_seed"]),
                {r["arm"]: _floats(r["test_mse_per_seed"]) for r in arms if r is not exact},
                alpha,
            )
        for r in arms:
            per_seed = _floats(r["test_mse_per_seed"])
            finite = per_seed[np.isfinite(per_seed)]
            cmp_ = r.get("comparison") or comparisons.get(r["arm"])
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


WIRING_CHECK = "wiring check"  # a positive control: exact by construction (issue 53, item 3)


def is_wiring_check(report: Mapping[str, Any], name: str) -> bool:
    """Whether arm ``name`` is the bench's positive control: a rank exact by construction
    (``config.positive_control_arm``), which checks the wiring and measures nothing."""
    return name == (report.get("config") or {}).get("positive_control_arm")


def arm_label(report: Mapping[str, Any], name: str, code: bool = False) -> str:
    """An arm's name as tables and figures show it: ``(primary)`` for the pre-registered
    primary arm, ``(wiring check)`` for the positive control (:func:`is_wiring_check`)."""
    shown = f"`{name}`" if code else name
    if name == report.get("primary_arm"):
        return f"{shown} (primary)"
    return f"{shown} ({WIRING_CHECK})" if is_wiring_check(report, name) else shown


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
