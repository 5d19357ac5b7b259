"""The report page (``notebooks/06_report``): the header (title, commit, date, preview
banner), the study index, numbered figures with captions and alt text, the targets table.

Every number is read from a result file. The study index ``data/results/<preset>/
study.json`` (``rpka.paths.study_json``) names each track's bench report, attention gate,
primary arm and verdicts; without it (a study run before the index existed) the index is
rebuilt from the study tracks' bench reports. Keys that older result files lack are read
with ``.get`` and the text says what is missing.
"""

from __future__ import annotations

import base64
import html
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import HTML
from matplotlib.figure import Figure

from rpka import paths
from rpka.config.presets import PREVIEW_PRESETS, STUDY_TRACKS
from rpka.io import figure_png, read_json_checked, save_figure, saved_path
from rpka.report import readme
from rpka.report.figures_headline import primary_comparison
from rpka.study import steps as study
from rpka.tracks import get_task
from rpka.verdict import stats
from rpka.verdict.step_cost import with_step_timing

# --------------------------------------------------------------------------- page


def inline_html(markdown: str) -> str:
    """A one-paragraph caption in Markdown (``code``, **bold**, *italic*) as escaped HTML."""
    out = html.escape(markdown, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
    return re.sub(r"(?<![\w*])\*([^*]+)\*(?![\w*])", r"<i>\1</i>", out)


@dataclass
class Figures:
    """Numbers the report's figures and shows each as ``<figure>`` with an embedded PNG,
    alt text and a caption that states its message.

    With ``figures_dir``, every figure shown is a file there and the page embeds that
    file's bytes: a figure its plotting function saved (and did not change after) as
    saved; one changed since, saved again to its file; one never saved, written as
    ``<name>.png`` (``name``: the caller's, else ``report_figure_<n>``). ``files`` maps
    each figure's number to its file.
    """

    count: int = 0
    figures_dir: str | Path | None = None
    files: dict[int, Path] = field(default_factory=dict)

    def show(self, fig: Figure, caption: str, alt: str, name: str | None = None) -> HTML:
        """The figure as HTML (the matplotlib figure is closed, so the notebook's inline
        backend does not show it a second time without alt text)."""
        self.count += 1
        if self.figures_dir is not None:
            path = saved_path(fig)
            if path is None or fig.stale:  # never saved, or changed since: (re)written
                stem = path.stem if path is not None else name or f"report_figure_{self.count}"
                path = save_figure(fig, path.parent if path is not None else self.figures_dir,
                                   stem)  # fmt: skip
            self.files[self.count] = path
        png = base64.b64encode(figure_png(fig)).decode("ascii")
        plt.close(fig)
        return HTML(
            f'<figure id="figure-{self.count}" style="margin:1.5em 0">'
            f'<img alt="{html.escape(alt, quote=True)}" '
            f'src="data:image/png;base64,{png}" style="max-width:100%"/>'
            f"<figcaption><b>Figure {self.count}.</b> {inline_html(caption)}</figcaption>"
            "</figure>"
        )


def provenance(root: Path = paths.REPO_ROOT) -> dict[str, str]:
    """The commit the report was rendered from (short hash, its date, uncommitted changes)
    and the time of rendering (UTC)."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        commit = git("rev-parse", "--short=10", "HEAD")
        date = git("log", "-1", "--format=%cd", "--date=short")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except OSError:  # no git on this machine
        commit, date, dirty = "", "", False
    return {
        "commit": commit or "unknown",
        "commit_date": date or "unknown",
        "dirty": "yes" if dirty else "no",
        "rendered": now,
    }


def page_title(preset: str, commit: str) -> str:
    """The HTML ``<title>``."""
    kind = "preview" if preset in PREVIEW_PRESETS else "study"
    return f"RPKA {kind} report ({preset} preset, commit {commit})"


def header(preset: str, study: Mapping[str, Any], source: Mapping[str, str]) -> str:
    """The line under the title: preset, commit and dates, where the results come from;
    then the preview banner for a preview preset."""
    dirty = " with uncommitted changes" if source["dirty"] == "yes" else ""
    line = (
        f"*Preset `{preset}` · commit `{source['commit']}` of {source['commit_date']}{dirty} · "
        f"rendered {source['rendered']} · results from `{study['source']}`.*"
    )
    return line + ("\n\n" + preview_banner(preset, study) if preset in PREVIEW_PRESETS else "")


def preview_banner(preset: str, study: Mapping[str, Any]) -> str:
    """What a smoke or quick report is: a preview that cannot reach significance."""
    n_pairs = sorted(
        {c["n_pairs"] for t in study["tracks"].values() if (c := t["comparison"]) is not None}
    )
    floors = ", ".join(
        f"{stats.sign_flip_floor(n, 'two-sided'):.3g} with {n} pairs" for n in n_pairs if n
    )
    return (
        f"> **Preview, not a result.** The `{preset}` preset runs the whole study with tiny "
        "models, few training steps and few seeds, to check that every step works. Its "
        "verdicts are printed as the rule gives them, but they **draw no conclusions**: the "
        f"smallest p-value the sign-flip test can give is {floors or 'undefined'}, and the "
        "models are far from trained. The study's answer is the committed report of the "
        f"`full` preset, `{paths.COMMITTED_REPORT_HTML}` in the repository (`python -m rpka "
        "report --from-results` renders it again from the committed results, in about a "
        "minute)."
    )


# --------------------------------------------------------------------------- study index


def _entry(
    name: str, report: Mapping[str, Any], indexed: Mapping[str, Any], bench: Path
) -> dict[str, Any]:
    gate = indexed.get("attention_gate", report.get("attention_gate"))
    superseded = bench.parent / study.SUPERSEDED_FILE  # what a rerun after a fix replaced
    return {
        "name": name,
        "title": get_task(report["track"]).text.title,
        "report": report,
        "primary_arm": indexed.get("primary_arm", report["primary_arm"]),
        "attention_gate": gate,
        "gate": "none" if gate is None else ("passed" if gate["passed"] else "failed"),
        "decision": report.get("decision") or {},
        "comparison": primary_comparison(report),
        "run_time_s": indexed.get("run_time_s", report["timings"].get("run_wall_s")),
        "superseded": (
            read_json_checked(superseded, ("reason", "fix", "metric", "arms"))
            if superseded.exists()
            else None
        ),
    }


# what a bench report must hold for the page to read it (an older report lacks the rest)
BENCH_REPORT_KEYS = ("track", "arms", "baseline_arm", "primary_arm")


def load_study(study_json: str | Path, preset: str, compute: bool = True) -> dict[str, Any]:
    """The study index with every track's bench report loaded.

    Returns {"preset", "source", "tracks": {name: entry}, "longctx", "longrange",
    "longrange_power" (the pre-registered long-range study, ``study.power_entry``),
    "longrange_v2" (the decision study, ``study.decision_entry``), "extensions"}
    (the frontier extensions' index entries, ``study.extension_entries``); each
    track entry has
    ``report`` (the bench report), ``gate`` ("passed", "failed", or "none" for a track
    without a control or an older report), ``attention_gate``, ``decision``,
    ``comparison`` (the primary arm's), ``run_time_s`` and ``superseded`` (what a rerun
    after a fix replaced, ``study.record_superseded``; None if none). Tracks are ordered:
    gate passed, no gate, gate failed (the Summary's order).
    """
    path = paths.resolve(study_json)
    tracks: dict[str, dict[str, Any]] = {}
    timing = optional_json(path.parent / paths.TRACK_STEPTIME_FILE)  # the steps' cost, timed
    if path.exists():
        index = read_json_checked(path, ("tracks",))
        for name, indexed in index["tracks"].items():
            bench = path.parent / indexed["bench_report"]
            if not bench.exists():
                raise FileNotFoundError(f"{path} names {indexed['bench_report']}: not found")
            report = with_step_timing(read_json_checked(bench, BENCH_REPORT_KEYS), timing)
            tracks[name] = _entry(name, report, indexed, bench)
        source, longctx = str(study_json), index.get("longctx")
        longrange, extensions = index.get("longrange"), index.get("extensions") or {}
        power, decision = index.get("longrange_power"), index.get("longrange_v2")
    else:  # an index-less study: the study tracks' bench reports where they exist
        for name in STUDY_TRACKS:
            bench = paths.resolve(paths.bench_report(preset, get_task(name).out_dir))
            if bench.exists():
                report = with_step_timing(read_json_checked(bench, BENCH_REPORT_KEYS), timing)
                tracks[name] = _entry(name, report, {}, bench)
        source, longctx = f"{paths.results_dir(preset)} (no study.json)", None
        longrange, extensions, power, decision = None, {}, None, None
    if not tracks and preset not in study.SCALING_PRESET:  # not a study preset
        raise FileNotFoundError(
            f"no study index {path} and no bench report of preset {preset!r}: run "
            f"`python -m rpka report --preset {preset}`"
        )
    if not tracks:  # nothing run yet (a fresh clone): compute the benches, saying so
        for name in STUDY_TRACKS:
            bench = paths.resolve(paths.bench_report(preset, get_task(name).out_dir))
            result = study.load_result(bench, preset, compute=compute)
            tracks[name] = _entry(name, result, {}, bench)
    order = {"passed": 0, "none": 1, "failed": 2}
    ordered = sorted(tracks.values(), key=lambda t: order[t["gate"]])
    return {
        "preset": preset,
        "source": source,
        "tracks": {t["name"]: t for t in ordered},
        "longctx": longctx,
        "longrange": longrange,
        "longrange_power": power,
        "longrange_v2": decision,
        "extensions": extensions,
    }


def optional_json(path: str | Path) -> Any | None:
    """A result file's content, or None where the study has not written it."""
    resolved = paths.resolve(path)
    return read_json_checked(resolved) if resolved.exists() else None


def targets(
    study: Mapping[str, Any],
    mechanism: Mapping[str, Any] | None,
    scaling: Mapping[str, Any] | None,
    decode: Mapping[str, Any] | None,
    gpu: Mapping[str, Any] | None,
    causal: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """The study's targets table (``rpka.report.readme.targets_table``) for these results;
    ``causal``: causal RPKA's bench (``scripts/bench_causal.py``)."""
    results: dict[str, Any] = dict.fromkeys(STUDY_TRACKS)
    results |= {name: t["report"] for name, t in study["tracks"].items()}
    results |= {"mechanism": mechanism, "scaling_cpu": scaling, "decode": decode}
    results["causal_cpu"] = causal
    results["longctx"] = readme.timed_longctx(
        optional_json(paths.longctx_json(study["preset"])), paths.results_dir(study["preset"])
    )
    cost = readme.cost_table(study["preset"], results)
    return readme.targets_table({**results, "scaling_gpu": gpu}, cost)
