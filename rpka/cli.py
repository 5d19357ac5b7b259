"""Command line: ``python -m rpka COMMAND [options]`` - every entry point, in one place.

    python -m rpka bench    --preset {smoke,quick,full} [--track NAME] [--out DIR] ...
    python -m rpka longctx  --preset {smoke,quick,full} [--out DIR] [--contexts 512 2048]
    python -m rpka report   --preset {smoke,quick,full}
    python -m rpka scaling  --preset {tiny,cpu,gpu,...} [--out PATH]
    python -m rpka decode   [--contexts ...] [--out PATH]
    python -m rpka summary  --preset full [--readme README.md]
    python -m rpka cost     --preset full [--benches forecast lm ...] [--steps 3]

Each command parses its options into a validated config (bad values exit with an error
naming the option), runs the compute module and prints a short summary; the compute
modules themselves know nothing of the command line or of the report layer.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rpka import bench, cost, decoding, longctx, paths, pipeline, scaling, study
from rpka.cli_args import (
    COST_STEPS_RANGE,
    EPOCHS_RANGE,
    SEEDS_RANGE,
    check_out_dir,
    check_out_file,
    check_seeds,
    eval_seeds,
    fail,
    make_parser,
    path_arg,
    readable_readme,
)
from rpka.config import DEVICES, BenchConfig, LongContextConfig
from rpka.executors import EXECUTOR_KINDS, make_executor, owned
from rpka.io import CorruptFileError, atomic_write_text, write_json
from rpka.paths import resolve
from rpka.presets import PRESETS_BY_TRACK, PREVIEW_PRESETS, STUDY_TRACKS, get_preset
from rpka.presets_longctx import LONGCTX_PRESETS, get_longctx_preset
from rpka.report import readme
from rpka.tracks import get_task

# --------------------------------------------------------------------------- bench


def parse_bench(argv: Sequence[str] | None = None) -> tuple[BenchConfig, argparse.Namespace]:
    """Parse the command line into a validated config; bad values exit with an error.

    ``--preset`` is required: without it the bench ran the full study (hours) into the
    committed ``data/results/full``. That folder is written only when ``--out`` names it.
    """
    parser = make_parser("bench", bench.__doc__.split("\n\n")[0])
    names = sorted({name for presets in PRESETS_BY_TRACK.values() for name in presets})
    parser.add_argument(
        "--preset",
        choices=names,
        help="the study to run (required; full is the real study: hours on 2 cores)",
    )
    parser.add_argument(
        "--track",
        choices=sorted(PRESETS_BY_TRACK),
        default=STUDY_TRACKS[0],
        help="the track (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=path_arg,
        help="results folder (default: data/results/<preset>, data/results/<preset>/<track> "
        f"for tracks other than forecast; {paths.COMMITTED_RESULTS}, the committed study, "
        "only when named here)",
    )
    parser.add_argument("--ranks", type=int, nargs="+", help="RPKA ranks (default: the preset's)")
    parser.add_argument(
        "--seeds", type=int, help="number of evaluation seeds (default: the preset's)"
    )
    parser.add_argument(
        "--lrs", type=float, nargs="+", help="learning rates to sweep (default: the preset's)"
    )
    parser.add_argument("--epochs", type=int, help="training epochs (default: the preset's)")
    parser.add_argument("--device", choices=DEVICES, help="(default: the preset's)")
    parser.add_argument(
        "--workers", type=int, help="parallel worker processes (default: the preset's)"
    )
    parser.add_argument(
        "--executor",
        choices=EXECUTOR_KINDS,
        help="where runs go: a local process pool, in-process, or a local Dask cluster "
        "(default: local)",
    )
    parser.add_argument(
        "--scheduler", help="a Dask scheduler address (tcp://host:port); implies --executor dask"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.preset is None:
        parser.error(f"argument --preset is required: one of {', '.join(names)}")
    if args.scheduler is not None and "://" not in args.scheduler:
        parser.error(f"argument --scheduler: expected tcp://host:port, got {args.scheduler!r}")
    if args.scheduler is not None and args.executor not in (None, "dask"):
        parser.error(
            f"argument --scheduler: not allowed with --executor {args.executor} (a scheduler "
            "address sends the runs to Dask: leave --executor out, or give --executor dask)"
        )
    if args.epochs is not None and not EPOCHS_RANGE[0] <= args.epochs <= EPOCHS_RANGE[1]:
        parser.error(f"argument --epochs: must be in [{EPOCHS_RANGE[0]}, {EPOCHS_RANGE[1]}], "
                     f"got {args.epochs}")  # fmt: skip

    overrides: dict[str, Any] = {}
    if args.ranks is not None:
        overrides["ranks"] = args.ranks
    if args.seeds is not None:
        check_seeds(parser, args.seeds)
        try:
            base = get_preset(args.preset, args.track)
        except ValueError as err:
            parser.error(str(err))
        overrides["eval_seeds"] = eval_seeds(base.sweep_seeds, args.seeds)
    if args.lrs is not None:
        overrides["learning_rates"] = tuple(args.lrs)
    if args.epochs is not None:
        overrides["train"] = {"epochs": args.epochs}
    if args.device is not None:
        overrides["device"] = args.device
    if args.workers is not None:
        overrides["n_workers"] = args.workers
    try:
        config = get_preset(args.preset, args.track, **overrides)
    except ValueError as err:
        parser.error(str(err))
    if config.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: cuda requested but CUDA is not available")
    if len(config.eval_seeds) < SEEDS_RANGE[0]:
        parser.error(f"preset {args.preset}: a paired comparison needs >= 2 evaluation seeds")
    if args.out is None:
        _refuse_committed_default(parser, bench.default_out(config))
    args.out = resolve(args.out or bench.default_out(config))
    check_out_dir(parser, "--out", args.out)
    return config, args


def _refuse_committed_default(parser: argparse.ArgumentParser, default: str) -> None:
    """Refuse a default output folder inside the committed study: the full preset's runs
    would overwrite the reports git keeps. Naming the folder with ``--out`` is the ask."""
    committed = resolve(paths.COMMITTED_RESULTS)
    if resolve(default) == committed or committed in resolve(default).parents:
        parser.error(
            f"argument --out: required with this preset, whose default folder {default} "
            f"holds the committed study (give --out {default} to rewrite it)"
        )


def bench_main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    config, args = parse_bench(argv)
    kind = args.scheduler or args.executor or "local"
    try:
        executor = make_executor(kind, n_workers=config.n_workers)
    except OSError as err:  # an unreachable scheduler: distributed's timeout, then OSError
        if args.scheduler is None:
            raise
        fail("bench", f"argument --scheduler: cannot reach {args.scheduler} ({err})")
    with owned(executor) as executor:
        report = bench.run_bench(config, args.out, executor, progress=not args.no_progress)
    out = args.out
    print_bench_summary(report, out)
    return report


def print_bench_summary(report: dict[str, Any], out: Path) -> None:
    """A results table: every arm and the naive baselines, the primary test metric; an arm
    with diverged evaluation seeds says how many (their scores are missing: n/a)."""
    metric = report["metric"]
    task = get_task(report["track"])
    naive = task.text.naive_rows(report, "test")
    width = max(12, *(len(name) for name in report["arms"]), *(len(label) for label, _ in naive))
    lines = [
        f"{'arm':<{width}} {'points':>6} {'best lr':>8} {'test ' + metric:>18} {'vs exact':>30}"
    ]
    for name, arm in report["arms"].items():
        full = arm["full"]
        points = arm["pivot_points"] or arm["attention_tokens"]
        cmp_ = arm["comparison"]
        versus = (
            "-"
            if cmp_ is None
            else f"{_number(cmp_['delta_mean'], '+.4f')} p_adj={_number(cmp_['p_adjusted'], '.3g')}"
        )
        diverged = arm["n_diverged"]
        lines.append(
            f"{name:<{width}} {points:>6} {_number(arm['best_cfg']['lr'], '.0e'):>8} "
            f"{_number(full['mean'], '.4f'):>9} +- {_number(full['std'], '.4f'):<6} {versus:>30}"
            + (f"  {diverged}/{len(full['per_seed'])} seeds diverged" if diverged else "")
        )
    for label, values in naive:
        lines.append(f"{label:<{width}} {'':>6} {'':>8} {values[metric]:>9.4f}")
    choice = report.get("ablation_choice")
    if choice is not None:
        lines.append(
            f"RPKA default (validation): {choice['chosen_arm']} "
            f"({choice['chosen_val_score']:.4f} vs reference {choice['reference']} "
            f"{choice['reference_val_score']:.4f})"
        )
    lines.append(task.text.learnability_text(report).replace("**", ""))
    if all(arm["n_diverged"] == len(arm["full"]["per_seed"]) for arm in report["arms"].values()):
        lines.append("every evaluation seed of every arm diverged: try lower --lrs")
    t = report["timings"]
    lines.append(
        f"wall {t['phases']['total_s']:.1f} s; step ms {t['step_ms_median']}; "
        f"written to {out / 'bench_report.json'}"
    )
    print("\n".join(lines), file=sys.stdout)


def _number(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``, or "n/a" where it is missing or not finite (a
    diverged seed has no score; NaN is saved as null)."""
    return "n/a" if value is None or not math.isfinite(value) else format(value, spec)


