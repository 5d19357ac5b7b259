"""Data per seed (issue 40, ``rpka.training.seed_data``): each evaluation seed its own draw of the
track, the same draw for every arm, also when seeds train stacked; the committed studies
keep their data and their run ids."""

from __future__ import annotations

import glob
import json

import numpy as np
import pytest
import torch

from rpka.config.presets_longctx import get_longctx_preset
from rpka.io import read_json
from rpka.paths import resolve
from rpka.training.run_config import DATA_PER_SEED_KEY, hashed_config, make_run_config, run_id
from rpka.training.seed_data import (
    data_seed,
    member_track,
    naive_baselines_of,
    run_splits,
    tracks_to_cache,
)
from rpka.training.train import train_run

COMMITTED = "data/results/full/longrange/longctx/context-1024/runs/*.json"


def _smoke(per_seed: bool):
    config = get_longctx_preset("longrange-smoke", data_per_seed=per_seed)
    return config.bench_for(config.contexts[-1])


def test_the_committed_runs_keep_their_configs_and_ids():
    files = sorted(glob.glob(str(resolve(COMMITTED))))
    assert files, "the committed long-range runs are missing"
    checked = 0
    for path in files:
        stored = read_json(path)
        warm = stored["config"].get("warm_start")  # cold probes lie beside the curriculum
        config = get_longctx_preset(
            "longrange", warm_start_from=512 if warm else None, ranks=[16, 64, 128]
        )
        bench = config.bench_for(1024)
        if stored["arm"] not in bench.design.arm_names:
            continue
        checked += 1
        rebuilt = make_run_config(
            bench, bench.arm(stored["arm"]), stored["lr"], stored["seeds"], stored["split"]
        )
        assert DATA_PER_SEED_KEY not in rebuilt
        assert run_id(rebuilt) == stored["run_id"], path
        assert json.loads(json.dumps(hashed_config(rebuilt))) == stored["config"], path
    assert checked >= len(files) // 2


def test_the_mode_is_in_the_run_id():
    shared, per_seed = _smoke(False), _smoke(True)
    args = ("exact", 1e-2, [100, 101], "test")
    a = make_run_config(shared, shared.arm(args[0]), *args[1:])
    b = make_run_config(per_seed, per_seed.arm(args[0]), *args[1:])
    assert b[DATA_PER_SEED_KEY] is True
    assert run_id(a) != run_id(b)


def test_each_seed_reads_its_own_windows_whoever_it_is_stacked_with(tmp_path):
    bench = _smoke(True)
    task = bench.task
    stacked = make_run_config(bench, bench.arm("exact"), 1e-2, [100, 101], "test", str(tmp_path))
    alone = make_run_config(bench, bench.arm("rpka-r8"), 1e-2, [101], "test", str(tmp_path))
    both = run_splits(stacked, task, bench.design.track)
    one = run_splits(alone, task, bench.design.track)
    for split in ("train", "val", "test"):
        x_both, x_one = both[split][0], one[split][0]
        assert x_both.shape[0] == 2 and x_one.shape[0] == 1
        assert torch.equal(x_both[1], x_one[0])  # seed 101: the same windows, any arm
        assert not torch.equal(x_both[0], x_both[1])  # seeds 100 and 101: their own
    own = task.load(member_track(bench.design.track, 101), str(tmp_path))
    assert torch.equal(one["test"][0][0], task.inputs_targets(own, "test")[0])
    assert data_seed(101) != data_seed(100) and data_seed(101) == data_seed(101)


def test_a_stacked_seed_scores_as_it_would_alone(tmp_path):
    bench = _smoke(True)
    arm = bench.arm("exact")
    stacked = train_run(make_run_config(bench, arm, 1e-2, [100, 101], "test", str(tmp_path)))
    alone = train_run(make_run_config(bench, arm, 1e-2, [101], "test", str(tmp_path)))
    assert stacked["data_seeds"] == [data_seed(100), data_seed(101)]
    assert stacked["scores"]["mse"][1] == pytest.approx(alone["scores"]["mse"][0], rel=1e-4)
    assert stacked["scores"]["mse"][0] != pytest.approx(alone["scores"]["mse"][0], rel=1e-3)
    # the first stage of the curriculum reads the same seed's data at its shorter context
    assert stacked["warm_start"]["context"] == bench.design.warm_start_track.context


def test_every_seed_and_stage_is_cached_before_the_workers():
    bench = _smoke(True)
    seeds = sorted({*bench.design.sweep_seeds, *bench.design.eval_seeds})
    cached = tracks_to_cache(bench)
    assert len(cached) == 2 * len(seeds)
    assert {t.seed for t in cached} == {data_seed(s) for s in seeds}
    shared = _smoke(False)
    assert tracks_to_cache(shared) == [shared.design.track, shared.design.warm_start_track]


def test_the_mode_must_be_a_bool():
    with pytest.raises(ValueError, match="data_per_seed"):
        get_longctx_preset("longrange-smoke", data_per_seed="yes")


def test_the_naive_forecasts_are_averaged_over_the_seeds_own_data(tmp_path):
    bench = _smoke(True)
    naive = naive_baselines_of(
        bench, bench.task.load(bench.design.track, str(tmp_path)), str(tmp_path)
    )
    per_seed = [
        bench.task.naive_baselines(
            bench.task.load(member_track(bench.design.track, s), str(tmp_path))
        )
        for s in bench.design.eval_seeds
    ]
    linear = [p["forecasts"]["linear"]["test"]["mse"] for p in per_seed]
    assert naive["forecasts"]["linear"]["test"]["mse"] == pytest.approx(np.mean(linear))
    assert sorted(naive["per_seed"]) == sorted(str(s) for s in bench.design.eval_seeds)
    assert len(set(linear)) == len(linear)  # each seed's own windows
