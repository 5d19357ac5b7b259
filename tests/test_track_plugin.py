"""A track is a plug-in: one ``Task`` subclass plus one registry entry runs through the
bench and the report layer without any other change (rpka.tracks.base)."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from rpka.bench import InProcessExecutor, run_bench
from rpka.config.bench import ArmConfig, BenchConfig, TrainConfig, rpka_arm
from rpka.model import ModelConfig
from rpka.report import figures, narrative, tables
from rpka.tracks import TRACKS, get_task
from rpka.tracks.forecast import ForecastTask, Split, Track


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """Noisy sines of one random period per window: a forecast-like toy track."""

    name: str = "toy"
    context: int = 16
    horizon: int = 4
    season_period: int = 8
    n_windows: int = 48
    seed: int = 0

    @property
    def attention_tokens(self) -> int:
        return self.context

    def validate(self) -> None:
        if self.n_windows < 8:
            raise ValueError(f"track.n_windows must be >= 8, got {self.n_windows!r}")


class ToyTask(ForecastTask):
    """Another generator, everything else the forecast track's."""

    name = "toy"
    config_class = ToyConfig
    out_dir = "toy"

    def load(self, config: ToyConfig, data_dir=None) -> Track:
        rng = np.random.default_rng(config.seed)
        steps = np.arange(config.context + config.horizon)
        periods = rng.uniform(5, 11, size=(config.n_windows, 1))
        phases = rng.uniform(0, 2 * math.pi, size=(config.n_windows, 1))
        series = np.sin(2 * math.pi * steps / periods + phases)
        series += 0.05 * rng.standard_normal(series.shape)
        windows = torch.from_numpy(series).float()

        def split(index: slice) -> Split:
            part = windows[index]
            n = len(part)
            return Split(
                x=part[:, : config.context],
                y=part[:, config.context :],
                series=torch.zeros(n, dtype=torch.long),
                start=torch.arange(n),
                mean=torch.zeros(n),
                std=torch.ones(n),
            )

        third = config.n_windows // 3
        return Track(
            config=config,
            series=windows,
            train=split(slice(0, third)),
            val=split(slice(third, 2 * third)),
            test=split(slice(2 * third, None)),
        )


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(TRACKS, "toy", ToyTask())  # the one registry line


def toy_bench() -> BenchConfig:
    return BenchConfig.of(
        preset="toy-smoke",
        track=ToyConfig(),
        model=ModelConfig(d_model=8, n_layers=1, n_heads=1, d_ff=16, embed_kernel=3),
        train=TrainConfig(epochs=1, batch_size=8, warmup_steps=0),
        arms=(ArmConfig("exact", "exact"), rpka_arm(4)),
        primary_arm="rpka-r4",
        learning_rates=(3e-3,),
        sweep_seeds=(0,),
        eval_seeds=(100, 101),
        n_workers=1,
        mechanism=None,
    )


def test_an_unregistered_track_is_refused():
    with pytest.raises(ValueError, match="track.name must be one of"):
        toy_bench().validate()


def test_a_registered_toy_track_runs_through_the_bench_and_the_report(toy_registered, tmp_path):
    config = toy_bench()
    config.validate()
    assert config.task is get_task("toy")
    report = run_bench(config, tmp_path / "out", InProcessExecutor(), progress=False)
    assert report["track"] == "toy" and report["metric"] == "mse"
    assert set(report["arms"]) == {"exact", "rpka-r4"}
    assert report["data"]["n_test_windows"] == 16
    for arm in report["arms"].values():
        assert all(np.isfinite(v) for v in arm["full"]["per_seed"])
    # the report layer asks the task, by the name in the report
    table = tables.results_table(report)
    assert "naive: linear (least squares)" in set(table["arm"])
    assert "Track `toy`" in narrative.setup(report)
    assert "learnability bar" in narrative.learnability(report)
    figures.plot_sweep(report)
    # a run file reloads its track config through the registry
    assert BenchConfig.from_dict(report["config"]) == config
