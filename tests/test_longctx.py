"""The long-context study: the smoke run's JSON against its documentation, the sized
tracks, the memory probe, the configuration's validation and the CLI."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from doc_keys import key_paths

from rpka.bench import InProcessExecutor
from rpka.cli import commands as cli
from rpka.config.bench import LongContextConfig
from rpka.config.presets_longctx import LONGCTX_PRESETS, LONGRANGE_PRESETS, get_longctx_preset
from rpka.io import read_json
from rpka.model import ModelConfig, TransformerTiny
from rpka.study import longctx
from rpka.tracks import get_task
from rpka.tracks.forecast import TrackConfig, sized_track, split_bounds, window_starts
from rpka.tracks.lm import LMConfig
from rpka.tracks.motif import MotifConfig
from rpka.tracks.real import RealConfig
from rpka.tracks.regimes import RegimesConfig
from rpka.verdict import stats

DOC = Path(__file__).resolve().parent.parent / "docs" / "longctx.md"
SMOKE = get_longctx_preset("smoke")
# dicts whose keys are data (configs, names): documented as a whole
OPAQUE = {
    "config",
    "versions",
    "rows[].guard_counts",
    "rows[].comparison",
    "per_context.<context>.data",
    "per_context.<context>.naive_test_mse",
    "per_context.<context>.attention_gate",
}


@pytest.fixture(scope="module")
def smoke_result(tmp_path_factory):
    root = tmp_path_factory.mktemp("longctx")
    result = longctx.run_longctx(
        SMOKE, root / "out", InProcessExecutor(), progress=False, data_dir=root / "cache"
    )
    return result, root


def test_every_key_is_documented_and_every_documented_key_exists(smoke_result):
    result, root = smoke_result
    saved = read_json(root / "out" / "longctx.json")
    documented = set(re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), flags=re.MULTILINE))
    present = key_paths(saved, OPAQUE, {"per_context": "<context>"})
    assert present - documented == set(), "undocumented keys"
    assert documented - present == set(), "documented keys missing from the file"
    assert saved["rows"] == result["rows"]


def test_smoke_content(smoke_result):
    result, root = smoke_result
    bench = SMOKE.bench
    arms = [arm.name for arm in bench.design.arms]
    assert [(r["context"], r["arm"]) for r in result["rows"]] == [
        (c, a) for c in SMOKE.contexts for a in arms
    ]
    assert LongContextConfig.from_dict(result["config"]) == SMOKE
    for context in SMOKE.contexts:
        rows = {r["arm"]: r for r in result["rows"] if r["context"] == context}
        exact = rows["exact"]
        assert exact["comparison"] is None and exact["step_ratio_vs_exact"] == pytest.approx(1)
        assert exact["peak_ratio_vs_exact"] == pytest.approx(1)
        for name, row in rows.items():
            assert row["seeds"] == list(bench.design.eval_seeds)
            assert len(row["test_mse_per_seed"]) == len(bench.design.eval_seeds)
            assert row["test_mse_mean"] == pytest.approx(np.mean(row["test_mse_per_seed"]))
            assert row["step_ms"] > 0 and row["peak_mib"] > 0
            assert row["peak_members"] == row["step_members"] == bench.execution.seeds_per_job
            if name == "exact":
                continue
            diffs = np.subtract(row["test_mse_per_seed"], exact["test_mse_per_seed"])
            assert row["comparison"]["per_seed_diffs"] == pytest.approx(diffs.tolist())
            if row["method"] == "rpka":
                assert row["pivot_points"] == 2 * context and row["rank"] == int(name[6:])
        entry = result["per_context"][str(context)]
        report = read_json(root / "out" / entry["bench_report"])
        assert report["track"] == bench.track_name == "forecast-regimes"
        assert report["data"] == entry["data"]
        assert report["data"]["context"] == context
        assert report["data"]["n_train_windows"] == SMOKE.train_windows
        assert report["data"]["n_test_windows"] == SMOKE.eval_windows
        assert report["arms"]["exact"]["full"]["per_seed"] == rows["exact"]["test_mse_per_seed"]
    assert result["wall_s"] > 0 and "reduced" in result["protocol"]


def test_smoke_reports_the_attention_gate_of_every_context(smoke_result):
    """The gate is the control against exact on the same evaluation seeds, as
    rpka.verdict.stats.attention_gate computes it, and the bench report's own."""
    result, root = smoke_result
    control = SMOKE.bench.control
    assert control == "mean-attention"
    for context in SMOKE.contexts:
        rows = {r["arm"]: r for r in result["rows"] if r["context"] == context}
        entry = result["per_context"][str(context)]
        gate = entry["attention_gate"]
        expected = stats.attention_gate(
            rows["exact"]["test_mse_per_seed"], rows[control]["test_mse_per_seed"]
        )
        assert gate["control_arm"] == control
        for key in ("passed", "n_pairs", "rule"):
            assert gate[key] == expected[key]
        for key in ("control_delta", "control_rel", "p_value"):
            assert gate[key] == pytest.approx(expected[key])
        report = read_json(root / "out" / entry["bench_report"])
        assert report["attention_gate"] == gate
        for row in rows.values():  # a failed gate turns every verdict uninformative
            if row["method"] == "rpka" and not gate["passed"]:
                assert row["comparison"]["verdict"] == "uninformative"