# --------------------------------------------------------------------------- longctx


def parse_longctx(
    argv: Sequence[str] | None = None,
) -> tuple[LongContextConfig, argparse.Namespace]:
    """Parse the command line into a validated config; bad values exit with an error."""
    parser = make_parser("longctx", longctx.__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(LONGCTX_PRESETS), default="full")
    parser.add_argument(
        "--out", type=path_arg, help="results folder (default data/results/<preset>)"
    )
    parser.add_argument("--contexts", type=int, nargs="+", help="context lengths")
    parser.add_argument("--ranks", type=int, nargs="+", help="RPKA ranks (replace the preset's)")
    parser.add_argument("--seeds", type=int, help="number of evaluation seeds")
    parser.add_argument("--device", choices=DEVICES)
    parser.add_argument("--workers", type=int, help="parallel worker processes")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory probes")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    overrides: dict[str, Any] = {}
    if args.contexts is not None:
        overrides["contexts"] = args.contexts
    if args.ranks is not None:
        overrides["ranks"] = args.ranks
        preset_primary = LONGCTX_PRESETS[args.preset].bench.primary_arm
        if preset_primary in {f"rpka-r{r}" for r in args.ranks}:
            overrides["primary_arm"] = preset_primary
    if args.seeds is not None:
        check_seeds(parser, args.seeds)
        sweep_seeds = LONGCTX_PRESETS[args.preset].bench.sweep_seeds
        overrides["eval_seeds"] = eval_seeds(sweep_seeds, args.seeds)
    if args.device is not None:
        overrides["device"] = args.device
    if args.workers is not None:
        overrides["n_workers"] = args.workers
    if args.no_memory:
        overrides["memory_probe"] = False
    try:
        config = get_longctx_preset(args.preset, **overrides)
        longctx.check_memory(config)
    except ValueError as err:
        parser.error(str(err))
    if config.bench.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: cuda requested but CUDA is not available")
    args.out = resolve(args.out or paths.results_dir(config.preset))
    check_out_dir(parser, "--out", args.out)
    return config, args


