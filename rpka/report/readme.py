"""The study's results in Markdown, read from the committed result files.

The README's results section is this module's output, so its numbers are the report's::

    python -m rpka summary --preset full                    # print it
    python -m rpka summary --preset full --readme README.md # rewrite the README's block

The block sits between ``BEGIN``/``END`` markers; ``tests/test_summary.py`` fails when the
README's block differs from what the committed files give (it is skipped once a local
rerun has changed those files).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rpka import paths
from rpka.config.presets import MECHANISM_TRACK, STANDARD_WALL_BUDGET_MIN, STUDY_TRACKS
from rpka.config.presets_longctx import POWER_PRESET, power_as_run
from rpka.io import read_json_checked
from rpka.paths import resolve
from rpka.report import narrative, rank_law, tables
from rpka.report.causal_targets import Target, against, causal_targets
from rpka.report.longrange_answer import robust_answer_text
from rpka.study import steps as study
from rpka.study.cost import cost_model_json, measured_cpu_s
from rpka.study.progress import landed, power_status
from rpka.tracks import get_task
from rpka.verdict.frontier import forward_speedup
from rpka.verdict.stats import ALPHA
from rpka.verdict.step_cost import with_longctx_timing, with_step_timing

BEGIN = "<!-- BEGIN rpka summary (python -m rpka summary --preset full --readme README.md) -->"
END = "<!-- END rpka summary -->"
GPU_JSON = paths.GPU_SCALING_JSON
DECODE_JSON = paths.decode_json("cpu")


# what the summary reads of a bench report: one without them is named (CorruptFileError)
BENCH_KEYS = ("track", "metric", "arms", "baseline_arm", "primary_arm", "timings")


def _load(path: str | os.PathLike, required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """A result file, checked; None where it is missing; never moved (committed results)."""
    path = resolve(path)
    return read_json_checked(path, required) if path.exists() else None


def load_results(preset: str) -> dict[str, dict[str, Any] | None]:
    """Every result file the summary reads (None where a file is missing)."""
    timing = _load(f"{paths.results_dir(preset)}/{paths.TRACK_STEPTIME_FILE}")

    def bench(name: str) -> dict[str, Any] | None:
        """A track's bench report, its step ratios from the timing file where it has one."""
        report = _load(paths.bench_report(preset, get_task(name).out_dir), BENCH_KEYS)
        return None if report is None else with_step_timing(report, timing)

    benches = {name: bench(name) for name in STUDY_TRACKS}
    mechanism_dir = get_task(MECHANISM_TRACK).out_dir  # the study's mechanism check
    return {
        **benches,
        "mechanism": _load(paths.mechanism_json(preset, mechanism_dir)),
        "mechanism_followup": _load(paths.mechanism_followup_json(preset, mechanism_dir)),
        "scaling_cpu": _load(paths.scaling_cpu_json(preset)),
        "longctx": timed_longctx(_load(paths.longctx_json(preset)), paths.results_dir(preset)),
        "decode": _load(DECODE_JSON),
        "causal_cpu": _load(paths.CAUSAL_CPU_JSON),
        "scaling_gpu": _load(GPU_JSON),
        "rank_law": _load(paths.RANK_LAW_JSON),
    }


def timed_longctx(
    longctx: dict[str, Any] | None, folder: str | os.PathLike
) -> dict[str, Any] | None:
    """A long-context study's ``longctx.json`` content with its step ratios from the
    ``steptime.json`` in ``folder`` (``rpka.verdict.step_cost.with_longctx_timing``; the
    runs' wall times where that file is missing)."""
    return with_longctx_timing(longctx, _load(Path(folder) / paths.STEPTIME_FILE))


