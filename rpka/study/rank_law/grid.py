"""The rank-law grid's cells and their training (issue 41, items 1-2).

A cell is the long-range lookup task (``forecast-lookup``, ``rpka.tracks.lookup``) at one
point of the grid: ``p`` distinct cue-payload pairs (the query asks one of them), ``n``
tokens, head dimension ``d_head`` and a ``background`` (noise, or a few repeated patterns:
near-duplicate points). Everything else is the long-range study's (``rpka.config.presets_longctx``:
model, 500 steps of batch 8, one learning rate, the curriculum from 512 tokens above it,
each seed its own data, ``rpka.training.seed_data``).

Per cell only exact attention and the ``mean-attention`` control are trained, on
:data:`GRID_SEEDS`: the drop-in (``rpka.study.rank_law.dropin``) swaps the other methods into
exact's trained model, and the gap it recovers is measured against the control on the same
seed. The cell's bench compares mean-attention with exact (its "primary"): that comparison
says whether attention matters in the cell at all.

How many copies of each pair: ``max(1, 8 // p)`` - p = 1 is the long-range study's task
(one pair, eight copies, the fewest that learned there); from p = 8 on, each pair once. A
cell whose pairs do not fit before the local window's tail is not in the grid (p = 64 at
512 tokens: 64 pairs of 16 steps need 1,024); where they do not fit at 512 the curriculum
starts at the shortest multiple of 256 tokens where they do (p = 64: 1,280).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpka.checks import is_int, require
from rpka.config.bench import LongContextConfig
from rpka.config.parts import peer_arm, rpka_arm
from rpka.config.presets_longctx import (
    LONGCTX_MODEL,
    LONGCTX_RESIDUAL_SOLVE,
    LONGRANGE_TRACK,
    LONGRANGE_TRAIN,
    LONGRANGE_WARM_START,
    long_preset,
)
from rpka.config.presets_tracks import EXACT, MEAN_CONTROL
from rpka.model import ModelConfig
from rpka.paths import RANK_LAW_RESULTS
from rpka.tracks.lookup import BACKGROUNDS, LookupConfig

GRID_SEEDS = (300, 301, 302, 303)  # evaluation seeds no other study used, own data each
CONFIRM_SEEDS = tuple(range(300, 308))  # the trained confirmation's 8 (the grid's 4 first)
CONFIRM_SEEDS_PER_JOB = 4
GRID_PAIRS = (1, 4, 16, 64)
GRID_LENGTHS = (512, 2048)
HEAD_DIM_PAIRS = (1, 16)  # the head-dimension cells: d 64 at 512 tokens, noise
COPIES_TOTAL = 8  # p = 1's copies; max(1, 8 // p) per pair
TRAIN_WINDOWS, EVAL_WINDOWS = 4000, 256
WARM_STEP = 256  # the curriculum's first length where 512 cannot hold the pairs


@dataclass(frozen=True)
class Cell:
    """One point of the grid: ``p`` pairs, ``n`` tokens, head dimension ``d_head``,
    ``background`` (``rpka.tracks.lookup.BACKGROUNDS``)."""

    p: int
    n: int
    d_head: int = 16
    background: str = "noise"

    @property
    def name(self) -> str:
        return f"p{self.p}-n{self.n}-d{self.d_head}-{self.background}"

    @property
    def copies(self) -> int:
        return max(1, COPIES_TOTAL // self.p)

    def fits(self, n: int) -> bool:
        """Whether the pairs fit before the last ``min_distance`` of ``n`` tokens."""
        need = self.p * self.copies * LONGRANGE_TRACK.pair_length
        return need <= n - LONGRANGE_TRACK.min_distance

    @property
    def warm_start(self) -> int | None:
        """The curriculum's first length: 512 (the long-range study's), else the shortest
        multiple of :data:`WARM_STEP` where the pairs fit; None when that is not below n."""
        warm = LONGRANGE_WARM_START
        while not self.fits(warm):
            warm += WARM_STEP
        return warm if warm < self.n else None

    def track(self) -> LookupConfig:
        """The lookup task of this cell (at the template's context; resized per length)."""
        return dataclasses.replace(
            LONGRANGE_TRACK,
            n_pairs=self.p,
            n_cues=self.p,
            n_copies=self.copies,
            background=self.background,
        )

    def model(self) -> ModelConfig:
        """The long-range model; at ``d_head`` 64 one head of 64 (d_model 64)."""
        if self.d_head == LONGCTX_MODEL.d_model // LONGCTX_MODEL.n_heads:
            return LONGCTX_MODEL
        return dataclasses.replace(
            LONGCTX_MODEL, d_model=self.d_head, n_heads=1, d_ff=2 * self.d_head
        )

    def validate(self) -> None:
        require(self.background in BACKGROUNDS, "background", f"one of {BACKGROUNDS}",
                self.background)  # fmt: skip
        require(self.d_head in (16, 64), "d_head", "16 or 64", self.d_head)
        require(
            self.fits(self.n),
            "p",
            f"pairs that fit before the last {LONGRANGE_TRACK.min_distance} of {self.n} "
            f"tokens (p x copies x {LONGRANGE_TRACK.pair_length} <= "
            f"{self.n - LONGRANGE_TRACK.min_distance})",
            self.p,
        )


def grid_cells() -> list[Cell]:
    """The grid (issue 41 item 2): p x length x background at head dimension 16 (where the
    pairs fit), then head dimension 64 at 512 tokens for p in :data:`HEAD_DIM_PAIRS`."""
    cells = []
    for n in GRID_LENGTHS:
        for background in BACKGROUNDS:
            for p in GRID_PAIRS:
                cell = Cell(p, n, 16, background)
                if cell.fits(n):
                    cells.append(cell)
    cells += [Cell(p, 512, 64, "noise") for p in HEAD_DIM_PAIRS]
    return cells


def parse_cell(name: str) -> Cell:
    """The cell named ``p<p>-n<n>-d<d>-<background>`` (:attr:`Cell.name`), validated."""
    try:
        p, n, d, background = name.split("-", 3)
        cell = Cell(int(p[1:]), int(n[1:]), int(d[1:]), background)
    except ValueError as err:
        raise ValueError(f"cell must read p<int>-n<int>-d<int>-<background>, got {name!r}") from err
    cell.validate()
    return cell


def cell_config(
    cell: Cell, seeds: tuple[int, ...] = GRID_SEEDS, workers: int = 1, **scale: Any
) -> LongContextConfig:
    """The cell's study: exact and the control at ``cell.n`` tokens (after the curriculum's
    first length below it). ``scale`` replaces the windows (``train_windows``,
    ``eval_windows``) or the bench's ``model`` / ``train`` (tests run a cell in seconds)."""
    cell.validate()
    windows = {"train_windows": TRAIN_WINDOWS, "eval_windows": EVAL_WINDOWS}
    windows |= {k: scale.pop(k) for k in list(scale) if k in windows}
    bench = {"model": cell.model(), "train": LONGRANGE_TRAIN} | scale
    return long_preset(
        f"rank-law-{cell.name}",
        (cell.n,),
        windows["train_windows"],
        windows["eval_windows"],
        cell.track(),
        (EXACT, MEAN_CONTROL),
        cell.warm_start,
        primary_arm=MEAN_CONTROL.name,
        learning_rates=(1e-2,),
        sweep_seeds=(0,),
        eval_seeds=seeds,
        data_per_seed=True,
        seeds_per_job=len(seeds),
        n_workers=workers,
        **bench,
    )


def confirmation_config(cell: Cell, rank: int, workers: int = 1, **scale: Any) -> LongContextConfig:
    """The trained confirmation of a cell (issue 41 item 4): RPKA and uniform landmarks
    trained at ``rank`` (the drop-in r*) and at half of it beside exact and the control,
    :data:`CONFIRM_SEEDS` (each its own data), the long-range study's rate and steps; the
    primary is RPKA at ``rank``; ``scale`` as :func:`cell_config`'s."""
    require(is_int(rank) and rank >= 2 and rank % 2 == 0, "rank", "an even integer >= 2", rank)
    arms = [
        arm
        for r in (rank, rank // 2)
        for arm in (
            rpka_arm(r, residual_solve=LONGCTX_RESIDUAL_SOLVE),
            peer_arm("nystrom-uniform", r),
        )
    ]
    base = cell_config(cell, CONFIRM_SEEDS, workers, **scale)
    bench = base.bench.replace(
        preset=f"rank-law-confirm-{cell.name}-r{rank}",
        arms=(*base.bench.design.arms, *arms),
        primary_arm=arms[0].name,
        seeds_per_job=CONFIRM_SEEDS_PER_JOB,
    )
    config = dataclasses.replace(base, preset=bench.preset, bench=bench)
    config.validate()
    return config


def cell_dir(cell: Cell, results: str | Path = RANK_LAW_RESULTS) -> Path:
    """Where a cell's study lives: ``<results>/<cell name>/``."""
    return Path(results) / cell.name


def confirmation_dir(cell: Cell, rank: int, results: str | Path = RANK_LAW_RESULTS) -> Path:
    """Where a cell's trained confirmation at ``rank`` lives: ``<cell dir>/trained-r<rank>``."""
    return cell_dir(cell, results) / f"trained-r{rank}"


def describe(cell: Cell) -> dict[str, Any]:
    """The cell's coordinates for the index (``rank_law.json``)."""
    return {"cell": cell.name, "p": cell.p, "n": cell.n, "d_head": cell.d_head,
            "background": cell.background, "copies": cell.copies}  # fmt: skip