@pytest.mark.parametrize("context", [32, 96, 512, 2048])
@pytest.mark.parametrize(("train", "evaluation", "stride"), [(1, 1, 8), (96, 16, 32), (7, 3, 5)])
def test_sized_track_holds_exactly_the_windows_asked_for(context, train, evaluation, stride):
    track = sized_track(TrackConfig(stride=stride), context, train, evaluation)
    track.validate()
    counts = {
        name: len(window_starts(begin, end, track))
        for name, (begin, end) in split_bounds(track).items()
    }
    assert counts == {"train": train, "val": evaluation, "test": evaluation}
    assert track.context == context


def test_at_context_resizes_a_generated_track_and_keeps_the_rest():
    for config in (RegimesConfig(n_regimes=16), MotifConfig()):
        resized = get_task(config.name).at_context(config, 512, 40, 8)
        assert (resized.context, resized.n_train, resized.n_val, resized.n_test) == (512, 40, 8, 8)
        assert resized.horizon == config.horizon and resized.seed == config.seed
    regimes = get_task("forecast-regimes").at_context(RegimesConfig(n_regimes=16), 2048, 4, 2)
    assert regimes.n_regimes == 16
    forecast = get_task("forecast").at_context(TrackConfig(stride=32), 512, 7, 3)
    assert forecast == sized_track(TrackConfig(stride=32), 512, 7, 3)


@pytest.mark.parametrize(
    ("name", "args", "match"),
    [
        ("forecast-regimes", (16, 4, 4), "context"),  # shorter than three segments
        ("forecast-regimes", (512, 0, 4), "train_windows"),
        ("forecast-regimes", (512, 4, 0), "eval_windows"),
        ("forecast", (4, 4, 4), "context"),
        ("forecast-real", (512, 4, 4), "long-context form"),
        ("lm", (512, 4, 4), "long-context form"),
    ],
)
def test_at_context_rejects_what_it_cannot_build(name, args, match):
    config = {
        "forecast-regimes": RegimesConfig(),
        "forecast": TrackConfig(),
        "forecast-real": RealConfig(),
        "lm": LMConfig(),
    }[name]
    with pytest.raises(ValueError, match=match):
        get_task(name).at_context(config, *args)


def test_every_preset_validates_and_full_is_the_issue_study():
    for name, config in LONGCTX_PRESETS.items():
        config.validate()
        assert config.bench.studies.mechanism is None and config.preset == name
    for name, config in LONGCTX_PRESETS.items():
        # the long-range presets (issue 27, tests/test_longrange.py) train forecast-lookup
        track = "forecast-lookup" if name in LONGRANGE_PRESETS else "forecast-regimes"
        assert config.bench.track_name == track, name
        assert config.bench.control == "mean-attention", name
    full = LONGCTX_PRESETS["full"]
    assert full.contexts == (512, 2048)
    assert [a.name for a in full.bench.design.arms] == [
        "exact",
        "rpka-r16",
        "rpka-r64",
        "mean-attention",
    ]
    # the gate's one-sided and the primary's two-sided sign-flip tests can reach p < 0.05
    n_seeds = len(full.bench.design.eval_seeds)
    assert stats.sign_flip_floor(n_seeds, "greater") < stats.sign_flip_floor(n_seeds) < stats.ALPHA


