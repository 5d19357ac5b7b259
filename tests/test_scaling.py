"""The scaling benchmark: a tiny CPU run, the JSON it writes, and its validation."""

import dataclasses

import pytest

from rpka.cli import commands as cli
from rpka.config import scaling as scaling_config
from rpka.io import read_json
from rpka.speed import scaling
from rpka.speed.timing import interleaved
from rpka.study import steps as study


def tiny(**changes) -> scaling_config.ScalingConfig:
    base = dataclasses.replace(
        scaling_config.SCALING_PRESETS["tiny"],
        lengths=(32, 64),
        ranks=(4,),
        control_ranks=(4,),
        repeats=1,
    )
    return dataclasses.replace(base, **changes)


def test_tiny_run_writes_every_measure(tmp_path):
    out = tmp_path / "scaling.json"
    result = scaling.run_scaling(tiny(), progress=False, out=out)
    saved = read_json(out)
    assert len(saved["rows"]) == len(result["rows"]) == 6
    for key in ("device", "dtype", "shapes", "memory_definition", "timing", "config", "torch"):
        assert key in saved
    methods = {(r["method"], r["rank"], r["n"]) for r in saved["rows"]}
    assert methods == {
        (m, r, n)
        for n in (32, 64)
        for m, r in (("exact", None), ("rpka", 4), ("nystrom-uniform", 4))
    }
    for row in saved["rows"]:
        assert row["forward_status"] == "ok" and row["forward_ms"] > 0
        assert row["fwd_bwd_status"] == "ok" and row["fwd_bwd_ms"] > 0
        assert row["memory_status"] == "ok" and row["peak_mib"] >= 0
        assert row["fwd_bwd_peak_mib"] > 0  # gradients at least
        if row["method"] == "exact":
            assert row["speedup_vs_exact"] == pytest.approx(1.0)
            assert "pivot_ms" not in row
        else:
            assert 0 < row["pivot_ms"] and row["pivot_fraction"] == pytest.approx(
                row["pivot_ms"] / row["forward_ms"]
            )
            assert row["rounds"] >= 1 and row["candidates"] >= 4


def test_cpu_memory_counts_the_output():
    """The profiler-based CPU peak sees at least the output tensor (B*H*n*d floats)."""
    import torch

    q = torch.randn(1, 2, 256, 16)
    peak = scaling.peak_memory_mib(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), "cpu"
    )
    assert peak >= q.numel() * 4 / 2**20


def test_time_budget_marks_skipped(tmp_path):
    result = scaling.run_scaling(tiny(max_seconds=1e-9), progress=False)
    statuses = {r.get("forward_status") for r in result["rows"]}
    assert statuses == {"skipped"}


def test_out_of_memory_is_recorded_and_larger_lengths_skipped(monkeypatch):
    real = scaling._measure

    def fake(kind, attn, inputs, config, repeats):
        if kind == "forward" and attn.name == "rpka" and inputs[0].shape[-2] >= 64:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(kind, attn, inputs, config, repeats)

    monkeypatch.setattr(scaling, "_measure", fake)
    result = scaling.run_scaling(tiny(lengths=(32, 64, 128), backward=False), progress=False)
    status = {(r["method"], r["n"]): r["forward_status"] for r in result["rows"]}
    assert status[("rpka", 32)] == "ok" and status[("rpka", 64)] == "oom"
    assert status[("rpka", 128)] == "skipped" and status[("exact", 128)] == "ok"
    row = next(r for r in result["rows"] if (r["method"], r["n"]) == ("rpka", 64))
    assert row["speedup_vs_exact"] is None and "forward_ms" not in row


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"lengths": ()}, "lengths"),
        ({"lengths": (1,)}, "lengths"),
        ({"ranks": (0,)}, "ranks"),
        ({"control_ranks": (-2,)}, "control_ranks"),
        ({"repeats": 0}, "repeats"),
        ({"batch_heads": 0}, "batch_heads"),
        ({"dtype": "int8"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"max_seconds": 0}, "max_seconds"),
        ({"exact_backend": "fastest"}, "backend"),
    ],
)
def test_bad_config_raises(changes, match):
    with pytest.raises(ValueError, match=match):
        scaling.run_scaling(tiny(**changes), progress=False)


