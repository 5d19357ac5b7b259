"""The study index: ``study.json``, where the report and the README start, written from
the bench reports a study's results folder holds (each track's gate, primary arm and
verdicts; the long-context and long-range studies; the frontier extensions), and the rank
frontier (``frontier.json``) of the tracks whose attention gate passed.

Every location comes from ``rpka.paths``: the file names (``paths.BENCH_REPORT_FILE``,
``paths.STUDY_FILE``, ...) inside the folder given, which is a preset's results folder
(``paths.results_dir``) or a test's own. Also here: ``record_superseded``, what a bench's
rerun after a fix replaced, which the report shows beside the new result.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpka import paths
from rpka.config.bench import LongContextConfig
from rpka.config.presets import RECALL_PAIRS_EPOCHS, STUDY_TRACKS
from rpka.config.presets_longctx import V2_EVAL_SEEDS, power_as_run
from rpka.io import (
    TIMING_KEYS,
    read_json,
    read_json_checked,
    write_result_and_timings,
    write_result_json,
)
from rpka.kernel.spectrum import bench_spectrum
from rpka.paths import resolve
from rpka.study import longrange_v2
from rpka.study.progress import landed
from rpka.tracks import get_task
from rpka.verdict.decision import gate_passed
from rpka.verdict.frontier import (
    ROBUSTNESS_KEYS,
    LongRangeTiming,
    add_robustness,
    track_frontier,
    write_frontier,
)
from rpka.verdict.step_cost import step_ratio_of


def track_entry(report: dict[str, Any], report_path: Path, index_dir: Path) -> dict[str, Any]:
    """One track's line in ``study.json``: where its report is, its gate, its verdicts."""
    primary = report["arms"][report["primary_arm"]]["comparison"]
    return {
        "bench_report": os.path.relpath(report_path, index_dir),
        "preset": report["config"]["preset"],
        "metric": report["metric"],
        "attention_gate": report.get("attention_gate"),
        "local_gate": report.get("local_gate"),
        "primary_arm": report["primary_arm"],
        "primary": {
            k: primary.get(k)
            for k in ("verdict", "delta_mean", "ci_low", "ci_high", "p_value", "margin", "mde")
        },
        "verdicts": {
            name: arm["comparison"]["verdict"]
            for name, arm in report["arms"].items()
            if arm.get("comparison")
        },
        "run_time_s": report["timings"]["phases"]["total_s"],
        "learnability_met": report["learnability"].get("met"),
    }


# Benches that extend a study's rank frontier beyond its tracks' own arms (issue 26), read
# where they are: frontier name (also its folder in the study's results) -> title. They
# are not study tracks: `make report` does not run them (each one's preset says how).
FRONTIER_EXTENSIONS: dict[str, str] = {
    "forecast-motif-64": "Motif forecast track at 64 tokens (rank sweep)",
}


# MQAR against rank / pairs (issue 26): the recall track's bench and its pair-count
# variants (rpka.config.presets.RECALL_PAIRS_EPOCHS), read where they are in a study's results
MQAR_BENCHES: tuple[str, ...] = ("recall", *(f"recall-pairs-{p}" for p in RECALL_PAIRS_EPOCHS))


def extension_reports(out: Path) -> dict[str, Path]:
    """The :data:`FRONTIER_EXTENSIONS` benches the study in the results folder ``out`` has
    run -> their bench reports (each in the folder named after it)."""
    found = {name: out / name / paths.BENCH_REPORT_FILE for name in FRONTIER_EXTENSIONS}
    return {name: path for name, path in found.items() if path.exists()}


def extension_entries(out: Path) -> dict[str, dict[str, Any]]:
    """The :data:`FRONTIER_EXTENSIONS` benches found in the results folder ``out``: a
    :func:`track_entry` each, with ``title`` and ``attention_tokens`` (the primary arm's)."""
    entries = {}
    for name, path in extension_reports(out).items():
        report = read_json_checked(path, INDEX_KEYS)
        tokens = report["arms"][report["primary_arm"]].get("attention_tokens")
        entries[name] = {**track_entry(report, path, out), "title": FRONTIER_EXTENSIONS[name],
                         "attention_tokens": tokens}  # fmt: skip
    return entries


