"""The long-range decision study (issue 53, docs/longrange_protocol_v2.md): its power from
the pilot, and its reading from the run files, seed by seed.

``python -m rpka decision power`` writes ``power.json`` (before the runs: the protocol
quotes it); ``python -m rpka decision read`` reads whatever runs have landed under
``data/results/full/longrange-v2/`` by the protocol's group-sequential rule
(``rpka.verdict.longrange_v2``) into ``longrange_v2.json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rpka import paths
from rpka.config.presets_longctx import (
    POWER_PRESET,
    V2_CONTEXT,
    V2_EVAL_SEEDS,
    V2_INTERIM_SEEDS,
    V2_PRESET,
    get_longctx_preset,
)
from rpka.io import read_json, write_result_json
from rpka.verdict import longrange_v2 as rule

PROTOCOL = "docs/longrange_protocol_v2.md"
POWER_FILE = "power.json"
READING_FILE = "longrange_v2.json"
QUESTION_ARMS = ("exact", "rpka-r64", "nystrom-uniform-r64")  # the two questions' arms
CONTROL_ARM = "mean-attention"  # the negative control
POWER_SEEDS = (32, 48, 64)  # the registered 32 and what more seeds would buy
POWER_SIMULATIONS = 2000


def study_dir(results: str | Path = paths.COMMITTED_RESULTS) -> Path:
    """The study's folder: ``<results>/longrange-v2``."""
    return Path(results) / V2_PRESET


def pilot_mse(results: str | Path = paths.COMMITTED_RESULTS) -> dict[str, list[float]]:
    """Per arm, the pilot's per-seed test MSE at 4,096 tokens (the 16-seed study of
    docs/longrange_protocol.md, seeds 200-215), read from its bench report."""
    report = Path(results) / POWER_PRESET / paths.longctx_context_dir(V2_CONTEXT)
    arms = read_json(report / paths.BENCH_REPORT_FILE)["arms"]
    return {name: list(arms[name]["full"]["per_seed"]) for name in arms}


def write_power(results: str | Path = paths.COMMITTED_RESULTS, n_sims: int = POWER_SIMULATIONS
                ) -> dict[str, Any]:  # fmt: skip
    """The protocol's power table from the pilot (:func:`rpka.verdict.longrange_v2.
    power_scenarios`), written to ``<study>/power.json``."""
    pilot = pilot_mse(results)
    result = {
        "protocol": PROTOCOL,
        "pilot": {name: rule.failure_count(pilot[name]) for name in pilot},
        "pilot_reading": rule.read_questions({a: pilot[a] for a in QUESTION_ARMS}, rule.ALPHA),
        "failure_mse": rule.FAILURE_MSE,
        "relative_margin": rule.RELATIVE_MARGIN,
        "nominal_alphas": dict(zip(("interim", "final"), rule.obf_nominal_alphas(), strict=True)),
        "n_sims": n_sims,
        "scenarios": rule.power_scenarios(
            {a: pilot[a] for a in QUESTION_ARMS}, POWER_SEEDS, n_sims
        ),
    }
    write_result_json(study_dir(results) / POWER_FILE, result)
    return result


