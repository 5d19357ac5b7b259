"""``python -m rpka report``: the study and its report, as a user's run beside the committed
study (``out/<preset>/``, compared with it at the end) or, with ``--publish``, into it.

Where each file goes is ``rpka.paths``'s (its output folder, set here through the
environment so that the notebook kernels see the same layout); the comparison is
``rpka.study.reproduction``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from rpka import paths
from rpka.cli import pipeline
from rpka.cli.args import check_out_file, fail, report_parser
from rpka.cli.report_lock import ReportRunning, report_lock
from rpka.config.presets import PREVIEW_PRESETS
from rpka.io import atomic_write_text
from rpka.paths import resolve
from rpka.study import cost, reproduction, results_check
from rpka.study import steps as study


def report_main(argv: Sequence[str] | None = None) -> None:
    parser = report_parser()
    args = parser.parse_args(argv)
    saved = {name: os.environ.get(name) for name in (paths.OUTPUT_ENV, paths.READ_COMMITTED_ENV)}
    try:
        _report(parser, args)
    finally:  # the layout is this command's: a caller in the same process keeps its own
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _report(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.publish and args.preset not in paths.PUBLISHED_PRESETS:
        parser.error(
            f"--publish: preset {args.preset} has no committed study (committed: "
            f"{', '.join(paths.PUBLISHED_PRESETS)})"
        )
    if args.publish and args.out != paths.OUT:
        parser.error("--publish writes into the committed study: it takes no --out")
    select_layout(args)
    if args.html is None:
        args.html = str(resolve(paths.report_html(args.preset)))
    steps = pipeline.preset_steps(args.preset, from_results=args.from_results, publish=args.publish)
    if args.print_parameters:
        print(json.dumps({s.notebook.name: s.parameters for s in steps}, indent=2))
        return
    check_out_file(parser, "--html", Path(args.html))
    if args.parallel < 1:
        parser.error(f"--parallel must be an integer >= 1, got {args.parallel}")
    if args.from_results:
        missing = study.missing_results(args.preset)
        if missing:
            parser.error(
                f"--from-results: {len(missing)} result file(s) of preset {args.preset} "
                f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                f"`python -m rpka report --preset {args.preset}` computes them"
            )
    try:  # one report of a preset at a time: they would write the same notebooks
        if args.from_results:  # before any notebook: each file whole, sealed, well-typed
            unsealed = results_check.check_study(args.preset)
            if unsealed:
                print(results_check.unsealed_note(unsealed, args.preset), file=sys.stderr)
        with report_lock(args.preset):
            _run_report(args, steps)
    except ReportRunning as err:
        fail("report", str(err))


def select_layout(args: argparse.Namespace) -> None:
    """Where this report reads and writes (``rpka.paths``, through the environment so that
    its notebook kernels see the same): a user's run under ``<out>/<preset>/`` (the
    committed study only read), or with ``--publish`` the committed study itself."""
    for name in (paths.OUTPUT_ENV, paths.READ_COMMITTED_ENV):
        os.environ.pop(name, None)
    if args.publish:
        return
    os.environ[paths.OUTPUT_ENV] = str(args.out)
    if args.from_results:
        os.environ[paths.READ_COMMITTED_ENV] = "1"


def _run_report(args: argparse.Namespace, steps: list[pipeline.Step]) -> None:
    """The checked ``report`` command, under its preset's lock: compute, run, render."""
    parallel = args.parallel
    # A preview draws no conclusion from its timings, so its notebooks run beside the
    # stages they do not read. One torch thread per process then, as in every bench worker:
    # OpenMP's spinning threads on oversubscribed cores made the stages ~4x slower.
    overlap = args.preset in PREVIEW_PRESETS and parallel > 1
    prediction = None if args.from_results else cost.stored_prediction(args.preset)
    if prediction is not None:  # before hours of compute: say how many
        print(cost.prediction_line(prediction), flush=True)
    if not args.from_results and (copied := reproduction.seed_results(args.preset)):
        print(
            f"{paths.results_dir(args.preset)}: {copied} file(s) of the committed study "
            "copied in to resume from (the committed study is only read)",
            flush=True,
        )
    if overlap and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"  # the notebook kernels, started later
        torch.set_num_threads(1)
    try:
        pipeline.run_pipeline(
            steps,
            Path(args.html),
            progress=not args.no_progress,
            compute=(
                study.render_steps(args.preset)
                if args.from_results
                else study.compute_steps(args.preset, progress=not args.no_progress)
            ),
            title=pipeline.preset_title(args.preset),
            parallel=parallel,
            overlap=overlap,
        )
    except pipeline.PipelineError as err:
        raise SystemExit(f"report failed: {err}") from None
    if args.publish:
        published = resolve(paths.committed_report_html(args.preset))
        atomic_write_text(published, Path(args.html).read_text(encoding="utf-8"))
        print(f"published: {published}")
    check = reproduction.compare(
        paths.results_dir(args.preset), paths.committed_results_dir(args.preset)
    )
    if paths.output_dir(args.preset):
        reproduction.write_check(check, paths.output_dir(args.preset))
    print("\n".join(reproduction.lines(check)))
