"""Tables of the study, as pandas DataFrames built from the result files.

Every function takes a plain dict read from a result JSON (``bench_report.json``, ...) and
returns a DataFrame ready to display; numbers are rounded only by the caller's display.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

NAIVE_NAMES = {
    "mean": "naive: context mean",
    "last_value": "naive: last value",
    "seasonal_naive": "naive: seasonal",
    "linear": "naive: linear (least squares)",
}

LM_NAMES = {
    "floor": "floor: exact entropy of the source",
    "source_optimal": "source-optimal predictor (realised)",
}

# --------------------------------------------------------------------------- bench


def _points(entry: Mapping) -> str:
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

    forecast: the four naive forecasts. lm: the exact floor (a number of the source, the
    same on every split), the source-optimal predictor's realised loss and the n-gram
    models - each with ``nll`` (nats) and ``perplexity``.
    """
    naive = report["naive_baselines"]
    if report["track"] == "forecast":
        return [(NAIVE_NAMES.get(k, k), dict(f[split])) for k, f in naive["forecasts"].items()]
    rows = [(LM_NAMES["floor"], dict(naive["floor"]))]
    for key, predictor in naive["predictors"].items():
        if key.startswith("ngram_"):
            order = int(key.split("_")[1])
            label = f"n-gram, {order} token{'s' if order > 1 else ''} of context"
        else:
            label = LM_NAMES.get(key, key)
        rows.append((label, dict(predictor[split])))
    return rows


def results_table(report: Mapping, split: str = "test") -> pd.DataFrame:
    """Per arm on the evaluation seeds: mean +- sd, median, IQM, 95 % CI, wins, verdict,
    with the track's reference predictors as extra rows (deterministic: no spread).

    Track lm adds the mean NLL (nats) and the gaps to the exact floor: perplexity - floor
    perplexity and NLL - floor NLL (nats), for the arms and the reference rows alike.
    """
    metric = report["metric"]
    lm = report["track"] == "lm"
    floor = report["naive_baselines"]["floor"] if lm else None
    rows = []
    for name, entry in report["arms"].items():
        full = entry["full"]
        comparison = entry.get("comparison") or {}
        wins = f"{comparison['idea_wins']}/{comparison['n_pairs']}" if comparison else ""
        row = {
            "arm": name,
            "attention": _points(entry),
            "best lr": entry["best_cfg"]["lr"],
            f"{metric} mean": full["mean"],
            "sd": full["std"],
            "median": full["median"],
            "IQM": full["iqm"],
            "95% CI": _interval(full["ci_low"], full["ci_high"]),
            "n": full["n"],
            "wins vs exact": wins,
            "verdict": comparison.get("verdict", "baseline" if not comparison else ""),
        }
        if lm:
            gap = entry["floor_gap"]
            row |= {
                "NLL (nats)": gap["nll_mean"],
                "perplexity - floor": gap["perplexity_gap"],
                "NLL - floor (nats)": gap["nll_gap"],
            }
        rows.append(row)
    for label, values in naive_rows(report, split):
        row = {"arm": label, "attention": "-", f"{metric} mean": values[metric]}
        if lm:
            row |= {
                "NLL (nats)": values["nll"],
                "perplexity - floor": values["perplexity"] - floor["perplexity"],
                "NLL - floor (nats)": values["nll"] - floor["nll"],
            }
        rows.append(row)
    return pd.DataFrame(rows)


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
                "verdict": c["verdict"],
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
