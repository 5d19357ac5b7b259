"""The report's "What sets the rank" section (rpka.report.rank_law) on an index built by
the study's own code from drop-in files, and without the file."""

from __future__ import annotations

import pytest

from rpka.io import write_result_json
from rpka.report import Figures
from rpka.report import rank_law as section
from rpka.study.rank_law import law
from rpka.study.rank_law.dropin import DROPIN_FILE, METHODS
from rpka.study.rank_law.grid import Cell
from rpka.verdict.decision import MARGIN_GAP

CELLS = [Cell(1, 512), Cell(4, 512), Cell(16, 512), Cell(4, 512, 16, "patterns")]


def _dropin(cell: Cell, r_star: int | None, learnable: bool = True) -> dict:
    """A drop-in file: RPKA reaches r* (or not: censored); uniform one rung later."""
    rows, pivoting = [], []
    for method in METHODS:
        own = r_star if method == "rpka" else (None if r_star is None else 2 * r_star)
        for rank in (2, 4, 8, 16, 32):
            g = 0.99 if own is not None and rank >= own else 0.5
            verdict = "non-inferior" if g > 0.95 else "not shown"
            rows.append({"method": method, "rank": rank, "mse": [0.1, 0.1], "g": [g, g],
                         "gap": {"mean": g, "verdict": verdict}})  # fmt: skip
    for rank in (2, 4, 8):
        low, p, high = (0.8, 1.0, 1.0) if cell.background == "patterns" else (0.2, 0.5, 0.8)
        pivoting.append({"rank": rank, "prob_improvement": p, "prob_ci_low": low,
                         "prob_ci_high": high})  # fmt: skip
    first = {m: next((r["rank"] for r in rows if r["method"] == m and min(r["g"]) >= 0.95), None)
             for m in METHODS}  # fmt: skip
    return {"learnable": learnable, "rows": rows, "pivoting": pivoting,
            "r_star": {m: {"every_seed": first[m], "mean_non_inferior": first[m]} for m in METHODS},
            "effective_rank": [{"kernel": 900.0, "attention": 12.0}]}  # fmt: skip


@pytest.fixture
def index(tmp_path):
    for cell, r in zip(CELLS, (2, 8, None, 4), strict=True):
        write_result_json(tmp_path / cell.name / DROPIN_FILE, _dropin(cell, r))
    return law.write_index(tmp_path, log=None)


def test_table_marks_censored_and_reads_every_cell(index):
    table = section.cells_table(index, cap=32)
    assert list(table["cell"]) == [c.name for c in CELLS if c.name in set(table["cell"])]
    assert "> 32" in set(table["r* RPKA"]) and "2" in set(table["r* RPKA"])
    assert set(table["effective rank (kernel)"]) == {"900"}


def test_law_and_pivoting_words_follow_the_file(index):
    text = section.law_text(index)
    assert "pairs p" in text and "censored" in text
    rows = section.pivoting_rows(index)
    sentence = section.pivoting_sentence(rows)
    assert "RPKA better (the interval of P(RPKA better) above 0.5) in 3" in sentence
    assert "pivoting pays in 3 of them" in sentence and "p4-n512-d16-patterns" in sentence
    none_better = rows.assign(low=0.4, high=0.6)
    assert "pivoting pays nowhere in this grid" in section.pivoting_sentence(none_better)
    assert "cells" not in section.pivoting_sentence(none_better)
    assert section.held_out_text(None).startswith("The held-out prediction has not been made")
    held = {"cell": "p32-n1024-d16-noise", "method": "rpka", "predicted_r_star": 10.0,
            "observed_r_star": 16,
            "held": True, "held_if": "within a factor 2"}  # fmt: skip
    assert "**held**" in section.held_out_text(held)
    assert "**did not hold**" in section.held_out_text({**held, "held": False})


