"""The "when" map (issue 41 item 8): every reading placed and coloured by the rules it names."""

from __future__ import annotations

from rpka.report import when_map
from rpka.verdict.decision import CHEAPER_RATIO_MAX


def _frontier(rows: list[dict], track: str = "recall-2048") -> dict:
    return {"tracks": {track: {"rows": rows}}}


def _row(method: str, rank: int, verdict: str, points: int = 4096) -> dict:
    return {"method": method, "rank": rank, "n_points": points, "verdict": verdict}


SWEEP = {"rows": [
    {"method": "rpka", "n": 2048, "rank": 64, "speedup_cpu_vs_exact": 3.0},
    {"method": "rpka", "n": 2048, "rank": 128, "speedup_cpu_vs_exact": 1 / CHEAPER_RATIO_MAX - 0.1},
    {"method": "exact", "n": 2048, "rank": None, "speedup_cpu_vs_exact": 1.0},
]}  # fmt: skip


def test_each_reading_gets_the_category_its_verdict_and_the_op_timing_give():
    frontier = _frontier([
        _row("rpka", 64, "non-inferior"),  # op 3x faster: cheaper
        _row("rpka", 128, "non-inferior"),  # op 1.15x faster, ratio 0.87 > 0.8: not cheaper
        _row("rpka", 16, "not shown"),
        _row("nystrom-uniform", 64, "non-inferior"),  # no uniform row in the sweep: untimed
        _row("rpka", 4096, "non-inferior"),  # the positive control: left out
    ])  # fmt: skip
    points = when_map.map_points(frontier, None, SWEEP)
    got = {(r.method, r.rank): r.category for r in points.itertuples()}
    assert got == {("rpka", 64): "cheaper", ("rpka", 128): "costly", ("rpka", 16): "loses",
                   ("nystrom-uniform", 64): "untimed"}  # fmt: skip
    assert set(points["tokens"]) == {2048} and points["rank_over_points"].min() == 16 / 4096


def test_drop_in_rungs_are_the_every_seed_r_star_and_the_rank_below():
    cell = {"cell": "p1-n512-d16-noise", "n": 512, "learnable": True,
            "r_star_dropin": {"rpka": None, "keys-coreset": 16}}  # fmt: skip
    unlearned = {**cell, "cell": "p4-n512-d16-noise", "learnable": False}
    points = when_map.map_points(None, {"cells": [cell, unlearned]}, None)
    assert [(r.method, r.rank, r.non_inferior, r.points) for r in points.itertuples()] == [
        ("keys-coreset", 16, True, 512), ("keys-coreset", 8, False, 512)]  # fmt: skip
    assert list(points["category"]) == ["untimed", "loses"]
    text, alt = when_map.caption(points)
    assert "1 non-inferior, op not timed there" in text and "1 not shown" in text and alt


def test_the_figure_draws_every_reading():
    rows = [_row("rpka", 64, "non-inferior"), _row("rpka", 16, "not shown")]
    points = when_map.map_points(_frontier(rows), None, SWEEP)
    fig = when_map.plot_when_map(points)
    drawn = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
    assert drawn == len(points) == 2


def test_the_superseded_long_range_study_is_not_a_reading():
    """The older 8-seed long-range study (frontier.json's longrange-<n>) is superseded by the
    pre-registered 16-seed one: Figure 1 does not show it as a finding (issue 53, item 3)."""
    rows = [_row("rpka", 64, "non-inferior")]
    older = _frontier(rows, "longrange-2048")
    assert when_map.map_points(older, None, SWEEP, superseded=True).empty
    assert len(when_map.map_points(older, None, SWEEP)) == 1  # a study without the 16-seed one
    text, _ = when_map.caption(when_map.map_points(_frontier(rows), None, SWEEP, superseded=True))
    assert "8-seed study is superseded and not shown" in text
    assert "superseded" not in when_map.caption(when_map.map_points(older, None, SWEEP))[0]
