"""The pre-registered long-range study's preset (issue 40, ``longrange-power``) and the
arm-by-arm invocation (``rpka.config.presets_longctx.with_arms``, ``longctx --arms``)."""

from __future__ import annotations

import pytest

from rpka.cli.commands import parse_longctx
from rpka.config.presets_longctx import (
    LONGCTX_PRESETS,
    POWER_POSITIVE_CONTROL_AT,
    power_as_run,
    with_arms,
)

POWER = LONGCTX_PRESETS["longrange-power"]


def test_the_study_is_the_protocols_design():
    """docs/longrange_protocol.md after its pre-registered cuts ("Price")."""
    assert POWER.contexts == (2048, 4096)
    assert POWER.warm_start_from == 512
    bench = POWER.bench_for(4096)
    assert bench.design.data_per_seed
    assert bench.design.eval_seeds == tuple(range(200, 216))
    assert not set(bench.design.eval_seeds) & set(bench.design.sweep_seeds)
    ranks = (16, 64, 128)
    expected = {
        "exact",
        "mean-attention",
        "local-w128",
        "rpka-r8192",
        *(f"rpka-r{r}" for r in ranks),
        *(f"nystrom-uniform-r{r}" for r in ranks),
    }
    assert set(bench.design.arm_names) == expected
    assert bench.decision.positive_control_arm == "rpka-r8192"  # >= 2 x 4,096 joint points
    assert (bench.control, bench.local_control) == ("mean-attention", "local-w128")
    for context in POWER.contexts:  # every length warm-started from 512, the same model
        assert POWER.bench_for(context).design.warm_start_track.context == 512


def test_an_arm_subset_keeps_what_the_decision_needs():
    config = with_arms(POWER, ["nystrom-uniform-r16"])
    names = set(config.bench.design.arm_names)
    assert names == {"nystrom-uniform-r16", "exact", "rpka-r64", "mean-attention", "local-w128"}
    assert config.bench.decision.positive_control_arm is None
    kept = with_arms(POWER, ["rpka-r8192"]).bench
    assert kept.decision.positive_control_arm == "rpka-r8192"
    with pytest.raises(ValueError, match="arms"):
        with_arms(POWER, ["rpka-r999"])


def test_the_cli_runs_one_length_and_some_arms(tmp_path):
    config, _ = parse_longctx(
        ["--preset", "longrange-power", "--contexts", "4096", "--arms", "nystrom-uniform-r16",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert config.contexts == (4096,)
    assert "nystrom-uniform-r16" in config.bench.design.arm_names
    assert "rpka-r16" not in config.bench.design.arm_names
    with pytest.raises(SystemExit):
        parse_longctx(["--preset", "longrange-power", "--arms", "nope", "--out", str(tmp_path)])


def test_the_study_as_run_has_its_positive_control_at_one_length():
    lengths = {c.contexts[0]: c.bench for c in power_as_run()}
    assert sorted(lengths) == sorted(POWER.contexts)
    for context, bench in lengths.items():
        has_control = "rpka-r8192" in bench.design.arm_names
        assert has_control == (context == POWER_POSITIVE_CONTROL_AT)
        assert bench.decision.positive_control_arm == ("rpka-r8192" if has_control else None)
        assert {"exact", "mean-attention", "local-w128", "nystrom-uniform-r128"} <= set(
            bench.design.arm_names
        )