def longctx_main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    config, args = parse_longctx(argv)
    out = args.out
    result = longctx.run_longctx(config, out, progress=not args.no_progress)
    print("\n".join(longctx.summary_lines(result)), file=sys.stdout)
    print(f"written to {out / longctx.FILE_NAME}")
    return result


# --------------------------------------------------------------------------- report


def report_main(argv: Sequence[str] | None = None) -> None:
    parser = make_parser("report", pipeline.__doc__)
    parser.add_argument(
        "--preset",
        choices=pipeline.PRESETS,
        default="standard",
        help="the study (default: %(default)s, about half an hour on 2 cores; full: the "
        "extended study, hours)",
    )
    parser.add_argument(
        "--html",
        type=path_arg,
        default=str(resolve(paths.REPORT_HTML)),
        help="where to write the report (default: %(default)s)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--parallel",
        type=int,
        default=2,
        help="notebooks run at a time before the last one, >= 1 (1 shows each notebook's cell "
        "bar; default: %(default)s)",
    )
    parser.add_argument(
        "--print-parameters", action="store_true", help="print each notebook's parameters and exit"
    )
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="render the result files already there (e.g. the committed full study): "
        "nothing is trained or computed and no result file is written (the study index "
        "only where there is none); figures go to reports/<preset>/figures; refused when "
        "a result file is missing",
    )
    args = parser.parse_args(argv)
    steps = pipeline.preset_steps(args.preset, from_results=args.from_results)
    if args.print_parameters:
        print(json.dumps({s.notebook.name: s.parameters for s in steps}, indent=2))
        return
    check_out_file(parser, "--html", Path(args.html))
    if args.parallel < 1:
        parser.error(f"--parallel must be an integer >= 1, got {args.parallel}")
    parallel = args.parallel
    if args.from_results:
        missing = study.missing_results(args.preset)
        if missing:
            parser.error(
                f"--from-results: {len(missing)} result file(s) of preset {args.preset} "
                f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                f"`python -m rpka report --preset {args.preset}` computes them"
            )
    # A preview draws no conclusion from its timings, so its notebooks run beside the
    # stages they do not read. One torch thread per process then, as in every bench worker:
    # OpenMP's spinning threads on oversubscribed cores made the stages ~4x slower.
    overlap = args.preset in PREVIEW_PRESETS and parallel > 1
    prediction = None if args.from_results else cost.stored_prediction(args.preset)
    if prediction is not None:  # before hours of compute: say how many
        print(cost.prediction_line(prediction), flush=True)
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