def write_study_index(
    preset: str, tracks: tuple[str, ...] = STUDY_TRACKS, out_dir: str | Path | None = None
) -> dict[str, Any]:
    """Write ``study.json`` in ``out_dir`` (default ``data/results/<preset>``,
    ``rpka.paths.study_json``) from the tracks' bench reports and the long-context result
    found there, and return it.

    Keys: ``preset``, ``tracks`` (``{<track>: track_entry}`` in the study's order; a track
    without a report yet is left out and named in ``missing``) and ``longctx`` (per
    context: a ``track_entry`` of its bench, or null without a long-context result) and
    ``longrange`` (:func:`longrange_entry`, from ``<out>/longrange/``, or null) and
    ``longrange_power`` (:func:`power_entry`, the pre-registered study, or null). The frontier
    (``frontier.json``) takes the tracks whose attention gate passed and the long-range
    lengths whose two-control gate passed (``longrange-<n>``), and the frontier extensions
    found there (``extensions``, :func:`extension_entries`) whose gate passed; the
    pre-registered study's gated complete lengths get a frontier of their own, in its folder.
    """
    out = resolve(out_dir or paths.results_dir(preset))
    entries, missing = track_entries(out, tracks)
    longctx = longctx_entry(out)
    longrange = longrange_entry(out / paths.LONGRANGE, out)
    extensions = extension_entries(out)
    power = power_entry(out)
    index = {
        "preset": preset, "tracks": entries, "missing": missing, "longctx": longctx,
        paths.LONGRANGE: longrange, POWER_KEY: power, DECISION_KEY: decision_entry(out),
        "extensions": extensions,
    }  # fmt: skip
    write_result_and_timings(out / paths.STUDY_FILE, index, TIMING_KEYS)
    # the rank frontier of the tracks that need attention (a gap to recover needs a gate)
    gated = {
        name: out / entry["bench_report"]
        for name, entry in (entries | extensions).items()
        if gate_passed(entry.get("attention_gate"), entry.get("local_gate"))
    }
    for report_path in gated.values():  # why: the kernel's spectrum on exact's trained heads
        spectrum_of(report_path.parent)
    # MQAR against rank / pairs: a curve needs the benches of two pair counts or more
    mqar = [p for name in MQAR_BENCHES if (p := out / name / paths.BENCH_REPORT_FILE).exists()]
    write_frontier(gated | longrange_gated(longrange, out), out / paths.FRONTIER_FILE,
                   latency_sweep(out),
                   mqar if len(mqar) > 1 else (),
                   longrange_positive_controls(longrange, out),
                   longrange_timings(longrange, out / paths.LONGRANGE, out),
                   step_timing=read_if_there(out / paths.TRACK_STEPTIME_FILE))  # fmt: skip
    write_power_frontier(power, out)
    return index


