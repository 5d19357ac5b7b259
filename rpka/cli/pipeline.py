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
import contextlib
import html
import logging
import os
import re
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import nbformat
import papermill
import zmq
from jupyter_client import AsyncKernelManager, KernelManager
from nbconvert import HTMLExporter
from papermill.exceptions import PapermillExecutionError
from tqdm import tqdm
from traitlets.config import Config

from rpka import paths, report
from rpka.io import atomic_write_text
from rpka.paths import REPO_ROOT, resolve
from rpka.study import notebook_params
from rpka.study.steps import NOTEBOOKS, notebook_parameters

NOTEBOOK_DIR = resolve(paths.NOTEBOOKS)
REPORT_DIR = resolve(paths.REPORTS)


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
    if Path(notebook).name in NOTEBOOKS:  # the study's: the check their first cell runs
        try:
            notebook_params.check(Path(notebook).name, parameters)
        except notebook_params.ParameterError as err:
            raise PipelineError(str(err)) from None
        return
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


class TrackedKernelManager(AsyncKernelManager):
    """The notebooks' kernel manager, listed while it exists so that :func:`kill_kernels`
    can reach its kernel from the main thread: papermill drives each kernel from a pool
    thread that waits for the notebook's end, and the interpreter's exit waits for that
    thread - after Ctrl-C, for a whole notebook (a kernel runs in its own session, so the
    terminal's Ctrl-C never reaches it)."""

    live: ClassVar[weakref.WeakSet] = weakref.WeakSet()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        TrackedKernelManager.live.add(self)

    async def _async_interrupt_kernel(self) -> None:
        """No SIGINT while shutting down: jupyter_client sends one before its shutdown
        request, after the notebook ended, and a kernel still handling a message logged
        "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel." (issue 43: 8 of ~27
        reports). The request alone ends it (then SIGTERM, SIGKILL: shutdown_wait_time)."""
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()


def kill_kernels() -> None:
    """SIGKILL the process group of every running kernel: the kernel and any pool workers
    of a bench it runs (a kernel leads its own group). nbclient then sees the kernel dead
    within a second and its thread ends."""
    for manager in list(TrackedKernelManager.live):
        provisioner = manager.provisioner
        group = getattr(provisioner, "pgid", None) or getattr(provisioner, "pid", None)
        if manager.has_kernel and group:
            with contextlib.suppress(OSError):  # gone already, or not ours
                os.killpg(group, signal.SIGKILL)


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
            kernel_manager_class=TrackedKernelManager,
        )
    except PapermillExecutionError as err:  # one message; the traceback is in the copy
        raise PipelineError(failure_message(step, err)) from None
    step.seconds = time.perf_counter() - start
    return step