def test_the_summary_says_which_terms_are_not_read_and_the_trained_outcome(index):
    # the fixture's cells vary p (all learnable) but not the head dimension
    assert "head dimension d term is not read" in section.unread_axes(index)
    assert "pairs p" not in section.unread_axes(index)
    index["cells"][1]["learnable"] = False  # p = 4 failed the bar: p = 1 and 16 still vary
    assert "`p4-n512-d16-noise`" in section.unread_axes(index)
    assert section.trained_sentence(index) == ""  # no confirmation read yet
    reached, missed = {"reached": True, "robust": True}, {"reached": False, "robust": True}
    index["trained"] = [
        {"cell": "p1-n512-d16-noise", "arm": "rpka-r8", "every_seed": reached},
        {"cell": "p1-n512-d16-noise", "arm": "rpka-r4", "every_seed": missed},
    ]
    text = section.trained_sentence(index)
    assert "1 of 2 trained arms reach the margin on every seed (`rpka-r8`" in text
    assert "no reading rests on one seed" in text
    assert "1 of 2 trained arms" in section.summary_sentence(index)


def test_the_planted_control_reads_its_file():
    assert "not run" in section.planted_text(None) and section.planted_sentence(None) == ""
    rows = [
        {"method": m, "rank": 8, "dtype": d, "relative_error": e}
        for m, e in (("rpka", 1e-15), ("nystrom-uniform", 0.3))
        for d in ("float64",)
    ]
    planted = {"rows": rows, "tokens": 256, "full_rank": 512, "tolerance": {"float64": 1e-12},
               "passed": True, "negative_min_error": 0.01, "negative_misses": 1,
               "negative_readings": 1}  # fmt: skip
    assert "**passed** - largest relative error against SDPA 1.0e-15 in float64" in (
        section.planted_text(planted)
    )
    assert "missed (error > 0.01) in 1 of 1" in section.planted_text(planted)
    assert "reproduces exact attention" in section.planted_sentence(planted)
    assert "**failed**" in section.planted_text({**planted, "passed": False})


def test_section_renders_figures_or_says_it_was_not_run(index, tmp_path):
    figs = Figures(figures_dir=tmp_path / "figures")
    items = section.rank_law_section(index, figs, "rank_law.json", cap=32)
    assert figs.count == 2 and len(items) == 8  # tables, law, held-out, trained, planted, figures
    missing = section.rank_law_section(None, figs, "somewhere/rank_law.json")
    assert "was not run" in missing[0].data


def test_summary_sentence_reads_the_index(index):
    sentence = section.summary_sentence(index)
    assert "Over 4 learnable cells" in sentence and "is 2-8" in sentence
    assert "(1 censored above the ladder)" in sentence and "pairs p" in sentence


@pytest.mark.parametrize(
    ("r_star", "learnable", "held"),
    [(8, True, True), (32, True, False), (None, True, False), (2, False, None)],
)
def test_held_out_outcome(tmp_path, r_star, learnable, held):
    """Within a factor 2 holds; censored below the cap does not; an unlearnable cell decides
    nothing; without a prediction there is no outcome."""
    cell = Cell(1, 1024)
    assert law.held_out_outcome(tmp_path) is None
    write_result_json(tmp_path / cell.name / DROPIN_FILE, _dropin(cell, r_star, learnable))
    write_result_json(tmp_path / law.HELD_OUT_FILE, {"cell": cell.name, "method": "rpka",
                      "predicted_r_star": 10.0, "held_if": "within a factor 2"})  # fmt: skip
    outcome = law.held_out_outcome(tmp_path)
    assert outcome["held"] is held
    words = section.held_out_text(outcome)
    assert ("**held**" in words) == bool(held) and ("did not hold" in words) == (held is False)


def test_the_trained_confirmation_table_names_the_deciding_seed():
    gap = {"mean": 0.97, "ci_low": 0.94, "ci_high": 1.0, "verdict": "not shown",
           "per_seed": [0.99, 0.93, 0.98, 0.99]}  # fmt: skip
    row = {"cell": "p1-n512-d16-noise", "trained_at": "trained-r16", "arm": "rpka-r16",
           "method": "rpka", "rank": 16, "seeds": [300, 301, 302, 303],
           "every_seed": {"reached": False, "seeds_read": 4, "rests_on_seeds": [301],
                          "robust": False},
           "gap": gap, "robust": True, "rests_on_seeds": []}  # fmt: skip
    table = section.trained_table({"trained": [row]})
    assert table.iloc[0][f"every seed ≥ {MARGIN_GAP:g}"] == "missed (rests on seed 301)"
    assert table.iloc[0]["mean rule"] == "not shown (robust)"
    assert table.iloc[0]["seeds read"] == "4/4" and table.iloc[0]["trained at"] == "16"
    assert "not run yet" in section.trained_text({"trained": []})