def track_entries(
    out: Path, tracks: tuple[str, ...]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each of ``tracks``' :func:`track_entry` from its bench report in the results folder
    ``out``, in order, and the tracks without a report yet."""
    entries, missing = {}, []
    for name in tracks:
        path = out / get_task(name).out_dir / paths.BENCH_REPORT_FILE
        report = read_if_there(path, INDEX_KEYS)
        if report is None:
            missing.append(name)
            continue
        entries[name] = track_entry(report, path, out)
    return entries, missing


def longctx_entry(out: Path) -> dict[str, Any] | None:
    """The long-context study in the results folder ``out``: per context a
    :func:`track_entry` of its bench; None without its ``longctx.json``."""
    longctx = read_if_there(out / paths.LONGCTX_FILE, ("per_context",))
    if longctx is None:
        return None
    contexts = {}
    for context, entry in longctx["per_context"].items():
        report = read_if_there(out / entry["bench_report"], INDEX_KEYS)
        if report is not None:
            contexts[context] = track_entry(report, out / entry["bench_report"], out)
    return {"contexts": contexts}


LONGRANGE_TRACK = "longrange-{context}"  # a long-range length's name in frontier.json
POWER_KEY = "longrange_power"  # the pre-registered long-range study's key in study.json
POWER_PROTOCOL = "docs/longrange_protocol.md"  # written before its runs
DECISION_KEY = "longrange_v2"  # the decision study's key in study.json (issue 53)


def longrange_entry(folder: Path, index_dir: Path) -> dict[str, Any] | None:
    """The long-range study's line in ``study.json`` (issue 27), from ``folder``'s own
    ``longctx.json`` (``python -m rpka longctx --preset longrange --out <folder>``): per
    context a :func:`longrange_line`, and ``longctx_json`` (its path). None without the
    file, never an error."""
    result = read_if_there(folder / paths.LONGCTX_FILE, ("per_context",))
    if result is None:
        return None
    timing = _steptime(folder, index_dir)
    contexts = {}
    for context, entry in result["per_context"].items():
        path = folder / entry["bench_report"]
        line = longrange_line(path, index_dir, LongRangeTiming(int(context), *timing))
        if line is not None:
            contexts[context] = line
    return {
        "longctx_json": os.path.relpath(folder / paths.LONGCTX_FILE, index_dir),
        "preset": result.get("preset"),
        "contexts": contexts,
    }


def power_entry(
    out: Path, configs: Sequence[LongContextConfig] | None = None
) -> dict[str, Any] | None:
    """The pre-registered long-range study's line in ``study.json`` (issue 40,
    docs/longrange_protocol.md; ``<out>/longrange-power/``; ``configs`` the study as run,
    one configuration per length, default ``power_as_run()``): ``landed`` (per length, the jobs
    in against those planned, ``rpka.study.progress.landed``) and, for each length whose
    every job is in - never before, the protocol reads no partial length - its
    :func:`longrange_line`; ``frontier_json``, the study's own frontier with its answer
    (written by :func:`write_study_index`). None where the study never started.

    A length is read from its bench report alone, since each invocation of the study
    (one per length) rewrites ``longctx.json`` with its own lengths."""
    configs = configs or power_as_run()
    preset = configs[0].preset
    folder = out / preset
    if not folder.exists():
        return None
    status = landed(configs, folder)
    timing = _steptime(folder, out)
    contexts = {}
    for row in (r for r in status if r["complete"]):
        path = folder / paths.longctx_context_dir(row["context"]) / paths.BENCH_REPORT_FILE
        line = longrange_line(path, out, LongRangeTiming(row["context"], *timing))
        if line is not None:
            contexts[str(row["context"])] = line
    return {
        "preset": preset,
        "protocol": POWER_PROTOCOL,
        "landed": status,
        "contexts": contexts,
        "frontier_json": os.path.relpath(folder / paths.FRONTIER_FILE, out),
    }


def decision_entry(out: Path) -> dict[str, Any] | None:
    """The decision study's line in ``study.json`` (issue 53, docs/longrange_protocol_v2.md;
    ``<out>/longrange-v2/``): its reading of the runs landed so far
    (``rpka.study.longrange_v2.read_study``, which rewrites ``longrange_v2.json``) - per arm
    its ``failures`` and ``relative_mse`` against exact, the control gate, each look's answers
    - and its pre-registered power. None where the study never started."""
    folder = longrange_v2.study_dir(out)
    if not (folder / longrange_v2.POWER_FILE).exists():
        return None
    result = longrange_v2.read_study(out)
    power = read_if_there(folder / longrange_v2.POWER_FILE)
    return {
        "protocol": longrange_v2.PROTOCOL,
        "reading_json": os.path.relpath(folder / longrange_v2.READING_FILE, out),
        "power_json": os.path.relpath(folder / longrange_v2.POWER_FILE, out),
        "seeds_planned": len(V2_EVAL_SEEDS),
        "seeds_complete": len(result["seeds_complete"]),
        "arms": result["arms"],
        "control_gate": result.get("control_gate"),
        "reading": result["reading"],
        "power": [row for row in (power or {}).get("scenarios", []) if row["n_seeds"] == 32],
    }


def _steptime(folder: Path, index_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The study's timing file beside it (``steptime.json``) and its path from the index."""
    timing = read_if_there(folder / paths.STEPTIME_FILE)
    return timing, os.path.relpath(folder / paths.STEPTIME_FILE, index_dir) if timing else None


