"""Where things live: the one owner of the study's file layout.

Every result, figure and report path is a function or constant here, named by preset and,
for a file of one track's bench, by that track's folder (``track_dir``: its task's
``out_dir``, e.g. ``get_task("lm").out_dir``; this module sits below the tracks). Relative
paths in configs and notebook parameters are relative to the repository root, so a notebook
opened in JupyterLab (cwd ``notebooks/``) and one run by papermill (cwd the root) read and
write the same files."""

from __future__ import annotations

import os
from pathlib import Path


def _find_root() -> Path:
    env = os.environ.get("RPKA_ROOT")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").exists():
        return here
    return Path.cwd().resolve()


REPO_ROOT = _find_root()


def resolve(path: str | os.PathLike) -> Path:
    """An absolute path: relative paths are taken from the repository root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


# --------------------------------------------------------------------------- the layout
# Every result, figure and report path of the study comes from here (relative to the root;
# ``resolve`` makes them absolute). Notebooks get theirs as parameters (rpka.study.steps).

DATA_CACHE = "data/cache"  # the tracks' generated data
RESULTS = "data/results"
SCALING_RESULTS = f"{RESULTS}/scaling"  # latency sweeps, shared by every preset
FIGURES = "figures"
REPORTS = "reports"
NOTEBOOKS = "notebooks"


# the committed study (git keeps its reports): a command writes there only when told to by
# name, never as its default
COMMITTED_RESULTS = f"{RESULTS}/full"

# the names of a study's result files, wherever their folder is (a preset's results folder,
# a bench's folder, a test's temporary one); the functions below place them for a preset
BENCH_REPORT_FILE = "bench_report.json"  # in a bench's folder
MECHANISM_FILE = "mechanism.json"  # beside a bench's report
SPECTRUM_FILE = "spectrum.json"  # beside a bench's report (rpka.kernel.spectrum)
SUPERSEDED_FILE = "superseded.json"  # beside a bench's report: what a rerun replaced
DROP_IN_FILE = "drop_in.json"  # beside a bench's report (rpka.study.dropin)
STUDY_FILE = "study.json"  # in a study's results folder
FRONTIER_FILE = "frontier.json"  # in a study's results folder
LONGCTX_FILE = "longctx.json"  # in a long-context study's folder
STEPTIME_FILE = "steptime.json"  # beside it: every arm's step timed (rpka.study.steptime)
TRACK_STEPTIME_FILE = "steptime_tracks.json"  # a study's short tracks' steps, timed alike
COST_MODEL_FILE = "cost_model.json"  # a study's price (python -m rpka cost), beside its results
POSITIVE_CONTROL = "positive_control"  # in a long-range folder: a positive control's own study
SCALING_CPU_FILE = "scaling_cpu.json"  # in a study's results folder: its latency sweep
SWAP_AUDIT_FILE = "swap_audit.json"  # in a study's results folder: rpka.swap's audit
# the rank-law study (issue 41): run once, into the committed results; every preset's report
# reads it (docs/rank_law.md)
RANK_LAW_RESULTS = f"{COMMITTED_RESULTS}/rank_law"
RANK_LAW_JSON = f"{RANK_LAW_RESULTS}/rank_law.json"


# A user's run (`make report`, `python -m rpka report`) writes under OUT, which git ignores:
# out/<preset>/results (the runs and result files), out/<preset>/figures, and the executed
# notebooks with the HTML report in out/<preset>/. The committed study (data/results/<preset>,
# figures/<preset>) is the reference it is compared with; only `report --publish` (`make
# publish`) writes there. The command sets OUTPUT_ENV, so its notebook kernels see the same.
OUT = "out"
OUTPUT_ENV = "RPKA_OUTPUT"  # the output folder of this run; unset: the committed layout
# set with OUTPUT_ENV by `report --from-results`: the results are read from the committed
# study, only the figures and the report go to the output folder
READ_COMMITTED_ENV = "RPKA_READ_COMMITTED"


def output_root() -> str | None:
    """The folder a user's run writes under (``out``), or None: the committed layout."""
    return os.environ.get(OUTPUT_ENV) or None


def committed_results_dir(preset: str) -> str:
    """``data/results/<preset>``: the committed study's result files (the reference)."""
    return f"{RESULTS}/{preset}"


def committed_figures_dir(preset: str) -> str:
    """``figures/<preset>``: the committed study's figures."""
    return f"{FIGURES}/{preset}"


def output_dir(preset: str) -> str | None:
    """``out/<preset>``: a user's run of ``preset`` (None under the committed layout)."""
    root = output_root()
    return f"{root}/{preset}" if root else None


def results_dir(preset: str) -> str:
    """The study's result files: ``out/<preset>/results`` for a user's run (unless it reads
    the committed study, ``report --from-results``), else ``data/results/<preset>``."""
    out = output_dir(preset)
    if out is None or os.environ.get(READ_COMMITTED_ENV):
        return committed_results_dir(preset)
    return f"{out}/results"


def bench_dir(preset: str, track_dir: str = "") -> str:
    """The bench's folder: ``data/results/<preset>``, plus ``/<track_dir>`` for a track
    with its own folder (a task's ``out_dir``, e.g. ``lm``)."""
    base = results_dir(preset)
    return f"{base}/{track_dir}" if track_dir else base