def failure_message(step: Step, err: PapermillExecutionError, width: int = 60) -> str:
    """What the terminal shows of a failed notebook: its name, the failing cell (``In [n]``
    as Jupyter labels it, and its first line), the exception, and the executed copy to open
    for the full traceback (papermill marks the failing cell there)."""
    lines = [line.strip() for line in (err.source or "").splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if len(first) > width:
        first = first[: width - 3] + "..."
    cell = f"In [{err.exec_count}]" if err.exec_count is not None else f"#{err.cell_index}"
    starts = f", which starts {first!r}" if first else ""
    error = f"{err.ename}: {err.evalue}" if err.evalue else err.ename
    return (
        f"{step.notebook.name} failed in cell {cell}{starts}: {error}\n"
        f"executed copy with the traceback: {step.output}"
    )


SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>\s*", re.S | re.I)
REMOTE_LINK = re.compile(r"<link\b[^>]*href=[\"']https?:[^>]*>\s*", re.I)
TITLE = re.compile(r"<title>.*?</title>", re.S | re.I)


# printed, a wide table wraps its cells inside the page instead of running off its edge
PRINT_CSS = (
    "<style>@media print { table { font-size: 8pt; table-layout: auto; width: 100%; } "
    "td, th { white-space: normal !important; word-break: break-word; } "
    "figure { break-inside: avoid; } img { max-width: 100% !important; } }</style>"
)


def offline(body: str, title: str | None = None) -> str:
    """The page without scripts (nbconvert's require.js, MathJax and mermaid loaders come
    from a CDN; the report needs none: its tables and figures are static) or remote
    stylesheets, with ``title`` as its ``<title>`` and a print style (``PRINT_CSS``)."""
    body = REMOTE_LINK.sub("", SCRIPT.sub("", body))
    body = body.replace("</head>", PRINT_CSS + "</head>", 1)
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


def report_title(path: Path) -> str | None:
    """The ``<title>`` of the report at ``path`` (None: no report there, or no title)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            found = TITLE.search(fh.read(1 << 16))  # the head: the title comes early
    except OSError:
        return None
    return html.unescape(found.group(0)[len("<title>") : -len("</title>")]) if found else None


def _relative(path: Path, start: Path) -> Path:
    try:
        return path.resolve().relative_to(start.resolve())
    except ValueError:
        return path.resolve()


def preset_title(preset: str) -> str:
    """The report's ``<title>``: what it is, the preset and the commit."""
    return report.page_title(preset, report.provenance()["commit"])


# a compute stage: (label, computation, the result files or folders it writes)
Stage = tuple[str, Callable[[], object], Sequence[str]]


def run_pipeline(
    steps: Sequence[Step],
    html_out: Path,
    progress: bool = True,
    log: Callable[[str], None] = tqdm.write,
    compute: Sequence[Stage] = (),
    title: str | None = None,
    parallel: int = 2,
    overlap: bool = False,
) -> Path:
    """Run the ``compute`` stages in order, then the notebook ``steps`` ``parallel`` at a
    time - with ``overlap`` (and ``parallel`` > 1), each notebook as soon as the stages it
    reads are done (:func:`stages_read`), beside the later ones. Side by side the last
    notebook (the report) starts first when it can, then the others in order; one at a
    time, in order. No notebook starts after a failure, and the stages stop too. Then
    render the last notebook to HTML (``title``: its ``<title>``) at ``html_out`` and
    beside the executed notebooks. Papermill's cell bars are shown when one notebook runs
    at a time."""
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise ValueError(f"parallel must be an integer >= 1, got {parallel!r}")
    for step in steps:  # check every notebook's parameters before running anything
        check_parameters(step.notebook, step.parameters)
    total = time.perf_counter()
    timings = []
    labelled = [(f"[{i}/{len(steps)}] {s.notebook.name}", s) for i, s in enumerate(steps, 1)]
    # Side by side, the report notebook (the longest) starts first once it can: started
    # last, it would run alone on an idle core.
    start_order = range(len(steps)) if parallel == 1 else [len(steps) - 1, *range(len(steps) - 1)]
    overlap = overlap and parallel > 1
    needs = [stages_read(s, compute) if overlap else len(compute) for s in steps]
    with NotebookQueue(labelled, parallel, progress, log, start_order, needs) as notebooks:
        for i, (name, stage, _) in enumerate(compute, 1):
            if notebooks.failed:  # a notebook failed: the study stops here
                break
            log(f"[compute {i}/{len(compute)}] {name} ...")
            start = time.perf_counter()
            stage()
            timings.append((name, time.perf_counter() - start))
            log(f"[compute {i}/{len(compute)}] {name} done in {timings[-1][1]:.1f} s")
            notebooks.stages_done(i)
        notebooks.stages_done(len(compute))
    outputs = [s.output for s in steps]
    replaced = report_title(html_out)  # another preset's report there is said to go
    render_html(steps[-1].output, html_out, outputs, title)
    copy = steps[-1].output.parent / html_out.name  # reports/<preset>/: one per preset
    written = f"report: {html_out}"
    if copy.resolve() != html_out.resolve():
        render_html(steps[-1].output, copy, outputs, title)
        written += f" (and its preset's copy {copy})"
    if replaced is not None and title is not None and replaced != title:
        written += f"; it replaces the report that was there: {replaced}"
    log(f"{written} (total {time.perf_counter() - total:.1f} s)")
    for name, seconds in timings + [(s.notebook.name, s.seconds) for s in steps]:
        log(f"  {name:<24} {seconds:8.1f} s")
    return html_out


def stages_read(step: Step, compute: Sequence[Stage]) -> int:
    """How many of the ``compute`` stages must be done before ``step`` may start: up to the
    last one that writes a path its parameters name (the file itself, or a folder above or
    below it). The stages run in order, so the ones before it are done too."""
    named = [resolve(value) for value in step.parameters.values() if isinstance(value, str)]
    last = 0
    for i, (_, _, outputs) in enumerate(compute, 1):
        for out in map(resolve, outputs):
            if any(out == path or path in out.parents or out in path.parents for path in named):
                last = i
    return last


BAR_REFRESH_S = 1.0  # how often the notebooks' bar is redrawn on a terminal (a log: never)


def notebooks_bar(total: int, done: int) -> tqdm:
    """The bar over the notebooks run side by side (their cell bars would interleave),
    from ``done``; redrawn every second on a terminal, in a log only as notebooks end."""
    return tqdm(
        total=total, initial=done, desc="notebooks", unit="notebook", dynamic_ncols=True,
        mininterval=BAR_REFRESH_S if sys.stderr.isatty() else 60.0,
    )  # fmt: skip


# an interrupted queue's wait for the threads of the killed kernels (nbclient checks each s)
STOP_WAIT_S = 3.0


class NotebookQueue:
    """Notebooks run ``parallel`` at a time on threads (each drives a kernel process),
    started in ``start_order`` (indices into ``steps``), each once ``needs[i]`` compute
    stages are done; after a failure none starts. Leaving the ``with`` block waits for
    every notebook that can still run (or, on an exception, only for those running) and
    raises the failure of the step listed first; on Ctrl-C or SIGTERM (a
    ``KeyboardInterrupt``, in a stage or while waiting) it kills the running kernels
    instead (:meth:`stop`)."""

    def __init__(
        self,
        steps: Sequence[tuple[str, Step]],
        parallel: int,
        progress: bool,
        log: Callable[[str], None],
        start_order: Sequence[int],
        needs: Sequence[int],
    ) -> None:
        self.steps, self.parallel, self.log, self.needs = steps, parallel, log, needs
        self.bars = progress and parallel == 1  # interleaved cell bars would be unreadable
        # side by side: one bar over the notebooks instead, once the stages' bars are done
        self.bar: tqdm | None = None
        self.overall = progress and parallel > 1 and len(steps) > 1
        self.finished = 0
        self.pending = list(start_order)
        self.done, self.running, self.failures = 0, 0, []
        self.stopped = False  # interrupted: the notebooks' ends are not logged
        self.changed = threading.Condition(threading.RLock())  # a callback may run inline
        self.pool = ThreadPoolExecutor(max_workers=parallel)

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def stages_done(self, count: int) -> None:
        """``count`` compute stages are done: start the notebooks that wait for no more."""
        with self.changed:
            self.done = count
            self._start_ready()

    def _start_ready(self) -> None:
        while not self.failures and self.running < self.parallel:
            index = next((i for i in self.pending if self.needs[i] <= self.done), None)
            if index is None:
                return
            self.pending.remove(index)
            label, step = self.steps[index]
            future = self.pool.submit(run_notebook, step, self.bars)
            self.running += 1
            future.add_done_callback(lambda future, index=index: self._finished(index, future))
            self.log(f"{label} ...")

    def _finished(self, index: int, future: Future) -> None:
        label, step = self.steps[index]
        error = future.exception()
        with self.changed:
            self.running -= 1
            try:
                if self.stopped:  # killed by stop(): the interrupt has its own line
                    pass
                elif error is not None:
                    self.failures.append((index, error))
                    self.log(f"{label} failed")
                else:
                    self.log(f"{label} done in {step.seconds:.1f} s")
                    self.finished += 1
                    if self.bar is not None:
                        self.bar.update()
                self._start_ready()
            except BaseException as err:  # e.g. a closed stdout: stop here, raise it at the end
                self.failures.append((index, err))
            finally:  # whatever happened, the waiting thread is told (no hang)
                self.changed.notify_all()

    def __enter__(self) -> NotebookQueue:
        return self

    def __exit__(self, kind: type | None, *_: object) -> None:
        try:
            if kind is not None and issubclass(kind, KeyboardInterrupt):
                self.stop()
            else:
                self._wait(stopping=kind is not None)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM while the notebooks run
            self.stop()
            raise
        self.pool.shutdown()
        if self.bar is not None:
            self.bar.close()
        if self.failures and kind is None:
            raise min(self.failures, key=lambda failure: failure[0])[1]

    def _wait(self, stopping: bool) -> None:
        """Wait for the running notebooks and, unless ``stopping`` (a stage raised: start
        nothing more), for those still to start; once stopped (:meth:`stop`), for at
        most ``STOP_WAIT_S``: their kernels are dead, so their threads end at once."""
        deadline = time.monotonic() + STOP_WAIT_S
        with self.changed:
            if stopping:
                self.pending.clear()
            elif self.overall and self.bar is None and (self.running or self.pending):
                self.bar = notebooks_bar(len(self.steps), self.finished)
            while self.running or (self.pending and not self.failures):
                if self.stopped and time.monotonic() > deadline:
                    return
                if self.bar is not None and not self.stopped and sys.stderr.isatty():
                    self.bar.refresh()  # its elapsed time moves while a notebook runs
                self.changed.wait(timeout=0.1 if self.stopped else BAR_REFRESH_S)

    def stop(self) -> None:
        """Ctrl-C: start no notebook, kill the running ones' kernels and wait (briefly) for
        their threads, saying nothing: the interrupt has its own line, and papermill's
        logger would add "Kernel died while waiting for execute reply." per notebook."""
        with self.changed:
            self.stopped = True
            self.pending.clear()
        papermill_log = logging.getLogger("papermill")
        was_disabled, papermill_log.disabled = papermill_log.disabled, True
        try:
            kill_kernels()
            self._wait(stopping=True)
        finally:
            papermill_log.disabled = was_disabled


def preset_steps(preset: str, from_results: bool = False, publish: bool = False) -> list[Step]:
    """The notebooks of the study, in order, with the preset's parameters. ``from_results``
    (``report --from-results``): the notebooks compute nothing and draw their figures into
    ``<report folder>/figures`` - or, ``publish``ed, the committed ``figures/<preset>``."""
    params = notebook_parameters(preset)
    out_dir = resolve(paths.report_dir(preset))
    if from_results:
        figures = paths.committed_figures_dir(preset) if publish else f"{out_dir}/figures"
        params = {
            name: {**values, "figures_dir": str(_relative(Path(figures), REPO_ROOT)),
                   "compute_missing": False}
            for name, values in params.items()
        }  # fmt: skip
    return [
        Step(NOTEBOOK_DIR / name, out_dir / name, parameters) for name, parameters in params.items()
    ]
