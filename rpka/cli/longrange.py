"""The long-range study's commands beside ``rpka.cli.commands`` (issue 40): its price per length
(``python -m rpka cost --longctx PRESET``) and its one timing protocol
(``python -m rpka steptime``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import torch

from rpka import paths
from rpka.cli.args import check_out_dir, check_out_file, make_parser, path_arg
from rpka.config.bench import LongContextConfig
from rpka.config.presets import STUDY_PRESETS, STUDY_TRACKS
from rpka.config.presets_longctx import (
    LONGCTX_PRESETS,
    POWER_PRESET,
    V2_CONTEXT,
    get_longctx_preset,
)
from rpka.paths import resolve
from rpka.study import cost_longctx, longrange_v2, steptime
from rpka.study.index import FRONTIER_EXTENSIONS, extension_reports


def _preset_or_exit(
    parser: argparse.ArgumentParser, name: str, contexts: Sequence[int] | None
) -> LongContextConfig:
    """The long-context preset ``name`` at ``contexts`` (all of its own if None), or the
    parser's one-line error naming what is wrong."""
    try:
        return get_longctx_preset(name, **({"contexts": contexts} if contexts else {}))
    except ValueError as err:
        parser.error(str(err))


def longctx_cost_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``cost --longctx PRESET``: price a long-context study per length
    (rpka.study.cost_longctx)."""
    config = _preset_or_exit(parser, args.longctx, args.contexts)
    results = resolve(args.results or paths.results_dir(config.preset))
    if args.out is not None:
        check_out_file(parser, "--out", args.out)
    torch.set_num_threads(1)  # as each bench job runs: the costs are one thread's
    try:
        result = cost_longctx.price_longctx(
            config, results, args.steps, args.probe_eval_windows or None, args.out,
            progress=not args.no_progress,
        )  # fmt: skip
    except ValueError as err:
        parser.error(str(err))
    print("\n".join(cost_longctx.price_lines(result)))
    print(f"written to {args.out or results / cost_longctx.COST_FILE}")
    return result


def steptime_parser() -> argparse.ArgumentParser:
    """``python -m rpka steptime``'s options."""
    parser = make_parser("steptime", steptime.__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(LONGCTX_PRESETS), default="longrange-power")
    parser.add_argument(
        "--out", type=path_arg, help="the study's folder (steptime.json goes there; "
        "default data/results/<preset>)",
    )  # fmt: skip
    parser.add_argument("--contexts", type=int, nargs="+", help="these lengths only")
    parser.add_argument("--arms", nargs="+", help="these arms only (exact is always timed)")
    parser.add_argument(
        "--repeats", type=int, default=steptime.MIN_REPEATS,
        help=f"timed repeats, >= {steptime.MIN_REPEATS} (default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--warmup", type=int, default=2, help="untimed repeats first, >= 1")
    parser.add_argument(
        "--tracks", nargs="*", metavar="TRACK",
        help="time the study's short tracks instead (--preset a study preset: "
        f"{', '.join(STUDY_PRESETS)}; no names: all of {', '.join(STUDY_TRACKS)} and the "
        f"frontier extensions it has run, {', '.join(FRONTIER_EXTENSIONS)}) -> "
        f"{paths.TRACK_STEPTIME_FILE}",
    )  # fmt: skip
    return parser


def steptime_main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m rpka steptime``: time every arm's step (rpka.study.steptime)."""
    parser = steptime_parser()
    args = parser.parse_args(argv)
    if args.tracks is not None:
        return _track_steptime(parser, args)
    config = _preset_or_exit(parser, args.preset, args.contexts)
    out = resolve(args.out or paths.results_dir(config.preset))
    check_out_dir(parser, "--out", out)
    try:
        result = steptime.run_steptime(config, out, args.repeats, args.warmup, args.arms)
    except ValueError as err:
        parser.error(str(err))
    print("\n".join(steptime.steptime_lines(result)), file=sys.stdout)
    print(f"written to {out / steptime.STEPTIME_FILE}")
    return result


def _track_steptime(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``steptime --tracks``: the study's short tracks (rpka.study.steptime.run_track_steptime)."""
    if args.preset not in STUDY_PRESETS:
        presets = ", ".join(STUDY_PRESETS)
        parser.error(f"--preset with --tracks: one of {presets}, not {args.preset}")
    if args.contexts or args.arms:
        parser.error("--contexts and --arms time the long-range study: not with --tracks")
    out = resolve(args.out or paths.results_dir(args.preset))
    check_out_dir(parser, "--out", out)
    names = args.tracks or [*STUDY_TRACKS, *FRONTIER_EXTENSIONS]
    extensions = {  # the frontier's extension benches the study has run, as they were run
        name: report for name, report in extension_reports(out).items() if name in names
    }
    try:
        result = steptime.run_track_steptime(
            args.preset, out, args.repeats, args.warmup,
            [n for n in names if n not in FRONTIER_EXTENSIONS], extensions,
        )  # fmt: skip
    except ValueError as err:
        parser.error(str(err))
    print("\n".join(steptime.steptime_lines(result)), file=sys.stdout)
    print(f"written to {out / paths.TRACK_STEPTIME_FILE}")
    return result


def decision_main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m rpka decision {power,read}``: the long-range decision study (issue 53,
    docs/longrange_protocol_v2.md) - its power from the pilot, or its reading so far."""
    parser = make_parser("decision", longrange_v2.__doc__.split("\n\n")[0])
    parser.add_argument(
        "step", choices=("power", "read"),
        help="power: the power table from the pilot (power.json); read: the protocol's "
        "reading of the runs landed so far (longrange_v2.json)",
    )  # fmt: skip
    parser.add_argument(
        "--results", type=path_arg, default=paths.COMMITTED_RESULTS,
        help="the folder holding longrange-power/ (the pilot) and longrange-v2/ "
        "(default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--sims", type=int, default=longrange_v2.POWER_SIMULATIONS,
        help="power: simulations per scenario, 100-100000 (default %(default)s)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not 100 <= args.sims <= 100_000:
        parser.error(f"--sims must be in 100..100000, got {args.sims}")
    results = resolve(args.results)
    pilot = results / POWER_PRESET / paths.longctx_context_dir(V2_CONTEXT)
    if not (pilot / paths.BENCH_REPORT_FILE).exists():
        parser.error(f"--results: no pilot bench report under {pilot}")
    if args.step == "power":
        result = longrange_v2.write_power(results, args.sims)
        print("\n".join(longrange_v2.power_lines(result)))
    else:
        result = longrange_v2.read_study(results)
        print("\n".join(longrange_v2.reading_lines(result)))
    name = longrange_v2.POWER_FILE if args.step == "power" else longrange_v2.READING_FILE
    print(f"written to {longrange_v2.study_dir(results) / name}")
    return result
