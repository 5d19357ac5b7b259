"""The recall (MQAR) track in the bench (issue 14): its presets embed the previous token, the
stacked val/test splits score every length in one pass exactly as the unpadded sequences
would, the smoke bench reports the accuracy at each length factor per arm, and the
accuracy-against-rank figure draws from that report."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from rpka.bench import InProcessExecutor, run_bench
from rpka.config.presets import PRESETS_BY_TRACK, get_preset
from rpka.io import atomic_save_npz
from rpka.model import ModelConfig, TransformerLM
from rpka.report.figures_recall import accuracy_points, plot_recall_accuracy_vs_rank, reference_arms
from rpka.tracks import get_task
from rpka.tracks.cache import cache_path
from rpka.tracks.recall import (
    IGNORE,
    LENGTH_FACTORS,
    LENGTH_METRICS,
    RecallConfig,
    build_arrays,
    load_recall,
)

SMALL = RecallConfig(
    vocab_size=17, n_pairs=4, n_queries=4, seq_len=32, n_train=16, n_val=8, n_test=12
)


@pytest.mark.parametrize("preset", sorted(PRESETS_BY_TRACK["recall"]))
def test_recall_presets_validate_and_embed_the_previous_token(preset):
    config = get_preset(preset, "recall")  # validated
    assert config.design.model.previous_tokens == 1
    assert config.design.track.length_factors == LENGTH_FACTORS
    assert {"exact", "mean-attention"} <= {arm.name for arm in config.design.arms}


def test_full_preset_ranks_straddle_the_pairs():
    config = get_preset("full", "recall")
    ranks = sorted(arm.options["rank"] for arm in config.design.arms if "rank" in arm.options)
    pairs = config.design.track.n_pairs
    assert ranks[0] < pairs and pairs in ranks and ranks[-1] > pairs
    assert len(config.design.learning_rates) >= 2 and len(config.design.eval_seeds) >= 6


def test_stacked_splits_score_each_length_as_the_unpadded_sequences(tmp_path):
    """error / error_x<f> from one pass over the padded stack equal the query error of each
    split scored alone at its own length (a causal model: padding after a position cannot
    change its output)."""
    task = get_task("recall")
    track = load_recall(SMALL, tmp_path)
    model = TransformerLM(ModelConfig(d_model=16, d_ff=32, previous_tokens=1), 17, 128, [0, 1])
    x, y = task.inputs_targets(track, "test")
    assert x.shape == (SMALL.n_test * 3, SMALL.max_len) and y.shape == (len(x), x.shape[1] + 1)
    with torch.no_grad():
        scores = task.finish(task.error_sums(model(x.expand(2, *x.shape)), y), task.count(y))
    for metric, split in (("error", "test"), *((f"error_x{f}", f"test_x{f}") for f in (2, 4))):
        tokens, targets = (torch.from_numpy(a) for a in track.split(split))
        with torch.no_grad():
            pred = model(tokens.expand(2, *tokens.shape)).argmax(-1)
        asked = targets != IGNORE
        expected = ((pred != targets) & asked).sum((1, 2)) / asked.sum()
        torch.testing.assert_close(scores[metric], expected.double(), msg=metric)


def test_train_split_is_unpadded_with_factor_one(tmp_path):
    x, y = get_task("recall").inputs_targets(load_recall(SMALL, tmp_path), "train")
    assert x.shape == (SMALL.n_train, SMALL.seq_len)
    assert (y[:, -1] == 1).all() and ((y[:, :-1] != IGNORE).sum(1) == SMALL.n_queries).all()


def test_a_cache_without_the_val_length_splits_is_rebuilt(tmp_path):
    arrays = build_arrays(SMALL)
    stale = {k: v for k, v in arrays.items() if not k.startswith("val_x")}
    atomic_save_npz(cache_path(SMALL, tmp_path), **stale)
    track = load_recall(SMALL, tmp_path)
    np.testing.assert_array_equal(track.split("val_x4")[0], arrays["val_x4_tokens"])
    assert load_recall(SMALL, tmp_path).arrays.keys() == arrays.keys()  # rewritten


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recall")
    config = get_preset("smoke", "recall")
    return run_bench(
        config, tmp / "out", InProcessExecutor(), progress=False, data_dir=tmp / "data"
    )


def test_smoke_bench_reports_accuracy_at_each_length(smoke_report):
    for name, arm in smoke_report["arms"].items():
        for metric in ("error", *LENGTH_METRICS):
            values = arm["full_by_metric"][metric]["per_seed"]
            assert len(values) == 2 and all(0.0 <= v <= 1.0 for v in values), (name, metric)
    assert smoke_report["data"]["length_factors"] == list(LENGTH_FACTORS)


def test_figure_draws_every_method_and_length(smoke_report, tmp_path):
    fig = plot_recall_accuracy_vs_rank(smoke_report, tmp_path)
    assert (tmp_path / "recall_accuracy_vs_rank.png").stat().st_size > 0
    assert len(fig.axes) == 1 + len(LENGTH_FACTORS)
    points = accuracy_points(smoke_report, "error_x2")
    n_pairs = smoke_report["data"]["n_pairs"]
    assert [p["ratio"] for p in points["rpka"]] == [4 / n_pairs]
    arm = smoke_report["arms"]["rpka-r4"]["full_by_metric"]["error_x2"]
    assert points["rpka"][0]["accuracy"] == pytest.approx(1 - arm["mean"])
    assert set(reference_arms(smoke_report, "error")) == {"exact", "mean-attention"}


def test_figure_refuses_another_track(smoke_report):
    with pytest.raises(ValueError, match="report must be a recall bench report"):
        plot_recall_accuracy_vs_rank({**smoke_report, "track": "lm"})
