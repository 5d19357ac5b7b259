"""Command line: ``python -m rpka COMMAND [options]`` - every entry point, in one place.

    python -m rpka bench    --preset {smoke,quick,full} [--track NAME] [--out DIR] ...
    python -m rpka longctx  --preset {smoke,quick,full} [--out DIR] [--contexts 512 2048]
                            [--warm-start-from 512]
    python -m rpka report   --preset {smoke,quick,full}
    python -m rpka scaling  --preset {tiny,cpu,gpu,...} [--out PATH]
    python -m rpka decode   [--contexts ...] [--out PATH]
    python -m rpka summary  --preset full [--readme README.md]
    python -m rpka cost     --preset full [--benches forecast lm ...] [--steps 3]
                            | --longctx longrange-power [--contexts 4096]
    python -m rpka steptime --preset longrange-power --out DIR [--contexts ...] [--arms ...]
    python -m rpka swap     --model pkg.module:factory --weights W.pt --batch B.pt ...

Each command parses its options into a validated config (bad values exit with an error
naming the option), runs the compute module and prints a short summary; the compute
modules themselves know nothing of the command line or of the report layer.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rpka import bench, numerics, paths
from rpka.cli import longrange as cli_longrange
from rpka.cli import pipeline  # noqa: F401 - the report's driver, as cli.pipeline
from rpka.cli.args import (
    COST_STEPS_RANGE,
    SEEDS_RANGE,
    bench_parser,
    check_bench_args,
    check_out_dir,
    check_out_file,
    check_seeds,
    cost_parser,
    decode_parser,
    eval_seeds,
    fail,
    longctx_parser,
    make_parser,
    readable_readme,
    refuse_committed_default,
    scaling_parser,
)
from rpka.cli.report_command import report_main
from rpka.cli.signals import STORAGE_ERRNOS, interrupted_status, stop_on_signals
from rpka.config.bench import BenchConfig, LongContextConfig
from rpka.config.presets import STUDY_TRACKS, get_preset
from rpka.config.presets_longctx import LONGCTX_PRESETS, get_longctx_preset, with_arms
from rpka.io import CorruptFileError, atomic_write_text, write_result_json
from rpka.paths import resolve
from rpka.report import readme, readme_table
from rpka.speed import decoding, scaling
from rpka.study import cost, longctx, results_check
from rpka.study import steps as study
from rpka.study.rank_law import command as rank_law_command
from rpka.swap import command as swap_command
from rpka.tracks import get_task
from rpka.training.executors import make_executor, owned

# --------------------------------------------------------------------------- bench


def parse_bench(argv: Sequence[str] | None = None) -> tuple[BenchConfig, argparse.Namespace]:
    """Parse the command line into a validated config; bad values exit with an error.

    ``--preset`` is required: without it the bench ran the full study (hours) into the
    committed ``data/results/full``. That folder is written only when ``--out`` names it.
    """
    parser = bench_parser()
    args = parser.parse_args(argv)
    check_bench_args(parser, args)
    try:
        config = get_preset(args.preset, args.track, **_bench_overrides(parser, args))
    except ValueError as err:
        parser.error(str(err))
    if config.execution.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: cuda requested but CUDA is not available")
    if len(config.design.eval_seeds) < SEEDS_RANGE[0]:
        parser.error(f"preset {args.preset}: a paired comparison needs >= 2 evaluation seeds")
    if args.out is None:
        refuse_committed_default(parser, bench.default_out(config))
    args.out = resolve(args.out or bench.default_out(config))
    check_out_dir(parser, "--out", args.out)
    return config, args


def _bench_overrides(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The preset's fields the options replace (``get_preset``'s overrides)."""
    overrides: dict[str, Any] = {}
    if args.ranks is not None:
        overrides["ranks"] = args.ranks
    if args.seeds is not None:
        check_seeds(parser, args.seeds)
        try:
            base = get_preset(args.preset, args.track)
        except ValueError as err:
            parser.error(str(err))
        overrides["eval_seeds"] = eval_seeds(base.design.sweep_seeds, args.seeds)
    if args.lrs is not None:
        overrides["learning_rates"] = tuple(args.lrs)
    if args.epochs is not None:
        overrides["train"] = {"epochs": args.epochs}
    if args.device is not None:
        overrides["device"] = args.device
    if args.workers is not None:
        overrides["n_workers"] = args.workers
    return overrides


