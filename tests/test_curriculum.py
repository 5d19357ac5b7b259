"""The curriculum over context lengths (issue 27, ``rpka.training.curriculum``): a warm-started run
trains at a shorter context first - exactly the run the short context's own bench trains -
then at its own, from those weights, its learned positions stretched."""

import dataclasses

import pytest
import torch

from rpka.bench import InProcessExecutor
from rpka.cli.commands import parse_longctx
from rpka.config.bench import BenchConfig
from rpka.config.presets_longctx import LONGRANGE_PRESETS, get_longctx_preset
from rpka.io import has_checksum
from rpka.study import longctx
from rpka.training.curriculum import first_stage_config, stretched_state
from rpka.training.run_config import make_run_config, run_id
from rpka.training.train import build_model, setup_run, track_config_of, train_run

SMOKE = get_longctx_preset("longrange-smoke")
SHORT, LONG = SMOKE.contexts


def run_config(tmp_path, context, arm="exact", lr=1e-2, seeds=(100, 101), **changes):
    bench = SMOKE.bench_for(context)
    if changes:
        bench = bench.replace(**changes)
    return make_run_config(bench, bench.arm(arm), lr, list(seeds), "test", str(tmp_path))


# --------------------------------------------------------------------------- stretching


def test_positions_are_interpolated_and_nothing_else_changes():
    positions = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)  # (S, C, d)
    state = {"position": positions, "head.weight": torch.ones(2, 4)}
    target = {"position": torch.zeros(2, 5, 2), "head.weight": torch.zeros(2, 4)}
    out = stretched_state(state, target)
    assert out["position"].shape == (2, 5, 2)
    assert torch.equal(out["head.weight"], state["head.weight"])
    # align_corners: the end points stay, the points between are the linear interpolant
    assert torch.equal(out["position"][:, 0], positions[:, 0])
    assert torch.equal(out["position"][:, -1], positions[:, -1])
    assert torch.allclose(out["position"][:, 1], (positions[:, 0] + positions[:, 1]) / 2)
    assert torch.allclose(out["position"][:, 2], positions[:, 1])


def test_any_other_shape_that_differs_is_refused():
    state = {"head.weight": torch.ones(2, 4)}
    with pytest.raises(ValueError, match="'head.weight'.*readout 'last'"):
        stretched_state(state, {"head.weight": torch.ones(2, 8)})


def test_the_long_model_starts_from_the_stretched_short_weights(tmp_path):
    short = run_config(tmp_path, SHORT)
    model = build_model(short, track_config_of(short), torch.device("cpu"))
    run = setup_run(run_config(tmp_path, LONG), start=model.state_dict())
    for name, value in run.model.state_dict().items():
        if name == "position":
            assert value.shape[1] == LONG and torch.equal(value[:, 0], model.position[:, 0])
        else:
            assert torch.equal(value, model.state_dict()[name])
    assert all(torch.equal(p, p0) for p, p0 in zip(run.params, run.initial, strict=True))


# --------------------------------------------------------------------------- the run


def test_the_first_stage_is_the_short_contexts_own_run(tmp_path):
    warm = run_config(tmp_path, LONG)
    assert warm["warm_start"]["track"]["context"] == SHORT
    first = first_stage_config(warm)
    assert first["track"]["context"] == SHORT and first["split"] == "val"
    assert "warm_start" not in first and "state_path" not in first
    cold_short = train_run(run_config(tmp_path, SHORT))
    result = train_run(warm | {"state_path": str(tmp_path / "w.pt")})
    summary = result["warm_start"]
    assert summary["context"] == SHORT and summary["n_diverged"] == 0
    assert summary["n_steps"] == cold_short["n_steps"] == result["n_steps"]
    # bit for bit the validation scores of the short context's own run
    assert summary["val"] == {
        k: [m["final"]["val"][k] for m in cold_short["members"]] for k in summary["val"]
    }
    assert result["cpu_s"] >= summary["cpu_s"] > 0  # the run's cost counts both stages
    assert (tmp_path / "w.pt").exists()  # only the run's own weights are saved