def arm_table(report: Mapping[str, Any]) -> pd.DataFrame:
    """One row per arm: points, test metric (mean ± sd), paired delta with its CI, Holm p,
    wins, training-step time against the baseline's (one-thread CPU time from the study's
    timing file where it has one, else the runs' wall times); then the reference predictors."""
    metric = report["metric"]
    timing = report["timings"]
    step_column = (
        "train step CPU ms (× exact)" if timing.get("step_source") else "train step ms (× exact)"
    )
    rows = []
    for name, arm in report["arms"].items():
        full = arm["full"]
        row = {
            "arm": tables.arm_label(report, name, code=True),
            "attention": tables.points_label(arm),
            f"test {metric} (mean ± sd)": f"{full['mean']:.4f} ± {full['std']:.4f}",
        }
        c = arm.get("comparison")
        if c:
            row["delta vs exact [95 % CI]"] = (
                f"{c['delta_mean']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]"
            )
            row["Holm p"] = f"{c['p_adjusted']:.3g}"
            row["wins"] = f"{c['idea_wins']}/{c['n_pairs']}"
        else:
            row["delta vs exact [95 % CI]"] = row["Holm p"] = row["wins"] = "baseline"
        step, ratio = timing["step_ms_median"].get(name), timing["step_ratio_vs_baseline"].get(name)
        row[step_column] = f"{step:.3g} ({ratio:.2f}×)" if step else "n/a"
        rows.append(row)
    return pd.DataFrame(rows)


def _met(flag: bool | None) -> str:
    return "n/a" if flag is None else ("met" if flag else "not met")


def _rpka_rows(scaling: Mapping[str, Any], rank: int = 64) -> dict[int, dict]:
    """The scaling file's ``rpka`` rows at ``rank`` with a measured speed-up, by length."""
    return {
        row["n"]: row
        for row in scaling["rows"]
        if row["method"] == "rpka" and row.get("rank") == rank and row.get("speedup_vs_exact")
    }


# the study's budget on the project's 2-core machine (issue 16): the standard study's
# `make report`, set-up included - one number, the preset's (docs/standard.md quotes it)
BUDGET_MIN = STANDARD_WALL_BUDGET_MIN


# long-context training at 2,048 tokens, the primary rank (issue 16's table)
LONGCTX_STEP_TARGET, LONGCTX_PEAK_TARGET = 0.5, 1.5


