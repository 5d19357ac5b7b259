"""Memory beside speed and the long-context section (rpka.report.sections), on the
committed full study's files and on files that lack keys (the long-context study's
structure is changing: a ``local_gate`` may appear)."""

import copy
import json

from rpka import paths
from rpka.report import sections

RESULTS = paths.resolve(paths.results_dir("full"))


def _load(name):
    return json.loads((RESULTS / name).read_text())


def test_memory_is_rpkas_forward_peak_over_exacts_at_every_length():
    scaling = _load("scaling_cpu.json")
    rows = sections.memory_rows(scaling)
    by_n = {
        (r["method"], r["rank"], r["n"]): r["peak_mib"]
        for r in scaling["rows"]
        if r["method"] in ("exact", "rpka")
    }
    assert [r["n"] for r in rows] == sorted({n for (m, _, n) in by_n if m == "exact"})
    for r in rows:
        assert r["ratio"] == by_n[("rpka", 64, r["n"])] / by_n[("exact", None, r["n"])]
    text = sections.memory_text(scaling)
    low, high = min(r["ratio"] for r in rows), max(r["ratio"] for r in rows)
    assert f"{low:.2f}–{high:.2f}×" in text and "not less" in text
    assert len(sections.memory_table(scaling)) == len(rows)
    assert "Not measured" in sections.memory_text(None)


def test_the_long_context_table_has_gate_verdict_and_costs_per_length():
    index, longctx = _load("study.json")["longctx"], _load("longctx.json")
    table = sections.longctx_table(index, longctx)
    assert len(table) == len(index["contexts"])
    for (_, row), (context, entry) in zip(
        table.iterrows(), sorted(index["contexts"].items(), key=lambda kv: int(kv[0])), strict=True
    ):
        assert row["context (tokens)"] == f"{int(context):,}"
        assert row["verdict"] == entry["primary"]["verdict"].split(" (")[0]
        cost = next(
            r
            for r in longctx["rows"]
            if r["context"] == int(context) and r["arm"] == entry["primary_arm"]
        )
        assert row["train step (× exact)"] == f"{cost['step_ratio_vs_exact']:.2f}×"
    assert "local gate" not in table
    text = sections.longctx_text(index, longctx)
    assert all(f"{int(c):,}" in text for c in index["contexts"])


def test_a_local_gate_is_shown_and_missing_keys_read_na():
    index = copy.deepcopy(_load("study.json")["longctx"])
    first = next(iter(index["contexts"].values()))
    first["local_gate"] = {"passed": False, "p_value": 0.2}
    index["contexts"]["8192"] = {}
    table = sections.longctx_table(index, None)
    assert "failed (p = 0.2)" in set(table["local gate"])
    last = table.iloc[-1]
    assert last["verdict"] == "n/a" and last["train step (× exact)"] == "n/a"
    assert "no long-context" in sections.longctx_text(None)
