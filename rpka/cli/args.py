"""The command line's options (``rpka.cli.commands`` runs the commands): each command's parser, and
the checks shared by every command - output paths probed before any work, ranges of
counts, one error format with exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rpka import bench, paths
from rpka.cli import pipeline
from rpka.config.bench import DEVICES
from rpka.config.presets import PRESETS_BY_TRACK, STUDY_PRESETS, STUDY_TRACKS
from rpka.config.presets_longctx import LONGCTX_PRESETS
from rpka.paths import resolve
from rpka.report import readme
from rpka.speed import decoding, scaling
from rpka.study import cost, longctx
from rpka.training.executors import EXECUTOR_KINDS

# evaluation seeds a paired comparison can use: at least 2 pairs; at most what any study
# here would run (more is a typo, and 10**20 overflows the seed arithmetic)
SEEDS_RANGE = (2, 1_000)
# training epochs of a bench: the studies here train 1-8; a billion ran on silently
EPOCHS_RANGE = (1, 1_000)
# timed training steps per cost probe: 3 by default; 10**8 ran on silently
COST_STEPS_RANGE = (1, 1_000)


def check_out_dir(parser: argparse.ArgumentParser, flag: str, folder: Path) -> None:
    """Refuse, before any compute, an output folder that is a file or cannot be written
    (probe: create it and a temporary file in it)."""
    try:
        if folder.exists() and not folder.is_dir():
            parser.error(f"argument {flag}: {folder} is a file, not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        parser.error(f"argument {flag}: cannot write to {folder} ({err.strerror})")


NAME_MAX = 255  # bytes in one file name, on every common file system


def path_arg(value: str) -> str:
    """An ``--out`` value: refused when empty (``--out ''`` fell back to the default and
    overwrote a committed result file)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path; leave the option out for the default")
    return value


def check_out_file(parser: argparse.ArgumentParser, flag: str, path: Path) -> None:
    """Refuse, before any compute, an output file that is a folder or whose folder cannot
    be created and written (the result is written to a temporary file there, then renamed)."""
    try:
        if path.is_dir():
            parser.error(f"argument {flag}: {path} is a folder, not a file")
    except OSError as err:  # e.g. a name longer than the file system allows
        parser.error(f"argument {flag}: cannot write to {path} ({err.strerror})")
    if len(path.name.encode()) > NAME_MAX - len(".tmp") - 20:  # the temporary file's name
        parser.error(f"argument {flag}: the file name {path.name[:40]}... is too long")
    check_out_dir(parser, flag, path.parent)


def check_seeds(parser: argparse.ArgumentParser, n_seeds: int) -> None:
    """``--seeds``: a paired test needs 2 seeds; above 1,000 the run is a typo, not a study."""
    low, high = SEEDS_RANGE
    if not low <= n_seeds <= high:
        parser.error(f"argument --seeds: must be in [{low}, {high}], got {n_seeds}")


def eval_seeds(sweep_seeds: Sequence[int], n_seeds: int) -> tuple[int, ...]:
    """``n_seeds`` evaluation seeds, disjoint from the sweep seeds."""
    first = max(sweep_seeds) + 100
    return tuple(range(first, first + n_seeds))


