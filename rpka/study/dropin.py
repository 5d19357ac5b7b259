"""Drop-in reading (issue 14 item 6) and trained-model exactness (issue 13 item 4).

Takes exact attention's trained model of a finished bench (its first evaluation run, the
weights saved beside the run file; retrained from the run file when they are missing,
``rpka.bench.jobs.ensure_weights``), swaps its attention for another method at inference -
no retraining - and scores the test split with the track's metric, per member (seed). At
full rank (RPKA: 2n joint points) the swap must reproduce exact's metric: the Nystrom
approximation is exact in exact arithmetic, so any gap there is numerics on the sharp,
trained Q/K. Also records the logit standard deviation of every layer (how sharp the
trained heads are) and, per method and rank, the relative attention output error against
exact SDPA on the first test items (``rpka.quality.method_output_errors``, float64).

:func:`drop_in` computes it and writes ``<bench_dir>/drop_in.json`` (or ``out``);
``scripts/drop_in.py`` is its command line. ``rpka.frontier.drop_in_curve`` reads the file.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rpka.attention import LANDMARK_METHODS, METHOD_INFO, options_of
from rpka.bench.jobs import ensure_weights
from rpka.io import (
    TIMING_KEYS,
    read_json,
    read_run_file,
    write_result_and_timings,
)
from rpka.kernel.quality import method_output_errors
from rpka.kernel.spectrum import qk_norm_ratio
from rpka.paths import BENCH_REPORT_FILE, DROP_IN_FILE, resolve
from rpka.tracks import get_task
from rpka.tracks.cache import DEFAULT_DATA_DIR
from rpka.training.train import build_model, evaluate, track_config_of
from rpka.training.trained import load_run_state
from rpka.verdict.frontier import causal_block_of

DEFAULT_METHODS = LANDMARK_METHODS  # RPKA and the peers that pick points (the registry)
DEFAULT_RANKS = ("16", "32", "64", "full")
EVAL_BATCH = 256
# the "what" of drop_in.json: this docstring's first paragraph (the script's, before)
WHAT = (__doc__ or "").split("\n\n")[0]


def full_rank(method: str, n_tokens: int) -> int:
    """The rank at which a method's landmarks span every point: 2n joint points where they
    are drawn from queries and keys (RPKA, uniform Nystrom), n where from the keys alone
    (the key coreset; ``rpka.attention.METHOD_INFO``'s ``landmarks``)."""
    return n_tokens if METHOD_INFO[method].landmarks == "keys" else 2 * n_tokens


def swapped_model(
    run_config: dict,
    state: dict,
    method: str,
    rank: int,
    dtype: torch.dtype,
    causal_block: int | None = None,
    pivot_method: str | None = None,
):
    """Exact's trained weights in a model whose attention is ``method`` at ``rank``
    (on a causal track with the trained RPKA arms' ``causal_block``: without it RPKA's
    default block of 64 would compute a 64-token sequence exactly at any rank).
    ``pivot_method``: RPKA's pivot sampler (None: the plain one above rank 64, below
    it the default)."""
    options = {"rank": rank} if "rank" in options_of(method) else {}
    if causal_block is not None and "causal_block" in options_of(method):
        options["causal_block"] = causal_block
    if "pivot_method" in options_of(method) and pivot_method is not None:
        options["pivot_method"] = pivot_method
    elif "pivot_method" in options_of(method) and rank > 64:
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
    """Per layer and head: :func:`rpka.kernel.spectrum.qk_norm_ratio`, the median over items."""
    return [qk_norm_ratio(q, k).median(0).values.tolist() for q, k, _ in qkv_per_layer]


def _scores(model, task, x: Tensor, y: Tensor, dtype: torch.dtype, metric: str) -> list[float]:
    inputs = x.to(dtype) if x.is_floating_point() else x
    return evaluate(model, task, inputs, y, EVAL_BATCH)[metric].tolist()


def drop_in(
    bench_dir: str | Path,
    ranks: Sequence[str] = DEFAULT_RANKS,
    methods: Sequence[str] = DEFAULT_METHODS,
    items: int = 4,
    windows: int | None = None,
    out: str | Path | None = None,
    data_dir: str | None = None,
    log: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """The drop-in reading of the finished bench in ``bench_dir`` (module docstring):
    every method at every rank (an integer, or "full": :func:`full_rank` of the longest
    test input) in float32 and float64, on the first ``windows`` test items (all when
    None), the output error on the first ``items``. Written to ``out`` (default
    ``<bench_dir>/drop_in.json``) and returned. ``data_dir``: the track cache (the run's
    own, else the default), also where missing weights are retrained from."""
    if windows is not None and windows < 1:
        raise ValueError(f"windows must be an integer >= 1, got {windows}")
    bench_dir = Path(bench_dir)
    report = read_json(bench_dir / BENCH_REPORT_FILE)
    run_file = bench_dir / "runs" / f"{report['arms']['exact']['run_ids'][0]}.json"
    run = read_run_file(run_file)
    run_config = {**run["config"], "device": "cpu"}
    data_dir = data_dir or run_config.get("data_dir")
    ensure_weights(run_file, data_dir or str(resolve(DEFAULT_DATA_DIR)))
    state = load_run_state(run_file, run)  # the weights the run saved, checked
    task = get_task(report["track"])
    track = task.load(track_config_of(run_config), data_dir)
    x, y = task.inputs_targets(track, "test")
    if windows is not None:
        x, y = x[:windows], y[:windows]
    metric = report["metric"]
    causal_block = causal_block_of(report)  # the trained arms' block (None: non-causal)
    qkv = first_attention_inputs(
        swapped_model(run_config, state, "exact", 1, torch.float64), x, items
    )
    # "full" covers every point of the test inputs, which may be longer than the training
    # sequences (recall scores 4x the training length): rank 2n of the training n is not
    # full rank there
    tokens = max(track_config_of(run_config).attention_tokens, qkv[0][0].shape[-2])
    result: dict[str, Any] = {
        "what": WHAT,
        "bench_report": str(bench_dir / BENCH_REPORT_FILE),
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
        result["exact"][str(dtype).split(".")[1]] = _scores(model, task, x, y, dtype, metric)
    swap = Swap(run_config, state, task, x, y, metric, causal_block)
    for method in methods:
        for rank_arg in ranks:
            rank = full_rank(method, tokens) if rank_arg == "full" else int(rank_arg)
            result["rows"] += swap.rows(method, rank, rank_arg == "full", log)
            block = {"causal_block": causal_block} if causal_block else {}
            errors = method_output_errors(qkv, method, block, [rank], seeds=3)
            result["rows"][-1]["output_error"] = errors[0]
    write_result_and_timings(
        Path(out) if out is not None else bench_dir / DROP_IN_FILE, result, TIMING_KEYS
    )
    return result


def first_attention_inputs(exact: torch.nn.Module, x: Tensor, items: int) -> list[tuple]:
    """q, k, v per layer of exact's model on the first ``items`` test inputs, float64
    where the inputs are (ensemble member 0): ``[(q, k, v)]``, each (items, H, n, d)."""
    first = x[:items].double() if x.is_floating_point() else x[:items]
    with torch.no_grad():
        stacked = exact.attention_inputs(first.expand(exact.n_members, *first.shape))
    return [tuple(t[: len(first)] for t in layer) for layer in stacked]


@dataclass
class Swap:
    """Exact's trained model and the test data it is scored on, with its attention swapped."""

    run_config: dict
    state: dict
    task: Any
    x: Tensor
    y: Tensor
    metric: str
    causal_block: int | None

    def rows(
        self, method: str, rank: int, full: bool, log: Callable[[str], None] | None
    ) -> list[dict[str, Any]]:
        """``method`` at ``rank`` in float32, then float64: the test metric per member."""
        rows = []
        for dtype in (torch.float32, torch.float64):
            start = time.perf_counter()
            model = swapped_model(
                self.run_config, self.state, method, rank, dtype, self.causal_block
            )
            row = {
                "method": method,
                "rank": rank,
                "full_rank": full,
                "dtype": str(dtype).split(".")[1],
                self.metric: _scores(model, self.task, self.x, self.y, dtype, self.metric),
                "seconds": time.perf_counter() - start,
            }
            rows.append(row)
            if log is not None:
                log(f"{method} {rank} {row['dtype']} {[round(v, 4) for v in row[self.metric]]}")
        return rows
