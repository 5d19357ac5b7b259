"""The rank-law study (issue 41): the lookup task's background knob, the grid's cells, the
drop-in's pieces against independent references, the fit, and one cell end to end."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rpka.config.bench import TrainConfig
from rpka.config.presets_longctx import LONGRANGE_TRACK
from rpka.kernel.spectrum import head_spectrum
from rpka.study.longctx import run_longctx
from rpka.study.rank_law import command as rank_law_command
from rpka.study.rank_law import dropin as rank_dropin
from rpka.study.rank_law import law
from rpka.study.rank_law.grid import (
    Cell,
    cell_config,
    cell_dir,
    confirmation_config,
    confirmation_dir,
    grid_cells,
    parse_cell,
)
from rpka.tracks.cache import cache_path, track_fields
from rpka.tracks.lookup import LookupConfig, background_patterns, generate

# --------------------------------------------------------------------------- the task's knob


def test_default_background_keeps_run_ids_and_cache_names():
    """The new knobs at their defaults are not in what run ids and cache names hash."""
    fields = track_fields(LONGRANGE_TRACK)
    assert not {"background", "n_patterns", "pattern_length"} & set(fields)
    assert fields == {k: v for k, v in dataclasses.asdict(LONGRANGE_TRACK).items()
                      if k not in LookupConfig.later_fields}  # fmt: skip
    patterned = dataclasses.replace(LONGRANGE_TRACK, background="patterns")
    assert track_fields(patterned)["background"] == "patterns"
    assert cache_path(patterned) != cache_path(LONGRANGE_TRACK)


def test_patterns_background_is_the_tiled_patterns():
    """Without observation noise, every background step is its tile's pattern step, and the
    pairs and the query are where the layout says (the noise background draws N(0, 1))."""
    config = LookupConfig(context=256, n_pairs=2, n_cues=2, min_distance=40, noise=0.0,
                          background="patterns", n_patterns=3, pattern_length=8)  # fmt: skip
    drawn = generate(config, 5, np.random.default_rng(0))
    raw, patterns = drawn["raw"], background_patterns(config)
    covered = np.zeros(raw.shape, dtype=bool)
    for i in range(config.n_slots):
        for row, start in enumerate(drawn["cue_start"][:, i]):
            covered[row, start : start + config.pair_length] = True
    covered[:, config.context - config.cue_length :] = True  # the query cue and the target
    tiles = raw[:, : (raw.shape[1] // 8) * 8].reshape(5, -1, 8)
    free = ~covered[:, : tiles.shape[1] * 8].reshape(5, -1, 8).any(-1)
    matches = [(np.abs(tile - patterns).max(-1) == 0).any() for tile in tiles[free]]
    assert free.sum() > 20 and all(matches)
    assert len({tuple(t) for t in tiles[free]}) <= config.n_patterns


@pytest.mark.parametrize(
    ("change", "field"),
    [({"background": "stripes"}, "background"), ({"n_patterns": 0}, "n_patterns"),
     ({"pattern_length": 0}, "pattern_length")],
)  # fmt: skip
def test_bad_background_knobs_are_refused_by_name(change, field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(LONGRANGE_TRACK, **change).validate()


# --------------------------------------------------------------------------- the grid


def test_grid_cells_fit_and_round_trip():
    cells = grid_cells()
    assert len(cells) == 16 and len(set(cells)) == 16
    assert all(parse_cell(c.name) == c for c in cells)
    assert Cell(64, 2048).warm_start == 1280 and Cell(1, 2048).warm_start == 512
    assert Cell(16, 512).warm_start is None and Cell(32, 1024).warm_start == 768
    config = cell_config(Cell(4, 2048, 16, "patterns"))
    assert config.bench.design.track.n_pairs == 4 and config.bench.design.track.n_copies == 2
    assert config.bench.design.data_per_seed and [a.name for a in config.bench.design.arms] == [
        "exact", "mean-attention"]  # fmt: skip


@pytest.mark.parametrize("name", ["p64-n512-d16-noise", "p4-n512-d32-noise", "p4-n512-d16-x",
                                  "q4-n512"])  # fmt: skip
def test_bad_cells_are_refused(name):
    with pytest.raises(ValueError, match="p|d_head|background|cell"):
        parse_cell(name)


# --------------------------------------------------------------------------- drop-in pieces


def test_ladder_stops_at_the_cap_or_full_rank():
    assert rank_dropin.ladder("rpka", 512) == [2, 4, 8, 16, 32, 64, 128, 256]
    assert rank_dropin.ladder("keys-coreset", 64) == [2, 4, 8, 16, 32, 64]


def test_effective_rank_matches_the_spectrum_module():
    """The kernel's effective rank is where rpka.kernel.spectrum's residual_optimal first drops to
    5 % (an independent computation of the same eigenvalue tail)."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(40, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    ranks = list(range(1, 81))
    curve = head_spectrum(q, k, ranks, draws=1)["residual_optimal"]
    expected = next(r for r, value in zip(ranks, curve, strict=True) if value <= 0.05)
    assert rank_dropin.head_effective_ranks(q, k)["kernel"] == expected
    assert rank_dropin.effective_rank(torch.tensor([4.0, 3, 2, 1, 0]), 0.05) == 4