def test_cli_rejects_bad_values(capsys):
    with pytest.raises(SystemExit):
        cli.scaling_main(["--preset", "tiny", "--repeats", "0"])
    assert "repeats" in capsys.readouterr().err


def test_the_time_budget_bounds_a_single_measurement(monkeypatch):
    """--max-seconds was checked between measurements only: `--lengths 4000000
    --max-seconds 20` ran past 150 s in its first one. A measurement predicted (from the
    arm's last length, or a one-call probe) to overrun what is left is skipped, with the
    prediction."""
    import time

    config = tiny(
        lengths=(64, 2**18), control_ranks=(), batch_heads=1, head_dim=8, warmup=0,
        memory=False, backward=False, max_seconds=3.0,
    )  # fmt: skip
    started = time.monotonic()
    result = scaling.run_scaling(config, progress=False)
    assert time.monotonic() - started < 60  # exact at 262,144 tokens alone: many minutes
    long_exact = next(r for r in result["rows"] if r["method"] == "exact" and r["n"] == 2**18)
    assert long_exact["forward_status"] == "skipped"
    assert long_exact["forward_predicted_s"] > 3.0
    short = [r for r in result["rows"] if r["n"] == 64]
    assert all(r["forward_status"] == "ok" for r in short)


def test_lengths_beyond_memory_are_refused_before_allocating():
    with pytest.raises(ValueError, match=r"lengths 4000000000 needs at least [\d,.]+ GiB"):
        tiny(lengths=(4_000_000_000,)).validate()


def test_a_study_resumes_its_measured_timing_and_remeasures_another_config(tmp_path):
    """A resumed study keeps the committed timing file (a measurement is not recomputed, so
    a clone's `make report` leaves it as committed); another configuration is measured."""
    out = tmp_path / "scaling.json"
    scaling.run_scaling(tiny(), progress=False, out=out)
    before = out.read_bytes()
    study.resume_or_run_scaling(tiny(), out, progress=False)
    assert out.read_bytes() == before
    remeasured = study.resume_or_run_scaling(tiny(lengths=(32,)), out, progress=False)
    assert {r["n"] for r in remeasured["rows"]} == {32}
    assert read_json(out)["config"]["lengths"] == [32]


def test_every_scaling_preset_has_its_default_result_file():
    """``python -m rpka scaling --preset P`` writes somewhere for every P it offers (the
    standard study's sweep had none: a KeyError before any work)."""
    assert set(scaling_config.DEFAULT_OUT) == set(scaling_config.SCALING_PRESETS)


def test_the_interleaved_order_changes_every_arms_neighbour():
    """Each repeat times every arm once, in an order that does not keep neighbours: the
    arm after the first one (exact, in the harness) differs between repeats."""
    log: list[str] = []
    labels = ["exact", "a", "b", "c", "d"]
    times = interleaved({x: (lambda x=x: log.append(x)) for x in labels}, warmup=0, repeats=8)
    assert all(len(t["cpu_ms"]) == 8 for t in times.values())
    repeats = [log[i : i + 5] for i in range(0, 40, 5)]
    assert all(sorted(r) == sorted(labels) for r in repeats)
    after_exact = {r[r.index("exact") + 1] for r in repeats if r[-1] != "exact"}
    assert len(after_exact) > 1


def test_the_sweeps_own_arms_are_registry_methods():
    """Issue 56: method names live in the registry; the sweep's built-in arms name entries
    of it, and the joint-landmark methods the rank law reads come from its metadata."""
    from rpka.attention import JOINT_LANDMARK_METHODS, METHOD_INFO, REGISTRY
    from rpka.config.scaling import BUILTIN_ARMS

    assert set(BUILTIN_ARMS) <= set(REGISTRY)
    assert JOINT_LANDMARK_METHODS == ("rpka", "nystrom-uniform")
    assert all(METHOD_INFO[m].landmarks == "joint" for m in JOINT_LANDMARK_METHODS)