# --------------------------------------------------------------------------- scaling, decode


def scaling_main(argv: Sequence[str] | None = None) -> dict:
    parser = make_parser("scaling", scaling.__doc__)
    parser.add_argument("--preset", choices=sorted(scaling.PRESETS), default="cpu")
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--ranks", type=int, nargs="+")
    parser.add_argument("--control-ranks", type=int, nargs="*")
    parser.add_argument("--batch-heads", type=int)
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--max-seconds", type=float)
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--bench-preset",
        help="time the arms of this bench preset (rpka.presets) at one length, forward only "
        f"(default length {scaling.ARM_LENGTH}; no rank sweep, backward or memory unless given)",
    )
    parser.add_argument(
        "--out", type=path_arg, help="JSON path (default: by preset, under data/results/scaling)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    overrides = {
        key: getattr(args, key)
        for key in (
            "lengths",
            "ranks",
            "control_ranks",
            "batch_heads",
            "head_dim",
            "device",
            "dtype",
            "warmup",
            "repeats",
            "max_seconds",
        )
        if getattr(args, key) is not None
    }
    if args.no_backward:
        overrides["backward"] = False
    if args.no_memory:
        overrides["memory"] = False
    config = scaling.PRESETS[args.preset]
    default_out = scaling.DEFAULT_OUT[args.preset]
    try:
        if args.bench_preset is not None:
            bench_arms = get_preset(args.bench_preset).arms
            config = scaling.bench_arms_config(bench_arms, base=config)
            default_out = paths.scaling_json(f"arms_{args.bench_preset}_{args.preset}")
        config = replace(config, **overrides)
        config.validate()
    except ValueError as err:
        parser.error(str(err))
    out = resolve(args.out or default_out)
    check_out_file(parser, "--out", out)
    result = scaling.run_scaling(config, progress=not args.quiet, out=out, preset=args.preset)
    print("\n".join(scaling.summary_lines(result)))
    print(f"written to {out}")
    return result