def test_r_star_is_the_first_rank_every_seed_reaches():
    def row(rank, g):
        return {"method": "rpka", "rank": rank, "g": g, "gap": {"verdict": "not shown"}}

    rows = [row(2, [0.5, 0.99]), row(4, [0.96, 0.94]), row(8, [0.97, 0.99])]
    assert rank_dropin.r_star(rows, "rpka")["every_seed"] == 8
    assert rank_dropin.r_star(rows[:2], "rpka")["every_seed"] is None


# --------------------------------------------------------------------------- the law


def _row(p, n, d, method_r):
    return {"cell": f"p{p}-n{n}-d{d}-noise", "p": p, "n": n, "d_head": d, "background": "noise",
            "learnable": True, "r_star_dropin": {"rpka": method_r}}  # fmt: skip


def test_fit_recovers_known_exponents_and_predicts():
    """r* = 2 p^0.5 n^1 exactly: the fit returns those exponents, R^2 = 1, and predicts an
    unseen cell; d does not vary, so its exponent reads None; a censored cell is listed."""
    rows = [_row(p, n, 16, 2 * p**0.5 * n) for p in (1, 4, 16) for n in (512, 2048)]
    rows.append(_row(64, 2048, 16, None))
    fit = law.fit_law(rows, "rpka")
    assert fit["exponents"]["p"] == pytest.approx(0.5) and fit["exponents"]["n"] == pytest.approx(1)
    assert fit["exponents"]["d_head"] is None and fit["censored"] == ["p64-n2048-d16-noise"]
    assert fit["r_squared"] == pytest.approx(1.0)
    predicted = law.predicted_r_star(fit, Cell(32, 1024))
    assert predicted == pytest.approx(2 * math.sqrt(32) * 1024)


def test_fit_needs_two_cells():
    assert law.fit_law([_row(1, 512, 16, 8)], "rpka")["exponents"] is None


# --------------------------------------------------------------------------- end to end