def test_the_warm_start_changes_the_result_and_the_run_id(tmp_path):
    warm = run_config(tmp_path, LONG)
    cold = {k: v for k, v in warm.items() if k != "warm_start"}
    assert run_id(warm) != run_id(cold)
    assert train_run(warm)["scores"] != train_run(cold)["scores"]
    assert "warm_start" not in train_run(cold)


def test_a_member_that_diverged_in_the_first_stage_stays_diverged(tmp_path):
    warm = run_config(tmp_path, LONG, lr=1e8, train=dataclasses.replace(
        SMOKE.bench.design.train, grad_clip=0.0))  # fmt: skip
    result = train_run(warm)
    assert result["warm_start"]["n_diverged"] == 2 and result["n_diverged"] == 2
    for member in result["members"]:
        assert member["status"] == "diverged"
        assert member["diverged_at"]["stage"] == "warm_start"


# --------------------------------------------------------------------------- configuration


def test_only_contexts_above_the_warm_start_get_one():
    assert SMOKE.warm_start_from == SHORT
    assert SMOKE.bench_for(SHORT).design.warm_start_track is None
    warm = SMOKE.bench_for(LONG).design.warm_start_track
    assert warm == dataclasses.replace(SMOKE.bench_for(SHORT).design.track)
    cold = dataclasses.replace(SMOKE, warm_start_from=None)
    assert cold.bench_for(LONG).design.warm_start_track is None
    full = LONGRANGE_PRESETS["longrange"]
    assert full.warm_start_from == 512
    assert [full.bench_for(c).design.warm_start_track is not None for c in full.contexts] == [
        c > 512 for c in full.contexts
    ]


def test_a_warm_start_round_trips_through_the_on_disk_form():
    bench = SMOKE.bench_for(LONG)
    assert BenchConfig.from_dict(bench.to_dict()) == bench
    assert type(SMOKE).from_dict(SMOKE.to_dict()) == SMOKE
    # a study written before warm starts existed reads as cold
    old = {k: v for k, v in SMOKE.bench_for(SHORT).to_dict().items() if k != "warm_start_track"}
    assert BenchConfig.from_dict(old).design.warm_start_track is None


def test_a_cold_run_config_has_no_warm_start_key():
    """Cold runs keep the run ids (and run files) they had before warm starts existed."""
    assert "warm_start" not in run_config("/tmp", SHORT)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"warm_start_from": 4}, "warm_start_from"),
        ({"warm_start_from": 64.5}, "warm_start_from"),
    ],
)
def test_bad_warm_start_from_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        get_longctx_preset("longrange-smoke", **changes)


def test_bad_warm_start_tracks_are_refused():
    bench = SMOKE.bench_for(LONG)
    longer = dataclasses.replace(bench.design.track, context=LONG + 16)
    with pytest.raises(ValueError, match=r"warm_start_track.context.*< the track's context"):
        bench.replace(warm_start_track=longer).validate()
    with pytest.raises(ValueError, match="warm_start_track"):
        bench.replace(warm_start_track=SMOKE.bench_for(SHORT).design.model).validate()
    flatten = dataclasses.replace(bench.design.model, readout="flatten")
    with pytest.raises(ValueError, match="model must be readout 'last'"):
        bench.replace(model=flatten).validate()


def test_the_command_line_sets_or_clears_the_warm_start(tmp_path):
    argv = ["--preset", "longrange-smoke", "--out", str(tmp_path)]
    assert parse_longctx(argv)[0].warm_start_from == SHORT
    assert parse_longctx([*argv, "--warm-start-from", "0"])[0].warm_start_from is None
    with pytest.raises(SystemExit):
        parse_longctx([*argv, "--warm-start-from", "3"])


def test_the_study_names_its_curriculum(tmp_path):
    result = longctx.run_longctx(
        SMOKE, tmp_path / "out", InProcessExecutor(), progress=False, data_dir=tmp_path / "c"
    )
    assert f"trained first at {SHORT} tokens" in result["protocol"]
    assert result["config"]["warm_start_from"] == SHORT
    assert has_checksum(tmp_path / "out" / longctx.FILE_NAME)  # sealed (issue 43)