def decode_main(argv: Sequence[str] | None = None) -> dict:
    parser = make_parser("decode", decoding.__doc__)
    defaults = decoding.DecodeConfig()
    parser.add_argument("--contexts", type=int, nargs="+", default=list(defaults.contexts))
    parser.add_argument("--batch-heads", type=int, default=defaults.batch_heads)
    parser.add_argument("--head-dim", type=int, default=defaults.head_dim)
    parser.add_argument("--rank", type=int, default=defaults.rank)
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    parser.add_argument("--pivot-set", default=defaults.pivot_set)
    parser.add_argument("--device", default=defaults.device)
    parser.add_argument("--dtype", default=defaults.dtype)
    parser.add_argument("--warmup", type=int, default=defaults.warmup)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--out",
        type=path_arg,
        default=None,
        help="default data/results/scaling/decode_<device>.json",
    )
    args = parser.parse_args(argv)
    config = decoding.DecodeConfig(
        contexts=args.contexts,
        batch_heads=args.batch_heads,
        head_dim=args.head_dim,
        rank=args.rank,
        block_size=args.block_size,
        pivot_set=args.pivot_set,
        device=args.device,
        dtype=args.dtype,
        warmup=args.warmup,
        steps=args.steps,
        seed=args.seed,
    )
    try:
        config.validate()
    except ValueError as err:
        parser.error(str(err))
    out = resolve(args.out or paths.decode_json(config.device))
    check_out_file(parser, "--out", out)
    result = decoding.run_decoding(config)
    write_json(out, result)
    print(f"{'method':>6} {'context':>8} {'ms/token':>9} {'mean':>8} {'max':>8} {'prefill ms':>11}")
    for r in result["rows"]:
        print(
            f"{r['method']:>6} {r['context']:>8} {r['per_token_ms']:>9.3f} "
            f"{r['per_token_mean_ms']:>8.3f} {r['per_token_max_ms']:>8.3f} {r['prefill_ms']:>11.1f}"
        )
    target = result["summary"]["target"]
    verdict = "met" if target["met"] else "NOT met"
    print(f"{target['statement']}: ratio {target['ratio']:.2f} -> {verdict}")
    print(f"device: {result['device']}; {result['shape']}; written to {out}")
    return result


# --------------------------------------------------------------------------- summary


def summary_main(argv: Sequence[str] | None = None) -> None:
    """The study's results in Markdown. Reads the committed results and never moves them;
    a missing study, a README without the markers or one that cannot be written is one
    line before anything is written."""
    parser = make_parser("summary", "the study's results in Markdown")
    parser.add_argument("--preset", default="full", choices=sorted(study.SCALING_PRESET))
    parser.add_argument("--readme", type=Path, help="rewrite this file's summary block")
    args = parser.parse_args(argv)
    text = None
    if args.readme is not None:
        text = readable_readme(parser, args.readme)
    if not any(
        resolve(paths.bench_report(args.preset, get_task(name).out_dir)).exists()
        for name in STUDY_TRACKS
    ):
        parser.error(
            f"argument --preset: no results of preset {args.preset} "
            f"(no {paths.bench_report(args.preset)}): `python -m rpka report --preset "
            f"{args.preset}` computes them"
        )
    index = study.write_study_index(args.preset)  # study.json: where every reader starts
    print(f"study index: {paths.study_json(args.preset)} ({len(index['tracks'])} track(s))")
    block = readme.render(args.preset)
    if args.readme is None or text is None:
        print(block)
        return
    try:
        atomic_write_text(args.readme, readme.replace_block(text, block))
    except OSError as err:
        parser.error(f"argument --readme: cannot write {args.readme} ({err.strerror or err})")
    print(f"updated the summary block of {args.readme}")


