"""The main job: run the numbered notebooks with papermill and render the HTML report.

    python -m rpka report --preset {smoke,quick,full}

Each notebook in ``notebooks/`` runs from a fresh kernel with the preset's parameters
(papermill), and its executed copy is kept under ``reports/<preset>/``. Notebooks exchange
results only through files whose paths are parameters, and the study's files are computed
before any notebook runs (and no two notebooks write the same file), so they run
``parallel`` at a time - a kernel's start and imports are single-threaded, and on 2 cores
two at a time halve the wait. Side by side, the last notebook (the report, the longest)
starts first and the others in order beside it; one at a time, they run in order. No
notebook starts after one has failed; the run stops naming the failing notebook and the
cell, and renders nothing. The last notebook is rendered to one self-contained HTML file
(code hidden, images embedded, no script) at ``reports/<preset>/rpka_report.html``, beside
the executed notebooks, with a copy of the latest at ``reports/rpka_report.html``.
"""

from __future__ import annotations

import ast
import html
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import papermill
import zmq
from jupyter_client import KernelManager
from nbconvert import HTMLExporter
from papermill.exceptions import PapermillExecutionError
from traitlets.config import Config

from rpka import paths, report
from rpka.io import atomic_write_text
from rpka.paths import REPO_ROOT, resolve
from rpka.study import notebook_parameters

NOTEBOOK_DIR = resolve(paths.NOTEBOOKS)
REPORT_DIR = resolve(paths.REPORTS)
PRESETS = ("smoke", "quick", "full")


class PipelineError(RuntimeError):
    """A notebook failed or was given parameters it does not declare."""


@dataclass
class Step:
    """One notebook run: where it comes from, where its executed copy goes, its parameters."""

    notebook: Path
    output: Path
    parameters: dict = field(default_factory=dict)
    seconds: float = 0.0


def declared_parameters(notebook: str | Path) -> dict[str, dict]:
    """The names (and defaults) in the notebook's cell tagged ``parameters``."""
    return papermill.inspect_notebook(str(notebook))


def check_parameters(notebook: str | Path, parameters: dict) -> None:
    """Reject names the notebook does not declare (papermill itself only warns) and values
    whose type is not their default's (they would fail late, cells into the run)."""
    declared = declared_parameters(notebook)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise PipelineError(
            f"{Path(notebook).name}: unknown parameter(s) {unknown}; the notebook declares "
            f"{sorted(declared)}"
        )
    for name, value in parameters.items():
        default = ast.literal_eval(declared[name]["default"])  # literals only (a test checks)
        if not _same_type(value, default):
            raise PipelineError(
                f"{Path(notebook).name}: parameter {name} must be a {type(default).__name__} "
                f"like its default {default!r}, got {value!r}"
            )


def _same_type(value: object, default: object) -> bool:
    """``value`` can stand for ``default``: same type, an int for a float; any for None."""
    if default is None:
        return True
    if type(default) is float:
        return type(value) in (int, float)
    return type(value) is type(default)


def kernel_config() -> Config:
    """Curve-encrypted kernel sockets where jupyter_client and zmq offer them (the python3
    kernelspec declares support): over plain TCP, ipykernel warns at every start that the
    traffic is unencrypted (six warnings per report)."""
    if zmq.has("curve") and KernelManager.class_traits().get("transport_encryption"):
        return Config({"KernelManager": {"transport_encryption": "auto"}})
    return Config()


def run_notebook(step: Step, progress: bool = True) -> Step:
    """Execute one notebook with papermill; raise ``PipelineError`` naming the failing cell."""
    check_parameters(step.notebook, step.parameters)
    step.output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(step.notebook),
            str(step.output),
            parameters=step.parameters,
            kernel_name="python3",  # this interpreter, not the notebooks' `rpka` kernel
            progress_bar=progress,
            cwd=str(REPO_ROOT),
            config=kernel_config(),
        )
    except PapermillExecutionError as err:
        raise PipelineError(
            f"{step.notebook.name} failed in cell {err.cell_index} (execution count "
            f"{err.exec_count}): {err.ename}: {err.evalue}\n"
            f"executed copy with the traceback: {step.output}"
        ) from None
    step.seconds = time.perf_counter() - start
    return step


SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>\s*", re.S | re.I)
REMOTE_LINK = re.compile(r"<link\b[^>]*href=[\"']https?:[^>]*>\s*", re.I)
TITLE = re.compile(r"<title>.*?</title>", re.S | re.I)


def offline(body: str, title: str | None = None) -> str:
    """The page without scripts (nbconvert's require.js, MathJax and mermaid loaders come
    from a CDN; the report needs none: its tables and figures are static) or remote
    stylesheets, with ``title`` as its ``<title>``."""
    body = REMOTE_LINK.sub("", SCRIPT.sub("", body))
    if title is not None:
        body = TITLE.sub(f"<title>{html.escape(title)}</title>", body, count=1)
    return body