def targets_table(results: Mapping[str, Any], cost: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each target of the study's issues, the measured figure and whether it is met; with
    ``cost`` (:func:`cost_table`), also the study's budget from its recorded training cost."""
    found: list[Target] = []
    for name in STUDY_TRACKS:  # each track's own targets (TrackText.summary_targets)
        if results.get(name):
            found += get_task(name).text.summary_targets(results[name])
    found += longctx_targets(results.get("longctx"))
    found += budget_targets(cost)
    found += mechanism_targets(results["mechanism"])
    found += speed_targets(results["scaling_cpu"])
    found += decode_targets(results["decode"])
    found += causal_targets(results.get("causal_cpu"))
    found += gpu_targets(results["scaling_gpu"])
    rows = [(target, measured, _met(met)) for target, measured, met in found]
    return pd.DataFrame(rows, columns=["target", "measured", "status"])


def budget_targets(cost: pd.DataFrame | None) -> list[Target]:
    """The study's budget against its recorded training cost (:func:`cost_table`'s total)."""
    if cost is None:
        return []
    cpu_s = int(cost["CPU s"].iloc[-1])  # the total row
    measured = f"{cpu_s / 120:.0f} min for the training runs alone ({cpu_s:,} CPU-s / 2 cores)"
    predicted = cost["predicted CPU s"].iloc[-1] if "predicted CPU s" in cost else "-"
    if predicted != "-":
        measured += f"; the cost model predicts {predicted} CPU-s"
    target = (f"study budget: the standard study's `make report` ≤ {BUDGET_MIN} min wall "
              "on 2 cores, set-up included")  # fmt: skip
    return [(target, measured, cpu_s / 120 <= BUDGET_MIN)]


def mechanism_targets(mechanism: Mapping[str, Any] | None) -> list[Target]:
    """The trace identity on the trained model: the pooled rule, or the per-step band of
    a file from before it."""
    if not mechanism:
        return []
    sig = mechanism["trained"]["mechanism_signature"]
    pooled = sig.get("pooled")
    if pooled:  # the pooled rule (docs/statistics.md section 7)
        return [(
            f"trace identity: pooled z-scores calibrated (χ² and Σz, α = {ALPHA:g} over both)",
            f"{pooled['n_seeds']} Monte Carlo seeds, {pooled['count']} z: χ² p "
            f"{pooled['chi2_p']:.3g}, Σz p {pooled['stouffer_p']:.3g}",
            pooled["confirmed"],
        )]  # fmt: skip
    return [(
        "trace identity: every step's z within ±4",
        f"largest abs(z) {sig['max_abs_z']:.2f} over {sig['n_tests']} tests",
        sig["confirmed"],
    )]  # fmt: skip


def speed_targets(scaling: Mapping[str, Any] | None) -> list[Target]:
    """RPKA r=64's CPU forward against exact's: at n = 4,096 and from n = 1,024 on."""
    if not scaling:
        return []
    speedup = {n: forward_speedup(row) for n, row in _rpka_rows(scaling).items()}
    at_4096 = speedup.get(4096)
    long = {n: x for n, x in speedup.items() if n >= 1024}
    slowest = min(long, key=long.get) if long else None
    return [
        (
            "CPU: rpka r=64 forward ≥ 3 × faster than exact at n = 4,096",
            f"{at_4096:.1f} ×" if at_4096 else "not in this sweep",
            at_4096 >= 3 if at_4096 else None,
        ),
        (
            "CPU: faster than exact from n = 1,024 on",
            f"{long[slowest]:.2f} × at n = {slowest:,} (the least)"
            if slowest
            else "not in this sweep",
            long[slowest] > 1 if slowest else None,
        ),
    ]


def decode_targets(decode: Mapping[str, Any] | None) -> list[Target]:
    """Per-token decoding at the longest context against the shortest, the landmark
    redraw amortised per token."""
    if not decode:
        return []
    target = decode["summary"]["target"]  # rpka.speed.decoding.summarise: both ratios
    longest = max(decode["config"]["contexts"])
    return [(
        "decoding: per-token time at the longest context ≤ 1.2 × at 1k, landmark "
        "redraw included",
        f"{target['ratio_with_redraw']:.2f} × at {longest:,} with the redraw amortised, "
        f"{target['ratio']:.2f} × without ({decode['device']})",
        target["met"],
    )]  # fmt: skip


def gpu_targets(gpu: Mapping[str, Any] | None) -> list[Target]:
    """The GPU targets as the GPU scaling file states them, or each one not measured."""
    if gpu is None:
        return [
            (target, "not measured: no GPU was lent to this study's sessions", None)
            for target in (
                "GPU: r=64 ≥ 5 × faster than SDPA flash at 65,536",
                "GPU: peak memory ≤ 4 × SDPA's at 65,536",
                "GPU: pivot selection ≤ 25 % of the forward at n ≥ 16,384",
            )
        ]
    return [(t["statement"], t["measured"], t["met"]) for t in gpu.get("targets", [])]


def longctx_targets(longctx: Mapping[str, Any] | None) -> list[tuple[str, str, bool | None]]:
    """Step time and peak memory of the long-context primary arm at the longest context,
    against exact's in the same study (issue 16)."""
    if not longctx:
        return []
    primary = longctx["config"]["bench"]["primary_arm"]
    context = max(longctx["contexts"])
    row = next(
        (r for r in longctx["rows"] if r["context"] == context and r["arm"] == primary), None
    )
    if row is None:
        return []
    where = f"long context, {context:,} tokens: {primary}"
    out = [
        (
            f"{where} training step ≤ {LONGCTX_STEP_TARGET} × exact",
            against(row["step_ratio_vs_exact"], LONGCTX_STEP_TARGET),
            row["step_ratio_vs_exact"] <= LONGCTX_STEP_TARGET,
        )
    ]
    if row.get("peak_ratio_vs_exact") is not None:
        out.append(
            (
                f"{where} peak memory ≤ {LONGCTX_PEAK_TARGET} × exact",
                against(row["peak_ratio_vs_exact"], LONGCTX_PEAK_TARGET),
                row["peak_ratio_vs_exact"] <= LONGCTX_PEAK_TARGET,
            )
        )
    return out


def cost_table(preset: str, results: Mapping[str, Any]) -> pd.DataFrame:
    """The study's training cost per bench: runs and CPU seconds (one thread per run), and
    what they come to on the 2-core machine with both cores busy (CPU seconds / 2); with
    the preset's ``cost_model.json`` (``python -m rpka cost``), also each bench's
    predicted CPU seconds."""
    benches = [(f"`{name}`", name, results[name]) for name in STUDY_TRACKS if results.get(name)]
    pattern = "context-*/bench_report.json"
    found = resolve(f"{paths.results_dir(preset)}/longctx").glob(pattern)
    for path in sorted(found, key=lambda p: int(p.parent.name.removeprefix("context-"))):
        context = int(path.parent.name.removeprefix("context-"))
        label = f"long context, {context:,} tokens"
        benches.append((label, f"longctx-{context}", read_json_checked(path)))
    model_file = cost_model_json(preset)
    model = read_json_checked(model_file)["benches"] if model_file.exists() else None
    rows = []
    for label, key, report in benches:
        # every training run's own cpu_s, recorded when it was trained (a resumed bench
        # keeps its original cost)
        seconds = sum(measured_cpu_s(report).values())
        row = [label, report["timings"]["n_runs"], round(seconds), seconds / 120]
        if model is not None:
            row.append(model[key]["predicted_cpu_s"] if key in model else None)
        rows.append(row)
    # the pre-registered long-range study's runs (issue 56: the total left them out), with
    # their own price (docs/longrange_protocol.md)
    power = resolve(f"{paths.results_dir(preset)}/{POWER_PRESET}")
    for row in landed(power_as_run(), power) if power.is_dir() else []:
        jobs = sum(row["landed"].values())
        label = f"long range, 16 seeds, {row['context']:,} tokens"
        rows.append([label, jobs, round(row["cpu_s"]), row["cpu_s"] / 120]
                    + ([row.get("predicted_cpu_s")] if model is not None else []))  # fmt: skip
    total = ["total", *(sum(r[i] for r in rows) for i in (1, 2, 3))]
    columns = ["bench", "runs", "CPU s", "min on 2 cores"]
    if model is not None:
        predicted = [r[4] for r in rows]
        total.append(None if None in predicted else sum(predicted))
        columns.append("predicted CPU s")
    frame = pd.DataFrame([*rows, total], columns=columns)
    frame["min on 2 cores"] = frame["min on 2 cores"].map(lambda m: f"{m:.0f}")
    if model is not None:
        frame["predicted CPU s"] = [
            "-" if p is None or pd.isna(p) else f"{p:,.0f}" for p in frame["predicted CPU s"]
        ]
    return frame


def cost_model_table(result: Mapping[str, Any]) -> pd.DataFrame:
    """The cost model's predictions (``rpka.study.cost``, ``cost_model.json``) beside the CPU
    seconds each bench recorded: one row per bench and a total of the benches with both."""
    rows = [
        (f"`{label}`", bench["n_jobs"], bench["predicted_cpu_s"], bench["measured_cpu_s"])
        for label, bench in result["benches"].items()
    ]
    both = [row for row in rows if row[3] is not None]
    if len(both) > 1:
        rows.append(("total (measured benches)", *(sum(r[i] for r in both) for i in (1, 2, 3))))

    def seconds(x: float | None) -> str:
        return "-" if x is None else f"{x:,.0f}"

    return pd.DataFrame(
        [
            (label, runs, seconds(p), seconds(m), f"{p / m:.2f}" if m else "-")
            for label, runs, p, m in rows
        ],
        columns=["bench", "runs", "predicted CPU s", "measured CPU s", "predicted / measured"],
    )


def gate_order(name: str, report: Mapping[str, Any]) -> int:
    """Sort key of a track in the summary: gate passed 0, no gate 1, gate failed 2."""
    gate = report.get("attention_gate")
    return 1 if gate is None else (0 if gate["passed"] else 2)


def track_block(name: str, report: Mapping[str, Any]) -> list[str]:
    """One track's part of the summary: its primary comparison, the control's reading, the
    learnability bar, its notes, its arm table and (where it has ablations) RPKA's default."""
    return [
        f"**{get_task(name).text.title}.** " + narrative.headline(report),
        narrative.control_reading(report),
        narrative.learnability(report),
        narrative.track_notes(report),
        arm_table(report).to_markdown(index=False),
        narrative.ablation_choice(report) if report.get("ablation_choice") else "",
    ]


def render(preset: str = "full") -> str:
    """The summary block (Markdown) for ``preset``'s committed results: the tracks whose
    attention gate passed first (they can tell attention methods apart), in study order."""
    results = load_results(preset)
    present = [name for name in STUDY_TRACKS if results.get(name)]
    if not present:
        raise FileNotFoundError(
            f"no {paths.bench_report(preset, get_task(STUDY_TRACKS[0]).out_dir)}: run "
            f"`python -m rpka report --preset {preset}` first"
        )
    parts = [
        f"Every number below is read from the result files of the `{preset}` preset "
        f"(`python -m rpka summary --preset {preset}` prints it). "
        "Tracks whose attention gate passed come first."
    ]
    for name in sorted(present, key=lambda n: gate_order(n, results[n])):
        parts += track_block(name, results[name])
    if results["mechanism"]:
        parts.append("**Mechanism.** " + study.mechanism_summary(results["mechanism"]))
        parts += narrative.mechanism_limitation(results["mechanism"], results["mechanism_followup"])
    if results["scaling_cpu"]:
        parts.append("**Scaling.** " + narrative.scaling_summary(results["scaling_cpu"]))
    if power := power_status(paths.results_dir(preset)):  # the pre-registered study's progress
        frontier = resolve(f"{paths.results_dir(preset)}/{POWER_PRESET}/{paths.FRONTIER_FILE}")
        answer = robust_answer_text(read_json_checked(frontier)) if frontier.exists() else ""
        parts.append(f"{power} {answer}".strip())  # and its answer from the lengths read
    if results["rank_law"]:
        parts.append("**What sets the rank** (docs/rank_law.md). "
                     + rank_law.summary_sentence(results["rank_law"]))  # fmt: skip
    cost = cost_table(preset, results)
    parts += [
        "**Verdicts.**\n\n" + narrative.verdicts(*(results[name] for name in present)),
        "**Targets.**",
        targets_table(results, cost).to_markdown(index=False),
        "**Training cost** (the runs behind these results; `timings.run_cpu_s` of each bench "
        "report, one thread per run; the notebooks and the scaling sweep come on top; "
        f"predicted: `python -m rpka cost --preset {preset}`, `rpka/study/cost.py`, each job's "
        "set-up, epochs of steps and validation passes and its test pass, timed by probes "
        "of a few steps per arm and seed count):",
        cost.to_markdown(index=False),
    ]
    return "\n\n".join(part for part in parts if part)  # a track without a control: ""


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between the markers replaced by ``block``."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"the file has no summary block: add the lines\n{BEGIN}\n{END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"