def test_one_cell_end_to_end(tmp_path):
    """A cell trained in seconds, read by the drop-in: exact's model scores what the bench
    recorded, every rung has a gap per seed, the file and the index are written."""
    cell = Cell(1, 288)
    tiny = {"train_windows": 16, "eval_windows": 8, "train": TrainConfig(1, 8, warmup_steps=0),
            "model": dataclasses.replace(cell.model(), d_model=8, n_heads=1, d_ff=16,
                                         embed_kernel=5)}  # fmt: skip
    config = cell_config(cell, seeds=(300, 301), **tiny)
    run_longctx(config, cell_dir(cell, tmp_path), progress=False, data_dir=tmp_path / "cache")
    skipped = rank_dropin.cell_dropin(cell, tmp_path, log=None)  # seconds of training: not
    assert skipped["learnable"] is False and skipped["rows"] == []  # learnable, not read
    result = rank_dropin.cell_dropin(cell, tmp_path, log=None, require_learnable=False)
    assert result["exact"] == pytest.approx(result["exact_in_bench"], rel=1e-5)
    assert {r["method"] for r in result["rows"]} == set(rank_dropin.METHODS)
    assert all(len(r["g"]) == 2 for r in result["rows"])
    assert (cell_dir(cell, tmp_path) / rank_dropin.DROPIN_FILE).exists()
    rows = law.cell_rows(tmp_path, [cell])
    assert rows[0]["cell"] == cell.name and rows[0]["effective_rank"]["kernel"] >= 1
    # the trained confirmation at rank 4 (and 2): RPKA and uniform, 8 seeds, read by the index
    confirm = confirmation_config(cell, 4, **tiny)
    assert [a.name for a in confirm.bench.design.arms][2:] == [
        "rpka-r4", "nystrom-uniform-r4", "rpka-r2", "nystrom-uniform-r2"]  # fmt: skip
    run_longctx(confirm, confirmation_dir(cell, 4, tmp_path), progress=False,
                data_dir=tmp_path / "cache")  # fmt: skip
    trained = law.trained_rows(tmp_path)
    assert {(r["arm"], r["trained_at"]) for r in trained} == {
        (a, "trained-r4")
        for a in ("rpka-r4", "nystrom-uniform-r4", "rpka-r2", "nystrom-uniform-r2")
    }
    assert all(len(r["seeds"]) + len(r["seeds_without_gap"]) == 8 for r in trained)
    assert all(len(r["gap"]["per_seed"]) == len(r["seeds"]) for r in trained)


def test_confirmation_needs_an_even_rank():
    with pytest.raises(ValueError, match="rank"):
        confirmation_config(Cell(4, 512), 3)


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["train", "--cells", "p64-n512-d16-noise"], "p must be"),
     (["confirm", "--cells", "p1-n512-d16-noise"], "--rank"),
     (["confirm", "--cells", "p1-n512-d16-noise", "--rank", "3"], "rank must be"),
     (["train", "--workers", "3"], "--workers"),
     (["predict"], "--cells")],
)  # fmt: skip
def test_the_command_refuses_bad_input_by_name(argv, named, capsys, tmp_path):
    """``python -m rpka rank-law``: exit 2 and one line naming the parameter, nothing run."""
    with pytest.raises(SystemExit) as stop:
        rank_law_command.main([*argv, "--results", str(tmp_path)])
    assert stop.value.code == 2 and named in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_every_seed_reading_names_the_seed_that_decides_it():
    """The trained confirmation's drop-in rule with leave-one-seed-out (docs/rank_law.md):
    one seed below the margin decides a miss; a seed without a gap is not read."""
    seeds = [300, 301, 302, 303]
    one_low = law.every_seed_reading(np.array([0.99, 0.97, 0.90, 0.98]), seeds)
    assert one_low == {"reached": False, "seeds_read": 4, "rests_on_seeds": [302],
                       "robust": False}  # fmt: skip
    two_low = law.every_seed_reading(np.array([0.99, 0.80, 0.90, 0.98]), seeds)
    assert not two_low["reached"] and two_low["robust"]
    no_gap = law.every_seed_reading(np.array([0.99, np.nan, 0.96, 0.98]), seeds)
    assert no_gap["reached"] and no_gap["seeds_read"] == 3 and no_gap["robust"]
    diverged = law.every_seed_reading(np.array([0.99, -np.inf, 0.96, 0.98]), seeds)
    assert not diverged["reached"] and diverged["seeds_read"] == 4
