"""Reading the pre-registered long-range study (issue 40): only complete lengths, its own
frontier and answer, a positive control that fails stops a length's reading, the report part."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rpka.config.presets_longctx import get_longctx_preset
from rpka.report import load_study
from rpka.report.longrange_power import power_section, status_text
from rpka.report.page import Figures
from rpka.study import index
from rpka.study.longctx import run_longctx
from rpka.verdict.decision import NON_INFERIOR
from rpka.verdict.robustness import UNREAD, longrange_answer

SMOKE = "longrange-power-smoke"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """The smoke study of the power preset, both lengths, in ``<out>/<preset>/``."""
    out = tmp_path_factory.mktemp("power")
    config = get_longctx_preset(SMOKE, memory_probe=False)
    run_longctx(config, out / SMOKE, progress=False)
    return out


def _copy(study: Path, tmp_path: Path) -> Path:
    shutil.copytree(study / SMOKE, tmp_path / SMOKE)
    return tmp_path


def test_a_length_is_read_only_when_every_job_is_in(study, tmp_path):
    out = _copy(study, tmp_path)
    first, second = get_longctx_preset(SMOKE).contexts
    entry = index.power_entry(out, [get_longctx_preset(SMOKE)])
    assert sorted(entry["contexts"]) == sorted([str(first), str(second)])
    assert entry["protocol"] == "docs/longrange_protocol.md"
    runs = out / SMOKE / "longctx" / f"context-{second}" / "runs"
    next(runs.glob("*.json")).unlink()  # a job missing: its bench report is not read
    entry = index.power_entry(out, [get_longctx_preset(SMOKE)])
    assert list(entry["contexts"]) == [str(first)]
    assert not entry["landed"][1]["complete"]
    assert f"Read (every job in): {first:,} tokens" in status_text(entry)
    assert index.power_entry(tmp_path / "elsewhere", [get_longctx_preset(SMOKE)]) is None


def test_the_study_gets_its_own_frontier_and_answer(study, tmp_path):
    out = _copy(study, tmp_path)
    entry = index.power_entry(out, [get_longctx_preset(SMOKE)])
    index.write_power_frontier(entry, out)  # the smoke study's gates fail: nothing to read
    assert not (out / entry["frontier_json"]).exists()
    for line in entry["contexts"].values():
        line["gate_passed"] = True  # as if the gates had passed
    index.write_power_frontier(entry, out)
    frontier = json.loads((out / entry["frontier_json"]).read_text())
    assert sorted(frontier["tracks"]) == sorted(f"longrange-{c}" for c in entry["contexts"])
    assert set(frontier["longrange_answer"]["per_length"]) == set(entry["contexts"])
    assert frontier["longrange_answer"]["pending_lengths"] == []  # every length is in
    entry["landed"][1]["complete"] = False  # as if the second length were still landing
    index.write_power_frontier(entry, out)
    second = entry["landed"][1]["context"]
    answer = json.loads((out / entry["frontier_json"]).read_text())["longrange_answer"]
    assert answer["pending_lengths"] == [second]
    items = power_section({"longrange_power": entry}, out, Figures(), None)
    html = "".join(getattr(item, "data", "") for item in items)
    assert "The pilot: the 16-seed study of protocol v1" in html and "leave one seed out" in html
    assert '<figure id="figure-1"' in html  # each seed's gap recovered


def test_no_study_no_part():
    assert power_section({"longrange_power": None}, ".", Figures(), None) == []


def _length(control_verdict: str) -> dict:
    row = {"arm": "rpka-r64", "method": "rpka", "verdict": NON_INFERIOR, "robust": True,
           "step_ratio_cpu": {"mean": 0.5, "ci_low": 0.45, "ci_high": 0.55}}  # fmt: skip
    control = {"arm": "rpka-r8192", "rank": 8192, "verdict": control_verdict}
    return {"rows": [row], "positive_control": control}


def test_a_positive_control_that_fails_stops_the_lengths_reading():
    read = longrange_answer({2048: _length(NON_INFERIOR)})
    assert read["n_star"]["rpka"] == 2048 and read["per_length"]["2048"]["cheapest"] == "rpka-r64"
    unread = longrange_answer({2048: _length("inconclusive")})
    assert unread["n_star"]["rpka"] is None
    assert unread["per_length"]["2048"] == {"robust_non_inferior": [], "cheapest": None,
                                            "step_ratio_cpu": None, "unread": UNREAD}  # fmt: skip


def test_the_report_loads_the_study_with_its_power_entry():
    """The committed full study's index carries the study to the report page."""
    loaded = load_study("data/results/full/study.json", "full", compute=False)
    assert loaded["longrange_power"]["preset"] == "longrange-power"
    assert loaded["longrange_power"]["contexts"]  # 2,048 tokens is complete and read
