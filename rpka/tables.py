"""Tables of the study, drawn from ``bench_report.json`` (as ``rpka.bench.run_bench`` returns it).

Every function returns a pandas ``DataFrame``; :func:`save_table` writes one as CSV and as
a PNG rendering (through :func:`rpka.plots.save_figure`) under a stable name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from rpka.plots import save_figure

GROUPS = ("baseline", "RPKA rank", "RPKA ablation", "peer", "naive")
NAIVE_LABELS = {
    "mean": "naive: context mean",
    "last_value": "naive: last value",
    "seasonal_naive": "naive: seasonal",
    "linear": "naive: linear (least squares)",
}


def arm_group(report: Mapping[str, Any], name: str) -> str:
    """``baseline``, ``RPKA rank`` (the rank sweep), ``RPKA ablation`` or ``peer``.

    The ablation reference counts as an ablation (it is the ablations' default). A peer
    that is listed among the ablation arms (``nystrom-uniform``: RPKA with uniform
    landmarks) stays a peer: the method differs, the group says so.
    """
    config = report["config"]
    arm = report["arms"][name]
    if name == config["baseline_arm"]:
        return "baseline"
    if arm["method"] != "rpka":
        return "peer"
    ablations = {config.get("ablation_reference"), *config.get("ablation_arms", ())}
    return "RPKA ablation" if name in ablations else "RPKA rank"


def arm_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """One row per arm (test metric) and per naive forecast, in the config's arm order.

    Columns: ``arm``, ``group``, ``method``, ``rank``, ``best_lr``, ``n`` (evaluation seeds
    that finished), ``mean``, ``sd`` (ddof=1), ``mean_sd`` (formatted), ``median``, ``iqm``,
    ``ci_low`` / ``ci_high`` (95 % t-interval of the mean), the paired comparison with the
    baseline (``delta``, ``delta_ci_low`` / ``_high``, ``wins`` "k/n", ``p_adjusted`` Holm,
    ``verdict``), ``step_ms`` (median training step) and ``n_diverged``. Naive forecasts
    are deterministic: only ``mean`` (their test score) is filled.
    """
    rows = []
    for name, arm in report["arms"].items():
        full = arm["full"]
        comparison = arm.get("comparison") or {}
        n_pairs = comparison.get("n_pairs")
        rows.append(
            {
                "arm": name,
                "group": arm_group(report, name),
                "method": arm["method"],
                "rank": arm.get("rank"),
                "best_lr": arm["best_cfg"]["lr"],
                "n": full["n"],
                "mean": full["mean"],
                "sd": full["std"],
                "mean_sd": f"{full['mean']:.4f} ± {full['std']:.4f}",
                "median": full["median"],
                "iqm": full["iqm"],
                "ci_low": full["ci_low"],
                "ci_high": full["ci_high"],
                "delta": comparison.get("delta_mean", math.nan),
                "delta_ci_low": comparison.get("ci_low", math.nan),
                "delta_ci_high": comparison.get("ci_high", math.nan),
                "wins": f"{comparison['idea_wins']}/{n_pairs}" if comparison else "",
                "p_adjusted": comparison.get("p_adjusted", math.nan),
                "verdict": comparison.get("verdict", "baseline" if not comparison else ""),
                "step_ms": arm.get("step_ms_median"),
                "n_diverged": arm["n_diverged"],
            }
        )
    for name, forecast in report["naive_baselines"]["forecasts"].items():
        rows.append(
            {
                "arm": NAIVE_LABELS.get(name, f"naive: {name}"),
                "group": "naive",
                "method": name,
                "mean": forecast["test"][report["metric"]],
                "mean_sd": f"{forecast['test'][report['metric']]:.4f}",
                "wins": "",
                "verdict": "",
            }
        )
    return pd.DataFrame(rows)


def ablation_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """RPKA's default choice: one row per candidate, validation scores only.

    Columns: ``arm``, ``factor`` and ``level`` (what it changes from the reference),
    ``lr``, ``val_score`` (mean over the sweep seeds: the choice), ``val_per_seed``,
    ``eval_seeds_val_mean`` (the check), ``chosen``. Empty without an ablation study.
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


__all__ = [
    "GROUPS",
    "ablation_table",
    "arm_group",
    "arm_table",
    "output_error_table",
    "render_table",
    "save_table",
]