def write_power_frontier(power: dict[str, Any] | None, out: Path) -> None:
    """The pre-registered study's own frontier with its answer (``power["frontier_json"]``)
    from its complete lengths whose two-control gate passed (its lengths still landing are
    named, ``pending_lengths``); nothing before one is."""
    if gated := longrange_gated(power, out):
        timings = longrange_timings(power, out / power["preset"], out)
        pending = [row["context"] for row in power["landed"] if not row["complete"]]
        write_frontier(
            gated, out / power["frontier_json"], longrange=timings, longrange_pending=pending
        )


def longrange_line(path: Path, index_dir: Path, timing: LongRangeTiming) -> dict[str, Any] | None:
    """One long-range length from its bench report ``path``: a :func:`track_entry` (both
    gates, every arm's verdict) with ``gate_passed`` (both gates), ``learnability`` (exact
    against the linear naive forecast), ``robustness`` per arm (issue 40: leave-one-seed-out,
    the CPU step ratio of the timing file, :func:`longrange_robustness`) and ``timing_file``.
    None without the report."""
    report = read_if_there(path, INDEX_KEYS)
    if report is None:
        return None
    line = track_entry(report, path, index_dir)
    line["gate_passed"] = gate_passed(line.get("attention_gate"), line.get("local_gate"))
    line["learnability"] = {
        k: report["learnability"].get(k)
        for k in ("ratio_to_linear", "linear_ratio_required", "meets_linear", "met")
    }
    line["timing_file"] = timing.timing_file
    line["robustness"] = longrange_robustness(report, timing)
    line["step_ratio_cpu"] = {  # every arm's, the controls' too (the robustness rows: low rank)
        arm: step_ratio_of(timing.timing, str(timing.context), arm) for arm in line["verdicts"]
    }
    return line


def longrange_robustness(report: dict[str, Any], timing: LongRangeTiming) -> dict[str, Any]:
    """Per low-rank arm of a long-range length (its frontier rows): ``verdict`` (gap
    recovered), the robustness keys (``rpka.verdict.frontier.ROBUSTNESS_KEYS``), ``step_ratio_cpu``
    and ``timing_file``; empty without a control arm to measure the gap from."""
    try:
        entry = track_frontier(report)
    except ValueError:  # no control arm: no gap, no verdict to test
        return {}
    add_robustness(entry, report, timing)
    keys = ("verdict", *ROBUSTNESS_KEYS, "step_ratio_cpu", "peak_ratio_step", "timing_file")
    return {row["arm"]: {k: row[k] for k in keys} for row in entry["rows"]}


def longrange_timings(
    longrange: dict[str, Any] | None, folder: Path, index_dir: Path
) -> dict[str, LongRangeTiming]:
    """The gated long-range lengths' timings for the frontier (``longrange-<n>`` ->
    :class:`rpka.verdict.frontier.LongRangeTiming`, from ``steptime.json`` beside the study)."""
    timing = read_if_there(folder / paths.STEPTIME_FILE)
    contexts = (longrange or {}).get("contexts") or {}
    return {
        LONGRANGE_TRACK.format(context=context): LongRangeTiming(
            int(context), timing, entry.get("timing_file")
        )
        for context, entry in contexts.items()
        if entry.get("gate_passed")
    }


def latency_sweep(out: Path) -> dict[str, Any] | None:
    """The latency sweep the cost at r* is read from: the study's own
    (``<out>/scaling_cpu.json``, 256 or 512 tokens and up) with the rows of the short-length
    sweep (``paths.SHORT_SCALING_JSON``: the short tracks' own lengths, 64 and 96 tokens)
    at lengths the study's does not measure; None without the study's own."""
    own = out / paths.SCALING_CPU_FILE
    if not own.exists():
        return None
    sweep = read_json(own)
    short = paths.resolve(paths.SHORT_SCALING_JSON)
    if short.exists():
        measured = {row["n"] for row in sweep["rows"]}
        sweep["rows"] += [row for row in read_json(short)["rows"] if row["n"] not in measured]
    return sweep


