"""The drop-in reading of one rank-law cell (issue 41, items 2, 5 and 7).

Exact attention's trained model of the cell (its evaluation run: every grid seed, stacked,
``rpka.study.rank_law.grid``) gets RPKA, uniform landmarks (``nystrom-uniform``) and the key
coreset swapped in at ranks 2, 4, 8, ... (no retraining, float32, ``rpka.study.dropin``'s swap)
and is scored on each seed's own test windows. Per seed the gap recovered against the
trained control on that seed (``rpka.verdict.frontier.per_seed_gap``):

    g_s(r) = (control_s - method_s(r)) / (control_s - exact_s)

A method's ladder stops at the first rank where g_s >= :data:`MARGIN_GAP` on every seed:
its **drop-in r*** (the every-seed rule; the mean's interval is beside it,
``rpka.verdict.decision.gap_recovered``), or at :data:`RANK_CAP` (r* censored: above it). Beside it:

* P(RPKA better than uniform) at every rank both read (``probability_of_improvement``);
* the **effective rank** of exact's trained heads: the smallest rank whose best rank-r
  approximation leaves at most :data:`EFFECTIVE_RESIDUAL` of the trace of the Gaussian
  kernel RPKA pivots (``rpka.kernel.spectrum``'s ``residual_optimal``), and the same for the
  attention matrix P's Frobenius norm - does the spectrum predict r*?

Written to ``<cell dir>/rank_dropin.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rpka import paths
from rpka.attention import LANDMARK_METHODS
from rpka.attention.rpcholesky import gaussian_kernel
from rpka.bench.jobs import ensure_weights
from rpka.config.presets_tracks import MEAN_CONTROL
from rpka.io import (
    TIMING_KEYS,
    read_json,
    read_run_file,
    write_result_and_timings,
)
from rpka.kernel.matrix import pivot_points
from rpka.paths import BENCH_REPORT_FILE, resolve
from rpka.study.dropin import full_rank, swapped_model
from rpka.study.rank_law.grid import Cell, cell_dir, describe
from rpka.tracks import get_task
from rpka.tracks.cache import DEFAULT_DATA_DIR
from rpka.training.seed_data import run_splits
from rpka.training.train import evaluate, track_config_of
from rpka.training.trained import load_run_state
from rpka.verdict.decision import MARGIN_GAP, NON_INFERIOR, gap_recovered
from rpka.verdict.frontier import per_seed_gap, probability_of_improvement

METHODS = LANDMARK_METHODS  # RPKA and the peers that pick points (the registry)
FIRST_RANK = 2
# the ladder's last rank: n / 2 at 512 tokens, n / 8 at 2,048. A rank-256 reading of one cell
# at 512 tokens costs ~40 CPU-s per method (4 seeds x 256 windows), ~4x that at 2,048, and
# doubling the rank more than doubles it; a cell whose r* lies above is censored (> 256)
RANK_CAP = 256
EFFECTIVE_RESIDUAL = 0.05  # effective rank: residual trace (or P's error) at most 5 %
SPECTRUM_ITEMS = 2  # test windows of seed 0 whose heads the effective rank reads
EVAL_BATCH = 64
DROPIN_FILE = "rank_dropin.json"
WHAT = (__doc__ or "").split("\n\n")[0]  # the file's "what": this docstring's first paragraph
METRIC = "mse"


def ladder(method: str, n_tokens: int) -> list[int]:
    """Ranks 2, 4, 8, ... up to :data:`RANK_CAP` (or the method's full rank, if lower)."""
    top = min(RANK_CAP, full_rank(method, n_tokens))
    return [2**i for i in range(1, 64) if FIRST_RANK <= 2**i <= top]


def pivot_method(n_tokens: int, rank: int) -> str:
    """RPKA's sampler: the accelerated one (block + rejection) up to a quarter of the 2n
    joint points - at n = 2,048 and rank 128 about 5x faster than the plain loop - and the
    plain one above, where the accelerated one's rejection rounds stall (``rpka.study.dropin``).
    The same pivot law either way."""
    return "accelerated" if 4 * rank <= 2 * n_tokens else "plain"


def effective_rank(values: Tensor, residual: float) -> int:
    """The smallest r whose tail ``sum(values[r:]) / sum(values)`` is at most ``residual``:
    values descending and non-negative (eigenvalues, or squared singular values)."""
    tail = values.flip(0).cumsum(0).flip(0) / values.sum()
    below = (tail <= residual).nonzero()
    return int(below[0]) if len(below) else len(values)


def head_effective_ranks(q: Tensor, k: Tensor) -> dict[str, int]:
    """One head's effective ranks: q, k (n, d) -> the Gaussian kernel of RPKA's joint points
    (trace) and the attention matrix P = softmax(q k^T / sqrt(d)) (Frobenius norm)."""
    points = pivot_points(q.unsqueeze(0), k.unsqueeze(0))[0]
    eigen = torch.linalg.eigvalsh(gaussian_kernel(points, points)).flip(0).clamp(min=0)
    attention = torch.softmax(q.double() @ k.double().T / q.shape[-1] ** 0.5, -1)
    singular = torch.linalg.svdvals(attention).square()
    return {"kernel": effective_rank(eigen, EFFECTIVE_RESIDUAL),
            "attention": effective_rank(singular, EFFECTIVE_RESIDUAL)}  # fmt: skip


def model_effective_ranks(model: torch.nn.Module, x: Tensor) -> list[dict[str, Any]]:
    """Per layer and head of seed 0's model on its first test windows, the effective ranks
    (mean over :data:`SPECTRUM_ITEMS` windows). x: (S, N, ...) per-seed inputs."""
    first = x[:, :SPECTRUM_ITEMS].double()
    with torch.no_grad():
        per_layer = model.double().attention_inputs(first)
    rows = []
    for layer, (q, k, _) in enumerate(per_layer):
        for head in range(q.shape[1]):
            ranks = [head_effective_ranks(q[i, head], k[i, head]) for i in range(SPECTRUM_ITEMS)]
            mean = {key: float(np.mean([r[key] for r in ranks])) for key in ranks[0]}
            rows.append({"layer": layer, "head": head, **mean})
    return rows


def reached(g: Sequence[float | None]) -> bool:
    """Whether a rung reaches the margin: g >= :data:`MARGIN_GAP` on every seed that has a
    gap to recover (a seed where the control does not lose to exact reads NaN or None and is
    left out; -inf, a diverged arm, is read and misses), at least two of them."""
    values = np.asarray([np.nan if v is None else v for v in g], dtype=float)
    read = values[~np.isnan(values)]
    return len(read) >= 2 and bool(read.min() >= MARGIN_GAP)


def r_star(rows: list[dict[str, Any]], method: str) -> dict[str, Any]:
    """A method's drop-in r*: the smallest rank that :func:`reached` (None: not on the
    ladder), and the smallest whose mean g is non-inferior (one-sided t)."""
    own = [r for r in rows if r["method"] == method]
    every = next((r["rank"] for r in own if reached(r["g"])), None)
    mean = next((r["rank"] for r in own if r["gap"]["verdict"] == NON_INFERIOR), None)
    return {"every_seed": every, "mean_non_inferior": mean, "ranks_read": [r["rank"] for r in own]}


def pivoting(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """P(RPKA's test MSE below uniform landmarks') per rank both read, over the seeds."""
    by = {(r["method"], r["rank"]): r for r in rows}
    out = []
    for (method, rank), row in sorted(by.items()):
        peer = by.get(("nystrom-uniform", rank))
        if method == "rpka" and peer is not None:
            out.append(
                {"rank": rank, **probability_of_improvement(row[METRIC], peer[METRIC], "lower")}
            )
    return out


def per_seed(report: dict[str, Any], arm: str, seeds: list[int]) -> list[float]:
    """An arm's test metric per seed of ``seeds`` from a bench report."""
    entry = report["arms"][arm]
    by_seed = dict(zip(entry["seeds"], entry["full"]["per_seed"], strict=True))
    return [by_seed[s] for s in seeds]


@dataclass(frozen=True)
class TrainedCell:
    """A cell's exact model, as its bench trained it: the bench report, exact's evaluation
    run (every grid seed, stacked) with its configuration and checked weights, the task
    and each seed's own test split x, y (S, N, ...)."""

    report: dict[str, Any]
    run_file: Path
    run: dict[str, Any]
    run_config: dict[str, Any]
    state: dict[str, Tensor]
    task: Any
    x: Tensor
    y: Tensor

    @property
    def seeds(self) -> list[int]:
        return self.run["seeds"]


def bench_report_path(cell: Cell, results: str | Path) -> Path:
    """The cell's bench report: ``<cell dir>/longctx/context-<n>/bench_report.json``."""
    return cell_dir(cell, results) / paths.longctx_context_dir(cell.n) / BENCH_REPORT_FILE


def bench_report_of(cell: Cell, results: str | Path) -> dict[str, Any]:
    """The cell's bench report (:func:`bench_report_path`)."""
    return read_json(bench_report_path(cell, results))


def trained_cell(
    cell: Cell, results: str | Path, report: dict[str, Any] | None = None
) -> TrainedCell:
    """The :class:`TrainedCell` of ``cell`` (weights retrained from the committed run file
    where they are missing, ``rpka.bench.jobs.ensure_weights``)."""
    report = report or bench_report_of(cell, results)
    bench_dir = cell_dir(cell, results) / paths.longctx_context_dir(cell.n)
    run_file = bench_dir / "runs" / f"{report['arms']['exact']['run_ids'][0]}.json"
    run = read_run_file(run_file)
    run_config = {**run["config"], "device": "cpu"}
    ensure_weights(run_file, run_config.get("data_dir") or str(resolve(DEFAULT_DATA_DIR)))
    task = get_task(report["track"])
    x, y = run_splits(run_config, task, track_config_of(run_config))["test"]
    return TrainedCell(report, run_file, run, run_config, load_run_state(run_file, run), task,
                       x, y)  # fmt: skip


def cell_dropin(
    cell: Cell,
    results: str | Path,
    log: Callable[[str], None] | None = print,
    require_learnable: bool = True,
) -> dict[str, Any]:
    """The drop-in reading of ``cell`` (module docstring), written and returned; a cell
    whose exact model fails the learnability bar is only recorded as such, unless
    ``require_learnable`` is off."""
    report = bench_report_of(cell, results)
    learnable = bool(report["learnability"]["met"])
    if require_learnable and not learnable:  # no gap to recover: reported, not read
        result = {"what": WHAT, **describe(cell), "learnable": False,
                  "learnability": report["learnability"], "rows": [], "pivoting": [],
                  "r_star": {m: r_star([], m) for m in METHODS}, "effective_rank": []}  # fmt: skip
        write_result_and_timings(cell_dir(cell, results) / DROPIN_FILE, result, TIMING_KEYS)
        return result
    trained = trained_cell(cell, results, report)
    seeds = trained.seeds
    control_scores = per_seed(report, MEAN_CONTROL.name, seeds)

    def score(method: str, rank: int) -> list[float]:
        model = swapped_model(trained.run_config, trained.state, method, rank, torch.float32,
                              pivot_method=pivot_method(cell.n, rank))  # fmt: skip
        return evaluate(model, trained.task, trained.x, trained.y, EVAL_BATCH,
                        per_member=True)[METRIC].tolist()  # fmt: skip

    exact = score("exact", 1)
    rows = []
    for method in METHODS:
        for rank in ladder(method, cell.n):
            started = time.process_time()
            scores = score(method, rank)
            g = per_seed_gap(control_scores, exact, scores, "lower")
            rows.append({"method": method, "rank": rank, METRIC: scores,
                         "g": [None if np.isnan(v) else float(v) for v in g],
                         "gap": gap_recovered(g),
                         "cpu_s": time.process_time() - started})  # fmt: skip
            if log is not None:
                log(f"{cell.name} {method} r{rank}: g {np.round(g, 3).tolist()}")
            if reached(g):
                break
    model = swapped_model(trained.run_config, trained.state, "exact", 1, torch.float64)
    result = {
        "what": WHAT,
        **describe(cell),
        "run_file": str(trained.run_file),
        "seeds": seeds,
        "margin_gap": MARGIN_GAP,
        "exact": exact,
        "exact_in_bench": per_seed(report, "exact", seeds),
        "control": control_scores,
        "learnable": learnable,
        "rows": rows,
        "r_star": {m: r_star(rows, m) for m in METHODS},
        "pivoting": pivoting(rows),
        "effective_rank": model_effective_ranks(model, trained.x),
    }
    write_result_and_timings(cell_dir(cell, results) / DROPIN_FILE, result, TIMING_KEYS)
    return result
