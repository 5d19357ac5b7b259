"""A positive control that exercises the estimator below full rank (issue 41, item 6):
``rpka.study.rank_law.planted`` against torch SDPA, and its result file."""

from __future__ import annotations

import json

import pytest
import torch

from rpka.study.rank_law import planted
from rpka.study.rank_law.command import main


@pytest.mark.parametrize("distinct", planted.DISTINCT)
def test_rpka_at_the_planted_rank_is_exact_attention(distinct):
    assert 2 * distinct < 2 * planted.TOKENS  # the estimator's path, not the full-rank identity
    assert planted.relative_error("rpka", distinct, torch.float64) < 1e-12
    assert planted.relative_error("rpka", distinct, torch.float32) < 1e-5


@pytest.mark.parametrize("distinct", planted.DISTINCT)
def test_uniform_landmarks_at_the_planted_rank_are_not(distinct):
    """The negative control: the same rank spent on uniform draws misses distinct points
    (measured 7-58 % off in float64), so the positive control could have failed."""
    assert planted.relative_error("nystrom-uniform", distinct, torch.float64) > 1e-2


def test_the_planted_inputs_have_the_planted_rank():
    q, k, _ = planted.planted_inputs(4, torch.float64)
    assert len(torch.unique(q[0, 0], dim=0)) == 4 and len(torch.unique(k[0, 0], dim=0)) == 4


def test_the_command_writes_the_control_for_the_index(tmp_path, capsys):
    assert main(["planted", "--results", str(tmp_path)]) == 0
    result = json.loads((tmp_path / planted.PLANTED_FILE).read_text())
    assert result["passed"] and result["could_fail"]
    assert len(result["rows"]) == 2 * len(planted.DISTINCT) * len(planted.TOLERANCE)
    assert "passed; uniform landmarks missed" in capsys.readouterr().out