# --------------------------------------------------------------------------- cost


def cost_main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser("cost", cost.__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset", choices=sorted(pipeline.PRESETS), default="standard",
        help="the study to price (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--benches", nargs="+", help="only these benches (default: every bench of the study)"
    )
    parser.add_argument(
        "--steps", type=int, default=3, help="timed training steps per probe, 1-1000 (default 3)"
    )
    parser.add_argument(
        "--out",
        type=lambda value: Path(path_arg(value)),
        help="default data/results/<preset>/cost_model.json",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    low, high = COST_STEPS_RANGE
    if not low <= args.steps <= high:
        parser.error(f"argument --steps: must be in [{low}, {high}], got {args.steps}")
    labels = [label for label, _, _ in cost.study_benches(args.preset)]
    unknown = sorted(set(args.benches or []) - set(labels))
    if unknown:
        parser.error(f"argument --benches: unknown {unknown}; choose from {labels}")
    if args.out is not None:
        check_out_file(parser, "--out", args.out)
    torch.set_num_threads(1)  # as each bench job runs: the costs are one thread's
    result = cost.run_cost_model(
        args.preset, args.benches, args.steps, args.out, progress=not args.no_progress
    )
    print(readme.cost_model_table(result).to_markdown(index=False))
    print(f"written to {args.out or cost.cost_model_json(args.preset)}")
    return result


# --------------------------------------------------------------------------- dispatch

COMMANDS: dict[str, tuple[Callable[[Sequence[str] | None], Any], str]] = {
    "bench": (bench_main, "benchmark (--track NAME): lr sweep, seeds, bench_report.json"),
    "longctx": (longctx_main, "long-context training: exact vs rpka at contexts 512 and 2,048"),
    "report": (report_main, "run the study and render the HTML report"),
    "scaling": (scaling_main, "attention latency against length and rank"),
    "decode": (decode_main, "per-token decoding latency against context length"),
    "summary": (summary_main, "the study's results in Markdown (the README's results block)"),
    "cost": (cost_main, "predict each bench's CPU time from its configuration (probes)"),
}


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM in the driver: every command stops the same way (its pools
    aborted on the way out, ``rpka.executors.owned``), and exits ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop(signum: int, frame: object) -> None:
    """Raise :class:`Interrupted`, once: later signals are ignored, so a second Ctrl-C
    cannot break the clean-up (killing the workers) half way and leave them running."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread while a command
    runs. SIGTERM's default ended this process at once and left its workers to the
    parent-death signal (no message, no exit code of ours). A signal ignored at start
    stays ignored (a background job's SIGINT); the handlers are restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (a test calling main() from a thread)
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _interrupted(err: KeyboardInterrupt) -> int:
    """One line on stderr, and the shell's code for the signal (130 Ctrl-C, 143 SIGTERM):
    every result file is whole (written, then renamed), so the same command resumes."""
    signum = getattr(err, "signum", signal.SIGINT)
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    newline = "\n" if sys.stderr.isatty() else ""  # end a progress bar's line first
    print(
        f"{newline}{word}: the runs that finished are kept, and the same command resumes from them",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: python -m rpka COMMAND [options]\n\ncommands:\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    try:
        with _stop_on_signals():
            COMMANDS[argv[0]][0](argv[1:])
    except CorruptFileError as err:  # a result file a reader cannot use: name it, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM (Interrupted)
        return _interrupted(err)
    except OSError as err:
        if err.errno not in STORAGE_ERRNOS:
            raise
        where = f" writing {err.filename}" if err.filename else ""
        print(
            f"error: {err.strerror}{where}: nothing was half-written (every result is written "
            "to a temporary file, then renamed); free space and run the same command, which "
            "resumes from the runs that finished",
            file=sys.stderr,
        )
        return 2
    return 0


# a full disk, a quota, a read-only file system: one line, not a traceback
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