def bench_report(preset: str, track_dir: str = "") -> str:
    return f"{bench_dir(preset, track_dir)}/{BENCH_REPORT_FILE}"


def frontier_json(preset: str) -> str:
    """The rank frontier of the study's gated tracks (``rpka.verdict.frontier``):
    ``data/results/<preset>/frontier.json``."""
    return f"{results_dir(preset)}/{FRONTIER_FILE}"


def study_json(preset: str) -> str:
    """The study index (every track's bench report, attention gate, primary arm and
    verdicts): ``data/results/<preset>/study.json``; where the report and README start."""
    return f"{results_dir(preset)}/{STUDY_FILE}"


def mechanism_json(preset: str, track_dir: str = "") -> str:
    """The mechanism study a bench wrote beside its report
    (``rpka.bench.studies.study_mechanism``)."""
    return f"{bench_dir(preset, track_dir)}/{MECHANISM_FILE}"


def mechanism_followup_json(preset: str, track_dir: str = "") -> str:
    """scripts/mechanism_followup.py's result beside a bench's mechanism study (optional)."""
    return f"{bench_dir(preset, track_dir)}/mechanism_followup.json"


def demo_run_dir(preset: str) -> str:
    """Where 01_train's two demo runs are cached: ``data/results/<preset>/train``."""
    return f"{results_dir(preset)}/train"


def longctx_json(preset: str) -> str:
    return f"{results_dir(preset)}/{LONGCTX_FILE}"


def longrange_dir(preset: str) -> str:
    """The long-range study's folder (issue 27: ``python -m rpka longctx --preset longrange
    --out <this>``), its own ``longctx.json`` inside: ``data/results/<preset>/longrange``."""
    return f"{results_dir(preset)}/{LONGRANGE}"


LONGRANGE = "longrange"  # the long-range study's folder in a study's results, and its key


def long_context_dir(preset: str, long_range: bool) -> str:
    """Where a study's long-context step writes: the long-range study's folder when that
    study is a long-range one (``long_range``: its gate needs the local control - the
    standard study), else the study's results folder (``full``'s forecast-regimes study
    and the previews)."""
    return longrange_dir(preset) if long_range else results_dir(preset)


def long_context_json(preset: str, long_range: bool) -> str:
    """The ``longctx.json`` of a study's long-context step (:func:`long_context_dir`)."""
    return f"{long_context_dir(preset, long_range)}/{LONGCTX_FILE}"


def longctx_context_dir(context: int) -> str:
    """One long-context bench's folder, relative to the study's results folder."""
    return f"longctx/context-{context}"


def scaling_cpu_json(preset: str) -> str:
    """The CPU latency sweep a study preset re-measures."""
    return f"{results_dir(preset)}/{SCALING_CPU_FILE}"


SHORT_SCALING_JSON = f"{SCALING_RESULTS}/short_cpu.json"  # the short tracks' own lengths


def scaling_json(name: str) -> str:
    """A latency sweep of ``rpka.speed.scaling``'s preset ``name``:
    ``data/results/scaling/<name>.json``."""
    return f"{SCALING_RESULTS}/{name}.json"


def decode_json(device: str = "cpu") -> str:
    return f"{SCALING_RESULTS}/decode_{device}.json"


GPU_SCALING_JSON = f"{SCALING_RESULTS}/gpu_h200.json"
# causal RPKA against exact causal SDPA (scripts/bench_causal.py, issue 55)
CAUSAL_CPU_JSON = f"{SCALING_RESULTS}/causal_cpu.json"
ARMS_LATENCY_JSON = f"{SCALING_RESULTS}/arms_full_cpu.json"


def swap_audit_json(preset: str) -> str:
    """The ``rpka.swap`` audit of the example model (notebook 07, issue 42):
    ``data/results/<preset>/swap_audit.json``."""
    return f"{results_dir(preset)}/{SWAP_AUDIT_FILE}"


def figures_dir(preset: str) -> str:
    """``out/<preset>/figures`` for a user's run, else ``figures/<preset>``."""
    out = output_dir(preset)
    return f"{out}/figures" if out else committed_figures_dir(preset)


def report_dir(preset: str) -> str:
    """The executed notebooks and a copy of the HTML report: ``out/<preset>`` for a user's
    run, else ``reports/<preset>``."""
    return output_dir(preset) or f"{REPORTS}/{preset}"


def report_html(preset: str) -> str:
    """The report of a user's run (``out/<preset>/rpka_report.html``), else the latest
    report's copy at ``reports/rpka_report.html``."""
    out = output_dir(preset)
    return f"{out}/rpka_report.html" if out else REPORT_HTML


def committed_report_html(preset: str) -> str:
    """Where a published study's report is committed: ``docs/rpka_report_<preset>.html``."""
    return f"docs/rpka_report_{preset}.html"


REPORT_HTML = f"{REPORTS}/rpka_report.html"
# the presets whose study is committed (results, figures, report): only these are published
PUBLISHED_PRESETS = ("standard", "full")
# in a user's run folder: its comparison with the committed study (rpka.study.reproduction)
REPRODUCTION_FILE = "reproduction.json"
# the full study's report as committed (git keeps it; reports/ is not kept)
COMMITTED_REPORT_HTML = "docs/rpka_report_full.html"