def render_html(
    executed: Path,
    html_path: Path,
    notebooks: Sequence[Path] = (),
    title: str | None = None,
) -> Path:
    """Render an executed notebook to one self-contained HTML file, code cells hidden.

    Images are embedded (base64); nothing is loaded from the network (:func:`offline`).
    ``notebooks`` (the executed copies) are listed in a footer by their path in the
    repository, as text: links to files beside the HTML would break once it is shared.
    """
    exporter = HTMLExporter(
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True, embed_images=True
    )
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4))
    body = offline(body, title)
    if notebooks:
        items = "".join(
            f"<li><code>{html.escape(str(_relative(path, REPO_ROOT)))}</code></li>"
            for path in notebooks
        )
        footer = (
            '<footer style="margin:2em auto;max-width:1000px;font-family:sans-serif">'
            "<h3>Executed notebooks</h3><p>Written by this run in the repository (not "
            f"part of this file):</p><ul>{items}</ul></footer>"
        )
        body = body.replace("</body>", footer + "</body>")
    return atomic_write_text(html_path, body)


def _relative(path: Path, start: Path) -> Path:
    try:
        return path.resolve().relative_to(start.resolve())
    except ValueError:
        return path.resolve()


def preset_title(preset: str) -> str:
    """The report's ``<title>``: what it is, the preset and the commit."""
    return report.page_title(preset, report.provenance()["commit"])


def run_pipeline(
    steps: Sequence[Step],
    html_out: Path,
    progress: bool = True,
    log: Callable[[str], None] = print,
    compute: Sequence[tuple[str, Callable[[], object]]] = (),
    title: str | None = None,
    parallel: int = 2,
) -> Path:
    """Run the ``compute`` stages, then the notebook ``steps`` (``parallel`` at a time:
    side by side the last starts first, then the others in order; none starts after a
    failure), and render the last notebook to HTML (``title``: its ``<title>``) at
    ``html_out`` and beside the executed notebooks. Papermill's cell bars are shown when
    one notebook runs at a time."""
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise ValueError(f"parallel must be an integer >= 1, got {parallel!r}")
    for step in steps:  # check every notebook's parameters before running anything
        check_parameters(step.notebook, step.parameters)
    total = time.perf_counter()
    timings = []
    for i, (name, stage) in enumerate(compute, 1):
        log(f"[compute {i}/{len(compute)}] {name} ...")
        start = time.perf_counter()
        stage()
        timings.append((name, time.perf_counter() - start))
        log(f"[compute {i}/{len(compute)}] {name} done in {timings[-1][1]:.1f} s")
    labelled = [(f"[{i}/{len(steps)}] {s.notebook.name}", s) for i, s in enumerate(steps, 1)]
    # Side by side, the report notebook (the longest; it reads only computed results)
    # starts first: started last, it would run alone on an idle core.
    start_order = range(len(steps)) if parallel == 1 else [len(steps) - 1, *range(len(steps) - 1)]
    run_notebooks(labelled, parallel, progress, log, start_order)
    notebooks = [s.output for s in steps]
    render_html(steps[-1].output, html_out, notebooks, title)
    copy = steps[-1].output.parent / html_out.name  # reports/<preset>/: one per preset
    if copy.resolve() != html_out.resolve():
        render_html(steps[-1].output, copy, notebooks, title)
    log(f"report: {html_out} (total {time.perf_counter() - total:.1f} s)")
    for name, seconds in timings + [(s.notebook.name, s.seconds) for s in steps]:
        log(f"  {name:<24} {seconds:8.1f} s")
    return html_out


def run_notebooks(
    steps: Sequence[tuple[str, Step]],
    parallel: int,
    progress: bool,
    log: Callable[[str], None],
    start_order: Sequence[int] | None = None,
) -> None:
    """Run the (label, step) pairs ``parallel`` at a time, started in ``start_order``
    (indices into ``steps``; default: as listed); after a failure start no other, wait for
    those running, and raise the failure of the step listed first."""
    bars = progress and parallel == 1  # interleaved cell bars would be unreadable
    order = range(len(steps)) if start_order is None else start_order
    pending, running, failures = [(i, steps[i]) for i in order], {}, []
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        while (pending and not failures) or running:
            while pending and len(running) < parallel and not failures:
                index, (label, step) = pending.pop(0)
                log(f"{label} ...")
                running[pool.submit(run_notebook, step, bars)] = (index, label, step)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                index, label, step = running.pop(future)
                if future.exception() is not None:
                    log(f"{label} failed")
                    failures.append((index, future.exception()))
                else:
                    log(f"{label} done in {step.seconds:.1f} s")
    if failures:
        raise min(failures, key=lambda failure: failure[0])[1]


def preset_steps(preset: str) -> list[Step]:
    """The notebooks of the study, in order, with the preset's parameters."""
    params = notebook_parameters(preset)
    out_dir = resolve(paths.report_dir(preset))
    return [
        Step(NOTEBOOK_DIR / name, out_dir / name, parameters) for name, parameters in params.items()
    ]
