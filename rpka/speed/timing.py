"""Interleaved forward timing of the attention op (issue 39): the harness one can publish.

Every arm is timed once per repeat, arms in turn within each repeat (so a burst of load
hits every arm alike), ``repeats`` >= ``MIN_REPEATS`` after ``warmup`` calls of each arm,
with CPU time (``time.process_time``, this process only) beside wall time. The arms use
the options a user gets by default (``check_inputs=True``); ``CHECK_OFF`` labels a second
RPKA row with the input check off. The load average is recorded before and after, with
the thread count; a load above the thread count is a warning in the result (``warnings``)
and on stderr. One thread is the headline (``--threads 1``).

    python -m rpka.speed.timing --lengths 2048 4096 8192 --threads 1 --out FILE.json

Forward only, without gradients (inference); peak memory and forward + backward remain
``python -m rpka scaling``'s (docs/speed.md, "Interleaved timing").
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from rpka import numerics
from rpka.attention import build
from rpka.io import write_result_json

MIN_REPEATS = 7
CHECK_OFF = "check_inputs=False"
STUDY_KEYS = 'key_precision="float64"'  # the key side every committed study ran (rpka.model)
# the arms: (label, method, options); ranks from --ranks are added as rpka / nystrom-uniform
BASE_ARMS: tuple[tuple[str, str, dict], ...] = (("exact", "exact", {}),)


def arms_for(
    ranks: Sequence[int], check_off: bool, study_keys: bool = False
) -> list[tuple[str, str, dict]]:
    """(label, method, options) of every arm: exact, RPKA and the uniform-landmark control
    at each rank with default options, and labelled RPKA rows if asked: without the input
    check, and with the float64 key side of the committed studies."""
    arms = list(BASE_ARMS)
    for r in ranks:
        arms.append((f"rpka-r{r}", "rpka", {"rank": r}))
        if check_off:
            arms.append((f"rpka-r{r} ({CHECK_OFF})", "rpka", {"rank": r, "check_inputs": False}))
        if study_keys:
            study = {"rank": r, "key_precision": "float64"}
            arms.append((f"rpka-r{r} ({STUDY_KEYS})", "rpka", study))
        arms.append((f"nystrom-uniform-r{r}", "rpka", {"rank": r, "pivot_rule": "uniform"}))
    return arms


ORDER_SEED = 0  # the arms' order per repeat: reproducible, and different every repeat


def interleaved(
    calls: dict[str, Callable[[], object]], warmup: int, repeats: int
) -> dict[str, dict[str, list[float]]]:
    """``{label: {"wall_ms": [...], "cpu_ms": [...]}}``: each call timed once per repeat,
    the labels in turn within a repeat, after ``warmup`` calls of each.

    Each repeat runs the labels in a fresh random order (seeded: ``ORDER_SEED``), so no arm
    runs right after the same one repeat after repeat: the arm after exact attention finds
    the caches filled with exact's data and reads 10-30 % slower (measured, one thread). A
    rotation is not enough - it keeps every neighbour - and under it ``rpka-r16`` followed
    exact in 8 of 9 repeats and read ~4 ms slower at 4,096 tokens than its own variants.
    """
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    times = {label: {"wall_ms": [], "cpu_ms": []} for label in calls}
    labels, order = list(calls), random.Random(ORDER_SEED)
    for _ in range(repeats):
        for label in order.sample(labels, len(labels)):
            fn = calls[label]
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[label]["cpu_ms"].append((time.process_time() - cpu) * 1e3)
            times[label]["wall_ms"].append((time.perf_counter() - wall) * 1e3)
    return times


def _load() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def measure_length(
    n: int, arms: list[tuple[str, str, dict]], batch_heads: int, head_dim: int, warmup: int,
    repeats: int, seed: int,
) -> list[dict]:  # fmt: skip
    """Rows of one length: q, k, v (1, batch_heads, n, head_dim) float32 from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, batch_heads, n, head_dim, generator=g) for _ in range(3))
    modules = {label: build(method, **options) for label, method, options in arms}

    def call(attn: torch.nn.Module) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return attn(q, k, v)

        return run

    times = interleaved({label: call(m) for label, m in modules.items()}, warmup, repeats)
    exact = {key: statistics.median(times["exact"][key]) for key in ("wall_ms", "cpu_ms")}
    rows = []
    for label, method, options in arms:
        row = {"n": n, "arm": label, "method": method, "options": options}
        for key in ("wall_ms", "cpu_ms"):
            median = statistics.median(times[label][key])
            row[f"forward_{key}"] = median
            row[f"forward_{key}_all"] = times[label][key]
            row[f"speedup_{key.split('_')[0]}"] = exact[key] / median
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> dict:
    """The whole sweep -> the result dict (written to ``args.out`` after each length)."""
    torch.set_num_threads(args.threads)
    arms = arms_for(args.ranks, args.check_off, args.study_keys)
    result = {
        "harness": "rpka.speed.timing (interleaved, CPU time beside wall time)",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "threads": torch.get_num_threads(),
        "numerics": numerics.record(),  # pinned or native kernels (rpka.numerics)
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "shapes": f"q, k, v: (1, {args.batch_heads}, n, {args.head_dim}) float32",
        "warmup": args.warmup,
        "repeats": args.repeats,
        "load_average_start": _load(),
        "rows": [],
        "warnings": [],
    }
    for n in args.lengths:
        load = _load()
        result["rows"] += [
            row | {"load_average_before": load, "load_average_after": _load()}
            for row in measure_length(
                n, arms, args.batch_heads, args.head_dim, args.warmup, args.repeats, args.seed
            )
        ]
        write_result_json(args.out, result)
    result["load_average_end"] = _load()
    loads = [x for x in (result["load_average_start"], result["load_average_end"]) if x]
    if any(load[0] > result["threads"] for load in loads):
        message = (
            f"load average {max(load[0] for load in loads):.2f} exceeds the thread count "
            f"{result['threads']}: timings are contended (CPU time is the steadier measure)"
        )
        result["warnings"].append(message)
        print(f"warning: {message}", file=sys.stderr)
    write_result_json(args.out, result)
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rpka.speed.timing", description=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-off", action="store_true", help=f"add an RPKA row with {CHECK_OFF}")
    p.add_argument("--study-keys", action="store_true", help=f"add an RPKA row with {STUDY_KEYS}")
    p.add_argument("--out", required=True, help="the JSON written")
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.repeats < MIN_REPEATS:
        raise SystemExit(f"--repeats must be >= {MIN_REPEATS}, got {args.repeats}")
    result = run(args)
    for row in result["rows"]:
        print(
            f"n={row['n']:>6}  {row['arm']:<34} cpu {row['forward_cpu_ms']:8.1f} ms "
            f"({row['speedup_cpu']:5.2f}x)  wall {row['forward_wall_ms']:8.1f} ms "
            f"({row['speedup_wall']:5.2f}x)"
        )
    return result


if __name__ == "__main__":
    main()
