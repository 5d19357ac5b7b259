"""Drop-in reading (issue 14 item 6) and trained-model exactness (issue 13 item 4).

Takes exact attention's trained model of a finished bench (its first evaluation run, the
weights saved beside the run file), swaps its attention for another method at inference -
no retraining - and scores the test split with the track's metric, per member (seed). At
full rank (RPKA: 2n joint points) the swap must reproduce exact's metric: the Nystrom
approximation is exact in exact arithmetic, so any gap there is numerics on the sharp,
trained Q/K. Also records the logit standard deviation of every layer (how sharp the
trained heads are) and, per method and rank, the relative attention output error against
exact SDPA on the first test items (``rpka.quality.method_output_errors``, float64).

    PYTHONPATH=. python scripts/drop_in.py --bench-dir data/results/full/forecast-motif \
        [--ranks 16 32 64 full] [--methods rpka nystrom-uniform keys-coreset] \
        [--windows 500] [--out data/results/full/forecast-motif/drop_in.json]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch

from rpka.attention import options_of
from rpka.frontier import causal_block_of
from rpka.io import read_json, write_json
from rpka.quality import method_output_errors
from rpka.spectrum import qk_norm_ratio
from rpka.tracks import get_task
from rpka.train import build_model, evaluate, load_state, track_config_of

DEFAULT_METHODS = ("rpka", "nystrom-uniform", "keys-coreset")


def full_rank(method: str, n_tokens: int) -> int:
    """The rank at which a method's landmarks span every point: 2n joint points for RPKA
    and uniform Nystrom (queries and keys), n for the keys-only coreset."""
    return n_tokens if method == "keys-coreset" else 2 * n_tokens


def swapped_model(
    run_config: dict,
    state: dict,
    method: str,
    rank: int,
    dtype: torch.dtype,
    causal_block: int | None = None,
):
    """Exact's trained weights in a model whose attention is ``method`` at ``rank``
    (on a causal track with the trained RPKA arms' ``causal_block``: without it RPKA's
    default block of 64 would compute a 64-token sequence exactly at any rank)."""
    options = {"rank": rank} if "rank" in options_of(method) else {}
    if causal_block is not None and "causal_block" in options_of(method):
        options["causal_block"] = causal_block
    if "pivot_method" in options_of(method) and rank > 64:
        # the accelerated sampler's rejection rounds stall as the residual runs out (near
        # full rank: 12 CPU-min for one rank-192 evaluation); same pivot law, one per step
        options["pivot_method"] = "plain"
    config = {**run_config, "arm": {"name": method, "method": method, "options": options}}
    model = build_model(config, track_config_of(config), torch.device("cpu"))
    model.load_state_dict(state)
    return model.to(dtype).eval()


def logit_std(qkv_per_layer: list) -> list[float]:
    """Standard deviation of q.k / sqrt(d) per layer (every item, head and pair)."""
    return [
        float((q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])).std())
        for q, k, _ in qkv_per_layer
    ]


def qk_norm_ratios(qkv_per_layer: list) -> list[list[float]]:
    """Per layer and head: :func:`rpka.spectrum.qk_norm_ratio`, the median over items."""
    return [qk_norm_ratio(q, k).median(0).values.tolist() for q, k, _ in qkv_per_layer]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, required=True)
    parser.add_argument("--ranks", nargs="+", default=["16", "32", "64", "full"])
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    parser.add_argument("--items", type=int, default=4, help="test items of the output error")
    parser.add_argument(
        "--windows", type=int, help="score the first N test items only (default: all)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    report = read_json(args.bench_dir / "bench_report.json")
    run_file = args.bench_dir / "runs" / f"{report['arms']['exact']['run_ids'][0]}.json"
    run = read_json(run_file)
    run_config = {**run["config"], "device": "cpu"}
    state = load_state(run_file.with_suffix(".pt"))
    task = get_task(report["track"])
    track = task.load(track_config_of(run_config), run_config.get("data_dir"))
    x, y = task.inputs_targets(track, "test")
    if args.windows is not None:
        if args.windows < 1:
            parser.error(f"--windows must be an integer >= 1, got {args.windows}")
        x, y = x[: args.windows], y[: args.windows]
    metric = report["metric"]
    causal_block = causal_block_of(report)  # the trained arms' block (None: non-causal)
    tokens = track_config_of(run_config).attention_tokens
    exact = swapped_model(run_config, state, "exact", 1, torch.float64)
    first = x[: args.items].double() if x.is_floating_point() else x[: args.items]
    with torch.no_grad():
        stacked = exact.attention_inputs(first.expand(exact.n_members, *first.shape))
    qkv = [tuple(t[: len(first)] for t in layer) for layer in stacked]  # member 0
    # "full" covers every point of the test inputs, which may be longer than the training
    # sequences (recall scores 4x the training length): rank 2n of the training n is not
    # full rank there
    tokens = max(tokens, qkv[0][0].shape[-2])
    result: dict[str, Any] = {
        "what": __doc__.split("\n\n")[0],
        "bench_report": str(args.bench_dir / "bench_report.json"),
        "run_file": str(run_file),
        "track": report["track"],
        "metric": metric,
        "members": run["seeds"],
        "causal_block": causal_block,
        "n_test_items": len(x),
        "logit_std_per_layer": logit_std(qkv),
        "qk_norm_ratio_per_layer_head": qk_norm_ratios(qkv),
        "exact": {},
        "rows": [],
    }
    for dtype in (torch.float32, torch.float64):
        model = swapped_model(run_config, state, "exact", 1, dtype)
        scores = evaluate(model, task, x.to(dtype) if x.is_floating_point() else x, y, 256)
        result["exact"][str(dtype).split(".")[1]] = scores[metric].tolist()
    for method in args.methods:
        for rank_arg in args.ranks:
            rank = full_rank(method, tokens) if rank_arg == "full" else int(rank_arg)
            for dtype in (torch.float32, torch.float64):
                start = time.perf_counter()
                model = swapped_model(run_config, state, method, rank, dtype, causal_block)
                inputs = x.to(dtype) if x.is_floating_point() else x
                scores = evaluate(model, task, inputs, y, 256)
                row = {
                    "method": method,
                    "rank": rank,
                    "full_rank": rank_arg == "full",
                    "dtype": str(dtype).split(".")[1],
                    metric: scores[metric].tolist(),
                    "seconds": time.perf_counter() - start,
                }
                result["rows"].append(row)
                print(method, rank, row["dtype"], [round(v, 4) for v in row[metric]], flush=True)
            block = {"causal_block": causal_block} if causal_block else {}
            errors = method_output_errors(qkv, method, block, [rank], seeds=3)
            result["rows"][-1]["output_error"] = errors[0]
    out = args.out or args.bench_dir / "drop_in.json"
    write_json(out, result)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