def test_memory_probe_counts_every_gradient(tmp_path):
    """All parameter gradients are alive at once before the update: a lower bound."""
    bench = SMOKE.bench_for(SMOKE.contexts[0])
    run_config = longctx.probe_run_config(bench, "rpka-r4", str(tmp_path))
    probe = longctx.training_step_peak_mib(run_config)
    model = TransformerTiny(
        bench.design.model,
        bench.design.track.context,
        bench.design.track.horizon,
        list(run_config["seeds"]),
    )
    gradients = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    assert probe["peak_mib"] >= gradients
    assert probe["members"] == len(run_config["seeds"])


def test_zero_head_starts_the_model_as_its_linear_skip():
    config = ModelConfig(d_model=8, n_layers=1, n_heads=1, d_ff=16, head_init_std=0.0)
    model = TransformerTiny(config, context=40, horizon=6, seeds=[3, 4])
    x = torch.randn(2, 5, 40)
    with torch.no_grad():
        assert torch.equal(model(x), model.skip(x))
    with pytest.raises(ValueError, match="head_init_std"):
        ModelConfig(head_init_std=-0.1).validate()


def test_last_token_readout_does_not_grow_with_the_context():
    def head_weights(readout: str, context: int) -> int:
        config = ModelConfig(d_model=8, n_layers=1, n_heads=1, d_ff=16, readout=readout)
        return TransformerTiny(config, context=context, horizon=6, seeds=[0]).head.weight.numel()

    assert head_weights("last", 64) == head_weights("last", 2048) == 8 * 6
    assert head_weights("flatten", 2048) == 2048 * 8 * 6
    config = ModelConfig(d_model=8, n_layers=1, n_heads=1, d_ff=16, readout="last")
    model = TransformerTiny(config, context=40, horizon=6, seeds=[3, 4])
    x = torch.randn(2, 5, 40, requires_grad=True)
    model(x).sum().backward()  # every input reaches the last token (through attention)
    assert bool((x.grad[..., :20].abs().sum((0, 1)) > 0).all())
    with pytest.raises(ValueError, match="model.readout"):
        ModelConfig(readout="mean").validate()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"contexts": ()}, "contexts"),
        ({"contexts": (64, 64)}, "contexts"),
        ({"contexts": (4,)}, "contexts"),
        ({"train_windows": 0}, "train_windows"),
        ({"memory_probe": "yes"}, "memory_probe"),
        ({"train": {"epoch": 2}}, "train override"),
        ({"colour": "red"}, "override"),
    ],
)
def test_bad_config_raises(overrides, match):
    with pytest.raises(ValueError, match=match):
        get_longctx_preset("smoke", **overrides)
    with pytest.raises(ValueError, match="preset"):
        get_longctx_preset("huge")


def test_cli_rejects_bad_values(capsys):
    with pytest.raises(SystemExit):
        cli.longctx_main(["--preset", "smoke", "--seeds", "0"])
    assert "seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.longctx_main(["--preset", "smoke", "--contexts", "4"])
    assert "contexts" in capsys.readouterr().err


def test_cli_overrides_keep_the_primary_arm():
    config, _ = cli.parse_longctx(["--preset", "full", "--ranks", "16", "64", "--seeds", "3"])
    assert (
        config.bench.decision.primary_arm == "rpka-r64" and len(config.bench.design.eval_seeds) == 3
    )
    assert config.bench.design.learning_rates == LONGCTX_PRESETS["full"].bench.design.learning_rates
    assert config.bench.control == "mean-attention"  # --ranks keeps the control