def make_parser(command: str, description: str) -> argparse.ArgumentParser:
    """The one argparse setup of every command."""
    return argparse.ArgumentParser(
        prog=f"python -m rpka {command}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def fail(command: str, message: str) -> NoReturn:
    """An error found once the options parsed (argparse's form and exit status 2)."""
    print(f"python -m rpka {command}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def readable_readme(parser: argparse.ArgumentParser, path: Path) -> str:
    """The README's text, refused before any work where it is not a file, cannot be read or
    written, or has no summary block."""
    try:
        if not path.is_file():
            parser.error(f"argument --readme: {path} is not a file")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        parser.error(f"argument --readme: cannot read {path} ({err})")
    if readme.BEGIN not in text or readme.END not in text:
        parser.error(
            f"argument --readme: {path} has no summary block (the lines {readme.BEGIN!r} "
            f"and {readme.END!r})"
        )
    if not os.access(path, os.W_OK) or not os.access(path.parent or Path("."), os.W_OK):
        parser.error(f"argument --readme: {path} cannot be written (permissions)")
    return text


# --------------------------------------------------------------------------- each command's options


def bench_preset_names() -> list[str]:
    """Every preset name of any track (``bench --preset``)."""
    return sorted({name for presets in PRESETS_BY_TRACK.values() for name in presets})


def bench_parser() -> argparse.ArgumentParser:
    """``python -m rpka bench``'s options."""
    parser = make_parser("bench", bench.__doc__.split("\n\n")[0])
    names = bench_preset_names()
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
    return parser


def check_bench_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check of ``bench``'s options: a preset given, a scheduler
    address (and no other executor with it), the epochs' range."""
    names = bench_preset_names()
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


def longctx_parser() -> argparse.ArgumentParser:
    """``python -m rpka longctx``'s options."""
    parser = make_parser("longctx", longctx.__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(LONGCTX_PRESETS), default="full")
    parser.add_argument(
        "--out", type=path_arg, help="results folder (default data/results/<preset>)"
    )
    parser.add_argument("--contexts", type=int, nargs="+", help="context lengths")
    parser.add_argument("--ranks", type=int, nargs="+", help="RPKA ranks (replace the preset's)")
    parser.add_argument(
        "--arms",
        nargs="+",
        help="train only these arms (with the baseline, the primary arm and the controls; "
        "the positive control only if named): a study run arm by arm, resumed by run id",
    )
    parser.add_argument(
        "--warm-start-from",
        type=int,
        help="train every longer context at this one first (0: cold; default: the preset's)",
    )
    parser.add_argument("--seeds", type=int, help="number of evaluation seeds")
    parser.add_argument("--device", choices=DEVICES)
    parser.add_argument("--workers", type=int, help="parallel worker processes")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory probes")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def report_parser() -> argparse.ArgumentParser:
    """``python -m rpka report``'s options."""
    parser = make_parser("report", pipeline.__doc__)
    parser.add_argument(
        "--preset",
        choices=STUDY_PRESETS,
        default="standard",
        help="the study (default: %(default)s, about half an hour on 2 cores; full: the "
        "extended study, hours)",
    )
    parser.add_argument(
        "--html",
        type=path_arg,
        default=None,
        help=f"where to write the report (default: {paths.OUT}/<preset>/rpka_report.html; "
        f"with --publish {paths.REPORT_HTML} and docs/rpka_report_<preset>.html)",
    )
    parser.add_argument(
        "--out",
        type=path_arg,
        default=paths.OUT,
        help="the folder this run writes its runs, results, figures and report under, as "
        "<out>/<preset>/ (default: %(default)s/, ignored by git); it resumes from the "
        "committed study's runs, copied there, and ends comparing itself with that study",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="write into the committed study instead (data/results/<preset>, "
        "figures/<preset>, docs/rpka_report_<preset>.html; presets "
        f"{', '.join(paths.PUBLISHED_PRESETS)}): the one step that rewrites it (make publish)",
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
        help="render the committed study's result files (e.g. the full study): nothing is "
        "trained or computed and no result file is written (the study index only where "
        "there is none); figures and report go to <out>/<preset>/ (with --publish: "
        "figures/<preset> and docs/); refused when a result file is missing",
    )
    return parser


def scaling_parser() -> argparse.ArgumentParser:
    """``python -m rpka scaling``'s options."""
    parser = make_parser("scaling", scaling.__doc__)
    parser.add_argument("--preset", choices=sorted(scaling.SCALING_PRESETS), default="cpu")
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
        help="time the arms of this bench preset (rpka.config.presets) at one length, forward only "
        f"(default length {scaling.ARM_LENGTH}; no rank sweep, backward or memory unless given)",
    )
    parser.add_argument(
        "--out", type=path_arg, help="JSON path (default: by preset, under data/results/scaling)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def decode_parser() -> argparse.ArgumentParser:
    """``python -m rpka decode``'s options (defaults: ``DecodeConfig``'s)."""
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
    return parser


def cost_parser() -> argparse.ArgumentParser:
    """``python -m rpka cost``'s options."""
    parser = make_parser("cost", cost.__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset", choices=sorted(STUDY_PRESETS), default="standard",
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
    parser.add_argument(
        "--longctx",
        choices=sorted(LONGCTX_PRESETS),
        help="price this long-context study per length instead (rpka.study.cost_longctx; "
        "curriculum first stages included)",
    )
    parser.add_argument("--contexts", type=int, nargs="+", help="with --longctx: these lengths")
    parser.add_argument(
        "--probe-eval-windows",
        type=int,
        default=32,
        help="with --longctx: probe the evaluation passes on this many windows and scale "
        "them up (default %(default)s)",
    )
    parser.add_argument(
        "--results",
        type=path_arg,
        help="with --longctx: the study's folder (measured CPU-s read from it, "
        "cost_model.json written to it; default data/results/<preset>)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def refuse_committed_default(parser: argparse.ArgumentParser, default: str) -> None:
    """Refuse a default output folder inside the committed study: the full preset's runs
    would overwrite the reports git keeps. Naming the folder with ``--out`` is the ask."""
    committed = resolve(paths.COMMITTED_RESULTS)
    if resolve(default) == committed or committed in resolve(default).parents:
        parser.error(
            f"argument --out: required with this preset, whose default folder {default} "
            f"holds the committed study (give --out {default} to rewrite it)"
        )