def power_lines(result: Mapping[str, Any]) -> list[str]:
    """The power table as Markdown rows (the protocol quotes them)."""
    lines = [
        "| new seeds | truth | Q1 pivoting better | Q1 uniform better | Q2 non-inferior "
        "| Q2 inferior | stop at interim |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["scenarios"]:
        cells = [row.get(k, 0.0) for k in ("q1: pivoting better", "q1: uniform better",
                                             "q2: non-inferior", "q2: inferior",
                                             "stopped at interim")]  # fmt: skip
        lines.append(f"| {row['n_seeds']} | {row['truth']} | "
                     + " | ".join(f"{c:.2f}" for c in cells) + " |")  # fmt: skip
    return lines


def landed_mse(folder: Path, arms: Sequence[str]) -> dict[str, dict[int, float]]:
    """Per arm, the test MSE of every evaluation seed whose run has landed in ``folder``
    (a diverged member: +inf, a failure by the protocol)."""
    runs = folder / paths.longctx_context_dir(V2_CONTEXT) / "runs"
    found: dict[str, dict[int, float]] = {arm: {} for arm in arms}
    for path in sorted(runs.glob("*.json")) if runs.exists() else []:
        run = read_json(path)
        if run["split"] != "test" or run["arm"] not in found:
            continue
        for member in run["members"]:
            mse = member["final"]["test"]["mse"] if member["status"] == "ok" else None
            found[run["arm"]][member["seed"]] = float("inf") if mse is None else float(mse)
    return found


def read_study(results: str | Path = paths.COMMITTED_RESULTS) -> dict[str, Any]:
    """The protocol's reading of the landed runs, written to ``<study>/longrange_v2.json``:
    per arm its failures (Clopper-Pearson) and relative MSE against exact; the two
    questions at the interim look (once its 16 seeds are in for every arm) and the final
    one (all 32), by the group-sequential rule; the negative control's failures; and the
    pilot pooled in as a secondary reading (48 seeds)."""
    folder = study_dir(results)
    arms = get_longctx_preset(V2_PRESET).bench.design.arm_names
    found = landed_mse(folder, arms)
    complete = [s for s in V2_EVAL_SEEDS if all(s in found[a] for a in arms)]
    # the seeds a look may read: the interim's until every seed is in (the final phase's
    # seeds stay unread while it runs, so no partial final result is ever shown)
    shown = complete
    if len(complete) < len(V2_EVAL_SEEDS):
        shown = [s for s in complete if s in V2_INTERIM_SEEDS]
    per_arm = {}
    exact = [found["exact"][s] for s in shown]
    for arm in arms:
        arm_mse = [found[arm][s] for s in shown]
        per_arm[arm] = {
            "seeds": len(shown),
            "failures": rule.failure_count(arm_mse) if shown else None,
            "relative_mse": rule.relative_mse(arm_mse, exact) if arm != "exact" and shown else None,
        }
    result: dict[str, Any] = {
        "protocol": PROTOCOL,
        "seeds_landed": {arm: sorted(found[arm]) for arm in arms},
        "seeds_complete": complete,
        "arms": per_arm,
        "reading": None,
    }
    interim = len(V2_INTERIM_SEEDS)
    if all(s in complete for s in V2_INTERIM_SEEDS):
        ordered = [s for s in V2_EVAL_SEEDS if s in shown]
        gate = rule.control_gate([found[CONTROL_ARM][s] for s in ordered])
        result["control_gate"] = gate
        mse = {a: [found[a][s] for s in ordered] for a in QUESTION_ARMS}
        if not gate["passed"]:  # the task did not need attention on these seeds
            write_result_json(folder / READING_FILE, result)
            return result
        reading = rule.sequential_reading(mse, interim)  # a final look only on every seed
        look = "final" if reading["final"] is not None else "interim"
        seeds = ordered if look == "final" else ordered[:interim]
        flips = rule.one_seed_decides(
            {a: mse[a][: len(seeds)] for a in QUESTION_ARMS}, reading[look]["alpha"]
        )
        # per question, each seed that decides it and the answer without it (JSON keys: seeds)
        reading["decided_by_one_seed"] = {
            q: {str(seeds[i]): answer for i, answer in v.items()} for q, v in flips.items()
        }
        result["reading"] = reading
        pilot = pilot_mse(results)
        pooled = {a: [*pilot[a], *mse[a]] for a in QUESTION_ARMS}
        result["pooled_with_pilot"] = {
            "seeds": len(pooled["exact"]),
            "reading": rule.read_questions(pooled, rule.ALPHA),
            "note": "secondary: the pilot fixed the failure threshold, so it is not independent",
        }
    write_result_json(folder / READING_FILE, result)
    return result


def reading_lines(result: Mapping[str, Any]) -> list[str]:
    """One line per arm and per answered question, for the terminal."""
    lines = [f"seeds complete for every arm: {len(result['seeds_complete'])} of "
             f"{len(V2_EVAL_SEEDS)}"]  # fmt: skip
    for arm, row in result["arms"].items():
        if row["failures"] is None:
            continue
        f = row["failures"]
        text = f"{arm}: failed {f['k']}/{f['n']} [{f['ci_low']:.2f}, {f['ci_high']:.2f}]"
        rel = row["relative_mse"]
        if rel and rel["median"] is not None:
            bound = "-" if rel["bound"] is None else f"{rel['bound']:.3f}"
            text += (f"; MSE / exact median {rel['median']:.3f} (bound {bound}, "
                     f"{rel['pairs']} pairs)")  # fmt: skip
        lines.append(text)
    reading = result["reading"]
    gate = result.get("control_gate")
    if gate is not None:
        verdict = "passed" if gate["passed"] else "FAILED"
        lines.append(f"control gate ({CONTROL_ARM} failed {gate['k']}/{gate['n']}, lower bound "
                     f"{gate['ci_low']:.2f}): {verdict}")  # fmt: skip
    if reading is None and gate is not None and not gate["passed"]:
        lines.append("nothing is read: the negative control learned on too many seeds")
        return lines
    if reading is None:
        lines.append(f"no look yet: the interim needs seeds {V2_INTERIM_SEEDS[0]}-"
                     f"{V2_INTERIM_SEEDS[-1]} for every arm")  # fmt: skip
        return lines
    for look in ("interim", "final"):
        if reading[look] is not None:
            q = reading[look]
            lines.append(f"{look} look (alpha {q['alpha']:.4f}): Q1 {q['q1']['answer']}; "
                         f"Q2 {q['q2']['answer']}")  # fmt: skip
    for q in ("q1", "q2"):
        if without := without_seed(reading, q):
            lines.append(f"{q.upper()}'s answer changes {without}")
    lines.append(f"study: {reading['stopped_at']}")
    return lines


def without_seed(reading: Mapping[str, Any], question: str) -> str:
    """``"without seed 323 or 327 (to inferior)"``: the seeds one of which, left out,
    changes ``question``'s answer, and what it becomes ("" where no one seed decides it)."""
    flips = reading.get("decided_by_one_seed", {}).get(question) or {}
    if not flips:
        return ""
    seeds = list(flips)
    names = ", ".join(seeds[:-1]) + (" or " if len(seeds) > 1 else "") + seeds[-1]
    return f"without seed {names} (to {' / '.join(sorted(set(flips.values())))})"