def longrange_positive_controls(longrange: dict[str, Any] | None, out: Path) -> dict[str, Path]:
    """The long-range lengths whose positive control ran as a study of its own
    (``<out>/longrange/positive_control/``, docs/longctx.md) where both that study's and
    the rank sweep's gates passed and the rank sweep has no positive control of its own
    (the ``longrange`` preset trains ``rpka-r4096`` beside its ranks): ``longrange-<n>`` ->
    its bench report."""
    folder = out / paths.LONGRANGE / paths.POSITIVE_CONTROL
    gated = longrange_gated(longrange, out)
    own = longrange_gated(longrange_entry(folder, out), out)
    return {
        track: path
        for track, path in own.items()
        if track in gated and not read_json(gated[track])["config"].get("positive_control_arm")
    }


def longrange_gated(longrange: dict[str, Any] | None, index_dir: Path) -> dict[str, Path]:
    """The long-range lengths whose two-control gate passed, as frontier tracks
    (``longrange-<n>`` -> bench report path)."""
    contexts = (longrange or {}).get("contexts") or {}
    return {
        LONGRANGE_TRACK.format(context=context): index_dir / entry["bench_report"]
        for context, entry in sorted(contexts.items(), key=lambda kv: int(kv[0]))
        if entry.get("gate_passed")
    }


# what a study index entry reads of a bench report (a report without one of them is
# named, CorruptFileError, instead of a KeyError deep in track_entry)
INDEX_KEYS = ("config", "metric", "arms", "primary_arm", "timings", "learnability")


def read_if_there(path: Path, required: tuple[str, ...] = ()) -> Any | None:
    """``path``'s JSON checked for ``required`` keys, or None where it is missing. A bad
    file raises ``CorruptFileError`` naming it and stays where it is: the study index is
    written from committed results too, and a reader of those never moves them."""
    return read_json_checked(path, required) if path.exists() else None


def spectrum_of(bench_out: Path) -> dict[str, Any] | None:
    """``spectrum.json`` of a bench (:func:`rpka.kernel.spectrum.bench_spectrum`): read when it is
    there, computed when exact's trained weights are (seconds), else None."""
    done = read_if_there(bench_out / paths.SPECTRUM_FILE, ("heads",))
    if done is not None:
        return done
    try:
        return bench_spectrum(bench_out)
    except FileNotFoundError:  # results without weights (e.g. a clone of the committed study)
        return None


def record_superseded(
    previous_report: str | Path, bench_dir: str | Path, reason: str, fix: str
) -> Path:
    """Keep what a rerun replaced, beside the new bench report: ``superseded.json``.

    A bench rerun after a bug fix overwrites ``bench_report.json``; the report then shows
    each arm before and after (:func:`rpka.report.narrative.superseded`). Stored per arm: the
    evaluation seeds' test scores and the comparison's delta, CI and verdict. ``reason``
    says what was wrong, ``fix`` where it was fixed (a commit, an issue).
    """
    if not reason.strip() or not fix.strip():
        raise ValueError("reason and fix must say what was wrong and where it was fixed")
    previous = read_json(resolve(previous_report))
    arms = {}
    for name, entry in previous["arms"].items():
        c = entry.get("comparison") or {}
        arms[name] = {
            "per_seed": entry["full"]["per_seed"],
            "mean": entry["full"]["mean"],
            **{k: c[k] for k in ("delta_mean", "ci_low", "ci_high", "verdict") if k in c},
        }
    out = resolve(bench_dir) / paths.SUPERSEDED_FILE
    superseded = {"reason": reason, "fix": fix, "metric": previous["metric"], "arms": arms}
    write_result_json(out, superseded)
    return out