def bench_main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    config, args = parse_bench(argv)
    kind = args.scheduler or args.executor or "local"
    try:
        executor = make_executor(kind, n_workers=config.execution.n_workers)
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
    parser = longctx_parser()
    args = parser.parse_args(argv)

    overrides: dict[str, Any] = {}
    if args.contexts is not None:
        overrides["contexts"] = args.contexts
    if args.ranks is not None:
        overrides["ranks"] = args.ranks
        preset_primary = LONGCTX_PRESETS[args.preset].bench.decision.primary_arm
        if preset_primary in {f"rpka-r{r}" for r in args.ranks}:
            overrides["primary_arm"] = preset_primary
    if args.warm_start_from is not None:
        overrides["warm_start_from"] = args.warm_start_from or None
    if args.seeds is not None:
        check_seeds(parser, args.seeds)
        sweep_seeds = LONGCTX_PRESETS[args.preset].bench.design.sweep_seeds
        overrides["eval_seeds"] = eval_seeds(sweep_seeds, args.seeds)
    if args.device is not None:
        overrides["device"] = args.device
    if args.workers is not None:
        overrides["n_workers"] = args.workers
    if args.no_memory:
        overrides["memory_probe"] = False
    try:
        config = get_longctx_preset(args.preset, **overrides)
        if args.arms is not None:
            config = with_arms(config, args.arms)
        longctx.check_memory(config)
    except ValueError as err:
        parser.error(str(err))
    if config.bench.execution.device == "cuda" and not torch.cuda.is_available():
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


# --------------------------------------------------------------------------- scaling, decode


def scaling_main(argv: Sequence[str] | None = None) -> dict:
    parser = scaling_parser()
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
    config = scaling.SCALING_PRESETS[args.preset]
    default_out = scaling.DEFAULT_OUT[args.preset]
    try:
        if args.bench_preset is not None:
            bench_arms = get_preset(args.bench_preset).design.arms
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
    parser = decode_parser()
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
    write_result_json(out, result)
    print(f"{'method':>6} {'context':>8} {'ms/token':>9} {'mean':>8} {'max':>8} {'prefill ms':>11}")
    for r in result["rows"]:
        print(
            f"{r['method']:>6} {r['context']:>8} {r['per_token_ms']:>9.3f} "
            f"{r['per_token_mean_ms']:>8.3f} {r['per_token_max_ms']:>8.3f} {r['prefill_ms']:>11.1f}"
        )
    target = result["summary"]["target"]
    verdict = "met" if target["met"] else "NOT met"
    print(
        f"{target['statement']}: ratio {target['ratio']:.2f}, with the redraw "
        f"{target['ratio_with_redraw']:.2f} -> {verdict}"
    )
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
    results_check.check_study(args.preset)  # every file whole, sealed, well-typed
    index = study.write_study_index(args.preset)  # study.json: where every reader starts
    print(f"study index: {paths.study_json(args.preset)} ({len(index['tracks'])} track(s))")
    if args.readme is None or text is None:
        print(readme.render(args.preset))  # the full summary (the report's appendix E)
        return
    block = readme_table.readme_block(args.preset)  # the README's short table
    try:
        atomic_write_text(args.readme, readme.replace_block(text, block))
    except OSError as err:
        parser.error(f"argument --readme: cannot write {args.readme} ({err.strerror or err})")
    print(f"updated the summary block of {args.readme}")


# --------------------------------------------------------------------------- cost


def cost_main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = cost_parser()
    args = parser.parse_args(argv)
    low, high = COST_STEPS_RANGE
    if not low <= args.steps <= high:
        parser.error(f"argument --steps: must be in [{low}, {high}], got {args.steps}")
    if args.longctx is not None:
        return cli_longrange.longctx_cost_main(parser, args)
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
    "longctx": (
        longctx_main,
        "long-context training: exact vs low-rank arms at each preset's "
        "lengths (--preset; up to 4,096 tokens)",
    ),
    "report": (report_main, "run the study and render the HTML report"),
    "scaling": (scaling_main, "attention latency against length and rank"),
    "decode": (decode_main, "per-token decoding latency against context length"),
    "summary": (summary_main, "the study's results in Markdown (the README's results block)"),
    "cost": (cost_main, "predict each bench's CPU time from its configuration (probes)"),
    "steptime": (cli_longrange.steptime_main, "every arm's training step, one thread, interleaved"),
    "decision": (cli_longrange.decision_main, "the long-range decision study: power, reading"),
    "swap": (swap_command.main, "audit your own model with its SDPA calls swapped (docs/swap.md)"),
    "rank-law": (rank_law_command.main, "what sets the rank (docs/rank_law.md)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: python -m rpka COMMAND [options]\n\ncommands:\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    numerics.check()  # warns if torch ran before rpka could pin its CPU kernels
    try:
        with stop_on_signals():
            COMMANDS[argv[0]][0](argv[1:])
    except CorruptFileError as err:  # a result file a reader cannot use: name it, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM (Interrupted)
        return interrupted_status(err)
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
